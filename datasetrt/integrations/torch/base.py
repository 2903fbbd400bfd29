"""What both torch datasets share: the dataset in the process that built them (None in a spawned
copy), the reading side per process, pass counting in DataLoader workers, the snapshot dir for
spawned copies, and the identity digests their resume states carry.

Boundary: torch's `IterableDataset` and `get_worker_info` only; the dataset is reached through
its integration seam, the reading side through spawn.py. No planning arithmetic (plan.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from datasetrt.errors import CacheFormatError, ConfigError, LoaderStateError
from datasetrt.integrations.torch.spawn import _PlanReader, _Recipe, _Snapshots

if TYPE_CHECKING:
    from datasetrt.dataset.seam import DatasetSeam


def _worker_identity() -> tuple[int, int, bool]:
    """(worker id, worker count, in a DataLoader worker)."""
    info = get_worker_info()
    return (0, 1, False) if info is None else (info.id, info.num_workers, True)


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        # numpy's stubs give ndarray `__buffer__` only for Python >= 3.12 (we check as 3.11)
        h.update(np.ascontiguousarray(arr).view(np.uint8))  # type: ignore[arg-type]
    return h.hexdigest()


DIGEST_BLOCK = 1 << 20  # positions widened to int64 per block of the rows digest


def _rows_digest(cache_pos: np.ndarray, sample_id: np.ndarray, weights: np.ndarray | None) -> str:
    """Identity of active rows (`DatasetSeam.population_rows`): positions, ids and weights. The
    positions are hashed as int64 whatever dtype the rows keep them in (blockwise: no per-row
    copy), so a state's digest does not depend on it. A dataset's own populations always keep
    their weights; only a spawned worker's rebuilt one may lack them."""
    if weights is None:  # pragma: no cover - see above
        raise CacheFormatError("the dataset's active rows carry no weights")
    h = hashlib.blake2b(digest_size=16)
    for lo in range(0, len(cache_pos), DIGEST_BLOCK):
        h.update(np.ascontiguousarray(cache_pos[lo : lo + DIGEST_BLOCK], dtype=np.int64).view(np.uint8))  # type: ignore[arg-type]
    for arr in (sample_id, weights):
        h.update(np.ascontiguousarray(arr).view(np.uint8))  # type: ignore[arg-type]
    return h.hexdigest()


def _caches_digest(ds: DatasetSeam) -> str:
    """Identity of the caches a state was taken on: their ids and sample counts, in path order."""
    caches = ds.cache_identity()
    return _digest(caches.cache_ids, caches.sample_counts)


# Identity keys a state carries only when they differ from their default (states of draws-mode
# datasets, older states included, have no "sampling").
_IDENTITY_DEFAULTS = {"sampling": "draws"}


def _with_order(identity: dict, order: str) -> dict:
    """`identity` plus the dataset's order (`CachedDataset.order_identity`) unless it is "draws"."""
    return identity if order == _IDENTITY_DEFAULTS["sampling"] else {**identity, "sampling": order}


def _check_identity(state: Mapping[str, Any], mine: dict, what: str) -> None:
    """Refuse a state of another plan, naming the first difference."""
    names = {
        "caches": "the caches differ",
        "table": "the active table (rows, order or weights) differs",
        "sampling": "the sampling order (ReaderConfig.sampling, the mixture or the curriculum) differs",
    }
    for key, value in {**_IDENTITY_DEFAULTS, **mine}.items():
        if state.get(key, _IDENTITY_DEFAULTS.get(key)) != value:
            raise ConfigError(
                f"{what} state does not match: {names.get(key, f'{key} differs')} "
                f"(state {state.get(key)!r}, here {value!r})"
            )


# Why a torch reader refuses advance() (docs/sampling.md, "Advancing a dataset's curriculum").
ADVANCE_REFUSED = (
    "advance() is not supported on torch loaders: DataLoader workers plan their batches from their "
    "own copy of the curriculum, fixed when they start, so a stage cannot end early at a batch "
    "boundary they have not produced yet without a channel to every worker; stages follow their "
    "lengths here. Read with ds.iter_batches() (in-process or reader workers) to advance"
)


def refuse_advance() -> None:
    raise LoaderStateError(ADVANCE_REFUSED)


class _PlanDataset(IterableDataset):
    """Base of `CachedIterableDataset` and `LoaderDataset`. In the process that built it,
    `_dataset` is the `CachedDataset`; a spawned copy (`_rebuilt`) has None there and rebuilds
    its reading side from `_recipe_shipped`. A forked copy keeps the inherited dataset."""

    def _require_dataset(self) -> DatasetSeam:
        """The dataset; present in the process that built this object and its forked workers."""
        if self._dataset is None:
            raise RuntimeError(
                f"{type(self).__name__} has no dataset in this process: a spawned copy reads only through its recipe"
            )
        return self._dataset

    def _setup(self, dataset: DatasetSeam | None, recipe: _Recipe | None, work_dir: str | None = None) -> None:
        self._dataset = dataset
        self._recipe_shipped = recipe
        self._owner_pid = os.getpid()
        self._local: tuple[int, int] | None = None  # (pid, passes this process started)
        self._reader: _PlanReader | None = None
        self._snapshots = _Snapshots(self, work_dir)

    @classmethod
    def _rebuilt(cls, recipe: _Recipe | None) -> Any:
        """The copy a spawned worker unpickles (no dataset: reads through `recipe`)."""
        obj = cls.__new__(cls)
        obj._setup(None, recipe)
        return obj

    def _next_pass(self) -> int:
        """How many passes this process already started (0 in a fresh worker), then +1."""
        pid = os.getpid()
        local = self._local
        k = local[1] if local is not None and local[0] == pid else 0
        self._local = (pid, k + 1)
        return k

    def _reader_here(self, population: Any = None) -> _PlanReader:
        """This process's reading side: a forked worker reads the inherited dataset and
        `population`; a spawned one reopens the recipe's caches and maps its snapshot."""
        if self._reader is None or self._reader.pid != os.getpid():
            if self._dataset is not None:
                self._reader = _PlanReader(self._dataset, population)
            elif self._recipe_shipped is not None:
                self._reader = _PlanReader.open(self._recipe_shipped)
            else:  # no recipe is shipped for a loader plan without rows, which no pass reads
                raise RuntimeError(f"{type(self).__name__} has neither a dataset nor a recipe to read through")
        return self._reader

    def _recipe_for(self, population: Any) -> _Recipe:
        """What a spawned worker needs to read `population` (in the process holding the dataset)."""
        return self._snapshots.recipe(self._require_dataset(), population)

    def advance(self) -> None:
        """Refused with `LoaderStateError` (ADVANCE_REFUSED says why)."""
        refuse_advance()

    @property
    def snapshot_dir(self) -> Path | None:
        """The temp dir holding population snapshots for spawned workers (None until needed)."""
        return self._snapshots.directory
