"""The memory limit and the one bound formula of the multiprocess reader.

Boundary: psutil / cgroup files and arithmetic; no processes are started here.

    bound = ring_slots x slot_bytes            shared-memory ring of one iterator run, including
                                               the batches the consumer holds (batch runs: at most
                                               held_slots = ring_slots - num_workers leases)
          + slot_bytes                         the chunk being turned into Python objects, or the
                                               batch being copied out of its slot (a consumer
                                               holding more than held_slots batches)
          + num_workers x scratch_bytes        per-worker decode scratch (records runs: slot_bytes;
                                               batch runs: the largest staged run of records)

The reorder window holds ring slots, never copies, so it is inside the first term. The plan needs
no term of its own: the parent writes each task's planned rows into its slot's header (part of
slot_bytes), and the population it plans from is the dataset's own table, not a per-run copy.
Batches a consumer keeps beyond held_slots are private copies it owns (one batch each, outside
the bound, like any object it keeps). A configuration whose bound exceeds the limit is refused
before any process or segment exists (docs/memory-guide.md).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from datasetrt.errors import ResourceLimitError

CGROUP_V2_MAX = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
SHM_DIR = Path("/dev/shm")
MEMINFO = Path("/proc/meminfo")


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value < (1 << 60) else None  # v1 reports "unlimited" as a huge number


def _memory_cgroups(proc_cgroup: Path, root: Path) -> list[tuple[Path, bool]]:
    """The memory-controller directories of this process's cgroup and each of its ancestors, as
    (directory, is_v2), from the paths /proc/self/cgroup names (v2 unified and v1 memory)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    nodes: list[tuple[Path, bool]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2 unified hierarchy
            base, v2 = root, True
        elif "memory" in controllers.split(","):  # cgroup v1 memory controller
            base, v2 = root / "memory", False
        else:
            continue
        node = base / rel.lstrip("/")
        while True:
            nodes.append((node, v2))
            if node == base or base not in node.parents:
                break
            node = node.parent
    return nodes


def cgroup_limit_bytes(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors (v2, else v1).

    Reads this process's own cgroup path from /proc/self/cgroup, so a nested container limit
    is found, not only the one at the mount root. None when unlimited or unknown."""
    limits: list[int] = []
    for node, v2 in _memory_cgroups(proc_cgroup, root):
        value = _read_limit(node / ("memory.max" if v2 else "memory.limit_in_bytes"))
        if value is not None:
            limits.append(value)
    for path in (CGROUP_V2_MAX, CGROUP_V1_LIMIT):  # the mount root: the first file present decides
        if path.exists():
            value = _read_limit(path)
            if value is not None:
                limits.append(value)
            break
    return min(limits) if limits else None


def reservable_bytes(
    meminfo: Path = MEMINFO, proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Shared memory the kernel can give a reservation now (a ring's memfd pages are shmem: RAM,
    or swap): MemAvailable + SwapFree of /proc/meminfo, and at most, in every memory cgroup of
    this process and its ancestors that has a limit, that limit minus its usage plus the file
    cache reclaim would free (active + inactive file pages). None when nothing is known.

    Past it a reservation does not fail cleanly: it waits on reclaim, then the OOM killer picks a
    process of the machine or of the cgroup. (Under strict overcommit, vm.overcommit_memory=2,
    the reservation itself fails with ENOSPC.)"""
    room: int | None = None
    fields = _read_fields(meminfo)
    if "MemAvailable" in fields:
        room = (fields["MemAvailable"] + fields.get("SwapFree", 0)) * 1024  # kB
    for node, v2 in _memory_cgroups(proc_cgroup, root):
        limit = _read_limit(node / ("memory.max" if v2 else "memory.limit_in_bytes"))
        usage = _read_limit(node / ("memory.current" if v2 else "memory.usage_in_bytes"))
        if limit is None or usage is None:
            continue
        stat = _read_fields(node / "memory.stat")
        prefix = "" if v2 else "total_"  # v1: the hierarchical counters
        reclaimable = stat.get(f"{prefix}active_file", 0) + stat.get(f"{prefix}inactive_file", 0)
        headroom = max(0, limit - usage + reclaimable)
        room = headroom if room is None else min(room, headroom)
    return room


def _read_fields(path: Path) -> dict[str, int]:
    """`name value` (or `Name: value kB`) lines of a /proc or cgroup stat file; {} when unreadable."""
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def available_memory_bytes() -> int:
    """Memory available to this process: min(physical memory, cgroup limit)."""
    import psutil  # lazily: reader workers import this module only for SHM_DIR

    physical = psutil.virtual_memory().total
    limit = cgroup_limit_bytes()
    return min(physical, limit) if limit is not None else physical


def default_memory_limit_bytes() -> int:
    """Half of what is available (physical or cgroup, whichever is lower)."""
    return available_memory_bytes() // 2


@dataclass(frozen=True)
class MemoryBound:
    """The terms of the bound formula for one run; `total` is what is checked against the limit."""

    ring_slots: int
    slot_bytes: int
    num_workers: int
    held_slots: int = 0  # batch runs: ring slots the consumer may hold as leased batches
    scratch_bytes: int | None = None  # per-worker decode scratch; None: slot_bytes

    @property
    def ring_bytes(self) -> int:
        return self.ring_slots * self.slot_bytes

    @property
    def worker_scratch_bytes(self) -> int:
        return self.slot_bytes if self.scratch_bytes is None else self.scratch_bytes

    @property
    def total(self) -> int:
        return self.ring_bytes + self.slot_bytes + self.num_workers * self.worker_scratch_bytes

    def describe(self) -> str:
        mib = 2**20
        ring = f"ring {self.ring_slots} slots x {self.slot_bytes / mib:.1f} MiB = {self.ring_bytes / mib:.1f} MiB"
        if self.held_slots:
            return (
                f"{ring} (up to {self.held_slots} of them batches the consumer holds)"
                f" + batch copied out {self.slot_bytes / mib:.1f} MiB"
                f" + decode scratch {self.num_workers} workers x {self.worker_scratch_bytes / mib:.1f} MiB"
                f" = {self.total / mib:.1f} MiB"
            )
        return (
            f"{ring} + consumer chunk {self.slot_bytes / mib:.1f} MiB"
            f" + decode scratch {self.num_workers} workers x {self.slot_bytes / mib:.1f} MiB"
            f" = {self.total / mib:.1f} MiB"
        )

    def check(self, limit_bytes: int) -> None:
        """Refuse (ResourceLimitError) a bound above the limit, printing every term."""
        if self.total > limit_bytes:
            raise ResourceLimitError(
                f"reader memory bound exceeds memory_limit_bytes ({limit_bytes / 2**20:.1f} MiB): {self.describe()}; "
                "lower prefetch_size or num_workers, or raise ReaderConfig.memory_limit_bytes"
            )


def return_freed_heap() -> None:
    """Give the C heap's free pages back to the kernel (glibc `malloc_trim(0)`; a no-op elsewhere),
    and pyarrow's memory pool its unused ones when pyarrow is loaded (decoded tables live there).

    Building a population allocates and frees per-row numpy temporaries; glibc keeps freed heap
    pages (and raises its mmap threshold after freeing a large block, so the next large arrays
    come from the heap too), which would stay in the process's anonymous memory as dead bytes per
    row. Call it after O(rows) work, never in a hot loop: it walks the heap's free lists.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    arrow = sys.modules.get("pyarrow")  # never imported here: only where a table was decoded
    if arrow is not None:
        arrow.default_memory_pool().release_unused()  # the pool's freed pages (the physical table's)


_TRIM: list = []


def _malloc_trim():
    """glibc's malloc_trim, resolved once (None without glibc)."""
    if not _TRIM:
        import ctypes
        import ctypes.util

        try:
            fn = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
            fn.argtypes = (ctypes.c_size_t,)
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _TRIM.append(fn)
    return _TRIM[0]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (back to its previous state after).

    For loops that build many long-lived, acyclic objects (a dataset opening 10^4 or more caches:
    parsed manifests, handles): each full collection walks every object built so far, a
    constant share of the loop's time spent finding no garbage. Nothing is lost: reference
    counting still frees everything, and the next collection after the block sees any cycle.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
