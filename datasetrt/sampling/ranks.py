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
the epoch. Rank r's sequence S_r is its blocks in dealt order, cut
into windows of `window_blocks` of its blocks, each window's records permuted by
`permutation_key(seed, WINDOW_LABEL ^ label ^ (i * world + r), e)` (window i of rank r). Rank r
reads the first `min(|S_r|, Q_r)` of S_r at its positions of the layout (Q_r: the epoch positions
the layout gives rank r); what a rank has beyond its quota (its last records) is read, in rank
order, by the ranks whose shards ran out, after their own records, then by the dropped positions.
So every aligned epoch of T positions holds each row its count times, and a rank reads records
of other ranks' shards only at the end of an epoch, at most about one block's worth per rank.
With world 1 the order is the base order, position for position.

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
    """One epoch's deal: per rank its blocks (dense ids, dealt order), its window starts (epoch
    positions of S_r, windows + 1 entries), and the spill arithmetic."""

    __slots__ = ("blocks", "window_starts", "sizes", "own", "deficit_start", "excess_start", "quotas")

    def __init__(self, blocks: list[np.ndarray], window_starts: list[np.ndarray], quotas: np.ndarray) -> None:
        self.blocks, self.window_starts, self.quotas = blocks, window_starts, quotas
        self.sizes = np.array([int(w[-1]) for w in window_starts], dtype=np.int64)
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
        self._windows: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray | None]] = {}

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
        blocks, window_starts = [], []
        for r in range(world):
            mine = np.flatnonzero(owner == r)
            positions = self.base.block_positions[order[mine]]
            starts = np.zeros(-(-len(mine) // w) + 1, dtype=np.int64)
            if len(mine):
                np.cumsum(np.add.reduceat(positions, np.arange(0, len(mine), w)), out=starts[1:])
            blocks.append(order[mine])
            window_starts.append(starts)
        deal = _Deal(blocks, window_starts, self._quotas)
        self._epoch = (epoch, deal)
        self._windows.clear()
        return deal

    def _window_rows(self, epoch: int, deal: _Deal, rank: int, window: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows of window `window` of rank `rank` in block order and their inclusive repeat
        running sums (None without repeat counts); up to 2 * world kept."""
        key = (epoch, rank, window)
        cached = self._windows.get(key)
        if cached is not None:
            return cached
        base, w = self.base, self.base.window_blocks
        spans = [
            (base.block_start[b], base.block_start[b + 1]) for b in deal.blocks[rank][window * w : (window + 1) * w]
        ]
        rows = np.concatenate([base.block_rows[a:b] for a, b in spans])
        ends = None
        if base.counts is not None:
            ends = np.cumsum(np.concatenate([base.counts[a:b] for a, b in spans]))
        if len(self._windows) >= 2 * self.split.world:
            self._windows.pop(next(iter(self._windows)))
        self._windows[key] = (rows, ends)
        return rows, ends

    def _sequence(self, epoch: int, deal: _Deal, rank: int, index: np.ndarray) -> np.ndarray:
        """Rows of S_rank at `index` (int64, any order)."""
        starts = deal.window_starts[rank]
        window = np.searchsorted(starts, index, side="right") - 1
        out = np.empty(len(index), dtype=np.int64)
        world, base = self.split.world, self.base
        for i in np.unique(window).tolist():
            at = np.flatnonzero(window == i)
            begin, end = int(starts[i]), int(starts[i + 1])
            rows, ends = self._window_rows(epoch, deal, rank, i)
            key = perm.permutation_key(base.seed, WINDOW_LABEL ^ base.label ^ (i * world + rank), epoch)
            values = perm.permute_values(key, end - begin, index[at] - begin)
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
