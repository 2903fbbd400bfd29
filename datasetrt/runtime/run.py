"""One parallel read: a ring in a /dev/shm run dir, planned tasks to workers, reorder to plan order.

Boundary: numpy arrays and the worker pool; no Polars, no Torch, no record types (the consumer
turns chunks into samples or batches).

Head start: a run on a pool whose workers have not reported ready yet reads the head of its
window in this process, chunk by chunk, until one has; tasks start where the head stopped.

Flow control: a task is submitted only with a free ring slot, and a slot is freed only when the
consumer asks for the next chunk, so a slow consumer stops submissions and memory never grows
past the ring. Chunks come out strictly in window order whatever order workers finish in
(`_done` is the reorder window, keyed by window position; it holds slots, not copies).
"""

from __future__ import annotations

import heapq
import importlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasetrt import errors
from datasetrt.runtime.local import Chunk, LocalReader, local_chunks
from datasetrt.runtime.memory import MemoryBound, check_shm_capacity
from datasetrt.runtime.pool import WorkerPool
from datasetrt.runtime.protocol import SLOT_ARRAYS, CloseRun, OpenRun, ReadTask, TaskDone, TaskFailed, slot_header_bytes
from datasetrt.runtime.shm import create_shared_file, new_run_dir, remove_run_dir
from datasetrt.sampling.planner import Window

MIN_SLOT_BYTES = 1 << 20
MIN_ROWS_PER_TASK = 16
MAX_ROWS_PER_TASK = 4096
TASK_TARGET_BYTES = 1 << 20
RING_TARGET_BYTES = 16 << 20


