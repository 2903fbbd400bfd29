"""`datasetrt.ray.write_caches` to an object-store URL on a real local Ray cluster, against moto's
server through the counting proxy: every task uploads its cache and publishes it, the build's
paths are the caches' URLs, reading them back gives the dataset's rows in order, a re-run keeps
what is published (no upload), and a task killed mid-write is retried with nothing left behind
(no staging directory on the node, no unpublished object). Skipped only when Ray is not installed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow as pa
import pytest

import datasetrt as drt
from datasetrt.format.upload import _remove_stale_staging, unpublished
from datasetrt.sources import Columns
from tests.servers.fixtures import proxy_options
from tests.storage.conftest import make_store

ray = pytest.importorskip("ray")
from datasetrt.ray import write_caches  # noqa: E402 - after the skip

ROWS = 240


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for the module; the signal handlers ray.init installs are put back after
    (as tests/integration/test_ray_build.py does)."""
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
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


def table(n: int = ROWS) -> pa.Table:
    return pa.table(
        {"data": [bytes((i * 7 + j) % 251 for j in range(i % 50)) for i in range(n)], "label": list(range(n))}
    )


def dataset(rows: pa.Table, chunk: int):
    return ray.data.from_arrow([rows.slice(i, chunk) for i in range(0, rows.num_rows, chunk)])


def storage(proxy, tmp_path) -> drt.StorageConfig:
    return drt.StorageConfig(
        options=proxy_options(proxy), cache_dir=str(tmp_path / "node"), retry_attempts=4, retry_budget_s=30.0
    )


def config(proxy, tmp_path) -> drt.WriterConfig:
    return drt.WriterConfig(show_progress=False, max_shard_bytes=2048, storage=storage(proxy, tmp_path))


def read_back(paths, proxy, tmp_path) -> list[tuple[int, bytes]]:
    reader = drt.ReaderConfig(seed=0, shuffle=False, storage=storage(proxy, tmp_path))
    return [(s.metadata["label"], bytes(s.data)) for s in drt.CachedDataset(paths, reader_config=reader)]


def test_tasks_upload_their_caches_and_the_build_reads_back(cluster, bucket, s3_proxy, tmp_path):
    rows = table()
    base = f"s3://{bucket}/ray/"
    build = write_caches(
        dataset(rows, 70), base, rows_per_cache=100, payload="data", writer_config=config(s3_proxy, tmp_path)
    )
    assert build.ok, build.results
    assert build.paths == [f"s3://{bucket}/ray/part-{build.build}-{k:05d}" for k in range(3)]
    assert build.rows == ROWS
    want = list(zip(rows.column("label").to_pylist(), rows.column("data").to_pylist()))
    assert read_back(build.paths, s3_proxy, tmp_path) == want
    puts = s3_proxy.count("PUT")
    again = write_caches(
        dataset(rows, 50), base, rows_per_cache=100, payload="data", writer_config=config(s3_proxy, tmp_path)
    )
    assert again.ok and again.paths == build.paths
    assert s3_proxy.count("PUT") == puts  # published caches were checked and kept, nothing uploaded
    assert unpublished(make_store(s3_proxy, bucket, "ray"), min_age_s=0) == []


class ExitOnceColumns(Columns):
    """Kills its writer task (os._exit) at the second batch of group 1, on the first attempt only
    (a marker file says it happened)."""

    def __init__(self, marker: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker

    def bind(self, schema, source):
        converter = super().bind(schema, source)
        marker, inner, state = self.marker, converter.records, {"batches": 0}

        def records(batch, where):
            state["batches"] += 1
            if "cache part-kill-00001" in where.source and state["batches"] == 2 and not os.path.exists(marker):
                Path(marker).write_text("killed")
                os._exit(1)
            return inner(batch, where)

        converter.records = records
        return converter


def test_a_killed_task_is_retried_and_leaves_nothing_behind(cluster, bucket, s3_proxy, tmp_path):
    rows = table()
    marker = tmp_path / "killed"
    build = write_caches(
        dataset(rows, 40),
        f"s3://{bucket}/kill",
        rows_per_cache=120,
        columns=ExitOnceColumns(str(marker), "data", ["label"]),
        writer_config=config(s3_proxy, tmp_path),
        build_id="kill",
        max_retries=2,
    )
    assert marker.exists(), "the writer task was never killed"
    assert build.ok, build.results
    want = list(zip(rows.column("label").to_pylist(), rows.column("data").to_pylist()))
    assert read_back(build.paths, s3_proxy, tmp_path) == want
    assert unpublished(make_store(s3_proxy, bucket, "kill"), min_age_s=0) == []
    staging = tmp_path / "node" / ".upload"
    # the killed attempt's staging dir stays until a later write on the node finds it a minute old
    # with its lock free; the lock is free now (its process is dead), so that removal takes it
    _remove_stale_staging(staging, min_age_s=0)
    assert list(staging.iterdir()) == []
