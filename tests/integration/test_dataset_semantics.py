"""CachedDataset iteration semantics (reference §2.2, §2.3, §2.4 effects) on small real caches.

Rows are named by their physical index (caches in path order, samples in sample_id order) so
that the expectations read like the reference; shuffled expectations come from rng048.
"""

import polars as pl
import pytest

import datasetrt as drt
from tests.conftest import sample_items
from tests.reference import rng048 as ref


class Rows:
    """Maps samples to physical indexes for one dataset (taken before any update)."""

    def __init__(self, ds):
        frame = ds.get_metadata()
        self.keys = list(zip(frame["cache_id"].to_list(), frame["sample_id"].to_list()))
        self.index = {k: i for i, k in enumerate(self.keys)}

    def __call__(self, samples):
        return [self.index[(s.cache_id, s.sample_id)] for s in samples]


@pytest.fixture
def five(write_caches):
    return write_caches({"five": 5})


@pytest.fixture
def two(write_caches):
    return write_caches({"left": 3, "right": 4})


# -- ordered (§2.2) -------------------------------------------------------------------------------


def test_ordered_windows_walk_cyclically(five, open_ds):
    ds = open_ds(five)
    rows = Rows(ds)
    assert len(ds) == 5 and rows(ds) == [0, 1, 2, 3, 4]
    ds.set_epoch_len(2)
    assert [rows(ds) for _ in range(3)] == [[0, 1], [2, 3], [4, 0]]
    assert rows(ds) == [1, 2]


def test_ordered_epoch_len_longer_than_population_wraps(five, open_ds):
    ds = open_ds(five)
    rows = Rows(ds)
    ds.set_epoch_len(7)
    assert len(ds) == 7
    assert rows(ds) == [0, 1, 2, 3, 4, 0, 1]
    assert rows(ds) == [2, 3, 4, 0, 1, 2, 3]  # cursor advanced by 7 mod 5


def test_samples_carry_their_payload_and_metadata(five, open_ds):
    ds = open_ds(five)
    samples = list(ds)
    assert [s.sample_id for s in samples] == [0, 1, 2, 3, 4]
    items = sample_items(5, seed=0, tag="five")
    assert [(s.data, s.metadata) for s in samples] == items
    assert samples[3].metadata == {"index": 3, "kept": False, "label": "five-3", "score": 0.75}
    assert samples[3] == ds.get_item(samples[3].cache_id, 3)
    assert isinstance(samples[0], drt.CachedSample) and isinstance(samples[0].data, bytes)


def test_ordered_duplicates_emitted_once_per_row(five, open_ds):
    ds = open_ds(five)
    rows = Rows(ds)
    md = ds.get_metadata()
    ds.update_metadata(
        pl.concat([md[[3]], md[[1]], md[[3]], md[[3]]]).with_columns(pl.Series("weight", [1.0, 9.0, 0.1, 5.0]))
    )
    assert len(ds) == 4 and rows(ds) == [3, 1, 3, 3]


def test_multi_cache_physical_order_follows_paths(two, open_ds):
    forward, backward = open_ds(two), open_ds(two[::-1])
    f, b = Rows(forward), Rows(backward)
    assert [s.sample_id for s in forward] == [0, 1, 2, 0, 1, 2, 3]
    assert [k[0] for k in f.keys] == [f.keys[0][0]] * 3 + [f.keys[3][0]] * 4
    assert b.keys == f.keys[3:] + f.keys[:3]
    assert [(s.cache_id, s.sample_id) for s in backward] == b.keys


# -- shuffled (§2.2) ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_shuffled_uniform_path_before_any_update(two, seed, open_ds):
    ds = open_ds(two, seed=seed, shuffle=True)
    rows = Rows(ds)
    assert rows(ds) == ref.uniform_draws(seed, 7, 0, 7)
    assert rows(ds) == ref.uniform_draws(seed, 7, 7, 7)


def test_three_windows_of_two_equal_one_window_of_six(five, open_ds):
    a, b = open_ds(five, seed=3, shuffle=True), open_ds(five, seed=3, shuffle=True)
    rows = Rows(a)
    a.set_epoch_len(2)
    b.set_epoch_len(6)
    assert rows(a) + rows(a) + rows(a) == rows(b) == ref.uniform_draws(3, 5, 0, 6)


