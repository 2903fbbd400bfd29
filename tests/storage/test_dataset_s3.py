"""Caches at s3:// URLs end to end, against moto's server through the counting proxy: written by
`DatasetRuntime.write_cache`, read by `CachedDataset` in-process, by reader workers and by torch
DataLoader workers, each sample exactly what a local copy of the same cache gives; every shard
downloaded once per node whatever reads it; the plan-driven prefetch and the disk bound.
"""

from __future__ import annotations

import collections
import multiprocessing as mp

import pytest

import datasetrt as drt
from datasetrt.dataset.remote import _small_bytes
from datasetrt.errors import DiskLimitError, IntegrityError, StorageError
from datasetrt.runtime.prefetch import ShardPrefetcher
from datasetrt.sampling.orders import Ordering, window
from tests.conftest import ListSource, sample_items, writer_config
from tests.servers.fixtures import proxy_options
from tests.storage.conftest import wait_until

SIZES = {"a": 60, "b": 45, "c": 30}
SHARD_BYTES = 2 << 10  # a few records per shard: several shards per cache


def storage(proxy, tmp_path, **kw) -> drt.StorageConfig:
    kw.setdefault("retry_attempts", 4)
    kw.setdefault("retry_budget_s", 30.0)
    return drt.StorageConfig(options=proxy_options(proxy), cache_dir=str(tmp_path / "node"), **kw)


def sources():
    return [ListSource(name, sample_items(n, seed=k, tag=name)) for k, (name, n) in enumerate(SIZES.items())]


def write(runtime, base, proxy, tmp_path, algo="none"):
    config = writer_config(algo, max_shard_bytes=SHARD_BYTES, storage=storage(proxy, tmp_path / "w"))
    results = runtime.write_cache(sources(), base, writer_config=config)
    for r in results:
        assert isinstance(r, drt.CacheWriteSuccess), r
    return [r.path for r in results]


def samples_of(ds) -> list[tuple[int, int, bytes, str]]:
    return [(s.cache_id, s.sample_id, bytes(s.data), s.metadata["label"]) for s in ds]


def batch_ids(batches) -> list[tuple[int, int]]:
    return [(int(c), int(s)) for b in batches for c, s in zip(b.cache_id, b.sample_id)]


def shard_gets(proxy) -> collections.Counter:
    """GET requests per shard object, as the proxy received them."""
    return collections.Counter(r.key for r in proxy.matching("GET") if "/shards/" in r.key)


@pytest.fixture
def urls(runtime, bucket, s3_proxy, tmp_path):
    return write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path, algo="zstd")


@pytest.fixture
def local(runtime, tmp_path):
    results = runtime.write_cache(
        sources(), tmp_path / "local", writer_config=writer_config("zstd", max_shard_bytes=SHARD_BYTES)
    )
    return [r.path for r in results]


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
def test_every_codec_round_trips_through_s3(runtime, bucket, s3_proxy, tmp_path, algo):
    urls = write(runtime, f"s3://{bucket}/{algo}", s3_proxy, tmp_path, algo=algo)
    assert all(u.startswith(f"s3://{bucket}/{algo}/") for u in urls)
    cfg = drt.ReaderConfig(seed=1, shuffle=False, storage=storage(s3_proxy, tmp_path))
    got = [(bytes(s.data), s.metadata["index"]) for s in drt.CachedDataset(urls, reader_config=cfg)]
    want = [(data, meta["index"]) for src in sources() for data, meta in src.items]
    assert got == want


def test_reads_match_a_local_copy_in_process_and_through_reader_workers(urls, local, s3_proxy, tmp_path):
    for sampling in ("draws", "permutation", "locality"):
        cfg = {"seed": 3, "shuffle": True, "sampling": sampling}
        want = samples_of(drt.CachedDataset(local, reader_config=drt.ReaderConfig(**cfg)))
        want_batches = batch_ids(drt.CachedDataset(local, reader_config=drt.ReaderConfig(**cfg)).iter_batches(16))
        remote_cfg = drt.ReaderConfig(**cfg, storage=storage(s3_proxy, tmp_path))
        assert samples_of(drt.CachedDataset(urls, reader_config=remote_cfg)) == want, sampling
        rt = drt.DatasetRuntime(num_workers=2)
        try:
            assert samples_of(drt.CachedDataset(urls, reader_config=remote_cfg, runtime=rt)) == want, sampling
            ds = drt.CachedDataset(urls, reader_config=remote_cfg, runtime=rt)
            assert batch_ids(ds.iter_batches(16)) == want_batches, sampling
        finally:
            rt.close()


def test_each_shard_is_downloaded_once_per_node_whatever_reads_it(urls, s3_proxy, tmp_path):
    cfg = drt.ReaderConfig(seed=5, shuffle=True, sampling="permutation", storage=storage(s3_proxy, tmp_path))
    rt = drt.DatasetRuntime(num_workers=2)
    try:
        first = samples_of(drt.CachedDataset(urls, reader_config=cfg, runtime=rt))
    finally:
        rt.close()
    # a second "rank": another process on the node, the same node cache
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        again = pool.apply(_read_all, (urls, cfg))
    assert again == first
    gets = shard_gets(s3_proxy)
    shards = sum(len(drt.CachedDataset([u], reader_config=cfg)._handles[0].manifest.shards) for u in urls)
    assert len(gets) == shards and set(gets.values()) == {1}, gets


