"""Datasets over s3:// caches under faults, end to end through moto's server and the fault proxy,
read by reader worker processes with the plan-driven prefetch on: a server stopped mid-epoch and
restarted within the retry budget (the read is exact) or beyond it (a typed StorageError, nothing
left running, the same dataset reads once it is back); 500/503 answers and slow answers (nothing
changes); a truncated or corrupted shard object (a typed IntegrityError naming its URL, nothing
wrong returned); a node cache on a full disk (a typed error, before the read where the disk bound
knows it, else at the failing download, no partial left).

Every read runs under a bound (`bounded`); every storage config has a retry budget.
"""

from __future__ import annotations

import errno
import threading
import traceback

import pytest

import datasetrt as drt
from datasetrt.errors import DiskFullError, IntegrityError, StorageError
from datasetrt.storage.objects import ObjectStore
from datasetrt.storage.urls import parse_remote
from tests.servers.moto import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, s3_options
from tests.storage._s3data import (
    Call,
    Leaks,
    batch_rows,
    bounded,
    samples_of,
    shard_gets,
    shard_keys,
    sources,
    write,
    write_both,
)
from tests.storage._s3data import storage as storage_config
from tests.storage.conftest import wait_until
from tests.storage.test_node_cache_faults import fill, small_tmpfs

BATCH = 8  # batches of 8 rows: tasks of 8 rows, so reader workers run a few shards ahead only
ORDERED = {"seed": 0, "shuffle": False, "prefetch_size": BATCH}
SHUFFLED = {"seed": 4, "sampling": "permutation", "prefetch_size": BATCH}


@pytest.fixture(scope="module")
def written(moto_server, tmp_path_factory):
    return write_both(moto_server, tmp_path_factory.mktemp("written"), "faults")


@pytest.fixture
def leaks():
    snapshot = Leaks()
    yield snapshot
    snapshot.check()


def reader(proxy, tmp_path, **kw) -> drt.StorageConfig:
    kw.setdefault("prefetch_shards", 4)
    return storage_config(proxy.endpoint, tmp_path / "node", **kw)


def rows_of(paths, cfg: dict, storage: drt.StorageConfig | None = None, runtime=None) -> list:
    reader_config = drt.ReaderConfig(**cfg, **({"storage": storage} if storage is not None else {}))
    ds = drt.CachedDataset(paths, reader_config=reader_config, runtime=runtime)
    return bounded(lambda: batch_rows(ds.iter_batches(BATCH)))


def prefetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("datasetrt-prefetch")]


def no_secret(error: BaseException) -> None:
    text = "".join(traceback.format_exception(error))
    assert FAKE_SECRET_ACCESS_KEY not in text and FAKE_ACCESS_KEY_ID not in text


# -- the server stopped mid-epoch -------------------------------------------------------------------


def test_a_server_stopped_mid_epoch_and_back_within_the_budget_changes_nothing(
    written, s3_proxy, tmp_path, no_leaks, leaks
):
    _bucket, urls, local = written
    want = rows_of(local, ORDERED)
    cfg = drt.ReaderConfig(**ORDERED, storage=reader(s3_proxy, tmp_path, retry_attempts=1000))
    with drt.DatasetRuntime(num_workers=2) as rt:
        batches = drt.CachedDataset(urls, reader_config=cfg, runtime=rt).iter_batches(BATCH)
        got = batch_rows([bounded(lambda: next(batches))])
        s3_proxy.down()  # the workers and the prefetcher are a few shards ahead: most shards are still remote
        rest = Call(lambda: batch_rows(batches, got))
        wait_until(lambda: s3_proxy.reset_connections >= 3, what="reads retrying against the stopped server")
        s3_proxy.up()
        rest.result()
    assert got == want
    assert set(shard_gets(s3_proxy)) == shard_keys(urls, cfg.storage)


def test_a_server_stopped_beyond_the_budget_is_a_typed_error_and_the_dataset_reads_once_it_is_back(
    written, s3_proxy, tmp_path, no_leaks, leaks
):
    bucket, urls, local = written
    local_ds = drt.CachedDataset(local, reader_config=drt.ReaderConfig(**SHUFFLED))
    want, want_next = (bounded(lambda: batch_rows(local_ds.iter_batches(BATCH))) for _ in range(2))
    cfg = drt.ReaderConfig(**SHUFFLED, storage=reader(s3_proxy, tmp_path, retry_attempts=3, retry_budget_s=2.0))
    with drt.DatasetRuntime(num_workers=2) as rt:
        ds = drt.CachedDataset(urls, reader_config=cfg, runtime=rt)
        batches = ds.iter_batches(BATCH)
        got = batch_rows([bounded(lambda: next(batches))])
        s3_proxy.down()
        try:
            with pytest.raises(StorageError) as info:
                bounded(lambda: batch_rows(batches, got))
            assert prefetch_threads() == []  # the failed read closed its prefetcher
        finally:
            s3_proxy.up()
        error = info.value
        assert f"s3://{bucket}/caches/" in str(error) and "/shards/" in str(error), error
        assert error.url is not None and error.url.startswith(f"s3://{bucket}/caches/"), (
            error.url
        )  # kept across processes
        no_secret(error)
        assert got == want[: len(got)]  # what came before the error is exact
        # the same dataset once the server is back: its next epoch (the failed one reserved its window)
        assert bounded(lambda: batch_rows(ds.iter_batches(BATCH))) == want_next
    assert prefetch_threads() == []


# -- transient answers ------------------------------------------------------------------------------


