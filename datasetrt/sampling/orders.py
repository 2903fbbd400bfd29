"""Which order a population's windows follow: the pure selection between dataset-rt's ordered
cursor and shuffled draws (`Window`), an exactly-once permutation, a locality-aware one, and a
stream order's plan (`PlanWindow` over `MixturePlan` / `CurriculumPlan`, each stream in
locality-aware epochs under sampling="locality").

Boundary: a population, a seed and an `Ordering` (the reader configuration's `sampling` and
`window_shards`, and how to find a row's shard) in; a plan or a window out. No I/O, no Polars, no
dataset state: `CachedDataset` keeps the positions and calls these with them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datasetrt.errors import SamplingConfigError
from datasetrt.sampling.curriculum import Curriculum, CurriculumPlan
from datasetrt.sampling.curriculum import order_identity as stream_order_identity
from datasetrt.sampling.locality import Locality, LocalityPermutation, blocks_digest
from datasetrt.sampling.permutation import EXACTLY_ONCE, EpochPermutation, repeat_counts
from datasetrt.sampling.planner import PlanWindow, Population, RowPlan, Window
from datasetrt.sampling.plans import MixturePlan, SegmentedPlan
from datasetrt.sampling.ranks import RankedLocality, RankSplit


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
    def locality(self) -> bool:
        return self.sampling == "locality"

    def shards(self, population: Population) -> np.ndarray:
        """The shard of each row of `population` (int64; `SamplingConfigError` without `blocks`)."""
        if self.blocks is None:
            raise SamplingConfigError("sampling='locality' needs the caches' shard of each row (a dataset's ordering)")
        return self.blocks(population)


def position_plan(population: Population, seed: int, ordering: Ordering) -> RowPlan | None:
    """The position plan of shuffled windows over `population` under `seed`: its stream order's
    (`MixturePlan`, `CurriculumPlan`), else an exactly-once order (`EpochPermutation`, or
    `LocalityPermutation` for sampling="locality"; integer weights as repeat counts), else None
    (dataset-rt's draws, `Window`). Built once per population, seed and ordering (O(rows) at
    most) and kept by the population."""
    order, streams = population.order, population.streams
    if order is not None:
        assert streams is not None  # a population's order and streams are set together
        local = ordering.window_shards if ordering.locality else None
        return population.plan(("streams", seed, local), lambda: stream_plan(population, seed, ordering))
    if not ordering.exactly_once or not len(population):
        return None
    if ordering.locality:
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


def stream_plan(population: Population, seed: int, ordering: Ordering) -> SegmentedPlan:
    """The plan of `population`'s mixture or curriculum; with sampling="locality", each stream's
    exactly-once epochs in its locality-aware order over its rows' shards (a weighted mixture is
    refused: `SamplingConfigError`)."""
    order, streams = population.order, population.streams
    assert order is not None and streams is not None  # a population's order and streams are set together
    locality = Locality(ordering.window_shards, ordering.shards(population)) if ordering.locality else None
    if isinstance(order, Curriculum):
        return CurriculumPlan(order, streams, seed, locality=locality)
    return MixturePlan(order, streams, seed, locality=locality)


def locality_permutation(population: Population, seed: int, ordering: Ordering) -> LocalityPermutation:
    """The locality-aware exactly-once order of `population` (`RepeatCountError` naming the row
    for a weight that is not a repeat count; `SamplingConfigError` without a way to find shards)."""
    active = population.active
    counts = None
    if active is not None and active.weights is not None:
        counts = repeat_counts(active.weights, _identify(population))
    return LocalityPermutation(seed, ordering.shards(population), ordering.window_shards, counts)


def permutation(population: Population, seed: int) -> EpochPermutation:
    """The exactly-once order of `population`: every row once per epoch, or its weight times
    (`RepeatCountError` naming the row, its cache_id and sample_id for a weight that is not a
    repeat count)."""
    active = population.active
    if active is None or active.weights is None:
        return EpochPermutation(seed, len(population))
    return EpochPermutation.from_weights(seed, active.weights, identify=_identify(population))


def window(
    population: Population,
    start: int,
    length: int,
    *,
    shuffle: bool,
    seed: int,
    ordering: Ordering,
    ranks: RankSplit | None = None,
) -> Window | PlanWindow:
    """`length` positions of the order over `population` from position `start` (dataset-rt's
    cursor or draw index, or a position of the population's plan). With `ranks`, a window that
    starts an epoch of a locality-aware order and is one epoch long reads the order re-planned
    for those ranks (`ranked_plan`); any other order or window is as without."""
    plan = position_plan(population, seed, ordering) if shuffle else None
    epoch = isinstance(plan, LocalityPermutation) and length == plan.positions_per_epoch and start % length == 0
    if ranks is not None and ranks.world > 1 and epoch:
        plan = ranked_plan(population, seed, ordering, ranks)
    if plan is not None:
        return PlanWindow(population, plan, start, length)
    return Window(population, shuffle, seed, start, length)


def ranked_plan(population: Population, seed: int, ordering: Ordering, ranks: RankSplit) -> RankedLocality:
    """The locality-aware order of `population` re-planned per epoch for `ranks` (ranks.py), built
    once per population, seed, window and split over the population's locality order."""
    base = position_plan(population, seed, ordering)
    assert isinstance(base, LocalityPermutation)
    key = ("locality-ranks", seed, ordering.window_shards, ranks)
    plan = population.plan(key, lambda: RankedLocality(base, ranks))
    assert isinstance(plan, RankedLocality)
    return plan


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
    "permutation", "locality:<W>:<digest of the rows' shards>", or "mixture:" / "curriculum:" and
    a BLAKE2b digest of the configuration (streams, their rows and weights, proportions, options,
    stages), "mixture+locality:<W>:" / "curriculum+locality:<W>:" and one digest of both with
    sampling="locality". The shards' digest is computed once per population (O(rows log rows))."""
    order, streams = population.order, population.streams
    if not ordering.locality:
        if order is None:
            return ordering.sampling
        assert streams is not None  # a population's order and streams are set together
        return stream_order_identity(order, streams)
    shards = population.memo(("locality-shards",), lambda: _shards_digest(population, ordering))
    if order is None:
        return f"locality:{ordering.window_shards}:{shards}"
    assert streams is not None
    kind, digest = stream_order_identity(order, streams).split(":", 1)
    both = hashlib.blake2b(f"{digest}|{shards}".encode(), digest_size=16).hexdigest()
    return f"{kind}+locality:{ordering.window_shards}:{both}"


def _shards_digest(population: Population, ordering: Ordering) -> str:
    """`blocks_digest` of the rows' shards; per stream (in stream order) under a mixture or
    curriculum, since each stream's order numbers its own shards."""
    shards = ordering.shards(population)
    streams = population.streams
    if streams is None:
        return blocks_digest(shards)
    h = hashlib.blake2b(digest_size=16)
    for name in streams.names:
        rows = streams.rows[name]
        h.update(blocks_digest(shards[slice(rows.start, rows.stop) if isinstance(rows, range) else rows]).encode())
    return h.hexdigest()
