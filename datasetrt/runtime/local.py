"""In-process reading: `Chunk` (gathered records of consecutive window positions), the block
loop around the gather kernel (`local_chunks`), `LocalReader` (a gatherer with its own buffer),
and the batch analogues: `PackedBatch` (a batch gathered in its final layout), `BatchShape`
(how a window is cut into batches), `local_batches` / `read_packed` (in-process batch gathers
into recycled private buffers, `BufferPool`).

Boundary: arrays of (cache position, sample_id) in; chunks of gathered records out. No Polars,
no Torch, no record types (runtime/samples.py and runtime/batches.py turn chunks into those).
`Gatherer` (runtime/gatherer.py: the descriptors and the kernel call) imports no numpy, for the
worker processes; this module is the parent's numpy side. One reader per process and thread
(descriptors are process-private).
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np

from datasetrt.errors import ResourceLimitError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.descriptors import DescriptorBudget
from datasetrt.runtime.gatherer import Gatherer
from datasetrt.runtime.memory import default_memory_limit_bytes
from datasetrt.runtime.protocol import CacheLayout
from datasetrt.values.payloads import PayloadCheck

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
    """A `Gatherer` with its own growable buffer, for reads outside a window (`read_chunk`), and
    the recycled buffers of in-process batches (`batch_buffers`).

    Memory: a gather reports the bytes a record needs (stored, before it is read; decoded as its
    codec declares, before it is decoded) instead of reading what does not fit, and no buffer
    is grown past `memory_limit_bytes` (default: runtime/memory.py's): a record that alone needs
    more is a ResourceLimitError naming the cache and sample, before anything is allocated."""

    def __init__(
        self,
        handles: Sequence[CacheHandle],
        *,
        verify_records: bool = True,
        budget: DescriptorBudget | None = None,
        memory_limit_bytes: int | None = None,
        layouts: Sequence[CacheLayout] | None = None,
    ) -> None:
        super().__init__(handles, verify_records=verify_records, budget=budget, layouts=layouts)
        self.memory_limit_bytes = memory_limit_bytes or default_memory_limit_bytes()
        self._out: np.ndarray = np.empty(INITIAL_OUT_BYTES, dtype=np.uint8)
        # In-process batch buffers of this reader (one per thread and process, as the reader),
        # kept across iterators: a new epoch gathers into the last one's buffers instead of
        # faulting in fresh ones. Holds at most `BufferPool.keep` buffers once idle.
        self.batch_buffers = BufferPool()

    def read_chunk(
        self,
        cache_pos: np.ndarray,
        sample_id: np.ndarray,
        *,
        first: int = 0,
        row: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> Chunk:
        """The given rows, in the given order, gathered as one Chunk (window positions from
        `first`; population rows `row`, default -1). Gathers into `out`, or into this reader's
        own buffer, which the next `read_chunk` reuses: consume such a chunk before reading
        again (get_item does). The buffer grows (keeping what was gathered) until every row fits
        (one record or a few: for windows use `local_chunks`)."""
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        n = len(cache_pos)
        own = out is None
        buf = self._out if out is None else out
        json_off, json_len, data_off, data_len = _record_offsets(n)
        pos = used = 0  # rows gathered, bytes of buf they use
        while pos < n:
            # A gather stops early when buf is full or the rows' caches exceed the descriptor
            # budget: gather the rest after what is there, offsets made relative to buf.
            done, more, need = self.gather_into(
                cache_pos[pos:],
                sample_id[pos:],
                buf[used:],
                json_off[pos:],
                json_len[pos:],
                data_off[pos:],
                data_len[pos:],
            )
            if done:
                json_off[pos : pos + done] += used
                data_off[pos : pos + done] += used
                pos, used = pos + done, used + more
            else:
                bigger = _grown(buf, used + max(need, 1), self._limit(need, cache_pos[pos], sample_id[pos]))
                bigger[:used] = buf[:used]
                buf = bigger
        if own:
            self._out = buf
        if row is None:
            row = np.empty(n, dtype=np.int64)
            row.fill(-1)
        return Chunk(
            first, n, buf, json_off, json_len, data_off, data_len, cache_pos, sample_id, np.asarray(row, dtype=np.int64)
        )

    def _limit(self, need: int, cache_pos: int, sample_id: int) -> int:
        """The most a gather buffer may grow to, once a record that alone needs `need` bytes is
        known to fit the memory limit (ResourceLimitError naming it otherwise)."""
        limit = self.memory_limit_bytes
        if need > limit:
            handle = self.handles[int(cache_pos)]
            raise ResourceLimitError(
                f"record needs {need} bytes (stored, or decoded as its codec declares), over the memory limit "
                f"of {limit} bytes (ReaderConfig.memory_limit_bytes): {handle.source} sample {int(sample_id)}"
            )
        return limit


def _record_offsets(n: int) -> np.ndarray:
    """Uninitialised (json_off, json_len, data_off, data_len) int64 rows of n entries (one
    allocation; unpack it), in the order `Gatherer.gather_into` and `Chunk` take them."""
    return np.empty((4, n), dtype=np.int64)


def _grown(out: np.ndarray, need: int, limit: int) -> np.ndarray:
    """A gather buffer that holds `need` bytes (twice `out` when that is more, up to `limit`)."""
    try:
        return np.empty(max(need, min(2 * len(out), limit)), dtype=np.uint8)
    except MemoryError:
        raise ResourceLimitError(f"cannot allocate a {need}-byte read buffer for one record") from None


def local_chunks(reader: LocalReader, window, block_rows: int, start: int = 0) -> Generator[Chunk, None, None]:
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
            done, _used, need = reader.gather_into(
                cache_pos[pos:], sample_id[pos:], out, json_off[pos:], json_len[pos:], data_off[pos:], data_len[pos:]
            )
            if done == 0:
                out = _grown(out, need, reader._limit(need, cache_pos[pos], sample_id[pos]))
                continue
            end = pos + done
            yield Chunk(
                first + pos,
                done,
                out,
                json_off[pos:end],
                json_len[pos:end],
                data_off[pos:end],
                data_len[pos:end],
                cache_pos[pos:end],
                sample_id[pos:end],
                rows[pos:end],
            )
            pos = end


# -- batches in their final layout ---------------------------------------------------------------


@dataclass
class PackedBatch:
    """`rows` consecutive window rows from window position `first`, gathered in their final batch
    layout: payload i is data[offsets[i] : offsets[i+1]] (`data` uint8, the gather buffer or ring
    slot region, payloads back to back from data[0]; `offsets` int64, rows+1). With the embedded
    JSON kept, row i's is data[json_off[i] : +json_len[i]]. cache_pos (int64), sample_id (uint64)
    and row (int64, population rows) are the batch's own arrays.

    Ownership: `data` and `offsets` are a private buffer or views of a ring slot leased to
    whoever holds them (runtime/ring.py, `Ring.lease`); unlike a Chunk, they stay valid for as
    long as they are referenced. `owned` says whether they are private memory.
    """

    first: int
    rows: int
    data: np.ndarray
    offsets: np.ndarray
    cache_pos: np.ndarray
    sample_id: np.ndarray
    row: np.ndarray
    owned: bool = True
    json_off: np.ndarray | None = None
    json_len: np.ndarray | None = None

    @property
    def payload(self) -> np.ndarray:
        """The payload bytes only (data[:offsets[rows]]), a view."""
        return self.data[: int(self.offsets[self.rows])]

    def chunk(self) -> Chunk:
        """The same rows as a `Chunk` (validate_cache's embedded-metadata check reads chunks):
        only for a batch read with its embedded JSON kept (`BatchShape.keep_json`)."""
        json_off, json_len = self.json_off, self.json_len
        if json_off is None or json_len is None:
            raise RuntimeError("a PackedBatch read without keep_json has no embedded JSON to make a Chunk of")
        return Chunk(
            self.first,
            self.rows,
            self.data,
            json_off,
            json_len,
            self.offsets[:-1],
            np.diff(self.offsets),
            self.cache_pos,
            self.sample_id,
            self.row,
        )


@dataclass(frozen=True)
class BatchShape:
    """How a window is read as batches: `batch_size` rows each (the last one shorter, or left out
    with `drop_last`), every payload checked against `check`, embedded JSON kept (`keep_json`:
    validate_cache compares it) or checked and dropped; `row_bytes` is the planned size of one
    row in a batch buffer (largest stored record, or twice the average decoded payload of a
    compressed cache; runtime/run.py `planned_record_bytes`), so a buffer of
    batch_size x row_bytes holds a batch read in place."""

    batch_size: int
    drop_last: bool
    check: PayloadCheck
    keep_json: bool
    row_bytes: int

    def end(self, length: int) -> int:
        """Window positions [0, end) are read: all of them, or whole batches with drop_last."""
        return length - length % self.batch_size if self.drop_last else length

    def buffer_bytes(self, rows: int) -> int:
        return max(rows * max(self.row_bytes, self.check.record_bytes, 1), 1)


class BufferPool:
    """Private batch buffers, recycled once unreachable. The pool keeps the last `keep` buffers it
    handed out and reuses one only when its reference count shows that nothing outside the pool
    refers to it (a batch, its arrays and every view, memoryview or tensor made from them hold a
    reference to the buffer). A fresh buffer of tens of MiB costs a page fault per 4 KiB on its
    first write; a recycled one costs nothing (docs/benchmarks.md)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep  # with `for b in it`, the consumer still holds the previous batch
        self._handed: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of at least `nbytes`: a handed-out one nothing refers to any more, or new."""
        for i in range(len(self._handed)):
            buf = self._handed[i]
            # exactly three references: the list, `buf` and getrefcount's argument
            if len(buf) >= nbytes and sys.getrefcount(buf) == 3:
                del self._handed[i]
                break
        else:
            buf = _allocated(nbytes)
        self._handed = [buf, *self._handed][: self.keep]
        return buf


_NO_JSON = np.empty(0, dtype=np.int64)


def read_packed(
    reader: LocalReader,
    cache_pos: np.ndarray,
    sample_id: np.ndarray,
    row: np.ndarray,
    first: int,
    shape: BatchShape,
    buffers: BufferPool,
) -> PackedBatch:
    """Gather rows (cache_pos int64, sample_id uint64; population rows `row`) as one batch in its
    final layout into a private buffer of `buffers`, in this process. A buffer that turns out too
    small (compressed payloads larger than planned) is replaced by a larger one, up to the
    reader's memory limit, and the batch gathered again. The arrays are the batch's own."""
    n = len(cache_pos)
    out = buffers.take(min(shape.buffer_bytes(n), reader.memory_limit_bytes))
    offsets = np.empty(n + 1, dtype=np.int64)
    json_off, json_len = (
        (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)) if shape.keep_json else (_NO_JSON, _NO_JSON)
    )
    while True:
        done, used, _json_bottom, need = reader.gather_batch_into(
            cache_pos, sample_id, out, offsets, json_off, json_len, shape.check
        )
        if done == n:
            break
        limit = reader._limit(need, cache_pos[done], sample_id[done])
        size = min(max(2 * len(out), used + need * (n - done)), limit)
        if size <= len(out):  # the batch needs a buffer larger than the limit allows
            raise ResourceLimitError(
                f"a batch of {n} rows needs more than {len(out)} bytes, and the memory limit is {limit} bytes "
                f"(ReaderConfig.memory_limit_bytes); it outgrew that at row {done}: "
                f"{reader.handles[int(cache_pos[done])].source} sample {int(sample_id[done])}"
            )
        out = buffers.take(size)
    keep = shape.keep_json
    return PackedBatch(
        first, n, out, offsets, cache_pos, sample_id, row, True, json_off if keep else None, json_len if keep else None
    )


def local_batches(
    reader: LocalReader, window, shape: BatchShape, start: int = 0, buffers: BufferPool | None = None
) -> Generator[PackedBatch, None, None]:
    """Batches of `window` from position `start` (a batch boundary) on, gathered in this process
    straight into private buffers in their final layout (no second copy), in window order: the
    runtime=None path, and a parallel batch run's head while its workers start."""
    buffers = buffers or BufferPool()
    end = shape.end(window.length)
    for first in range(start, end, shape.batch_size):
        count = min(shape.batch_size, end - first)
        rows = window.rows(first, count)
        cache_pos, sample_id = window.population.resolve(rows)
        yield read_packed(
            reader,
            np.ascontiguousarray(cache_pos, dtype=np.int64),
            np.ascontiguousarray(sample_id, dtype=np.uint64),
            np.asarray(rows, dtype=np.int64),
            first,
            shape,
            buffers,
        )


def _allocated(nbytes: int) -> np.ndarray:
    try:
        return np.empty(nbytes, dtype=np.uint8)
    except MemoryError:
        raise ResourceLimitError(f"cannot allocate a {nbytes}-byte batch buffer") from None
