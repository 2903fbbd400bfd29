"""Shared-memory files of one reader run: a directory under /dev/shm owned by the parent.

Boundary: files and mappings; knows nothing of records or tables.

Ownership: the parent creates `/dev/shm/datasetrt-<pid>-<token>/`, every file in it (today the
run's ring), and removes it (normal end, exception, abandoned iterator, interrupt, runtime
close). Workers only map its files read-write and never unlink. Nothing is registered with the
`multiprocess` resource tracker (the zygote is spawned without one: `pool._LeanSpawnPopen`). A
parent killed with SIGKILL leaves its directory behind; the next `sweep_stale_runs()` (at every
runtime start) removes directories whose owner pid is gone.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import shutil
from pathlib import Path


from datasetrt.runtime.memory import SHM_DIR

RUN_PREFIX = "datasetrt-"
_RUN_RE = re.compile(r"^datasetrt-(\d+)-[0-9a-f]+$")


def new_run_dir(shm_dir: Path = SHM_DIR) -> Path:
    """Create a fresh, private run directory (mode 0700)."""
    path = shm_dir / f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    path.mkdir(mode=0o700)
    return path


def remove_run_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale_runs(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove run directories whose creating process no longer exists; returns what was removed."""
    import psutil  # lazily: only the parent sweeps; workers import what they use

    removed = []
    try:
        entries = list(shm_dir.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _RUN_RE.match(entry.name)
        if m and not psutil.pid_exists(int(m.group(1))):
            remove_run_dir(entry)
            removed.append(entry)
    return removed


def create_shared_file(path: Path, size: int) -> mmap.mmap:
    """Create `path` of `size` bytes with its pages reserved (posix_fallocate: ENOSPC now, not
    SIGBUS later), and map it read-write."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        if size:
            os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def attach_shared_file(path: Path, writable: bool) -> mmap.mmap:
    """Map an existing run file (workers)."""
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)
