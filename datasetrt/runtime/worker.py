"""Reader worker process: maps a run's ring and the cache indexes; gathers planned rows into ring slots.

Boundary: imports the native kernels, the format reader, the gatherer and the protocol — no
numpy, pyarrow, Polars or Torch (`WorkerReady.heavy_modules` reports what a worker has; a
spawned one has none of them). The parent plans: each task's rows (cache position, sample id)
arrive in the slot header (runtime/slot.py), so a worker needs no planner, table or snapshot.
How a slot is filled depends on its layout's kind (`FILLERS`, one function per layout).

The worker ignores SIGINT (the parent owns interrupt handling and cleanup), dies of SIGTERM (the
default action, whatever handler a forked worker inherited), exits when the parent process dies
(a pidfd watched by a daemon thread), and also exits when its task socket reaches EOF. A run's
ring arrives as a descriptor right after its OpenRun; the worker maps it and closes the
descriptor, so the memory goes when the parent and the workers have unmapped it.
Exceptions while serving a task are reported as TaskFailed with the traceback text (and a
CacheIOError's errno and path); the worker keeps serving. Its readers map the uncompressed shards
of local caches (`Gatherer(map_shards=True)`): a shard truncated under it kills it with SIGBUS,
which the parent reports as a WorkerCrashedError naming the shard (runtime/run.py).
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import sys
import threading
import traceback
from collections import OrderedDict

from datasetrt.errors import CacheFormatError, CacheIOError, StorageError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.gatherer import Gatherer, LazyHandles
from datasetrt.runtime.memory import collector_paused
from datasetrt.runtime.protocol import (
    HEAVY_MODULES,
    CloseRun,
    ForgetRing,
    OpenRun,
    ReadTask,
    RunOpened,
    Shutdown,
    TaskDone,
    TaskFailed,
    WorkerExited,
    WorkerForked,
    WorkerReady,
)
from datasetrt.runtime.shm import attach_shared_memory, recv_fd
from datasetrt.runtime.slot import WorkerSlot

MAX_CACHED_READERS = 4


def _die_with_parent(parent_pid: int) -> None:
    """Exit as soon as the parent process is gone.

    A pidfd becomes readable when the process exits; a daemon thread waits on it. (prctl's
    PR_SET_PDEATHSIG fires when the parent *thread* that started us exits, which kills workers of
    a pool first used from a short-lived thread.) The task pipe's EOF is the second line.
    """
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):
        return  # no pidfd (old kernel): rely on EOF of the task pipe
    if select.select([pidfd], [], [], 0)[0]:  # the parent is already gone (pid not reused yet)
        os._exit(1)

    def watch() -> None:
        select.select([pidfd], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="datasetrt-parent-watch", daemon=True).start()


class _RingMap:
    """A ring as one worker maps it: the mapping, its memoryview and the slot views this worker
    made (once per slot). It lives from the OpenRun that brought its descriptor until a CloseRun
    without `keep_ring` or a ForgetRing: a ring the pool keeps idle between runs stays mapped, so
    the next run of the same shape costs no new mapping and no page faults."""

    def __init__(self, ring_fd: int) -> None:
        self.map = attach_shared_memory(ring_fd, writable=True)  # closes ring_fd: the mapping holds the memory
        self.view = memoryview(self.map)
        self.slots: dict[int, WorkerSlot] = {}

    def slot(self, layout, index: int) -> WorkerSlot:
        slot = self.slots.get(index)
        if slot is None or (slot.layout is not layout and slot.layout != layout):
            if slot is not None:
                slot.release()
            slot = self.slots[index] = WorkerSlot(self.view, layout, index)
        return slot

    def close(self) -> None:
        for slot in self.slots.values():
            slot.release()
        self.view.release()
        self.map.close()


class _Run:
    """A run as one worker sees it: its ring (by key), slot layout and the cache gatherer."""

    def __init__(self, spec: OpenRun, reader: Gatherer, ring: _RingMap) -> None:
        self.spec = spec
        self.reader = reader
        self.ring = ring
        self.layout = spec.layout
        self.fill = FILLERS[spec.layout.kind]

    def execute(self, task: ReadTask) -> tuple[int, int]:
        """Fill the task's slot from the plan in its header: (rows, need_bytes) for TaskDone."""
        return self.fill(self.reader, self.ring.slot(self.layout, task.slot), task.count)


