"""How a dataset's windows are read: in this process (a reader per thread) or by a runtime's reader
processes, as `CachedSample`s or as `SampleBatch`es, in window order either way.

Boundary: windows in (any object with `population`, `length`, `rows(first, count)`), samples and
batches out; no sampling state (the dataset reserves its windows), no Polars (a batch's metadata
comes from the `table_of` callable the dataset hands in), no byte layouts (runtime/ and
format/ own them). `ReadRuntime` is what reads need of a `DatasetRuntime`, so this package's
dataset never imports the runtime module that constructs datasets.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from datasetrt.dataset import remote
from datasetrt.errors import ResourceLimitError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.batch_run import BatchRun
from datasetrt.runtime.batches import BatchMaker
from datasetrt.runtime.local import READ_BLOCK_ROWS, BatchShape, Chunk, LocalReader, local_batches, local_chunks
from datasetrt.runtime.memory import collector_paused, default_memory_limit_bytes
from datasetrt.runtime.pool import WorkerPool
from datasetrt.runtime.protocol import CacheLayout, CacheSet
from datasetrt.runtime.run import ParallelRun, RunSpec, cache_set, planned_record_bytes
from datasetrt.runtime.sample_batch import SampleBatch
from datasetrt.runtime.samples import SampleBuilder
from datasetrt.sampling.planner import Population
from datasetrt.values.config import PayloadSpec, ReaderConfig
from datasetrt.values.payloads import PayloadCheck
from datasetrt.values.records import CachedSample


class ReadRuntime(Protocol):
    """What a dataset's reads need of the `DatasetRuntime` it was built with."""

    @property
    def num_workers(self) -> int: ...

    @property
    def parallel_reads(self) -> bool: ...

    @property
    def workers_launched(self) -> bool: ...

    def running_pool(self) -> WorkerPool: ...


