"""Sequence packing arithmetic: which tokens of which documents fill each row of a `[rows, row_len]` batch.

Boundary: numpy in, numpy out; no I/O, no payload bytes, no caches. The dataset layer
(`dataset/packing.py`) reads the documents and applies a `Packing` to their tokens.

Input: the lengths (int, >= 0) of consecutive documents in plan order, and `offset`, the tokens
of the first document already packed into earlier rows. Output: a `Packing`, the segments of one
batch of rows — segment k is `length[k]` tokens of document `doc[k]` from its token `start[k]`,
placed in row `row[k]` from column `col[k]` — and where the next batch starts: document `docs`
(an index into the input), token `offset` of it. So packing is a pure function of the lengths
and (docs, offset): a resume state is those two integers plus the plan position they index.

Modes (`PACK_MODES`):

- "split" (concatenate and chunk, as Megatron and torchtitan): the documents' tokens back to back,
  cut every `row_len` tokens; a document crossing a row end continues at the start of the next
  row (the next batch's first row, at the end of a batch). Only the last rows of a stream pad.
- "whole" (first-fit, as Grain's `FirstFitPackIterDataset`): `rows` open rows; each piece goes
  to the first row with room for all of it; the batch is complete when a piece fits no row, and
  that piece starts the next batch. Pieces are documents, except for a document longer than
  `row_len` (`OVERLONG`): "split" cuts it into pieces of `row_len` tokens (the last shorter),
  "truncate" keeps its first `row_len` tokens (the rest counted in `dropped`), "error" refuses
  it with `PackingError` naming its index.

Empty documents take no room and give no segment. Segments of a row are in column order and
contiguous from column 0; the rest of the row is padding.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from datasetrt.errors import ArgumentTypeError, ConfigError, PackingError

PACK_MODES = ("split", "whole")
OVERLONG = ("split", "truncate", "error")

__all__ = [
    "OVERLONG",
    "PACK_MODES",
    "PackedRows",
    "Packer",
    "Packing",
    "check_packing",
    "pack",
    "row_layout",
    "token_index",
]


class _Overlong(PackingError):
    """A document longer than a row under overlong='error'; `document` is its input index."""

    def __init__(self, document: int, message: str) -> None:
        super().__init__(message)
        self.document = document


@dataclass(frozen=True)
class Packing:
    """One batch of packed rows. Segment arrays are int64 of one length, ordered by (row, col).

    `rows`: rows holding at least one segment (<= the rows asked for; fewer only at the end of
    the input). `docs`, `offset`: the next batch starts at token `offset` of input document
    `docs` (docs == number of input documents with offset 0: everything was packed).
    `dropped`: tokens truncated away ("whole" with overlong="truncate").
    """

    rows: int
    row: np.ndarray
    col: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    docs: int
    offset: int
    dropped: int = 0

    @property
    def tokens(self) -> int:
        """Tokens packed (not counting padding)."""
        return int(self.length.sum())


def _int(name: str, value: Any, low: int) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if v < low:
        raise ConfigError(f"{name} must be >= {low}, got {v}")
    return v


def check_packing(rows: Any, row_len: Any, mode: Any, overlong: Any) -> tuple[int, int]:
    """Validated (rows, row_len); ConfigError naming a bad mode or overlong rule."""
    if mode not in PACK_MODES:
        raise ConfigError(f"pack mode must be one of {PACK_MODES}, got {mode!r}")
    if overlong not in OVERLONG:
        raise ConfigError(f"overlong must be one of {OVERLONG}, got {overlong!r}")
    return _int("rows", rows, 1), _int("row_len", row_len, 1)


def pack(
    lengths: Any,
    row_len: int,
    rows: int,
    *,
    mode: str = "split",
    offset: int = 0,
    final: bool = True,
    overlong: str = "split",
) -> Packing | None:
    """Pack documents of `lengths` (from token `offset` of the first) into up to `rows` rows.

    `final`: no document follows these. When not final and the lengths cannot yet decide the
    batch (fewer tokens than `rows * row_len` for "split"; no piece that fits no row for
    "whole"), returns None: give more documents. Also None when final and nothing is left.
    O(documents + rows) for "split"; O(pieces x rows) for "whole".
    """
    rows, row_len = check_packing(rows, row_len, mode, overlong)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if len(lengths) and int(lengths.min()) < 0:
        raise ConfigError("document lengths must be >= 0")
    offset = _int("offset", offset, 0)
    if offset and (not len(lengths) or offset >= lengths[0]):
        raise ConfigError(f"offset {offset} is not inside the first document")
    if mode == "split":
        return _split(lengths, row_len, rows, offset, final)
    return _first_fit(lengths, row_len, rows, offset, final, overlong)


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _split(lengths: np.ndarray, row_len: int, rows: int, offset: int, final: bool) -> Packing | None:
    ends = np.cumsum(lengths) - offset  # token stream positions where each document ends
    total = int(ends[-1]) if len(ends) else 0
    want = rows * row_len
    if total < want and not final:
        return None
    take = min(total, want)
    if take == 0:
        return None
    starts = ends - lengths  # stream position of each document's token 0 (-offset for the first)
    cuts = np.union1d(np.concatenate([ends[ends < take], [0, take]]), np.arange(0, take, row_len))
    seg_s, seg_e = cuts[:-1], cuts[1:]
    doc = np.searchsorted(ends, seg_s, side="right")
    keep = seg_e > seg_s
    seg_s, seg_e, doc = seg_s[keep], seg_e[keep], doc[keep]
    doc_start = seg_s - starts[doc]
    nxt = int(np.searchsorted(ends, take, side="right"))  # first document not finished by `take`
    next_offset = 0 if nxt >= len(lengths) else take - int(starts[nxt])
    return Packing(
        rows=-(-take // row_len),
        row=seg_s // row_len,
        col=seg_s % row_len,
        doc=doc.astype(np.int64),
        start=doc_start,
        length=seg_e - seg_s,
        docs=nxt,
        offset=next_offset,
    )


def _first_fit(lengths: np.ndarray, row_len: int, rows: int, offset: int, final: bool, overlong: str) -> Packing | None:
    used = [0] * rows  # a Python list: scanning a few rows beats a numpy call per piece
    seg: list[tuple[int, int, int, int, int]] = []  # (row, col, doc, start, length)
    dropped = 0
    for d, n in enumerate(lengths.tolist()):
        start, cut = (offset if d == 0 else 0), 0
        if n - start > row_len:
            if overlong == "error":
                raise _Overlong(d, f"document {d} has {n} tokens, more than a row of {row_len} (overlong='error')")
            if overlong == "truncate":
                cut = n - start - row_len
                n = start + row_len
        while start < n:
            piece = min(n - start, row_len)
            room = row_len - piece
            r = next((r for r in range(rows) if used[r] <= room), -1)
            if r < 0:  # the batch is complete: this piece starts the next one
                return _segments(seg, rows, d, start, dropped)
            seg.append((r, used[r], d, start, piece))
            used[r] += piece
            start += piece
        dropped += cut  # counted once the document is packed (it may start the next batch)
    if not final or not seg:
        return None
    return _segments(seg, rows, len(lengths), 0, dropped)


def _segments(seg: list, rows: int, docs: int, offset: int, dropped: int) -> Packing:
    a = np.array(seg, dtype=np.int64).reshape(-1, 5)
    order = np.lexsort((a[:, 1], a[:, 0]))
    a = a[order]
    return Packing(
        rows=int(a[:, 0].max()) + 1 if len(a) else 0,
        row=a[:, 0],
        col=a[:, 1],
        doc=a[:, 2],
        start=a[:, 3],
        length=a[:, 4],
        docs=docs,
        offset=offset,
        dropped=dropped,
    )


def row_layout(packing: Packing, rows: int, row_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(segment_ids, positions, cu_seqlens, max_seqlen) of a packing laid out in `rows` rows.

    `segment_ids` int32 `[rows, row_len]`: 1, 2, ... for a row's segments in column order, 0 on
    padding. `positions` int32 `[rows, row_len]`: the token's position within its segment (from
    0 at each segment start, also where a split document continues in a new row), 0 on padding.
    `cu_seqlens` int32: boundaries of the flattened `rows * row_len` tokens into attention
    segments — each packed segment, and each row's padding run as a segment of its own — from 0
    to `rows * row_len`, as varlen attention (flash_attn_varlen_func) takes; `max_seqlen` the
    longest. O(rows * row_len).
    """
    n = rows * row_len
    seg_ids = np.zeros(n, dtype=np.int32)
    positions = np.zeros(n, dtype=np.int32)
    flat_start = packing.row * row_len + packing.col
    if len(flat_start):
        first_of_row = np.r_[True, packing.row[1:] != packing.row[:-1]]
        group_start = np.maximum.accumulate(np.where(first_of_row, np.arange(len(flat_start)), 0))
        ordinal = np.arange(len(flat_start)) - group_start + 1
        seg_ids[:] = 0
        idx = _ranges(flat_start, packing.length)
        seg_ids[idx] = np.repeat(ordinal, packing.length).astype(np.int32)
        positions[idx] = (idx - np.repeat(flat_start, packing.length)).astype(np.int32)
    ends = flat_start + packing.length
    row_fill = np.zeros(rows, dtype=np.int64)
    if len(ends):
        np.maximum.at(row_fill, packing.row, ends - packing.row * row_len)
    pad_starts = np.arange(rows, dtype=np.int64) * row_len + row_fill
    pad_starts = pad_starts[row_fill < row_len]
    cuts = np.union1d(np.concatenate([flat_start, pad_starts, [n]]), [0]).astype(np.int32)
    max_seqlen = int(np.diff(cuts).max()) if len(cuts) > 1 else 0
    return seg_ids.reshape(rows, row_len), positions.reshape(rows, row_len), cuts, max_seqlen


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorized (int64)."""
    total = int(lengths.sum())
    if total == 0:
        return _empty()
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def token_index(packing: Packing, doc_offsets: Any, row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(destination, source): flat positions in the `[rows, row_len]` batch and the positions in
    the documents' values (`doc_offsets` int64, len docs + 1: document d's tokens are values
    [doc_offsets[d] : doc_offsets[d+1]]) they copy, so `out.flat[dest] = values[src]`."""
    doc_offsets = np.asarray(doc_offsets, dtype=np.int64)
    dest = _ranges(packing.row * row_len + packing.col, packing.length)
    src = _ranges(doc_offsets[packing.doc] + packing.start, packing.length)
    return dest, src


