"""Which order a population's windows follow: the pure selection between dataset-rt's ordered
cursor and shuffled draws (`Window`), an exactly-once permutation and a stream order's plan
(`PlanWindow` over `MixturePlan` / `CurriculumPlan`).

Boundary: a population, a seed and an `Ordering` (the reader configuration's `sampling` and
`window_shards`, and how to find a row's shard) in; a plan or a window out. No I/O, no Polars, no
dataset state: `CachedDataset` keeps the positions and calls these with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datasetrt.sampling.curriculum import Curriculum, CurriculumPlan
from datasetrt.sampling.curriculum import order_identity as stream_order_identity
from datasetrt.sampling.locality import LocalityPermutation
from datasetrt.sampling.permutation import EXACTLY_ONCE, EpochPermutation, repeat_counts
from datasetrt.sampling.planner import PlanWindow, Population, RowPlan, Window
from datasetrt.sampling.plans import MixturePlan, SegmentedPlan


@dataclass(frozen=True)
class Ordering:
    """How shuffled windows are ordered when no mixture or curriculum is set: `sampling`
    ("draws": dataset-rt's; "permutation": exactly-once epochs; "locality": exactly-once epochs
    read `window_shards` shards at a time) and, for "locality", `blocks(population)`: the shard
    of each population row as int64 ids (dense or not; rows of one shard share an id)."""

    sampling: str = "draws"
    window_shards: int = 8
    blocks: Callable[[Population], np.ndarray] | None = None

    @property
    def exactly_once(self) -> bool:
        return self.sampling in EXACTLY_ONCE

    @property
    def identity(self) -> str:
        """The ordering as resume states name it: "draws", "permutation", "locality:<W>"."""
        return f"locality:{self.window_shards}" if self.sampling == "locality" else self.sampling


def position_plan(population: Population, seed: int, ordering: Ordering) -> RowPlan | None:
    """The position plan of shuffled windows over `population` under `seed`: its stream order's
    (`MixturePlan`, `CurriculumPlan`), else an exactly-once order (`EpochPermutation`, or
    `LocalityPermutation` for sampling="locality"; integer weights as repeat counts), else None
    (dataset-rt's draws, `Window`). Built once per population, seed and ordering (O(rows) at
    most) and kept by the population."""
    order, streams = population.order, population.streams
    if order is not None:
        assert streams is not None  # a population's order and streams are set together
        if isinstance(order, Curriculum):
            return population.plan(("streams", seed), lambda: CurriculumPlan(order, streams, seed))
        return population.plan(("streams", seed), lambda: MixturePlan(order, streams, seed))
    if not ordering.exactly_once or not len(population):
        return None
    if ordering.sampling == "locality":
        return population.plan(
            ("locality", seed, ordering.window_shards), lambda: locality_permutation(population, seed, ordering)
        )
    return population.plan(("permutation", seed), lambda: permutation(population, seed))


def _identify(population: Population) -> Callable[[int], str]:
    active = population.active
    ids = population.catalog.cache_ids
    assert active is not None

    def identify(row: int) -> str:
        return f"row {row} (cache_id {int(ids[int(active.cache_pos[row])])}, sample_id {int(active.sample_id[row])})"

    return identify


def locality_permutation(population: Population, seed: int, ordering: Ordering) -> LocalityPermutation:
    """The locality-aware exactly-once order of `population` (`RepeatCountError` naming the row
    for a weight that is not a repeat count; `SamplingConfigError` without a way to find shards)."""
    if ordering.blocks is None:
        from datasetrt.errors import SamplingConfigError

        raise SamplingConfigError("sampling='locality' needs the caches' shard of each row (a dataset's ordering)")
    active = population.active
    counts = None
    if active is not None and active.weights is not None:
        counts = repeat_counts(active.weights, _identify(population))
    return LocalityPermutation(seed, ordering.blocks(population), ordering.window_shards, counts)


def permutation(population: Population, seed: int) -> EpochPermutation:
    """The exactly-once order of `population`: every row once per epoch, or its weight times
    (`RepeatCountError` naming the row, its cache_id and sample_id for a weight that is not a
    repeat count)."""
    active = population.active
    if active is None or active.weights is None:
        return EpochPermutation(seed, len(population))
    return EpochPermutation.from_weights(seed, active.weights, identify=_identify(population))


def window(
    population: Population, start: int, length: int, *, shuffle: bool, seed: int, ordering: Ordering
) -> Window | PlanWindow:
    """`length` positions of the order over `population` from position `start` (dataset-rt's
    cursor or draw index, or a position of the population's plan)."""
    plan = position_plan(population, seed, ordering) if shuffle else None
    if plan is not None:
        return PlanWindow(population, plan, start, length)
    return Window(population, shuffle, seed, start, length)


def epoch_positions(population: Population, *, shuffle: bool, seed: int, ordering: Ordering) -> int:
    """Positions of one epoch over `population`: its rows (dataset-rt's orders), the repeat
    counts' sum (exactly-once order), the streams' epochs together (a mixture or curriculum; at
    most the plan's length when it stops)."""
    plan = position_plan(population, seed, ordering) if shuffle else None
    if plan is None:
        return len(population)
    if isinstance(plan, (EpochPermutation, LocalityPermutation)):
        return plan.positions_per_epoch
    assert isinstance(plan, SegmentedPlan)
    total = int(plan.stream_sizes.sum())
    return total if plan.length is None else min(total, plan.length)


def order_identity(population: Population, ordering: Ordering) -> str:
    """What orders `population`'s shuffled windows, for resume states: "draws" (dataset-rt's),
    "permutation", "locality:<W>", or "mixture:" / "curriculum:" and a BLAKE2b digest of the
    configuration (streams, their rows and weights, proportions, options, stages)."""
    order, streams = population.order, population.streams
    if order is None:
        return ordering.identity
    assert streams is not None  # a population's order and streams are set together
    return stream_order_identity(order, streams)
