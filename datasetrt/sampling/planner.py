"""Pure planning: which (cache position, sample_id) each position of an iterator window reads.

Boundary: numpy in, numpy out; no I/O. Bit-compatible with dataset-rt 0.4.8 (docs/determinism.md):
* ordered: window rows (start + k) mod n_rows over the population;
* shuffled, physical population (no update_metadata yet): draw d picks global physical index
  uniform_draws(seed, N, d) — ChaCha8 per draw, computed in the native kernel in blocks;
* shuffled, active population (after update_metadata): weighted_draws over the active rows.
Windows are planned lazily, any range of positions at a time (`Window.rows`), so an epoch of any
length costs memory only for the range being read. `PlanWindow` is the same reader-facing shape
over a position plan (exactly-once epochs, mixtures, curricula: permutation.py, plans.py,
curriculum.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from datasetrt._native import draws
from datasetrt.errors import EmptyStreamError
from datasetrt.table.catalog import CacheCatalog

T = TypeVar("T")

if TYPE_CHECKING:  # annotations only: planning imports no stream-order code
    from datasetrt.sampling.curriculum import Curriculum
    from datasetrt.sampling.mixture import Mixture, StreamRows


@dataclass(frozen=True)
class ActiveRows:
    """The validated active population.

    `cache_pos` (positions in the catalog: int32 from `update_metadata` while the catalog has
    fewer than 2**31 caches, int64 otherwise; any integer dtype is accepted), `sample_id`
    (uint64) and `weights` (float64, positive, finite) have one entry per active row, duplicates
    included, in table order.
    `weights` may be None where only the precomputed cumulative sums travel (a population
    rebuilt by `Population.from_columns` from columns without weights).
    Lives here, not in table/, so that planning never imports Polars.
    """

    cache_pos: np.ndarray
    sample_id: np.ndarray
    weights: np.ndarray | None

    def __len__(self) -> int:
        return len(self.cache_pos)


class Population:
    """The rows a window draws from: either all physical samples or the validated active rows.

    `cum`/`scale` may be given precomputed (`from_columns`: a spawned torch DataLoader worker maps
    them from its population snapshot). `table` is opaque here: the table
    this population was validated from (batch metadata reads its rows), or None for the physical
    population. `order` and `streams` (a `Mixture` or `Curriculum` and the `StreamRows` of these
    rows, set together, or both None) are the stream order the dataset set over these rows
    (`CachedDataset.set_mixture`, `set_curriculum`). `plan(key, build)` keeps the position plans
    built over this population (one per order and seed), so an O(rows) plan table is computed
    once per population, before DataLoader workers fork.
    """

    def __init__(
        self,
        catalog: CacheCatalog,
        active: ActiveRows | None = None,
        cum: np.ndarray | None = None,
        scale: float = 0.0,
        table: object = None,
        order: Mixture | Curriculum | None = None,
        streams: StreamRows | None = None,
    ) -> None:
        self.catalog = catalog
        self.active = active
        self.table = table
        self.order = order
        self.streams = streams
        self._cum = cum
        self._scale = scale
        self._plans: dict[Hashable, RowPlan] = {}
        self._memo: dict[Hashable, Any] = {}

    def with_order(self, order: Mixture | Curriculum | None, streams: StreamRows | None) -> Population:
        """These rows (and their table and weighted sampler sums) with another stream order (None: none)."""
        return Population(self.catalog, self.active, self._cum, self._scale, self.table, order, streams)

    def plan(self, key: Hashable, build: Callable[[], RowPlan]) -> RowPlan:
        """The plan `build()` made for `key` over this population (built at the first call)."""
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build()
        return plan

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """The value `build()` computed for `key` over these rows (computed at the first call):
        what orders derive from the rows once (e.g. a digest of their shards)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def __len__(self) -> int:
        return len(self.active) if self.active is not None else self.catalog.total

    @property
    def weighted(self) -> bool:
        """True once an active table exists: shuffled draws use WeightedIndex, as dataset-rt."""
        return self.active is not None

    def resolve(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Population rows -> (cache position int64, sample_id uint64), whatever dtype the
        active rows keep their positions in."""
        if self.active is None:
            return self.catalog.locate(rows)
        return self.active.cache_pos[rows].astype(np.int64, copy=False), self.active.sample_id[rows]

    def cumulative(self) -> tuple[np.ndarray, float]:
        """(cum, scale) of the weights for weighted draws; computed once per population."""
        assert self.active is not None
        if self._cum is None:
            weights = self.active.weights
            assert weights is not None  # weights are None only beside precomputed sums (`from_columns`)
            self._cum, self._scale = draws.weighted_cumulative(weights)
        return self._cum, self._scale

    def rows(self) -> ActiveRows:
        """The active rows, or every physical sample in physical order with weight 1.0 (24 B per
        row, vectorised)."""
        if self.active is not None:
            return self.active
        cache_pos, sample_id = self.catalog.locate(np.arange(self.catalog.total, dtype=np.int64))
        return ActiveRows(cache_pos, sample_id, np.ones(len(cache_pos), dtype=np.float64))

    def columns(self) -> tuple[dict[str, np.ndarray], dict[str, float]] | None:
        """What rebuilds this population in another process (`from_columns`): columns of one
        entry per row — cache_pos (the active rows' dtype), sample_id uint64, cum float64 (the weighted sampler's
        running sums, computed here once; the last entry is padding) — and the sampler's scale.
        None for the physical population (rebuilt from the catalog alone). `from_columns` also
        takes an optional weights float64 column (added by the dataset when its order needs the
        weights: an exactly-once order's repeat counts)."""
        if self.active is None:
            return None
        cum, scale = self.cumulative()
        padded = np.zeros(len(self.active), dtype=np.float64)
        padded[: len(cum)] = cum
        return {"cache_pos": self.active.cache_pos, "sample_id": self.active.sample_id, "cum": padded}, {"scale": scale}

    @classmethod
    def from_columns(
        cls, catalog: CacheCatalog, columns: dict[str, np.ndarray] | None, params: dict[str, float]
    ) -> Population:
        """The population `columns()` described (arrays used as they are: views of a mapped file
        stay views), or the physical population for None."""
        if columns is None:
            return cls(catalog)
        cum = columns["cum"][: max(len(columns["cum"]) - 1, 0)]
        return cls(
            catalog,
            ActiveRows(columns["cache_pos"], columns["sample_id"], columns.get("weights")),
            cum=cum,
            scale=params["scale"],
        )


@dataclass(frozen=True)
class Window:
    """One iterator's reserved window: `length` rows starting at `start` (cursor or draw index)."""

    population: Population
    shuffle: bool
    seed: int
    start: int
    length: int

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows for window positions [first, first+count). An empty population (a
        cache of no samples, every row filtered out) has no rows to give: no positions are
        planned over it (EmptyStreamError for count > 0)."""
        n = len(self.population)
        if n == 0:
            if count > 0:
                raise EmptyStreamError(
                    f"cannot plan {count} positions over an empty population: the caches hold no samples "
                    "(or no active row is left)"
                )
            return np.empty(0, dtype=np.int64)
        if not self.shuffle:
            return (np.arange(first, first + count, dtype=np.int64) + self.start) % n
        begin = (self.start + first) & 0xFFFFFFFFFFFFFFFF
        if self.population.weighted:
            cum, scale = self.population.cumulative()
            return draws.weighted_draws(self.seed, cum, scale, begin, count).astype(np.int64)
        return draws.uniform_draws(self.seed, n, begin, count).astype(np.int64)

    def sub(self, first: int, count: int) -> Window:
        """The window of this window's positions [first, first+count), as `PlanWindow.sub` cuts
        one; positions past `length` continue the same stream (the windows reserved after it)."""
        return Window(
            self.population,
            self.shuffle,
            self.seed,
            advance(self.shuffle, self.start, first, len(self.population)),
            count,
        )


def advance(shuffle: bool, position: int, length: int, n_rows: int) -> int:
    """Dataset position after reserving a window: cursor + len mod n (ordered), or draw + len.
    An ordered cursor over no rows stays 0 (its windows are empty: `Window.rows`)."""
    if shuffle:
        return (position + length) & 0xFFFFFFFFFFFFFFFF
    return (position + length) % n_rows if n_rows else 0


class RowPlan(Protocol):
    """A position plan: population rows (int64) of plan positions [first, first+count), a pure
    function of the plan's configuration, seed and the positions (EpochPermutation, MixturePlan,
    CurriculumPlan)."""

    def rows(self, first: int, count: int) -> np.ndarray: ...


@dataclass(frozen=True)
class PlanWindow:
    """One iterator's window over a position plan: `length` plan positions from `start`. Readers
    use it as a `Window` (`population`, `length`, `rows(first, count)`); `sub` cuts it for shares.
    The dataset position after it is `start + length` (plan positions never wrap)."""

    shuffle: ClassVar[bool] = True  # a position plan is a shuffled order: its position is the draw offset

    population: Population
    plan: RowPlan
    start: int
    length: int

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows for window positions [first, first+count)."""
        return self.plan.rows(self.start + first, count)

    def sub(self, first: int, count: int) -> PlanWindow:
        """The window of this window's positions [first, first+count)."""
        return PlanWindow(self.population, self.plan, self.start + first, count)