@dataclass
class PackedRows:
    """A packed batch: `tokens` `[n, row_len]` (the payload dtype; `pad` on padding), with the
    `row_layout` arrays `segment_ids`, `positions` (int32 `[n, row_len]`), `cu_seqlens` (int32)
    and `max_seqlen`; `cache_id`, `sample_id` (uint64) name the document of each segment, in
    segment order (row by row, column order: segment k of the batch is the k-th nonzero run of
    `segment_ids` read row-major). `state` is the packing state after this batch (resume there).
    """

    tokens: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int
    cache_id: np.ndarray
    sample_id: np.ndarray
    state: dict

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def pad_fraction(self) -> float:
        """Padding tokens / all tokens of the batch."""
        return float((self.segment_ids == 0).mean()) if self.segment_ids.size else 0.0

    def to_torch(self) -> dict:
        """The arrays as torch tensors sharing their memory (`torch.from_numpy`; ids as int64),
        `max_seqlen` as an int: a dict with the field names."""
        from datasetrt.values.arrays import as_tensors

        out: dict = {
            name: as_tensors(getattr(self, name)) for name in ("tokens", "segment_ids", "positions", "cu_seqlens")
        }
        out["cache_id"] = as_tensors(self.cache_id.astype(np.int64))
        out["sample_id"] = as_tensors(self.sample_id.astype(np.int64))
        out["max_seqlen"] = self.max_seqlen
        return out


