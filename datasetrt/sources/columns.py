"""Column mapping of every source: which input column is the payload, which are metadata and under
which names, and the vectorised conversion of one Arrow record batch into CacheInput items.

Boundary: Arrow/numpy values in, CacheInput out. Knows nothing of the cache format (the writer
validates and stores what this yields), of files (the adapters beside it read them) or of processes.

Payload column types:
  binary, large_binary, binary_view, fixed_size_binary    -> the bytes as they are
  string, large_string, string_view                       -> the UTF-8 bytes
  struct<bytes: binary, ...> (HF Image / Audio features) -> the encoded file bytes
  list / large_list / fixed_size_list of numbers, nested  -> a typed payload: one numpy array per
    fixed_size_lists inside (list<fixed_size_list<f32,3>>)   record, C order; its PayloadSpec
                                                             (dtype, shape, None = the ragged dim)
                                                             is inferred from the Arrow type or given
Metadata column types: bool; int8..int64, uint8..uint64 (values must fit int64); float16/32/64
(finite); string, large_string, string_view; dictionaries of those (decoded). Anything else is
refused by type (nested: list, struct, map, ...; unsupported: binary, timestamps, decimals, null)
when a file's schema is bound, and nulls / non-finite floats / out-of-range integers by row.

Cost per batch: Arrow/numpy vector operations plus one small Python object per record (its payload
view or bytes and its metadata dict): no per-value Python work.

Size: over 500 lines because the conversion of each Arrow type family (binary, string, HF
structs, numeric lists, metadata scalars) and its per-row refusal live together: splitting them
would separate each type's conversion from the error that names its row.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datasetrt.errors import ArgumentTypeError, ConfigError, SourceInputError
from datasetrt.values.config import PayloadSpec
from datasetrt.values.payloads import dims_product
from datasetrt.values.records import CacheInput

INT64_MAX = (1 << 63) - 1
RESERVED_NAMES = ("cache_id", "sample_id", "weight")  # columns of the metadata table, not of a cache
LEAF_DTYPES = {
    pa.bool_(): np.dtype(np.bool_),
    pa.int8(): np.dtype(np.int8),
    pa.int16(): np.dtype(np.int16),
    pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64),
    pa.uint8(): np.dtype(np.uint8),
    pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32),
    pa.uint64(): np.dtype(np.uint64),
    pa.float16(): np.dtype(np.float16),
    pa.float32(): np.dtype(np.float32),
    pa.float64(): np.dtype(np.float64),
}


def as_spec(spec: Any) -> PayloadSpec:
    """`spec` as a PayloadSpec: a PayloadSpec itself, or a (dtype, shape) pair (ConfigError when
    the pair is not a valid spec)."""
    if isinstance(spec, PayloadSpec):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return PayloadSpec(*spec)
    raise ArgumentTypeError(f"payload_spec must be a PayloadSpec or a (dtype, shape) pair, got {type(spec).__name__}")


@dataclass(frozen=True)
class Where:
    """Where a record batch came from, for error messages.

    `source` names the file or dataset; `unit` is "row group", "record batch", ... or None;
    `first_row` is the source-wide row of the batch's first row (0-based), `unit_first_row` its row
    within the unit; `row_word` is what a row is called ("row", or "record" for JSON Lines).
    """

    source: str
    unit: str | None = None
    unit_index: int = 0
    first_row: int = 0
    unit_first_row: int = 0
    row_word: str = "row"

    def at(self, row: int | None = None) -> str:
        where = []
        if self.unit is not None:
            where.append(f"{self.unit} {self.unit_index}")
        if row is not None:
            text = f"{self.row_word} {self.first_row + row}"
            if self.unit is not None:
                text += f" ({self.row_word} {self.unit_first_row + row} of the {self.unit})"
            where.append(text)
        return self.source + (": " + ", ".join(where) if where else "")


class Columns:
    """Which column is the payload, which are metadata (in order), and renames (input -> output).

    `payload=None` picks the one binary column of the schema. `metadata=None` takes every other
    column; `[]` takes none. `index_column`, when given, adds the source-wide row number (int,
    0-based) as a metadata column of that name: a cache needs at least one metadata column.
    `payload_spec` (a PayloadSpec, or a (dtype, shape) pair) fixes the payloads' type instead of
    inferring it from the payload column's Arrow type: list payloads are cast to its dtype when
    every value survives the cast exactly, and each record must fit its shape; byte payloads must
    have a length that fits it. Picklable (sent to Ray tasks).
    """

    def __init__(
        self,
        payload: str | None = None,
        metadata: Sequence[str] | None = None,
        *,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
    ) -> None:
        if payload is not None and not isinstance(payload, str):
            raise ArgumentTypeError(f"payload column must be a str, got {type(payload).__name__}")
        if isinstance(metadata, str) or (metadata is not None and not all(isinstance(m, str) for m in metadata)):
            raise ArgumentTypeError("metadata columns must be a sequence of str")
        rename = dict(rename or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
            raise ArgumentTypeError("rename must map str to str")
        if index_column is not None and not isinstance(index_column, str):
            raise ArgumentTypeError(f"index_column must be a str, got {type(index_column).__name__}")
        self.payload = payload
        self.metadata = None if metadata is None else tuple(metadata)
        self.rename = rename
        self.payload_spec = None if payload_spec is None else as_spec(payload_spec)
        self.index_column = index_column
        if self.metadata is not None and payload in self.metadata:
            raise ConfigError(f"column {payload!r} cannot be both the payload and metadata")
        if self.metadata is not None and len(set(self.metadata)) != len(self.metadata):
            raise ConfigError(f"metadata columns repeat a name: {list(self.metadata)}")

    @classmethod
    def of(
        cls,
        columns: Columns | None = None,
        payload: str | None = None,
        metadata: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
    ) -> Columns:
        """`columns` itself, or a Columns built from the keywords (giving both is a ConfigError)."""
        if columns is None:
            return cls(payload, metadata, rename=rename, payload_spec=payload_spec, index_column=index_column)
        if not isinstance(columns, Columns):
            raise ArgumentTypeError(f"columns must be a Columns, got {type(columns).__name__}")
        if (payload, metadata, rename, payload_spec, index_column) != (None, None, None, None, None):
            raise ConfigError("give either columns=Columns(...) or the column keywords, not both")
        return columns

    def fingerprint(self) -> dict:
        """The mapping as plain JSON values (for build fingerprints)."""
        return {
            "payload": self.payload,
            "metadata": None if self.metadata is None else list(self.metadata),
            "rename": dict(sorted(self.rename.items())),
            "index_column": self.index_column,
            "payload_spec": None
            if self.payload_spec is None
            else [self.payload_spec.dtype, list(self.payload_spec.shape)],
        }

    def with_spec(self, spec: PayloadSpec | None) -> Columns:
        """A copy of this mapping (of its class) whose payload_spec is `spec`."""
        out = copy.copy(self)
        out.payload_spec = spec
        return out

    def spec_for(self, schema: pa.Schema, source: str) -> PayloadSpec | None:
        """The spec of the payloads of `schema` (of the file or dataset named `source`): the given
        one, else inferred from the payload column's type (list<int32> -> int32[None],
        fixed_size_list<float32, 3> -> float32[3]); None for byte payloads without a spec. Reads
        the schema only; metadata columns are checked by `bind`."""
        payload = self._payload_column(schema, source)
        return _payload_values(payload, schema.field(payload).type, self.payload_spec, source).spec

    def _payload_column(self, schema: pa.Schema, source: str) -> str:
        payload = self.payload if self.payload is not None else _infer_payload(schema, source)
        if payload not in schema.names:
            raise SourceInputError(
                f"{source}: payload column {payload!r} not found (columns: {', '.join(schema.names)})"
            )
        return payload

    def bind(self, schema: pa.Schema, source: str) -> BatchConverter:
        """Check `schema` (of the file or dataset named `source`) against the mapping. Every
        problem of the schema is reported in one SourceInputError (a missing or unusable payload
        column, missing metadata columns, renames of no metadata column, reserved or duplicate
        output names, metadata columns of refused types), so one run names all of them."""
        names = schema.names
        problems: list[str] = []
        payload: str | None = None
        try:
            payload = self._payload_column(schema, source)
            _payload_values(payload, schema.field(payload).type, self.payload_spec, source)
        except SourceInputError as exc:
            problems.append(str(exc).removeprefix(f"{source}: "))
            if payload is None and self.payload is None and self.metadata is None:
                raise SourceInputError(f"{source}: {'; '.join(problems)}") from None  # metadata unknown
        if self.metadata is None:
            metadata = [n for n in names if n != (payload or self.payload)]
        else:
            metadata = list(self.metadata)
            missing = [m for m in metadata if m not in names]
            if missing:
                problems.append(
                    f"metadata column(s) {', '.join(map(repr, missing))} not found (columns: {', '.join(names)})"
                )
        unknown = [k for k in self.rename if k not in metadata]
        if unknown:
            problems.append(
                f"rename names column(s) {', '.join(map(repr, unknown))} that are not "
                f"metadata columns ({', '.join(metadata) or 'none'})"
            )
        outputs = [self.rename.get(m, m) for m in metadata]
        if self.index_column is not None:
            outputs.append(self.index_column)
        problems += _output_name_problems(outputs)
        problems += _metadata_type_problems([(m, schema.field(m).type) for m in metadata if m in names])
        if problems:
            raise SourceInputError(f"{source}: {'; '.join(problems)}")
        assert payload is not None  # no problem: the payload column was found
        return BatchConverter(
            payload,
            schema.field(payload).type,
            metadata,
            [schema.field(m).type for m in metadata],
            outputs,
            self.payload_spec,
            self.index_column is not None,
            source,
        )


def _output_name_problems(outputs: list[str]) -> list[str]:
    """What is wrong with the output metadata names (none, reserved, duplicated); [] when fine."""
    if not outputs:
        return ["no metadata columns: a cache needs at least one (choose metadata columns or an index column)"]
    problems = []
    reserved = [name for name in outputs if name in RESERVED_NAMES]
    if reserved:
        these = (
            "name " + repr(reserved[0]) + " is"
            if len(reserved) == 1
            else "names " + ", ".join(map(repr, reserved)) + " are"
        )
        problems.append(
            f"metadata column {these} reserved (cache_id, sample_id and weight are columns of the "
            f"metadata table); rename {'it' if len(reserved) == 1 else 'them'}"
        )
    seen: set[str] = set()
    for name in outputs:
        if name in seen:
            problems.append(f"two metadata columns would be named {name!r}")
        seen.add(name)
    return problems


def _infer_payload(schema: pa.Schema, source: str) -> str:
    binary = [f.name for f in schema if _is_binary(f.type)]
    if len(binary) == 1:
        return binary[0]
    found = f"binary columns: {', '.join(binary)}" if binary else "no binary column"
    raise SourceInputError(
        f"{source}: no payload column given and the schema has {found}; "
        f"name the payload column (columns: {', '.join(schema.names)})"
    )


def _is_binary(t: pa.DataType) -> bool:
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)


def metadata_kind(t: pa.DataType) -> str:
    """The writer's kind of metadata values of Arrow type `t` (bool, int, float, string; "" when
    `t` cannot be metadata)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    return "string" if _is_string(t) else ""


