"""datasetrt.sampling.planner against plain references: the cyclic cursor and tests/reference/rng048."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datasetrt.errors import EmptyStreamError
from datasetrt.sampling.planner import ActiveRows, PlanWindow, Population, Window, advance
from datasetrt.table.catalog import CacheCatalog
from tests.reference import rng048 as ref

M64 = 2**64 - 1
u64 = st.integers(0, M64)
weights_st = st.lists(st.floats(min_value=1e-3, max_value=1e3, allow_nan=False), min_size=1, max_size=12)


def catalog(counts=(3, 0, 4)) -> CacheCatalog:
    return CacheCatalog([100 + k for k in range(len(counts))], list(counts), [str(k) for k in range(len(counts))])


def active(cat: CacheCatalog, pairs, weights) -> ActiveRows:
    return ActiveRows(
        cache_pos=np.array([p for p, _ in pairs], dtype=np.int64),
        sample_id=np.array([s for _, s in pairs], dtype=np.uint64),
        weights=np.asarray(weights, dtype=np.float64),
    )


def physical_pairs(cat: CacheCatalog):
    return [(k, s) for k, n in enumerate(cat.counts.tolist()) for s in range(n)]


def blocks(window: Window, block_rows: int):
    """(cache position, sample_id) arrays of consecutive blocks of the window, as readers plan them."""
    for first in range(0, window.length, block_rows):
        yield window.population.resolve(window.rows(first, min(block_rows, window.length - first)))


def resolved(window: Window, block_rows: int):
    out = []
    for pos, sid in blocks(window, block_rows):
        assert pos.dtype == np.int64 and sid.dtype == np.uint64 and len(pos) == len(sid) <= block_rows
        out += list(zip(pos.tolist(), sid.tolist()))
    return out


# -- population ----------------------------------------------------------------------------------


def test_population_physical_then_active():
    cat = catalog()
    phys = Population(cat)
    assert len(phys) == 7 and not phys.weighted
    pos, sid = phys.resolve(np.array([0, 2, 3, 6]))
    assert pos.tolist() == [0, 0, 2, 2] and sid.tolist() == [0, 2, 0, 3]
    act = Population(cat, active(cat, [(2, 3), (0, 1), (2, 3)], [1.0, 1.0, 1.0]))
    assert len(act) == 3 and act.weighted  # weighted even with all-ones weights
    pos, sid = act.resolve(np.array([2, 0, 1]))
    assert pos.tolist() == [2, 2, 0] and sid.tolist() == [3, 3, 1]


def test_cumulative_matches_reference_and_is_cached():
    cat = catalog()
    w = [0.5, 2.0, 1.25, 3.0]
    pop = Population(cat, active(cat, [(0, 0)] * 4, w))
    cum, scale = pop.cumulative()
    ref_cum, ref_scale = ref.cumulative(w)
    assert cum.tolist() == ref_cum and scale == ref_scale
    assert pop.cumulative()[0] is cum


# -- ordered --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 30),
    start=st.integers(0, 29),
    length=st.integers(1, 80),
    first=st.integers(0, 80),
    count=st.integers(0, 40),
)
def test_ordered_rows_are_cyclic(n, start, length, first, count):
    start %= n
    pop = Population(CacheCatalog([1], [n], ["a"]))
    window = Window(pop, False, 123, start, length)
    got = window.rows(first, count)
    assert got.dtype == np.int64
    assert got.tolist() == [(start + first + k) % n for k in range(count)]


def test_ordered_example_from_reference():
    pop = Population(CacheCatalog([1], [5], ["a"]))
    cursor, windows = 0, []
    for _ in range(3):
        windows.append(Window(pop, False, 0, cursor, 2).rows(0, 2).tolist())
        cursor = advance(False, cursor, 2, 5)
    assert windows == [[0, 1], [2, 3], [4, 0]]
    assert Window(pop, False, 0, 0, 7).rows(0, 7).tolist() == [0, 1, 2, 3, 4, 0, 1]


def test_ordered_ignores_weights_and_keeps_duplicates():
    cat = catalog()
    pairs = [(2, 1), (0, 0), (2, 1)]
    pop = Population(cat, active(cat, pairs, [5.0, 1e-9, 100.0]))
    assert resolved(Window(pop, False, 9, 1, 6), 4) == pairs[1:] + pairs + pairs[:1]


# -- shuffled ---------------------------------------------------------------------------------------


# Draw indices at and above 2**63 and at the u64 edge (a window that wraps past 2**64 - 1): the index
# is a u64, so a 63-bit mask or a signed intermediate changes these rows, and only these.
EDGE_STARTS = (2**63, 2**63 + 7, M64, M64 - 3)


@settings(max_examples=60, deadline=None)
@given(
    seed=u64,
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda c: sum(c) > 0),
    start=st.one_of(st.integers(0, 100), u64),
    first=st.integers(0, 20),
    count=st.integers(0, 20),
)
@example(seed=7, counts=[3, 0, 4], start=2**63, first=0, count=5)
@example(seed=M64, counts=[6, 6], start=2**63 - 2, first=1, count=6)  # crosses 2**63
@example(seed=0, counts=[5], start=M64, first=0, count=4)  # wraps to 0
def test_shuffled_physical_rows_equal_uniform_draws(seed, counts, start, first, count):
    cat = catalog(counts)
    window = Window(Population(cat), True, seed, start, first + count)
    expected = [ref.gen_range(ref.draw_rng(seed, (start + first + k) & M64), cat.total) for k in range(count)]
    assert window.rows(first, count).tolist() == expected
    if start + first + count <= M64:
        assert expected == ref.uniform_draws(seed, cat.total, start + first, count)


@settings(max_examples=60, deadline=None)
@given(
    seed=u64,
    weights=weights_st,
    start=st.one_of(st.integers(0, 100), u64),
    first=st.integers(0, 20),
    count=st.integers(0, 20),
)
@example(seed=7, weights=[1.0, 2.0, 3.0], start=2**63, first=0, count=5)
@example(seed=3, weights=[0.5, 4.0], start=M64 - 1, first=1, count=5)  # wraps to 0
def test_shuffled_active_rows_equal_weighted_draws(seed, weights, start, first, count):
    cat = catalog()
    pop = Population(cat, active(cat, [(0, k % 3) for k in range(len(weights))], weights))
    window = Window(pop, True, seed, start, first + count)
    cum, scale = ref.cumulative(weights)
    expected = [ref.weighted(ref.draw_rng(seed, (start + first + k) & M64), cum, scale) for k in range(count)]
    assert window.rows(first, count).tolist() == expected


def test_shuffled_known_sequences():
    cat = CacheCatalog([1, 2], [5, 4], ["a", "b"])
    assert Window(Population(cat), True, 7, 20, 20).rows(0, 20).tolist() == ref.uniform_draws(7, 9, 20, 20)
    ones = active(cat, physical_pairs(cat), [1.0] * 9)
    weighted = Window(Population(cat, ones), True, 7, 0, 20).rows(0, 20).tolist()
    assert weighted == ref.weighted_draws(7, [1.0] * 9, 0, 20)
    assert weighted != ref.uniform_draws(7, 9, 0, 20)  # the weighted path differs even with equal weights


def test_shuffled_resolves_physical_index_in_path_order():
    cat = catalog((3, 0, 4))
    pairs = physical_pairs(cat)
    rows = ref.uniform_draws(11, 7, 0, 30)
    assert resolved(Window(Population(cat), True, 11, 0, 30), 7) == [pairs[r] for r in rows]


def test_shuffled_resolves_active_position_with_duplicates():
    cat = catalog()
    pairs = [(2, 3), (2, 3), (0, 1), (2, 0)]
    w = [1.0, 1.0, 4.0, 0.5]
    rows = ref.weighted_draws(5, w, 3, 25)
    assert resolved(Window(Population(cat, active(cat, pairs, w)), True, 5, 3, 25), 6) == [pairs[r] for r in rows]


# -- blocks ---------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    shuffle=st.booleans(),
    weighted=st.booleans(),
    seed=u64,
    start=st.integers(0, 50),
    length=st.integers(0, 60),
    block_a=st.integers(1, 70),
    block_b=st.integers(1, 70),
)
def test_blocks_concatenation_independent_of_block_size(shuffle, weighted, seed, start, length, block_a, block_b):
    cat = catalog((3, 0, 4))
    pairs = physical_pairs(cat)
    pop = Population(cat, active(cat, pairs[::-1], [float(k + 1) for k in range(7)]) if weighted else None)
    if not shuffle:
        start %= len(pop)
    window = Window(pop, shuffle, seed, start, length)
    whole = resolved(window, block_a)
    assert len(whole) == length
    assert whole == resolved(window, block_b) == resolved(window, max(length, 1))


def test_blocks_of_empty_window():
    assert list(blocks(Window(Population(catalog()), True, 0, 0, 0), 8)) == []


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_population_of_no_rows_plans_empty_windows_and_refuses_positions(shuffle, weighted):
    """A cache of 0 samples (or every row filtered out): its windows are empty, and the ordered
    cursor stays 0 instead of dividing by the row count; positions over it are a typed error."""
    cat = catalog((0,))
    pop = Population(cat, active(cat, [], [])) if weighted else Population(cat)
    window = Window(pop, shuffle, 7, 0, 0)
    assert len(pop) == 0 and window.rows(0, 0).tolist() == [] and window.rows(0, 0).dtype == np.int64
    assert advance(shuffle, 0, 0, 0) == 0 and window.sub(0, 0).start == 0
    with pytest.raises(EmptyStreamError, match="cannot plan 3 positions over an empty population"):
        window.rows(0, 3)


# -- advance --------------------------------------------------------------------------------------


@pytest.mark.parametrize("position,length,n,expected", [(0, 2, 5, 2), (4, 2, 5, 1), (3, 7, 5, 0), (0, 2**64 - 1, 5, 0)])
def test_advance_ordered(position, length, n, expected):
    assert advance(False, position, length, n) == expected


def test_advance_shuffled_adds_and_wraps():
    assert advance(True, 10, 6, 3) == 16
    assert advance(True, M64 - 1, 5, 3) == 3


@pytest.mark.parametrize("start", EDGE_STARTS)
def test_draw_index_is_a_full_u64(start):
    """Draw positions are u64 (dataset-rt's draw counter): starts at and above 2**63 read the
    draws of that exact index, and advance keeps all 64 bits (wrapping only past 2**64 - 1)."""
    assert advance(True, start, 5, 3) == (start + 5) % 2**64
    cat = CacheCatalog([1, 2], [5, 4], ["a", "b"])
    expected = [ref.gen_range(ref.draw_rng(11, (start + k) % 2**64), 9) for k in range(6)]
    assert Window(Population(cat), True, 11, start, 6).rows(0, 6).tolist() == expected
    w = [1.0, 3.0, 0.5, 2.0]
    cum, scale = ref.cumulative(w)
    pop = Population(cat, active(cat, [(0, 0), (0, 1), (1, 0), (1, 3)], w))
    expected = [ref.weighted(ref.draw_rng(11, (start + 2 + k) % 2**64), cum, scale) for k in range(4)]
    assert Window(pop, True, 11, start, 6).rows(2, 4).tolist() == expected


@settings(max_examples=50, deadline=None)
@given(seed=u64, lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_consecutive_windows_continue_one_stream(seed, lengths):
    pop = Population(CacheCatalog([1], [6], ["a"]))
    draw, parts = 0, []
    for length in lengths:
        parts += Window(pop, True, seed, draw, length).rows(0, length).tolist()
        draw = advance(True, draw, length, 6)
    assert parts == Window(pop, True, seed, 0, sum(lengths)).rows(0, sum(lengths)).tolist()


# -- sub-windows and population columns (the dataset's integration seam) ----------------------------


@settings(max_examples=80, deadline=None)
@given(
    shuffle=st.booleans(),
    weighted=st.booleans(),
    seed=u64,
    start=st.integers(0, 50),
    first=st.integers(0, 40),
    count=st.integers(0, 30),
    inner=st.integers(0, 10),
)
def test_sub_windows_are_the_same_positions(shuffle, weighted, seed, start, first, count, inner):
    """`sub(first, count)` reads the window's positions [first, first+count), also past its
    length (the stream continues), and subs of subs compose; its start is where a reservation
    after `first` positions would begin."""
    cat = catalog((3, 0, 4))
    rows = active(cat, physical_pairs(cat)[::-1], [float(k + 1) for k in range(7)])
    pop = Population(cat, rows if weighted else None)
    if not shuffle:
        start %= len(pop)
    window = Window(pop, shuffle, seed, start, 20)
    sub = window.sub(first, count)
    assert (sub.population, sub.shuffle, sub.seed, sub.length) == (pop, shuffle, seed, count)
    assert sub.start == advance(shuffle, start, first, len(pop))
    assert sub.rows(0, count).tolist() == window.rows(first, count).tolist()
    inner = min(inner, count)
    rest = count - inner
    assert sub.sub(inner, rest).rows(0, rest).tolist() == window.rows(first + inner, rest).tolist()


def test_population_rows_expand_the_physical_population():
    cat = catalog((3, 0, 4))
    rows = Population(cat).rows()
    assert list(zip(rows.cache_pos.tolist(), rows.sample_id.tolist())) == physical_pairs(cat)
    assert rows.cache_pos.dtype == np.int64 and rows.sample_id.dtype == np.uint64
    assert rows.weights.tolist() == [1.0] * 7
    act = active(cat, [(2, 3), (0, 1)], [2.0, 0.5])
    assert Population(cat, act).rows() is act


def test_population_columns_rebuild_the_same_plan():
    cat = catalog((3, 0, 4))
    assert Population(cat).columns() is None
    assert len(Population.from_columns(cat, None, {})) == 7
    pop = Population(cat, active(cat, physical_pairs(cat)[::-1] + [(0, 1)], [float(k + 1) for k in range(8)]))
    columns, params = pop.columns()
    assert {name: len(col) for name, col in columns.items()} == {"cache_pos": 8, "sample_id": 8, "cum": 8}
    again = Population.from_columns(cat, columns, params)
    assert again.active.weights is None and again.weighted
    planned = [p.resolve(Window(p, True, 9, 4, 30).rows(0, 30)) for p in (pop, again)]
    assert [a.tolist() for a in planned[0]] == [a.tolist() for a in planned[1]]  # the same weighted draws
    assert again.cumulative()[1] == params["scale"]


def test_a_one_row_active_population_rebuilt_from_its_columns_draws_that_row():
    """One active row (a torch worker's table filtered to one sample): its `cum` column is only the
    padding entry, which the rebuilt population must drop, and every weighted draw is row 0."""
    cat = catalog((3, 0, 4))
    pop = Population(cat, active(cat, [(2, 1)], [0.5]))
    again = Population.from_columns(cat, *pop.columns())
    assert len(again.cumulative()[0]) == 0
    for p in (pop, again):
        pos, sid = p.resolve(Window(p, True, 5, 2**64 - 3, 6).rows(0, 6))
        assert pos.tolist() == [2] * 6 and sid.tolist() == [1] * 6


# -- PlanWindow ------------------------------------------------------------------------------------


class _Plan:
    """A plan whose row at position p is p * 10 (positions are visible in the rows)."""

    def rows(self, first: int, count: int) -> np.ndarray:
        return np.arange(first, first + count, dtype=np.int64) * 10


def test_plan_window_reads_plan_positions_from_its_start():
    pop = Population(catalog())
    window = PlanWindow(pop, _Plan(), start=7, length=20)
    assert window.rows(0, 3).tolist() == [70, 80, 90]
    assert window.rows(5, 2).tolist() == [120, 130]
    sub = window.sub(4, 6)
    assert (sub.start, sub.length, sub.population, sub.plan) == (11, 6, pop, window.plan)
    assert sub.rows(2, 2).tolist() == window.rows(6, 2).tolist() == [130, 140]
    assert PlanWindow(pop, _Plan(), 0, 5).sub(3, 2).rows(0, 2).tolist() == [30, 40]


def test_windows_and_active_rows_are_immutable():
    """Windows and active rows are shared by iterators, threads and workers: frozen."""
    cat = catalog()
    pop = Population(cat)
    for window in (Window(pop, True, 1, 0, 5), PlanWindow(pop, _Plan(), 0, 5)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            window.start = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        active(cat, [(0, 0)], [1.0]).weights = None
