"""The samples-metadata table (Polars) and the validation of `update_metadata`.

Boundary: Polars/Arrow tables and numpy arrays; no file formats (it gets decoded Arrow tables
from the format layer through a callable), no processes.

All rules are columnar: no Python loop over rows. The validated result is an `ActiveRows`
(numpy identity and weight arrays) plus the frame exactly as the user supplied it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import polars as pl
import pyarrow as pa

from datasetrt.errors import MetadataValidationError
from datasetrt.format.layout import IDENTITY_COLUMNS, WEIGHT_COLUMN
from datasetrt.sampling.planner import ActiveRows
from datasetrt.table.catalog import CacheCatalog

IDENTITY_DTYPES = (pl.Int32, pl.Int64, pl.UInt32, pl.UInt64)
WEIGHT_DTYPES = (*IDENTITY_DTYPES, pl.Float32, pl.Float64)
STORED_DTYPES = {
    "int": (pl.Int64, "Int64"),
    "float": (pl.Float64, "Float64"),
    "bool": (pl.Boolean, "Boolean"),
    "string": (pl.String, "Utf8"),
}


def physical_table(
    catalog: CacheCatalog, schema: Sequence[tuple[str, str]], read_cache: Callable[[int], pa.Table]
) -> pl.DataFrame:
    """The full physical table: cache_id u64, sample_id u64, stored columns (sorted), weight f64 = 1.

    Rows are caches in path order, samples in sample_id order. `read_cache(k)` returns cache
    k's decoded metadata (columns in schema order). O(total rows), columnar.
    """
    names = [n for n, _ in schema]
    if len(catalog):
        tables = [read_cache(k) for k in range(len(catalog))]
        stored = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        # One chunk per column (the caches' tables arrive one batch per cache), combined by
        # pyarrow, whose pool the frame's buffers then live in: a frame filtered or extended from
        # it stays one chunk, so `validate_update` views its identity and weight columns instead
        # of copying them. A string column past 2 GiB of text cannot be one chunk: left as is.
        try:
            stored = stored.combine_chunks()
        except pa.ArrowInvalid:
            pass
    else:
        stored = pa.table({n: pa.array([], type=pa.null()) for n in names})
    columns = list(_identity_columns(catalog))
    columns += [stored.column(n) for n in names]
    table = pa.table(columns, names=[*IDENTITY_COLUMNS, *names])
    # A pa.Table converts to a DataFrame; pyarrow is untyped here, so mypy cannot pick that overload.
    frame = cast(pl.DataFrame, pl.from_arrow(table))
    # weight = 1 as a literal: Polars keeps it as one value until a row of it is needed, so the
    # table a user filters and reweights never holds a column of ones.
    return frame.with_columns(pl.lit(1.0, dtype=pl.Float64).alias(WEIGHT_COLUMN))


def _identity_columns(catalog: CacheCatalog) -> tuple[pa.Array, pa.Array]:
    """cache_id and sample_id of every physical row (caches in path order, samples in sample_id
    order) as uint64 arrays in pyarrow's memory pool, each filled in place by one running sum
    (uint64 arithmetic wraps, so steps between cache ids sum back to each id exactly): no
    per-row temporary, and no numpy allocation of every row (numpy asks the kernel for huge
    pages there, which can stall on compaction for longer than the fill takes)."""
    total = catalog.total
    counts = catalog.counts
    nonempty = counts > 0
    starts = catalog.offsets[:-1][nonempty]
    ids = catalog.cache_ids[nonempty].astype(np.uint64)
    sizes = counts[nonempty].astype(np.uint64)
    out = []
    for steps in (_cache_id_steps, _sample_id_steps):
        buffer = pa.allocate_buffer(total * 8)
        values = np.frombuffer(buffer, dtype=np.uint64)
        if total:
            steps(values, starts, ids, sizes)
            np.cumsum(values, out=values)
        out.append(pa.Array.from_buffers(pa.uint64(), total, [None, buffer]))
    return out[0], out[1]


def _cache_id_steps(values: np.ndarray, starts: np.ndarray, ids: np.ndarray, sizes: np.ndarray) -> None:
    """Steps whose running sum is each row's cache id: the id at the first row, then the change
    of id at each cache's first row (mod 2^64), 0 elsewhere."""
    values[:] = 0
    values[starts[0]] = ids[0]
    values[starts[1:]] = ids[1:] - ids[:-1]


def _sample_id_steps(values: np.ndarray, starts: np.ndarray, ids: np.ndarray, sizes: np.ndarray) -> None:
    """Steps whose running sum is each row's sample id: 1 per row, 0 at the first row, and at
    each later cache's first row the step back to 0 (1 - the previous cache's size, mod 2^64)."""
    values[:] = 1
    values[starts[0]] = 0
    values[starts[1:]] = np.uint64(1) - sizes[:-1]


def _fail(message: str) -> MetadataValidationError:
    return MetadataValidationError(message)


def _first_true(mask: pl.Series) -> int:
    """Row of the first True of a boolean `mask` that has one (so it is not empty: arg_max is
    None only for an empty series)."""
    row = mask.arg_max()
    assert row is not None
    return row


