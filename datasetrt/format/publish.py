"""Publication of staged caches: the per-name staging lock and directory, and the batched
sync-then-rename that makes caches appear at <base>/<name> complete or not at all.

Boundary: directories, locks and durability calls only; knows no record, shard or manifest
layout (format/shards.py writes the files a `Staged` lists). The protocol, in the order a write
takes it (the writer's module docstring has the whole write):
  1. `Staging.acquire`: an exclusive flock on <base>/tmp/.<name>.lock (`lock_file_name`: hashed
     when the name is too long), then a fresh <base>/tmp/<name>/ (a stale one, whose writer died
     and left its lock free, is removed first); a second writer of the name fails fast. A lock
     file is created locked (made unnamed, flocked, then linked into place), so a flock that
     fails leaves no file behind;
  2. the writer stages every file there, manifest last, and hands a `Staged` to the `Publisher`;
  3. per batch, `Publisher.flush`: every file and directory durable at once, then renames in
     input order with RENAME_NOREPLACE, one fsync of <base>, and the locks released;
  4. `remove_empty_staging_root` when the write leaves <base>/tmp empty.

Failures after a rename never unpublish or misreport a cache: when the fsync of <base> fails,
each renamed cache is a `CacheWriteSuccess(durable=False)` and a marker <base>/tmp/.<name>.unsynced
(naming the published directory's device and inode) lets the next write of the name fsync <base>
again and report the same cache (`confirm_published`). Releasing a lock never raises: its
descriptor is closed exactly once, and a lock file whose unlink failed is a free lock the next
writer of the name takes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
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
    removes the staging dir (already renamed away when published), unlinks and unlocks; it is
    idempotent and raises no OSError (module docstring).
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
        """Remove the staging dir and the lock file, then unlock; best effort, raises no OSError.

        The descriptor is taken before anything can fail and closed exactly once: close(2)
        releases it even when it reports an error (EIO), and closing the same number again could
        close a descriptor another thread has been given since. A lock file whose unlink fails
        stays behind unlocked: the next writer of the name locks and removes it, and a write that
        finds the name published drops it (`drop_if_stale`)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            try:
                _remove(self.path)
            except OSError:
                pass  # a stale staging dir: the next writer of the name replaces it
            try:
                os.unlink(self.lock_path)
            except OSError:
                pass  # absent, or it stays as a free lock (see above)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass  # released all the same (and with it the lock)

    def mark_unconfirmed(self, target: Path) -> None:
        """Record that `target` was published by this write but the fsync of <base> that makes
        its rename durable failed (`confirm_published` reads it). Best effort: without the marker
        a later write of the name reports "cache path already exists"."""
        try:
            st = os.lstat(target)
            fd = os.open(
                self.root / unconfirmed_file_name(self.name),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                0o644,
            )
        except OSError:
            return
        try:
            os.write(fd, f"{st.st_dev}:{st.st_ino}\n".encode())
        except OSError:
            pass
        finally:
            try:
                os.close(fd)
            except OSError:
                pass


def confirm_published(base: Path, name: str, target: Path) -> CacheWriteSuccess | None:
    """For a name whose `target` exists: when an earlier write published this very directory but
    could not confirm its rename durable (its marker names the directory's device and inode),
    fsync <base> again and report the cache: durable when that fsync succeeds (the marker is then
    removed), else `durable=False` again. None when no marker names `target` (the usual "cache
    path already exists"); a marker naming another directory is stale and removed.

    On a journaling file system (ext4, xfs, btrfs) a failed journal commit aborts the journal and
    fails every later fsync, so an fsync that succeeds now has made the earlier rename durable.
    The source is not read again."""
    marker = base / STAGING_DIR / unconfirmed_file_name(name)
    try:
        recorded = marker.read_text().strip()
        st = os.lstat(target)
    except (OSError, UnicodeDecodeError):
        return None
    if recorded != f"{st.st_dev}:{st.st_ino}":
        marker.unlink(missing_ok=True)
        return None
    try:
        fsync_path(base)
    except OSError:
        return CacheWriteSuccess(name, target, durable=False)
    try:
        marker.unlink(missing_ok=True)
    except OSError:
        pass  # durable all the same; the next write of the name fsyncs once more
    return CacheWriteSuccess(name, target)


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
    return _private_name(name, "lock")


def unconfirmed_file_name(name: str) -> str:
    """`.<name>.unsynced` (hashed as `lock_file_name` when too long): the marker of a cache
    published without a confirmed fsync of <base> (`Staging.mark_unconfirmed`)."""
    return _private_name(name, "unsynced")


def _private_name(name: str, suffix: str) -> str:
    private = f".{name}.{suffix}"
    if len(private.encode("utf-8")) > 255:
        private = f".{hashlib.sha256(name.encode('utf-8')).hexdigest()}.{suffix}"
    return private


