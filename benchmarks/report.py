"""Render a benchmark JSON (bench-out/*.json) as the markdown tables of docs/benchmarks.md.

Usage: python -m benchmarks.report bench-out/reader.json [bench-out/foundation.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import Measurement, ratio_table


def reader_table(doc: dict) -> str:
    """One row per (workload, contender) with every figure the reader benchmark records."""
    rows = doc["rows"]
    baseline = {r["workload"]: statistics.median(r["rates"]) for r in rows if r["contender"].startswith("dataset-rt")}
    lines = [
        "| workload | contender | samples/s (median) | min - max | MiB/s | p95 batch of 256 | first sample | peak tree PSS | vs dataset-rt |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        med = statistics.median(r["rates"])
        base = baseline.get(r["workload"])
        ratio = f"{med / base:.2f}x" if base else "n/a"
        p95 = f"{statistics.median(r['p95_batch_ms']):.1f} ms" if r["p95_batch_ms"] else "-"
        first = f"{r['first_sample_s'] * 1e3:.0f} ms" if r.get("first_sample_s") is not None else "-"
        lines.append(
            f"| {r['workload']} | {r['contender']} | {med:,.0f} | {min(r['rates']):,.0f} - {max(r['rates']):,.0f} | "
            f"{statistics.median(r['mib']):,.0f} | {p95} | {first} | {r['peak_pss_mib']:.0f} MiB | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    for path in sys.argv[1:]:
        doc = json.loads(Path(path).read_text())
        print(f"### {path}\n\nmachine: {doc['machine']}\n")
        if "rows" in doc:
            print(reader_table(doc))
        else:
            ms = [Measurement(**m) for m in doc["measurements"]]
            print(ratio_table(ms, "datasetrt"))
        print()


if __name__ == "__main__":
    main()
