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
import urllib.parse
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


HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # pyarrow's (and Hive's) directory name for a null partition value
INT32 = (-(2**31), 2**31 - 1)


def hive_segments(root: Path, path: Path) -> list[tuple[str, str]]:
    """The `key=value` directory names between `root` and the file `path`, in order, with the
    value %-decoded as pyarrow's `segment_encoding="uri"` does (directories without `=` are skipped)."""
    out = []
    for segment in path.relative_to(root).parts[:-1]:
        key, eq, value = segment.partition("=")
        if eq and key:
            out.append((urllib.parse.unquote(key), urllib.parse.unquote(value)))
    return out


def hive_partitions(paths: PathArg, files: list[Path]) -> dict[Path, dict[str, Any]]:
    """Per file found under a directory of `paths`: its Hive partition values by key, typed as
    pyarrow's dataset discovery (`partitioning="hive"`) infers them: a key whose every value is a
    decimal integer in int32 range is int32, any other key is string; `__HIVE_DEFAULT_PARTITION__`
    is null. Files named directly (not under a given directory) have no partition values."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    roots = [Path(p) for p in paths if Path(p).is_dir()]
    raw: dict[Path, list[tuple[str, str]]] = {}
    for f in files:
        root = next((r for r in roots if f.is_relative_to(r)), None)
        if root is not None:
            raw[f] = hive_segments(root, f)
    values: dict[str, list[str]] = {}
    for segments in raw.values():
        for key, value in segments:
            values.setdefault(key, []).append(value)
    types = {
        key: pa.int32() if all(_is_int32(v) for v in vs if v != HIVE_NULL) else pa.string()
        for key, vs in values.items()
    }
    return {
        f: {
            k: pa.scalar(None if v == HIVE_NULL else int(v) if types[k] == pa.int32() else v, types[k])
            for k, v in segments
        }
        for f, segments in raw.items()
        if segments
    }


def _is_int32(text: str) -> bool:
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit() and INT32[0] <= int(text) <= INT32[1]


class ParquetSource(_FileSource):
    """Parquet files (any codec pyarrow reads), or directories of them, in order: one cache.

    Each file is read row group by row group (only the payload and metadata columns), decoded in
    batches of about `batch_bytes`. Errors name the file, row group and row. `len()` reads the
    files' footers.

    Hive partitioning (`pq.write_to_dataset(table, root, partition_cols=[...])`): a file found
    under a given directory has the `key=value` directory names between that directory and the
    file as columns, after the file's own, typed as pyarrow's dataset discovery infers them
    (int32 when every value of the key is an integer in int32 range, else string; the directory
    `__HIVE_DEFAULT_PARTITION__` is null); they are metadata columns like any other (`metadata=`,
    `rename=`). A key that is also a column of the file is a SourceInputError. A file named
    directly has no partition columns: asking for one then says so.
    """

    SUFFIXES = PARQUET_SUFFIXES
    WHAT = "Parquet"

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
            paths,
            payload=payload,
            metadata=metadata,
            rename=rename,
            payload_spec=payload_spec,
            index_column=index_column,
            batch_bytes=batch_bytes,
            columns=columns,
        )
        self.partitions = hive_partitions(paths, self.files)  # file -> {key: typed pyarrow scalar}

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
            schema = pf.schema_arrow
            partition = self.partitions.get(path, {})
            clash = [k for k in partition if k in schema.names]
            if clash:
                raise SourceInputError(
                    f"{path}: Hive partition key {clash[0]!r} of its directory is also a column of the file"
                )
            self._check_unpartitioned(path, schema)
            for key, value in partition.items():
                schema = schema.append(pa.field(key, value.type))
            yield Part(str(path), schema, self._row_groups(path, pf, partition))

    def _check_unpartitioned(self, path: Path, schema: pa.Schema) -> None:
        """A metadata column missing from the file that a `key=value` directory above it names:
        say the file was given without its partitioned root (the mapping's own check would only
        list the file's columns)."""
        asked: Sequence[str] = self.columns.metadata or []
        above = {urllib.parse.unquote(s.partition("=")[0]) for s in path.parent.parts if "=" in s}
        missing = [m for m in asked if m not in schema.names and m not in self.partitions.get(path, {}) and m in above]
        if missing:
            raise SourceInputError(
                f"{path}: metadata column {missing[0]!r} not found (columns: {', '.join(schema.names)}); it is a "
                f"Hive partition key of the file's directory: give the partitioned dataset's root directory "
                "to read partition keys as columns"
            )

    def _row_groups(
        self, path: Path, pf: pq.ParquetFile, partition: dict[str, Any]
    ) -> Iterator[tuple[Where, pa.RecordBatch]]:
        meta = pf.metadata
        wanted = self._wanted(pf, partition)
        row = 0
        for group in range(meta.num_row_groups):
            rg = meta.row_group(group)
            rows = self.batch_rows(rg.total_byte_size / max(1, rg.num_rows))
            at = 0
            try:
                for batch in pf.iter_batches(batch_size=rows, row_groups=[group], columns=wanted, use_threads=False):
                    for key, value in partition.items():
                        batch = batch.append_column(key, pa.repeat(value, batch.num_rows))
                    yield Where(str(path), "row group", group, row + at, at), batch
                    at += batch.num_rows
            except (pa.ArrowException, OSError) as exc:
                raise _reading(path, f": row group {group}", exc) from None
            row += rg.num_rows

    def _wanted(self, pf: pq.ParquetFile, partition: dict[str, Any]) -> list[str]:
        """Only the file columns the mapping reads (all but the payload when metadata is None);
        partition columns come from the path."""
        c = self.columns
        if c.payload is None or c.metadata is None:
            return pf.schema_arrow.names
        return [c.payload, *(m for m in c.metadata if m not in partition)]


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
