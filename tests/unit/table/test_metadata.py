"""datasetrt.table.metadata: the physical table and update_metadata validation (reference §2.1, §2.4).

The catalog and schema are synthetic (two caches, 5 + 4 rows, the four stored kinds), so these
tests need no cache on disk. Dataset-level effects (previous table kept, len, iterators) are in
tests/integration/test_dataset_api.py.
"""

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from datasetrt.errors import MetadataValidationError
from datasetrt.table.catalog import CacheCatalog
from datasetrt.table.metadata import physical_table, validate_update

IDS = [11, 2**63 + 5]
COUNTS = [5, 4]
SCHEMA = (("index", "int"), ("kept", "bool"), ("label", "string"), ("score", "float"))
CATALOG = CacheCatalog(IDS, COUNTS, ["a", "b"])


def _stored(k: int) -> pa.Table:
    n = COUNTS[k]
    return pa.table(
        {
            "index": pa.array(range(n), pa.int64()),
            "kept": pa.array([i % 2 == 0 for i in range(n)]),
            "label": pa.array([f"c{k}-{i}" for i in range(n)]),
            "score": pa.array([i * 0.5 + k for i in range(n)]),
        }
    )


def physical() -> pl.DataFrame:
    return physical_table(CATALOG, SCHEMA, _stored)


def at(col: str, row: int, value, dtype=None) -> pl.Expr:
    """`col` with `value` at position `row` (everything else unchanged)."""
    return pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value, dtype=dtype)).otherwise(pl.col(col)).alias(col)


def fails(df: pl.DataFrame, message: str) -> None:
    with pytest.raises(MetadataValidationError) as info:
        validate_update(df, CATALOG, SCHEMA)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == message


def bad_weight(row: int, value: float, more: int = 0) -> str:
    """dataset-rt's "weight {row} must be positive and finite", then the row's identity and value."""
    cache_id, sample_id = (IDS[0], row) if row < COUNTS[0] else (IDS[1], row - COUNTS[0])
    tail = f"; {more} more row{'s' if more > 1 else ''} too" if more else ""
    return (
        f"weight {row} must be positive and finite: row {row} (cache_id={cache_id}, sample_id={sample_id}) "
        f"has weight {value!r}{tail}"
    )


def ok(df: pl.DataFrame):
    return validate_update(df, CATALOG, SCHEMA)


# -- physical table -------------------------------------------------------------------------------


def test_physical_table_layout():
    df = physical()
    assert df.columns == ["cache_id", "sample_id", "index", "kept", "label", "score", "weight"]
    assert df.dtypes == [pl.UInt64, pl.UInt64, pl.Int64, pl.Boolean, pl.String, pl.Float64, pl.Float64]
    assert df["cache_id"].to_list() == [IDS[0]] * 5 + [IDS[1]] * 4
    assert df["sample_id"].to_list() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert df["label"].to_list()[4:6] == ["c0-4", "c1-0"]
    assert df["weight"].to_list() == [1.0] * 9


def test_physical_table_of_one_cache():
    one = CacheCatalog(IDS[1:], COUNTS[1:], ["b"])
    df = physical_table(one, SCHEMA, lambda k: _stored(k + 1))
    assert df["cache_id"].to_list() == [IDS[1]] * 4 and df["sample_id"].to_list() == [0, 1, 2, 3]
    assert df["label"].to_list() == ["c1-0", "c1-1", "c1-2", "c1-3"]


def test_physical_table_round_trips_through_validation():
    active = ok(physical())
    assert active.cache_pos.tolist() == [0] * 5 + [1] * 4
    assert active.sample_id.dtype == np.uint64 and active.sample_id.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert active.weights.dtype == np.float64 and len(active) == 9


# -- one rule at a time (§2.4 table) ---------------------------------------------------------------


def test_zero_rows():
    fails(physical().head(0), "metadata table must include at least one sample")
    fails(physical().head(0).drop("weight"), "metadata table must include at least one sample")


@pytest.mark.parametrize("col", ["cache_id", "sample_id", "weight", "index", "kept", "label", "score"])
def test_missing_column(col):
    fails(physical().drop(col), f"samples metadata missing '{col}' column")


@pytest.mark.parametrize("col", ["cache_id", "sample_id"])
@pytest.mark.parametrize(
    "dtype", [pl.Int8, pl.Int16, pl.UInt8, pl.UInt16, pl.Float32, pl.Float64, pl.String, pl.Decimal(20, 0), pl.Null]
)
def test_identity_dtype_rejected(col, dtype):
    df = physical().with_columns(pl.col(col).cast(dtype, strict=False) if dtype != pl.Null else pl.lit(None).alias(col))
    fails(df, f"samples metadata column '{col}' must be an integer")


