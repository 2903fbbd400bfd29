"""metadata.arrow's IPC structure read without decoding it: the rows each record batch declares and
the size each of its buffers decodes to, so a file is sized before pyarrow allocates anything.

Boundary: bytes of one Arrow IPC file in, numbers out; no pyarrow, no cache layout beyond the
column kinds a caller passes. Imports only `struct`.

Why: pyarrow's IPC reader trusts a file's own sizes. A compressed buffer (IPC body compression,
lz4 or zstd) starts with its decoded length as an int64, and the reader allocates that length
before it decompresses; a 100 KB file of zstd frames can so declare (and really decode to)
gigabytes. `scan` reads the footer and each message's flatbuffer (the Arrow format's
File.fbs/Message.fbs: Footer, Block, Message, RecordBatch, FieldNode, Buffer, BodyCompression),
checks every offset and length against the file, and reports per record batch its declared rows
and its buffers' decoded sizes; `check_sizes` then holds each buffer to what `rows` rows of its
column can need (validity bitmaps, fixed-width values, offsets) and the whole file to a byte
bound. Everything is bounds-checked; a structure that does not parse is `IpcStructureError`.

Cost: O(blocks + buffers) Python work, both bounded by the file's size (each costs >= 16 bytes
of flatbuffer), no body byte is read but the 8-byte length prefix of each compressed buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_BLOCK = struct.Struct("<qi4xq")  # Block: offset, metaDataLength, (pad), bodyLength
_PAIR = struct.Struct("<qq")  # FieldNode (length, null_count) and Buffer (offset, length)
_CONTINUATION = 0xFFFFFFFF
_HEADER_DICTIONARY_BATCH = 2
_HEADER_RECORD_BATCH = 3
PAD = 64  # Arrow buffers are padded to 64 bytes; a declared size may round up to that


class IpcStructureError(ValueError):
    """The file's footer or a message does not parse (an offset or length out of range)."""


@dataclass(frozen=True)
class Batch:
    """One message of the file: a record batch (`dictionary` False) of `rows` rows, its field
    nodes' lengths, and per buffer its decoded size (`decoded`) and whether decoding allocates
    it (`allocated`: a compressed buffer; an uncompressed one is a slice of the file)."""

    dictionary: bool
    rows: int
    node_lengths: tuple[int, ...]
    decoded: tuple[int, ...]
    allocated: tuple[bool, ...]
    variadic: tuple[int, ...]


class _Flat:
    """Bounds-checked reads of one flatbuffer held in data[lo:hi]."""

    def __init__(self, data: bytes, lo: int, hi: int) -> None:
        if lo < 0 or hi > len(data) or lo > hi:
            raise IpcStructureError(f"flatbuffer [{lo}, {hi}) outside the file")
        self.data, self.lo, self.hi = data, lo, hi

    def _at(self, pos: int, size: int) -> int:
        if pos < self.lo or pos + size > self.hi:
            raise IpcStructureError(f"flatbuffer read at {pos} outside [{self.lo}, {self.hi})")
        return pos

    def u16(self, pos: int) -> int:
        return int(_U16.unpack_from(self.data, self._at(pos, 2))[0])

    def i32(self, pos: int) -> int:
        return int(_I32.unpack_from(self.data, self._at(pos, 4))[0])

    def u32(self, pos: int) -> int:
        return int(_U32.unpack_from(self.data, self._at(pos, 4))[0])

    def i64(self, pos: int) -> int:
        return int(_I64.unpack_from(self.data, self._at(pos, 8))[0])

    def u8(self, pos: int) -> int:
        return self.data[self._at(pos, 1)]

    def root(self) -> tuple[int, int, int]:
        return self.table(self.lo + self.u32(self.lo))

    def table(self, pos: int) -> tuple[int, int, int]:
        """(table position, vtable position, vtable length) of the table at `pos`."""
        vtable = pos - self.i32(pos)
        size = self.u16(vtable)
        if size < 4 or size % 2:
            raise IpcStructureError(f"flatbuffer vtable of {size} bytes at {vtable}")
        self._at(vtable, size)
        return pos, vtable, size

    def field(self, table: tuple[int, int, int], index: int) -> int:
        """Absolute position of field `index` of `table`, or 0 when the field is absent."""
        pos, vtable, size = table
        slot = 4 + 2 * index
        if slot + 2 > size:
            return 0
        offset = self.u16(vtable + slot)
        return pos + offset if offset else 0

    def scalar(self, table: tuple[int, int, int], index: int, read, default: int = 0) -> int:
        at = self.field(table, index)
        return read(at) if at else default

    def ref(self, table: tuple[int, int, int], index: int) -> int:
        """Position of the table/vector field `index` refers to, or 0 when absent."""
        at = self.field(table, index)
        return at + self.u32(at) if at else 0

    def vector(self, table: tuple[int, int, int], index: int, item_bytes: int) -> tuple[int, int]:
        """(first item position, item count) of vector field `index` ((0, 0) when absent)."""
        at = self.ref(table, index)
        if not at:
            return 0, 0
        count = self.u32(at)
        self._at(at + 4, count * item_bytes)
        return at + 4, count


