"""Sampling modes at the dataset level: ReaderConfig(sampling="permutation"), set_mixture and
set_curriculum drive what iter(ds) and iter_batches read, in-process and through reader worker
processes."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError, EmptyStreamError, RepeatCountError, UnknownStreamError
from datasetrt.sampling import (
    Curriculum,
    CurriculumPlan,
    EpochPermutation,
    Mixture,
    MixturePlan,
    Stage,
    Stream,
    StreamRows,
)

SIZES = {"a": 7, "b": 13, "c": 1, "d": 30, "e": 9}  # many caches, of very different sizes


def ids(samples) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in samples]


def batch_ids(batches) -> list[tuple[int, int]]:
    return [(int(c), int(s)) for b in batches for c, s in zip(b.cache_id, b.sample_id)]


def table_ids(ds) -> list[tuple[int, int]]:
    """(cache_id, sample_id) of each population row, in table order."""
    table = ds.get_metadata()
    return list(zip(table["cache_id"].to_list(), table["sample_id"].to_list()))


def permutation_ds(paths, seed=11, runtime=None, **kw):
    return drt.CachedDataset(
        paths, reader_config=drt.ReaderConfig(seed=seed, sampling="permutation", **kw), runtime=runtime
    )


def test_each_row_once_per_epoch_in_the_plan_s_order(write_caches):
    paths = write_caches(SIZES)
    ds = permutation_ds(paths)
    every = table_ids(ds)
    n = len(every)
    assert len(ds) == n == sum(SIZES.values())
    epochs = [ids(ds) for _ in range(3)]
    plan = EpochPermutation(11, n)
    for e, epoch in enumerate(epochs):
        assert sorted(epoch) == sorted(every)  # exactly once: multiset equality
        assert epoch == [every[r] for r in plan.rows(e * n, n).tolist()]
    assert epochs[0] != epochs[1] != epochs[2]  # a new order every epoch
    assert batch_ids(ds.iter_batches(8)) == [every[r] for r in plan.rows(3 * n, n).tolist()]
    other = permutation_ds(paths, seed=12)
    assert ids(other) != epochs[0] and sorted(ids(other)) == sorted(every)


def test_integer_weights_are_repeat_counts_and_others_are_refused(write_caches):
    paths = write_caches({"a": 10, "b": 5})
    ds = permutation_ds(paths)
    table = ds.get_metadata()
    counts = np.arange(table.height) % 3 + 1
    ds.update_metadata(table.with_columns(pl.Series("weight", counts.astype(np.float64))))
    assert len(ds) == int(counts.sum())
    for _ in range(2):
        seen = Counter(ids(ds))
        assert seen == Counter({key: int(c) for key, c in zip(table_ids(ds), counts)})
    weighted = ds.get_metadata()
    with pytest.raises(RepeatCountError, match=r"row 1 \(cache_id \d+, sample_id 1\) has weight 2.5"):
        ds.update_metadata(weighted.with_columns(pl.Series("weight", [1.0, 2.5] + [1.0] * (table.height - 2))))
    assert ds.get_metadata() is weighted and len(ds) == int(counts.sum())  # the previous table stays
    assert len(list(ds)) == len(ds)


def test_draws_mode_is_unchanged_by_the_order_machinery(write_caches):
    paths = write_caches({"a": 20, "b": 11})
    draws = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=3))
    assert draws.reader_config.sampling == "draws" and draws.order_identity() == "draws"
    window = draws.peek_window()
    every = table_ids(draws)
    assert ids(draws) == [every[r] for r in window.rows(0, len(draws)).tolist()]
    assert len(set(ids(draws))) < len(draws)  # with replacement, as dataset-rt


def three_streams(paths):
    """Streams of 1, 30 and 7+13+9 rows: very different sizes."""
    return Mixture(
        {"small": 0.2, "big": 0.5, "rest": 0.3},
        {
            "small": Stream.by_cache(paths[2]),
            "big": Stream.by_cache(paths[3]),
            "rest": Stream.by_cache(paths[0], paths[1], paths[4]),
        },
    )


def test_mixture_reads_the_plan_with_exact_proportions(write_caches):
    paths = write_caches(SIZES)
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=5))
    mix = three_streams(paths)
    ds.set_mixture(mix)
    assert ds.mixture == mix and ds.order_identity().startswith("mixture:")
    assert len(ds) == sum(SIZES.values())
    every = table_ids(ds)
    got = list(itertools.chain.from_iterable(ids(ds) for _ in range(20)))
    n = len(got)
    cache_ids = ds.get_metadata()["cache_id"].unique(maintain_order=True).to_list()  # path order
    column = np.array([c for c, _ in every], dtype=np.uint64)
    rows = {
        name: np.flatnonzero(np.isin(column, [cache_ids[k] for k in ks]))
        for name, ks in (("small", [2]), ("big", [3]), ("rest", [0, 1, 4]))
    }
    plan = MixturePlan(mix, StreamRows(rows), seed=5)
    assert got == [every[r] for r in plan.rows(0, n).tolist()]
    stream_of = {key: name for name, r in rows.items() for key in (every[i] for i in r)}
    picks = [stream_of[key] for key in got]
    for name, w in zip(mix.names, mix.weights):  # within 1 sample of n x p at every prefix
        delivered = np.cumsum([p == name for p in picks])
        assert np.abs(delivered * mix.period - np.arange(1, n + 1) * w).max() < mix.period
        assert delivered[-1] == plan.progress(n)[mix.names.index(name)].samples
    big = [key for key, p in zip(got, picks) if p == "big"]
    for e in range(len(big) // 30):  # each row of a stream once per stream epoch
        assert sorted(big[30 * e : 30 * (e + 1)]) == sorted(every[i] for i in rows["big"])
    assert batch_ids(ds.iter_batches(16)) == [every[r] for r in plan.rows(n, len(ds)).tolist()]


def test_mixture_by_column_survives_update_metadata_and_can_be_removed(write_caches):
    paths = write_caches({"a": 40, "b": 25})
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=9, sampling="permutation"))
    mix = Mixture.by_column("label", {"a-0": "1/2", "b-1": "1/2"})
    ds.set_mixture(mix)
    assert {s.metadata["label"] for s in ds} == {"a-0", "b-1"}
    table = ds.get_metadata()
    ds.update_metadata(table.filter(pl.col("index") < 30))  # regrouped from the new table
    assert ds.mixture == mix
    got = list(ds)
    assert (
        all(s.metadata["index"] < 30 for s in got)
        and len(got) == table.filter((pl.col("index") < 30) & pl.col("label").is_in(["a-0", "b-1"])).height
    )
    current = ds.get_metadata()
    with pytest.raises(EmptyStreamError, match="'a-0'"):
        ds.update_metadata(current.filter(pl.col("label") != "a-0"))
    assert ds.get_metadata() is current and ds.mixture == mix  # nothing changed
    with pytest.raises(UnknownStreamError, match="no column 'nope'"):
        ds.set_mixture(Mixture.by_column("nope", {"x": 1}))
    assert ds.mixture == mix
    ds.set_mixture(None)
    assert ds.mixture is None and len(ds) == current.height
    assert sorted(ids(ds)) == sorted(table_ids(ds))  # the reader config's order again: exactly once
    ordered = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=9, shuffle=False))
    with pytest.raises(ConfigError, match="shuffle=True"):
        ordered.set_mixture(mix)


def test_a_stopping_mixture_ends_the_iterators(write_caches):
    paths = write_caches({"a": 4, "b": 50})
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1))
    ds.set_mixture(Mixture.by_cache({str(paths[0]): 0.5, str(paths[1]): 0.5}, on_exhausted="stop"))
    assert len(ds) == 8  # the 5th sample of "a" would be position 8
    first = ids(ds)
    a = ds.get_metadata()["cache_id"][0]
    assert len(first) == 8 and sorted(k for k in first if k[0] == a) == [(a, i) for i in range(4)]
    assert ids(ds) == [] and list(ds.iter_batches(3)) == []


def test_resume_from_a_cursor_state_continues_the_plan(write_caches):
    paths = write_caches(SIZES)
    run = permutation_ds(paths, seed=4)
    run.set_mixture(three_streams(paths))
    expected = [ids(run) for _ in range(4)]
    first = permutation_ds(paths, seed=4)
    first.set_mixture(three_streams(paths))
    assert [ids(first) for _ in range(2)] == expected[:2]
    saved = first.cursor_state().as_dict()
    resumed = permutation_ds(paths, seed=4)
    resumed.set_mixture(three_streams(paths))
    resumed.restore_cursor_state(resumed.cursor_state_from(saved))
    assert [ids(resumed) for _ in range(2)] == expected[2:]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reader_workers_read_the_same_order(write_caches, start_method):
    paths = write_caches(SIZES)
    local = permutation_ds(paths, seed=21)
    local_mixed = permutation_ds(paths, seed=21)
    local_mixed.set_mixture(three_streams(paths))
    with drt.DatasetRuntime(num_workers=2, start_method=start_method) as rt:
        assert len(rt.start_workers()) == 2  # the workers read, not the head start
        parallel = permutation_ds(paths, seed=21, runtime=rt, prefetch_size=4)
        mixed = permutation_ds(paths, seed=21, runtime=rt, prefetch_size=4)
        mixed.set_mixture(three_streams(paths))
        for _ in range(2):
            assert ids(parallel) == ids(local)
            assert ids(mixed) == ids(local_mixed)
            assert batch_ids(parallel.iter_batches(5)) == batch_ids(local.iter_batches(5))
            assert batch_ids(mixed.iter_batches(5)) == batch_ids(local_mixed.iter_batches(5))


def curriculum(paths) -> Curriculum:
    streams = {
        "small": Stream.by_cache(paths[2]),
        "big": Stream.by_cache(paths[3]),
        "rest": Stream.by_cache(paths[0], paths[1], paths[4]),
    }
    return Curriculum(
        [
            Stage(Mixture({"small": 1}, streams), batches=3, name="warmup"),
            Stage(Mixture({"big": 0.5, "rest": 0.5}, streams), samples=40, name="main"),
            Stage(Mixture({"rest": 1}, streams), name="anneal"),
        ],
        batch_size=4,
    )


def test_curriculum_stages_change_at_their_sample_counts(write_caches):
    paths = write_caches(SIZES)
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=8))
    cur = curriculum(paths)
    ds.set_curriculum(cur)
    assert ds.curriculum is cur and ds.mixture is None and ds.order_identity().startswith("curriculum:")
    every = table_ids(ds)
    got = ids(ds) + batch_ids(ds.iter_batches(4))  # two windows of len(ds) = 60: all three stages
    cache_ids = ds.get_metadata()["cache_id"].unique(maintain_order=True).to_list()
    column = np.array([c for c, _ in every], dtype=np.uint64)
    rows = {
        name: np.flatnonzero(np.isin(column, [cache_ids[k] for k in ks]))
        for name, ks in (("small", [2]), ("big", [3]), ("rest", [0, 1, 4]))
    }
    plan = CurriculumPlan(cur, StreamRows(rows), seed=8)
    assert len(got) == 2 * len(ds) == 120
    assert got == [every[r] for r in plan.rows(0, len(got)).tolist()]
    assert set(got[:12]) == {every[int(rows["small"][0])]}  # warmup: 3 batches of the 1-row stream
    assert set(got[52:]) <= {every[i] for i in rows["rest"]}  # anneal from sample 12 + 40 on
    ds.set_mixture(three_streams(paths))  # replaces the curriculum
    assert ds.curriculum is None and ds.mixture is not None
    with pytest.raises(drt.errors.ArgumentTypeError, match="set_curriculum expects"):
        ds.set_curriculum(three_streams(paths))


def test_curriculum_reads_the_same_with_workers_and_after_a_resume(write_caches):
    paths = write_caches(SIZES)
    local = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=8))
    local.set_curriculum(curriculum(paths))
    expected = [ids(local) for _ in range(3)]
    with drt.DatasetRuntime(num_workers=2, start_method="fork") as rt:
        rt.start_workers()
        parallel = rt.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=8, prefetch_size=4))
        parallel.set_curriculum(curriculum(paths))
        assert ids(parallel) == expected[0]
        saved = parallel.cursor_state().as_dict()
        assert batch_ids(parallel.iter_batches(4)) == expected[1]
    resumed = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=8))
    resumed.set_curriculum(curriculum(paths))
    resumed.restore_cursor_state(resumed.cursor_state_from(saved))
    assert [ids(resumed) for _ in range(2)] == expected[1:]
