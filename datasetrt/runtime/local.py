"""In-process record reader: flat cache/shard tables, lazily opened shard descriptors, and the
block loop around the native gather kernel.

Boundary: numpy arrays of (cache position, sample_id) in; payload bytes and embedded-JSON text
out. No Polars, no Torch. One `LocalReader` per process (descriptors are process-private).

Descriptor budget: at most `max_open_shards` shard files are open at once; when a block needs
more, every cache not in the block is closed first (bounded, O(caches) per eviction).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from datasetrt._native import gather as native
from datasetrt.errors import CacheIOError, ResourceLimitError
from datasetrt.format.reader import CODEC_IDS, CacheHandle

INITIAL_OUT_BYTES = 4 << 20


@dataclass
class Chunk:
    """`rows` consecutive window rows starting at window position `first`, as gathered records.

    Offsets in json_off/data_off are relative to `data`; `row` are population rows (for table
    lookups). Views into a reusable buffer or ring slot: valid until the next chunk is requested.
    """

    first: int
    rows: int
    data: np.ndarray
    json_off: np.ndarray
    json_len: np.ndarray
    data_off: np.ndarray
    data_len: np.ndarray
    cache_pos: np.ndarray
    sample_id: np.ndarray
    row: np.ndarray


def default_fd_budget() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, min(4096, soft // 2))


class LocalReader:
    """Reads records of the given caches in the calling process.

    Invariants: the flat tables never change shape after construction; `shard_fd[s] >= 0` iff
    shard s is open; a cache's index mapping is taken from its `CacheHandle` (shared by every
    reader in the process and by all processes through the page cache).
    """

    def __init__(self, handles: Sequence[CacheHandle], *, verify_records: bool = True,
                 max_open_shards: int | None = None) -> None:
        self.handles = list(handles)
        self.verify_records = verify_records
        self.max_open_shards = max_open_shards or default_fd_budget()
        n = len(self.handles)
        self.index_addr = np.zeros(n, dtype=np.uint64)
        self.index_rows = np.array([h.sample_count for h in self.handles], dtype=np.uint64)
        self.cksum_addr = np.zeros(n, dtype=np.uint64)
        self.shard_count = np.array([len(h.manifest.shards) for h in self.handles], dtype=np.int64)
        self.shard_base = np.zeros(n, dtype=np.int64)
        if n:
            np.cumsum(self.shard_count[:-1], out=self.shard_base[1:])
        shards = [s for h in self.handles for s in h.manifest.shards]
        self.shard_len = np.array([s.byte_len for s in shards], dtype=np.uint64)
        self.shard_ulen = np.array([s.uncompressed_byte_len for s in shards], dtype=np.uint64)
        self.shard_codec = np.array([CODEC_IDS[s.algo] for s in shards], dtype=np.uint8)
        self.shard_fd = np.full(len(shards), -1, dtype=np.int32)
        self.shard_names = [str(p) for h in self.handles for p in h.shard_paths()]
        self.labels = [str(h.path) for h in self.handles]
        self._prepared = np.zeros(n, dtype=bool)
        self._mapped = np.zeros(n, dtype=bool)
        self._maps: list = [None] * n  # keeps index/sidecar mappings alive while addresses are used
        self._open_count = 0
        self._scratch = native.Scratch()
        self._out = np.empty(INITIAL_OUT_BYTES, dtype=np.uint8)
        self._closed = False

    # -- descriptors ------------------------------------------------------------------------

    def _prepare(self, caches: np.ndarray) -> None:
        todo = caches[~self._prepared[caches]]
        if not todo.size:
            return
        need = int(self.shard_count[todo].sum())
        if self._open_count + need > self.max_open_shards:
            keep = np.zeros(len(self.handles), dtype=bool)
            keep[caches] = True
            for k in np.flatnonzero(self._prepared & ~keep):
                self._close_cache(int(k))
        for k in todo.tolist():
            self._open_cache(k)

    def _open_cache(self, k: int) -> None:
        handle = self.handles[k]
        if not self._mapped[k]:
            index = handle.index_map()
            sidecar = handle.checksum_map() if self.verify_records else None
            self._maps[k] = (index, sidecar)
            self.index_addr[k] = index.address
            self.cksum_addr[k] = sidecar.address if sidecar is not None else 0
            self._mapped[k] = True
        base = int(self.shard_base[k])
        for j, path in enumerate(handle.shard_paths()):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                self._close_cache(k)
                raise CacheIOError(f"I/O error: {exc.strerror} (os error {exc.errno}): {path}") from None
            self.shard_fd[base + j] = fd
            self._open_count += 1
        self._prepared[k] = True

    def _close_cache(self, k: int) -> None:
        base, count = int(self.shard_base[k]), int(self.shard_count[k])
        for s in range(base, base + count):
            fd = int(self.shard_fd[s])
            if fd >= 0:
                os.close(fd)
                self.shard_fd[s] = -1
                self._open_count -= 1
        self._prepared[k] = False

    def close(self) -> None:
        """Close every descriptor (idempotent). Mappings stay with their handles."""
        if self._closed:
            return
        for k in np.flatnonzero(self._prepared):
            self._close_cache(int(k))
        self._closed = True

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- reading ----------------------------------------------------------------------------

    def gather_into(self, cache_pos: np.ndarray, sample_id: np.ndarray, out: np.ndarray,
                    json_off: np.ndarray, json_len: np.ndarray, data_off: np.ndarray,
                    data_len: np.ndarray) -> tuple[int, int, int]:
        """One native gather of the given rows into `out` (offsets relative to `out`).

        Returns (rows_done, bytes_used, need_bytes) as `_native.gather`: rows_done < len(rows)
        when `out` filled; need_bytes > 0 when row rows_done alone exceeds what was left.
        """
        if self._closed:
            raise CacheIOError("reader is closed")
        self._prepare(np.unique(cache_pos))
        return native.gather(
            self.index_addr, self.index_rows, self.shard_base, self.shard_count, self.cksum_addr,
            self.shard_fd, self.shard_len, self.shard_ulen, self.shard_codec,
            cache_pos, sample_id, out, json_off, json_len, data_off, data_len,
            self._scratch, self.labels, self.shard_names,
        )

    def read(self, cache_pos: np.ndarray, sample_id: np.ndarray) -> tuple[list[bytes], list[str]]:
        """Payloads and embedded JSON texts of the given rows, in the given order."""
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        n = len(cache_pos)
        json_off = np.empty(n, dtype=np.int64)
        json_len = np.empty(n, dtype=np.int64)
        data_off = np.empty(n, dtype=np.int64)
        data_len = np.empty(n, dtype=np.int64)
        datas: list[bytes] = []
        jsons: list[str] = []
        first = 0
        while first < n:
            done, _used, need = self.gather_into(
                cache_pos[first:], sample_id[first:], self._out,
                json_off[first:], json_len[first:], data_off[first:], data_len[first:],
            )
            d, j = native.slice_records(self._out, json_off[first:], json_len[first:],
                                        data_off[first:], data_len[first:], done)
            datas += d
            jsons += j
            first += done
            if need and done == 0:
                self._grow(need)
        return datas, jsons

    def _grow(self, need: int) -> None:
        """Make the gather buffer hold one record of `need` bytes (a record larger than the buffer)."""
        self._out = _grown(self._out, need)


def _grown(out: np.ndarray, need: int) -> np.ndarray:
    """A gather buffer that holds one record of `need` bytes (at least twice `out`)."""
    try:
        return np.empty(max(need, 2 * len(out)), dtype=np.uint8)
    except MemoryError:
        raise ResourceLimitError(f"cannot allocate a {need}-byte read buffer for one record") from None


def local_chunks(reader: LocalReader, window, block_rows: int) -> Iterator[Chunk]:
    """Chunks of `window` read in this process, in window order (the runtime=None path).

    The gather buffer belongs to this generator (not to the shared reader), so a chunk stays
    valid until this generator is advanced, however many other iterators read meanwhile.
    """
    out = np.empty(INITIAL_OUT_BYTES, dtype=np.uint8)
    for first in range(0, window.length, block_rows):
        count = min(block_rows, window.length - first)
        rows = window.rows(first, count)
        cache_pos, sample_id = window.population.resolve(rows)
        cache_pos = np.ascontiguousarray(cache_pos, dtype=np.int64)
        sample_id = np.ascontiguousarray(sample_id, dtype=np.uint64)
        arrays = np.empty((4, count), dtype=np.int64)
        pos = 0
        while pos < count:
            done, _used, need = reader.gather_into(cache_pos[pos:], sample_id[pos:], out,
                                                   arrays[0, pos:], arrays[1, pos:], arrays[2, pos:], arrays[3, pos:])
            if done == 0:
                out = _grown(out, need)
                continue
            end = pos + done
            yield Chunk(first + pos, done, out, arrays[0, pos:end], arrays[1, pos:end], arrays[2, pos:end],
                        arrays[3, pos:end], cache_pos[pos:end], sample_id[pos:end], rows[pos:end])
            pos = end
