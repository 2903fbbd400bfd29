"""The report of the object-storage benchmark (benchmarks.remote): the table, the issue's targets
checked against it, and the figure, from the run's JSON document (a live run or `--report`).

Definitions (every figure is a median over a row's repeats unless marked max):
- first batch: seconds until the first batch is in the consumer's hands; for the cold pass from
  the dataset's construction (its index fetch included), for the warm pass from the pass's start.
- epoch samples/s: samples / pass seconds (the cold pass from the dataset's construction).
- steady samples/s: (samples - the first batch's) / (pass seconds - first batch seconds): the rate
  once the first batch is out. In a cold pass it counts what a loader downloaded before its first
  batch as free, so a loader that buffers more before its first batch shows a higher steady rate
  (it can exceed the link); "MiB by then" (what the link carried until the first batch) shows it.
- downloaded / stored: body bytes the proxy served during the pass over the bytes the tool
  stored (its whole store: index and metadata files included); one node, one epoch.
- peak local disk: the most blocks the contender's cache directory held during the child, plus
  the files removed from it that a process of the child still holds open (their blocks stay
  allocated); the sampled maximum, so a short-lived peak between two samples can be missed.
- peak PSS: the child's whole process tree (workers and helpers included).

Boundary: reads the document only; no servers, no children. matplotlib is imported only to plot.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

OURS = "datasetrt"
PEERS = ("MosaicML Streaming", "LitData")
FLOOR = "GET floor (obstore)"
REMOTE, LOCAL, LIMIT = "remote", "local disk", "limit"
PASSES = ("cold", "warm")
TARGET_AHEAD = 1.0
TARGET_DOWNLOADS = 1.05
TARGET_WARM_VS_LOCAL = 0.9


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rate_mib_s(rate: str | None) -> float | None:
    """tc's rate ("800mbit", "1gbit", "100mbps") in MiB/s of payload-and-framing bytes."""
    if not rate:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", rate.strip().lower())
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    bytes_s = float(m.group(1)) * scale / (8 if m.group(3) == "bit" else 1)
    return bytes_s / 2**20


def steady(p: dict) -> float:
    """Samples/s after the first batch (the whole pass when it had a single batch)."""
    first_s, first_n = p.get("first_batch_s") or 0.0, p.get("first_n") or 0
    rest_s = p["s"] - first_s
    return (p["samples"] - first_n) / rest_s if rest_s > 0 and p["samples"] > first_n else p["samples"] / p["s"]


def label(row: dict, doc: dict) -> str:
    if row["contender"] != OURS or row.get("variant", REMOTE) == REMOTE:
        return row["contender"]
    if row["variant"] == LOCAL:
        return f"{OURS}, local disk"
    return f"{OURS}, limit {row['limit_bytes'] / 2**20:.0f} MiB (W={row['window_shards']})"


def pass_label(row: dict, name: str) -> str:
    if row.get("variant") == LOCAL:
        return {"cold": "1st pass", "warm": "2nd pass"}[name]
    return name


def summarize_row(row: dict, stored: float) -> dict:
    """{pass: figures} of a row's successful runs, plus run-wide figures."""
    runs = [r for r in row["runs"] if not r.get("error")]
    out: dict = {}
    if not runs:
        return out
    for name in PASSES:
        ps = [r["passes"][name] for r in runs]
        st = [steady(p) for p in ps]
        out[name] = {
            "first_batch_s": med([p["first_batch_s"] or 0.0 for p in ps]),
            "steady": med(st),
            "steady_range": (min(st), max(st)),
            "epoch": med([p["samples"] / p["s"] for p in ps]),
            "epoch_range": (min(p["samples"] / p["s"] for p in ps), max(p["samples"] / p["s"] for p in ps)),
            "first_mib": med([p["link_bytes_first_batch"] / 2**20 for p in ps if p.get("link_bytes_first_batch")]),
            "downloaded": med([p["served"]["bytes"] / stored for p in ps]) if stored else None,
            "downloaded_max": max(p["served"]["bytes"] / stored for p in ps) if stored else None,
            "gets": med([p["served"]["gets"] for p in ps]),
            "ranged": med([p["served"]["ranged_gets"] for p in ps]),
            "in_flight": max(p["served"].get("peak_gets_in_flight", 0) for p in ps),
            "requests": max(p["served"]["requests"] for p in ps),
        }
    paired = [r for r in runs if r.get("local_paired_s") and r.get("warm_all_s")]
    if paired:  # the local-disk reference read in the same process, between the warm epochs
        out["paired_ratio"] = [
            statistics.median(r["local_paired_s"]) / statistics.median(r["warm_all_s"]) for r in paired
        ]
        out["paired_local_epoch"] = med(
            [r["passes"]["warm"]["samples"] / statistics.median(r["local_paired_s"]) for r in paired]
        )
        out["paired_warm_epoch"] = med(
            [r["passes"]["warm"]["samples"] / statistics.median(r["warm_all_s"]) for r in paired]
        )
    out["peak_disk_mib"] = med([r.get("peak_disk_bytes", 0) / 2**20 for r in runs])
    out["peak_disk_max_mib"] = max(r.get("peak_disk_bytes", 0) / 2**20 for r in runs)
    out["peak_unlinked_max_mib"] = max(r.get("peak_unlinked_bytes", 0) / 2**20 for r in runs)
    out["pss_mib"] = med([r["peak_pss_mib"] for r in runs if r.get("peak_pss_mib") is not None])
    out["errors"] = max(r["served_all"]["errors"] for r in runs)
    out["repeats"] = len(runs)
    out["load"] = [r.get("load") for r in runs]
    return out


