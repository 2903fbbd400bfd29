"""Reliability suite (issue 6): corruption fuzzing, crash-safe publication, resource hygiene
under read faults, failing syscalls (an LD_PRELOAD shim: faultshim.c, faultrun.py), hostile caches
that validate (hostile.py), and a soak test (slow, opt in with ``-m slow``).

Shared helpers live here (the conftest only builds the shim): deterministic template caches, a
probe that opens, reads metadata and reads every sample under a deadline, and process/fd/shm
counters.
Waiting for an external event is a bounded polling loop with a deadline; nothing sleeps to
synchronise and nothing asserts on timing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

import datasetrt as drt
from datasetrt.errors import DatasetRTError
from tests.conftest import ListSource, sample_items, writer_config

SHM = Path("/dev/shm")
PROBE_DEADLINE_S = 60.0  # generous: a tiny cache reads in milliseconds; this only catches hangs
WORKER_TIMEOUT_S = 30.0  # parallel reads: a lost worker surfaces as WorkerTimeoutError, never a hang


def write_template(base: Path, name: str, n: int, algo: str = "none", **kw) -> Path:
    """Write one cache (in-process writer) and return its path."""
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache(
            ListSource(name, sample_items(n, tag=name)), base, writer_config=writer_config(algo, **kw)
        )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return Path(result.path)


def reader_config(validate: bool, **kw) -> drt.ReaderConfig:
    kw = {"seed": 0, "shuffle": False, "worker_timeout_s": WORKER_TIMEOUT_S, **kw}
    return drt.ReaderConfig(validate_cache=validate, **kw)


@dataclass
class Probe:
    """What one open + get_metadata + full read produced: samples and table, or the error."""

    stage: str | None
    error: BaseException | None = None
    samples: list | None = None
    table: object = None


def probe(
    path: Path, *, validate: bool, runtime=None, threaded: bool = True, deadline_s: float = PROBE_DEADLINE_S
) -> Probe:
    """Open `path`, get_metadata(), read every sample in order. Catches everything, so the caller
    can check that only datasetrt errors escape. `threaded`: on a helper thread with a deadline (a
    hang fails loudly instead of blocking the suite); parallel reads pass False and rely on
    worker_timeout_s, since reader workers must be started from a long-lived thread."""
    box: dict = {}

    def run() -> None:
        stage = "open"
        try:
            ds = drt.CachedDataset([path], reader_config=reader_config(validate), runtime=runtime)
            try:
                stage = "metadata"
                table = ds.get_metadata()
                stage = "iter"
                samples = list(ds)
            finally:
                ds.close()
            box["probe"] = Probe(None, samples=samples, table=table)
        except BaseException as exc:
            box["probe"] = Probe(stage, error=exc)

    if not threaded:
        run()
        return box["probe"]
    thread = threading.Thread(target=run, name="reliability-probe", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise AssertionError(f"open/read of {path} neither finished nor raised within {deadline_s:.0f} s")
    return box["probe"]


def is_typed(exc: BaseException | None) -> bool:
    return isinstance(exc, DatasetRTError)


# -- resource counters ---------------------------------------------------------------------------


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def shm_entries() -> list[str]:
    """datasetrt run directories of this process in /dev/shm."""
    return sorted(p.name for p in SHM.glob(f"datasetrt-{os.getpid()}-*"))


def trackers() -> set[int]:
    """Live resource trackers / forkservers among the descendants (live_children() skips them;
    baselines count them apart, so a fault path that starts one is still seen)."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(
                k in " ".join(proc.cmdline()) for k in ("resource_tracker", "forkserver")
            ):
                out.add(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def live_children() -> set[int]:
    """Live (non-zombie) descendants, excluding multiprocess's resource tracker / forkserver."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.add(proc.pid)
    return out


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):
    """Bounded poll for an external event (a process exit, a file appearing). Returns the
    predicate's last truthy value; fails after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.005)  # poll interval of an external event, not synchronisation