def _lock_file(lock_path: Path, name: str, base: Path) -> int:
    """Open and exclusively flock the lock file; return its fd.

    The holder unlinks the lock file before releasing it, so a writer that opened the old inode
    could otherwise win a lock nobody else can see while a third writer locks a new file of the
    same name. After locking we therefore check that the path still names our inode, and retry
    on the current file if it does not. A missing lock file is created already locked
    (`_create_locked`; where the file system has no hard links, by name as dataset-rt does, and a
    failed flock then leaves it); a lock file that was there before is never removed here, even
    when it cannot be locked (another writer may hold it).
    """
    create_locked = True
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | (0 if create_locked else os.O_CREAT), 0o644)
        except FileNotFoundError:
            if not create_locked:
                raise  # no staging root: `acquire` creates it
            created = _create_locked(lock_path, name, base)  # (no staging root: raises the same)
            if created == _NO_LINKS:
                create_locked = False
                continue
            if created is None:
                continue  # another writer linked its lock file first: contend for that one
            return created
        try:
            _flock(fd, lock_path, name, base)
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


_TMPFILE = getattr(os, "O_TMPFILE", 0) if os.path.isdir("/proc/self/fd") else 0  # 0: named temporaries
_NO_LINKS = -1  # `_create_locked`: the file system makes no hard links (vfat, exFAT, some FUSE)


def _create_locked(lock_path: Path, name: str, base: Path) -> int | None:
    """A new lock file at `lock_path`, flocked before it has that name: an unnamed file in the
    staging root (O_TMPFILE; where the file system has none, a randomly named one removed once
    linked), locked, then hard-linked to `lock_path`, which fails if the name exists. So a lock
    file appears only locked, and a flock that fails (ENOLCK) leaves nothing behind. Returns the
    locked fd, None when another writer's lock file took the name first, or `_NO_LINKS`."""
    root, temp = lock_path.parent, None
    fd = -1
    if _TMPFILE:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # no root: FileNotFoundError
        try:
            fd = os.open(".", _TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644, dir_fd=root_fd)
        except OSError as exc:
            # Another writer removed the (empty) root meanwhile: ext4 refuses to create in a
            # deleted directory with EPERM, where a named create says ENOENT. `acquire` retries.
            if os.fstat(root_fd).st_nlink == 0:
                raise FileNotFoundError(errno.ENOENT, "staging root removed meanwhile", str(root)) from None
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
        finally:
            os.close(root_fd)
    if fd < 0:
        temp = root / f".{secrets.token_hex(8)}.lock-new"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _flock(fd, lock_path, name, base)
        try:
            if temp is not None:
                os.link(temp, lock_path)
            else:  # linkat(2) of the /proc/self/fd entry with AT_SYMLINK_FOLLOW: the unnamed file itself
                proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.link(str(fd), lock_path, src_dir_fd=proc, follow_symlinks=True)
                finally:
                    os.close(proc)
        except FileExistsError:
            os.close(fd)
            return None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP):
                raise
            os.close(fd)
            return _NO_LINKS
        return fd
    except BaseException:
        os.close(fd)
        raise
    finally:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass


def _flock(fd: int, lock_path: Path, name: str, base: Path) -> None:
    """Take the exclusive lock without waiting; a held lock is the "another process" error, any
    other failure (ENOLCK: no lock records, or no lock manager on NFS) an OSError naming the lock
    file."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SourceError(f"another process is writing cache {name!r} into {base.absolute()}") from None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(lock_path)) from None


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
    (format/overwrite.py: keep an identical cache, or exchange); an error of the fsync of <base>
    makes each renamed cache a `CacheWriteSuccess(durable=False)` (published and complete, the
    rename not known durable; marked for the next write of the name: `confirm_published`).
    Results are filled into `results` (position -> CacheWriteResult) as batches publish. Holds
    one lock fd per waiting cache.
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
            published: list[tuple[int, Staged]] = []
            for position, staged in batch:
                try:
                    rename_noreplace(staged.staging.path, staged.target)
                except FileExistsError:
                    result: CacheWriteResult = publish_over(
                        staged.staging.path, staged.target, staged.name, self.if_exists
                    )
                    if isinstance(result, CacheWriteSuccess):  # kept or exchanged: its rename needs the fsync too
                        published.append((position, staged))
                except OSError as exc:
                    result = CacheWriteError(staged.name, io_error_message(exc))
                else:
                    result = CacheWriteSuccess(staged.name, staged.target)
                    published.append((position, staged))
                self.results[position] = result
            if published:
                try:
                    fsync_path(self.base)
                except OSError:  # published and complete, the renames not known durable: say so
                    for position, staged in published:
                        self.results[position] = CacheWriteSuccess(staged.name, staged.target, durable=False)
                        staged.staging.mark_unconfirmed(staged.target)  # under its lock
        finally:
            for _, staged in batch:  # after the fsync of <base>: a marker is written under its lock
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