def test_500_503_and_slow_answers_during_an_epoch_change_nothing(written, s3_proxy, tmp_path, leaks):
    _bucket, urls, local = written
    want = rows_of(local, SHUFFLED)
    want_samples = samples_of(drt.CachedDataset(local, reader_config=drt.ReaderConfig(**SHUFFLED)))
    s3_proxy.fail("*/shards/*", status=503, times=6, method="GET")
    s3_proxy.fail("*/shards/*", status=500, times=6, method="GET")
    s3_proxy.delay("*/shards/*", 0.05, times=8, method="GET")
    s3_proxy.fail("*/shards/*", status=503, times=4, method="GET")
    storage = reader(s3_proxy, tmp_path, retry_attempts=20)  # more than the 16 failures: no request exhausts it
    with drt.DatasetRuntime(num_workers=2) as rt:
        assert rows_of(urls, SHUFFLED, storage, rt) == want
        ds = drt.CachedDataset(urls, reader_config=drt.ReaderConfig(**SHUFFLED, storage=storage), runtime=rt)
        assert bounded(lambda: samples_of(ds)) == want_samples
    keys = shard_keys(urls, storage)
    assert set(shard_gets(s3_proxy)) == keys
    assert s3_proxy.count("GET", "*/shards/*") == len(keys) + 16  # each failed answer retried once, never more


# -- objects changed on the server after the cache was published -------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_a_damaged_shard_object_is_an_integrity_error_naming_its_url(
    runtime, moto_server, bucket, s3_proxy, tmp_path, damage, leaks
):
    small = {"a": 60, "b": 45}
    urls = write(runtime, f"s3://{bucket}/p", sources(sizes=small), storage_config(moto_server.endpoint, tmp_path))
    want = rows_of(write(runtime, tmp_path / "local", sources(sizes=small)), ORDERED)
    store = ObjectStore(parse_remote(urls[1]), s3_options(moto_server.endpoint))
    name = "shards/000001.bin"
    data = bytearray(store.get(name, max_bytes=1 << 20))
    if damage == "truncated":
        del data[-100:]
    else:
        data[len(data) // 2] ^= 0x01
    store.put(name, bytes(data))
    cfg = drt.ReaderConfig(**ORDERED, storage=reader(s3_proxy, tmp_path))
    got: list = []
    with drt.DatasetRuntime(num_workers=2) as rt:
        ds = drt.CachedDataset(urls, reader_config=cfg, runtime=rt)
        with pytest.raises(IntegrityError, match=f"{urls[1]}/{name}"):
            bounded(lambda: batch_rows(ds.iter_batches(BATCH), got))
    assert got == want[: len(got)] and len(got) < len(want)  # nothing wrong returned
    mirror = ds._handles[1].remote.mirror()
    assert not mirror.has(name) and list(tmp_path.rglob("*.part-*")) == []


# -- the node cache on a full disk ----------------------------------------------------------------


@pytest.fixture
def big(runtime, bucket, moto_server, tmp_path):
    """Caches of 3.2 MiB in 256 KiB shards (more than the 2 MiB disk of these tests) and a local copy."""
    big = {"a": 100, "b": 100}
    kw = {"max_shard_bytes": 256 << 10, "algo": "none"}
    srcs = sources(sizes=big, payload_bytes=16 << 10)
    urls = write(runtime, f"s3://{bucket}/big", srcs, storage_config(moto_server.endpoint, tmp_path / "w"), **kw)
    return urls, write(runtime, tmp_path / "local", srcs, **kw)


def test_a_disk_too_small_for_the_order_is_refused_at_open_and_an_ordered_read_fits(
    big, s3_proxy, tmp_path, no_leaks, leaks
):
    urls, local = big
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        storage = storage_config(s3_proxy.endpoint, fs)
        with pytest.raises(DiskFullError) as info:
            drt.CachedDataset(urls, reader_config=drt.ReaderConfig(**SHUFFLED, storage=storage))
        error = info.value
        assert error.errno == errno.ENOSPC and error.path == str(fs) and urls[0] in str(error)
        assert 'sampling="locality"' in str(error)
        assert s3_proxy.count("GET", "*/shards/*") == 0 and list(fs.rglob("*.part-*")) == []
        with drt.DatasetRuntime(num_workers=2) as rt:  # read in order, the same shards fit one after another
            assert rows_of(urls, ORDERED, storage, rt) == rows_of(local, ORDERED)
        assert list(fs.rglob("*.part-*")) == []


def test_a_disk_filled_by_another_after_the_open_fails_the_download_and_leaves_no_partial(
    big, s3_proxy, tmp_path, no_leaks, leaks
):
    urls, local = big
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        storage = storage_config(s3_proxy.endpoint, fs)
        want = rows_of(local, ORDERED)
        with drt.DatasetRuntime(num_workers=2) as rt:
            ds = drt.CachedDataset(urls, reader_config=drt.ReaderConfig(**ORDERED, storage=storage), runtime=rt)
            filler = fs / "filler"
            fill(filler)  # someone else fills the disk; the open dataset's small files stay (pinned)
            got: list = []
            with pytest.raises(DiskFullError) as info:
                bounded(lambda: batch_rows(ds.iter_batches(BATCH), got))
            error = info.value
            assert error.errno == errno.ENOSPC and error.path == str(fs), error
            assert f"{urls[0]}/shards/" in str(error), error
            assert got == [] and list(fs.rglob("*.part-*")) == []
            filler.unlink()
            assert bounded(lambda: batch_rows(ds.iter_batches(BATCH))) == want  # the same dataset, room again
