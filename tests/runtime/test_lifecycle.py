"""Lifecycle of reader workers and run directories: reuse, normal end, abandonment, consumer
exceptions, KeyboardInterrupt, runtime.close(), garbage collection, and what workers import.

After each of these, no `datasetrt-<this pid>-*` entry is left in /dev/shm (also checked after
every test by the autouse fixture) and, once the runtime is closed, no child process remains.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.errors import WorkerError
from tests.conftest import sample_items
from tests.runtime.conftest import (
    active_run,
    child_pids,
    consume_within,
    idle_ring,
    loose_rings,
    ring_maps,
    shm_entries,
    take,
    wait_pids_gone,
    write_cache,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    base = tmp_path_factory.mktemp("lifecycle")
    return [
        write_cache(base, "a", sample_items(400), "lz4", max_shard_bytes=16384),
        write_cache(base, "b", sample_items(300, seed=1, tag="b"), "zstd"),
    ]


@pytest.fixture(scope="module")
def shared():
    """One spawn runtime for the module: its workers must survive everything but close()."""
    rt = drt.DatasetRuntime(num_workers=2, start_method="spawn")
    yield rt
    rt.close()


def own_rings(foreign: set[str]) -> list[str]:
    """Rings this process maps, other than `foreign` (other runtimes' idle rings, taken first)."""
    return sorted(set(ring_maps()) - foreign)


def dataset(paths, runtime, **cfg):
    cfg.setdefault("seed", 1)
    cfg.setdefault("prefetch_size", 8)
    return drt.CachedDataset(paths, reader_config=drt.ReaderConfig(**cfg), runtime=runtime)


def started(runtime, paths) -> list[int]:
    """Make sure the runtime's workers run and are ready; return their pids."""
    return runtime.start_workers()


def test_first_read_starts_in_process_while_workers_start(paths):
    """A fresh runtime's first iterator yields before any worker is ready (the head of the
    window is read in-process), then hands over to the workers; the samples are the in-process
    reader's, in order."""
    rt = drt.DatasetRuntime(num_workers=2, start_method="spawn")
    try:
        ds, ref = dataset(paths, rt), dataset(paths, None)
        for d in (ds, ref):
            d.set_epoch_len(300_000)
        it, want = iter(ds), iter(ref)
        assert next(it) == next(want)
        assert not rt._worker_pool.all_ready  # a spawned worker needs ~0.1 s; the first sample came first
        for k, (got, expected) in enumerate(zip(it, want), start=1):
            if got != expected:
                pytest.fail(f"sample {k} differs")
        assert k == 299_999 and next(it, None) is None
        assert rt._worker_pool.all_ready and len(rt.worker_pids) == 2
    finally:
        rt.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_first_batch_is_read_before_the_workers_launch(paths, method):
    """A fresh runtime's first batch iterator reads its first batch in this process before it
    launches any worker (a fork from a torch process takes tens of ms), then launches them and
    goes on; an iterator closed after one batch launches nothing. Bytes and order are the
    in-process reader's."""
    others = child_pids()  # other tests' runtimes may still run workers
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    try:
        ds, ref = dataset(paths, rt, shuffle=True), dataset(paths, None, shuffle=True)
        it, ref_it = ds.iter_batches(64), ref.iter_batches(64)
        assert bytes(next(it).data) == bytes(next(ref_it).data)
        assert not rt.workers_launched and rt.worker_pids == []
        it.close()
        ref_it.close()
        assert not rt.workers_launched and child_pids() - others == set()
        got = [bytes(b.data) for b in ds.iter_batches(64)]  # the next epoch: launched after its first batch
        assert rt.workers_launched and len(rt.worker_pids) == 2
        want = [bytes(b.data) for b in ref.iter_batches(64)]
        assert got == want and len(want) == 11
    finally:
        rt.close()


def test_start_workers_waits_until_every_worker_is_ready(paths):
    rt = drt.DatasetRuntime(num_workers=2, start_method="spawn")
    try:
        pids = rt.start_workers()
        assert len(pids) == 2 and set(pids) <= child_pids() and rt._worker_pool.all_ready
        assert rt.start_workers() == pids  # idempotent
        assert len(list(dataset(paths, rt))) == 700
    finally:
        rt.close()


def test_workers_start_lazily_and_are_reused_across_iterators_and_datasets(shared, paths):
    ds1 = dataset(paths, shared)
    ds2 = dataset(paths[1:], shared, shuffle=False)
    pids = started(shared, paths)
    assert len(pids) == 2 and set(pids) <= child_pids()
    want = list(drt.CachedDataset(paths, reader_config=ds1.reader_config))
    assert list(ds1) == want
    assert len(list(ds2)) == 300
    assert len(list(ds1)) == 700
    assert shared.worker_pids == pids
    assert shm_entries() == []


def test_ring_lives_while_iterating_and_is_kept_idle_for_the_next_run_of_its_shape(shared, paths):
    foreign = set(loose_rings(shared))  # other runtimes' idle rings in this process: not this test's
    ds = dataset(paths, shared)
    it = iter(ds)
    take(it, 3)
    [ring] = own_rings(foreign)
    run = active_run(shared)
    assert ring.startswith(f"datasetrt-{os.getpid()}-ring{run.ring.key}@")
    assert shm_entries() == []  # the ring has no name: private to this process and its workers
    assert os.fstat(run.ring.fd).st_nlink == 0
    assert os.fstat(run.ring.fd).st_size == run.shape.slots * run.shape.slot_bytes
    for pid in shared.worker_pids:  # every worker that got a task maps the same ring
        assert ring_maps(pid) in ([ring], [])
    del run  # (a run's ring is unmapped when its last view goes; this test held the run)
    assert len(list(it)) == 697
    # Exhausted with no task in flight: the pool keeps the ring for the next run of its shape.
    assert idle_ring(shared) == [ring] and own_rings(foreign) == [ring] and shared._worker_pool.handlers == {}
    for pid in shared.worker_pids:
        assert ring_maps(pid) in ([ring], [])
    assert len(list(ds)) == 700 and own_rings(foreign) == [ring]  # the next epoch reads through the same ring
    # A run of another shape (a larger prefetch: more slots) drops it, in the workers too (ForgetRing).
    assert len(list(dataset(paths, shared, prefetch_size=4096))) == 700
    [other] = idle_ring(shared)
    assert other != ring and own_rings(foreign) == [other]
    for pid in shared.worker_pids:
        assert ring_maps(pid) in ([other], [])


def test_abandoned_iterator_is_cleaned_up_by_gc(shared, paths):
    foreign = set(loose_rings(shared))
    pids = started(shared, paths)
    it = iter(dataset(paths, shared, shuffle=False))
    take(it, 5)
    assert len(own_rings(foreign)) == 1 and shm_entries() == []
    del it
    gc.collect()
    assert loose_rings(shared, foreign=foreign) == [] and shared._worker_pool.handlers == {}  # (at most the idle ring)
    assert shared.worker_pids == pids
    assert len(list(dataset(paths, shared))) == 700


@pytest.mark.parametrize("exc_type", [ValueError, KeyboardInterrupt])
def test_consumer_exception_inside_the_loop(shared, paths, exc_type):
    pids = started(shared, paths)
    ds = dataset(paths, shared)

    def consume():
        for k, _sample in enumerate(ds):
            if k == 10:
                raise exc_type("consumer stops")

    with pytest.raises(exc_type, match="consumer stops"):
        consume()
    gc.collect()
    assert shm_entries() == [] and shared._worker_pool.handlers == {}
    assert shared.worker_pids == pids  # workers ignore it and keep serving
    ref = drt.CachedDataset(paths, reader_config=ds.reader_config)
    take(iter(ref), 1)  # the failed iterator reserved a window; advance the reference the same way
    assert list(ds) == list(ref)


def test_workers_ignore_sigint(shared, paths):
    """Ctrl-C reaches the whole process group; the parent alone handles it."""
    pids = started(shared, paths)
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    ds = dataset(paths, shared)
    assert len(list(ds)) == 700 and len(list(ds)) == 700
    assert shared.worker_pids == pids


def test_spawned_workers_import_no_numpy_polars_pyarrow_or_torch(shared, paths):
    started(shared, paths)
    pytest.importorskip("polars")
    assert "polars" in sys.modules and "numpy" in sys.modules  # so spawn had something to leak

    ds = dataset(paths, shared)
    assert len(list(ds)) == 700  # after a real read, not just start-up
    ready = shared._worker_pool.ready
    assert len(ready) == 2 and all(r is not None for r in ready)
    assert sorted(r.pid for r in ready) == sorted(shared.worker_pids)
    assert [r.heavy_modules for r in ready] == [(), ()]
    for pid in shared.worker_pids:  # and none was mapped later, while reading
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "_multiarray_umath" not in maps and "libarrow" not in maps and "polars" not in maps


def test_script_without_main_guard_importing_torch_and_polars(tmp_path, paths):
    """A user script with no `if __name__ == "__main__"` guard that imports torch (a stub here)
    and Polars: spawn workers must not re-run it nor import either."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        import torch, polars
        import datasetrt as drt
        rt = drt.DatasetRuntime(num_workers=2, start_method="spawn")
        rt.start_workers()  # readiness is what this test checks; reads would not wait for it
        ds = rt.cached_dataset([{str(paths[0])!r}], reader_config=drt.ReaderConfig(seed=1))
        n = len(list(ds))
        print(json.dumps([n, [list(r.heavy_modules) for r in rt._worker_pool.ready]]))
        rt.close()
    """)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [400, [[], []]]


