"""JSON Lines text to record batches: whole-line blocks, one schema for every file of a source
(inferred over all of them, or given), exact numbers, and errors naming the file, record and column.

Boundary: JSON text in, pyarrow record batches out; knows nothing of the column mapping, the cache
format or processes (`files.JsonLinesSource` puts these batches through the mapping).

Blocks: the text is cut at line ends into blocks of at most `block_bytes`; a line longer than that
makes its block grow to hold it whole, up to `max_line_bytes` (>= `block_bytes`) per line: a
longer line is a SourceInputError naming the file and record. pyarrow parses each block as one unit, so no line
ever straddles two blocks. Parsing takes several times a block's size (JSON_TEXT_FACTOR), so the
largest block costs about JSON_TEXT_FACTOR x (block_bytes + max_line_bytes) while it is parsed.

Types: the columns with a given type (`column_types`, or a whole `schema`) are read as that type;
the others are inferred by a first pass over every file (one block at a time) whose block schemas
are unified (a column null or missing in some blocks takes its type from the others; a column that
is a string in one block and a number in another is refused naming the record). When every column
the mapping reads has a given type, there is no first pass.

Numbers: JSON writes integers without '.' or exponent and floats with one. A column with an
inferred type holds one kind: integers (int64, exact; an integer beyond int64 is refused) or
floats (float64). A column mixing the kinds is refused naming the first record whose kind differs
from the first number's, unless its type is given as a float type: then integers are read as
floats, and one that the float type cannot hold exactly is refused. Never rounded silently.
Finding the kinds costs vector operations and a regular-expression scan per block; only when a
block may hold an integer in a float column (a whole float value and the column's key followed by
an integer somewhere in its text), Python's `json` parses the lines holding whole float values.

Records: 0-based index of the object in its file, counted over non-blank lines (pyarrow skips
blank ones), i.e. the line number when a file has no blank lines.

Size: over 500 lines because the block cutter, the inference pass, the number-kind checks and the
error locator share one block-and-record bookkeeping; split, each would re-derive it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from datasetrt.errors import ConfigError, SourceInputError

# Parsing a block of JSON text takes several times its size in pyarrow's memory pool (measured
# peak PSS of a conversion 82 MiB with 1 MiB blocks, ~200 MiB with 8 MiB blocks).
JSON_TEXT_FACTOR = 8
MAX_LINE_BYTES = 64 << 20  # default `max_line_bytes`: the longest line read
LINE_BYTES_CAP = 1 << 30  # the largest `max_line_bytes` (pyarrow parses a block of < 2 GiB)
MIN_BLOCK_BYTES = 1 << 16
BLOCK_BYTES_CAP = 256 << 20
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# a float type holds every integer of magnitude below 2**digits exactly
_FLOAT_DIGITS = {pa.float16(): 11, pa.float32(): 24, pa.float64(): 53}
_FLOAT_NAMES = {pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64"}


# --- column types ---------------------------------------------------------------------------


def parse_type(text: str) -> pa.DataType:
    """The pyarrow type named by `text`: a pyarrow alias (`int64`, `int32`, `float64`, `double`,
    `float32`, `string`, `bool`, `uint8`, ...) or `list<T>` / `large_list<T>` of one; ConfigError
    for anything else."""
    t = text.strip()
    nested = re.fullmatch(r"(large_list|list)\s*<(.*)>", t)
    if nested:
        item = parse_type(nested.group(2))
        return pa.large_list(item) if nested.group(1) == "large_list" else pa.list_(item)
    try:
        return pa.type_for_alias(t)
    except (ValueError, KeyError):
        raise ConfigError(
            f"unknown column type {text!r}; expected a pyarrow type name (int64, int32, float64, "
            f"float32, string, bool, ...) or list<T>"
        ) from None


def parse_column_types(text: str) -> dict[str, pa.DataType]:
    """`name=type,name=type,...` (commas inside `<>` belong to the type) as {name: pyarrow type};
    ConfigError naming the bad item."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    out: dict[str, pa.DataType] = {}
    for item in items:
        name, sep, type_text = item.partition("=")
        if not sep or not name.strip() or not type_text.strip():
            raise ConfigError(f"column types take name=type items, got {item!r}")
        out[name.strip()] = parse_type(type_text)
    return out


