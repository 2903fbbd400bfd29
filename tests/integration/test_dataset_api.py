"""The public API surface and its errors (reference §1.1, §1.4, §1.5, §2.4 at dataset level)."""

import pickle

import polars as pl
import pytest

import datasetrt as drt
import datasetrt.api as api
from datasetrt.errors import MetadataValidationError
from tests.conftest import QUIET, ListSource

DATASET_RT_ALL = [
    "CacheInput",
    "CacheSource",
    "CacheSourcesDatasetError",
    "CacheSourcesDatasetResult",
    "CacheSourcesDatasetSuccess",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "CachedDataset",
    "CachedSample",
    "DatasetRuntime",
    "ReaderConfig",
    "ShardCompression",
    "SizedTorchIterableDataset",
    "WriterConfig",
    "WriterProfilerConfig",
    "AbsentManifestTarget",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Ok",
    "Result",
]


@pytest.fixture
def two(write_caches):
    return write_caches({"left": 5, "right": 4})


@pytest.fixture
def ds(two, open_ds):
    return open_ds(two)


def ids(ds):
    md = ds.get_metadata()
    return md["cache_id"][0], md["cache_id"][5]


# -- exports (§1.1) -------------------------------------------------------------------------------


def test_public_names():
    try:
        import dataset_rt as real
    except ImportError:
        real = None
    if real is not None:
        assert real.__all__ == DATASET_RT_ALL
    for name in DATASET_RT_ALL:
        obj = getattr(drt, name)
        assert getattr(api, name) is obj
        if isinstance(obj, type):
            assert obj.__module__ == "datasetrt.api", name
    assert set(DATASET_RT_ALL) <= set(drt.__all__) and set(DATASET_RT_ALL) <= set(api.__all__)


# -- DatasetRuntime (§1.4) ------------------------------------------------------------------------


def test_runtime_num_workers():
    assert drt.DatasetRuntime(num_workers=3).num_workers == 3
    assert drt.DatasetRuntime(num_workers=True).num_workers == 1
    with pytest.raises(ValueError, match="^num_workers must be greater than zero$"):
        drt.DatasetRuntime(num_workers=0)
    with pytest.raises(OverflowError):
        drt.DatasetRuntime(num_workers=-1)
    with pytest.raises(TypeError):
        drt.DatasetRuntime(num_workers=1.5)
    with pytest.raises(TypeError):
        drt.DatasetRuntime(2)
    with pytest.raises(TypeError):
        drt.DatasetRuntime()


def test_runtime_not_picklable():
    with pytest.raises(TypeError, match="cannot pickle 'DatasetRuntime' object"):
        pickle.dumps(drt.DatasetRuntime(num_workers=1))


# -- construction (§1.5, §2.6) --------------------------------------------------------------------


@pytest.mark.parametrize("as_", [str, bytes, lambda p: p], ids=["str", "bytes", "Path"])
def test_a_single_path_is_a_type_error(two, runtime, as_):
    """Documented (python-api.md): `paths` is a sequence; one str/Path (a real cache here, so
    iterating its characters or failing to iterate would be the only other outcomes) is refused
    with TypeError before anything is opened."""
    single = as_(two[0]) if as_ is not bytes else bytes(two[0])
    for make in (
        lambda: runtime.cached_dataset(single, reader_config=drt.ReaderConfig(seed=1)),
        lambda: drt.CachedDataset(single, reader_config=drt.ReaderConfig(seed=1)),
    ):
        with pytest.raises(TypeError, match="^paths must be a sequence of cache directories, not a single path$"):
            make()


def test_empty_paths(runtime):
    with pytest.raises(ValueError, match="^CachedDataset requires at least one cache path$"):
        runtime.cached_dataset([], reader_config=drt.ReaderConfig(seed=1))


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_outside_u64(two, runtime, seed):
    with pytest.raises(OverflowError):
        runtime.cached_dataset(two, reader_config=drt.ReaderConfig(seed=seed))


def test_seed_u64_bounds_accepted(two, runtime):
    for seed in (0, 2**64 - 1):
        assert len(runtime.cached_dataset(two, reader_config=drt.ReaderConfig(seed=seed))) == 9