DESCENDANTS = textwrap.dedent("""
    import json, sys
    import psutil
    import datasetrt as drt
    rt = drt.DatasetRuntime(num_workers=2, start_method=sys.argv[2])
    pids = rt.start_workers()
    ds = rt.cached_dataset([sys.argv[1]], reader_config=drt.ReaderConfig(seed=1, prefetch_size=8))
    n = len(list(ds))
    procs = psutil.Process().children(recursive=True)
    print(json.dumps({"n": n, "workers": pids, "children": [[p.pid, " ".join(p.cmdline())] for p in procs]}))
    rt.close()
""")


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_reader_workers_start_without_a_resource_tracker(paths, method):
    """Documented (memory-guide.md): reader workers register no semaphore or shared-memory block,
    so no multiprocess resource tracker (~10 MiB) is started. A fresh interpreter, so a tracker
    some earlier test started cannot hide one (the child-count helpers skip trackers)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", DESCENDANTS, str(paths[0]), method], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["n"] == 400 and len(report["workers"]) == 2
    trackers = [cmd for _, cmd in report["children"] if "resource_tracker" in cmd]
    assert trackers == []
    others = sorted(pid for pid, _ in report["children"] if pid not in report["workers"])
    assert len(others) == (1 if method == "spawn" else 0), report  # spawn: the zygote that forks them


EXIT_WITH_OPEN_ITERATOR = textwrap.dedent("""
    import json, os, sys
    import datasetrt as drt
    rt = drt.DatasetRuntime(num_workers=2, start_method="spawn")
    ds = rt.cached_dataset([sys.argv[1]], reader_config=drt.ReaderConfig(seed=1))
    ds.set_epoch_len(10**6)
    it = iter(ds)  # a module-level iterator, still open when the interpreter exits
    next(it)
    runs = [p.name for p in __import__("pathlib").Path("/dev/shm").glob(f"datasetrt-{os.getpid()}-*")]
    rings = {line.split()[-2] for line in open("/proc/self/maps") if "/memfd:datasetrt-" in line}
    print(json.dumps({"workers": rt.worker_pids, "runs": runs, "rings": len(rings)}), flush=True)
    if sys.argv[2] == "uncaught":
        raise RuntimeError("training step failed")
