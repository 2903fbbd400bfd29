"""`DatasetRuntime`: the workers shared by every write and dataset built through it — compression
threads for writes, reader worker processes for parallel reads — and the write entry points.

Boundary: orchestration over format/ (the writer, imported lazily: it imports pyarrow) and
runtime/ (the worker pool). A `CachedDataset` reaches the pool through `running_pool()` and never
imports this module: it takes its runtime as a parameter (`dataset.reads.ReadRuntime`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from datasetrt.dataset.cached import CachedDataset
from datasetrt.errors import (
    ArgumentOverflowError,
    ArgumentTypeError,
    ConfigError,
    DatasetRTError,
    PayloadSpecMismatchError,
)
from datasetrt.format.overwrite import check_if_exists
from datasetrt.format.progress import WriteProgress
from datasetrt.format.reader import CacheHandle, common_payload_spec
from datasetrt.format.remote import Storage
from datasetrt.format.results import CacheWriteSuccess
from datasetrt.runtime.pool import WorkerPool
from datasetrt.storage.urls import parse_location
from datasetrt.values.config import (
    DEFAULT_STORAGE_CONFIG,
    DEFAULT_WRITER_CONFIG,
    PayloadSpec,
    ReaderConfig,
    WriterConfig,
)


class CacheSourcesDatasetSuccess(NamedTuple):
    dataset: CachedDataset
    results: list


class CacheSourcesDatasetError(NamedTuple):
    results: list
    message: str


CacheSourcesDatasetResult = CacheSourcesDatasetSuccess | CacheSourcesDatasetError

for _cls in (CacheSourcesDatasetSuccess, CacheSourcesDatasetError):
    _cls.__module__ = "datasetrt.api"
del _cls


class DatasetRuntime:
    """Owns the workers shared by every write and dataset built through it.

    `num_workers` threads compress during writes (the native codecs release the GIL).
    """

    __slots__ = ("_num_workers", "_writer_threads", "_worker_pool", "_start_method", "parallel_reads", "__weakref__")

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
        self._writer_threads: ThreadPoolExecutor | None = None  # compression threads of writes
        self._worker_pool: WorkerPool | None = None  # reader worker processes of parallel reads
        self._start_method = start_method
        self.parallel_reads = bool(parallel_reads)

    def running_pool(self) -> WorkerPool:
        """The reader worker processes, launched at first use (a run reads in-process until one
        is ready) and relaunched after a crash."""
        if self._worker_pool is None or self._worker_pool.closed:
            pool = WorkerPool(self._num_workers, self._start_method)
            pool.launch()
            self._worker_pool = pool
        return self._worker_pool

    def start_workers(self) -> list[int]:
        """Start the reader workers now and wait until each reports ready; returns their pids.

        Optional: without it they start at the first parallel read, which reads in-process until
        one is ready (same samples either way). Useful before timing a loop, or to fail early.
        """
        pool = self.running_pool()
        while not pool.all_ready:
            pool.check_startup()
            pool.poll(1.0, what="worker start-up", idle_ok=True)
        return pool.pids

    @property
    def workers_launched(self) -> bool:
        """Whether the reader workers are launched (ready or starting), so a read gets the pool
        without starting processes."""
        return self._worker_pool is not None and not self._worker_pool.closed

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the running reader workers (empty before the first parallel read)."""
        return [] if self._worker_pool is None or self._worker_pool.closed else self._worker_pool.pids

    @property
    def num_workers(self) -> int:
        return self._num_workers

    def _compression_threads(self) -> ThreadPoolExecutor | None:
        if self._num_workers < 2:
            return None
        if self._writer_threads is None:
            self._writer_threads = ThreadPoolExecutor(
                max_workers=self._num_workers, thread_name_prefix="datasetrt-writer"
            )
        return self._writer_threads

    def close(self) -> None:
        """Stop the writer threads and the reader processes (idempotent)."""
        if self._writer_threads is not None:
            self._writer_threads.shutdown(wait=True)
            self._writer_threads = None
        if self._worker_pool is not None:
            self._worker_pool.close()
            self._worker_pool = None

    def __enter__(self) -> DatasetRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        threads = getattr(self, "_writer_threads", None)
        if threads is not None:
            threads.shutdown(wait=False)
        pool = getattr(self, "_worker_pool", None)
        if pool is not None:
            pool.close()

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'DatasetRuntime' object")

    def write_cache(
        self,
        sources: Any,
        path: str | os.PathLike,
        *,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
        if_exists: str = "error",
    ) -> list:
        """Write one source or a list of sources under `path`; one result per source, in order
        (`CacheWriteSuccess(source_name, path)` or `CacheWriteError(source_name, message)`:
        check them, a failure is a value, never raised).

        `if_exists` says what a source does when `path/<name>` is taken (local directories;
        docs/python-api.md, "Writing over an existing cache"):
        - "error" (the default, dataset-rt's): `CacheWriteError(name, "cache path already exists:
          <path>")`, the existing cache untouched;
        - "skip_identical": the source is written to staging and compared; the same cache is kept
          as it is (a success at its path), a different one fails as "error" does, saying so;
        - "replace": the new cache takes the name in one atomic rename, the old one is removed.

        Payload types: a source that declares a `payload_spec` (the `datasetrt.sources` adapters)
        has it recorded: when `writer_config.payload_spec` is None and every source declares the
        same spec, the caches are written with it; a source whose spec differs from the writer
        config's, or sources of one call that disagree, raise PayloadSpecMismatchError (a
        ConfigError) before anything is written.
        """
        policy = check_if_exists(if_exists)
        if policy != "error" and not isinstance(parse_location(path), Path):
            raise ConfigError(
                f"if_exists={policy!r} is for caches in local directories; an object store has no atomic "
                "replace: write under a new prefix"
            )
        return self._write(sources, path, writer_config, reuse_existing=False, reader_config=None, if_exists=policy)

    def _write(
        self,
        sources: Any,
        path: Any,
        writer_config: WriterConfig,
        *,
        reuse_existing: bool,
        reader_config: ReaderConfig | None,
        if_exists: str = "error",
    ) -> list:
        from datasetrt.format.writer import write_profile, write_sources  # lazily: imports pyarrow

        if not isinstance(writer_config, WriterConfig):
            raise ArgumentTypeError(f"writer_config must be a WriterConfig, got {type(writer_config).__name__}")
        comp = writer_config.shard_compression
        if comp.algo == "none" and comp.ratio != 1.0:
            raise ConfigError("shard_compression.ratio must be 1.0 when algo is 'none'")
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        writer_config = with_sources_spec(items, writer_config)
        progress = WriteProgress(items) if writer_config.show_progress and items else None
        start = time.perf_counter_ns()
        profiles: list = []
        location = parse_location(path)
        storage = None if isinstance(location, Path) else Storage.of(writer_config.storage)
        check = _reuse_checker(writer_config, storage) if reuse_existing else None

        def write_local(group: list, base: Path) -> list:
            results, _ = write_sources(
                group,
                base,
                writer_config,
                pool=self._compression_threads(),
                progress=progress,
                reuse_existing=reuse_existing,
                check_reused=check,
                profiles=profiles,
                if_exists=if_exists,
            )
            return results

        try:
            if isinstance(location, Path):
                results = write_local(items, location)
            else:
                from datasetrt.format.upload import write_sources_remote  # lazily: object stores

                assert storage is not None
                results = write_sources_remote(
                    items, location, storage, write_local, reuse_existing=reuse_existing, check_reused=check
                )
        finally:
            if progress is not None:
                progress.close()
            if writer_config.profiler.enabled:
                write_profile(writer_config.profiler.path, time.perf_counter_ns() - start, profiles)
        return results

    def cached_dataset(self, paths: Sequence[str | os.PathLike], *, reader_config: ReaderConfig) -> CachedDataset:
        """`CachedDataset(paths, ...)` read with this runtime's workers; `paths` are cache
        directories or object-store URLs (`s3://bucket/prefix/name`, reached with
        `reader_config.storage`), in any mix."""
        return CachedDataset(paths, reader_config=reader_config, runtime=self)

    def from_cache_sources(
        self,
        sources: Any,
        path: str | os.PathLike,
        *,
        reader_config: ReaderConfig,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    ) -> Any:
        """Write missing caches (reusing valid existing ones), then open the successful ones in order.

        `path` is a base directory or an object-store URL (`s3://bucket/prefix`): caches are then
        uploaded and published there (`WriterConfig.storage`) and opened from there, with
        `reader_config.storage`, or with `writer_config.storage` when the reader's is the default
        (one storage configuration serves both)."""
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        if not items:
            return CacheSourcesDatasetError([], "no cache sources were provided")
        results = self._write(items, path, writer_config, reuse_existing=True, reader_config=reader_config)
        ok = [r.path for r in results if isinstance(r, CacheWriteSuccess)]
        if not ok:
            detail = "; ".join(f"{r.source_name}: {r.message}" for r in results)
            return CacheSourcesDatasetError(results, f"no caches were written: {detail}")
        read_config = _read_config(reader_config, writer_config, path)
        return CacheSourcesDatasetSuccess(self.cached_dataset(ok, reader_config=read_config), results)


