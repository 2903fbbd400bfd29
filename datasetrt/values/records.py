"""Plain values every layer shares: what sources yield (`CacheInput`), what readers return
(`CachedSample`), the `CacheSource` protocol and the sized-iterable protocol of torch datasets.

Boundary: plain data holders; no I/O, no numpy. Every class reports `__module__ == "datasetrt.api"`
so pickles name the stable public path, as dataset-rt's do for `dataset_rt.api`. The records of
an operation live with the code that produces them: write and manifest-update results in
`format/results.py`, `SampleBatch` in `runtime/sample_batch.py`, `StageInfo` in
`sampling/curriculum.py`, `CacheSourcesDataset*` in `dataset/runtime.py`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

BytesLike = bytes | bytearray | memoryview
MetadataValue = bool | int | float | str
Metadata = Mapping[str, MetadataValue]


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


@runtime_checkable
class CacheSource(Protocol):
    """A named iterable of CacheInput. The name becomes the cache directory and its v3 cache_id."""

    name: str

    def __iter__(self) -> Iterator[CacheInput]: ...


@runtime_checkable
class SizedTorchIterableDataset(Protocol):
    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


for _cls in (CacheInput, CachedSample, CacheSource, SizedTorchIterableDataset):
    _cls.__module__ = "datasetrt.api"
del _cls
