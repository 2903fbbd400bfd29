"""Populations built from rows and shipped to other processes: a selection of a population's rows
(keeping its mixture or curriculum), and the export another process rebuilds a population from.

Boundary: numpy arrays and sampling values in and out; no I/O, no Polars. A carrier (the torch
population snapshot) stores a `PopulationExport`'s arrays as they are, without knowing the names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datasetrt.sampling.curriculum import Curriculum
from datasetrt.sampling.mixture import Mixture, StreamRows
from datasetrt.sampling.permutation import EXACTLY_ONCE
from datasetrt.sampling.planner import ActiveRows, Population
from datasetrt.table.catalog import CacheCatalog


@dataclass(frozen=True)
class PopulationExport:
    """A population as another process rebuilds it (`import_population`): `columns`, named 1-D
    numpy arrays of one entry per population row, `params`, a few named floats, and `order`, an
    opaque picklable value (the mixture or curriculum set over the rows, or None). Only
    `export_population` and `import_population` know the names."""

    columns: dict[str, np.ndarray]
    params: dict[str, float]
    order: Mixture | Curriculum | None = None  # picklable

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


def from_rows(
    catalog: CacheCatalog,
    cache_pos: np.ndarray,
    sample_id: np.ndarray,
    weights: np.ndarray,
    *,
    source: Population | None = None,
    selection: np.ndarray | None = None,
) -> Population:
    """A population of these (trusted) rows. With `source` (the population they were selected
    from) and `selection` (int64: their rows in `source`, in order; None: all of them), the new
    population keeps `source`'s mixture or curriculum, its streams regrouped to the selection
    (`EmptyStreamError` if a stream has no row left)."""
    population = Population(catalog, ActiveRows(cache_pos, sample_id, weights))
    if source is None or source.order is None:
        return population
    order, streams = source.order, source.streams
    assert streams is not None  # a population's order and streams are set together
    index = streams.index(len(source))
    if selection is not None:
        index = index[selection]
    return population.with_order(order, StreamRows.from_index(tuple(order.streams), index, weights))


def export_population(population: Population, sampling: str) -> PopulationExport | None:
    """`population` as `import_population` rebuilds it in another process; None for the
    physical population of dataset-rt's orders (nothing to ship). An exactly-once order or a
    mixture or curriculum adds the rows' weights (repeat counts); a mixture or curriculum
    travels as its configuration and one int16 stream column (never regrouped from the table)."""
    described = population.columns()
    order = population.order
    if order is None and sampling not in EXACTLY_ONCE:
        return None if described is None else PopulationExport(*described)
    columns, params = described if described is not None else ({}, {})
    if population.active is not None and population.active.weights is not None:
        columns = {**columns, "weights": population.active.weights}
    if order is not None:
        assert population.streams is not None  # a population's order and streams are set together
        columns = {**columns, "stream": population.streams.index(len(population))}
    return PopulationExport(columns, params, order) if columns else None


def import_population(catalog: CacheCatalog, export: PopulationExport | None) -> Population:
    """The population `export_population` exported (its arrays used as they are)."""
    if export is None:
        return Population(catalog)
    columns = export.columns
    population = Population.from_columns(catalog, columns if "cache_pos" in columns else None, export.params)
    order = export.order
    if order is None:
        return population
    weights = None if population.active is None else population.active.weights
    return population.with_order(order, StreamRows.from_index(tuple(order.streams), columns["stream"], weights))