def test_different_schemas(two, runtime, tmp_path):
    other = runtime.write_cache(ListSource("other", [(b"x", {"index": 1})]), tmp_path / "o", writer_config=QUIET)[
        0
    ].path
    with pytest.raises(ValueError, match="^all caches must share the same metadata schema"):
        runtime.cached_dataset([two[0], other], reader_config=drt.ReaderConfig(seed=1))


def test_same_cache_twice(two, runtime):
    with pytest.raises(ValueError, match="^duplicate cache_id "):
        runtime.cached_dataset([two[0], two[1], two[0]], reader_config=drt.ReaderConfig(seed=1))


def test_direct_construction(two):
    ds = drt.CachedDataset([two[0], two[1]], reader_config=drt.ReaderConfig(seed=3), runtime=None)
    assert len(ds) == 9 and ds.cache_paths == list(two)
    assert ds.reader_config.seed == 3
    assert len(list(ds)) == 9


def test_dataset_not_picklable(ds):
    with pytest.raises(TypeError):
        pickle.dumps(ds)


# -- get_item (§1.5) ------------------------------------------------------------------------------


def test_get_item_type_errors(ds):
    left, _ = ids(ds)
    for args in [(True, 0), (left, True), (left, 1.0), (float(left), 0), ("1", 0), (left, None)]:
        with pytest.raises(TypeError, match="^cache_id and sample_id must be integers$"):
            ds.get_item(*args)


def test_get_item_range_errors(ds):
    left, right = ids(ds)
    cases = [
        ((12345, 0), "cache_id 12345 is out of range"),
        ((-1, 0), "cache_id -1 is out of range"),
        ((2**64, 0), f"cache_id {2**64} is out of range"),
        ((-1, 2**64), "cache_id -1 is out of range"),
        ((left, 5), f"sample_id 5 is out of range for cache_id {left}"),
        ((right, 4), f"sample_id 4 is out of range for cache_id {right}"),
        ((left, -1), "sample_id -1 is out of range"),
        ((left, 2**64), f"sample_id {2**64} is out of range"),
        ((right, 2**64 - 1), f"sample_id {2**64 - 1} is out of range for cache_id {right}"),
    ]
    for args, message in cases:
        with pytest.raises(IndexError) as info:
            ds.get_item(*args)
        assert str(info.value) == message


def test_get_item_sample_range_checked_before_cache_lookup(ds):
    # dataset-rt 0.4.8: get_item(12345, -1) -> IndexError("sample_id -1 is out of range")
    with pytest.raises(IndexError, match="^sample_id -1 is out of range$"):
        ds.get_item(12345, -1)


def test_get_item_ignores_active_table_and_cursors(ds):
    left, right = ids(ds)
    md = ds.get_metadata()
    ds.update_metadata(md.filter(pl.col("cache_id") == left).with_columns(pl.lit("edited").alias("label")))
    ds.set_epoch_len(2)
    assert [s.sample_id for s in ds] == [0, 1]
    item = ds.get_item(right, 3)  # filtered out of the active table, still readable
    assert (item.cache_id, item.sample_id) == (right, 3)
    assert item.metadata["label"] == "right-3"  # from the record, not the edited table
    assert [s.sample_id for s in ds] == [2, 3]  # cursor untouched by get_item


# -- set_epoch_len (§2.3) -------------------------------------------------------------------------


def test_set_epoch_len_errors(ds):
    with pytest.raises(ValueError, match="^epoch_len must be at least 1$"):
        ds.set_epoch_len(0)
    with pytest.raises(ValueError, match="^epoch_len must be at least 1$"):
        ds.set_epoch_len(-3)
    for bad in (2.0, "3", None):
        with pytest.raises(TypeError):
            ds.set_epoch_len(bad)
    with pytest.raises(OverflowError):
        ds.set_epoch_len(2**64)
    assert len(ds) == 9  # nothing changed
    ds.set_epoch_len(True)
    assert len(ds) == 1
    ds.set_epoch_len(2**40)
    assert len(ds) == 2**40


