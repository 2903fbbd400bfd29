"""Markdown tables and the plot of benchmark results: the reader benchmark's rows, the suite's
read / write / open / torch rows, and rendering any benchmark JSON (bench-out/*.json) as the
tables of docs/benchmarks.md.

Boundary: pure functions over result dicts (matplotlib only for `plot`); runs nothing and imports
no library under test.

Usage: python -m benchmarks.report bench-out/reader.json [bench-out/foundation.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.common import Measurement, median, ratio_table
from benchmarks.suite import BATCH, OURS, TTD


def reader_table(doc: dict) -> str:
    """One row per (workload, contender) with every figure the reader benchmark records."""
    rows = doc["rows"]
    baseline = {r["workload"]: median(r["rates"]) for r in rows if r["contender"].startswith("dataset-rt")}
    lines = [
        f"| workload | contender | samples/s (median) | min - max | MiB/s | p95 batch of {BATCH} | first sample | peak tree PSS | vs dataset-rt |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        med = median(r["rates"])
        base = baseline.get(r["workload"])
        ratio = f"{med / base:.2f}x" if base else "n/a"
        p95 = f"{median(r['p95_batch_ms']):.1f} ms" if r["p95_batch_ms"] else "-"
        first = f"{r['first_sample_s'] * 1e3:.0f} ms" if r.get("first_sample_s") is not None else "-"
        lines.append(
            f"| {r['workload']} | {r['contender']} | {med:,.0f} | {min(r['rates']):,.0f} - {max(r['rates']):,.0f} | "
            f"{median(r['mib']):,.0f} | {p95} | {first} | {r['peak_pss_mib']:.0f} MiB | {ratio} |"
        )
    return "\n".join(lines)


def read_table(rows: list[dict]) -> str:
    """The suite's read rows: rates, MiB/s, p95 batch gap, first sample, PSS, CPU per GiB, the
    ratio to datasetrt's per-sample path in the same row, and the byte check."""
    lines = [
        f"| workload | contender | samples/s (median) | min - max | MiB/s | p95 batch of {BATCH} | first sample | peak tree PSS "
        "| CPU s/GiB parent + workers | vs datasetrt | bytes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = {r["workload"]: median(r["rates"]) for r in rows if r["contender"] == OURS}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['contender']} | - | - | - | - | - | - | - | - | {r['error']} |")
            continue
        rate = median(r["rates"])
        cpu = median(r.get("cpu_parent_s_per_gib") or [])
        cpu_txt = f"{cpu:.2f} + {median(r['cpu_workers_s_per_gib']):.2f}" if cpu is not None else "-"
        b = base.get(r["workload"])
        p95 = median(r["p95_batch_ms"])
        first = r["first_sample_s"]
        pss = r.get("peak_pss_mib")
        lines.append(
            f"| {r['workload']} | {r['contender']} | {rate:,.0f} | {min(r['rates']):,.0f} - {max(r['rates']):,.0f} | "
            f"{median(r['mib']):,.0f} | {f'{p95:.1f} ms' if p95 is not None else '-'} | "
            f"{f'{first * 1e3:.0f} ms' if first is not None else '-'} | {f'{pss:.0f} MiB' if pss else '-'} | {cpu_txt} | "
            f"{f'{rate / b:.2f}x' if b else 'n/a'} | {r['check']} |"
        )
    return "\n".join(lines)


def write_table(rows: list[dict]) -> str:
    lines = [
        "| workload | contender | write MiB/s (median) | min - max | samples/s | peak tree PSS | vs datasetrt | bytes read back |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    base = {r["workload"]: median(r["mib"]) for r in rows if r["contender"] == OURS}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['contender']} | - | - | - | - | - | {r['error']} |")
            continue
        mib, b, pss = median(r["mib"]), base.get(r["workload"]), r.get("peak_pss_mib")
        lines.append(
            f"| {r['workload']} | {r['contender']} | {mib:,.0f} | {min(r['mib']):,.0f} - {max(r['mib']):,.0f} | "
            f"{median(r['rates']):,.0f} | {f'{pss:.0f} MiB' if pss else '-'} | {f'{mib / b:.2f}x' if b else 'n/a'} | {r['check']} |"
        )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"


