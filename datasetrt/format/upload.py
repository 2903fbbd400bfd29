"""Publishing caches under an object-store prefix: each cache is written to a local staging base,
then its objects are uploaded and `manifest.json` is put last, create-only, so a cache in a
bucket is published atomically, by exactly one writer.

Boundary: write results in, write results out; the local write is `format/writer.py`'s and the
objects' transfer `storage/`'s. No tables, no processes.

The protocol, per cache `<prefix>/<name>/` (docs/object-storage.md, "Writing"):
  1. a published cache (its manifest exists) is never touched: "cache path already exists";
  2. the writer claims the name with a create-only put of `<name>/.datasetrt-writer` (who and
     when: format/claims.py); a claim already there is another writer's, live or dead: one made
     by a process provably dead (on this node) is taken over, its objects cleared first; any other
     is an error that names `datasetrt prune`, which removes a dead writer's objects; with the
     claim held, the manifest is looked up again (a writer that published since step 1 released
     its claim only after), so nothing is uploaded over a published cache;
  3. shards, index, metadata, the checksum sidecar and the dictionary are uploaded (large ones in
     parts), then the manifest with a create-only put: the one moment the cache appears; an
     upload that fails removes what it put and its claim, unless the manifest is there;
  4. the claim is removed. A writer killed before step 3 leaves objects but no manifest: readers
     never see them (a cache is its manifest), and `unpublished` / `datasetrt prune` find them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasetrt.errors import DatasetRTError, ObjectExistsError, ObjectNotFoundError
from datasetrt.format.claims import (
    CLAIM_NAME,
    Cleared,
    clear_unpublished,
    describe_claim,
    holder_is_dead,
    idle_seconds,
    is_cache_object,
    read_claim,
)
from datasetrt.format.claims import claim_text as _claim_text
from datasetrt.format.layout import MANIFEST_NAME
from datasetrt.format.manifest import read_manifest_stat
from datasetrt.format.remote import Storage
from datasetrt.format.remote import small_files as _small_files
from datasetrt.format.results import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from datasetrt.storage.objects import ObjectInfo, ObjectStore
from datasetrt.storage.urls import RemoteLocation

__all__ = ["CLAIM_NAME", "EXISTS", "Cleared", "Unpublished", "delete_objects", "publish_cache", "unpublished"]

EXISTS = "cache path already exists"


def upload_order(cache_dir: Path) -> list[str]:
    """The cache-relative names of a local cache's files in upload order: shards, then the small
    files, the manifest last."""
    manifest, _st = read_manifest_stat(cache_dir)
    names = [f"shards/{s.name}" for s in manifest.shards]
    names += [name for name, _size, _sha in _small_files(manifest)]
    return [*names, MANIFEST_NAME]


def publish_cache(local_dir: Path, store: ObjectStore) -> str | None:
    """Upload the local cache `local_dir` as the cache at `store`'s location (the protocol above);
    None once published, else the error message (nothing published)."""
    try:
        store.head(MANIFEST_NAME)
        return f"{EXISTS}: {store.url}"
    except ObjectNotFoundError:
        pass
    mine = _claim_text()
    try:
        store.put_if_absent(CLAIM_NAME, mine)
    except ObjectExistsError:
        problem = _take_over(store, mine)
        if problem:
            return problem
    if _published(store):  # published between our first look and our claim (its writer then released it)
        _drop_claim(store)
        return f"{EXISTS}: {store.url}"
    names = upload_order(local_dir)
    try:
        for name in names[:-1]:
            store.put(name, local_dir / name)
        store.put_if_absent(MANIFEST_NAME, (local_dir / MANIFEST_NAME).read_bytes())
    except ObjectExistsError:
        _drop_claim(store)
        return f"{EXISTS}: {store.url}"
    except DatasetRTError:
        _remove_unpublished_upload(store, names[:-1])
        raise
    _drop_claim(store)
    return None


def _drop_claim(store: ObjectStore) -> None:
    try:
        store.delete([CLAIM_NAME])
    except DatasetRTError:
        pass  # a claim left beside a manifest blocks nothing (the manifest answers first)


def _take_over(store: ObjectStore, mine: bytes) -> str | None:
    """Take the place of the writer whose claim is on the cache when it is provably dead (its
    objects are cleared first); else the error message naming the claim."""
    claim = read_claim(store)
    if claim is not None and holder_is_dead(claim):
        cleared = clear_unpublished(store, claim, replace_with=mine)
        if not cleared.stopped:
            return None
        reason = f" ({cleared.stopped})"
    elif claim is None:  # released between our put and our read: claim again, once
        try:
            store.put_if_absent(CLAIM_NAME, mine)
            return None
        except ObjectExistsError:
            claim, reason = read_claim(store), ""
    else:
        reason = ""
    location = store.location
    base = RemoteLocation(location.scheme, location.bucket, location.prefix.rpartition("/")[0]).url
    return (
        f"another writer holds {store.url_of(CLAIM_NAME)} ({describe_claim(claim)}: writing now, or killed "
        f"before it published){reason}; if none is running, `datasetrt prune {base}` removes its objects "
        f"once they are idle for --min-age"
    )


def _remove_unpublished_upload(store: ObjectStore, names: list[str]) -> None:
    """After a failed upload: remove what it put and the claim, unless the manifest is there (a put
    whose answer was lost may have published it). Best effort: what stays, `prune` removes."""
    try:
        if _published(store):
            return
        store.delete(names)
        store.delete([CLAIM_NAME])
    except DatasetRTError:
        pass


def write_sources_remote(
    sources: list[Any],
    base: RemoteLocation,
    storage: Storage,
    write_local: Callable[[list[Any], Path], list[CacheWriteResult]],
    *,
    reuse_existing: bool = False,
    check_reused: Callable[[str, str], str | None] | None = None,
) -> list[CacheWriteResult]:
    """Write `sources` as caches under `base`, one at a time: `write_local(sources, dir)` writes
    a source into a fresh local staging base (under the node cache's root), its cache is uploaded
    and published, and the local copy removed, so local disk holds one cache at a time (a killed
    writer's staging directory is removed by the next write on the node: `_new_staging`). Results
    are per source, in order (`CacheWriteSuccess.path` is the cache's URL string). With
    `reuse_existing`, a published cache of the source's name is checked (`check_reused(name,
    url)`) and reused instead of written."""
    results: list[CacheWriteResult] = []
    root = Path(storage.cache_dir) / ".upload"
    root.mkdir(parents=True, exist_ok=True)
    for source in sources:
        name = getattr(source, "name", None)
        if isinstance(name, str) and reuse_existing:
            url = base.child(name).url if _valid_segment(name) else None
            if url is not None and _published(storage.store(base.child(name))):
                problem = check_reused(name, url) if check_reused is not None else None
                results.append(CacheWriteError(name, problem) if problem else CacheWriteSuccess(name, url))  # type: ignore[arg-type]
                continue
        staging, lock_fd = _new_staging(root)
        try:
            [result] = write_local([source], staging)
            if isinstance(result, CacheWriteSuccess):
                location = base.child(result.source_name)
                try:
                    problem = publish_cache(Path(result.path), storage.store(location))
                except DatasetRTError as exc:
                    problem = str(exc)
                result = (
                    CacheWriteError(result.source_name, problem)
                    if problem
                    else CacheWriteSuccess(result.source_name, location.url)  # type: ignore[arg-type]
                )
            results.append(result)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            os.close(lock_fd)
    return results


STAGING_LOCK = ".writer.lock"
STALE_STAGING_MIN_AGE_S = 60.0


def _new_staging(root: Path) -> tuple[Path, int]:
    """A fresh staging directory under `root` and the descriptor of its lock, held (flock) for as
    long as the write runs; the staging directories of dead writers (their lock free) go first."""
    _remove_stale_staging(root)
    staging = Path(tempfile.mkdtemp(prefix="write-", dir=root))
    fd = os.open(staging / STAGING_LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return staging, fd


def _remove_stale_staging(root: Path, min_age_s: float = STALE_STAGING_MIN_AGE_S) -> None:
    """Remove the staging directories a killed writer left under `root`: those whose lock no
    process holds (or that have none) and that are older than `min_age_s` (a writer holds its
    lock from its first microseconds)."""
    now = time.time()
    for staging in root.glob("write-*"):
        try:
            if now - staging.stat().st_mtime < min_age_s:
                continue
            fd = os.open(staging / STAGING_LOCK, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            shutil.rmtree(staging, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: a live writer's
        else:
            shutil.rmtree(staging, ignore_errors=True)
        finally:
            os.close(fd)


def _valid_segment(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..")


def _published(store: ObjectStore) -> bool:
    try:
        store.head(MANIFEST_NAME)
        return True
    except ObjectNotFoundError:
        return False


@dataclass(frozen=True)
class Unpublished:
    """The objects of one cache that has no manifest: `name` its name under the listed location
    ("" for the location itself), `url` its URL, `objects` (names relative to the cache), `idle_s`
    the seconds since its youngest object was written (None when the store gives no times) and
    `claim` its writer's claim as read (None: none)."""

    name: str
    url: str
    objects: list[ObjectInfo]
    idle_s: float | None
    claim: bytes | None

    @property
    def size_bytes(self) -> int:
        return sum(info.size for info in self.objects)

    @property
    def holder(self) -> str:
        return describe_claim(self.claim)


def unpublished(store: ObjectStore, *, min_age_s: float = 3600.0) -> list[Unpublished]:
    """The unpublished caches at `store`'s location, idle for at least `min_age_s` (an active
    writer's are left out; `min_age_s=0` lists every one), by name.

    The location is a base (its caches are the first segment of the names below it) or itself a
    cache (a cache file or a claim at its top). Only a prefix whose every object is a name a cache
    or its writer puts there (`claims.is_cache_object`) and that holds no manifest.json counts, so
    a published cache, anything nested deeper and data that is not a cache are never listed.
    One listing, plus one small read per candidate with a claim."""
    infos = store.list()
    groups: dict[str, list[ObjectInfo]] = {}
    if any("/" not in info.name and is_cache_object(info.name) for info in infos):
        groups[""] = infos  # the location is a cache itself
    else:
        for info in infos:
            head, sep, rest = info.name.partition("/")
            if sep:
                groups.setdefault(head, []).append(ObjectInfo(rest, info.size, info.etag, info.version, info.modified))
    out = []
    for name, objects in sorted(groups.items()):
        if not objects or not all(is_cache_object(info.name) for info in objects):
            continue
        if any(info.name == MANIFEST_NAME for info in objects):
            continue
        idle = idle_seconds(objects)
        if min_age_s > 0 and (idle is None or idle < min_age_s):
            continue
        cache = store if not name else store.with_location(store.location.child(name))
        claim = read_claim(cache) if any(info.name == CLAIM_NAME for info in objects) else None
        out.append(Unpublished(name, cache.url, objects, idle, claim))
    return out


def delete_objects(store: ObjectStore, found: Unpublished, *, min_age_s: float = 3600.0) -> Cleared:
    """Remove the objects of the unpublished cache `found` (from `unpublished(store)`), under the
    lock of `claims.clear_unpublished`, which checks again that it has no manifest and nothing
    younger than `min_age_s`: what it removed, or why it stopped (`found` changed meanwhile)."""
    cache = store if not found.name else store.with_location(store.location.child(found.name))
    return clear_unpublished(cache, found.claim, min_idle_s=min_age_s)
