"""Stub of datasetrt._native.codec (_ext/codec.pyx): encoding, per-cache codec states, XXH3."""

from collections.abc import Sequence

from datasetrt._native._buffers import BufferLike

def xxh3_64_pairs(heads: Sequence[bytes], bodies: Sequence[bytes], out: BufferLike) -> None:
    """out[i] (uint64) = XXH3-64 of heads[i] + bodies[i], hashed as one stream."""

class EncodeState:
    """A cache's codec state as the writer uses it (zstd_dict: its dictionary prepared at `level`)."""

    def __init__(self, codec_id: int, data: BufferLike, level: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def state_id(self) -> int: ...

class Encoder:
    """Encodes payloads into the stored form of one codec of the table; one per writer thread."""

    def __init__(self, codec_id: int, level: int = 0, state: EncodeState | None = None) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def state(self) -> EncodeState | None: ...
    @property
    def max_payload_bytes(self) -> int | None: ...
    def encode(self, data: BufferLike) -> bytes:
        """The stored form of one payload."""

class DecodeState:
    """One cache's codec state as readers use it (zstd_dict: its dictionary); shared read-only."""

    def __init__(self, codec_id: int, data: BufferLike, label: str) -> None: ...
    @property
    def label(self) -> str: ...
    @property
    def address(self) -> int: ...
    @property
    def state_id(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
