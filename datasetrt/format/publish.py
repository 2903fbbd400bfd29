"""Publication of staged caches: the per-name staging lock and directory, and the batched
sync-then-rename that makes caches appear at <base>/<name> complete or not at all.

Boundary: directories, locks and durability calls only; knows no record, shard or manifest
layout (format/shards.py writes the files a `Staged` lists). The protocol, in the order a write
takes it (the writer's module docstring has the whole write):
  1. `Staging.acquire`: an exclusive flock on <base>/tmp/.<name>.lock (`lock_file_name`: hashed
     when the name is too long), then a fresh <base>/tmp/<name>/ (a stale one, whose writer died
     and left its lock free, is removed first); a second writer of the name fails fast;
  2. the writer stages every file there, manifest last, and hands a `Staged` to the `Publisher`;
  3. per batch, `Publisher.flush`: every file and directory durable at once, then renames in
     input order with RENAME_NOREPLACE, one fsync of <base>, and the locks released;
  4. `remove_empty_staging_root` when the write leaves <base>/tmp empty.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import time
from pathlib import Path

from datasetrt.errors import CacheIOError, SourceError, os_error_text
from datasetrt.format.durable import SYNCFS_REPORTS_ERRORS, fsync_path, fsync_paths, rename_noreplace, syncfs
from datasetrt.format.layout import STAGING_DIR
from datasetrt.format.overwrite import publish_over
from datasetrt.format.profile import StageProfile
from datasetrt.format.results import CacheWriteError, CacheWriteResult, CacheWriteSuccess


class Staging:
    """The exclusive per-name writer lock and the fresh, empty staging dir <base>/tmp/<name>
    (a stale one, whose writer died and left its lock free, is removed first).

    Held from `acquire()` until `release()` — across the publisher's batch, so no other writer
    of the name can take the staging dir for stale while it waits to be published. `release()`
    removes the staging dir (already renamed away when published), unlinks and unlocks.
    """

    def __init__(self, base: Path, name: str) -> None:
        self.base, self.name = base, name
        self.root = base / STAGING_DIR
        self.path = self.root / name
        self.lock_path = self.root / lock_file_name(name)
        self._fd: int | None = None

    def acquire(self) -> Path:
        while True:
            try:
                self._fd = _lock_file(self.lock_path, self.name, self.base)
                break
            except FileNotFoundError:  # no staging root yet (or another writer just removed the empty one)
                self.root.mkdir(parents=True, exist_ok=True)
        try:
            try:
                self.path.mkdir()
            except FileExistsError:
                _remove(self.path)  # stale: its writer died (its lock is free)
                self.path.mkdir()
        except BaseException:
            self.release()
            raise
        return self.path

    def drop_if_stale(self) -> None:
        """For a name whose cache is published: remove the lock file (and staging dir) a writer
        killed after its rename left behind, so the staging root can become empty again. A lock
        someone holds is left alone; nothing is created."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return  # no lock file (the usual case), or not ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine = os.fstat(fd)
            current = os.stat(self.lock_path)
        except OSError:  # held by a live writer, or unlinked meanwhile by its holder
            os.close(fd)
            return
        if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)
            return
        self._fd = fd
        self.release()

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            _remove(self.path)
            try:
                os.unlink(self.lock_path)
            except FileNotFoundError:
                pass
        finally:
            os.close(self._fd)
            self._fd = None


def remove_empty_staging_root(base: Path) -> None:
    """Remove <base>/tmp when it is empty (dataset-rt leaves it; it is no cache and nothing reads
    it). rmdir is atomic and refuses a non-empty directory, and every writer using the root keeps
    its lock file in it from before it stages until after it has published, so this never removes
    a root another writer (of this process or another) is using; a writer that created the root
    and lost it before creating its lock file retries (`Staging.acquire`)."""
    try:
        os.rmdir(base / STAGING_DIR)
    except OSError:
        pass  # not empty (another writer, a stale staging dir of a killed one), absent, or not ours to remove


def lock_file_name(name: str) -> str:
    """`.<name>.lock`, or `.<sha256 hex of name>.lock` when that would exceed NAME_MAX (255 bytes),
    so every name dataset-rt accepts (up to 255 bytes) can be locked."""
    lock = f".{name}.lock"
    if len(lock.encode("utf-8")) > 255:
        lock = f".{hashlib.sha256(name.encode('utf-8')).hexdigest()}.lock"
    return lock


