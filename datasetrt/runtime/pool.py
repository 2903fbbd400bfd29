"""The reader worker processes of one DatasetRuntime: start, route messages, watch, stop.

Boundary: processes and pipes (the `multiprocess` package); no Polars, no Torch, no records.

Invariants: workers start once (lazily, at the first parallel read) and are reused by every run;
the parent waits on all result pipes and all process sentinels together, so a worker that dies
wakes it at once and becomes a `WorkerCrashedError` naming the worker and its exit code; a pool
with a dead worker is closed and the next read starts a fresh one. `close()` is idempotent and
leaves no process behind (Shutdown, join with a timeout, then terminate/kill).

Runs (`open_run` / `submit` / `close_run`): the pool owns each run's id, which workers have
opened it, and the tasks in flight per worker (`inflight`, +1 at `submit`, -1 when the task's
TaskDone or TaskFailed is routed); a run owns its ring and slots. A worker new to a run gets
its OpenRun and then the ring's descriptor over its task socket (SCM_RIGHTS): shared memory has
no name, so no process death can leave one behind (runtime/shm.py).

Idle ring: a run that ends with no task in flight may hand its ring back (`close_run(run,
keep_ring=ring)`); the pool keeps at most one such ring, mapped by the parent and by the workers
that held it (`ring_holders`), and gives it to the next run asking for the same geometry
(`take_ring`). Each epoch of a loop then reuses one ring instead of reserving, zero-filling and
faulting in a new one (150 KiB x 256-record batches: a 150 MiB posix_fallocate per epoch). Any
other run makes the pool drop it (ForgetRing to its holders); so does `close()`.

SIGTERM: while a pool runs, a process whose SIGTERM disposition is the default gets a handler
that raises SystemExit(143) in the main thread, so `finally` blocks and the runtime's cleanup
run as for Ctrl-C and the exit status is still 143 (128 + SIGTERM). A handler the program
installed (or SIG_IGN) is never replaced; the default comes back when the last pool closes
(from the main thread), and forked children start with the default.
"""

from __future__ import annotations

import gc
import io
import itertools
import os
import pickle
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import multiprocess as mp
from multiprocess import popen_spawn_posix, spawn, util
from multiprocess.connection import wait
from multiprocess.context import SpawnProcess, reduction, set_spawning_popen

from datasetrt.errors import ConfigError, WorkerCrashedError, WorkerError, WorkerTimeoutError
from datasetrt.runtime.protocol import (
    CloseRun,
    ForgetRing,
    OpenRun,
    ReadTask,
    Shutdown,
    TaskDone,
    TaskFailed,
    WorkerExited,
    WorkerForked,
    WorkerReady,
)
from datasetrt.runtime.shm import send_fd, sweep_stale_runs
from datasetrt.runtime.worker import worker_main, zygote_main

START_METHODS = ("fork", "spawn")
_STOPPED = "reader workers are stopped (DatasetRuntime.close() or an earlier worker failure); start a new iterator"
JOIN_TIMEOUT_S = 5.0


def default_start_method() -> str:
    """spawn: safe with the threads Polars/pyarrow/torch start in the parent (fork is opt-in)."""
    return "spawn"


