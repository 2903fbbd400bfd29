"""datasetrt.table.streams: grouping a real dataset's active table into streams (by cache, by column
value), the typed refusals (unknown column/cache, mismatched values, empty and overlapping streams),
and a mixture planned over the grouped rows reading the samples it names."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.errors import EmptyStreamError, SamplingConfigError, UnknownStreamError
from datasetrt.sampling import Mixture, MixturePlan, Stream
from datasetrt.table.streams import group_streams


@pytest.fixture
def dataset(write_caches):
    paths = write_caches({"alpha": 30, "beta": 12})
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=3))
    frame = ds.get_metadata()
    caches = dict(zip(map(str, paths), frame.get_column("cache_id").unique(maintain_order=True).to_list()))
    return ds, paths, caches


def test_streams_by_cache_and_by_column_on_the_physical_table(dataset):
    ds, paths, caches = dataset
    frame = ds.get_metadata()
    streams = {
        "beta": Stream.by_cache(paths[1]),
        "zeros": Stream.by_column("label", "alpha-0"),
        "ones": Stream.by_column("label", "alpha-1", "alpha-2"),
    }
    got = group_streams(frame, streams, caches)
    assert got.names == ("beta", "zeros", "ones")
    assert got.rows["beta"].tolist() == list(range(30, 42))
    assert got.rows["zeros"].tolist() == list(range(0, 30, 5))
    assert got.rows["ones"].tolist() == sorted([*range(1, 30, 5), *range(2, 30, 5)])
    assert all(np.array_equal(w, np.ones(len(got.rows[n]))) for n, w in got.weights.items())
    by_id = group_streams(frame, {"beta": Stream.by_cache(caches[str(paths[1])])}, caches)
    assert np.array_equal(by_id.rows["beta"], got.rows["beta"])


def test_a_mixture_over_a_reweighted_table_reads_its_streams(dataset):
    ds, paths, caches = dataset
    table = ds.get_metadata()
    active = pl.concat([table.filter(pl.col("index") < 10), table.filter(pl.col("index") < 2)])  # duplicates
    active = active.with_columns(weight=pl.when(pl.col("kept")).then(2.0).otherwise(1.0))
    ds.update_metadata(active)
    frame = ds.get_metadata()
    mix = Mixture.by_cache({str(paths[0]): 0.75, str(paths[1]): 0.25})
    rows = group_streams(frame, mix.streams, caches)
    plan = MixturePlan(mix, rows, 11)
    epoch_a = int(frame.filter(pl.col("cache_id") == caches[str(paths[0])]).get_column("weight").sum())
    positions = plan.rows(0, 4 * epoch_a)
    picks = plan.streams_at(0, 4 * epoch_a)
    alpha = positions[picks == 0][:epoch_a]
    expected = np.repeat(rows.rows[str(paths[0])], rows.weights[str(paths[0])].astype(np.int64))
    assert np.array_equal(np.sort(alpha), np.sort(expected))  # once per repeat count per epoch
    sample_ids = frame.get_column("sample_id").to_numpy()
    cache_ids = frame.get_column("cache_id").to_numpy()
    for row, stream in zip(positions[:20].tolist(), picks[:20].tolist()):
        sample = ds.get_item(int(cache_ids[row]), int(sample_ids[row]))
        assert sample.metadata["label"].startswith(("alpha", "beta")[stream])


@pytest.mark.parametrize(
    "streams, error, match",
    [
        ({"x": Stream.by_column("colour", "red")}, UnknownStreamError, r"stream 'x': the table has no column 'colour'"),
        ({"x": Stream.by_column("label", 3)}, SamplingConfigError, r"values \[3\] do not match column 'label'"),
        ({"x": Stream.by_column("index", "3")}, SamplingConfigError, "do not match column 'index'"),
        ({"x": Stream.by_column("kept", 1)}, SamplingConfigError, "do not match column 'kept'"),
        ({"x": Stream.by_cache("/no/such/cache")}, UnknownStreamError, r"cache '/no/such/cache' is not one of"),
        ({"x": Stream.by_cache(987654321)}, UnknownStreamError, "cache_id 987654321 is not one of"),
        (
            {"x": Stream.by_column("label", "gamma-0")},
            EmptyStreamError,
            r"stream 'x' \(label in \['gamma-0'\]\) selects no",
        ),
        (
            {"x": Stream.by_column("index", 4), "y": Stream.by_column("label", "alpha-4")},
            SamplingConfigError,
            r"table row 4 belongs to streams 'x' and 'y'",
        ),
    ],
)
def test_bad_streams_are_refused_and_the_dataset_stays_usable(dataset, streams, error, match):
    ds, _paths, caches = dataset
    with pytest.raises(error, match=match):
        group_streams(ds.get_metadata(), streams, caches)
    assert len(list(itertools.islice(iter(ds), 5))) == 5


def test_float_and_integer_columns_group_by_value(dataset):
    ds, _paths, caches = dataset
    got = group_streams(
        ds.get_metadata(), {"low": Stream.by_column("score", 0.25, 1), "seven": Stream.by_column("index", 7)}, caches
    )
    # alpha's score is index * 0.25, beta's 1 + index * 0.25 (rows 30..41)
    assert got.rows["low"].tolist() == [1, 4, 30] and got.rows["seven"].tolist() == [7, 37]
