"""`CachedDataset`: a deterministic view over caches, and the sampling state its iterators share.

Boundary: orchestration of format (open caches), table (`tables.py`), sampling (`orders`,
`populations`) and the reads (`reads.py`: in-process or through a runtime's reader processes);
no byte layouts, slot layouts, processes or record assembly of its own. torch is reached only
through the three `to_torch_*` methods' lazy forwarding into `integrations/torch`, which sees a
dataset only through its integration seam (`seam.DatasetSeam`).

The state, read and moved under the dataset's lock: `cursor` (ordered mode: the next population
row), `draw_offset` (shuffled mode: dataset-rt's draw index, or the plan position of an
exactly-once order, a mixture or a curriculum), both reserved at an iterator's first `next()`,
`epoch_len` (None = the population's epoch), the population and the active frame. Every window
is built by `_window`, the one place that asks `sampling.orders` for an order.

Size: over 500 lines because it is the public API surface of dataset-rt's `CachedDataset` (each
public method with its docstring and argument checks); the work behind them lives in `reads.py`,
`tables.py`, `stages.py`, `remote.py`, `packing.py`, `torch_methods.py` (the `to_torch_*` methods) and
`sampling/`.
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from datasetrt.dataset import remote
from datasetrt.dataset.reads import DatasetReads, ReadRuntime
from datasetrt.dataset.seam import CacheIdentity, CursorState
from datasetrt.dataset.stages import StageReads, curriculum_plan, stage_of
from datasetrt.dataset.tables import DatasetTables
from datasetrt.dataset.torch_methods import TorchConversions
from datasetrt.errors import (
    ArgumentOverflowError,
    ArgumentTypeError,
    CacheFormatError,
    ConfigError,
    LoaderStateError,
    SampleIndexError,
)
from datasetrt.format.layout import U64_MAX
from datasetrt.format.reader import CacheHandle, common_payload_spec
from datasetrt.format.remote import Storage
from datasetrt.format.results import Err, Ok
from datasetrt.runtime.memory import collector_paused, default_memory_limit_bytes, return_freed_heap
from datasetrt.runtime.sample_batch import SampleBatch
from datasetrt.sampling import orders, populations
from datasetrt.sampling.curriculum import Curriculum, CurriculumPlan, StageInfo
from datasetrt.sampling.mixture import Mixture
from datasetrt.sampling.planner import ActiveRows, PlanWindow, Population, Window, advance
from datasetrt.sampling.populations import PopulationExport
from datasetrt.sampling.ranks import RankSplit
from datasetrt.storage.urls import parse_location
from datasetrt.table.catalog import CacheCatalog
from datasetrt.values.config import PayloadSpec, ReaderConfig
from datasetrt.values.records import CachedSample

if TYPE_CHECKING:
    import polars as pl

    from datasetrt.dataset.packing import PackedBatches


def _check_seed(seed: Any) -> int:
    if type(seed) is bool or not isinstance(seed, int):
        raise ArgumentTypeError(f"seed must be an integer, got {type(seed).__name__}")
    if seed < 0:
        raise ArgumentOverflowError(f"can't convert negative int to unsigned (seed={seed})")
    if seed > U64_MAX:
        raise ArgumentOverflowError(f"int too big to convert (seed={seed} is not a u64)")
    return seed


_DATASETS: weakref.WeakSet[CachedDataset] = weakref.WeakSet()  # every open dataset


def _fresh_locks_after_fork() -> None:
    """A forked child gives every dataset a new lock: one held by another parent thread at the
    fork would never be released here (torch DataLoader workers read their inherited dataset)."""
    for ds in list(_DATASETS):
        ds._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def _check_paths(paths: Any) -> list[Path | str]:
    """The cache paths as given: local directories as `Path`s, object-store URLs as their
    canonical URL strings (never through `Path`, which would mangle `s3://` into `s3:/`)."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ArgumentTypeError("paths must be a sequence of cache directories, not a single path")
    try:
        items = list(paths)
    except TypeError:
        raise ArgumentTypeError(f"paths must be a sequence of cache directories, got {type(paths).__name__}") from None
    if not items:
        raise ConfigError("CachedDataset requires at least one cache path")
    out: list[Path | str] = []
    for item in items:
        location = parse_location(item)
        out.append(location if isinstance(location, Path) else location.url)
    return out


