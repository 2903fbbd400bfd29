"""What a dataset over caches at object-store URLs adds to its reads: the disk bound checked when
the dataset opens, and the plan-driven shard prefetch of each read.

Boundary: handles and windows in; no sampling state and no bytes (the prefetcher is
`runtime.prefetch`, the node cache `storage.node_cache`). Local caches make both a no-op.

The disk bound: a read of remote caches keeps their small files (index, metadata, checksums,
dictionary) on the node for the dataset's life, plus the shards its order reads close together.
Under a node-cache limit (`StorageConfig.cache_limit_bytes`) the order decides how many that is:
- everything fits: any order;
- ordered reads (`shuffle=False`) read shard after shard: two shards at a time;
- `sampling="locality"` reads `window_shards` shards interleaved, one window after another: a
  window of shards plus the one the next window starts with;
- a mixture or curriculum (`MixturePlan`, `CurriculumPlan`) under `sampling="locality"` reads
  each of its m streams in its own locality order at once: m such windows, m x (window_shards + 1)
  shards (m counts the streams some stage reads; checked when the mixture is set);
- any other shuffled order touches every shard throughout an epoch, so all of them must fit
  (below that every epoch would download the dataset many times over).
A dataset whose order cannot fit is refused at open with `DiskLimitError` naming the need, the
limit and the order that would fit, rather than thrashing the node cache for a whole epoch. The
same need is checked against the node cache's file system (its free bytes plus what the cache
already holds, which it can evict): `DiskFullError` naming the cache directory when it cannot
fit. Space that others take after the open is the download's to report (`DiskFullError` naming
the object's URL, its partial removed).

The prefetch look-ahead under a limit takes only the room the order leaves: the limit holds
`(limit - small files) // largest shard` shards, the order keeps as many in use as its need
above counts (`window_shards + 1` for locality, per stream of a mixture; two for an ordered
read), and the look-ahead gets
the rest, none when nothing is left, so prefetching never evicts a shard the read still needs
(when the whole dataset fits, it is not limited). With no limit and every shard already on the node (a warm epoch) a read starts no
prefetcher.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

from datasetrt.errors import DiskFullError, DiskLimitError
from datasetrt.format.layout import MANIFEST_NAME, SHARDS_DIR
from datasetrt.format.reader import CacheHandle
from datasetrt.format.remote import small_files
from datasetrt.runtime.local import Chunk
from datasetrt.runtime.prefetch import ShardPrefetcher
from datasetrt.sampling.plans import SegmentedPlan
from datasetrt.storage.node_cache import NodeCache
from datasetrt.values.config import ReaderConfig

_T = TypeVar("_T", bound=Sized)


def _remote(handles: Sequence[CacheHandle]) -> list[CacheHandle]:
    return [h for h in handles if h.remote is not None]


def _small_bytes(handle: CacheHandle) -> int:
    """Bytes a remote cache keeps in its mirror for the dataset's life: the manifest and the small files."""
    total = 0
    files = [(MANIFEST_NAME, None, ""), *small_files(handle.manifest)]
    for name, size, _sha256 in files:
        if size is None:
            try:
                size = (handle.path / name).stat().st_size
            except OSError:
                size = 0
        total += size
    return total


def locality_streams(plan: Any) -> int:
    """Streams a position plan reads side by side, each in its own locality order: those of a
    mixture or curriculum (`SegmentedPlan`) that some stage gives a weight; 1 for any other plan."""
    if not isinstance(plan, SegmentedPlan):
        return 1
    read = [any(stage.weights[i] for stage in plan.stages) for i in range(len(plan.names))]
    return max(1, sum(read))


