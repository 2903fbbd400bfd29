"""datasetrt.sampling.packing: the packing arithmetic against plain-Python references
(concatenate-and-chunk; Grain-style first-fit), the row layout's consistency (segment ids,
positions, cu_seqlens), boundaries (a document of exactly a row, longer than a row, empty
documents), resume from (docs, offset), and typed refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasetrt.errors import ArgumentTypeError, ConfigError, PackingError
from datasetrt.sampling.packing import Packer, pack, packed_stream, row_layout, share_bounds, token_index

PROPS = settings(derandomize=True, deadline=None, max_examples=150)
LENGTHS = st.lists(st.integers(0, 40), min_size=0, max_size=30)


def _docs(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Documents whose tokens name (document, position): token = 1000 * (d + 1) + i."""
    values = np.concatenate([1000 * (d + 1) + np.arange(n) for d, n in enumerate(lengths)] + [np.zeros(0, int)])
    return values.astype(np.int64), np.r_[0, np.cumsum(lengths)].astype(np.int64)


def _stream(lengths: list[int], row_len: int, rows: int, mode: str, overlong: str = "split") -> list[np.ndarray]:
    """Every batch of the lengths' documents through Packer, fed 3 documents at a time."""
    values, offsets = _docs(lengths)
    ids = np.arange(len(lengths), dtype=np.uint64)
    chunks = [(values, offsets[i : j + 1], ids[i:j], ids[i:j]) for i, j in _cuts(len(lengths), 3)]
    packer = Packer(rows, row_len, mode=mode, overlong=overlong, pad=-1)
    return [b.tokens for b in packed_stream(packer, chunks)]


def _cuts(n: int, k: int) -> list[tuple[int, int]]:
    return [(i, min(i + k, n)) for i in range(0, n, k)]


