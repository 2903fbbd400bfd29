"""datasetrt._native.perm against the pure-Python statement tests/reference/perm.py, and the
properties the planners rely on: bijection on [0, n) for every n, epochs with unrelated keys, the
quota interleave's prefix bound. Hypothesis is derandomized (a fixed example stream)."""

from __future__ import annotations

import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datasetrt._native import perm
from tests.reference import perm as ref

M64 = (1 << 64) - 1
PROPS = settings(derandomize=True, deadline=None, max_examples=150)
EDGE_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 97, 127, 128, 129, 1000, 1023, 1024, 1025, 65537]


# -- bit for bit ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7, M64])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 129])
def test_permuted_matches_reference_across_epochs(seed, n):
    got = perm.permuted(seed, 5, n, 0, 3 * n + 2)
    assert got.dtype == np.int64 and got.tolist() == ref.permuted(seed, 5, [1] * n, 0, 3 * n + 2)


def test_keys_match_reference_and_are_not_seed_plus_epoch():
    for seed, label, epoch in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (M64, M64, M64), (7, 3, 12345)]:
        assert perm.permutation_key(seed, label, epoch) == ref.permutation_key(seed, label, epoch)
        assert perm.stream_seed(seed, label) == ref.stream_seed(seed, label)
    # seed + epoch collides ((s, e+1) and (s+1, e)); the derivation does not
    assert perm.permutation_key(5, 0, 6) != perm.permutation_key(6, 0, 5)
    keys = {perm.permutation_key(9, 0, e) for e in range(10_000)}
    assert len(keys) == 10_000  # mix is a bijection: distinct epochs never share a key


@PROPS
@given(
    seed=st.integers(0, M64),
    label=st.integers(0, M64),
    n=st.integers(1, 300),
    first=st.integers(0, 10**6),
    count=st.integers(0, 70),
)
def test_any_window_matches_reference(seed, label, n, first, count):
    assert perm.permuted(seed, label, n, first, count).tolist() == ref.permuted(seed, label, [1] * n, first, count)


@PROPS
@given(
    seed=st.integers(0, M64),
    counts=st.lists(st.integers(1, 5), min_size=1, max_size=20),
    first=st.integers(0, 500),
    count=st.integers(0, 60),
)
def test_repeats_match_reference(seed, counts, first, count):
    ends = np.cumsum(np.array(counts, dtype=np.int64))
    got = perm.permuted_repeats(seed, 3, ends, first, count)
    assert got.tolist() == ref.permuted(seed, 3, counts, first, count)


# -- bijection ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", EDGE_SIZES)
def test_every_epoch_is_a_bijection(n):
    got = perm.permuted(11, 0, n, 0, 3 * n)
    for e in range(3):
        assert np.array_equal(np.sort(got[e * n : (e + 1) * n]), np.arange(n))


@PROPS
@given(n=st.integers(1, 5000), key=st.integers(0, M64))
@example(n=1, key=0)
@example(n=2, key=M64)
@example(n=2**12 + 1, key=1)
@example(n=2**12 - 1, key=1)
@example(n=4099, key=3)  # prime
def test_permute_values_is_a_bijection(n, key):
    images = perm.permute_values(key, n, np.arange(n, dtype=np.int64))
    assert np.array_equal(np.sort(images), np.arange(n))


def test_large_domain_bijection():
    n = (1 << 20) + 7  # just past a power of two: the worst cycle-walking ratio
    got = perm.permuted(1, 2, n, 5 * n, n)
    assert np.array_equal(np.bincount(got, minlength=n), np.ones(n, dtype=np.int64))


def test_epochs_differ_and_windows_are_slices():
    n = 1000
    whole = perm.permuted(3, 0, n, 0, 4 * n)
    epochs = whole.reshape(4, n)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not np.array_equal(epochs[a], epochs[b])
    for first, count in [(0, 1), (999, 2), (1500, 700), (3999, 1)]:
        assert np.array_equal(perm.permuted(3, 0, n, first, count), whole[first : first + count])