def test_set_epoch_len_beyond_index_size(ds):
    # dataset-rt 0.4.8 raises OverflowError at set_epoch_len(2**63); datasetrt accepts it and len() fails later
    with pytest.raises(OverflowError):
        ds.set_epoch_len(2**63)
    assert len(ds) == 9


# -- metadata table (§2.1, §2.4) ------------------------------------------------------------------


def test_aliases(ds):
    assert drt.CachedDataset.samples_metadata is drt.CachedDataset.get_metadata
    assert drt.CachedDataset.set_samples_metadata is drt.CachedDataset.update_metadata
    md = ds.samples_metadata()
    assert md.equals(ds.get_metadata())
    ds.set_samples_metadata(md.head(3))
    assert len(ds) == 3 and ds.get_metadata().equals(md.head(3))


def test_get_metadata_returns_the_frame_as_supplied(ds):
    md = ds.get_metadata()
    chunked = pl.concat([md.head(4), md.tail(3)], rechunk=False)
    frame = chunked.select(
        pl.col("weight").cast(pl.Float32),
        pl.col("cache_id").cast(pl.Int64),
        pl.col("sample_id").cast(pl.UInt32),
        pl.exclude("weight", "cache_id", "sample_id"),
        pl.struct("index", "label").alias("nested"),
    ).with_columns(pl.lit(None, dtype=pl.String).alias("label"))
    assert frame.n_chunks() == 2
    ds.update_metadata(frame)
    got = ds.get_metadata()
    assert got.columns == frame.columns and got.dtypes == frame.dtypes
    assert got.equals(frame) and got.n_chunks() == 2


def _bad_frames(md: pl.DataFrame, left: int):
    """One table per §2.4 rule, with its message."""

    def at(col, row, value, dtype=None):
        return pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value, dtype=dtype)).otherwise(pl.col(col)).alias(col)

    return [
        (md.head(0), "metadata table must include at least one sample"),
        (md.drop("sample_id"), "samples metadata missing 'sample_id' column"),
        (md.drop("score"), "samples metadata missing 'score' column"),
        (md.with_columns(pl.col("cache_id").cast(pl.String)), "samples metadata column 'cache_id' must be an integer"),
        (
            md.with_columns(pl.col("sample_id").cast(pl.UInt16)),
            "samples metadata column 'sample_id' must be an integer",
        ),
        (md.with_columns(at("sample_id", 2, None, pl.UInt64)), "samples metadata column 'sample_id' contains null"),
        (
            md.with_columns(pl.col("sample_id").cast(pl.Int64)).with_columns(at("sample_id", 1, -4, pl.Int64)),
            "samples metadata column 'sample_id' must be non-negative",
        ),
        (
            md.with_columns(at("sample_id", 4, 5, pl.UInt64)),
            f"unknown samples metadata row identity cache_id={left} sample_id=5",
        ),
        (
            md.with_columns(at("cache_id", 0, 99, pl.UInt64)),
            "unknown samples metadata row identity cache_id=99 sample_id=0",
        ),
        (md.with_columns(pl.col("index").cast(pl.Int32)), "samples metadata column 'index' must have Arrow type Int64"),
        (
            md.with_columns(pl.col("score").cast(pl.Float32)),
            "samples metadata column 'score' must have Arrow type Float64",
        ),
        (
            md.with_columns(pl.col("label").cast(pl.Categorical)),
            "samples metadata column 'label' must have Arrow type Utf8",
        ),
        (md.with_columns(pl.col("kept").cast(pl.Int64)), "samples metadata column 'kept' must have Arrow type Boolean"),
        (md.with_columns(pl.col("weight").cast(pl.Boolean)), "samples metadata column 'weight' must be numeric"),
        (md.with_columns(pl.col("weight").cast(pl.Int8)), "samples metadata column 'weight' must be numeric"),
        (md.with_columns(at("weight", 3, None, pl.Float64)), "samples metadata column 'weight' contains null"),
        (
            md.with_columns(at("weight", 6, 0.0)),
            f"weight 6 must be positive and finite: row 6 (cache_id={md['cache_id'][6]}, sample_id=1) has weight 0.0",
        ),
        (
            md.with_columns(at("weight", 8, float("nan"))),
            f"weight 8 must be positive and finite: row 8 (cache_id={md['cache_id'][8]}, sample_id=3) has weight nan",
        ),
        (
            md.with_columns(at("weight", 0, float("-inf"))),
            f"weight 0 must be positive and finite: row 0 (cache_id={left}, sample_id=0) has weight -inf",
        ),
    ]


