"""Value types of `CachedDataset`'s integration seam: the cursor state, the caches' identity and a
population exported for another process (docs/python-api.md, "Integration seam").

Boundary: plain values (ints, strings, numpy arrays); no planning, no I/O, no torch. The seam's
methods are on `CachedDataset` (dataset.py), which builds and consumes these values; integrations
(the torch datasets) hold them without knowing the dataset's fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class CursorState:
    """Where a dataset's next window starts: `cursor` (ordered mode: the next population row),
    `draw_offset` (shuffled mode: the next draw index, u64) and `epoch_len` (window length; None
    = the population size). `population` is the (opaque) population these positions were taken
    for or checked against; it is not part of `as_dict()` and never compared.

    `CachedDataset.cursor_state()` reads one under the dataset's lock; `cursor_state_from(values)`
    checks saved values; `restore_cursor_state(state)` writes one back under the lock.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ("cursor", "draw_offset", "epoch_len")

    cursor: int
    draw_offset: int
    epoch_len: int | None
    population: Any = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The positions as plain Python values, keyed by `FIELDS` (json- and torch.save-able)."""
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def values_from(cls, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The `FIELDS` of a saved mapping, in order (None where missing), unchecked."""
        return tuple(values.get(name) for name in cls.FIELDS)

    def valid_for(self, rows: int) -> bool:
        """Integers in range for a population of `rows` rows: cursor in [0, max(rows, 1)), draw
        offset a u64, epoch_len None or >= 1."""
        cursor, offset, epoch_len = self.cursor, self.draw_offset, self.epoch_len
        return (type(cursor) is int and 0 <= cursor < max(rows, 1) and type(offset) is int
                and 0 <= offset < 1 << 64 and (epoch_len is None or (type(epoch_len) is int and epoch_len >= 1)))


@dataclass(frozen=True)
class CacheIdentity:
    """A dataset's caches, two ways. Logical: `cache_ids` (uint64) and `sample_counts` (int64),
    one per cache in path order — the same for a copy of the caches elsewhere (resume states name
    it). Physical: `cache_dirs` (absolute directories, path order) and `key`, which also covers
    each cache's manifest and index as opened (device, inode, mtime) and the verify flag, so a
    process that reopens the directories can refuse caches rewritten since."""

    cache_ids: np.ndarray
    sample_counts: np.ndarray
    cache_dirs: tuple[str, ...]
    key: str


@dataclass(frozen=True)
class PopulationExport:
    """A population as another process rebuilds it (`CachedDataset.import_population`):
    `columns`, named 1-D numpy arrays of one entry per population row, `params`, a few named
    floats, and `order`, an opaque picklable value (the mixture or curriculum set over the rows,
    or None).
    Only their producer and consumer (dataset.py) know the names; a carrier (the torch
    population snapshot) stores and maps them as they are."""

    columns: dict[str, np.ndarray]
    params: dict[str, float]
    order: Any = None  # the population's `Mixture` or `Curriculum` (picklable), or None

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0
