"""Exactly-once epochs: a stateless, seekable order over a population; integer weights are repeat counts.

Boundary: numpy in, numpy out; no I/O, no Polars, no knowledge of caches (rows are population
rows, identities only travel in error messages). The hot loop is `datasetrt._native.perm`.

Plan position `p` (0 <= p < 2**63) is element `p % T` of epoch `p // T`, where T (positions per
epoch) is the sum of the repeat counts (the row count when every count is 1). Every aligned run
of T positions holds row i exactly `count[i]` times, in an order keyed by
`permutation_key(seed, label, epoch)` (docs/determinism.md): different per epoch, never
`seed + epoch`. Memory: O(1) with unit counts whatever the row count; with repeat counts, the
running sums of the counts (uint32 when T < 2**32, else int64), O(rows) — the size of the table,
like the weighted sampler's cumulative sums — never O(T) nor O(rows x repeats).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable

import numpy as np

from datasetrt._native import perm
from datasetrt.errors import (
    ArgumentOverflowError,
    ArgumentTypeError,
    ConfigError,
    RepeatCountError,
    SamplingConfigError,
)

EXACTLY_ONCE = ("permutation", "locality")  # the sampling modes whose integer weights are repeat counts
DATASET_LABEL = 0  # the key label of a dataset-level order; mixture streams use stream_label(name)
MAX_POSITIONS_PER_EPOCH = 1 << 62
MAX_REPEAT = 1 << 53  # weights are float64: larger integers are not exact
MAX_POSITION = (1 << 63) - 1  # a range of plan positions ends at or before this (int64)


def stream_label(name: str) -> int:
    """The u64 key label of a named stream: the first 8 bytes (little-endian) of BLAKE2b(name).
    A stream's order depends on its name, not on which other streams share the mixture."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def repeat_counts(weights: np.ndarray, identify: Callable[[int], str] | None = None) -> np.ndarray | None:
    """int64 repeat counts of float64 `weights` (one per row), or None when every weight is 1.

    Refuses (RepeatCountError) the first row whose weight is not an integer in [1, 2**53], naming
    the row (`identify(i)` adds its identity) and the value; and a total past 2**62 positions.
    Columnar, O(rows).
    """
    w = np.asarray(weights, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(w) & (w >= 1) & (w <= MAX_REPEAT) & (w == np.floor(w))))
    if bad.size:
        i = int(bad[0])
        who = identify(i) if identify is not None else f"row {i}"
        raise RepeatCountError(
            f"exactly-once sampling takes integer weights as repeat counts: {who} has weight {float(w[i])!r}"
        )
    if not len(w) or bool((w == 1.0).all()):
        return None
    if float(w.sum()) > MAX_POSITIONS_PER_EPOCH:
        raise RepeatCountError(f"the repeat counts sum to {float(w.sum()):.0f} positions per epoch, past 2**62")
    return w.astype(np.int64)


class EpochPermutation:
    """Exactly-once order over `rows` population rows with optional integer repeat `counts`.

    `rows(first, count)` returns the int64 population rows of plan positions [first, first+count)
    in O(count) (O(count log rows) with repeat counts), random access, no state: position k of
    epoch e is `rows(e * positions_per_epoch + k, 1)`. Immutable; cheap to pickle (the running
    sums `ends` are its only array: uint32 when an epoch has fewer than 2**32 positions, else
    int64; the order is the same either way).
    """

    __slots__ = ("seed", "label", "row_count", "ends", "positions_per_epoch")

    def __init__(self, seed: int, rows: int, counts: np.ndarray | None = None, *, label: int = DATASET_LABEL) -> None:
        if type(rows) is not int or rows < 1:
            raise SamplingConfigError(f"an exactly-once order needs at least one row, got {rows!r}")
        self.seed, self.label, self.row_count = _u64("seed", seed), _u64("label", label), rows
        if counts is None:
            self.ends = None
            self.positions_per_epoch = rows
        else:
            counts = np.asarray(counts, dtype=np.int64)
            if counts.shape != (rows,) or (counts < 1).any():
                raise SamplingConfigError("repeat counts must be one integer >= 1 per row")
            total = int(counts.sum())  # exact (int64) below 2**63; checked against 2**62 below
            self.ends = np.cumsum(counts, dtype=np.uint32 if 0 < total < 1 << 32 else np.int64)
            self.positions_per_epoch = int(self.ends[-1])
        if self.positions_per_epoch > MAX_POSITIONS_PER_EPOCH:
            raise SamplingConfigError(f"{self.positions_per_epoch} positions per epoch is past 2**62")

    @classmethod
    def from_weights(
        cls, seed: int, weights: np.ndarray, *, label: int = DATASET_LABEL, identify: Callable[[int], str] | None = None
    ) -> EpochPermutation:
        """The order of a weighted population: integer weights are repeat counts (see repeat_counts)."""
        return cls(seed, len(weights), repeat_counts(weights, identify), label=label)

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows (int64) of plan positions [first, first+count): ints >= 0 with
        first + count <= 2**63 - 1 (else ConfigError / ArgumentOverflowError naming the argument)."""
        first, count = _position_range(first, count)
        if self.ends is None:
            return perm.permuted(self.seed, self.label, self.row_count, first, count)
        return perm.permuted_repeats(self.seed, self.label, self.ends, first, count)

    def epoch(self, position: int) -> int:
        """The epoch plan position `position` belongs to."""
        return position // self.positions_per_epoch

    def __repr__(self) -> str:
        return (
            f"EpochPermutation(rows={self.row_count}, positions_per_epoch={self.positions_per_epoch}, seed={self.seed})"
        )


def _integer(name: str, value: object) -> int:
    """`value` as a Python int (numpy integers included); ArgumentTypeError for anything else."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


def _u64(name: str, value: object) -> int:
    """A seed or key label: an int in [0, 2**64) (SamplingConfigError otherwise, as MixturePlan's)."""
    number = _integer(name, value)
    if not 0 <= number < 1 << 64:
        raise SamplingConfigError(f"{name} must be a u64, got {number!r}")
    return number


def _position_range(first: object, count: object) -> tuple[int, int]:
    """(first, count) of a plan-position range: ints >= 0 (ConfigError) whose end first + count
    is at most 2**63 - 1 (ArgumentOverflowError), the argument named in the message."""
    first, count = _integer("first", first), _integer("count", count)
    for name, value in (("first", first), ("count", count)):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if first > MAX_POSITION:
        raise ArgumentOverflowError(f"first={first} is past the plan positions (at most 2**63 - 1)")
    if first + count > MAX_POSITION:
        raise ArgumentOverflowError(f"count={count} from first={first} runs past the plan positions (2**63 - 1)")
    return first, count
