"""The ring slot: the one definition of its layout (named header arrays, named byte regions) and
the worker's numpy-free view of one slot.

Boundary: arithmetic and memoryviews only; no numpy (reader workers import this module), no
processes, no files. The parent's numpy view of the same bytes is `runtime.ring.Ring`.

A run's ring is `slots` slots of `layout.slot_bytes` bytes each, back to back in one shared file;
slot s starts at byte `s * slot_bytes`. Inside a slot, in order:

    header   one array of `layout.rows` entries per `SlotArray` (8-byte entries, in `arrays` order)
    regions  the `SlotRegion`s, in order, each aligned to its `align`; a region without a size
             takes the rest of the slot (only the last one may)

Who writes what (the protocol NOTE in runtime/protocol.py gives the order of events): arrays of
`writer == PARENT` are the task's plan, written by the parent before it sends the ReadTask;
arrays of `writer == WORKER` and every region are written by the worker before its TaskDone. A
slot is touched by one worker between ReadTask and TaskDone and read by the parent only after.

`layout.kind` names the worker code path that fills a slot of this layout (`worker.FILLERS`):
  "records"  the gather kernel writes each record's embedded JSON and payload into the "data"
             region and their offsets/lengths (relative to that region) into the four result
             arrays (per-sample iteration; a task is any run of window positions);
  "batch"    one task is one whole batch: the batch gather kernel writes the decoded payloads
             back to back, in their final dense or ragged layout, from the start of the
             64-byte-aligned "payload" region, and their n+1 byte offsets (int64, relative to
             that region) into the "offsets" region; with `keep_json`, each record's embedded
             JSON goes to the end of the payload region (stacked down) and its offset/length
             into json_off/json_len. `payload` is the length rule every payload is checked
             against (a dense spec's exact size, a ragged spec's unit). The parent hands the
             consumer views of the slot (`Ring.lease`) and the slot stays out of circulation
             until they are all gone.
The parent reads a slot through `Ring.array()` / `Ring.region()` by the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from datasetrt.values.payloads import PayloadCheck

PARENT = "parent"  # written by the parent: the task's plan, before the ReadTask
WORKER = "worker"  # written by the worker: results, before the TaskDone
ENTRY_BYTES = 8  # every header array holds 8-byte entries
PAGE_BYTES = 4096

EntryCode = Literal["q", "Q"]  # the typecode of a header array's 8-byte entries: int64 or uint64


@dataclass(frozen=True, slots=True)
class SlotArray:
    """A header array of `SlotLayout.rows` entries: `typecode` is its `array`/memoryview format
    ("q" int64, "Q" uint64; numpy accepts the same codes as dtypes)."""

    name: str
    typecode: EntryCode
    writer: str


@dataclass(frozen=True, slots=True)
class SlotRegion:
    """A byte region after the header: `nbytes` long (None: the rest of the slot), starting at a
    multiple of `align` bytes from the slot's start."""

    name: str
    nbytes: int | None = None
    align: int = ENTRY_BYTES


# The "records" layout: rows as the gather kernel returns them. The order is the byte order in the slot.
RECORD_ARRAYS = (
    SlotArray("json_off", "q", WORKER),  # embedded JSON of row i: data[json_off[i] : + json_len[i]]
    SlotArray("json_len", "q", WORKER),
    SlotArray("data_off", "q", WORKER),  # decoded payload of row i: data[data_off[i] : + data_len[i]]
    SlotArray("data_len", "q", WORKER),
    SlotArray("cache_pos", "q", PARENT),  # the plan: catalog position of row i's cache
    SlotArray("sample_id", "Q", PARENT),  # ... its sample id
    SlotArray("row", "q", PARENT),  # ... its population row (table lookups; not read by workers)
)
RECORD_REGIONS = (SlotRegion("data"),)

# The "batch" layout: one planned batch in its final layout.
BATCH_ARRAYS = (
    SlotArray("cache_pos", "q", PARENT),  # the plan, as in "records"
    SlotArray("sample_id", "Q", PARENT),
    SlotArray("row", "q", PARENT),
)
BATCH_JSON_ARRAYS = (
    SlotArray("json_off", "q", WORKER),  # keep_json only: row i's embedded JSON, relative to "payload"
    SlotArray("json_len", "q", WORKER),
)
PAYLOAD_ALIGN = 64  # a cache line: typed arrays of any dtype start aligned (SIMD loads, DLPack consumers)