COLUMNS = (
    "transport",
    "contender",
    "where",
    "cache",
    "first batch s (MiB by then)",
    "epoch samples/s (min-max)",
    "steady samples/s",
    "downloaded / stored (max)",
    "GETs (ranged) / most in flight",
    "peak local disk MiB",
    "peak PSS MiB",
    "datasetrt ahead: epoch / steady / first batch",
)


def _summaries(rows: list[dict], doc: dict) -> dict[tuple, dict]:
    stored = {k: v["stored_bytes"] for k, v in doc.get("stores", {}).items()}
    for row in rows:
        row["summary"] = summarize_row(row, stored.get(row["contender"], 0))
    return {
        (r["transport"], r["where"], r.get("variant", REMOTE)): r["summary"]
        for r in rows
        if r["contender"] == OURS and r["summary"]
    }


def table(rows: list[dict], floors: list[dict], doc: dict) -> str:
    """Markdown: two lines (cold, warm) per (transport, contender, where), then the GET floors."""
    ours = _summaries(rows, doc)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---|---|---|" + "---:|" * (len(COLUMNS) - 4)]
    empty = " |" * (len(COLUMNS) - 5)
    for row in rows:
        s = row["summary"]
        name = label(row, doc)
        head = f"| {row['transport']} | {name} | {row['where']} |"
        if row.get("skipped"):
            lines.append(f"{head} | skipped: {row['skipped']} |{empty}")
            continue
        if not s:
            err = next((r.get("error") for r in row["runs"] if r.get("error")), "no run")
            lines.append(f"{head} | error: {str(err).splitlines()[0][:160]} |{empty}")
            continue
        failed = len(row["runs"]) - s["repeats"]
        if failed:
            head = f"| {row['transport']} | {name} | {row['where']} ({failed} of {len(row['runs'])} runs failed) |"
        base = ours.get((row["transport"], row["where"], REMOTE))
        for pname in PASSES:
            p = s[pname]
            lo, hi = p["epoch_range"]
            ahead = ""
            if row["contender"] != OURS and base:
                b = base[pname]
                ahead = (
                    f"{b['epoch'] / p['epoch']:.2f}x / {b['steady'] / p['steady']:.2f}x / "
                    f"{p['first_batch_s'] / max(b['first_batch_s'], 1e-3):.2f}x"
                )
            first = f"{p['first_batch_s']:.2f}" + (f" ({p['first_mib']:.0f})" if p["first_mib"] else "")
            dl = "" if p["downloaded"] is None else f"{p['downloaded']:.3f} ({p['downloaded_max']:.3f})"
            disk = f"{s['peak_disk_mib']:.1f}"
            if row.get("limit_bytes"):
                disk += (
                    f" (max {s['peak_disk_max_mib']:.1f}, removed but open {s['peak_unlinked_max_mib']:.1f};"
                    f" limit {row['limit_bytes'] / 2**20:.1f})"
                )
            lines.append(
                f"{head} {pass_label(row, pname)} | {first} | {p['epoch']:,.0f} ({lo:,.0f}-{hi:,.0f}) |"
                f" {p['steady']:,.0f} | {dl} | {p['gets']:.0f} ({p['ranged']:.0f}) / {p['in_flight'] or '-'} |"
                f" {disk} | {s['pss_mib']:.0f} | {ahead} |"
            )
    link = rate_mib_s(doc.get("rate"))
    for f in floors:
        head = f"| {f['transport']} | {FLOOR} | {f['concurrency']} in flight | |"
        if f.get("error"):
            lines.append(f"{head} error: {f['error'].splitlines()[0][:160]} |{empty}")
            continue
        xs = f["rates"]
        share = f"; {med(xs) / link:.0%} of the link" if link else ""
        lines.append(
            f"{head} | {med(xs):.1f} MiB/s ({min(xs):.1f}-{max(xs):.1f}){share} | | {f['bytes'] / 2**20:.1f} MiB per pass |"
            f" {f['gets']} (0) / {f['concurrency']} | | | |"
        )
    notes = [e for row in rows for e in row.get("errors", [])]
    if notes:
        lines += ["", "failed runs (their figures are not in the medians):"]
        lines += [f"- {e.splitlines()[0][:300]}" for e in notes]
    return "\n".join(lines)


