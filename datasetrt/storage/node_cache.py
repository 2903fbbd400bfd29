"""The node-local shard cache: verified local copies of remote cache files, shared by every process on a node.

Boundary: files by relative name, size and sha256 under a local directory, fetched through an
`ObjectStore`; coordination only through the file system (flock, create + rename), never shared
memory or threads; knows nothing of manifests, records or plans (the caller passes names, sizes
and digests, and decides what to pin and evict).

Layout (one root per node, e.g. on local NVMe; every path below is relative to it)::

    <mirror>/                       one remote cache: complete, verified files only, under the
      manifest.json ...               same relative names as in the store (shards/000000.bin), so
      shards/000000.bin               the directory opens as a local cache once its small files are in
    .work/space.lock                flock: held while the directory's usage is counted and space reserved
    .work/<mirror>/SOURCE           JSON {"url", "version"}: which remote cache the mirror holds
    .work/<mirror>/<name>.lock      flock per file: EX while it is fetched (or evicted)
    .work/<mirror>/<name>.pin       flock per file: SH while pinned, EX (non-blocking) while evicted
    .work/<mirror>/<name>.part-<N>  a download in progress of an N-byte file (kept across failures)

`<mirror>` is `<last URL segment>-<first 20 hex digits of sha256(url + "\\n" + version)>`:
`version` (opaque, e.g. the sha256 of the manifest the caller read) makes a republished cache at
the same URL a different mirror rather than a stale one. Lock files are never removed (removing a
file others may lock is racy); they are empty.

Invariants:
- A file appears under `<mirror>/` only by `rename` from its partial after its size and sha256
  matched and it was fsynced (then its directory is fsynced): a present file of the expected size
  is complete, and any process uses it without downloading or locking (`ensure`'s fast path).
- One download per file per node: a process that needs a missing file takes the file's lock
  exclusively, looks again, and only then fetches; waiters find the file in place.
- A download resumes from its partial: a partial left by a failed or killed process (whose lock the
  kernel released) is continued by a range request from its length, never restarted. A file whose
  sha256 does not match is fetched once more from byte 0; a second mismatch raises IntegrityError
  naming the object's URL (and removes the partial). An object of the wrong size in the store is
  an IntegrityError at once (a refetch cannot change it).
- Disk accounting (`limit_bytes`, None for none): usage is the size of every complete file plus the
  full declared size N of every partial (a reservation made, under `space.lock`, before its first
  byte is fetched), so concurrent downloads cannot overshoot the limit. To fit a new file the
  least recently ensured unpinned files are evicted (their access time is set on each `ensure`;
  the modification time, which readers use as identity, is never touched), then unheld partials;
  if it still cannot fit, DiskLimitError names the limit and the need. The file system's free
  space, less what the partials in flight have reserved but not written yet, is checked the same
  way (DiskFullError up front when it cannot hold the file), and ENOSPC
  during a download is a DiskFullError naming the root; its partial is removed, so a full disk is
  not kept full by a reservation.
- Pins (`ensure(..., pin=True)`, `pin`, `unpin`) are shared flocks on the file's `.pin` lock held
  by this process until unpinned or `release_all()`; eviction (by any process) takes both of the
  file's locks exclusively without waiting, so it never removes a pinned or in-flight file. The two
  locks are separate so that a process waiting for a download (exclusive on `.lock`) never waits
  on a pin: a pin may be held by a look-ahead that is itself waiting for the read that waits.
  Nothing ever blocks on a `.pin` lock but a pin taker during an eviction's unlink. Removing a file that a reader has open is
  safe (POSIX unlink) but keeps its blocks allocated until it is closed, outside the limit's
  accounting: pins keep what a look-ahead still needs from being downloaded again, and a reader
  that must keep the directory plus its removed-but-open files within the limit pins every file
  while it has it open. A path returned without a pin can be evicted before it is opened: open it
  promptly or pin it.
- Fork: pins belong to the process that took them; a forked child starts with none (it closes
  the inherited descriptors without unlocking the parent's locks).

Costs: a hit is one stat (plus a flock when pinning); a miss adds a directory walk of the root
under `space.lock` (O(files)), the download and one sequential read to hash it.

Size: over 500 lines because fetching, pinning and eviction share one lock protocol and one
space account, stated once above; splitting them would split the invariants they keep together.
"""

from __future__ import annotations

import errno as errno_codes
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from datasetrt.errors import CacheIOError, ConfigError, DiskFullError, DiskLimitError, IntegrityError
from datasetrt.storage.objects import ObjectStore
from datasetrt.storage.urls import relative_name

