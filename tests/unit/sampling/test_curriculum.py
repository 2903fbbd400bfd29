"""datasetrt.sampling.curriculum against the sequential simulation in tests/reference/perm.py:
stages at batch boundaries, streams continuing across stages, advance(), and resume (mid-stage,
across stages, after an advance) bit-identical to an uninterrupted run; typed refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import datasetrt as drt
from datasetrt.errors import ArgumentTypeError, SamplingConfigError, SamplingStateError
from datasetrt.sampling import Curriculum, CurriculumPlan, Mixture, Stage, Stream, StreamRows, stream_label
from tests.reference import perm as ref

PROPS = settings(derandomize=True, deadline=None, max_examples=50)
NAMES = ("a", "b", "c")
SIZES = (5, 40, 300)
STREAMS = {n: Stream.by_column("source", n) for n in NAMES}


def stream_rows() -> tuple[StreamRows, list[list[int]]]:
    rows = {n: np.arange(1000 * k, 1000 * k + size, dtype=np.int64) for k, (n, size) in enumerate(zip(NAMES, SIZES))}
    return StreamRows(rows), [r.tolist() for r in rows.values()]


def mix(weights, stop=False) -> Mixture:
    total = sum(weights)
    return Mixture(
        {n: f"{w}/{total}" for n, w in zip(NAMES, weights) if w}, STREAMS, on_exhausted="stop" if stop else "next_epoch"
    )


def three_stages(batch=8):
    return Curriculum(
        [
            Stage(mix([1, 1, 2]), batches=5, name="warmup"),
            Stage(mix([0, 3, 1]), samples=10 * batch, name="main"),
            Stage(mix([1, 0, 4]), name="anneal"),
        ],
        batch_size=batch,
    )


def simulate(cur: Curriculum, seed: int, total: int, advances: dict[int, int]):
    orders = ref.Orders(seed, [stream_label(n) for n in NAMES], [[1] * s for s in SIZES])
    stages = [
        {
            "weights": list(_weights_over(stage.mixture)),
            "samples": cur.samples(i),
            "stop": stage.mixture.on_exhausted == "stop",
        }
        for i, stage in enumerate(cur.stages)
    ]
    return ref.curriculum(orders, stream_rows()[1], stages, cur.batch_size, total, advances)


def _weights_over(m: Mixture):
    w = dict(zip(m.names, m.weights))
    return [w.get(n, 0) for n in NAMES]


def run(plan: CurriculumPlan, total: int, batch: int, advance_at=(), resume_at=None, seed=0, cur=None):
    """Read `total` positions batch by batch, calling advance() when the position reaches an entry
    of `advance_at`; with `resume_at`, switch to a fresh plan loaded from a JSON state there.
    Returns (rows, stage per batch, {advance position: stage})."""
    rows, stages, advances = [], [], {}
    pending = sorted(advance_at)
    position = 0
    while position < total and (plan.length is None or position < plan.length):
        if resume_at is not None and position >= resume_at:
            state = json.loads(json.dumps(plan.state_dict(position)))
            plan = CurriculumPlan(cur, stream_rows()[0], seed)
            assert plan.load_state_dict(state) == position
            resume_at = None
        while pending and pending[0] <= position:
            pending.pop(0)
            g = plan.stage_at(position)
            if g + 1 < len(plan.stages):
                advances[position] = g
                plan.advance(position)
        count = min(batch, total - position, (plan.length or total) - position)
        got = plan.stages_at(position, count)
        assert len(set(got.tolist())) == 1  # a batch comes from one stage
        stages.append(int(got[0]))
        rows += plan.rows(position, count).tolist()
        position += count
    return rows, stages, advances


def test_public_names():
    assert drt.Curriculum is Curriculum and drt.Stage is Stage


def test_stages_follow_the_simulation_with_streams_continuing():
    cur = three_stages()
    plan = CurriculumPlan(cur, stream_rows()[0], 4)
    expected = simulate(cur, 4, 300, {})
    assert plan.rows(0, 300).tolist() == [r for r, _s, _g in expected]
    assert plan.stages_at(0, 300).tolist() == [g for _r, _s, g in expected]
    assert plan.streams_at(0, 300).tolist() == [s for _r, s, _g in expected]
    assert [plan.stage_at(p) for p in (0, 39, 40, 119, 120)] == [0, 0, 1, 1, 2]
    assert plan.length is None
    # stream b continues: its samples before stage 2 carry over
    assert plan.stream_positions(120).tolist() == [10, 10 + 60, 20 + 20]


@PROPS
@given(
    seed=st.integers(0, 2**64 - 1),
    batch=st.integers(1, 6),
    lengths=st.lists(st.integers(0, 6), min_size=2, max_size=2),
    weights=st.lists(
        st.lists(st.integers(0, 4), min_size=3, max_size=3).filter(lambda w: sum(w) > 0), min_size=3, max_size=3
    ),
    stops=st.lists(st.booleans(), min_size=3, max_size=3),
    advance_at=st.lists(st.integers(0, 120), max_size=3),
    resume_at=st.none() | st.integers(0, 120),
)
@example(
    seed=0,
    batch=4,
    lengths=[3, 3],
    weights=[[1, 1, 1], [1, 0, 0], [0, 0, 1]],
    stops=[True, True, True],
    advance_at=[5],
    resume_at=6,
)
@example(
    seed=1,
    batch=3,
    lengths=[0, 2],
    weights=[[1, 0, 0], [0, 1, 0], [0, 0, 1]],
    stops=[False, False, False],
    advance_at=[0, 1, 2],
    resume_at=3,
)
def test_advance_and_resume_match_the_simulation(seed, batch, lengths, weights, stops, advance_at, resume_at):
    cur = Curriculum(
        [
            Stage(mix(weights[0], stops[0]), batches=lengths[0]),
            Stage(mix(weights[1], stops[1]), samples=lengths[1] * batch),
            Stage(mix(weights[2], stops[2])),
        ],
        batch_size=batch,
    )
    total = 150
    rows, stages, advances = run(CurriculumPlan(cur, stream_rows()[0], seed), total, batch, advance_at)
    expected = simulate(cur, seed, total, advances)
    assert rows == [r for r, _s, _g in expected]
    assert stages == [g for _r, _s, g in expected[::batch]]
    resumed, resumed_stages, _ = run(
        CurriculumPlan(cur, stream_rows()[0], seed), total, batch, advance_at, resume_at=resume_at, seed=seed, cur=cur
    )
    assert resumed == rows and resumed_stages == stages


def test_resume_mid_stage_and_across_stages_is_bit_identical():
    cur = three_stages(batch=8)
    base = run(CurriculumPlan(cur, stream_rows()[0], 9), 400, 8, advance_at=[60])
    assert base[2] == {64: 1}  # advance() at 60 (stage "main") took effect at the next batch boundary
    for resume_at in (16, 44, 64, 70, 200):  # mid warmup, mid main, at the advanced boundary, after, anneal
        assert (
            run(CurriculumPlan(cur, stream_rows()[0], 9), 400, 8, advance_at=[60], resume_at=resume_at, seed=9, cur=cur)
            == base
        )


def test_state_after_an_advance_keeps_the_cut_stage_end():
    cur = three_stages(batch=8)
    plan = CurriculumPlan(cur, stream_rows()[0], 2)
    assert plan.advance(3) == 8  # stage 0 now ends at 8
    state = plan.state_dict(5)
    assert (state["stage"], state["stage_start"], state["stage_end"]) == (0, 0, 8)
    fresh = CurriculumPlan(cur, stream_rows()[0], 2)
    fresh.load_state_dict(state)
    assert fresh.stages_at(5, 11).tolist() == [0, 0, 0] + [1] * 8
    assert np.array_equal(fresh.rows(5, 100), plan.rows(5, 100))
    assert plan.state_dict(8)["stage"] == 1 and plan.state_dict(8)["stage_stream_positions"] == [2, 2, 4]


def test_stop_in_an_inner_stage_ends_at_a_batch_boundary_and_the_stream_continues():
    cur = Curriculum([Stage(mix([1, 1, 0], stop=True), batches=100), Stage(mix([1, 0, 0]), batches=2)], batch_size=4)
    plan = CurriculumPlan(cur, stream_rows()[0], 0)
    # stream a (5 rows) would take its 6th sample at position 10: the stage ends at 8
    assert plan.stages_at(0, 16).tolist() == [0] * 8 + [1] * 8 and plan.length == 16
    first = plan.rows(0, 8)[::2].tolist() + plan.rows(8, 1).tolist()
    assert sorted(first) == list(range(5))  # a's epoch: 4 in stage 0, the 5th opens stage 1
    assert plan.progress(16)[0].epoch == 2


def test_advance_refusals():
    cur = three_stages()
    plan = CurriculumPlan(cur, stream_rows()[0], 0)
    with pytest.raises(SamplingStateError, match=r"stage 2 \('anneal'\) is the last stage"):
        plan.advance(500)
    assert plan.advance(41) == 48 and plan.stage_at(47) == 1 and plan.stage_at(48) == 2
    with pytest.raises(SamplingStateError, match="last stage"):
        plan.advance(48)
    fresh = CurriculumPlan(cur, stream_rows()[0], 0)
    assert fresh.advance(40) == 40 and fresh.stage_at(40) == 2  # at stage 1's first position: stage 1 is empty
    assert fresh.advance(38) == 40  # stage 0 already ends within this batch
    with pytest.raises(SamplingStateError):
        plan.advance(-3)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (
            lambda: Curriculum([Stage(mix([1, 1, 1]), samples=10)], batch_size=4),
            SamplingConfigError,
            "10 samples is not a whole",
        ),
        (
            lambda: Curriculum([Stage(mix([1, 1, 1])), Stage(mix([1, 0, 0]))], batch_size=4),
            SamplingConfigError,
            "only the last",
        ),
        (
            lambda: Curriculum(
                [Stage(mix([1, 1, 1]), batches=1, name="x"), Stage(mix([1, 0, 0]), name="x")], batch_size=4
            ),
            SamplingConfigError,
            "two stages are named 'x'",
        ),
        (
            lambda: Curriculum(
                [Stage(mix([1, 1, 1]), batches=1), Stage(Mixture({"a": 1}, {"a": Stream.by_cache("other")}))],
                batch_size=4,
            ),
            SamplingConfigError,
            r"stream 'a' is caches \['other'\] in stage 1",
        ),
        (
            lambda: Curriculum(
                [Stage(mix([1, 1, 1]), batches=1), Stage(Mixture({"a": 1}, STREAMS, order="weighted"))], batch_size=4
            ),
            SamplingConfigError,
            "one order",
        ),
        (lambda: Curriculum([], batch_size=4), SamplingConfigError, "at least one stage"),
        (lambda: Curriculum([Stage(mix([1, 1, 1]))], batch_size=0), SamplingConfigError, "batch_size"),
        (lambda: Stage(mix([1, 1, 1]), samples=8, batches=1), SamplingConfigError, "not both"),
        (lambda: Stage(mix([1, 1, 1]), batches=-1), SamplingConfigError, ">= 0"),
        (lambda: Stage({"a": 1}), ArgumentTypeError, "Mixture"),
    ],
)
def test_bad_curricula_are_refused(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    "other, match",
    [
        (
            lambda: Curriculum(
                [
                    Stage(mix([1, 1, 2]), batches=5, name="warmup"),
                    Stage(mix([0, 3, 1]), batches=11, name="main"),
                    Stage(mix([1, 0, 4]), name="anneal"),
                ],
                batch_size=8,
            ),
            r"stage 1 \('main'\): samples differs \(state 80, here 88\)",
        ),
        (
            lambda: Curriculum(
                [Stage(mix([1, 1, 2]), batches=5, name="warmup"), Stage(mix([0, 3, 1]), batches=10, name="main")],
                batch_size=8,
            ),
            r"number of stages differs \(state 3, here 2\)",
        ),
        (
            lambda: Curriculum(
                [
                    Stage(mix([1, 1, 2]), batches=5, name="warmup"),
                    Stage(mix([0, 1, 1]), batches=10, name="main"),
                    Stage(mix([1, 0, 4]), name="anneal"),
                ],
                batch_size=8,
            ),
            r"stream 'b' differs \(state 3/4, here 1/2\)",
        ),
        (
            lambda: Curriculum(
                [
                    Stage(mix([1, 1, 2]), batches=10, name="warmup"),
                    Stage(mix([0, 3, 1]), batches=20, name="main"),
                    Stage(mix([1, 0, 4]), name="anneal"),
                ],
                batch_size=4,
            ),
            r"batch size differ \(state 8, here 4\)",
        ),
    ],
)
def test_state_of_another_stage_list_is_refused(other, match):
    plan = CurriculumPlan(three_stages(), stream_rows()[0], 1)
    state = plan.state_dict(100)
    target = CurriculumPlan(other(), stream_rows()[0], 1)
    with pytest.raises(SamplingStateError, match=match):
        target.load_state_dict(state)
    assert target.stage_at(0) == 0 and len(target.rows(0, 16)) == 16  # still usable
    mixture_state = {**state, "kind": "datasetrt.sampling.mixture"}
    with pytest.raises(SamplingStateError, match="not a datasetrt.sampling.curriculum state"):
        plan.load_state_dict(mixture_state)


def test_state_with_edited_stream_epochs_is_refused():
    """docs/sampling.md: a state's stream_epochs are checked on load (they follow from its positions)."""
    plan = CurriculumPlan(three_stages(), stream_rows()[0], 1)
    state = plan.state_dict(100)
    assert CurriculumPlan(three_stages(), stream_rows()[0], 1).load_state_dict(state) == 100
    edited = {**state, "stream_epochs": [e + 1 for e in state["stream_epochs"]]}
    with pytest.raises(SamplingStateError, match="stream_epochs"):
        CurriculumPlan(three_stages(), stream_rows()[0], 1).load_state_dict(edited)
