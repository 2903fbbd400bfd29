"""`CachedDataset`'s integration seam: the protocol integrations see a dataset through
(`DatasetSeam`) and its value types: the cursor state, the caches' identity and a population
exported for another process (docs/python-api.md, "Integration seam").

Boundary: plain values (ints, strings, numpy arrays) and a protocol; no planning, no I/O, no
torch. The seam's methods are on `CachedDataset` (cached.py), which builds and consumes these
values; integrations (the torch datasets) hold them without knowing the dataset's fields, and
type a dataset as `DatasetSeam`, so they never import the dataset module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from datasetrt.sampling.populations import PopulationExport

if TYPE_CHECKING:
    from datasetrt.runtime.sample_batch import SampleBatch
    from datasetrt.sampling.planner import ActiveRows, PlanWindow, Population, Window
    from datasetrt.values.config import PayloadSpec, ReaderConfig
    from datasetrt.values.records import CachedSample

__all__ = ["CacheIdentity", "CursorState", "DatasetSeam", "PopulationExport"]


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
        return (
            type(cursor) is int
            and 0 <= cursor < max(rows, 1)
            and type(offset) is int
            and 0 <= offset < 1 << 64
            and (epoch_len is None or (type(epoch_len) is int and epoch_len >= 1))
        )


@dataclass(frozen=True)
class CacheIdentity:
    """A dataset's caches, two ways. Logical: `cache_ids` (uint64) and `sample_counts` (int64),
    one per cache in path order — the same for a copy of the caches elsewhere (resume states name
    it). Physical: `cache_dirs` (absolute directories, or the URL of a cache in object storage; path order) and `key`, which also covers
    each cache's manifest and index as opened (device, inode, mtime) and the verify flag, so a
    process that reopens the directories can refuse caches rewritten since."""

    cache_ids: np.ndarray
    sample_counts: np.ndarray
    cache_dirs: tuple[str, ...]
    key: str


class DatasetSeam(Protocol):
    """What an integration may use of a dataset (`CachedDataset` implements it): its reader
    configuration, windows (peek, reserve, plan), populations (rows, selections, exports), reads
    of any window or share or of given rows, the cursor state and the caches' identity."""

    reader_config: ReaderConfig

    @property
    def payload_spec(self) -> PayloadSpec | None: ...

    @property
    def reads_with_workers(self) -> bool: ...

    def __len__(self) -> int: ...

    def peek_window(self) -> Window | PlanWindow: ...

    def reserve_window(self) -> Window | PlanWindow: ...

    def plan_window(
        self,
        start: int,
        length: int,
        *,
        population: Population | None = None,
        shuffle: bool | None = None,
        seed: int | None = None,
        rank_layout: tuple[int, int, bool] | None = None,
    ) -> Window | PlanWindow: ...

    def population_rows(
        self, population: Population | None = None, *, expand_physical: bool = False
    ) -> ActiveRows | None: ...

    def population_from_rows(
        self,
        cache_pos: np.ndarray,
        sample_id: np.ndarray,
        weights: np.ndarray,
        *,
        source: Population | None = None,
        selection: np.ndarray | None = None,
    ) -> Population: ...

    def export_population(self, population: Population) -> PopulationExport | None: ...

    def import_population(self, export: PopulationExport | None) -> Population: ...

    def order_identity(self, population: Population | None = None) -> str: ...

    def read_window(
        self,
        window: Window | PlanWindow,
        transform: Callable[[CachedSample], Any] | None = None,
        *,
        in_process: bool = False,
        check_embedded: bool | None = None,
    ) -> Iterator[Any]: ...

    def read_rows(
        self,
        rows: np.ndarray,
        transform: Callable[[CachedSample], Any] | None = None,
        *,
        population: Population | None = None,
        check_embedded: bool | None = None,
    ) -> Iterator[Any]: ...

    def read_window_batches(
        self,
        window: Window | PlanWindow,
        batch_size: int,
        *,
        with_metadata: bool = True,
        in_process: bool = False,
        check_embedded: bool | None = None,
        buffers: Any = None,
    ) -> Iterator[SampleBatch]: ...

    def iter_batches(
        self, batch_size: int, *, drop_last: bool = False, with_metadata: bool = True
    ) -> Iterator[SampleBatch]: ...

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
    ) -> Any: ...  # a dataset.packing.PackedBatches

    def sample_columns(self, cache_id: np.ndarray, sample_id: np.ndarray, names: Sequence[str]) -> dict[str, Any]: ...

    def cursor_state(self) -> CursorState: ...

    def cursor_state_from(self, values: Mapping[str, Any]) -> CursorState: ...

    def restore_cursor_state(self, state: CursorState) -> None: ...

    def cache_identity(self) -> CacheIdentity: ...

    def hold_stages(self, owner: object) -> None: ...
