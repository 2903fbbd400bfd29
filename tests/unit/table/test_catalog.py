"""datasetrt.table.catalog.CacheCatalog against a plain-Python reference (Hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasetrt.errors import CacheFormatError
from datasetrt.table.catalog import CacheCatalog

M64 = 2**64 - 1
u64 = st.integers(0, M64)
interesting_ids = st.one_of(u64, st.integers(0, 20), st.sampled_from([0, 1, 2**63 - 1, 2**63, M64 - 1, M64]))


@st.composite
def catalogs(draw):
    ids = draw(st.lists(interesting_ids, min_size=1, max_size=8, unique=True))
    counts = draw(st.lists(st.integers(0, 12), min_size=len(ids), max_size=len(ids)))
    return ids, counts


def test_shape_and_offsets():
    cat = CacheCatalog([9, 4, 7], [3, 0, 5], ["a", "b", "c"])
    assert len(cat) == 3 and cat.total == 8
    assert cat.cache_ids.dtype == np.uint64 and cat.counts.dtype == np.int64
    assert cat.offsets.tolist() == [0, 3, 3, 8]
    assert cat.positions(np.array([7, 9, 4, 5], dtype=np.uint64)).tolist() == [2, 0, 1, -1]
    assert cat.position(4) == 1 and cat.position(M64) == -1


@settings(max_examples=200, deadline=None)
@given(catalogs(), st.lists(interesting_ids, max_size=20))
def test_positions_match_reference(cat_spec, queries):
    ids, counts = cat_spec
    cat = CacheCatalog(ids, counts, [f"c{k}" for k in range(len(ids))])
    probe = queries + ids
    expected = [ids.index(q) if q in ids else -1 for q in probe]
    got = cat.positions(np.array(probe, dtype=np.uint64))
    assert got.dtype == np.int64
    assert got.tolist() == expected
    assert [cat.position(q) for q in probe] == expected


@settings(max_examples=200, deadline=None)
@given(catalogs(), st.data())
def test_locate_matches_reference(cat_spec, data):
    ids, counts = cat_spec
    cat = CacheCatalog(ids, counts, [f"c{k}" for k in range(len(ids))])
    reference = [(k, s) for k, n in enumerate(counts) for s in range(n)]  # physical order: caches in path order
    assert cat.total == len(reference)
    if not reference:
        return
    picks = data.draw(st.lists(st.integers(0, len(reference) - 1), max_size=30))
    every = list(range(len(reference))) + picks
    pos, sample = cat.locate(np.array(every, dtype=np.int64))
    assert pos.dtype == np.int64 and sample.dtype == np.uint64
    assert list(zip(pos.tolist(), sample.tolist())) == [reference[i] for i in every]


def test_locate_skips_empty_caches():
    cat = CacheCatalog([1, 2, 3, 4], [0, 2, 0, 1], ["a", "b", "c", "d"])
    pos, sample = cat.locate(np.arange(3))
    assert pos.tolist() == [1, 1, 3] and sample.tolist() == [0, 1, 0]


@pytest.mark.parametrize("ids", [[5, 5], [1, 2, 1], [M64, 0, M64], [0, 0, 0]])
def test_duplicate_cache_id(ids):
    dup = next(i for i in ids if ids.count(i) > 1)
    with pytest.raises(CacheFormatError, match=f"^duplicate cache_id {dup}\\b") as info:
        CacheCatalog(ids, [1] * len(ids), [f"/caches/p{k}" for k in range(len(ids))])
    assert isinstance(info.value, ValueError)
    assert "/caches/p" in str(info.value)  # names the clashing caches


@settings(max_examples=100, deadline=None)
@given(st.lists(interesting_ids, min_size=2, max_size=6))
def test_duplicates_detected_iff_present(ids):
    labels = [str(k) for k in range(len(ids))]
    if len(set(ids)) < len(ids):
        with pytest.raises(CacheFormatError, match="^duplicate cache_id "):
            CacheCatalog(ids, [0] * len(ids), labels)
    else:
        assert len(CacheCatalog(ids, [0] * len(ids), labels)) == len(ids)


@pytest.mark.parametrize("block", [2, 3, 1 << 20])
def test_lookup_gives_narrow_positions_and_the_first_unknown_row_across_blocks(monkeypatch, block):
    from datasetrt.table import catalog as module

    monkeypatch.setattr(module, "LOOKUP_BLOCK", block)
    cat = CacheCatalog([9, 4, 7], [3, 0, 5], ["a", "b", "c"])
    ids = np.array([7, 9, 9, 7, 7], dtype=np.uint64)
    sids = np.array([4, 0, 2, 0, 1], dtype=np.uint64)
    pos, unknown = cat.lookup(ids, sids)
    assert pos.dtype == np.int32 and unknown == -1
    assert pos.tolist() == cat.positions(ids).tolist() == [2, 0, 0, 2, 2]
    for row, (cid, sid) in {3: (5, 0), 4: (7, 5), 2: (4, 0)}.items():  # unknown cache, past the count, empty cache
        bad_ids, bad_sids = ids.copy(), sids.copy()
        bad_ids[row], bad_sids[row] = cid, sid
        bad_ids[-1] = 5 if row < 4 else bad_ids[-1]  # a later unknown row never hides the first
        assert cat.lookup(bad_ids, bad_sids)[1] == row
    assert CacheCatalog([], [], []).lookup(ids[:2], sids[:2])[1] == 0
