"""Caches written by the real dataset-rt 0.4.8, read by datasetrt (with and without validate_cache).

Such caches have no datasetrt checksum sidecar, so datasetrt falls back to structural checks on
read (and to dataset-rt's sha256 + embedded-metadata checks with validate_cache=True).
"""

from __future__ import annotations

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

SPEC = {"red": tricky_items(33, "red"), "green": tricky_items(20, "green"), "blue": tricky_items(7, "blue")}
MAX_SHARD_BYTES = 1500
SEEDS = [0, 5, 2**63 + 12345]


@pytest.fixture(scope="module", params=["none", "lz4"])
def rt_caches(request, runtimes, tmp_path_factory):
    """(algo, paths, cache_ids) of SPEC written by dataset-rt with small shards."""
    algo = request.param
    base = tmp_path_factory.mktemp(f"rt-{algo}")
    paths = write(runtimes["rt"], LIBS["rt"], SPEC, base, algo, max_shard_bytes=MAX_SHARD_BYTES)
    ids = [read_manifest(p)["cache_id"] for p in paths]
    return algo, paths, ids


@pytest.fixture(params=[False, True], ids=["novalidate", "validate"])
def validate(request):
    return request.param


def _both(runtimes, paths, validate, **reader_kw):
    return (
        open_ds(runtimes["rt"], LIBS["rt"], paths, **reader_kw),
        open_ds(runtimes["drt"], LIBS["drt"], paths, validate_cache=validate, **reader_kw),
    )


def test_fixture_has_no_datasetrt_extension(rt_caches):
    algo, paths, _ = rt_caches
    for path in paths:
        manifest = read_manifest(path)
        assert "datasetrt" not in manifest
        assert not (path / "checksums.xxh3").exists()
    assert len(read_manifest(paths[0])["shards"]) >= 3
    assert {s["compression"]["algo"] for s in read_manifest(paths[0])["shards"]} == {algo}


def test_ordered_samples_identical(runtimes, rt_caches, validate):
    _, paths, ids = rt_caches
    rt_ds, drt_ds = _both(runtimes, paths, validate, shuffle=False)
    want = expected_keys(SPEC, ids)
    assert take(drt_ds) == want
    assert take(rt_ds) == want


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffled_samples_identical(runtimes, rt_caches, validate, seed):
    _, paths, _ = rt_caches
    rt_ds, drt_ds = _both(runtimes, paths, validate, shuffle=True, seed=seed)
    assert take(drt_ds, iterators=3) == take(rt_ds, iterators=3)


def test_get_item_identical_for_every_sample(runtimes, rt_caches, validate):
    _, paths, ids = rt_caches
    rt_ds, drt_ds = _both(runtimes, paths, validate, shuffle=False)
    for cid, items in zip(ids, SPEC.values()):
        for sid in range(len(items)):
            assert sample_key(drt_ds.get_item(cid, sid)) == sample_key(rt_ds.get_item(cid, sid))


def test_get_metadata_frames_identical(runtimes, rt_caches, validate):
    _, paths, _ = rt_caches
    rt_ds, drt_ds = _both(runtimes, paths, validate, shuffle=False)
    assert_frames_identical(drt_ds.get_metadata(), rt_ds.get_metadata())
    assert len(drt_ds) == len(rt_ds) == sum(map(len, SPEC.values()))


def test_two_of_three_caches_in_other_order(runtimes, rt_caches, validate):
    _, paths, _ = rt_caches
    subset = [paths[2], paths[0]]
    for shuffle in (False, True):
        rt_ds, drt_ds = _both(runtimes, subset, validate, shuffle=shuffle, seed=21)
        assert take(drt_ds, iterators=2) == take(rt_ds, iterators=2)
        assert_frames_identical(drt_ds.get_metadata(), rt_ds.get_metadata())