def with_sources_spec(items: list, writer_config: WriterConfig) -> WriterConfig:
    """`writer_config` with the payload spec the sources declare (`source.payload_spec`, a
    PayloadSpec or None; reading it may open a source's first file for its schema) when it gives
    none and every source declares the same one; unchanged when no source declares a spec.
    PayloadSpecMismatchError when a declared spec differs from the config's, or the config gives
    none and the sources' disagree (a typed source beside an untyped one included). A source whose
    spec cannot be read (its own write then fails, as a value) declares nothing. O(sources)."""
    given = writer_config.payload_spec
    declared: list[tuple[str, PayloadSpec | None]] = []
    for item in items:
        spec = _declared_spec(item)
        if spec is not _NOT_DECLARED:
            declared.append((str(getattr(item, "name", type(item).__name__)), spec))
    if given is not None:
        for name, spec in declared:
            if spec is not None and spec != given:
                raise PayloadSpecMismatchError(
                    f"source {name!r} has payload spec {spec}, but WriterConfig.payload_spec is {given}; "
                    "give the same spec to both (or leave WriterConfig.payload_spec unset to use the source's)"
                )
        return writer_config
    specs = {spec for _name, spec in declared}
    if not any(isinstance(spec, PayloadSpec) for spec in specs):
        return writer_config
    if len(specs) == 1 and len(declared) == len(items):
        return writer_config.model_copy(update={"payload_spec": specs.pop()})
    listed = ", ".join(f"{name!r}: {spec or 'untyped'}" for name, spec in declared)
    undeclared = len(items) - len(declared)
    more = f" and {undeclared} source(s) that declare none" if undeclared else ""
    raise PayloadSpecMismatchError(
        f"the sources of one write have different payload specs ({listed}{more}) and WriterConfig.payload_spec "
        "is unset; write them in separate write_cache calls, or give WriterConfig(payload_spec=...)"
    )


