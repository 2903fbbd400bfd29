"""Batches for `CachedDataset.iter_batches`: `PackedBatch`es (gathered in their final layout, by
reader workers into leased ring slots or in-process into private buffers) to `SampleBatch`es,
and the packing fallback from record chunks (`BatchBuilder`) where no batch gather applies.

Boundary: packed batches and chunks in (runtime/local.py), `SampleBatch`es out; the metadata
table is an opaque callable returning a pyarrow-like table (`slice`/`take`), called only if the
consumer reads a batch's metadata. No Polars, no Torch, no planning, no processes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from datasetrt._native.batch import pack_payloads
from datasetrt.errors import CacheFormatError
from datasetrt.runtime.local import BufferPool, Chunk, PackedBatch
from datasetrt.runtime.sample_batch import Deferred, SampleBatch
from datasetrt.values.payloads import PayloadCheck


class BatchMaker:
    """Turns batches of rows into `SampleBatch`es of one dataset: `cache_ids` (uint64) maps cache
    positions to ids; `table_of` returns the table whose rows the population rows index (None:
    batches carry no metadata); `check` runs on every chunk before its rows are used
    (validate_cache's embedded-metadata comparison); `payload_spec` goes with every batch."""

    def __init__(
        self,
        cache_ids: np.ndarray,
        table_of: Callable[[], Any] | None,
        check: Callable[[Chunk], Any] | None,
        payload_spec: Any,
    ) -> None:
        self.cache_ids = cache_ids
        self.table_of = table_of
        self.check = check
        self.payload_spec = payload_spec

    def batch(self, packed: PackedBatch, checked: bool = False) -> SampleBatch:
        """The SampleBatch of one packed batch: its payload bytes and offsets as they are (views
        of a leased slot, or the batch's own buffer: no copy), its own id arrays. O(rows).
        The embedded metadata is checked first unless `checked` (its chunks were)."""
        if self.check is not None and not checked:
            self.check(packed.chunk())
        table_of = self.table_of
        metadata = None if table_of is None else Deferred(functools.partial(table_rows, table_of, packed.row))
        return SampleBatch(
            packed.payload,
            packed.offsets,
            self.cache_ids[packed.cache_pos],
            packed.sample_id,
            metadata,
            self.payload_spec,
        )

    def from_chunks(
        self, chunks: Iterable[Chunk], batch_size: int, drop_last: bool, rule: PayloadCheck, labels: list[str]
    ) -> Iterator[SampleBatch]:
        """Batches of `batch_size` consecutive chunk rows (the last one shorter unless
        drop_last), packed into one buffer each: the fallback where a run cannot give each batch
        a slot of its own (a batch larger than the memory bound allows). Payload lengths are
        checked against `rule` (typed caches); `labels` name caches in messages."""
        builder = BatchBuilder(batch_size)
        for chunk in chunks:
            if self.check is not None:
                self.check(chunk)
            check_lengths(chunk, rule, labels)
            start = 0
            while start < chunk.rows:
                start = builder.add(chunk, start)
                if builder.full:
                    yield self.batch(builder.finish(), checked=True)
        if builder.rows and not drop_last:
            yield self.batch(builder.finish(), checked=True)


def check_lengths(chunk: Chunk, rule: PayloadCheck, labels: list[str]) -> None:
    """CacheFormatError naming the first record of `chunk` whose payload length breaks `rule`
    (the batch gather kernel checks the same rule itself). O(rows), vectorised."""
    lens = chunk.data_len[: chunk.rows]
    if rule.record_bytes >= 0:
        bad = np.flatnonzero(lens != rule.record_bytes)
        expected = f"{rule.record_bytes} bytes"
    elif rule.unit_bytes > 1:
        bad = np.flatnonzero(lens % rule.unit_bytes)
        expected = f"a multiple of {rule.unit_bytes} bytes"
    else:
        return
    if len(bad):
        i = int(bad[0])
        raise CacheFormatError(
            f"payload of {int(lens[i])} bytes does not fit payload spec {rule.label} (expected "
            f"{expected}): {labels[int(chunk.cache_pos[i])]} sample {int(chunk.sample_id[i])}"
        )


def table_rows(table_of: Callable[[], Any], rows: np.ndarray) -> Any:
    """Rows `rows` of the table: a zero-copy slice when they are consecutive (ordered windows)."""
    table = table_of()
    n = len(rows)
    first = int(rows[0])
    if int(rows[-1]) - first == n - 1 and (n < 3 or bool((np.diff(rows) == 1).all())):
        return table.slice(first, n)
    return table.take(rows)


class BatchBuilder:
    """Accumulates chunk rows into one batch: payloads are packed straight into one buffer
    (sized from the first rows' average, grown by doubling), so a batch costs one copy of its
    payload bytes however many chunks it spans. Buffers come from a `BufferPool` (recycled once
    nothing outside refers to them)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._buffers = BufferPool()
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self.used = 0
        self.first = -1
        self.data = np.empty(0, dtype=np.uint8)
        self.lens = np.empty(self.batch_size, dtype=np.int64)
        self.cache_pos = np.empty(self.batch_size, dtype=np.int64)
        self.sample_id = np.empty(self.batch_size, dtype=np.uint64)
        self.row = np.empty(self.batch_size, dtype=np.int64)
        self.starts = np.empty(self.batch_size, dtype=np.int64)

    @property
    def full(self) -> bool:
        return self.rows == self.batch_size

    def add(self, chunk: Chunk, start: int) -> int:
        """Take chunk rows from `start` until the batch is full; returns the next chunk row."""
        take = min(self.batch_size - self.rows, chunk.rows - start)
        end = start + take
        lens = chunk.data_len[start:end]
        need = self.used + int(lens.sum())
        if need > len(self.data):
            average = need / (self.rows + take)
            estimate = max(need, int(average * self.batch_size * 1.05) + 64, 2 * len(self.data))
            grown = self._buffers.take(estimate)
            grown[: self.used] = self.data[: self.used]
            self.data = grown
        if self.rows == 0:
            self.first = chunk.first + start
        r = self.rows
        pack_payloads(
            chunk.data, chunk.data_off[start:end], lens, take, self.data, self.starts[r : r + take], self.used
        )
        self.lens[r : r + take] = lens
        self.cache_pos[r : r + take] = chunk.cache_pos[start:end]
        self.sample_id[r : r + take] = chunk.sample_id[start:end]
        self.row[r : r + take] = chunk.row[start:end]
        self.rows += take
        self.used = need
        return end

    def finish(self) -> PackedBatch:
        """The batch so far, as a PackedBatch of its own arrays."""
        n = self.rows
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.lens[:n], out=offsets[1:])
        packed = PackedBatch(self.first, n, self.data, offsets, self.cache_pos[:n], self.sample_id[:n], self.row[:n])
        self._reset()
        return packed
