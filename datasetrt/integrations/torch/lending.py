"""Lending a torch worker's batch buffers to the main process without torch's per-storage
transfer: `WorkerRing` (in a DataLoader worker) and `Receiver` (in the main process).

Boundary: torch tensors and storages, numpy views; no datasetrt reading, planning or layout (a
batch's arrays are placed by batches.py through `SharedBuffers`' `take` / `tensor` / `small`).

Why: torch sends each tensor storage of a worker's item through `multiprocessing.resource_sharer`
(a socket connection with an HMAC handshake per storage, a fresh shared-memory file per batch,
its pages faulted in each time). Measured here, a DataLoader whose 2 workers only allocate and
send one [256, 512] int32 tensor per item delivers 313 items/s against 4,485 for items without a
tensor. So each worker keeps one shared storage of `SLOTS` batch slots, sent once; an item that
uses a slot travels as a `LentBatch` (slot numbers and the views' dtype/shape/stride/offset), and
the main process rebuilds the tensors as views of its mapping of that storage.

Slot ownership, one byte per slot in the storage's header: 0 free, 1 lent. Only the worker sets
0 -> 1 (`take`), only the main process sets 1 -> 0, when the last tensor rebuilt from the item is
gone (a weakref on the numpy array every rebuilt tensor of the item keeps alive). A ring serves
one pass of one worker (the next pass brings a new one). A slot the main process never sees (an
item torch dropped at an early break) stays lent for the rest of its pass, and so do the slots of a
result holding objects the lending cannot look into (anything but dicts, lists, tuples, tensors,
numpy arrays, str/bytes/numbers/None), which travels as torch sends it: both only cost reuse (the
worker falls back to a fresh storage per batch, torch's own path), never a slot overwritten while
viewed.
"""

from __future__ import annotations

import os
import secrets
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SLOTS = 4  # per worker: prefetch_factor (2) items queued, the one the loop holds, the one being read
MAX_SLOT_BYTES = 16 << 20  # larger batches take a fresh storage each (the transfer is then a small part)
HEADER_BYTES = 64  # slot state bytes, padded so every slot starts 64-byte aligned
_PLAIN = (str, bytes, int, float, bool, type(None), np.ndarray, np.generic)


@dataclass(frozen=True)
class RingView:
    """A tensor of a lent item, as a view of the worker ring: dtype, shape, stride and offset in
    elements (torch's `as_strided` arguments)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class LentBatch:
    """A worker's item whose tensors in the ring are `RingView`s: `ring` names the worker ring
    (its storage travels with the ring's first item, `storage`, a uint8 tensor over all of it),
    `slots` are the slots the item holds, `tree` the item with its ring tensors replaced."""

    ring: str
    slots: tuple[int, ...]
    tree: Any
    storage: torch.Tensor | None


class WorkerRing:
    """`SLOTS` batch slots of `slot_bytes` each in one shared storage of a DataLoader worker.
    `take()` lends a free slot (lowest index first: a loop that needs fewer never touches the
    others' pages) or returns None; `lend(tree)` turns a finished item into a `LentBatch`."""

    def __init__(self, slot_bytes: int) -> None:
        """`slot_bytes` (at most MAX_SLOT_BYTES) per slot, rounded up to HEADER_BYTES."""
        self.slot_bytes = -(-slot_bytes // HEADER_BYTES) * HEADER_BYTES
        storage = torch.UntypedStorage._new_shared(HEADER_BYTES + SLOTS * self.slot_bytes)
        self.whole = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.whole[:HEADER_BYTES] = 0
        self._state = self.whole[:SLOTS].numpy()
        self._address = storage.data_ptr()
        self.name = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._sent = False
        self._taken: list[int] = []  # slots taken since the last lend()

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A uint8 tensor over a free slot of at least `nbytes` (now lent), or None."""
        if nbytes > self.slot_bytes:
            return None
        free = np.flatnonzero(self._state == 0)
        if len(free) == 0:
            return None
        slot = int(free[0])
        self._state[slot] = 1
        self._taken.append(slot)
        start = HEADER_BYTES + slot * self.slot_bytes
        return self.whole[start : start + self.slot_bytes]

    def lend(self, tree: Any) -> Any:
        """`tree` (the item after `batch_transform`) with its tensors over this ring replaced by
        `RingView`s, as a `LentBatch` holding the slots they use; slots taken since the last call
        that nothing uses are free again. `tree` itself when it uses no slot."""
        used: set[int] = set()
        opaque = [False]

        def leaf(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu" or value.untyped_storage().data_ptr() != self._address:
                    return value
                offset = int(value.storage_offset())  # a plain int for CPU tensors (SymInt only when traced)
                used.add((offset * value.element_size() - HEADER_BYTES) // self.slot_bytes)
                return RingView(value.dtype, tuple(value.shape), tuple(value.stride()), offset)
            if not isinstance(value, _PLAIN):
                opaque[0] = True
            return value

        replaced = _map_leaves(tree, leaf)
        if opaque[0]:
            # Something may hold a ring tensor out of sight: the slots taken stay lent for good
            # (nothing returns them) and `tree` travels as torch sends it (the ring's storage by
            # descriptor, so its views stay valid).
            self._taken = []
            return tree
        for slot in set(self._taken) - used:
            self._state[slot] = 0
        self._taken = []
        if not used:
            return tree
        storage, self._sent = (None if self._sent else self.whole), True
        return LentBatch(self.name, tuple(sorted(used)), replaced, storage)


def _return_slots(state: np.ndarray, slots: tuple[int, ...]) -> None:
    state[list(slots)] = 0


class Receiver:
    """The main process's side: `receive(item)` rebuilds a `LentBatch` as tensors over its
    mapping of the worker ring (other items pass unchanged). Keeps the last `keep` rings it was
    sent: one per worker. A worker sends its pass's ring once, with the pass's first item, so the
    receiver outlives a pass: the loader's with persistent workers (one iterator at a time), one
    per iterator otherwise. A ring dropped here stays mapped while tensors of it live."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._rings: OrderedDict[str, torch.Tensor] = OrderedDict()

    def receive(self, item: Any) -> Any:
        if not isinstance(item, LentBatch):
            return item
        if item.storage is not None:
            self._rings[item.ring] = item.storage
            while len(self._rings) > self.keep:
                self._rings.popitem(last=False)
        whole = self._rings[item.ring]
        self._rings.move_to_end(item.ring)
        memory = whole.numpy()
        lease = np.frombuffer(memory, dtype=np.uint8)  # every tensor below keeps this array alive
        weakref.finalize(lease, _return_slots, memory[:SLOTS], item.slots)
        by_dtype: dict[torch.dtype, torch.Tensor] = {}

        def rebuilt(view: RingView) -> torch.Tensor:
            flat = by_dtype.get(view.dtype)
            if flat is None:
                flat = by_dtype[view.dtype] = torch.from_numpy(lease).view(view.dtype)
            return flat.as_strided(view.shape, view.stride, view.offset)

        return _map_leaves(item.tree, lambda value: rebuilt(value) if isinstance(value, RingView) else value)


def _map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with every leaf (anything but a dict, list or tuple) replaced by `leaf(value)`;
    containers are rebuilt as their own type, others are leaves."""
    if type(value) is dict:
        return {k: _map_leaves(v, leaf) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_map_leaves(v, leaf) for v in value)
    return leaf(value)
