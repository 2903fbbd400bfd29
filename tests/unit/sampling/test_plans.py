"""datasetrt.sampling.plans (MixturePlan) against the sequential simulation in tests/reference/perm.py:
bit-identical rows, the prefix bound at every n, exactly-once within each stream's epochs,
"stop" and "next_epoch", weighted streams, slicing by any share layout, the state dict, streams given as
ranges, and O(1) memory at 10^8 rows (tracemalloc and RSS)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datasetrt._native import draws, perm
from datasetrt.errors import (
    PlanRangeError,
    RepeatCountError,
    SamplingConfigError,
    SamplingStateError,
    UnknownStreamError,
)
from datasetrt.sampling import Mixture, MixturePlan, Stream, StreamRows, stream_label
from tests.reference import perm as ref

PROPS = settings(derandomize=True, deadline=None, max_examples=60)
NAMES = ("a", "b", "c")


def make_rows(sizes, repeats=None) -> tuple[StreamRows, list[list[int]], list[list[int]]]:
    """Disjoint streams over consecutive population rows; (StreamRows, rows, counts) per stream."""
    rows, counts, start = {}, {}, 0
    for name, n in zip(NAMES, sizes):
        rows[name] = np.arange(start, start + n, dtype=np.int64) * 3 + 1  # not the identity
        start += n
        counts[name] = list(repeats[name]) if repeats and name in repeats else [1] * n
    weights = {k: np.array(v, dtype=np.float64) for k, v in counts.items() if any(c != 1 for c in v)}
    names = list(rows)
    return StreamRows(rows, weights or None), [rows[k].tolist() for k in names], [counts[k] for k in names]


def mixture(props: dict, **kw) -> Mixture:
    return Mixture(props, {n: Stream.by_column("s", n) for n in NAMES[: len(props)]}, **kw)


def reference(mix: Mixture, rows, counts, seed, total):
    orders = ref.Orders(seed, [stream_label(n) for n in mix.names], counts)
    stage = {"weights": list(mix.weights), "samples": None, "stop": mix.on_exhausted == "stop"}
    return ref.curriculum(orders, rows, [stage], 1, total)


weights_st = st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(lambda w: sum(w) > 0)


@PROPS
@given(
    w=weights_st,
    sizes=st.lists(st.integers(1, 30), min_size=3, max_size=3),
    seed=st.integers(0, 2**64 - 1),
    stop=st.booleans(),
    first=st.integers(0, 200),
    count=st.integers(0, 200),
)
@example(w=[5, 3, 2], sizes=[1, 1, 1], seed=0, stop=False, first=0, count=50)
@example(w=[0, 1, 0], sizes=[3, 4, 5], seed=1, stop=True, first=0, count=4)
def test_rows_match_the_sequential_simulation(w, sizes, seed, stop, first, count):
    total = sum(w)
    mix = mixture(dict(zip(NAMES, [f"{x}/{total}" for x in w])), on_exhausted="stop" if stop else "next_epoch")
    stream_rows, rows, counts = make_rows(sizes)
    plan = MixturePlan(mix, stream_rows, seed)
    expected = reference(mix, rows, counts, seed, first + count)
    if plan.length is not None:
        assert plan.length == len(expected) and stop
        if first + count > plan.length:
            with pytest.raises(PlanRangeError):
                plan.rows(first, count)
            return
    assert plan.rows(first, count).tolist() == [r for r, _s, _g in expected[first : first + count]]
    assert plan.streams_at(first, count).tolist() == [s for _r, s, _g in expected[first : first + count]]


@PROPS
@given(seed=st.integers(0, 2**64 - 1), reps=st.lists(st.integers(1, 4), min_size=5, max_size=5))
def test_repeat_counts_inside_streams_match_the_simulation(seed, reps):
    mix = mixture({"a": 0.5, "b": 0.25, "c": 0.25})
    stream_rows, rows, counts = make_rows([5, 3, 7], {"a": reps})
    plan = MixturePlan(mix, stream_rows, seed)
    expected = reference(mix, rows, counts, seed, 120)
    assert plan.rows(0, 120).tolist() == [r for r, _s, _g in expected]


def test_prefix_bound_and_exactly_once_with_very_different_stream_sizes():
    """0.5 / 0.3 / 0.2 over streams of 10, 1,000 and 100,000 rows: after every n of 100k samples each
    stream delivered within 1 of n x p; each stream's aligned epochs hold each of its rows once."""
    mix = mixture({"a": 0.5, "b": 0.3, "c": 0.2})
    stream_rows, rows, _ = make_rows([10, 1_000, 100_000])
    plan = MixturePlan(mix, stream_rows, 77)
    n_total = 100_000
    picks = plan.streams_at(0, n_total)
    got = plan.rows(0, n_total)
    n = np.arange(1, n_total + 1)
    for s, w in enumerate(mix.weights):
        delivered = np.cumsum(picks == s)
        assert np.abs(delivered * mix.period - n * w).max() < mix.period  # |c - n p| < 1, exactly
        taken = got[picks == s]
        size = len(rows[s])
        full = len(taken) // size * size
        for e in range(0, full, size):
            assert np.array_equal(np.sort(taken[e : e + size]), np.array(rows[s]))
        assert len(np.unique(taken[full:])) == len(taken) - full
    progress = {p.name: p for p in plan.progress(n_total)}
    assert (progress["a"].samples, progress["a"].epoch, progress["a"].epoch_position) == (50_000, 5_000, 0)
    assert (progress["b"].epoch, progress["c"].epoch, progress["c"].epoch_position) == (30, 0, 20_000)


