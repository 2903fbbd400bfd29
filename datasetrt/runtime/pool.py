"""The reader workers of one DatasetRuntime as a pool: runs, task submission, rings, poll and route.

Boundary: messages (runtime/protocol.py) and the pool's bookkeeping; no Polars, no Torch, no
records. How worker processes are started, watched and stopped is runtime/launch.py's; the
SIGTERM handler a running pool holds is runtime/signals.py's.

Invariants: workers start once (lazily, at the first parallel read) and are reused by every run;
the parent waits on all result pipes and all process sentinels together, so a worker that dies
wakes it at once and becomes a `WorkerCrashedError` naming the worker and its exit code; a pool
with a dead worker is closed and the next read starts a fresh one. `close()` is idempotent and
leaves no process behind (`launch.shutdown`: Shutdown, join with a timeout, then terminate/kill).
A pool that times out waiting for progress (`poll`, `check_startup`) kills its workers outright
(`close(hung=True)`) and raises `WorkerTimeoutError` within `launch.KILL_WAIT_S` of the timeout.

Runs (`open_run` / `submit` / `close_run`): the pool owns each run's id, which workers have
opened it, and the tasks in flight per worker (`inflight`, +1 at `submit`, -1 when the task's
TaskDone or TaskFailed is routed); a run owns its ring and slots. A worker new to a run gets
its OpenRun and then the ring's descriptor over its task socket (SCM_RIGHTS): shared memory has
no name, so no process death can leave one behind (runtime/shm.py). That happens at the
worker's first task of the run, or earlier through `offer` (a run's head start, so the worker
opens the run while the parent reads); the worker answers RunOpened, routed to the run.

Idle ring: a run that ends with no task in flight may hand its ring back (`close_run(run,
keep_ring=ring)`); the pool keeps at most one such ring, mapped by the parent and by the workers
that held it (`ring_holders`), and gives it to the next run asking for the same geometry
(`take_ring`). Each epoch of a loop then reuses one ring instead of reserving, zero-filling and
faulting in a new one. Any other run makes the pool drop it (ForgetRing to its holders); so does
`close()`.

SIGTERM: from `launch()` to `close()` the pool holds `signals.SigtermExit` (SystemExit(143) in the
main thread unless the program installed its own handler).
"""

from __future__ import annotations

import itertools
import pickle
import time
import weakref
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import multiprocess as mp
from multiprocess.connection import wait

from datasetrt.errors import ConfigError, WorkerCrashedError, WorkerError, WorkerTimeoutError
from datasetrt.runtime.launch import ForkedWorker, Poller, WorkerProcesses, launch_forked, launch_zygote, shutdown
from datasetrt.runtime.protocol import (
    CloseRun,
    ForgetRing,
    OpenRun,
    ReadTask,
    RunOpened,
    TaskDone,
    TaskFailed,
    WorkerReady,
)
from datasetrt.runtime.shm import send_fd, sweep_stale_runs
from datasetrt.runtime.signals import SigtermExit

START_METHODS = ("fork", "spawn")
_STOPPED = "reader workers are stopped (DatasetRuntime.close() or an earlier worker failure); start a new iterator"


def default_start_method() -> str:
    """spawn: safe with the threads Polars/pyarrow/torch start in the parent (fork is opt-in)."""
    return "spawn"


@dataclass(eq=False)
class PoolRun:
    """A run as the pool tracks it (`WorkerPool.open_run`): its id, the OpenRun a worker gets
    before its first task of the run and the ring descriptor sent right after it (`opening` and
    `ring_fd`, set by the run's owner, which also owns the descriptor), and the workers that got
    them."""

    run_id: int
    opening: OpenRun | None = None
    ring_fd: int = -1
    opening_bytes: bytes | None = None  # `opening` pickled once for every worker (it names every cache)
    workers: set[int] = field(default_factory=set)


