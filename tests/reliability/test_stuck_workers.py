"""Stuck workers (docs/reliability.md, "Stuck workers"): a stopped reader worker is reported within
`worker_timeout_s` plus a small margin and the hung pool is killed; torch DataLoader workers that
datasetrt starts exit when their parent is SIGKILLed; persistent torch workers recover on the
next pass after one of them is killed.

Timing bounds here are generous against what they exclude (waiting for a stopped process to act
on Shutdown or SIGTERM: 5 s per step; workers that outlive their parent for good): a busy machine
does not make them fail, such a wait does.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import datasetrt as drt
from datasetrt.errors import WorkerTimeoutError
from tests.conftest import sample_items
from tests.runtime.conftest import consume_within, shm_entries, take, wait_pids_gone, write_cache

PARENT_SCRIPT = Path(__file__).with_name("torch_parent.py")
ROOT = PARENT_SCRIPT.parents[2]
EXIT_DEADLINE_S = 30.0  # workers that outlive their parent did so for 90 s and more
START_DEADLINE_S = 120.0  # a parent importing torch and spawning two workers on a loaded machine


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return write_cache(tmp_path_factory.mktemp("stuck"), "c", sample_items(400), "lz4", max_shard_bytes=8192)


def kill_survivors(pids) -> list[int]:
    """SIGKILL whichever of `pids` still runs (never leak a process); returns them."""
    alive = [pid for pid in pids if pid_alive(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    return alive


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- reader workers ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_stopped_reader_worker_is_reported_within_the_timeout(cache, method):
    """worker_timeout_s=3: the hung pool is SIGKILLed when the timeout fires, not joined twice for
    5 s (a stopped process reads no Shutdown and does not act on SIGTERM)."""
    timeout_s = 3.0
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    rt.start_workers()
    try:
        config = drt.ReaderConfig(seed=3, shuffle=False, prefetch_size=4, worker_timeout_s=timeout_s)
        ds = drt.CachedDataset([cache], reader_config=config, runtime=rt)
        ds.set_epoch_len(200_000)
        it = iter(ds)
        take(it, 5)
        pids = rt.worker_pids
        stopped_at = time.monotonic()
        os.kill(pids[0], signal.SIGSTOP)
        try:
            with pytest.raises(WorkerTimeoutError, match="no progress"):
                consume_within(it, timeout_s=60.0)
            reported_s = time.monotonic() - stopped_at
            assert reported_s < 10.0, (
                f"reported after {reported_s:.1f} s (timeout {timeout_s} s): joined the stopped worker"
            )
            assert rt.worker_pids == []
            assert wait_pids_gone(pids) == []
        finally:
            kill_survivors(pids)
        del it
        gc.collect()
        assert shm_entries() == []
        assert len(list(drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=5), runtime=rt))) == 400
    finally:
        rt.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_close_kills_a_stopped_worker_at_once(cache, method):
    """An orderly close() does not wait for a stopped worker to read Shutdown or act on SIGTERM
    (5 s each): it is SIGKILLed, the others stop as usual."""
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    rt.start_workers()
    pids = rt.worker_pids
    try:
        os.kill(pids[1], signal.SIGSTOP)
        started = time.monotonic()
        rt.close()
        closed_s = time.monotonic() - started
        assert closed_s < 5.0, f"close() took {closed_s:.1f} s with a stopped worker: joined it"
        assert wait_pids_gone(pids) == []
    finally:
        kill_survivors(pids)
        rt.close()


# -- torch DataLoader workers --------------------------------------------------------------------


@pytest.mark.parametrize(("method", "mode"), [("spawn", "idle"), ("spawn", "blocked"), ("fork", "blocked")])
def test_torch_workers_exit_when_the_parent_is_sigkilled(cache, method, mode):
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    parent = subprocess.Popen(
        [sys.executable, str(PARENT_SCRIPT), str(cache), method, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    workers: list[int] = []
    try:
        line = _read_line(parent, START_DEADLINE_S)
        assert line, f"the parent printed no worker pids (exit {parent.poll()}): {parent.stderr.read()[-2000:]}"
        workers = json.loads(line)["workers"]
        assert len(workers) == 2 and all(pid_alive(pid) for pid in workers)
        parent.kill()
        parent.wait()
        survivors = wait_pids_gone(workers, timeout_s=EXIT_DEADLINE_S)
        assert survivors == [], f"DataLoader workers {survivors} outlived their SIGKILLed parent by {EXIT_DEADLINE_S} s"
    finally:
        parent.kill()
        parent.wait()
        parent.stdin.close()
        parent.stdout.close()
        parent.stderr.close()
        kill_survivors(workers)


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line of `proc`'s stdout, or "" if it exits (or `timeout_s` passes) first."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return proc.stdout.readline()


def keys(batch) -> list[tuple]:
    return [(s.cache_id, s.sample_id, s.data) for s in batch]


def test_persistent_torch_workers_restart_after_one_is_killed(cache):
    """The pass that loses a worker fails (torch's error); the next pass starts new workers and
    yields exactly that pass's batches (torch alone would wait for the dead worker on every pass)."""
    pytest.importorskip("torch")
    want = _two_passes(loader_over(cache, num_workers=0))[1]
    loader = loader_over(cache, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    victim = it._workers[1].pid
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        os.kill(victim, signal.SIGKILL)
        wait_pids_gone([victim])  # (torch's SIGCHLD handler may raise here already)
        for _ in it:
            pass
    old = [w.pid for w in it._workers]
    second = iter(loader)
    got = [list(b) for b in second]
    assert got == want
    assert victim not in [w.pid for w in second._workers]
    assert wait_pids_gone(old) == []
    del it, second, loader
    gc.collect()


def loader_over(cache: Path, **kw):
    ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=0))
    return ds.to_torch_dataloader(seed=3, batch_size=4, samples_per_epoch=400, collate_fn=keys, verbose=False, **kw)


def _two_passes(loader) -> list[list]:
    return [list(loader) for _ in range(2)]
