"""The shared shape of every source adapter: a named CacheSource that binds each input schema to its
Columns and converts record batch after record batch.

Boundary: no cache format, no processes; subclasses only say how to list their input's batches.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from datasetrt.errors import ArgumentTypeError, ConfigError, SourceInputError
from datasetrt.sources.columns import Columns, Where
from datasetrt.values.config import PayloadSpec
from datasetrt.values.records import CacheInput

BATCH_BYTES = 8 << 20  # conversion works on record batches of about this many input bytes
MAX_BATCH_ROWS = 65_536
_UNKNOWN: Any = object()


class Part:
    """One part of an input with its own schema (a file, a dataset): its name for messages and its
    record batches with their locations."""

    def __init__(self, label: str, schema: pa.Schema, batches: Iterable[tuple[Where, pa.RecordBatch]]) -> None:
        self.label = label
        self.schema = schema
        self.batches = batches


class BatchSource:
    """A CacheSource over record batches: subclasses implement `_parts()` (and `__len__` when cheap).

    Iterating reads one record batch at a time (about `batch_bytes` of input); nothing else of the
    input is held. The column mapping is given by keywords (see `Columns`) or as `columns=`.
    Every part (file) must give payloads of one spec: the given `payload_spec`, else the first
    part's inferred one (see `payload_spec`).
    """

    def __init__(
        self,
        name: str,
        *,
        payload: str | None = None,
        metadata: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
        batch_bytes: int = BATCH_BYTES,
        columns: Columns | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"source name must be a str, got {type(name).__name__}")
        if not isinstance(batch_bytes, int) or batch_bytes <= 0:
            raise ConfigError(f"batch_bytes must be a positive int, got {batch_bytes!r}")
        self.name = name
        self.columns = Columns.of(columns, payload, metadata, rename, payload_spec, index_column)
        self.batch_bytes = batch_bytes
        self._spec: PayloadSpec | None = _UNKNOWN if self.columns.payload_spec is None else self.columns.payload_spec

    @property
    def payload_spec(self) -> PayloadSpec | None:
        """The PayloadSpec of this source's payloads: the one given, else inferred from the payload
        column's type in the first part's schema (`list<int32>` -> `int32[None]`,
        `fixed_size_list<float32, 3>` -> `float32[3]`); None for byte payloads without a spec and
        for a source with no parts. Before iteration, reading it opens the first part for its schema
        only (a Parquet footer, an IPC schema, JSON Lines: the type-inference pass over its files,
        one batch of a dataset).
        `write_cache` records it in the manifest (DatasetRuntime.write_cache, "Payload types")."""
        if self._spec is _UNKNOWN:
            parts = self._parts()
            try:
                part = next(parts, None)
            finally:
                parts.close()
            self._spec = None if part is None else self.columns.spec_for(part.schema, part.label)
        return self._spec

    def _parts(self) -> Generator[Part, None, None]:
        """The input's parts, in order. A generator: `payload_spec` reads the first part and then
        closes it, which releases what the part holds open (a file, a dataset iterator)."""
        raise NotImplementedError

    def batch_rows(self, row_bytes: float) -> int:
        """Rows per conversion batch for rows of about `row_bytes` input bytes."""
        return int(max(1, min(MAX_BATCH_ROWS, self.batch_bytes // max(1.0, row_bytes))))

    def __iter__(self) -> Iterator[CacheInput]:
        first: tuple[str, PayloadSpec | None] | None = None
        kinds: tuple[str, dict[str, tuple[str, str]]] | None = None  # of the first part with rows
        sample = 0  # source-wide position of the next record (the writer's "sample")
        for part in self._parts():
            converter = self.columns.bind(part.schema, part.label)
            spec = converter.spec
            if first is None:
                first = part.label, spec
                self._spec = spec
            elif spec != first[1]:
                raise SourceInputError(
                    f"{part.label}: payload spec {describe_spec(spec)} differs from "
                    f"{describe_spec(first[1])} of {first[0]}; give a payload_spec to cast them to one"
                )
            checked = False
            for where, batch in part.batches:
                if not checked and batch.num_rows:
                    checked = True
                    if kinds is None:
                        kinds = part.label, converter.kinds
                    else:
                        drift(kinds, converter.kinds, where, sample)
                yield from converter.records(batch, where)
                sample += batch.num_rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def drift(
    first: tuple[str, dict[str, tuple[str, str]]], kinds: dict[str, tuple[str, str]], where: Where, sample: int
) -> None:
    """SourceInputError naming the file and row of a part's first record (`where`, its source-wide
    position `sample`) when its metadata names or kinds (`BatchConverter.kinds`) differ from those
    of the first part with records (`first`: its label and kinds), which fix the cache's schema.
    Every differing column is named; the wording starts as the writer's would for that record."""
    label, want = first
    if set(kinds) != set(want):
        raise SourceInputError(
            f"{where.at(0)}, sample {sample} of the source: metadata keys must be identical for every sample: "
            f"keys {sorted(kinds)} here, expected {sorted(want)} as in {label}"
        )
    differ = [name for name in sorted(want) if kinds[name][0] != want[name][0]]
    if differ:
        fields = "; ".join(f"metadata field {n!r} expected {want[n][0]}, got {kinds[n][0]}" for n in differ)
        types = ", ".join(f"{n!r} is {kinds[n][1]} here, {want[n][1]} in {label}" for n in differ)
        raise SourceInputError(
            f"{where.at(0)}, sample {sample} of the source: {fields} (column {types}); "
            f"cast the column(s) to one type, or write the files as separate sources"
        )