def open_table(rows: list[dict]) -> str:
    lines = [
        "| caches | contender | open time (median) | min - max | first open (cold process) | peak tree PSS | time vs datasetrt | samples |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    base = {r["workload"]: median(r["seconds"]) for r in rows if r["contender"] == OURS and not r.get("error")}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['caches']:,} | {r['contender']} | - | - | - | - | - | {r['error']} |")
            continue
        sec, b, pss = median(r["seconds"]), base.get(r["workload"]), r.get("peak_pss_mib")
        lines.append(
            f"| {r['caches']:,} | {r['contender']} | {_ms(sec)} | {_ms(min(r['seconds']))} - {_ms(max(r['seconds']))} | "
            f"{_ms(r['first_s'])} | {f'{pss:.0f} MiB' if pss else '-'} | {f'{sec / b:.2f}x' if b else 'n/a'} | {r['check']} |"
        )
    return "\n".join(lines)


def summarize(rows: list[dict]) -> dict:
    """Per (config, contender) of loader-style runs (pass_n / pass_s / first_batch_s / build_s /
    peak_pss_mib, or `error`): samples/s of passes 2.. (pass 1 alone when it is the only one) and
    pass 1 apart, medians over repeats; failures kept as text."""
    out: dict = {}
    for r in rows:
        key = (r["config"], r["contender"])
        s = out.setdefault(
            key,
            {
                "config": r["config"],
                "contender": r["contender"],
                "rates": [],
                "first_pass_rates": [],
                "first_batch_s": [],
                "build_s": [],
                "pss_mib": [],
                "errors": [],
                "notes": [],
            },
        )
        if "error" in r:
            s["errors"].append(r["error"])
            continue
        rates = [n / t for n, t in zip(r["pass_n"], r["pass_s"])]
        s["first_pass_rates"].append(rates[0])
        s["rates"].extend(rates[1:] if len(rates) > 1 else rates)
        s["first_batch_s"].append(r["first_batch_s"])
        s["build_s"].append(r["build_s"])
        s["pss_mib"].append(r["peak_pss_mib"])
        if "exit_note" in r:
            s["notes"].append(r["exit_note"])
    for s in out.values():
        s["rate"], s["first_pass_rate"] = median(s["rates"]), median(s["first_pass_rates"])
        s["first_batch"], s["build"], s["pss"] = median(s["first_batch_s"]), median(s["build_s"]), median(s["pss_mib"])
    return out


def torch_table(rows: list[dict]) -> str:
    """The torch end to end (benchmarks.torch_batches rows): per config and contender, samples/s
    (median over passes 2.. and repeats), pass 1, first batch, PSS, and each ratio to
    `to_torch_dataloader` in the same config."""
    summary = summarize(rows)
    lines = [
        "| config | contender | samples/s (median) | min - max | pass 1 samples/s | first batch | peak tree PSS "
        "| samples/s vs to_torch_dataloader | bytes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    checks = {(r["config"], r["contender"]): r.get("check", "not compared") for r in rows}
    for (config, contender), s in summary.items():
        if s["rate"] is None:
            lines.append(
                f"| {config} | {contender} | **failed**: {'; '.join(dict.fromkeys(s['errors']))} | | | | | | |"
            )
            continue
        base = summary.get((config, TTD), {}).get("rate")
        ratio = f"{s['rate'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {config} | {contender} | {s['rate']:,.0f} | {min(s['rates']):,.0f} - {max(s['rates']):,.0f} | "
            f"{s['first_pass_rate']:,.0f} | {s['first_batch'] * 1e3:,.0f} ms | {s['pss']:,.0f} MiB | {ratio} | "
            f"{checks[(config, contender)]} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], sizes: dict[str, float], path: Path) -> None:
    """PNG of read MiB/s (median, ordered rows, first codec of each workload) by mean record size,
    one line per contender, log-log (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    chosen = [r for r in rows if r["workload"].endswith(" ordered") and not r.get("error") and r["mib"]]
    for contender in dict.fromkeys(r["contender"] for r in chosen):
        pts = {}
        for r in chosen:
            if r["contender"] == contender and r["base"] not in pts:  # first codec of each workload
                pts[r["base"]] = median(r["mib"])
        xs = sorted(pts, key=lambda k: sizes[k])
        ax.plot([sizes[k] / 1024 for k in xs], [pts[k] for k in xs], marker="o", label=contender)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean record size (KiB)")
    ax.set_ylabel("read MiB/s (median, ordered)")
    ax.set_title("Read throughput by record size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


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
