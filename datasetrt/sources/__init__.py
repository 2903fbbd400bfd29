"""Sources: adapters from the data users have to CacheSource (named iterables of CacheInput).

Boundary: columnar and bounded readers of Parquet, Arrow IPC / Feather, JSON Lines, CSV, Hugging Face
datasets, numpy arrays and in-memory Arrow data; they know nothing of the cache format or of
processes (the writer validates and stores what they yield).

Every source takes the same column mapping (`payload=`, `metadata=`, `rename=`, `payload_spec=`,
`index_column=`, `batch_bytes=`; see `Columns`) and is usable with `rt.write_cache([...], base)`;
its `payload_spec` (a `datasetrt.PayloadSpec`, given or inferred from a list column) is recorded
by `write_cache` when `WriterConfig.payload_spec` is unset and every source of the call agrees
(`PayloadSpecMismatchError` when a source's differs from the config's or from another source's).
`open_path(path, name, ...)` picks the adapter for a file or directory by its suffix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasetrt.errors import ConfigError
from datasetrt.sources.arrays import NumpySource
from datasetrt.sources.base import BATCH_BYTES, BatchSource, RecordBatchSource
from datasetrt.sources.columns import Columns
from datasetrt.sources.delimited import CSV_SUFFIXES, CsvSource
from datasetrt.sources.files import (
    ARROW_SUFFIXES,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    ArrowSource,
    JsonLinesSource,
    ParquetSource,
    _FileSource,
)
from datasetrt.sources.hf import HFDatasetSource

__all__ = [
    "ArrowSource",
    "BatchSource",
    "Columns",
    "CsvSource",
    "HFDatasetSource",
    "JsonLinesSource",
    "NumpySource",
    "ParquetSource",
    "RecordBatchSource",
    "default_name",
    "open_path",
]

_KINDS = (
    (PARQUET_SUFFIXES, ParquetSource),
    (ARROW_SUFFIXES, ArrowSource),
    (JSONL_SUFFIXES, JsonLinesSource),
    (CSV_SUFFIXES, CsvSource),
)


def _kind(name: str) -> type[_FileSource] | None:
    lower = name.lower()
    for suffixes, cls in _KINDS:
        if lower.endswith(suffixes):
            return cls
    return None


def default_name(path: str | os.PathLike) -> str:
    """A cache name for `path`: the file name without its data suffixes (`train.jsonl.gz` ->
    `train`), or the directory's name."""
    p = Path(path)
    name = p.name
    if p.is_file():
        lower = name.lower()
        for suffixes, _ in _KINDS:
            for suffix in sorted(suffixes, key=len, reverse=True):
                if lower.endswith(suffix):
                    return name[: -len(suffix)] or name
    return name


def open_path(
    path: str | os.PathLike,
    name: str | None = None,
    *,
    payload: str | None = None,
    metadata: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None,
    payload_spec: Any = None,
    index_column: str | None = None,
    batch_bytes: int = BATCH_BYTES,
    columns: Columns | None = None,
    column_types: Mapping[str, Any] | None = None,
    schema: Any = None,
    block_bytes: int | None = None,
    max_line_bytes: int | None = None,
) -> BatchSource:
    """The source for a Parquet / Arrow IPC / JSON Lines / CSV file, or a directory of one of those
    kinds (by suffix; a directory mixing kinds is a ConfigError). `name` defaults to `default_name`;
    the column keywords are the sources' (`Columns`); `column_types` is `JsonLinesSource`'s and
    `CsvSource`'s, `schema`, `block_bytes` and `max_line_bytes` are `JsonLinesSource`'s (a
    ConfigError for another kind)."""
    p = Path(path)
    cls: type[_FileSource] | None
    if p.is_dir():
        kinds = {kind for f in p.rglob("*") if f.is_file() and (kind := _kind(f.name)) is not None}
        if len(kinds) != 1:
            found = ", ".join(sorted(k.__name__ for k in kinds)) or "no Parquet, Arrow IPC, JSON Lines or CSV files"
            raise ConfigError(f"{p}: cannot tell which source reads this directory ({found})")
        cls = kinds.pop()
    elif p.is_file():
        cls = _kind(p.name)
        if cls is None:
            raise ConfigError(f"{p}: unknown file type; expected *{', *'.join(s for k, _ in _KINDS for s in k)}")
    else:
        raise ConfigError(f"{p}: no such file or directory")
    json_options = {
        "column_types": column_types,
        "schema": schema,
        "block_bytes": block_bytes,
        "max_line_bytes": max_line_bytes,
    }
    extra: dict[str, Any] = {k: v for k, v in json_options.items() if v is not None}
    accepted = set(json_options) if cls is JsonLinesSource else {"column_types"} if cls is CsvSource else set()
    if refused := [k for k in extra if k not in accepted]:
        raise ConfigError(f"{p}: {', '.join(refused)} do not apply to {cls.__name__}")
    return cls(
        name if name is not None else default_name(p),
        p,
        payload=payload,
        metadata=metadata,
        rename=rename,
        payload_spec=payload_spec,
        index_column=index_column,
        batch_bytes=batch_bytes,
        columns=columns,
        **extra,
    )
