"""The parent's side of a run's ring: the shared file, which slots are free, and numpy views of a
slot by the names `runtime.slot.SlotLayout` defines.

Boundary: numpy and the run's ring file; no processes, no records (a `Chunk` is arrays), no
Polars or Torch.

Ownership: the parent creates the ring file (inside the run's /dev/shm directory, which the pool
removes) and maps it read-write; workers attach to it. A slot is either free (in `free`) or
lent: to a task between `acquire()` and the task's result, then to whoever holds the chunk made
from it, until `release(slot)`. Views from `arrays()`, `region()` and `chunk()` are only
meaningful while their slot is lent to the caller; the run decides when a slot returns (today:
when the consumer asks for the next chunk).

Every view holds a buffer export of the mapping (`np.frombuffer`; `np.ndarray(buffer=)` keeps
none), so `close()` never unmaps memory a view still points to: the mapping then lives until the
last view is gone.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np

from datasetrt.runtime.local import Chunk
from datasetrt.runtime.shm import create_shared_file
from datasetrt.runtime.slot import PARENT, SlotLayout


class Ring:
    """`slots` slots of `layout` in one shared file at `path` (created here, pages reserved)."""

    def __init__(self, path: Path, layout: SlotLayout, slots: int) -> None:
        self.path = path
        self.layout = layout
        self.slots = slots
        self.map = create_shared_file(path, slots * layout.slot_bytes)
        self.free: deque[int] = deque(range(slots))

    # -- lending ------------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free slot (lent to the caller), or None when every slot is lent."""
        return self.free.popleft() if self.free else None

    def release(self, slot: int) -> None:
        """Return a lent slot; its bytes may be overwritten by the next task."""
        self.free.append(slot)

    # -- views --------------------------------------------------------------------------------

    def array(self, slot: int, name: str, count: int) -> np.ndarray:
        """Entries [0, count) of header array `name` of `slot` (a view; dtype from the layout)."""
        offset, typecode = self.layout.array(name)
        return np.frombuffer(self.map, dtype=np.dtype(typecode), count=count,
                             offset=self.layout.slot_offset(slot) + offset)

    def arrays(self, slot: int, count: int) -> dict[str, np.ndarray]:
        """Every header array of `slot`, entries [0, count), by name."""
        return {field.name: self.array(slot, field.name, count) for field in self.layout.arrays}

    def region(self, slot: int, name: str) -> np.ndarray:
        """Region `name` of `slot` as a uint8 view."""
        offset, size = self.layout.region(name)
        return np.frombuffer(self.map, dtype=np.uint8, count=size, offset=self.layout.slot_offset(slot) + offset)

    def write_plan(self, slot: int, **plan: np.ndarray) -> None:
        """Write a task's plan into `slot`: one array per PARENT header array of the layout,
        by name, all of the task's length (values are cast to the array's dtype)."""
        wanted = {f.name for f in self.layout.arrays if f.writer == PARENT}
        if set(plan) != wanted:
            raise ValueError(f"a {self.layout.kind!r} plan has arrays {sorted(wanted)}, got {sorted(plan)}")
        for name, values in plan.items():
            self.array(slot, name, len(values))[:] = values

    def chunk(self, slot: int, first: int, rows: int) -> Chunk:
        """A "records" slot whose task filled `rows` rows, as the Chunk of window positions
        [first, first+rows) (views of the slot)."""
        return Chunk(first, rows, self.region(slot, "data"), **self.arrays(slot, rows))

    def close(self) -> None:
        """Unmap (idempotent). While a view of the ring is alive the mapping stays (BufferError
        from mmap, ignored) and goes when the last view and this ring are collected."""
        try:
            self.map.close()
        except BufferError:
            pass
