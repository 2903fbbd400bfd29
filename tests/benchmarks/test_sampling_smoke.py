"""Smoke test of `python -m benchmarks.sampling --smoke`: it exits 0 and prints a planning row and
a read row (samples and batches, in-process and with reader workers) for every order. No speed is
asserted (the machine is shared; the lead reruns the benchmark quiet)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDERS = ("shuffled (draws)", "permutation", "mixture 0.5/0.3/0.2 (3 streams)")


def test_sampling_benchmark_smoke(tmp_path: Path) -> None:
    out_json = tmp_path / "sampling.json"
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.sampling", "--smoke", "--out", str(out_json)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    measured = json.loads(out_json.read_text())["measurements"]
    reads = {(m["workload"].split(", ", 1)[1], m["contender"]) for m in measured if m["workload"].startswith("read ")}
    layouts = {
        f"{mode}, {where}" for mode in ("samples", "batches of 256") for where in ("in-process", "2 reader workers")
    }
    assert reads == {(layout, order) for layout in layouts for order in ORDERS}
    assert all(m["values"] and min(m["values"]) > 0 for m in measured)
    assert "permutation" in {m["contender"] for m in measured if "blocks of 256" in m["workload"]}
