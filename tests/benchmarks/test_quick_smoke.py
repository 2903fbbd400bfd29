"""Smoke test of the benchmark suite: `python -m benchmarks.run --smoke` exits 0, every read and
write contender produced datasetrt's bytes, the write, open and torch sections printed a row for
each contender, and the targets table was printed. No speed is asserted. (--smoke, not
--quick: --quick overran 300 s while other test runs loaded the 2 vCPU machine; measured under
that load, old --quick 906 s wall / 144 s CPU, this test 788 s / 115 s; 277 s / 107 s with less
load. MosaicML Streaming and
LitData, seconds of imports per process, are in --quick / --full only.) The default run checks all
of it on two workloads (`--workloads`); every workload and codec is `-m slow`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RT = "dataset-rt 0.4.8"
TOKENS512 = "int32[512] x 1024 none"
# --smoke write workloads (each workload's codecs) -> contenders: dataset-rt has no zstd, loaderx no lz4
WRITES = {
    "4 KiB x 1024 none": {"datasetrt", RT, "loaderx"},
    "1-64 KiB x 512 none": {"datasetrt", RT, "loaderx"},
    "tokens x 1024 lz4": {"datasetrt", RT},
    "tokens x 1024 zstd": {"datasetrt", "loaderx"},
    TOKENS512: {"datasetrt", RT, "loaderx"},
    "50 x 20 x 64 B none": {"datasetrt", RT},
}
OPEN_COUNTS = ("1", "10")
CONTENDER = r"(?P<c>datasetrt|dataset-rt 0\.4\.8|loaderx)"
# datasetrt's paths, each with 2 reader workers and in-process, in every read row
OURS = ("datasetrt,", "datasetrt batches,", "datasetrt in-process,", "datasetrt batches in-process,")


# The default run's subset: every read contender (4 KiB: dataset-rt, loaderx, the torch memmap
# loader, memmap copy, pread; int32[512]: the memmap gather, .to_numpy() and the torch section)
# and every write contender, on 2 of the 4 workloads and one codec.
SUBSET = ("4 KiB", TOKENS512.split(" x ")[0])
SUBSET_WRITES = {
    "4 KiB x 1024 none": WRITES["4 KiB x 1024 none"],
    TOKENS512: WRITES[TOKENS512],
    "50 x 20 x 64 B none": WRITES["50 x 20 x 64 B none"],
}


def run_suite(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--smoke",
            *args,
            "--out",
            str(tmp_path / "suite.json"),
            "--baseline",
            str(tmp_path / "no-baseline.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_smoke_subset_same_bytes(tmp_path: Path) -> None:
    """Every section and every read and write contender, on the 4 KiB and int32[512] workloads
    (uncompressed): the claims of test_smoke_suite_same_bytes on fewer caches."""
    check_suite(run_suite(tmp_path, "--workloads", ",".join(SUBSET)), tmp_path, caches=2, expected_writes=SUBSET_WRITES)


@pytest.mark.slow(
    reason="every --smoke workload and codec (lz4/zstd reads, 1-64 KiB records): "
    "test_smoke_subset_same_bytes checks every section and contender in the default run"
)
def test_smoke_suite_same_bytes(tmp_path: Path) -> None:
    # 4 KiB, 1-64 KiB, tokens in lz4 and zstd, int32[512]: 5 caches x (ordered, shuffled)
    check_suite(run_suite(tmp_path), tmp_path, caches=5, expected_writes=WRITES)


def check_suite(out: subprocess.CompletedProcess, tmp_path: Path, caches: int, expected_writes: dict) -> None:
    """The assertions of a --smoke run over `caches` read caches and the `expected_writes` rows."""
    lines = out.stdout.splitlines()
    same = [line for line in lines if line.startswith("same bytes: ")]
    assert len(same) == 2 * caches, out.stdout[-3000:]
    for line in same:
        assert all(c in line + "," for c in OURS) and "pread per record (limit)" in line and "loaderx" in line, line
        if line.startswith(f"same bytes: {TOKENS512}"):
            assert "numpy memmap gather (limit)" in line, line
        else:
            assert re.search(r"torch DataLoader \(memmap\)", line), line

    # write: one row per (workload, contender); datasetrt's and dataset-rt's caches read back equal
    writes: dict[str, set[str]] = {}
    for line in lines:
        m = re.match(rf"write (?P<wl>.+?)\s{{2,}}{CONTENDER}\s", line)
        if m:
            writes.setdefault(m["wl"], set()).add(m["c"])
            if m["c"] != "loaderx":
                assert "same bytes, same order" in line, line
    assert writes == expected_writes, out.stdout[-3000:]
    assert len([line for line in lines if line.startswith("same bytes written: ")]) == len(expected_writes)

    # open: one row per (cache count, contender), both the same dataset length
    opens = set()
    for line in lines:
        m = re.match(rf"open\s+(?P<n>[\d,]+) caches {CONTENDER}\s", line)
        if m:
            opens.add((m["n"], m["c"]))
            assert "same length" in line, line
    assert opens == {(n, c) for n in OPEN_COUNTS for c in ("datasetrt", RT)}, out.stdout[-3000:]

    # torch end to end: today's per-sample loader delivered every int32[512] record as [n, 512] int32
    torch_lines = [line for line in lines if line.startswith("torch [0] K=2 fork")]
    assert any("datasetrt to_torch_dataloader" in line and "same bytes" in line for line in torch_lines), out.stdout[
        -3000:
    ]
    assert not any("FAILED" in line for line in torch_lines), torch_lines

    assert "| issue 11 target |" in out.stdout
    assert "DIFFERENT BYTES" not in out.stdout
    assert "all contenders produced the same bytes" in out.stdout
    assert (tmp_path / "suite.json").exists()
