"""`CachedDataset` and `DatasetRuntime`: orchestration of format, table, sampling and runtime.

Boundary: no byte layouts (those live in format/); this module wires open caches, the Polars
table, the planner and the reader together and owns the dataset-level sampling state:
`cursor` (ordered mode) and `draw_offset` (shuffled mode), both reserved at an iterator's first
`next()`, and `epoch_len` (None = the population size).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from datasetrt.config import DEFAULT_WRITER_CONFIG, PayloadSpec, ReaderConfig, WriterConfig
from datasetrt.errors import (
    ArgumentOverflowError,
    ArgumentTypeError,
    CacheFormatError,
    ConfigError,
    DatasetRTError,
    MetadataTypeError,
    RecordJSONError,
    SampleIndexError,
)
from datasetrt.format.layout import U64_MAX
from datasetrt.format.reader import CacheHandle, common_payload_spec
from datasetrt.records import (
    CachedSample,
    CacheSourcesDatasetError,
    CacheSourcesDatasetSuccess,
    CacheWriteSuccess,
    Deferred,
    Err,
    Ok,
    SampleBatch,
)
from datasetrt._native.batch import json_array, pack_payloads, payload_list
from datasetrt._native.gather import slice_records
from datasetrt.runtime.local import Chunk, LocalReader, local_chunks
from datasetrt.runtime.memory import default_memory_limit_bytes
from datasetrt.runtime.pool import WorkerPool
from datasetrt.runtime.run import ParallelRun
from datasetrt.sampling.planner import ActiveRows, Population, Window, advance
from datasetrt.table.catalog import CacheCatalog

if TYPE_CHECKING:
    # Polars and pyarrow (~65 MiB together) load only when metadata is touched or a cache is
    # written: table.metadata and format.writer are imported inside the methods that use them.
    import polars as pl

# Payloads at least this large on average are copied out one at a time as the consumer advances, not a whole
# chunk at once: a chunk's worth of large bytes objects freed one by one lets glibc trim the heap,
# and the next chunk pays a page fault per 4 KiB again (measured: 150 KiB records 1.5x faster).
LAZY_PAYLOAD_BYTES = 32 * 1024
READ_BLOCK_ROWS = 256
DECODED_ESTIMATE_CAP = 16 << 20  # ring planning only; larger records split tasks or read in-process


def _check_seed(seed: Any) -> int:
    if type(seed) is bool or not isinstance(seed, int):
        raise ArgumentTypeError(f"seed must be an integer, got {type(seed).__name__}")
    if seed < 0:
        raise ArgumentOverflowError(f"can't convert negative int to unsigned (seed={seed})")
    if seed > U64_MAX:
        raise ArgumentOverflowError(f"int too big to convert (seed={seed} is not a u64)")
    return seed


def _check_paths(paths: Any) -> list[Path]:
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ArgumentTypeError("paths must be a sequence of cache directories, not a single path")
    try:
        items = list(paths)
    except TypeError:
        raise ArgumentTypeError(f"paths must be a sequence of cache directories, got {type(paths).__name__}") from None
    if not items:
        raise ConfigError("CachedDataset requires at least one cache path")
    return [Path(p) for p in items]


class CachedDataset:
    """A deterministic view over one or more caches.

    Opening reads manifests and stats files only (validate_cache=True adds the deep checks). The
    metadata table is decoded on first use. Iterators snapshot the population and reserve their
    window at the first `next()`; concurrent iterators are independent.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], *, reader_config: ReaderConfig,
                 runtime: DatasetRuntime | None = None) -> None:
        if not isinstance(reader_config, ReaderConfig):
            raise ArgumentTypeError(f"reader_config must be a ReaderConfig, got {type(reader_config).__name__}")
        self.cache_paths: list[Path] = _check_paths(paths)
        self.reader_config = reader_config
        self._seed = _check_seed(reader_config.seed)
        if reader_config.sampling != "draws":
            raise ConfigError(f"ReaderConfig(sampling={reader_config.sampling!r}): CachedDataset does not read "
                              "this order yet; plan it with datasetrt.sampling.EpochPermutation (docs/sampling.md)")
        self._runtime = runtime
        self._handles = [CacheHandle.open(p) for p in self.cache_paths]
        if reader_config.validate_cache:
            for handle in self._handles:
                handle.validate_deep()
        schema = self._handles[0].manifest.metadata_schema
        for handle in self._handles[1:]:
            if handle.manifest.metadata_schema != schema:
                raise CacheFormatError(f"all caches must share the same metadata schema: {handle.path} differs from {self._handles[0].path}")
        self._schema = schema
        self._payload_spec = common_payload_spec(self._handles)
        ids = [h.manifest.cache_id if h.manifest.cache_id is not None else k for k, h in enumerate(self._handles)]
        self._catalog = CacheCatalog(ids, [h.sample_count for h in self._handles], [str(h.path) for h in self._handles])
        self._population = Population(self._catalog)
        self._active_frame: pl.DataFrame | None = None
        self._physical_frame: pl.DataFrame | None = None
        self._epoch_len: int | None = None
        self._cursor = 0
        self._draw_offset = 0
        self._lock = threading.Lock()
        self._readers = threading.local()
        self._validation_tables: dict[int, Any] = {}
        self._labels = [str(h.path) for h in self._handles]
        self._largest_record: int | None = None
        self._arrow_cache: tuple[Any, Any] | None = None
        self._dataset_key: str | None = None  # computed at the first parallel read (stats every cache)

    @property
    def payload_spec(self) -> PayloadSpec | None:
        """The caches' common `PayloadSpec` (typed payloads), or None when they are untyped."""
        return self._payload_spec

    # -- size and windows ---------------------------------------------------------------------

    def __len__(self) -> int:
        return self._epoch_len if self._epoch_len is not None else len(self._population)

    def set_epoch_len(self, epoch_len: int) -> None:
        """Length of future iterators' windows; the population is unchanged."""
        if type(epoch_len) is bool:
            epoch_len = int(epoch_len)
        if not isinstance(epoch_len, int):
            raise ArgumentTypeError(f"epoch_len must be an integer, got {type(epoch_len).__name__}")
        if epoch_len < 1:
            raise ConfigError("epoch_len must be at least 1")
        if epoch_len > sys.maxsize:
            raise ArgumentOverflowError(f"int too big to convert (epoch_len must be <= {sys.maxsize}, as len() requires)")
        self._epoch_len = epoch_len

    def _reserve(self) -> Window:
        """Reserve the next window (called at an iterator's first next())."""
        with self._lock:
            population = self._population
            length = len(self)
            shuffle = self.reader_config.shuffle
            start = self._draw_offset if shuffle else self._cursor
            if shuffle:
                self._draw_offset = advance(True, start, length, len(population))
            else:
                self._cursor = advance(False, start, length, len(population))
            return Window(population, shuffle, self._seed, start, length)

    # -- reading ------------------------------------------------------------------------------

    def _reader(self) -> LocalReader:
        """This thread's reader in this process (descriptors are never shared across forks)."""
        local = self._readers
        reader = getattr(local, "reader", None)
        if reader is None or local.pid != os.getpid():
            reader = LocalReader(self._handles, verify_records=self.reader_config.verify_records)
            local.reader, local.pid = reader, os.getpid()
        return reader

    def __iter__(self) -> Iterator[CachedSample]:
        return self._iterate()

    def _iterate(self) -> Iterator[CachedSample]:
        window = self._reserve()
        cache_ids = self._catalog.cache_ids
        validate = self.reader_config.validate_cache
        for chunk in self._chunks(window):
            metas = self._chunk_metadata(chunk)
            if validate:
                self._compare_embedded(metas, chunk.cache_pos, chunk.sample_id)
            ids, sids = cache_ids[chunk.cache_pos].tolist(), chunk.sample_id.tolist()
            if chunk.rows and int(chunk.data_len[: chunk.rows].sum()) >= LAZY_PAYLOAD_BYTES * chunk.rows:
                # Large payloads: one bytes object alive at a time (see LAZY_PAYLOAD_BYTES).
                with memoryview(chunk.data) as view:  # released even if the consumer abandons us
                    for off, length, meta, cid, sid in zip(chunk.data_off.tolist(), chunk.data_len.tolist(), metas, ids, sids):
                        yield CachedSample(view[off:off + length].tobytes(), meta, cid, sid)
            else:
                datas = payload_list(chunk.data, chunk.data_off, chunk.data_len, chunk.rows)
                yield from map(CachedSample, datas, metas, ids, sids)

    def iter_batches(self, batch_size: int, *, drop_last: bool = False, with_metadata: bool = True) -> Iterator[SampleBatch]:
        """Iterate one window (len(self) samples, same order as `iter(self)`) as `SampleBatch`es
        of `batch_size` (the last one shorter unless drop_last). Reserves its window at the
        first next(), like __iter__. No Python object is created per sample.
        """
        if type(batch_size) is not int or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        return self._iterate_batches(batch_size, drop_last, with_metadata)

    def _iterate_batches(self, batch_size: int, drop_last: bool, with_metadata: bool) -> Iterator[SampleBatch]:
        window = self._reserve()
        # The metadata slice of each batch is built only if the consumer reads it (see SampleBatch).
        table = functools.partial(self._arrow_table, window.population) if with_metadata else None
        cache_ids = self._catalog.cache_ids
        validate = self.reader_config.validate_cache
        builder = _BatchBuilder(batch_size)
        for chunk in self._chunks(window, batch_size):
            if validate:
                self._compare_embedded(self._chunk_metadata(chunk), chunk.cache_pos, chunk.sample_id)
            start = 0
            while start < chunk.rows:
                start = builder.add(chunk, start)
                if builder.full:
                    yield builder.finish(cache_ids, table)
        if builder.rows and not drop_last:
            yield builder.finish(cache_ids, table)

    def _arrow_table(self, population: Population) -> Any:
        """pyarrow form of the table whose rows a population's planner rows index (cached):
        the frame that population was validated from, or the physical table."""
        frame = population.source if population.source is not None else self._physical()
        if self._arrow_cache is None or self._arrow_cache[0] is not frame:
            self._arrow_cache = (frame, frame.to_arrow())
        return self._arrow_cache[1]

    def _chunk_metadata(self, chunk: Chunk) -> list[dict]:
        """Embedded metadata of a chunk: one json.loads over the joined records when each record
        is structurally one object (the kernel checks), else per record for a precise error."""
        text, _bad = json_array(chunk.data, chunk.json_off, chunk.json_len, chunk.rows)
        if text is not None:
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                pass
        try:
            _datas, jsons = slice_records(chunk.data, chunk.json_off, chunk.json_len,
                                          chunk.data_off, chunk.data_len, chunk.rows)
        except UnicodeDecodeError as exc:
            raise RecordJSONError(f"JSON error: embedded metadata is not UTF-8 ({exc.reason})") from None
        return _parse_metadata(jsons, self._labels, chunk.cache_pos, chunk.sample_id)

    def _chunks(self, window: Window, rows_hint: int | None = None) -> Iterator[Chunk]:
        """Gathered records of `window` in plan order: worker processes when the dataset has a
        runtime (and it has parallel_reads), else this process. `rows_hint` (a batch size)
        aligns chunks with batches where the record size allows."""
        if self._runtime is not None and self._runtime.parallel_reads:
            run = self._parallel_run(window, rows_hint)
            try:
                yield from run
            finally:
                run.close()
        else:
            yield from local_chunks(self._reader(), window, rows_hint or READ_BLOCK_ROWS)

    def _parallel_run(self, window: Window, rows_hint: int | None = None) -> ParallelRun:
        """Start a multiprocess read of `window` on the runtime's workers."""
        cfg = self.reader_config
        return ParallelRun(
            self._runtime._reader_pool,
            self._runtime.num_workers,
            dataset_key=self._dataset_key or self._set_dataset_key(),
            cache_dirs=[str(h.path.absolute()) for h in self._handles],
            counts=self._catalog.counts.tolist(),
            verify_records=cfg.verify_records,
            window=window,
            prefetch_size=cfg.prefetch_size,
            max_record_bytes=self._max_record_bytes(),
            memory_limit_bytes=cfg.memory_limit_bytes or default_memory_limit_bytes(),
            timeout_s=cfg.worker_timeout_s,
            fallback=self._reader(),
            rows_hint=rows_hint,
            identities=tuple(h.identity for h in self._handles),
        )

    def _set_dataset_key(self) -> str:
        self._dataset_key = _dataset_key(self._handles, self.reader_config.verify_records)
        return self._dataset_key

    def _max_record_bytes(self) -> int:
        """Record size the worker ring is planned for (cached): the largest stored record over all
        caches (one vectorised pass over each index) or, for compressed caches, twice the largest
        average decoded payload (manifest uncompressed_byte_len / sample_count), if larger. A
        record that decodes bigger still fits: its task splits (runtime/run.py)."""
        if self._largest_record is None:
            largest = 0
            for handle in self._handles:
                if handle.sample_count and any(s.algo != "none" for s in handle.manifest.shards):
                    decoded = sum(s.uncompressed_byte_len for s in handle.manifest.shards) // handle.sample_count
                    largest = max(largest, min(2 * decoded + 256, DECODED_ESTIMATE_CAP))  # manifests are untrusted
            for handle in self._handles:
                if handle.sample_count:
                    # A hostile index length is the gather kernel's to refuse; size by what can exist.
                    biggest_shard = max((s.byte_len for s in handle.manifest.shards), default=0)
                    largest = max(largest, min(int(handle.index_array()[:, 2].max()), biggest_shard))
            self._largest_record = largest
        return self._largest_record

    def _samples(self, reader: LocalReader, cache_pos: np.ndarray, sample_id: np.ndarray,
                 cache_ids: np.ndarray) -> list[CachedSample]:
        datas, jsons = _read_checked(reader, cache_pos, sample_id)
        return self._to_samples(datas, jsons, cache_pos, sample_id, cache_ids)

    def _to_samples(self, datas: list, jsons: list, cache_pos: np.ndarray, sample_id: np.ndarray,
                    cache_ids: np.ndarray) -> list[CachedSample]:
        metas = _parse_metadata(jsons, self._labels, cache_pos, sample_id)
        if self.reader_config.validate_cache:
            self._compare_embedded(metas, cache_pos, sample_id)
        return list(map(CachedSample, datas, metas, cache_ids[cache_pos].tolist(), sample_id.tolist()))

    def get_item(self, cache_id: int, sample_id: int) -> CachedSample:
        """One sample by identity; ignores the active table and does not move any cursor."""
        if type(cache_id) is not int or type(sample_id) is not int:
            raise ArgumentTypeError("cache_id and sample_id must be integers")
        if not 0 <= cache_id <= U64_MAX:
            raise SampleIndexError(f"cache_id {cache_id} is out of range")
        if not 0 <= sample_id <= U64_MAX:
            raise SampleIndexError(f"sample_id {sample_id} is out of range")
        pos = self._catalog.position(cache_id)
        if pos < 0:
            raise SampleIndexError(f"cache_id {cache_id} is out of range")
        if sample_id >= self._catalog.counts[pos]:
            raise SampleIndexError(f"sample_id {sample_id} is out of range for cache_id {cache_id}")
        rows = self._samples(self._reader(), np.array([pos], dtype=np.int64),
                             np.array([sample_id], dtype=np.uint64), self._catalog.cache_ids)
        return rows[0]

    def _compare_embedded(self, metas: list[dict], cache_pos: np.ndarray, sample_id: np.ndarray) -> None:
        """validate_cache=True: each record's embedded JSON must equal its metadata.arrow row."""
        for k in np.unique(cache_pos).tolist():
            table = self._validation_tables.get(k)
            if table is None:
                table = self._validation_tables[k] = self._handles[k].read_metadata()
            mask = cache_pos == k
            expected = table.take(sample_id[mask].astype(np.int64)).to_pylist()
            for meta, want, sid in zip((m for m, keep in zip(metas, mask) if keep), expected, sample_id[mask].tolist()):
                if meta != want:
                    raise CacheFormatError(
                        f"embedded metadata does not match metadata.arrow for sample {sid}: {self._handles[k].path}"
                    )

    # -- metadata table -----------------------------------------------------------------------

    def get_metadata(self) -> pl.DataFrame:
        """The active table as last supplied, or the physical table (decoded on first use)."""
        if self._active_frame is not None:
            return self._active_frame
        return self._physical()

    def _physical(self) -> pl.DataFrame:
        """The caches' own metadata table (decoded once, on first use; never changes)."""
        if self._physical_frame is None:
            from datasetrt.table.metadata import physical_table  # lazily: imports Polars and pyarrow

            self._physical_frame = physical_table(self._catalog, self._schema, lambda k: self._handles[k].read_metadata())
        return self._physical_frame

    samples_metadata = get_metadata

    def update_metadata(self, df: pl.DataFrame) -> None:
        """Validate and activate a new population; resets len() to its row count and both cursors.

        On any error the previous table stays active. Started iterators keep their snapshot.
        """
        import polars as pl  # lazily, with table.metadata: a plain read never imports Polars

        from datasetrt.table.metadata import validate_update

        if not isinstance(df, pl.DataFrame):
            raise MetadataTypeError(f"update_metadata expects a polars.DataFrame, got {type(df).__name__}")
        active: ActiveRows = validate_update(df, self._catalog, self._schema)
        population = Population(self._catalog, active, source=df)
        with self._lock:
            self._population = population
            self._active_frame = df
            self._epoch_len = None
            self._cursor = 0
            self._draw_offset = 0

    set_samples_metadata = update_metadata

    # -- manifests ----------------------------------------------------------------------------

    def update_manifests(self, version: Any) -> Ok | Err:
        """Migrate v2 manifests to v3 (cache_id = position in paths), atomically per manifest
        (datasetrt/format/migrate.py)."""
        from datasetrt.format.migrate import update_manifests

        return update_manifests([h.path for h in self._handles], self._catalog.cache_ids.tolist(), version)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close this thread's shard descriptors now (they are also closed on garbage collection)."""
        reader = getattr(self._readers, "reader", None)
        if reader is not None:
            reader.close()
            self._readers.reader = None

    def __enter__(self) -> CachedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'CachedDataset' object: pass cache paths and a ReaderConfig instead")

    def __repr__(self) -> str:
        return f"CachedDataset(caches={len(self._handles)}, rows={len(self._population)}, len={len(self)})"

    # -- PyTorch (datasetrt/integrations/torch.py, imported here lazily: the core never imports torch)

    def to_torch_iterable_dataset(self) -> Any:
        """A sized `torch.utils.data.IterableDataset` over this dataset (docs/pytorch.md)."""
        from datasetrt.integrations.torch import to_torch_iterable_dataset

        return to_torch_iterable_dataset(self)

    def to_torch_dataloader(self, **kwargs: Any) -> Any:
        """A `torch.utils.data.DataLoader` with dataset-rt 0.4.8's arguments (docs/pytorch.md)."""
        from datasetrt.integrations.torch import to_torch_dataloader

        return to_torch_dataloader(self, **kwargs)


