"""Preemption: SIGTERM and SIGKILL to a process iterating `DatasetRuntime(num_workers=2)`, and to
its workers, fork and spawn (issue 15, item 3).

Whatever kills whom, no `datasetrt-<victim pid>-*` name is left in /dev/shm (rings are anonymous
memfds: no name exists even while iterating) and no process of the victim is left. SIGTERM to
the parent runs the normal cleanup (`finally` blocks, workers stopped) and exits 143, unless the
program installed its own SIGTERM handler, which is left alone. Before this, each run was a named
/dev/shm directory that SIGTERM (default action) and SIGKILL left behind.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

import datasetrt as drt
from datasetrt.errors import WorkerCrashedError
from tests.conftest import sample_items
from tests.runtime.conftest import consume_within, ring_maps, shm_entries, take, wait_pids_gone, write_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT_DEADLINE_S = 120.0

VICTIM = textwrap.dedent("""
    import json, os, signal, sys
    import datasetrt as drt
    cache, method, own_handler = sys.argv[1], sys.argv[2], sys.argv[3] == "own"
    if own_handler:  # the program's own handler: datasetrt must leave it in place
        def on_term(signum, frame):
            print(json.dumps({"own_handler": signum}), flush=True)
            os._exit(7)
        signal.signal(signal.SIGTERM, on_term)
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    ds = rt.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=1, shuffle=False, prefetch_size=4))
    ds.set_epoch_len(10**12)
    workers = rt.start_workers()
    pool = rt._worker_pool
    it = iter(ds)
    for _ in range(50):
        next(it)
    names = [p.name for p in __import__("pathlib").Path("/dev/shm").glob(f"datasetrt-{os.getpid()}-*")]
    rings = {line.split()[-2] for line in open("/proc/self/maps") if "/memfd:datasetrt-" in line}
    try:  # (the report is printed inside: SIGTERM may arrive as soon as it is written)
        print(json.dumps({"pid": os.getpid(), "workers": workers, "zygote": pool._zygote.pid if pool._zygote else None,
                          "names": names, "rings": len(rings), "handler": repr(signal.getsignal(signal.SIGTERM))}),
              flush=True)
        for _ in it:  # until killed
            pass
    finally:
        print(json.dumps({"finally": True}), flush=True)
""")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return write_cache(tmp_path_factory.mktemp("preempt"), "p", sample_items(300), "lz4", max_shard_bytes=8192)


def start_victim(cache, method: str, handler: str = "default"):
    """The victim process and its first report (read with a deadline: a hang fails, not blocks)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(cache), method, handler],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    ready, _, _ = select.select([proc.stdout], [], [], REPORT_DEADLINE_S)
    if not ready:
        proc.kill()
        pytest.fail(f"the victim reported nothing within {REPORT_DEADLINE_S:.0f} s")
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        pytest.fail(f"the victim exited early ({proc.returncode}): {proc.stderr.read()}")
    return proc, json.loads(line)


def finish(proc) -> tuple[int, list[dict], str]:
    out, err = proc.communicate(timeout=REPORT_DEADLINE_S)
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def assert_nothing_left(report: dict) -> None:
    """No name of the victim in /dev/shm, and none of its processes alive."""
    pids = [*report["workers"], *([report["zygote"]] if report["zygote"] else [])]
    assert wait_pids_gone(pids) == [], "a worker (or the zygote) outlived the victim"
    assert shm_entries(report["pid"]) == []


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_parent_leaves_no_name_and_no_process(cache, method, sig):
    proc, report = start_victim(cache, method)
    assert report["names"] == [] and report["rings"] == 1  # no name even while it iterates
    assert len(report["workers"]) == 2 and (report["zygote"] is not None) == (method == "spawn")
    os.kill(report["pid"], sig)
    code, lines, err = finish(proc)
    if sig == signal.SIGTERM:  # the handler raised SystemExit: finally blocks and cleanup ran
        assert code == 128 + signal.SIGTERM, err
        assert {"finally": True} in lines and "Traceback" not in err, err
    else:
        assert code == -signal.SIGKILL
    assert_nothing_left(report)


def test_the_programs_own_sigterm_handler_is_left_alone(cache):
    proc, report = start_victim(cache, "spawn", handler="own")
    assert "on_term" in report["handler"]
    os.kill(report["pid"], signal.SIGTERM)
    code, lines, _err = finish(proc)
    assert code == 7 and {"own_handler": signal.SIGTERM} in lines  # its handler ran; ours was never installed
    assert_nothing_left(report)  # os._exit skipped cleanup: the workers die with their parent


HELD = textwrap.dedent("""
    import json, signal
    import datasetrt as drt
    out = {"before": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}
    rt = drt.DatasetRuntime(num_workers=1, start_method="fork")
    try:
        out["before_start"] = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # nothing before the pool starts
        rt.start_workers()
        handler = signal.getsignal(signal.SIGTERM)
        out["held"] = handler is not signal.SIG_DFL
        try:
            handler(signal.SIGTERM, None)
            out["exit_code"] = None
        except SystemExit as exc:
            out["exit_code"] = exc.code
    finally:
        rt.close()
    out["after_close"] = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    print(json.dumps(out), flush=True)
""")


def test_the_sigterm_handler_is_held_while_a_pool_runs():
    """In a fresh interpreter (the test runner's own process may hold another handler: a pool a
    module fixture keeps, or Ray's), so it runs in every order of the full suite."""
    proc = subprocess.run(
        [sys.executable, "-c", HELD],
        env={**os.environ, "PYTHONPATH": ROOT},
        text=True,
        capture_output=True,
        timeout=REPORT_DEADLINE_S,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["before"], "a fresh interpreter starts with the default SIGTERM action"
    assert out["before_start"]  # nothing before the pool starts
    assert out["held"]
    assert out["exit_code"] == 143
    assert out["after_close"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_worker_leaves_no_name_and_no_process(cache, method, sig):
    """The parent raises WorkerCrashedError naming the signal, stops the other worker (and the
    zygote), and the ring goes with the iterator; no name existed at any point."""
    foreign = set(ring_maps())  # other runtimes' idle rings in this process (runtime/pool.py) are not ours
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    try:
        workers = rt.start_workers()
        zygote = rt._worker_pool._zygote
        ds = rt.cached_dataset(
            [cache], reader_config=drt.ReaderConfig(seed=3, shuffle=False, prefetch_size=4, worker_timeout_s=60.0)
        )
        ds.set_epoch_len(10**9)
        it = iter(ds)
        take(it, 20)
        [ring] = sorted(set(ring_maps()) - foreign)
        assert shm_entries() == []
        # the same anonymous ring (forked workers also inherited the parent's mappings of `foreign`)
        assert all(sorted(set(ring_maps(pid)) - foreign) in ([ring], []) for pid in workers)
        os.kill(workers[0], sig)
        with pytest.raises(WorkerCrashedError, match=f"signal {int(sig)}"):
            consume_within(it)
        del it
        gc.collect()
        assert shm_entries() == [] and set(ring_maps()) - foreign == set()
        assert wait_pids_gone([*workers, *([zygote.pid] if zygote else [])]) == []
    finally:
        rt.close()
