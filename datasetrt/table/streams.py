"""Grouping the active table's rows into the named streams of a mixture or curriculum (Polars, once).

Boundary: a Polars frame (the active table in population order, or the physical table) and the
dataset's cache identities in; numpy `StreamRows` out. No file formats, no processes; the
planners never see Polars.

Rules: a cache given by path must be one of the dataset's caches (paths compared resolved, URLs
canonical: `s3://b/p/` and `s3a://b/p` are `s3://b/p`), a
cache_id must be present; a column must exist and its values must have the column's kind; every
stream must select at least one row; no row may belong to two streams. Columnar: one boolean
column per stream, no Python loop over rows. O(rows x streams).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
import polars as pl

from datasetrt.errors import ConfigError, EmptyStreamError, SamplingConfigError, UnknownStreamError
from datasetrt.format.layout import IDENTITY_COLUMNS, WEIGHT_COLUMN
from datasetrt.sampling.mixture import Stream, StreamRows
from datasetrt.storage.urls import parse_location

# A key of `group_streams`' caches, str or PathLike (a TypeVar: a Mapping is invariant in its keys).
CachePath = TypeVar("CachePath", bound=str | os.PathLike[str])


def _fspath(path: str | os.PathLike[str]) -> str:
    """`os.fspath` of a `CachePath` (mypy resolves its overloads on the bound, not the variable)."""
    return os.fspath(path)


def _identity(path: str) -> str | None:
    """A cache path's identity: a local path resolved, an object-store URL canonical (never through
    Path, which mangles URLs); None for a malformed URL."""
    try:
        location = parse_location(path)
    except ConfigError:
        return None
    return str(location.resolve()) if isinstance(location, Path) else location.url


def _cache_ids(stream: Stream, name: str, caches: Mapping[str, int], present: set[int]) -> list[int]:
    resolved = {_identity(p): cid for p, cid in caches.items()}
    ids = []
    for cache in stream.caches:
        if isinstance(cache, int):
            if cache not in present:
                raise UnknownStreamError(f"stream {name!r}: cache_id {cache} is not one of the dataset's caches")
            ids.append(cache)
        else:
            key = _identity(cache)
            cid = resolved.get(key) if key is not None else None
            if cid is None:
                raise UnknownStreamError(f"stream {name!r}: cache {cache!r} is not one of the dataset's caches")
            ids.append(cid)
    return ids


def _column_values(frame: pl.DataFrame, stream: Stream, name: str) -> pl.Expr:
    column = stream.column
    if column not in frame.columns:
        raise UnknownStreamError(f"stream {name!r}: the table has no column {column!r}")
    dtype = frame.schema[column]
    values = stream.values
    if dtype == pl.String:
        ok = all(isinstance(v, str) for v in values)
    elif dtype == pl.Boolean:
        ok = all(isinstance(v, bool) for v in values)
    elif dtype.is_integer():
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    elif dtype.is_float():
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    else:
        raise SamplingConfigError(
            f"stream {name!r}: column {column!r} has type {dtype}; streams group by "
            "string, integer, float or boolean columns"
        )
    if not ok:
        raise SamplingConfigError(
            f"stream {name!r}: values {list(values)!r} do not match column {column!r} of type {dtype}"
        )
    return pl.col(column).is_in(list(values)).fill_null(False)


def group_streams(
    frame: pl.DataFrame, streams: Mapping[str, Stream], caches: Mapping[CachePath, int] | None = None
) -> StreamRows:
    """The rows (population rows = frame row positions) and weights of each named stream.

    `frame`: the active table as validated by update_metadata (or the physical table), in
    population order, with cache_id and weight columns. `caches`: the dataset's cache directory
    -> cache_id, for streams that name caches by path. Raises UnknownStreamError,
    EmptyStreamError or SamplingConfigError naming the stream; nothing is kept on error.
    """
    by_path = {_fspath(k): v for k, v in (caches or {}).items()}
    present = (
        set(frame.get_column(IDENTITY_COLUMNS[0]).unique().to_list())
        if any(s.caches for s in streams.values())
        else set()
    )
    exprs = []
    for i, (name, stream) in enumerate(streams.items()):
        if stream.column is not None:
            expr = _column_values(frame, stream, name)
        else:
            expr = pl.col(IDENTITY_COLUMNS[0]).is_in(_cache_ids(stream, name, by_path, present))
        exprs.append(expr.alias(f"s{i}"))
    masks = frame.select(exprs)
    names = list(streams)
    overlap = masks.select(pl.sum_horizontal(pl.all()).alias("n")).get_column("n").to_numpy()
    both = np.flatnonzero(overlap > 1)
    if both.size:
        row = int(both[0])
        hit = [names[i] for i, v in enumerate(masks.row(row)) if v]
        raise SamplingConfigError(
            f"table row {row} belongs to streams {hit[0]!r} and {hit[1]!r}; streams must not overlap"
        )
    weights = frame.get_column(WEIGHT_COLUMN).to_numpy().astype(np.float64) if WEIGHT_COLUMN in frame.columns else None
    rows: dict[str, np.ndarray] = {}
    stream_weights: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        selected = np.flatnonzero(masks.get_column(f"s{i}").to_numpy())
        if selected.size == 0:
            raise EmptyStreamError(f"stream {name!r} ({streams[name].describe()}) selects no active row")
        rows[name] = selected.astype(np.int64)
        if weights is not None:
            stream_weights[name] = weights[selected]
    return StreamRows(rows, stream_weights or None)
