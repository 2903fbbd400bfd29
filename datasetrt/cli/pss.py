"""`datasetrt pss`: the memory of a whole process tree: PSS, USS, RSS and shared (RSS - USS) per process.

    datasetrt pss [options] -- COMMAND [ARG ...]   run COMMAND and sample its process tree
    datasetrt pss [options] --pid PID              attach to a running process and its descendants

(`scripts/pss` in a checkout is the same tool.) Boundary: psutil and the standard library only
(matplotlib for --png, imported only then); knows nothing of caches or datasetrt's runtime.

Every --interval seconds (default 0.1) the tree (the process and all its descendants, found
through their parent links) is sampled with psutil's memory_full_info (/proc/PID/smaps_rollup),
until it exits or --duration seconds have passed. The report (on stderr, so the command's own
stdout stays clean) gives, per process and for the tree, the peak and the steady value (the median
of the last half of the samples) of each figure, in MiB.

PSS (proportional set size) charges each shared page 1/n to each of the n processes mapping it,
so the tree's total PSS counts each page once; summed RSS counts shared pages once per process.
USS is the memory only that process maps; shared = RSS - USS. Kernel page cache that no process
maps (e.g. files read with pread) is not in any of these figures.

Phase marks: in command mode the command inherits PSS_MARK_FILE, a path. A program that appends
the lines "steady-start <unix time>" and "steady-end <unix time>" to it restricts the steady value
to the samples taken between the two marks (still the median of the last half of them);
benchmarks/memory.py marks its epoch this way. Without marks the whole run counts.

Exit code: the command's (128 + N when it died of signal N); 0 with --pid; 2 on a usage error
(including --png without matplotlib, which `pip install "datasetrt[bench]"` installs); 127 when the
command cannot be started. With a command,
--duration ends it like timeout(1): SIGTERM, then SIGKILL 5 s later. Ctrl-C reaches the command
(same process group) and sampling goes on until it exits; with --pid, Ctrl-C stops sampling. Descendants that detach from the tree
(double fork, reparented to init) are no longer seen.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

MIB = 2**20
FIGURES = ("pss", "uss", "rss", "shared")
CSV_COLUMNS = ["t_s", "unix_time", "pid", "ppid", "name", "pss_bytes", "uss_bytes", "rss_bytes", "shared_bytes"]
MARK_ENV = "PSS_MARK_FILE"


def short_name(proc: psutil.Process, width: int = 48) -> str:
    try:
        cmd = proc.cmdline()
        text = " ".join([os.path.basename(cmd[0]), *cmd[1:]]) if cmd else proc.name()
    except psutil.Error:
        text = "?"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def sample_tree(root: psutil.Process, names: dict[int, str]) -> list[dict]:
    """One sample of `root` and its live descendants: pid, ppid, name, pss/uss/rss/shared bytes."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = [root]
    rows = []
    for proc in procs:
        try:
            info = proc.memory_full_info()
            ppid = proc.ppid()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue  # exited (or not ours) between listing and reading
        if info.rss == 0:
            continue  # exiting: its address space is already gone
        if proc.pid not in names:
            names[proc.pid] = short_name(proc)
        rows.append(
            {
                "pid": proc.pid,
                "ppid": ppid,
                "name": names[proc.pid],
                "pss": info.pss,
                "uss": info.uss,
                "rss": info.rss,
                "shared": info.rss - info.uss,
            }
        )
    return rows


