"""Smoke test of `python -m benchmarks.remote --smoke`: moto's S3 server behind the counting proxy
and the TLS front on loopback (--smoke is unshaped: no namespace, no root needed), datasetrt
writing a cache to s3:// and reading it cold and warm (in-process and with 2 reader workers), the
same cache read back from local disk, a read under a node-cache limit, and the raw GET floor;
every record read exactly once with the written bytes. The peers (MosaicML Streaming, LitData)
need their own venv and are skipped in --smoke with a printed reason. No speed is asserted; what
the proxy counted is: each object fetched once, the cold epoch fetching the bytes stored, the warm
epoch and the local-disk reads fetching nothing, the limited read fetching every byte at least
once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_remote_benchmark_smoke(tmp_path: Path) -> None:
    out_json = tmp_path / "remote.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.remote",
            "--smoke",
            "--transports",
            "https",
            "--peer-python",
            str(tmp_path / "no-venv" / "bin" / "python"),
            "--out",
            str(out_json),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every contender read every record exactly once" in out.stdout
    assert out.stdout.count("skipped: ") == 4  # Streaming and LitData, in-process and 2 workers
    assert "targets:" in out.stdout
    doc = json.loads(out_json.read_text())
    assert doc["network"].startswith("unshaped")
    stored = doc["stores"]["datasetrt"]["stored_bytes"]
    ours = {(r["variant"], r["where"]): r for r in doc["rows"] if r["contender"] == "datasetrt"}
    assert set(ours) == {(v, w) for v in ("remote", "local disk", "limit") for w in ("in-process", "2 workers")}
    for (variant, _where), row in ours.items():
        [run] = row["runs"]
        assert not run.get("error") and not run["problems"], run
        assert run["multiset"]  # the digest pass ran (and matched: no PROBLEMS line)
        cold, warm = run["passes"]["cold"]["served"], run["passes"]["warm"]["served"]
        assert run["peak_pss_mib"] > 0 and cold["errors"] == 0
        if variant == "remote":
            assert cold["bytes"] == stored and cold["max_gets_per_object"] == 1, cold
            assert warm["requests"] == 0, warm
            assert run["peak_disk_bytes"] >= doc["records"] * doc["record_bytes"]
        elif variant == "local disk":
            assert cold["requests"] == warm["requests"] == 0
        else:
            assert row["limit_bytes"] == doc["limit"]["bytes"] < stored
            assert cold["bytes"] >= stored  # a fresh node cache: every object at least once
            assert run["peak_disk_bytes"] > 0
    assert {f["concurrency"] for f in doc["floors"]} == {1, 4}
    assert all(min(f["rates"]) > 0 for f in doc["floors"])


def test_the_limited_run_takes_the_largest_window_the_disk_bound_accepts() -> None:
    from benchmarks.remote import limit_plan

    stored = [("drt/manifest.json", 100), ("drt/index.bin", 200)] + [(f"drt/shards/{i}.bin", 100) for i in range(40)]
    assert limit_plan(stored, 0.25) == (1075, 5)  # small 300 + (5 + 1 + 1 spare) x 100 <= 1075
    assert limit_plan(stored, 0.25, spare=0) == (1075, 6)
    assert limit_plan(stored, 0.05) == (600, 1)  # too small for any window: raised to fit one and its spare


def test_missing_peer_venv_is_a_reason(tmp_path: Path) -> None:
    from benchmarks.remote import LITDATA, STREAMING, peers_missing

    reasons = peers_missing(str(tmp_path / "absent" / "python"))
    assert set(reasons) == {STREAMING, LITDATA}
    assert all("no peer venv" in r for r in reasons.values())