""")


@pytest.mark.parametrize("mode", ["exit", "uncaught"])
def test_interpreter_exit_with_an_open_iterator_leaves_shm_clean(paths, mode):
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_OPEN_ITERATOR, str(paths[0]), mode],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == (0 if mode == "exit" else 1), out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["runs"] == [] and report["rings"] == 1 and len(report["workers"]) == 2
    assert wait_pids_gone(report["workers"]) == []
    assert "Exception ignored" not in out.stderr, out.stderr


# -- close and garbage collection (each with its own runtime) ----------------------------------------


def test_close_stops_every_worker(paths):
    before = child_pids()
    rt = drt.DatasetRuntime(num_workers=3, start_method="fork")
    assert rt.worker_pids == [] and child_pids() == before  # started at the first parallel read
    pids = started(rt, paths)
    assert set(pids) <= child_pids()
    rt.close()
    assert rt.worker_pids == []
    assert wait_pids_gone(pids, timeout_s=0.0) == []  # close() joined them
    assert child_pids() <= before
    rt.close()  # idempotent


def test_del_runtime_and_gc_stops_workers_and_cleans_shm(paths, shared):
    # (`shared`'s idle ring and other runtimes' are not this test's: loose_rings leaves them out)
    foreign = set(loose_rings(shared))
    before = child_pids()
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    ds = dataset(paths, rt)
    it = iter(ds)
    take(it, 4)
    pids = rt.worker_pids
    assert len(loose_rings(shared, foreign=foreign)) == 1 and shm_entries() == []
    del it, ds, rt
    gc.collect()
    assert shm_entries() == [] and loose_rings(shared, foreign=foreign) == []
    assert wait_pids_gone(pids) == []
    assert child_pids() <= before


def test_close_with_an_open_iterator_stops_workers_and_the_ring_goes_with_the_iterator(paths, shared):
    foreign = set(loose_rings(shared))
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    it = iter(dataset(paths, rt))
    take(it, 4)
    pids = rt.worker_pids
    rt.close()
    try:
        assert not child_pids() & set(pids)
        assert shm_entries() == []
        assert (
            len(loose_rings(shared, foreign=foreign)) == 1
        )  # the iterator's chunk may still be viewed: only this process maps it
    finally:
        del it
        gc.collect()
    assert loose_rings(shared, foreign=foreign) == []


@pytest.mark.parametrize("method", ["fork", "spawn"])  # spawn: closed during the in-process head start
def test_iterator_used_after_close_raises_a_typed_error(paths, method):
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    ds = dataset(paths, rt, prefetch_size=1)
    ds.set_epoch_len(100_000)  # far more than the ring holds
    it = iter(ds)
    take(it, 2)
    pids = rt.worker_pids
    rt.close()
    assert wait_pids_gone(pids, timeout_s=0.0) == []
    with pytest.raises(WorkerError):
        consume_within(it)
    del it
    gc.collect()
    assert shm_entries() == []


def test_parallel_reads_off_reads_in_process(paths):
    before = child_pids()
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork", parallel_reads=False)
    ds = dataset(paths, rt)
    it = iter(ds)
    take(it, 3)
    assert shm_entries() == [] and rt.worker_pids == [] and child_pids() == before
    assert len(list(it)) == 697
    rt.close()