def _dataset_key(handles: list[CacheHandle], verify_records: bool) -> str:
    """Identity of a cache set for worker-side reader reuse: paths plus each cache's identity as
    opened (manifest and index device, inode, mtime), so a cache rewritten at the same path is never
    served from a worker's stale handles."""
    h = hashlib.sha256(f"{verify_records}".encode())
    for handle in handles:
        h.update(b"\0" + str(handle.path.absolute()).encode() + repr(handle.identity).encode())
    return h.hexdigest()[:32]


def _table_rows(table_of: Callable[[], Any], rows: np.ndarray) -> Any:
    """Rows `rows` of the table: a zero-copy slice when they are consecutive (ordered windows)."""
    table = table_of()
    n = len(rows)
    first = int(rows[0])
    if int(rows[-1]) - first == n - 1 and (n < 3 or bool((np.diff(rows) == 1).all())):
        return table.slice(first, n)
    return table.take(rows)


class _BatchBuilder:
    """Accumulates chunk rows into one batch: payloads are packed straight into one buffer
    (sized from the first rows' average, grown by doubling), so a batch costs one copy of its
    payload bytes however many chunks it spans.

    Payload buffers of earlier batches are recycled once nothing outside this builder refers to
    them (the batch, its `data` view and every view, memoryview or tensor made from it hold a
    reference to the buffer, so a buffer whose reference count is back to the builder's own is
    unreachable to the consumer). A fresh buffer of tens of MiB costs a page fault per 4 KiB on
    its first write; a recycled one costs nothing (150 KiB records: batches read 1.6x faster).
    """

    RECYCLED = 2  # buffers kept: with `for b in it`, the consumer still holds the previous batch

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._finished: list[np.ndarray] = []
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self.used = 0
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
            grown = self._recycled(estimate)
            grown[: self.used] = self.data[: self.used]
            self.data = grown
        r = self.rows
        pack_payloads(chunk.data, chunk.data_off[start:end], lens, take, self.data, self.starts[r:r + take], self.used)
        self.lens[r:r + take] = lens
        self.cache_pos[r:r + take] = chunk.cache_pos[start:end]
        self.sample_id[r:r + take] = chunk.sample_id[start:end]
        self.row[r:r + take] = chunk.row[start:end]
        self.rows += take
        self.used = need
        return end

    def finish(self, cache_ids: np.ndarray, table_of: Callable[[], Any] | None) -> SampleBatch:
        """The batch so far; `table_of` returns the pyarrow table its rows index (called only if
        the consumer reads `metadata`)."""
        n = self.rows
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.lens[:n], out=offsets[1:])
        metadata = None if table_of is None else Deferred(functools.partial(_table_rows, table_of, self.row[:n]))
        batch = SampleBatch(self.data[: self.used], offsets, cache_ids[self.cache_pos[:n]], self.sample_id[:n].copy(), metadata)
        self._finished = [self.data, *self._finished][: self.RECYCLED]
        self._reset()
        return batch

    def _recycled(self, nbytes: int) -> np.ndarray:
        """A buffer of at least `nbytes`: a finished batch's that nothing else refers to, or new."""
        for i in range(len(self._finished)):
            buf = self._finished[i]
            # exactly three references: the list, `buf` and getrefcount's argument
            if len(buf) >= nbytes and sys.getrefcount(buf) == 3:
                del self._finished[i]
                return buf
        return np.empty(nbytes, dtype=np.uint8)