def steady_value(values: list[float]) -> float:
    """Median of the last half of `values` (the last one alone when there is one)."""
    if not values:
        return 0.0
    return float(statistics.median(values[len(values) // 2 :]))


def read_marks(path: str | None) -> dict[str, float]:
    marks: dict[str, float] = {}
    if not path or not os.path.exists(path):
        return marks
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0] in ("steady-start", "steady-end"):
                try:
                    marks.setdefault(parts[0], float(parts[1]))
                except ValueError:
                    pass
    return marks


def summarize(samples: list[tuple[float, list[dict]]], marks: dict[str, float]) -> dict:
    """Peak (all samples) and steady (median of the last half, inside the marks if any) per process
    and for the tree total."""
    lo, hi = marks.get("steady-start", float("-inf")), marks.get("steady-end", float("inf"))
    in_window = [(t, rows) for t, rows in samples if lo <= t <= hi] or samples
    per_proc: dict[int, dict] = {}
    for t, rows in samples:
        for r in rows:
            p = per_proc.setdefault(
                r["pid"],
                {
                    "pid": r["pid"],
                    "ppid": r["ppid"],
                    "name": r["name"],
                    "samples": 0,
                    "first_t": t,
                    **{f: [] for f in FIGURES},
                    **{f"w_{f}": [] for f in FIGURES},
                },
            )
            p["samples"] += 1
            for f in FIGURES:
                p[f].append(r[f])
                if lo <= t <= hi:
                    p[f"w_{f}"].append(r[f])
    processes = []
    for p in sorted(per_proc.values(), key=lambda p: (p["first_t"], p["pid"])):
        out = {k: p[k] for k in ("pid", "ppid", "name", "samples")}
        for f in FIGURES:
            out[f"peak_{f}"] = max(p[f])
            out[f"steady_{f}"] = steady_value(p[f"w_{f}"] or p[f])
        processes.append(out)
    totals = {f: [sum(r[f] for r in rows) for _, rows in samples] for f in FIGURES}
    wtotals = {f: [sum(r[f] for r in rows) for _, rows in in_window] for f in FIGURES}
    total: dict[str, float] = {"processes": len(processes), "samples": len(samples)}
    for f in FIGURES:
        total[f"peak_{f}"] = max(totals[f], default=0)
        total[f"steady_{f}"] = steady_value(wtotals[f])
    return {
        "processes": processes,
        "total": total,
        "marks": marks,
        "steady_samples": len(in_window) - len(in_window) // 2,
    }


def report(summary: dict, header: str) -> str:
    cols = "  ".join(f"{f'{f.upper()} peak':>10} {'steady':>8}" for f in FIGURES)
    lines = [header, f"{'pid':>8}  {'process':48}  {cols}  samples"]

    def row(pid: str, name: str, d: dict, n: int) -> str:
        figs = "  ".join(f"{d[f'peak_{f}'] / MIB:>10.1f} {d[f'steady_{f}'] / MIB:>8.1f}" for f in FIGURES)
        return f"{pid:>8}  {name:48}  {figs}  {n:>7}"

    for p in summary["processes"]:
        lines.append(row(str(p["pid"]), p["name"], p, p["samples"]))
    t = summary["total"]
    lines.append(row("total", f"({t['processes']} processes)", t, t["samples"]))
    lines.append(
        "MiB; steady = median of the last half of the samples"
        + (" between the steady-start/steady-end marks" if summary["marks"] else "")
        + "; total peak = peak of the per-sample sum;"
        " total RSS counts a shared page once per process mapping it, total PSS once"
    )
    return "\n".join(lines)


def write_csv(path: str, samples: list[tuple[float, list[dict]]], t0: float) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for t, rows in samples:
            for r in rows:
                w.writerow([f"{t - t0:.4f}", f"{t:.4f}", r["pid"], r["ppid"], r["name"], *(r[k] for k in FIGURES)])
            w.writerow(
                [
                    f"{t - t0:.4f}",
                    f"{t:.4f}",
                    "total",
                    "",
                    f"{len(rows)} processes",
                    *(sum(r[k] for r in rows) for k in FIGURES),
                ]
            )


def write_png(
    path: str, samples: list[tuple[float, list[dict]]], t0: float, marks: dict[str, float], title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ts = [t - t0 for t, _ in samples]
    ax.plot(ts, [sum(r["pss"] for r in rows) / MIB for _, rows in samples], label="total PSS")
    ax.plot(ts, [sum(r["uss"] for r in rows) / MIB for _, rows in samples], label="total USS", linestyle="--")
    for name, t in marks.items():
        ax.axvline(t - t0, color="grey", linestyle=":", label=name)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(title[:100])
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv: list[str], prog: str = "datasetrt pss") -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pid", type=int, default=None, help="attach to this process (and its descendants)")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples (default 0.1)")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument(
        "--csv", default=None, metavar="FILE", help="write every sample (one row per process, plus a 'total' row)"
    )
    parser.add_argument(
        "--png",
        default=None,
        metavar="FILE",
        help="plot total PSS (and USS) over time (needs matplotlib: the bench extra)",
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="write the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no report on stderr")
    args = parser.parse_args(argv)
    if (args.pid is None) == (not command):
        parser.error("give either --pid PID or -- COMMAND ...")
    if args.interval <= 0:
        parser.error("--interval must be positive")
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.exit(
                2,
                f"{prog}: --png needs matplotlib, which is not installed in this environment "
                f'({sys.executable}): install datasetrt\'s bench extra (pip install "datasetrt[bench]") '
                "or matplotlib, or drop --png\n",
            )
    return args, command


def main(argv: list[str], prog: str = "datasetrt pss") -> int:
    """Run the tool on `argv` (the arguments after `datasetrt pss`); returns the exit code."""
    args, command = parse_args(argv, prog)
    child: subprocess.Popen | None = None
    mark_file = None
    if command:
        fd, mark_file = tempfile.mkstemp(prefix="pss-marks-")
        os.close(fd)
        try:
            child = subprocess.Popen(command, env={**os.environ, MARK_ENV: mark_file})
        except OSError as exc:
            os.unlink(mark_file)
            print(f"{prog}: cannot run {command[0]!r}: {exc}", file=sys.stderr)
            return 127
        root = psutil.Process(child.pid)
        label = " ".join(" ".join(command).split())
    else:
        try:
            root = psutil.Process(args.pid)
        except psutil.NoSuchProcess:
            print(f"{prog}: no process {args.pid}", file=sys.stderr)
            return 2
        label = f"pid {args.pid} ({short_name(root)})"
    if child is not None:
        # Ctrl-C goes to the whole foreground group: the command decides; we sample until it exits.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    names: dict[int, str] = {}
    samples: list[tuple[float, list[dict]]] = []
    t0 = time.time()
    deadline = t0 + args.duration if args.duration is not None else None
    timed_out = False

    def alive() -> bool:
        if child is not None:
            return child.poll() is None
        try:
            return root.is_running() and root.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    try:
        while alive():
            now = time.time()
            rows = sample_tree(root, names)
            if rows:
                samples.append((now, rows))
            if deadline is not None and time.time() >= deadline:
                timed_out = True
                break
            time.sleep(max(0.0, args.interval - (time.time() - now)))
    except KeyboardInterrupt:  # --pid mode: Ctrl-C ends the sampling, not the process
        pass
    elapsed = time.time() - t0
    code = 0
    if child is not None:
        if timed_out and child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
        rc = child.wait()
        code = 128 - rc if rc < 0 else rc
    marks = read_marks(mark_file)
    if mark_file:
        os.unlink(mark_file)
    summary = summarize(samples, marks)
    how = (
        ("stopped by --duration" if timed_out else f"exited with code {code}")
        if child is not None
        else ("sampling stopped by --duration" if timed_out else "exited")
    )
    header = f"{prog}: {label[:120]} {how} after {elapsed:.2f} s; {len(samples)} samples every {args.interval:g} s"
    summary.update(
        {
            "command": command or None,
            "pid": root.pid,
            "exit_code": code if child is not None else None,
            "elapsed_s": elapsed,
            "interval_s": args.interval,
            "timed_out": timed_out,
        }
    )
    if args.csv:
        write_csv(args.csv, samples, t0)
    if args.png and samples:
        write_png(args.png, samples, t0, marks, label)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if not args.quiet:
        print(report(summary, header), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