def _metadata_type_problems(columns: list[tuple[str, pa.DataType]]) -> list[str]:
    """One problem per metadata column whose Arrow type cannot be metadata, then the remedy once;
    [] when every type can."""
    problems = []
    for column, t in columns:
        if not metadata_kind(t):
            value_type = t.value_type if pa.types.is_dictionary(t) else t
            what = "nested metadata" if _is_nested(value_type) else "unsupported metadata type"
            problems.append(f"{what}: column {column!r} has type {value_type}")
    if problems:
        them = "it" if len(problems) == 1 else "them"
        problems[-1] += (
            f"; metadata values must be bool, int, float or string (flatten or cast {them}, or leave {them} out)"
        )
    return problems


# ------------------------------------------------------------------------------------------------
# One bound schema
# ------------------------------------------------------------------------------------------------


class BatchConverter:
    """Converts record batches of one bound schema (`columns`: the input columns to read)."""

    def __init__(
        self,
        payload: str,
        payload_type: pa.DataType,
        metadata: list[str],
        metadata_types: Sequence[pa.DataType],
        outputs: list[str],
        spec: PayloadSpec | None,
        with_index: bool,
        source: str,
    ) -> None:
        self.payload = payload
        self.metadata = metadata
        self.metadata_types = list(metadata_types)
        self.outputs = outputs
        self.with_index = with_index
        self.columns = [payload, *metadata]
        self.payload_values = _payload_values(payload, payload_type, spec, source)

    @property
    def spec(self) -> PayloadSpec | None:
        """The spec of this schema's payloads (None: bytes without a spec)."""
        return self.payload_values.spec

    @property
    def kinds(self) -> dict[str, tuple[str, str]]:
        """Output metadata name -> (the writer's kind: bool / int / float / string, the input's Arrow
        type as text): what every record of this schema carries, so a part whose kinds differ from
        another part's is refused once, at its first row, by file and row (see `drift`)."""
        out = {name: (metadata_kind(t), str(t)) for name, t in zip(self.outputs, self.metadata_types)}
        if self.with_index:
            out[self.outputs[-1]] = ("int", "row number")
        return out

    def records(self, batch: pa.RecordBatch, where: Where) -> Iterator[CacheInput]:
        """CacheInput items of `batch`, in order (the batch's columns by name)."""
        n = batch.num_rows
        if n == 0:
            return iter(())
        payloads = self.payload_values(batch.column(self.payload), where)
        values: list[Sequence[Any]] = [_metadata_values(batch.column(m), m, where) for m in self.metadata]
        if self.with_index:
            values.append(range(where.first_row, where.first_row + n))
        metadata = map(dict, map(zip, repeat(self.outputs), zip(*values)))
        return map(CacheInput._make, zip(payloads, metadata))


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _first_null(array: pa.Array) -> int:
    return _first(array.is_null().to_numpy(zero_copy_only=False))


