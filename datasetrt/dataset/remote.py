"""What a dataset over caches at object-store URLs adds to its reads: the disk bound checked (and
the small files pinned) when the dataset opens, and the plan-driven shard prefetch of each read.

Boundary: handles and windows in; no sampling state and no bytes (the prefetcher is
`runtime.prefetch`, the node cache `storage.node_cache`). Local caches make both a no-op.

The disk bound: a read of remote caches keeps their small files (index, metadata, checksums,
dictionary) on the node for the dataset's life, plus the shards its order reads close together.
Under a node-cache limit (`StorageConfig.cache_limit_bytes`) the order decides how many that is:
- everything fits: any order;
- ordered reads (`shuffle=False`) read shard after shard: two shards at a time;
- `sampling="locality"` reads `window_shards` shards interleaved, one window after another: a
  window of shards plus the one the next window starts with;
- any other shuffled order touches every shard throughout an epoch, so all of them must fit
  (below that every epoch would download the dataset many times over).
A dataset whose order cannot fit is refused at open with `DiskLimitError` naming the need, the
limit and the order that would fit, rather than thrashing the node cache for a whole epoch.
Under a limit the small files are also pinned in the node cache while a handle of their cache
lives, so the evictions the limit causes never remove them (reader workers reopen the mirror by
its files); they are part of the need.

The prefetch look-ahead under a limit takes only the room the order leaves: the limit holds
`(limit - small files) // largest shard` shards, the order keeps its window of them in use
(`window_shards` for locality, one for an ordered read), and the look-ahead gets the rest, so
prefetching never evicts a shard the read still needs. With no limit and every shard already
on the node (a warm epoch) a read starts no prefetcher.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

from datasetrt.errors import DiskLimitError
from datasetrt.format.layout import MANIFEST_NAME, SHARDS_DIR
from datasetrt.format.reader import CacheHandle
from datasetrt.format.remote import small_files
from datasetrt.runtime.local import Chunk
from datasetrt.runtime.prefetch import ShardPrefetcher
from datasetrt.storage.node_cache import Mirror
from datasetrt.values.config import ReaderConfig

_T = TypeVar("_T", bound=Sized)


def _remote(handles: Sequence[CacheHandle]) -> list[CacheHandle]:
    return [h for h in handles if h.remote is not None]


def _small_bytes(handle: CacheHandle) -> int:
    """Bytes of the files a remote cache keeps on the node besides its shards: the manifest and
    the small files (index, metadata, checksums, dictionary)."""
    total = 0
    for name, size in ((MANIFEST_NAME, None), *((n, s) for n, s, _sha256 in small_files(handle.manifest))):
        if size is None:
            try:
                size = (handle.path / name).stat().st_size
            except OSError:
                size = 0
        total += size
    return total


def _unpin_all(mirror: Mirror, names: list[str]) -> None:
    for name in names:
        mirror.unpin(name)


def pin_small_files(handle: CacheHandle) -> None:
    """Pin the manifest and small files of a remote `handle` in the node cache until the handle
    (its `RemoteCache`) is collected, so no eviction removes what a reader worker reopens."""
    remote = handle.remote
    if remote is None:
        return
    mirror = remote.mirror()
    names = [name for name in (MANIFEST_NAME, *(n for n, _, _ in small_files(handle.manifest))) if mirror.pin(name)]
    weakref.finalize(remote, _unpin_all, mirror, names)


def check_disk_bound(handles: Sequence[CacheHandle], config: ReaderConfig) -> None:
    """Under a node-cache limit: pin the small files of the remote caches, then refuse a dataset
    whose read order cannot fit the limit (module docstring)."""
    remote = _remote(handles)
    limit = config.storage.cache_limit_bytes
    if not remote or limit is None:
        return
    for handle in remote:
        pin_small_files(handle)
    shard_sizes = [s.byte_len for h in remote for s in h.manifest.shards]
    largest = max(shard_sizes, default=0)
    resident = sum(_small_bytes(h) for h in remote)
    everything = resident + sum(shard_sizes)
    if everything <= limit:
        return
    if not config.shuffle:
        need, order = resident + 2 * largest, "an ordered read (shuffle=False)"
    elif config.sampling == "locality":
        need = resident + (config.window_shards + 1) * largest
        order = f'sampling="locality" with window_shards={config.window_shards}'
    else:
        need, order = everything, f'a shuffled read with sampling="{config.sampling}"'
    if need <= limit:
        return
    hint = (
        'use sampling="locality" (shards read a window at a time) or raise cache_limit_bytes'
        if config.shuffle and config.sampling != "locality"
        else "lower window_shards or raise cache_limit_bytes"
    )
    raise DiskLimitError(
        f"the node-local cache limit of {limit} bytes (StorageConfig.cache_limit_bytes) cannot hold what "
        f"{order} over {remote[0].source}{' and others' if len(remote) > 1 else ''} needs at once: "
        f"{need} bytes (small files {resident} + shards of up to {largest} bytes); {hint}",
        limit_bytes=limit,
        need_bytes=need,
    )


def _all_on_node(remote: Sequence[CacheHandle]) -> bool:
    """Every shard of these remote caches is complete in its mirror (one stat per shard; stops at
    the first missing one)."""
    for handle in remote:
        shards = os.path.join(handle.path, SHARDS_DIR)
        for entry in handle.manifest.shards:
            try:
                if os.stat(os.path.join(shards, entry.name)).st_size != entry.byte_len:
                    return False
            except OSError:
                return False
    return True


def look_ahead(handles: Sequence[CacheHandle], config: ReaderConfig | None) -> int:
    """Shards a read may prefetch ahead of itself (0: none); see the module docstring."""
    remote = _remote(handles)
    if not remote:
        return 0
    first = remote[0].remote
    assert first is not None  # _remote keeps the handles that have one
    storage = first.storage
    ahead = storage.prefetch_shards
    limit = storage.limit_bytes
    if ahead <= 0:
        return 0
    if limit is None:
        return 0 if _all_on_node(remote) else ahead
    shard_sizes = [s.byte_len for h in remote for s in h.manifest.shards]
    largest = max(1, max(shard_sizes, default=1))
    resident = sum(_small_bytes(h) for h in remote)
    if resident + sum(shard_sizes) <= limit:
        return ahead  # everything fits: no eviction to cause
    if config is None:
        return min(ahead, limit // (2 * largest))  # the order is unknown: half of the limit
    in_use = 1 if not config.shuffle else config.window_shards if config.sampling == "locality" else len(shard_sizes)
    return max(0, min(ahead, (limit - resident) // largest - in_use))


def prefetcher(
    handles: Sequence[CacheHandle], window: Any, config: ReaderConfig | None = None
) -> ShardPrefetcher | None:
    """The prefetcher of one read of `window` in the order `config` gives, or None (no remote
    cache, prefetch off, nothing to fetch, no room under the limit, an empty window)."""
    if window.length == 0:
        return None
    ahead = look_ahead(handles, config)
    if ahead <= 0:
        return None
    first = _remote(handles)[0].remote
    assert first is not None
    return ShardPrefetcher(handles, window, lookahead=ahead, concurrency=first.storage.fetch_concurrency)


def prefetched_chunks(chunks: Iterator[Chunk], fetcher: ShardPrefetcher) -> Iterator[Chunk]:
    """`chunks` as they come, telling `fetcher` each one's end; closes it when done or dropped."""
    try:
        for chunk in chunks:
            fetcher.advance(chunk.first + chunk.rows)
            yield chunk
    finally:
        fetcher.close()


class Advancing(Generic[_T]):
    """`items` as they come, telling `fetcher` the positions consumed (`len` of each item from
    window position `start`). An iterator object, not a generator: it keeps no reference to an
    item once returned (a batch's ring slot returns as soon as the consumer drops it)."""

    def __init__(self, items: Iterator[_T], fetcher: ShardPrefetcher, start: int = 0) -> None:
        self._items = items
        self._fetcher = fetcher
        self._position = start

    def __iter__(self) -> Advancing[_T]:
        return self

    def __next__(self) -> _T:
        item = next(self._items)
        self._position += len(item)
        self._fetcher.advance(self._position)
        return item
