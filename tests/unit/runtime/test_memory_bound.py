"""The reader's memory bound (runtime/memory.py), the run shape (runtime/run.py RunShape.plan) and
the ring's reserved pages (runtime/shm.py), against oracles that are not the code under test:
hand-computed shapes from the formula in docs/memory-guide.md, the figures that page prints,
and a real small tmpfs (mounted here when the test runs as root, as on CI).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
from pathlib import Path

import pytest

from datasetrt.errors import DatasetRTError, ResourceLimitError
from datasetrt.runtime.memory import MemoryBound, check_shm_capacity
from datasetrt.runtime.ring import Ring
from datasetrt.runtime.run import RunShape
from datasetrt.runtime.shm import create_shared_file
from datasetrt.runtime.slot import SlotLayout

MiB = 1 << 20
GUIDE = Path(__file__).resolve().parents[3] / "docs" / "memory-guide.md"

# (prefetch_size, num_workers, largest record, rows_hint) -> (rows_per_task, slot_bytes, ring slots),
# worked by hand from docs/memory-guide.md:
#   rows = max(16, min(512, 1 MiB // record))    (a batch hint B: min(B, 4096, max(16, 4 MiB // record)))
#   slot_bytes = 7 x 8 B x rows + max(1 MiB, rows x record), rounded up to 4 KiB
#   slots = max(2 x K + 2, min(ceil(prefetch / rows), 16 MiB // slot_bytes))
SHAPES = [
    ((1024, 1, 4096, None), (256, 1_064_960, 4)),  # 14,336 B header + 1 MiB -> 260 pages; 4 = 2K+2
    ((1024, 2, 4096, None), (256, 1_064_960, 6)),
    ((1024, 4, 4096, None), (256, 1_064_960, 10)),
    ((1, 2, 4096, None), (256, 1_064_960, 6)),  # a tiny prefetch still gets two tasks per worker + 2
    ((1, 0, 4096, None), (256, 1_064_960, 2)),
    ((4096, 1, 4096, None), (256, 1_064_960, 15)),  # prefetch wants 16, the 16 MiB cap gives 15
    ((3000, 1, 4096, None), (256, 1_064_960, 12)),  # ceil(3000 / 256) = 12
    ((64, 2, 150 << 10, None), (16, 2_461_696, 6)),  # 16 x 150 KiB + 896 B -> 601 pages
    ((100_000, 1, 100, None), (512, 1_077_248, 15)),  # 512 rows of small records: 1 MiB + 28,672 B
    ((1024, 2, 0, None), (512, 1_077_248, 6)),  # empty records plan as 1 byte
    ((1024, 2, 4 << 20, None), (16, 67_112_960, 6)),  # 4 MiB records: 16 per slot, slots from 2K+2
    ((1024, 2, 4096, 64), (64, 1_052_672, 15)),  # iter_batches(64): one task per batch; 16 wanted, cap 15
    ((1024, 2, 4096, 10_000), (1024, 4_251_648, 6)),  # a huge batch: 4 MiB of records per task
    ((1024, 2, 100, 10_000), (4096, 1_277_952, 6)),  # small records: capped at 4096 rows (224 KiB header)
    ((1024, 2, 4096, 3), (3, 1_052_672, 15)),  # a batch under 16 rows is taken as it is; cap 15
]


@pytest.mark.parametrize("args, want", SHAPES, ids=[str(a) for a, _ in SHAPES])
def test_run_shape_follows_the_documented_formula(args, want):
    prefetch, k, record, hint = args
    shape = RunShape.plan(prefetch, k, record, hint)
    assert (shape.rows_per_task, shape.slot_bytes, shape.slots) == want
    assert shape.slot_bytes % 4096 == 0


def _guide_rows() -> list[str]:
    text = GUIDE.read_text()
    rows = re.findall(r"^K=\d+ prefetch=\d+ record=\d+ KiB: .*$", text, flags=re.M)
    assert len(rows) >= 5, "docs/memory-guide.md lost its printed ring shapes"
    return rows


def test_memory_guide_figures_are_what_the_code_prints():
    """The shapes and bounds docs/memory-guide.md prints, line for line (the page's own command)."""
    for line in _guide_rows():
        k, prefetch, record_kib = map(int, re.match(r"K=(\d+) prefetch=(\d+) record=(\d+)", line).groups())
        s = RunShape.plan(prefetch, k, record_kib << 10)
        got = (f"K={k} prefetch={prefetch} record={record_kib} KiB: rows_per_task={s.rows_per_task}; "
               + MemoryBound(s.slots, s.slot_bytes, k).describe())
        assert got == line


def test_bound_is_ring_plus_one_chunk_plus_scratch_per_worker():
    bound = MemoryBound(ring_slots=6, slot_bytes=1_064_960, num_workers=2)
    assert bound.ring_bytes == 6 * 1_064_960
    assert bound.total == (6 + 1 + 2) * 1_064_960
    assert bound.describe() == ("ring 6 slots x 1.0 MiB = 6.1 MiB + consumer chunk 1.0 MiB"
                                " + decode scratch 2 workers x 1.0 MiB = 9.1 MiB")
    bound.check(bound.total)  # exactly the bound passes
    with pytest.raises(ResourceLimitError) as info:
        bound.check(bound.total - 1)
    assert str(info.value) == (
        f"reader memory bound exceeds memory_limit_bytes ({(bound.total - 1) / MiB:.1f} MiB): {bound.describe()}; "
        "lower prefetch_size or num_workers, or raise ReaderConfig.memory_limit_bytes")


def test_resource_limit_error_is_a_memory_error():
    """Documented: a refused bound is a ResourceLimitError, which is also the builtin MemoryError
    (and a DatasetRTError), so `except MemoryError` written for dataset-rt catches it."""
    assert issubclass(ResourceLimitError, MemoryError) and issubclass(ResourceLimitError, DatasetRTError)
    with pytest.raises(MemoryError):
        MemoryBound(4, 1 << 20, 1).check(1 << 20)
    with pytest.raises(MemoryError, match="/dev/shm|has .* MiB free"):
        check_shm_capacity(1 << 62)


# -- a small filesystem: /dev/shm capacity and pages reserved up front -------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs of this test's own (root only: CI and this machine run as root)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_shm_capacity_is_checked_against_the_filesystem_given(small_tmpfs):
    st = os.statvfs(small_tmpfs)
    free = st.f_bavail * st.f_frsize
    assert 0 < free <= MiB
    check_shm_capacity(free, small_tmpfs)  # exactly what is free fits
    with pytest.raises(ResourceLimitError, match=rf"{small_tmpfs} has 1.0 MiB free but the reader needs 1.0 MiB"):
        check_shm_capacity(free + 1, small_tmpfs)
    with pytest.raises(ResourceLimitError, match="is not usable for shared memory"):
        check_shm_capacity(1, small_tmpfs / "missing")


def test_ring_pages_are_reserved_at_creation(small_tmpfs):
    """A ring that does not fit fails when it is created, with ENOSPC (posix_fallocate), never
    later with SIGBUS on first touch; a ring that fits owns all its pages from the start."""
    layout = SlotLayout.records(16, 256 << 10)
    with pytest.raises(OSError) as info:
        Ring(small_tmpfs / "ring", layout, 8)  # 8 x ~260 KiB > 1 MiB
    assert info.value.errno == errno.ENOSPC
    with contextlib.suppress(FileNotFoundError):
        (small_tmpfs / "ring").unlink()
    ring_map = create_shared_file(small_tmpfs / "fits", 3 * layout.slot_bytes)
    try:
        st = os.stat(small_tmpfs / "fits")
        assert st.st_size == 3 * layout.slot_bytes
        assert st.st_blocks * 512 >= st.st_size  # allocated now, not a sparse file
    finally:
        ring_map.close()
