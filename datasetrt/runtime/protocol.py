"""Typed messages between the parent and reader worker processes.

Boundary: plain frozen dataclasses of ints, floats and strings; no behaviour.

NOTE (worker protocol). One duplex-free pipe pair per worker: tasks parent -> worker, results
worker -> parent. The parent waits on every result pipe and every worker's process sentinel at
once (`multiprocess.connection.wait`), so a dead worker wakes it immediately.
  parent -> worker   OpenRun      once per (worker, run), before that worker's first ReadTask
                     ReadTask     the `count` planned rows the parent wrote into slot `slot`'s
                                  header (window positions [first, first+count)): gather them
                                  into that slot
                     CloseRun     after the run ends; the worker unmaps the run's files
                     Shutdown     the worker exits 0
  zygote -> parent   WorkerForked (spawn) worker i runs as pid p; WorkerExited: it exited
                                  with this code (the zygote forks and reaps the workers)
  worker -> parent   WorkerReady  after start-up (pid, which heavy modules it has imported)
                     TaskDone     `rows` rows of the task are in the slot (rows < count: the
                                  slot filled; the parent submits the rest as a new task;
                                  rows == 0 and need_bytes > 0: the next record alone exceeds a
                                  slot and the parent reads it in-process)
                     TaskFailed   an exception: its qualified type, message and traceback text
Slot layout (ring file offset slot * slot_bytes): seven int64 arrays of rows_per_slot entries —
json_off, json_len, data_off, data_len, cache_pos, sample_id, row (population row) — then the
data region; offsets are relative to the data region. The parent writes the plan (cache_pos,
sample_id, row) before it sends the ReadTask; the worker reads those and writes the four
offset/length arrays and the data region. A slot is touched by one worker between ReadTask and
TaskDone and read by the parent only after TaskDone; the parent reassigns it only after the
consumer released it.
Results of a run the parent already closed are discarded.
"""

from __future__ import annotations

from dataclasses import dataclass

SLOT_ARRAYS = 7  # json_off, json_len, data_off, data_len, cache_pos, sample_id, row
# A spawned reader worker imports none of these (each costs 14-45 MiB of private memory per
# process); a forked one inherits whatever the parent had.
HEAVY_MODULES = ("numpy", "polars", "pyarrow", "torch", "pandas")


@dataclass(frozen=True, slots=True)
class OpenRun:
    run_id: int
    dataset_key: str
    cache_dirs: tuple[str, ...]
    verify_records: bool
    ring_path: str
    slot_bytes: int
    rows_per_slot: int
    identities: tuple[tuple[int, ...], ...] = ()  # CacheHandle.identity per cache, as the parent opened it


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


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker: int
    pid: int
    heavy_modules: tuple[str, ...]  # which of HEAVY_MODULES are in the worker's sys.modules


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


def slot_header_bytes(rows_per_slot: int) -> int:
    return SLOT_ARRAYS * 8 * rows_per_slot