def _metadata_values(array: pa.Array, column: str, where: Where) -> list:
    """Plain Python values of one metadata column; nulls, NaN/inf and ints past int64 refused by row."""
    if array.null_count:
        row = _first_null(array)
        raise SourceInputError(f"{where.at(row)}: metadata column {column!r} ({array.type}) is null")
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    t = array.type
    if _is_string(t):
        return array.to_numpy(zero_copy_only=False).tolist()
    values = array.to_numpy(zero_copy_only=False)
    if pa.types.is_floating(t):
        finite = np.isfinite(values)
        if not finite.all():
            row = _first(~finite)
            raise SourceInputError(
                f"{where.at(row)}: metadata column {column!r} ({t}) is {values[row]}; float metadata must be finite"
            )
        if values.dtype != np.float64:
            values = values.astype(np.float64)
    elif t == pa.uint64():
        big = values > INT64_MAX
        if big.any():
            row = _first(big)
            raise SourceInputError(
                f"{where.at(row)}: metadata column {column!r} ({t}) is {int(values[row])}, "
                f"outside the int64 range of metadata"
            )
    return values.tolist()


def _payload_values(column: str, t: pa.DataType, spec: PayloadSpec | None, source: str):
    if _is_binary(t) or _is_string(t):
        return _BytePayloads(column, t, spec)
    if _is_encoded_file(t):
        return _EncodedFilePayloads(column, t, spec)
    if _is_list(t) or pa.types.is_fixed_size_list(t):
        return _TypedPayloads(column, t, spec, source)
    what = "nested" if _is_nested(t) else "unsupported"
    raise SourceInputError(
        f"{source}: payload column {column!r} has {what} type {t}; a payload must be binary, "
        f"string, an encoded file (struct with a binary 'bytes' field), or a list / "
        f"fixed-size list of numbers"
    )


