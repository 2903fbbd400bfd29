"""Publishing caches under an object-store prefix: each cache is written to a local staging base,
then its objects are uploaded and `manifest.json` is put last, create-only, so a cache in a
bucket is published atomically, by exactly one writer.

Boundary: write results in, write results out; the local write is `format/writer.py`'s and the
objects' transfer `storage/`'s. No tables, no processes.

The protocol, per cache `<prefix>/<name>/` (docs/object-storage.md, "Writing"):
  1. a published cache (its manifest exists) is never touched: "cache path already exists";
  2. the writer claims the name with a create-only put of `<name>/.datasetrt-writer` (who and
     when); a lost claim is another writer's, live or dead: the error says which command removes
     a dead one's objects (`datasetrt clean-remote`);
  3. shards, index, metadata, the checksum sidecar and the dictionary are uploaded (large ones in
     parts), then the manifest with a create-only put: the one moment the cache appears;
  4. the claim is removed. A writer killed before step 3 leaves objects but no manifest: readers
     never see them (a cache is its manifest), and `clean-remote` lists and removes them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from datasetrt.errors import DatasetRTError, ObjectExistsError, ObjectNotFoundError
from datasetrt.format.layout import MANIFEST_NAME
from datasetrt.format.manifest import read_manifest_stat
from datasetrt.format.remote import Storage
from datasetrt.format.remote import small_files as _small_files
from datasetrt.format.results import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from datasetrt.storage.objects import ObjectStore
from datasetrt.storage.urls import RemoteLocation

CLAIM_NAME = ".datasetrt-writer"  # a writer's claim on a cache name (removed once published)
EXISTS = "cache path already exists"


def upload_order(cache_dir: Path) -> list[str]:
    """The cache-relative names of a local cache's files in upload order: shards, then the small
    files, the manifest last."""
    manifest, _st = read_manifest_stat(cache_dir)
    names = [f"shards/{s.name}" for s in manifest.shards]
    names += [name for name, _size, _sha in _small_files(manifest)]
    return [*names, MANIFEST_NAME]


def _claim_text() -> bytes:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode()


def publish_cache(local_dir: Path, store: ObjectStore) -> str | None:
    """Upload the local cache `local_dir` as the cache at `store`'s location (the protocol above);
    None once published, else the error message (nothing published)."""
    try:
        store.head(MANIFEST_NAME)
        return f"{EXISTS}: {store.url}"
    except ObjectNotFoundError:
        pass
    try:
        store.put_if_absent(CLAIM_NAME, _claim_text())
    except ObjectExistsError:
        return (
            f"another writer holds {store.url_of(CLAIM_NAME)} (writing now, or killed before it published): "
            f"if none is running, remove its objects with `datasetrt clean-remote {store.url} --delete`"
        )
    names = upload_order(local_dir)
    for name in names[:-1]:
        store.put(name, local_dir / name)
    try:
        store.put_if_absent(MANIFEST_NAME, (local_dir / MANIFEST_NAME).read_bytes())
    except ObjectExistsError:
        return f"{EXISTS}: {store.url}"
    try:
        store.delete([CLAIM_NAME])
    except DatasetRTError:
        pass  # published; a claim left behind only blocks nothing (the manifest answers first)
    return None


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
    and published, and the local copy removed, so local disk holds one cache at a time. Results
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
        staging = Path(tempfile.mkdtemp(prefix="write-", dir=root))
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
    return results


def _valid_segment(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..")


def _published(store: ObjectStore) -> bool:
    try:
        store.head(MANIFEST_NAME)
        return True
    except ObjectNotFoundError:
        return False


def unpublished(store: ObjectStore, *, min_age_s: float = 3600.0) -> list[tuple[str, list[str], float | None]]:
    """The caches under `store`'s location that have objects but no manifest: (cache name, its
    object names, the age in seconds of its writer's claim or None). Those whose claim is younger
    than `min_age_s` are left out (a writer may be uploading them now)."""
    groups: dict[str, list[str]] = {}
    for info in store.list():
        head, sep, _rest = info.name.partition("/")
        if sep:
            groups.setdefault(head, []).append(info.name)
    out = []
    now = time.time()
    for name, objects in sorted(groups.items()):
        if f"{name}/{MANIFEST_NAME}" in objects:
            continue
        age = None
        if f"{name}/{CLAIM_NAME}" in objects:
            try:
                claim = json.loads(store.get(f"{name}/{CLAIM_NAME}", max_bytes=4096))
                age = max(0.0, now - float(claim.get("time", now)))
            except (DatasetRTError, ValueError, TypeError, AttributeError):
                age = None
            if age is not None and age < min_age_s:
                continue
        out.append((name, objects, age))
    return out


def delete_objects(store: ObjectStore, names: Iterable[str]) -> None:
    """Remove objects (those `unpublished` listed)."""
    store.delete(list(names))
