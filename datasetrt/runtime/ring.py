"""The parent's side of a run's ring: the shared file, which slots are free, and numpy views of a
slot by the names `runtime.slot.SlotLayout` defines.

Boundary: numpy and the run's ring file; no processes, no records (a `Chunk` is arrays), no
Polars or Torch.

Ownership: the parent creates the ring (an anonymous memfd, runtime/shm.py: it has no name to
leave behind), maps it read-write and keeps its descriptor (`fd`) until `close()` or collection,
for the pool to pass to each worker of the run, which maps it. A slot is either free (in `free`)
or lent: to a task between `acquire()` and the task's result, then to whoever holds what was made
from it, until it returns: by `release(slot)` (a "records" run, when the consumer asks for the
next chunk) or by its lease (`lease(slot)`: when the last view made from the lease's array is
gone). Views from `arrays()`, `region()` and `chunk()` are only meaningful while their slot is
lent to the caller; a lease's views are valid for as long as they exist (closing the descriptor
never unmaps: the mapping outlives every view).

Reservation: the ring's size is checked against what the kernel can give when it is created,
but a slot's pages are reserved (posix_fallocate) at its first `acquire()`, before any task or
view can touch them: a run that uses fewer slots than its ring has never allocates, zero-fills
or maps the others, and the first task waits for one slot's reservation, not the whole ring's.

Every view holds a buffer export of the mapping (`np.frombuffer`; `np.ndarray(buffer=)` keeps
none), so `close()` never unmaps memory a view still points to: the mapping then lives until the
last view is gone, whatever happened to the run, its files and its workers meanwhile.
"""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from collections import deque

import numpy as np

from datasetrt.runtime.local import Chunk
from datasetrt.runtime.shm import create_shared_memory, reserve_shared_memory
from datasetrt.runtime.slot import PARENT, SlotLayout

_RING_KEYS = itertools.count(1)


