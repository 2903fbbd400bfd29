"""runtime/slot.py: the slot layout's geometry and the worker's (numpy-free) view of a slot."""

from __future__ import annotations

import pytest

from datasetrt.runtime.slot import (
    ENTRY_BYTES,
    PAGE_BYTES,
    PARENT,
    RECORD_ARRAYS,
    WORKER,
    SlotArray,
    SlotLayout,
    SlotRegion,
    WorkerSlot,
)


@pytest.mark.parametrize("rows,data_bytes", [(1, 0), (16, 1 << 20), (37, 12_345), (512, 4096 * 512)])
def test_records_layout_geometry(rows, data_bytes):
    layout = SlotLayout.records(rows, data_bytes)
    header = len(RECORD_ARRAYS) * ENTRY_BYTES * rows
    assert layout.kind == "records" and layout.rows == rows
    assert layout.header_bytes == header == 7 * 8 * rows
    assert layout.slot_bytes % PAGE_BYTES == 0
    assert header + data_bytes <= layout.slot_bytes < header + data_bytes + PAGE_BYTES
    offsets = [layout.array(a.name)[0] for a in layout.arrays]
    assert offsets == [k * ENTRY_BYTES * rows for k in range(len(RECORD_ARRAYS))]
    assert layout.region("data") == (header, layout.slot_bytes - header)  # the rest of the slot
    assert layout.slot_offset(3) == 3 * layout.slot_bytes


def test_records_layout_names_who_writes_what():
    writers = {a.name: a.writer for a in RECORD_ARRAYS}
    assert {n for n, w in writers.items() if w == PARENT} == {"cache_pos", "sample_id", "row"}
    assert {n for n, w in writers.items() if w == WORKER} == {"json_off", "json_len", "data_off", "data_len"}
    assert SlotLayout.records(4, 100).array("sample_id")[1] == "Q"  # uint64; the rest are int64


def test_sized_regions_are_aligned_and_the_last_takes_the_rest():
    arrays = (SlotArray("a", "q", PARENT),)
    layout = SlotLayout("test", 3, 8192, arrays, (SlotRegion("first", 100, 64), SlotRegion("rest", None, 64)))
    assert layout.header_bytes == 24
    assert layout.region("first") == (64, 100)
    assert layout.region("rest") == (192, 8192 - 192)


def test_unknown_names_are_refused():
    layout = SlotLayout.records(2, 10)
    with pytest.raises(KeyError, match="no array 'payload'"):
        layout.array("payload")
    with pytest.raises(KeyError, match="no region 'json'"):
        layout.region("json")


def test_worker_view_reads_and_writes_the_named_bytes():
    layout = SlotLayout.records(4, 64)
    ring = bytearray(2 * layout.slot_bytes)
    view = memoryview(ring)
    slot = WorkerSlot(view, layout, 1)
    base = layout.slot_offset(1)
    sample_id = slot.array("sample_id", 3)
    assert sample_id.format == "Q" and len(sample_id) == 3
    sample_id[:] = memoryview(bytes(8 * 3)).cast("Q")
    sample_id[2] = 2**64 - 1
    offset, _ = layout.array("sample_id")
    assert ring[base + offset + 16 : base + offset + 24] == b"\xff" * 8
    data = slot.region("data")
    data[:3] = b"abc"
    assert ring[base + layout.header_bytes : base + layout.header_bytes + 3] == b"abc"
    assert len(data) == layout.slot_bytes - layout.header_bytes
    assert not any(ring[: layout.slot_bytes])  # slot 0 untouched
    del sample_id, data
    slot.release()
    view.release()
    ring.append(0)  # no view pins the buffer any more (a bytearray with exports cannot grow)


def test_layout_pickles_as_plain_data():
    import pickle

    layout = SlotLayout.records(16, 1 << 20)
    assert pickle.loads(pickle.dumps(layout)) == layout
