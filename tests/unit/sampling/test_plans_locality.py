"""Mixtures and curricula whose streams read locality-aware exactly-once epochs (plans.py with a
`Locality`, orders.py's `stream_plan`) against the sequential simulation in tests/reference/perm.py
fed by the locality orders of tests/reference/locality.py: bit-identical rows, each stream
shard-local (a stream window reads only its window's shards), exact resume with the state naming
the window and the streams' shards, refusals, and the order identity."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datasetrt.errors import SamplingConfigError, SamplingStateError
from datasetrt.sampling import Curriculum, CurriculumPlan, Mixture, MixturePlan, Stage, Stream, StreamRows, stream_label
from datasetrt.sampling.curriculum import order_identity as stream_order_identity
from datasetrt.sampling.locality import Locality
from datasetrt.sampling.orders import Ordering, order_identity, position_plan
from datasetrt.sampling.planner import ActiveRows, Population
from datasetrt.table.catalog import CacheCatalog
from tests.reference import perm as ref
from tests.reference.locality import LocalityOrders

PROPS = settings(derandomize=True, deadline=None, max_examples=40)
NAMES = ("a", "b", "c")
STREAMS = {n: Stream.by_column("s", n) for n in NAMES}


def layout(sizes, shard_rows, repeats=None):
    """Disjoint streams over interleaved population rows, shards of `shard_rows` consecutive
    population rows: (StreamRows, rows per stream, counts per stream, blocks per population row)."""
    total = sum(sizes)
    owner = np.repeat(np.arange(len(sizes)), sizes)[np.random.default_rng(len(sizes) + total).permutation(total)]
    blocks = np.arange(total, dtype=np.int64) // shard_rows * 5 + 2  # sparse, increasing ids
    rows = {n: np.flatnonzero(owner == k).astype(np.int64) for k, n in enumerate(NAMES[: len(sizes)])}
    counts = {n: list(repeats[n]) if repeats and n in repeats else [1] * len(r) for n, r in rows.items()}
    weights = {n: np.array(c, dtype=np.float64) for n, c in counts.items() if any(x != 1 for x in c)}
    return StreamRows(rows, weights or None), [r.tolist() for r in rows.values()], list(counts.values()), blocks


def locality_orders(names, seed, rows, counts, blocks, window):
    return LocalityOrders(seed, [stream_label(n) for n in names], counts, [blocks[np.array(r)] for r in rows], window)


def mixture(weights, stop=False, order="permutation"):
    total = sum(weights)
    props = {n: f"{w}/{total}" for n, w in zip(NAMES, weights)}
    return Mixture(props, STREAMS, on_exhausted="stop" if stop else "next_epoch", order=order)


@PROPS
@given(
    w=st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
    sizes=st.lists(st.integers(1, 25), min_size=3, max_size=3),
    shard_rows=st.integers(1, 7),
    window=st.integers(1, 4),
    seed=st.integers(0, 2**64 - 1),
    stop=st.booleans(),
    repeat=st.booleans(),
    first=st.integers(0, 120),
    count=st.integers(0, 120),
)
@example(w=[1, 0, 0], sizes=[1, 1, 1], shard_rows=1, window=1, seed=0, stop=False, repeat=False, first=0, count=5)
@example(w=[2, 1, 1], sizes=[9, 4, 20], shard_rows=3, window=2, seed=3, stop=True, repeat=True, first=7, count=90)
def test_mixture_rows_match_the_simulation(w, sizes, shard_rows, window, seed, stop, repeat, first, count):
    repeats = {"a": [1 + i % 3 for i in range(sizes[0])]} if repeat else None
    streams, rows, counts, blocks = layout(sizes, shard_rows, repeats)
    mix = mixture(w, stop)
    plan = MixturePlan(mix, streams, seed, locality=Locality(window, blocks))
    orders = locality_orders(NAMES, seed, rows, counts, blocks, window)
    stage = {"weights": list(mix.weights), "samples": None, "stop": stop}
    expected = ref.curriculum(orders, rows, [stage], 1, first + count)
    assert plan.stream_sizes.tolist() == [sum(c) for c in counts]
    if plan.length is not None and first + count > plan.length:
        assert len(expected) == plan.length
        return
    assert plan.rows(first, count).tolist() == [r for r, _s, _g in expected[first : first + count]]


@PROPS
@given(seed=st.integers(0, 2**64 - 1), window=st.integers(1, 3), resume_at=st.integers(0, 150))
@example(seed=0, window=1, resume_at=0)
def test_curriculum_rows_and_resume_match_the_simulation(seed, window, resume_at):
    cur = Curriculum(
        [Stage(mixture([1, 1, 2]), batches=5), Stage(mixture([0, 3, 1]), batches=7), Stage(mixture([1, 0, 4]))],
        batch_size=4,
    )
    streams, rows, counts, blocks = layout([6, 30, 70], 4)
    local = Locality(window, blocks)
    plan = CurriculumPlan(cur, streams, seed, locality=local)
    stages = [
        {"weights": list(s.mixture.weights), "samples": cur.samples(i), "stop": False} for i, s in enumerate(cur.stages)
    ]
    expected = ref.curriculum(locality_orders(NAMES, seed, rows, counts, blocks, window), rows, stages, 4, 200)
    assert plan.rows(0, 200).tolist() == [r for r, _s, _g in expected]
    state = json.loads(json.dumps(plan.state_dict(resume_at)))
    fresh = CurriculumPlan(cur, streams, seed, locality=local)
    assert fresh.load_state_dict(state) == resume_at
    assert fresh.rows(resume_at, 200 - resume_at).tolist() == [r for r, _s, _g in expected[resume_at:]]


def test_each_stream_reads_its_epochs_a_window_of_its_shards_at_a_time():
    """Stream by stream, the plan's picks are the stream's locality order: every stream epoch
    holds each of its rows once, and each stream window touches at most `window` shards."""
    streams, rows, _counts, blocks = layout([300, 800, 2_000], 25)
    window = 3
    plan = MixturePlan(mixture([1, 2, 3]), streams, 17, locality=Locality(window, blocks))
    n = 12_000
    picks, got = plan.streams_at(0, n), plan.rows(0, n)
    for s, stream in enumerate(plan._finish):
        taken = got[picks == s]
        size = len(rows[s])
        for e in range(len(taken) // size):
            epoch = taken[e * size : (e + 1) * size]
            assert sorted(epoch.tolist()) == rows[s]
            _order, starts = stream.order.epoch_layout(e)
            for j in range(len(starts) - 1):
                assert len(set(blocks[epoch[starts[j] : starts[j + 1]]].tolist())) <= window
        shards_per_epoch = len(set(blocks[rows[s]].tolist()))
        assert stream.order.block_count == shards_per_epoch > window


def test_state_names_the_window_and_the_shards_and_refuses_other_ones():
    streams, _rows, _counts, blocks = layout([40, 60, 90], 6)
    mix = mixture([1, 1, 1])
    plan = MixturePlan(mix, streams, 5, locality=Locality(2, blocks))
    state = json.loads(json.dumps(plan.state_dict(101)))
    assert state["locality"]["window_blocks"] == 2 and len(state["locality"]["stream_blocks"]) == 3
    assert "locality" not in MixturePlan(mix, streams, 5).state_dict(101)  # other orders' states unchanged
    cases = [
        (MixturePlan(mix, streams, 5), r"the stream orders differ"),
        (
            MixturePlan(mix, streams, 5, locality=Locality(3, blocks)),
            r"locality window differs \(state 2 shards, here 3\)",
        ),
        (
            MixturePlan(mix, streams, 5, locality=Locality(2, blocks // 11)),
            r"the shards of the rows of stream 'a' differ",
        ),
    ]
    for other, match in cases:
        before = other.rows(0, 20)
        with pytest.raises(SamplingStateError, match=match):
            other.load_state_dict(state)
        assert np.array_equal(other.rows(0, 20), before)
    with pytest.raises(SamplingStateError, match="stream orders differ"):
        plan.load_state_dict(MixturePlan(mix, streams, 5).state_dict(4))
    edited = {**state, "locality": {**state["locality"], "stream_blocks": ["0" * 32] * 3}}
    with pytest.raises(SamplingStateError, match="shards of the rows of stream 'a'"):
        plan.load_state_dict(edited)
    same = MixturePlan(mix, streams, 5, locality=Locality(2, blocks * 3 + 1))  # same shards, other ids
    assert same.load_state_dict(state) == 101
    assert np.array_equal(same.rows(101, 500), plan.rows(101, 500))
    assert np.array_equal(pickle.loads(pickle.dumps(plan)).rows(0, 700), plan.rows(0, 700))


def test_weighted_mixture_is_refused_and_the_plain_orders_are_unchanged():
    streams, _rows, _counts, blocks = layout([10, 20, 30], 5)
    with pytest.raises(SamplingConfigError, match="order='weighted' draws with replacement"):
        MixturePlan(mixture([1, 1, 1], order="weighted"), streams, 1, locality=Locality(2, blocks))
    plain = MixturePlan(mixture([1, 1, 1]), streams, 1)
    local = MixturePlan(mixture([1, 1, 1]), streams, 1, locality=Locality(2, blocks))
    assert plain.order_name == "permutation" and local.order_name == "locality:2"
    assert plain.rows(0, 300).tolist() != local.rows(0, 300).tolist()


def population_with(order, streams, n_rows):
    catalog = CacheCatalog([0], [n_rows], ["mem"])
    active = ActiveRows(np.zeros(n_rows, dtype=np.int64), np.arange(n_rows, dtype=np.uint64), None)
    return Population(catalog, active).with_order(order, streams)


def test_position_plan_and_identity_follow_the_ordering():
    streams, _rows, _counts, blocks = layout([10, 20, 30], 5)
    mix = mixture([1, 1, 1])
    population = population_with(mix, streams, 60)
    shards = Ordering("locality", 2, lambda _p: blocks)
    plan = position_plan(population, 9, shards)
    assert isinstance(plan, MixturePlan) and plan.order_name == "locality:2"
    assert plan is position_plan(population, 9, shards)  # built once per population, seed and window
    assert position_plan(population, 9, Ordering("permutation")).order_name == "permutation"
    assert order_identity(population, Ordering("permutation")) == stream_order_identity(mix, streams)
    identity = order_identity(population, shards)
    assert identity.startswith("mixture+locality:2:")
    assert order_identity(population_with(mix, streams, 60), Ordering("locality", 3, lambda _p: blocks)).startswith(
        "mixture+locality:3:"
    )
    other = order_identity(population_with(mix, streams, 60), Ordering("locality", 2, lambda _p: blocks // 11))
    assert other.startswith("mixture+locality:2:") and other != identity
    cur = Curriculum([Stage(mix)], batch_size=2)
    assert order_identity(population_with(cur, streams, 60), shards).startswith("curriculum+locality:2:")
    with pytest.raises(SamplingConfigError, match="needs the caches' shard"):
        position_plan(population_with(mix, streams, 60), 9, Ordering("locality", 2))
