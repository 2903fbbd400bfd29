"""What the format layer's operations report: one `CacheWriteSuccess` / `CacheWriteError` per
source of a write, and `update_manifests`' `Ok(ManifestUpdateReport)` / `Err(ManifestUpdateError)`.

Boundary: plain data holders (dataset-rt 0.4.8's result types, name for name); no I/O. Every
class reports `__module__ == "datasetrt.api"` so pickles name the stable public path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, NamedTuple, TypeVar

T = TypeVar("T")
E = TypeVar("E")


class _CacheWriteSuccessFields(NamedTuple):
    source_name: str
    path: Path


class CacheWriteSuccess(_CacheWriteSuccessFields):
    """A published cache: `path` is complete (all of its files were durable before its rename).

    Its tuple is dataset-rt's two fields (`source_name`, `path`: unpacking, indexing and equality
    are theirs). `durable` (keyword-only, default True) is False when the fsync of the base
    directory after the rename failed: the cache is in place and complete, but the rename is not
    known to survive a crash. Writing the same name again fsyncs the base directory again and
    reports the same cache (durable once that fsync succeeds) instead of "cache path already
    exists" (docs/reliability.md, "Writer failure paths")."""

    durable: bool = True  # the class default; a non-durable result sets its own

    def __new__(cls, source_name: str, path: Path, *, durable: bool = True) -> CacheWriteSuccess:
        self = super().__new__(cls, source_name, path)
        if not durable:
            self.durable = False  # pickled with the instance (its __dict__)
        return self

    def __repr__(self) -> str:
        text = super().__repr__()
        return text if self.durable else f"{text[:-1]}, durable=False)"

    def _replace(self, **changes: Any) -> CacheWriteSuccess:
        durable = changes.pop("durable", self.durable)
        return type(self)(*super()._replace(**changes), durable=durable)


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
