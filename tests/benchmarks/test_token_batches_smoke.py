"""Smoke test of the token batches benchmark: `python -m benchmarks.token_batches` on a small
cache exits 0, every contender's batches equal the memmap gather's rows, and each contender has
a row with a rate and its ratio to the gather. No speed is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_small_run_same_rows_and_a_row_per_contender() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.token_batches", "--count", "1024", "--rounds", "1", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every contender's batches equal the memmap gather's rows" in out.stdout
    rows = {
        m.group(1) for m in re.finditer(r"^\s*this (\S+)\s+median\s+[\d.]+ MiB/s .* [\d.]+x gather$", out.stdout, re.M)
    }
    assert rows == {"gather", "workers", "in-process"}, out.stdout
