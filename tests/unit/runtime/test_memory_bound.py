"""The reader's memory bound (runtime/memory.py), the run shape (runtime/run.py RunShape.plan) and
the ring's reserved pages (runtime/shm.py), against oracles that are not the code under test:
hand-computed shapes from the formula in docs/memory-guide.md, the figures that page prints,
and the kernel's own accounting of a ring's memfd (fstat blocks).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import datasetrt as drt
from datasetrt.errors import DatasetRTError, ResourceLimitError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.batch_run import batch_ring
from datasetrt.runtime.local import BatchShape
from datasetrt.runtime.memory import MemoryBound
from datasetrt.runtime.run import RunShape, RunSpec, planned_record_bytes
from datasetrt.runtime.shm import create_shared_memory
from datasetrt.runtime.slot import SlotLayout
from datasetrt.values.payloads import PayloadCheck
from tests.conftest import ListSource, writer_config

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
    ((1024, 2, 4096, 1), (1, 1_052_672, 15)),  # iter_batches(1): one row per task, not the 2 the floor of 1 allows
    ((1024, 2, 100_000, 64), (41, 4_104_192, 6)),  # a batch of 64 large records: 4 MiB // 100,000 B = 41 rows per task
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
        got = (
            f"K={k} prefetch={prefetch} record={record_kib} KiB: rows_per_task={s.rows_per_task}; "
            + MemoryBound(s.slots, s.slot_bytes, k).describe()
        )
        assert got == line


@pytest.mark.parametrize(
    ("algo", "payload_bytes", "planned"),
    [
        ("none", 40_000, None),  # the largest stored record (payload + envelope)
        ("lz4", 40_000, 2 * 40_000 + 256),
        ("lz4", 5 * MiB, 10 * MiB + 256),
        ("lz4", 9 * MiB, 16 * MiB),  # capped: manifests are untrusted, larger records split their tasks
    ],
    ids=["stored", "decoded", "decoded-5MiB", "decoded-cap"],
)
def test_planned_record_bytes_is_the_largest_stored_or_twice_the_average_decoded(
    tmp_path, algo, payload_bytes, planned
):
    """docs/memory-guide.md: the planned record is the largest stored record or, for a compressed
    cache, twice the average decoded payload if that is larger (+256 B, at most 16 MiB:
    runtime/run.py). Payloads of one repeated byte, which lz4 shrinks to a few KiB."""
    items = [(bytes([k]) * payload_bytes, {"k": k}) for k in range(2)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(ListSource("p", items), tmp_path, writer_config=writer_config(algo))
    handle = CacheHandle.open(res.path)
    stored = int(handle.index_array()[:, 2].max())
    if planned is None:
        assert planned_record_bytes([handle]) == stored > payload_bytes
    else:
        assert stored < payload_bytes // 100
        assert planned_record_bytes([handle]) == planned


def test_bound_is_ring_plus_one_chunk_plus_scratch_per_worker():
    bound = MemoryBound(ring_slots=6, slot_bytes=1_064_960, num_workers=2)
    assert bound.ring_bytes == 6 * 1_064_960
    assert bound.total == (6 + 1 + 2) * 1_064_960
    assert bound.describe() == (
        "ring 6 slots x 1.0 MiB = 6.1 MiB + consumer chunk 1.0 MiB + decode scratch 2 workers x 1.0 MiB = 9.1 MiB"
    )
    bound.check(bound.total)  # exactly the bound passes
    with pytest.raises(ResourceLimitError) as info:
        bound.check(bound.total - 1)
    assert str(info.value) == (
        f"reader memory bound exceeds memory_limit_bytes ({(bound.total - 1) / MiB:.1f} MiB): {bound.describe()}; "
        "lower prefetch_size or num_workers, or raise ReaderConfig.memory_limit_bytes"
    )


def test_batch_run_bound_prints_held_batches_and_its_own_scratch():
    """A batch run's bound: the ring holds up to held_slots leased batches, one more batch may be
    copied out of its slot, and the workers' scratch is the staged-records size, not a slot."""
    bound = MemoryBound(ring_slots=5, slot_bytes=3 * MiB // 2, num_workers=2, held_slots=3, scratch_bytes=3 * MiB // 4)
    assert bound.total == 5 * 3 * MiB // 2 + 3 * MiB // 2 + 2 * 3 * MiB // 4
    assert bound.describe() == (
        "ring 5 slots x 1.5 MiB = 7.5 MiB (up to 3 of them batches the consumer holds)"
        " + batch copied out 1.5 MiB + decode scratch 2 workers x 0.8 MiB = 10.5 MiB"
    )


@pytest.mark.parametrize(
    "epoch, drop_last, slots, held",
    [
        (40_000, False, 4, 2),
        (4_000, False, 4, 2),
        (1_000, False, 4, 4),
        (500, False, 2, 2),
        (500, True, 1, 1),
        (1, False, 1, 1),
    ],
)
def test_a_batch_ring_has_no_more_slots_than_its_window_has_batches(epoch, drop_last, slots, held):
    """150 KiB records in batches of 256, 2 workers: 4 slots of 38 MiB, fewer when the window
    has fewer batches; the bound (checked up front) is that of the ring made, and a ring with a
    slot per batch lets the consumer hold every one of them."""
    spec = SimpleNamespace(
        window=SimpleNamespace(length=epoch), num_workers=2, prefetch_size=64, max_record_bytes=150 << 10
    )
    shape = BatchShape(256, drop_last, PayloadCheck(), False, 150 << 10)
    ring, bound = batch_ring(spec, shape)  # type: ignore[arg-type]
    assert ring.slots == bound.ring_slots == slots and bound.held_slots == held
    assert ring.slot_bytes == bound.slot_bytes > 256 * (150 << 10)
    assert bound.total == (slots + 1) * ring.slot_bytes + 2 * bound.worker_scratch_bytes


def test_a_bound_cannot_change_after_it_is_checked():
    import dataclasses

    bound = MemoryBound(4, MiB, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        bound.ring_slots = 400
    assert bound.total == 7 * MiB


def test_a_run_shape_cannot_change_after_it_is_planned():
    """The bound is checked and the ring is made from one shape: it cannot change in between."""
    import dataclasses

    shape = RunShape.plan(1024, 1, 4096)
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.slots = 400
    assert shape.slots == 4


def test_a_run_spec_cannot_change_after_the_run_starts():
    """A run plans its ring, its bound and its tasks from one RunSpec (window, workers, sizes)."""
    import dataclasses

    spec = RunSpec(
        caches=None,
        window=None,
        num_workers=2,
        prefetch_size=64,
        max_record_bytes=4096,
        memory_limit_bytes=1 << 30,
        timeout_s=5.0,
        fallback=None,
        rows_hint=16,
    )
    for field, value in (("num_workers", 3), ("prefetch_size", 4096), ("rows_hint", None), ("window", object())):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(spec, field, value)
    assert (spec.num_workers, spec.prefetch_size, spec.rows_hint, spec.window) == (2, 64, 16, None)


def test_resource_limit_error_is_a_memory_error():
    """Documented: a refused bound is a ResourceLimitError, which is also the builtin MemoryError
    (and a DatasetRTError), so `except MemoryError` written for dataset-rt catches it."""
    assert issubclass(ResourceLimitError, MemoryError) and issubclass(ResourceLimitError, DatasetRTError)
    with pytest.raises(MemoryError):
        MemoryBound(4, 1 << 20, 1).check(1 << 20)


# -- ring memory: anonymous memfds with their pages reserved up front ---------------------------------


def test_ring_pages_are_reserved_at_creation():
    """A ring's memory is reserved when it is created (posix_fallocate on its memfd: a refusal is a
    ResourceLimitError then, never SIGBUS on first touch later); it has no name in /dev/shm."""
    layout = SlotLayout.records(16, 256 << 10)
    ring_map, fd = create_shared_memory("test-ring", 3 * layout.slot_bytes)
    try:
        st = os.fstat(fd)
        assert st.st_size == 3 * layout.slot_bytes
        assert st.st_blocks * 512 >= st.st_size  # allocated now, not sparse
        assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:datasetrt-{os.getpid()}-test-ring")
    finally:
        ring_map.close()
        os.close(fd)


def _cgroup_tree(tmp_path, files: dict[str, str]) -> Path:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    "lines, files, expected",
    [
        # a non-memory v1 controller line first is skipped; the v2 limit of an ancestor is the tightest
        (
            ["3:cpu,cpuacct:/job", "4:memory:/job/step", "0::/user/job"],
            {
                "memory/job/step/memory.limit_in_bytes": f"{300 * MiB}\n",
                "memory/memory.limit_in_bytes": f"{1 << 62}\n",
                "user/job/memory.max": f"{100 * MiB}\n",
                "user/memory.max": f"{50 * MiB}\n",
                "memory.max": "max\n",
            },
            50 * MiB,
        ),
        # a v1 memory controller listed with others, limited two levels up from the process's group
        (
            ["0::/", "5:cpu,memory:/a/b/c"],
            {"memory/a/memory.limit_in_bytes": f"{64 * MiB}\n", "memory/a/b/c/memory.limit_in_bytes": f"{1 << 62}\n"},
            64 * MiB,
        ),
        (["0::/user/job"], {"user/job/memory.max": "max\n", "user/memory.max": "max\n"}, None),
        # unreadable or garbled limit files are no limit, not an error
        (
            ["0::/user/job", "7:memory:/job"],
            {"user/job/memory.max": "12x\n", "user/memory.max": "\n", "memory/job/memory.limit_in_bytes": "-\n"},
            None,
        ),
        (None, {}, None),  # no /proc/self/cgroup at all (not Linux-like): unknown
    ],
)
def test_cgroup_limit_is_the_tightest_on_the_process_group_and_its_ancestors(
    tmp_path, monkeypatch, lines, files, expected
):
    """A container's limit sits on an ancestor of the process's own cgroup (docs/memory-guide.md):
    every level of the v2 and v1 memory hierarchies named in /proc/self/cgroup counts."""
    from datasetrt.runtime import memory

    monkeypatch.setattr(memory, "CGROUP_V2_MAX", tmp_path / "absent-v2")  # not the host's mount root
    monkeypatch.setattr(memory, "CGROUP_V1_LIMIT", tmp_path / "absent-v1")
    proc = tmp_path / "proc-self-cgroup"
    if lines is not None:
        proc.write_text("\n".join(lines) + "\n")
    assert memory.cgroup_limit_bytes(proc, _cgroup_tree(tmp_path, files)) == expected


def test_default_limit_is_whole_bytes_half_of_what_is_available(monkeypatch):
    from datasetrt.runtime import memory

    monkeypatch.setattr(memory, "available_memory_bytes", lambda: (1 << 33) + 1)
    limit = memory.default_memory_limit_bytes()
    assert limit == 1 << 32 and type(limit) is int


@pytest.mark.parametrize(
    "lines, files, expected",
    [
        # v2: limit 10 MiB, usage 9 MiB of which 1.5 MiB file cache -> 2.5 MiB, under the 3 MiB of meminfo
        (
            ["0::/job"],
            {
                "job/memory.max": f"{10 * MiB}\n",
                "job/memory.current": f"{9 * MiB}\n",
                "job/memory.stat": f"anon 1\nactive_file {MiB}\ninactive_file {MiB // 2}\nshmem 7\n",
            },
            5 * MiB // 2,
        ),
        # v1 counts the hierarchical (total_) file pages; an unlimited parent adds nothing
        (
            ["4:memory:/a/b"],
            {
                "memory/a/b/memory.limit_in_bytes": f"{4 * MiB}\n",
                "memory/a/b/memory.usage_in_bytes": f"{4 * MiB}\n",
                "memory/a/b/memory.stat": f"active_file 999999\ntotal_active_file 0\ntotal_inactive_file {MiB}\n",
                "memory/a/memory.limit_in_bytes": f"{1 << 62}\n",
            },
            MiB,
        ),
        (["0::/job"], {"job/memory.max": "max\n", "job/memory.current": "5\n"}, 3 * MiB),  # no limit: meminfo
        # over its limit (usage counts kernel memory too): nothing, never negative
        (["0::/job"], {"job/memory.max": f"{MiB}\n", "job/memory.current": f"{2 * MiB}\n"}, 0),
    ],
)
def test_reservable_bytes_is_available_memory_within_every_cgroup_limit(tmp_path, lines, files, expected):
    from datasetrt.runtime import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       8000 kB\nMemAvailable:   2048 kB\nSwapTotal: 4096 kB\nSwapFree:       1024 kB\n"
    )
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("\n".join(lines) + "\n")
    assert memory.reservable_bytes(meminfo, proc, _cgroup_tree(tmp_path, files)) == expected
    assert memory.reservable_bytes(tmp_path / "absent", tmp_path / "absent", tmp_path) is None  # nothing known