def _lock_file(lock_path: Path, name: str, base: Path) -> int:
    """Open and exclusively flock the lock file; return its fd.

    The holder unlinks the lock file before releasing it, so a writer that opened the old inode
    could otherwise win a lock nobody else can see while a third writer locks a new file of the
    same name. After locking we therefore check that the path still names our inode, and retry
    on the current file if it does not.
    """
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SourceError(f"another process is writing cache {name!r} into {base.absolute()}") from None
            try:
                current = os.stat(lock_path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # stale inode: its holder unlinked it; lock the current file instead


def _remove(path: Path) -> None:
    """Remove a file, symlink or directory tree at `path`, if anything is there (one lstat when not)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def io_error_message(exc: OSError) -> str:
    """A write result's message for `exc`: `CacheIOError.from_os`'s text naming the file the OS
    named, or without a path when it named none."""
    if exc.filename:
        return str(CacheIOError.from_os(exc, exc.filename))
    return f"I/O error: {os_error_text(exc)}"


class Staged:
    """A cache whose files are all written under its staging dir (manifest last), waiting in the
    publisher's batch to be made durable and renamed into place. Holds its staging lock."""

    __slots__ = ("name", "target", "staging", "files", "nbytes", "profile")

    def __init__(
        self, name: str, target: Path, staging: Staging, files: list[Path], nbytes: int, profile: StageProfile
    ) -> None:
        self.name, self.target, self.staging, self.profile = name, target, staging, profile
        self.files, self.nbytes = files, nbytes


class Publisher:
    """Makes staged caches durable and publishes them, a batch at a time, in input order.

    Crash safety (docs/storage-format.md): a cache is renamed to <base>/<name> only after every
    file and directory of it is durable, so after a crash at any point <base>/<name> is absent or
    complete; a killed writer's staging dirs are stale and replaced by the next writer. What
    batching changes is only how often the disk is waited for: once per batch of up to
    `BATCH_CACHES` caches / `BATCH_BYTES` bytes instead of ~8 fsyncs per cache:

      1. sync the batch: one syncfs(2) of the filesystem of <base> where it reports errors
         (Linux >= 5.8) and the batch holds `SYNCFS_MIN_CACHES` or more caches, else fsync of
         every file and directory of the batch, concurrently;
      2. rename each staging dir to its target (RENAME_NOREPLACE), in input order;
      3. one fsync of <base>, which makes all the renames durable;
      4. release the staging locks (held since staging, so no writer of the same name takes a
         waiting staging dir for stale).
    A sync error fails every cache of the batch (I/O error value); a target created meanwhile
    fails that cache alone ("cache path already exists"), unless `if_exists` says otherwise
    (format/overwrite.py: keep an identical cache, or exchange). Results are filled into `results`
    (position -> CacheWriteResult) as batches publish. Holds one lock fd per waiting cache.
    """

    BATCH_CACHES = 128
    BATCH_BYTES = 64 << 20
    # syncfs also waits for every other process's dirty data on the filesystem, so a batch of few
    # caches (one large cache, the tail of a write) fsyncs its own files instead.
    SYNCFS_MIN_CACHES = 16

    def __init__(self, base: Path, results: list, if_exists: str = "error") -> None:
        self.base = base
        self.results = results
        self.if_exists = if_exists
        self.pending: list[tuple[int, Staged]] = []
        self.pending_bytes = 0
        self._base_fd: int | None = None  # <base>, opened before the batch's first write (for syncfs)

    def begin(self) -> None:
        """Called before a source is staged: the batch's syncfs descriptor is opened before any
        of its files is written, so syncfs reports every writeback error of the batch (the
        filesystem's error state is sampled when the descriptor is opened)."""
        if SYNCFS_REPORTS_ERRORS and self._base_fd is None:
            # <base>, not the staging root (another writer may remove an empty one at any time):
            # the same filesystem, as staging dirs are renamed from one into the other.
            self._base_fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        fd, self._base_fd = self._base_fd, None
        if fd is not None:
            os.close(fd)

    def add(self, position: int, staged: Staged) -> None:
        self.pending.append((position, staged))
        self.pending_bytes += staged.nbytes
        if len(self.pending) >= self.BATCH_CACHES or self.pending_bytes >= self.BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        batch, self.pending, self.pending_bytes = self.pending, [], 0
        if not batch:
            return
        start = time.perf_counter_ns()
        try:
            try:
                self._sync(batch)
            except OSError as exc:
                message = io_error_message(exc)
                for position, staged in batch:
                    self.results[position] = CacheWriteError(staged.name, message)
                return
            published = False
            for position, staged in batch:
                try:
                    rename_noreplace(staged.staging.path, staged.target)
                except FileExistsError:
                    result: CacheWriteResult = publish_over(
                        staged.staging.path, staged.target, staged.name, self.if_exists
                    )
                    published = published or isinstance(result, CacheWriteSuccess)
                except OSError as exc:
                    result = CacheWriteError(staged.name, io_error_message(exc))
                else:
                    result, published = CacheWriteSuccess(staged.name, staged.target), True
                self.results[position] = result
                staged.staging.release()  # its staging dir is renamed away (or failed): unlock now
            if published:
                try:
                    fsync_path(self.base)
                except OSError as exc:  # renamed, but not known to be durable: report it as such
                    message = io_error_message(exc)
                    for position, staged in batch:
                        if isinstance(self.results[position], CacheWriteSuccess):
                            self.results[position] = CacheWriteError(staged.name, message)
        finally:
            for _, staged in batch:
                staged.staging.release()
            share = (time.perf_counter_ns() - start) // len(batch)
            for _, staged in batch:
                staged.profile.add("publish", share)

    def _sync(self, batch: list[tuple[int, Staged]]) -> None:
        fd, self._base_fd = self._base_fd, None  # the next batch samples the error state anew
        try:
            if fd is not None and len(batch) >= self.SYNCFS_MIN_CACHES:
                syncfs(fd)
            else:
                fsync_paths([path for _, staged in batch for path in staged.files])
        finally:
            if fd is not None:
                os.close(fd)
