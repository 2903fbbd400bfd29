"""ReaderConfig(sampling="locality") at the dataset level: exactly-once epochs that read a window of
`window_shards` shards at a time, the same in-process and through reader worker processes, resumable
from a cursor state, with integer weights as repeat counts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.errors import RepeatCountError
from datasetrt.sampling.locality import LocalityPermutation

SIZES = {"a": 40, "b": 75, "c": 3, "d": 120}
SHARD_BYTES = 2 << 10  # a few records per shard: many shards per cache


def locality_ds(paths, seed=11, window_shards=2, runtime=None, **kw):
    config = drt.ReaderConfig(seed=seed, sampling="locality", window_shards=window_shards, **kw)
    return drt.CachedDataset(paths, reader_config=config, runtime=runtime)


def ids(samples) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in samples]


def batch_ids(batches) -> list[tuple[int, int]]:
    return [(int(c), int(s)) for b in batches for c, s in zip(b.cache_id, b.sample_id)]


def shard_of(paths) -> dict[tuple[int, int], tuple[int, int]]:
    """(cache_id, sample_id) -> (cache position, shard id), read from each index.bin."""
    out = {}
    for k, path in enumerate(paths):
        ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0))
        handle = ds._handles[0]
        cid = int(ds.get_metadata()["cache_id"][0]) if len(ds) else 0
        for sid, row in enumerate(handle.index_array()):
            out[(cid, sid)] = (k, int(row[0]))
    return out


@pytest.fixture
def paths(write_caches):
    return write_caches(SIZES, max_shard_bytes=SHARD_BYTES)


def test_each_row_once_per_epoch_and_each_window_reads_its_shards_only(paths):
    ds = locality_ds(paths, window_shards=3)
    shards = shard_of(paths)
    every = sorted(shards)
    assert len(ds) == len(every) == sum(SIZES.values())
    assert len(set(shards.values())) > 12, "the caches need many shards for this test"
    epochs = [ids(ds) for _ in range(2)]
    for epoch in epochs:
        assert sorted(epoch) == every
    assert epochs[0] != epochs[1]
    plan = ds._plan(ds._population)
    assert isinstance(plan, LocalityPermutation)
    for e, epoch in enumerate(epochs):
        _order, starts = plan.epoch_layout(e)
        for j in range(len(starts) - 1):
            seen = {shards[k] for k in epoch[starts[j] : starts[j + 1]]}
            assert len(seen) <= 3, f"window {j} of epoch {e} read {len(seen)} shards"


def test_batches_follow_the_samples_order(paths):
    samples = locality_ds(paths)
    batches = locality_ds(paths)
    for _ in range(2):
        assert batch_ids(batches.iter_batches(16)) == ids(samples)


def test_window_size_and_seed_change_the_order_not_the_rows(paths):
    base = ids(locality_ds(paths, seed=3, window_shards=2))
    assert ids(locality_ds(paths, seed=3, window_shards=5)) != base
    assert ids(locality_ds(paths, seed=4, window_shards=2)) != base
    assert sorted(ids(locality_ds(paths, seed=4, window_shards=5))) == sorted(base)
    assert locality_ds(paths, window_shards=5).order_identity().startswith("locality:5:")


def test_integer_weights_are_repeat_counts_and_others_are_refused(paths):
    ds = locality_ds(paths)
    table = ds.get_metadata()
    weighted = table.filter(pl.col("sample_id") % 3 != 0).with_columns(
        weight=(pl.col("sample_id") % 2 + 1).cast(pl.Float64)
    )
    ds.update_metadata(weighted)
    want = Counter({(c, s): int(w) for c, s, w in zip(weighted["cache_id"], weighted["sample_id"], weighted["weight"])})
    assert len(ds) == sum(want.values())
    assert Counter(ids(ds)) == want
    with pytest.raises(RepeatCountError, match="sample_id"):
        ds.update_metadata(table.with_columns(weight=pl.lit(1.5)))


def test_resume_from_a_cursor_state_continues_the_plan(paths):
    expected = [ids(ds) for ds in [locality_ds(paths, seed=4)] for _ in range(3)]
    first = locality_ds(paths, seed=4)
    assert ids(first) == expected[0]
    it = iter(first)
    [next(it) for _ in range(10)]
    saved = first.cursor_state().as_dict()  # the next window starts after the reserved one
    resumed = locality_ds(paths, seed=4)
    resumed.restore_cursor_state(resumed.cursor_state_from(saved))
    assert ids(resumed) == expected[2]


def test_needs_shuffle():
    with pytest.raises(ValueError, match="sampling=.locality. is a shuffled order"):
        drt.ReaderConfig(seed=1, sampling="locality", shuffle=False)
    with pytest.raises(ValueError):
        drt.ReaderConfig(seed=1, sampling="locality", window_shards=0)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reader_workers_read_the_same_order(paths, start_method):
    local = locality_ds(paths, seed=21)
    with drt.DatasetRuntime(num_workers=2, start_method=start_method) as rt:
        assert len(rt.start_workers()) == 2  # the workers read, not the head start
        parallel = locality_ds(paths, seed=21, runtime=rt, prefetch_size=4)
        for _ in range(2):
            assert ids(parallel) == ids(local)
            assert batch_ids(parallel.iter_batches(5)) == batch_ids(local.iter_batches(5))


def test_row_shards_name_each_row_s_shard(paths):
    ds = locality_ds(paths)
    shards = shard_of(paths)
    physical = ds._reads.row_shards(ds._population)
    table = ds.get_metadata()
    bases = np.cumsum([0] + [len(h.manifest.shards) for h in ds._handles])
    want = [bases[shards[(c, s)][0]] + shards[(c, s)][1] for c, s in zip(table["cache_id"], table["sample_id"])]
    assert physical.tolist() == want
    picked = table.filter(pl.col("sample_id") % 4 == 1).reverse()
    ds.update_metadata(picked)
    want = [bases[shards[(c, s)][0]] + shards[(c, s)][1] for c, s in zip(picked["cache_id"], picked["sample_id"])]
    assert ds._reads.row_shards(ds._population).tolist() == want