@pytest.mark.parametrize("dtype", [pl.Int8, pl.Float64, pl.String])
def test_all_null_identity_of_wrong_dtype_reports_null(dtype):
    # dataset-rt checks cell by cell: row 0 is a null cell before it is a wrongly typed one
    fails(
        physical().with_columns(pl.lit(None, dtype=dtype).alias("cache_id")),
        "samples metadata column 'cache_id' contains null",
    )
    fails(
        physical().with_columns(pl.lit(None, dtype=dtype).alias("weight")),
        "samples metadata column 'weight' contains null",
    )


@pytest.mark.parametrize("dtype", [pl.Int32, pl.Int64, pl.UInt32, pl.UInt64])
def test_identity_dtype_accepted(dtype):
    df = physical().with_columns(pl.col("sample_id").cast(dtype))
    assert ok(df).sample_id.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]


@pytest.mark.parametrize("col", ["cache_id", "sample_id"])
def test_identity_null(col):
    fails(physical().with_columns(at(col, 3, None, pl.UInt64)), f"samples metadata column '{col}' contains null")


@pytest.mark.parametrize("col", ["cache_id", "sample_id"])
@pytest.mark.parametrize("dtype", [pl.Int32, pl.Int64])
def test_identity_negative(col, dtype):
    # the second cache id does not fit a signed column (null from row 5 on): row 2 comes first
    df = physical().with_columns(pl.col(col).cast(dtype, strict=False)).with_columns(at(col, 2, -1, dtype))
    fails(df, f"samples metadata column '{col}' must be non-negative")


@pytest.mark.parametrize("cache_id,sample_id", [(12, 0), (IDS[0], 5), (IDS[1], 4), (2**64 - 1, 0), (IDS[0], 2**64 - 1)])
def test_unknown_identity(cache_id, sample_id):
    df = (
        physical()
        .with_columns(at("cache_id", 7, cache_id, pl.UInt64))
        .with_columns(at("sample_id", 7, sample_id, pl.UInt64))
    )
    fails(df, f"unknown samples metadata row identity cache_id={cache_id} sample_id={sample_id}")


def test_unknown_identity_reports_first_row():
    df = physical().with_columns(at("sample_id", 6, 77, pl.UInt64)).with_columns(at("sample_id", 2, 88, pl.UInt64))
    fails(df, f"unknown samples metadata row identity cache_id={IDS[0]} sample_id=88")


@pytest.mark.parametrize(
    "col,kind,arrow",
    [
        ("index", "int", "Int64"),
        ("kept", "bool", "Boolean"),
        ("label", "string", "Utf8"),
        ("score", "float", "Float64"),
    ],
)
@pytest.mark.parametrize(
    "dtype", [pl.Int32, pl.Int64, pl.Float32, pl.Float64, pl.Boolean, pl.String, pl.Categorical, pl.Binary, pl.Null]
)
def test_stored_column_dtype(col, kind, arrow, dtype):
    # the column type is checked, not its values: an all-null column of the right dtype passes
    df = physical().with_columns(pl.lit(None, dtype=dtype).alias(col))
    if dtype == physical()[col].dtype:
        assert len(ok(df)) == 9
    else:
        fails(df, f"samples metadata column '{col}' must have Arrow type {arrow}")


def test_large_string_is_accepted():
    arrow = physical().to_arrow()
    i = arrow.schema.get_field_index("label")
    df = pl.from_arrow(arrow.set_column(i, "label", pa.array(physical()["label"].to_list(), pa.large_string())))
    assert len(ok(df)) == 9


@pytest.mark.parametrize(
    "dtype", [pl.Int8, pl.Int16, pl.UInt8, pl.UInt16, pl.Boolean, pl.String, pl.Decimal(10, 2), pl.Null]
)
def test_weight_dtype_rejected(dtype):
    df = physical().with_columns(pl.col("weight").cast(dtype) if dtype != pl.Null else pl.lit(None).alias("weight"))
    fails(df, "samples metadata column 'weight' must be numeric")


@pytest.mark.parametrize("dtype", [pl.Int32, pl.Int64, pl.UInt32, pl.UInt64, pl.Float32, pl.Float64])
def test_weight_dtype_accepted(dtype):
    df = physical().with_columns((pl.int_range(pl.len()) + 1).cast(dtype).alias("weight"))
    assert ok(df).weights.tolist() == [float(i) for i in range(1, 10)]