WORK_DIR = ".work"
SPACE_LOCK = "space.lock"
SOURCE_FILE = "SOURCE"
DEFAULT_SMALL_MAX_BYTES = 256 << 20  # bound of a file fetched without a known size
_PART_RE = re.compile(r"^(.+)\.part-(\d+)$")
_SLUG_RE = re.compile(r"[^A-Za-z0-9._-]")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Entry:
    path: Path
    lock: Path  # the fetch lock
    pin: Path | None  # the pin lock (complete files; None for partials)
    size: int  # bytes counted against the limit
    atime_ns: int
    partial: bool
    unwritten: int = 0  # of a partial: declared bytes not on disk yet (the file system still shows them free)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class NodeCache:
    """A node-local cache directory `root` (created if missing) with an optional byte limit."""

    def __init__(self, root: str | os.PathLike[str], *, limit_bytes: int | None = None) -> None:
        if limit_bytes is not None and (not isinstance(limit_bytes, int) or limit_bytes < 0):
            raise ConfigError(f"limit_bytes must be an integer >= 0 or None, got {limit_bytes!r}")
        self.root = Path(os.fspath(root)).absolute()
        self.limit_bytes = limit_bytes
        self.work = self.root / WORK_DIR
        try:
            self.work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheIOError.from_os(exc, self.root, "cannot create the local shard cache") from None
        self._lock = threading.Lock()
        self._pins: dict[Path, list[int]] = {}  # lock path -> [fd, count]
        self._pins_pid = os.getpid()

    def __repr__(self) -> str:
        return f"NodeCache({str(self.root)!r}, limit_bytes={self.limit_bytes})"

    def mirror(self, store: ObjectStore, *, version: str = "") -> Mirror:
        """The mirror of `store`'s location (one remote cache) at `version` (see the module docstring)."""
        return Mirror(self, store, version)

    # -- accounting -----------------------------------------------------------------------------

    def _entries(self) -> list[_Entry]:
        entries: list[_Entry] = []
        try:
            tops = [e for e in os.scandir(self.root) if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            raise CacheIOError.from_os(exc, self.root) from None
        for top in tops:
            for dirpath, _, files in os.walk(top.path):
                for file in files:
                    path = Path(dirpath, file)
                    try:
                        st = path.stat()
                    except FileNotFoundError:
                        continue
                    rel = path.relative_to(self.root)
                    lock = self.work / rel.parent / f"{rel.name}.lock"
                    pin = self.work / rel.parent / f"{rel.name}.pin"
                    entries.append(_Entry(path, lock, pin, st.st_size, st.st_atime_ns, False))
        for dirpath, _, files in os.walk(self.work):
            for file in files:
                match = _PART_RE.match(file)
                if match is None:
                    continue
                path = Path(dirpath, file)
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                lock = Path(dirpath, f"{match.group(1)}.lock")
                declared = max(int(match.group(2)), st.st_size)
                entries.append(_Entry(path, lock, None, declared, st.st_mtime_ns, True, declared - st.st_size))
        return entries

    def usage_bytes(self) -> int:
        """Bytes the directory holds or has reserved: complete files plus declared sizes of partials."""
        return sum(e.size for e in self._entries())

    def free_bytes(self) -> int:
        """Bytes the file system under the root has free for this process (statvfs)."""
        try:
            fs = os.statvfs(self.root)
        except OSError as exc:
            raise CacheIOError.from_os(exc, self.root) from None
        return fs.f_bavail * fs.f_frsize

    def capacity_bytes(self) -> int:
        """The most the directory could hold: the file system's free bytes plus what it holds now
        (which evictions can free). An upper bound: files others pin cannot be evicted."""
        entries = self._entries()
        return self.free_bytes() + sum(e.size - e.unwritten for e in entries)

    def _space_lock(self) -> int:
        fd = _open_lock(self.work / SPACE_LOCK)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _try_evict(self, entry: _Entry) -> bool:
        """Remove `entry` if nobody holds its locks (pinned, being fetched or evicted): non-blocking."""
        fds: list[int] = []
        try:
            for lock in (entry.lock, entry.pin):
                if lock is None:
                    continue
                fds.append(_open_lock(lock))
                try:
                    fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
            try:
                entry.path.unlink()
            except FileNotFoundError:
                return False
            return True
        finally:
            for fd in fds:
                os.close(fd)  # closing releases the lock

    def _make_room_locked(self, need: int, *, keep: Path | None, url: str) -> None:
        """Under space.lock: evict until `need` more bytes fit the limit and the file system."""
        entries = [e for e in self._entries() if e.path != keep]
        usage = sum(e.size for e in entries)
        fs = os.statvfs(self.root)
        # Downloads in flight have reserved their declared size, but the file system counts only
        # what they wrote so far: the rest of their reservations is not free for this file.
        fs_free = fs.f_bavail * fs.f_frsize - sum(e.unwritten for e in entries)
        over_limit = usage + need - self.limit_bytes if self.limit_bytes is not None else 0
        over_fs = need - fs_free
        if over_limit <= 0 and over_fs <= 0:
            return
        candidates = sorted((e for e in entries if not e.partial), key=lambda e: e.atime_ns)
        candidates += sorted((e for e in entries if e.partial), key=lambda e: e.atime_ns)
        for entry in candidates:
            if over_limit <= 0 and over_fs <= 0:
                return
            if self._try_evict(entry):
                usage -= entry.size
                over_limit -= entry.size
                over_fs -= entry.size  # its bytes on disk and, for a partial, its unwritten reservation
        if over_limit > 0:
            assert self.limit_bytes is not None
            raise DiskLimitError(
                f"the local shard cache {self.root} cannot hold {url} ({need} bytes) within its limit of "
                f"{self.limit_bytes} bytes: {usage} bytes stay in use by files that are pinned or being fetched",
                limit_bytes=self.limit_bytes,
                need_bytes=need,
            )
        if over_fs > 0:
            raise DiskFullError.from_os(
                errno_codes.ENOSPC, self.root, f"the file system cannot hold {url} ({need} bytes) even after evictions"
            )

    def _reserve(self, partial: Path, size: int, url: str) -> None:
        """Create `partial` (declaring `size` bytes) once the space for it is found."""
        fd = self._space_lock()
        try:
            if not partial.exists():
                self._make_room_locked(size, keep=partial, url=url)
                partial.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        finally:
            os.close(fd)

    def make_room(self, need_bytes: int) -> None:
        """Evict unpinned files until `need_bytes` more fit (DiskLimitError / DiskFullError if not)."""
        fd = self._space_lock()
        try:
            self._make_room_locked(need_bytes, keep=None, url=f"{need_bytes} bytes")
        finally:
            os.close(fd)

    # -- pins -----------------------------------------------------------------------------------

    def _pin_table(self) -> dict[Path, list[int]]:
        if self._pins_pid != os.getpid():  # forked: the inherited descriptors are the parent's locks
            for fd, _ in self._pins.values():
                os.close(fd)  # no LOCK_UN: that would release the parent's lock
            self._pins = {}
            self._pins_pid = os.getpid()
        return self._pins

    def _pinned(self, lock: Path) -> bool:
        with self._lock:
            return lock in self._pin_table()

    def _add_pin(self, lock: Path, fd: int) -> None:
        with self._lock:
            table = self._pin_table()
            if lock in table:
                table[lock][1] += 1
                os.close(fd)  # the table's descriptor already holds the shared lock
            else:
                table[lock] = [fd, 1]

    def _unpin(self, lock: Path, *, all_counts: bool = False) -> None:
        with self._lock:
            table = self._pin_table()
            slot = table.get(lock)
            if slot is None:
                return
            slot[1] -= 1
            if slot[1] > 0 and not all_counts:
                return
            del table[lock]
        fcntl.flock(slot[0], fcntl.LOCK_UN)
        os.close(slot[0])

    def pinned_count(self) -> int:
        with self._lock:
            return len(self._pin_table())

    def release_all(self) -> None:
        """Drop every pin this process holds."""
        with self._lock:
            table = self._pin_table()
            slots = list(table.values())
            table.clear()
        for fd, _ in slots:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    close = release_all


class Mirror:
    """The local copy of one remote cache under a NodeCache; see the module docstring."""

    def __init__(self, cache: NodeCache, store: ObjectStore, version: str) -> None:
        self.cache = cache
        self.store = store
        self.version = version
        url = store.location.url
        digest = hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:20]
        slug = _SLUG_RE.sub("_", store.location.name or store.location.bucket)[:48]
        self.dir = cache.root / f"{slug}-{digest}"
        self.work = cache.work / self.dir.name
        try:
            self.dir.mkdir(exist_ok=True)
            self.work.mkdir(exist_ok=True)
            source = self.work / SOURCE_FILE
            if not source.exists():
                tmp = self.work / f".{SOURCE_FILE}.{os.getpid()}.{threading.get_ident()}"
                tmp.write_text(json.dumps({"url": url, "version": version}) + "\n")
                os.replace(tmp, source)
        except OSError as exc:
            raise CacheIOError.from_os(exc, self.dir, f"cannot create the local mirror of {url}") from None

    def __repr__(self) -> str:
        return f"Mirror({self.store.location.url!r} -> {str(self.dir)!r})"

    # -- names ----------------------------------------------------------------------------------

    def path(self, name: str) -> Path:
        """Where file `name` is (or will be) in the mirror."""
        return self.dir / relative_name(name)

    def _lock_path(self, rel: str) -> Path:
        return self.work / f"{rel}.lock"

    def _pin_path(self, rel: str) -> Path:
        return self.work / f"{rel}.pin"

    def _partial_path(self, rel: str, size: int) -> Path:
        return self.work / f"{rel}.part-{size}"

    def has(self, name: str, size: int | None = None) -> bool:
        """True when `name` is complete in the mirror (of `size` bytes, when given)."""
        return _complete(self.path(name), size)

    # -- ensure ---------------------------------------------------------------------------------

    def ensure(
        self,
        name: str,
        *,
        size: int | None,
        sha256: str | None,
        pin: bool = False,
        max_bytes: int = DEFAULT_SMALL_MAX_BYTES,
    ) -> Path:
        """The local path of `name`, complete and verified: downloaded (once per node) if missing.

        `size` is the file's byte length (None when unknown: the file is then fetched whole,
        bounded by `max_bytes`, and any present copy is taken as complete); `sha256` its lowercase
        hex digest (None: size only). `pin=True` keeps a shared lock on it until `unpin`."""
        rel = relative_name(name)
        _check_digest(sha256)
        final = self.dir / rel
        if not pin and _complete(final, size):
            _touch(final)
            return final

        def fetch() -> None:
            self._fetch(rel, final, size, sha256, max_bytes)

        return self._hold(rel, final, size, pin, fetch)

    def install(self, name: str, data: bytes, *, sha256: str | None = None, pin: bool = False) -> Path:
        """Place bytes the caller already fetched (e.g. manifest.json) as file `name`, with the
        same atomic, verified path as a download; a complete copy already there is kept."""
        rel = relative_name(name)
        _check_digest(sha256)
        final = self.dir / rel

        def place() -> None:
            self._place(rel, final, data, sha256)

        return self._hold(rel, final, len(data), pin, place)

    def _hold(self, rel: str, final: Path, size: int | None, pin: bool, produce: Callable[[], None]) -> Path:
        """`final`, complete: produced under the file's exclusive fetch lock unless present; with
        `pin`, a shared pin lock is taken first and kept (handed to the pin table), so no eviction
        can slip in between the check and the pin."""
        pin_lock = self._pin_path(rel)
        if pin and self.cache._pinned(pin_lock):
            if _complete(final, size):
                extra = _open_lock(pin_lock)
                fcntl.flock(extra, fcntl.LOCK_SH)
                self.cache._add_pin(pin_lock, extra)
                _touch(final)
                return final
            self.cache._unpin(pin_lock, all_counts=True)  # removed behind our back: a stale pin
        pin_fd = _open_lock(pin_lock) if pin else None
        try:
            if pin_fd is not None:
                fcntl.flock(pin_fd, fcntl.LOCK_SH)
            if not _complete(final, size):
                fd = _open_lock(self._lock_path(rel))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # waits only for another fetch of this file
                    if not _complete(final, size):
                        produce()
                finally:
                    os.close(fd)  # releases the fetch lock
            _touch(final)
            if pin_fd is not None:
                self.cache._add_pin(pin_lock, pin_fd)
                pin_fd = None  # the pin table owns it
            return final
        finally:
            if pin_fd is not None:
                os.close(pin_fd)  # releases the pin lock

    def _fetch(self, rel: str, final: Path, size: int | None, sha256: str | None, max_bytes: int) -> None:
        """Under the file's exclusive lock: download, verify and publish `rel`."""
        if size is None:
            self._place(rel, final, self.store.get(rel, max_bytes=max_bytes), sha256)
            return
        url = self.store.url_of(rel)
        partial = self._partial_path(rel, size)
        self._drop_other_partials(rel, partial)
        self._os(lambda: self.cache._reserve(partial, size, url), url, partial)
        for attempt in (1, 2):
            have = self._os(lambda: partial.stat().st_size, url, partial)
            if have > size:
                self._os(lambda: os.truncate(partial, 0), url, partial)
                have = 0
            try:
                self.store.download(rel, partial, start=have, size=size)
            except DiskFullError:
                partial.unlink(missing_ok=True)
                raise DiskFullError.from_os(
                    errno_codes.ENOSPC, self.cache.root, f"while downloading {url} ({size} bytes)"
                ) from None
            except IntegrityError:
                partial.unlink(missing_ok=True)
                raise
            digest = self._os(lambda: _sha256_file(partial), url, partial) if sha256 is not None else None
            if digest == sha256:
                self._publish(partial, final, url)
                return
            if attempt == 2:
                partial.unlink(missing_ok=True)
                raise IntegrityError(
                    f"{url}: sha256 {digest} after downloading it twice, the cache's manifest says {sha256}"
                )
            self._os(lambda: os.truncate(partial, 0), url, partial)  # a bad copy: fetch it again from byte 0

    def _place(self, rel: str, final: Path, data: bytes, sha256: str | None) -> None:
        url = self.store.url_of(rel)
        if sha256 is not None:
            digest = hashlib.sha256(data).hexdigest()
            if digest != sha256:
                raise IntegrityError(f"{url}: sha256 {digest}, the cache's manifest says {sha256}")
        partial = self._partial_path(rel, len(data))
        self._drop_other_partials(rel, partial)
        self._os(lambda: self.cache._reserve(partial, len(data), url), url, partial)

        def write() -> None:
            with open(partial, "wb") as f:
                f.write(data)

        try:
            self._os(write, url, partial)
        except DiskFullError:
            partial.unlink(missing_ok=True)
            raise
        self._publish(partial, final, url)

    def _publish(self, partial: Path, final: Path, url: str) -> None:
        def publish() -> None:
            fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(partial, final)
            _fsync_dir(final.parent)

        self._os(publish, url, partial)

    def _drop_other_partials(self, rel: str, keep: Path) -> None:
        parent = (self.work / rel).parent
        stem = Path(rel).name
        try:
            names = os.listdir(parent)
        except FileNotFoundError:
            return
        for entry in names:
            match = _PART_RE.match(entry)
            if match and match.group(1) == stem and parent / entry != keep:
                (parent / entry).unlink(missing_ok=True)

    def _os(self, action: Callable[[], _T], url: str, path: Path) -> _T:
        """Run a local file operation; ENOSPC becomes DiskFullError naming the root, other OS errors CacheIOError."""
        try:
            return action()
        except OSError as exc:
            if isinstance(exc, CacheIOError):
                raise
            if exc.errno in (errno_codes.ENOSPC, errno_codes.EDQUOT):
                raise DiskFullError.from_os(exc, self.cache.root, f"while fetching {url}") from None
            raise CacheIOError.from_os(exc, path, f"while fetching {url}") from None

    # -- pins and eviction ----------------------------------------------------------------------

    def pin(self, name: str) -> bool:
        """Pin `name` if it is complete in the mirror (True), without fetching it."""
        rel = relative_name(name)
        final = self.dir / rel
        lock = self._pin_path(rel)
        fd = _open_lock(lock)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not _complete(final, None):
            os.close(fd)
            return False
        self.cache._add_pin(lock, fd)
        return True

    def unpin(self, name: str) -> None:
        """Drop one pin of `name` taken by this process."""
        self.cache._unpin(self._pin_path(relative_name(name)))

    def evict(self, names: Iterable[str]) -> int:
        """Remove these complete files from the mirror unless another process holds them (pinned
        or being fetched: those are skipped); this process's own pins on them are dropped first.
        Returns the bytes removed."""
        freed = 0
        for name in names:
            rel = relative_name(name)
            pin = self._pin_path(rel)
            self.cache._unpin(pin, all_counts=True)
            final = self.dir / rel
            try:
                size = final.stat().st_size
            except FileNotFoundError:
                continue
            if self.cache._try_evict(_Entry(final, self._lock_path(rel), pin, size, 0, False)):
                freed += size
        return freed


def _complete(path: Path, size: int | None) -> bool:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    return size is None or st.st_size == size


def _touch(path: Path) -> None:
    """Set the access time (the eviction order), keeping the modification time readers rely on."""
    try:
        st = path.stat()
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except OSError:
        pass


def _check_digest(sha256: str | None) -> None:
    if sha256 is not None and not _SHA256_RE.match(sha256):
        raise ConfigError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}")