def _read_checked(reader: LocalReader, cache_pos: np.ndarray, sample_id: np.ndarray) -> tuple[list, list]:
    try:
        return reader.read(cache_pos, sample_id)
    except UnicodeDecodeError as exc:
        raise RecordJSONError(f"JSON error: embedded metadata is not UTF-8 ({exc.reason})") from None


def _parse_metadata(jsons: list[str], labels: list[str], cache_pos: np.ndarray, sample_id: np.ndarray) -> list[dict]:
    """Embedded JSON texts -> dicts (keys already sorted on disk). Typed error naming the sample."""
    loads = json.loads
    try:
        metas = list(map(loads, jsons))
    except (json.JSONDecodeError, RecursionError):
        metas = []
        for i, text in enumerate(jsons):
            try:
                metas.append(loads(text))
            except (json.JSONDecodeError, RecursionError) as exc:
                raise RecordJSONError(
                    f"JSON error: {exc}: {labels[int(cache_pos[i])]} sample {int(sample_id[i])}"
                ) from None
    for i, meta in enumerate(metas):
        if type(meta) is not dict:
            raise RecordJSONError(
                f"JSON error: invalid type: {type(meta).__name__}, expected a map: "
                f"{labels[int(cache_pos[i])]} sample {int(sample_id[i])}"
            )
    return metas