def test_fresh_dataset_restarts_at_draw_zero(five, open_ds):
    first = open_ds(five, seed=11, shuffle=True)
    rows = Rows(first)
    assert rows(first) == ref.uniform_draws(11, 5, 0, 5)
    assert rows(first) == ref.uniform_draws(11, 5, 5, 5)
    assert rows(open_ds(five, seed=11, shuffle=True)) == ref.uniform_draws(11, 5, 0, 5)


def test_weighted_path_after_update_even_with_all_ones(five, open_ds):
    ds = open_ds(five, seed=7, shuffle=True)
    rows = Rows(ds)
    ds.update_metadata(ds.get_metadata())  # weights all 1.0: still the weighted path
    got = rows(ds)
    assert got == ref.weighted_draws(7, [1.0] * 5, 0, 5)
    assert got != ref.uniform_draws(7, 5, 0, 5)


def test_weighted_draws_over_active_rows(two, open_ds):
    ds = open_ds(two, seed=5, shuffle=True)
    rows = Rows(ds)
    md = ds.get_metadata()
    picks = [6, 0, 6, 2]  # a subset with a duplicate, in a new order
    weights = [0.5, 3.0, 1.0, 2.5]
    ds.update_metadata(md[picks].with_columns(pl.Series("weight", weights)))
    ds.set_epoch_len(12)
    assert rows(ds) == [picks[r] for r in ref.weighted_draws(5, weights, 0, 12)]
    assert rows(ds) == [picks[r] for r in ref.weighted_draws(5, weights, 12, 12)]


# -- reservation at the first next() --------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_iter_without_next_reserves_nothing(five, shuffle, open_ds):
    ds = open_ds(five, seed=2, shuffle=shuffle)
    rows = Rows(ds)
    ds.set_epoch_len(2)
    lazy = iter(ds)
    unused = iter(ds)
    expected = [[0, 1], [2, 3]] if not shuffle else [ref.uniform_draws(2, 5, 0, 2), ref.uniform_draws(2, 5, 2, 2)]
    assert rows(iter(ds)) == expected[0]
    assert rows(lazy) == expected[1]  # reserved only now, after the first window
    del unused


@pytest.mark.parametrize("shuffle", [False, True])
def test_abandoned_iterator_consumes_its_whole_window(five, shuffle, open_ds):
    ds = open_ds(five, seed=4, shuffle=shuffle)
    rows = Rows(ds)
    ds.set_epoch_len(3)
    it = iter(ds)
    next(it)
    it.close()
    expected = [3, 4, 0] if not shuffle else ref.uniform_draws(4, 5, 3, 3)
    assert rows(ds) == expected


def test_iterator_created_before_set_epoch_len_uses_new_length(five, open_ds):
    ds = open_ds(five)
    rows = Rows(ds)
    it = iter(ds)
    ds.set_epoch_len(1)
    assert rows(it) == [0]
    assert rows(ds) == [1]


def test_started_iterator_keeps_its_length(five, open_ds):
    ds = open_ds(five)
    rows = Rows(ds)
    ds.set_epoch_len(4)
    it = iter(ds)
    first = next(it)
    ds.set_epoch_len(1)
    assert rows([first, *it]) == [0, 1, 2, 3]
    assert rows(ds) == [4]


def test_concurrent_iterators_interleave_independently(five, open_ds):
    ds = open_ds(five, seed=9, shuffle=True)
    rows = Rows(ds)
    ds.set_epoch_len(4)
    a, b = iter(ds), iter(ds)
    got_a, got_b = [next(a)], [next(b)]  # a reserves draws 0..3, b draws 4..7
    for x, y in zip(a, b):
        got_a.append(x)
        got_b.append(y)
    assert rows(got_a) == ref.uniform_draws(9, 5, 0, 4)
    assert rows(got_b) == ref.uniform_draws(9, 5, 4, 4)


