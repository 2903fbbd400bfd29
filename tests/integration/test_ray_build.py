"""Distributed builds on a real local Ray cluster (datasetrt/integrations/ray.py): caches equal a
local write of the same rows byte for byte, a writer task killed mid-write is retried with no
partial or duplicate cache, re-runs keep (and check) what exists, a failing group is an error
value. Skipped only when Ray is not installed (the `ray` extra)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow as pa
import pytest

import datasetrt as drt
from datasetrt.sources import Columns, RecordBatchSource

ray = pytest.importorskip("ray")
from datasetrt.ray import write_caches  # noqa: E402 - after the skip

QUIET = drt.WriterConfig(show_progress=False, max_shard_bytes=8192, shard_compression=drt.ShardCompression(algo="zstd"))
ROWS = 1000


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for the module. ray.init installs its own handlers in this process
    (SIGTERM: `sigterm_handler`) and ray.shutdown leaves them; the previous handlers are put
    back, so later tests in the same process (test_preemption's SIGTERM checks) see the
    runner's own, not Ray's."""
    root = str(Path(__file__).resolve().parents[2])
    before = {
        sig: signal.getsignal(sig) for sig in signal.valid_signals() if sig not in (signal.SIGKILL, signal.SIGSTOP)
    }
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": root}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
        for sig, handler in before.items():
            if handler is not None and signal.getsignal(sig) is not handler:  # None: set outside Python
                signal.signal(sig, handler)


def rows(n: int = ROWS, null_at: int | None = None) -> pa.Table:
    data = [bytes((i * 13 + j) % 251 for j in range(i % 90)) for i in range(n)]
    if null_at is not None:
        data[null_at] = None
    return pa.table(
        {
            "data": pa.array(data, pa.binary()),
            "label": [i % 5 for i in range(n)],
            "text": [f"t{i % 17}" for i in range(n)],
        }
    )


def dataset(table: pa.Table, chunk: int):
    """An in-memory Ray dataset whose blocks are `chunk` rows (the layout must not matter)."""
    return ray.data.from_arrow([table.slice(i, chunk) for i in range(0, table.num_rows, chunk)])


