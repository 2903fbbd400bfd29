"""Stub of datasetrt._native.gather (_ext/gather.pyx): the record and batch gather kernels."""

from datasetrt._native._buffers import BufferLike
from datasetrt._native.table import CacheTable
from datasetrt.values.payloads import PayloadCheck

RECORD_LAYOUT: dict[str, int]

class Scratch:
    """Per-reader staging buffer and decoding contexts; one per reading thread."""

    def __init__(self) -> None: ...
    @property
    def capacity(self) -> int: ...

def gather(
    table: CacheTable,
    cache_pos: BufferLike,
    sample_id: BufferLike,
    out: BufferLike,
    json_off: BufferLike,
    json_len: BufferLike,
    data_off: BufferLike,
    data_len: BufferLike,
    scratch: Scratch,
) -> tuple[int, int, int]:
    """Rows (cache_pos int64, sample_id uint64) into `out` (uint8), each record's JSON then its
    payload at the int64 offsets/lengths: (rows_done, out_used, need_bytes)."""

def gather_batch(
    table: CacheTable,
    cache_pos: BufferLike,
    sample_id: BufferLike,
    out: BufferLike,
    offsets: BufferLike,
    json_off: BufferLike,
    json_len: BufferLike,
    check: PayloadCheck,
    start: int,
    json_bottom: int,
    scratch: Scratch,
) -> tuple[int, int, int, int]:
    """Rows into `out` with payloads back to back from out[start] (int64 `offsets`, n+1), JSON kept
    below json_bottom or dropped: (rows_done, payload_end, json_bottom, need_bytes)."""