def test_order_is_not_the_identity_nor_a_shift():
    got = perm.permuted(0, 0, 10_000, 0, 10_000)
    assert np.mean(got == np.arange(10_000)) < 0.01
    assert len(np.unique(np.diff(got))) > 1000
    # first positions of many epochs spread over the domain
    firsts = np.array([perm.permuted(0, 0, 100, 100 * e, 1)[0] for e in range(2000)])
    assert np.bincount(firsts // 10, minlength=10).min() > 120  # ~200 expected per decile


def test_argument_errors():
    with pytest.raises(ValueError):
        perm.permuted(0, 0, 0, 0, 1)
    with pytest.raises(ValueError):
        perm.permuted(0, 0, 5, -1, 1)
    with pytest.raises(OverflowError):
        perm.permuted(0, 0, 5, (1 << 63) - 2, 5)
    with pytest.raises(ValueError):
        perm.permuted_repeats(0, 0, np.zeros(0, dtype=np.int64), 0, 1)
    with pytest.raises(ValueError):
        perm.permute_values(0, 4, np.array([4], dtype=np.int64))
    assert perm.permuted(0, 0, 5, 0, 0).shape == (0,)


# -- quota interleave ---------------------------------------------------------------------------


def _max_deviation(weights: list[int], stream: np.ndarray) -> Fraction:
    total = sum(weights)
    n = np.arange(1, len(stream) + 1, dtype=np.int64)
    worst = Fraction(0)
    for s, w in enumerate(weights):
        c = np.cumsum(stream == s)
        worst = max(worst, Fraction(int(np.abs(c * total - n * w).max()), total))
    return worst


@PROPS
@given(weights=st.lists(st.integers(0, 40), min_size=1, max_size=8).filter(lambda w: sum(w) > 0))
@example(weights=[343, 9, 1, 1, 26])  # smooth weighted round-robin exceeds 1 here (39/38)
@example(weights=[5, 3, 2])
@example(weights=[1])
@example(weights=[0, 7, 0])
def test_quota_schedule_matches_reference_and_holds_the_bound(weights):
    stream = perm.quota_schedule(np.array(weights, dtype=np.int64))
    assert stream.dtype == np.int16 and len(stream) == sum(weights)
    assert stream.tolist() == ref.quota_sequence(weights, sum(weights))
    # periodic: two periods of the schedule equal the sequential simulation of two periods
    assert np.tile(stream, 2).tolist() == ref.quota_sequence(weights, 2 * sum(weights))
    assert _max_deviation(weights, np.tile(stream, 3)) < 1
    assert np.bincount(stream, minlength=len(weights)).tolist() == weights


def test_interleave_tables():
    inter = perm.Interleave(np.array([5, 3, 2], dtype=np.int64))
    assert inter.period == 10 and inter.stream.tolist() == [0, 1, 0, 2, 0, 1, 0, 1, 0, 2]
    assert inter.picks(8, 5).tolist() == [0, 2, 0, 1, 0]
    assert inter.count_before(23).tolist() == [2 * 5 + 2, 2 * 3 + 1, 2 * 2 + 0]
    assert inter.position_of(2, 0) == 3 and inter.position_of(2, 3) == 19 and inter.position_of(0, 5) == 10
    clone = pickle.loads(pickle.dumps(inter))
    assert clone.stream.tolist() == inter.stream.tolist()
    with pytest.raises(ValueError):
        perm.quota_schedule(np.array([0, 0], dtype=np.int64))
    with pytest.raises(ValueError):
        perm.quota_schedule(np.array([-1, 2], dtype=np.int64))


def test_stream_tables_read_ranges_and_arrays_alike():
    inter = perm.Interleave(np.array([2, 1], dtype=np.int64))
    ends = np.cumsum(np.array([1, 3, 1], dtype=np.int64))
    as_range = perm.StreamTables([5, 6], [range(10, 13), range(40, 47)], [ends, None], True)
    as_array = perm.StreamTables([5, 6], [np.arange(10, 13), np.arange(40, 47)], [ends, None], True)
    outs = []
    for tables in (as_range, as_array, pickle.loads(pickle.dumps(as_range))):
        out, picks = np.empty(60, dtype=np.int64), np.empty(60, dtype=np.int16)
        tables.block(3, inter, 7, np.array([4, 0], dtype=np.int64), out, picks)
        outs.append((out.tolist(), picks.tolist()))
    assert outs[0] == outs[1] == outs[2]
    assert as_range.per_epoch.tolist() == [5, 7]
    out, picks = outs[0]
    # stream 0's picks from stream position 4 + 5 on read its epoch order (repeat counts 1, 3, 1)
    mine = [r for r, s in zip(out, picks) if s == 0]
    assert mine == [10 + x for x in ref.permuted(3, 5, [1, 3, 1], 4 + 5, len(mine))]
    with pytest.raises(ValueError):
        perm.StreamTables([1], [range(0)], [None], True)
    with pytest.raises(ValueError):
        perm.StreamTables([1], [np.arange(3)], [np.array([1, 2])], True)
