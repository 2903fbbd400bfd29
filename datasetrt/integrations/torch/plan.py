"""Torch-free planning of the torch integration: which plan positions each rank and each
DataLoader worker reads in one pass, and which window a pass is.

Boundary: numpy and plain integers only; no torch, no dataset, no I/O (importable and testable
without torch: tests/unit/integrations/test_torch_plan.py). Windows arrive from the dataset's
integration seam (`CachedDataset.peek_window`, `reserve_window`, `plan_window`) and are used
only through `population`, `length`, `rows(first, count)` and `sub(first, count)`, so any plan
the dataset builds (dataset-rt's draws, exactly-once permutations, mixtures) divides the same way.

One plan per pass. With K DataLoader workers, worker w reads the rank's batches w, w+K, w+2K, ...
(`_Share`); torch gathers worker batches round-robin, so with block rows == batch size the
batches come out in plan order for any K, and the union over workers is the plan, each planned
sample once.

Ranks (torchrun / torch.distributed): every rank plans the same global pass and reads its
`_Layout` of it: steps of world_size batches, rank r taking batch r of each step, the short last
step split evenly, padding wrapped to the start of the pass (dataset-rt's per-rank counts and
warning, reference §3.3). After s batches on every rank the ranks have consumed a prefix of the
pass, so a state resumes on any world size and worker count. Docs: docs/distributed.md. What the
pass's positions hold may depend on the world size: a locality-aware order plans an epoch-long
pass for the ranks that read it (`rank_layout` of `plan_window`; docs/sampling.md, "Ranks"), so
that rank r's batches come from its own shards; the layout here is the same for every order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

SPAN_CALL_ROWS = 64  # a plan call costs about as much as computing this many extra draws


def rank_count(rows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Rows each rank reads out of `rows` global rows (reference §3.3): ceil(rows/R), or
    B*floor(rows/(R*B)) with drop_last; 0 when rows <= 0."""
    if rows <= 0:
        return 0
    if drop_last:
        return batch_size * (rows // (world_size * batch_size))
    return -(-rows // world_size)


@dataclass(frozen=True)
class RankShare:
    """dataset-rt's per-rank arithmetic for `requested` global samples per pass (reference §3.3)."""

    requested: int
    world_size: int
    per_rank: int
    effective: int  # per_rank * world_size
    padded: int  # effective - requested when positive (rows read twice)
    discarded: int  # requested - effective when positive (drop_last)

    @property
    def message(self) -> str | None:
        """dataset-rt's rank-0 UserWarning text, or None when nothing is adjusted."""
        if self.effective == self.requested:
            return None
        word, k = ("padded", self.padded) if self.padded else ("discarded", self.discarded)
        return (
            f"samples_per_epoch adjusted: requested {self.requested} global samples, effective "
            f"{self.effective}; {word} {k} for equal rank batch counts"
        )


def rank_share(requested: int, world_size: int, batch_size: int, drop_last: bool) -> RankShare:
    per_rank = rank_count(requested, world_size, batch_size, drop_last)
    effective = per_rank * world_size
    return RankShare(
        requested, world_size, per_rank, effective, max(0, effective - requested), max(0, requested - effective)
    )


@dataclass(frozen=True)
class _Layout:
    """Rank `rank` of `world`'s rows of one pass of `total` plan positions, from position `start`
    (rows the ranks already consumed together) on, in this rank's order.

    The remaining positions [start, total) are cut into steps of `world` batches: rank r reads
    batch r of every full step, then its slice of `tail` rows of the last, short step; positions
    past `total` (padding) wrap to the start of the pass. Each rank reads `per_rank` rows
    (`rank_count` of the remaining rows), so all ranks have the same batch count; after s
    batches on every rank, the consumed positions are exactly [start, start + s*world*batch),
    a prefix of the pass (resume with another world size continues from there).
    """

    total: int
    start: int
    batch: int
    drop_last: bool
    rank: int = 0
    world: int = 1

    @property
    def per_rank(self) -> int:
        return rank_count(self.total - self.start, self.world, self.batch, self.drop_last)

    @property
    def batches(self) -> int:
        return -(-self.per_rank // self.batch)

    def positions(self, j: np.ndarray) -> np.ndarray:
        """Pass positions (int64) of this rank's rows j (0 <= j < per_rank)."""
        b, world = self.batch, self.world
        full, tail = divmod(self.per_rank, b)
        q, o = np.divmod(j, b)
        p = np.where(q < full, (q * world + self.rank) * b + o, full * world * b + self.rank * tail + o)
        return (self.start + p) % self.total


def _window_rows(window: Any, pos: np.ndarray) -> np.ndarray:
    """Population rows of window positions `pos` (any order): one plan call over their span, or
    one per contiguous run when that computes far fewer draws."""
    n = len(pos)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    if len(breaks) == 0:
        return window.rows(int(pos[0]), n)
    lo, hi = int(pos.min()), int(pos.max())
    if (len(breaks) + 1) * SPAN_CALL_ROWS + n >= hi + 1 - lo:
        return window.rows(lo, hi + 1 - lo)[pos - lo]
    return np.concatenate([window.rows(int(run[0]), len(run)) for run in np.split(pos, breaks)])


class _Share:
    """Worker `worker` of `workers`' part of a rank's `layout` of `window`, itself window-like
    (`population`, `length`, `rows(first, count)`: what the dataset's readers take): the rank's
    batches worker, worker + workers, ... (of `layout.batch` rows), in order. Torch gathers worker
    batches round-robin, so the rank's batches come out in layout order for any worker count; the
    rank's first remaining batch always goes to worker 0.
    Without `layout`: a single rank's blocks of `block_rows` from block `first_block` on.
    """

    def __init__(
        self,
        window: Any,
        worker: int = 0,
        workers: int = 1,
        block_rows: int = 1,
        first_block: int = 0,
        *,
        layout: _Layout | None = None,
    ) -> None:
        if layout is None:
            layout = _Layout(window.length, min(first_block * block_rows, window.length), block_rows, False)
        self.window = window
        self.population = window.population
        self.layout = layout
        self.worker, self.workers = worker, workers
        b, count, batches = layout.batch, layout.per_rank, layout.batches
        blocks = 0 if worker >= batches else (batches - 1 - worker) // workers + 1
        if blocks == 0:
            self.length = 0
        else:
            last = worker + (blocks - 1) * workers
            self.length = (blocks - 1) * b + min(b, count - last * b)

    def positions(self, first: int, count: int) -> np.ndarray:
        """Window positions of share positions [first, first+count)."""
        b = self.layout.batch
        q, o = np.divmod(np.arange(first, first + count, dtype=np.int64), b)
        return self.layout.positions((self.worker + q * self.workers) * b + o)

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows of share positions [first, first+count)."""
        return _window_rows(self.window, self.positions(first, count))


@dataclass(frozen=True)
class _Spec:
    """What a loader pass is, in any process: the plan stream (shuffle, plan seed), the global
    plan positions per pass (`stride`: the single-rank samples per pass, topology independent),
    the batch size and drop_last, and this process's rank of `world`. Pass e is window
    positions [e*stride, (e+1)*stride) of the stream."""

    shuffle: bool
    seed: int
    stride: int
    batch: int
    drop_last: bool
    rank: int = 0
    world: int = 1

    def layout(self, start: int = 0) -> _Layout:
        return _Layout(self.stride, start, self.batch, self.drop_last, self.rank, self.world)

    def pass_window(self, stream: Any, epoch: int, skip: int = 0) -> Any:
        """Pass `epoch` of `stream` (a window starting at the plan's position 0), without its
        first `skip` positions."""
        return stream.sub(epoch * self.stride + skip, self.stride - skip)


@dataclass
class _PassProgress:
    """A main-process pass: its full window and the samples delivered so far."""

    window: Any
    consumed: int

    def rest(self) -> Any:
        """The window of the samples not yet delivered."""
        return self.window.sub(self.consumed, self.window.length - self.consumed)
