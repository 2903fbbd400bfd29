"""Measuring plumbing every benchmark shares: medians and repeats, per-repeat figures, output
digests, tree PSS, the fresh child process a contender runs in, ratio tables and the JSON record.

Boundary: imports no library under test (no datasetrt, dataset-rt or peer), so a peer's child
process holds only its own library; the heavier standard modules (subprocess, threading, hashlib)
load inside the functions that need them. Nothing here asserts a speed: figures are ratios
measured in the same run against the peers, medians over repeats with min and max, because the
machine is shared and noisy.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: every child process runs from here
DATASET_RT = "dataset-rt 0.4.8"  # the peer every benchmark measures against, as its rows name it


# ---------------------------------------------------------------------------- figures


def median(xs) -> float | None:
    """Median of `xs`, None when it is empty."""
    return statistics.median(xs) if xs else None


@dataclass
class Measurement:
    """One contender on one workload: `values` are per-repeat rates (higher is better) or seconds."""

    workload: str
    contender: str
    unit: str
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    """Run `fn` (returns one figure) `repeats` times with a GC between runs."""
    out = []
    for _ in range(repeats):
        gc.collect()
        out.append(fn())
    return out


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def new_result() -> dict:
    """The figure dict of one read contender's child: per-repeat rates / mib / p95_batch_ms,
    first_sample_s, the output digests, plus `note` / `error` text."""
    return {
        "rates": [],
        "mib": [],
        "p95_batch_ms": [],
        "first_sample_s": None,
        "digest": None,
        "multiset": None,
        "count": 0,
        "note": "",
        "error": None,
    }


def p95_ms(t0: float, stamps: list[float]) -> float | None:
    """95th percentile of the gaps between consecutive batch timestamps (first gap from t0), ms."""
    gaps = [b - a for a, b in zip([t0, *stamps], stamps)]
    if not gaps:
        return None
    return 1e3 * (statistics.quantiles(gaps, n=20)[-1] if len(gaps) > 1 else gaps[0])


def record_rep(
    result: dict, rep: int, repeats: int, n: int, nbytes: int, dt: float, t0: float, stamps: list[float]
) -> None:
    """Repeat 0 also computes the digests, so it is timed only when it is the only repeat."""
    if rep > 0 or repeats == 1:
        result["rates"].append(n / dt)
        result["mib"].append(nbytes / 2**20 / dt)
        p = p95_ms(t0, stamps)
        if p is not None:
            result["p95_batch_ms"].append(p)


class Digest:
    """Ordered digest (sha256 over length-prefixed payloads in delivery order) and an order-free
    multiset digest (sum of per-payload 128-bit blake2b values mod 2**128, plus the count)."""

    def __init__(self) -> None:
        import hashlib

        self._blake2b = hashlib.blake2b
        self.h = hashlib.sha256()
        self.acc = 0
        self.count = 0

    def add(self, payload) -> None:
        mv = memoryview(payload).cast("B")
        self.h.update(len(mv).to_bytes(8, "little"))
        self.h.update(mv)
        self.acc = (self.acc + int.from_bytes(self._blake2b(mv, digest_size=16).digest(), "little")) % (1 << 128)
        self.count += 1

    def result(self) -> dict:
        return {"digest": self.h.hexdigest(), "multiset": f"{self.count}:{self.acc:032x}", "count": self.count}

    @classmethod
    def of(cls, payloads: Iterable) -> dict:
        """result() of the digests of `payloads`, in order."""
        d = cls()
        for p in payloads:
            d.add(p)
        return d.result()


# ---------------------------------------------------------------------------- memory: tree PSS


def _pss_tool():
    """datasetrt/cli/pss.py, the `datasetrt pss` sampler. Its import loads only the package's
    errors module besides psutil and the standard library (datasetrt/__init__.py and
    datasetrt/cli/__init__.py export lazily), so measured processes, the peers' too, carry
    nothing else of datasetrt."""
    from datasetrt.cli import pss

    return pss


def tree_pss_bytes(root=None) -> int:
    """Sum of PSS over psutil.Process `root` (default: this process) and all its live descendants,
    in bytes (datasetrt.cli.pss.sample_tree: psutil memory_full_info of each)."""
    import psutil

    return sum(r["pss"] for r in _pss_tool().sample_tree(root or psutil.Process(), {}))


class PeakPss:
    """Samples tree PSS (tree_pss_bytes of `root`, default this process) every `interval_s` in a
    background thread from `with` to its end; `peak` and `last` in bytes."""

    def __init__(self, interval_s: float = 0.05, root=None) -> None:
        import threading

        import psutil

        self.interval_s = interval_s
        self.root = root or psutil.Process()
        self.peak = 0
        self.last = 0
        self._sample_tree = _pss_tool().sample_tree
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> int:
        value = sum(r["pss"] for r in self._sample_tree(self.root, self._names))
        self.last = value
        self.peak = max(self.peak, value)
        return value

    def __enter__(self) -> PeakPss:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# ---------------------------------------------------------------------------- child processes


@dataclass
class Child:
    """How one child process ended: `figures` is the last stdout line that is a JSON object (what
    a `--child` entry point prints), None when there is none."""

    figures: dict | None
    returncode: int
    stderr: str
    timed_out: bool
    timeout_s: float | None = None
    peak_pss_bytes: int | None = None

    def tail(self, lines: int = 2, chars: int = 300) -> str:
        """The last `lines` non-empty stderr lines, joined, at most `chars` characters."""
        kept = [ln.strip() for ln in self.stderr.strip().splitlines() if ln.strip()]
        return " / ".join(kept[-lines:])[-chars:] or "(no stderr)"

    def failure(self, lines: int = 2) -> str | None:
        """'timed out after N s: ...' or 'exit N: ...' (stderr tail), None for a clean run."""
        if self.timed_out:
            return f"timed out after {self.timeout_s:.0f} s: {self.tail(lines)}"
        if self.returncode != 0 or self.figures is None:
            return f"exit {self.returncode}: {self.tail(lines)}"
        return None


def child_process(
    args: list[str], timeout_s: float | None = None, peak_pss: bool = False, python: str | None = None
) -> Child:
    """Run `python ARGS` (this interpreter, or `python`: another venv's) in a fresh process, from the checkout root, in its own
    session, and wait for it to exit (its output goes to temporary files, so a descendant that
    keeps them open cannot stall the wait). On the timeout, or any exception here (Ctrl-C
    included), the whole session is killed (SIGKILL: the child and its workers, nothing else)
    before the child is reaped. With `peak_pss` the child's process tree is sampled from this
    process (PeakPss, every 50 ms) while it runs, so this process's memory is not in the figure."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [python or sys.executable, *args], stdout=out, stderr=err, text=True, cwd=ROOT, start_new_session=True
        )
        sampler = None
        timed_out = False
        try:
            if peak_pss:
                import psutil

                sampler = PeakPss(root=psutil.Process(proc.pid)).__enter__()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_session(proc.pid)
                proc.wait()
        except BaseException:
            _kill_session(proc.pid)
            proc.wait()
            raise
        finally:
            if sampler is not None:
                sampler.__exit__(None, None, None)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    figures = None
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            figures = json.loads(line)
            break
    peak = sampler.peak if sampler is not None else None
    return Child(figures, proc.returncode, stderr, timed_out, timeout_s, peak)