def check_disk_bound(handles: Sequence[CacheHandle], config: ReaderConfig, *, streams: int = 1) -> None:
    """Refuse a dataset whose read order cannot fit the node cache's limit (`DiskLimitError`) or
    its file system (`DiskFullError`, counting what the node cache holds as room; module
    docstring). `streams`: how many streams a mixture or curriculum reads side by side
    (`locality_streams`), each holding its own locality window."""
    remote = _remote(handles)
    if not remote:
        return
    shard_sizes = [s.byte_len for h in remote for s in h.manifest.shards]
    largest = max(shard_sizes, default=0)
    resident = sum(_small_bytes(h) for h in remote)
    everything = resident + sum(shard_sizes)
    if not config.shuffle:
        need, order = resident + 2 * largest, "an ordered read (shuffle=False)"
    elif config.sampling == "locality":
        need = resident + streams * (config.window_shards + 1) * largest
        order = f'sampling="locality" with window_shards={config.window_shards}'
        if streams > 1:
            order = f"a mixture of {streams} streams, each read with {order},"
    else:
        need, order = everything, f'a shuffled read with sampling="{config.sampling}"'
    need = min(need, everything)
    what = (
        f"{order} over {remote[0].source}{' and others' if len(remote) > 1 else ''} needs at once: "
        f"{need} bytes (small files {resident} + shards of up to {largest} bytes)"
    )
    limit = config.storage.cache_limit_bytes
    if limit is not None and need > limit:
        hint = (
            'use sampling="locality" (shards read a window at a time) or raise cache_limit_bytes'
            if config.shuffle and config.sampling != "locality"
            else "lower window_shards, read fewer streams at once or raise cache_limit_bytes"
            if streams > 1
            else "lower window_shards or raise cache_limit_bytes"
        )
        raise DiskLimitError(
            f"the node-local cache limit of {limit} bytes (StorageConfig.cache_limit_bytes) cannot hold what "
            f"{what}; {hint}",
            limit_bytes=limit,
            need_bytes=need,
        )
    node = _node_cache(remote)
    free = node.free_bytes()
    if need > free and need > (capacity := free + node.usage_bytes()):
        raise DiskFullError.from_os(
            errno.ENOSPC,
            node.root,
            f"the file system of the node-local cache can hold at most {capacity} bytes ({free} free plus the "
            f"{capacity - free} the cache holds), less than what {what}; use a larger cache_dir"
            + (' or sampling="locality"' if config.shuffle and config.sampling != "locality" else ""),
        )


def _node_cache(remote: Sequence[CacheHandle]) -> NodeCache:
    first = remote[0].remote
    assert first is not None  # _remote keeps the handles that have one
    return first.storage.node_cache()


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


def look_ahead(handles: Sequence[CacheHandle], config: ReaderConfig | None, *, streams: int = 1) -> int:
    """Shards a read in the order `config` gives may prefetch ahead of itself (0: none): at most
    what the node cache's limit leaves beside the order's window (one per stream of a mixture;
    half of the room when the order is not known) and half of what its file system's room
    leaves, both beside the dataset's small files (pinned while it is open); none when there is
    no limit and nothing is missing."""
    remote = _remote(handles)
    if not remote:
        return 0
    first = remote[0].remote
    assert first is not None  # _remote keeps the handles that have one
    storage = first.storage
    ahead = storage.prefetch_shards
    limit = storage.limit_bytes
    if ahead <= 0 or (limit is None and _all_on_node(remote)):
        return 0
    shard_sizes = [s.byte_len for h in remote for s in h.manifest.shards]
    largest = max(1, max(shard_sizes, default=1))
    resident = sum(_small_bytes(h) for h in remote)  # pinned while the dataset is open
    if limit is not None and resident + sum(shard_sizes) > limit:
        room = max(0, limit - resident) // largest
        if config is None:
            ahead = min(ahead, room // 2)
        else:
            # what the order holds at once by the disk bound: two shards of an ordered read, a
            # locality window plus the next window's first shard
            in_use = (
                2
                if not config.shuffle
                else streams * (config.window_shards + 1)
                if config.sampling == "locality"
                else len(shard_sizes)
            )
            ahead = min(ahead, max(0, room - in_use))
    node = _node_cache(remote)
    if ahead > 0 and node.free_bytes() < 2 * ahead * largest:  # a small disk: walk the cache only then
        ahead = min(ahead, max(0, node.capacity_bytes() - resident) // (2 * largest))
    return ahead


def prefetcher(
    handles: Sequence[CacheHandle], window: Any, config: ReaderConfig | None = None
) -> ShardPrefetcher | None:
    """The prefetcher of one read of `window` in the order `config` gives, or None (no remote
    cache, prefetch off, nothing to fetch, no room, an empty window); see `look_ahead`."""
    if window.length == 0:
        return None
    ahead = look_ahead(handles, config, streams=locality_streams(getattr(window, "plan", None)))
    if ahead <= 0:
        return None
    first = _remote(handles)[0].remote
    assert first is not None  # look_ahead is 0 without a remote cache
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