class _BytePayloads:
    """Payloads of a binary or string column: zero-copy views of the column's data buffer (the
    writer copies each record once). With a spec, each length must fit it."""

    def __init__(self, column: str, t: pa.DataType, spec: PayloadSpec | None) -> None:
        self.column = column
        self.type = t
        self.spec = spec
        if (
            pa.types.is_fixed_size_binary(t)
            or pa.types.is_binary_view(t)
            or pa.types.is_string_view(t)
            or pa.types.is_large_string(t)
        ):
            self.cast = pa.large_binary()
        elif pa.types.is_string(t):
            self.cast = pa.binary()
        else:
            self.cast = None

    def __call__(self, array: pa.Array, where: Where) -> list:
        if array.null_count:
            raise SourceInputError(
                f"{where.at(_first_null(array))}: payload column {self.column!r} ({self.type}) is null"
            )
        if self.cast is not None:
            array = array.cast(self.cast)
        offsets_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        _, offsets_buf, data_buf = array.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=offsets_type)[array.offset : array.offset + len(array) + 1]
        if self.spec is not None:
            self._check_lengths(np.diff(offsets), self.spec, where)
        data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
        bounds = offsets.tolist()
        return [data[a:b] for a, b in pairwise(bounds)]

    def _check_lengths(self, lengths: np.ndarray, spec: PayloadSpec, where: Where) -> None:
        unit = spec.unit_bytes
        if unit is None:  # dense: every record has exactly record_bytes
            bad = lengths != spec.record_bytes
        else:  # ragged: a whole number of steps along the ragged dim
            bad = lengths % unit != 0
        if bad.any():
            row = _first(bad)
            raise SourceInputError(
                f"{where.at(row)}: payload column {self.column!r} holds {int(lengths[row])} bytes; "
                f"payload spec {spec} needs {spec.expected_bytes()}"
            )


