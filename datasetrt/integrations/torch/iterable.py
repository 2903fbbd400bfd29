"""`ds.to_torch_iterable_dataset()`: a sized torch `IterableDataset` that reads as `iter(ds)` does
in the main process and divides the window `iter(ds)` would reserve next among DataLoader
workers; exact resume of main-process passes.

Boundary: reaches the dataset only through its integration seam (`peek_window`,
`reserve_window`, `plan_window`, `read_window`, `cursor_state*`, `population_rows`,
`cache_identity`); the division is plan.py's, the spawned side spawn.py's. Its state format
(ITER_STATE_KIND, version 1) is documented in docs/pytorch.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from datasetrt.errors import ConfigError, LoaderStateError
from datasetrt.integrations.torch.base import (
    _caches_digest,
    _check_identity,
    _PlanDataset,
    _rows_digest,
    _with_order,
    _worker_identity,
)
from datasetrt.integrations.torch.plan import _Layout, _PassProgress, _Share
from datasetrt.integrations.torch.spawn import _Recipe
from datasetrt.values.records import CachedSample

if TYPE_CHECKING:
    from datasetrt.dataset.seam import DatasetSeam

ITER_STATE_KIND = "datasetrt.torch.IterableDataset"
ITER_STATE_VERSION = 1


class CachedIterableDataset(_PlanDataset):
    """Sized torch `IterableDataset` over a `CachedDataset` (`ds.to_torch_iterable_dataset()`).

    * Main process (`num_workers=0`): `iter(self)` reads as `iter(dataset)` does: same samples,
      same order, same window reservation at the first `next()`; `state_dict()` /
      `load_state_dict()` resume such passes exactly, mid-window included.
    * DataLoader workers: the plan is the window `iter(dataset)` would reserve next
      (`dataset.peek_window()` when the workers started); worker w of K reads plan blocks w, w+K,
      ... of `block_rows` samples, so with `batch_size == block_rows` (default 1) the loader
      yields exactly the plan order. A worker's k-th pass (persistent workers) reads the k-th
      window from there. The parent dataset's cursor is not advanced (torch calls nothing on the
      dataset in the parent); for epochs that advance, use `to_torch_dataloader`.
    """

    def __init__(self, dataset: DatasetSeam, *, block_rows: int = 1) -> None:
        if type(block_rows) is not int or block_rows < 1:
            raise ConfigError(f"block_rows must be a positive integer, got {block_rows!r}")
        self._setup(dataset, None)
        self._init_passes(block_rows, None)
        dataset.hold_stages(self)  # its workers read copies of the plan: the dataset refuses advance()

    def _init_passes(self, block_rows: int, shipped_window: tuple[int, int] | None) -> None:
        self.block_rows = block_rows
        self._shipped_window = shipped_window  # (start, length) of the plan, in a spawned copy
        self._reading: tuple[Any, Any] | None = None  # (reader, base window) in this process
        self._started = False
        self._progress: _PassProgress | None = None  # the main-process pass in progress (or loaded)
        self._resume = False  # the next main-process pass continues `_progress` (a loaded state)

    def _require_shipped_window(self) -> tuple[int, int]:
        """The plan's (start, length); shipped to every spawned copy, which has no dataset."""
        if self._shipped_window is None:
            raise RuntimeError("CachedIterableDataset has neither a dataset nor a shipped plan window")
        return self._shipped_window

    def __len__(self) -> int:
        return len(self._dataset) if self._dataset is not None else self._require_shipped_window()[1]

    def __iter__(self) -> Iterator[CachedSample]:
        worker, workers, in_worker = _worker_identity()
        if not in_worker and self._dataset is not None:
            return self._main_pass()
        k = self._next_pass()
        if self._reading is None or self._reading[0].pid != os.getpid():
            if self._dataset is not None:  # forked worker: the inherited dataset, as it was at fork
                window = self._dataset.peek_window()
                reader = self._reader_here(window.population)
            else:
                reader = self._reader_here()
                start, length = self._require_shipped_window()
                window = reader.ds.plan_window(start, length, population=reader.population)
            self._reading = (reader, window)
        reader, base = self._reading
        window = base.sub(k * base.length, base.length)
        layout = _Layout(window.length, 0, self.block_rows, False)
        return reader.read(_Share(window, worker, workers, layout=layout), None)

    def __reduce__(self) -> Any:
        """Ship paths, config and the plan position; the population travels as a snapshot path."""
        if self._dataset is None:
            return _rebuild_iterable, (self._recipe_shipped, self.block_rows, self._shipped_window)
        window = self._dataset.peek_window()
        recipe = self._recipe_for(window.population)
        return _rebuild_iterable, (recipe, self.block_rows, (window.start, window.length))

    def _main_pass(self) -> Iterator[CachedSample]:
        """One main-process pass, built as CachedDataset.__iter__ builds it: the window is reserved
        at the first next() (or is the rest of a loaded state's pass); delivered samples are
        counted for state_dict()."""
        ds = self._require_dataset()
        self._started = True
        progress = self._progress if self._resume else None  # set whenever `_resume` is
        self._resume = False
        if progress is None:
            progress = self._progress = _PassProgress(ds.reserve_window(), 0)
        window = progress.rest()
        if window.length == 0:
            return
        for sample in ds.read_window(window):
            progress.consumed += 1
            yield sample

    def _identity(self, ds: DatasetSeam, population: Any) -> dict:
        rows = ds.population_rows(population)
        table = "physical" if rows is None else _rows_digest(rows.cache_pos, rows.sample_id, rows.weights)
        return _with_order(
            {
                "caches": _caches_digest(ds),
                "table": table,
                "seed": ds.reader_config.seed,
                "shuffle": ds.reader_config.shuffle,
            },
            ds.order_identity(population),
        )

    def state_dict(self) -> dict:
        """Main-process position: the dataset's cursor, draw offset and epoch length, and the pass
        in progress (its window and the samples delivered), plus the identity of the caches, the
        active table and the seed. Plain Python values. Worker passes are not tracked here
        (they do not move the dataset); resume those with `to_torch_dataloader`."""
        ds = self._dataset
        if ds is None or os.getpid() != self._owner_pid:
            raise LoaderStateError("state_dict is available on the torch dataset in the process that built it")
        cursor = ds.cursor_state()
        population = cursor.population
        state = {"kind": ITER_STATE_KIND, "version": ITER_STATE_VERSION, **cursor.as_dict()}
        progress, current = self._progress, None
        if progress is not None and progress.consumed < progress.window.length:
            if progress.window.population is not population:
                raise LoaderStateError(
                    "the dataset's table changed during the pass in progress; take the state between passes"
                )
            current = {"start": progress.window.start, "length": progress.window.length, "consumed": progress.consumed}
        return {**state, "pass": current, **self._identity(ds, population)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the dataset's positions; the next main-process pass yields exactly the samples
        the saved pass had left (then passes continue as they would have). Before any pass;
        a state of other caches, another active table, seed or shuffle is refused."""
        ds = self._dataset
        if ds is None or os.getpid() != self._owner_pid:
            raise LoaderStateError("load_state_dict is available on the torch dataset in the process that built it")
        if self._started:
            raise LoaderStateError(
                "load_state_dict must be called before the torch dataset is iterated; build a fresh one to resume"
            )
        if not isinstance(state, Mapping) or state.get("kind") != ITER_STATE_KIND:
            raise ConfigError(f"not a datasetrt torch dataset state (expected kind {ITER_STATE_KIND!r})")
        if state.get("version") != ITER_STATE_VERSION:
            raise ConfigError(f"unsupported torch dataset state version {state.get('version')!r}")
        population = ds.cursor_state().population
        _check_identity(state, self._identity(ds, population), "torch dataset")
        try:
            cursor = ds.cursor_state_from(state)
        except ConfigError:
            raise ConfigError("torch dataset state has invalid positions") from None
        current, progress = state.get("pass"), None
        if current is not None:
            start, length, consumed = (current.get(k) for k in ("start", "length", "consumed"))
            if not all(type(v) is int and v >= 0 for v in (start, length, consumed)) or consumed > length:
                raise ConfigError("torch dataset state has an invalid pass")
            progress = _PassProgress(ds.plan_window(start, length, population=population), consumed)
        ds.restore_cursor_state(cursor)
        self._progress, self._resume = progress, progress is not None

    def __repr__(self) -> str:
        return f"CachedIterableDataset({self._dataset!r}, block_rows={self.block_rows})"


def _rebuild_iterable(recipe: _Recipe, block_rows: int, window: tuple[int, int]) -> CachedIterableDataset:
    obj = CachedIterableDataset._rebuilt(recipe)
    obj._init_passes(block_rows, window)
    return obj


def to_torch_iterable_dataset(dataset: DatasetSeam, *, block_rows: int = 1) -> CachedIterableDataset:
    """`CachedDataset.to_torch_iterable_dataset()`; `block_rows` = the DataLoader batch size gives
    plan-ordered batches with workers."""
    return CachedIterableDataset(dataset, block_rows=block_rows)
