"""The reader worker processes of one pool and their channels: start them, wait on them, stop them.

Boundary: processes, pipes and descriptors (the `multiprocess` package, pidfds); knows nothing of
runs, tasks, rings or what travels on the channels beyond the zygote's status messages and the
Shutdown request (routing is runtime/pool.py's).

Two launches fill a `WorkerProcesses`:
  - fork (`launch_forked`): each worker is a child of the parent, forked with the parent's heap
    frozen (`gc.freeze`) so the children's collections do not copy-on-write its pages;
  - spawn (`launch_zygote`): one fresh interpreter, the zygote (`worker.zygote_main`, started
    without `multiprocess`'s resource tracker), forks the workers, so they share its pages; they
    are the parent's grandchildren (`ForkedWorker`: a pidfd for liveness, the exit code as the
    zygote reports it on its status pipe, `StatusChannel`).
Each worker has a task channel (a socket pair: it also carries ring descriptors) and a result
pipe. While a worker starts, __main__'s file and spec are hidden, so no worker re-imports the
user's script.

Ownership: a `WorkerProcesses` owns its processes, its pipes, the status pipe and the zygote's pidfd;
`shutdown` releases all of them (Shutdown message, join with a timeout, then terminate / kill)
and is the pool's finalizer, so a pool that is garbage-collected or left at interpreter exit
leaves no process behind.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import select
import signal
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import multiprocess as mp
from multiprocess import popen_spawn_posix, spawn, util
from multiprocess.connection import wait
from multiprocess.context import SpawnProcess, reduction, set_spawning_popen

from datasetrt.runtime.protocol import Shutdown, WorkerExited, WorkerForked
from datasetrt.runtime.worker import worker_main, zygote_main

JOIN_TIMEOUT_S = 5.0  # orderly shutdown: per step and process
KILL_WAIT_S = 2.0  # hung shutdown: the whole stop (docs/reliability.md, "Stuck workers")


@dataclass(eq=False)
class WorkerProcesses:
    """The processes of one pool and their channels, index i being worker i. `procs` are
    `multiprocess` Processes (fork) or `ForkedWorker`s (spawn: `zygote`, `status` and
    `zygote_pidfd` are then set). Filled by a launch, released by `shutdown`."""

    procs: list = field(default_factory=list)
    task_conns: list = field(default_factory=list)
    result_conns: list = field(default_factory=list)
    zygote: SpawnProcess | None = None
    status: StatusChannel | None = None
    zygote_pidfd: int | None = None

    def waitables(self) -> list:
        """What the pool waits on for news: every result pipe, the sentinel of every worker whose
        pid is known, and (spawn) the zygote's status pipe and pidfd."""
        out = [*self.result_conns, *(p.sentinel for p in self.procs if p.sentinel is not None)]
        if self.zygote is not None and self.status is not None:
            out += [self.status.conn, self.zygote_pidfd]
        return out


def launch_forked(processes: WorkerProcesses, num_workers: int, start_method: str) -> None:
    """Start `num_workers` workers as children of this process with `start_method` ("fork"),
    appending each to `processes` as it starts. On an exception the caller shuts down what was
    started (`shutdown(processes)`)."""
    ctx = mp.get_context(start_method)
    process_class = ctx.Process
    if start_method == "fork":
        # Forked children inherit every object in the permanent generation, which their
        # garbage collections never traverse, so they do not copy-on-write the parent's
        # pages; the parent unfreezes right after the forks (no lasting effect on it).
        gc.freeze()
    try:
        for index in range(num_workers):
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
            processes.procs.append(proc)
            processes.task_conns.append(task_w)
            processes.result_conns.append(res_r)
        if start_method == "fork":
            gc.unfreeze()
    except BaseException:
        gc.unfreeze()
        raise


def launch_zygote(processes: WorkerProcesses, num_workers: int) -> None:
    """spawn: start the zygote (`worker.zygote_main`), which forks `num_workers` workers and
    reports their pids and exit codes on a status pipe; fill `processes` with its channels and one
    `ForkedWorker` per worker (pid unknown until reported). On an exception the caller shuts
    down what was started (`shutdown(processes)`)."""
    ctx = mp.get_context("spawn")
    # Task channels are socket pairs (they carry ring descriptors); results are pipes.
    ends = [(ctx.Pipe(duplex=True), ctx.Pipe(duplex=False)) for _ in range(num_workers)]
    status_r, status_w = ctx.Pipe(duplex=False)
    status = processes.status = StatusChannel(status_r)
    zygote = _ReaderSpawnProcess(
        target=zygote_main,
        name="datasetrt-reader-zygote",
        daemon=True,
        args=([t[0] for t, _ in ends], [r[1] for _, r in ends], status_w, os.getpid()),
    )
    with _main_module_hidden():
        zygote.start()
    processes.zygote = zygote
    # Its `sentinel` is a pipe the workers inherit: it fires only when they are all gone.
    # A pidfd fires when the zygote itself exits.
    processes.zygote_pidfd = os.pidfd_open(zygote.pid)  # closed by shutdown, exactly once
    status_w.close()
    for index, ((task_r, task_w), (res_r, res_w)) in enumerate(ends):
        task_r.close()
        res_w.close()
        processes.procs.append(ForkedWorker(index, status))
        processes.task_conns.append(task_w)
        processes.result_conns.append(res_r)


