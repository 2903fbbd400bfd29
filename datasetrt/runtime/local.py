"""In-process record reader: flat cache/shard tables, lazily opened shard descriptors, and the
block loop around the native gather kernel.

Boundary: arrays of (cache position, sample_id) in; payload bytes and embedded-JSON text out.
No Polars, no Torch. `Gatherer` (the descriptors and the kernel call) imports no numpy, for the
worker processes; `LocalReader`, `Chunk` and `local_chunks` are the parent's numpy side. One
reader per process (descriptors are process-private).

Descriptor budget: at most `max_open_shards` shard files are open at once; when a block needs
more, every cache not in the block is closed first (bounded, O(caches) per eviction).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from datasetrt.errors import ResourceLimitError
from datasetrt.format.reader import CacheHandle
from datasetrt._native.gather import slice_records
from datasetrt.runtime.gatherer import Gatherer

INITIAL_OUT_BYTES = 4 << 20


@dataclass
class Chunk:
    """`rows` consecutive window rows starting at window position `first`, as gathered records.

    Offsets in json_off/data_off are relative to `data`; `row` are population rows (for table
    lookups). Views into a reusable buffer or ring slot: valid until the next chunk is requested.
    """

    first: int
    rows: int
    data: np.ndarray
    json_off: np.ndarray
    json_len: np.ndarray
    data_off: np.ndarray
    data_len: np.ndarray
    cache_pos: np.ndarray
    sample_id: np.ndarray
    row: np.ndarray


class LocalReader(Gatherer):
    """A `Gatherer` with its own growable buffer: `read()` returns payloads and JSON texts."""

    def __init__(self, handles: Sequence[CacheHandle], *, verify_records: bool = True,
                 max_open_shards: int | None = None) -> None:
        super().__init__(handles, verify_records=verify_records, max_open_shards=max_open_shards)
        self._out = np.empty(INITIAL_OUT_BYTES, dtype=np.uint8)

    def read(self, cache_pos: np.ndarray, sample_id: np.ndarray) -> tuple[list[bytes], list[str]]:
        """Payloads and embedded JSON texts of the given rows, in the given order."""
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        n = len(cache_pos)
        json_off = np.empty(n, dtype=np.int64)
        json_len = np.empty(n, dtype=np.int64)
        data_off = np.empty(n, dtype=np.int64)
        data_len = np.empty(n, dtype=np.int64)
        datas: list[bytes] = []
        jsons: list[str] = []
        first = 0
        while first < n:
            done, _used, need = self.gather_into(
                cache_pos[first:], sample_id[first:], self._out,
                json_off[first:], json_len[first:], data_off[first:], data_len[first:],
            )
            d, j = slice_records(self._out, json_off[first:], json_len[first:],
                                 data_off[first:], data_len[first:], done)
            datas += d
            jsons += j
            first += done
            if need and done == 0:
                self._grow(need)
        return datas, jsons

    def _grow(self, need: int) -> None:
        """Make the gather buffer hold one record of `need` bytes (a record larger than the buffer)."""
        self._out = _grown(self._out, need)


def _grown(out: np.ndarray, need: int) -> np.ndarray:
    """A gather buffer that holds one record of `need` bytes (at least twice `out`)."""
    try:
        return np.empty(max(need, 2 * len(out)), dtype=np.uint8)
    except MemoryError:
        raise ResourceLimitError(f"cannot allocate a {need}-byte read buffer for one record") from None


def local_chunks(reader: LocalReader, window, block_rows: int, start: int = 0) -> Iterator[Chunk]:
    """Chunks of `window` from position `start` on, read in this process, in window order (the
    runtime=None path, and a parallel run's head while its workers start).

    The gather buffer belongs to this generator (not to the shared reader), so a chunk stays
    valid until this generator is advanced, however many other iterators read meanwhile.
    """
    out = np.empty(INITIAL_OUT_BYTES, dtype=np.uint8)
    for first in range(start, window.length, block_rows):
        count = min(block_rows, window.length - first)
        rows = window.rows(first, count)
        cache_pos, sample_id = window.population.resolve(rows)
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        arrays = np.empty((4, count), dtype=np.int64)
        pos = 0
        while pos < count:
            done, _used, need = reader.gather_into(cache_pos[pos:], sample_id[pos:], out,
                                                   arrays[0, pos:], arrays[1, pos:], arrays[2, pos:], arrays[3, pos:])
            if done == 0:
                out = _grown(out, need)
                continue
            end = pos + done
            yield Chunk(first + pos, done, out, arrays[0, pos:end], arrays[1, pos:end], arrays[2, pos:end],
                        arrays[3, pos:end], cache_pos[pos:end], sample_id[pos:end], rows[pos:end])
            pos = end