def _ref_split(lengths: list[int], row_len: int) -> np.ndarray:
    values, _ = _docs(lengths)
    rows = -(-len(values) // row_len)
    out = np.full(rows * row_len, -1, dtype=np.int64)
    out[: len(values)] = values
    return out.reshape(rows, row_len)


def _ref_first_fit(lengths: list[int], row_len: int, bins: int) -> list[list[list[int]]]:
    """Grain's FirstFitPackIterDataset rule, in plain Python, over pieces of at most row_len."""
    pieces = []
    for d, n in enumerate(lengths):
        for s in range(0, n, row_len):
            pieces.append(list(1000 * (d + 1) + np.arange(s, min(n, s + row_len))))
    batches, open_rows = [], [[] for _ in range(bins)]
    for piece in pieces:
        for row in open_rows:
            if len(row) + len(piece) <= row_len:
                row.extend(piece)
                break
        else:
            batches.append(open_rows)
            open_rows = [list(piece)] + [[] for _ in range(bins - 1)]
    if any(open_rows):
        batches.append(open_rows)
    return [[r for r in b if r] for b in batches]


@PROPS
@given(LENGTHS, st.integers(1, 17), st.integers(1, 4))
def test_split_is_concatenate_and_chunk(lengths, row_len, rows):
    got = _stream(lengths, row_len, rows, "split")
    want = _ref_split(lengths, row_len)
    assert np.array_equal(np.concatenate(got) if got else np.zeros((0, row_len), int), want)
    assert all(len(b) == rows for b in got[:-1])


@PROPS
@given(LENGTHS, st.integers(1, 17), st.integers(1, 4))
def test_whole_is_first_fit(lengths, row_len, rows):
    got = _stream(lengths, row_len, rows, "whole")
    want = _ref_first_fit(lengths, row_len, rows)
    assert [[list(r[r != -1]) for r in b] for b in got] == want


@PROPS
@given(LENGTHS, st.integers(1, 17), st.integers(1, 4))
def test_truncate_counts_each_cut_once(lengths, row_len, rows):
    values, offsets = _docs(lengths)
    ids = np.arange(len(lengths), dtype=np.uint64)
    packer = Packer(rows, row_len, mode="whole", overlong="truncate")
    chunks = [(values, offsets[i : j + 1], ids[i:j], ids[i:j]) for i, j in _cuts(len(lengths), 2)]
    kept = sum(int((b.segment_ids > 0).sum()) for b in packed_stream(packer, chunks))
    assert packer.dropped == sum(max(0, n - row_len) for n in lengths)
    assert kept + packer.dropped == sum(lengths)


@PROPS
@given(LENGTHS, st.integers(1, 17), st.integers(1, 4), st.sampled_from(["split", "whole"]))
def test_layout_is_consistent(lengths, row_len, rows, mode):
    lengths_arr = np.array(lengths, dtype=np.int64)
    p = pack(lengths_arr, row_len, rows, mode=mode)
    if p is None:
        assert lengths_arr.sum() == 0
        return
    seg, pos, cu, max_seqlen = row_layout(p, p.rows, row_len)
    assert seg.shape == pos.shape == (p.rows, row_len) and seg.dtype == pos.dtype == cu.dtype == np.int32
    assert cu[0] == 0 and cu[-1] == p.rows * row_len and np.all(np.diff(cu) > 0)
    assert max_seqlen == np.diff(cu).max() <= row_len
    flat_seg, flat_pos = seg.reshape(-1), pos.reshape(-1)
    for a, b in itertools.pairwise(cu):
        # one attention segment: one row, one segment id, positions 0.. (padding: id 0, positions 0)
        assert a // row_len == (b - 1) // row_len
        assert len(set(flat_seg[a:b])) == 1
        want = np.arange(b - a) if flat_seg[a] else np.zeros(b - a)
        assert np.array_equal(flat_pos[a:b], want)
    assert int((seg > 0).sum()) == p.tokens == p.length.sum()
    for r in range(p.rows):  # ids 1..k in column order, padding only at the end of a row
        ids = seg[r][seg[r] > 0]
        assert np.array_equal(np.unique(ids), np.arange(1, len(np.unique(ids)) + 1))
        assert np.all(np.diff(ids) >= 0) and np.all(seg[r][len(ids) :] == 0)
    dest, src = token_index(p, np.r_[0, np.cumsum(lengths_arr)], row_len)
    assert len(dest) == len(src) == p.tokens and len(np.unique(dest)) == len(dest)


@PROPS
@given(LENGTHS, st.integers(1, 17), st.integers(1, 4), st.sampled_from(["split", "whole"]), st.data())
def test_resume_from_docs_and_offset(lengths, row_len, rows, mode, data):
    """A batch packed from (docs, offset) of the previous one equals the uninterrupted stream's."""
    lengths_arr = np.array(lengths, dtype=np.int64)
    batches, docs, offset = [], 0, 0
    while (p := pack(lengths_arr[docs:], row_len, rows, mode=mode, offset=offset)) is not None:
        batches.append((docs, offset, p))
        docs, offset = docs + p.docs, p.offset
    assert offset == 0 and not lengths_arr[docs:].any()  # only empty documents are left over
    if not batches:
        return
    k = data.draw(st.integers(0, len(batches) - 1))
    d0, o0, p = batches[k]
    again = pack(lengths_arr[d0:], row_len, rows, mode=mode, offset=o0)
    assert again is not None and all(
        np.array_equal(getattr(again, f), getattr(p, f)) for f in ("row", "col", "doc", "start", "length")
    )


def test_boundaries():
    # a document of exactly a row fills it; the next starts the next row
    p = pack([4, 4], 4, 2, mode="split")
    assert p.rows == 2 and p.row.tolist() == [0, 1] and p.length.tolist() == [4, 4] and (p.docs, p.offset) == (2, 0)
    p = pack([4, 4], 4, 2, mode="whole")
    assert p.row.tolist() == [0, 1] and p.docs == 2
    # longer than a row: split carries the rest, in both modes by default
    p = pack([10], 4, 2, mode="split", final=False)
    assert p.length.tolist() == [4, 4] and p.start.tolist() == [0, 4] and (p.docs, p.offset) == (0, 8)
    p = pack([10], 4, 2, mode="whole")  # pieces 4, 4, 2: the third fits no row of this batch
    assert p.length.tolist() == [4, 4] and (p.docs, p.offset) == (0, 8)
    p = pack([10], 4, 2, mode="whole", offset=8)
    assert p.length.tolist() == [2] and p.start.tolist() == [8] and (p.docs, p.offset) == (1, 0)
    # truncate keeps a row's worth, counting the rest
    p = pack([10, 3], 4, 2, mode="whole", overlong="truncate")
    assert p.length.tolist() == [4, 3] and p.dropped == 6
    p = pack([4, 4, 10], 4, 2, mode="whole", overlong="truncate")  # the third starts the next batch
    assert p.docs == 2 and p.dropped == 0  # its truncation is counted there, once
    with pytest.raises(PackingError, match="document 1 has 9 tokens, more than a row of 4"):
        pack([3, 9], 4, 2, mode="whole", overlong="error")
    # empty documents take no room and give no segment, even between and at the end
    p = pack([0, 3, 0, 0, 1, 0], 4, 1, mode="split")
    assert p.doc.tolist() == [1, 4] and p.docs == 6
    p = pack([0, 3, 0, 0, 1, 0], 4, 1, mode="whole")
    assert p.doc.tolist() == [1, 4] and p.docs == 6
    assert pack([0, 0], 4, 1) is None and pack([], 4, 1) is None


def test_needs_more_documents_until_decided():
    assert pack([3, 3], 4, 2, mode="split", final=False) is None  # 6 < 8 tokens
    assert pack([3, 3, 3], 4, 2, mode="split", final=False) is not None
    assert pack([3, 3], 4, 2, mode="whole", final=False) is None  # both fit: the batch is still open
    p = pack([3, 3, 3], 4, 2, mode="whole", final=False)
    assert p is not None and p.docs == 2  # the third fits no row: it starts the next batch


def test_deterministic():
    lengths = np.random.default_rng(0).lognormal(3, 1, 500).astype(np.int64)
    a = [b.tolist() for b in _stream(lengths.tolist(), 64, 4, "whole")]
    b = [b.tolist() for b in _stream(lengths.tolist(), 64, 4, "whole")]
    assert a == b


def test_refusals():
    with pytest.raises(ConfigError, match="pack mode"):
        pack([1], 4, 1, mode="greedy")
    with pytest.raises(ConfigError, match="overlong"):
        pack([1], 4, 1, overlong="drop")
    with pytest.raises(ConfigError, match="row_len must be >= 1"):
        pack([1], 0, 1)
    with pytest.raises(ArgumentTypeError, match="rows must be an integer"):
        pack([1], 4, 1.5)
    with pytest.raises(ConfigError, match="lengths must be >= 0"):
        pack([1, -1], 4, 1)
    with pytest.raises(ConfigError, match="offset 3 is not inside"):
        pack([3], 4, 1, offset=3)


def test_packer_names_an_overlong_document():
    packer = Packer(2, 4, mode="whole", overlong="error")
    values, offsets = _docs([2, 9])
    packer.feed(values, offsets, np.array([5, 6], np.uint64), np.array([10, 11], np.uint64))
    with pytest.raises(PackingError, match=r"cache_id 6, sample_id 11"):
        packer.take(True)


@pytest.mark.parametrize("length,world", [(0, 1), (10, 3), (7, 7), (5, 8)])
def test_share_bounds_cover(length, world):
    shares = [share_bounds(length, r, world) for r in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shares))
    assert max(b - a for a, b in shares) - min(b - a for a, b in shares) <= 1