def test_any_share_layout_slices_the_same_plan():
    """Ranks x workers read blocks w, w+K, ... of batches r, r+W, ...: the union is the plan."""
    mix = mixture({"a": 0.25, "b": 0.25, "c": 0.5})
    plan = MixturePlan(mix, make_rows([7, 50, 300])[0], 3)
    whole = plan.rows(0, 4_000)
    for world, workers, batch in [(1, 1, 64), (2, 2, 32), (3, 1, 10), (4, 3, 7)]:
        got = np.empty_like(whole)
        for rank in range(world):
            for worker in range(workers):
                for b in range(rank + worker * world, len(whole) // batch + 1, world * workers):
                    first, count = b * batch, min(batch, len(whole) - b * batch)
                    if count > 0:
                        got[first : first + count] = MixturePlan(mix, make_rows([7, 50, 300])[0], 3).rows(first, count)
        assert np.array_equal(got, whole)


def test_stop_ends_when_a_stream_completes_its_epoch():
    mix = mixture({"a": 0.5, "b": 0.5}, on_exhausted="stop")
    plan = MixturePlan(mix, make_rows([4, 100])[0], 0)
    assert plan.length == 8  # stream a's 5th pick would be position 8
    assert sorted(plan.rows(0, 8)[::2].tolist()) == [1, 4, 7, 10]
    assert plan.stage_at(8) == 0 and plan.stream_positions(8).tolist() == [4, 4]
    with pytest.raises(PlanRangeError, match="past the end"):
        plan.rows(7, 2)
    assert plan.rows(8, 0).shape == (0,)


def test_weighted_streams_draw_with_replacement_from_their_own_draw_stream():
    mix = mixture({"a": 0.5, "b": 0.5}, order="weighted")
    weights = {"a": np.array([1.0, 2.0, 0.5])}
    stream_rows = StreamRows({"a": np.array([10, 11, 12]), "b": np.array([20, 21])}, weights)
    plan = MixturePlan(mix, stream_rows, 9)
    got = plan.rows(0, 400)
    cum, scale = draws.weighted_cumulative(weights["a"])
    a = draws.weighted_draws(perm.stream_seed(9, stream_label("a")), cum, scale, 0, 200)
    b = draws.uniform_draws(perm.stream_seed(9, stream_label("b")), 2, 0, 200)
    assert got[0::2].tolist() == (a + 10).tolist() and got[1::2].tolist() == (b + 20).tolist()
    assert plan.stream_sizes.tolist() == [3, 2] and plan.progress(400)[0].epoch == 66


def test_non_integer_weight_in_an_exactly_once_stream_is_refused():
    stream_rows = StreamRows({"a": np.array([4, 8, 9]), "b": np.array([1])}, {"a": np.array([1.0, 2.5, 1.0])})
    with pytest.raises(RepeatCountError, match=r"stream 'a' row 1 \(table row 8\) has weight 2\.5"):
        MixturePlan(mixture({"a": 0.5, "b": 0.5}), stream_rows, 0)
    MixturePlan(mixture({"a": 0.5, "b": 0.5}, order="weighted"), stream_rows, 0)  # draws take any weight
    with pytest.raises(UnknownStreamError, match="'c'"):
        MixturePlan(mixture({"a": 0.5, "b": 0.25, "c": 0.25}), stream_rows, 0)


# -- state ---------------------------------------------------------------------------------------


def test_state_round_trips_through_json_and_resumes_exactly():
    mix = mixture({"a": 0.5, "b": 0.3, "c": 0.2})
    stream_rows = make_rows([10, 1_000, 5_000])[0]
    plan = MixturePlan(mix, stream_rows, 5)
    whole = plan.rows(0, 20_000)
    state = json.loads(json.dumps(plan.state_dict(12_345)))
    assert state["position"] == 12_345 and state["stream_positions"] == [6_173, 3_703, 2_469]
    assert state["stream_epochs"] == [617, 3, 0] and state["stages"][0]["weights"] == [5, 3, 2]
    fresh = MixturePlan(mix, make_rows([10, 1_000, 5_000])[0], 5)
    assert fresh.load_state_dict(state) == 12_345
    assert np.array_equal(fresh.rows(12_345, 20_000 - 12_345), whole[12_345:])
    assert np.array_equal(fresh.rows(0, 100), whole[:100])  # the state's stage is reachable from its start
    clone = pickle.loads(pickle.dumps(plan))
    assert np.array_equal(clone.rows(19_000, 1_000), whole[19_000:])


@pytest.mark.parametrize(
    "other, match",
    [
        (
            lambda: (mixture({"a": 0.6, "b": 0.2, "c": 0.2}), 5, [10, 100, 50]),
            r"stage 0 \('mixture'\): the proportion of stream 'a' differs \(state 1/2, here 3/5\)",
        ),
        (lambda: (mixture({"a": 0.5, "b": 0.3, "c": 0.2}), 6, [10, 100, 50]), r"seed differ \(state 5, here 6\)"),
        (lambda: (mixture({"a": 0.5, "b": 0.3, "c": 0.2}), 5, [10, 101, 50]), r"stream sizes differ"),
        (
            lambda: (mixture({"a": 0.5, "b": 0.3, "c": 0.2}, on_exhausted="stop"), 5, [10, 100, 50]),
            r"on_exhausted differs",
        ),
        (lambda: (mixture({"a": 0.5, "b": 0.5}), 5, [10, 100]), r"streams differ"),
    ],
)
def test_state_of_another_mixture_is_refused_naming_the_difference(other, match):
    plan = MixturePlan(mixture({"a": 0.5, "b": 0.3, "c": 0.2}), make_rows([10, 100, 50])[0], 5)
    state = plan.state_dict(77)
    mix, seed, sizes = other()
    target = MixturePlan(mix, make_rows(sizes)[0], seed)
    before = target.rows(0, 10)
    with pytest.raises(SamplingStateError, match=match):
        target.load_state_dict(state)
    assert np.array_equal(target.rows(0, 10), before)  # unchanged, still usable


def test_state_with_other_rows_or_edited_fields_is_refused():
    mix = mixture({"a": 0.5, "b": 0.5})
    plan = MixturePlan(mix, make_rows([10, 20])[0], 1)
    state = plan.state_dict(33)
    shuffled = StreamRows({"a": np.arange(10)[::-1], "b": np.arange(10, 30)})
    with pytest.raises(SamplingStateError, match="rows or weights of stream 'a' differ"):
        MixturePlan(mix, shuffled, 1).load_state_dict(state)
    for key, value, match in [
        ("stream_positions", [16, 17], "inconsistent"),
        ("stream_epochs", [0, 0], "stream_epochs"),  # docs/sampling.md: checked on load
        ("stream_epochs", None, "stream_epochs"),
        ("position", -1, "invalid"),
        ("fingerprint", "0" * 32, "fingerprint"),
        ("kind", "x", "not a"),
        ("version", 9, "version"),
        ("stage_stream_positions", [0], "invalid"),
        ("stage_end", 5, "outside"),
    ]:
        with pytest.raises(SamplingStateError, match=match):
            MixturePlan(mix, make_rows([10, 20])[0], 1).load_state_dict({**state, key: value})
    with pytest.raises(SamplingStateError):
        plan.load_state_dict("not a state")


def test_range_streams_plan_as_their_arrays_do():
    """A stream given as a range of consecutive rows is the same stream as its array: same rows
    for both orders, same digest (so states load across the two), same refusals."""
    sizes = {"a": 5, "b": 40, "c": 300}
    bounds = np.cumsum([0, *sizes.values()])
    ranges = {k: range(int(x), int(y)) for k, x, y in zip(sizes, bounds[:-1], bounds[1:])}
    arrays = {k: np.arange(r.start, r.stop, dtype=np.int64) for k, r in ranges.items()}
    streams = {k: Stream.by_column("s", k) for k in sizes}
    for order in ("permutation", "weighted"):
        mix = Mixture({"a": 0.5, "b": 0.3, "c": 0.2}, streams, order=order)
        by_range, by_array = MixturePlan(mix, StreamRows(ranges), 3), MixturePlan(mix, StreamRows(arrays), 3)
        assert np.array_equal(by_range.rows(10**6, 2000), by_array.rows(10**6, 2000))
        assert by_array.load_state_dict(by_range.state_dict(77)) == 77
    weights = {"c": np.arange(300) % 3 + 1.0}
    assert StreamRows(ranges, weights).digest("c") == StreamRows(arrays, weights).digest("c")
    assert np.array_equal(StreamRows(ranges).index(345), StreamRows(arrays).index(345))
    with pytest.raises(SamplingConfigError, match="step 1"):
        StreamRows({"a": range(0, 10, 2)})
    with pytest.raises(SamplingConfigError, match="weight 0.0 of table row 7"):
        StreamRows({"a": range(5, 10)}, {"a": np.array([1.0, 1.0, 0.0, 1.0, 1.0])})


def test_mixture_and_curriculum_plans_over_1e8_rows_allocate_no_o_n_table():
    """Streams of 10^8 rows in all, given as ranges (what a whole cache of the physical table is):
    building a mixture and a 3-stage curriculum plan and planning 4,096-position blocks anywhere
    allocate the blocks and the period table only — tracemalloc peak < 256 KiB, RSS growth < 16
    MiB, where one int64 row array would take 800 MB. (Streams grouped from a table are row
    arrays: the rows are then the O(N) input, and the plan references them without a copy.)"""
    from datasetrt.sampling import Curriculum, CurriculumPlan, Stage
    from tests.unit.sampling.test_permutation import _rss, traced_peak

    n = 10**8
    sizes = {"small": 10, "medium": 333_333}
    sizes["large"] = n - sum(sizes.values())
    bounds = np.cumsum([0, *sizes.values()])
    streams = {k: Stream.by_column("s", k) for k in sizes}
    mix = Mixture({"small": 0.5, "medium": 0.3, "large": 0.2}, streams)
    cur = Curriculum(
        [
            Stage(Mixture({"small": 0.2, "medium": 0.3, "large": 0.5}, streams), batches=1000),
            Stage(mix, batches=1000),
            Stage(Mixture({"large": 1}, streams)),
        ],
        batch_size=256,
    )
    MixturePlan(mix, StreamRows({"w": range(4)} | {k: range(2) for k in sizes}), 1).rows(0, 16)  # warm-up
    rss_before = _rss()

    def plan_blocks():
        rows = StreamRows({k: range(int(a), int(b)) for k, a, b in zip(sizes, bounds[:-1], bounds[1:])})
        plans = (MixturePlan(mix, rows, 7), CurriculumPlan(cur, rows, 7))
        firsts = (0, 255_900, 10**9 + 5, 10**15)
        return plans, [(b.min(), b.max()) for b in (plan.rows(f, 4096) for plan in plans for f in firsts)]

    (plans, ranges), peak = traced_peak(plan_blocks)
    assert all(low >= 0 and high < n for low, high in ranges)  # one block alive at a time
    assert peak < 256 * 1024, f"tracemalloc peak {peak} bytes"
    assert _rss() - rss_before < 16 * 1024 * 1024
    assert sorted(plans[0].rows(0, 20)[plans[0].streams_at(0, 20) == 0]) == list(range(10))  # one small epoch
    assert plans[1].stage_at(256 * 1500) == 1 and plans[1].stage_at(256 * 2000) == 2