def _is_encoded_file(t: pa.DataType) -> bool:
    """A struct with a binary `bytes` field: how Hugging Face stores Image / Audio / Video features
    (struct<bytes: binary, path: string>)."""
    if not pa.types.is_struct(t) or t.get_field_index("bytes") < 0:
        return False
    return _is_binary(t.field("bytes").type)


class _EncodedFilePayloads(_BytePayloads):
    """Payloads of an encoded-file struct column: the encoded bytes (the image or audio file as
    stored), never decoded. A row stored by path only (null bytes) is refused by row."""

    def __init__(self, column: str, t: pa.DataType, spec: PayloadSpec | None) -> None:
        super().__init__(column, t.field("bytes").type, spec)
        self.struct_type = t

    def __call__(self, array: pa.Array, where: Where) -> list:
        if array.null_count:
            raise SourceInputError(
                f"{where.at(_first_null(array))}: payload column {self.column!r} ({self.struct_type}) is null"
            )
        encoded = pc.struct_field(array, "bytes")
        if encoded.null_count:
            raise SourceInputError(
                f"{where.at(_first_null(encoded))}: payload column {self.column!r} "
                f"({self.struct_type}) has no bytes (a file stored by path only); embed the "
                f"files first (datasets: Dataset.embed_external_files / cast_column(decode=False))"
            )
        return super().__call__(encoded, where)