def targets(rows: list[dict], doc: dict) -> str:
    """The issue's targets, each with the figures that decide it and met / NOT met."""
    ours = _summaries(rows, doc)
    out = ["targets:"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    out.append("- ahead of both peers on samples/s (epoch; steady) and on first batch, every row:")
    for row in rows:
        if row["contender"] != OURS or row.get("variant") != REMOTE or not row["summary"]:
            continue
        for pname in PASSES:
            b = row["summary"][pname]
            parts = []
            for peer in PEERS:
                prow = next(
                    (
                        r
                        for r in rows
                        if r["contender"] == peer and r["transport"] == row["transport"] and r["where"] == row["where"]
                    ),
                    None,
                )
                if prow is None or not prow.get("summary"):
                    continue
                p = prow["summary"][pname]
                parts.append(
                    f"{peer} {p['epoch']:,.0f} ({verdict(b['epoch'] > p['epoch'])}); {p['steady']:,.0f} "
                    f"({verdict(b['steady'] > p['steady'])}); {p['first_batch_s']:.2f} s "
                    f"({verdict(b['first_batch_s'] < p['first_batch_s'])})"
                )
            if parts:
                out.append(
                    f"  - {row['transport']}, {row['where']}, {pname}: datasetrt {b['epoch']:,.0f}; "
                    f"{b['steady']:,.0f}; {b['first_batch_s']:.2f} s | " + " | ".join(parts)
                )
    out.append(f"- downloads per node per epoch <= {TARGET_DOWNLOADS}x the stored dataset (locality order):")
    for row in rows:
        if row["contender"] != OURS or row.get("variant") == LOCAL or not row["summary"]:
            continue
        for pname in PASSES:
            p = row["summary"][pname]
            if p["downloaded_max"] is None:
                continue
            out.append(
                f"  - {row['transport']}, {label(row, doc)}, {row['where']}, {pname}: {p['downloaded']:.3f}x "
                f"(max {p['downloaded_max']:.3f}x): {verdict(p['downloaded_max'] <= TARGET_DOWNLOADS)}"
            )
    out.append(
        f"- warm samples/s >= {TARGET_WARM_VS_LOCAL}x the same cache read from local disk (decided on the "
        "paired reads: the local copy read between the warm epochs in the same process, same orders; the "
        "separate local-disk row's 2nd pass beside it):"
    )
    for (transport, where, variant), s in ours.items():
        if variant != REMOTE:
            continue
        local = ours.get((transport, where, LOCAL))
        row = f"  - {transport}, {where}:"
        if s.get("paired_ratio"):
            r = med(s["paired_ratio"])
            runs = ", ".join(f"{x:.2f}" for x in s["paired_ratio"])
            row += (
                f" paired {s['paired_warm_epoch']:,.0f} vs {s['paired_local_epoch']:,.0f} samples/s = {r:.2f}x "
                f"(runs {runs}): {verdict(r >= TARGET_WARM_VS_LOCAL)};"
            )
        if local:
            r = s["warm"]["epoch"] / local["warm"]["epoch"]
            row += f" separate children {s['warm']['epoch']:,.0f} vs {local['warm']['epoch']:,.0f} = {r:.2f}x"
        out.append(row)
    out.append("- peak local disk <= the configured limit:")
    for row in rows:
        if row.get("variant") == LIMIT and row["summary"]:
            s = row["summary"]
            lim = row["limit_bytes"] / 2**20
            out.append(
                f"  - {row['transport']}, {row['where']}: max {s['peak_disk_max_mib']:.1f} MiB (of which "
                f"{s['peak_unlinked_max_mib']:.1f} in removed files still open) of {lim:.1f}: "
                f"{verdict(s['peak_disk_max_mib'] <= lim)}"
            )
    return "\n".join(out)


def header(doc: dict) -> str:
    loads = [x[0] for x in doc.get("load", []) if x]
    load = f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}" if loads else "load average not recorded"
    return (
        f"machine: {doc['machine']}; mode={doc['mode']}, {doc['records']} records x {doc['record_bytes']} B "
        f"({doc['records'] * doc['record_bytes'] / 2**20:.0f} MiB), shards {doc['shard_bytes'] >> 20} MiB, "
        f"batch 256, window_shards {doc.get('window_shards', 8)}, cold repeats {doc.get('repeats', '?')}, "
        f"wall {doc['wall_s']:.0f} s ({doc.get('started_utc', '?')} - {doc.get('ended_utc', '?')} UTC), {load}\n"
        f"network: {doc.get('network', 'unshaped (loopback)')}"
    )