def _raise_system_exit(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


class _SigtermExit:
    """The SIGTERM handler pools hold (module docstring): installed by the first holder, put
    back to the default by the last, never over a handler the program installed itself."""

    holders = 0

    @classmethod
    def acquire(cls) -> bool:
        """Hold the handler (installing it over SIG_DFL); False when this is not the main thread
        or the program has its own handler (the caller then holds nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_system_exit)
        elif current is not _raise_system_exit:
            return False
        cls.holders += 1
        return True

    @classmethod
    def release(cls, _signal=signal, _threading=threading, _handler=_raise_system_exit) -> None:
        """(Modules bound as defaults: a pool may be closed during interpreter teardown.)"""
        cls.holders -= 1
        if (
            cls.holders == 0
            and _threading.current_thread() is _threading.main_thread()
            and _signal.getsignal(_signal.SIGTERM) is _handler
        ):
            _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)

    @classmethod
    def after_fork_in_child(cls) -> None:
        """A forked child (a reader or DataLoader worker) has no pool: SIGTERM kills it as usual."""
        cls.holders = 0
        try:
            if signal.getsignal(signal.SIGTERM) is _raise_system_exit:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main thread (cannot happen in a fresh child; be safe)
            pass


os.register_at_fork(after_in_child=_SigtermExit.after_fork_in_child)


@dataclass(eq=False)
class PoolRun:
    """A run as the pool tracks it (`WorkerPool.open_run`): its id, the OpenRun a worker gets
    before its first task of the run and the ring descriptor sent right after it (`opening` and
    `ring_fd`, set by the run's owner, which also owns the descriptor), and the workers that got
    them."""

    run_id: int
    opening: OpenRun | None = None
    ring_fd: int = -1
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
        self.procs: list = []
        self.task_conns: list = []
        self.result_conns: list = []
        self.ready: list[WorkerReady | None] = []
        self.inflight = [0] * num_workers  # tasks submitted to each worker and not answered yet
        self.handlers: dict[int, Callable[[object], None]] = {}  # run id -> its result handler
        self._run_ids = itertools.count(1)
        self.closed = False
        self.launched_at = 0.0
        self._finalizer = None
        self._zygote = None  # spawn: the process that forks the workers
        self._zygote_pidfd: int | None = None
        self._status: _StatusChannel | None = None
        self._sigterm: type[_SigtermExit] | None = None  # set while this pool holds the SIGTERM handler
        self.idle_ring = None  # a finished run's ring kept for the next run of its geometry
        self._poller = _Poller()
        self.ring_holders: dict[int, set[int]] = {}  # ring key -> workers that were sent it (and map it)

    # -- lifecycle --------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the worker processes without waiting for them: their WorkerReady messages are
        routed by later polls (`ready_workers`). A worker that dies while starting is reported
        by the next poll like any other crash."""
        sweep_stale_runs()
        self._sigterm = _SigtermExit if _SigtermExit.acquire() else None
        self.launched_at = time.monotonic()
        if self.start_method == "spawn":
            self._launch_zygote()
            return
        ctx = mp.get_context(self.start_method)
        process_class = ctx.Process
        if self.start_method == "fork":
            # Forked children inherit every object in the permanent generation, which their
            # garbage collections never traverse, so they do not copy-on-write the parent's
            # pages; the parent unfreezes right after the forks (no lasting effect on it).
            gc.freeze()
        try:
            for index in range(self.num_workers):
                task_w, task_r = ctx.Pipe(duplex=True)  # a socket pair: it carries ring descriptors
                res_r, res_w = ctx.Pipe(duplex=False)
                proc = process_class(
                    target=worker_main,
                    args=(index, task_r, res_w, os.getpid()),
                    name=f"datasetrt-reader-{index}",
                    daemon=True,
                )
                with _main_module_hidden():
                    proc.start()
                task_r.close()
                res_w.close()
                self.procs.append(proc)
                self.task_conns.append(task_w)
                self.result_conns.append(res_r)
                self.ready.append(None)
            if self.start_method == "fork":
                gc.unfreeze()
            self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.task_conns, self.result_conns)
        except BaseException:
            gc.unfreeze()
            self.close()
            raise

    def _launch_zygote(self) -> None:
        """spawn: one fresh interpreter (the zygote, `worker.zygote_main`) forks the workers, so
        they share its pages; the zygote reports their pids and exit codes on a status pipe."""
        ctx = mp.get_context("spawn")
        try:
            # Task channels are socket pairs (they carry ring descriptors); results are pipes.
            ends = [(ctx.Pipe(duplex=True), ctx.Pipe(duplex=False)) for _ in range(self.num_workers)]
            status_r, status_w = ctx.Pipe(duplex=False)
            self._status = _StatusChannel(status_r)
            zygote = _ReaderSpawnProcess(
                target=zygote_main,
                name="datasetrt-reader-zygote",
                daemon=True,
                args=([t[0] for t, _ in ends], [r[1] for _, r in ends], status_w, os.getpid()),
            )
            with _main_module_hidden():
                zygote.start()
            self._zygote = zygote
            # Its `sentinel` is a pipe the workers inherit: it fires only when they are all gone.
            # A pidfd fires when the zygote itself exits.
            self._zygote_pidfd = os.pidfd_open(zygote.pid)  # closed by _shutdown, exactly once
            status_w.close()
            for index, ((task_r, task_w), (res_r, res_w)) in enumerate(ends):
                task_r.close()
                res_w.close()
                self.procs.append(_ForkedWorker(index, self._status))
                self.task_conns.append(task_w)
                self.result_conns.append(res_r)
                self.ready.append(None)
            self._finalizer = weakref.finalize(
                self,
                _shutdown,
                self.procs,
                self.task_conns,
                self.result_conns,
                zygote,
                self._status,
                self._zygote_pidfd,
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        ring, self.idle_ring = self.idle_ring, None
        if ring is not None:
            ring.close()  # the workers' mappings go with the workers
        if self._finalizer is not None:
            self._finalizer()
        else:
            _shutdown(self.procs, self.task_conns, self.result_conns, self._zygote, self._status, self._zygote_pidfd)
        holder, self._sigterm = self._sigterm, None
        if holder is not None:
            holder.release()

    @property
    def pids(self) -> list[int]:
        """Worker pids. With spawn the zygote forks them ~0.1 s after launch: this waits for its
        reports (bounded by startup_timeout_s), so a launched pool always lists every worker."""
        if self._status is not None and not self.closed:
            deadline = time.monotonic() + self.startup_timeout_s
            while any(p.pid is None for p in self.procs) and time.monotonic() < deadline:
                if wait([self._zygote_pidfd], 0):  # the zygote is gone: no more reports
                    self._status.pump(0.0)
                    break
                self._status.pump(0.05)
        return [p.pid for p in self.procs if p.pid is not None]

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
            pids = [p.pid for p in self.procs]  # as known: never wait here
            self.close()
            raise WorkerTimeoutError(
                f"no progress from worker start-up in {self.startup_timeout_s:.0f} s (workers {pids})"
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
        if run.opening is None or run.ring_fd < 0:
            raise ValueError("PoolRun.opening and ring_fd must be set before the run's first task")
        candidates = [i for i, r in enumerate(self.ready) if r is not None] or range(self.num_workers)
        worker = min(candidates, key=self.inflight.__getitem__)
        if worker not in run.workers:
            try:
                self._send(worker, run.opening)
                self._send_fd(worker, run.ring_fd)
            except BaseException:
                # Interrupted between the two, the worker's channel would be out of step.
                self.close()
                raise
            run.workers.add(worker)
            self.ring_holders.setdefault(run.opening.ring_key, set()).add(worker)
        self.inflight[worker] += 1
        self._send(worker, task)
        return worker

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

    def _forget_ring(self, key: int, except_workers: set[int] = frozenset()) -> None:
        """ForgetRing to the workers that map ring `key` (but `except_workers`); it has no holders after."""
        try:
            for worker in sorted(self.ring_holders.pop(key, set()) - except_workers):
                if not self.closed:
                    self._send(worker, ForgetRing(key))
        except Exception:
            pass

    def _send(self, worker: int, msg: object) -> None:
        if self.closed:
            raise WorkerError(_STOPPED)
        try:
            self.task_conns[worker].send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            self._raise_dead(worker)

    def _send_fd(self, worker: int, fd: int) -> None:
        try:
            send_fd(self.task_conns[worker], fd)
        except (BrokenPipeError, OSError):
            self._raise_dead(worker)

    def poll(self, timeout_s: float, what: str = "reader workers", idle_ok: bool = False) -> None:
        """Wait up to timeout_s for results; route each to its run's handler.

        Raises WorkerCrashedError if a worker exited, WorkerTimeoutError if nothing arrived
        (unless idle_ok: a non-blocking check).
        """
        waitables = [*self.result_conns, *(p.sentinel for p in self.procs if p.sentinel is not None)]
        if self._zygote is not None:
            waitables += [self._status.conn, self._zygote_pidfd]
        ready = self._poller.wait(waitables, timeout_s)
        if not ready and idle_ok:
            return
        if not ready:
            pids = [p.pid for p in self.procs]  # as known: never wait here
            self.close()  # a hung worker must not poison later reads: the next read starts fresh
            raise WorkerTimeoutError(f"no progress from {what} in {timeout_s:.0f} s (workers {pids})")
        for worker, conn in enumerate(self.result_conns):
            if conn in ready:
                while True:
                    try:
                        msg = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        self._raise_dead(worker)
                    self._route(msg)
                    if not self._poller.readable(conn):
                        break
        if self._zygote is not None and self._status.conn in ready:
            self._status.pump(0.0)
        for worker, proc in enumerate(self.procs):
            if proc.sentinel is not None and proc.sentinel in ready:
                self._raise_dead(worker)
        if self._zygote is not None and self._zygote_pidfd in ready:
            self._zygote.join(0.5)
            code = self._zygote.exitcode
            self.close()
            raise WorkerCrashedError(
                f"the process that forks the reader workers (pid {self._zygote.pid}) "
                f"exited (code {code}); the workers were stopped"
            )

    def _route(self, msg: object) -> None:
        if isinstance(msg, WorkerReady):
            self.ready[msg.worker] = msg
            proc = self.procs[msg.worker]
            if isinstance(proc, _ForkedWorker):
                proc.forked(msg.pid)
            return
        if isinstance(msg, (TaskDone, TaskFailed)):
            if msg.task_id >= 0:
                self.inflight[msg.worker] -= 1
            handler = self.handlers.get(msg.run_id)
            if handler is not None:
                handler(msg)

    def _raise_dead(self, worker: int) -> None:
        proc = self.procs[worker]
        proc.join(5.0 if isinstance(proc, _ForkedWorker) else 0.5)  # forked: the zygote reports the code
        code = proc.exitcode
        self.close()
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        raise WorkerCrashedError(f"reader worker {worker} (pid {proc.pid}) {how}")


class _Poller:
    """`multiprocess.connection.wait` for the pool's hot loop: one `select.poll` object kept while
    the set of waitables stays the same (wait() builds and registers a new selector on every call,
    and Connection.poll() another: ~2 per batch, a third of the parent's CPU per batch on 2 KiB x
    256-record batches), and one per connection for "another message waiting?" checks."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] = ()
        self._poll = select.poll()
        self._by_fd: dict[int, object] = {}
        self._single: dict[int, select.poll] = {}

    def wait(self, waitables: list, timeout_s: float) -> list:
        """The waitables (connections or descriptors) readable within timeout_s, as given."""
        fds = tuple(w if isinstance(w, int) else w.fileno() for w in waitables)
        if fds != self._key:
            self._poll = select.poll()
            for fd in fds:
                self._poll.register(fd, select.POLLIN)
            self._key, self._by_fd = fds, dict(zip(fds, waitables))
        events = self._poll.poll(None if timeout_s is None else max(0, int(timeout_s * 1000 + 0.999)))
        return [self._by_fd[fd] for fd, _ in events]

    def readable(self, conn) -> bool:
        """Whether `conn` has data (or EOF) now, without blocking."""
        fd = conn.fileno()
        poll = self._single.get(fd)
        if poll is None:
            poll = self._single[fd] = select.poll()
            poll.register(fd, select.POLLIN)
        return bool(poll.poll(0))


class _StatusChannel:
    """The zygote's status pipe: WorkerForked / WorkerExited messages, dispatched to the workers."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.workers: dict[int, _ForkedWorker] = {}
        self.ended = False  # the zygote closed its end (exited): nothing more will arrive

    def pump(self, timeout_s: float) -> None:
        """Read every message that arrives within timeout_s (0: what is there now)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                    return
                msg = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                self.ended = True  # the zygote is gone (it reported everything it could)
                return
            worker = self.workers.get(msg.worker)
            if worker is not None:
                if isinstance(msg, WorkerForked):
                    worker.forked(msg.pid)
                elif isinstance(msg, WorkerExited):
                    worker.exitcode = msg.exitcode
            if timeout_s == 0.0 and not self.conn.poll(0):
                return


class _ForkedWorker:
    """A reader worker forked by the zygote (a grandchild): liveness through a pidfd, exit code
    as the zygote reports it. Duck-types what the pool uses of a `multiprocess` Process."""

    def __init__(self, index: int, status: _StatusChannel) -> None:
        self.index = index
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.sentinel: int | None = None  # the pidfd, once the pid is known
        self._status = status
        status.workers[index] = self

    def forked(self, pid: int) -> None:
        if self.pid is not None:
            return
        self.pid = pid
        try:
            self.sentinel = os.pidfd_open(pid)
        except ProcessLookupError:
            self.sentinel = None
            self.exitcode = self.exitcode if self.exitcode is not None else -1
        weakref.finalize(self, _close_fd, self.sentinel)

    def is_alive(self) -> bool:
        if self.sentinel is None:
            return self.pid is not None and self.exitcode is None
        return not wait([self.sentinel], 0)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process exited and its exit code arrived (at most `timeout` seconds)."""
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        if self.sentinel is not None:
            wait([self.sentinel], max(0.0, deadline - time.monotonic()))
        while self.exitcode is None and not self._status.ended and time.monotonic() < deadline:
            if self.sentinel is not None and self.is_alive():
                return
            self._status.pump(min(0.05, max(0.0, deadline - time.monotonic())))

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.pid is not None and self.is_alive():
            try:  # through the pidfd: never a reused pid
                if self.sentinel is not None:
                    signal.pidfd_send_signal(self.sentinel, sig)
                else:
                    os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def _close_fd(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class _LeanSpawnPopen(popen_spawn_posix.Popen):
    """`multiprocess`'s spawn launch without its resource tracker.

    The stock launch first starts a resource-tracker process (a third interpreter, ~10 MiB of
    PSS) so children can register named semaphores and shared-memory blocks for cleanup. Reader
    workers register none: the parent passes them each run's ring as a descriptor (no name). The
    body is `popen_spawn_posix.Popen._launch` with the tracker fd left out (`tracker_fd=None`;
    a child that did register something would start its own tracker lazily).
    """

    def _launch(self, process_obj) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=None, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class _ReaderSpawnProcess(SpawnProcess):
    """A spawn-method process started with `_LeanSpawnPopen`."""

    @staticmethod
    def _Popen(process_obj):
        return _LeanSpawnPopen(process_obj)


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While a worker starts, hide __main__'s file/spec from the spawn preparation.

    Workers run only datasetrt code, so they must not re-import the user's script: that would
    re-run its top level (the classic "missing main guard" failure), import whatever it imports
    (torch, Polars) into every worker, and slow start-up. Only the start() call is covered.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    try:
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _shutdown(
    procs: list,
    task_conns: list,
    result_conns: list,
    zygote=None,
    status: _StatusChannel | None = None,
    zygote_pidfd: int | None = None,
) -> None:
    """Stop workers: Shutdown message, join, then terminate and kill; close every pipe (the
    workers' ring mappings go with them). Runs at close(), garbage collection, or interpreter
    exit (weakref.finalize's atexit hook, before module teardown)."""
    for conn in task_conns:
        try:
            conn.send_bytes(pickle.dumps(Shutdown()))
        except (OSError, ValueError):
            pass
    for proc in procs:
        if proc.pid is None and zygote is not None:
            continue  # never forked: the zygote's end below covers it
        proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(JOIN_TIMEOUT_S)
    if zygote is not None:
        # It exits once its children are reaped; one that is still forking is stopped outright.
        zygote.join(JOIN_TIMEOUT_S)
        if zygote.is_alive():
            zygote.kill()
            zygote.join()
        for proc in procs:  # forked after all (a zygote killed mid-fork leaves orphans)
            if proc.pid is not None and proc.is_alive():
                proc.kill()
                proc.join(JOIN_TIMEOUT_S)
        if status is not None:
            try:
                status.conn.close()
            except OSError:
                pass
        _close_fd(zygote_pidfd)
    for conn in (*task_conns, *result_conns):
        try:
            conn.close()
        except OSError:
            pass
