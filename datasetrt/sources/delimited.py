"""CSV / TSV source: delimited text files (plain or compressed: .gz, .bz2, .zst, .lz4), read block
by block with pyarrow's streaming CSV reader into the shared column mapping.

Boundary: reads files with pyarrow.csv and hands record batches to the column mapping; knows
nothing of the cache format or processes.

Rows are numbered from 0 after the header line (the file's first line names the columns), so row
r is line r + 2 of a file without quoted line breaks; errors name the file and the row, and a
value pyarrow cannot parse or convert is named by row and line. Memory: one block of
`batch_bytes` / CSV_TEXT_FACTOR of text and the batch it parses to.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from datasetrt.errors import SourceInputError
from datasetrt.sources.base import BATCH_BYTES, Part
from datasetrt.sources.columns import Columns, Where
from datasetrt.sources.files import PathArg, _FileSource, _reading

CSV_SUFFIXES = tuple(s + c for s in (".csv", ".tsv") for c in ("", ".gz", ".bz2", ".zst", ".lz4"))
CSV_TEXT_FACTOR = 4  # a block of text parses to a few times its size in pyarrow's memory pool
_PYARROW_ROW = re.compile(r"Row #(\d+)")  # pyarrow's 1-based line number in parse/convert errors


class CsvSource(_FileSource):
    """CSV files (`.tsv`: tab-delimited), or directories of them, in order: one cache.

    The first line is the header. Column types are inferred from the first block unless given in
    `column_types` (name -> pyarrow type); the payload column, when named, is read as binary (its
    text's bytes as they are), since CSV has no binary type to infer it from. Columns pyarrow
    infers as dates, times or timestamps are read as their text instead (temporal values cannot be
    metadata; a file whose first block has them is opened twice). An empty field of a number column is
    a null, refused by row as in every source. `delimiter` defaults to "," (tab for .tsv files).
    """

    SUFFIXES = CSV_SUFFIXES
    WHAT = "CSV"

    def __init__(
        self,
        name: str,
        paths: PathArg,
        *,
        column_types: Mapping[str, pa.DataType] | None = None,
        delimiter: str | None = None,
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
        self.column_types = dict(column_types or {})
        if self.columns.payload is not None and self.columns.payload_spec is None:
            self.column_types.setdefault(self.columns.payload, pa.binary())
        self.delimiter = delimiter

    def _file_parts(self, path: Path) -> Iterator[Part]:
        types = dict(self.column_types)
        opened = self._open(path, types)
        if opened is None:  # an empty file: no header, no rows
            return
        stream, reader = opened
        temporal = [f.name for f in reader.schema if pa.types.is_temporal(f.type) and f.name not in types]
        if temporal:  # inferred dates / times: read again with those columns as their text
            stream.close()
            opened = self._open(path, {**types, **dict.fromkeys(temporal, pa.string())})
            assert opened is not None
            stream, reader = opened
        with closing(stream):
            yield Part(str(path), reader.schema, self._batches(path, reader))

    def _open(self, path: Path, types: dict[str, pa.DataType]) -> tuple[Any, Any] | None:
        """(the open file, a streaming reader of it with column `types`: its first block read), or
        None for an empty file (closed); the caller closes the file."""
        block = max(1 << 16, min(self.batch_bytes // CSV_TEXT_FACTOR, 1 << 30))
        delimiter = self.delimiter or ("\t" if ".tsv" in path.name.lower() else ",")
        read = pacsv.ReadOptions(block_size=block, use_threads=False)
        parse = pacsv.ParseOptions(delimiter=delimiter)
        convert = pacsv.ConvertOptions(column_types=types, timestamp_parsers=[])
        try:
            stream = pa.input_stream(str(path), compression="detect")
        except (pa.ArrowException, OSError) as exc:
            raise _reading(path, "", exc) from None
        try:
            return stream, pacsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
        except (pa.ArrowException, OSError) as exc:
            stream.close()
            if "Empty CSV file" in str(exc):
                return None
            raise _csv_error(path, 0, exc) from None

    def _batches(self, path: Path, reader: Any) -> Iterator[tuple[Where, pa.RecordBatch]]:
        row = 0
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise _csv_error(path, row, exc) from None
            yield Where(str(path), None, 0, row, 0), batch
            row += batch.num_rows


def _csv_error(path: Path, row: int, exc: Exception) -> SourceInputError:
    """The error of a block pyarrow could not read: by row and line when pyarrow says which line
    (its "Row #N" is the 1-based line, the header being line 1), else after the rows read."""
    found = _PYARROW_ROW.search(str(exc))
    if found is not None and int(found.group(1)) >= 2:
        line = int(found.group(1))
        return _reading(path, f": row {line - 2} (line {line})", exc)
    return _reading(path, f": after row {row}" if row else "", exc)
