"""format/arrow_ipc.py: the IPC structure read without decoding agrees with pyarrow's decode, and
no damage to a file makes it fail otherwise than with IpcStructureError."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from datasetrt.format.arrow_ipc import IpcStructureError, check_sizes, scan

TABLE = pa.table(
    {
        "b": pa.array([True, False, None, True, False]),
        "i": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "f": pa.array([0.5, None, 1.5, 2.5, 3.5]),
        "s": pa.array(["a", "bb", None, "dddd", "eeeee"]),
        "l": pa.array(["x" * 40] * 5, pa.large_string()),
        "v": pa.array(["short", "a string longer than twelve", None, "", "v"], pa.string_view()),
    }
)
COLUMNS = [(f.name, str(f.type)) for f in TABLE.schema]


def _file(compression: str | None, batches: int = 2) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, TABLE.schema, options=ipc.IpcWriteOptions(compression=compression)) as writer:
        for k in range(batches):
            writer.write_table(TABLE.slice(k, 5 - k))
    return sink.getvalue().to_pybytes()


def _footer_len(data: bytes) -> int:
    return int.from_bytes(data[-10:-6], "little", signed=True)


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_scan_agrees_with_pyarrow(compression):
    """Rows per batch, and for compressed buffers the decoded size pyarrow then allocates."""
    data = _file(compression)
    batches = scan(data, _footer_len(data))
    reader = ipc.open_file(pa.py_buffer(data))
    assert [b.rows for b in batches] == [reader.get_batch(k).num_rows for k in range(reader.num_record_batches)]
    for k, batch in enumerate(batches):
        decoded = reader.get_batch(k)
        sizes = [buf.size if buf is not None else 0 for col in decoded.columns for buf in col.buffers()]
        assert len(batch.decoded) == len(sizes)
        for declared, allocated, size in zip(batch.decoded, batch.allocated, sizes):
            if allocated:
                assert declared == size
        assert any(batch.allocated) == (compression is not None)
        assert batch.variadic == (1,)  # the string_view column's data buffers
    fault, total = check_sizes(batches, COLUMNS, max_rows=9)
    assert fault is None
    assert (total > 0) == (compression is not None)


def test_check_sizes_faults():
    data = _file("zstd")
    batches = scan(data, _footer_len(data))
    fault, _ = check_sizes(batches, COLUMNS, max_rows=8)
    assert fault is not None and fault.kind == "rows" and fault.rows == 9
    fault, _ = check_sizes(batches, COLUMNS[:-1], max_rows=9)
    assert fault is not None and fault.kind == "layout" and "6 field nodes for 5 columns" in fault.detail
    # a values buffer declaring more than 5 int64 values need
    first = batches[0]
    decoded = list(first.decoded)
    decoded[3] = 10_000  # "i" values (buffers: b validity, b values, i validity, i values)
    inflated = type(first)(first.dictionary, first.rows, first.node_lengths, tuple(decoded), first.allocated, (1,))
    fault, total = check_sizes([inflated], COLUMNS, max_rows=9)
    assert fault is not None and fault.kind == "buffer"
    assert "values buffer of column 'i'" in fault.detail and "declares 10000" in fault.detail
    assert total >= 10_000


def test_uncompressed_buffers_are_not_held_to_their_rows():
    """An uncompressed buffer is a slice of the file (nothing allocated): larger than its rows
    need is Arrow-legal and not refused."""
    data = _file(None, batches=1)
    (batch,) = scan(data, _footer_len(data))
    bigger = type(batch)(False, 5, batch.node_lengths, tuple(d + 4096 for d in batch.decoded), batch.allocated, (1,))
    assert check_sizes([bigger], COLUMNS, max_rows=5) == (None, 0)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_no_damage_escapes_as_another_error(compression):
    """Every single-byte change and every truncation of the metadata region (messages and footer,
    not the bodies): scan returns or raises IpcStructureError, nothing else."""
    data = _file(compression, batches=1)
    footer_len = _footer_len(data)
    for pos in range(8, len(data) - 10):
        for value in (0x00, 0xFF, data[pos] ^ 0x80):
            damaged = bytearray(data)
            damaged[pos] = value
            try:
                scan(bytes(damaged), footer_len)
            except IpcStructureError:
                pass
    for cut in range(1, footer_len):
        try:
            scan(data[: len(data) - 10 - cut] + data[-10:], footer_len - cut)
        except IpcStructureError:
            pass
