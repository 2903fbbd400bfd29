"""Every public entry point that takes a cache path takes an object-store URL (against moto's
server through the counting proxy): `DatasetRuntime.cached_dataset`, `from_cache_sources` (written,
then reused on a second call with no upload), URLs mixed with local paths, and a URL mangled by
`pathlib.Path` refused everywhere rather than read as a local directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError, StorageError
from tests.conftest import ListSource, sample_items, writer_config
from tests.servers.fixtures import proxy_options
from tests.servers.moto import s3_options

SIZES = {"a": 40, "b": 25}
SHARD_BYTES = 2 << 10


def storage(proxy, tmp_path, name: str = "node") -> drt.StorageConfig:
    return drt.StorageConfig(
        options=proxy_options(proxy), cache_dir=str(tmp_path / name), retry_attempts=4, retry_budget_s=30.0
    )


def sources(sizes=SIZES):
    return [ListSource(name, sample_items(n, seed=k, tag=name)) for k, (name, n) in enumerate(sizes.items())]


def samples_of(ds) -> list[tuple[int, int, bytes, str]]:
    return [(s.cache_id, s.sample_id, bytes(s.data), s.metadata["label"]) for s in ds]


def uploads(proxy) -> list[str]:
    return [r.key for r in proxy.matching("PUT") if "/shards/" in r.key or r.key.endswith("manifest.json")]


@pytest.fixture
def local(runtime, tmp_path):
    config = writer_config("lz4", max_shard_bytes=SHARD_BYTES)
    return [r.path for r in runtime.write_cache(sources(), tmp_path / "local", writer_config=config)]


def test_cached_dataset_of_the_runtime_reads_urls_alone_and_mixed_with_local_paths(
    runtime, local, bucket, s3_proxy, tmp_path
):
    config = writer_config("lz4", max_shard_bytes=SHARD_BYTES, storage=storage(s3_proxy, tmp_path, "w"))
    results = runtime.write_cache(sources(), f"s3://{bucket}/base/", writer_config=config)
    urls = [r.path for r in results]
    assert urls == [f"s3://{bucket}/base/a", f"s3://{bucket}/base/b"]
    reader = drt.ReaderConfig(seed=4, shuffle=True, storage=storage(s3_proxy, tmp_path))
    want = samples_of(runtime.cached_dataset(local, reader_config=drt.ReaderConfig(seed=4, shuffle=True)))
    ds = runtime.cached_dataset(urls, reader_config=reader)
    assert ds.cache_paths == urls  # kept as URL strings, never Path("s3:/...")
    assert samples_of(ds) == want
    mixed = runtime.cached_dataset([urls[0], local[1]], reader_config=reader)
    assert [p if isinstance(p, str) else Path(p) for p in mixed.cache_paths] == [urls[0], local[1]]
    assert samples_of(mixed) == want


def test_from_cache_sources_writes_to_a_url_then_reuses_what_is_published(runtime, local, bucket, s3_proxy, tmp_path):
    base = f"s3://{bucket}/fcs"
    config = writer_config("lz4", max_shard_bytes=SHARD_BYTES, storage=storage(s3_proxy, tmp_path, "w"))
    reader = drt.ReaderConfig(seed=7, shuffle=True)  # no storage of its own: the writer's reaches the caches
    out = runtime.from_cache_sources(sources(), base, reader_config=reader, writer_config=config)
    assert isinstance(out, drt.CacheSourcesDatasetSuccess), out
    assert [r.path for r in out.results] == [f"{base}/a", f"{base}/b"]
    assert out.dataset.cache_paths == [f"{base}/a", f"{base}/b"]
    want = samples_of(drt.CachedDataset(local, reader_config=drt.ReaderConfig(seed=7, shuffle=True)))
    assert samples_of(out.dataset) == want
    first = uploads(s3_proxy)
    assert first and all(key.startswith("fcs/") for key in first)

    again = runtime.from_cache_sources(sources(), base, reader_config=reader, writer_config=config)
    assert isinstance(again, drt.CacheSourcesDatasetSuccess), again
    assert uploads(s3_proxy) == first  # published caches are checked and reused, nothing uploaded
    assert samples_of(again.dataset) == want


def test_a_reader_storage_of_its_own_wins_over_the_writers(runtime, bucket, s3_proxy, tmp_path):
    """The fallback to the writer's storage is only for a reader left at the default storage: a
    reader that names storage of its own reads with it (here it reaches nothing: a typed error)."""
    base = f"s3://{bucket}/own"
    config = writer_config(storage=storage(s3_proxy, tmp_path, "w"))
    runtime.write_cache([ListSource("y", sample_items(3))], base, writer_config=config)
    opts = s3_options("http://127.0.0.1:9")  # loopback's discard port: nothing listens there
    unreachable = drt.StorageConfig(options=opts, cache_dir=str(tmp_path / "r"), retry_attempts=1, retry_budget_s=1.0)
    with pytest.raises(StorageError, match=f"{base}/y/manifest.json"):
        runtime.from_cache_sources(
            [ListSource("y", sample_items(3))],
            base,
            reader_config=drt.ReaderConfig(seed=0, storage=unreachable),
            writer_config=config,
        )
    good = drt.ReaderConfig(seed=0, storage=storage(s3_proxy, tmp_path, "r2"))
    out = runtime.from_cache_sources([ListSource("y", [])], base, reader_config=good, writer_config=config)
    assert isinstance(out, drt.CacheSourcesDatasetSuccess) and len(out.dataset) == 3  # reused, not rewritten
    assert out.dataset.reader_config.storage == good.storage


@pytest.mark.parametrize("mangled", [Path("s3://bucket/x"), "s3:/bucket/x"])
def test_a_url_mangled_by_pathlib_is_refused_by_every_entry_point(runtime, tmp_path, mangled):
    reader = drt.ReaderConfig(seed=0)
    calls = [
        lambda: runtime.write_cache([ListSource("m", sample_items(2))], mangled, writer_config=writer_config()),
        lambda: runtime.from_cache_sources([ListSource("m", sample_items(2))], mangled, reader_config=reader),
        lambda: runtime.cached_dataset([mangled], reader_config=reader),
        lambda: drt.CachedDataset([mangled], reader_config=reader),
    ]
    for call in calls:
        with pytest.raises(ConfigError, match="lost a slash"):
            call()
    assert not any(tmp_path.iterdir()) and not Path("s3:").exists()  # nothing written as a local directory


def test_a_mixture_names_caches_by_url_in_any_spelling(runtime, bucket, s3_proxy, tmp_path):
    from datasetrt.errors import UnknownStreamError
    from datasetrt.sampling.mixture import Mixture, Stream

    config = writer_config(storage=storage(s3_proxy, tmp_path, "w"))
    urls = [r.path for r in runtime.write_cache(sources(), f"s3://{bucket}/mix", writer_config=config)]
    reader = drt.ReaderConfig(seed=1, storage=storage(s3_proxy, tmp_path))
    ds = runtime.cached_dataset(urls, reader_config=reader)
    a_spelled = f"s3a://{bucket}/mix/a/"  # an alias scheme and a trailing slash: the same cache
    ds.set_mixture(Mixture({"a": 1}, {"a": Stream.by_cache(a_spelled), "b": Stream.by_cache(urls[1])}))
    got = {s.metadata["label"].split("-")[0] for s in ds}
    assert got == {"a"}
    with pytest.raises(UnknownStreamError, match="mix/c"):
        ds.set_mixture(Mixture({"c": 1}, {"c": Stream.by_cache(f"s3://{bucket}/mix/c")}))


def test_update_manifests_refuses_caches_in_object_storage(runtime, bucket, s3_proxy, tmp_path):
    config = writer_config("none", max_shard_bytes=SHARD_BYTES, storage=storage(s3_proxy, tmp_path, "w"))
    urls = [r.path for r in runtime.write_cache(sources(), f"s3://{bucket}/m", writer_config=config)]
    ds = drt.CachedDataset(urls, reader_config=drt.ReaderConfig(seed=0, storage=storage(s3_proxy, tmp_path)))
    puts = s3_proxy.count("PUT")
    result = ds.update_manifests(3)
    assert isinstance(result, drt.Err)
    assert urls[0] in result.error.message and "object storage" in result.error.message
    assert s3_proxy.count("PUT") == puts  # nothing written, in the store or claimed as updated
