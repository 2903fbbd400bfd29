"""One parallel read: a shared-memory ring, planned tasks to workers, reorder to plan order.

Boundary: numpy arrays, the worker pool and the ring; no Polars, no Torch, no record types (the
consumer turns chunks into samples or batches). Slot bytes are named in runtime/slot.py and
viewed through `Ring`; this module never indexes a slot by number.

Head start: a run on a pool whose workers have not reported ready yet, or over so many caches
(HEAD_START_CACHES) that a worker takes a while to open it, reads the head of its window in
this process, item by item, while the workers open the run (offered to each as it becomes
ready); it stops at the first RunOpened (or failure), and tasks start where the head stopped.

Flow control: a task is submitted only with a free ring slot, and a slot is freed only when the
consumer asks for the next chunk, so a slow consumer stops submissions and memory never grows
past the ring. Chunks come out strictly in window order whatever order workers finish in
(`_done` is the reorder window, keyed by window position; it holds slots, not copies).
"""

from __future__ import annotations

import hashlib
import heapq
import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from datasetrt import errors
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.gatherer import cache_layout
from datasetrt.runtime.local import Chunk, LocalReader, local_chunks
from datasetrt.runtime.memory import MemoryBound, collector_paused
from datasetrt.runtime.pool import PoolRun, WorkerPool
from datasetrt.runtime.protocol import CacheSet, OpenRun, ReadTask, RunOpened, TaskDone, TaskFailed
from datasetrt.runtime.ring import Ring
from datasetrt.runtime.slot import SlotLayout
from datasetrt.sampling.planner import Window

MIN_SLOT_BYTES = 1 << 20
MIN_ROWS_PER_TASK = 16
MAX_ROWS_PER_TASK = 4096
TASK_TARGET_BYTES = 1 << 20
RING_TARGET_BYTES = 16 << 20
DECODED_ESTIMATE_CAP = 16 << 20  # ring planning only; larger records split tasks or read in-process

ItemT = TypeVar("ItemT")  # what iterating a run yields


def cache_set(handles: Sequence[CacheHandle], verify_records: bool) -> CacheSet:
    """The caches as workers open them. Its key covers the paths and each cache's identity as
    opened (manifest and index device, inode, mtime), so a cache rewritten at the same path is
    never served from a worker's stale reader."""
    remotes = tuple(handle.remote for handle in handles) if any(h.remote is not None for h in handles) else ()
    with collector_paused():  # O(caches) long-lived tuples, no garbage
        dirs = tuple(_absolute(handle.path) for handle in handles)
        identities = tuple(handle.identity for handle in handles)
        h = hashlib.sha256(f"{verify_records}".encode())
        h.update("\0".join(dirs).encode(errors="surrogateescape"))
        h.update("\0".join(map(repr, identities)).encode())
        return CacheSet(
            h.hexdigest()[:32],
            dirs,
            identities,
            verify_records,
            remotes,
            () if remotes else tuple(cache_layout(handle) for handle in handles),
        )


def _absolute(path: os.PathLike[str]) -> str:
    """`str(Path(path).absolute())` without building a Path for the usual absolute directory."""
    text = os.fspath(path)
    return text if os.path.isabs(text) else str(Path(text).absolute())


# Index rows `planned_record_bytes` reads per cache at most (24 MiB of index.bin), in this many
# evenly spread blocks when a cache has more: planning costs what it reads, never what a manifest's
# sample_count claims (a sparse index.bin of terabytes is as quick to plan for as a small one).
PLAN_SCAN_ROWS = 1 << 20
PLAN_SCAN_BLOCKS = 16
# Indexes `planned_record_bytes` scans at most per dataset: a dataset of 10^5 small caches plans
# in what a few hundred index scans cost, not one mapping per cache.
PLAN_SCAN_CACHES = 256
# A run over at least this many caches gets a head start even on a ready pool (a worker's open of
# them takes longer than a chunk here); below it a ready pool reads the whole window (`start_workers`).
HEAD_START_CACHES = 1024


def planned_record_bytes(handles: Sequence[CacheHandle]) -> int:
    """Record size the ring is planned for: the largest stored record seen by scanning indexes
    (a vectorised pass over each, or over PLAN_SCAN_ROWS rows of it in PLAN_SCAN_BLOCKS evenly
    spread blocks when it has more), and at least every cache's average stored record (its shard
    bytes over its samples, from the manifest) and, for compressed caches, twice the largest
    average decoded payload (manifest uncompressed_byte_len / sample_count).

    Indexes are scanned in decreasing order of their cache's largest shard (no record of a cache
    is larger than its largest shard), stopping once no unscanned cache can hold a larger record
    than the largest seen, or after PLAN_SCAN_CACHES scans. The result only shapes the ring: a
    record that decodes bigger, or a larger one the scan did not see, still reads (its task
    splits, or the parent reads it in-process). O(caches + PLAN_SCAN_CACHES x PLAN_SCAN_ROWS)."""
    with collector_paused():
        return _planned_record_bytes(handles)