def scan(data: bytes, footer_len: int) -> list[Batch]:
    """Every dictionary and record batch of the Arrow IPC file `data` (framing already checked:
    leading and trailing magic, footer length in range), in footer order. IpcStructureError
    when the footer, a block or a message does not parse or points outside the file."""
    end = len(data) - 10
    footer = _Flat(data, end - footer_len, end)
    top = footer.root()
    batches = []
    for index, dictionary in ((2, True), (3, False)):
        first, count = footer.vector(top, index, _BLOCK.size)
        for k in range(count):
            offset, meta_len, body_len = _BLOCK.unpack_from(data, first + k * _BLOCK.size)
            batches.append(_message(data, offset, meta_len, body_len, end - footer_len, dictionary))
    return batches


def _message(data: bytes, offset: int, meta_len: int, body_len: int, limit: int, dictionary: bool) -> Batch:
    if offset < 8 or meta_len < 8 or body_len < 0 or offset + meta_len + body_len > limit:
        raise IpcStructureError(f"block at {offset} (metadata {meta_len}, body {body_len} bytes) outside the file")
    head = _Flat(data, offset, offset + meta_len)
    if head.u32(offset) == _CONTINUATION:
        size, start = head.i32(offset + 4), offset + 8
    else:  # the pre-1.0 framing: the length alone
        size, start = head.i32(offset), offset + 4
    if size <= 0 or start + size > offset + meta_len:
        raise IpcStructureError(f"message at {offset} declares {size} bytes of metadata in a {meta_len}-byte block")
    flat = _Flat(data, start, start + size)
    message = flat.root()
    header_type = flat.scalar(message, 1, flat.u8)
    wanted = _HEADER_DICTIONARY_BATCH if dictionary else _HEADER_RECORD_BATCH
    if header_type != wanted:
        raise IpcStructureError(f"message at {offset} has header type {header_type}, expected {wanted}")
    header_at = flat.ref(message, 2)
    if not header_at:
        raise IpcStructureError(f"message at {offset} has no header")
    batch = flat.table(header_at)
    if dictionary:  # DictionaryBatch: id, data (a RecordBatch), isDelta
        data_at = flat.ref(batch, 1)
        if not data_at:
            raise IpcStructureError(f"dictionary batch at {offset} has no data")
        batch = flat.table(data_at)
    rows = flat.scalar(batch, 0, flat.i64)
    nodes_at, node_count = flat.vector(batch, 1, _PAIR.size)
    buffers_at, buffer_count = flat.vector(batch, 2, _PAIR.size)
    compressed = bool(flat.ref(batch, 3))
    variadic_at, variadic_count = flat.vector(batch, 4, 8)
    node_lengths = tuple(_PAIR.unpack_from(data, nodes_at + 16 * i)[0] for i in range(node_count))
    body = offset + meta_len
    decoded, allocated = [], []
    for i in range(buffer_count):
        buf_offset, buf_len = _PAIR.unpack_from(data, buffers_at + 16 * i)
        if buf_offset < 0 or buf_len < 0 or buf_offset + buf_len > body_len:
            raise IpcStructureError(f"buffer {i} of the batch at {offset} lies outside its {body_len}-byte body")
        if not compressed or buf_len == 0:
            decoded.append(buf_len)
            allocated.append(False)
            continue
        if buf_len < 8:
            raise IpcStructureError(f"compressed buffer {i} of the batch at {offset} is {buf_len} bytes (< 8)")
        declared = int(_I64.unpack_from(data, body + buf_offset)[0])
        if declared == -1:  # stored uncompressed after the prefix
            decoded.append(buf_len - 8)
            allocated.append(False)
        elif declared < 0:
            raise IpcStructureError(f"compressed buffer {i} of the batch at {offset} declares {declared} bytes")
        else:
            decoded.append(declared)
            allocated.append(True)
    variadic = tuple(int(_I64.unpack_from(data, variadic_at + 8 * i)[0]) for i in range(variadic_count))
    if rows < 0 or any(n < 0 for n in node_lengths) or any(v < 0 for v in variadic):
        raise IpcStructureError(f"batch at {offset} declares a negative length")
    return Batch(dictionary, rows, node_lengths, tuple(decoded), tuple(allocated), variadic)


