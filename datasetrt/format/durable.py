"""Durable file primitives for publication: fsync of files and directories, no-replace rename.

Boundary: POSIX calls only; knows nothing of caches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
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
