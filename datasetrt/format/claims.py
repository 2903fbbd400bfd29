"""Writer claims on cache names in an object store: what a claim says about its writer, whether
that writer is provably dead, and clearing an unpublished cache's objects under a lock.

Boundary: the objects of one cache prefix by name (its claim, takeover markers, its files) through
`ObjectStore`; no byte layouts beyond the file names of `format/layout.py`, no local files.

A claim (`<cache>/.datasetrt-writer`, created with a create-only put before anything is uploaded)
names its writer: host, pid, the time it claimed and, where /proc exists, the boot id, the pid
namespace and the process's start time. Its writer is provably dead when the claim was made
during this machine's current boot, in this process's pid namespace, and no process with that pid
and start time exists now. Nothing else is proof: a claim made on another node is never called
dead here (`datasetrt prune` removes its objects once they are idle for `--min-age`).

Clearing (`clear_unpublished`) removes every object of an unpublished cache, under a lock:
  - with no claim, the lock is a claim of our own (create-only): a writer starting meanwhile finds
    it and stops, and one that claimed first makes us stop;
  - with a claim, the lock is the takeover marker `<cache>/.datasetrt-takeover-<16 hex of the
    claim's sha256>` (create-only): of the processes that read the same claim, one wins; the
    winner re-reads the claim and stops unless it is byte for byte the one it judged.
Under the lock: a listing; any manifest (published meanwhile) stops it; with `min_idle_s`, an
object younger than that (a writer still active) stops it; then every object but the lock is
deleted, the claim is replaced (a writer taking over) or deleted, and the marker goes last. A
process that re-reads the claim after that finds ours or none, so it stops. A clearer killed
midway leaves its lock, itself a claim or a marker beside one, which the next prune clears.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from datasetrt.errors import DatasetRTError, ObjectExistsError, ObjectNotFoundError
from datasetrt.format.layout import (
    CHECKSUMS_NAME,
    DICTIONARY_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARD_NAME_RE,
    SHARDS_DIR,
)
from datasetrt.storage.objects import ObjectInfo, ObjectStore

CLAIM_NAME = ".datasetrt-writer"  # a writer's claim on a cache name (removed once published)
TAKEOVER_PREFIX = ".datasetrt-takeover-"
CLAIM_MAX_BYTES = 4096
CACHE_FILE_NAMES = frozenset((MANIFEST_NAME, INDEX_NAME, METADATA_NAME, CHECKSUMS_NAME, DICTIONARY_NAME, CLAIM_NAME))


def is_cache_object(name: str) -> bool:
    """Whether `name` (relative to a cache's prefix) is a name a datasetrt cache or its writer
    puts there: its files, `shards/NNNNNN.bin`, a claim or a takeover marker."""
    if "/" not in name:
        return name in CACHE_FILE_NAMES or name.startswith(TAKEOVER_PREFIX)
    head, _, shard = name.partition("/")
    return head == SHARDS_DIR and SHARD_NAME_RE.match(shard) is not None


def _proc_identity(pid: int) -> dict[str, Any]:
    """boot id, pid namespace and start time (clock ticks after boot) of `pid`, where /proc has them."""
    out: dict[str, Any] = {}
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            out["boot_id"] = f.read().strip()
        out["pid_ns"] = os.readlink("/proc/self/ns/pid")
        out["start"] = _start_ticks(pid)
    except OSError:
        return {}
    return out if out["start"] is not None else {}


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return int(fields[19]) if len(fields) > 19 else None


def claim_text() -> bytes:
    """The claim of this process."""
    pid = os.getpid()
    return json.dumps({"host": socket.gethostname(), "pid": pid, "time": time.time(), **_proc_identity(pid)}).encode()


def claim_fields(raw: bytes) -> dict[str, Any]:
    """The fields of a claim's bytes ({} when they are not a claim)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def holder_is_dead(raw: bytes) -> bool:
    """Whether the claim `raw` was made by a process that provably no longer exists (see the module
    docstring); False whenever that cannot be known."""
    doc = claim_fields(raw)
    pid, start = doc.get("pid"), doc.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, int) or pid <= 0:
        return False
    here = _proc_identity(os.getpid())
    if not here or doc.get("boot_id") != here["boot_id"] or doc.get("pid_ns") != here["pid_ns"]:
        return False
    return _start_ticks(pid) != start


