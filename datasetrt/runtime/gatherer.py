"""The record gatherer: per-cache flat tables, lazily opened shard descriptors, and the call of
the native gather kernel into caller-provided buffers.

Boundary: imports no numpy (nor Polars, pyarrow, torch), so reader worker processes stay small:
its tables are `array.array`s and every buffer argument may be a numpy array or a memoryview.

Descriptor budget: at most `max_open_shards` shard files are open at once; when a block needs
more, every cache not in the block is closed first (bounded, O(caches) per eviction).

Codec state: a cache whose codec has per-cache state (zstd_dict) gets its prepared state from its
`CacheHandle` (built once per handle and process) when the cache is first opened here; its address
sits in the per-cache `codec_state` table the kernel reads, and the handle keeps it alive.
"""

from __future__ import annotations

import itertools
import os
import resource
from array import array
from collections.abc import Sequence

from datasetrt._native import gather as native
from datasetrt.codecs import CODEC_IDS
from datasetrt.errors import CacheIOError
from datasetrt.format.reader import CacheHandle
from datasetrt.payloads import PayloadCheck


def default_fd_budget() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, min(4096, soft // 2))


class Gatherer:
    """Reads records of the given caches in the calling process into caller-provided buffers.

    Numpy-free (flat tables are `array.array`s), so reader worker processes can use it without
    importing numpy. Invariants: the flat tables never change shape after construction;
    `shard_fd[s] >= 0` iff shard s is open; a cache's index mapping and codec state are taken from
    its `CacheHandle` (shared by every reader in the process; the index by all processes through
    the page cache).
    """

    def __init__(self, handles: Sequence[CacheHandle], *, verify_records: bool = True,
                 max_open_shards: int | None = None) -> None:
        self.handles = list(handles)
        self.verify_records = verify_records
        self.max_open_shards = max_open_shards or default_fd_budget()
        n = len(self.handles)
        self.index_addr = array("Q", bytes(8 * n))
        self.index_rows = array("Q", [h.sample_count for h in self.handles])
        self.cksum_addr = array("Q", bytes(8 * n))
        self.codec_state = array("Q", bytes(8 * n))  # DecodeState.address per cache, 0 for none
        self.shard_count = array("q", [len(h.manifest.shards) for h in self.handles])
        self.shard_base = array("q", itertools.accumulate(self.shard_count[:-1], initial=0)) if n else array("q")
        shards = [s for h in self.handles for s in h.manifest.shards]
        self.shard_len = array("Q", [s.byte_len for s in shards])
        self.shard_ulen = array("Q", [s.uncompressed_byte_len for s in shards])
        self.shard_codec = array("B", [CODEC_IDS[s.algo] for s in shards])
        self.shard_fd = array("i", [-1]) * len(shards)
        self.shard_names = [str(p) for h in self.handles for p in h.shard_paths()]
        self.labels = [str(h.path) for h in self.handles]
        self._prepared = bytearray(n)
        self._unprepared = n
        self._mapped = bytearray(n)
        self._maps: list = [None] * n  # keeps index/sidecar mappings alive while addresses are used
        self._open_count = 0
        self._scratch = native.Scratch()
        self._closed = False

    # -- descriptors ------------------------------------------------------------------------

    def _prepare(self, cache_pos) -> None:
        """Open the shards of every cache named in `cache_pos` (any 1-D int buffer)."""
        if not self._unprepared:
            return  # every cache is open: the common case after the first blocks
        prepared = self._prepared
        todo = sorted({k for k in memoryview(cache_pos).tolist() if not prepared[k]})
        if not todo:
            return
        need = sum(self.shard_count[k] for k in todo)
        if self._open_count + need > self.max_open_shards:
            keep = set(memoryview(cache_pos).tolist())
            for k in range(len(self.handles)):
                if prepared[k] and k not in keep:
                    self._close_cache(k)
        for k in todo:
            self._open_cache(k)

    def _open_cache(self, k: int) -> None:
        handle = self.handles[k]
        if not self._mapped[k]:
            index = handle.index_map()
            sidecar = handle.checksum_map() if self.verify_records else None
            state = handle.codec_state()
            self._maps[k] = (index, sidecar, state)
            self.index_addr[k] = index.address
            self.cksum_addr[k] = sidecar.address if sidecar is not None else 0
            self.codec_state[k] = state.address if state is not None else 0
            self._mapped[k] = True
        base = self.shard_base[k]
        for j, path in enumerate(handle.shard_paths()):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                self._close_cache(k)
                raise CacheIOError(f"I/O error: {exc.strerror} (os error {exc.errno}): {path}") from None
            self.shard_fd[base + j] = fd
            self._open_count += 1
        self._prepared[k] = True
        self._unprepared -= 1

    def _close_cache(self, k: int) -> None:
        base, count = self.shard_base[k], self.shard_count[k]
        for s in range(base, base + count):
            fd = self.shard_fd[s]
            if fd >= 0:
                os.close(fd)
                self.shard_fd[s] = -1
                self._open_count -= 1
        if self._prepared[k]:
            self._prepared[k] = False
            self._unprepared += 1

    def close(self) -> None:
        """Close every descriptor (idempotent). Mappings stay with their handles."""
        if self._closed:
            return
        for k in range(len(self.handles)):
            if self._prepared[k]:
                self._close_cache(k)
        self._closed = True

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- reading ----------------------------------------------------------------------------

    def gather_into(self, cache_pos, sample_id, out, json_off, json_len, data_off, data_len) -> tuple[int, int, int]:
        """One native gather of the given rows into `out` (offsets relative to `out`).

        Arguments are 1-D contiguous buffers (numpy arrays or memoryviews): cache_pos int64,
        sample_id uint64, out uint8, the four offset/length outputs int64.
        Returns (rows_done, bytes_used, need_bytes) as `_native.gather`: rows_done < len(rows)
        when `out` filled; need_bytes > 0 when row rows_done alone exceeds what was left.
        """
        if self._closed:
            raise CacheIOError("reader is closed")
        self._prepare(cache_pos)
        return native.gather(
            self.index_addr, self.index_rows, self.shard_base, self.shard_count, self.cksum_addr,
            self.codec_state, self.shard_fd, self.shard_len, self.shard_ulen, self.shard_codec,
            cache_pos, sample_id, out, json_off, json_len, data_off, data_len,
            self._scratch, self.labels, self.shard_names,
        )

    def gather_batch_into(self, cache_pos, sample_id, out, offsets, json_off, json_len,
                          check: PayloadCheck) -> tuple[int, int, int, int]:
        """One native batch gather of the given rows into `out`, payloads back to back from out[0]
        in their final layout (`_native.gather.gather_batch`): offsets int64 (rows + 1 entries,
        relative to `out`); json_off/json_len int64 (rows entries to keep the embedded JSON,
        stacked down from the end of `out`; empty to check and drop it). `check` is the payload
        spec's length rule. Returns (rows_done, payload_bytes, json_bottom, need_bytes)."""
        if self._closed:
            raise CacheIOError("reader is closed")
        self._prepare(cache_pos)
        return native.gather_batch(
            self.index_addr, self.index_rows, self.shard_base, self.shard_count, self.cksum_addr,
            self.codec_state, self.shard_fd, self.shard_len, self.shard_ulen, self.shard_codec,
            cache_pos, sample_id, out, offsets, json_off, json_len, check.record_bytes, check.unit_bytes,
            self._scratch, self.labels, self.shard_names, check.label,
        )

