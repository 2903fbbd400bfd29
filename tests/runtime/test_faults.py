"""Fault injection with real processes: killed and stopped workers, corrupted and missing cache
files, and a parent process that dies while its workers read.

Each fault surfaces as a typed error within a bounded time (never a hang), leaves /dev/shm clean,
and leaves the runtime usable for the next iteration.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

import datasetrt as drt
from datasetrt.errors import CacheIOError, IntegrityError, WorkerCrashedError, WorkerError, WorkerTimeoutError
from datasetrt.runtime.shm import sweep_stale_runs
from tests.conftest import sample_items
from tests.runtime.conftest import (
    SHM,
    consume_within,
    flip_payload_byte,
    shard_paths,
    shm_entries,
    take,
    wait_pids_gone,
    write_cache,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_cache(tmp_path_factory.mktemp("faults"), "good", sample_items(300), "lz4", max_shard_bytes=8192)


@pytest.fixture(scope="module")
def fork_rt():
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()  # faults must hit reads in the workers, not an in-process head start
    yield rt
    rt.close()


def long_dataset(paths, runtime, **cfg):
    """An ordered window far longer than the ring holds, so workers are busy when a fault hits."""
    cfg.setdefault("worker_timeout_s", 60.0)  # a missed fault would hang 300 s by default
    ds = drt.CachedDataset(
        paths, reader_config=drt.ReaderConfig(seed=3, shuffle=False, prefetch_size=4, **cfg), runtime=runtime
    )
    ds.set_epoch_len(200_000)
    return ds


def check_usable(runtime, paths) -> None:
    config = drt.ReaderConfig(seed=5, prefetch_size=16)
    want = list(drt.CachedDataset(paths, reader_config=config))
    assert list(drt.CachedDataset(paths, reader_config=config, runtime=runtime)) == want


# -- worker processes --------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sigkill_mid_epoch_raises_worker_crashed_and_pool_restarts(good, method):
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    rt.start_workers()
    try:
        it = iter(long_dataset([good], rt))
        take(it, 5)
        old = rt.worker_pids
        victim = 1
        os.kill(old[victim], signal.SIGKILL)
        with pytest.raises(WorkerCrashedError) as info:
            consume_within(it)
        message = str(info.value)
        assert f"worker {victim}" in message and str(old[victim]) in message and "signal 9" in message
        del it
        gc.collect()
        assert shm_entries() == []
        assert wait_pids_gone(old) == []  # the broken pool was closed, its survivor too
        check_usable(rt, [good])
        assert len(rt.worker_pids) == 2 and not set(rt.worker_pids) & set(old)
    finally:
        rt.close()


def test_sigkill_of_the_zygote_mid_epoch_raises_and_stops_its_workers(good):
    """spawn: the process that forked the workers dies -> WorkerCrashedError at once, no worker
    outlives the pool, and the next read starts a fresh zygote and workers."""
    rt = drt.DatasetRuntime(num_workers=2, start_method="spawn")
    try:
        old = rt.start_workers()
        zygote = rt._worker_pool._zygote.pid
        assert all(psutil.Process(pid).ppid() == zygote for pid in old)  # the workers are its children
        it = iter(long_dataset([good], rt))
        take(it, 5)
        os.kill(zygote, signal.SIGKILL)
        with pytest.raises(WorkerCrashedError, match="forks the reader workers"):
            consume_within(it)
        del it
        gc.collect()
        assert shm_entries() == []
        assert wait_pids_gone([*old, zygote]) == []
        check_usable(rt, [good])
        assert len(rt.worker_pids) == 2 and not set(rt.worker_pids) & set(old)
    finally:
        rt.close()


def test_worker_killed_between_iterations(fork_rt, good):
    """A worker that died while idle is reported by the next read (WorkerCrashedError naming the
    worker, its pid and the signal: a lost worker is never silent), and the read after that
    recovers on a fresh pool."""
    check_usable(fork_rt, [good])
    old = fork_rt.worker_pids
    os.kill(old[0], signal.SIGKILL)
    assert wait_pids_gone([old[0]]) == []
    with pytest.raises(WorkerCrashedError) as info:
        check_usable(fork_rt, [good])
    assert f"reader worker 0 (pid {old[0]}) was killed by signal 9" in str(info.value)
    check_usable(fork_rt, [good])
    assert not set(fork_rt.worker_pids) & set(old)


def test_stopped_worker_raises_worker_timeout(good):
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()
    try:
        it = iter(long_dataset([good], rt, worker_timeout_s=1.0))
        take(it, 5)
        stopped = rt.worker_pids[0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            with pytest.raises(WorkerTimeoutError, match="no progress"):
                consume_within(it)
            assert rt.worker_pids == []  # the hung pool was stopped (the stopped worker killed)
            assert wait_pids_gone([stopped]) == []
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        del it
        gc.collect()
        assert shm_entries() == []
        check_usable(rt, [good])
    finally:
        rt.close()


# -- cache files ---------------------------------------------------------------------------------------


def test_corrupted_record_raises_integrity_error_with_worker_traceback(fork_rt, good, tmp_path):
    bad = write_cache(tmp_path, "bad", sample_items(200), "none")  # record checksums on by default
    flip_payload_byte(bad, 17)
    config = drt.ReaderConfig(seed=1, shuffle=False)
    with pytest.raises(IntegrityError):  # the reference reader agrees it is corrupt
        list(drt.CachedDataset([bad], reader_config=config))
    pids = fork_rt.worker_pids or None
    with pytest.raises(IntegrityError, match="sample 17") as info:
        consume_within(iter(drt.CachedDataset([bad], reader_config=config, runtime=fork_rt)))
    cause = info.value.__cause__
    assert isinstance(cause, WorkerError)
    assert "Traceback" in str(cause) and "IntegrityError" in str(cause)
    gc.collect()
    assert shm_entries() == []
    if pids is not None:
        assert fork_rt.worker_pids == pids  # a failed task does not kill the worker
    check_usable(fork_rt, [good])


def test_corrupt_first_batch_of_a_fresh_runtime_raises_integrity_error(good, tmp_path):
    """A fresh runtime reads its first batch in this process before launching its workers
    (BatchRun(pool_running=False)): a corrupt record there raises IntegrityError itself (the run,
    never attached to a pool, closes without touching one), and the runtime stays usable."""
    bad = write_cache(tmp_path, "bad", sample_items(200), "none")
    flip_payload_byte(bad, 3)
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    try:
        ds = rt.cached_dataset([bad], reader_config=drt.ReaderConfig(seed=1, shuffle=False))
        with pytest.raises(IntegrityError, match="sample 3"):
            next(ds.iter_batches(16))
        assert not rt.workers_launched
        gc.collect()
        assert shm_entries() == []
        check_usable(rt, [good])
    finally:
        rt.close()


def test_shard_deleted_after_open_raises_cache_io_error(fork_rt, good, tmp_path):
    cache = write_cache(tmp_path, "gone", sample_items(200), "zstd", max_shard_bytes=4096)
    ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=1), runtime=fork_rt)
    shards = shard_paths(cache)
    assert len(shards) > 2
    shards[1].unlink()
    with pytest.raises(CacheIOError, match="No such file") as info:
        consume_within(iter(ds))
    assert isinstance(info.value.__cause__, WorkerError)
    gc.collect()
    assert shm_entries() == []
    check_usable(fork_rt, [good])


# -- the parent dies -------------------------------------------------------------------------------------


PARENT = textwrap.dedent("""
    import json, os, sys
    import datasetrt as drt
    rt = drt.DatasetRuntime(num_workers=2, start_method=sys.argv[2])
    ds = rt.cached_dataset([sys.argv[1]], reader_config=drt.ReaderConfig(seed=1, shuffle=False, prefetch_size=4))
    ds.set_epoch_len(10**7)
    it = iter(ds)
    for _ in range(20):
        next(it)
    runs = [p.name for p in __import__("pathlib").Path("/dev/shm").glob(f"datasetrt-{os.getpid()}-*")]
    rings = {line.split()[-2] for line in open("/proc/self/maps") if "/memfd:datasetrt-" in line}
    print(json.dumps({"pid": os.getpid(), "workers": rt.worker_pids, "runs": runs, "rings": len(rings)}), flush=True)
    os._exit(0)
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_parent_death_stops_workers_and_next_start_sweeps_old_run_dirs(good, method):
    """os._exit skips every cleanup: the workers die with their parent, and its ring, which has
    no name (only a mapping in each process), goes with the last of them. The next pool start
    still sweeps /dev/shm run directories of dead owners that older releases left behind."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", PARENT, str(good), method], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report["workers"]) == 2 and report["runs"] == [] and report["rings"] == 1
    assert wait_pids_gone(report["workers"]) == [], "workers outlived their parent"
    assert shm_entries(report["pid"]) == []
    stale = SHM / f"datasetrt-{report['pid']}-0123456789ab"  # as an older release left it
    stale.mkdir()
    (stale / "ring").write_bytes(b"x")
    rt = drt.DatasetRuntime(num_workers=1, start_method="fork")
    try:
        check_usable(rt, [good])  # starting the pool sweeps dead owners' run dirs
        assert not stale.exists()
    finally:
        rt.close()


def test_sweep_removes_only_run_dirs_of_dead_owners(tmp_path):
    live = tmp_path / f"datasetrt-{os.getpid()}-abc123"
    dead = tmp_path / f"datasetrt-{(1 << 22) + 1}-abc123"  # above the kernel's maximum pid
    other = tmp_path / "datasetrt-notarun"
    for path in (live, dead, other):
        path.mkdir()
    (dead / "ring").write_bytes(b"x")
    assert sweep_stale_runs(tmp_path) == [dead]
    assert live.exists() and other.exists() and not dead.exists()
