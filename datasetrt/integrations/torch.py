"""PyTorch integration: a sized `IterableDataset` over a `CachedDataset`, and a `DataLoader`
factory with dataset-rt 0.4.8's arguments, real `num_workers` (fork and spawn) and exact resume.

Boundary: imported lazily by `CachedDataset.to_torch_*` (the core never imports torch). It uses
the dataset's population, chunks and `SampleBuilder` (the one records -> samples path,
runtime/samples.py) and, inside torch workers, the in-process reader (`runtime.local`), the
population snapshot (`runtime.snapshot`) and the pure planner; it knows no byte layouts. The
multiprocess runtime is never used inside torch workers: torch's workers are the processes.

One plan per pass: a pass reads one planner `Window` (a pure function of population, shuffle,
seed, start and length). With K torch workers, worker w reads plan blocks w, w+K, w+2K, ... of
`block_rows` positions (`_Share`), in its own process with its own `LocalReader`. Torch gathers
worker batches round-robin, so with block_rows == batch_size the batches come out in plan order,
whatever K is; the union over workers is the plan, each planned sample once.

Ranks (`to_torch_dataloader` under torchrun / torch.distributed): every rank builds the same
global plan (the single-rank plan: same seed, same windows) and reads its `_Layout` of each pass:
steps of world_size batches, rank r taking batch r of each step, the short last step split
evenly, padding wrapped to the start of the pass (dataset-rt's per-rank counts and warning,
reference §3.3). After s batches on every rank the ranks have consumed a prefix of the pass, so
a state resumes on any world size and worker count. Docs: docs/distributed.md.

What crosses to a spawned worker (`__reduce__`): cache directories, the reader config, the dataset
key (refuses caches changed since), a path to an Arrow IPC snapshot of the population (cache_pos,
sample_id, cum; written once per population into a temp dir the wrapper owns and removes when it
is garbage collected) and a few integers. Forked workers use the inherited objects directly.
Docs: docs/pytorch.md.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pickle
import secrets
import shutil
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import torch.distributed as torch_distributed
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised with torch hidden
    from datasetrt.errors import MissingExtraError

    raise MissingExtraError(
        "CachedDataset.to_torch_iterable_dataset requires PyTorch to be installed "
        "(so do CachedDataset.to_torch_dataloader and datasetrt.integrations.torch): "
        "pip install 'datasetrt[torch]'"
    ) from exc

from datasetrt._native.draws import derive_seed
from datasetrt.config import ReaderConfig
from datasetrt.errors import ArgumentTypeError, CacheFormatError, ConfigError, LoaderStateError
from datasetrt.records import CachedSample
from datasetrt.runtime.local import READ_BLOCK_ROWS, local_chunks
from datasetrt.runtime.samples import SampleBuilder
from datasetrt.runtime.snapshot import read_snapshot, write_snapshot
from datasetrt.sampling.planner import ActiveRows, Population, Window, advance

if TYPE_CHECKING:
    # Not imported at run time: datasets arrive as arguments, and a spawned worker reopens its
    # dataset with the class recorded in its `_Recipe` (datasetrt.dataset imports this module).
    from datasetrt.dataset import CachedDataset

LOGGER_NAME = "datasetrt.loader"
MAX_SAMPLE_BUDGET = min(sys.maxsize, 1 << 53)  # torch computes len(loader) through float division
STATE_KIND = "datasetrt.torch.DataLoader"
ITER_STATE_KIND = "datasetrt.torch.IterableDataset"
ITER_STATE_VERSION = 1
STATE_VERSION = 2  # DataLoader states; version 1 (single rank, no `rows`) is still accepted


# --------------------------------------------------------------------------------------------
# plan shares and worker-side reading


def rank_count(rows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Rows each rank reads out of `rows` global rows (reference §3.3): ceil(rows/R), or
    B*floor(rows/(R*B)) with drop_last; 0 when rows <= 0."""
    if rows <= 0:
        return 0
    if drop_last:
        return batch_size * (rows // (world_size * batch_size))
    return -(-rows // world_size)


@dataclass(frozen=True)
class RankShare:
    """dataset-rt's per-rank arithmetic for `requested` global samples per pass (reference §3.3)."""

    requested: int
    world_size: int
    per_rank: int
    effective: int  # per_rank * world_size
    padded: int  # effective - requested when positive (rows read twice)
    discarded: int  # requested - effective when positive (drop_last)

    @property
    def message(self) -> str | None:
        """dataset-rt's rank-0 UserWarning text, or None when nothing is adjusted."""
        if self.effective == self.requested:
            return None
        word, k = ("padded", self.padded) if self.padded else ("discarded", self.discarded)
        return (f"samples_per_epoch adjusted: requested {self.requested} global samples, effective "
                f"{self.effective}; {word} {k} for equal rank batch counts")


def rank_share(requested: int, world_size: int, batch_size: int, drop_last: bool) -> RankShare:
    per_rank = rank_count(requested, world_size, batch_size, drop_last)
    effective = per_rank * world_size
    return RankShare(requested, world_size, per_rank, effective, max(0, effective - requested),
                     max(0, requested - effective))


@dataclass(frozen=True)
class _Layout:
    """Rank `rank` of `world`'s rows of one pass of `total` plan positions, from position `start`
    (rows the ranks already consumed together) on, in this rank's order.

    The remaining positions [start, total) are cut into steps of `world` batches: rank r reads
    batch r of every full step, then its slice of `tail` rows of the last, short step; positions
    past `total` (padding) wrap to the start of the pass. Each rank reads `per_rank` rows
    (`rank_count` of the remaining rows), so all ranks have the same batch count; after s
    batches on every rank, the consumed positions are exactly [start, start + s*world*batch),
    a prefix of the pass (resume with another world size continues from there).
    """

    total: int
    start: int
    batch: int
    drop_last: bool
    rank: int = 0
    world: int = 1

    @property
    def per_rank(self) -> int:
        return rank_count(self.total - self.start, self.world, self.batch, self.drop_last)

    @property
    def batches(self) -> int:
        return -(-self.per_rank // self.batch)

    def positions(self, j: np.ndarray) -> np.ndarray:
        """Pass positions (int64) of this rank's rows j (0 <= j < per_rank)."""
        b, world = self.batch, self.world
        full, tail = divmod(self.per_rank, b)
        q, o = np.divmod(j, b)
        p = np.where(q < full, (q * world + self.rank) * b + o, full * world * b + self.rank * tail + o)
        return (self.start + p) % self.total


SPAN_CALL_ROWS = 64  # a plan call costs about as much as computing this many extra draws


def _window_rows(window: Window, pos: np.ndarray) -> np.ndarray:
    """Population rows of window positions `pos` (any order): one plan call over their span, or
    one per contiguous run when that computes far fewer draws."""
    n = len(pos)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    if len(breaks) == 0:
        return window.rows(int(pos[0]), n)
    lo, hi = int(pos.min()), int(pos.max())
    if (len(breaks) + 1) * SPAN_CALL_ROWS + n >= hi + 1 - lo:
        return window.rows(lo, hi + 1 - lo)[pos - lo]
    return np.concatenate([window.rows(int(run[0]), len(run)) for run in np.split(pos, breaks)])


class _Share:
    """Worker `worker` of `workers`' part of a rank's `layout` of `window`, as a window-like object
    for `local_chunks`: the rank's batches worker, worker + workers, ... (of `layout.batch` rows),
    in order. Torch gathers worker batches round-robin, so the rank's batches come out in layout
    order for any worker count; the rank's first remaining batch always goes to worker 0.
    Without `layout`: a single rank's blocks of `block_rows` from block `first_block` on.
    """

    def __init__(self, window: Window, worker: int = 0, workers: int = 1, block_rows: int = 1, first_block: int = 0,
                 *, layout: _Layout | None = None) -> None:
        if layout is None:
            layout = _Layout(window.length, min(first_block * block_rows, window.length), block_rows, False)
        self.window = window
        self.population = window.population
        self.layout = layout
        self.worker, self.workers = worker, workers
        b, count, batches = layout.batch, layout.per_rank, layout.batches
        blocks = 0 if worker >= batches else (batches - 1 - worker) // workers + 1
        if blocks == 0:
            self.length = 0
        else:
            last = worker + (blocks - 1) * workers
            self.length = (blocks - 1) * b + min(b, count - last * b)

    def positions(self, first: int, count: int) -> np.ndarray:
        """Window positions of share positions [first, first+count)."""
        b = self.layout.batch
        q, o = np.divmod(np.arange(first, first + count, dtype=np.int64), b)
        return self.layout.positions((self.worker + q * self.workers) * b + o)

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows of share positions [first, first+count)."""
        return _window_rows(self.window, self.positions(first, count))

    def windows(self) -> Iterator[Window]:
        """The share as contiguous sub-windows, in order (for reading through a runtime)."""
        w, b = self.window, self.layout.batch
        for first in range(0, self.length, b):
            pos = self.positions(first, min(b, self.length - first))
            for run in np.split(pos, np.flatnonzero(np.diff(pos) != 1) + 1):
                start = advance(w.shuffle, w.start, int(run[0]), len(w.population))
                yield Window(w.population, w.shuffle, w.seed, start, len(run))


def _read_share(ds: CachedDataset, samples: SampleBuilder, share: _Share, transform: Callable | None) -> Iterator[Any]:
    """Read `share` in this process (its own LocalReader), as `samples` builds them, transformed."""
    if share.length == 0:
        return iter(())
    return samples.samples(local_chunks(ds._reader(), share, READ_BLOCK_ROWS), transform)


@dataclass(frozen=True)
class _Recipe:
    """Everything a spawned worker needs to rebuild the reading side; small and picklable."""

    dataset_class: type  # the CachedDataset (sub)class to reopen the caches with
    cache_dirs: tuple[str, ...]
    reader_config: dict
    dataset_key: str
    snapshot: str | None  # Arrow IPC population snapshot; None = the physical population
    scale: float
    rows: int
    shuffle: bool
    seed: int
    start: int  # window start of pass 0 (draw index or cursor)
    length: int  # samples per pass
    block_rows: int


class _PlanReader:
    """The reading side in one process: a CachedDataset (read in-process), the plan population,
    and the SampleBuilder that turns its chunks into samples."""

    def __init__(self, ds: CachedDataset, population: Population, samples: SampleBuilder, mapping: Any = None) -> None:
        self.pid = os.getpid()
        self.ds = ds
        self.population = population
        self.samples = samples
        self._mapping = mapping  # keeps the snapshot's memory map alive while the arrays are used

    @classmethod
    def open(cls, recipe: _Recipe) -> _PlanReader:
        cfg = dict(recipe.reader_config)
        validate = bool(cfg.get("validate_cache", False))
        cfg["validate_cache"] = False  # the parent validated at open; embedded checks still run per read
        ds = recipe.dataset_class(list(recipe.cache_dirs), reader_config=ReaderConfig(**cfg), runtime=None)
        if _dataset_key(ds) != recipe.dataset_key:
            raise CacheFormatError(
                "caches changed since the torch dataset was created (manifest or index rewritten): "
                + ", ".join(recipe.cache_dirs)
            )
        if recipe.snapshot is None:
            population, mapping = Population(ds._catalog), None
        else:
            cache_pos, sample_id, cum, mapping = read_snapshot(recipe.snapshot)
            population = Population(ds._catalog, ActiveRows(cache_pos, sample_id, None), cum=cum, scale=recipe.scale)
        if len(population) != recipe.rows:
            raise CacheFormatError(
                f"population snapshot has {len(population)} rows, expected {recipe.rows}: {recipe.snapshot}")
        return cls(ds, population, ds._sample_builder.checking(validate), mapping)


class _TempDir:
    """A temp dir owned by one wrapper in one process: removed when the wrapper is garbage
    collected (or at exit), never by a forked child that inherited the wrapper."""

    def __init__(self, owner: object, parent: str | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="datasetrt-torch-", dir=parent))
        weakref.finalize(owner, _remove_owned, str(self.path), os.getpid())


def _remove_owned(path: str, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


class _Snapshots:
    """Writes a population's snapshot once (per population object) into the owner's temp dir."""

    def __init__(self, owner: object, work_dir: str | None = None) -> None:
        self._owner = weakref.ref(owner)
        self._work_dir = work_dir
        self._dir: _TempDir | None = None
        self._last: tuple[Population, str, float] | None = None

    @property
    def directory(self) -> Path | None:
        return None if self._dir is None else self._dir.path

    def path_for(self, population: Population) -> tuple[str | None, float]:
        """(snapshot path, sampler scale); (None, 0.0) for the physical population."""
        if not population.weighted:
            return None, 0.0
        if self._last is not None and self._last[0] is population:
            return self._last[1], self._last[2]
        if self._dir is None:
            self._dir = _TempDir(self._owner(), self._work_dir)
        cum, scale = population.cumulative()
        run = Path(tempfile.mkdtemp(prefix="population-", dir=self._dir.path))
        path = str(write_snapshot(run, population.active.cache_pos, population.active.sample_id, cum))
        self._last = (population, path, scale)
        return path, scale


def _recipe(ds: CachedDataset, snapshots: _Snapshots, population: Population, shuffle: bool, seed: int,
            start: int, length: int, block_rows: int) -> _Recipe:
    path, scale = snapshots.path_for(population)
    caches = ds._worker_caches()
    return _Recipe(type(ds), caches.cache_dirs, ds.reader_config.model_dump(), caches.key, path, scale,
                   len(population), shuffle, seed, start, length, block_rows)


def _dataset_key(ds: CachedDataset) -> str:
    """The dataset's cache-set identity (paths, manifest/index inode and mtime), computed once."""
    return ds._worker_caches().key


def _worker_identity() -> tuple[int, int, bool]:
    """(worker id, worker count, in a DataLoader worker)."""
    info = get_worker_info()
    return (0, 1, False) if info is None else (info.id, info.num_workers, True)


def _next_pass(obj: Any) -> int:
    """How many passes this process already started on `obj` (0 in a fresh worker), then +1."""
    pid = os.getpid()
    local = obj._local
    k = local[1] if local is not None and local[0] == pid else 0
    obj._local = (pid, k + 1)
    return k


# --------------------------------------------------------------------------------------------
# to_torch_iterable_dataset


class CachedIterableDataset(IterableDataset):
    """Sized torch `IterableDataset` over a `CachedDataset` (`ds.to_torch_iterable_dataset()`).

    * Main process (`num_workers=0`): `iter(self)` reads as `iter(dataset)` does: same samples,
      same order, same window reservation at the first `next()`; `state_dict()` /
      `load_state_dict()` resume such passes exactly, mid-window included.
    * DataLoader workers: the plan is the window `iter(dataset)` would reserve next, computed from
      the dataset's state when the workers started (cursor or draw offset, `len(dataset)`, active
      rows); worker w of K reads plan blocks w, w+K, ... of `block_rows` samples, so with
      `batch_size == block_rows` (default 1) the loader yields exactly the plan order. A worker's
      k-th pass (persistent workers) reads the k-th window from there. The parent dataset's
      cursor is not advanced (torch calls nothing on the dataset in the parent); for epochs that
      advance, use `to_torch_dataloader`.
    """

    def __init__(self, dataset: CachedDataset, *, block_rows: int = 1) -> None:
        if type(block_rows) is not int or block_rows < 1:
            raise ConfigError(f"block_rows must be a positive integer, got {block_rows!r}")
        self._dataset: CachedDataset | None = dataset
        self._owner_pid = os.getpid()
        self.block_rows = block_rows
        self._recipe_shipped: _Recipe | None = None
        self._snapshots = _Snapshots(self)
        self._reading: tuple[_PlanReader, Window] | None = None
        self._local: tuple[int, int] | None = None
        self._started = False
        self._progress: _PassProgress | None = None  # the main-process pass in progress (or loaded)
        self._resume = False

    def __len__(self) -> int:
        return len(self._dataset) if self._dataset is not None else self._recipe_shipped.length

    def _plan_now(self) -> tuple[Population, bool, int, int, int]:
        """(population, shuffle, seed, start, length) of the window iter(dataset) would reserve next.
        Read under the dataset's lock in the process that owns it; a forked worker reads its
        inherited copy without it (a lock held by another parent thread at fork is never released)."""
        ds = self._dataset
        shuffle = ds.reader_config.shuffle
        if os.getpid() != self._owner_pid:
            return ds._population, shuffle, ds._seed, ds._draw_offset if shuffle else ds._cursor, len(ds)
        with ds._lock:
            return ds._population, shuffle, ds._seed, ds._draw_offset if shuffle else ds._cursor, len(ds)

    def __iter__(self) -> Iterator[CachedSample]:
        worker, workers, in_worker = _worker_identity()
        if not in_worker and self._dataset is not None:
            return self._main_pass()
        k = _next_pass(self)
        if self._reading is None or self._reading[0].pid != os.getpid():
            if self._dataset is not None:  # forked worker: the inherited dataset, as it was at fork
                population, shuffle, seed, start, length = self._plan_now()
                reader = _PlanReader(self._dataset, population, self._dataset._sample_builder)
            else:
                r = self._recipe_shipped
                reader, shuffle, seed, start, length = _PlanReader.open(r), r.shuffle, r.seed, r.start, r.length
            self._reading = (reader, Window(reader.population, shuffle, seed, start, length))
        reader, base = self._reading
        start = advance(base.shuffle, base.start, k * base.length, len(base.population))
        window = Window(base.population, base.shuffle, base.seed, start, base.length)
        layout = _Layout(window.length, 0, self.block_rows, False)
        return _read_share(reader.ds, reader.samples, _Share(window, worker, workers, layout=layout), None)

    def __reduce__(self) -> Any:
        """Ship paths, config and the plan position; the population travels as a snapshot path."""
        if self._dataset is None:
            return _rebuild_iterable, (self._recipe_shipped, self.block_rows)
        population, shuffle, seed, start, length = self._plan_now()
        recipe = _recipe(self._dataset, self._snapshots, population, shuffle, seed, start, length, self.block_rows)
        return _rebuild_iterable, (recipe, self.block_rows)

    def _main_pass(self) -> Iterator[CachedSample]:
        """One main-process pass, built as CachedDataset.__iter__ builds it: the window is reserved
        at the first next() (or is the rest of a loaded state's pass); delivered samples are
        counted for state_dict()."""
        ds = self._dataset
        self._started = True
        if self._resume:
            self._resume = False
            progress = self._progress
        else:
            progress = self._progress = _PassProgress(ds._reserve(), 0)
        window = progress.rest()
        if window.length == 0:
            return
        for sample in ds._sample_builder.samples(ds._chunks(window)):
            progress.consumed += 1
            yield sample

    def _identity(self, population: Population) -> dict:
        ds = self._dataset
        rows = population.active
        table = "physical" if rows is None else _digest(rows.cache_pos, rows.sample_id, rows.weights)
        return {"caches": _digest(ds._catalog.cache_ids, ds._catalog.counts), "table": table,
                "seed": ds._seed, "shuffle": ds.reader_config.shuffle}

    def state_dict(self) -> dict:
        """Main-process position: the dataset's cursor, draw offset and epoch length, and the pass
        in progress (its window and the samples delivered), plus the identity of the caches, the
        active table and the seed. Plain Python values. Worker passes are not tracked here
        (they do not move the dataset); resume those with `to_torch_dataloader`."""
        ds = self._dataset
        if ds is None or os.getpid() != self._owner_pid:
            raise LoaderStateError("state_dict is available on the torch dataset in the process that built it")
        with ds._lock:
            population = ds._population
            state = {"kind": ITER_STATE_KIND, "version": ITER_STATE_VERSION, "cursor": ds._cursor,
                     "draw_offset": ds._draw_offset, "epoch_len": ds._epoch_len}
        progress, current = self._progress, None
        if progress is not None and progress.consumed < progress.window.length:
            if progress.window.population is not population:
                raise LoaderStateError("the dataset's table changed during the pass in progress; "
                                       "take the state between passes")
            current = {"start": progress.window.start, "length": progress.window.length,
                       "consumed": progress.consumed}
        return {**state, "pass": current, **self._identity(population)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the dataset's positions; the next main-process pass yields exactly the samples
        the saved pass had left (then passes continue as they would have). Before any pass;
        a state of other caches, another active table, seed or shuffle is refused."""
        ds = self._dataset
        if ds is None or os.getpid() != self._owner_pid:
            raise LoaderStateError("load_state_dict is available on the torch dataset in the process that built it")
        if self._started:
            raise LoaderStateError("load_state_dict must be called before the torch dataset is iterated; "
                                   "build a fresh one to resume")
        if not isinstance(state, Mapping) or state.get("kind") != ITER_STATE_KIND:
            raise ConfigError(f"not a datasetrt torch dataset state (expected kind {ITER_STATE_KIND!r})")
        if state.get("version") != ITER_STATE_VERSION:
            raise ConfigError(f"unsupported torch dataset state version {state.get('version')!r}")
        population = ds._population
        _check_identity(state, self._identity(population), "torch dataset")
        cursor, offset, epoch_len, current = (state.get(k) for k in ("cursor", "draw_offset", "epoch_len", "pass"))
        if (type(cursor) is not int or not 0 <= cursor < max(len(population), 1) or type(offset) is not int
                or not 0 <= offset < 1 << 64 or not (epoch_len is None or (type(epoch_len) is int and epoch_len >= 1))):
            raise ConfigError("torch dataset state has invalid positions")
        progress = None
        if current is not None:
            start, length, consumed = (current.get(k) for k in ("start", "length", "consumed"))
            if not all(type(v) is int and v >= 0 for v in (start, length, consumed)) or consumed > length:
                raise ConfigError("torch dataset state has an invalid pass")
            window = Window(population, ds.reader_config.shuffle, ds._seed, start, length)
            progress = _PassProgress(window, consumed)
        with ds._lock:
            ds._cursor, ds._draw_offset, ds._epoch_len = cursor, offset, epoch_len
        self._progress, self._resume = progress, progress is not None

    @property
    def snapshot_dir(self) -> Path | None:
        """The temp dir holding population snapshots for spawned workers (None until needed)."""
        return self._snapshots.directory

    def __repr__(self) -> str:
        return f"CachedIterableDataset({self._dataset!r}, block_rows={self.block_rows})"


def _rebuild_iterable(recipe: _Recipe, block_rows: int) -> CachedIterableDataset:
    obj = CachedIterableDataset.__new__(CachedIterableDataset)
    obj._dataset, obj.block_rows, obj._recipe_shipped = None, block_rows, recipe
    obj._owner_pid = os.getpid()
    obj._snapshots = _Snapshots(obj)
    obj._reading, obj._local = None, None
    obj._started, obj._progress, obj._resume = False, None, False
    return obj


@dataclass
class _PassProgress:
    """A main-process pass: its full window and the samples delivered so far."""

    window: Window
    consumed: int

    def rest(self) -> Window:
        w = self.window
        start = advance(w.shuffle, w.start, self.consumed, len(w.population))
        return Window(w.population, w.shuffle, w.seed, start, w.length - self.consumed)


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        h.update(np.ascontiguousarray(arr).view(np.uint8))
    return h.hexdigest()


def _check_identity(state: Mapping[str, Any], mine: dict, what: str) -> None:
    """Refuse a state of another plan, naming the first difference."""
    names = {"caches": "the caches differ", "table": "the active table (rows, order or weights) differs"}
    for key, value in mine.items():
        if state.get(key) != value:
            raise ConfigError(f"{what} state does not match: {names.get(key, f'{key} differs')} "
                              f"(state {state.get(key)!r}, here {value!r})")


def to_torch_iterable_dataset(dataset: CachedDataset, *, block_rows: int = 1) -> CachedIterableDataset:
    """`CachedDataset.to_torch_iterable_dataset()`; `block_rows` = the DataLoader batch size gives
    plan-ordered batches with workers."""
    return CachedIterableDataset(dataset, block_rows=block_rows)


# --------------------------------------------------------------------------------------------
# to_torch_dataloader


def _physical_rows(ds: CachedDataset) -> ActiveRows:
    """All physical samples as active rows with weight 1.0 (vectorised; 24 B per row)."""
    catalog = ds._catalog
    cache_pos = np.repeat(np.arange(len(catalog), dtype=np.int64), catalog.counts)
    sample_id = (np.arange(catalog.total, dtype=np.int64) - catalog.offsets[cache_pos]).astype(np.uint64)
    return ActiveRows(cache_pos, sample_id, np.ones(catalog.total, dtype=np.float64))


class _LoaderPlan:
    """The loader's sampling plan, fixed when the loader is built (as dataset-rt exports the table):
    the dataset's active rows at that time (all physical rows, weight 1.0, before any
    update_metadata), ordered per `worker_partition` exactly as dataset-rt's single consumer sees
    them; pass e reads window [e*count, (e+1)*count) of one stream (draw offset or cursor) seeded
    `derive_seed(common_seed, 0, 0)`. Shuffled plans always use the weighted sampler, as
    dataset-rt's loaders do. `count` is the single-rank samples per pass whatever the world size:
    ranks divide each window (`_Layout`), they do not change it.
    """

    def __init__(self, ds: CachedDataset, *, shuffle: bool, common_seed: int | None, partition: str,
                 budget: int, count: int, batch_size: int, drop_last: bool) -> None:
        self.catalog = ds._catalog
        population = ds._population
        self.base = population.active if population.active is not None else _physical_rows(ds)
        if self.base.weights is None:  # pragma: no cover - datasets always keep their weights
            raise CacheFormatError("the dataset's active rows carry no weights")
        self.shuffle, self.partition, self.budget = shuffle, partition, budget
        self.count, self.batch_size, self.drop_last = count, batch_size, drop_last
        self.common_seed = common_seed
        self.frozen = False
        self._population: Population | None = None
        self._digest: str | None = None

    @property
    def plan_seed(self) -> int:
        return derive_seed(self.common_seed, 0, 0) if self.shuffle else 0

    @property
    def population(self) -> Population:
        """Built once: dataset-rt's split selection (rows [0, count) when the budget equals the
        rows, a seeded permutation for shuffled split), else the rows as they are."""
        if self._population is None:
            base, rows = self.base, len(self.base)
            size = self.count if self.partition == "split" and self.budget == rows else rows
            if self.partition == "split" and self.shuffle:
                order = np.random.default_rng(self.common_seed).permutation(rows)[:size]
            else:
                order = None if size == rows else np.arange(size, dtype=np.int64)
            active = base if order is None else ActiveRows(base.cache_pos[order], base.sample_id[order],
                                                           base.weights[order])
            self._population = Population(self.catalog, active)
        return self._population

    def freeze(self) -> Population:
        """Fix the plan (first pass or first pickle); precompute the sampler tables once, in the
        parent, so forked workers share them."""
        self.frozen = True
        population = self.population
        if self.shuffle and len(population):
            population.cumulative()
        return population

    def window(self, epoch: int, skip_rows: int = 0) -> Window:
        population = self.population
        start = advance(self.shuffle, 0, epoch * self.count + skip_rows, len(population))
        return Window(population, self.shuffle, self.plan_seed, start, self.count - skip_rows)

    def table_digest(self) -> str:
        """Identity of the active rows the plan was built from (positions, ids, weights)."""
        if self._digest is None:
            self._digest = _digest(self.base.cache_pos, self.base.sample_id, self.base.weights)
        return self._digest

    def caches_digest(self) -> str:
        return _digest(self.catalog.cache_ids, self.catalog.counts)


@dataclass(frozen=True)
class _Spec:
    """What a loader pass is, in any process: the plan stream (shuffle, plan seed), the global
    plan positions per pass (`stride`: the single-rank samples per pass, topology independent),
    the batch size and drop_last, and this process's rank of `world`."""

    shuffle: bool
    seed: int
    stride: int
    batch: int
    drop_last: bool
    rank: int = 0
    world: int = 1

    def layout(self, start: int = 0) -> _Layout:
        return _Layout(self.stride, start, self.batch, self.drop_last, self.rank, self.world)


class LoaderDataset(IterableDataset):
    """`loader.dataset` of `to_torch_dataloader`: `len()` is this rank's samples per pass; pass e
    reads this rank's layout of window e of the global plan. Main process (`num_workers=0`): read
    through the dataset (its runtime's reader processes, if it has them). Worker w of K: the
    rank's batches w, w+K, ... in-process. `sample_transform_fn` runs per sample where the sample
    is read."""

    def __init__(self, dataset: CachedDataset, plan: _LoaderPlan, spec: _Spec, transform: Callable | None,
                 worker_seeds: tuple[int, ...], work_dir: str | None) -> None:
        self._dataset: CachedDataset | None = dataset
        self._plan: _LoaderPlan | None = plan
        self.sample_transform_fn = transform
        self.worker_seeds = worker_seeds
        self._spec = spec
        self._pass = (0, 0)  # (epoch, plan rows already consumed) of the next pass the loader starts
        self._local: tuple[int, int] | None = None
        self._reader: _PlanReader | None = None
        self._recipe_shipped: _Recipe | None = None
        self._snapshots = _Snapshots(self, work_dir)

    def __len__(self) -> int:
        return self._spec.layout().per_rank

    @property
    def worker_seed(self) -> int:
        """derive_seed(seed, rank, worker) of the calling DataLoader worker (worker 0 in the main
        process): a reproducible seed for random transforms; 0 for sequential loaders."""
        worker, _workers, _in = _worker_identity()
        return self.worker_seeds[worker] if worker < len(self.worker_seeds) else 0

    def _begin(self, epoch: int, rows: int) -> None:
        """Parent side, before torch starts the pass (and maybe its workers)."""
        self._plan.freeze()
        self._pass = (epoch, rows)

    def __iter__(self) -> Iterator[Any]:
        worker, workers, in_worker = _worker_identity()
        main = not in_worker and self._dataset is not None
        if main:
            epoch, rows = self._pass
            self._pass = (epoch + 1, 0)
        else:
            k = _next_pass(self)
            epoch, rows = self._pass
            epoch, rows = epoch + k, (rows if k == 0 else 0)
        spec = self._spec
        layout = spec.layout(rows)
        if layout.per_rank == 0:
            return iter(())
        transform = self.sample_transform_fn
        if main:
            ds = self._dataset
            samples = ds._sample_builder
            if spec.world == 1:  # the rest of the pass is one contiguous window
                return samples.samples(ds._chunks(self._plan.window(epoch, rows)), transform)
            share = _Share(self._plan.window(epoch), layout=layout)
            if ds._runtime is not None and ds._runtime.parallel_reads:
                chunks = (c for sub in share.windows() for c in ds._chunks(sub, spec.batch))
                return samples.samples(chunks, transform)
            return _read_share(ds, samples, share, transform)
        reader = self._worker_reader()
        start = advance(spec.shuffle, 0, epoch * spec.stride, len(reader.population))
        window = Window(reader.population, spec.shuffle, spec.seed, start, spec.stride)
        return _read_share(reader.ds, reader.samples, _Share(window, worker, workers, layout=layout), transform)

    def _worker_reader(self) -> _PlanReader:
        if self._reader is None or self._reader.pid != os.getpid():
            if self._dataset is not None:  # forked worker: the parent's objects, inherited
                self._reader = _PlanReader(self._dataset, self._plan.freeze(), self._dataset._sample_builder)
            else:
                self._reader = _PlanReader.open(self._recipe_shipped)
        return self._reader

    def __reduce__(self) -> Any:
        """Ship paths, config, the plan parameters and a snapshot path; never the table."""
        recipe = self._recipe_shipped
        spec = self._spec
        if self._dataset is not None and spec.stride > 0:
            recipe = _recipe(self._dataset, self._snapshots, self._plan.freeze(), spec.shuffle, spec.seed, 0,
                             spec.stride, spec.batch)
        return _rebuild_loader_dataset, (recipe, spec, self.sample_transform_fn, self.worker_seeds, self._pass)

    @property
    def snapshot_dir(self) -> Path | None:
        """The temp dir holding the population snapshot for spawned workers (None until needed)."""
        return self._snapshots.directory


def _rebuild_loader_dataset(recipe: _Recipe | None, spec: _Spec, transform: Callable | None,
                            worker_seeds: tuple[int, ...], pass_: tuple[int, int]) -> LoaderDataset:
    obj = LoaderDataset.__new__(LoaderDataset)
    obj._dataset, obj._plan, obj._recipe_shipped = None, None, recipe
    obj.sample_transform_fn, obj.worker_seeds, obj._spec, obj._pass = transform, worker_seeds, spec, pass_
    obj._local, obj._reader = None, None
    obj._snapshots = _Snapshots(obj)
    return obj


class _LoaderIterator:
    """The torch iterator of one pass, counting delivered batches for `state_dict()`."""

    def __init__(self, it: Any, epoch: int, layout: _Layout, prior: int) -> None:
        self._it = it
        self.epoch, self.layout, self.prior = epoch, layout, prior
        self.yielded = 0
        self.exhausted = False

    def __iter__(self) -> _LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self.exhausted = True
            raise
        self.yielded += 1
        return batch

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        if name == "_it":
            raise AttributeError(name)
        return getattr(self._it, name)


class DatasetRTDataLoader(DataLoader):
    """A `torch.utils.data.DataLoader` over a `LoaderDataset`. Each `iter(loader)` starts the next
    pass (epoch) of the loader's plan, decided here in the parent before torch starts or resumes
    its workers, so persistent and non-persistent workers, fork and spawn, and `num_workers=0`
    all yield the same batches in the same order. With several ranks, each reads its share of the
    same global plan (docs/distributed.md). `state_dict()` / `load_state_dict()` resume exactly,
    also on another world size or worker count (docs/pytorch.md, docs/distributed.md).

    Attributes: `rank`, `world_size`; `padded_rows` / `dropped_rows`: rows per pass the ranks read
    twice (padding to equal batch counts) / drop (drop_last) relative to the requested samples;
    `global_samples_per_pass` = world_size * len(loader.dataset)."""

    def _setup_resume(self, plan: _LoaderPlan, explicit_seed: bool, partition: str, share: RankShare) -> None:
        self._plan = plan
        self._explicit_seed = explicit_seed
        self._partition = partition
        self._share = share
        self._next_epoch = 0
        self._pending = (0, 0)  # (rows, batches) where the next pass starts
        self._started = False
        self._current: _LoaderIterator | None = None

    @property
    def seed(self) -> int | None:
        """The loader's common seed (None for sequential loaders)."""
        return self._plan.common_seed

    @property
    def rank(self) -> int:
        return self.dataset._spec.rank

    @property
    def world_size(self) -> int:
        return self.dataset._spec.world

    @property
    def padded_rows(self) -> int:
        """Rows per full pass read twice across ranks so that every rank has the same batch count
        (the first rows of the pass, again); 0 with drop_last."""
        return self._share.padded

    @property
    def dropped_rows(self) -> int:
        """Requested rows per pass that no rank reads (drop_last rounding to whole batches on every rank)."""
        return self._share.discarded

    @property
    def global_samples_per_pass(self) -> int:
        return self._share.effective

    @property
    def batches_per_pass(self) -> int:
        return self.dataset._spec.layout().batches

    def __iter__(self) -> _LoaderIterator:
        epoch, (rows, prior) = self._next_epoch, self._pending
        self._started = True
        self._next_epoch, self._pending = epoch + 1, (0, 0)
        self.dataset._begin(epoch, rows)
        tracked = _LoaderIterator(super().__iter__(), epoch, self.dataset._spec.layout(rows), prior)
        self._current = tracked
        return tracked

    def _identity(self) -> dict:
        plan = self._plan
        return {"caches": plan.caches_digest(), "table": plan.table_digest(), "shuffle": plan.shuffle,
                "worker_partition": self._partition, "samples_per_epoch": plan.count,
                "batch_size": plan.batch_size, "drop_last": bool(self.drop_last), "seed": plan.common_seed}

    def state_dict(self) -> dict:
        """Where the next batch comes from: {"epoch", "rows" (plan positions of that epoch the
        ranks consumed together, assuming every rank delivered as many batches as this one),
        "batches" (delivered by this rank in that epoch), "world_size", "rank"} plus what the plan
        is (cache and table digests, seed, shuffle, partition, sizes). Plain Python values (json-
        and torch.save-able)."""
        cur = self._current
        if cur is None:
            epoch, (rows, batches) = self._next_epoch, self._pending
        else:
            layout = cur.layout
            epoch, rows, batches = cur.epoch, layout.start + cur.yielded * layout.world * layout.batch, \
                cur.prior + cur.yielded
            if cur.exhausted or cur.yielded >= layout.batches:
                epoch, rows, batches = epoch + 1, 0, 0
        return {"kind": STATE_KIND, "version": STATE_VERSION, "epoch": epoch, "rows": rows, "batches": batches,
                "world_size": self.world_size, "rank": self.rank, **self._identity()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where `state` was taken: the next iteration yields exactly the remaining
        batches of that epoch (the same batches when the world size is the same; otherwise this
        topology's share of the remaining plan positions), later iterations the following epochs.
        Must precede iteration. A state of another plan (caches, table, seed, shuffle, partition,
        sizes) is refused; a loader built with seed="random" adopts the state's seed."""
        if self._started:
            raise LoaderStateError("load_state_dict must be called before the loader is iterated; "
                                   "build a fresh loader with the same arguments to resume")
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND:
            raise ConfigError(f"not a datasetrt DataLoader state (expected kind {STATE_KIND!r})")
        version = state.get("version")
        if version not in (1, STATE_VERSION):
            raise ConfigError(f"unsupported DataLoader state version {version!r}")
        mine = self._identity()
        seed = state.get("seed")
        adopt = (seed != mine["seed"] and not self._explicit_seed and self._plan.shuffle and not self._plan.frozen
                 and type(seed) is int and 0 <= seed < 1 << 64)
        _check_identity(state, {k: v for k, v in mine.items() if not (adopt and k == "seed")}, "DataLoader")
        epoch, batches = state.get("epoch"), state.get("batches")
        if version == 1:  # single rank: rows = batches * batch_size
            world = 1
            rows = min(batches * self._plan.batch_size, self._plan.count) if type(batches) is int else None
        else:
            world, rows = state.get("world_size"), state.get("rows")
        same = world == self.world_size
        if (type(epoch) is not int or type(batches) is not int or type(rows) is not int or type(world) is not int
                or epoch < 0 or batches < 0 or world < 1 or not 0 <= rows <= self._plan.count
                or (same and batches > self.batches_per_pass)):
            raise ConfigError(f"DataLoader state has an invalid position (epoch {epoch!r}, batches {batches!r}, "
                              f"rows {rows!r}, world_size {world!r})")
        if adopt:
            self._plan.common_seed = seed  # seed="random": continue the saved stream
            rank, workers = self.rank, len(self.dataset.worker_seeds)
            self.dataset.worker_seeds = tuple(derive_seed(seed, rank, w) for w in range(workers))
            self.dataset._spec = replace(self.dataset._spec, seed=self._plan.plan_seed)
        if not same:
            batches = rows // (self.world_size * self._plan.batch_size)
        if self.dataset._spec.layout(rows).per_rank == 0:
            epoch, rows, batches = epoch + 1, 0, 0
        self._next_epoch, self._pending = epoch, (rows, batches)


# -- options (dataset-rt 0.4.8 wording and checking order) -------------------------------------

_RESERVED = frozenset({
    "dataset", "sampler", "batch_sampler", "shuffle", "seed", "samples_per_epoch", "worker_partition",
    "work_dir", "batch_size", "num_workers", "sample_transform_fn", "collate_fn", "drop_last",
    "pin_memory", "timeout", "native_num_workers", "multiprocessing_context", "worker_init_fn",
    "prefetch_factor", "persistent_workers", "verbose", "dataloader_kwargs",
})


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _check_count(value: Any, name: str, minimum: int, maximum: int) -> None:
    if _is_auto(value) or (type(value) is int and minimum <= value <= maximum):
        return
    raise ConfigError(f"{name} must be 'auto' or an integer between {minimum} and {maximum}")


def available_cpus() -> int:
    """CPUs this process may use: min(cpu_count, affinity, cgroup v2 cpu.max quota), at least 1."""
    n = os.cpu_count() or 1
    try:
        n = min(n, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        pass
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, int(quota) // int(period))
    except (OSError, ValueError):
        pass
    return max(1, n)


class _PickleSink:
    def write(self, data: bytes) -> int:
        return len(data)


def _loader_event(message: str) -> None:
    """INFO on logger `datasetrt.loader`; without configured handlers, one line on stderr."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.hasHandlers():
        logger.info(message)
    elif logger.level == logging.NOTSET or logger.isEnabledFor(logging.INFO):
        print(f"[{LOGGER_NAME}] {message}", file=sys.stderr)


@dataclass(frozen=True)
class Replica:
    """This process's place among training processes: `rank` of `world_size`, `local_world_size`
    processes on this machine, and whether a torch.distributed group is initialised (`group`)."""

    rank: int
    world_size: int
    local_world_size: int
    group: bool


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def capture_replica() -> Replica:
    """Rank and world size from the initialised default torch.distributed group, else from the
    torchrun environment variables (RANK, WORLD_SIZE), else (0, 1); LOCAL_WORLD_SIZE (between 1
    and the world size) or the world size counts the processes sharing this machine's CPUs."""
    if get_worker_info() is not None:
        raise RuntimeError("capture_replica must run before DataLoader workers start")
    dist = torch_distributed
    group = dist.is_available() and dist.is_initialized()
    if group:
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is None or world is None:
            rank, world = 0, 1
        elif not (world >= 1 and 0 <= rank < world):
            raise ConfigError(f"RANK={rank} and WORLD_SIZE={world} must satisfy 0 <= RANK < WORLD_SIZE")
    local = _env_int("LOCAL_WORLD_SIZE")
    if local is None:
        local = world
    elif not 1 <= local <= world:
        raise ConfigError(f"LOCAL_WORLD_SIZE must be between 1 and the world size {world}, got {local}")
    return Replica(rank, world, local, group)


def _agree(replica: Replica, fingerprint: dict, candidate: int | None) -> int | None:
    """Broadcast rank 0's (seed, plan fingerprint) to every rank (one `broadcast_object_list`);
    return rank 0's seed, or refuse on a rank whose plan differs from rank 0's."""
    objects = [(candidate, fingerprint)] if replica.rank == 0 else [None]
    torch_distributed.broadcast_object_list(objects, src=0)
    seed, theirs = objects[0]
    for key, value in fingerprint.items():
        if theirs.get(key) != value:
            raise ConfigError(f"to_torch_dataloader on rank {replica.rank} differs from rank 0: {key} "
                              f"(rank 0 {theirs.get(key)!r}, here {value!r}); every rank must build the same plan")
    return seed


def to_torch_dataloader(
    dataset: CachedDataset, *, shuffle: bool = True, seed: int | str = "random",
    samples_per_epoch: int | None = None, worker_partition: str | None = None, work_dir: Any = None,
    batch_size: int = 1, num_workers: int | str = "auto", sample_transform_fn: Callable | None = None,
    collate_fn: Callable | None = None, drop_last: bool = False, pin_memory: bool = False, timeout: float = 0,
    native_num_workers: int | str = "auto", multiprocessing_context: Any = "spawn",
    worker_init_fn: Callable | None = None, prefetch_factor: int | str = "auto",
    persistent_workers: bool | str = "auto", verbose: bool = True, dataloader_kwargs: Mapping | None = None,
) -> DatasetRTDataLoader:
    """`CachedDataset.to_torch_dataloader(...)`: dataset-rt 0.4.8's arguments, defaults and
    validation messages; a real DataLoader whose batches are the loader plan in order, or this
    rank's share of it when several ranks train (`capture_replica`; docs/distributed.md). With an
    initialised process group of world_size > 1 this is a collective call (one
    `broadcast_object_list`): every rank must call it, with the same arguments."""
    extra = dict(dataloader_kwargs) if dataloader_kwargs is not None else {}
    conflicts = _RESERVED.intersection(extra)
    if conflicts:
        raise ConfigError(f"dataloader_kwargs contains reserved arguments: {', '.join(sorted(conflicts))}")
    _check_count(num_workers, "num_workers", 0, (1 << 32) - 1)
    _check_count(native_num_workers, "native_num_workers", 1, sys.maxsize)
    flags = (("shuffle", shuffle), ("drop_last", drop_last), ("pin_memory", pin_memory), ("verbose", verbose))
    for name, value in flags:
        if type(value) is not bool:
            raise ConfigError(f"{name} must be a boolean")
    if type(batch_size) is not int or not 1 <= batch_size <= sys.maxsize:
        raise ConfigError("batch_size must be a positive integer fitting sys.maxsize")
    if samples_per_epoch is not None and (type(samples_per_epoch) is not int
                                          or not 1 <= samples_per_epoch <= MAX_SAMPLE_BUDGET):
        raise ConfigError(f"samples_per_epoch must be a positive integer <= {MAX_SAMPLE_BUDGET} or None")
    if not math.isfinite(timeout) or timeout < 0:
        raise ConfigError("timeout must be finite and nonnegative")
    _check_count(prefetch_factor, "prefetch_factor", 1, sys.maxsize)
    if not (persistent_workers is True or persistent_workers is False or _is_auto(persistent_workers)):
        raise ConfigError("persistent_workers must be a boolean or 'auto'")
    if not (isinstance(seed, str) and seed == "random"):
        if type(seed) is not int:
            raise ConfigError("seed must be 'random' or an unsigned 64-bit integer")
        if not shuffle:
            raise ConfigError("seed requires shuffle=True; use 'random' for sequential reading")
        if not 0 <= seed < 1 << 64:
            raise ConfigError("seed must be 'random' or an unsigned 64-bit integer")
    explicit_seed = type(seed) is int
    ctx_ok = isinstance(multiprocessing_context, BaseContext) or (
        isinstance(multiprocessing_context, str)
        and (multiprocessing_context == "inherit" or multiprocessing_context in get_all_start_methods()))
    if not ctx_ok:
        raise ConfigError("multiprocessing_context must be 'inherit', an available start method, or BaseContext")
    if worker_partition is not None and worker_partition not in ("split", "replicate"):
        raise ConfigError("worker_partition must be 'split', 'replicate', or None")

    if get_worker_info() is not None:
        raise LoaderStateError("to_torch_dataloader must run before DataLoader workers start")
    replica = capture_replica()
    rank, world, local = replica.rank, replica.world_size, replica.local_world_size
    if shuffle and not explicit_seed and world > 1 and not replica.group:
        raise ConfigError(f"seed='random' with WORLD_SIZE={world} needs an initialised torch.distributed process "
                          f"group to share rank 0's seed; pass an explicit seed (the same on every rank)")
    cpus = available_cpus() if _is_auto(num_workers) or _is_auto(native_num_workers) else 1
    processes = min(4, max(0, cpus // local - 1)) if _is_auto(num_workers) else num_workers
    threads = (max(1, min(4, cpus // (max(1, processes) * local))) if _is_auto(native_num_workers)
               else native_num_workers)
    if processes == 0 and timeout != 0:
        raise ConfigError("timeout must be zero with num_workers=0")
    if _is_auto(persistent_workers):
        persistent = processes > 0
    elif persistent_workers and processes == 0:
        raise ConfigError("persistent_workers=True requires num_workers > 0")
    else:
        persistent = persistent_workers
    if _is_auto(prefetch_factor):
        prefetch = 2 if processes > 0 else None
    elif processes == 0:
        raise ConfigError("prefetch_factor requires num_workers > 0")
    else:
        prefetch = prefetch_factor
    if processes == 0:
        context = None
    elif isinstance(multiprocessing_context, BaseContext):
        context = multiprocessing_context
    else:
        context = get_context(None if multiprocessing_context == "inherit" else multiprocessing_context)
    if sample_transform_fn is not None and processes > 0:
        try:
            ForkingPickler(_PickleSink(), pickle.HIGHEST_PROTOCOL).dump(sample_transform_fn)
        except Exception as error:
            raise ArgumentTypeError("sample_transform_fn must be picklable for multiprocess loading") from error

    budget = samples_per_epoch if samples_per_epoch is not None else len(dataset)
    if not 1 <= budget <= MAX_SAMPLE_BUDGET:
        raise ConfigError(f"inherited samples_per_epoch must be between 1 and {MAX_SAMPLE_BUDGET}")
    share = rank_share(budget, world, batch_size, drop_last)
    count = rank_count(budget, 1, batch_size, drop_last)  # global plan positions per pass, any world size
    if rank == 0 and share.message is not None:
        warnings.warn(share.message, UserWarning, stacklevel=3)
    work = None
    if work_dir is not None:
        from pydantic import DirectoryPath, TypeAdapter

        work = str(TypeAdapter(DirectoryPath).validate_python(work_dir))
    partition = worker_partition or ("replicate" if shuffle else "split")

    plan = _LoaderPlan(dataset, shuffle=shuffle, common_seed=None, partition=partition, budget=budget,
                       count=count, batch_size=batch_size, drop_last=drop_last)
    common = (seed if explicit_seed else secrets.randbits(64)) if shuffle else None
    if replica.group and world > 1:
        fingerprint = {"caches": plan.caches_digest(), "table": plan.table_digest(), "shuffle": shuffle,
                       "worker_partition": partition, "samples_per_epoch": budget, "batch_size": batch_size,
                       "drop_last": drop_last, "seed": seed}
        common = _agree(replica, fingerprint, common)
    plan.common_seed = common
    consumers = max(1, processes)
    worker_seeds = tuple(derive_seed(common, rank, w) for w in range(consumers)) if shuffle else (0,) * consumers
    spec = _Spec(shuffle, plan.plan_seed, count, batch_size, drop_last, rank, world)
    adapter = LoaderDataset(dataset, plan, spec, sample_transform_fn, worker_seeds, work)
    loader = DatasetRTDataLoader(
        adapter, batch_size=batch_size, num_workers=processes, collate_fn=collate_fn, drop_last=drop_last,
        pin_memory=pin_memory, timeout=timeout, multiprocessing_context=context, worker_init_fn=worker_init_fn,
        prefetch_factor=prefetch, persistent_workers=persistent, **extra,
    )
    loader._setup_resume(plan, explicit_seed, partition, share)
    if verbose:
        seeds = ",".join(f"{w}:{s}" for w, s in enumerate(worker_seeds))
        _loader_event(
            f"event=loader_ready pid={os.getpid()} rank={rank} seed={common} worker_seeds={seeds} "
            f"num_workers={processes} native_threads_per_consumer={threads} partition={partition} "
            f"persistent={persistent} prefetch_factor={prefetch if prefetch is not None else 'disabled'} "
            f"samples={budget} samples_per_rank={share.per_rank} batch_size={batch_size} world_size={world} "
            f"padded={share.padded} dropped={share.discarded} shuffle={shuffle} "
            f"multiprocessing_context={context.get_start_method() if context is not None else 'disabled'}"
        )
    return loader
