"""Smoke test of the benchmark suite: `python -m benchmarks.run --quick` exits 0, every read and
write contender produced datasetrt's bytes, and the write and open sections printed a row for each
contender. No speed is asserted (measured: ~70 s on 2 vCPU, ~110 s while other test runs loaded
the machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RT = "dataset-rt 0.4.8"
# --quick write workloads (each workload's codecs) -> contenders: dataset-rt has no zstd, loaderx no lz4
WRITES = {"4 KiB x 4096 none": {"datasetrt", RT, "loaderx"}, "150 KiB x 512 none": {"datasetrt", RT, "loaderx"},
          "1-64 KiB x 1024 none": {"datasetrt", RT, "loaderx"}, "tokens x 4096 lz4": {"datasetrt", RT},
          "tokens x 4096 zstd": {"datasetrt", "loaderx"}, "100 x 20 x 64 B none": {"datasetrt", RT}}
OPEN_COUNTS = ("1", "100", "1,000")
CONTENDER = r"(?P<c>datasetrt|dataset-rt 0\.4\.8|loaderx)"


def test_quick_suite_same_bytes(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path / "suite.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    same = [line for line in lines if line.startswith("same bytes: ")]
    # 4 workloads, tokens in lz4 and zstd: 5 caches x (ordered, shuffled)
    assert len(same) == 10, out.stdout[-3000:]
    for line in same:
        assert "datasetrt batches" in line and "pread per record (limit)" in line, line
        assert re.search(r"torch DataLoader \(memmap\)", line), line

    # write: one row per (workload, contender); datasetrt's and dataset-rt's caches read back equal
    writes: dict[str, set[str]] = {}
    for line in lines:
        m = re.match(rf"write (?P<wl>.+?)\s{{2,}}{CONTENDER}\s", line)
        if m:
            writes.setdefault(m["wl"], set()).add(m["c"])
            if m["c"] != "loaderx":
                assert "same bytes, same order" in line, line
    assert writes == WRITES, out.stdout[-3000:]
    assert len([line for line in lines if line.startswith("same bytes written: ")]) == len(WRITES)

    # open: one row per (cache count, contender), both the same dataset length
    opens = set()
    for line in lines:
        m = re.match(rf"open\s+(?P<n>[\d,]+) caches {CONTENDER}\s", line)
        if m:
            opens.add((m["n"], m["c"]))
            assert "same length" in line, line
    assert opens == {(n, c) for n in OPEN_COUNTS for c in ("datasetrt", RT)}, out.stdout[-3000:]

    assert "DIFFERENT BYTES" not in out.stdout
    assert "all contenders produced the same bytes" in out.stdout
    assert (tmp_path / "suite.json").exists()