def files(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def assert_same_as_local(build, table: pa.Table, rows_per_cache: int, columns: Columns, tmp_path: Path) -> None:
    """Every cache equals, file for file, a local write_cache of the same row range and name."""
    assert build.ok, build.results
    assert len(build.paths) == -(-table.num_rows // rows_per_cache)
    with drt.DatasetRuntime(num_workers=1) as rt:
        for k, path in enumerate(build.paths):
            first = k * rows_per_cache
            part = table.slice(first, rows_per_cache)
            source = RecordBatchSource(path.name, part, first_row=first, columns=columns)
            (local,) = rt.write_cache([source], tmp_path / "local", writer_config=QUIET)
            assert files(path) == files(local.path), path


def no_leftovers(base: Path, names: list[str]) -> None:
    assert sorted(os.listdir(base)) == sorted(names)  # no staging dir or lock, and no staging root


def test_build_equals_local_writes_whatever_the_block_layout(cluster, tmp_path):
    table = rows()
    columns = Columns("data", ["label", "text"], rename={"text": "tag"}, index_column="row")
    build = write_caches(
        dataset(table, 130), tmp_path / "a", rows_per_cache=300, columns=columns, writer_config=QUIET, build_id="b1"
    )
    assert [p.name for p in build.paths] == [f"part-b1-{k:05d}" for k in range(4)] and build.rows == ROWS
    assert_same_as_local(build, table, 300, columns, tmp_path)
    ds = drt.CachedDataset(build.paths, reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert [s.metadata["row"] for s in ds] == list(range(ROWS))
    other = write_caches(
        dataset(table, 77), tmp_path / "b", rows_per_cache=300, columns=columns, writer_config=QUIET, build_id="b1"
    )
    for mine, theirs in zip(build.paths, other.paths):
        assert files(mine) == files(theirs)


class ExitOnceColumns(Columns):
    """Kills its writer task (os._exit) at the fourth batch of group 1 on the first attempt only
    (a marker file says it happened, and how many shard bytes that task had staged by then)."""

    def __init__(self, marker: str, base: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker
        self.base = base

    def bind(self, schema, source):
        converter = super().bind(schema, source)
        marker, base = self.marker, self.base
        inner = converter.records
        state = {"batches": 0}

        def records(batch, where):
            state["batches"] += 1
            if "cache part-kill-00001" in where.source and state["batches"] == 4 and not os.path.exists(marker):
                staged = sum(f.stat().st_size for f in Path(base, "tmp", "part-kill-00001").rglob("*.bin"))
                Path(marker).write_text(str(staged))
                os._exit(1)
            return inner(batch, where)

        converter.records = records
        return converter


def test_a_killed_writer_task_is_retried_without_partial_or_duplicate_caches(cluster, tmp_path):
    table = rows()
    marker = tmp_path / "killed"
    base = tmp_path / "caches"
    columns = ExitOnceColumns(str(marker), str(base), "data", ["label"])
    build = write_caches(
        dataset(table, 100),
        base,
        rows_per_cache=400,
        columns=columns,
        writer_config=QUIET,
        build_id="kill",
        max_retries=2,
    )
    assert marker.exists(), "the writer task was never killed"
    assert int(marker.read_text()) > 0, "the task died before writing any record"
    assert_same_as_local(build, table, 400, Columns("data", ["label"]), tmp_path)
    no_leftovers(base, [p.name for p in build.paths])


def test_a_task_killed_every_time_is_an_error_value(cluster, tmp_path):
    table = rows(300)
    base = tmp_path / "caches"

    class AlwaysExit(Columns):
        def bind(self, schema, source):
            os._exit(3)

    build = write_caches(
        dataset(table, 100),
        base,
        rows_per_cache=300,
        columns=AlwaysExit("data", ["label"]),
        writer_config=QUIET,
        build_id="dead",
        max_retries=0,
    )
    (result,) = build.results
    assert isinstance(result, drt.CacheWriteError) and result.source_name == "part-dead-00000"
    assert "died 1 times (max_retries=0); nothing was published" in result.message
    assert build.paths == [] and not (base / "part-dead-00000").exists()


def test_rerun_keeps_checks_and_completes(cluster, tmp_path):
    table = rows()
    base = tmp_path / "caches"
    columns = Columns("data", ["label"])
    first = write_caches(dataset(table, 250), base, rows_per_cache=250, columns=columns, writer_config=QUIET)

    def identity(p):  # inode numbers alone are reused by the filesystem for a rewritten file
        st = (p / "manifest.json").stat()
        return st.st_ino, st.st_mtime_ns

    inodes = {p: identity(p) for p in first.paths}
    lost = first.paths[2]
    for f in sorted(lost.rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    lost.rmdir()
    again = write_caches(dataset(table, 250), base, rows_per_cache=250, columns=columns, writer_config=QUIET)
    assert again.paths == first.paths and again.build == first.build
    assert [identity(p) == inodes[p] for p in again.paths] == [True, True, False, True]
    assert_same_as_local(again, table, 250, columns, tmp_path)
    # a foreign cache under a build's name is reported, not kept silently
    victim = again.paths[1]
    for f in sorted(victim.rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    victim.rmdir()
    with drt.DatasetRuntime(num_workers=1) as rt:
        rt.write_cache([RecordBatchSource(victim.name, table.slice(0, 10), columns=columns)], base, writer_config=QUIET)
    third = write_caches(dataset(table, 250), base, rows_per_cache=250, columns=columns, writer_config=QUIET)
    assert isinstance(third.results[1], drt.CacheWriteError)
    assert "holds 10 samples where this group has 250" in third.results[1].message
    assert victim not in third.paths and len(third.paths) == 3


def test_a_failing_group_is_an_error_value_and_the_others_are_written(cluster, tmp_path):
    table = rows(600, null_at=450)
    base = tmp_path / "caches"
    build = write_caches(
        dataset(table, 100),
        base,
        rows_per_cache=200,
        payload="data",
        metadata=["label"],
        writer_config=QUIET,
        build_id="bad",
    )
    ok, ok2, bad = build.results
    assert isinstance(ok, drt.CacheWriteSuccess) and isinstance(ok2, drt.CacheWriteSuccess)
    assert isinstance(bad, drt.CacheWriteError) and bad.source_name == "part-bad-00002"
    assert "Ray dataset rows 400..599 (cache part-bad-00002)" in bad.message
    assert "row 450" in bad.message and "payload column 'data' (binary) is null" in bad.message
    no_leftovers(base, ["part-bad-00000", "part-bad-00001"])


def test_a_typed_column_builds_caches_that_record_its_spec(cluster, tmp_path):
    tokens = [list(range(i, i + i % 11)) for i in range(500)]
    table = pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32())), "label": [i % 5 for i in range(500)]})
    spec = drt.PayloadSpec("int32", (None,))
    build = write_caches(
        dataset(table, 90), tmp_path / "c", rows_per_cache=200, payload="tokens", writer_config=QUIET, build_id="typed"
    )
    ds = drt.CachedDataset(build.paths, reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec == spec  # inferred from the dataset's schema, recorded by every cache
    assert [ds.payload_spec.decode(s.data).tolist() for s in ds] == tokens
    typed = QUIET.model_copy(update={"payload_spec": spec})
    with drt.DatasetRuntime(num_workers=1) as rt:  # each cache equals a local typed write of its rows
        for k, path in enumerate(build.paths):
            source = RecordBatchSource(path.name, table.slice(k * 200, 200), first_row=k * 200, payload="tokens")
            (local,) = rt.write_cache([source], tmp_path / "local", writer_config=typed)
            assert files(path) == files(local.path), path
    # a given spec casts every group and is checked against the writer's
    small = write_caches(
        dataset(table, 90),
        tmp_path / "c",
        rows_per_cache=500,
        payload="tokens",
        payload_spec=drt.PayloadSpec("int16", (None,)),
        writer_config=QUIET,
        build_id="int16",
    )
    ds16 = drt.CachedDataset(small.paths, reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds16.payload_spec == drt.PayloadSpec("int16", (None,))
    assert [ds16.payload_spec.decode(s.data).tolist() for s in ds16] == tokens
    with pytest.raises(drt.errors.ConfigError, match=r"payload_spec int16\[None\] differs from writer_config"):
        write_caches(
            dataset(table, 90),
            tmp_path / "c",
            rows_per_cache=200,
            payload="tokens",
            payload_spec=("int16", (None,)),
            writer_config=typed,
        )


def test_arguments_are_checked_before_anything_runs(cluster, tmp_path):
    from datasetrt.errors import ArgumentTypeError, ConfigError

    with pytest.raises(ArgumentTypeError, match="ray.data.Dataset"):
        write_caches(pa.table({"data": [b"x"]}), tmp_path, rows_per_cache=10)
    with pytest.raises(ConfigError, match="rows_per_cache"):
        write_caches(ray.data.from_items([{"data": b"x"}]), tmp_path, rows_per_cache=0)
    with pytest.raises(ConfigError, match="build_id"):
        write_caches(ray.data.from_items([{"data": b"x"}]), tmp_path, rows_per_cache=1, build_id="a/b")
