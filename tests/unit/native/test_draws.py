"""datasetrt._native.draws against the pure-Python statement of dataset-rt 0.4.8's shuffle RNG."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasetrt._native import draws

try:
    from tests.reference import rng048 as ref
except ImportError:  # repository root not on sys.path: load the reference by file location
    _path = Path(__file__).resolve().parents[2] / "reference" / "rng048.py"
    _spec = importlib.util.spec_from_file_location("rng048", _path)
    ref = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(ref)

M64 = (1 << 64) - 1
SEEDS = [0, 7, M64]
# (start, count): the first draws, draws 20..39, a large index, and a run wrapping past 2**64 - 1.
WINDOWS = [(0, 20), (20, 20), (1 << 40, 8), (M64 - 9, 20)]
SIZES = [1, 2, 3, 10, 2**63 + 1]
WEIGHT_SETS = {
    "ones": [1.0] * 7,
    "linear": [float(i) for i in range(1, 11)],
    "duplicates": [2.0, 2.0, 5.0, 5.0, 5.0, 1.0, 2.0],
    "tiny": [5e-324, 1.0, 5e-324, 5e-324, 1.0, 5e-324],
    "one": [3.5],
}


def _weighted(seed, weights, start, count):
    cum, scale = draws.weighted_cumulative(np.asarray(weights, dtype=np.float64))
    return draws.weighted_draws(seed, cum, scale, start, count)


# ---------------------------------------------------------------------------------------------
# Known-good sequences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("start,count", WINDOWS)
@pytest.mark.parametrize("seed", SEEDS)
def test_uniform_matches_reference(seed, start, count, n):
    got = draws.uniform_draws(seed, n, start, count)
    assert got.dtype == np.uint64 and got.shape == (count,)
    assert got.tolist() == ref.uniform_draws(seed, n, start, count)


@pytest.mark.parametrize("name", sorted(WEIGHT_SETS))
@pytest.mark.parametrize("start,count", WINDOWS)
@pytest.mark.parametrize("seed", SEEDS)
def test_weighted_matches_reference(seed, start, count, name):
    weights = WEIGHT_SETS[name]
    got = _weighted(seed, weights, start, count)
    assert got.dtype == np.uint64 and got.shape == (count,)
    assert got.tolist() == ref.weighted_draws(seed, weights, start, count)


@pytest.mark.parametrize("name", sorted(WEIGHT_SETS))
def test_weighted_cumulative_matches_reference(name):
    weights = WEIGHT_SETS[name]
    cum, scale = draws.weighted_cumulative(np.asarray(weights, dtype=np.float64))
    ref_cum, ref_scale = ref.cumulative(weights)
    assert cum.dtype == np.float64 and cum.shape == (len(weights) - 1,)
    assert cum.tolist() == ref_cum
    assert isinstance(scale, float) and scale == ref_scale
    total = ref_cum[-1] + weights[-1] if ref_cum else weights[0]
    # The sampler's largest value, scale * (1 - 2**-52), stays strictly below the total.
    assert scale <= total and scale * (1.0 - 2.0**-52) < total


def test_rejection_heavy_uniform_consumes_extra_words():
    # n = 2**63 + 1 rejects about half of the 64-bit samples, so draws take 2, 4, ... words.
    n = 2**63 + 1
    got = draws.uniform_draws(0, n, 0, 200).tolist()
    assert got == ref.uniform_draws(0, n, 0, 200)
    assert all(0 <= x < n for x in got)


def test_index_wraps_modulo_2_64():
    wrapped = draws.uniform_draws(7, 10, M64 - 4, 10).tolist()
    assert wrapped[5:] == draws.uniform_draws(7, 10, 0, 5).tolist()
    assert wrapped[:5] == draws.uniform_draws(7, 10, M64 - 4, 5).tolist()
    w = _weighted(7, WEIGHT_SETS["linear"], M64 - 4, 10).tolist()
    assert w[5:] == _weighted(7, WEIGHT_SETS["linear"], 0, 5).tolist()


def test_empty_and_single_outcome():
    assert draws.uniform_draws(1, 5, 0, 0).shape == (0,)
    assert draws.uniform_draws(1, 1, 0, 50).tolist() == [0] * 50
    assert _weighted(1, [2.0], 0, 50).tolist() == [0] * 50
    assert _weighted(1, [2.0, 3.0], 0, 0).shape == (0,)


def test_weighted_accepts_read_only_buffers():
    weights = np.arange(1.0, 6.0)
    weights.setflags(write=False)
    cum, scale = draws.weighted_cumulative(weights)
    cum.setflags(write=False)
    got = draws.weighted_draws(3, cum, scale, 0, 30).tolist()
    assert got == ref.weighted_draws(3, weights.tolist(), 0, 30)


# ---------------------------------------------------------------------------------------------
# Properties against the reference (small sizes keep the pure-Python reference fast)
# ---------------------------------------------------------------------------------------------

u64 = st.integers(0, M64)
counts = st.integers(0, 40)
positive_weights = st.floats(
    min_value=5e-324, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=True
)


@settings(max_examples=150, deadline=None)
@given(seed=u64, n=st.one_of(st.integers(1, 50), st.integers(1, M64)), start=u64, count=counts)
def test_uniform_property(seed, n, start, count):
    got = draws.uniform_draws(seed, n, start, count).tolist()
    assert got == ref.uniform_draws(seed, n, start, count)
    assert all(0 <= x < n for x in got)


@settings(max_examples=150, deadline=None)
@given(
    seed=u64,
    weights=st.lists(positive_weights, min_size=1, max_size=50),
    start=u64,
    count=counts,
)
def test_weighted_property(seed, weights, start, count):
    cum, scale = draws.weighted_cumulative(np.asarray(weights, dtype=np.float64))
    ref_cum, ref_scale = ref.cumulative(weights)
    assert cum.tolist() == ref_cum and scale == ref_scale
    got = draws.weighted_draws(seed, cum, scale, start, count).tolist()
    assert got == ref.weighted_draws(seed, weights, start, count)
    assert all(0 <= x < len(weights) for x in got)


@settings(max_examples=50, deadline=None)
@given(seed=u64, n=st.integers(1, M64), start=u64, split=st.integers(0, 30), count=counts)
def test_windows_compose(seed, n, start, split, count):
    # A draw depends only on (seed, index): any window equals the concatenation of its parts.
    split = min(split, count)
    whole = draws.uniform_draws(seed, n, start, count).tolist()
    head = draws.uniform_draws(seed, n, start, split).tolist()
    tail = draws.uniform_draws(seed, n, (start + split) & M64, count - split).tolist()
    assert whole == head + tail


# ---------------------------------------------------------------------------------------------
# derive_seed
# ---------------------------------------------------------------------------------------------


def test_derive_seed_known_values():
    assert draws.derive_seed(9, 0, 0) == 13072959374078767098
    assert draws.derive_seed(9, 0, 1) == 5244088115552500355


@settings(max_examples=100, deadline=None)
@given(common=u64, rank=st.integers(0, 2**32 - 1), worker=st.integers(0, 2**32 - 1))
def test_derive_seed_matches_reference(common, rank, worker):
    assert draws.derive_seed(common, rank, worker) == ref.derive_seed(common, rank, worker)


@pytest.mark.parametrize("args", [(-1, 0, 0), (2**64, 0, 0), (0, -1, 0), (0, 0, 2**32)])
def test_derive_seed_rejects_out_of_range(args):
    with pytest.raises(OverflowError):
        draws.derive_seed(*args)


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------


def test_uniform_rejects_empty_range():
    with pytest.raises(ValueError):
        draws.uniform_draws(0, 0, 0, 1)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_out_of_range(seed):
    with pytest.raises((OverflowError, ValueError)):
        draws.uniform_draws(seed, 10, 0, 1)
    cum, scale = draws.weighted_cumulative(np.ones(3))
    with pytest.raises((OverflowError, ValueError)):
        draws.weighted_draws(seed, cum, scale, 0, 1)


@pytest.mark.parametrize("start", [-1, 2**64])
def test_start_out_of_range(start):
    with pytest.raises((OverflowError, ValueError)):
        draws.uniform_draws(0, 10, start, 1)


def test_negative_count():
    with pytest.raises(ValueError):
        draws.uniform_draws(0, 10, 0, -1)
    cum, scale = draws.weighted_cumulative(np.ones(3))
    with pytest.raises(ValueError):
        draws.weighted_draws(0, cum, scale, 0, -1)


def test_weighted_cumulative_rejects_no_weights_and_overflowing_sum():
    with pytest.raises(ValueError):
        draws.weighted_cumulative(np.empty(0, dtype=np.float64))
    with pytest.raises(ValueError):
        draws.weighted_cumulative(np.array([1e308, 1e308]))


# ---------------------------------------------------------------------------------------------
# Statistical sanity (deterministic: fixed seed, so never flaky)
# ---------------------------------------------------------------------------------------------


def test_weighted_frequencies():
    got = _weighted(12345, [1.0, 3.0], 0, 20_000)
    assert 0.73 <= float(np.mean(got == 1)) <= 0.77


def test_uniform_frequencies():
    got = draws.uniform_draws(12345, 10, 0, 20_000)
    counts_ = np.bincount(got.astype(np.int64), minlength=10)
    assert counts_.shape == (10,) and counts_.min() >= 1800 and counts_.max() <= 2200