# ------------------------------------------------------------------------------------------------


class _Progress:
    """Write progress to stderr (tqdm): samples, samples/s, payload MB/s, sources done, and an ETA
    when every source has a __len__ (sources are iterated once, never counted ahead)."""

    def __init__(self, sources: list) -> None:
        from tqdm import tqdm

        self.total_sources = len(sources)
        self.sources_done = 0
        self.bytes = 0
        self.start = time.perf_counter()
        total = None
        try:
            if all(hasattr(type(s), "__len__") for s in sources):
                total = sum(len(s) for s in sources)
        except Exception:  # noqa: BLE001 - a source's __len__ is user code; progress is best effort
            total = None
        self.bar = tqdm(total=total, unit=" samples", file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
                        desc=f"datasetrt write 0/{self.total_sources} sources")

    def advance(self, samples: int, nbytes: int) -> None:
        self.bytes += nbytes
        self.bar.update(samples)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s", refresh=False)

    def source_done(self) -> None:
        self.sources_done += 1
        self.bar.set_description(f"datasetrt write {self.sources_done}/{self.total_sources} sources", refresh=False)

    def close(self) -> None:
        self.bar.close()


class DatasetRuntime:
    """Owns the workers shared by every write and dataset built through it.

    `num_workers` threads compress during writes (the native codecs release the GIL).
    """

    __slots__ = ("_num_workers", "_pool", "_readers", "_start_method", "parallel_reads", "__weakref__")

    def __init__(self, *, num_workers: int, start_method: str | None = None, parallel_reads: bool = True) -> None:
        if isinstance(num_workers, float) or not isinstance(num_workers, int):
            raise ArgumentTypeError(f"num_workers must be an integer, got {type(num_workers).__name__}")
        if num_workers < 0:
            raise ArgumentOverflowError("can't convert negative int to unsigned (num_workers)")
        if num_workers == 0:
            raise ConfigError("num_workers must be greater than zero")
        if start_method is not None and start_method not in ("fork", "spawn"):
            raise ConfigError(f"start_method must be 'fork' or 'spawn', got {start_method!r}")
        self._num_workers = int(num_workers)
        self._pool: ThreadPoolExecutor | None = None
        self._readers: WorkerPool | None = None
        self._start_method = start_method
        self.parallel_reads = bool(parallel_reads)

    def _reader_pool(self) -> WorkerPool:
        """The reader worker processes, launched at first use (a run reads in-process until one
        is ready) and relaunched after a crash."""
        if self._readers is None or self._readers.closed:
            pool = WorkerPool(self._num_workers, self._start_method)
            pool.launch()
            self._readers = pool
        return self._readers

    def start_workers(self) -> list[int]:
        """Start the reader workers now and wait until each reports ready; returns their pids.

        Optional: without it they start at the first parallel read, which reads in-process until
        one is ready (same samples either way). Useful before timing a loop, or to fail early.
        """
        pool = self._reader_pool()
        while not pool.all_ready:
            pool.check_startup()
            pool.poll(1.0, what="worker start-up", idle_ok=True)
        return pool.pids

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the running reader workers (empty before the first parallel read)."""
        return [] if self._readers is None or self._readers.closed else self._readers.pids

    @property
    def num_workers(self) -> int:
        return self._num_workers

    def _writer_pool(self) -> ThreadPoolExecutor | None:
        if self._num_workers < 2:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._num_workers, thread_name_prefix="datasetrt-writer")
        return self._pool

    def close(self) -> None:
        """Stop the writer threads and the reader processes (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._readers is not None:
            self._readers.close()
            self._readers = None

    def __enter__(self) -> DatasetRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
        readers = getattr(self, "_readers", None)
        if readers is not None:
            readers.close()

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'DatasetRuntime' object")

    def write_cache(self, sources: Any, path: str | os.PathLike, *,
                    writer_config: WriterConfig = DEFAULT_WRITER_CONFIG) -> list:
        """Write one source or a list of sources under `path`; one result per source, in order."""
        return self._write(sources, path, writer_config, reuse_existing=False, reader_config=None)

    def _write(self, sources: Any, path: Any, writer_config: WriterConfig, *, reuse_existing: bool,
               reader_config: ReaderConfig | None) -> list:
        from datasetrt.format.writer import write_profile, write_sources  # lazily: imports pyarrow

        if not isinstance(writer_config, WriterConfig):
            raise ArgumentTypeError(f"writer_config must be a WriterConfig, got {type(writer_config).__name__}")
        comp = writer_config.shard_compression
        if comp.algo == "none" and comp.ratio != 1.0:
            raise ConfigError("shard_compression.ratio must be 1.0 when algo is 'none'")
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        progress = _Progress(items) if writer_config.show_progress and items else None
        start = time.perf_counter_ns()
        profiles: list = []
        check = _reuse_checker(writer_config) if reuse_existing else None
        try:
            results, _ = write_sources(items, Path(path), writer_config, pool=self._writer_pool(),
                                       progress=progress, reuse_existing=reuse_existing, check_reused=check,
                                       profiles=profiles)
        finally:
            if progress is not None:
                progress.close()
            if writer_config.profiler.enabled:
                write_profile(writer_config.profiler.path, time.perf_counter_ns() - start, profiles)
        return results

    def cached_dataset(self, paths: Sequence[str | os.PathLike], *, reader_config: ReaderConfig) -> CachedDataset:
        return CachedDataset(paths, reader_config=reader_config, runtime=self)

    def from_cache_sources(self, sources: Any, path: str | os.PathLike, *, reader_config: ReaderConfig,
                           writer_config: WriterConfig = DEFAULT_WRITER_CONFIG) -> Any:
        """Write missing caches (reusing valid existing ones), then open the successful ones in order."""
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        if not items:
            return CacheSourcesDatasetError([], "no cache sources were provided")
        results = self._write(items, path, writer_config, reuse_existing=True, reader_config=reader_config)
        ok = [r.path for r in results if isinstance(r, CacheWriteSuccess)]
        if not ok:
            detail = "; ".join(f"{r.source_name}: {r.message}" for r in results)
            return CacheSourcesDatasetError(results, f"no caches were written: {detail}")
        return CacheSourcesDatasetSuccess(self.cached_dataset(ok, reader_config=reader_config), results)


def _reuse_checker(writer_config: WriterConfig):
    def check(name: str, path: Path) -> str | None:
        try:
            handle = CacheHandle.open(path)
            if handle.manifest.source_name != name:
                return f"existing cache at {path} belongs to source {handle.manifest.source_name!r}, not {name!r}"
            spec, existing = writer_config.payload_spec, common_payload_spec([handle])
            if spec is not None and existing != spec:
                return f"existing cache at {path} has payload spec {existing if existing else 'none'}, not {spec}"
            if writer_config.validate_cache:
                handle.validate_deep()
        except DatasetRTError as exc:
            return str(exc)
        return None

    return check
