"""datasetrt.sampling.permutation: exactly-once epochs against a plain-numpy reference (multiset
equality per epoch), repeat counts from integer weights, typed refusals, and O(1) memory at 10^8
rows (measured with tracemalloc and RSS)."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import psutil
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datasetrt._native import perm
from datasetrt.errors import (
    ArgumentOverflowError,
    ArgumentTypeError,
    ConfigError,
    RepeatCountError,
    SamplingConfigError,
)
from datasetrt.sampling import EpochPermutation, repeat_counts, stream_label
from datasetrt.sampling.permutation import DATASET_LABEL
from tests.reference import perm as ref

PROPS = settings(derandomize=True, deadline=None, max_examples=120)


def _reference_epoch(counts: np.ndarray) -> np.ndarray:
    """The multiset every epoch must hold: row i, counts[i] times (sorted)."""
    return np.repeat(np.arange(len(counts)), counts)


@PROPS
@given(n=st.integers(1, 400), seed=st.integers(0, 2**64 - 1), epochs=st.integers(1, 3))
@example(n=1, seed=0, epochs=3)
@example(n=2, seed=1, epochs=3)
@example(n=257, seed=2, epochs=2)
def test_each_epoch_holds_every_row_once(n, seed, epochs):
    order = EpochPermutation(seed, n)
    got = order.rows(0, n * epochs)
    assert got.dtype == np.int64
    for e in range(epochs):
        assert np.array_equal(np.sort(got[e * n : (e + 1) * n]), np.arange(n))
    assert got.tolist() == ref.permuted(seed, DATASET_LABEL, [1] * n, 0, n * epochs)


@PROPS
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    seed=st.integers(0, 2**64 - 1),
    first=st.integers(0, 300),
    count=st.integers(0, 300),
)
@example(counts=[3], seed=0, first=0, count=9)
@example(counts=[1, 1, 5], seed=0, first=5, count=14)
def test_integer_weights_are_repeat_counts(counts, seed, first, count):
    weights = np.array(counts, dtype=np.float64)
    order = EpochPermutation.from_weights(seed, weights)
    total = sum(counts)
    assert order.positions_per_epoch == total
    got = order.rows(first, count)
    assert got.tolist() == ref.permuted(seed, DATASET_LABEL, counts, first, count)
    epoch = order.rows(total * 2, total)
    assert np.array_equal(np.sort(epoch), _reference_epoch(np.array(counts)))


def test_random_access_equals_sequential_blocks():
    order = EpochPermutation(5, 1234, np.arange(1, 1235) % 3 + 1)
    whole = order.rows(0, 3 * order.positions_per_epoch)
    pieces = np.concatenate([order.rows(a, 97) for a in range(0, len(whole), 97)])[: len(whole)]
    assert np.array_equal(pieces, whole)
    assert order.epoch(order.positions_per_epoch * 2 + 3) == 2


def test_epochs_and_seeds_and_labels_differ():
    n = 500
    base = EpochPermutation(1, n).rows(0, 2 * n)
    assert not np.array_equal(base[:n], base[n:])
    assert not np.array_equal(base[:n], EpochPermutation(2, n).rows(0, n))
    assert not np.array_equal(base[:n], EpochPermutation(1, n, label=stream_label("web")).rows(0, n))


def test_all_ones_weights_are_the_unweighted_order():
    assert repeat_counts(np.ones(4)) is None
    assert np.array_equal(
        EpochPermutation.from_weights(3, np.ones(50)).rows(0, 120), EpochPermutation(3, 50).rows(0, 120)
    )


@pytest.mark.parametrize("bad", [0.5, 2.5, 0.0, -1.0, float("nan"), float("inf"), 2.0**53 + 2])
def test_non_integer_weight_is_refused_naming_row_and_value(bad):
    weights = np.array([1.0, 3.0, bad, 2.0])
    with pytest.raises(RepeatCountError, match=r"row 2 .*has weight") as info:
        repeat_counts(weights, lambda i: f"row {i} (cache_id=7, sample_id={i + 10})")
    assert repr(float(bad)) in str(info.value) and "sample_id=12" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_invalid_orders_are_refused():
    for rows in (0, -1, 1.5):
        with pytest.raises(SamplingConfigError):
            EpochPermutation(0, rows)
    with pytest.raises(SamplingConfigError):
        EpochPermutation(0, 3, np.array([1, 0, 2]))
    with pytest.raises(SamplingConfigError):
        EpochPermutation(0, 3, np.array([1, 2]))


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_outside_u64_is_refused_when_built_as_mixtures_refuse_it(seed):
    counts = np.array([1, 2, 1])
    for build in (lambda: EpochPermutation(seed, 3), lambda: EpochPermutation(seed, 3, counts)):
        with pytest.raises(SamplingConfigError, match=rf"seed must be a u64, got {seed}"):
            build()
    with pytest.raises(SamplingConfigError, match=r"label must be a u64"):
        EpochPermutation(0, 3, label=-1)
    with pytest.raises(ArgumentTypeError, match="seed must be an integer"):
        EpochPermutation(1.5, 3)  # type: ignore[arg-type]
    assert (
        EpochPermutation(2**64 - 1, 3).rows(0, 6).tolist()
        == EpochPermutation(np.uint64(2**64 - 1), 3).rows(0, 6).tolist()
    )


@pytest.mark.parametrize("counts", [None, np.array([1, 2, 1, 1, 3])])
def test_position_ranges_outside_the_plan_are_typed_errors_naming_the_argument(counts):
    order = EpochPermutation(7, 5, counts)
    for first, count, error, name in [
        (-1, 3, ConfigError, "first"),
        (0, -1, ConfigError, "count"),
        (2**64, 1, ArgumentOverflowError, "first=18446744073709551616"),
        (2**63, 0, ArgumentOverflowError, "first=9223372036854775808"),
        (2**63 - 3, 5, ArgumentOverflowError, "count=5"),
    ]:
        with pytest.raises(error, match=name):
            order.rows(first, count)
    with pytest.raises(ArgumentTypeError, match="first must be an integer"):
        order.rows(1.0, 2)  # type: ignore[arg-type]
    last = 2**63 - 1  # the last range the int64 kernel serves ends there
    assert len(order.rows(last - 4, 4)) == 4 and len(order.rows(last, 0)) == 0
    assert order.rows(np.int64(3), np.int64(4)).tolist() == order.rows(3, 4).tolist()


def test_stream_label_is_stable():
    assert stream_label("web") == stream_label("web") != stream_label("code")
    assert stream_label("web") == int.from_bytes(
        __import__("hashlib").blake2b(b"web", digest_size=8).digest(), "little"
    )


# -- memory ----------------------------------------------------------------------------------------


def _rss() -> int:
    return psutil.Process(os.getpid()).memory_info().rss


def traced_peak(run):
    """(run(), the peak bytes tracemalloc saw allocated while it ran)."""
    tracemalloc.start()
    try:
        out = run()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_a_block_at_1e8_rows_allocates_no_order_array():
    """10^8 rows: an order array would take 800 MB; planning blocks anywhere in any epoch allocates
    only the block (4096 x 8 bytes) and no O(N) structure, measured by tracemalloc and RSS."""
    n = 10**8
    order = EpochPermutation(2024, n)
    order.rows(0, 16)  # warm up (first-call allocations of numpy and the kernel)
    rss_before = _rss()
    ranges, peak = traced_peak(
        lambda: [(b.min(), b.max()) for b in (order.rows(f, 4096) for f in (0, n - 2048, 7 * n + 12345, 10**15))]
    )
    assert all(low >= 0 and high < n for low, high in ranges)  # one block alive at a time
    assert peak < 256 * 1024, f"tracemalloc peak {peak} bytes"
    assert _rss() - rss_before < 16 * 1024 * 1024  # an order array would add ~800 MB
    assert len(np.unique(order.rows(3 * n + 77, 4096))) == 4096  # distinct within an epoch


def test_repeat_counts_cost_one_running_sum_per_row_not_per_repeat():
    """With repeat counts the only array is the running sums: O(distinct rows), like the
    weighted sampler's cumulative sums, whatever the repeats (uint32: 10^9 positions per epoch
    fit)."""
    counts = np.full(1000, 10**6, dtype=np.int64)  # 10^9 positions per epoch
    tracemalloc.start()
    try:
        order = EpochPermutation(1, 1000, counts)
        block = order.rows(5 * 10**9 + 3, 4096)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert order.ends.nbytes == 4000 and peak < 128 * 1024
    assert block.max() < 1000


def test_running_sums_narrow_to_uint32_below_2_32_positions_and_give_the_same_order():
    narrow = EpochPermutation(7, 3, np.array([2**32 - 3, 1, 1], dtype=np.int64))  # 2**32 - 1 positions
    wide = EpochPermutation(7, 3, np.array([2**32 - 2, 1, 1], dtype=np.int64))  # 2**32: int64
    assert narrow.ends.dtype == np.uint32 and wide.ends.dtype == np.int64
    assert narrow.positions_per_epoch == 2**32 - 1 and wide.positions_per_epoch == 2**32
    counts = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int64)
    order = EpochPermutation(11, len(counts), counts)
    assert order.ends.dtype == np.uint32
    ends64 = np.cumsum(counts)
    for first in (0, 5, 31 * 3 + 2):
        assert np.array_equal(order.rows(first, 64), perm.permuted_repeats(11, DATASET_LABEL, ends64, first, 64))
    # Across the end of an epoch whose values reach the top of the uint32 range.
    ends64 = narrow.ends.astype(np.int64)
    first = 2**32 - 2000
    assert np.array_equal(narrow.rows(first, 4000), perm.permuted_repeats(7, DATASET_LABEL, ends64, first, 4000))
