"""File sources: Parquet (files or directories), Arrow IPC / Feather v2, JSON Lines (plain or
compressed: .gz, .bz2, .zst, .lz4), read record batch by record batch.

Boundary: reads files with pyarrow and hands record batches to the column mapping; knows nothing of
the cache format or processes.

Memory: one record batch at a time, of about `batch_bytes` of input (Parquet: one row group's
column chunks for the chosen columns, decoded in batches; IPC: one stored record batch, read with
pread, never mapped, so pages of a large file are not charged to the process; JSON Lines: one
block of `batch_bytes` / 8 of text cut at line ends, grown to hold a longer line up to
`max_line_bytes`, which parses to several times its size: see jsonl.py). Files are opened when
iteration reaches them and closed when it leaves them.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from datasetrt.errors import ConfigError, SourceInputError
from datasetrt.sources.base import BATCH_BYTES, BatchSource, Part, slices
from datasetrt.sources.columns import Columns, Where
from datasetrt.sources.jsonl import (
    BLOCK_BYTES_CAP,
    JSON_TEXT_FACTOR,
    MAX_LINE_BYTES,
    MIN_BLOCK_BYTES,
    JsonText,
    given_types,
)

PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
JSONL_SUFFIXES = tuple(s + c for s in (".jsonl", ".ndjson") for c in ("", ".gz", ".bz2", ".zst", ".lz4"))

PathArg = str | os.PathLike | Sequence[str | os.PathLike]


def list_files(paths: PathArg, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """The files named by `paths` (a path or a list of them); a directory stands for its files
    ending in one of `suffixes`, recursively, sorted by relative path. Missing paths and
    directories without such files are a ConfigError."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                (f for f in p.rglob("*") if f.is_file() and f.name.lower().endswith(suffixes)),
                key=lambda f: f.relative_to(p).as_posix(),
            )
            if not found:
                raise ConfigError(f"{p}: no {what} files (*{', *'.join(suffixes)}) in this directory")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"{p}: no such file or directory")
    if not files:
        raise ConfigError(f"no {what} files given")
    return files


def _reading(path: Path, where: str, exc: Exception) -> SourceInputError:
    return SourceInputError(f"{path}{where}: cannot read: {type(exc).__name__}: {exc}")


class _FileSource(BatchSource):
    SUFFIXES: tuple[str, ...] = ()
    WHAT = ""

    def __init__(
        self,
        name: str,
        paths: PathArg,
        *,
        payload: str | None = None,
        metadata: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
        batch_bytes: int = BATCH_BYTES,
        columns: Columns | None = None,
    ) -> None:
        super().__init__(
            name,
            payload=payload,
            metadata=metadata,
            rename=rename,
            payload_spec=payload_spec,
            index_column=index_column,
            batch_bytes=batch_bytes,
            columns=columns,
        )
        self.files = list_files(paths, self.SUFFIXES, self.WHAT)

    def _parts(self) -> Generator[Part, None, None]:
        for path in self.files:
            yield from self._file_parts(path)

    def _file_parts(self, path: Path) -> Iterator[Part]:
        raise NotImplementedError


class ParquetSource(_FileSource):
    """Parquet files (any codec pyarrow reads), or directories of them, in order: one cache.

    Each file is read row group by row group (only the payload and metadata columns), decoded in
    batches of about `batch_bytes`. Errors name the file, row group and row. `len()` reads the
    files' footers.
    """

    SUFFIXES = PARQUET_SUFFIXES
    WHAT = "Parquet"

    def __len__(self) -> int:
        total = 0
        for path in self.files:
            try:
                total += pq.read_metadata(path).num_rows
            except (pa.ArrowException, OSError) as exc:
                raise _reading(path, "", exc) from None
        return total

    def _file_parts(self, path: Path) -> Iterator[Part]:
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise _reading(path, "", exc) from None
        with closing(pf):
            yield Part(str(path), pf.schema_arrow, self._row_groups(path, pf))

    def _row_groups(self, path: Path, pf: pq.ParquetFile) -> Iterator[tuple[Where, pa.RecordBatch]]:
        meta = pf.metadata
        wanted = self._wanted(pf)
        row = 0
        for group in range(meta.num_row_groups):
            rg = meta.row_group(group)
            rows = self.batch_rows(rg.total_byte_size / max(1, rg.num_rows))
            at = 0
            try:
                for batch in pf.iter_batches(batch_size=rows, row_groups=[group], columns=wanted, use_threads=False):
                    yield Where(str(path), "row group", group, row + at, at), batch
                    at += batch.num_rows
            except (pa.ArrowException, OSError) as exc:
                raise _reading(path, f": row group {group}", exc) from None
            row += rg.num_rows

    def _wanted(self, pf: pq.ParquetFile) -> list[str]:
        """Only the columns the mapping reads (all but the payload when metadata is None)."""
        c = self.columns
        if c.payload is None or c.metadata is None:
            return pf.schema_arrow.names
        return [c.payload, *c.metadata]


