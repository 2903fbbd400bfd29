"""Smoke test of the packing benchmark: `python -m benchmarks.packing --smoke` exits 0, every
datasetrt read (in-process, reader workers, codecs none and zstd) gives the Packer's rows byte for
byte, and the table has a row per contender. Grain is compared only where its interpreter
exists. No speed or padding is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_same_rows_and_a_row_per_contender() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.packing", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every datasetrt read gave the Packer's rows (sha256): True" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| datasetrt")]
    assert len(rows) == 3 + 8
