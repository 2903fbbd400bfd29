"""`ds.to_torch_map_dataset()`: a map-style torch `Dataset` over a `CachedDataset`'s active table,
for a DataLoader with the user's own sampler or batch sampler.

Boundary: torch's `Dataset` only; the dataset is reached through its integration seam
(`cursor_state().population`, `read_rows`, and for spawned workers the recipe of spawn.py). No
plan, no order, no resume state: the sampler decides what is read, and in which order.

Index i is row i of the population the dataset had when this object was built (the active table
then; a later `update_metadata` does not reach it), read in the process that indexes it: the main
process, a forked DataLoader worker through the inherited dataset, or a spawned worker through
the caches reopened from the recipe, with the population mapped from its snapshot file.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from datasetrt.errors import ArgumentTypeError, SampleIndexError
from datasetrt.integrations.torch.spawn import _PlanReader, _Recipe, _Snapshots

if TYPE_CHECKING:
    from datasetrt.dataset.seam import DatasetSeam


class CachedMapDataset(Dataset):
    """Map-style torch `Dataset` (`ds.to_torch_map_dataset(sample_transform_fn)`): `len()` is the
    row count of the active table when it was built, `self[i]` is its row i (`ds[i]`, Python
    indexing) through `sample_transform_fn`, and `__getitems__(indices)` (what a DataLoader with a
    batch size calls) reads a whole batch of indexes in one in-process read. Picklable: a spawned
    worker reopens the caches (refusing caches rewritten since) and maps the population."""

    def __init__(self, dataset: DatasetSeam, sample_transform_fn: Callable | None = None) -> None:
        if sample_transform_fn is not None and not callable(sample_transform_fn):
            raise ArgumentTypeError(
                f"sample_transform_fn must be callable or None, got {type(sample_transform_fn).__name__}"
            )
        self._dataset: DatasetSeam | None = dataset
        self._population = dataset.cursor_state().population
        self._rows = len(self._population)
        self.sample_transform_fn = sample_transform_fn
        self._recipe: _Recipe | None = None  # in a spawned copy: how to reopen the reading side
        self._reader: _PlanReader | None = None
        self._snapshots = _Snapshots(self)

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, index: int) -> Any:
        [sample] = self.__getitems__([index])
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list:
        """The samples of rows `indices` (Python ints, numpy or 0-d tensor integers; -1 is the last
        row), in order; SampleIndexError naming the first index out of range."""
        rows = np.empty(len(indices), dtype=np.int64)
        for k, index in enumerate(indices):
            if isinstance(index, bool):
                raise ArgumentTypeError(f"dataset indices must be integers, not {type(index).__name__}")
            try:
                rows[k] = operator.index(index)
            except (TypeError, OverflowError):
                raise ArgumentTypeError(f"dataset indices must be integers in range, got {index!r}") from None
        bad = np.flatnonzero((rows < -self._rows) | (rows >= self._rows))
        if bad.size:
            raise SampleIndexError(
                f"row {int(rows[bad[0]])} is out of range for the {self._rows} rows of this map dataset"
            )
        rows %= max(1, self._rows)
        transform = self.sample_transform_fn
        if self._dataset is not None:
            return list(self._dataset.read_rows(rows, transform, population=self._population))
        reader = self._reader_here()
        return list(
            reader.ds.read_rows(rows, transform, population=reader.population, check_embedded=reader.check_embedded)
        )

    def _reader_here(self) -> _PlanReader:
        """The reading side of a spawned copy, opened from its recipe at the first read."""
        if self._reader is None:
            if self._recipe is None:
                raise RuntimeError("CachedMapDataset has neither a dataset nor a recipe to read through")
            self._reader = _PlanReader.open(self._recipe)
        return self._reader

    def __reduce__(self) -> Any:
        """Ship the caches' paths, the reader config and the population's snapshot path (the
        table itself is written once to a temp file this object owns, not pickled)."""
        if self._dataset is None:
            return _rebuild_map, (self._recipe, self.sample_transform_fn, self._rows)
        recipe = self._snapshots.recipe(self._dataset, self._population)
        return _rebuild_map, (recipe, self.sample_transform_fn, self._rows)


def _rebuild_map(recipe: _Recipe, transform: Callable | None, rows: int) -> CachedMapDataset:
    obj = CachedMapDataset.__new__(CachedMapDataset)
    obj._dataset, obj._population, obj._rows = None, None, rows
    obj.sample_transform_fn = transform
    obj._recipe, obj._reader = recipe, None
    obj._snapshots = _Snapshots(obj)
    return obj


def to_torch_map_dataset(dataset: DatasetSeam, sample_transform_fn: Callable | None = None) -> CachedMapDataset:
    """`CachedDataset.to_torch_map_dataset(sample_transform_fn)`."""
    return CachedMapDataset(dataset, sample_transform_fn)
