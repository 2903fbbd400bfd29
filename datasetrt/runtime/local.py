"""In-process reading: `Chunk` (gathered records of consecutive window positions), the block
loop around the gather kernel (`local_chunks`) and `LocalReader` (a gatherer with its own buffer).

Boundary: arrays of (cache position, sample_id) in; chunks of gathered records out. No Polars,
no Torch, no record types (runtime/samples.py and runtime/batches.py turn chunks into those).
`Gatherer` (runtime/gatherer.py: the descriptors and the kernel call) imports no numpy, for the
worker processes; this module is the parent's numpy side. One reader per process and thread
(descriptors are process-private).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from datasetrt.errors import ResourceLimitError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.descriptors import DescriptorBudget
from datasetrt.runtime.gatherer import Gatherer

INITIAL_OUT_BYTES = 4 << 20
READ_BLOCK_ROWS = 256  # rows per in-process chunk when the consumer gives no batch size


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
    """A `Gatherer` with its own growable buffer, for reads outside a window (`read_chunk`)."""

    def __init__(self, handles: Sequence[CacheHandle], *, verify_records: bool = True,
                 budget: DescriptorBudget | None = None) -> None:
        super().__init__(handles, verify_records=verify_records, budget=budget)
        self._out = np.empty(INITIAL_OUT_BYTES, dtype=np.uint8)

    def read_chunk(self, cache_pos: np.ndarray, sample_id: np.ndarray, *, first: int = 0,
                   row: np.ndarray | None = None, out: np.ndarray | None = None) -> Chunk:
        """The given rows, in the given order, gathered as one Chunk (window positions from
        `first`; population rows `row`, default -1). Gathers into `out`, or into this reader's
        own buffer, which the next `read_chunk` reuses: consume such a chunk before reading
        again (get_item does). The buffer grows (keeping what was gathered) until every row fits
        (one record or a few: for windows use `local_chunks`)."""
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        n = len(cache_pos)
        own = out is None
        buf = self._out if own else out
        offsets = json_off, json_len, data_off, data_len = _record_offsets(n)
        pos = used = 0  # rows gathered, bytes of buf they use
        while pos < n:
            # A gather stops early when buf is full or the rows' caches exceed the descriptor
            # budget: gather the rest after what is there, offsets made relative to buf.
            done, more, need = self.gather_into(cache_pos[pos:], sample_id[pos:], buf[used:], json_off[pos:],
                                                json_len[pos:], data_off[pos:], data_len[pos:])
            if done:
                json_off[pos:pos + done] += used
                data_off[pos:pos + done] += used
                pos, used = pos + done, used + more
            else:
                bigger = _grown(buf, used + max(need, 1))
                bigger[:used] = buf[:used]
                buf = bigger
        if own:
            self._out = buf
        if row is None:
            row = np.empty(n, dtype=np.int64)
            row.fill(-1)
        return Chunk(first, n, buf, *offsets, cache_pos, sample_id, np.asarray(row, dtype=np.int64))


def _record_offsets(n: int) -> np.ndarray:
    """Uninitialised (json_off, json_len, data_off, data_len) int64 rows of n entries (one
    allocation; unpack it), in the order `Gatherer.gather_into` and `Chunk` take them."""
    return np.empty((4, n), dtype=np.int64)


def _grown(out: np.ndarray, need: int) -> np.ndarray:
    """A gather buffer that holds `need` bytes (at least twice `out`)."""
    try:
        return np.empty(max(need, 2 * len(out)), dtype=np.uint8)
    except MemoryError:
        raise ResourceLimitError(f"cannot allocate a {need}-byte read buffer for one record") from None


def local_chunks(reader: Gatherer, window, block_rows: int, start: int = 0) -> Iterator[Chunk]:
    """Chunks of `window` from position `start` on, read in this process, in window order (the
    runtime=None path, and a parallel run's head while its workers start). `window` is anything
    with `length`, `rows(first, count)` and `population.resolve(rows)` (a planner Window, or a
    torch worker's share of one).

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
        json_off, json_len, data_off, data_len = _record_offsets(count)
        pos = 0
        while pos < count:
            done, _used, need = reader.gather_into(cache_pos[pos:], sample_id[pos:], out,
                                                   json_off[pos:], json_len[pos:], data_off[pos:], data_len[pos:])
            if done == 0:
                out = _grown(out, need)
                continue
            end = pos + done
            yield Chunk(first + pos, done, out, json_off[pos:end], json_len[pos:end], data_off[pos:end],
                        data_len[pos:end], cache_pos[pos:end], sample_id[pos:end], rows[pos:end])
            pos = end
