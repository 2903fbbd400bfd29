"""Records to samples: the one path from gathered chunks to `CachedSample`s (dataset iteration,
`get_item`, the torch datasets), with the embedded-metadata parsing and the validate_cache check.

Boundary: chunks in (runtime/local.py), `CachedSample`s and metadata dicts out; reads a cache's
metadata.arrow only for validate_cache. No Polars, no Torch, no planning, no processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from datasetrt._native.batch import json_array, slice_bytes
from datasetrt.errors import CacheFormatError, RecordJSONError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.local import Chunk
from datasetrt.values.records import CachedSample

# Payloads at least this large on average are copied out one at a time as the consumer advances,
# not a whole chunk at once: a chunk's worth of large bytes objects freed one by one lets glibc
# trim the heap, and the next chunk pays a page fault per 4 KiB again (docs/benchmarks.md).
LAZY_PAYLOAD_BYTES = 32 * 1024


class SampleBuilder:
    """Builds the `CachedSample`s of chunks gathered from `handles` (in catalog order).

    `cache_ids` (uint64, one per handle) turns cache positions into ids. With `check_embedded`
    (the dataset's validate_cache), every record's embedded JSON must equal its metadata.arrow
    row; each cache's table is read once, on first need. Not thread-safe for that cache; the
    samples themselves own their bytes (no views of the chunk).
    """

    def __init__(self, handles: Sequence[CacheHandle], cache_ids: np.ndarray, *, check_embedded: bool) -> None:
        self.handles = list(handles)
        self.cache_ids = cache_ids
        self.check_embedded = check_embedded
        self._labels = [str(h.path) for h in self.handles]
        self._tables: dict[int, Any] = {}  # cache position -> its metadata.arrow (check_embedded)

    def checking(self, check_embedded: bool) -> SampleBuilder:
        """The same builder with the embedded-metadata check on or off."""
        if check_embedded == self.check_embedded:
            return self
        return SampleBuilder(self.handles, self.cache_ids, check_embedded=check_embedded)

    def samples(self, chunks: Iterable[Chunk], transform: Callable[[CachedSample], Any] | None = None) -> Iterator[Any]:
        """The samples of `chunks`, in order (each passed through `transform` if given). A chunk
        is read before the next one is requested, as chunks require."""
        for chunk in chunks:
            samples = self.chunk_samples(chunk)
            yield from (samples if transform is None else map(transform, samples))

    def chunk_samples(self, chunk: Chunk) -> Iterator[CachedSample]:
        """The samples of one chunk, in order (what `samples` yields per chunk)."""
        metas = self.metadata(chunk)
        ids, sids = self.cache_ids[chunk.cache_pos].tolist(), chunk.sample_id.tolist()
        if chunk.rows > 1 and int(chunk.data_len[: chunk.rows].sum()) >= LAZY_PAYLOAD_BYTES * chunk.rows:
            # Large payloads: one bytes object alive at a time (see LAZY_PAYLOAD_BYTES).
            return _one_at_a_time(chunk, metas, ids, sids)
        datas = slice_bytes(chunk.data, chunk.data_off, chunk.data_len, chunk.rows)
        return map(CachedSample, datas, metas, ids, sids)

    def metadata(self, chunk: Chunk) -> list[dict]:
        """Embedded metadata of a chunk's records as dicts (checked against metadata.arrow when
        `check_embedded`): one json.loads over the joined records when each record is
        structurally one object (the kernel checks), else per record for a precise error."""
        metas = None
        text, _bad = json_array(chunk.data, chunk.json_off, chunk.json_len, chunk.rows)
        if text is not None:
            try:
                # What json.loads(text) does with these bytes ("[" then "{" or a space: UTF-8),
                # without its encoding detection.
                metas = json.loads(text.decode("utf-8", "surrogatepass"))
            except (ValueError, RecursionError):
                pass
        if metas is None:
            try:
                jsons = [text.decode() for text in slice_bytes(chunk.data, chunk.json_off, chunk.json_len, chunk.rows)]
            except UnicodeDecodeError as exc:
                raise RecordJSONError(f"JSON error: embedded metadata is not UTF-8 ({exc.reason})") from None
            metas = self._parse(jsons, chunk.cache_pos, chunk.sample_id)
        if self.check_embedded:
            self._compare(metas, chunk.cache_pos, chunk.sample_id)
        return metas

    def _parse(self, jsons: list[str], cache_pos: np.ndarray, sample_id: np.ndarray) -> list[dict]:
        """Embedded JSON texts -> dicts (keys already sorted on disk). Typed error naming the
        sample for anything json.loads refuses: malformed text, nesting past the recursion
        limit, an integer with more digits than Python converts (`sys.get_int_max_str_digits`,
        a plain ValueError)."""
        loads = json.loads
        try:
            metas = list(map(loads, jsons))
        except (ValueError, RecursionError):  # ValueError includes json.JSONDecodeError
            metas = []
            for i, text in enumerate(jsons):
                try:
                    metas.append(loads(text))
                except (ValueError, RecursionError) as exc:
                    raise RecordJSONError(
                        f"JSON error: {exc}: {self._labels[int(cache_pos[i])]} sample {int(sample_id[i])}"
                    ) from None
        for i, meta in enumerate(metas):
            if type(meta) is not dict:
                raise RecordJSONError(
                    f"JSON error: invalid type: {type(meta).__name__}, expected a map: "
                    f"{self._labels[int(cache_pos[i])]} sample {int(sample_id[i])}"
                )
        return metas

    def _compare(self, metas: list[dict], cache_pos: np.ndarray, sample_id: np.ndarray) -> None:
        """validate_cache=True: each record's embedded JSON must equal its metadata.arrow row."""
        for k in np.unique(cache_pos).tolist():
            table = self._tables.get(k)
            if table is None:
                table = self._tables[k] = self.handles[k].read_metadata()
            mask = cache_pos == k
            expected = table.take(sample_id[mask].astype(np.int64)).to_pylist()
            for meta, want, sid in zip((m for m, keep in zip(metas, mask) if keep), expected, sample_id[mask].tolist()):
                if meta != want:
                    raise CacheFormatError(
                        f"embedded metadata does not match metadata.arrow for sample {sid}: {self.handles[k].path}"
                    )


def _one_at_a_time(chunk: Chunk, metas: list[dict], ids: list[int], sids: list[int]) -> Iterator[CachedSample]:
    with chunk.data.data as view:  # the array's bytes (ndarray.data); released even if the consumer abandons us
        for off, length, meta, cid, sid in zip(chunk.data_off.tolist(), chunk.data_len.tolist(), metas, ids, sids):
            yield CachedSample(view[off : off + length].tobytes(), meta, cid, sid)
