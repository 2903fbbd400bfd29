"""The memory limit and flow control of the multiprocess reader.

A configuration whose bound (runtime/memory.py) exceeds ReaderConfig.memory_limit_bytes is
refused, with every term listed, before any worker or shared memory exists; ring memory that
cannot be reserved is a typed error; the default limit is half of min(physical, cgroup); and a slow consumer never lets
workers read further ahead than the ring holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import psutil
import pytest

import datasetrt as drt
from datasetrt.errors import ResourceLimitError
from datasetrt.runtime import memory
from datasetrt.runtime.memory import MemoryBound, default_memory_limit_bytes
from datasetrt.runtime.run import RunShape
from tests.conftest import sample_items
from tests.runtime.conftest import INDEX_ROW, active_run, child_pids, shm_entries, take, write_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TERMS = ("ring", "consumer chunk", "decode scratch")


def largest_record(cache: Path) -> int:
    """The largest stored record, read from index.bin (shard_id, offset, byte_len rows)."""
    return max(length for _, _, length in INDEX_ROW.iter_unpack((cache / "index.bin").read_bytes()))


def documented_shape(prefetch: int, num_workers: int, record: int) -> tuple[int, int, int]:
    """(rows_per_task, slot_bytes, ring slots) as docs/memory-guide.md states the formula, written
    here independently of RunShape.plan (tests/unit/runtime/test_memory_bound.py checks worked
    numbers and the guide's printed figures)."""
    rows = max(16, min(512, (1 << 20) // record))
    slot_bytes = -(-(7 * 8 * rows + max(1 << 20, rows * record)) // 4096) * 4096
    slots = max(2 * num_workers + 2, min(-(-prefetch // rows), (16 << 20) // slot_bytes))
    return rows, slot_bytes, slots


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """200 records of 32 KiB: 16 rows per task, so a few slots hold only a few dozen rows."""
    return write_cache(tmp_path_factory.mktemp("memory"), "m", sample_items(200, payload_bytes=32 << 10), "none")


@pytest.fixture(scope="module")
def fork_rt():
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()
    yield rt
    rt.close()


def dataset(cache, runtime, **cfg):
    cfg.setdefault("seed", 1)
    return drt.CachedDataset([cache], reader_config=drt.ReaderConfig(**cfg), runtime=runtime)


def weighted(ds):
    md = ds.get_metadata()
    ds.update_metadata(pl.concat([md, md]).with_columns((pl.col("index") % 3 + 1).cast(pl.Float64).alias("weight")))
    return ds


# -- the limit ------------------------------------------------------------------------------------


def test_too_small_limit_is_refused_before_any_worker_starts(cache):
    before = child_pids()
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    try:
        with pytest.raises(ResourceLimitError) as info:
            next(iter(dataset(cache, rt, memory_limit_bytes=1 << 20)))
        assert all(term in str(info.value) for term in TERMS), str(info.value)
        assert shm_entries() == []
        assert child_pids() == before and rt.worker_pids == []
    finally:
        rt.close()


@pytest.mark.parametrize("is_weighted", [False, True], ids=["physical", "weighted"])
def test_too_small_limit_with_running_workers_creates_nothing(fork_rt, cache, is_weighted):
    assert len(list(dataset(cache, fork_rt))) == 200
    children, pids = child_pids(), fork_rt.worker_pids
    ds = dataset(cache, fork_rt, memory_limit_bytes=1 << 20)
    if is_weighted:
        weighted(ds)
    with pytest.raises(ResourceLimitError, match="memory_limit_bytes") as info:
        next(iter(ds))
    message = str(info.value)
    assert all(term in message for term in TERMS), message
    assert shm_entries() == [] and fork_rt._worker_pool.handlers == {}
    assert child_pids() == children and fork_rt.worker_pids == pids


@pytest.mark.parametrize("is_weighted", [False, True], ids=["physical", "weighted"])
@pytest.mark.parametrize("prefetch", [1, 64, 4096])
def test_limit_is_checked_against_the_written_bound(fork_rt, cache, prefetch, is_weighted):
    """Exactly the bound passes; one byte less is refused (ring + chunk + scratch): the weighted
    path's plan travels in the slot headers, so it adds no term."""
    probe = dataset(cache, None)
    if is_weighted:
        weighted(probe)
    shape = RunShape.plan(prefetch, 2, probe._max_record_bytes())
    rows, slot_bytes, slots = documented_shape(prefetch, 2, largest_record(cache))
    assert (shape.rows_per_task, shape.slot_bytes, shape.slots) == (rows, slot_bytes, slots)
    bound = MemoryBound(shape.slots, shape.slot_bytes, 2)
    assert bound.total == (slots + 1 + 2) * slot_bytes
    for limit, ok in ((bound.total, True), (bound.total - 1, False)):
        ds = dataset(cache, fork_rt, prefetch_size=prefetch, memory_limit_bytes=limit)
        if is_weighted:
            weighted(ds)
        if ok:
            assert len(list(ds)) == len(ds)
        else:
            with pytest.raises(ResourceLimitError):
                next(iter(ds))


RESERVE_REFUSED = textwrap.dedent("""
    import json, resource, signal, sys
    import datasetrt as drt
    from datasetrt.errors import ResourceLimitError
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    ds = rt.cached_dataset([sys.argv[1]], reader_config=drt.ReaderConfig(seed=1, prefetch_size=100))
    rt.start_workers()
    # The kernel refuses to reserve the ring's pages (as when memory runs out): a file size limit
    # makes posix_fallocate fail (EFBIG) on the ring's memfd as it would on a full /dev/shm.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
    try:
        next(iter(ds))
    except ResourceLimitError as exc:
        message = str(exc)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(json.dumps({"message": message, "rows": len(list(ds))}))
    rt.close()
""")


def test_ring_memory_that_cannot_be_reserved_is_a_typed_error(cache):
    """Rings are anonymous (runtime/shm.py), so /dev/shm's size no longer limits them; what can
    still fail is reserving their pages, which is a ResourceLimitError naming the size (not a
    SIGBUS later), and the runtime reads normally once memory is there."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", RESERVE_REFUSED, str(cache)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["message"].startswith("cannot reserve ") and "MiB of shared memory" in report["message"]
    assert "File too large" in report["message"] and report["rows"] == 200


# -- the default limit ----------------------------------------------------------------------------


def _own_cgroup_limit() -> int | None:
    """This process's memory limit read independently: cgroup v2 unified, else v1 memory, along
    its own cgroup path (the tightest limit of it and its ancestors)."""
    limits = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, rel = line.split(":", 2)
        if hid == "0" and controllers == "":
            root, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts) + 1):
            path = root.joinpath(*parts[:depth], name)
            try:
                text = path.read_text().strip()
            except OSError:
                continue
            if text != "max" and int(text) < (1 << 60):
                limits.append(int(text))
    return min(limits) if limits else None


def test_default_limit_is_half_of_physical_or_cgroup():
    physical = psutil.virtual_memory().total
    limit = _own_cgroup_limit()
    expected = min(physical, limit) if limit is not None else physical
    assert default_memory_limit_bytes() == expected // 2


@pytest.mark.parametrize(
    "v2,v1,expected",
    [
        ("max\n", "1073741824\n", None),  # v2 present and unlimited: v1 is not consulted
        ("536870912\n", None, 512 << 20),
        (None, "268435456\n", 256 << 20),
        (None, "9223372036854771712\n", None),  # v1 "unlimited"
        (None, f"{1 << 60}\n", None),  # 1 EiB and above count as unlimited (memory._read_limit)
        (None, f"{(1 << 60) - 4096}\n", (1 << 60) - 4096),
        (None, None, None),
    ],
)
def test_cgroup_limit_files(tmp_path, monkeypatch, v2, v1, expected):
    paths = {}
    for name, text in (("v2", v2), ("v1", v1)):
        paths[name] = tmp_path / name
        if text is not None:
            paths[name].write_text(text)
    monkeypatch.setattr(memory, "CGROUP_V2_MAX", paths["v2"])
    monkeypatch.setattr(memory, "CGROUP_V1_LIMIT", paths["v1"])
    assert memory.cgroup_limit_bytes() == expected
    physical = psutil.virtual_memory().total
    assert default_memory_limit_bytes() == (min(physical, expected) if expected else physical) // 2


# -- flow control ---------------------------------------------------------------------------------


def _drain(pool) -> None:
    """Let every in-flight task finish and route its result (what a long consumer pause allows)."""
    while sum(pool.inflight):
        pool.poll(30.0)


@pytest.mark.parametrize("prefetch", [1, 100])
def test_slow_consumer_never_reads_ahead_of_the_ring(cache, prefetch):
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    try:
        ds = dataset(cache, rt, shuffle=False, prefetch_size=prefetch)
        ds.set_epoch_len(100_000)
        it = iter(ds)
        consumed = len(take(it, 1))
        run = active_run(rt)
        pool, shape = rt._worker_pool, run.shape
        ring_fd = run.ring.fd
        assert shape == RunShape.plan(prefetch, 2, ds._max_record_bytes())
        assert (shape.rows_per_task, shape.slot_bytes, shape.slots) == documented_shape(
            prefetch, 2, largest_record(cache)
        )
        assert os.fstat(ring_fd).st_size == shape.slots * shape.slot_bytes
        window_rows = shape.slots * shape.rows_per_task
        assert window_rows < 400  # the ring holds a small part of one pass
        for step in range(4 * window_rows // 9 + 10):
            consumed += len(take(it, 7 + step % 5))
            assert len(pool.handlers) == 1 and sum(pool.inflight) <= shape.slots
            _drain(pool)  # the consumer pauses: workers finish, and nothing new is submitted
            assert sum(pool.inflight) == 0
            assert len(run._done) <= shape.slots
            buffered = sum(done.rows for done, _count in run._done.values())
            assert buffered <= window_rows
            assert run._next_first - consumed <= window_rows
            assert os.fstat(ring_fd).st_size == shape.slots * shape.slot_bytes
        assert consumed > 3 * window_rows
        del it
    finally:
        rt.close()