def test_weight_null():
    fails(physical().with_columns(at("weight", 4, None, pl.Float64)), "samples metadata column 'weight' contains null")


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("row", [0, 4, 8])
def test_weight_not_positive_finite(bad, row):
    fails(physical().with_columns(at("weight", row, bad, pl.Float64)), bad_weight(row, bad))


def test_weight_reports_first_bad_row():
    df = physical().with_columns(at("weight", 6, -1.0)).with_columns(at("weight", 2, float("nan")))
    fails(df, bad_weight(2, float("nan"), more=1))
    fails(
        physical().with_columns(pl.col("weight").cast(pl.Int64)).with_columns(at("weight", 3, 0, pl.Int64)),
        bad_weight(3, 0.0),
    )
    fails(
        physical()
        .with_columns(pl.col("weight").cast(pl.Float32))
        .with_columns(at("weight", 5, float("inf"), pl.Float32)),
        bad_weight(5, float("inf")),
    )
    fails(physical().with_columns(pl.lit(-2.0).alias("weight")), bad_weight(0, -2.0, more=8))
    three = (
        physical()
        .with_columns(at("weight", 1, 0.0))
        .with_columns(at("weight", 4, -1.0))
        .with_columns(at("weight", 8, 0.0))
    )
    fails(three, bad_weight(1, 0.0, more=2))  # "; 2 more rows too": plural from two on


def test_tiny_and_huge_weights_accepted():
    assert ok(physical().with_columns(pl.lit(5e-324).alias("weight"))).weights.tolist() == [5e-324] * 9
    assert len(ok(physical().with_columns(pl.lit(1e-45, dtype=pl.Float32).alias("weight")))) == 9
    assert len(ok(physical().with_columns(pl.lit(2**64 - 1, dtype=pl.UInt64).alias("weight")))) == 9


# -- not validated --------------------------------------------------------------------------------


def test_unvalidated_shapes_are_accepted():
    base = physical()
    extra = base.with_columns(
        pl.struct("index", "label").alias("nested"),
        pl.lit([1, 2]).alias("lst"),
        pl.col("label").cast(pl.Binary).alias("blob"),
    )
    assert len(ok(extra)) == 9
    assert len(ok(base.select(list(reversed(base.columns))))) == 9
    assert (
        len(
            ok(
                base.with_columns(
                    pl.lit(None, dtype=pl.String).alias("label"), pl.lit(-5, dtype=pl.Int64).alias("index")
                )
            )
        )
        == 9
    )
    dup = pl.concat([base, base.slice(6, 2), base.head(1)])
    active = ok(dup)
    assert active.cache_pos.tolist() == [0] * 5 + [1] * 4 + [1, 1, 0]
    assert active.sample_id.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 1, 2, 0]


def test_subset_in_any_order():
    df = physical()[[8, 0, 3]].with_columns(pl.Series("weight", [0.5, 2.0, 3.0]))
    active = ok(df)
    assert (active.cache_pos.tolist(), active.sample_id.tolist(), active.weights.tolist()) == (
        [1, 0, 0],
        [3, 0, 3],
        [0.5, 2.0, 3.0],
    )


# -- which rule wins when several break (observed on 0.4.8) ----------------------------------------


def test_precedence_stored_columns_first_in_schema_order():
    base = physical()
    fails(base.drop("label", "cache_id"), "samples metadata missing 'label' column")
    fails(
        base.drop("score").with_columns(pl.col("label").cast(pl.Binary)),
        "samples metadata column 'label' must have Arrow type Utf8",
    )
    fails(
        base.with_columns(pl.col("index").cast(pl.Int32), pl.col("cache_id").cast(pl.Float64)),
        "samples metadata column 'index' must have Arrow type Int64",
    )
    fails(base.drop("weight", "sample_id"), "samples metadata missing 'sample_id' column")
    fails(
        base.drop("weight").with_columns(pl.col("cache_id").cast(pl.String)), "samples metadata missing 'weight' column"
    )