def given_types(column_types: Mapping[str, Any] | None, schema: Any) -> tuple[dict[str, pa.DataType], bool]:
    """({column: pyarrow type} given, whether they are the whole schema). Types may be pyarrow
    types or their names (`parse_type`); `schema` is a pa.Schema or such a mapping. ConfigError for
    both at once, a bad type, or one the JSON reader cannot produce."""
    if column_types is not None and schema is not None:
        raise ConfigError("give column_types (some columns' types) or schema (every column's), not both")
    given = schema if schema is not None else column_types
    if given is None:
        return {}, False
    if isinstance(given, pa.Schema):
        pairs = [(f.name, f.type) for f in given]
    elif isinstance(given, Mapping):
        pairs = list(given.items())
    else:
        raise ConfigError(f"{'schema' if schema is not None else 'column_types'} must be a mapping, got {given!r}")
    types = {}
    for name, t in pairs:
        if not isinstance(name, str):
            raise ConfigError(f"column names must be str, got {name!r}")
        types[name] = parse_type(t) if isinstance(t, str) else t
        if not isinstance(types[name], pa.DataType):
            raise ConfigError(f"column {name!r}: type must be a pyarrow DataType or its name, got {t!r}")
    try:  # a type the JSON reader cannot produce (float16, fixed_size_list) is refused here
        _parse(pa.py_buffer(b"{}\n"), pa.schema(list(types.items())), infer=False)
    except pa.ArrowException as exc:
        raise ConfigError(f"column types {types}: the JSON reader cannot read them: {exc}") from None
    return types, schema is not None


# --- blocks of whole lines --------------------------------------------------------------------


class _LongLine(Exception):
    pass


def text_blocks(stream: Any, block_bytes: int, max_line_bytes: int) -> Iterator[pa.Buffer]:
    """The stream's text cut after line ends: blocks of at most `block_bytes`, except one holding
    a longer line, which holds that line whole plus less than `block_bytes`. Raises _LongLine at a
    line longer than `max_line_bytes`. Holds at most one block and the partial line after it."""
    carry = bytearray()  # the partial line after the last line end read (a new one per block)
    while True:
        data = stream.read(block_bytes - len(carry) if len(carry) < block_bytes else block_bytes)
        if not data:
            if carry and not carry.isspace():
                yield pa.py_buffer(carry)
            return
        cut = data.rfind(b"\n")
        if cut < 0:
            carry += data
            if len(carry) > max_line_bytes:
                raise _LongLine
            continue
        if carry and len(carry) + data.find(b"\n") > max_line_bytes:
            raise _LongLine
        if carry:
            carry += memoryview(data)[: cut + 1]
            block = pa.py_buffer(carry)
        else:
            block = pa.py_buffer(data).slice(0, cut + 1)
        carry = bytearray(memoryview(data)[cut + 1 :])
        yield block


def _parse(block: pa.Buffer, schema: pa.Schema | None, *, infer: bool) -> pa.Table:
    """One block parsed as one pyarrow block: `schema` the explicit columns, the rest inferred
    (`infer`) or ignored."""
    read = pajson.ReadOptions(block_size=max(MIN_BLOCK_BYTES, block.size + 1), use_threads=False)
    parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer" if infer else "ignore")
    return pajson.read_json(pa.BufferReader(block), read_options=read, parse_options=parse)


def _lines(block: pa.Buffer) -> list[bytes]:
    """The block's non-blank lines: one per record (pyarrow skips blank lines)."""
    return [line for line in block.to_pybytes().split(b"\n") if line and not line.isspace()]


# --- numbers -----------------------------------------------------------------------------------