class ArrowSource(_FileSource):
    """Arrow IPC files (Feather v2, `.arrow`) or IPC streams (`.arrows`), or directories of them.

    Read one stored record batch at a time with pread (never memory-mapped), converted in slices of
    about `batch_bytes`. Errors name the file, record batch and row.
    """

    SUFFIXES = ARROW_SUFFIXES
    WHAT = "Arrow IPC"

    def _file_parts(self, path: Path) -> Iterator[Part]:
        try:
            f = pa.OSFile(str(path), "rb")
        except (pa.ArrowException, OSError) as exc:
            raise _reading(path, "", exc) from None
        with closing(f):
            try:
                reader = ipc.open_file(f)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:  # not the file format: an IPC stream?
                f.seek(0)
                try:
                    reader = ipc.open_stream(f)
                except (pa.ArrowException, OSError) as exc:
                    raise _reading(
                        path, " (neither an Arrow IPC file nor stream; Feather v1 is not read)", exc
                    ) from None
                batches = iter(reader)
            yield Part(str(path), reader.schema, self._batches(path, batches))

    def _batches(self, path: Path, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[Where, pa.RecordBatch]]:
        row = 0
        index = 0
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise _reading(path, f": record batch {index}", exc) from None
            if batch is None:
                return
            rows = self.batch_rows(batch.nbytes / max(1, batch.num_rows))
            for start, piece in slices(batch, rows):
                yield Where(str(path), "record batch", index, row + start, start), piece
            row += batch.num_rows
            index += 1


class JsonLinesSource(_FileSource):
    """JSON Lines files (one object per line; `.gz`, `.bz2`, `.zst`, `.lz4` decompressed by
    extension), or directories of them, in order (reading: `jsonl.py`).

    Text is parsed in blocks of `block_bytes` (default `batch_bytes` / 8) cut at line ends; a
    longer line grows its block, up to `max_line_bytes` (default 64 MiB, or `block_bytes` when
    larger). Column types are given in `column_types` (some columns: name -> pyarrow type or its
    name, e.g. `{"tokens": pa.list_(pa.int32())}` or `{"tokens": "list<int32>"}`) or `schema`
    (every column read; the others are ignored); the others are inferred by a first pass over every file, one block at a
    time (none when every column the mapping reads has a type). Integers are read exactly or
    refused; a column mixing integers and floats is refused unless given a float type. Errors name
    the file, the record (0-based object index: the line number when the file has no blank lines)
    and the column.
    """

    SUFFIXES = JSONL_SUFFIXES
    WHAT = "JSON Lines"

    def __init__(
        self,
        name: str,
        paths: PathArg,
        *,
        column_types: Mapping[str, pa.DataType | str] | None = None,
        schema: pa.Schema | Mapping[str, pa.DataType | str] | None = None,
        block_bytes: int | None = None,
        max_line_bytes: int | None = None,
        payload: str | None = None,
        metadata: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
        batch_bytes: int = BATCH_BYTES,
        columns: Columns | None = None,
    ) -> None:
        super().__init__(
            name,
            paths,
            payload=payload,
            metadata=metadata,
            rename=rename,
            payload_spec=payload_spec,
            index_column=index_column,
            batch_bytes=batch_bytes,
            columns=columns,
        )
        given, whole = given_types(column_types, schema)
        self.column_types = given
        c = self.columns
        needed = None if c.payload is None or c.metadata is None else [c.payload, *c.metadata]
        if block_bytes is None:
            block_bytes = max(MIN_BLOCK_BYTES, min(batch_bytes // JSON_TEXT_FACTOR, BLOCK_BYTES_CAP))
        if max_line_bytes is None:
            max_line_bytes = max(MAX_LINE_BYTES, block_bytes) if isinstance(block_bytes, int) else MAX_LINE_BYTES
        self.text = JsonText(self.files, given, whole, needed, block_bytes, max_line_bytes)

    def _file_parts(self, path: Path) -> Iterator[Part]:
        schema = self.text.schema()
        if schema is not None:
            yield Part(str(path), schema, self._batches(path))

    def _batches(self, path: Path) -> Iterator[tuple[Where, pa.RecordBatch]]:
        for record, batch in self.text.batches(path):
            yield Where(str(path), None, 0, record, 0, row_word="record"), batch
