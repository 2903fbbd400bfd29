"""Rank-local locality orders (sampling/ranks.py) against a sequential statement written here: the
layout agrees with the torch loaders' `_Layout`, each epoch holds every row its count, world 1 is
the base order, and a rank reads its own shards except a bounded spill at the end of an epoch."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datasetrt.errors import SamplingConfigError
from datasetrt.integrations.torch.plan import _Layout
from datasetrt.sampling.locality import LocalityPermutation
from datasetrt.sampling.ranks import RankedLocality, RankSplit
from tests.reference import perm as ref
from tests.reference.locality import BLOCK_LABEL, WINDOW_LABEL

PROPS = settings(derandomize=True, deadline=None, max_examples=60)


def layout_positions(total, world, batch, drop_last, rank):
    """The loaders' raw positions of `rank` (before the wrap to the pass start): plan.py's _Layout."""
    lay = _Layout(total, 0, batch, drop_last, rank, world)
    full, tail = divmod(lay.per_rank, batch)
    j = np.arange(lay.per_rank)
    q, o = np.divmod(j, batch)
    raw = np.where(q < full, (q * world + rank) * batch + o, full * world * batch + rank * tail + o)
    assert np.array_equal(raw % total, lay.positions(j))
    return raw


def reference_epoch(seed, blocks, window, counts, epoch, world, batch, drop_last, label=0):
    """One epoch of the rank-local order, written out sequentially (ranks.py's docstring)."""
    ids = sorted(set(blocks.tolist()))
    members = {b: [r for r in range(len(blocks)) if blocks[r] == b] for b in ids}
    size = {b: sum(1 if counts is None else int(counts[r]) for r in members[b]) for b in ids}
    total = sum(size.values())
    key = ref.permutation_key(seed, BLOCK_LABEL ^ label, epoch)
    visit = [ids[ref.permute(key, len(ids), v)] for v in range(len(ids))]
    raw = [layout_positions(total, world, batch, drop_last, r) for r in range(world)]
    quota = [int((p < total).sum()) for p in raw]
    dealt, mine = [0] * world, [[] for _ in range(world)]
    for b in visit:  # the rank furthest below its quota, lowest rank on ties
        r = min(range(world), key=lambda k: (dealt[k] - quota[k], k))
        mine[r].append(b)
        dealt[r] += size[b]
    seqs = []
    for r in range(world):
        recs = [row for b in mine[r] for row in members[b] for _ in range(1 if counts is None else int(counts[row]))]
        cuts = {0, len(recs)}  # segments: every `window` of the rank's blocks, and its quota (world > 1)
        cuts |= {sum(size[b] for b in mine[r][:i]) for i in range(0, len(mine[r]), window)}
        if world > 1 and quota[r] < len(recs):
            cuts.add(quota[r])
        bounds = sorted(cuts)
        seq = []
        for k, (a, z) in enumerate(itertools.pairwise(bounds)):
            key = ref.permutation_key(seed, WINDOW_LABEL ^ label ^ (k * world + r), epoch)
            seq += [recs[a + ref.permute(key, z - a, t)] for t in range(z - a)]
        seqs.append(seq)
    excess = [row for r in range(world) for row in seqs[r][quota[r] :]]
    out = [None] * total
    for r in range(world):
        own = seqs[r][: quota[r]]
        short = quota[r] - len(own)
        reads, excess = own + excess[:short], excess[short:]
        for j, p in enumerate(raw[r][raw[r] < total].tolist()):
            out[p] = reads[j]
    rest = [p for p in range(total) if out[p] is None]  # dropped positions, in order
    for p, row in zip(rest, excess, strict=True):
        out[p] = row
    return out, mine


@st.composite
def populations(draw):
    rows = draw(st.integers(1, 50))
    blocks = np.array(draw(st.lists(st.integers(0, 15), min_size=rows, max_size=rows)), dtype=np.int64)
    counts = None
    if draw(st.booleans()):
        counts = np.array(draw(st.lists(st.integers(1, 3), min_size=rows, max_size=rows)), dtype=np.int64)
    return blocks, counts


@PROPS
@given(
    population=populations(),
    window=st.integers(1, 3),
    world=st.integers(1, 5),
    batch=st.integers(1, 6),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2),
)
@example(population=(np.zeros(1, dtype=np.int64), None), window=1, world=4, batch=3, drop_last=False, seed=0, epoch=0)
@example(population=(np.arange(9), None), window=2, world=3, batch=2, drop_last=True, seed=1, epoch=1)
def test_rows_follow_the_reference(population, window, world, batch, drop_last, seed, epoch):
    blocks, counts = population
    base = LocalityPermutation(seed, blocks, window, counts, label=5)
    plan = RankedLocality(base, RankSplit(world, batch, drop_last))
    total = plan.positions_per_epoch
    want, dealt = reference_epoch(seed, blocks, window, counts, epoch, world, batch, drop_last, label=5)
    got = plan.rows(epoch * total, total)
    assert got.tolist() == want
    assert Counter(got.tolist()) == Counter({i: 1 if counts is None else int(counts[i]) for i in range(len(blocks))})
    ids = sorted(set(blocks.tolist()))
    assert [[ids[b] for b in mine] for mine in plan.deal(epoch)] == dealt
    cut = total // 2  # random access: any split gives the same rows
    assert np.concatenate([plan.rows(epoch * total + cut, total - cut), plan.rows(epoch * total, cut)]).tolist() == (
        want[cut:] + want[:cut]
    )
    if world == 1:
        assert got.tolist() == base.rows(epoch * total, total).tolist()


