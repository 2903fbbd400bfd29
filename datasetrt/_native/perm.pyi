"""Stub of datasetrt._native.perm (_ext/perm.pyx): exactly-once orders and the quota interleave."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from datasetrt._native._buffers import BufferLike

_Int64s = np.ndarray[Any, np.dtype[np.int64]]

def permutation_key(seed: int, label: int, epoch: int) -> int:
    """Key of epoch `epoch` of the order labelled `label`."""

def stream_seed(seed: int, label: int) -> int:
    """Draw seed of a weighted (with-replacement) stream."""

def permute_values(key: int, n: int, values: BufferLike) -> _Int64s:
    """Images of the int64 `values` (each in [0, n)) under the permutation keyed by `key`."""

def permuted(seed: int, label: int, total: int, first: int, count: int) -> _Int64s:
    """Positions first .. first+count-1 of the exactly-once order of [0, total): int64."""

def permuted_repeats(seed: int, label: int, ends: BufferLike, first: int, count: int) -> _Int64s:
    """As `permuted` over ends[-1] positions per epoch, each mapped to its row (`ends`: running sums,
    int64, or uint32 when ends[-1] < 2**32)."""

def quota_schedule(weights: BufferLike) -> np.ndarray[Any, np.dtype[np.int16]]:
    """One period of the quota interleave of the int64 `weights`: int16 stream per step."""

class Interleave:
    """One period of the quota interleave of integer weights. Immutable; picklable."""

    def __init__(self, weights: Sequence[int] | BufferLike) -> None: ...
    @property
    def weights(self) -> _Int64s: ...
    @property
    def stream(self) -> np.ndarray[Any, np.dtype[np.int16]]: ...
    @property
    def occ(self) -> _Int64s: ...
    @property
    def occ_start(self) -> _Int64s: ...
    @property
    def period(self) -> int: ...
    def picks(self, first: int, count: int) -> np.ndarray[Any, np.dtype[np.int16]]:
        """Stream (int16) of relative positions [first, first+count)."""
    def count_before(self, n: int) -> _Int64s:
        """Picks of each stream (int64) among relative positions [0, n)."""
    def position_of(self, s: int, j: int) -> int:
        """Relative position of stream s's j-th pick."""

class StreamTables:
    """The per-stream tables of a mixture plan. Picklable."""

    def __init__(
        self,
        labels: Sequence[int],
        rows: Sequence[range | BufferLike],
        ends: Sequence[BufferLike | None],
        permuted: bool,
    ) -> None: ...
    @property
    def labels(self) -> tuple[int, ...]: ...
    @property
    def rows(self) -> tuple[range | _Int64s, ...]: ...
    @property
    def ends(self) -> tuple[_Int64s | None, ...]: ...
    @property
    def per_epoch(self) -> _Int64s: ...
    @property
    def permuted(self) -> bool: ...
    def block(
        self, seed: int, inter: Interleave, rel_first: int, bases: BufferLike, out: BufferLike, picks: BufferLike
    ) -> None:
        """Rows (int64 `out`) and streams (int16 `picks`) of relative positions [rel_first, rel_first+len(out))."""
