"""Stub of datasetrt._native.batch (_ext/batch.pyx): chunk post-processing kernels."""

from datasetrt._native._buffers import BufferLike

def json_array(data: BufferLike, json_off: BufferLike, json_len: BufferLike, n: int) -> tuple[bytes | None, int]:
    """(b"[j0,j1,...]", -1) when every record's JSON is structurally one object, else (None, first bad record)."""

def pack_payloads(
    data: BufferLike,
    data_off: BufferLike,
    data_len: BufferLike,
    n: int,
    out: BufferLike,
    out_off: BufferLike,
    start: int,
) -> int:
    """Payloads [0, n) back to back into out[start:] (their starts in int64 out_off); the end offset."""

def slice_bytes(data: BufferLike, off: BufferLike, length: BufferLike, n: int) -> list[bytes]:
    """Spans [0, n) of `data` (int64 offsets and lengths) as new bytes objects."""

def project_rows(
    data: BufferLike,
    offsets: BufferLike,
    n: int,
    outer: int,
    inner_bytes: int,
    step_bytes_out: int,
    pad_item: BufferLike,
    out: BufferLike,
) -> int:
    """n ragged records projected to one length along their ragged dim into `out`; bytes written."""
