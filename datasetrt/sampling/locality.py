"""Locality-aware exactly-once epochs: shards visited in a seeded order, records permuted within
windows of a few shards, so a reader needs only the shards of the current and next window.

Boundary: numpy in, numpy out; no I/O. Rows are population rows; a row's *block* is the shard
that stores it (an int64 id the dataset computes from the caches' indexes: any labelling works,
only the order of the ids matters). The hot loop is `datasetrt._native.perm` (keyed Feistel
permutations).

The order (docs/sampling.md, "Locality-aware epochs"): epoch e lists the non-empty blocks in the
permutation of [0, blocks) keyed by `permutation_key(seed, BLOCK_LABEL ^ label, e)` and cuts that
list into windows of `window_blocks` consecutive blocks (the last one may be shorter). The
epoch's positions are window 0's records, then window 1's, ...; within window j, the window's
records (its blocks' rows in block order, each row repeated by its count) are permuted by the key
`permutation_key(seed, WINDOW_LABEL ^ label ^ j, e)`. `label` is 0 for a dataset's order and
`stream_label(name)` for a stream of a mixture (plans.py): each stream has its own orders. So
every aligned run of `positions_per_epoch` positions holds row i exactly `count[i]` times, and
the positions of one window read only that window's blocks. Position p is element `p % T` of
epoch `p // T`; `rows(first, count)` is random access (pure in seed and position), which is what
exact and elastic resume need.

Memory: the rows in block order (int64) and the block offsets, O(rows + blocks), plus per epoch
the block order and window starts, O(blocks); one materialised window at a time, O(rows of one
window). With repeat counts, the counts in block order, O(rows). Time: O(count) per call plus
O(rows of a window) when a call enters a new window.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from datasetrt._native import perm
from datasetrt.errors import SamplingConfigError
from datasetrt.sampling.permutation import MAX_POSITIONS_PER_EPOCH

BLOCK_LABEL = 0x4C4F43424C4F434B  # b"LOCBLOCK": the key label of an epoch's block order
WINDOW_LABEL = 0x4C4F4357494E444F  # b"LOCWINDO": window j's records use label WINDOW_LABEL ^ j


def dense_blocks(blocks: np.ndarray) -> np.ndarray:
    """int64 dense block ids (0, 1, ... in increasing order of the given ids) of one id per row."""
    return np.unique(np.asarray(blocks, dtype=np.int64), return_inverse=True)[1].astype(np.int64).reshape(-1)


def blocks_digest(blocks: np.ndarray) -> str:
    """BLAKE2b-128 (hex) of the dense block ids of one id per row, in row order: what, beside the
    rows, the seed and the window size, decides a locality order. O(rows log rows)."""
    return hashlib.blake2b(dense_blocks(blocks).tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Locality:
    """What makes an exactly-once order shard-local: `window_blocks` blocks per window and
    `blocks`, the block (shard id, int64 >= 0) of every population row (stream orders take the
    entries of their rows)."""

    window_blocks: int
    blocks: np.ndarray


class LocalityPermutation:
    """Exactly-once order over population rows grouped in blocks (shards), read a window of
    `window_blocks` blocks at a time. `blocks` (int64, one per row, >= 0) names each row's block;
    `counts` (int64, one per row, >= 1) are repeat counts or None (every row once per epoch);
    `label` (u64) keys the orders: 0 for a dataset's, `stream_label(name)` for a stream's.

    Immutable apart from two caches (the latest epoch's block order, the latest window's rows),
    which only save recomputation. Picklable (the caches are dropped)."""

    __slots__ = (
        "seed",
        "label",
        "window_blocks",
        "row_count",
        "positions_per_epoch",
        "block_rows",
        "block_start",
        "block_positions",
        "counts",
        "_epoch",
        "_window",
    )

    def __init__(
        self, seed: int, blocks: np.ndarray, window_blocks: int, counts: np.ndarray | None = None, *, label: int = 0
    ) -> None:
        if type(window_blocks) is not int or window_blocks < 1:
            raise SamplingConfigError(f"window_shards must be an integer >= 1, got {window_blocks!r}")
        blocks = np.asarray(blocks, dtype=np.int64)
        if blocks.ndim != 1 or not len(blocks):
            raise SamplingConfigError("a locality-aware order needs at least one row")
        if int(blocks.min()) < 0:
            raise SamplingConfigError("block ids must be >= 0")
        self.seed, self.label, self.window_blocks, self.row_count = seed, label, window_blocks, len(blocks)
        order = np.argsort(blocks, kind="stable")  # rows in block order, table order within a block
        sorted_blocks = blocks[order]
        starts = np.flatnonzero(np.r_[True, sorted_blocks[1:] != sorted_blocks[:-1]])
        self.block_rows = order.astype(np.int64)
        self.block_start = np.append(starts, len(blocks)).astype(np.int64)  # dense: empty blocks dropped
        if counts is None:
            self.counts = None
            sizes = np.diff(self.block_start)
        else:
            counts = np.asarray(counts, dtype=np.int64)
            if counts.shape != blocks.shape or (counts < 1).any():
                raise SamplingConfigError("repeat counts must be one integer >= 1 per row")
            self.counts = counts[self.block_rows]  # repeat counts in block-row order
            sizes = np.add.reduceat(self.counts, self.block_start[:-1])
        self.block_positions = sizes.astype(np.int64)  # positions per epoch of each (dense) block
        self.positions_per_epoch = int(self.block_positions.sum())
        if self.positions_per_epoch > MAX_POSITIONS_PER_EPOCH:
            raise SamplingConfigError(f"{self.positions_per_epoch} positions per epoch is past 2**62")
        self._epoch: tuple[int, np.ndarray, np.ndarray] | None = None
        self._window: tuple[int, int, np.ndarray, np.ndarray | None] | None = None

    @property
    def block_count(self) -> int:
        """Blocks that hold at least one row."""
        return len(self.block_positions)

    def __reduce__(self) -> tuple:
        counts = None
        if self.counts is not None:
            counts = np.empty(self.row_count, dtype=np.int64)
            counts[self.block_rows] = self.counts
        return _rebuild, (self.seed, self.dense_blocks(), self.window_blocks, counts, self.label)

    def dense_blocks(self) -> np.ndarray:
        """The dense block id of every row (int64, row order): `dense_blocks` of the given ids."""
        blocks = np.empty(self.row_count, dtype=np.int64)
        blocks[self.block_rows] = np.repeat(np.arange(self.block_count, dtype=np.int64), np.diff(self.block_start))
        return blocks

    def blocks_digest(self) -> str:
        """`blocks_digest` of the blocks this order was built from."""
        return hashlib.blake2b(self.dense_blocks().tobytes(), digest_size=16).hexdigest()

    # -- one epoch's layout ------------------------------------------------------------------

    def epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(block order, window starts) of `epoch`: the dense block ids in visiting order (int64)
        and the first epoch position of each window, with the epoch length appended (int64,
        windows + 1 entries)."""
        cached = self._epoch
        if cached is not None and cached[0] == epoch:
            return cached[1], cached[2]
        n = self.block_count
        key = perm.permutation_key(self.seed, BLOCK_LABEL ^ self.label, epoch)
        order = perm.permute_values(key, n, np.arange(n, dtype=np.int64))
        w = self.window_blocks
        sizes = self.block_positions[order]
        window_sizes = np.add.reduceat(sizes, np.arange(0, n, w)) if n else sizes
        starts = np.zeros(len(window_sizes) + 1, dtype=np.int64)
        np.cumsum(window_sizes, out=starts[1:])
        self._epoch = (epoch, order, starts)
        return order, starts

    def window_blocks_of(self, epoch: int, window: int) -> np.ndarray:
        """The dense block ids of window `window` of `epoch`, in visiting order."""
        order, _starts = self.epoch_layout(epoch)
        return order[window * self.window_blocks : (window + 1) * self.window_blocks]

    def blocks_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Dense block ids (int64) of population rows."""
        pos = np.empty(self.row_count, dtype=np.int64)
        pos[self.block_rows] = np.arange(self.row_count, dtype=np.int64)
        return np.searchsorted(self.block_start, pos[np.asarray(rows, dtype=np.int64)], side="right") - 1

    def _window_rows(self, epoch: int, window: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows of one window in block order and their inclusive repeat running sums (None
        without repeat counts)."""
        cached = self._window
        if cached is not None and cached[0] == epoch and cached[1] == window:
            return cached[2], cached[3]
        spans = [(self.block_start[b], self.block_start[b + 1]) for b in self.window_blocks_of(epoch, window)]
        rows = np.concatenate([self.block_rows[a:b] for a, b in spans])
        ends = None
        if self.counts is not None:
            ends = np.cumsum(np.concatenate([self.counts[a:b] for a, b in spans]))
        self._window = (epoch, window, rows, ends)
        return rows, ends

    # -- the plan ------------------------------------------------------------------------------

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows (int64) of plan positions [first, first+count)."""
        if first < 0 or count < 0:
            raise SamplingConfigError(f"plan positions must be >= 0, got first={first}, count={count}")
        out = np.empty(count, dtype=np.int64)
        total = self.positions_per_epoch
        done = 0
        while done < count:
            position = first + done
            epoch, t = divmod(position, total)
            _order, starts = self.epoch_layout(epoch)
            window = int(np.searchsorted(starts, t, side="right")) - 1
            begin, end = int(starts[window]), int(starts[window + 1])
            take = min(count - done, end - t)
            rows, ends = self._window_rows(epoch, window)
            key = perm.permutation_key(self.seed, WINDOW_LABEL ^ self.label ^ window, epoch)
            values = perm.permute_values(key, end - begin, np.arange(t - begin, t - begin + take, dtype=np.int64))
            if ends is not None:
                values = np.searchsorted(ends, values, side="right")
            out[done : done + take] = rows[values]
            done += take
        return out

    def epoch(self, position: int) -> int:
        """The epoch plan position `position` belongs to."""
        return position // self.positions_per_epoch

    def __repr__(self) -> str:
        repeats = "" if self.counts is None else f", {self.positions_per_epoch} positions"
        return (
            f"LocalityPermutation(rows={self.row_count}, blocks={self.block_count}, "
            f"window_blocks={self.window_blocks}{repeats})"
        )


def _rebuild(
    seed: int, blocks: np.ndarray, window_blocks: int, counts: np.ndarray | None, label: int
) -> LocalityPermutation:
    return LocalityPermutation(seed, blocks, window_blocks, counts, label=label)
