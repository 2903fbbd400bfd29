"""Plain statement of datasetrt's locality-aware exactly-once order (for tests only).

`datasetrt.sampling.locality.LocalityPermutation` and the streams of locality mixtures are checked
against this module: blocks visited in a keyed order, windows of `window` blocks, each window's
records permuted by its own key. One Python pass per epoch over the rows; the Feistel permutation
itself is `tests/reference/perm.py`'s, so nothing here calls the code under test.
"""

from __future__ import annotations

import numpy as np

from tests.reference import perm as ref

BLOCK_LABEL = 0x4C4F43424C4F434B  # b"LOCBLOCK"
WINDOW_LABEL = 0x4C4F4357494E444F  # b"LOCWINDO"


def epoch_order(
    seed: int, blocks: np.ndarray, window: int, epoch: int, counts: np.ndarray | None = None, label: int = 0
) -> list[int]:
    """The rows (indexes into `blocks`) of one epoch in order: the distinct blocks (dense, in
    increasing id order) in the keyed order, cut into windows of `window` blocks; each window's
    rows (block order, row order within a block, repeated by count) permuted by its own key."""
    ids = sorted(set(np.asarray(blocks).tolist()))
    n = len(ids)
    block_key = ref.permutation_key(seed, BLOCK_LABEL ^ label, epoch)
    visit = [ids[ref.permute(block_key, n, v)] for v in range(n)]
    out: list[int] = []
    for j in range(0, n, window):
        members: list[int] = []
        for b in visit[j : j + window]:
            for row in np.flatnonzero(np.asarray(blocks) == b).tolist():
                members += [row] * (1 if counts is None else int(counts[row]))
        key = ref.permutation_key(seed, WINDOW_LABEL ^ label ^ (j // window), epoch)
        out += [members[ref.permute(key, len(members), t)] for t in range(len(members))]
    return out


class LocalityOrders:
    """Per-stream locality orders, epoch by epoch (cached), with the interface of
    `tests.reference.perm.Orders` (`sizes`, `local(s, j)`), so `perm.curriculum` simulates a
    locality mixture or curriculum. `blocks[s]`: the block of each of stream s's rows."""

    def __init__(
        self, seed: int, labels: list[int], counts: list[list[int]], blocks: list[np.ndarray], window: int
    ) -> None:
        self.seed, self.labels, self.counts, self.blocks, self.window = seed, labels, counts, blocks, window
        self.sizes = [sum(c) for c in counts]
        self._cache: dict[tuple[int, int], list[int]] = {}

    def local(self, s: int, j: int) -> int:
        epoch, k = divmod(j, self.sizes[s])
        if (s, epoch) not in self._cache:
            counts = np.array(self.counts[s])
            self._cache[(s, epoch)] = epoch_order(self.seed, self.blocks[s], self.window, epoch, counts, self.labels[s])
        return self._cache[(s, epoch)][k]
