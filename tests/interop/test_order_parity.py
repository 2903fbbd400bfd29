"""Same seed, same operations -> same sample stream on dataset-rt 0.4.8 and datasetrt.

Every test runs one script of dataset operations (update_metadata, set_epoch_len, successive,
abandoned and interleaved iterators) against both libraries over the same two caches and compares
the full sample keys (payload, metadata, cache_id, sample_id) of everything read.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.interop._interop import (
    LIBS,
    assert_frames_identical,
    identities,
    open_ds,
    plain_items,
    sample_key,
    take,
    write,
)

pytestmark = pytest.mark.interop

SPEC = {"c0": plain_items(23, "c0"), "c1": plain_items(17, "c1")}
SEEDS = [0, 9, 2**64 - 1, 12345678901234567]


def _nonuniform(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(weight=((pl.col("index") % 4 + 1) ** 2).cast(pl.Float64) * 0.5 + pl.col("score"))


TRANSFORMS = {
    "ones": lambda df: df,
    "weights": _nonuniform,
    "filtered": lambda df: _nonuniform(df).filter(pl.col("kept")),
    "duplicated": lambda df: pl.concat([_nonuniform(df), _nonuniform(df).filter(pl.col("index") % 5 == 0)]),
    "mixed": lambda df: pl.concat([df.filter(~pl.col("kept")), _nonuniform(df).reverse(), df.head(3)]),
    "tiny_weights": lambda df: df.with_columns(
        weight=pl.when(pl.col("index") % 2 == 0).then(5e-324).otherwise(pl.col("score") + 1e-3)
    ),
    "narrow_dtypes": lambda df: _nonuniform(df).with_columns(
        pl.col("cache_id").cast(pl.Int64), pl.col("sample_id").cast(pl.UInt32), pl.col("weight").cast(pl.Float32)
    ),
}


@pytest.fixture(scope="module")
def cache_paths(runtimes, tmp_path_factory):
    return write(runtimes["rt"], LIBS["rt"], SPEC, tmp_path_factory.mktemp("order"))


@pytest.fixture(params=["forward", "reverse"])
def paths(request, cache_paths):
    return cache_paths if request.param == "forward" else list(reversed(cache_paths))


def _pair(runtimes, paths, **reader_kw):
    return {label: open_ds(runtimes[label], lib, paths, **reader_kw) for label, lib in LIBS.items()}


def _run(runtimes, paths, script, **reader_kw):
    """Run `script(ds) -> list` on both libraries; assert equal results; return one of them."""
    results = {label: script(ds) for label, ds in _pair(runtimes, paths, **reader_kw).items()}
    assert results["drt"] == results["rt"]
    return results["rt"]


def _windows(ds, lengths):
    """For each length: set it (None keeps the current) and read one full iterator."""
    out = []
    for n in lengths:
        if n is not None:
            ds.set_epoch_len(n)
        out.append((len(ds), take(ds)))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_physical_population_shuffled(runtimes, paths, seed):
    got = _run(runtimes, paths, lambda ds: _windows(ds, [None, 5, None, 57, 1]), seed=seed)
    assert [n for n, _ in got] == [40, 5, 5, 57, 1]


def test_physical_population_ordered(runtimes, paths):
    got = _run(runtimes, paths, lambda ds: _windows(ds, [None, 7, None, 63, 40]), shuffle=False)
    assert [len(keys) for _, keys in got] == [40, 7, 7, 63, 40]


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_update_metadata_shuffled(runtimes, paths, transform, seed):
    def script(ds):
        df = TRANSFORMS[transform](ds.get_metadata())
        ds.update_metadata(df)
        return [len(ds)] + _windows(ds, [None, None, 6, None, None, 101])

    got = _run(runtimes, paths, script, seed=seed)
    assert got[1][0] == got[0]  # len() became the new row count


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_update_metadata_ordered(runtimes, paths, transform):
    def script(ds):
        df = TRANSFORMS[transform](ds.get_metadata())
        ds.update_metadata(df)
        return [len(ds)] + _windows(ds, [None, 4, None, None, 9, 1])

    _run(runtimes, paths, script, shuffle=False)


@pytest.mark.parametrize("shuffle", [False, True])
def test_update_resets_cursors_and_epoch_len(runtimes, paths, shuffle):
    def script(ds):
        ds.set_epoch_len(11)
        first = take(ds, iterators=2)
        ds.update_metadata(TRANSFORMS["duplicated"](ds.get_metadata()))
        after = (len(ds), take(ds, iterators=2))
        ds.update_metadata(
            TRANSFORMS["filtered"](ds.get_metadata().unique(["cache_id", "sample_id"], maintain_order=True))
        )
        return [first, after, len(ds), take(ds, iterators=2)]

    _run(runtimes, paths, script, shuffle=shuffle, seed=4)


@pytest.mark.parametrize("shuffle", [False, True])
def test_unstarted_and_abandoned_iterators(runtimes, paths, shuffle):
    """iter() reserves nothing; an iterator abandoned after one next() consumes its whole window."""

    def script(ds):
        ds.update_metadata(TRANSFORMS["weights"](ds.get_metadata()))
        ds.set_epoch_len(6)
        unstarted = iter(ds)
        abandoned = iter(ds)
        head = sample_key(next(abandoned))
        del abandoned
        rest = take(ds, iterators=2)
        late = [sample_key(s) for s in unstarted]  # reserves its window only now
        return [head, rest, late, take(ds)]

    _run(runtimes, paths, script, shuffle=shuffle, seed=77)


@pytest.mark.parametrize("shuffle", [False, True])
def test_interleaved_iterators(runtimes, paths, shuffle):
    def script(ds):
        ds.set_epoch_len(9)
        a, b = iter(ds), iter(ds)
        out = [sample_key(next(b)), sample_key(next(a))]
        out += [sample_key(x) for pair in zip(a, b) for x in pair]
        return out + take(ds)

    _run(runtimes, paths, script, shuffle=shuffle, seed=3)


def test_set_epoch_len_applies_to_unstarted_iterator(runtimes, paths):
    def script(ds):
        it = iter(ds)
        ds.set_epoch_len(3)
        return [sample_key(s) for s in it] + take(ds)

    got = _run(runtimes, paths, script, seed=8)
    assert len(got) == 6


@pytest.mark.parametrize("transform", ["mixed", "narrow_dtypes"])
def test_get_metadata_returns_supplied_frame(runtimes, paths, transform):
    pair = _pair(runtimes, paths, seed=1)
    assert_frames_identical(pair["drt"].get_metadata(), pair["rt"].get_metadata())
    df = TRANSFORMS[transform](pair["rt"].get_metadata())
    for ds in pair.values():
        ds.update_metadata(df)
    assert_frames_identical(pair["drt"].get_metadata(), df)
    assert_frames_identical(pair["rt"].get_metadata(), df)


@pytest.fixture(scope="module")
def wide_paths(runtimes, tmp_path_factory):
    items = [(b"", {"k": i}) for i in range(3000)]
    return write(runtimes["drt"], LIBS["drt"], {"wide": items, "tail": items[:5]}, tmp_path_factory.mktemp("wide"))


@pytest.mark.parametrize("weights", ["log_uniform", "subnormal", "integers"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_large_population_with_spread_weights(runtimes, wide_paths, weights, shuffle):
    """3005 rows, windows of 1000 (crossing read-block boundaries), weights over 400 decades."""
    rng = np.random.default_rng(1)
    w = {
        "log_uniform": 10.0 ** rng.uniform(-200, 200, 3005),
        "subnormal": rng.uniform(0, 1, 3005) * 1e-300 + 5e-324,
        "integers": rng.integers(1, 5, 3005),
    }[weights]

    def script(ds):
        ds.update_metadata(ds.get_metadata().with_columns(weight=pl.Series(w)))
        ds.set_epoch_len(1000)
        return identities(take(ds, iterators=3))

    _run(runtimes, wide_paths, script, shuffle=shuffle, seed=99)