@dataclass(frozen=True)
class RunShape:
    """Ring geometry of a run: `slots` x `slot_bytes`, at most `rows_per_task` rows per task."""

    slots: int
    rows_per_task: int
    slot_bytes: int

    @classmethod
    def plan(cls, prefetch_size: int, num_workers: int, max_record_bytes: int, rows_hint: int | None = None) -> RunShape:
        """Tasks carry ~TASK_TARGET_BYTES of records (16..512 rows; `rows_hint`, a batch size, up to
        4x that), so per-task messaging is
        amortised; in-flight samples <= max(prefetch_size, (2 x num_workers + 2) x rows_per_task).
        Every slot fits rows_per_task records of the largest stored size (a compressed record
        that decodes larger splits its task; one larger than a whole slot is read in-process)."""
        record = max(max_record_bytes, 1)
        rows = max(MIN_ROWS_PER_TASK, min(512, TASK_TARGET_BYTES // record))
        if rows_hint is not None:  # batch readers: one task per batch when a batch is not huge
            rows = max(1, min(rows_hint, MAX_ROWS_PER_TASK, max(MIN_ROWS_PER_TASK, 4 * TASK_TARGET_BYTES // record)))
        data = max(MIN_SLOT_BYTES, rows * record)
        slot_bytes = slot_header_bytes(rows) + data
        slot_bytes = -(-slot_bytes // 4096) * 4096
        # Two tasks per worker plus the consumer's keep every process busy; more slots only
        # help up to prefetch_size, and a ring beyond RING_TARGET_BYTES falls out of the CPU
        # caches and costs page faults (measured: 157 MiB ring reads 40% slower than 10 MiB; for
        # 150 KiB records a 16 MiB ring reads as fast as a 32 MiB one with 16 MiB less PSS).
        wanted = -(-prefetch_size // rows)
        slots = max(2 * num_workers + 2, min(wanted, RING_TARGET_BYTES // slot_bytes))
        return cls(slots, rows, slot_bytes)


class ParallelRun:
    """Reads one window through the pool's workers; iterate it for `Chunk`s in window order."""

    def __init__(self, get_pool: Callable[[], WorkerPool], num_workers: int, *, dataset_key: str,
                 cache_dirs: list[str], counts: list[int], verify_records: bool, window: Window,
                 prefetch_size: int, max_record_bytes: int, memory_limit_bytes: int, timeout_s: float,
                 fallback: LocalReader, rows_hint: int | None = None, identities: tuple = ()) -> None:
        """Check the memory bound and /dev/shm first; only then get (maybe start) the pool."""
        self.run_dir: Path | None = None
        self.window = window
        self.timeout_s = timeout_s
        self.fallback = fallback
        self.shape = RunShape.plan(prefetch_size, num_workers, max_record_bytes, rows_hint)
        bound = MemoryBound(self.shape.slots, self.shape.slot_bytes, num_workers)
        bound.check(memory_limit_bytes)
        check_shm_capacity(bound.ring_bytes)
        self.pool = pool = get_pool()
        self.run_id = pool.new_run_id()
        self.run_dir = new_run_dir()
        pool.run_dirs.add(self.run_dir)
        self._opened: set[int] = set()
        self._free = deque(range(self.shape.slots))
        self._todo: list[tuple[int, int]] = []  # heap of continuation ranges, served first
        self._next_first = 0
        self._done: dict[int, tuple[TaskDone, int]] = {}  # window position -> (result, task count)
        self._failure: TaskFailed | None = None
        self._task_ids = 0
        self._task_counts: dict[int, int] = {}
        try:
            self.ring = create_shared_file(self.run_dir / "ring", self.shape.slots * self.shape.slot_bytes)
            self.spec = OpenRun(
                run_id=self.run_id, dataset_key=dataset_key, cache_dirs=tuple(cache_dirs),
                verify_records=verify_records, ring_path=str(self.run_dir / "ring"),
                slot_bytes=self.shape.slot_bytes, rows_per_slot=self.shape.rows_per_task,
                identities=tuple(identities),
            )
            pool.handlers[self.run_id] = self._on_message
        except BaseException:
            self.close()
            raise

    # -- messages and submission ------------------------------------------------------------

    def _on_message(self, msg: object) -> None:
        if isinstance(msg, TaskFailed):
            self._failure = self._failure or msg
        elif isinstance(msg, TaskDone):
            count = self._task_counts.pop(msg.task_id)
            self._done[msg.first] = (msg, count)
            if 0 < msg.rows < count:
                # The slot filled early (records decoded larger than planned): queue the rest at
                # once, ahead of new ranges, so it is in flight before the consumer reaches it.
                heapq.heappush(self._todo, (msg.first + msg.rows, count - msg.rows))

    def _submit(self) -> None:
        while self._free and (self._todo or self._next_first < self.window.length):
            if self._todo:
                first, count = heapq.heappop(self._todo)
            else:
                first = self._next_first
                count = min(self.shape.rows_per_task, self.window.length - first)
                self._next_first += count
            worker = self.pool.least_loaded()
            if worker not in self._opened:
                self.pool.send(worker, self.spec)
                self._opened.add(worker)
            slot = self._free.popleft()
            self._write_plan(slot, first, count)
            self._task_ids += 1
            self._task_counts[self._task_ids] = count
            self.pool.inflight[worker] += 1
            self.pool.send(worker, ReadTask(self.run_id, self._task_ids, first, count, slot))

    def _write_plan(self, slot: int, first: int, count: int) -> None:
        """Publish window positions [first, first+count) into the slot header: the population
        rows and their (cache position, sample id), which the worker gathers."""
        rows = self.window.rows(first, count)
        cache_pos, sample_id = self.window.population.resolve(rows)
        r = self.shape.rows_per_task
        header = np.ndarray((SLOT_ARRAYS, r), dtype=np.int64, buffer=self.ring, offset=slot * self.shape.slot_bytes)
        header[4, :count] = cache_pos
        header[5, :count] = np.asarray(sample_id, dtype=np.uint64).view(np.int64)
        header[6, :count] = rows

    def _raise_failure(self, msg: TaskFailed) -> None:
        module, _, name = msg.error_type.rpartition(".")
        cls = None
        if module == "datasetrt.errors":
            cls = getattr(errors, name, None)
        elif module == "builtins":
            cls = getattr(importlib.import_module("builtins"), name, None)
        remote = errors.WorkerError(f"reader worker {msg.worker} traceback:\n{msg.traceback}")
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(msg.message)
            except Exception:  # noqa: BLE001 - exotic constructor
                exc = None
            if exc is not None:
                raise exc from remote
        raise errors.WorkerError(f"reader worker {msg.worker} failed: {msg.error_type}: {msg.message}") from remote

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Chunk]:
        header = slot_header_bytes(self.shape.rows_per_task)
        position = 0
        held: int | None = None
        try:
            # Head start: while no worker has reported ready (a pool just launched: ~0.1 s for
            # spawn), read the head of the window in this process; tasks start where it stopped.
            # Who reads a row never changes its bytes, so the output is the same either way.
            if not self.pool.ready_workers():
                head = local_chunks(self.fallback, self.window, self.shape.rows_per_task)
                for chunk in head:
                    yield chunk
                    position = chunk.first + chunk.rows
                    if self.pool.ready_workers():
                        break
                    self.pool.check_startup()
                head.close()
                self._next_first = position
            while position < self.window.length:
                if held is not None:
                    self._free.append(held)
                    held = None
                self._submit()
                while position not in self._done and self._failure is None:
                    self.pool.poll(self.timeout_s)
                    self._submit()
                if self._failure is not None:
                    self._raise_failure(self._failure)
                done, count = self._done.pop(position)
                if done.rows == 0:
                    # The next record alone exceeds a slot: read it here, queue the rest.
                    self._free.append(done.slot)
                    yield self._inline_chunk(position)
                    position += 1
                    if count > 1:
                        heapq.heappush(self._todo, (position, count - 1))
                    continue
                base = done.slot * self.shape.slot_bytes
                arrays = np.ndarray((SLOT_ARRAYS, self.shape.rows_per_task), dtype=np.int64, buffer=self.ring, offset=base)
                data = np.ndarray(self.shape.slot_bytes - header, dtype=np.uint8, buffer=self.ring, offset=base + header)
                n = done.rows
                held = done.slot
                yield Chunk(position, n, data, arrays[0, :n], arrays[1, :n], arrays[2, :n], arrays[3, :n],
                            arrays[4, :n], arrays[5, :n].view(np.uint64), arrays[6, :n])
                position += n
        finally:
            self.close()

    def _inline_chunk(self, position: int) -> Chunk:
        """Read one record too large for a ring slot in this process (its own buffer)."""
        rows = self.window.rows(position, 1)
        cache_pos, sample_id = self.window.population.resolve(rows)
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        datas, jsons = self.fallback.read(cache_pos, sample_id)
        js = jsons[0].encode()
        buf = np.frombuffer(js + datas[0], dtype=np.uint8)
        return Chunk(position, 1, buf, np.array([0]), np.array([len(js)]), np.array([len(js)]),
                     np.array([len(datas[0])]), cache_pos, sample_id, np.asarray(rows, dtype=np.int64))

    def close(self) -> None:
        """Idempotent: tell workers the run is over, drop its handler, remove its files.

        Safe at interpreter exit (module globals may be gone): it only uses what it holds.
        The pool also removes its runs' directories when it closes, so `runtime.close()` cleans
        up after iterators that are still open."""
        run_dir, self.run_dir = self.run_dir, None
        if run_dir is None:
            return
        pool = self.pool
        pool.handlers.pop(self.run_id, None)
        ring = getattr(self, "ring", None)
        if ring is not None:
            try:
                ring.close()
            except BufferError:
                pass  # a consumer still holds a chunk view; the mapping goes with it
        if run_dir not in pool.run_dirs:
            return  # the pool already removed it when it closed (crash, runtime.close, exit)
        pool.run_dirs.discard(run_dir)
        if not pool.closed:
            for worker in self._opened:
                try:
                    pool.send(worker, CloseRun(self.run_id))
                except Exception:  # noqa: BLE001 - a dead worker: the pool is closed by send()
                    break
        remove_run_dir(run_dir)
