"""Which order a population's windows follow: the pure selection between dataset-rt's ordered
cursor and shuffled draws (`Window`), an exactly-once permutation and a stream order's plan
(`PlanWindow` over `MixturePlan` / `CurriculumPlan`).

Boundary: a population, a seed and the reader configuration's `shuffle` / `sampling` in; a plan
or a window out. No I/O, no Polars, no dataset state: `CachedDataset` keeps the positions and
calls these with them.
"""

from __future__ import annotations

from datasetrt.sampling.curriculum import Curriculum, CurriculumPlan
from datasetrt.sampling.curriculum import order_identity as stream_order_identity
from datasetrt.sampling.permutation import EpochPermutation
from datasetrt.sampling.planner import PlanWindow, Population, RowPlan, Window
from datasetrt.sampling.plans import MixturePlan, SegmentedPlan


def position_plan(population: Population, seed: int, sampling: str) -> RowPlan | None:
    """The position plan of shuffled windows over `population` under `seed`: its stream order's
    (`MixturePlan`, `CurriculumPlan`), else with sampling="permutation" an `EpochPermutation`
    (integer weights as repeat counts), else None (dataset-rt's draws, `Window`). Built once per
    population and seed (O(rows) at most) and kept by the population."""
    order = population.order
    if order is not None:
        planner = CurriculumPlan if isinstance(order, Curriculum) else MixturePlan
        return population.plan(("streams", seed), lambda: planner(order, population.streams, seed))
    if sampling != "permutation" or not len(population):
        return None
    return population.plan(("permutation", seed), lambda: permutation(population, seed))


def permutation(population: Population, seed: int) -> EpochPermutation:
    """The exactly-once order of `population`: every row once per epoch, or its weight times
    (`RepeatCountError` naming the row, its cache_id and sample_id for a weight that is not a
    repeat count)."""
    active = population.active
    if active is None or active.weights is None:
        return EpochPermutation(seed, len(population))
    ids = population.catalog.cache_ids

    def identify(row: int) -> str:
        return f"row {row} (cache_id {int(ids[int(active.cache_pos[row])])}, sample_id {int(active.sample_id[row])})"

    return EpochPermutation.from_weights(seed, active.weights, identify=identify)


def window(
    population: Population, start: int, length: int, *, shuffle: bool, seed: int, sampling: str
) -> Window | PlanWindow:
    """`length` positions of the order over `population` from position `start` (dataset-rt's
    cursor or draw index, or a position of the population's plan)."""
    plan = position_plan(population, seed, sampling) if shuffle else None
    if plan is not None:
        return PlanWindow(population, plan, start, length)
    return Window(population, shuffle, seed, start, length)


def epoch_positions(population: Population, *, shuffle: bool, seed: int, sampling: str) -> int:
    """Positions of one epoch over `population`: its rows (dataset-rt's orders), the repeat
    counts' sum (exactly-once order), the streams' epochs together (a mixture or curriculum; at
    most the plan's length when it stops)."""
    plan = position_plan(population, seed, sampling) if shuffle else None
    if plan is None:
        return len(population)
    if isinstance(plan, EpochPermutation):
        return plan.positions_per_epoch
    assert isinstance(plan, SegmentedPlan)
    total = int(plan.stream_sizes.sum())
    return total if plan.length is None else min(total, plan.length)


def order_identity(population: Population, sampling: str) -> str:
    """What orders `population`'s shuffled windows, for resume states: "draws" (dataset-rt's),
    "permutation", or "mixture:" / "curriculum:" and a BLAKE2b digest of the configuration
    (streams, their rows and weights, proportions, options, stages)."""
    if population.order is None:
        return sampling
    return stream_order_identity(population.order, population.streams)