def _fill_records(reader: Gatherer, slot: WorkerSlot, count: int) -> tuple[int, int]:
    """Fill a "records" slot: gather the planned rows into the "data" region (embedded JSON and
    decoded payload per record) and their offsets/lengths into the result arrays."""
    rows, _used, need = reader.gather_into(
        slot.array("cache_pos", count),
        slot.array("sample_id", count),
        slot.region("data"),
        slot.array("json_off", count),
        slot.array("json_len", count),
        slot.array("data_off", count),
        slot.array("data_len", count),
    )
    return rows, need


_NO_JSON = memoryview(bytearray()).cast("q")  # empty JSON spans: the batch gather drops the JSON


def _fill_batch(reader: Gatherer, slot: WorkerSlot, count: int) -> tuple[int, int]:
    """Fill a "batch" slot: gather the planned rows' payloads back to back, in their final
    layout, into the "payload" region and their byte offsets into the "offsets" region (and,
    with `keep_json`, the embedded JSON at the region's end). Partial (rows < count) only when
    the payloads outgrow the region; the parent then reads the batch itself."""
    layout = slot.layout
    check = layout.payload
    if check is None:  # SlotLayout.batch always sets it
        raise RuntimeError("a batch slot layout without its payload length rule")
    json = (slot.array("json_off", count), slot.array("json_len", count)) if layout.keep_json else (_NO_JSON, _NO_JSON)
    offsets = slot.region("offsets")[: (count + 1) * 8].cast("q")
    try:
        rows, _payload_bytes, _json_bottom, need = reader.gather_batch_into(
            slot.array("cache_pos", count),
            slot.array("sample_id", count),
            slot.region("payload"),
            offsets,
            *json,
            check,
        )
    finally:
        offsets.release()
    return rows, need


# How a worker fills a slot, by `SlotLayout.kind` (runtime/slot.py): one code path per layout.
FILLERS = {"records": _fill_records, "batch": _fill_batch}


# A message at least this large (an OpenRun of many caches) is unpickled with the cyclic collector
# paused: it builds O(caches) long-lived objects, and full collections would walk them all.
LARGE_MESSAGE_BYTES = 1 << 16


def _loads(data: bytes) -> object:
    if len(data) < LARGE_MESSAGE_BYTES:
        return pickle.loads(data)
    with collector_paused():
        return pickle.loads(data)


def worker_main(index: int, task_conn, result_conn, parent_pid: int) -> None:
    """Entry point of worker `index` (importable for the spawn start method)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's exit-on-SIGTERM handler (fork)
    _die_with_parent(parent_pid)
    _send(result_conn, WorkerReady(index, os.getpid(), tuple(m for m in HEAVY_MODULES if m in sys.modules)))
    readers: OrderedDict[str, Gatherer] = OrderedDict()
    runs: dict[int, _Run] = {}
    rings: dict[int, _RingMap] = {}  # ring key -> mapping (of open runs, and kept idle ones)
    while True:
        try:
            msg = _loads(task_conn.recv_bytes())
        except (EOFError, OSError):
            break
        if isinstance(msg, ReadTask):
            try:
                rows, need = runs[msg.run_id].execute(msg)
                _send(result_conn, TaskDone(index, msg.run_id, msg.task_id, msg.slot, msg.first, rows, need))
            except BaseException as exc:
                _report(result_conn, index, msg.run_id, msg.task_id, exc)
        elif isinstance(msg, OpenRun):
            try:
                ring_fd = recv_fd(task_conn)  # sent right after OpenRun: take it before anything can fail
            except (EOFError, OSError):
                break  # the parent is gone, or the channel is out of step: exit (the parent sees it)
            try:
                caches = msg.caches
                reader = readers.pop(caches.key, None)
                if reader is None and caches.layouts:  # local caches: each opened at its first read
                    lazy = LazyHandles(caches.cache_dirs, caches.identities, caches.layouts)
                    reader = Gatherer(lazy, verify_records=caches.verify_records, map_shards=True)
                if reader is None:
                    remotes = caches.remotes or (None,) * len(caches.cache_dirs)
                    # The parent applied the symbolic-link rule when it opened them (its reader
                    # config may allow external links); every file is checked again here.
                    handles = [
                        CacheHandle.open(p, remote=r, external_links=True) for p, r in zip(caches.cache_dirs, remotes)
                    ]
                    for handle, expected in zip(handles, caches.identities):
                        if handle.identity != tuple(expected):
                            raise CacheFormatError(f"cache changed on disk since it was opened: {handle.path}")
                    reader = Gatherer(handles, verify_records=caches.verify_records, map_shards=True)
                readers[caches.key] = reader
                ring = rings.get(msg.ring_key)
                if ring is None:
                    fd, ring_fd = ring_fd, -1
                    ring = rings[msg.ring_key] = _RingMap(fd)
                runs[msg.run_id] = _Run(msg, reader, ring)
                _evict_idle(readers, runs)
                _send(result_conn, RunOpened(index, msg.run_id))
            except BaseException as exc:
                _report(result_conn, index, msg.run_id, -1, exc)
            finally:
                if ring_fd >= 0:
                    os.close(ring_fd)
        elif isinstance(msg, CloseRun):
            run = runs.pop(msg.run_id, None)
            if run is not None:
                if not msg.keep_ring:
                    _forget(rings, run.spec.ring_key)
                _evict_idle(readers, runs)
        elif isinstance(msg, ForgetRing):
            _forget(rings, msg.ring_key)
        elif isinstance(msg, Shutdown):
            break
    for ring in rings.values():
        ring.close()
    for reader in readers.values():
        reader.close()
    task_conn.close()
    result_conn.close()


def zygote_main(task_conns: list, result_conns: list, status_conn, parent_pid: int) -> None:
    """Entry point of the spawn start method's one spawned process: fork the reader workers.

    Workers forked from this small, single-purpose interpreter share its pages (imports, heap)
    copy-on-write, so each costs a few MiB of PSS instead of a whole interpreter. Each child keeps
    only its own two pipe ends and runs `worker_main`; the zygote reports `WorkerForked(i, pid)`,
    reaps its children and reports `WorkerExited(i, exit code)`, and exits when they are all gone.
    It dies with the parent like the workers do (`_die_with_parent`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    children: dict[int, int] = {}
    gc.freeze()  # the children's garbage collections leave the shared pages alone
    for index in range(len(task_conns)):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for j in range(len(task_conns)):
                    if j != index:
                        task_conns[j].close()
                        result_conns[j].close()
                status_conn.close()
                worker_main(index, task_conns[index], result_conns[index], parent_pid)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        children[pid] = index
        _send(status_conn, WorkerForked(index, pid))
    for conn in (*task_conns, *result_conns):
        conn.close()
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        exited = children.pop(pid, None)  # the worker index of the child reaped
        if exited is not None:
            try:
                _send(status_conn, WorkerExited(exited, os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # the parent closed its end: it is shutting down
    status_conn.close()


def _forget(rings: dict, key: int) -> None:
    ring = rings.pop(key, None)
    if ring is not None:
        ring.close()


def _evict_idle(readers: OrderedDict, runs: dict) -> None:
    """Keep at most MAX_CACHED_READERS readers, closing least recently opened ones that no open
    run uses (readers in use are never closed, so the cache may exceed the cap while they are)."""
    in_use = {id(run.reader) for run in runs.values()}
    for key in list(readers):
        if len(readers) <= MAX_CACHED_READERS:
            break
        if id(readers[key]) not in in_use:
            readers.pop(key).close()


def _send(conn, msg: object) -> None:
    conn.send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))


def _report(conn, index: int, run_id: int, task_id: int, exc: BaseException) -> None:
    cls = type(exc)
    io = exc if isinstance(exc, CacheIOError) else None
    store = exc if isinstance(exc, StorageError) else None
    _send(
        conn,
        TaskFailed(
            index,
            run_id,
            task_id,
            f"{cls.__module__}.{cls.__qualname__}",
            str(exc),
            "".join(traceback.format_exception(exc)),
            io.errno if io is not None else None,
            io.path if io is not None else None,
            store.url if store is not None else None,
            store.operation if store is not None else None,
            store.status if store is not None else None,
        ),
    )
