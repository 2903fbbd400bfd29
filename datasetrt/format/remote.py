"""Caches at object-store URLs, opened through their mirror in the node-local cache: the manifest
fetched at every open, the small files (index, metadata, checksum sidecar, dictionary) at open,
shards on demand, each verified against the manifest's size and sha256 before first use.

Boundary: which files a cache has and what they must be (from the manifest); the bytes are
fetched and kept by `storage/` (`ObjectStore`, `NodeCache`). No tables, sampling or processes;
no pydantic (reader workers reopen remote caches from a `RemoteCache`, a plain value).

A mirror is keyed by the cache's URL and the sha256 of the manifest as fetched (the `version`),
so a cache republished at the same URL opens as a new mirror, never against stale files.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasetrt.errors import MissingManifestError, ObjectNotFoundError
from datasetrt.format.layout import (
    CHECKSUM_ROW_BYTES,
    INDEX_NAME,
    INDEX_ROW_BYTES,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARDS_DIR,
)
from datasetrt.format.manifest import Manifest, parse_manifest
from datasetrt.storage.node_cache import DEFAULT_SMALL_MAX_BYTES, Mirror, NodeCache
from datasetrt.storage.objects import ObjectStore, RetryPolicy
from datasetrt.storage.urls import RemoteLocation

MANIFEST_MAX_BYTES = 64 << 20  # a manifest larger than this is refused before its body is read
METADATA_MAX_BYTES = 4 << 30  # metadata.arrow is fetched whole; its size is not in the manifest


@dataclass(frozen=True)
class Storage:
    """How this process reaches object stores and the node-local cache: obstore `options` (held
    here in plain form; never shown: `repr` hides them), the node cache's `cache_dir` and
    `limit_bytes`, the retry budget, how many shards a read fetches ahead. Built from a `StorageConfig` by the dataset or writer;
    picklable, so reader workers get it with their caches."""

    options: dict[str, Any] = field(default_factory=dict, repr=False)
    cache_dir: str = ""
    limit_bytes: int | None = None
    fetch_concurrency: int = 4
    retry_attempts: int = 10
    retry_budget_s: float = 120.0
    prefetch_shards: int = 16

    @classmethod
    def of(cls, config: Any) -> Storage:
        """From a `StorageConfig` (values/config.py)."""
        return cls(
            config.plain_options(),
            config.resolved_cache_dir(),
            config.cache_limit_bytes,
            config.fetch_concurrency,
            config.retry_attempts,
            config.retry_budget_s,
            config.prefetch_shards,
        )

    def store(self, location: RemoteLocation) -> ObjectStore:
        """The object store of `location` (kept per process, per location)."""
        key = (os.getpid(), location.url, tuple(sorted(self.options.items())), self.retry_attempts, self.retry_budget_s)
        store = _STORES.get(key)
        if store is None:
            retry = RetryPolicy(attempts=self.retry_attempts, budget_s=self.retry_budget_s)
            store = _STORES[key] = ObjectStore(location, self.options, retry=retry)
        return store

    def node_cache(self) -> NodeCache:
        """The node-local cache (one object per process and directory)."""
        key = (os.getpid(), self.cache_dir, self.limit_bytes)
        node = _NODES.get(key)
        if node is None:
            node = _NODES[key] = NodeCache(self.cache_dir, limit_bytes=self.limit_bytes)
        return node


_STORES: dict[tuple[Any, ...], ObjectStore] = {}
_NODES: dict[tuple[Any, ...], NodeCache] = {}


@dataclass(frozen=True)
class RemoteCache:
    """One cache at an object-store URL as this node holds it: where it is (`location`), how to
    reach it (`storage`), which manifest it was opened at (`version`: its sha256) and the mirror
    directory that holds its verified files under their cache-relative names."""

    location: RemoteLocation
    storage: Storage
    version: str
    mirror_dir: str

    @property
    def url(self) -> str:
        return self.location.url

    def mirror(self) -> Mirror:
        return self.storage.node_cache().mirror(self.storage.store(self.location), version=self.version)

    def ensure(
        self, name: str, *, size: int | None, sha256: str, max_bytes: int | None = None, pin: bool = False
    ) -> Path:
        """The local path of cache file `name` (e.g. "shards/000000.bin"), fetched first when it
        is not on the node (one download per node; verified against `size` and `sha256`); with
        `pin`, pinned in the node cache (no process evicts it) until `unpin(name)`."""
        bound = DEFAULT_SMALL_MAX_BYTES if max_bytes is None else max_bytes
        return self.mirror().ensure(name, size=size, sha256=sha256, max_bytes=bound, pin=pin)

    def ensure_shard(self, manifest: Manifest, shard: int, *, pin: bool = False) -> Path:
        entry = manifest.shards[shard]
        return self.ensure(f"{SHARDS_DIR}/{entry.name}", size=entry.byte_len, sha256=entry.sha256, pin=pin)

    def unpin_shard(self, manifest: Manifest, shard: int) -> None:
        """Drop one pin of shard `shard` taken by this process (`ensure_shard(..., pin=True)`)."""
        self.mirror().unpin(f"{SHARDS_DIR}/{manifest.shards[shard].name}")

    def shard_names(self, manifest: Manifest) -> list[str]:
        return [f"{SHARDS_DIR}/{entry.name}" for entry in manifest.shards]


def small_files(manifest: Manifest) -> list[tuple[str, int | None, str]]:
    """(name, size or None, sha256) of the files a reader needs at open: index, metadata, the
    checksum sidecar and the dictionary when the manifest names them."""
    files: list[tuple[str, int | None, str]] = [
        (INDEX_NAME, manifest.sample_count * INDEX_ROW_BYTES, manifest.index_sha256),
        (METADATA_NAME, None, manifest.metadata_sha256),
    ]
    if manifest.checksums is not None:
        files.append((manifest.checksums.file, manifest.sample_count * CHECKSUM_ROW_BYTES, manifest.checksums.sha256))
    if manifest.dictionary is not None:
        files.append((manifest.dictionary.file, manifest.dictionary.byte_len, manifest.dictionary.sha256))
    return files


def open_remote(location: RemoteLocation, storage: Storage) -> RemoteCache:
    """Mirror the cache at `location` on this node: fetch its manifest (every time: it decides the
    mirror), then every small file the mirror lacks; shards stay remote until a read needs them.
    The manifest and the small files are pinned in the node cache while the returned
    `RemoteCache` lives (readers map and stat them for as long as the cache is open, so evicting
    them to make room for shards would break the open cache). `MissingManifestError` naming the
    URL when there is no manifest (an unpublished or absent cache); the storage layer's typed
    errors (access denied, unreachable) otherwise."""
    store = storage.store(location)
    try:
        raw = store.get(MANIFEST_NAME, max_bytes=MANIFEST_MAX_BYTES)
    except ObjectNotFoundError:
        raise MissingManifestError(f"missing manifest: {location.url_of(MANIFEST_NAME)}") from None
    manifest = parse_manifest(raw, location.url_of(MANIFEST_NAME))
    version = hashlib.sha256(raw).hexdigest()
    mirror = storage.node_cache().mirror(store, version=version)
    pinned: list[str] = []
    try:
        mirror.install(MANIFEST_NAME, raw, sha256=version, pin=True)
        pinned.append(MANIFEST_NAME)
        for name, size, sha256 in small_files(manifest):
            bound = DEFAULT_SMALL_MAX_BYTES if size is not None else METADATA_MAX_BYTES
            mirror.ensure(name, size=size, sha256=sha256, max_bytes=bound, pin=True)
            pinned.append(name)
    except BaseException:
        _unpin(mirror, pinned)
        raise
    remote = RemoteCache(location, storage, version, str(mirror.dir))
    weakref.finalize(remote, _unpin, mirror, pinned)
    return remote


def _unpin(mirror: Mirror, names: list[str]) -> None:
    for name in names:
        mirror.unpin(name)
