"""What the format layer's operations report: one `CacheWriteSuccess` / `CacheWriteError` per
source of a write, and `update_manifests`' `Ok(ManifestUpdateReport)` / `Err(ManifestUpdateError)`.

Boundary: plain data holders (dataset-rt 0.4.8's result types, name for name); no I/O. Every
class reports `__module__ == "datasetrt.api"` so pickles name the stable public path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, NamedTuple, TypeVar

T = TypeVar("T")
E = TypeVar("E")


class CacheWriteSuccess(NamedTuple):
    source_name: str
    path: Path


class CacheWriteError(NamedTuple):
    source_name: str
    message: str


CacheWriteResult = CacheWriteSuccess | CacheWriteError


@dataclass(frozen=True)
class Ok(Generic[T]):
    value: T


@dataclass(frozen=True)
class Err(Generic[E]):
    error: E


Result = Ok[T] | Err[E]


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
    path: Path | AbsentManifestTarget
    message: str
    entries: tuple = ()


for _cls in (
    CacheWriteSuccess,
    CacheWriteError,
    Ok,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateReport,
    AbsentManifestTarget,
    ManifestUpdateError,
):
    _cls.__module__ = "datasetrt.api"
del _cls