_NOT_DECLARED: Any = object()


def _declared_spec(item: Any) -> Any:
    """`item.payload_spec` when it is a PayloadSpec or None, else `_NOT_DECLARED` (no such
    attribute, another type, or reading it failed: the write reports that failure)."""
    try:
        spec = getattr(item, "payload_spec", _NOT_DECLARED)
    except DatasetRTError:
        return _NOT_DECLARED
    return spec if spec is None or isinstance(spec, PayloadSpec) else _NOT_DECLARED


def _read_config(reader_config: ReaderConfig, writer_config: WriterConfig, path: Any) -> ReaderConfig:
    """`reader_config`, with the writer's storage when the caches are remote and the reader's
    storage is the default (so from_cache_sources needs the storage options once)."""
    if not isinstance(reader_config, ReaderConfig) or isinstance(parse_location(path), Path):
        return reader_config
    if reader_config.storage == DEFAULT_STORAGE_CONFIG and writer_config.storage != DEFAULT_STORAGE_CONFIG:
        return reader_config.model_copy(update={"storage": writer_config.storage})
    return reader_config


def _reuse_checker(writer_config: WriterConfig, storage: Storage | None):
    def check(name: str, path: Path | str) -> str | None:
        try:
            handle = CacheHandle.open(path, storage)
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
