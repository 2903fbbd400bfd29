"""Smoke test of `python -m benchmarks.shuffle_quality --smoke`: tiny sizes, it exits 0 and prints
a row per datasetrt order and the rank tables; the Streaming rows appear when the peer
interpreter is there (its orders computed in a child process) and are skipped otherwise. The
metric functions are checked on orders whose values are known."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks import shuffle_quality as sq

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.shuffle_quality", "--smoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def rows(text: str) -> dict[str, list[str]]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    return {c[0]: c[1:] for c in cells}


def test_runs_without_the_peer_and_reports_every_datasetrt_order(tmp_path: Path) -> None:
    text = run("--peer-python", str(tmp_path / "missing" / "python"), "--out", str(tmp_path / "q.md"))
    table = rows(text)
    assert (tmp_path / "q.md").read_text().startswith("8 shards x 50 records")
    full = table['datasetrt sampling="permutation" (full permutation)']
    assert float(full[0]) > 0.8 and full[4] == "8"  # diversity near 1; every shard open at once
    for w in (1, 2, 4):
        local = table[f'datasetrt sampling="locality", W={w}']
        assert local[4] == str(w) and local[5] == "1.0"  # W shards open at once; each loaded once
    assert table['datasetrt sampling="draws" (dataset-rt, with replacement)'][2] == "n/a"
    assert table["MosaicML Streaming"][0].startswith("skipped: no peer interpreter")
    for line in (
        "| 1 | (one rank) | 8.0 / 8 | 1.000 |",
        "| 2 | rank-local | 4.0 / 4 | 1.000 |",
        "| 2 | interleaved | 8.0 / 8 |",
    ):
        assert line in text  # equal shards: each of 2 ranks reads its 4, where interleaved ranks read all 8


def test_peer_rows_when_the_peer_interpreter_is_there() -> None:
    peer = Path(sq.PEER_PYTHON)
    table = rows(run())
    names = [k for k in table if k.startswith("Streaming") or k == "MosaicML Streaming"]
    if not peer.exists():
        assert names == ["MosaicML Streaming"]
        return
    measured = [k for k in names if table[k][1] != ""]
    assert any("naive" in k for k in measured), table  # a plain permutation: diversity about 1
    assert all(float(table[k][0]) > 0 for k in measured)


def test_metrics_on_known_orders() -> None:
    label = np.repeat(np.arange(4), 100)  # 4 shards of 100
    sizes = np.full(4, 100)
    in_order = label.copy()
    assert sq.cache_shards(in_order, 4) == 1 and sq.lru_loads(in_order, 2) == 4
    round_robin = np.tile(np.arange(4), 100)
    assert sq.cache_shards(round_robin, 4) == 4 and sq.lru_loads(round_robin, 2) == 400
    assert sq.shard_ks(round_robin, 4) < 0.03 and sq.shard_ks(in_order, 4) > 0.6
    expected = sq.expected_distinct(sizes, 8)
    # batches of 8 over shards of 100: 2 of the 50 batches straddle a shard boundary (at 100 and 300)
    assert 3.5 < expected < 4 and abs(sq.diversity(in_order, 8, expected) - 52 / 50 / expected) < 1e-12
    assert abs(sq.spearman(np.arange(400), np.arange(400)) - 1) < 1e-12
    assert abs(sq.spearman(np.arange(400), -np.arange(400)) + 1) < 1e-12