class CachedDataset(TorchConversions):
    """A deterministic view over one or more caches.

    Opening reads manifests and stats files only (validate_cache=True adds the deep checks). The
    metadata table is decoded on first use. Iterators snapshot the population and reserve their
    window at the first `next()`; concurrent iterators are independent.
    """

    def __init__(
        self, paths: Sequence[str | os.PathLike], *, reader_config: ReaderConfig, runtime: ReadRuntime | None = None
    ) -> None:
        if not isinstance(reader_config, ReaderConfig):
            raise ArgumentTypeError(f"reader_config must be a ReaderConfig, got {type(reader_config).__name__}")
        self.cache_paths: list[Path | str] = _check_paths(paths)
        self.reader_config = reader_config
        self._seed = _check_seed(reader_config.seed)
        storage = Storage.of(reader_config.storage) if any(isinstance(p, str) for p in self.cache_paths) else None
        # Decoding metadata.arrow is bounded by the reader's memory limit (format/reader.py).
        limit = reader_config.memory_limit_bytes or default_memory_limit_bytes()
        parents: dict[str, str] = {}  # resolved parent directories, shared by this open's caches
        with collector_paused():  # O(caches) long-lived objects, no garbage: no full collections
            self._handles = [
                CacheHandle.open(
                    p,
                    storage,
                    external_links=reader_config.allow_external_links,
                    memory_limit_bytes=limit,
                    parents=parents,
                )
                for p in self.cache_paths
            ]
        if reader_config.validate_cache:
            for handle in self._handles:
                handle.validate_deep()
        schema = self._handles[0].manifest.metadata_schema
        for handle in self._handles[1:]:
            if handle.manifest.metadata_schema != schema:
                raise CacheFormatError(
                    f"all caches must share the same metadata schema: {handle.source} differs from {self._handles[0].source}"
                )
        remote.check_disk_bound(self._handles, reader_config)
        self._payload_spec = common_payload_spec(self._handles)
        ids = [h.manifest.cache_id if h.manifest.cache_id is not None else k for k, h in enumerate(self._handles)]
        self._catalog = CacheCatalog(ids, [h.sample_count for h in self._handles], [h.source for h in self._handles])
        self._tables = DatasetTables(self._catalog, schema, self._handles)
        self._reads = DatasetReads(self._handles, self._catalog.cache_ids, reader_config, self._payload_spec, runtime)
        self._ordering = orders.Ordering(reader_config.sampling, reader_config.window_shards, self._reads.row_shards)
        self._population = Population(self._catalog)
        self._active_frame: pl.DataFrame | None = None
        self._epoch_len: int | None = None
        self._cursor = 0
        self._draw_offset = 0
        self._stages = StageReads()  # a curriculum's live read, advance() and resume state
        self._lock = threading.Lock()  # replaced in a forked child (_fresh_locks_after_fork)
        _DATASETS.add(self)

    @property
    def payload_spec(self) -> PayloadSpec | None:
        """The caches' common `PayloadSpec` (typed payloads), or None when they are untyped."""
        return self._payload_spec

    @property
    def reads_with_workers(self) -> bool:
        """Whether batches are read by a `DatasetRuntime`'s reader processes (`parallel_reads`)."""
        return self._reads.with_workers

    # -- size and windows ---------------------------------------------------------------------

    def __len__(self) -> int:
        if self._epoch_len is not None:
            return self._epoch_len
        cfg = self.reader_config
        return orders.epoch_positions(self._population, shuffle=cfg.shuffle, seed=self._seed, ordering=self._ordering)

    def set_epoch_len(self, epoch_len: int) -> None:
        """Length of future iterators' windows; the population is unchanged."""
        if type(epoch_len) is bool:
            epoch_len = int(epoch_len)
        if not isinstance(epoch_len, int):
            raise ArgumentTypeError(f"epoch_len must be an integer, got {type(epoch_len).__name__}")
        if epoch_len < 1:
            raise ConfigError("epoch_len must be at least 1")
        if epoch_len > sys.maxsize:
            raise ArgumentOverflowError(
                f"int too big to convert (epoch_len must be <= {sys.maxsize}, as len() requires)"
            )
        self._epoch_len = epoch_len

    def _window(
        self,
        population: Population,
        start: int,
        length: int,
        shuffle: bool | None = None,
        seed: int | None = None,
        ranks: RankSplit | None = None,
    ) -> Window | PlanWindow:
        """The one place a window is built: `length` positions of the dataset's order over
        `population` from dataset position `start` (`sampling.orders.window`)."""
        return orders.window(
            population,
            start,
            length,
            shuffle=self.reader_config.shuffle if shuffle is None else shuffle,
            seed=self._seed if seed is None else seed,
            ordering=self._ordering,
            ranks=ranks,
        )

    def _plan(self, population: Population) -> Any:
        """The position plan of the dataset's shuffled windows over `population` (None: dataset-rt's draws)."""
        return orders.position_plan(population, self._seed, self._ordering)

    def _next_window(self) -> Window | PlanWindow:
        """The window at the cursor (ordered) or draw offset (shuffled); call under the lock. A
        window of a plan that ends (on_exhausted="stop") stops at its end."""
        start = self._draw_offset if self.reader_config.shuffle else self._cursor
        window = self._window(self._population, start, len(self))
        end = getattr(getattr(window, "plan", None), "length", None)  # None: unbounded (or no plan)
        if end is not None and window.length > end - start:
            window = window.sub(0, max(0, end - start))
        return self._stages.cut(window)  # the rest of a loaded state's window comes first

    # -- integration seam (docs/python-api.md, "Integration seam"; `seam.DatasetSeam`): how an
    # integration divides this dataset's windows among its own processes. A window is anything
    # with `population` (opaque), `start` (a dataset position), `length`, `rows(first, count)`
    # and `sub(first, count)` (a planner `Window` or a `PlanWindow`); integrations cut windows
    # with `sub` and never compute dataset positions themselves.

    def peek_window(self) -> Window | PlanWindow:
        """The window `iter(self)` would reserve next, not reserved (nothing moves)."""
        with self._lock:
            return self._next_window()

    def reserve_window(self) -> Window | PlanWindow:
        """Reserve the next window, as an iterator does at its first `next()`."""
        with self._lock:
            window = self._next_window()
            n_rows = len(window.population)
            if window.shuffle:
                self._draw_offset = advance(True, window.start, window.length, n_rows)
            else:
                self._cursor = advance(False, window.start, window.length, n_rows)
            self._stages.resume_end = None
            return window

    def plan_window(
        self,
        start: int,
        length: int,
        *,
        population: Population | None = None,
        shuffle: bool | None = None,
        seed: int | None = None,
        rank_layout: tuple[int, int, bool] | None = None,
    ) -> Window | PlanWindow:
        """`length` positions of the dataset's order from dataset position `start` over
        `population` (default: the current one); `shuffle`/`seed` override the reader config's (a
        loader's own stream). `rank_layout` = (world_size, batch_size, drop_last): how ranks will
        read the window (steps of world_size batches, rank r reading batch r of each); a
        locality-aware order then plans each epoch-long window so that each rank reads its own
        shards (docs/sampling.md, "Ranks"); other orders ignore it. Reserves nothing; computes
        the plan's tables (the weighted sampler's running sums, an exactly-once order's, a
        mixture's or a curriculum's plan) now, once per population, so processes forked
        afterwards share them."""
        population = self._population if population is None else population
        ranks = None if rank_layout is None else RankSplit(*rank_layout)
        window = self._window(population, start, length, shuffle, seed, ranks)
        if window.shuffle and population.weighted and len(population):
            population.cumulative()
        return window

    def population_rows(
        self, population: Population | None = None, *, expand_physical: bool = False
    ) -> ActiveRows | None:
        """`population`'s (default: the current one's) rows: cache_pos (int32 or int64), sample_id uint64,
        weights float64, in table order. The physical population is None, or with
        `expand_physical` every physical sample with weight 1.0."""
        population = self._population if population is None else population
        return population.rows() if expand_physical else population.active

    def population_from_rows(
        self,
        cache_pos: np.ndarray,
        sample_id: np.ndarray,
        weights: np.ndarray,
        *,
        source: Population | None = None,
        selection: np.ndarray | None = None,
    ) -> Population:
        """A population of these rows (e.g. a selection of `population_rows()`: trusted), for
        `plan_window` (`sampling.populations.from_rows`: `source` and `selection` keep its
        mixture or curriculum)."""
        return populations.from_rows(self._catalog, cache_pos, sample_id, weights, source=source, selection=selection)

    def export_population(self, population: Population) -> PopulationExport | None:
        """`population` as `import_population` rebuilds it in another process (None: nothing to ship)."""
        return populations.export_population(population, self.reader_config.sampling)

    def import_population(self, export: PopulationExport | None) -> Population:
        """The population `export_population` exported (its arrays used as they are)."""
        return populations.import_population(self._catalog, export)

    def order_identity(self, population: Population | None = None) -> str:
        """What orders `population`'s (default: the current one's) shuffled windows, for resume
        states (`sampling.orders.order_identity`)."""
        return orders.order_identity(self._population if population is None else population, self._ordering)

    def read_window(
        self,
        window: Window | PlanWindow,
        transform: Callable[[CachedSample], Any] | None = None,
        *,
        in_process: bool = False,
        check_embedded: bool | None = None,
    ) -> Iterator[Any]:
        """The samples of `window` (or of a share of one) in window order, each passed through
        `transform`: read as `iter(self)` reads (the runtime's workers if the dataset has them),
        or with `in_process` by this thread's reader here (code that is itself a worker process).
        `check_embedded` overrides validate_cache's check of embedded metadata."""
        return self._reads.samples(window, transform, in_process=in_process, check_embedded=check_embedded)

    def read_window_batches(
        self,
        window: Window | PlanWindow,
        batch_size: int,
        *,
        with_metadata: bool = True,
        in_process: bool = False,
        check_embedded: bool | None = None,
        buffers: Any = None,
    ) -> Iterator[SampleBatch]:
        """`window` (or a share of one) as `SampleBatch`es of `batch_size` consecutive positions
        (the last one shorter), read as `iter_batches` reads (leased ring slots of the runtime's
        workers, if the dataset has them), or with `in_process` by this thread's reader here.
        `buffers` (in-process only): an object whose `take(nbytes)` returns a writable C-contiguous
        uint8 numpy array of at least `nbytes` (e.g. a view of shared memory) that each batch is
        gathered into in its final layout; default: recycled private buffers. `check_embedded` as
        in `read_window`. Nothing is read before the first `next()`."""
        if type(batch_size) is not int or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if buffers is not None and not in_process:
            raise ConfigError("read_window_batches: buffers= needs in_process=True (ring slots are the runtime's)")
        return self._reads.batches(
            window,
            batch_size,
            False,
            self._tables.arrow if with_metadata else None,
            self._reads.builder(check_embedded),
            in_process,
            buffers,
        )

    def sample_columns(self, cache_id: np.ndarray, sample_id: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
        """Columns `names` of the caches' own metadata tables (metadata.arrow) for the samples
        (cache_id, sample_id) (uint64 arrays of one length n, ids this dataset holds): numeric
        and boolean columns as numpy arrays, others as object arrays, each of n entries.
        ConfigError naming a missing column. O(n) after the table's first decode."""
        return self._tables.sample_columns(cache_id, sample_id, names)

    def cursor_state(self) -> CursorState:
        """Cursor, draw offset, epoch length and their population, read together under the lock."""
        with self._lock:
            return CursorState(self._cursor, self._draw_offset, self._epoch_len, self._population)

    def cursor_state_from(self, values: Mapping[str, Any]) -> CursorState:
        """A saved `CursorState.as_dict()` checked against the current population (`ConfigError`)."""
        population = self._population
        cursor, draw_offset, epoch_len = CursorState.values_from(values)
        state = CursorState(cursor, draw_offset, epoch_len, population)
        if not state.valid_for(len(population)):
            raise ConfigError(f"invalid cursor state {state.as_dict()!r} for a population of {len(population)} rows")
        return state

    def restore_cursor_state(self, state: CursorState) -> None:
        """Make a checked `state` the dataset's cursor, under its lock (`LoaderStateError` if the
        population changed since it was checked)."""
        with self._lock:
            if state.population is not self._population:
                raise LoaderStateError("the dataset's table changed while its cursor state was restored")
            self._cursor, self._draw_offset, self._epoch_len = state.cursor, state.draw_offset, state.epoch_len

    def cache_identity(self) -> CacheIdentity:
        """The caches' logical and physical identity (computed once). A cache at a URL is named by
        its URL, so a process that reopens it goes through its own node cache, as this one did."""
        caches = self._reads.worker_caches
        where = tuple(h.source if h.remote is not None else d for h, d in zip(self._handles, caches.cache_dirs))
        return CacheIdentity(self._catalog.cache_ids, self._catalog.counts, where, caches.key)

    # -- reading ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[CachedSample]:
        return self._iterate()

    def _iterate(self) -> Iterator[CachedSample]:
        yield from self._stages.reads(self.reserve_window(), self.read_window, False)

    def iter_batches(
        self, batch_size: int, *, drop_last: bool = False, with_metadata: bool = True
    ) -> Iterator[SampleBatch]:
        """Iterate one window (len(self) samples, same order as `iter(self)`) as `SampleBatch`es
        of `batch_size` (the last one shorter unless drop_last). Reserves its window at the
        first next(), like __iter__. No Python object is created per sample.
        """
        if type(batch_size) is not int or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        return self._iterate_batches(batch_size, drop_last, with_metadata)

    def _iterate_batches(self, batch_size: int, drop_last: bool, with_metadata: bool) -> Iterator[SampleBatch]:
        read = functools.partial(
            self._reads.batches,
            batch_size=batch_size,
            drop_last=drop_last,
            table_of=self._tables.arrow if with_metadata else None,
            builder=self._reads.sample_builder,
        )
        yield from self._stages.reads(self.reserve_window(), read, True)

    def iter_packed(
        self,
        rows: int,
        row_len: int,
        *,
        mode: str = "split",
        overlong: str = "split",
        pad: Any = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        read_size: int = 256,
        in_process: bool = False,
    ) -> PackedBatches:
        """One window (the order `iter_batches` reads) of 1-D token documents packed into batches
        of `rows` rows of `row_len` tokens (`PackedRows`: tokens, segment_ids, positions,
        cu_seqlens), "split" (concatenate and chunk) or "whole" (first-fit); each rank of
        `world_size` packs its own share. Exact resume with `state_dict()` / `load_state_dict()`
        (docs/packing.md)."""
        from datasetrt.dataset.packing import PackedBatches

        return PackedBatches(
            self,
            rows,
            row_len,
            mode=mode,
            overlong=overlong,
            pad=pad,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            read_size=read_size,
            in_process=in_process,
        )

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
        return self._reads.sample(pos, sample_id)

    # -- random access in the active table's order (docs/python-api.md, "Random access") ----------

    @overload
    def __getitem__(self, index: int) -> CachedSample: ...
    @overload
    def __getitem__(self, index: slice) -> list[CachedSample]: ...
    def __getitem__(self, index: int | slice) -> CachedSample | list[CachedSample]:
        """Row `index` of the active table, in its order (`get_metadata()`'s rows: every sample of
        the caches in path order until `update_metadata`; a duplicated row is two rows), with
        Python's indexing: -1 is the last row, and an index outside [-rows, rows) raises
        `SampleIndexError` (an IndexError) naming it and the row count. A slice gives a list of
        its rows in slice order. Read in this process, through this thread's reader; ignores the
        sampling order, weights and `len()` (the epoch length); moves no cursor. O(k) for k rows."""
        population = self._population
        rows = len(population)
        if isinstance(index, slice):
            return list(self.read_rows(np.arange(*index.indices(rows), dtype=np.int64), population=population))
        if isinstance(index, bool):
            raise ArgumentTypeError(f"dataset indices must be integers or slices, not {type(index).__name__}")
        try:
            i = operator.index(index)
        except TypeError:
            raise ArgumentTypeError(f"dataset indices must be integers or slices, not {type(index).__name__}") from None
        if not -rows <= i < rows:
            raise SampleIndexError(f"row {i} is out of range for the active table's {rows} rows")
        [sample] = self.read_rows(np.array([i % rows], dtype=np.int64), population=population)
        return sample

    def read_rows(
        self,
        rows: np.ndarray,
        transform: Callable[[CachedSample], Any] | None = None,
        *,
        population: Population | None = None,
        check_embedded: bool | None = None,
    ) -> Iterator[Any]:
        """The samples of `population`'s (default: the current one's) rows `rows` (int64 indexes
        into its rows, each in range: the caller checks), in that order, each through `transform`,
        read in this process by this thread's reader (the integration seam's random access).
        `check_embedded` as in `read_window`."""
        population = self._population if population is None else population
        picked = _Rows(population, np.ascontiguousarray(rows, dtype=np.int64))
        return self._reads.samples(picked, transform, in_process=True, check_embedded=check_embedded)

    def _max_record_bytes(self) -> int:
        """Record size the worker ring is planned for (`runtime.run.planned_record_bytes`, cached)."""
        return self._reads.max_record_bytes

    # -- metadata table -----------------------------------------------------------------------

    def get_metadata(self) -> pl.DataFrame:
        """The active table as last supplied, or the physical table (decoded on first use)."""
        if self._active_frame is not None:
            return self._active_frame
        return self._tables.physical()

    samples_metadata = get_metadata

    def update_metadata(self, df: pl.DataFrame) -> None:
        """Validate and activate a new population; resets len() to its row count and both cursors.

        On any error the previous table stays active. Started iterators keep their snapshot.
        """
        with self._lock:
            # Validation needs only the catalog: the physical table is not held through it (it is
            # decoded again if the physical population or get_metadata() needs it after a refusal).
            self._tables.release_physical()
        active = self._tables.validated(df)
        population = self._ordered(Population(self._catalog, active, table=df), self._order)
        with self._lock:
            self._population = population
            self._active_frame = df
            self._epoch_len = None
            self._cursor = 0
            self._draw_offset = 0
        del active, population  # held by the dataset now; what validation freed goes back to the kernel
        return_freed_heap()

    set_samples_metadata = update_metadata

    # -- sampling orders (docs/sampling.md) ----------------------------------------------------

    @property
    def _order(self) -> Mixture | Curriculum | None:
        """The stream order set on the population: `_set_order` only ever sets a Mixture, a
        Curriculum or None."""
        order = self._population.order
        return order if isinstance(order, (Mixture, Curriculum)) else None

    @property
    def mixture(self) -> Mixture | None:
        """The mixture set by `set_mixture` (None: none is set)."""
        order = self._order
        return order if isinstance(order, Mixture) else None

    @property
    def curriculum(self) -> Curriculum | None:
        """The curriculum set by `set_curriculum` (None: none is set)."""
        order = self._order
        return order if isinstance(order, Curriculum) else None

    def set_mixture(self, mixture: Mixture | None) -> None:
        """Read the active rows as `mixture`'s streams (docs/sampling.md, "Reading a dataset"),
        or with None in the reader config's order again. The streams are grouped from the active
        table now, once (and again by each `update_metadata`, which keeps the mixture); the plan
        is seeded with the reader config's seed. Replaces a curriculum. Resets len() and the
        positions, as `update_metadata` does. Needs shuffle=True. On any error
        (`SamplingConfigError`, `UnknownStreamError`, `EmptyStreamError`, `RepeatCountError`)
        nothing changes."""
        self._set_order(mixture, Mixture, "set_mixture")

    def set_curriculum(self, curriculum: Curriculum | None) -> None:
        """Read the active rows as `curriculum`'s stages (docs/sampling.md, "Reading a dataset"):
        stages change at the curriculum's sample counts from plan position 0, or earlier by
        `advance()`; otherwise as `set_mixture` (replaces a mixture)."""
        self._set_order(curriculum, Curriculum, "set_curriculum")

    def _set_order(self, order: Mixture | Curriculum | None, kind: type, method: str) -> None:
        if order is not None and not isinstance(order, kind):
            raise ArgumentTypeError(f"{method} expects a datasetrt.{kind.__name__} or None, got {type(order).__name__}")
        if order is not None and not self.reader_config.shuffle:
            raise ConfigError(
                f"a {kind.__name__.lower()} is a shuffled order: {method} needs ReaderConfig(shuffle=True)"
            )
        population = self._ordered(self._population.with_order(None, None), order)
        if order is not None and self.reader_config.sampling == "locality":
            # each stream holds its own locality window on the node: refused before anything changes
            streams = remote.locality_streams(self._plan(population))
            remote.check_disk_bound(self._handles, self.reader_config, streams=streams)
        with self._lock:
            self._population = population
            self._epoch_len = None
            self._cursor = 0
            self._draw_offset = 0
        del population
        return_freed_heap()  # what grouping the streams and planning freed

    def _ordered(self, population: Population, order: Mixture | Curriculum | None) -> Population:
        """`population` with `order`'s streams grouped from its table (Polars, once), and its
        plan under the dataset's seed built now, so that a bad table or configuration is refused
        before anything changes (repeat counts of an exactly-once order included)."""
        if order is not None:
            population = self._tables.grouped(population, order, self.cache_paths)
        if self.reader_config.shuffle:
            self._plan(population)
        return population

    # -- a curriculum's reads (stages.py; docs/sampling.md, "Advancing a curriculum") ---------

    @property
    def read_position(self) -> int | None:
        """Plan position of the next sample this dataset's iterator hands out (between iterators:
        where the next one starts); None without a curriculum."""
        with self._lock:
            plan = self._curriculum_plan(None)
            return None if plan is None else self._stages.position(plan, self._draw_offset)

    def stage_at(self, position: int) -> StageInfo | None:
        """The curriculum stage (index, name) of plan position `position`; None without one."""
        return stage_of(self._curriculum_plan(None), position)

    @property
    def stage(self) -> StageInfo | None:
        """The stage of the next sample read (`stage_at(read_position)`): the one `advance()` ends."""
        position = self.read_position
        return None if position is None else self.stage_at(position)

    def advance(self) -> int:
        """End the current stage at the first batch boundary at or after `read_position` (for the
        iterator reading now too); returns where the next stage starts. `SamplingStateError` on
        the last stage or without a curriculum (nothing changes)."""
        with self._lock:
            return self._stages.advance(self._curriculum_plan("advance()"), self._draw_offset)

    def state_dict(self) -> dict:
        """The curriculum read's resume state at `read_position` (plain values; docs/sampling.md)."""
        with self._lock:
            plan = self._curriculum_plan("state_dict()")
            return self._stages.state(plan, self._draw_offset, self._epoch_len, self.order_identity())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` (the same curriculum and table set): the next iterator reads the
        rest of the state's window. `SamplingStateError` on a mismatch; nothing changes on error."""
        with self._lock:
            plan = self._curriculum_plan("load_state_dict()")
            self._draw_offset, self._epoch_len = self._stages.load(plan, state, self.order_identity())

    def hold_stages(self, owner: object) -> None:
        """Integration seam: `owner` reads the curriculum in copies `advance()` cannot reach."""
        self._stages.hold(owner)

    @overload
    def _curriculum_plan(self, method: str) -> CurriculumPlan: ...
    @overload
    def _curriculum_plan(self, method: None) -> CurriculumPlan | None: ...
    def _curriculum_plan(self, method: str | None) -> CurriculumPlan | None:
        """The population's curriculum plan; without a curriculum None, or with `method`
        SamplingStateError naming it (`stages.curriculum_plan`)."""
        return curriculum_plan(self._plan(self._population), method)

    # -- manifests ----------------------------------------------------------------------------

    def update_manifests(self, version: Any) -> Ok | Err:
        """Migrate v2 manifests to v3 (cache_id = position in paths), atomically per manifest
        (datasetrt/format/migrate.py). A cache in object storage is refused (Err naming it): its
        node-local copy is not the cache, and a published manifest is never replaced in place."""
        from datasetrt.format.migrate import update_manifests
        from datasetrt.format.results import AbsentManifestTarget, Err, ManifestUpdateError

        for h in self._handles:
            if h.remote is not None:
                return Err(
                    ManifestUpdateError(
                        AbsentManifestTarget(h.source),
                        f"{h.source}: manifests of caches in object storage are not migrated in place; "
                        "migrate a local copy and write it to a new prefix",
                    )
                )
        return update_manifests([h.path for h in self._handles], self._catalog.cache_ids.tolist(), version)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close this thread's shard descriptors now (they are also closed on garbage collection)."""
        self._reads.close()

    def __enter__(self) -> CachedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'CachedDataset' object: pass cache paths and a ReaderConfig instead")

    def __repr__(self) -> str:
        return f"CachedDataset(caches={len(self._handles)}, rows={len(self._population)}, len={len(self)})"

    # -- PyTorch (datasetrt/integrations/torch/, imported here lazily: the core never imports torch)


@dataclass(frozen=True)
class _Rows:
    """Given rows of a population as the readers take a window: `length` positions whose rows are
    `picked` (int64 indexes into `population`'s rows), in order."""

    population: Population
    picked: np.ndarray

    @property
    def length(self) -> int:
        return len(self.picked)

    def rows(self, first: int, count: int) -> np.ndarray:
        return self.picked[first : first + count]
