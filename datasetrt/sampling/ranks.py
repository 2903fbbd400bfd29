"""Rank-local locality orders: each epoch of a locality-aware exactly-once order re-planned for
`world` ranks reading it as steps of `world` batches, so that each rank reads its own shards.

Boundary: numpy in, numpy out; no I/O, no torch. The rank layout (`RankSplit`) is the one the
torch loaders use (integrations/torch/plan.py `_Layout` from position 0; tests check the two
agree): pass positions are cut into steps of `world` batches of `batch`, rank r reading batch r of
every full step, then its `tail` rows of the last short step; with drop_last every rank reads
`batch * floor(T / (world * batch))` rows and the last positions of the epoch are dropped.

The order (docs/sampling.md, "Ranks"): epoch e visits the blocks in the base order's keyed order
(`LocalityPermutation.epoch_layout`) and deals them, one at a time in that order, to the rank
furthest below its quota (the fewest positions dealt minus the rank's quota Q_r, see below; ties:
the lowest rank), so every rank's share stays within one block of its quota's share all along
the epoch. Rank r's records, its blocks' rows in dealt order (each repeated by its count), are cut
into segments at every `window_blocks` of its blocks and, with world > 1, at its quota Q_r (the
epoch positions the layout gives rank r); segment k's records are permuted by
`permutation_key(seed, WINDOW_LABEL ^ label ^ (k * world + r), e)`, giving its sequence S_r.
Rank r reads the first `min(|S_r|, Q_r)` of S_r at its positions of the layout; the records a
rank has beyond its quota (the tail of its last blocks: the deal keeps it within about one block)
are read, in rank order, by the ranks whose blocks ran out, after their own records, then by the
dropped positions. So every aligned epoch of T positions holds each row its count times, and a
rank reads records of other ranks' shards only at the end of an epoch, about one block's worth
from each rank that gives. With world 1 the order is the base order, position for position.

Memory: per epoch O(blocks) (the deal and every rank's window starts), and the rows of up to
2 * world materialised windows (a process reading one rank's positions touches one at a time).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from datasetrt._native import perm
from datasetrt.errors import SamplingConfigError
from datasetrt.sampling.locality import WINDOW_LABEL, LocalityPermutation


@dataclass(frozen=True)
class RankSplit:
    """How `world` ranks read an epoch of positions: steps of `world` batches of `batch`, rank r
    taking batch r of each step (the loaders' layout from position 0)."""

    world: int
    batch: int
    drop_last: bool

    def __post_init__(self) -> None:
        for name in ("world", "batch"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise SamplingConfigError(f"a rank split's {name} must be an integer >= 1, got {value!r}")

    def per_rank(self, total: int) -> int:
        """Positions each rank reads of an epoch of `total` (padding included): ceil(T / world),
        or batch * floor(T / (world * batch)) with drop_last."""
        if self.drop_last:
            return self.batch * (total // (self.world * self.batch))
        return -(-total // self.world)

    def quotas(self, total: int) -> np.ndarray:
        """Per rank (int64), how many of its positions are epoch positions (< total, not padding)."""
        b, world = self.batch, self.world
        full, tail = divmod(self.per_rank(total), b)
        out = np.zeros(world, dtype=np.int64)
        for r in range(world):
            whole = 0 if total < (r + 1) * b else min(full, (total - (r + 1) * b) // (world * b) + 1)
            part = 0
            if whole < full:
                part = min(b, max(0, total - (whole * world + r) * b))
            out[r] = whole * b + part + min(tail, max(0, total - (full * world * b + r * tail)))
        return out

    def locate(self, positions: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
        """(rank, j) of epoch positions (int64, each < total): the rank whose layout reads it and
        the index among that rank's rows; rank -1 and j = the index among the dropped positions
        for positions no rank reads (drop_last)."""
        b, world = self.batch, self.world
        full, tail = divmod(self.per_rank(total), b)
        p = np.asarray(positions, dtype=np.int64)
        split = full * world * b
        q, rem = np.divmod(p, world * b)
        rank, o = np.divmod(rem, b)
        j = q * b + o
        late = p >= split
        if late.any():
            rest = p[late] - split
            if tail:
                late_rank, late_o = np.divmod(rest, tail)
            else:
                late_rank, late_o = np.full(len(rest), world), rest
            dropped = late_rank >= world
            late_j = np.where(dropped, rest - world * tail, full * b + late_o)
            rank[late] = np.where(dropped, -1, late_rank)
            j[late] = late_j
        return rank, j


class _Deal:
    """One epoch's deal: per rank its blocks (dense ids, dealt order), the start of each of its
    blocks and of each of its segments in S_r (with the end appended), and the spill arithmetic."""

    __slots__ = ("blocks", "block_starts", "segments", "sizes", "own", "deficit_start", "excess_start", "quotas")

    def __init__(
        self, blocks: list[np.ndarray], block_starts: list[np.ndarray], segments: list[np.ndarray], quotas: np.ndarray
    ) -> None:
        self.blocks, self.block_starts, self.segments, self.quotas = blocks, block_starts, segments, quotas
        self.sizes = np.array([int(b[-1]) for b in block_starts], dtype=np.int64)
        self.own = np.minimum(self.sizes, quotas)
        self.deficit_start = np.concatenate([[0], np.cumsum(np.maximum(quotas - self.sizes, 0))]).astype(np.int64)
        self.excess_start = np.concatenate([[0], np.cumsum(np.maximum(self.sizes - quotas, 0))]).astype(np.int64)


class RankedLocality:
    """`base`'s locality order re-planned per epoch for the ranks of `split` (module docstring):
    `rows(first, count)` -> int64 population rows of plan positions [first, first+count), pure in
    (seed, blocks, window, split, position); position p is element p % T of epoch p // T as in
    the base order. `deal(epoch)` gives each rank's blocks. Immutable apart from caches."""

    def __init__(self, base: LocalityPermutation, split: RankSplit) -> None:
        self.base, self.split = base, split
        self.positions_per_epoch = base.positions_per_epoch
        self._quotas = split.quotas(self.positions_per_epoch)
        self._epoch: tuple[int, _Deal] | None = None
        self._windows: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray | None, int]] = {}

    def __reduce__(self) -> tuple:
        return RankedLocality, (self.base, self.split)

    def epoch(self, position: int) -> int:
        """The epoch plan position `position` belongs to."""
        return position // self.positions_per_epoch

    def deal(self, epoch: int) -> list[np.ndarray]:
        """Per rank, the dense block ids dealt to it in `epoch` (dealt order)."""
        return list(self._deal(epoch).blocks)

    def _deal(self, epoch: int) -> _Deal:
        cached = self._epoch
        if cached is not None and cached[0] == epoch:
            return cached[1]
        order, _starts = self.base.epoch_layout(epoch)
        sizes = self.base.block_positions[order].tolist()
        world, w = self.split.world, self.base.window_blocks
        heap = [(-int(q), r) for r, q in enumerate(self._quotas.tolist())]  # (dealt - quota, rank)
        heapq.heapify(heap)
        owner = np.empty(len(order), dtype=np.int64)
        for k, size in enumerate(sizes):  # a loop over blocks: the rank furthest below its quota takes the next one
            short, r = heap[0]
            owner[k] = r
            heapq.heapreplace(heap, (short + size, r))
        blocks, block_starts, segments = [], [], []
        for r in range(world):
            mine = order[owner == r]
            starts = np.zeros(len(mine) + 1, dtype=np.int64)
            np.cumsum(self.base.block_positions[mine], out=starts[1:])
            cuts = starts[::w] if len(mine) % w == 0 else np.append(starts[::w], starts[-1])
            quota = int(self._quotas[r])
            if world > 1 and quota < starts[-1]:  # the records beyond the quota: a segment of their own
                cuts = np.union1d(cuts, [quota])
            blocks.append(mine)
            block_starts.append(starts)
            segments.append(cuts.astype(np.int64))
        deal = _Deal(blocks, block_starts, segments, self._quotas)
        self._windows = {}
        self._epoch = (epoch, deal)
        return deal

    def _segment_rows(
        self, epoch: int, deal: _Deal, rank: int, segment: int
    ) -> tuple[np.ndarray, np.ndarray | None, int]:
        """The rows of the blocks segment `segment` of rank `rank` overlaps, in block order, their
        inclusive repeat running sums (None without repeat counts) and the segment's start within
        them; up to 2 * world kept."""
        key = (epoch, rank, segment)
        cached = self._windows.get(key)
        if cached is not None:
            return cached
        base, starts = self.base, deal.block_starts[rank]
        begin, end = deal.segments[rank][segment : segment + 2].tolist()
        first = int(np.searchsorted(starts, begin, side="right")) - 1
        last = int(np.searchsorted(starts, end, side="left"))
        spans = [(base.block_start[b], base.block_start[b + 1]) for b in deal.blocks[rank][first:last]]
        rows = np.concatenate([base.block_rows[a:b] for a, b in spans])
        ends = None
        if base.counts is not None:
            ends = np.cumsum(np.concatenate([base.counts[a:b] for a, b in spans]))
        made = (rows, ends, begin - int(starts[first]))
        kept = list(self._windows.items())[-(2 * self.split.world - 1) :] if self.split.world > 1 else []
        self._windows = {**dict(kept), key: made}  # replaced whole: readers in other threads see one or the other
        return made

    def _sequence(self, epoch: int, deal: _Deal, rank: int, index: np.ndarray) -> np.ndarray:
        """Rows of S_rank at `index` (int64, any order)."""
        cuts = deal.segments[rank]
        segment = np.searchsorted(cuts, index, side="right") - 1
        out = np.empty(len(index), dtype=np.int64)
        world, base = self.split.world, self.base
        for k in np.unique(segment).tolist():
            at = np.flatnonzero(segment == k)
            begin, end = int(cuts[k]), int(cuts[k + 1])
            rows, ends, offset = self._segment_rows(epoch, deal, rank, k)
            key = perm.permutation_key(base.seed, WINDOW_LABEL ^ base.label ^ (k * world + rank), epoch)
            values = perm.permute_values(key, end - begin, index[at] - begin) + offset
            if ends is not None:
                values = np.searchsorted(ends, values, side="right")
            out[at] = rows[values]
        return out

    def _epoch_rows(self, epoch: int, t: np.ndarray) -> np.ndarray:
        """Rows of positions `t` (int64, < T) of `epoch`."""
        deal = self._deal(epoch)
        rank, j = self.split.locate(t, self.positions_per_epoch)
        source = rank.copy()
        index = j.copy()
        spill = np.full(len(t), -1, dtype=np.int64)  # index into the epoch's pooled excess records
        for r in range(self.split.world):
            beyond = (rank == r) & (j >= deal.own[r])
            spill[beyond] = deal.deficit_start[r] + (j[beyond] - deal.own[r])
        dropped = rank < 0
        spill[dropped] = deal.deficit_start[-1] + j[dropped]
        pooled = spill >= 0
        if pooled.any():
            giver = np.searchsorted(deal.excess_start, spill[pooled], side="right") - 1
            source[pooled] = giver
            index[pooled] = deal.quotas[giver] + (spill[pooled] - deal.excess_start[giver])
        out = np.empty(len(t), dtype=np.int64)
        for r in np.unique(source).tolist():
            at = np.flatnonzero(source == r)
            out[at] = self._sequence(epoch, deal, r, index[at])
        return out

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows (int64) of plan positions [first, first+count)."""
        if first < 0 or count < 0:
            raise SamplingConfigError(f"plan positions must be >= 0, got first={first}, count={count}")
        total = self.positions_per_epoch
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, t = divmod(first + done, total)
            take = min(count - done, total - t)
            out[done : done + take] = self._epoch_rows(epoch, np.arange(t, t + take, dtype=np.int64))
            done += take
        return out

    def rank_blocks(self, first: int, count: int) -> np.ndarray:
        """The rank each block of plan positions [first, first+count) was dealt to (int64): for
        measuring how much of a rank's reads come from its own shards."""
        rows = self.rows(first, count)
        blocks = self.base.blocks_of_rows(rows)
        epochs = (first + np.arange(count, dtype=np.int64)) // self.positions_per_epoch
        out = np.empty(count, dtype=np.int64)
        for e in np.unique(epochs).tolist():
            owner = np.empty(self.base.block_count, dtype=np.int64)
            for r, mine in enumerate(self._deal(e).blocks):
                owner[mine] = r
            at = epochs == e
            out[at] = owner[blocks[at]]
        return out

    def __repr__(self) -> str:
        return f"RankedLocality({self.base!r}, {self.split})"
