"""Short epochs: what starting a batch read costs, against what the epoch reads.

Workload: one cache of 4,000 records of 150 KiB (incompressible bytes), read as batches of 256 by
`DatasetRuntime(num_workers=2)` (spawn, the default) with `ReaderConfig(seed=0)`, at epoch sizes
of 500, 4,000 and 40,000 records (`set_epoch_len`: the window draws from the 4,000 records, so
every size reads the same files, warm in the page cache). Each run is a fresh process (the
runtime, its workers and its ring start from nothing, as in the issue's side-by-side runs).

Figures per run (the child measures, from before `DatasetRuntime()` is created; imports
excluded): samples/s over the whole epoch (start-up included: that is what a short epoch pays),
time to first batch, CPU seconds of the tree (user + system of the child from that point, plus
its reaped workers and zygote: less sensitive than wall time to other load on the machine), and tree PSS (the child and its workers: `datasetrt.cli.pss` sampling from
the parent every 50 ms, so the sampler is not in the tree; `peak`) plus the tree PSS the child
measures right after its last batch (`end`).

Trees: `--tree LABEL=PATH` (repeatable) runs the same child against the datasetrt package of
another checkout (PATH holds `datasetrt/` with its compiled `_native/*.so`): the runs alternate
tree by tree within each repeat, so a before/after table is measured under the same load. Each
tree is byte-compiled first (under a PYTHONPYCACHEPREFIX in the workdir: no run compiles what it
imports lazily, and nothing is written into the trees) and run once uncounted.

Usage:
  python -m benchmarks.startup [--sizes 500,4000,40000] [--repeats 5] [--workdir DIR]
      [--tree before=/tmp/base --tree after=.] [--out bench-out/startup.json]
  python -m benchmarks.startup --child SPEC      one run (what the parent starts)

Boundary: measures; asserts no speed (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, child_process, machine_facts

RECORD_BYTES = 150 << 10
RECORDS = 4000
BATCH = 256
WORKERS = 2


def prepare(workdir: Path) -> Path:
    """The 4,000-record cache under `workdir` (written once; reused when present)."""
    import datasetrt as drt

    cache = workdir / "startup-150k"
    if (cache / "manifest.json").exists():
        return cache

    class Records:
        name = "startup-150k"

        def __iter__(self):
            block = os.urandom(RECORD_BYTES + RECORDS)
            for i in range(RECORDS):
                yield drt.CacheInput(block[i : i + RECORD_BYTES], {"i": i})

    rt = drt.DatasetRuntime(num_workers=1)
    try:
        rt.write_cache([Records()], str(workdir), writer_config=drt.WriterConfig(show_progress=False))
    finally:
        rt.close()
    return cache


def child(spec: dict) -> dict:
    """One epoch of `spec["size"]` records in this (fresh) process, with the datasetrt of `spec["tree"]`."""
    tree = str(Path(spec["tree"]).resolve())
    # `python -m` put the checkout first on sys.path: the measured package comes from `tree`.
    sys.path[:] = [tree] + [p for p in sys.path if p not in ("", str(ROOT), tree)]
    os.environ["PYTHONPATH"] = tree  # spawned reader processes import the same tree
    import datasetrt as drt
    from benchmarks.common import tree_pss_bytes

    assert Path(drt.__file__).resolve().is_relative_to(tree), drt.__file__
    runtime_cls, config_cls = drt.DatasetRuntime, drt.ReaderConfig  # the lazy imports, before the clock
    size = spec["size"]
    cpu0 = sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),))
    t0 = time.perf_counter()
    rt = runtime_cls(num_workers=WORKERS)
    first = None
    rows = 0
    try:
        ds = rt.cached_dataset([spec["cache"]], reader_config=config_cls(seed=0))
        ds.set_epoch_len(size)
        for batch in ds.iter_batches(BATCH):
            if first is None:
                first = time.perf_counter() - t0
            rows += len(batch)
        elapsed = time.perf_counter() - t0
        end_pss = tree_pss_bytes()
    finally:
        rt.close()
    if rows != size:
        raise AssertionError(f"read {rows} rows of a {size}-record epoch")
    cpu = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu_s = sum(u.ru_utime + u.ru_stime for u in cpu) - cpu0
    return {"rate": size / elapsed, "elapsed_s": elapsed, "first_batch_s": first, "end_pss": end_pss, "cpu_s": cpu_s}


def compiled(trees: dict[str, str], workdir: Path) -> None:
    """Bytecode of every tree, under one prefix outside the trees (PYTHONPYCACHEPREFIX, inherited
    by the children and their workers): no run compiles the modules it imports lazily, as a
    reader with a writable __pycache__ never does after its first import."""
    import subprocess

    os.environ["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "datasetrt")], check=True)


def run(trees: dict[str, str], sizes: list[int], repeats: int, cache: Path) -> dict:
    """Every (tree, size) `repeats` times, trees alternating inside each repeat (after one run of
    each tree that is not counted)."""
    results: dict[str, dict[int, list[dict]]] = {label: {size: [] for size in sizes} for label in trees}
    for tree in trees.values():
        spec = {"tree": tree, "size": min(sizes), "cache": str(cache)}
        child_process(["-m", "benchmarks.startup", "--child", json.dumps(spec)], timeout_s=600)
    for rep in range(repeats):
        for size in sizes:
            for label, tree in trees.items():
                spec = {"tree": tree, "size": size, "cache": str(cache)}
                load = os.getloadavg()[0]
                got = child_process(
                    ["-m", "benchmarks.startup", "--child", json.dumps(spec)], timeout_s=600, peak_pss=True
                )
                if got.failure() is not None:
                    raise SystemExit(f"{label} size {size}: {got.failure()}")
                figures = dict(got.figures or {}, peak_pss=got.peak_pss_bytes, load=load)
                results[label][size].append(figures)
                print(
                    f"rep {rep} {label:>8} {size:>6}: {figures['rate']:8.0f} samples/s, first batch "
                    f"{figures['first_batch_s'] * 1e3:6.0f} ms, peak tree PSS {figures['peak_pss'] / 2**20:6.1f} MiB "
                    f"(load {load:.1f})",
                    flush=True,
                )
    return results


def table(results: dict[str, dict[int, list[dict]]]) -> str:
    """Markdown: medians (min-max) per tree and epoch size."""
    lines = [
        "| epoch | tree | samples/s | first batch | CPU (tree) | peak tree PSS | tree PSS after the last batch | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    sizes = sorted({size for per in results.values() for size in per})
    for size in sizes:
        for label, per in results.items():
            runs = per[size]
            rate = [r["rate"] for r in runs]
            first = [r["first_batch_s"] * 1e3 for r in runs]
            peak = [r["peak_pss"] / 2**20 for r in runs]
            end = [r["end_pss"] / 2**20 for r in runs]
            cpu = [r["cpu_s"] * 1e3 for r in runs]
            load = [r["load"] for r in runs]
            lines.append(
                f"| {size:,} | {label} | {statistics.median(rate):,.0f} ({min(rate):,.0f}-{max(rate):,.0f}) "
                f"| {statistics.median(first):,.0f} ms ({min(first):,.0f}-{max(first):,.0f}) "
                f"| {statistics.median(cpu):,.0f} ms ({min(cpu):,.0f}-{max(cpu):,.0f}) "
                f"| {statistics.median(peak):.0f} MiB ({min(peak):.0f}-{max(peak):.0f}) "
                f"| {statistics.median(end):.0f} MiB | {min(load):.1f}-{max(load):.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="500,4000,40000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", default="/tmp/datasetrt-startup")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--out", default="bench-out/startup.json")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": str(ROOT)}
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cache = prepare(workdir)
    compiled(trees, workdir)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = run(trees, sizes, args.repeats, cache)
    print(table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_facts(), "trees": trees, "results": results}, indent=1))


if __name__ == "__main__":
    main()
