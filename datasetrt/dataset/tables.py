"""A dataset's metadata tables: the caches' own (physical) table, decoded once on first use, its
Arrow form for batch metadata and `sample_columns`, and the validation of a user's active table.

Boundary: Polars and pyarrow are imported here lazily (through `table/`), at the first call that
needs them: a dataset that only reads payloads never loads them. No sampling state.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from datasetrt.errors import ArgumentTypeError, ConfigError, MetadataTypeError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.memory import return_freed_heap
from datasetrt.sampling.planner import ActiveRows, Population
from datasetrt.table.catalog import CacheCatalog

if TYPE_CHECKING:
    import polars as pl


class DatasetTables:
    """The tables of the caches `handles` (catalog order) with metadata schema `schema`. The
    physical table never changes once decoded; the Arrow form is kept for the last frame asked
    for (the active table a population was validated from, or the physical one)."""

    def __init__(self, catalog: CacheCatalog, schema: Any, handles: Sequence[CacheHandle]) -> None:
        self.catalog = catalog
        self.schema = schema
        self.handles = list(handles)
        self._physical: pl.DataFrame | None = None
        self._physical_ref: weakref.ref[pl.DataFrame] | None = None
        self._arrow: tuple[Any, Any] | None = None

    def physical(self) -> pl.DataFrame:
        """The caches' own metadata table (decoded on first use, then kept while it is the
        dataset's table; after `release_physical`, kept only while someone else holds it)."""
        if self._physical is None:
            held = self._physical_ref() if self._physical_ref is not None else None
            if held is not None:
                return held
            from datasetrt.table.metadata import physical_table  # lazily: imports Polars and pyarrow

            self._physical = physical_table(self.catalog, self.schema, lambda k: self.handles[k].read_metadata())
            return_freed_heap()  # the decode's per-row temporaries
        return self._physical

    def release_physical(self) -> None:
        """Stop holding the physical table (an active table replaced it): its 32 B per physical
        row stay alive only while the user keeps the frame; `physical()` decodes it again after."""
        frame = self._physical
        if frame is not None:
            self._physical_ref = weakref.ref(frame)
            self._physical = None
            if self._arrow is not None and self._arrow[0] is frame:
                self._arrow = None

    def frame(self, population: Population | None) -> pl.DataFrame:
        """The table whose rows a population's planner rows index: the frame that population was
        validated from, or the physical table (also for None)."""
        if population is None or population.table is None:
            return self.physical()
        # Population keeps its table opaque (planning never imports Polars); the dataset only ever
        # sets it to the DataFrame that `validated` accepted.
        return cast("pl.DataFrame", population.table)

    def arrow(self, population: Population | None) -> Any:
        """pyarrow form of `frame(population)` (cached for the last frame asked for)."""
        frame = self.frame(population)
        if self._arrow is None or self._arrow[0] is not frame:
            self._arrow = (frame, frame.to_arrow())
        return self._arrow[1]

    def validated(self, df: Any) -> ActiveRows:
        """The active rows of a user's table (`MetadataTypeError` for anything but a Polars
        DataFrame; the table layer's typed errors for a table that does not fit the caches)."""
        import polars as pl  # lazily, with table.metadata: a plain read never imports Polars

        from datasetrt.table.metadata import validate_update

        if not isinstance(df, pl.DataFrame):
            raise MetadataTypeError(f"update_metadata expects a polars.DataFrame, got {type(df).__name__}")
        return validate_update(df, self.catalog, self.schema)

    def sample_columns(self, cache_id: np.ndarray, sample_id: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
        """Columns `names` of the caches' own tables for the samples (cache_id, sample_id):
        numeric and boolean columns as numpy arrays, others as object arrays, each of n entries.
        ConfigError naming a missing column. O(n) after the table's first decode."""
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ArgumentTypeError("sample_columns() takes a list of column names")
        table = self.arrow(None)
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise ConfigError(f"no metadata column {missing[0]!r}; the columns are {table.column_names}")
        catalog = self.catalog
        rows = catalog.offsets[catalog.positions(np.asarray(cache_id, dtype=np.uint64))] + np.asarray(
            sample_id, dtype=np.int64
        )
        part = table.select(list(names)).take(rows)
        return {n: part.column(n).to_numpy() for n in names}

    def grouped(self, population: Population, order: Any, cache_paths: Sequence[Any]) -> Population:
        """`population` with `order`'s streams grouped from its table (Polars, once)."""
        from datasetrt.table.streams import group_streams  # lazily: imports Polars

        caches: dict[str | os.PathLike, int] = {
            str(path): int(cid) for path, cid in zip(cache_paths, self.catalog.cache_ids.tolist())
        }
        return population.with_order(order, group_streams(self.frame(population), order.streams, caches))