def _leaves(array: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The number values inside `array` (through any lists) and each one's row in `array`."""
    rows = np.arange(len(array))
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        rows = rows[pc.list_parent_indices(array).to_numpy()]
        array = pc.list_flatten(array)
    return array, rows


def _depth(t: pa.DataType) -> int:
    """How many levels of lists hold the values of a column of type `t`."""
    return 0 if t == _leaf_type(t) else 1 + _depth(t.value_type)


def _leaf_type(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return t


def _flat(value: Any) -> Iterator[Any]:
    if isinstance(value, list):
        for v in value:
            yield from _flat(v)
    elif value is not None:
        yield value


def _may_hold_integers(block: pa.Buffer, name: str, rows: int, depth: int) -> bool:
    """False when the text of `block` surely holds no integer in column `name`, which holds numbers
    in `rows` records, under `depth` levels of lists: its key is written literally in at least
    `rows` places and never followed by an integer (depth 0) or by a list holding one (depth 1);
    deeper lists: no integer follows `[` or `,` anywhere. True (look closer) otherwise."""
    text = memoryview(block)
    if depth > 1:
        return re.search(rb"[\[,]\s*-?\d+(?![\d.eE])", text) is not None
    key = re.escape(json.dumps(name, ensure_ascii=False).encode())
    if len(re.findall(key + rb"\s*:", text)) < rows:  # a key written with escapes: look closer
        return True
    inside = rb"\[(?:[^\]]*?,)?" if depth else b""  # a list of numbers holds no ']' before its end
    return re.search(key + rb"\s*:\s*" + inside + rb"\s*-?\d+(?![\d.eE])", text) is not None


def _loads(path: Path, record: int, lines: list[bytes], rows: np.ndarray) -> list[Any]:
    """The objects of `lines[rows]` parsed by Python's json (ints exact, floats as float)."""
    try:
        return json.loads(b"[" + b",".join(lines[r] for r in rows) + b"]")
    except (ValueError, RecursionError) as exc:  # text pyarrow read but Python's json does not
        raise SourceInputError(
            f"{path}: records {record + int(rows[0])}..{record + int(rows[-1])}: cannot read numbers exactly: "
            f"{type(exc).__name__}: {exc}"
        ) from None


class _Kinds:
    """The first integer and the first float of one inferred column over a source's files, in
    order: (file index, file, record, what, value)."""

    def __init__(self) -> None:
        self.int: tuple[int, str, int, str, Any] | None = None
        self.float: tuple[int, str, int, str, Any] | None = None


class JsonText:
    """How a JSON Lines source reads its files: the block sizes, the given types, which columns
    the mapping reads (`needed`; None: all), the schema over every file (inferred once, then kept;
    picklable)."""

    def __init__(
        self,
        files: Sequence[Path],
        given: dict[str, pa.DataType],
        whole_schema: bool,
        needed: Sequence[str] | None,
        block_bytes: int,
        max_line_bytes: int,
    ) -> None:
        if not isinstance(block_bytes, int) or not MIN_BLOCK_BYTES <= block_bytes <= BLOCK_BYTES_CAP:
            raise ConfigError(
                f"block_bytes must be an int in [{MIN_BLOCK_BYTES}, {BLOCK_BYTES_CAP}], got {block_bytes!r}"
            )
        if not isinstance(max_line_bytes, int) or not block_bytes <= max_line_bytes <= LINE_BYTES_CAP:
            raise ConfigError(
                f"max_line_bytes must be an int in [block_bytes ({block_bytes}), {LINE_BYTES_CAP}], got {max_line_bytes!r}"
            )
        self.files = list(files)
        self.given = given
        self.block_bytes = block_bytes
        self.max_line_bytes = max_line_bytes
        self.needed = None if needed is None else list(needed)
        self._schema: pa.Schema | None = None
        self._empty = False
        if whole_schema:
            self._schema = pa.schema(list(given.items()))
        elif self.needed is not None and all(c in given for c in self.needed):
            self._schema = pa.schema([(c, given[c]) for c in self.needed])

    # -- the schema -----------------------------------------------------------------------------

    def schema(self) -> pa.Schema | None:
        """The columns every file is read with: the given ones, or inferred over every file
        (None when the files hold no record)."""
        if self._schema is None and not self._empty:
            self._schema = self._infer()
            self._empty = self._schema is None
        return self._schema

    def _infer(self) -> pa.Schema | None:
        explicit = pa.schema(list(self.given.items())) if self.given else None
        types: dict[str, pa.DataType] = {}
        kinds: dict[str, _Kinds] = {}
        records = 0
        for path in self.files:
            for record, block in self._blocks(path, explicit, infer=True):
                table = block[1]
                records += table.num_rows
                for field in table.schema:
                    name = field.name
                    if self.needed is not None and name not in self.needed:
                        continue
                    if name in self.given:
                        types[name] = self.given[name]
                        continue
                    merged = _unify(types.get(name), field.type)
                    if merged is None:
                        ahead = pa.schema([*(explicit or []), (name, types[name])])
                        note = f" (column {name!r} holds {types[name]} in earlier records)"
                        raise self._locate(path, record, block[0], ahead, True, note)
                    types[name] = merged
                    if pa.types.is_integer(_leaf_type(field.type)) or pa.types.is_floating(_leaf_type(field.type)):
                        self._kinds(path, record, block, name, kinds.setdefault(name, _Kinds()))
        return pa.schema(list(types.items())) if records else None

    def _kinds(self, path: Path, record: int, block: tuple[pa.Buffer, pa.Table], name: str, seen: _Kinds) -> None:
        """Track the first integer and float of inferred column `name`; SourceInputError at the
        first record whose kind differs from the first number's, or at an integer beyond int64."""
        leaves, rows = _leaves(block[1].column(name).combine_chunks())
        valid = leaves.is_valid().to_numpy(zero_copy_only=False)
        first_int = first_float = big = None
        if pa.types.is_integer(leaves.type):
            if valid.any():
                i = int(np.flatnonzero(valid)[0])
                first_int = int(rows[i]), leaves[i].as_py()
        else:
            values = leaves.to_numpy(zero_copy_only=False)
            whole = valid & (np.floor(values) == values)
            fraction = np.flatnonzero(valid & ~whole)
            if len(fraction):
                first_float = int(rows[fraction[0]]), float(values[fraction[0]])
            candidates = np.unique(rows[whole])  # rows whose whole numbers may be written as integers
            depth = _depth(block[1].schema.field(name).type)
            holders = len(np.unique(rows[valid]))
            if len(candidates) and not _may_hold_integers(block[0], name, holders, depth):
                i = int(np.flatnonzero(valid)[0])  # every number is written as a float
                first_float = int(rows[i]), float(values[i])
            elif len(candidates):
                lines = self._record_lines(path, record, block)
                for row, obj in zip(candidates.tolist(), _loads(path, record, lines, candidates)):
                    for v in _flat(obj.get(name) if type(obj) is dict else None):
                        if type(v) is int:
                            if first_int is None:
                                first_int = row, v
                            if big is None and not INT64_MIN <= v <= INT64_MAX:
                                big = row, v
                        elif type(v) is float and (first_float is None or row < first_float[0]):
                            first_float = row, v
        errors = []
        index = self.files.index(path)
        if seen.int is None and first_int is not None:
            seen.int = (index, str(path), record + first_int[0], "the integer", first_int[1])
        if seen.float is None and first_float is not None:
            seen.float = (index, str(path), record + first_float[0], "the float", first_float[1])
        if seen.int is not None and seen.float is not None:
            errors.append(_mixed(name, seen.int, seen.float))
        if big is not None:
            errors.append(
                (
                    record + big[0],
                    f"{path}: record {record + big[0]}: column {name!r} holds the integer {big[1]}, beyond "
                    f"int64: integers are read exactly or refused",
                )
            )
        if errors:
            raise SourceInputError(min(errors)[1])

    # -- reading ----------------------------------------------------------------------------------

    def batches(self, path: Path) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(file-relative record of the first row, batch) over `path`, read with `schema()`."""
        schema = self.schema()
        if schema is None:
            return
        floats = {
            f.name: _FLOAT_DIGITS[_leaf_type(f.type)]
            for f in schema
            if f.name in self.given and _leaf_type(f.type) in _FLOAT_DIGITS
        }
        for record, (buf, table) in self._blocks(path, schema, infer=False):
            for name, digits in floats.items():
                self._exact(path, record, (buf, table), name, digits)
            for batch in table.to_batches():
                yield record, batch
                record += batch.num_rows

    def _exact(self, path: Path, record: int, block: tuple[pa.Buffer, pa.Table], name: str, digits: int) -> None:
        """SourceInputError at the first integer of given-float column `name` that the float type
        does not hold exactly (only values of magnitude >= 2**digits can be such)."""
        leaves, rows = _leaves(block[1].column(name).combine_chunks())
        values = pc.cast(leaves, pa.float64()).to_numpy(zero_copy_only=False)
        large = np.flatnonzero(leaves.is_valid().to_numpy(zero_copy_only=False) & ~(np.abs(values) < 2.0**digits))
        if not len(large):
            return
        candidates = np.unique(rows[large])
        lines = self._record_lines(path, record, block)
        column = block[1].column(name)
        for row, obj in zip(candidates, _loads(path, record, lines, candidates)):
            read = _flat(column[int(row)].as_py())
            for v, got in zip(_flat(obj.get(name) if isinstance(obj, dict) else None), read):
                if isinstance(v, int) and not isinstance(v, bool) and not (math.isfinite(got) and int(got) == v):
                    raise SourceInputError(
                        f"{path}: record {record + int(row)}: column {name!r} holds the integer {v}, which "
                        f"{_FLOAT_NAMES[_leaf_type(column.type)]} cannot hold exactly (it would read {got!r}); "
                        f"integers are read exactly or refused"
                    )

    # -- blocks and errors ------------------------------------------------------------------------

    def _blocks(
        self, path: Path, schema: pa.Schema | None, *, infer: bool
    ) -> Iterator[tuple[int, tuple[pa.Buffer, pa.Table]]]:
        """(record of the block's first row, (block text, parsed table)) over `path`; errors name
        the file, record and column."""
        try:
            stream = pa.input_stream(str(path), compression="detect")
        except (pa.ArrowException, OSError) as exc:
            raise SourceInputError(f"{path}: cannot read: {type(exc).__name__}: {exc}") from None
        record = 0
        with closing(stream):
            blocks = text_blocks(stream, self.block_bytes, self.max_line_bytes)
            while True:
                try:
                    block = next(blocks, None)
                except _LongLine:
                    raise SourceInputError(
                        f"{path}: record {record}: the line is longer than max_line_bytes ({self.max_line_bytes}); "
                        f"give a larger max_line_bytes (--max-line-bytes) to read it, which costs about "
                        f"{JSON_TEXT_FACTOR}x the line's length in memory while it is parsed"
                    ) from None
                except (pa.ArrowException, OSError) as exc:
                    raise SourceInputError(
                        f"{path}: after record {record}: cannot read: {type(exc).__name__}: {exc}"
                    ) from None
                if block is None:
                    return
                try:
                    table = _parse(block, schema, infer=infer)
                except pa.ArrowInvalid as exc:
                    raise self._locate(path, record, block, schema, infer, "", exc) from None
                except pa.ArrowException as exc:
                    raise SourceInputError(
                        f"{path}: after record {record}: cannot read: {type(exc).__name__}: {exc}"
                    ) from None
                yield record, (block, table)
                record += table.num_rows

    def _record_lines(self, path: Path, record: int, block: tuple[pa.Buffer, pa.Table]) -> list[bytes]:
        lines = _lines(block[0])
        if len(lines) != block[1].num_rows:
            raise SourceInputError(
                f"{path}: records {record}..{record + block[1].num_rows - 1}: {len(lines)} lines hold "
                f"{block[1].num_rows} objects; JSON Lines holds one object per line"
            )
        return lines

    def _locate(
        self,
        path: Path,
        record: int,
        block: pa.Buffer,
        schema: pa.Schema | None,
        infer: bool,
        note: str,
        exc: Exception | None = None,
    ) -> SourceInputError:
        """The error of the first line of `block` that fails to parse with `schema`, found by
        bisecting over prefixes (a prefix fails once it holds a failing line), naming its record
        and column."""
        lines = _lines(block)

        def failure(n: int) -> Exception | None:
            try:
                _parse(pa.py_buffer(b"\n".join(lines[:n])), schema, infer=infer)
            except pa.ArrowInvalid as e:
                return e
            return None

        lo, hi = 0, len(lines)
        error = exc if exc is not None else failure(hi)
        if error is None:  # not reproduced line by line: name the block
            return SourceInputError(f"{path}: after record {record}: cannot read{note}")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            e = failure(mid)
            if e is None:
                lo = mid
            else:
                hi, error = mid, e
        message = re.sub(r" in row \d+", "", str(error))
        column = re.search(r"Column\(/([^/)]*)", message)
        name = column.group(1) if column else self._failing_column(lines[hi - 1], schema)
        where = f"column {name!r}: " if name else ""
        return SourceInputError(
            f"{path}: record {record + hi - 1}: {where}cannot read: {type(error).__name__}: {message}{note}"
        )

    @staticmethod
    def _failing_column(line: bytes, schema: pa.Schema | None) -> str | None:
        for field in schema or []:
            try:
                _parse(pa.py_buffer(line), pa.schema([field]), infer=False)
            except pa.ArrowInvalid:
                return field.name
        return None


def _mixed(name: str, *kinds: tuple[int, str, int, str, Any]) -> tuple[int, str]:
    """(record, message) naming the later of the column's first integer and first float."""
    first, later = sorted(kinds, key=lambda k: (k[0], k[2]))
    earlier = f"record {first[2]}" if first[1] == later[1] else f"{first[1]}: record {first[2]}"
    return later[2], (
        f"{later[1]}: record {later[2]}: column {name!r} holds {later[3]} {later[4]!r} but {earlier} holds "
        f"{first[3]} {first[4]!r}: a column's numbers must be all integers or all floats; give it a float "
        f"type to read them all as floats (column_types={{{name!r}: 'float64'}}, --column-types {name}=float64)"
    )


def _unify(a: pa.DataType | None, b: pa.DataType) -> pa.DataType | None:
    """The type of a column that is `a` in earlier blocks and `b` in this one, None when they
    conflict. Numbers unify to float64 (the kind check refuses a mix); an inferred timestamp and a
    string to string."""
    if a is None or pa.types.is_null(a):
        return b
    if pa.types.is_null(b) or a == b:
        return a
    if {pa.types.is_timestamp(a) or pa.types.is_string(a), pa.types.is_timestamp(b) or pa.types.is_string(b)} == {True}:
        return pa.string()
    try:
        return (
            pa.unify_schemas([pa.schema([("c", a)]), pa.schema([("c", b)])], promote_options="permissive").field(0).type
        )
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