def plot(doc: dict, path: Path) -> None:
    """Four panels of the https block (http when there is none): bytes over the link through the
    cold epoch (in-process, first repeat; dot: first batch), epoch samples/s cold, epoch samples/s
    warm (with the local-disk reference), first batch of the cold epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    _summaries(rows, doc)
    transport = "https" if any(r["transport"] == "https" for r in rows) else rows[0]["transport"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    ax = axes[0][0]
    xmax = 0.0
    for row in rows:
        if row["transport"] != transport or row["where"] != "in-process" or row.get("variant") == LOCAL:
            continue
        run = next((r for r in row["runs"] if not r.get("error") and r.get("timeline")), None)
        if run is None:
            continue
        cold = run["passes"]["cold"]
        t0, t1 = cold["wall"]
        pts = [(t - t0, b) for t, b in run["timeline"] if t0 - 0.1 <= t <= t1 + 0.1]
        if len(pts) < 2:
            continue
        b0 = pts[0][1]
        (line,) = ax.plot([t for t, _ in pts], [(b - b0) / 2**20 for _, b in pts], label=label(row, doc))
        fb = cold["first_batch_s"] or 0.0
        near = min(pts, key=lambda p: abs(p[0] - fb))
        ax.plot([fb], [(near[1] - b0) / 2**20], "o", color=line.get_color())
        xmax = max(xmax, pts[-1][0])
    link = rate_mib_s(doc.get("rate"))
    if link and xmax:
        top = max(s["stored_bytes"] for s in doc["stores"].values()) / 2**20 * 1.1
        ax.plot([0, top / link], [0, top], "k--", lw=0.8, label=f"link rate ({doc['rate']})")
    ax.set_xlabel("seconds since the dataset's construction")
    ax.set_ylabel("MiB carried by the link")
    ax.set_title(f"{transport}, in-process, cold epoch: downloads over time (dot: first batch)")
    ax.legend(fontsize=8)

    groups = [r for r in rows if r["transport"] == transport and r.get("summary") and not r.get("skipped")]

    def bars(ax, picked, value, title, xlabel, extra=None):
        entries = []
        for r in picked:
            entries.append((f"{label(r, doc)}, {r['where']}", value(r), "C0" if r["contender"] == OURS else "C1"))
            if extra is not None and extra(r) is not None:
                entries.append((f"{label(r, doc)}, {r['where']}: local disk, paired", extra(r), "C2"))
        names = [e[0] for e in entries]
        vals = [e[1] for e in entries]
        ys = list(range(len(entries)))
        ax.barh(ys, vals, color=[e[2] for e in entries])
        for y, v in zip(ys, vals):
            ax.text(v, y, f" {v:,.2f}" if v < 100 else f" {v:,.0f}", va="center", fontsize=7)
        ax.set_yticks(ys)
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title)
        ax.set_xlabel(xlabel)

    remote = [r for r in groups if r.get("variant") != LOCAL]
    bars(axes[0][1], remote, lambda r: r["summary"]["cold"]["epoch"], "cold epoch: samples/s", "samples/s")
    bars(
        axes[1][0],
        groups,
        lambda r: r["summary"]["warm"]["epoch"],
        "warm epoch (local disk: its 2nd pass; paired: read between the warm epochs): samples/s",
        "samples/s",
        extra=lambda r: r["summary"].get("paired_local_epoch"),
    )
    bars(axes[1][1], remote, lambda r: r["summary"]["cold"]["first_batch_s"], "cold epoch: first batch", "seconds")
    loads = [x[0] for x in doc.get("load", []) if x]
    fig.suptitle(
        f"S3 (moto) through a shaped link: {doc.get('rate') or 'loopback'}, "
        f"{doc.get('latency_ms', 0):g} ms first-byte latency; {doc['records']} x 16 KiB records, "
        f"{doc['shard_bytes'] >> 20} MiB shards; {doc.get('started_utc', '')} UTC, "
        f"load {min(loads or [0]):.1f}-{max(loads or [0]):.1f} on {doc['machine']['cpu_count']} CPUs",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
