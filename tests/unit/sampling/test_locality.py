"""Locality-aware exactly-once epochs (sampling/locality.py) against the plain statement in
tests/reference/locality.py."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from datasetrt.errors import SamplingConfigError
from datasetrt.sampling.locality import LocalityPermutation, blocks_digest
from tests.reference.locality import epoch_order


@st.composite
def populations(draw):
    rows = draw(st.integers(1, 60))
    blocks = np.array(draw(st.lists(st.integers(0, 12), min_size=rows, max_size=rows)), dtype=np.int64)
    counts = None
    if draw(st.booleans()):
        counts = np.array(draw(st.lists(st.integers(1, 3), min_size=rows, max_size=rows)), dtype=np.int64)
    return blocks, counts


@given(
    populations(),
    st.integers(1, 5),
    st.integers(0, 2**64 - 1),
    st.integers(0, 3),
    st.sampled_from([0, 2**64 - 1, 12345]),
)
@example((np.zeros(1, dtype=np.int64), None), 1, 0, 0, 0)  # one row, one block
@example((np.arange(7, dtype=np.int64), None), 3, 5, 1, 0)  # one row per block
def test_rows_follow_the_reference(population, window, seed, epoch, label):
    blocks, counts = population
    plan = LocalityPermutation(seed, blocks, window, counts, label=label)
    total = plan.positions_per_epoch
    assert total == (len(blocks) if counts is None else int(counts.sum()))
    want = epoch_order(seed, blocks, window, epoch, counts, label)
    assert plan.rows(epoch * total, total).tolist() == want
    # random access: any split of the range gives the same rows
    cut = total // 3
    assert np.concatenate([plan.rows(epoch * total, cut), plan.rows(epoch * total + cut, total - cut)]).tolist() == want


@given(populations(), st.integers(1, 5), st.integers(0, 2**32))
def test_each_epoch_holds_every_row_its_count_and_windows_stay_in_their_blocks(population, window, seed):
    blocks, counts = population
    plan = LocalityPermutation(seed, blocks, window, counts)
    total = plan.positions_per_epoch
    for epoch in range(2):
        rows = plan.rows(epoch * total, total)
        want = Counter({i: (1 if counts is None else int(counts[i])) for i in range(len(blocks))})
        assert Counter(rows.tolist()) == want
        order, starts = plan.epoch_layout(epoch)
        assert len(starts) - 1 == -(-plan.block_count // window)
        for j in range(len(starts) - 1):
            seen = set(plan.blocks_of_rows(rows[starts[j] : starts[j + 1]]).tolist())
            assert seen <= set(order[j * window : (j + 1) * window].tolist())


def test_epochs_differ_and_positions_cross_epochs():
    blocks = np.repeat(np.arange(20), 50)
    plan = LocalityPermutation(11, blocks, 4)
    total = plan.positions_per_epoch
    e0, e1 = plan.rows(0, total), plan.rows(total, total)
    assert (e0 != e1).any() and sorted(e0) == sorted(e1)
    assert plan.rows(total - 10, 20).tolist() == e0[-10:].tolist() + e1[:10].tolist()
    assert plan.epoch(total - 1) == 0 and plan.epoch(total) == 1


def test_pickles_to_the_same_order():
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 9, 300)
    counts = rng.integers(1, 4, 300)
    for c in (None, counts):
        plan = LocalityPermutation(5, blocks, 2, c, label=99)
        again = pickle.loads(pickle.dumps(plan))
        assert again.label == 99 and again.blocks_digest() == plan.blocks_digest() == blocks_digest(blocks)
        assert (
            again.rows(17, 3 * plan.positions_per_epoch).tolist()
            == plan.rows(17, 3 * plan.positions_per_epoch).tolist()
        )


@pytest.mark.parametrize(
    ("blocks", "window", "counts", "words"),
    [
        (np.zeros(0, dtype=np.int64), 2, None, "at least one row"),
        (np.array([0, -1]), 2, None, "block ids must be >= 0"),
        (np.array([0, 1]), 0, None, "window_shards must be an integer >= 1"),
        (np.array([0, 1]), True, None, "window_shards must be an integer >= 1"),
        (np.array([0, 1]), 2, np.array([1, 0]), "repeat counts"),
    ],
)
def test_bad_arguments_are_refused(blocks, window, counts, words):
    with pytest.raises(SamplingConfigError, match=words):
        LocalityPermutation(1, blocks, window, counts)


def test_negative_positions_are_refused():
    plan = LocalityPermutation(1, np.arange(3), 1)
    with pytest.raises(SamplingConfigError, match="plan positions must be >= 0"):
        plan.rows(-1, 2)


def test_labels_give_streams_their_own_orders_and_the_digest_names_the_blocks_only():
    blocks = np.repeat(np.arange(12), 10)
    a, b = LocalityPermutation(3, blocks, 2, label=1), LocalityPermutation(3, blocks, 2, label=2)
    assert a.rows(0, 120).tolist() != b.rows(0, 120).tolist()
    assert blocks_digest(blocks) == blocks_digest(blocks * 7 + 3)  # only the order of the ids matters
    assert blocks_digest(blocks) != blocks_digest(np.repeat(np.arange(24), 5))
