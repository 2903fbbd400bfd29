"""Plan-driven prefetch of remote shards: the shards a read will need, fetched onto the node in the
order the read's window first needs them, a bounded number ahead of the read.

Boundary: window positions -> shards of caches at object-store URLs -> `RemoteCache.ensure_shard`
(the node cache does the download, its verification and the one-download-per-node rule). No
records, no processes: a prefetcher is a few threads of the process that reads the window (the
dataset's, or a torch worker's for its share); reader workers fetch on demand what the
prefetcher has not fetched yet, through the same node cache.

Invariants:
- At most `lookahead` shards are held ahead of the read: fetching, or fetched and pinned until
  the read reaches the position that first needs them (then unpinned: the read has it, or fetches
  it again when the node cache evicted it meanwhile). So the look-ahead never holds more than
  `lookahead` shards of disk against the node cache's limit.
- A prefetch never decides a read's outcome: a failed fetch is dropped (the read's own fetch of
  that shard then raises the storage layer's typed error, or succeeds on its own retry budget).
- A shard is prefetched only while the read has not reached its first need: once it has, the
  read has fetched (or opened) the shard itself, so a queued fetch of it is dropped rather than
  downloading it again after an eviction.
- `close()` stops scanning, cancels fetches not started, waits for the running ones (each bounded
  by the storage retry budget), and drops every pin it holds; no thread outlives it.
- Scanning is lazy: window positions are read `scan_rows` at a time, only while the look-ahead has
  room, and stop once every remote shard has been queued (a shuffled epoch touches them all early).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from datasetrt.format.layout import SHARDS_DIR
from datasetrt.format.reader import CacheHandle

SCAN_ROWS = 1 << 16  # window positions resolved to shards per scan step


class ShardPrefetcher:
    """Prefetch for one read of `window` (anything with `length`, `rows(first, count)` and
    `population.resolve(rows)`) over `handles` (the dataset's caches, by catalog position).
    `advance(position)` tells it the read has consumed window positions below `position`."""

    def __init__(
        self,
        handles: Sequence[CacheHandle],
        window: Any,
        *,
        lookahead: int,
        concurrency: int,
        scan_rows: int = SCAN_ROWS,
    ) -> None:
        self._handles = handles
        self._window = window
        self._lookahead = max(1, lookahead)
        self._scan_rows = scan_rows
        self._remote = [k for k, h in enumerate(handles) if h.remote is not None]
        self._shards_total = sum(len(handles[k].manifest.shards) for k in self._remote)
        self._cond = threading.Condition()
        self._queued: set[tuple[int, int]] = set()  # (cache, shard) ever queued by this read
        self._todo: deque[tuple[int, int, int]] = deque()  # (first-need position, cache, shard)
        self._held: list[tuple[int, int, int]] = []  # fetching or pinned ahead of the read
        self._scanned = 0  # window positions resolved so far
        self._consumed = 0
        self._stopped = False
        self.fetched = 0  # shards this prefetcher ensured (present already, or downloaded)
        self.failed = 0  # fetches dropped on an error (the read's own fetch decides)
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="datasetrt-prefetch")
        self._thread = threading.Thread(target=self._run, name="datasetrt-prefetch-plan", daemon=True)
        self._thread.start()

    # -- the read's side -------------------------------------------------------------------------

    def advance(self, position: int) -> None:
        """The read has consumed window positions below `position`: release what it reached."""
        with self._cond:
            if position <= self._consumed:
                return
            self._consumed = position
            reached = [h for h in self._held if h[0] < position and h[2] >= 0]
            self._held = [h for h in self._held if not (h[0] < position and h[2] >= 0)]
            self._cond.notify_all()
        for _need, k, j in reached:
            self._unpin(k, j)

    def close(self) -> None:
        """Stop, wait for fetches in flight, drop every pin (idempotent)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            held, self._held = self._held, []
        for _need, k, j in held:
            if j >= 0:
                self._unpin(k, j)

    def __enter__(self) -> ShardPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the planning thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and len(self._held) >= self._lookahead:
                    self._cond.wait()
                if self._stopped:
                    return
            if not self._todo and not self._scan():
                return  # every position scanned and every shard queued: nothing left to fetch
            if not self._todo:
                continue
            need, k, j = self._todo.popleft()
            entry = (need, k, -1 - j)  # negative shard: in flight (not pinned yet)
            with self._cond:
                if self._stopped:
                    return
                if need < self._consumed:
                    continue  # the read got there first
                self._held.append(entry)
            try:
                future = self._pool.submit(self._fetch, need, k, j)
            except RuntimeError:  # the pool was shut down by close()
                return
            future.add_done_callback(self._landed(entry))

    def _scan(self) -> bool:
        """Queue the new shards of the next `scan_rows` window positions in first-need order;
        False when there is nothing left to scan."""
        length = self._window.length
        while not self._todo:
            if self._scanned >= length or len(self._queued) >= self._shards_total or self._stopped:
                return False
            first = self._scanned
            count = min(self._scan_rows, length - first)
            self._scanned = first + count
            rows = self._window.rows(first, count)
            cache_pos, sample_id = self._window.population.resolve(rows)
            cache_pos = np.asarray(cache_pos, dtype=np.int64)
            sample_id = np.asarray(sample_id, dtype=np.int64)
            by_cache = np.argsort(cache_pos, kind="stable")  # positions of one cache stay in order
            caches, starts = np.unique(cache_pos[by_cache], return_index=True)
            ends = np.append(starts[1:], len(by_cache))
            for k, start, end in zip(caches.tolist(), starts.tolist(), ends.tolist()):
                if self._handles[k].remote is None:
                    continue
                at = by_cache[start:end]
                shards = self._handles[k].index_array()[sample_id[at], 0].astype(np.int64)
                unique, first_at = np.unique(shards, return_index=True)
                for shard, pos in zip(unique.tolist(), first_at.tolist()):
                    if (k, shard) not in self._queued:
                        self._queued.add((k, shard))
                        self._todo.append((first + int(at[pos]), k, shard))
            if self._todo:
                ordered = sorted(self._todo)
                self._todo = deque(ordered)
        return True

    # -- the fetch threads -----------------------------------------------------------------------

    def _fetch(self, need: int, k: int, j: int) -> bool:
        """Fetch and pin shard j of cache k; False (nothing pinned) when stopped or when the read
        reached the shard's first need while this fetch waited for a thread."""
        handle = self._handles[k]
        assert handle.remote is not None
        with self._cond:
            if self._stopped or need < self._consumed:
                return False
        entry = handle.manifest.shards[j]
        handle.remote.mirror().ensure(f"{SHARDS_DIR}/{entry.name}", size=entry.byte_len, sha256=entry.sha256, pin=True)
        return True

    def _landed(self, entry: tuple[int, int, int]) -> Callable[[Future[bool]], None]:
        def done(future: Future[bool]) -> None:
            need, k, flight = entry
            j = -1 - flight
            failed = not future.cancelled() and future.exception() is not None
            pinned = not future.cancelled() and not failed and future.result()
            unpin_now = False
            with self._cond:
                if pinned:
                    self.fetched += 1
                elif failed:
                    self.failed += 1
                if entry in self._held:
                    self._held.remove(entry)
                    if pinned and need >= self._consumed and not self._stopped:
                        self._held.append((need, k, j))
                    else:
                        unpin_now = pinned
                else:
                    unpin_now = pinned
                self._cond.notify_all()
            if unpin_now:
                self._unpin(k, j)

        return done

    def _unpin(self, k: int, j: int) -> None:
        handle = self._handles[k]
        assert handle.remote is not None
        handle.remote.mirror().unpin(f"{SHARDS_DIR}/{handle.manifest.shards[j].name}")
