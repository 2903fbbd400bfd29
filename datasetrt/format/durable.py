"""Durable file primitives for publication: fsync of files and directories (one by one, many at
once, or the whole filesystem with syncfs), no-replace rename.

Boundary: POSIX calls only; knows nothing of caches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    _sync_file_range.restype = ctypes.c_int
_SYNC_FILE_RANGE_WRITE = 2
_syncfs = getattr(_libc, "syncfs", None)
if _syncfs is not None:
    _syncfs.argtypes = (ctypes.c_int,)
    _syncfs.restype = ctypes.c_int
SYNC_THREADS = 32  # fsyncs in flight at once in fsync_paths (they wait on the disk, not the CPU)


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        release = os.uname().release.split("-")[0].split(".")
        return (int(release[0]), int(release[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


# syncfs reports writeback errors (of the filesystem, since the fd was opened) only since Linux 5.8;
# before that it returned 0 even when data was lost, so it cannot replace fsync there.
SYNCFS_REPORTS_ERRORS = _syncfs is not None and _kernel_at_least(5, 8)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing [offset, offset + nbytes) of fd to disk now, without
    waiting (Linux sync_file_range(SYNC_FILE_RANGE_WRITE)); a no-op where unavailable.

    Only a hint that spreads the disk writes over the time the file is being written, so the
    fsync that closes the file has little left to flush. It is not a durability step and never
    replaces that fsync (an I/O error here is reported by the fsync too, so failures are ignored).
    """
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path (directories make renames and creations durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(fd: int) -> None:
    """Make everything written to the filesystem holding `fd` durable: data, inodes and directory
    entries, one journal commit (Linux syncfs(2)). Raises OSError for a writeback error on that
    filesystem since `fd` was opened. Only where SYNCFS_REPORTS_ERRORS (callers check)."""
    if _syncfs is None:
        raise RuntimeError("syncfs(2) is not available here: callers check SYNCFS_REPORTS_ERRORS first")
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def fsync_paths(paths: Sequence[Path]) -> None:
    """fsync every file and directory of `paths`, up to SYNC_THREADS at once (concurrent fsyncs
    share journal commits); re-raises the first OSError after all have finished."""
    if len(paths) <= 1:
        for path in paths:
            fsync_path(path)
        return
    with ThreadPoolExecutor(max_workers=min(SYNC_THREADS, len(paths)), thread_name_prefix="datasetrt-fsync") as pool:
        futures = [pool.submit(fsync_path, path) for path in paths]
    for future in futures:
        future.result()


def rename_noreplace(src: Path, dst: Path) -> None:
    """Atomically rename src to dst, failing with FileExistsError if dst exists (even empty).

    Uses renameat2(RENAME_NOREPLACE) where the kernel and filesystem have it; otherwise falls back
    to a check-then-rename, which is atomic only against writers that use this same function
    under the per-name staging lock (the writer holds it).
    """
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(src))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)
