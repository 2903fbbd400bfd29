"""The reading side of the torch datasets in one process, and the recipe that rebuilds it in a
spawned DataLoader worker: cache directories, reader config, the caches' key and the path of a
population snapshot, written once per population into a temp dir its wrapper owns.

Boundary: no torch (importable without it). Talks to the dataset only through its integration
seam (`cache_identity`, `export_population`, `import_population`, `read_window`); knows no
planner, no reader and no file layout but the snapshot's (snapshot.py). Forked workers use the
inherited dataset directly (`_PlanReader(ds, population)`); spawned ones get a `_Recipe` (a few
hundred bytes pickled, whatever the table size) and `_PlanReader.open` it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasetrt.errors import CacheFormatError
from datasetrt.integrations.torch.snapshot import read_snapshot, write_snapshot
from datasetrt.values.config import ReaderConfig

if TYPE_CHECKING:
    # Not imported at run time: datasets arrive as arguments, and a spawned worker reopens its
    # dataset with the class recorded in its `_Recipe` (datasetrt.dataset.cached forwards to this package).
    from datasetrt.dataset.seam import DatasetSeam


@dataclass(frozen=True)
class _Recipe:
    """Everything a spawned worker needs to rebuild the reading side; small and picklable."""

    dataset_class: type  # the CachedDataset (sub)class to reopen the caches with
    cache_dirs: tuple[str, ...]
    reader_config: dict
    dataset_key: str  # CacheIdentity.key: the caches as the parent opened them
    snapshot: str | None  # population snapshot; None = the physical population
    rows: int  # rows of the population (checked after the snapshot is mapped)


class _PlanReader:
    """The reading side in one process: a CachedDataset (read in-process), the population its
    plan draws from, and whether records' embedded metadata is checked (None: as the dataset's
    validate_cache says)."""

    def __init__(
        self, ds: DatasetSeam, population: Any, check_embedded: bool | None = None, mapping: Any = None
    ) -> None:
        self.pid = os.getpid()
        self.ds = ds
        self.population = population
        self.check_embedded = check_embedded
        self._mapping = mapping  # keeps the snapshot's memory map alive while the arrays are used

    @classmethod
    def open(cls, recipe: _Recipe) -> _PlanReader:
        cfg = dict(recipe.reader_config)
        validate = bool(cfg.get("validate_cache", False))
        cfg["validate_cache"] = False  # the parent validated at open; embedded checks still run per read
        ds = recipe.dataset_class(list(recipe.cache_dirs), reader_config=ReaderConfig(**cfg), runtime=None)
        if ds.cache_identity().key != recipe.dataset_key:
            raise CacheFormatError(
                "caches changed since the torch dataset was created (manifest or index rewritten): "
                + ", ".join(recipe.cache_dirs)
            )
        export, mapping = (None, None) if recipe.snapshot is None else read_snapshot(recipe.snapshot)
        population = ds.import_population(export)
        if len(population) != recipe.rows:
            raise CacheFormatError(
                f"population snapshot has {len(population)} rows, expected {recipe.rows}: {recipe.snapshot}"
            )
        return cls(ds, population, validate, mapping)

    def read(self, window: Any, transform: Callable | None) -> Iterator[Any]:
        """The samples of `window` (a worker's share), read in this process, transformed."""
        return self.ds.read_window(window, transform, in_process=True, check_embedded=self.check_embedded)

    def read_batches(self, window: Any, batch_size: int, buffers: Any) -> Iterator[Any]:
        """`window` (a worker's share) as SampleBatches of `batch_size`, gathered in this process
        into `buffers`' arrays (`CachedDataset.read_window_batches`), without metadata tables."""
        return self.ds.read_window_batches(
            window,
            batch_size,
            with_metadata=False,
            in_process=True,
            check_embedded=self.check_embedded,
            buffers=buffers,
        )


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
    """Writes a population's snapshot once (per population object) into the owner's temp dir
    (under `work_dir` if given), and builds the owner's recipes."""

    def __init__(self, owner: object, work_dir: str | None = None) -> None:
        self._owner = weakref.ref(owner)
        self._work_dir = work_dir
        self._dir: _TempDir | None = None
        self._last: tuple[Any, str | None] | None = None

    @property
    def directory(self) -> Path | None:
        return None if self._dir is None else self._dir.path

    def path_for(self, ds: DatasetSeam, population: Any) -> str | None:
        """The snapshot path of `population` (None for the physical population: no snapshot)."""
        if self._last is not None and self._last[0] is population:
            return self._last[1]
        export = ds.export_population(population)
        if export is None:
            return None
        if self._dir is None:
            self._dir = _TempDir(self._owner(), self._work_dir)
        run = Path(tempfile.mkdtemp(prefix="population-", dir=self._dir.path))
        path = str(write_snapshot(run, export))
        self._last = (population, path)
        return path

    def recipe(self, ds: DatasetSeam, population: Any) -> _Recipe:
        """How a spawned worker reopens `ds` and maps `population`."""
        path = self.path_for(ds, population)
        caches = ds.cache_identity()
        return _Recipe(type(ds), caches.cache_dirs, ds.reader_config.model_dump(), caches.key, path, len(population))