@dataclass(frozen=True, slots=True)
class SlotLayout:
    """Geometry of every slot of one run. Frozen plain data: it travels to workers in `OpenRun`.

    Invariants: `slot_bytes` is a multiple of PAGE_BYTES and holds the header and every sized
    region; the last region may be unsized (the rest); names are unique across arrays and regions.
    """

    kind: str
    rows: int
    slot_bytes: int
    arrays: tuple[SlotArray, ...]
    regions: tuple[SlotRegion, ...]
    payload: PayloadCheck | None = None  # "batch": the length rule of every payload
    keep_json: bool = False  # "batch": embedded JSON kept (validate_cache compares it)

    @classmethod
    def records(cls, rows: int, data_bytes: int) -> SlotLayout:
        """Slots for `rows` gathered records whose JSON and payloads need `data_bytes` together
        (the slot is rounded up to whole pages; the "data" region gets the rounding too)."""
        header = len(RECORD_ARRAYS) * ENTRY_BYTES * rows
        return cls("records", rows, _pages(header + data_bytes), RECORD_ARRAYS, RECORD_REGIONS)

    @classmethod
    def batch(cls, rows: int, payload_bytes: int, payload: PayloadCheck, keep_json: bool = False) -> SlotLayout:
        """Slots for one batch of `rows` records whose payloads (plus, with `keep_json`, their
        embedded JSON) need `payload_bytes` (the "payload" region gets the page rounding too;
        uncompressed records are read in place, so size it for whole stored records)."""
        arrays = BATCH_ARRAYS + (BATCH_JSON_ARRAYS if keep_json else ())
        regions = (SlotRegion("offsets", (rows + 1) * ENTRY_BYTES), SlotRegion("payload", align=PAYLOAD_ALIGN))
        fixed = len(arrays) * ENTRY_BYTES * rows + (rows + 1) * ENTRY_BYTES + PAYLOAD_ALIGN
        return cls("batch", rows, _pages(fixed + payload_bytes), arrays, regions, payload, keep_json)

    @property
    def header_bytes(self) -> int:
        return len(self.arrays) * ENTRY_BYTES * self.rows

    def array(self, name: str) -> tuple[int, EntryCode]:
        """(byte offset in the slot, typecode) of header array `name`."""
        for k, field in enumerate(self.arrays):
            if field.name == name:
                return k * ENTRY_BYTES * self.rows, field.typecode
        raise KeyError(f"slot layout {self.kind!r} has no array {name!r}")

    def region(self, name: str) -> tuple[int, int]:
        """(byte offset in the slot, size in bytes) of region `name`."""
        offset = self.header_bytes
        for region in self.regions:
            offset = -(-offset // region.align) * region.align
            size = self.slot_bytes - offset if region.nbytes is None else region.nbytes
            if region.name == name:
                return offset, size
            offset += size
        raise KeyError(f"slot layout {self.kind!r} has no region {name!r}")

    def slot_offset(self, slot: int) -> int:
        """Byte offset of slot `slot` in the ring file."""
        return slot * self.slot_bytes


class WorkerSlot:
    """One slot of a mapped ring as memoryviews, by name (the worker's view; no numpy).

    `ring` is a writable byte memoryview of the whole ring. The full-length views are made once
    (a worker keeps one WorkerSlot per slot it fills); `array` and `region` hand out slices.
    Call `release()` before the ring is unmapped: the views pin the mapping.
    """

    __slots__ = ("layout", "_arrays", "_regions")

    def __init__(self, ring: memoryview, layout: SlotLayout, slot: int) -> None:
        self.layout = layout
        base = layout.slot_offset(slot)
        self._arrays: dict[str, memoryview] = {}
        for field in layout.arrays:
            offset, typecode = layout.array(field.name)
            start = base + offset
            self._arrays[field.name] = ring[start : start + layout.rows * ENTRY_BYTES].cast(typecode)
        self._regions: dict[str, memoryview] = {}
        for region in layout.regions:
            offset, size = layout.region(region.name)
            self._regions[region.name] = ring[base + offset : base + offset + size]

    def array(self, name: str, count: int) -> memoryview:
        """Entries [0, count) of header array `name`, cast to its typecode."""
        return self._arrays[name][:count]

    def region(self, name: str) -> memoryview:
        """Region `name` as bytes."""
        return self._regions[name]

    def release(self) -> None:
        """Release every view (idempotent); the slot is unusable afterwards."""
        for view in (*self._arrays.values(), *self._regions.values()):
            view.release()
        self._arrays.clear()
        self._regions.clear()


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES
