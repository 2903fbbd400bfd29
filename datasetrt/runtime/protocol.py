"""Typed messages between the parent and reader worker processes.

Boundary: plain frozen dataclasses (ints, floats, strings, tuples, and the frozen `CacheSet` and
`SlotLayout` records); no behaviour, no numpy.

NOTE (worker protocol) — the one description; docs/architecture.md points here.
One channel per direction per worker: tasks parent -> worker (a Unix socket, so it can carry
descriptors), results worker -> parent (a pipe); every message is one pickled dataclass below
(never a tuple). The parent waits on every result pipe and
every worker's process sentinel at once (`multiprocess.connection.wait`), so a dead worker wakes
it immediately. The pool (runtime/pool.py) sends and routes; a run (runtime/run.py) owns its ring.
  parent -> worker   OpenRun      once per (worker, run), before that worker's first ReadTask of
                                  the run (or, in a run's head start, as soon as the worker
                                  is ready: `WorkerPool.offer`): the caches (`CacheSet`), the ring's `SlotLayout` and
                                  its `ring_key`, followed at once by the ring's memfd as one
                                  SCM_RIGHTS byte (runtime/shm.py send_fd / recv_fd): the ring
                                  has no name. A worker that still maps the ring of that key
                                  (kept from an earlier run) uses its mapping and closes the fd
                     ReadTask     fill slot `slot` for window positions [first, first+count):
                                  the parent wrote their plan into the slot's header first
                     CloseRun     after the run ends; the worker unmaps the run's ring
                                  unless `keep_ring` (the pool kept it idle for a next run)
                     ForgetRing   the pool dropped its idle ring `ring_key`: unmap it
                     Shutdown     the worker exits 0
  zygote -> parent   WorkerForked (spawn) worker i runs as pid p; WorkerExited: it exited
                                  with this code (the zygote forks and reaps the workers)
  worker -> parent   WorkerReady  after start-up (pid, which heavy modules it has imported — a
                                  spawned worker has none)
                     RunOpened    the worker took the run's OpenRun: its reader and the ring's
                                  mapping are ready (a run's head start ends at the first)
                     TaskDone     `rows` rows of the task are in the slot (rows < count: the
                                  slot filled; the parent submits the rest as a new task;
                                  rows == 0 and need_bytes > 0: the next record alone exceeds a
                                  slot and the parent reads it in-process)
                     TaskFailed   an exception: its qualified type, message and traceback text,
                                  and for a CacheIOError its `errno` and `path` (so code reacting
                                  to EMFILE or ENOSPC reads them in the parent too); the parent
                                  re-raises the same datasetrt error class with the worker
                                  traceback as `__cause__`
The slot's bytes — which header arrays the parent writes (the plan) and which the worker writes,
and the regions — are defined once, in runtime/slot.py. A slot is touched by one worker between
ReadTask and TaskDone and read by the parent only after TaskDone; the parent reassigns it only
after the consumer released it. Results of a run the parent already closed are discarded.
"""

from __future__ import annotations

import copyreg
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from datasetrt.runtime.slot import SlotArray, SlotLayout, SlotRegion
from datasetrt.values.payloads import PayloadCheck

if TYPE_CHECKING:
    from datasetrt.format.remote import RemoteCache

# A spawned reader worker imports none of these (each costs 14-45 MiB of private memory per
# process); a forked one inherits whatever the parent had.
HEAVY_MODULES = ("numpy", "polars", "pyarrow", "torch", "pandas")


# A cache as a reader's table needs it before the cache is opened: (sample_count, per shard
# (file name, byte_len, uncompressed_byte_len, codec name)), from the manifest the parent read.
CacheLayout = tuple[int, tuple[tuple[str, int, int, str], ...]]


@dataclass(frozen=True, slots=True)
class CacheSet:
    """The caches a run reads, as a worker opens them: directories in catalog order, each one's
    `CacheHandle.identity` as the parent opened it (a worker refuses a cache changed since), the
    verify flag, and `key`, which names this set for worker-side reader reuse across runs."""

    key: str
    cache_dirs: tuple[str, ...]
    identities: tuple[tuple[int, ...], ...]
    verify_records: bool
    remotes: tuple[RemoteCache | None, ...] = ()  # per cache: its remote origin (format/remote.py), or None
    # Per cache, what a reader builds its table from (`CacheLayout`), so that a worker opens each
    # cache only when a read first needs it; empty (remote caches): it opens every cache first.
    layouts: tuple[CacheLayout, ...] = ()


@dataclass(frozen=True, slots=True)
class OpenRun:
    run_id: int
    caches: CacheSet
    layout: SlotLayout
    ring_key: int  # names the ring across runs: a kept ring is opened again under the same key


@dataclass(frozen=True, slots=True)
class ReadTask:
    run_id: int
    task_id: int
    first: int
    count: int
    slot: int


@dataclass(frozen=True, slots=True)
class CloseRun:
    run_id: int
    keep_ring: bool = False  # True: keep the ring mapped (ForgetRing or a later CloseRun unmaps it)


@dataclass(frozen=True, slots=True)
class ForgetRing:
    ring_key: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker: int
    pid: int
    heavy_modules: tuple[str, ...]  # which of HEAVY_MODULES are in the worker's sys.modules


@dataclass(frozen=True, slots=True)
class RunOpened:
    worker: int
    run_id: int


@dataclass(frozen=True, slots=True)
class WorkerForked:
    """zygote -> parent (spawn): worker `worker` runs as process `pid`."""

    worker: int
    pid: int


@dataclass(frozen=True, slots=True)
class WorkerExited:
    """zygote -> parent (spawn): worker `worker` exited (`exitcode`: negative = killed by signal)."""

    worker: int
    exitcode: int


@dataclass(frozen=True, slots=True)
class TaskDone:
    worker: int
    run_id: int
    task_id: int
    slot: int
    first: int
    rows: int
    need_bytes: int


@dataclass(frozen=True, slots=True)
class TaskFailed:
    worker: int
    run_id: int
    task_id: int
    error_type: str
    message: str
    traceback: str
    io_errno: int | None = None  # CacheIOError.errno (None for other errors, or no OS error)
    io_path: str | None = None  # CacheIOError.path
    store_url: str | None = None  # StorageError.url (None for other errors)
    store_operation: str | None = None  # StorageError.operation
    store_status: int | None = None  # StorageError.status


def _pickle_as_constructor_calls(*classes: type) -> None:
    """Pickle each of `classes` (frozen slots dataclasses whose fields are all `__init__`
    arguments, in order) as a call of its constructor with its field values. The default for a
    slots dataclass is its generated `__getstate__`, which calls `dataclasses.fields()` on every
    object: ~3x the bytes and time per message, paid per batch (ReadTask, TaskDone) and per run
    (OpenRun with its CacheSet and SlotLayout, ~10 objects per worker)."""
    for cls in classes:
        names = [f.name for f in dataclasses.fields(cls)]
        assert all(f.init for f in dataclasses.fields(cls)), cls
        copyreg.pickle(cls, _constructor_call(cls, _field_values(names)))


def _field_values(names: list[str]) -> Callable[[object], tuple[object, ...]]:
    """obj -> the values of its fields `names`, as a tuple (attrgetter returns the bare value
    for a single name)."""
    if len(names) > 1:
        return attrgetter(*names)
    name = names[0]
    return lambda obj: (getattr(obj, name),)


def _constructor_call(
    cls: type, values: Callable[[object], tuple[object, ...]]
) -> Callable[[object], tuple[type, tuple[object, ...]]]:
    """The copyreg reduce function of `cls`: obj -> (cls, its field values)."""
    return lambda obj: (cls, values(obj))


_pickle_as_constructor_calls(
    CacheSet,
    OpenRun,
    ReadTask,
    CloseRun,
    ForgetRing,
    TaskDone,
    TaskFailed,
    SlotLayout,
    SlotArray,
    SlotRegion,
    PayloadCheck,
)