@pytest.mark.parametrize("shuffle", [False, True])
def test_previous_table_stays_active_on_every_error(two, shuffle, open_ds):
    ds = open_ds(two, seed=5, shuffle=shuffle)
    md = ds.get_metadata()
    left, _ = ids(ds)
    good = md[[8, 1, 1, 4]].with_columns(pl.Series("weight", [1.0, 2.0, 3.0, 4.0]))
    ds.update_metadata(good)
    ds.set_epoch_len(6)
    twin = open_ds(two, seed=5, shuffle=shuffle)  # the same state, never given a bad table
    twin.update_metadata(good)
    twin.set_epoch_len(6)
    for frame, message in _bad_frames(md, left):
        with pytest.raises(MetadataValidationError) as info:
            ds.update_metadata(frame)
        assert isinstance(info.value, ValueError) and str(info.value) == message
        assert len(ds) == 6 and ds.get_metadata().equals(good) and ds.get_metadata().columns == good.columns
    for _ in range(2):  # neither the table, the length nor the cursor/draw offset moved
        assert [(s.cache_id, s.sample_id) for s in ds] == [(s.cache_id, s.sample_id) for s in twin]


@pytest.mark.parametrize("kind", ["int", "none", "str", "dict", "arrow", "lazy", "rows"])
def test_non_dataframe_input(ds, kind):
    md = ds.get_metadata()
    value = {
        "int": 5,
        "none": None,
        "str": "table",
        "dict": md.to_dict(as_series=False),
        "arrow": md.to_arrow(),
        "lazy": md.lazy(),
        "rows": md.to_dicts(),
    }[kind]
    with pytest.raises(TypeError) as info:  # dataset-rt raises AttributeError (it calls df.to_arrow())
        ds.update_metadata(value)
    assert isinstance(info.value, AttributeError)
    assert ds.get_metadata().equals(md) and len(ds) == 9


@pytest.mark.interop
def test_validation_messages_match_dataset_rt(two, open_ds):
    real = pytest.importorskip("dataset_rt")
    ours = open_ds(two)
    theirs = real.DatasetRuntime(num_workers=1).cached_dataset(two, reader_config=real.ReaderConfig(seed=7))
    md = theirs.get_metadata()
    left, _ = ids(ours)

    def at(col, row, value, dtype=None):
        return pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value, dtype=dtype)).otherwise(pl.col(col)).alias(col)

    several = [  # several rules broken at once: the reported one must be the same
        md.drop("label", "cache_id"),
        md.drop("score").with_columns(pl.col("label").cast(pl.Binary)),
        md.with_columns(at("cache_id", 3, None, pl.UInt64)).with_columns(at("sample_id", 1, None, pl.UInt64)),
        md.with_columns(at("weight", 1, float("nan"))).with_columns(at("sample_id", 3, 99, pl.UInt64)),
        md.with_columns(at("sample_id", 1, 99, pl.UInt64)).with_columns(at("sample_id", 3, None, pl.UInt64)),
        md.with_columns(pl.lit(None, dtype=pl.Float64).alias("cache_id")),
        md.with_columns(pl.col("weight").cast(pl.String)).with_columns(at("sample_id", 1, None, pl.UInt64)),
    ]
    for frame in [f for f, _ in _bad_frames(md, left)] + several:
        with pytest.raises(ValueError) as mine:
            ours.update_metadata(frame)
        with pytest.raises(ValueError) as reference:
            theirs.update_metadata(frame)
        if str(reference.value).startswith("weight "):  # datasetrt adds the row's identity and value after it
            assert str(mine.value).startswith(f"{reference.value}: row "), (str(mine.value), str(reference.value))
        else:
            assert str(mine.value) == str(reference.value)