def _read_all(urls, cfg):
    return samples_of(drt.CachedDataset(urls, reader_config=cfg))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_dataloader_workers_read_s3_caches(urls, local, s3_proxy, tmp_path, context):
    torch = pytest.importorskip("torch")
    cfg = {"seed": 2, "shuffle": True, "sampling": "permutation"}
    want = sorted((c, s) for c, s, _, _ in samples_of(drt.CachedDataset(local, reader_config=drt.ReaderConfig(**cfg))))
    ds = drt.CachedDataset(urls, reader_config=drt.ReaderConfig(**cfg, storage=storage(s3_proxy, tmp_path)))
    loader = torch.utils.data.DataLoader(
        ds.to_torch_iterable_dataset(), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    got = sorted((s.cache_id, s.sample_id) for s in loader)
    assert got == want
    assert set(shard_gets(s3_proxy).values()) == {1}


def test_prefetch_fetches_in_first_need_order_and_stays_within_its_look_ahead(urls, s3_proxy, tmp_path):
    cfg = drt.ReaderConfig(seed=9, shuffle=True, sampling="locality", window_shards=2)
    ds = drt.CachedDataset(urls, reader_config=cfg.model_copy(update={"storage": storage(s3_proxy, tmp_path)}))
    handles = ds._handles
    win = window(
        ds._population, 0, len(ds), shuffle=True, seed=9, ordering=Ordering("locality", 2, ds._reads.row_shards)
    )
    rows = win.rows(0, win.length)
    cache_pos, sample_id = win.population.resolve(rows)
    need: list[tuple[int, int]] = []
    for k, sid in zip(cache_pos.tolist(), sample_id.tolist()):
        key = (k, int(handles[k].index_array()[sid, 0]))
        if key not in need:
            need.append(key)
    names = [f"{handles[k].remote.location.key()}/shards/{handles[k].manifest.shards[j].name}" for k, j in need]
    before = s3_proxy.count("GET")
    node = handles[0].remote.storage.node_cache()
    resident = node.pinned_count()  # each cache's manifest and small files, pinned while it is open
    fetcher = ShardPrefetcher(handles, win, lookahead=3, concurrency=1)
    try:
        wait_until(lambda: fetcher.fetched >= 3, what="three shards prefetched")
        assert node.pinned_count() <= resident + 3
        fetcher.advance(win.length)  # the read has passed every position: the rest may come
        wait_until(lambda: fetcher.fetched == len(need), what="every shard prefetched")
    finally:
        fetcher.close()
    order = [r.key for r in s3_proxy.matching("GET")[before:] if "/shards/" in r.key]
    assert order == names
    assert node.pinned_count() == resident


def test_a_node_cache_limit_too_small_for_the_order_is_refused_at_open(urls, s3_proxy, tmp_path):
    probe = drt.CachedDataset(urls, reader_config=drt.ReaderConfig(seed=0, storage=storage(s3_proxy, tmp_path)))
    shard_bytes = [s.byte_len for h in probe._handles for s in h.manifest.shards]
    small = sum(_small_bytes(h) for h in probe._handles)
    limit = small + 6 * max(shard_bytes)  # a locality window of 4 and then some, not the whole dataset
    assert limit < small + sum(shard_bytes)
    small = storage(s3_proxy, tmp_path, cache_limit_bytes=limit)
    with pytest.raises(DiskLimitError, match="cache_limit_bytes") as err:
        drt.CachedDataset(
            urls, reader_config=drt.ReaderConfig(seed=0, shuffle=True, sampling="permutation", storage=small)
        )
    assert err.value.limit_bytes == limit and err.value.need_bytes > limit
    assert 'sampling="locality"' in str(err.value)
    ds = drt.CachedDataset(
        urls, reader_config=drt.ReaderConfig(seed=0, shuffle=True, sampling="locality", window_shards=4, storage=small)
    )
    assert len(samples_of(ds)) == sum(SIZES.values())
    node = ds._handles[0].remote.storage.node_cache()
    assert node.usage_bytes() <= limit


def test_a_transient_503_is_retried_and_the_read_is_unchanged(urls, local, s3_proxy, tmp_path):
    want = samples_of(drt.CachedDataset(local, reader_config=drt.ReaderConfig(seed=1)))
    s3_proxy.fail("*/shards/*", status=503, times=3)
    cfg = drt.ReaderConfig(seed=1, storage=storage(s3_proxy, tmp_path, prefetch_shards=0))
    assert samples_of(drt.CachedDataset(urls, reader_config=cfg)) == want
    gets = shard_gets(s3_proxy)
    assert sum(gets.values()) == len(gets) + 3  # the three failed answers were retried


def test_a_corrupted_shard_object_is_an_integrity_error_naming_its_url(urls, s3_proxy, tmp_path, bucket):
    from datasetrt.storage.objects import ObjectStore
    from datasetrt.storage.urls import parse_remote

    store = ObjectStore(parse_remote(urls[1]), proxy_options(s3_proxy))
    name = "shards/000000.bin"
    data = bytearray(store.get(name, max_bytes=1 << 30))
    data[len(data) // 2] ^= 0xFF
    store.put(name, bytes(data))
    cfg = drt.ReaderConfig(seed=1, storage=storage(s3_proxy, tmp_path, prefetch_shards=0))
    ds = drt.CachedDataset(urls, reader_config=cfg)
    with pytest.raises(IntegrityError, match=f"{urls[1]}/{name}"):
        samples_of(ds)


def test_an_unreachable_server_is_a_typed_error_and_leaves_nothing_running(urls, s3_proxy, tmp_path, no_leaks):
    cfg = drt.ReaderConfig(seed=1, storage=storage(s3_proxy, tmp_path, retry_attempts=2, retry_budget_s=2.0))
    ds = drt.CachedDataset(urls, reader_config=cfg)
    s3_proxy.down()
    try:
        with pytest.raises(StorageError):
            samples_of(ds)
    finally:
        s3_proxy.up()
    assert len(samples_of(ds)) == sum(SIZES.values())  # the same dataset reads once the server is back
