"""Cache identity catalog: cache_id <-> position in paths, per-cache sample counts and offsets.

Boundary: numpy only. Positions follow the order of the dataset's paths; the physical row order
is caches in path order, samples in sample_id order within each.
"""

from __future__ import annotations

import numpy as np

from datasetrt.errors import CacheFormatError

LOOKUP_BLOCK = 1 << 20  # rows per block of `lookup`: its temporaries are O(block), not O(rows)


class CacheCatalog:
    """Invariants: `cache_ids` unique (uint64), `counts` >= 0 (int64), `offsets[k]` = first global
    physical index of cache k, `offsets[-1]` = total. Lookups are O(log caches) vectorised."""

    __slots__ = ("cache_ids", "counts", "offsets", "_order", "_sorted_ids")

    def __init__(self, cache_ids: list[int], counts: list[int], labels: list[str]) -> None:
        self.cache_ids = np.asarray(cache_ids, dtype=np.uint64)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.offsets[1:])
        self._order = np.argsort(self.cache_ids, kind="stable")
        self._sorted_ids = self.cache_ids[self._order]
        dup = np.flatnonzero(self._sorted_ids[1:] == self._sorted_ids[:-1])
        if dup.size:
            cid = int(self._sorted_ids[dup[0]])
            where = [labels[i] for i in np.flatnonzero(self.cache_ids == cid)]
            raise CacheFormatError(f"duplicate cache_id {cid}: {', '.join(map(str, where))}")

    def __len__(self) -> int:
        return len(self.cache_ids)

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def positions(self, cache_ids: np.ndarray) -> np.ndarray:
        """Positions (int64) of the given ids; -1 where unknown."""
        ids = np.asarray(cache_ids, dtype=np.uint64)
        if len(self._sorted_ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        # In place on one int64 array: one more per-row temporary (the gathered ids) at most.
        where = np.searchsorted(self._sorted_ids, ids).astype(np.int64, copy=False)
        np.minimum(where, len(self._sorted_ids) - 1, out=where)
        found = np.take(self._sorted_ids, where) == ids
        np.take(self._order, where, out=where)
        where[~found] = -1
        return where

    @property
    def position_dtype(self) -> np.dtype:
        """dtype of the positions an active population keeps (`lookup`): int32 while every
        position fits (fewer than 2**31 caches), else int64."""
        return np.dtype(np.int32) if len(self.cache_ids) < 1 << 31 else np.dtype(np.int64)

    def lookup(self, cache_ids: np.ndarray, sample_ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(positions, first unknown row) of the rows (cache_ids[i], sample_ids[i]) (uint64
        arrays of one length): positions as `position_dtype`, and the first row whose cache_id
        is not in the catalog or whose sample_id is past its cache's count (-1: every row is
        known; the positions from that row on are then unset). Blockwise: besides the result,
        O(LOOKUP_BLOCK) temporaries whatever the row count."""
        n = len(cache_ids)
        out = np.empty(n, dtype=self.position_dtype)
        counts = self.counts.astype(np.uint64)
        for lo in range(0, n, LOOKUP_BLOCK):
            hi = min(n, lo + LOOKUP_BLOCK)
            pos = self.positions(cache_ids[lo:hi])
            known = pos >= 0
            if len(counts):  # an unknown cache (-1) gathers the last cache's count, masked out above
                known &= np.asarray(sample_ids[lo:hi]) < np.take(counts, pos, mode="wrap")
            bad = np.flatnonzero(~known)
            if bad.size:
                return out, lo + int(bad[0])
            out[lo:hi] = pos
        return out, -1

    def position(self, cache_id: int) -> int:
        """Position of one id, or -1."""
        return int(self.positions(np.array([cache_id], dtype=np.uint64))[0])

    def locate(self, physical: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global physical indexes -> (cache position int64, sample_id uint64)."""
        idx = np.asarray(physical, dtype=np.int64)
        pos = np.searchsorted(self.offsets, idx, side="right") - 1
        return pos, (idx - self.offsets[pos]).astype(np.uint64)