def describe_claim(raw: bytes | None) -> str:
    """Who holds a claim, for messages ("host h, pid 12, claimed 2026-01-01T00:00:00Z")."""
    if raw is None:
        return "no claim"
    doc = claim_fields(raw)
    when = doc.get("time")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)) if isinstance(when, (int, float)) else "?"
    return f"host {doc.get('host', '?')}, pid {doc.get('pid', '?')}, claimed {stamp}"


def read_claim(store: ObjectStore) -> bytes | None:
    """The claim's bytes of the cache at `store`'s location, None when there is none."""
    try:
        return store.get(CLAIM_NAME, max_bytes=CLAIM_MAX_BYTES)
    except ObjectNotFoundError:
        return None


@dataclass(frozen=True)
class Cleared:
    """What `clear_unpublished` removed (`objects`) or why it stopped (`stopped`, "" when it cleared)."""

    objects: list[ObjectInfo]
    stopped: str = ""


def clear_unpublished(
    store: ObjectStore, claim: bytes | None, *, replace_with: bytes | None = None, min_idle_s: float | None = None
) -> Cleared:
    """Remove the objects of the unpublished cache at `store`'s location whose claim, as the caller
    read it, is `claim` (None: it had none), under the lock of the module docstring. With
    `replace_with`, the claim is then replaced by it (a writer taking a dead writer's place) instead
    of deleted. With `min_idle_s`, stops when any object is younger than that."""
    if claim is None:
        lock, mine = CLAIM_NAME, replace_with if replace_with is not None else claim_text()
        try:
            store.put_if_absent(CLAIM_NAME, mine)
        except ObjectExistsError:
            return Cleared([], "a writer claimed it meanwhile")
    else:
        lock = TAKEOVER_PREFIX + hashlib.sha256(claim).hexdigest()[:16]
        try:
            store.put_if_absent(lock, claim_text())
        except ObjectExistsError:
            return Cleared([], f"another process is clearing it ({store.url_of(lock)} exists)")
        if read_claim(store) != claim:
            _release(store, lock)
            return Cleared([], "its claim changed meanwhile")
    try:
        objects = [info for info in store.list() if info.name != lock]
        if any(info.name == MANIFEST_NAME for info in objects):
            _release(store, lock)
            return Cleared([], "it was published meanwhile")
        if min_idle_s is not None and min_idle_s > 0:
            idle = idle_seconds([i for i in objects if i.name != CLAIM_NAME] or objects)
            if idle is None or idle < min_idle_s:
                _release(store, lock)
                return Cleared([], "it is being written (an object is younger than the minimum age)")
        doomed = [info for info in objects if info.name != CLAIM_NAME]
        store.delete([info.name for info in doomed])
        if replace_with is not None:
            if lock != CLAIM_NAME:
                store.put(CLAIM_NAME, replace_with)
        else:
            store.delete([CLAIM_NAME])
            doomed += [info for info in objects if info.name == CLAIM_NAME]
        if lock != CLAIM_NAME:
            store.delete([lock])
    except BaseException:
        if lock != CLAIM_NAME:
            _release(store, lock)  # the claim (ours, or the one judged) stays: the next clearer finds it
        raise
    return Cleared(doomed)


def idle_seconds(objects: list[ObjectInfo], now: float | None = None) -> float | None:
    """Seconds since the youngest of `objects` was written (None when the store gave no times)."""
    times = [info.modified for info in objects if info.modified is not None]
    if not times:
        return None
    return max(0.0, (time.time() if now is None else now) - max(times))


def _release(store: ObjectStore, name: str) -> None:
    try:
        store.delete([name])
    except DatasetRTError:
        pass  # a lock left behind blocks, never corrupts: the next prune clears it
