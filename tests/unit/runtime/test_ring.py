"""runtime/ring.py: the parent's numpy views name the same bytes as the worker's view; slot lending."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from datasetrt.errors import ResourceLimitError
from datasetrt.runtime.ring import Ring
from datasetrt.runtime.slot import SlotLayout, WorkerSlot


@pytest.fixture
def ring():
    r = Ring("test-ring", SlotLayout.records(8, 1000), 3)
    yield r
    r.close()


def test_file_size_and_lending(ring):
    assert os.fstat(ring.fd).st_size == 3 * ring.layout.slot_bytes
    taken = [ring.acquire() for _ in range(3)]
    assert sorted(taken) == [0, 1, 2] and ring.acquire() is None
    ring.release(taken[1])
    assert ring.acquire() == taken[1]


def test_the_slot_freed_last_is_lent_first(ring):
    """LIFO: a loop needing fewer slots than the ring has keeps reusing the same ones (warm in
    the caches; the others are never touched, so never in any process's PSS)."""
    a = ring.acquire()
    ring.release(a)
    assert ring.acquire() == a == 0
    c = ring.acquire()
    leased = ring.lease(c)
    ring.release(a)
    del leased  # the lease's return (its weakref callback) frees c after a
    assert ring.acquire() == c and ring.acquire() == a


def test_plan_written_by_the_parent_is_what_the_worker_reads(ring):
    cache_pos = np.array([2, 0, 1], dtype=np.int64)
    sample_id = np.array([5, 2**64 - 1, 0], dtype=np.uint64)
    row = np.array([10, 11, 12], dtype=np.int64)
    ring.write_plan(1, cache_pos=cache_pos, sample_id=sample_id, row=row)
    view = memoryview(ring.map)
    slot = WorkerSlot(view, ring.layout, 1)
    assert slot.array("cache_pos", 3).tolist() == [2, 0, 1]
    assert slot.array("sample_id", 3).tolist() == [5, 2**64 - 1, 0]
    assert slot.array("row", 3).tolist() == [10, 11, 12]
    slot.release()
    view.release()


def test_results_written_by_the_worker_are_the_parents_chunk(ring):
    ring.write_plan(2, cache_pos=np.array([1, 1]), sample_id=np.array([7, 8], dtype=np.uint64), row=np.array([3, 4]))
    view = memoryview(ring.map)
    slot = WorkerSlot(view, ring.layout, 2)
    for name, values in (("json_off", [0, 5]), ("json_len", [2, 2]), ("data_off", [2, 7]), ("data_len", [3, 1])):
        slot.array(name, 2)[:] = memoryview(np.array(values, dtype=np.int64).tobytes()).cast("q")
    slot.region("data")[:8] = b"{}abc{}z"
    slot.release()
    view.release()
    chunk = ring.chunk(2, first=40, rows=2)
    assert (chunk.first, chunk.rows) == (40, 2)
    assert chunk.sample_id.dtype == np.uint64 and chunk.sample_id.tolist() == [7, 8]
    assert chunk.cache_pos.tolist() == [1, 1] and chunk.row.tolist() == [3, 4]
    payloads = [bytes(chunk.data[o : o + n]) for o, n in zip(chunk.data_off, chunk.data_len)]
    texts = [bytes(chunk.data[o : o + n]) for o, n in zip(chunk.json_off, chunk.json_len)]
    assert payloads == [b"abc", b"z"] and texts == [b"{}", b"{}"]


def test_a_plan_must_name_exactly_the_parent_arrays(ring):
    with pytest.raises(ValueError, match="cache_pos"):
        ring.write_plan(0, cache_pos=np.zeros(1, dtype=np.int64), sample_id=np.zeros(1, dtype=np.uint64))


def test_close_with_a_live_view_keeps_the_mapping_for_it(ring):
    chunk_data = ring.region(0, "data")
    ring.close()  # a consumer still holds a view: no error, the view stays readable
    assert chunk_data[:4].tolist() == [0, 0, 0, 0]


def _blocks(ring) -> int:
    return os.fstat(ring.fd).st_blocks * 512


def test_a_slots_pages_are_reserved_at_its_first_acquire_and_never_before():
    """The ring is sized at creation, but only a slot that is acquired gets its pages reserved
    (posix_fallocate), once: a run that needs fewer slots than its ring never pays for the rest."""
    ring = Ring("test-lazy", SlotLayout.records(8, 1 << 20), 4)
    try:
        slot_bytes = ring.layout.slot_bytes
        assert os.fstat(ring.fd).st_size == 4 * slot_bytes and _blocks(ring) == 0 and ring.reserved_slots == 0
        a = ring.acquire()
        assert ring.reserved_slots == 1 and slot_bytes <= _blocks(ring) < 2 * slot_bytes
        ring.release(a)
        assert ring.acquire() == a and ring.reserved_slots == 1  # reused: nothing new reserved
        b = ring.acquire()
        assert b != a and ring.reserved_slots == 2 and _blocks(ring) >= 2 * slot_bytes
    finally:
        ring.close()


def test_a_refused_slot_reservation_is_typed_and_leaves_the_slot_free(monkeypatch):
    ring = Ring("test-refused", SlotLayout.records(8, 1000), 2)
    try:

        def no_space(fd, offset, size):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(
            ResourceLimitError,
            match=r"cannot reserve [0-9.]+ MiB of shared memory for the reader's test-refused[0-9]+ slot 0: No space",
        ):
            ring.acquire()
        assert len(ring.free) == 2 and ring.reserved_slots == 0
        monkeypatch.undo()
        assert ring.acquire() == 0 and ring.reserved_slots == 1
    finally:
        ring.close()