class Packer:
    """The documents between batches: feed documents in plan order, take packed batches.

    Holds the fed documents not yet wholly packed (their tokens, lengths and ids) and `offset`,
    the tokens of the first of them already packed; `consumed` counts the documents fed and
    wholly packed, so (consumed, offset) is the position of the next batch in the fed stream.
    Memory: the fed tokens not yet packed, at most one batch plus the last feed.
    """

    def __init__(
        self, rows: int, row_len: int, *, mode: str = "split", overlong: str = "split", pad: Any = 0, offset: int = 0
    ) -> None:
        self.rows, self.row_len = check_packing(rows, row_len, mode, overlong)
        self.mode, self.overlong, self.pad = mode, overlong, pad
        self.offset = _int("offset", offset, 0)
        self.consumed = 0
        self.dropped = 0
        self._values: np.ndarray | None = None
        self._offsets = np.zeros(1, dtype=np.int64)
        self._cache_id = np.zeros(0, dtype=np.uint64)
        self._sample_id = np.zeros(0, dtype=np.uint64)

    def feed(self, values: np.ndarray, offsets: np.ndarray, cache_id: np.ndarray, sample_id: np.ndarray) -> None:
        """Append documents: document i is values[offsets[i]:offsets[i+1]] (1-D values; offsets
        int64 of n+1 entries from 0). The values are copied."""
        values = np.asarray(values).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64)
        if self._values is None:
            self._values = values[offsets[0] : offsets[-1]].copy()
        else:
            self._values = np.concatenate([self._values, values[offsets[0] : offsets[-1]]])
        self._offsets = np.concatenate([self._offsets, self._offsets[-1] + offsets[1:] - offsets[0]])
        self._cache_id = np.concatenate([self._cache_id, np.asarray(cache_id, dtype=np.uint64)])
        self._sample_id = np.concatenate([self._sample_id, np.asarray(sample_id, dtype=np.uint64)])

    @property
    def pending(self) -> int:
        """Documents fed and not wholly packed."""
        return len(self._offsets) - 1

    def take(self, final: bool) -> PackedRows | None:
        """The next batch, or None when the fed documents cannot decide it yet (feed more) or,
        when `final` (nothing more will be fed), nothing is left. The batch has `rows` rows except
        the last of a stream, which may have fewer."""
        if not self.pending:
            return None
        lengths = np.diff(self._offsets)
        try:
            packing = pack(
                lengths,
                self.row_len,
                self.rows,
                mode=self.mode,
                offset=self.offset,
                final=final,
                overlong=self.overlong,
            )
        except _Overlong as exc:
            d = exc.document
            raise PackingError(f"{exc} (cache_id {self._cache_id[d]}, sample_id {self._sample_id[d]})") from None
        if packing is None:
            return None
        assert self._values is not None
        n = packing.rows
        tokens = np.full(n * self.row_len, self.pad, dtype=self._values.dtype)
        dest, src = token_index(packing, self._offsets, self.row_len)
        tokens[dest] = self._values[src]
        segment_ids, positions, cu_seqlens, max_seqlen = row_layout(packing, n, self.row_len)
        out = PackedRows(
            tokens.reshape(n, self.row_len),
            segment_ids,
            positions,
            cu_seqlens,
            max_seqlen,
            self._cache_id[packing.doc],
            self._sample_id[packing.doc],
            {},
        )
        d = packing.docs
        self._values = self._values[self._offsets[d] :]
        self._offsets = self._offsets[d:] - self._offsets[d]
        self._cache_id, self._sample_id = self._cache_id[d:], self._sample_id[d:]
        self.consumed += d
        self.offset = packing.offset
        self.dropped += packing.dropped
        return out


def share_bounds(length: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank `rank`'s share of a window of `length` positions: the contiguous positions
    `[rank * length // world_size, (rank + 1) * length // world_size)`. The shares of ranks
    0..world_size-1 are disjoint and cover the window; their sizes differ by at most 1."""
    return rank * length // world_size, (rank + 1) * length // world_size


def packed_stream(packer: Packer, documents: Any, *, drop_last: bool = False) -> Any:
    """Packed batches of `documents`, an iterator of (values, offsets, cache_id, sample_id)
    chunks in plan order (see `Packer.feed`), through `packer`; each batch's `state` is
    {"consumed": documents wholly packed so far, "offset": tokens of the next one packed}. The
    last batch of the stream may be shorter; `drop_last` drops it. Takes chunks only as needed."""
    documents = iter(documents)
    final = False
    while True:
        batch = packer.take(final)
        if batch is None:
            if final:
                return
            chunk = next(documents, None)
            if chunk is None:
                final = True
            else:
                packer.feed(*chunk)
            continue
        batch.state = {"consumed": packer.consumed, "offset": packer.offset}
        if drop_last and len(batch) < packer.rows:
            return
        yield batch
