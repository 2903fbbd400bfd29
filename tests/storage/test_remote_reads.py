"""What a dataset over an s3:// cache adds to its reads (datasetrt/dataset/remote.py and the
prefetcher, datasetrt/runtime/prefetch.py), against moto's server through the fault proxy: the
look-ahead under a node-cache limit leaves the order its window, a shard the read reached first is
never prefetched again, the small files stay on the node under a limit (so reader workers reopen
the mirror), and a warm read starts no prefetcher.
"""

from __future__ import annotations

import collections

import pytest

import datasetrt as drt
from datasetrt.dataset import remote
from datasetrt.dataset.remote import _small_bytes
from datasetrt.format.layout import MANIFEST_NAME
from datasetrt.format.remote import small_files
from datasetrt.runtime.prefetch import ShardPrefetcher
from datasetrt.sampling.orders import Ordering, window
from tests.conftest import ListSource, sample_items, writer_config
from tests.servers.fixtures import proxy_options
from tests.storage.conftest import DEADLINE_S, wait_until

SAMPLES = 96
SHARD_BYTES = 2 << 10  # about 8 records of 256 bytes per shard: a dozen shards


def storage(proxy, tmp_path, **kw) -> drt.StorageConfig:
    return drt.StorageConfig(
        options=proxy_options(proxy), cache_dir=str(tmp_path / "node"), retry_attempts=4, retry_budget_s=30.0, **kw
    )


@pytest.fixture
def url(runtime, bucket, s3_proxy, tmp_path) -> str:
    cfg = writer_config(max_shard_bytes=SHARD_BYTES, storage=storage(s3_proxy, tmp_path / "w"))
    source = ListSource("a", sample_items(SAMPLES, payload_bytes=256))
    [result] = runtime.write_cache([source], f"s3://{bucket}/caches", writer_config=cfg)
    assert isinstance(result, drt.CacheWriteSuccess), result
    s3_proxy.reset()
    return str(result.path)


def sizes(url, proxy, tmp_path) -> tuple[list[int], int]:
    """(shard sizes, small-file bytes) of the cache at `url`."""
    probe = drt.CachedDataset([url], reader_config=drt.ReaderConfig(seed=0, storage=storage(proxy, tmp_path / "p")))
    [handle] = probe._handles
    return [s.byte_len for s in handle.manifest.shards], _small_bytes(handle)


def shard_gets(proxy) -> collections.Counter:
    return collections.Counter(r.key for r in proxy.matching("GET") if "/shards/" in r.key)


def locality(proxy, tmp_path, window_shards: int, **kw) -> drt.ReaderConfig:
    return drt.ReaderConfig(
        seed=4, shuffle=True, sampling="locality", window_shards=window_shards, storage=storage(proxy, tmp_path, **kw)
    )


def test_under_a_limit_the_look_ahead_leaves_the_window_its_room_and_each_shard_comes_once(url, s3_proxy, tmp_path):
    shard_sizes, small = sizes(url, s3_proxy, tmp_path)
    assert len(shard_sizes) >= 8
    largest = max(shard_sizes)
    limit = small + 5 * largest  # room for 5 shards: a window of 2 and the next one's first, a look-ahead of 2
    cfg = locality(s3_proxy, tmp_path, 2, cache_limit_bytes=limit)
    ds = drt.CachedDataset([url], reader_config=cfg)
    assert remote.look_ahead(ds._handles, cfg) == 2
    assert remote.look_ahead(ds._handles, cfg.model_copy(update={"shuffle": False})) == 3  # an ordered read: 2 in use
    assert remote.look_ahead(ds._handles, cfg.model_copy(update={"window_shards": 4})) == 0  # the bound's need exactly
    s3_proxy.reset()
    assert sum(len(b) for b in ds.iter_batches(10)) == SAMPLES
    gets = shard_gets(s3_proxy)
    assert len(gets) == len(shard_sizes) and set(gets.values()) == {1}, gets  # one epoch, one download each
    assert ds._handles[0].remote.storage.node_cache().usage_bytes() <= limit