class DatasetReads:
    """The read side of one dataset over `handles` (catalog order): this thread's `LocalReader`
    (descriptors are never shared across threads or forks), the sample builders, and the specs
    of parallel runs on `runtime`'s reader processes (None: every read is in-process).

    Thread-safe as the dataset is: per-thread readers; the builders and the cached sizes are
    computed idempotently."""

    def __init__(
        self,
        handles: Sequence[CacheHandle],
        cache_ids: np.ndarray,
        reader_config: ReaderConfig,
        payload_spec: PayloadSpec | None,
        runtime: ReadRuntime | None,
    ) -> None:
        self.handles = list(handles)
        self.cache_ids = cache_ids
        self.config = reader_config
        self.payload_spec = payload_spec
        self.runtime = runtime
        self._thread_readers = threading.local()  # this thread's LocalReader (and the pid it was opened in)
        self.sample_builder = SampleBuilder(self.handles, cache_ids, check_embedded=reader_config.validate_cache)
        self._other_builder: SampleBuilder | None = None  # the opposite embedded check (read_window)

    @property
    def with_workers(self) -> bool:
        """Whether reads go to the runtime's reader processes (`parallel_reads`)."""
        return self.runtime is not None and self.runtime.parallel_reads

    def reader(self, layouts: Sequence[CacheLayout] | None = None) -> LocalReader:
        """This thread's reader in this process. `layouts`: the caches' layouts when the caller
        has them (a run's `CacheSet`), used if the reader is built now."""
        local = self._thread_readers
        reader = getattr(local, "reader", None)
        if reader is None or local.pid != os.getpid():
            with collector_paused():  # O(caches) long-lived objects, no garbage
                reader = LocalReader(
                    self.handles,
                    verify_records=self.config.verify_records,
                    memory_limit_bytes=self.config.memory_limit_bytes or self.default_memory_limit,
                    layouts=layouts,
                )
            local.reader, local.pid = reader, os.getpid()
        return reader

    def close(self) -> None:
        """Close this thread's shard descriptors now (they are also closed on garbage collection)."""
        reader = getattr(self._thread_readers, "reader", None)
        if reader is not None:
            reader.close()
            self._thread_readers.reader = None

    def builder(self, check_embedded: bool | None) -> SampleBuilder:
        """The sample builder checking embedded metadata as `check_embedded` says (None: as
        validate_cache says)."""
        builder = self.sample_builder
        if check_embedded is not None and check_embedded != builder.check_embedded:
            if self._other_builder is None:
                self._other_builder = builder.checking(check_embedded)
            builder = self._other_builder
        return builder

    def row_shards(self, population: Population) -> np.ndarray:
        """The shard of each row of `population` as int64 ids unique across the dataset's caches
        (cache k's shard j is `shard_base[k] + j`), read from the mapped indexes. O(rows) time and
        memory (plus a stable sort of the rows by cache for an active population)."""
        bases = np.zeros(len(self.handles) + 1, dtype=np.int64)
        np.cumsum([len(h.manifest.shards) for h in self.handles], out=bases[1:])
        active = population.active
        if active is None:
            parts = [h.index_array()[:, 0].astype(np.int64) + bases[k] for k, h in enumerate(self.handles)]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        out = np.empty(len(active), dtype=np.int64)
        by_cache = np.argsort(active.cache_pos, kind="stable")
        cache_of = active.cache_pos[by_cache]
        bounds = np.searchsorted(cache_of, np.arange(len(self.handles) + 1))
        for k, handle in enumerate(self.handles):
            rows = by_cache[bounds[k] : bounds[k + 1]]
            if len(rows):
                index = handle.index_array()
                out[rows] = index[active.sample_id[rows].astype(np.int64), 0].astype(np.int64) + bases[k]
        return out

    # -- samples -------------------------------------------------------------------------------

    def samples(
        self,
        window: Any,
        transform: Callable[[CachedSample], Any] | None,
        *,
        in_process: bool,
        check_embedded: bool | None,
    ) -> Iterator[Any]:
        """The samples of `window` in window order, each through `transform`."""
        if window.length == 0:
            return iter(())
        builder = self.builder(check_embedded)
        if in_process:
            chunks: Iterator[Chunk] = local_chunks(self.reader(), window, READ_BLOCK_ROWS)
            fetcher = remote.prefetcher(self.handles, window, self.config)
            if fetcher is not None:
                chunks = remote.prefetched_chunks(chunks, fetcher)
        else:
            chunks = self.chunks(window)
        return builder.samples(chunks, transform)

    def sample(self, cache_pos: int, sample_id: int) -> CachedSample:
        """One sample by catalog position and sample_id (both checked by the caller)."""
        chunk = self.reader().read_chunk(np.array([cache_pos], dtype=np.int64), np.array([sample_id], dtype=np.uint64))
        [sample] = self.sample_builder.chunk_samples(chunk)
        return sample

    def chunks(self, window: Any, rows_hint: int | None = None) -> Iterator[Chunk]:
        """Gathered records of `window` in plan order, read as `with_workers` says; `rows_hint`
        (a batch size) aligns chunks with batches where the record size allows. Shards of remote
        caches are prefetched in the order the window first needs them."""
        fetcher = remote.prefetcher(self.handles, window, self.config)
        if fetcher is not None:
            yield from remote.prefetched_chunks(self._chunks(window, rows_hint), fetcher)
        else:
            yield from self._chunks(window, rows_hint)

    def _chunks(self, window: Any, rows_hint: int | None) -> Iterator[Chunk]:
        if self.with_workers:
            assert self.runtime is not None
            run = ParallelRun(self.run_spec(window, rows_hint), self.runtime.running_pool)
            try:
                yield from run
            finally:
                run.close()
        else:
            yield from local_chunks(self.reader(), window, rows_hint or READ_BLOCK_ROWS)

    # -- batches -------------------------------------------------------------------------------

    def batches(
        self,
        window: Any,
        batch_size: int,
        drop_last: bool,
        table_of: Callable[[Population], Any] | None,
        builder: SampleBuilder,
        in_process: bool = False,
        buffers: Any = None,
    ) -> Iterator[SampleBatch]:
        """`window` as SampleBatches of `batch_size` in order: leased ring slots through the
        runtime's workers, or in-process batches gathered straight into private buffers (or
        `buffers`' arrays). `table_of(population)` gives the table a batch's metadata rows come
        from (None: no metadata); `builder` decides the embedded-metadata check."""
        if window.length == 0:
            return
        # The metadata slice of each batch is built only if the consumer reads it (see SampleBatch).
        table = functools.partial(table_of, window.population) if table_of is not None else None
        check = builder.metadata if builder.check_embedded else None
        maker = BatchMaker(self.cache_ids, table, check, self.payload_spec)
        shape = self.batch_shape(batch_size, drop_last, builder.check_embedded)
        packed: Any
        if not in_process and self.with_workers:
            assert self.runtime is not None
            try:
                packed = BatchRun(
                    self.run_spec(window, batch_size),
                    self.runtime.running_pool,
                    shape,
                    pool_running=self.runtime.workers_launched,
                )
            except ResourceLimitError:
                # A slot per batch exceeds the memory limit: small record slots, one copy per batch.
                labels = [str(h.path) for h in self.handles]
                yield from maker.from_chunks(
                    self.chunks(window, batch_size), batch_size, drop_last, shape.check, labels
                )
                return
        else:
            reader = self.reader()
            packed = local_batches(reader, window, shape, buffers=buffers or reader.batch_buffers)
        fetcher = remote.prefetcher(self.handles, window, self.config)
        try:
            # `yield from map`: no frame here keeps a batch once it is handed out, so the
            # consumer's references alone decide when a leased ring slot returns.
            if fetcher is None:
                yield from map(maker.batch, packed)
            else:
                yield from remote.Advancing(map(maker.batch, packed), fetcher)
        finally:
            if fetcher is not None:
                fetcher.close()
            packed.close()

    def batch_shape(self, batch_size: int, drop_last: bool, keep_json: bool) -> BatchShape:
        """How a window is cut and checked into batches: the payload spec's length rule, the
        embedded JSON kept only when it is checked (validate_cache), rows planned at the ring's
        record size."""
        spec = self.payload_spec
        check = PayloadCheck() if spec is None else PayloadCheck.of(spec.dtype, spec.shape)
        return BatchShape(batch_size, drop_last, check, keep_json, self.max_record_bytes)

    # -- parallel runs -------------------------------------------------------------------------

    def run_spec(self, window: Any, rows_hint: int | None = None) -> RunSpec:
        """The spec of one parallel read of `window` on the runtime's reader processes."""
        with collector_paused():  # the first one builds O(caches) long-lived objects, no garbage
            return self._run_spec(window, rows_hint)

    def _run_spec(self, window: Any, rows_hint: int | None) -> RunSpec:
        assert self.runtime is not None
        cfg = self.config
        caches = self.worker_caches
        return RunSpec(
            caches=caches,
            window=window,
            num_workers=self.runtime.num_workers,
            prefetch_size=cfg.prefetch_size,
            max_record_bytes=self.max_record_bytes,
            memory_limit_bytes=cfg.memory_limit_bytes or self.default_memory_limit,
            timeout_s=cfg.worker_timeout_s,
            fallback=self.reader(caches.layouts or None),  # (remote caches: no layouts)
            rows_hint=rows_hint,
        )

    @functools.cached_property
    def default_memory_limit(self) -> int:
        """`default_memory_limit_bytes()`, read once (cgroup files and psutil)."""
        return default_memory_limit_bytes()

    @functools.cached_property
    def worker_caches(self) -> CacheSet:
        """The caches as reader workers open them (built at the first parallel read)."""
        return cache_set(self.handles, self.config.verify_records)

    @functools.cached_property
    def max_record_bytes(self) -> int:
        """Record size the worker ring is planned for (`runtime.run.planned_record_bytes`)."""
        return planned_record_bytes(self.handles)