class WorkerPool:
    """N reader workers with one task pipe and one result pipe each."""

    def __init__(self, num_workers: int, start_method: str | None = None, startup_timeout_s: float = 120.0) -> None:
        method = start_method or default_start_method()
        if method not in START_METHODS or method not in mp.get_all_start_methods():
            raise ConfigError(
                f"start_method must be one of {[m for m in START_METHODS if m in mp.get_all_start_methods()]}, got {method!r}"
            )
        self.num_workers = num_workers
        self.start_method = method
        self.startup_timeout_s = startup_timeout_s
        self.processes = WorkerProcesses()  # the processes and their channels (runtime/launch.py)
        self.ready: list[WorkerReady | None] = []
        self.inflight = [0] * num_workers  # tasks submitted to each worker and not answered yet
        self.handlers: dict[int, Callable[[object], None]] = {}  # run id -> its result handler
        self._run_ids = itertools.count(1)
        self.closed = False
        self.launched_at = 0.0
        self._finalizer: weakref.finalize | None = None
        self._sigterm: type[SigtermExit] | None = None  # set while this pool holds the SIGTERM handler
        self.idle_ring: Any = None  # a finished run's ring kept for the next run of its geometry
        self._poller = Poller()
        self.ring_holders: dict[int, set[int]] = {}  # ring key -> workers that were sent it (and map it)

    # -- lifecycle --------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the worker processes without waiting for them: their WorkerReady messages are
        routed by later polls (`ready_workers`). A worker that dies while starting is reported
        by the next poll like any other crash. spawn: one zygote forks the workers
        (`launch.launch_zygote`); fork: the workers are this process's children."""
        sweep_stale_runs()
        self._sigterm = SigtermExit if SigtermExit.acquire() else None
        self.launched_at = time.monotonic()
        try:
            if self.start_method == "spawn":
                launch_zygote(self.processes, self.num_workers)
            else:
                launch_forked(self.processes, self.num_workers, self.start_method)
        except BaseException:
            self.close()
            raise
        self.ready = [None] * self.num_workers
        self._finalizer = weakref.finalize(self, shutdown, self.processes)

    @property
    def _zygote(self) -> Any:
        """spawn: the process that forks the workers (None with fork)."""
        return self.processes.zygote

    def close(self, hung: bool = False) -> None:
        """Stop the workers (`launch.shutdown`); `hung`: the pool timed out, so they are killed
        outright and the stop is bounded by `launch.KILL_WAIT_S` (no orderly Shutdown)."""
        if self.closed:
            return
        self.closed = True
        ring, self.idle_ring = self.idle_ring, None
        if ring is not None:
            ring.close()  # the workers' mappings go with the workers
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is None or finalizer.detach() is not None:  # (None from detach: it ran at exit)
            shutdown(self.processes, hung=hung)
        holder, self._sigterm = self._sigterm, None
        if holder is not None:
            holder.release()

    @property
    def pids(self) -> list[int]:
        """Worker pids. With spawn the zygote forks them shortly after launch: this waits for its
        reports (bounded by startup_timeout_s), so a launched pool always lists every worker."""
        procs, status = self.processes.procs, self.processes.status
        if status is not None and not self.closed:
            deadline = time.monotonic() + self.startup_timeout_s
            while any(p.pid is None for p in procs) and time.monotonic() < deadline:
                if wait([self.processes.zygote_pidfd], 0):  # the zygote is gone: no more reports
                    status.pump(0.0)
                    break
                status.pump(0.05)
        return [p.pid for p in procs if p.pid is not None]

    @property
    def all_ready(self) -> bool:
        return bool(self.ready) and all(r is not None for r in self.ready)

    def ready_workers(self) -> list[int]:
        """Indices of workers that reported WorkerReady (after routing what has arrived)."""
        if self.closed:
            raise WorkerError(_STOPPED)
        if not self.all_ready:
            self.poll(0.0, what="worker start-up", idle_ok=True)
        return [i for i, r in enumerate(self.ready) if r is not None]

    def check_startup(self) -> None:
        """WorkerTimeoutError when some worker has not reported ready within startup_timeout_s."""
        if not self.all_ready and time.monotonic() - self.launched_at > self.startup_timeout_s:
            pids = [p.pid for p in self.processes.procs]  # as known: never wait here
            self.close(hung=True)
            raise WorkerTimeoutError(
                f"no progress from worker start-up in {self.startup_timeout_s:.0f} s (workers {pids}); "
                "the workers were killed"
            )

    # -- messages ---------------------------------------------------------------------------

    def open_run(self, handler: Callable[[object], None]) -> PoolRun:
        """Register a new run: a run id and the handler its TaskDone / TaskFailed messages are
        routed to. The caller creates the run's ring and sets `run.opening` (its OpenRun) and
        `run.ring_fd` before the first `submit`."""
        if self.closed:
            raise WorkerError(_STOPPED)
        run = PoolRun(next(self._run_ids))
        self.handlers[run.run_id] = handler
        return run

    def submit(self, run: PoolRun, task: ReadTask) -> int:
        """Send `task` to the ready worker with the fewest tasks in flight (any worker while none
        is ready) and count it in flight until its TaskDone / TaskFailed arrives; a worker new to
        the run gets `run.opening` first. Returns the worker index."""
        candidates = [i for i, r in enumerate(self.ready) if r is not None] or range(self.num_workers)
        worker = min(candidates, key=self.inflight.__getitem__)
        if worker not in run.workers:
            self._open_run_on(worker, run)
        self.inflight[worker] += 1
        self._send(worker, task)
        return worker

    def offer(self, run: PoolRun) -> None:
        """Send `run.opening` (and the ring) now to every ready worker that has not had it, so
        it opens the run (its reader of the run's caches, the ring's mapping) before its first
        task; each answers RunOpened, routed to the run's handler by a later poll."""
        for worker in self.ready_workers():
            if worker not in run.workers:
                self._open_run_on(worker, run)

    def _open_run_on(self, worker: int, run: PoolRun) -> None:
        if run.opening is None or run.ring_fd < 0:
            raise ValueError("PoolRun.opening and ring_fd must be set before the run's first task or offer")
        if run.opening_bytes is None:
            run.opening_bytes = pickle.dumps(run.opening, pickle.HIGHEST_PROTOCOL)
        try:
            self._send_bytes(worker, run.opening_bytes)
            self._send_fd(worker, run.ring_fd)
        except BaseException:
            # Interrupted between the two, the worker's channel would be out of step.
            self.close()
            raise
        run.workers.add(worker)
        self.ring_holders.setdefault(run.opening.ring_key, set()).add(worker)

    def close_run(self, run: PoolRun, keep_ring=None) -> bool:
        """Idempotent: drop the run's handler and tell the workers that opened it (CloseRun: they
        unmap its ring). Results of the run that still arrive are discarded. With `keep_ring`
        (the run's `Ring`; only with no task of the run in flight) the pool keeps it as its idle
        ring, replacing any other, and the workers keep it mapped. Returns whether it was kept
        (if not, the caller closes its ring)."""
        if self.handlers.pop(run.run_id, None) is None:
            return False  # closed already
        keep = keep_ring is not None and not self.closed
        if keep:
            self._drop_idle_ring()
            self.idle_ring = keep_ring
        if not self.closed:
            try:
                for worker in sorted(run.workers):
                    self._send(worker, CloseRun(run.run_id, keep))
            except Exception:
                pass
            if not keep and run.opening is not None:
                # Workers that kept this ring from an earlier run and had no task in this one.
                self._forget_ring(run.opening.ring_key, except_workers=run.workers)
        return keep and not self.closed  # (a worker that died meanwhile closed the pool and its idle ring)

    def take_ring(self, slots: int, layout) -> object | None:
        """The idle ring if it has exactly `slots` slots of `layout` (it is the caller's now),
        else None after dropping it (ForgetRing to the workers that map it)."""
        ring = self.idle_ring
        if ring is not None and ring.slots == slots and ring.layout == layout:
            self.idle_ring = None
            return ring
        self._drop_idle_ring()
        return None

    def _drop_idle_ring(self) -> None:
        ring, self.idle_ring = self.idle_ring, None
        if ring is None:
            return
        self._forget_ring(ring.key)
        ring.close()

    def _forget_ring(self, key: int, except_workers: AbstractSet[int] = frozenset()) -> None:
        """ForgetRing to the workers that map ring `key` (but `except_workers`); it has no holders after."""
        try:
            for worker in sorted(self.ring_holders.pop(key, set()) - except_workers):
                if not self.closed:
                    self._send(worker, ForgetRing(key))
        except Exception:
            pass

    def _send(self, worker: int, msg: object) -> None:
        self._send_bytes(worker, pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))

    def _send_bytes(self, worker: int, data: bytes) -> None:
        if self.closed:
            raise WorkerError(_STOPPED)
        try:
            self.processes.task_conns[worker].send_bytes(data)
        except (BrokenPipeError, OSError):
            self._raise_dead(worker)

    def _send_fd(self, worker: int, fd: int) -> None:
        try:
            send_fd(self.processes.task_conns[worker], fd)
        except (BrokenPipeError, OSError):
            self._raise_dead(worker)

    def poll(self, timeout_s: float, what: str = "reader workers", idle_ok: bool = False) -> None:
        """Wait up to timeout_s for results; route each to its run's handler.

        Raises WorkerCrashedError if a worker exited, WorkerTimeoutError if nothing arrived
        (unless idle_ok: a non-blocking check).
        """
        processes = self.processes
        ready = self._poller.wait(processes.waitables(), timeout_s)
        if not ready and idle_ok:
            return
        if not ready:
            pids = [p.pid for p in processes.procs]  # as known: never wait here
            # A hung worker must not poison later reads (the next read starts fresh), nor delay
            # this report: the workers are killed, not asked to stop (bounded by KILL_WAIT_S).
            self.close(hung=True)
            raise WorkerTimeoutError(
                f"no progress from {what} in {timeout_s:.0f} s (workers {pids}); the workers were killed"
            )
        for worker, conn in enumerate(processes.result_conns):
            if conn in ready:
                while True:
                    try:
                        msg = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        self._raise_dead(worker)
                    self._route(msg)
                    if not self._poller.readable(conn):
                        break
        zygote, status = processes.zygote, processes.status
        if zygote is not None and status is not None and status.conn in ready:
            status.pump(0.0)
        for worker, proc in enumerate(processes.procs):
            if proc.sentinel is not None and proc.sentinel in ready:
                self._raise_dead(worker)
        if zygote is not None and processes.zygote_pidfd in ready:
            zygote.join(0.5)
            code = zygote.exitcode
            self.close()
            raise WorkerCrashedError(
                f"the process that forks the reader workers (pid {zygote.pid}) "
                f"exited (code {code}); the workers were stopped"
            )

    def _route(self, msg: object) -> None:
        if isinstance(msg, WorkerReady):
            self.ready[msg.worker] = msg
            proc = self.processes.procs[msg.worker]
            if isinstance(proc, ForkedWorker):
                proc.forked(msg.pid)
            return
        if isinstance(msg, (TaskDone, TaskFailed)) and msg.task_id >= 0:
            self.inflight[msg.worker] -= 1
        if isinstance(msg, (TaskDone, TaskFailed, RunOpened)):
            handler = self.handlers.get(msg.run_id)
            if handler is not None:
                handler(msg)

    def _raise_dead(self, worker: int) -> None:
        proc = self.processes.procs[worker]
        proc.join(5.0 if isinstance(proc, ForkedWorker) else 0.5)  # forked: the zygote reports the code
        code = proc.exitcode
        self.close()
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        raise WorkerCrashedError(f"reader worker {worker} (pid {proc.pid}) {how}", worker=worker)