def test_a_shard_the_read_reached_first_is_not_prefetched(url, s3_proxy, tmp_path):
    cfg = locality(s3_proxy, tmp_path, 2)
    ds = drt.CachedDataset([url], reader_config=cfg)
    [handle] = ds._handles
    win = window(
        ds._population, 0, len(ds), shuffle=True, seed=4, ordering=Ordering("locality", 2, ds._reads.row_shards)
    )
    _cache_pos, sample_id = win.population.resolve(win.rows(0, win.length))
    first = int(handle.index_array()[int(sample_id[0]), 0])
    key = f"{handle.remote.location.key()}/shards/{handle.manifest.shards[first].name}"
    node = handle.remote.storage.node_cache()
    resident = node.pinned_count()  # the manifest and small files, pinned while the dataset is open
    stall = s3_proxy.stall(key, after_bytes=16, resume=True)
    fetcher = ShardPrefetcher(ds._handles, win, lookahead=1, concurrency=1)
    try:
        assert stall.reached.wait(DEADLINE_S), "the first prefetch never reached the server"
        fetcher.advance(win.length)  # meanwhile the read has consumed every position itself
        stall.release()
        # the planning thread ends once it has handed out (or dropped) every shard of the window
        wait_until(lambda: not fetcher._thread.is_alive(), what="the prefetch plan to run out")
    finally:
        fetcher.close()
    assert list(shard_gets(s3_proxy)) == [key]  # the queued shards were dropped, not downloaded
    assert (fetcher.fetched, fetcher.failed) == (1, 0)
    assert node.pinned_count() == resident


def test_under_a_limit_the_small_files_stay_so_reader_workers_reopen_the_mirror(url, s3_proxy, tmp_path):
    shard_sizes, small = sizes(url, s3_proxy, tmp_path)
    limit = small + 3 * max(shard_sizes)  # a window of 2 and one more: most shards get evicted
    cfg = locality(s3_proxy, tmp_path, 2, cache_limit_bytes=limit)
    ds = drt.CachedDataset([url], reader_config=cfg)
    [handle] = ds._handles
    assert sum(len(b) for b in ds.iter_batches(10)) == SAMPLES
    mirror = handle.remote.mirror()
    assert sum(mirror.has(f"shards/{s.name}") for s in handle.manifest.shards) < len(shard_sizes)  # evictions
    for name in (MANIFEST_NAME, *(n for n, _, _ in small_files(handle.manifest))):
        assert mirror.has(name), name  # the least recently used files, yet pinned
    # Reader workers reopen the mirror by its files. (Room for every shard here: under a limit this
    # tight, a worker's on-demand shard can be evicted by another process before it opens it.)
    roomy = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"cache_limit_bytes": limit * 8})})
    rt = drt.DatasetRuntime(num_workers=2)
    try:
        ds2 = drt.CachedDataset([url], reader_config=roomy, runtime=rt)
        assert sorted(int(s) for b in ds2.iter_batches(10) for s in b.sample_id) == list(range(SAMPLES))
    finally:
        rt.close()
    node = handle.remote.storage.node_cache()
    pinned = node.pinned_count()
    assert pinned > 0
    del ds, ds2, handle, mirror
    import gc

    gc.collect()
    assert node.pinned_count() < pinned  # the pins go with the datasets' handles


def test_a_warm_read_without_a_limit_starts_no_prefetcher(url, s3_proxy, tmp_path):
    cfg = locality(s3_proxy, tmp_path, 2)
    ds = drt.CachedDataset([url], reader_config=cfg)
    assert remote.look_ahead(ds._handles, cfg) == cfg.storage.prefetch_shards  # nothing on the node yet
    assert sum(len(b) for b in ds.iter_batches(10)) == SAMPLES
    assert remote.look_ahead(ds._handles, cfg) == 0
    assert remote.prefetcher(ds._handles, ds.reserve_window(), cfg) is None
    s3_proxy.reset()
    assert sum(len(b) for b in ds.iter_batches(10)) == SAMPLES
    assert not shard_gets(s3_proxy)
    ds._handles[0].remote.mirror().evict(["shards/" + ds._handles[0].manifest.shards[0].name])
    assert remote.look_ahead(ds._handles, cfg) == cfg.storage.prefetch_shards  # one shard gone: prefetch again