def test_precedence_row_by_row():
    base = physical()
    i64 = base.with_columns(pl.col("cache_id").cast(pl.Int64, strict=False), pl.col("sample_id").cast(pl.Int64))
    # the earliest row wins across cache_id, sample_id and weight cells
    fails(
        base.with_columns(at("cache_id", 3, None, pl.UInt64)).with_columns(at("sample_id", 1, None, pl.UInt64)),
        "samples metadata column 'sample_id' contains null",
    )
    fails(
        i64.with_columns(at("cache_id", 1, -1, pl.Int64)).with_columns(at("sample_id", 0, -1, pl.Int64)),
        "samples metadata column 'sample_id' must be non-negative",
    )
    fails(
        base.with_columns(at("cache_id", 3, None, pl.UInt64)).with_columns(at("weight", 1, None, pl.Float64)),
        "samples metadata column 'weight' contains null",
    )
    # a wrong dtype fails at row 0, unless row 0 is null
    fails(
        base.with_columns(at("cache_id", 3, None, pl.UInt64), pl.col("sample_id").cast(pl.Float64)),
        "samples metadata column 'sample_id' must be an integer",
    )
    fails(
        base.with_columns(at("cache_id", 0, None, pl.UInt64), pl.col("weight").cast(pl.String)),
        "samples metadata column 'cache_id' contains null",
    )
    fails(
        base.with_columns(at("sample_id", 1, None, pl.UInt64), pl.col("weight").cast(pl.String)),
        "samples metadata column 'weight' must be numeric",
    )  # row 0's dtype fault before row 1's null
    fails(
        base.with_columns(at("cache_id", 0, 7, pl.UInt64), pl.col("sample_id").cast(pl.Float64)),
        "samples metadata column 'sample_id' must be an integer",
    )  # before row 0's identity lookup
    fails(
        base.with_columns(pl.col("sample_id").cast(pl.Float64)).with_columns(at("sample_id", 1, None, pl.Float64)),
        "samples metadata column 'sample_id' must be an integer",
    )  # only a null in row 0 reports null
    # a negative identity fails at its own row (sample_id 0 in row 0 is valid), after an earlier null
    fails(
        i64.with_columns(at("sample_id", 3, -1, pl.Int64)).with_columns(at("cache_id", 2, None, pl.Int64)),
        "samples metadata column 'cache_id' contains null",
    )
    # in one signed column, a null before a negative is reported as the null (its row comes first)
    fails(
        i64.with_columns(at("sample_id", 1, None, pl.Int64)).with_columns(at("sample_id", 3, -1, pl.Int64)),
        "samples metadata column 'sample_id' contains null",
    )
    # within a row: cache_id, sample_id, weight, then the identity lookup
    fails(
        base.with_columns(at("sample_id", 1, 99, pl.UInt64)).with_columns(at("weight", 1, None, pl.Float64)),
        "samples metadata column 'weight' contains null",
    )
    fails(
        base.with_columns(at("sample_id", 1, 99, pl.UInt64)).with_columns(at("sample_id", 3, None, pl.UInt64)),
        f"unknown samples metadata row identity cache_id={IDS[0]} sample_id=99",
    )


def test_precedence_weight_values_last():
    base = physical()
    fails(
        base.with_columns(at("weight", 1, float("nan"), pl.Float64)).with_columns(at("sample_id", 3, 99, pl.UInt64)),
        f"unknown samples metadata row identity cache_id={IDS[0]} sample_id=99",
    )
    fails(
        base.with_columns(at("weight", 1, -1.0, pl.Float64)).with_columns(at("cache_id", 3, None, pl.UInt64)),
        "samples metadata column 'cache_id' contains null",
    )


# -- columnar at scale ----------------------------------------------------------------------------


def test_million_rows_validate_columnar():
    n = 1_000_000
    catalog = CacheCatalog([3, 9], [600_000, 400_000], ["x", "y"])
    sample = np.arange(n, dtype=np.int64)
    sample[600_000:] -= 600_000
    df = pl.DataFrame(
        {
            "cache_id": np.where(np.arange(n) < 600_000, 3, 9).astype(np.uint64),
            "sample_id": sample.astype(np.uint64),
            "weight": np.linspace(0.5, 2.0, n),
        }
    )
    active = validate_update(df, catalog, ())
    assert len(active) == n
    assert active.cache_pos[[0, 599_999, 600_000, n - 1]].tolist() == [0, 0, 1, 1]
    assert active.sample_id[[599_999, 600_000, n - 1]].tolist() == [599_999, 0, 399_999]
    with pytest.raises(
        MetadataValidationError,
        match=r"^weight 999999 must be positive and finite: row 999999 "
        r"\(cache_id=9, sample_id=399999\) has weight 0\.0$",
    ):
        validate_update(df.with_columns(at("weight", n - 1, 0.0)), catalog, ())