class Ring:
    """`slots` slots of `layout` in one anonymous shared file (created here, sized and checked
    against what the kernel can give; each slot's pages reserved at its first `acquire`); `name` + key labels it in /proc maps). `key` names it to the workers (unique in this process), also
    across the runs that reuse it (runtime/pool.py, "Idle ring").

    Each slot's full-length views are made once, here (a view costs a few microseconds, and a
    task reads or writes eight of them); `array`, `region` and `chunk` hand out slices of them.
    """

    def __init__(self, name: str, layout: SlotLayout, slots: int) -> None:
        self.key = next(_RING_KEYS)
        self.name = f"{name}{self.key}"
        self.layout = layout
        self.slots = slots
        self.map, self.fd = create_shared_memory(self.name, slots * layout.slot_bytes, reserve=False)
        self.reserved = bytearray(slots)  # 1: the slot's pages are reserved (at its first acquire)
        self._close_fd = weakref.finalize(self, os.close, self.fd)
        self.free: deque[int] = deque(range(slots - 1, -1, -1))  # a stack: slot 0 is taken first
        self._leases: dict[int, weakref.ref] = {}  # slot -> weakref of its lease array, while leased
        self._plan_names = frozenset(f.name for f in layout.arrays if f.writer == PARENT)
        self._arrays: list[dict[str, np.ndarray]] | None = [
            {f.name: self._view(slot, *layout.array(f.name), layout.rows) for f in layout.arrays}
            for slot in range(slots)
        ]
        self._regions: list[dict[str, np.ndarray]] | None = [
            {r.name: self._view(slot, layout.region(r.name)[0], "B", layout.region(r.name)[1]) for r in layout.regions}
            for slot in range(slots)
        ]

    def _view(self, slot: int, offset: int, typecode: str, count: int) -> np.ndarray:
        return np.frombuffer(
            self.map, dtype=np.dtype(typecode), count=count, offset=self.layout.slot_offset(slot) + offset
        )

    # -- lending ------------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free slot (lent to the caller), or None when every slot is lent. The slot freed
        last is taken first (LIFO): its pages are the likeliest in the CPU caches, and a loop
        that needs fewer slots than the ring has never touches the others. A slot's first
        acquire reserves its pages (posix_fallocate; ResourceLimitError if the kernel refuses,
        and the slot stays free), so slots never acquired cost nothing."""
        if not self.free:
            return None
        slot = self.free.pop()
        if not self.reserved[slot]:
            try:
                reserve_shared_memory(
                    self.fd, self.layout.slot_offset(slot), self.layout.slot_bytes, f"{self.name} slot {slot}"
                )
            except BaseException:
                self.free.append(slot)
                raise
            self.reserved[slot] = 1
        return slot

    @property
    def reserved_slots(self) -> int:
        """Slots whose pages have been reserved (acquired at least once)."""
        return sum(self.reserved)

    def release(self, slot: int) -> None:
        """Return a lent slot; its bytes may be overwritten by the next task."""
        self.free.append(slot)

    def lease(self, slot: int) -> np.ndarray:
        """Lend `slot` to the consumer for as long as it reads it: a new uint8 array over the whole
        slot (its own buffer export of the mapping). Derive every view handed out from it (numpy
        views keep their base array; `torch.from_numpy` and DLPack capsules keep the array): the
        slot returns to `free` when this array and everything made from it are gone — never
        earlier, and with no lock (a weakref callback: a dict delete and a deque append)."""
        lease = np.frombuffer(
            self.map, dtype=np.uint8, count=self.layout.slot_bytes, offset=self.layout.slot_offset(slot)
        )
        self._leases[slot] = weakref.ref(lease, functools.partial(_returned, self._leases, self.free, slot))
        return lease

    @property
    def leased(self) -> int:
        """Slots lent to the consumer through `lease()` and not returned yet."""
        return len(self._leases)

    # -- views --------------------------------------------------------------------------------

    def _slot_arrays(self, slot: int) -> dict[str, np.ndarray]:
        """The full-length header array views of `slot` (made at creation, dropped by `close()`)."""
        if self._arrays is None:
            raise RuntimeError(f"ring {self.name} is closed: its slots have no views")
        return self._arrays[slot]

    def array(self, slot: int, name: str, count: int) -> np.ndarray:
        """Entries [0, count) of header array `name` of `slot` (a view; dtype from the layout)."""
        return self._slot_arrays(slot)[name][:count]

    def arrays(self, slot: int, count: int) -> dict[str, np.ndarray]:
        """Every header array of `slot`, entries [0, count), by name."""
        return {name: view[:count] for name, view in self._slot_arrays(slot).items()}

    def region(self, slot: int, name: str) -> np.ndarray:
        """Region `name` of `slot` as a uint8 view."""
        if self._regions is None:
            raise RuntimeError(f"ring {self.name} is closed: its slots have no views")
        return self._regions[slot][name][:]

    def write_plan(self, slot: int, **plan: np.ndarray) -> None:
        """Write a task's plan into `slot`: one array per PARENT header array of the layout,
        by name, all of the task's length (values are cast to the array's dtype)."""
        if plan.keys() != self._plan_names:
            raise ValueError(f"a {self.layout.kind!r} plan has arrays {sorted(self._plan_names)}, got {sorted(plan)}")
        views = self._slot_arrays(slot)
        for name, values in plan.items():
            views[name][: len(values)] = values

    def chunk(self, slot: int, first: int, rows: int) -> Chunk:
        """A "records" slot whose task filled `rows` rows, as the Chunk of window positions
        [first, first+rows) (views of the slot)."""
        return Chunk(first, rows, self.region(slot, "data"), **self.arrays(slot, rows))

    def close(self) -> None:
        """Close the descriptor and unmap (idempotent). While a view handed out is alive the
        mapping stays (BufferError from mmap, ignored) and goes when the last such view and this
        ring are collected."""
        self._arrays = self._regions = None
        self.fd = -1
        self._close_fd()
        try:
            self.map.close()
        except BufferError:
            pass


def _returned(leases: dict, free: deque, slot: int, ref: weakref.ref) -> None:
    """Weakref callback of a lease: its array is gone, so the slot is free again."""
    if leases.get(slot) is ref:
        del leases[slot]
        free.append(slot)
