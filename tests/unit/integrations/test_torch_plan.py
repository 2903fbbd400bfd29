"""datasetrt.integrations.torch.plan without torch: rank shares against reference §3.3, rank
layouts, worker shares of any window (dataset-rt draws or a `PlanWindow`), pass windows.

This module must not import torch: the planning module is torch-free (checked in a fresh
interpreter below)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from itertools import chain

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasetrt.integrations.torch.plan import _Layout, _PassProgress, _Share, _Spec, rank_count, rank_share
from datasetrt.sampling import EpochPermutation, PlanWindow
from datasetrt.sampling.planner import ActiveRows, Population, Window
from datasetrt.table.catalog import CacheCatalog


def weighted_population() -> Population:
    """Two caches of 61 and 40 rows; about half the rows kept, reweighted, every 4th twice: a
    population unlike the physical one (as the torch tests' `update_metadata` view)."""
    catalog = CacheCatalog([0, 1], [61, 40], ["t0", "t1"])
    pos, sid = catalog.locate(np.arange(101, dtype=np.int64))
    kept = np.flatnonzero(np.random.default_rng(3).random(101) < 0.6)
    rows = np.concatenate([kept, kept[kept % 4 == 0]])
    weights = 1.0 + (rows % 7) / 7.0
    return Population(catalog, ActiveRows(pos[rows], sid[rows], weights))


def test_planning_imports_no_torch():
    code = (
        "import sys, datasetrt.integrations.torch.plan, datasetrt.integrations.torch.spawn; "
        "import datasetrt.integrations.torch as t; t.rank_count; assert 'torch' not in sys.modules, 'torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- rank-share arithmetic against a plain model of reference §3.3 ----------------------------------------


def model_share(n, world, batch, drop_last):
    """Reference §3.3 item 3, literally: per-rank ceil(N/R), or B*floor(N/(R*B)) with drop_last."""
    per = batch * math.floor(n / (world * batch)) if drop_last else math.ceil(n / world)
    m = per * world
    text = None
    if m != n:
        text = (
            f"samples_per_epoch adjusted: requested {n} global samples, effective {m}; "
            f"{'padded' if m > n else 'discarded'} {abs(m - n)} for equal rank batch counts"
        )
    return per, m, text


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10**6), st.integers(1, 64), st.integers(1, 512), st.booleans())
def test_rank_share_matches_reference_model(n, world, batch, drop_last):
    share = rank_share(n, world, batch, drop_last)
    per, m, text = model_share(n, world, batch, drop_last)
    assert (share.per_rank, share.effective, share.message) == (per, m, text)
    assert share.padded == max(0, m - n) and share.discarded == max(0, n - m)
    assert share.padded < world and (share.padded == 0 or not drop_last)
    stride = rank_count(n, 1, batch, drop_last)  # the global plan's positions per pass (any world size)
    assert rank_count(stride, world, batch, drop_last) == per


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 120), st.integers(1, 6), st.integers(1, 9), st.booleans(), st.integers(1, 6), st.data())
def test_layouts_cover_the_pass_exactly(n, world, batch, drop_last, new_world, data):
    """Every rank's positions: equal counts, together the remaining positions once plus the padding
    (the pass's first positions again), and after s full batches a prefix; also when a pass started
    under `world` ranks resumes under `new_world` ranks."""
    total = rank_count(n, 1, batch, drop_last)
    first = _Layout(total, 0, batch, drop_last, 0, world)
    steps = data.draw(st.integers(0, max(0, first.batches - 1)))
    start = min(steps * world * batch, total)
    layouts = [_Layout(total, start, batch, drop_last, r, new_world) for r in range(new_world)]
    per = rank_count(total - start, new_world, batch, drop_last)
    got = [lay.positions(np.arange(lay.per_rank)).tolist() for lay in layouts]
    assert all(len(g) == per for g in got)
    assert Counter(list(chain.from_iterable(got))) == Counter((start + i) % total for i in range(per * new_world))
    assert all(g == sorted(g) or start + per * new_world > total for g in got)
    for s in range(per // batch + 1):  # batches that are full on every rank
        consumed = sorted(chain.from_iterable(g[: s * batch] for g in got))
        assert consumed == sorted((start + i) % total for i in range(s * new_world * batch))
    if drop_last:
        assert per % batch == 0 and start + per * new_world <= total


# -- worker shares against a plain model --------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_worker_shares_partition_the_window(shuffle):
    population = weighted_population()
    for length, block, workers, first_block in [
        (1, 1, 1, 0),
        (37, 1, 3, 0),
        (100, 16, 2, 0),
        (100, 17, 3, 2),
        (64, 16, 4, 1),
        (5, 8, 3, 0),
        (250, 40, 2, 3),
    ]:
        window = Window(population, shuffle, 99, 12345, length)
        plan = window.rows(0, length)
        blocks = [plan[i : i + block] for i in range(first_block * block, length, block)]
        for worker in range(workers):
            share = _Share(window, worker, workers, block, first_block)
            expected = np.concatenate(blocks[worker::workers]) if blocks[worker::workers] else np.empty(0, np.int64)
            assert share.length == len(expected)
            if share.length:
                got = np.concatenate([share.rows(i, min(7, share.length - i)) for i in range(0, share.length, 7)])
                assert np.array_equal(got, expected)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 90), st.integers(1, 4), st.integers(1, 8), st.integers(0, 3), st.booleans(), st.integers(1, 5))
def test_rank_and_worker_shares_of_any_plan_window(length, world, batch, start_batches, drop_last, workers):
    """An exactly-once `PlanWindow` divides like a draws window: every rank's workers read, in
    round-robin batch order, exactly the rows of that rank's layout positions."""
    population = weighted_population()
    window = PlanWindow(population, EpochPermutation(5, len(population)), 17, length)
    total = rank_count(length, 1, batch, drop_last)
    start = min(start_batches * world * batch, total)
    for rank in range(world):
        layout = _Layout(total, start, batch, drop_last, rank, world)
        want = window.rows(0, length)[layout.positions(np.arange(layout.per_rank))] if layout.per_rank else []
        shares = [_Share(window, w, workers, layout=layout) for w in range(workers)]
        per_worker = [[s.rows(i, 1)[0] for i in range(s.length)] for s in shares]
        batches = [[rows[i : i + batch] for i in range(0, len(rows), batch)] for rows in per_worker]
        merged = [x for r in range(layout.batches) for x in batches[r % workers][r // workers]]
        assert merged == list(want)


def test_pass_windows_continue_one_stream():
    """Pass e of a loader stream is stream positions [e*stride, (e+1)*stride), minus `skip`; a
    main-process pass's rest is its undelivered positions."""
    population = weighted_population()
    spec = _Spec(True, 42, 30, 4, False)
    stream = Window(population, True, 42, 0, 30)
    whole = stream.rows(0, 120)
    for epoch, skip in [(0, 0), (1, 0), (2, 7), (3, 29)]:
        window = spec.pass_window(stream, epoch, skip)
        assert window.length == 30 - skip
        assert window.rows(0, window.length).tolist() == whole[epoch * 30 + skip : (epoch + 1) * 30].tolist()
    progress = _PassProgress(Window(population, False, 0, 95, 20), 6)
    rest = progress.rest()
    assert rest.length == 14 and rest.rows(0, 14).tolist() == progress.window.rows(6, 14).tolist()
