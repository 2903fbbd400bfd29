"""Smoke test of the zstd_dict benchmark: `python -m benchmarks.zstd_dict --smoke` exits 0, every
contender read back exactly the generated records in datasetrt's plan order, and the table has a
row with a ratio and a read rate for each (workload, contender). No speed or ratio is asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.zstd_dict import COUNTS, DATASETRT, LOADERX

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_same_bytes_and_a_row_per_contender(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.zstd_dict", "--smoke", "--out", str(tmp_path / "z.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "all contenders produced the same bytes" in out.stdout
    rows = {
        (m["wl"], m["c"])
        for m in (
            re.match(r"\| (?P<wl>.+?) x [\d,]+ \| (?P<c>[^|]+?) \| [\d.]+x \|", line)
            for line in out.stdout.splitlines()
        )
        if m
    }
    assert rows == {(w, c) for w in COUNTS["smoke"] for c in [*DATASETRT, *LOADERX]}
    doc = json.loads((tmp_path / "z.json").read_text())
    datasetrt_dict = [r for r in doc["rows"] if r["contender"] == "datasetrt zstd_dict"]
    assert all(r["algos"] == ["zstd_dict"] and 0 < r["dict_bytes"] <= 32 << 10 for r in datasetrt_dict)
