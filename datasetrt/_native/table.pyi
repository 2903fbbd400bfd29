"""Stub of datasetrt._native.table (_ext/table.pyx): the reader's table of caches and shards."""

from collections.abc import Sequence

from datasetrt._native._buffers import BufferLike
from datasetrt._native.codec import DecodeState
from datasetrt._native.mapped import MappedFile

class CacheTable:
    """Per cache and per shard tables of one reader, which the gather kernels read."""

    def __init__(
        self,
        labels: Sequence[str],
        index_rows: Sequence[int],
        shard_count: Sequence[int],
        shard_len: Sequence[int],
        shard_ulen: Sequence[int],
        shard_codec: Sequence[int],
        shard_names: Sequence[str],
        shard_fd: BufferLike,
    ) -> None: ...
    @property
    def labels(self) -> list[str]: ...
    @property
    def shard_names(self) -> list[str]: ...
    @property
    def unmapped(self) -> int:
        """Caches not mapped yet."""
    @property
    def n_caches(self) -> int: ...
    @property
    def n_shards(self) -> int: ...
    def map_cache(
        self, k: int, index: MappedFile, checksums: MappedFile | None = None, state: DecodeState | None = None
    ) -> None:
        """Point cache k at its mapped index, sidecar (None: not verified) and codec state."""
    def map_shard(self, s: int, shard: MappedFile) -> bool:
        """Read flat shard s's uncompressed records from `shard` (its whole file mapped); False
        (not mapped) when the mapping is shorter than the shard's byte_len."""
    @property
    def mapped_shards(self) -> int: ...
    def unmapped_in(self, cache_pos: BufferLike) -> list[int]:
        """The distinct caches named in the int64 `cache_pos` not mapped yet, in order of first use."""
    @property
    def index_addr(self) -> tuple[int, ...]: ...
    @property
    def cksum_addr(self) -> tuple[int, ...]: ...