class _TypedPayloads:
    """Payloads of a list column: one numpy array view per record (C order, dtype and shape of the
    spec). The leaf values of a batch are taken as one flat numpy array; records are slices."""

    def __init__(self, column: str, t: pa.DataType, spec: PayloadSpec | None, source: str) -> None:
        self.column = column
        self.type = t
        ragged = _is_list(t)
        inner: list[int] = []
        leaf = t.value_type
        while pa.types.is_fixed_size_list(leaf):
            inner.append(leaf.list_size)
            leaf = leaf.value_type
        if pa.types.is_fixed_size_list(t):
            inner.insert(0, t.list_size)
        if leaf not in LEAF_DTYPES:
            raise SourceInputError(
                f"{source}: payload column {column!r} has type {t}; list payloads must hold "
                f"numbers or bools (at most one variable-length level, the outermost)"
            )
        self.leaf_dtype = LEAF_DTYPES[leaf]
        self.ragged = ragged
        self.inner = tuple(inner)
        if spec is None:
            try:
                spec = PayloadSpec(self.leaf_dtype.name, (None, *inner) if ragged else tuple(inner))
            except ConfigError as exc:
                raise SourceInputError(f"{source}: payload column {column!r} has type {t}: {exc}") from None
        self.spec = spec
        self.dtype = np.dtype(spec.dtype)

    def __call__(self, array: pa.Array, where: Where) -> list:
        if array.null_count:
            raise SourceInputError(
                f"{where.at(_first_null(array))}: payload column {self.column!r} ({self.type}) is null"
            )
        n = len(array)
        counts = np.full(n, math.prod(self.inner), dtype=np.int64)
        leaf = array
        if self.ragged:
            counts *= pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(np.int64)
            leaf = leaf.flatten()
        for _ in self.inner:
            leaf = leaf.flatten()
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if leaf.null_count:
            element = _first_null(leaf)
            row = int(np.searchsorted(offsets, element, side="right") - 1)
            raise SourceInputError(
                f"{where.at(row)}: payload column {self.column!r} ({self.type}) has a null "
                f"element (index {element - int(offsets[row])} of the record)"
            )
        values = leaf.to_numpy(zero_copy_only=False)
        if values.dtype != self.dtype:
            values = self._cast(values, offsets, where)
        return _split(values, offsets, counts, self.spec, self.column, where)

    def _cast(self, values: np.ndarray, offsets: np.ndarray, where: Where) -> np.ndarray:
        target = self.dtype
        with np.errstate(all="ignore"):
            cast = values.astype(target)
            exact = cast.astype(values.dtype) == values
        if not exact.all():
            element = _first(~exact)
            row = int(np.searchsorted(offsets, element, side="right") - 1)
            raise SourceInputError(
                f"{where.at(row)}: payload column {self.column!r} value {values[element]} "
                f"({values.dtype}) does not fit payload spec dtype {target.name}"
            )
        return cast


def _split(
    values: np.ndarray, offsets: np.ndarray, counts: np.ndarray, spec: PayloadSpec, column: str, where: Where
) -> list:
    """Per-record views of `values` (record i = values[offsets[i]:offsets[i+1]]) in `spec`'s shape."""
    axis = spec.ragged_axis
    shape = spec.shape
    unit = dims_product(shape, axis)  # elements per record (dense) or per ragged step (> 0)
    bad = counts != unit if axis is None else counts % unit != 0
    if bad.any():
        row = _first(bad)
        need = f"{unit} elements" if axis is None else f"a multiple of {unit} elements"
        raise SourceInputError(
            f"{where.at(row)}: payload column {column!r} holds {int(counts[row])} elements; "
            f"payload spec {spec} needs {need}"
        )
    n = len(counts)
    if axis is None:
        return list(values.reshape(n, *shape))
    if axis == 0:
        steps = values.reshape(-1, *shape[1:])
        cuts = (offsets // unit).tolist()
        return [steps[a:b] for a, b in pairwise(cuts)]
    bounds = offsets.tolist()
    dims = [0 if dim is None else dim for dim in shape]  # the ragged dim (the only None) is set per record
    out = []
    for a, b in pairwise(bounds):  # ragged inner axis: a reshape per record
        dims[axis] = (b - a) // unit
        out.append(values[a:b].reshape(dims))
    return out