def _first_bad_row(series: pl.Series, accepted: tuple, signed_check: bool) -> tuple[int, str] | None:
    """First row at which `series` fails a per-row check, and the failure kind, or None.

    dataset-rt checks each identity/weight cell in turn: a null cell reports "null", a non-null
    cell of an unaccepted dtype reports "type", a negative identity reports "negative". So an
    all-null column of the wrong dtype reports "null" and a pl.Null column (no validity bitmap
    in Arrow) reports "type". Columnar: one null mask and one comparison, no row loop.
    """
    if series.dtype == pl.Null:
        return (0, "type")
    nulls = series.null_count()
    if series.dtype not in accepted:
        return (0, "null") if series.slice(0, 1).null_count() else (0, "type")
    bad_null = _first_true(series.is_null()) if nulls else None
    bad_neg = None
    if signed_check and series.dtype.is_signed_integer():
        lowest = series.min()  # an int, or None when every cell is null
        if isinstance(lowest, int) and lowest < 0:
            bad_neg = _first_true((series < 0).fill_null(False))
    if bad_null is None:
        return None if bad_neg is None else (bad_neg, "negative")
    if bad_neg is None or bad_null < bad_neg:
        return (bad_null, "null")
    return (bad_neg, "negative")


def validate_update(df: pl.DataFrame, catalog: CacheCatalog, schema: Sequence[tuple[str, str]]) -> ActiveRows:
    """Check a user table against the samples-metadata contract (reference §2.4) and return the
    active rows. Raises MetadataValidationError with dataset-rt's messages; never mutates state.

    When a table breaks several rules, the reported one follows dataset-rt 0.4.8 (observed):
    0 rows; then each stored column in schema order (missing, then Arrow type); then presence
    of cache_id, sample_id, weight; then row by row: cache_id, sample_id (null, integer dtype,
    non-negative), weight (null, numeric dtype), the row's identity lookup; finally the first
    weight that is not positive and finite. Evaluated columnar, O(rows).
    """
    if df.height == 0:
        raise _fail("metadata table must include at least one sample")
    present = set(df.columns)
    for name, kind in schema:
        if name not in present:
            raise _fail(f"samples metadata missing '{name}' column")
        dtype, arrow_name = STORED_DTYPES[kind]
        if df.get_column(name).dtype != dtype:
            raise _fail(f"samples metadata column '{name}' must have Arrow type {arrow_name}")
    for col in (*IDENTITY_COLUMNS, WEIGHT_COLUMN):
        if col not in present:
            raise _fail(f"samples metadata missing '{col}' column")
    messages = {
        "null": "samples metadata column '{}' contains null",
        "negative": "samples metadata column '{}' must be non-negative",
    }
    first: tuple[int, int, str, str] | None = None  # (row, column order, column, message)
    for order, col in enumerate((*IDENTITY_COLUMNS, WEIGHT_COLUMN)):
        is_weight = col == WEIGHT_COLUMN
        found = _first_bad_row(df.get_column(col), WEIGHT_DTYPES if is_weight else IDENTITY_DTYPES, not is_weight)
        if found is None:
            continue
        row, kind = found
        if kind == "type":
            message = f"samples metadata column '{col}' must be {'numeric' if is_weight else 'an integer'}"
        else:
            message = messages[kind].format(col)
        if first is None or (row, order) < first[:2]:
            first = (row, order, col, message)
    # Identity lookup, for the rows before the first bad cell (those rows are all valid).
    valid_rows = df.height if first is None else first[0]
    cache_ids = df.get_column(IDENTITY_COLUMNS[0]).slice(0, valid_rows).to_numpy().astype(np.uint64, copy=False)
    sample_ids = df.get_column(IDENTITY_COLUMNS[1]).slice(0, valid_rows).to_numpy().astype(np.uint64, copy=False)
    # Blockwise (O(block) temporaries besides the narrow positions it returns).
    pos, unknown = catalog.lookup(cache_ids, sample_ids)
    if unknown >= 0:
        raise _fail(
            f"unknown samples metadata row identity cache_id={int(cache_ids[unknown])} "
            f"sample_id={int(sample_ids[unknown])}"
        )
    if first is not None:
        raise _fail(first[3])
    # Views of the user's frame where its dtypes allow (UInt64 sample_id, Float64 weight without
    # nulls: read-only, zero-copy); the population keeps the frame, so the buffers outlive them.
    weights = np.ascontiguousarray(df.get_column(WEIGHT_COLUMN).to_numpy(), dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(weights) & (weights > 0)))
    if bad.size:
        # dataset-rt's text names the row position ("weight 5"); then the row's identity and value.
        row = int(bad[0])
        raise _fail(
            f"weight {row} must be positive and finite: row {row} (cache_id={int(cache_ids[row])}, "
            f"sample_id={int(sample_ids[row])}) has weight {float(weights[row])!r}"
            + (f"; {bad.size - 1} more row{'s' if bad.size > 2 else ''} too" if bad.size > 1 else "")
        )
    return ActiveRows(cache_pos=pos, sample_id=np.ascontiguousarray(sample_ids), weights=weights)
