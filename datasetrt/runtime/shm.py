"""Shared memory of reader runs: anonymous memory files (memfd) passed to workers as descriptors.

Boundary: descriptors and mappings; knows nothing of records, tables or runs' contents.

Ownership: no shared memory of a run ever has a name. The parent creates each file with
`memfd_create` (it appears only as `/memfd:datasetrt-<pid>-<what> (deleted)` in the maps and fd
lists of the processes that hold it), maps it, and hands the descriptor to each worker over the
worker's task socket (SCM_RIGHTS, `send_fd` / `recv_fd`); the worker maps it and closes the
descriptor. The memory is freed by the kernel when the last mapping and descriptor are gone,
whichever process goes last and however it ends (exit, exception, SIGTERM, SIGKILL): nothing in
/dev/shm or any file system can outlive its owners, so nothing needs unlinking or sweeping.
Nothing is registered with the `multiprocess` resource tracker (the zygote is spawned without
one: `launch._LeanSpawnPopen`).

Reservation: a file's size is checked when it is created against what the kernel can give now
(`memory.reservable_bytes`: available memory and swap, within the memory cgroup's limit),
because past that a reservation does not fail: the OOM killer ends some process. Its pages are
reserved (posix_fallocate) either all at creation or, for a ring (`reserve=False`), range by
range with `reserve_shared_memory` before any process touches the range (`Ring.acquire`: a slot
at its first lease), so a run pays for the slots it uses, never a page fault on an unreserved
page. A refusal, a failed reservation or mapping is a `ResourceLimitError` naming the sizes; running out of descriptors (EMFILE, ENFILE) gives back
the process's unused shard descriptors (`descriptors.BUDGET.relieve`) and tries once more, then
is a `CacheIOError` whose `errno` says which. Memfds are not in /dev/shm and its size does not
limit them.

`sweep_stale_runs()` (at every pool launch) is the backstop for `/dev/shm/datasetrt-<pid>-*`
directories that releases before this one created (one per run, named, removed by the parent):
it removes those whose owner pid is gone.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import resource
import shutil
import socket
from pathlib import Path

from datasetrt.errors import CacheIOError, ResourceLimitError, os_error_text
from datasetrt.runtime.descriptors import BUDGET
from datasetrt.runtime.memory import SHM_DIR, reservable_bytes

RUN_PREFIX = "datasetrt-"
_RUN_RE = re.compile(r"^datasetrt-(\d+)-[0-9a-f]+$")


def sweep_stale_runs(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove run directories whose creating process no longer exists; returns what was removed."""
    import psutil  # lazily: only the parent sweeps; workers import what they use

    removed: list[Path] = []
    try:
        entries = list(shm_dir.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _RUN_RE.match(entry.name)
        if m and not psutil.pid_exists(int(m.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def create_shared_memory(what: str, size: int, reserve: bool = True) -> tuple[mmap.mmap, int]:
    """An anonymous shared file of `size` bytes, mapped read-write: (mapping, descriptor). With
    `reserve` its pages are reserved now (posix_fallocate: a typed error now, not SIGBUS later);
    without, the caller reserves each range with `reserve_shared_memory` before any process
    touches it. The caller owns the descriptor (close it once no worker needs it any more);
    `what` names it in /proc maps.

    Refused before anything is reserved when `size` exceeds what the kernel can give now
    (ResourceLimitError); a descriptor shortage is a CacheIOError (module docstring)."""
    label = f"{RUN_PREFIX}{os.getpid()}-{what}"
    if size:
        room = reservable_bytes()
        if room is not None and size > room:
            raise ResourceLimitError(
                f"cannot reserve {size / 2**20:.1f} MiB of shared memory for the reader's {what}: the kernel "
                f"can give {room / 2**20:.1f} MiB now (available memory and swap, within the memory cgroup's "
                "limit); lower prefetch_size / num_workers, or free memory"
            )
    fd = _memfd(label)
    try:
        if size and reserve:
            reserve_shared_memory(fd, 0, size, what)
        elif size:
            try:
                os.ftruncate(fd, size)  # sized, no page allocated yet
            except OSError as exc:
                raise ResourceLimitError(
                    f"cannot reserve {size / 2**20:.1f} MiB of shared memory for the reader's {what}: "
                    f"{os_error_text(exc)}; lower prefetch_size / num_workers"
                ) from None
        try:
            return mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE), fd
        except OSError as exc:
            raise ResourceLimitError(
                f"cannot map {size / 2**20:.1f} MiB of shared memory for the reader's {what}: "
                f"{os_error_text(exc)}; lower prefetch_size / num_workers"
            ) from None
    except BaseException:
        os.close(fd)
        raise


def reserve_shared_memory(fd: int, offset: int, length: int, what: str) -> None:
    """Reserve the pages of bytes [offset, offset+length) of shared file `fd` (posix_fallocate;
    the file grows to cover them if it is shorter). ResourceLimitError naming the size when the
    kernel refuses (ENOSPC under strict overcommit, EFBIG past RLIMIT_FSIZE)."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        raise ResourceLimitError(
            f"cannot reserve {length / 2**20:.1f} MiB of shared memory for the reader's {what}: "
            f"{os_error_text(exc)}; lower prefetch_size / num_workers"
        ) from None


_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)


def _memfd(label: str) -> int:
    """memfd_create(label); out of descriptors, once more after the process's unused shard
    descriptors are closed. CacheIOError (path `memfd:<label>`) when it still fails."""
    for attempt in (0, 1):
        try:
            return os.memfd_create(label, os.MFD_CLOEXEC)
        except OSError as exc:
            if attempt == 0 and exc.errno in _OUT_OF_FDS:
                BUDGET.relieve()
                continue
            raise CacheIOError.from_os(exc, f"memfd:{label}", _memfd_hint(exc)) from None
    raise AssertionError("unreachable")


def _memfd_hint(exc: OSError) -> str:
    if exc.errno == errno.EMFILE:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f"cannot create the reader's shared memory: this process has no descriptor left (RLIMIT_NOFILE "
            f"soft limit {soft}, after closing unused shard files); raise `ulimit -n` or close descriptors"
        )
    if exc.errno == errno.ENFILE:
        return "cannot create the reader's shared memory: the system's file table is full (fs.file-max)"
    return "cannot create the reader's shared memory"


def attach_shared_memory(fd: int, writable: bool) -> mmap.mmap:
    """Map a shared file received from the parent (workers); closes `fd` (the mapping keeps the
    memory alive)."""
    try:
        size = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)


def send_fd(conn, fd: int) -> None:
    """Send a duplicate of `fd` over `conn` (a `multiprocess` Connection on a Unix socket) as one
    byte with SCM_RIGHTS; the receiver calls `recv_fd` before reading its next message."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn.fileno())
    try:
        socket.send_fds(sock, [b"F"], [fd])
    finally:
        sock.detach()  # the Connection keeps its descriptor


def recv_fd(conn) -> int:
    """The descriptor `send_fd` sent (close-on-exec). EOFError when the sender is gone."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn.fileno())
    try:
        data, fds, flags, _addr = socket.recv_fds(sock, 1, 1, socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.detach()
    if not data:
        raise EOFError("the parent closed the task socket")
    if data != b"F" or len(fds) != 1 or flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        raise OSError(f"expected one shared-memory descriptor from the parent, got {len(fds)} (flags {flags:#x})")
    return fds[0]