class Poller:
    """`multiprocess.connection.wait` for the pool's hot loop: one `select.poll` object kept while
    the set of waitables stays the same (wait() builds and registers a new selector on every
    call, and Connection.poll() another), and one per connection for "another message waiting?"
    checks. O(waitables) only when the set changes."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] = ()
        self._poll = select.poll()
        self._by_fd: dict[int, Any] = {}
        self._single: dict[int, select.poll] = {}

    def wait(self, waitables: list, timeout_s: float | None) -> list:
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


class StatusChannel:
    """The zygote's status pipe: WorkerForked / WorkerExited messages, dispatched to the workers."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.workers: dict[int, ForkedWorker] = {}
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


class ForkedWorker:
    """A reader worker forked by the zygote (a grandchild): liveness through a pidfd, exit code
    as the zygote reports it. Duck-types what the pool uses of a `multiprocess` Process. Owns
    its pidfd (closed when the object is collected)."""

    def __init__(self, index: int, status: StatusChannel) -> None:
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

    The stock launch first starts a resource-tracker process (a third interpreter) so children
    can register named semaphores and shared-memory blocks for cleanup. Reader workers register
    none: the parent passes them each run's ring as a descriptor (no name). The body is
    `popen_spawn_posix.Popen._launch` with the tracker fd left out (`tracker_fd=None`; a child
    that did register something would start its own tracker lazily).
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
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    try:
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def shutdown(processes: WorkerProcesses, hung: bool = False) -> None:
    """Stop workers and close every pipe (the workers' ring mappings go with them). Runs at the
    pool's close(), garbage collection, or interpreter exit (weakref.finalize's atexit hook, before
    module teardown).

    Orderly (`hung=False`): Shutdown message, join, then SIGTERM (with SIGCONT, so a stopped
    process acts on it) and SIGKILL; O(workers) joins, each bounded by JOIN_TIMEOUT_S. A worker
    that is stopped (SIGSTOP, a debugger) cannot read the Shutdown message: it is killed at once.

    Hung (`hung=True`, the pool timed out waiting for progress): nothing is asked of the workers;
    every worker (then the zygote) is SIGKILLed at once and the whole stop waits at most
    KILL_WAIT_S in total, so the caller reports the timeout promptly. Workers hold nothing that
    needs an orderly exit (their rings have no name; the parent owns every other resource). A
    process still there after KILL_WAIT_S (uninterruptible I/O) is left to exit on its own."""
    procs, zygote = processes.procs, processes.zygote
    if hung:
        _kill_all(processes)
        return
    for conn in processes.task_conns:
        try:
            conn.send_bytes(pickle.dumps(Shutdown()))
        except (OSError, ValueError):
            pass
    for proc in procs:
        if proc.pid is None and zygote is not None:
            continue  # never forked: the zygote's end below covers it
        if not _is_stopped(proc.pid):
            proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive() and not _is_stopped(proc.pid):
            proc.terminate()
            _continue(proc)
            proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(JOIN_TIMEOUT_S)
    if zygote is not None:
        # It exits once its children are reaped; one that is still forking (or stopped) is killed outright.
        if not _is_stopped(zygote.pid):
            zygote.join(JOIN_TIMEOUT_S)
        if zygote.is_alive():
            zygote.kill()
            zygote.join()
        for proc in procs:  # forked after all (a zygote killed mid-fork leaves orphans)
            if proc.pid is not None and proc.is_alive():
                proc.kill()
                proc.join(JOIN_TIMEOUT_S)
    _close_channels(processes)


def _kill_all(processes: WorkerProcesses) -> None:
    """`shutdown(hung=True)`: SIGKILL the workers, then the zygote (and any worker it forked
    meanwhile), reaping them within one KILL_WAIT_S deadline; then close the channels."""
    procs, zygote = processes.procs, processes.zygote
    deadline = time.monotonic() + KILL_WAIT_S
    for proc in procs:
        if proc.pid is not None:
            proc.kill()  # through the pidfd for a forked worker: never a reused pid
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(0.0, deadline - time.monotonic()))
    if zygote is not None:
        zygote.kill()  # it only forks and reaps: nothing of it needs an orderly exit
        zygote.join(max(0.0, deadline - time.monotonic()))
        if processes.status is not None:
            processes.status.pump(0.0)  # late WorkerForked reports: kill those workers too
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                proc.kill()
                proc.join(max(0.0, deadline - time.monotonic()))
    _close_channels(processes)


def _close_channels(processes: WorkerProcesses) -> None:
    if processes.zygote is not None:
        if processes.status is not None:
            try:
                processes.status.conn.close()
            except OSError:
                pass
        _close_fd(processes.zygote_pidfd)
    for conn in (*processes.task_conns, *processes.result_conns):
        try:
            conn.close()
        except OSError:
            pass


def _is_stopped(pid: int | None) -> bool:
    """Whether process `pid` is stopped (state T, by a signal, or t, by a tracer): it reads no
    message and acts on no signal but SIGKILL until continued. False when unknown or gone."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2 :].split(b" ", 1)  # after "pid (comm) ": the state letter
    return fields[0] in (b"T", b"t")


def _continue(proc) -> None:
    """SIGCONT after a SIGTERM, so a process stopped since the last check acts on it. A forked
    worker is signalled through its pidfd; a child of this process cannot be reused before we
    reap it."""
    if isinstance(proc, ForkedWorker):
        proc._signal(signal.SIGCONT)
    elif proc.pid is not None and proc.is_alive():
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
