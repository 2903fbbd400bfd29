"""The record gatherer: a reader's native `CacheTable`, its shard descriptors under the process's
budget, and the calls of the native gather kernels into caller-provided buffers.

Boundary: imports no numpy (nor Polars, pyarrow, torch), so reader worker processes stay small:
its tables are `array.array`s and every buffer argument may be a numpy array or a memoryview.

The table (`_native.table.CacheTable`, built once per Gatherer) holds what the kernels read per
cache (index mapping, sample count, shards, checksum sidecar mapping, codec state) and per shard
(descriptor, byte_len, uncompressed_byte_len, codec, file name). It views the descriptor array
the budget writes, so opening and closing shards needs no update of the table.

Descriptors: shard files are opened per cache when a block first needs them and closed when the
process's one budget (`runtime/descriptors.py`) needs room for another reader or cache; index
and sidecar files are mapped once and keep no descriptor.

Remote caches under a tight node cache (one that cannot hold all their files at once, so shards
are evicted while the read goes on): a reader holds a shard (open, and pinned in the node cache
so no process on the node evicts it) only while it gathers a block that reads it, and none
between gathers. Every process reading a node's caches keeps this rule (the dataset's readers,
reader workers, DataLoader workers), so a file is never removed while open and the node's disk
stays within the limit (files present plus removed-but-open <= limit). A block whose shards do
not all fit beside the other pins is gathered in prefixes (`_hold`).

Mapped shards (`map_shards=True`, reader workers only): the uncompressed shards of a local cache
are mapped whole, read-only and shared (`MappedFile`), when the cache is first mapped here, and
the kernels copy their records out of the mapping instead of calling pread per record; every
check still reads the copy. The pages are the page cache's (file-backed, reclaimable: Pss_File),
not the process's. A shard file truncated after it was mapped raises SIGBUS in the process that
touches a page past its new end: the process dies, which only a reader worker may do (its parent
turns the death into a WorkerCrashedError naming the shard). A shard that cannot be mapped, or
is shorter than its manifest's byte_len, stays on pread, whose errors name it as before.
Compressed shards and remote caches (whose node-cache files come and go) stay on pread, and so
do the shards past the first MAX_MAPPED_SHARDS of a reader: a mapping is an area of the process's
`vm.max_map_count`, which the caches' index and sidecar mappings need too.

Codec state: a cache whose codec has per-cache state (zstd_dict) gets its prepared state from its
`CacheHandle` (built once per handle and process) when the cache is first mapped here; the table
points the cache at it and keeps it alive.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Container, Sequence

from datasetrt._native import gather as native
from datasetrt._native.mapped import MappedFile
from datasetrt._native.table import CacheTable
from datasetrt.errors import CacheFormatError, CacheIOError, DiskFullError, DiskLimitError
from datasetrt.format.layout import SHARDS_DIR
from datasetrt.format.reader import CacheHandle
from datasetrt.format.remote import small_files
from datasetrt.runtime.descriptors import BUDGET, DescriptorBudget, ShardDescriptors
from datasetrt.runtime.memory import collector_paused
from datasetrt.runtime.protocol import CacheLayout
from datasetrt.values.codecs import CODEC_IDS
from datasetrt.values.payloads import PayloadCheck

_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
MAX_MAPPED_SHARDS = 1024  # per reader (a reader worker keeps at most MAX_CACHED_READERS readers)


def _node_cache_tight(handles: Sequence[CacheHandle]) -> bool:
    """Whether the node cache holding these remote caches cannot hold all their files at once
    (its limit, or its file system's room), so their shards are evicted while they are read."""
    remote = [h.remote for h in handles if h.remote is not None]
    if not remote:
        return False
    need = sum(s.byte_len for h in handles if h.remote is not None for s in h.manifest.shards)
    need += sum(size or 0 for h in handles if h.remote is not None for _n, size, _s in small_files(h.manifest))
    node = remote[0].storage.node_cache()
    if node.limit_bytes is not None and need > node.limit_bytes:
        return True
    return need > node.free_bytes() and need > node.capacity_bytes()  # walk the cache only on a small disk


def cache_layout(handle: CacheHandle) -> CacheLayout:
    """What a reader's table needs of an opened cache (`protocol.CacheLayout`)."""
    shards = tuple((s.name, s.byte_len, s.uncompressed_byte_len, s.algo) for s in handle.manifest.shards)
    return handle.sample_count, shards


class LazyHandles:
    """A reader worker's caches (local ones), each opened when a read first needs it rather than
    all before the first task: `dirs` in catalog order, with the identity and layout each had
    when the parent opened it. Opening checks every file again (`CacheHandle.open`; the parent
    applied the symbolic-link rule, which its reader config may relax); a cache that is no
    longer the one the parent opened (identity), or whose shards differ from its layout, is
    refused (CacheFormatError naming it) at that first use, before any of it is read."""

    def __init__(
        self, dirs: Sequence[str], identities: Sequence[Sequence[int]], layouts: Sequence[CacheLayout]
    ) -> None:
        self.dirs, self.identities, self.layouts = tuple(dirs), tuple(identities), tuple(layouts)
        self._open: list[CacheHandle | None] = [None] * len(self.dirs)

    def __len__(self) -> int:
        return len(self.dirs)

    def __getitem__(self, k: int) -> CacheHandle:
        handle = self._open[k]
        if handle is None:
            handle = CacheHandle.open(self.dirs[k], external_links=True)
            if handle.identity != tuple(self.identities[k]) or cache_layout(handle) != tuple(self.layouts[k]):
                raise CacheFormatError(f"cache changed on disk since it was opened: {handle.path}")
            self._open[k] = handle
        return handle

    def opened(self) -> int:
        """How many caches were opened so far."""
        return sum(h is not None for h in self._open)


class Gatherer:
    """Reads records of the given caches in the calling process into caller-provided buffers.

    Numpy-free, so reader worker processes can use it without importing numpy. Invariants: the
    table never changes shape after construction; shard descriptors (`shards.fds`, -1 when
    closed) are opened and closed only by `budget` (the process's, unless another is given); a
    cache's index mapping is taken from its `CacheHandle` (shared by every reader of the dataset
    and by all processes through the page cache), and so is its codec state. One gather at a
    time per Gatherer (it has one scratch buffer): one reader per thread.
    """

    def __init__(
        self,
        handles: Sequence[CacheHandle] | LazyHandles,
        *,
        verify_records: bool = True,
        budget: DescriptorBudget | None = None,
        map_shards: bool = False,
        layouts: Sequence[CacheLayout] | None = None,
    ) -> None:
        """`layouts`: each handle's `cache_layout`, when the caller has them already (a run's
        `CacheSet.layouts`); computed here otherwise."""
        self.verify_records = verify_records
        self.map_shards = map_shards
        self.mapped_shards = 0  # shards read from their mapping (`_map_shards`)
        self.budget = budget if budget is not None else BUDGET
        self.handles: Sequence[CacheHandle] | LazyHandles
        if isinstance(handles, LazyHandles):  # local caches, opened at first use
            self.handles = handles
            labels, layouts = list(handles.dirs), list(handles.layouts)
            remote = [False] * len(labels)
        else:
            self.handles = list(handles)
            labels = [os.fspath(h.path) for h in self.handles]
            layouts = list(layouts) if layouts is not None else [cache_layout(h) for h in self.handles]
            remote = [h.remote is not None for h in self.handles]
        self._remote = remote if any(remote) else None
        # Remote caches the node cache cannot hold whole: their shard files get evicted while the
        # read goes on, so this reader holds (open and pinned in the node cache) only the shards of
        # the block it gathers, and none between gathers.
        self._tight = self._remote is not None and _node_cache_tight(self.handles)  # type: ignore[arg-type]
        self._held: dict[tuple[int, int], None] = {}  # (cache, shard) pinned by this reader
        self._index_words: dict[int, memoryview] = {}  # remote caches: index.bin as u64 words
        with collector_paused():  # O(caches) long-lived lists and tuples, no garbage
            # (f-strings: os.path.join costs more than the rest of a cache's row; a shard name is
            # one plain segment, checked when its manifest was parsed)
            shard_paths = [
                [f"{d.rstrip(os.sep)}{os.sep}{SHARDS_DIR}{os.sep}{s[0]}" for s in shards]
                for d, (_n, shards) in zip(labels, layouts)
            ]
            self.shards = self.budget.register(ShardDescriptors(shard_paths, remote, open_present=not self._tight))
            shards = [s for _n, of_cache in layouts for s in of_cache]
            self.table = CacheTable(
                labels=labels,
                index_rows=[n for n, _shards in layouts],
                shard_count=self.shards.count,
                shard_len=[s[1] for s in shards],
                shard_ulen=[s[2] for s in shards],
                shard_codec=[CODEC_IDS[s[3]] for s in shards],
                shard_names=[p for paths in shard_paths for p in paths],
                shard_fd=self.shards.fds,
            )
        self._scratch = native.Scratch()
        self._closed = False

    # -- mappings -------------------------------------------------------------------------------

    def _map_block(self, cache_pos) -> None:
        """Map the index (and sidecar) of every cache named in `cache_pos` not mapped yet."""
        if not self.table.unmapped:
            return  # every cache is mapped: the common case after the first blocks
        for k in self.table.unmapped_in(cache_pos):
            try:
                self._map_cache(k)
            except CacheIOError as exc:
                if exc.errno not in _OUT_OF_FDS:
                    raise
                self.budget.relieve()  # mapping needs one descriptor for a moment
                self._map_cache(k)

    def _fetch_block(self, cache_pos, sample_id) -> int:
        """Bring the shards a block of rows reads onto the node, for rows of remote caches whose
        shard is not open yet (one download per shard per node: `CacheHandle.shard_path`), and
        open them; returns how many leading rows are ready: all of them, or under a tight node
        cache a prefix (`_hold`). Rows of local caches cost a list lookup each."""
        remote, fds, base = self._remote, self.shards.fds, self.shards.base
        assert remote is not None
        wanted: dict[tuple[int, int], None] = {}
        needed: dict[tuple[int, int], int] = {}  # (cache, shard) -> its first row, in order of first use
        for row, (k, sid) in enumerate(zip(memoryview(cache_pos).tolist(), memoryview(sample_id).tolist())):
            if not remote[k]:
                continue
            words = self._index_words.get(k)
            if words is None:
                words = self._index_words[k] = memoryview(self.handles[k].index_map()).cast("B").cast("Q")
            j = words[3 * sid] if 0 <= sid < len(words) // 3 else -1
            if 0 <= j < self.shards.count[k]:  # out-of-range rows are the gather's to refuse
                needed.setdefault((k, j), row)
                if fds[base[k] + j] < 0:
                    wanted[(k, j)] = None
        if self._tight:
            return self._hold(needed, len(cache_pos))
        for k, j in wanted:
            self.handles[k].shard_path(j)
            self.budget.open_fetched(self.shards, k, j)
        return len(cache_pos)

    def _hold(self, needed: dict[tuple[int, int], int], rows: int) -> int:
        """Under a tight node cache: hold the shards of `needed` ((cache, shard) -> first row), in
        order of first use, each pinned in the node cache before it is opened, so no file this
        reader has open is ever evicted (an eviction by any process on the node skips a pinned
        file) and its space is never in use twice; what this reader held for another block is
        closed and unpinned first. Returns the leading rows whose shards are held: all `rows`, or
        when the node cache has no room for the next shard while this reader holds some, the
        rows before that shard's first use (the caller gathers them, lets go of everything and
        asks again for the rest: a block never needs more room than one shard at a time)."""
        if any(key not in needed for key in self._held):
            self._release_held(keep=needed)
        for (k, j), first in needed.items():
            if (k, j) not in self._held:
                try:
                    self._pin(k, j, wait=not self._held)
                except (DiskLimitError, DiskFullError):
                    if not self._held or first == 0:
                        raise
                    return first  # the rows before it read only held shards
                self._held[(k, j)] = None
            self.budget.open_fetched(self.shards, k, j)  # no-op when open
        return rows

    def _pin(self, k: int, j: int, *, wait: bool) -> None:
        """Fetch (if missing) and pin shard j of cache k. The node cache refuses room while pins
        fill it (DiskLimitError). With `wait` (this reader holds nothing, so it waits on no one
        who waits on it), the pins in the way are other readers' blocks and the look-ahead, both
        let go of as their reads move on: the fetch is tried again, backing off, for up to the
        storage retry budget before the error is the read's."""
        handle = self.handles[k]
        remote = handle.remote
        assert remote is not None
        deadline = time.monotonic() + remote.storage.retry_budget_s
        backoff_s = 0.005
        while True:
            try:
                handle.shard_path(j, pin=True)
                return
            except DiskLimitError:
                if not wait or time.monotonic() + backoff_s > deadline:
                    raise
            time.sleep(backoff_s)  # other processes unpin through their files: nothing to wait on
            backoff_s = min(2 * backoff_s, 0.2)

    def _release_held(self, keep: Container[tuple[int, int]] = ()) -> None:
        """Close and unpin the shards this reader holds, but those in `keep`."""
        if not self._held:
            return
        self.budget.close_fetched(self.shards, keep)
        for key in [key for key in self._held if key not in keep]:
            del self._held[key]
            self.handles[key[0]].unpin_shard(key[1])

    def _map_cache(self, k: int) -> None:
        handle = self.handles[k]
        index = handle.index_map()
        sidecar = handle.checksum_map() if self.verify_records else None
        self.table.map_cache(k, index, sidecar, handle.codec_state())
        if self.map_shards and handle.remote is None:
            self._map_shards(k)

    def _map_shards(self, k: int) -> None:
        """Map the uncompressed, non-empty shards of local cache k (see the module docstring);
        one that cannot be mapped stays on pread."""
        base = self.shards.base[k]
        for j, (shard, path) in enumerate(zip(self.handles[k].manifest.shards, self.shards.paths[k])):
            if self.mapped_shards >= MAX_MAPPED_SHARDS:
                return
            if shard.algo != "none" or shard.byte_len == 0:
                continue
            try:
                self.mapped_shards += self.table.map_shard(base + j, MappedFile(path))
            except (CacheIOError, CacheFormatError):
                continue  # pread meets the same file and words its error

    def close(self) -> None:
        """Close every descriptor (idempotent). Mappings stay with their handles."""
        if self._closed:
            return
        self._closed = True
        self.budget.release(self.shards)
        for k, j in self._held:
            self.handles[k].unpin_shard(j)
        self._held.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- reading ----------------------------------------------------------------------------

    def gather_into(self, cache_pos, sample_id, out, json_off, json_len, data_off, data_len) -> tuple[int, int, int]:
        """One native gather of the given rows into `out` (offsets relative to `out`).

        Arguments are 1-D contiguous buffers (numpy arrays or memoryviews): cache_pos int64,
        sample_id uint64, out uint8, the four offset/length outputs int64.
        Returns (rows_done, bytes_used, need_bytes) as `_native.gather`: rows_done < len(rows)
        when `out` filled, when the block's caches did not all fit the descriptor budget or when
        its shards did not all fit a tight node cache at once (the caller asks again for the rest); need_bytes > 0 when row rows_done alone exceeds what
        was left. At least one row is gathered unless `out` is too small for it.
        """
        if self._closed:
            raise CacheIOError("reader is closed")
        self._map_block(cache_pos)
        budget, shards = self.budget, self.shards
        rows = budget.open_block(shards, cache_pos)
        try:
            if self._remote is not None:
                rows = self._fetch_block(memoryview(cache_pos)[:rows], memoryview(sample_id)[:rows])
            if rows < len(cache_pos):  # the block's caches do not all fit the budget: its prefix
                cache_pos, sample_id, json_off, json_len, data_off, data_len = (
                    memoryview(a)[:rows] for a in (cache_pos, sample_id, json_off, json_len, data_off, data_len)
                )
            return native.gather(
                self.table, cache_pos, sample_id, out, json_off, json_len, data_off, data_len, self._scratch
            )
        finally:
            budget.unpin(shards)
            if self._tight:
                self._release_held()

    def gather_batch_into(
        self, cache_pos, sample_id, out, offsets, json_off, json_len, check: PayloadCheck
    ) -> tuple[int, int, int, int]:
        """Native batch gathers of the given rows into `out`, payloads back to back from out[0]
        in their final layout (`_native.gather.gather_batch`): offsets int64 (rows + 1 entries,
        relative to `out`); json_off/json_len int64 (rows entries to keep the embedded JSON,
        stacked down from the end of `out`; empty to check and drop it). `check` is the payload
        spec's length rule. Returns (rows_done, payload_bytes, json_bottom, need_bytes):
        rows_done < len(rows) only when `out` is full (need_bytes > 0 when row rows_done alone
        does not fit what is left). Rows whose caches do not all fit the descriptor budget (or
        whose shards do not all fit a tight node cache) at once are gathered block after block,
        each continuing where the last one stopped."""
        if self._closed:
            raise CacheIOError("reader is closed")
        self._map_block(cache_pos)
        budget, shards = self.budget, self.shards
        n = len(cache_pos)
        keep_json = len(json_off) > 0
        done, pos, bottom, need = 0, 0, len(out), 0
        while True:
            block = memoryview(cache_pos)[done:]
            rows = budget.open_block(shards, block)
            try:
                if self._remote is not None:
                    rows = self._fetch_block(block[:rows], memoryview(sample_id)[done : done + rows])
                part = (lambda a: memoryview(a)[done : done + rows]) if done or rows < n - done else (lambda a: a)  # noqa: B023 (called within this iteration)
                got, pos, bottom, need = native.gather_batch(
                    self.table,
                    part(cache_pos),
                    part(sample_id),
                    out,
                    memoryview(offsets)[done : done + rows + 1],
                    part(json_off) if keep_json else json_off,
                    part(json_len) if keep_json else json_len,
                    check,
                    pos,
                    bottom,
                    self._scratch,
                )
            finally:
                budget.unpin(shards)
                if self._tight:
                    self._release_held()
            done += got
            if done == n or got < rows:  # all rows, or `out` is full
                return done, pos, bottom, need
