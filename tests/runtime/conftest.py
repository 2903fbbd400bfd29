"""Helpers for the multiprocess reader tests: caches, runtimes, /dev/shm and process probes.

Everything here uses real processes and real shared memory. Waiting for an external event (a
process exit) is a bounded loop over psutil with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import gc
import json
import os
import select
import struct
import threading
import time
from pathlib import Path

import psutil
import pytest

import datasetrt as drt
from tests.conftest import ListSource, sample_items, writer_config

SHM = Path("/dev/shm")
MiB = 1 << 20
INDEX_ROW = struct.Struct("<QQQ")  # index.bin row: shard_id, offset, byte_len
CRASH_DEADLINE_S = 30.0


# -- caches -----------------------------------------------------------------------------------


def write_cache(base: Path, name: str, items, algo: str = "none", **kw) -> Path:
    """Write one cache with datasetrt's writer (single-threaded) and return its path."""
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache(ListSource(name, items), base, writer_config=writer_config(algo, **kw))
    assert isinstance(result, drt.CacheWriteSuccess), result
    return Path(result.path)


def compressible(size: int, tag: bytes = b"z") -> bytes:
    """`size` bytes that every codec shrinks a lot (so it decodes far larger than it is stored)."""
    return (tag * 64 + bytes(range(64))) * (size // 128) + tag * (size % 128)


def varied_items(n: int, *, seed: int, tag: str, extra=()):
    """sample_items (payloads 0..300 bytes, sample 0 empty when seed=0) plus extra (data, meta)."""
    items = sample_items(n, seed=seed, tag=tag)
    for k, data in enumerate(extra):
        items.append((data, {"index": n + k, "kept": True, "label": f"{tag}-big", "score": float(k)}))
    return items


def flip_payload_byte(cache: Path, sample_id: int) -> None:
    """Flip the last byte of a record (a payload byte; the record must have a payload)."""
    rows = list(INDEX_ROW.iter_unpack((cache / "index.bin").read_bytes()))
    shard_id, offset, byte_len = rows[sample_id]
    name = json.loads((cache / "manifest.json").read_text())["shards"][shard_id]["name"]
    path = cache / "shards" / name
    data = bytearray(path.read_bytes())
    data[offset + byte_len - 1] ^= 0xFF
    path.write_bytes(bytes(data))


def shard_paths(cache: Path) -> list[Path]:
    doc = json.loads((cache / "manifest.json").read_text())
    return [cache / "shards" / s["name"] for s in doc["shards"]]


# -- datasets -----------------------------------------------------------------------------------


def pair(paths, runtime, **cfg):
    """(reference in-process dataset, dataset read through `runtime`) with the same config."""
    config = drt.ReaderConfig(**cfg)
    return drt.CachedDataset(paths, reader_config=config), drt.CachedDataset(
        paths, reader_config=config, runtime=runtime
    )


def take(iterator, n: int) -> list:
    return [next(iterator) for _ in range(n)]


def active_run(runtime):
    """The single ParallelRun currently registered with the runtime's worker pool."""
    handlers = list(runtime._worker_pool.handlers.values())
    assert len(handlers) == 1, handlers
    return handlers[0].__self__


def consume_within(iterator, timeout_s: float = CRASH_DEADLINE_S) -> int:
    """Exhaust `iterator` on a helper thread; re-raise what it raised; fail if it hangs.

    Returns the number of items consumed. A hang fails the test after `timeout_s` instead of
    blocking the suite (the thread is a daemon and is abandoned)."""
    outcome: dict = {}

    def run() -> None:
        count = 0
        try:
            for _ in iterator:
                count += 1
            outcome["count"] = count
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="consume_within", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"iteration neither ended nor raised within {timeout_s:.0f} s")
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["count"]


# -- /dev/shm and processes -----------------------------------------------------------------------


def shm_entries(pid: int | None = None) -> list[str]:
    """Names in /dev/shm made by `pid` (default: this test process). Rings are anonymous memfds,
    so this is always empty; it was one run directory per open run before (issue 15)."""
    return sorted(p.name for p in SHM.glob(f"datasetrt-{pid or os.getpid()}-*"))


def idle_ring(runtime) -> list[str]:
    """The reader pool's idle ring (kept between runs, runtime/pool.py) as `ring_maps` names it;
    [] when the pool keeps none."""
    pool = runtime._worker_pool
    ring = None if pool is None else pool.idle_ring
    if ring is None:
        return []
    return [f"datasetrt-{os.getpid()}-{ring.name}@{os.fstat(ring.fd).st_ino}"]


def loose_rings(runtime, pid: int | str = "self", foreign: set[str] = frozenset()) -> list[str]:
    """Rings `pid` maps other than the pool's idle ring and `foreign` (rings of other runtimes
    alive in this process, taken before the test): none once every run has ended."""
    idle = set(idle_ring(runtime)) | set(foreign)
    return [name for name in ring_maps(pid) if name not in idle]


def ring_maps(pid: int | str = "self") -> list[str]:
    """The datasetrt shared-memory files `pid` has mapped (memfds: `name@inode`, one per ring)."""
    found = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/memfd:datasetrt-"):
                found.add(f"{fields[5].split()[0][len('/memfd:') :]}@{fields[4]}")
    return sorted(found)


def _is_mp_infrastructure(proc: psutil.Process) -> bool:
    """The multiprocess resource tracker / forkserver: process-wide singletons started by the
    spawn machinery, not by datasetrt, and alive until the interpreter exits."""
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return "resource_tracker" in cmd or "forkserver" in cmd


def tracker_pids() -> set[int]:
    """Live resource trackers / forkservers among this process's descendants: counted apart from
    child_pids(), so a reader start that launches one is still seen (no_new_tracker below)."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and _is_mp_infrastructure(proc):
                out.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def child_pids() -> set[int]:
    """Live child processes of this test process, excluding the multiprocess singletons."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and not _is_mp_infrastructure(proc):
                out.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_pids_gone(pids, timeout_s: float = CRASH_DEADLINE_S) -> list[int]:
    """Wait (bounded) until none of `pids` runs; returns the survivors. Zombies count as gone.

    Waits on a pidfd (readable once the process exits) so it never reaps a child: the pool's own
    join must still see the exit status."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
    return [pid for pid in pids if _alive(pid)]


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_new_tracker():
    """Reader workers need no resource tracker: no runtime test may start one (docs/memory-guide.md)."""
    before = tracker_pids()
    yield
    assert tracker_pids() <= before, "a resource tracker / forkserver was started"


@pytest.fixture(autouse=True)
def no_leftover_shm():
    """Every runtime test must leave no run directory of this process in /dev/shm."""
    yield
    gc.collect()
    assert shm_entries() == [], "run directories left in /dev/shm"


@pytest.fixture(scope="module")
def runtimes():
    """get(start_method, num_workers) -> a DatasetRuntime shared by the module (closed at the end)."""
    made: dict[tuple[str, int], drt.DatasetRuntime] = {}

    def get(start_method: str, num_workers: int) -> drt.DatasetRuntime:
        key = (start_method, num_workers)
        if key not in made:
            made[key] = drt.DatasetRuntime(num_workers=num_workers, start_method=start_method)
            made[key].start_workers()  # every read goes through the workers (no in-process head start)
        return made[key]

    yield get
    for rt in made.values():
        rt.close()
