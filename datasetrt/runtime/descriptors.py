"""The process's one budget of shard file descriptors, shared by every reader in the process.

Boundary: descriptors and their owners' open/closed state; no numpy (reader workers import it),
no records, no caches beyond the shard paths a reader registers.

Why one budget: descriptors are a per-process resource (RLIMIT_NOFILE), so a per-reader cap
multiplies with the number of datasets, threads and worker-side readers until `open()` fails
with EMFILE and the process cannot open anything else. Every `Gatherer` in a process (each
dataset's per-thread readers, a torch DataLoader worker's readers, a reader worker's readers)
registers its shards here (`ShardDescriptors`); together they keep at most `limit` shard
descriptors open, where `limit` is derived from the soft RLIMIT_NOFILE at each use (half of it,
at least 16 and at most 4096: the other half is headroom for the rest of the program). Index
and sidecar files cost no descriptor: they are mapped and their descriptor closed at once
(`MappedFile`).

Granularity: a cache's shards are opened and closed together (`open_block`), but for a cache whose
shards arrive on demand (a remote cache's mirror), which open one by one as they are fetched
(`open_fetched`) and may be closed one by one (`close_fetched`). When opening needs
room, the least recently used caches of any reader in the process are closed first: readers in
the order they last gathered, and within a reader its caches in the order they last served a
block that needed opening. Never closed: a cache a gather is using right now (`open_block` pins
the caches of a block until `unpin`; a reader whose caches were all open pins all of them).

Progress: a block whose caches do not all fit is cut at the first cache that does not (the
caller gathers the prefix and asks again), and the first cache of a block is always opened, even
over the budget (other threads' pinned blocks can hold the rest), so a read never waits and never
deadlocks; the overshoot is at most one cache's shards per concurrently gathering thread. If
`open()` still fails for lack of descriptors (EMFILE/ENFILE: the rest of the program used its
headroom), every unpinned descriptor in the process is closed and the open retried once.

Thread safety: one lock guards every registered reader's open/closed state and descriptor
array; the native gather reads a reader's descriptors only for the caches that reader has
pinned, which nothing closes. Fork: the lock is held across `fork()` (so the child copies a
consistent state) and the child starts with a fresh lock and no pins; it inherits the parent's
open shard descriptors and may close them under its own budget (they are its copies).

Complexity: an already-open reader costs two lock round trips per gather; opening costs one
`open()` per shard plus O(caches of the block) bookkeeping; an eviction walks readers and their
caches in LRU order until enough descriptors are free.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from array import array
from collections import OrderedDict, deque
from collections.abc import Container, Sequence

from datasetrt.errors import CacheIOError

MIN_SHARD_FDS = 16
MAX_SHARD_FDS = 4096
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
ALL = "all"  # pin value: every open cache of the reader (its gather needed no opening)


def default_limit() -> int:
    """Shard descriptors one process keeps open: half the soft RLIMIT_NOFILE, in [16, 4096]."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_SHARD_FDS
    return max(MIN_SHARD_FDS, min(MAX_SHARD_FDS, soft // 2))


class ShardDescriptors:
    """One reader's shard descriptors, opened and closed per cache through a `DescriptorBudget`.

    `fds` is the int32 array the native gather reads (`fds[s] >= 0` iff shard s is open): the
    reader's `CacheTable` views it, so every open and close here is what the next gather sees,
    and it is never resized. Cache k owns shards [base[k], base[k] + count[k]). State below is changed only under the
    budget's lock. `unopened` counts caches with any shard closed (0: the fast path).
    """

    __slots__ = (
        "paths",
        "fetched",
        "open_present",
        "base",
        "count",
        "fds",
        "is_open",
        "lru",
        "unopened",
        "pinned",
        "open_fds",
        "closed",
        "__weakref__",
    )

    def __init__(
        self, shard_paths: Sequence[Sequence[str]], fetched: Sequence[bool] | None = None, *, open_present: bool = True
    ) -> None:
        n = len(shard_paths)
        self.paths = [list(p) for p in shard_paths]
        # Per cache: True when its shard files appear on demand (a remote cache's mirror): opening
        # the cache then opens the shards present and leaves the others closed until fetched.
        self.fetched = bytearray(n) if fetched is None else bytearray(bool(f) for f in fetched)
        # False: opening a fetched cache opens none of its shards, each opens only by
        # `open_fetched` (a reader that pins every shard it holds open in the node cache).
        self.open_present = open_present
        self.count = array("q", [len(p) for p in self.paths])
        self.base = array("q", [0] * n)
        total = 0
        for k in range(n):
            self.base[k] = total
            total += self.count[k]
        self.fds = array("i", [-1]) * total
        self.is_open = bytearray(n)
        self.lru: OrderedDict[int, None] = OrderedDict()  # open caches, least recently used first
        self.unopened = n
        self.pinned: set[int] | str | None = None
        self.open_fds = 0
        self.closed = False

    def _close(self, k: int) -> int:
        """Close cache k's shards (lock held); returns how many descriptors were closed."""
        closed = 0
        for s in range(self.base[k], self.base[k] + self.count[k]):
            fd = self.fds[s]
            if fd >= 0:
                self.fds[s] = -1
                os.close(fd)
                closed += 1
        if self.is_open[k]:
            self.is_open[k] = 0
            self.unopened += 1
            self.lru.pop(k, None)
        self.open_fds -= closed
        return closed

    def _evictable(self, k: int) -> bool:
        pinned = self.pinned
        return pinned is None or (pinned is not ALL and k not in pinned)


class DescriptorBudget:
    """At most `limit` shard descriptors open over every registered reader of the process."""

    def __init__(self, limit: int | None = None) -> None:
        self._fixed_limit = limit
        self._lock = threading.Lock()
        self._readers: OrderedDict[ShardDescriptors, None] = OrderedDict()  # registered, LRU first
        self._open = 0
        self._pending: deque[ShardDescriptors] = deque()  # released while the lock was busy

    @property
    def limit(self) -> int:
        return self._fixed_limit if self._fixed_limit is not None else default_limit()

    @property
    def open_count(self) -> int:
        """Shard descriptors open now, over every reader of this budget."""
        return self._open

    # -- per gather ---------------------------------------------------------------------------

    def open_block(self, reader: ShardDescriptors, cache_pos) -> int:
        """Open (evicting LRU caches as needed) and pin the caches of a block of rows; returns
        how many leading rows of `cache_pos` (any 1-D int buffer of cache positions) are
        gathered with their caches open: all of them, or a prefix cut at the first cache that
        did not fit (at least one row). The caller gathers those rows, then `unpin(reader)`."""
        rows = len(cache_pos)
        with self._lock:
            try:
                if reader.closed:
                    raise CacheIOError("reader is closed")
                self._readers.move_to_end(reader)  # the most recently used reader
                if not reader.unopened:
                    reader.pinned = ALL
                    return rows
                positions = memoryview(cache_pos).tolist()
                pinned: set[int] = set()
                reader.pinned = pinned
                limit = self.limit
                for k in dict.fromkeys(positions):  # distinct caches, in order of first use
                    if reader.is_open[k]:
                        reader.lru.move_to_end(k)
                        pinned.add(k)
                        continue
                    need = reader.count[k]
                    if self._open + need > limit and not self._evict(self._open + need - limit) and pinned:
                        return positions.index(k)  # the rows before cache k use only pinned caches
                    self._open_cache(reader, k)
                    pinned.add(k)
                return rows
            finally:
                self._drain_pending()

    def unpin(self, reader: ShardDescriptors) -> None:
        with self._lock:
            reader.pinned = None
            self._drain_pending()

    def relieve(self) -> None:
        """Close every unpinned descriptor (the program ran out of descriptors elsewhere)."""
        with self._lock:
            self._evict(self._open)
            self._drain_pending()

    # -- lifecycle ----------------------------------------------------------------------------

    def register(self, reader: ShardDescriptors) -> ShardDescriptors:
        """Count `reader`'s descriptors in this budget until `release(reader)`."""
        with self._lock:
            self._readers[reader] = None
            self._drain_pending()
        return reader

    def release(self, reader: ShardDescriptors) -> None:
        """Close every descriptor of `reader` and forget it (idempotent). Safe from `__del__`:
        when the lock is busy (even by this thread) the reader is closed by the next holder."""
        if not self._lock.acquire(blocking=False):
            self._pending.append(reader)
            return
        try:
            self._release(reader)
            self._drain_pending()
        finally:
            self._lock.release()

    def _release(self, reader: ShardDescriptors) -> None:
        if reader.closed:
            return
        reader.closed = True
        reader.pinned = None
        for k in list(reader.lru):
            self._open -= reader._close(k)
        self._readers.pop(reader, None)

    def _drain_pending(self) -> None:
        while self._pending:
            self._release(self._pending.popleft())

    def _after_fork_in_child(self) -> None:
        """No other thread exists in the child: nothing is gathering, so nothing stays pinned."""
        self._lock = threading.Lock()
        for reader in self._readers:
            reader.pinned = None

    # -- opening and eviction (lock held) -------------------------------------------------------

    def open_fetched(self, reader: ShardDescriptors, k: int, j: int) -> None:
        """Open shard j of cache k, a fetched-on-demand cache, now that its file is on the node
        (a no-op unless the cache is open and that shard closed: opening the cache later opens it)."""
        with self._lock:
            try:
                s = reader.base[k] + j
                if reader.closed or not reader.is_open[k] or reader.fds[s] >= 0:
                    return
                path = reader.paths[k][j]
                try:
                    fd = self._open_file(path)
                except OSError as exc:
                    raise CacheIOError.from_os(exc, path) from None
                reader.fds[s] = fd
                reader.open_fds += 1
                self._open += 1
            finally:
                self._drain_pending()

    def close_fetched(self, reader: ShardDescriptors, keep: Container[tuple[int, int]]) -> int:
        """Close the open shards of `reader`'s fetched-on-demand caches but those in `keep`
        ((cache, shard) pairs); returns how many. The node cache may evict such a file, and an
        open descriptor would keep an evicted file's space in use; a block that needs it again
        has it fetched (or found) and opened again. O(shards of the reader's open fetched caches)."""
        with self._lock:
            try:
                closed = 0
                for k in reader.lru:
                    if not reader.fetched[k]:
                        continue
                    base = reader.base[k]
                    for j in range(reader.count[k]):
                        fd = reader.fds[base + j]
                        if fd >= 0 and (k, j) not in keep:
                            reader.fds[base + j] = -1
                            os.close(fd)
                            closed += 1
                reader.open_fds -= closed
                self._open -= closed
                return closed
            finally:
                self._drain_pending()

    def _open_cache(self, reader: ShardDescriptors, k: int) -> None:
        base = reader.base[k]
        for j, path in enumerate(reader.paths[k]):
            if reader.fetched[k] and (not reader.open_present or not os.path.exists(path)):
                continue  # not on the node yet (or not pinned yet): opened by open_fetched once it is
            try:
                fd = self._open_file(path)
            except OSError as exc:
                self._open -= reader._close(k)
                text = f"{CacheIOError.from_os(exc, path)}{_fd_hint(exc, self)}"  # the hint follows the path
                raise CacheIOError(text, errno=exc.errno, path=path) from None
            reader.fds[base + j] = fd
            reader.open_fds += 1
            self._open += 1
        reader.is_open[k] = 1
        reader.unopened -= 1
        reader.lru[k] = None

    def _open_file(self, path: str) -> int:
        # O_NONBLOCK: a shard replaced by a FIFO after the cache opened fails its read (pread on a
        # pipe) instead of blocking in open(); it changes nothing for a regular file.
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno not in _OUT_OF_FDS:
                raise
        self._evict(self._open)  # the program used its headroom: give back every unpinned fd
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)

    def _evict(self, wanted: int) -> bool:
        """Close least recently used, unpinned caches until `wanted` descriptors were closed
        (or nothing evictable is left); True when enough were. O(caches looked at)."""
        freed = 0
        for reader in self._readers:
            if freed >= wanted:
                break
            if reader.pinned is ALL or not reader.lru:
                continue
            victims = []
            for k in reader.lru:  # every shard of a cache in `lru` is open
                if freed >= wanted:
                    break
                if reader._evictable(k):
                    victims.append(k)
                    freed += reader.count[k]
            for k in victims:
                reader._close(k)
        self._open -= freed
        return freed >= wanted


def _fd_hint(exc: OSError, budget: DescriptorBudget) -> str:
    if exc.errno not in _OUT_OF_FDS:
        return ""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (
        f" (RLIMIT_NOFILE soft limit {soft}; datasetrt keeps at most {budget.limit} shard files open "
        f"and had {budget.open_count}: the rest of the program holds the others; raise `ulimit -n`)"
    )


BUDGET = DescriptorBudget()  # the process's budget: every Gatherer uses it unless given another

os.register_at_fork(
    before=lambda: BUDGET._lock.acquire(),
    after_in_parent=lambda: BUDGET._lock.release(),
    after_in_child=BUDGET._after_fork_in_child,
)