# -- update_metadata effects (§2.4) ---------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_started_iterator_keeps_snapshot_across_update(five, shuffle, open_ds):
    ds = open_ds(five, seed=1, shuffle=shuffle)
    rows = Rows(ds)
    ds.set_epoch_len(8)
    it = iter(ds)
    head = next(it)
    ds.update_metadata(ds.get_metadata().head(2))
    old = rows([head, *it])
    assert old == ([0, 1, 2, 3, 4, 0, 1, 2] if not shuffle else ref.uniform_draws(1, 5, 0, 8))
    assert len(ds) == 2


def test_update_resets_len_and_cursor(five, open_ds):
    ds = open_ds(five)
    rows = Rows(ds)
    ds.set_epoch_len(3)
    assert rows(ds) == [0, 1, 2]
    md = ds.get_metadata()
    ds.update_metadata(md[[4, 2, 0]])
    assert len(ds) == 3  # the row count, replacing set_epoch_len
    assert rows(ds) == [4, 2, 0]  # cursor back at row 0 of the new table
    ds.set_epoch_len(2)
    assert rows(ds) + rows(ds) == [4, 2, 0, 4]


def test_update_resets_draw_offset(five, open_ds):
    ds = open_ds(five, seed=6, shuffle=True)
    rows = Rows(ds)
    ds.set_epoch_len(3)
    assert rows(ds) == ref.uniform_draws(6, 5, 0, 3)
    ds.update_metadata(ds.get_metadata().with_columns(pl.Series("weight", [1.0, 2.0, 3.0, 4.0, 5.0])))
    assert len(ds) == 5
    assert rows(ds) == ref.weighted_draws(6, [1.0, 2.0, 3.0, 4.0, 5.0], 0, 5)


def test_removed_rows_are_never_drawn(two, open_ds):
    ds = open_ds(two, seed=8, shuffle=True)
    rows = Rows(ds)
    md = ds.get_metadata()
    ds.update_metadata(md.filter(pl.col("kept")))
    ds.set_epoch_len(40)
    kept = {i for i, k in enumerate(md["kept"].to_list()) if k}
    assert set(rows(ds)) <= kept


# -- same order as the real dataset-rt 0.4.8 ------------------------------------------------------


def _order(ds, windows):
    out = []
    for n in windows:
        ds.set_epoch_len(n)
        out.append([(s.cache_id, s.sample_id) for s in ds])
    return out


@pytest.mark.interop
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("seed", [0, 7, 2**63 + 11])
def test_same_sample_order_as_dataset_rt(write_caches, shuffle, seed, open_ds):
    real = pytest.importorskip("dataset_rt")
    paths = write_caches({"alpha": 6, "beta": 5, "gamma": 1})
    ours = open_ds(paths, seed=seed, shuffle=shuffle)
    theirs = real.DatasetRuntime(num_workers=1).cached_dataset(
        paths, reader_config=real.ReaderConfig(seed=seed, shuffle=shuffle)
    )
    assert ours.get_metadata().equals(theirs.get_metadata())
    assert _order(ours, [12, 5, 3]) == _order(theirs, [12, 5, 3])
    md = theirs.get_metadata()
    update = pl.concat([md.filter(pl.col("kept")), md[[0, 0, 11]]]).with_columns(
        (pl.int_range(pl.len()) % 4 + 0.5).alias("weight"), pl.lit("x").alias("extra")
    )
    ours.update_metadata(update)
    theirs.update_metadata(update)
    assert len(ours) == len(theirs) == update.height
    assert [(s.cache_id, s.sample_id) for s in ours] == [(s.cache_id, s.sample_id) for s in theirs]
    assert _order(ours, [7, 20]) == _order(theirs, [7, 20])


def test_rejected_update_keeps_the_uniform_path(five, open_ds):
    ds = open_ds(five, seed=12, shuffle=True)
    rows = Rows(ds)
    with pytest.raises(
        ValueError,
        match=r"^weight 0 must be positive and finite: row 0 \(cache_id=\d+, sample_id=0\) "
        r"has weight 0\.0; 4 more rows too$",
    ):
        ds.update_metadata(ds.get_metadata().with_columns(pl.lit(0.0).alias("weight")))
    assert rows(ds) == ref.uniform_draws(12, 5, 0, 5)