def _planned_record_bytes(handles: Sequence[CacheHandle]) -> int:
    largest = 0
    bounds: list[tuple[int, int]] = []  # (-largest shard, position) of each cache holding samples
    for k, handle in enumerate(handles):
        manifest = handle.manifest
        count = manifest.sample_count
        if not count:
            continue
        stored = biggest = decoded = 0
        compressed = False
        for shard in manifest.shards:
            size = shard.byte_len
            stored += size
            biggest = max(biggest, size)
            decoded += shard.uncompressed_byte_len
            compressed = compressed or shard.algo != "none"
        # Manifests are untrusted: an average is at most what its largest shard holds.
        largest = max(largest, min(stored // count, biggest))
        if compressed:
            largest = max(largest, min(2 * (decoded // count) + 256, DECODED_ESTIMATE_CAP))
        # A hostile index length is the gather kernel's to refuse; size by what can exist.
        bounds.append((-biggest, k))
    for neg_bound, k in heapq.nsmallest(PLAN_SCAN_CACHES, bounds):
        if -neg_bound <= largest:
            break  # no cache left can hold a larger record
        largest = max(largest, min(handles[k].scan_index(_largest_stored), -neg_bound))
    return largest


def _largest_stored(index: np.ndarray) -> int:
    """The largest byte_len among the scanned rows of `index` (n x 3 uint64, n > 0)."""
    rows = len(index)
    if rows <= PLAN_SCAN_ROWS:
        return int(index[:, 2].max())
    block = PLAN_SCAN_ROWS // PLAN_SCAN_BLOCKS
    starts = np.linspace(0, rows - block, PLAN_SCAN_BLOCKS).astype(np.int64)
    return max(int(index[start : start + block, 2].max()) for start in starts.tolist())


@dataclass(frozen=True)
class RunShape:
    """Ring geometry of a run: `slots` slots of `layout` (at most `rows_per_task` rows per task)."""

    slots: int
    layout: SlotLayout

    @property
    def rows_per_task(self) -> int:
        return self.layout.rows

    @property
    def slot_bytes(self) -> int:
        return self.layout.slot_bytes

    @classmethod
    def plan(
        cls, prefetch_size: int, num_workers: int, max_record_bytes: int, rows_hint: int | None = None
    ) -> RunShape:
        """Tasks carry ~TASK_TARGET_BYTES of records (16..512 rows; `rows_hint`, a batch size, up to
        4x that), so per-task messaging is
        amortised; in-flight samples <= max(prefetch_size, (2 x num_workers + 2) x rows_per_task).
        Every slot fits rows_per_task records of the largest stored size (a compressed record
        that decodes larger splits its task; one larger than a whole slot is read in-process)."""
        record = max(max_record_bytes, 1)
        rows = max(MIN_ROWS_PER_TASK, min(512, TASK_TARGET_BYTES // record))
        if rows_hint is not None:  # batch readers: one task per batch when a batch is not huge
            rows = max(1, min(rows_hint, MAX_ROWS_PER_TASK, max(MIN_ROWS_PER_TASK, 4 * TASK_TARGET_BYTES // record)))
        layout = SlotLayout.records(rows, max(MIN_SLOT_BYTES, rows * record))
        # Two tasks per worker plus the consumer's keep every process busy; more slots only
        # help up to prefetch_size, and a ring beyond RING_TARGET_BYTES falls out of the CPU
        # caches and costs page faults (measured: 157 MiB ring reads 40% slower than 10 MiB; for
        # 150 KiB records a 16 MiB ring reads as fast as a 32 MiB one with 16 MiB less PSS).
        wanted = -(-prefetch_size // rows)
        slots = max(2 * num_workers + 2, min(wanted, RING_TARGET_BYTES // layout.slot_bytes))
        return cls(slots, layout)


@dataclass(frozen=True)
class RunSpec:
    """What one parallel read is, fixed when it starts: the caches and the window to read, the
    ring sizing inputs (`prefetch_size`, `num_workers`, `max_record_bytes`, `rows_hint` — a batch
    size to align tasks with), the memory limit the bound is checked against, the per-wait
    timeout, and the parent's own reader (`fallback`: the head start and oversized records)."""

    caches: CacheSet
    window: Window
    num_workers: int
    prefetch_size: int
    max_record_bytes: int
    memory_limit_bytes: int
    timeout_s: float
    fallback: LocalReader
    rows_hint: int | None = None


class RingRun(ABC, Generic[ItemT]):
    """One window read through the pool's workers into a ring of `shape`: submission, reorder,
    failures and close. Subclasses iterate it for `ItemT`s in window order: `ParallelRun`
    (`Chunk`s, a "records" ring), `BatchRun` (runtime/batch_run.py: `PackedBatch`es)."""

    def __init__(
        self,
        spec: RunSpec,
        get_pool: Callable[[], WorkerPool],
        shape: RunShape,
        bound: MemoryBound,
        attach: bool = True,
    ) -> None:
        """Check the memory `bound` of the ring `shape` first; only then get (maybe start) the
        pool, register the run and take its ring (`_attach`; a subclass passing `attach=False`
        calls it later: until then `pool` and `ring` are None and `close()` does nothing)."""
        self._closed = True  # until the pool has registered the run
        self.window = spec.window
        self.timeout_s = spec.timeout_s
        self.fallback = spec.fallback
        self.num_workers = spec.num_workers
        self.shape = shape
        self._end = self.window.length  # window positions [0, _end) are read
        bound.check(spec.memory_limit_bytes)
        self._get_pool, self._caches = get_pool, spec.caches
        self.pool: WorkerPool | None = None
        self.ring: Ring | None = None
        self._todo: list[tuple[int, int]] = []  # heap of continuation ranges, served first
        self._next_first = 0
        self._done: dict[int, tuple[TaskDone, int]] = {}  # window position -> (result, task count)
        self._held: int | None = None  # "records": the slot of the chunk the consumer has (freed at its next request)
        self._failure: TaskFailed | None = None
        self._task_ids = 0
        self._task_counts: dict[int, int] = {}
        self._task_worker: dict[int, tuple[int, int, int]] = {}  # task id in flight -> (worker, slot, count)
        self._opened_by: set[int] = set()  # workers that reported RunOpened
        if attach:
            self._attach()

    def _attach(self) -> None:
        """Get (maybe start) the pool, register this run with it and take a ring: the pool's
        idle ring of this geometry, or a new one."""
        pool = self.pool = self._get_pool()
        self._run: PoolRun = pool.open_run(self._on_message)
        self.run_id, self._closed = self._run.run_id, False
        try:
            idle = pool.take_ring(self.shape.slots, self.shape.layout)  # a Ring a run gave back (close_run), or None
            ring = self.ring = idle if isinstance(idle, Ring) else Ring("ring", self.shape.layout, self.shape.slots)
            self._run.opening = OpenRun(self.run_id, self._caches, self.shape.layout, ring.key)
            self._run.ring_fd = ring.fd
        except BaseException:
            self.close()
            raise

    def _attached(self) -> tuple[WorkerPool, Ring]:
        """The pool and ring `_attach` took. Everything that submits, waits or reads slots runs
        after it (in the constructor, or after a `BatchRun`'s first batch)."""
        pool, ring = self.pool, self.ring
        if pool is None or ring is None:
            raise RuntimeError(f"{type(self).__name__} used before it was attached to its worker pool")
        return pool, ring

    # -- messages and submission ------------------------------------------------------------

    def _on_message(self, msg: object) -> None:
        if isinstance(msg, RunOpened):
            self._opened_by.add(msg.worker)
            return
        if isinstance(msg, (TaskDone, TaskFailed)):
            self._task_worker.pop(msg.task_id, None)
        if isinstance(msg, TaskFailed):
            self._failure = self._failure or msg
        elif isinstance(msg, TaskDone):
            count = self._task_counts.pop(msg.task_id)
            self._done[msg.first] = (msg, count)
            if 0 < msg.rows < count and self.shape.layout.kind == "records":
                # The slot filled early (records decoded larger than planned): queue the rest at
                # once, ahead of new ranges, so it is in flight before the consumer reaches it.
                heapq.heappush(self._todo, (msg.first + msg.rows, count - msg.rows))

    def _head_start(self, pool: WorkerPool) -> bool:
        """Whether this run begins by reading the head of its window here (module docstring)."""
        return not pool.ready_workers() or len(self._caches.cache_dirs) >= HEAD_START_CACHES

    def _taken_over(self, pool: WorkerPool) -> bool:
        """Called after each item of the head: offers the run to the workers ready now and
        routes what arrived; True once a worker has opened the run or the run failed (the
        failure is raised by the next `_wait_for`), so the head stops there."""
        pool.check_startup()
        pool.offer(self._run)
        pool.poll(0.0, idle_ok=True)
        return bool(self._opened_by) or self._failure is not None

    def _wait_for(self, position: int) -> tuple[TaskDone, int]:
        """Keep the ring's free slots working until the task starting at window `position` is
        done; pop and return its (result, row count). Raises the run's first failure."""
        pool, _ring = self._attached()
        try:
            self._submit()
            while position not in self._done and self._failure is None:
                pool.poll(self.timeout_s)
                self._submit()
        except errors.WorkerCrashedError as exc:
            self._raise_crash(exc)
        if self._failure is not None:
            self._raise_failure(self._failure)
        return self._done.pop(position)

    def _submit(self) -> None:
        pool, ring = self._attached()
        while self._todo or self._next_first < self._end:
            slot = ring.acquire()
            if slot is None:  # every slot is lent
                return
            if self._todo:
                first, count = heapq.heappop(self._todo)
            else:
                first = self._next_first
                count = min(self.shape.rows_per_task, self._end - first)
                self._next_first += count
            # The plan: population rows of window positions [first, first+count) and their
            # (cache position, sample id), which the worker gathers.
            rows = self.window.rows(first, count)
            cache_pos, sample_id = self.window.population.resolve(rows)
            ring.write_plan(slot, cache_pos=cache_pos, sample_id=sample_id, row=rows)
            self._task_ids += 1
            self._task_counts[self._task_ids] = count
            worker = pool.submit(self._run, ReadTask(self.run_id, self._task_ids, first, count, slot))
            self._task_worker[self._task_ids] = (worker, slot, count)

    def _raise_crash(self, exc: errors.WorkerCrashedError) -> None:
        """Raise `exc` again naming the shards the dead worker's unfinished tasks of this run
        were reading (their plans are still in their slots), a shard file now shorter than its
        manifest says (or gone) first: a reader worker reading mapped shards dies of SIGBUS
        when one is truncated under it. Unchanged when the run had no task on that worker."""
        try:
            note = self._crash_note(exc.worker)
        except Exception:  # the note must never hide the crash (a cache removed meanwhile, ...)
            note = None
        if note is None:
            raise exc
        what, named = note
        raise errors.WorkerCrashedError(f"{exc} {what}", worker=exc.worker, shards=named) from exc

    def _crash_note(self, dead: int | None) -> tuple[str, tuple[str, ...]] | None:
        """(`while reading shard ...`, shard paths) for `_raise_crash`, or None."""
        ring = self.ring
        plans = [(slot, count) for worker, slot, count in self._task_worker.values() if worker == dead]
        if ring is None or not plans:
            return None
        handles = self.fallback.handles
        shards: dict[tuple[int, int], None] = {}
        for slot, count in plans:
            plan = ring.arrays(slot, count)
            cache_pos, sample_id = plan["cache_pos"], plan["sample_id"]
            for k in np.unique(cache_pos).tolist():
                index = np.frombuffer(memoryview(handles[k].index_map()), dtype="<u8").reshape(-1, 3)
                sids = sample_id[cache_pos == k]
                ids = np.unique(index[sids[sids < len(index)].astype(np.int64), 0])
                for j in ids[ids < len(handles[k].manifest.shards)].tolist():
                    shards[(k, j)] = None
        short: list[str] = []
        named: list[str] = []
        for k, j in shards:
            path = str(handles[k].shard_paths()[j])
            declared = handles[k].manifest.shards[j].byte_len
            try:
                size: int | None = os.stat(path).st_size
            except OSError:
                size = None
            if size is None or size < declared:
                now = "is gone" if size is None else f"is now {size} bytes"
                short.append(f"{path} ({now}; its manifest says {declared}: truncated while it was read?)")
                named.insert(len(short) - 1, path)
            else:
                named.append(path)
        if short:
            what = f"while reading shard {'; shard '.join(short)}"
        else:
            more = f" and {len(named) - 4} more" if len(named) > 4 else ""
            what = f"while reading shard(s) {', '.join(named[:4])}{more}"
        return what, tuple(named)

    @staticmethod
    def _raise_failure(msg: TaskFailed) -> None:
        """Raise a worker's failure in this process: the same datasetrt (or builtin) error class
        and message (a CacheIOError with its errno and path, a StorageError with its URL, operation
        and status), the worker traceback as its cause."""
        module, _, name = msg.error_type.rpartition(".")
        cls = None
        if module == "datasetrt.errors":
            cls = getattr(errors, name, None)
        elif module == "builtins":
            cls = getattr(importlib.import_module("builtins"), name, None)
        remote = errors.WorkerError(f"reader worker {msg.worker} traceback:\n{msg.traceback}")
        if isinstance(cls, type) and issubclass(cls, Exception):
            exc: Exception | None
            try:
                if issubclass(cls, errors.CacheIOError):
                    exc = cls(msg.message, errno=msg.io_errno, path=msg.io_path)
                elif issubclass(cls, errors.StorageError):
                    exc = cls(msg.message, url=msg.store_url, operation=msg.store_operation, status=msg.store_status)
                else:
                    exc = cls(msg.message)
            except Exception:
                exc = None
            if exc is not None:
                raise exc from remote
        raise errors.WorkerError(f"reader worker {msg.worker} failed: {msg.error_type}: {msg.message}") from remote

    # -- iteration and close ------------------------------------------------------------------

    @abstractmethod
    def __iter__(self) -> Iterator[ItemT]:
        """The window's items in window order; the run closes when the iteration ends."""

    def close(self) -> None:
        """Idempotent: let the pool drop the run (handler, CloseRun to the workers that opened
        it) and close the ring (descriptor and mapping) — or, when no task is in flight and the
        run did not fail, hand the ring to the pool as its idle ring for the next run of the same
        geometry (runtime/pool.py). When the pool closes first (`runtime.close()` with iterators
        still open), the workers' mappings go with the workers and the ring's memory when this
        run is closed or collected."""
        if self._closed:
            return
        self._closed = True
        pool, ring = self.pool, self.ring
        if pool is None:
            raise RuntimeError(f"{type(self).__name__} registered with no worker pool")  # _attach sets it first
        kept = pool.close_run(self._run, keep_ring=ring if self._reusable() else None)
        if ring is not None and not kept:
            ring.close()  # a consumer may still hold a chunk view; the mapping goes with it

    def _reusable(self) -> bool:
        """Whether the ring can serve another run: no task in flight (no worker can still write
        a slot) and no failure; then the slots of finished tasks not consumed and of the chunk
        the consumer held go back, and every slot is free or leased (a lease returns its slot
        when its views are gone, in whichever run)."""
        ring = self.ring
        if ring is None or self._task_counts or self._failure is not None:
            return False
        for done, _count in self._done.values():
            ring.release(done.slot)
        self._done.clear()
        if self._held is not None:
            ring.release(self._held)
            self._held = None
        return len(ring.free) + ring.leased == ring.slots


class ParallelRun(RingRun[Chunk]):
    """Reads one window through the pool's workers into a "records" ring (`RunShape.plan`);
    iterate it for `Chunk`s in window order."""

    def __init__(self, spec: RunSpec, get_pool: Callable[[], WorkerPool]) -> None:
        shape = RunShape.plan(spec.prefetch_size, spec.num_workers, spec.max_record_bytes, spec.rows_hint)
        super().__init__(spec, get_pool, shape, MemoryBound(shape.slots, shape.slot_bytes, spec.num_workers))

    def __iter__(self) -> Iterator[Chunk]:
        position = 0
        try:
            pool, ring = self._attached()
            # Head start (module docstring): tasks start where it stopped. Who reads a row never
            # changes its bytes, so the output is the same either way.
            if self._head_start(pool):
                head = local_chunks(self.fallback, self.window, self.shape.rows_per_task)
                for chunk in head:
                    yield chunk
                    position = chunk.first + chunk.rows
                    if self._taken_over(pool):
                        break
                head.close()
                self._next_first = position
            while position < self.window.length:
                if self._held is not None:
                    ring.release(self._held)
                    self._held = None
                done, count = self._wait_for(position)
                if done.rows == 0:
                    # The next record alone exceeds a slot: read it here, queue the rest.
                    ring.release(done.slot)
                    yield self._inline_chunk(position)
                    position += 1
                    if count > 1:
                        heapq.heappush(self._todo, (position, count - 1))
                    continue
                self._held = done.slot
                yield ring.chunk(done.slot, position, done.rows)
                position += done.rows
        finally:
            self.close()

    def _inline_chunk(self, position: int) -> Chunk:
        """Read one record too large for a ring slot in this process (into its own buffer)."""
        rows = self.window.rows(position, 1)
        cache_pos, sample_id = self.window.population.resolve(rows)
        return self.fallback.read_chunk(cache_pos, sample_id, first=position, row=rows, out=np.empty(0, dtype=np.uint8))
