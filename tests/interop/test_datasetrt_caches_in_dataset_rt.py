"""Caches written by datasetrt, read by the real dataset-rt 0.4.8 (validate_cache=True).

dataset-rt's deep validation checks the sha256 of every file, decodes metadata.arrow against the
manifest schema and compares each record's embedded JSON with its metadata.arrow row, so a pass
here means datasetrt's shards, index, metadata and manifest are accepted as dataset-rt's own.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.interop._interop import (
    LIBS,
    assert_frames_identical,
    expected_keys,
    open_ds,
    read_manifest,
    sample_key,
    take,
    tricky_items,
    write,
)

pytestmark = pytest.mark.interop

SPEC = {"alpha": tricky_items(40, "alpha"), "beta": tricky_items(25, "beta"), "gamma": tricky_items(9, "gamma")}
MAX_SHARD_BYTES = 1500
SEEDS = [0, 3, 2**64 - 1]


@pytest.fixture(scope="module", params=["none", "lz4"])
def drt_caches(request, runtimes, tmp_path_factory):
    """(algo, paths, cache_ids) of SPEC written by datasetrt with small shards."""
    algo = request.param
    base = tmp_path_factory.mktemp(f"drt-{algo}")
    paths = write(runtimes["drt"], LIBS["drt"], SPEC, base, algo, max_shard_bytes=MAX_SHARD_BYTES)
    ids = [read_manifest(p)["cache_id"] for p in paths]
    return algo, paths, ids


def _both(runtimes, paths, **reader_kw):
    return (
        open_ds(runtimes["rt"], LIBS["rt"], paths, validate_cache=True, **reader_kw),
        open_ds(runtimes["drt"], LIBS["drt"], paths, **reader_kw),
    )


def test_fixture_covers_shards_and_payload_sizes(drt_caches):
    algo, paths, _ = drt_caches
    manifest = read_manifest(paths[0])
    assert len(manifest["shards"]) >= 3
    assert {s["compression"]["algo"] for s in manifest["shards"]} == {algo}
    sizes = {len(d) for items in SPEC.values() for d, _ in items}
    assert 0 in sizes and max(sizes) >= 4096


def test_ordered_samples_identical(runtimes, drt_caches):
    _, paths, ids = drt_caches
    rt_ds, drt_ds = _both(runtimes, paths, shuffle=False)
    want = expected_keys(SPEC, ids)
    assert take(rt_ds) == want
    assert take(drt_ds) == want


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffled_samples_identical(runtimes, drt_caches, seed):
    _, paths, _ = drt_caches
    rt_ds, drt_ds = _both(runtimes, paths, shuffle=True, seed=seed)
    got_rt = take(rt_ds, iterators=2)
    assert got_rt == take(drt_ds, iterators=2)
    assert len(got_rt) == 2 * sum(map(len, SPEC.values()))


def test_get_item_identical_for_every_sample(runtimes, drt_caches):
    _, paths, ids = drt_caches
    rt_ds, drt_ds = _both(runtimes, paths, shuffle=False)
    want = expected_keys(SPEC, ids)
    got = [
        (sample_key(rt_ds.get_item(cid, sid)), sample_key(drt_ds.get_item(cid, sid)))
        for cid, items in zip(ids, SPEC.values())
        for sid in range(len(items))
    ]
    assert [g[0] for g in got] == want
    assert [g[1] for g in got] == want


def test_get_metadata_frames_identical(runtimes, drt_caches):
    _, paths, ids = drt_caches
    rt_ds, drt_ds = _both(runtimes, paths, shuffle=False)
    rt_df, drt_df = rt_ds.get_metadata(), drt_ds.get_metadata()
    assert_frames_identical(rt_df, drt_df)
    assert rt_df.columns == ["cache_id", "sample_id", "Name", "b", "i", "s", "zf", "weight"]
    assert rt_df["cache_id"].unique(maintain_order=True).to_list() == ids


def test_reversed_path_order_identical(runtimes, drt_caches):
    _, paths, _ = drt_caches
    rev = list(reversed(paths))
    for shuffle in (False, True):
        rt_ds, drt_ds = _both(runtimes, rev, shuffle=shuffle, seed=11)
        assert take(rt_ds) == take(drt_ds)
        assert_frames_identical(rt_ds.get_metadata(), drt_ds.get_metadata())


def test_zstd_cache_is_rejected_by_dataset_rt(runtimes, tmp_path):
    """Expected, deliberate difference: datasetrt can write zstd caches; dataset-rt 0.4.8 cannot read them.

    dataset-rt's manifest parser only knows the compression variants `none` and `lz4`, so opening
    fails at load with `RuntimeError: JSON error: unknown variant `zstd`, expected `none` or `lz4``
    (reference §6). datasetrt itself reads the cache back.
    """
    spec = {"zeta": tricky_items(12, "zeta")}
    paths = write(runtimes["drt"], LIBS["drt"], spec, tmp_path, "zstd")
    assert read_manifest(paths[0])["shards"][0]["compression"]["algo"] == "zstd"
    for validate in (False, True):
        with pytest.raises((RuntimeError, ValueError), match="zstd"):
            open_ds(runtimes["rt"], LIBS["rt"], paths, validate_cache=validate)
    drt_ds = open_ds(runtimes["drt"], LIBS["drt"], paths, shuffle=False, validate_cache=True)
    assert take(drt_ds) == expected_keys(spec, [read_manifest(paths[0])["cache_id"]])


@pytest.mark.parametrize("algo", ["none", "lz4"])
@pytest.mark.parametrize("writer", ["drt", "rt"])
def test_large_payloads_both_directions(runtimes, tmp_path, writer, algo):
    """Payloads around the 64 KiB LZ4 boundaries and up to 1 MiB, incompressible and repetitive."""
    rng = np.random.default_rng(0)
    sizes = [65535, 65536, 65537, 200_000, 300_000, 1 << 20]
    items = [(rng.bytes(n) if k % 2 else (b"abc" * n)[:n], {"n": n}) for k, n in enumerate(sizes)]
    paths = write(runtimes[writer], LIBS[writer], {"large": items}, tmp_path, algo)
    want = expected_keys({"large": items}, [read_manifest(paths[0])["cache_id"]])
    for label, lib in LIBS.items():
        assert take(open_ds(runtimes[label], lib, paths, shuffle=False, validate_cache=True)) == want, label
