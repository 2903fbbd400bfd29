"""The disk bound of mixtures and curricula over s3:// caches (datasetrt/dataset/remote.py): under
sampling="locality" each of a mixture's m streams holds its own window on the node, so setting a
mixture whose m x (window_shards + 1) shards do not fit the node cache's limit is refused with a
DiskLimitError naming the limit and the need (nothing changes), and one that fits reads within
the limit; against moto's server through the fault proxy.
"""

from __future__ import annotations

import collections

import pytest

import datasetrt as drt
from datasetrt.dataset import remote
from datasetrt.dataset.remote import _small_bytes
from datasetrt.errors import DiskLimitError
from datasetrt.sampling import Curriculum, Mixture, Stage, Stream
from tests.conftest import ListSource, sample_items, writer_config
from tests.servers.fixtures import proxy_options

SIZES = {"a": 40, "b": 30, "c": 30}
SHARD_BYTES = 2 << 10  # a few records per shard: several shards per cache


def storage(proxy, tmp_path, **kw) -> drt.StorageConfig:
    return drt.StorageConfig(
        options=proxy_options(proxy), cache_dir=str(tmp_path / "node"), retry_attempts=4, retry_budget_s=30.0, **kw
    )


@pytest.fixture
def urls(runtime, bucket, s3_proxy, tmp_path) -> list[str]:
    cfg = writer_config(max_shard_bytes=SHARD_BYTES, storage=storage(s3_proxy, tmp_path / "w"))
    sources = [ListSource(name, sample_items(n, seed=k, tag=name)) for k, (name, n) in enumerate(SIZES.items())]
    results = runtime.write_cache(sources, f"s3://{bucket}/caches", writer_config=cfg)
    for r in results:
        assert isinstance(r, drt.CacheWriteSuccess), r
    return [str(r.path) for r in results]


def bound(urls, proxy, tmp_path) -> tuple[int, int]:
    """(small-file bytes of the caches, their largest shard)."""
    probe = drt.CachedDataset(urls, reader_config=drt.ReaderConfig(seed=0, storage=storage(proxy, tmp_path / "p")))
    return sum(_small_bytes(h) for h in probe._handles), max(
        s.byte_len for h in probe._handles for s in h.manifest.shards
    )


def locality(proxy, tmp_path, limit: int) -> drt.ReaderConfig:
    return drt.ReaderConfig(
        seed=5,
        shuffle=True,
        sampling="locality",
        window_shards=1,
        storage=storage(proxy, tmp_path, cache_limit_bytes=limit),
    )


def streams(urls) -> dict[str, Stream]:
    return {"a": Stream.by_cache(urls[0]), "bc": Stream.by_cache(urls[1], urls[2])}


def test_a_mixture_whose_streams_windows_exceed_the_limit_is_refused_naming_it(urls, s3_proxy, tmp_path):
    small, largest = bound(urls, s3_proxy, tmp_path)
    limit = small + 3 * largest  # one stream's window, the next one's first and a look-ahead: not two streams'
    ds = drt.CachedDataset(urls, reader_config=locality(s3_proxy, tmp_path, limit))  # a single order fits
    need = small + 2 * (1 + 1) * largest
    with pytest.raises(DiskLimitError) as err:
        ds.set_mixture(Mixture({"a": 0.5, "bc": 0.5}, streams(urls)))
    assert err.value.limit_bytes == limit and err.value.need_bytes == need
    text = str(err.value)
    assert f"limit of {limit} bytes" in text and f"{need} bytes" in text and "2 streams" in text, text
    assert ds.mixture is None  # nothing changed
    with pytest.raises(DiskLimitError, match="2 streams"):
        ds.set_curriculum(
            Curriculum(
                [Stage(Mixture({"a": 1}, streams(urls)), batches=2), Stage(Mixture({"bc": 1}, streams(urls)))],
                batch_size=4,
            )
        )
    assert ds.curriculum is None
    ds.set_mixture(Mixture({"a": 1}, {"a": Stream.by_cache(urls[0])}))  # one stream: the single order's need
    assert ds.mixture is not None


def test_a_mixture_that_fits_reads_within_the_limit(urls, s3_proxy, tmp_path):
    small, largest = bound(urls, s3_proxy, tmp_path)
    limit = small + 5 * largest  # two streams' windows and their next windows' first shards, one of look-ahead
    cfg = locality(s3_proxy, tmp_path, limit)
    ds = drt.CachedDataset(urls, reader_config=cfg)
    assert limit < small + sum(s.byte_len for h in ds._handles for s in h.manifest.shards)  # not the whole dataset
    ds.set_mixture(Mixture({"a": 0.5, "bc": 0.5}, streams(urls)))
    assert remote.look_ahead(ds._handles, cfg, streams=2) == 1
    ds.set_epoch_len(2 * SIZES["a"])  # an epoch of stream "a" beside as many of "bc"
    seen = [(int(c), int(s)) for b in ds.iter_batches(8) for c, s in zip(b.cache_id, b.sample_id)]
    assert len(seen) == 2 * SIZES["a"]
    by_cache = collections.Counter(c for c, _ in seen)
    a_id = ds._handles[0].manifest.cache_id if ds._handles[0].manifest.cache_id is not None else 0
    assert by_cache[a_id] == SIZES["a"] and len(set(seen)) == len(seen)  # stream "a" once, nothing twice
    assert ds._handles[0].remote.storage.node_cache().usage_bytes() <= limit