def describe_spec(spec: PayloadSpec | None) -> str:
    """A source's spec as messages show it: `int32[None]`, or `none (bytes)`."""
    return "none (bytes)" if spec is None else str(spec)


def slices(batch: pa.RecordBatch, rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(first row, zero-copy slice of at most `rows` rows) over `batch`."""
    for start in range(0, batch.num_rows, rows):
        yield start, batch.slice(start, rows)


class RecordBatchSource(BatchSource):
    """A CacheSource over Arrow data already at hand: a pyarrow Table, a RecordBatchReader, or an
    iterable of RecordBatches/Tables sharing one schema (an iterator or reader is read once, in
    order: reading `payload_spec` first keeps its first batch for the write; `description` names
    it in errors). Tables are converted in slices of about `batch_bytes`. Rows are numbered from
    `first_row` (in errors and the index column): the position of this data in a larger whole."""

    def __init__(
        self,
        name: str,
        data: Any,
        *,
        description: str | None = None,
        first_row: int = 0,
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
        self.data = data
        self.description = description or f"Arrow data of source {name!r}"
        self.first_row = first_row

    def __len__(self) -> int:
        if isinstance(self.data, (pa.Table, pa.RecordBatch)):
            return self.data.num_rows
        raise TypeError(f"{type(self.data).__name__} has no length")

    def _parts(self) -> Generator[Part, None, None]:
        data = self.data
        if isinstance(data, (pa.Table, pa.RecordBatch)):
            data = [data]
        iterator = iter(data)
        head = next(iterator, None)
        if head is None:
            return
        if iterator is data or isinstance(data, pa.RecordBatchReader):  # one-shot input: the next
            self.data = _chain(head, iterator)  # pass (after `payload_spec` peeked) starts at the head
        yield Part(self.description, head.schema, self._batches(head, iterator))

    def _batches(self, head: Any, rest: Iterator) -> Iterator[tuple[Where, pa.RecordBatch]]:
        row = self.first_row
        index = 0
        for item in _chain(head, rest):
            if not item.schema.equals(head.schema):
                raise SourceInputError(
                    f"{self.description}: record batch {index} has schema {item.schema}, "
                    f"which differs from the first batch's {head.schema}"
                )
            batches = item.to_batches() if isinstance(item, pa.Table) else [item]
            for batch in batches:
                rows = self.batch_rows(batch.nbytes / max(1, batch.num_rows))
                for start, piece in slices(batch, rows):
                    yield Where(self.description, "batch", index, row + start, start), piece
                row += batch.num_rows
                index += 1


def _chain(head: Any, rest: Iterator) -> Iterator:
    yield head
    yield from rest