@PROPS
@given(
    total=st.integers(1, 400),
    world=st.integers(1, 7),
    batch=st.integers(1, 9),
    drop_last=st.booleans(),
)
def test_locate_inverts_the_loaders_layout(total, world, batch, drop_last):
    split = RankSplit(world, batch, drop_last)
    quotas = split.quotas(total)
    rank, j = split.locate(np.arange(total), total)
    for r in range(world):
        raw = layout_positions(total, world, batch, drop_last, r)
        inside = raw[raw < total]
        assert quotas[r] == len(inside) and split.per_rank(total) == len(raw)
        assert np.array_equal(rank[inside], np.full(len(inside), r))
        assert np.array_equal(j[inside], np.flatnonzero(raw < total))
    dropped = np.flatnonzero(rank < 0)
    assert np.array_equal(j[dropped], np.arange(len(dropped))) and len(dropped) == total - int(quotas.sum())


def test_each_rank_reads_its_own_shards_but_a_bounded_spill():
    rng = np.random.default_rng(7)
    sizes = rng.integers(40, 120, 96)  # 96 shards of 40 to 119 records
    blocks = np.repeat(np.arange(96), sizes)
    base = LocalityPermutation(3, blocks, 4)
    total = base.positions_per_epoch
    for world, batch in [(2, 32), (4, 16), (8, 8)]:
        split = RankSplit(world, batch, False)
        plan = RankedLocality(base, split)
        rank, _j = split.locate(np.arange(total), total)
        for epoch in range(2):
            rows = plan.rows(epoch * total, total)
            owner = plan.rank_blocks(epoch * total, total)
            for r in range(world):
                mine = rank == r
                shards = set(blocks[rows[mine]].tolist())
                own = float((owner[mine] == r).mean())
                assert len(plan.deal(epoch)[r]) <= 96 // world + 3
                assert len(shards) <= len(plan.deal(epoch)[r]) + 2 * base.window_blocks
                assert own >= 1 - 2 * int(sizes.max()) / int(mine.sum())  # at most about one shard's worth
            windows = [len(plan.deal(epoch)[r]) for r in range(world)]
            assert sum(windows) == 96


def test_pickles_and_refuses_bad_splits():
    base = LocalityPermutation(1, np.repeat(np.arange(10), 7), 2, np.arange(70) % 3 + 1)
    plan = RankedLocality(base, RankSplit(3, 4, True))
    again = pickle.loads(pickle.dumps(plan))
    assert np.array_equal(again.rows(5, 400), plan.rows(5, 400))
    for args in [(0, 4, False), (2, 0, False), (True, 4, False)]:
        with pytest.raises(SamplingConfigError, match="rank split"):
            RankSplit(*args)
    with pytest.raises(SamplingConfigError, match="positions must be >= 0"):
        plan.rows(-1, 3)
