"""One parallel read as batches: one batch = one task = one ring slot, gathered by a reader worker
in its final layout and leased to the consumer.

Boundary: numpy arrays, the worker pool and the ring (runtime/run.py's `RingRun` machinery:
submission, reorder, failures, close); no Polars, no Torch, no record types (`PackedBatch`es
out; runtime/batches.py makes SampleBatches).

Flow: the parent plans batch k (window positions [k*B, (k+1)*B)) into a free slot's header and
sends one ReadTask; the worker gathers the whole batch into the slot's "payload" region (the
"batch" layout, runtime/slot.py); when batch k is the next in window order, the parent yields
it as views of the slot derived from `Ring.lease(slot)`. The slot returns to the ring when the
last of those views (and everything made from them: arrays, tensors, DLPack capsules) is gone,
at any time, even after this run closed (the mapping outlives every view).

Ring exhaustion: at least `num_workers` slots always circulate (free or in flight), so the
workers never starve and the run never blocks on the consumer: a batch that would leave fewer
is delivered as a private copy (its slot returns at once). In a ring with a slot for every batch
of the window (a short epoch: `batch_ring` never gives it more), only as many slots as batches
remain to be delivered (at most `num_workers`) need to circulate, so it copies only when the
consumer still holds batches of an earlier run of the same ring. With `for b in it`, the consumer
holds the previous batch while the next is fetched, so `RunShape` gives batch runs at least
num_workers + 2 slots. A batch whose payloads outgrow its slot (compressed records decoding
larger than planned) is read again by the parent into a private buffer. Both are counted in
`copies`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from datasetrt.runtime.local import BatchShape, BufferPool, PackedBatch, local_batches, read_packed
from datasetrt.runtime.memory import MemoryBound
from datasetrt.runtime.pool import WorkerPool
from datasetrt.runtime.protocol import TaskDone
from datasetrt.runtime.run import RING_TARGET_BYTES, RingRun, RunShape, RunSpec
from datasetrt.runtime.slot import SlotLayout

STAGED_RUN_BYTES = 4 << 20  # the gather kernel's SPAN_MAX_BYTES: the most a worker stages at once


def batch_ring(spec: RunSpec, shape: BatchShape) -> tuple[RunShape, MemoryBound]:
    """The ring of a batch run and its memory bound. A slot holds one batch read in place
    (`shape.buffer_bytes(batch_size)` of payload region); slots = min(batches in the window,
    max(num_workers + 2, min(max(2 x num_workers + 2, ceil(prefetch_size / batch_size)),
    RING_TARGET_BYTES / slot))): two tasks per worker and the consumer's two batches while small
    slots keep the ring in the CPU caches, down to one task per worker for large batches
    (150 KiB x 256 records: 4 slots of 38 MiB), whose tree PSS the ring dominates; never more
    slots than the window has batches (every epoch of a loop has the same window length, so
    the idle ring still fits the next epoch). The consumer may hold slots - num_workers
    batches, or every slot when the ring has one per batch."""
    rows = shape.batch_size
    layout = SlotLayout.batch(rows, shape.buffer_bytes(rows), shape.check, shape.keep_json)
    workers = spec.num_workers
    wanted = max(2 * workers + 2, -(-spec.prefetch_size // rows))
    batches = max(1, -(-shape.end(spec.window.length) // rows))
    slots = min(batches, max(workers + 2, min(wanted, RING_TARGET_BYTES // layout.slot_bytes)))
    held = slots if slots >= batches else slots - workers
    scratch = min(layout.slot_bytes, max(STAGED_RUN_BYTES, spec.max_record_bytes))
    return RunShape(slots, layout), MemoryBound(slots, layout.slot_bytes, workers, held, scratch)


class BatchRun(RingRun[PackedBatch]):
    """Reads one window through the pool's workers as batches of `shape`; iterate it for
    `PackedBatch`es in window order (leased views of ring slots, or private copies)."""

    def __init__(
        self, spec: RunSpec, get_pool: Callable[[], WorkerPool], shape: BatchShape, pool_running: bool = True
    ) -> None:
        """`pool_running=False` (the runtime's workers are not launched yet): the first batch
        is read in this process before `get_pool` launches them: forking a worker from a process
        that imported torch pays for the parent's atfork handlers and page tables, which the first
        batch would otherwise wait for."""
        ring_shape, bound = batch_ring(spec, shape)
        super().__init__(spec, get_pool, ring_shape, bound, attach=pool_running)
        self.batch_shape = shape
        self._end = shape.end(self.window.length)
        # A slot for every batch of the window: circulating slots are needed only for the batches left.
        self._slot_per_batch = ring_shape.slots * shape.batch_size >= self._end
        self._buffers = BufferPool()
        self.copies = 0  # batches delivered as private copies (ring exhausted, or outgrown slot)

    def __iter__(self) -> Iterator[PackedBatch]:
        position = 0
        try:
            # Head start, as ParallelRun: batches read here while no worker has opened the run. A
            # pool not launched yet (pool_running=False) is launched after the first of them.
            if self.pool is None or self._head_start(self.pool):
                head = local_batches(self.fallback, self.window, self.batch_shape, buffers=self._buffers)
                for packed in head:
                    position = packed.first + packed.rows
                    yield packed
                    if self.pool is None:
                        self._attach()
                    pool, _ring = self._attached()
                    if self._taken_over(pool):
                        break
                head.close()
                # The head's private buffers go with its batches, not with the run: the ring
                # serves the rest (a batch outgrowing its slot gets a buffer of its own).
                self._buffers = BufferPool()
                if self.pool is None:  # an empty window
                    self._attach()
                self._next_first = position
            while position < self._end:
                # (slots whose leases ended since the last batch go back to work first)
                done, count = self._wait_for(position)
                position += count
                # Yielded without a local name: while suspended, this frame holds nothing of the
                # batch, so the consumer's references alone decide when its slot returns.
                yield self._delivered(done, position - count, count)
        finally:
            self.close()

    def _delivered(self, done: TaskDone, first: int, count: int) -> PackedBatch:
        """Batch [first, first+count) of slot `done.slot`: leased views, or a private copy."""
        _pool, ring = self._attached()
        slot = done.slot
        plan = ring.arrays(slot, count)
        cache_pos, sample_id, row = plan["cache_pos"].copy(), plan["sample_id"].copy(), plan["row"].copy()
        if done.rows < count:
            # The payloads outgrew the slot: read the whole batch here instead.
            ring.release(slot)
            self.copies += 1
            return read_packed(self.fallback, cache_pos, sample_id, row, first, self.batch_shape, self._buffers)
        layout = ring.layout
        circulating = self.num_workers
        if self._slot_per_batch:  # (batches after this one, each needing a slot of its own)
            circulating = min(circulating, -(-(self._end - first - count) // self.batch_shape.batch_size))
        if ring.leased + 1 > ring.slots - circulating:
            # Leasing this slot would leave fewer than `circulating` slots working: a copy instead.
            offsets = ring.region(slot, "offsets")[: 8 * (count + 1)].view(np.int64).copy()
            json = self._json(plan, count)
            end = int(offsets[count]) if json is None else len(ring.region(slot, "payload"))
            data = ring.region(slot, "payload")[:end].copy()
            ring.release(slot)
            self.copies += 1
            return PackedBatch(first, count, data, offsets, cache_pos, sample_id, row, True, *(json or (None, None)))
        lease = ring.lease(slot)
        off_at, _ = layout.region("offsets")
        data_at, data_size = layout.region("payload")
        offsets = lease[off_at : off_at + 8 * (count + 1)].view(np.int64)
        json = self._json(plan, count)
        return PackedBatch(
            first,
            count,
            lease[data_at : data_at + data_size],
            offsets,
            cache_pos,
            sample_id,
            row,
            False,
            *(json or (None, None)),
        )

    def _json(self, plan: dict, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Copies of json_off/json_len of a slot's batch (validate_cache runs), else None."""
        if not self.batch_shape.keep_json:
            return None
        return plan["json_off"].copy(), plan["json_len"].copy()
