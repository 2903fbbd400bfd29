"""Public record types: what sources yield, what readers return, what writes report.

Boundary: plain data holders; no I/O. Every class reports `__module__ == "datasetrt.api"` so pickles
name the stable public path, as dataset-rt's do for `dataset_rt.api`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, Protocol, TypeVar, Union, runtime_checkable

from datasetrt.errors import ArgumentTypeError, SampleIndexError

if TYPE_CHECKING:
    from datasetrt.dataset import CachedDataset

BytesLike = Union[bytes, bytearray, memoryview]
MetadataValue = Union[bool, int, float, str]
Metadata = Mapping[str, MetadataValue]

T = TypeVar("T")
E = TypeVar("E")


class CacheInput(NamedTuple):
    """One sample as a source yields it: payload bytes and flat primitive metadata."""

    data: BytesLike
    metadata: Metadata


class CachedSample(NamedTuple):
    """One sample as read back. `metadata` is parsed from the record's embedded JSON, keys sorted."""

    data: bytes
    metadata: dict
    cache_id: int
    sample_id: int


class CacheWriteSuccess(NamedTuple):
    source_name: str
    path: Path


class CacheWriteError(NamedTuple):
    source_name: str
    message: str


CacheWriteResult = Union[CacheWriteSuccess, CacheWriteError]


class CacheSourcesDatasetSuccess(NamedTuple):
    dataset: "CachedDataset"
    results: list


class CacheSourcesDatasetError(NamedTuple):
    results: list
    message: str


CacheSourcesDatasetResult = Union[CacheSourcesDatasetSuccess, CacheSourcesDatasetError]


class Deferred:
    """A value computed on first use, once (`SampleBatch.metadata`)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Any) -> None:
        self.compute = compute


@dataclass(frozen=True, eq=False)
class SampleBatch:
    """A batch of consecutive plan positions without a Python object per sample (datasetrt).

    `data` (uint8) holds the payloads back to back; payload i is data[offsets[i]:offsets[i+1]]
    (`offsets` int64, len n+1). `cache_id`/`sample_id` are uint64 arrays of length n.
    `metadata` is a pyarrow Table with the dataset table's rows for these samples (the table the
    window was planned from, so weights and extra columns come along), or None when not
    requested. It is built on first access — a consumer that never reads it never imports
    pyarrow or Polars — and always from the table as it was when the window was reserved.
    Arrays are owned by the batch (no views into reader buffers).
    """

    data: Any
    offsets: Any
    cache_id: Any
    sample_id: Any
    _metadata: Any = field(default=None, repr=False)

    @property
    def metadata(self) -> Any:
        value = self._metadata
        if isinstance(value, Deferred):
            value = value.compute()
            object.__setattr__(self, "_metadata", value)
        return value

    def __len__(self) -> int:
        return len(self.cache_id)

    def payload(self, i: int) -> memoryview:
        """Zero-copy view of payload i; Python indexing: -1 is the last payload, and an index
        outside [-len, len) raises SampleIndexError (an IndexError) naming it and the length."""
        k = batch_position(i, len(self.cache_id))
        return memoryview(self.data)[int(self.offsets[k]) : int(self.offsets[k + 1])]


def batch_position(i: Any, length: int) -> int:
    """The position in [0, length) that index `i` names, with Python's sequence semantics
    (negative counts from the end). Raises ArgumentTypeError for a non-integer (numpy integers are
    integers) and SampleIndexError naming `i` and `length` when out of range. O(1)."""
    try:
        k = operator.index(i)
    except TypeError:
        raise ArgumentTypeError(f"batch indices must be integers, not {type(i).__name__}") from None
    if not -length <= k < length:
        raise SampleIndexError(f"batch index {k} is out of range for a batch of {length} samples")
    return k + length if k < 0 else k


@runtime_checkable
class CacheSource(Protocol):
    """A named iterable of CacheInput. The name becomes the cache directory and its v3 cache_id."""

    name: str

    def __iter__(self) -> Iterator[CacheInput]: ...


@runtime_checkable
class SizedTorchIterableDataset(Protocol):
    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class Ok(Generic[T]):
    value: T


@dataclass(frozen=True)
class Err(Generic[E]):
    error: E


Result = Union[Ok[T], Err[E]]


@dataclass(frozen=True)
class ManifestUpdateEntry:
    path: Path
    cache_id: int
    status: Literal["updated", "unchanged", "durability_unknown"]


@dataclass(frozen=True)
class ManifestUpdateReport:
    entries: tuple


@dataclass(frozen=True)
class AbsentManifestTarget:
    reason: str


@dataclass(frozen=True)
class ManifestUpdateError:
    path: Union[Path, AbsentManifestTarget]
    message: str
    entries: tuple = ()


PUBLIC_RECORDS = (
    CacheInput, CachedSample, CacheWriteSuccess, CacheWriteError, CacheSourcesDatasetSuccess,
    CacheSourcesDatasetError, CacheSource, SizedTorchIterableDataset, SampleBatch, Ok, Err, ManifestUpdateEntry,
    ManifestUpdateReport, AbsentManifestTarget, ManifestUpdateError,
)
for _cls in PUBLIC_RECORDS:
    _cls.__module__ = "datasetrt.api"
del _cls
