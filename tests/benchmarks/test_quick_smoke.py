"""Smoke test of the benchmark suite: `python -m benchmarks.run --quick` exits 0 and every
contender produced datasetrt's bytes. No speed is asserted (measured: ~60 s alone on 2 vCPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_suite_same_bytes(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path / "suite.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    same = [line for line in out.stdout.splitlines() if line.startswith("same bytes: ")]
    # 4 workloads, tokens in lz4 and zstd: 5 caches x (ordered, shuffled)
    assert len(same) == 10, out.stdout[-3000:]
    for line in same:
        assert "datasetrt batches" in line and "pread per record (limit)" in line, line
        assert re.search(r"torch DataLoader \(memmap\)", line), line
    assert "DIFFERENT BYTES" not in out.stdout
    assert "all contenders produced the same bytes" in out.stdout
    assert (tmp_path / "suite.json").exists()