def _kill_session(pid: int) -> None:
    """SIGKILL every process of the session `pid` leads (child_process's child and its workers)."""
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole session has already exited
        pass


# ---------------------------------------------------------------------------- reports


def machine_facts() -> dict:
    import psutil

    return {
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def ratio_table(measurements: list[Measurement], baseline: str) -> str:
    """Markdown table: one row per (workload, contender), median [min-max], ratio of datasetrt to it."""
    by_workload: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_workload.setdefault(m.workload, []).append(m)
    lines = ["| workload | contender | median | min - max | datasetrt / contender |", "|---|---|---:|---:|---:|"]
    for workload, ms in by_workload.items():
        base = next((m for m in ms if m.contender == baseline), None)
        for m in ms:
            if base is None or not m.values:
                ratio = ""
            elif m.higher_is_better:
                ratio = f"{base.median / m.median:.2f}x"
            else:
                ratio = f"{m.median / base.median:.2f}x"
            lines.append(
                f"| {workload} | {m.contender} | {_fmt(m.median)} {m.unit} | {_fmt(min(m.values))} - {_fmt(max(m.values))} | {ratio} |"
            )
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.4f}"


def save_json(path: Path, measurements: list[Measurement], extra: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"machine": machine_facts(), **extra, "measurements": [asdict(m) for m in measurements]}, indent=2)
    )


def exit_on_different_bytes(failures: list[str]) -> None:
    """End of a run: list the byte mismatches and exit 1, or say that every contender agreed."""
    if failures:
        print("\nDIFFERENT BYTES:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nall contenders produced the same bytes")


def child_figures(module: str, spec: dict, timeout_s: float) -> dict:
    """`python -m MODULE --child SPEC` (child_process); its figures, or {"error": text} when it timed
    out or printed none. A child that printed its figures and then exited non-zero (e.g. an abort
    at teardown) keeps its figures, with the exit noted in "exit_note"."""
    child = child_process(["-m", module, "--child", json.dumps(spec)], timeout_s=timeout_s)
    if child.timed_out or child.figures is None:
        return {"error": child.failure()}
    if child.returncode != 0:
        child.figures["exit_note"] = f"exit {child.returncode} after its figures: {child.tail()}"
    return child.figures