# Buffers of each column kind the metadata table accepts, as (name, bytes per row, bits) with
# bytes per row None for variable-size data: the validity bitmap first, then the values.
_LAYOUTS: dict[str, tuple[tuple[str, int | None, bool], ...]] = {
    "bool": (("validity", 1, True), ("values", 1, True)),
    "int64": (("validity", 1, True), ("values", 8, False)),
    "double": (("validity", 1, True), ("values", 8, False)),
    "string": (("validity", 1, True), ("offsets", 4, False), ("data", None, False)),
    "large_string": (("validity", 1, True), ("offsets", 8, False), ("data", None, False)),
    "string_view": (("validity", 1, True), ("views", 16, False)),  # then its variadic data buffers
}
LAYOUT_KINDS = frozenset(_LAYOUTS)


@dataclass(frozen=True)
class SizeFault:
    """Why a file's declared sizes are refused: `rows` (more rows than allowed), `buffer` (a
    buffer larger than its column can need: `column`, `buffer`, `declared`, `allowed`) or
    `layout` (nodes or buffers that do not match the columns)."""

    kind: str
    detail: str
    rows: int = 0


def _allowed(per_row: int, bits: bool, rows: int, offsets: bool) -> int:
    need = (rows * per_row + 7) // 8 if bits else (rows + (1 if offsets else 0)) * per_row
    return (need + PAD - 1) // PAD * PAD + PAD


def check_sizes(batches: list[Batch], columns: list[tuple[str, str]], max_rows: int) -> tuple[SizeFault | None, int]:
    """Hold the file's record batches to `columns` ((name, Arrow type name in LAYOUT_KINDS), in
    schema order) and `max_rows`: the rows of all record batches together at most `max_rows`,
    one field node per column, each node at most its batch's rows, each compressed buffer's
    decoded size at most what its column's rows can need (variable-size data excepted). Returns (the first
    fault or None, bytes decoding allocates in all: compressed buffers' declared sizes, over
    every batch and dictionary). O(batches x buffers)."""
    allocated = sum(size for b in batches for size, alloc in zip(b.decoded, b.allocated) if alloc)
    rows = sum(b.rows for b in batches if not b.dictionary)
    if rows > max_rows:
        return SizeFault("rows", f"{rows} rows", rows), allocated
    for k, batch in enumerate(b for b in batches if not b.dictionary):
        if len(batch.node_lengths) != len(columns):
            return SizeFault(
                "layout", f"record batch {k} has {len(batch.node_lengths)} field nodes for {len(columns)} columns"
            ), allocated
        buffer = 0
        views = 0
        for (name, kind), length in zip(columns, batch.node_lengths):
            if length > batch.rows:
                return SizeFault(
                    "layout", f"column '{name}' of record batch {k} has {length} rows, the batch {batch.rows}"
                ), allocated
            layout = list(_LAYOUTS[kind])
            if kind == "string_view":
                extra = batch.variadic[views] if views < len(batch.variadic) else 0
                views += 1
                layout += [("data", None, False)] * extra
            for part, per_row, bits in layout:
                if buffer >= len(batch.decoded):
                    return SizeFault(
                        "layout", f"record batch {k} has {len(batch.decoded)} buffers, too few for its columns"
                    ), allocated
                size = batch.decoded[buffer]
                if per_row is not None and batch.allocated[buffer]:  # (an uncompressed buffer is file bytes)
                    allowed = _allowed(per_row, bits, length, part == "offsets")
                    if size > allowed:
                        return SizeFault(
                            "buffer",
                            f"the {part} buffer of column '{name}' in record batch {k} "
                            f"declares {size} decoded bytes, more than {length} rows of {kind} "
                            f"need ({allowed})",
                        ), allocated
                buffer += 1
        if buffer != len(batch.decoded):
            return SizeFault(
                "layout", f"record batch {k} has {len(batch.decoded)} buffers, its columns {buffer}"
            ), allocated
    return None, allocated
