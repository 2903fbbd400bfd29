"""The samples-metadata table (Polars) and the validation of `update_metadata`.

Boundary: Polars/Arrow tables and numpy arrays; no file formats (it gets decoded Arrow tables
from the format layer through a callable), no processes.

All rules are columnar: no Python loop over rows. The validated result is an `ActiveRows`
(numpy identity and weight arrays) plus the frame exactly as the user supplied it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from datasetrt.errors import MetadataValidationError
from datasetrt.format.layout import IDENTITY_COLUMNS, WEIGHT_COLUMN
from datasetrt.table.catalog import CacheCatalog

IDENTITY_DTYPES = (pl.Int32, pl.Int64, pl.UInt32, pl.UInt64)
WEIGHT_DTYPES = (*IDENTITY_DTYPES, pl.Float32, pl.Float64)
STORED_DTYPES = {"int": (pl.Int64, "Int64"), "float": (pl.Float64, "Float64"), "bool": (pl.Boolean, "Boolean"), "string": (pl.String, "Utf8")}


@dataclass(frozen=True)
class ActiveRows:
    """The validated active population.

    `cache_pos` (int64, positions in the catalog), `sample_id` (uint64) and `weights` (float64,
    positive, finite) have one entry per active row, duplicates included, in table order.
    """

    cache_pos: np.ndarray
    sample_id: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return len(self.weights)


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
    else:
        stored = pa.table({n: pa.array([], type=pa.null()) for n in names})
    starts = np.repeat(catalog.offsets[:-1], catalog.counts)
    cache_id = np.repeat(catalog.cache_ids, catalog.counts)
    sample_id = (np.arange(catalog.total, dtype=np.int64) - starts).astype(np.uint64)
    columns = [pa.array(cache_id, type=pa.uint64()), pa.array(sample_id, type=pa.uint64())]
    columns += [stored.column(n) for n in names]
    columns.append(pa.array(np.ones(catalog.total, dtype=np.float64)))
    return pl.from_arrow(pa.table(columns, names=[*IDENTITY_COLUMNS, *names, WEIGHT_COLUMN]))


def _fail(message: str) -> MetadataValidationError:
    return MetadataValidationError(message)


def validate_update(df: pl.DataFrame, catalog: CacheCatalog, schema: Sequence[tuple[str, str]]) -> ActiveRows:
    """Check a user table against the samples-metadata contract (reference §2.4) and return the
    active rows. Raises MetadataValidationError with dataset-rt's messages; never mutates state."""
    if df.height == 0:
        raise _fail("metadata table must include at least one sample")
    present = set(df.columns)
    for col in (*IDENTITY_COLUMNS, WEIGHT_COLUMN, *(n for n, _ in schema)):
        if col not in present:
            raise _fail(f"samples metadata missing '{col}' column")
    identities = []
    for col in IDENTITY_COLUMNS:
        series = df.get_column(col)
        if series.dtype not in IDENTITY_DTYPES:
            raise _fail(f"samples metadata column '{col}' must be an integer")
        if series.null_count():
            raise _fail(f"samples metadata column '{col}' contains null")
        if series.dtype.is_signed_integer() and series.min() < 0:
            raise _fail(f"samples metadata column '{col}' must be non-negative")
        identities.append(series.to_numpy().astype(np.uint64, copy=False))
    for name, kind in schema:
        dtype, arrow_name = STORED_DTYPES[kind]
        if df.get_column(name).dtype != dtype:
            raise _fail(f"samples metadata column '{name}' must have Arrow type {arrow_name}")
    weight = df.get_column(WEIGHT_COLUMN)
    if weight.dtype not in WEIGHT_DTYPES:
        raise _fail(f"samples metadata column '{WEIGHT_COLUMN}' must be numeric")
    if weight.null_count():
        raise _fail(f"samples metadata column '{WEIGHT_COLUMN}' contains null")
    weights = weight.to_numpy().astype(np.float64)
    bad = np.flatnonzero(~(np.isfinite(weights) & (weights > 0)))
    if bad.size:
        raise _fail(f"weight {int(bad[0])} must be positive and finite")
    cache_ids, sample_ids = identities
    pos = catalog.positions(cache_ids)
    known = pos >= 0
    known[known] = sample_ids[known] < catalog.counts[pos[known]].astype(np.uint64)
    unknown = np.flatnonzero(~known)
    if unknown.size:
        i = int(unknown[0])
        raise _fail(f"unknown samples metadata row identity cache_id={int(cache_ids[i])} sample_id={int(sample_ids[i])}")
    return ActiveRows(cache_pos=pos, sample_id=sample_ids.copy(), weights=np.ascontiguousarray(weights))
