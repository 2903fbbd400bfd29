"""Scale benchmark, caches: one dataset over 10^4 and 10^5 small caches: open time, the first
sample, descriptors and memory per cache, datasetrt (in-process, and reader workers under fork
and spawn) against dataset-rt 0.4.8 (its native threads).

Workload: `make_caches`: copies of one 8-record cache (64-byte records) under distinct manifests,
so N caches hold 8 N samples. Each configuration runs in its
own fresh process (`--run`), which measures itself and its descendants:

  base    after the imports and the runtime (datasetrt `DatasetRuntime(num_workers=2,
          start_method=...)`, or none in-process; dataset-rt `DatasetRuntime(num_workers=K)`)
  open    `cached_dataset(paths, ReaderConfig(seed=1, shuffle=True))` and len() (timed)
  first   `next(iter(ds))` (timed: the first sample, workers started)
  read    1,000 more samples

Memory is the tree's anonymous + shmem PSS (/proc/PID/smaps_rollup) and the file-backed part
beside it; descriptors are counted in /proc/PID/fd of each process of the tree (the largest
process's count is what the per-process budget bounds: datasetrt.runtime.descriptors.
default_limit(), half the soft RLIMIT_NOFILE, at most 4096).

With `--repeats R`, each configuration runs R times (the configurations' order reversed every
other round) and the table shows the median open and first-sample times with their range; the
memory and descriptor columns are those of the run with the median open time. `--many DIR` reads
caches `make_caches` wrote before (kept) instead of writing them into a temporary directory.

Usage:
  python -m benchmarks.scale_caches [--counts 10000,100000] [--repeats 1] [--many DIR]
      [--out bench-out/scale_caches.json]
  python -m benchmarks.scale_caches --run datasetrt-fork --many DIR --n N      one configuration
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import child_process, machine_facts
from benchmarks.scale_rows import _descendants, tree_memory

MIB = 2**20
READS = 1000
CONFIGS = ("datasetrt-inprocess", "datasetrt-fork", "datasetrt-spawn", "dataset-rt-1", "dataset-rt-2")


def make_caches(workdir: Path, how_many: int) -> Path:
    """`how_many` caches under workdir/many (c00000, c00001, ...): one 8-record cache of 64-byte
    records written with datasetrt, its files copied into each (files of their own: a file
    system allows only so many hard links to one inode), each with its own manifest (source
    name and cache id). Returns workdir/many."""
    import datasetrt.format.layout
    from benchmarks.caches import write_once

    seed = write_once(datasetrt, workdir / "seed", 8, 64, "none", name="seed")
    manifest = json.loads((seed / "manifest.json").read_text())
    files = {
        str(p.relative_to(seed)): p.read_bytes() for p in seed.rglob("*") if p.is_file() and p.name != "manifest.json"
    }
    base = workdir / "many"
    for i in range(how_many):
        name = f"c{i:06d}"
        d = base / name
        (d / "shards").mkdir(parents=True)
        for rel, data in files.items():
            (d / rel).write_bytes(data)
        doc = dict(manifest, source_name=name, cache_id=datasetrt.format.layout.cache_id_for(name))
        (d / "manifest.json").write_text(json.dumps(doc))
    return base


def tree_fds(pid: int | None = None) -> list[int]:
    """Open descriptors of each process of the tree of `pid` (default this process)."""
    out = []
    for p in _descendants(pid or os.getpid()):
        try:
            out.append(len(os.listdir(f"/proc/{p}/fd")))
        except OSError:
            continue
    return out


def _private(m: dict) -> int:
    return m["anon"] + m["shmem"]


def run_one(config: str, many: Path, n: int) -> dict:
    """Open a dataset over the first `n` caches of `many`, read the first sample and READS more."""
    paths = sorted(many.iterdir())[:n]
    if config.startswith("dataset-rt"):
        import dataset_rt as lib

        runtime = lib.DatasetRuntime(num_workers=int(config.rsplit("-", 1)[1]))
    else:
        import datasetrt as lib

        method = config.split("-", 1)[1]
        runtime = None if method == "inprocess" else lib.DatasetRuntime(num_workers=2, start_method=method)
    cfg = lib.ReaderConfig(seed=1, shuffle=True)
    marks, fds, times = {}, {}, {}
    marks["base"], fds["base"] = tree_memory(), tree_fds()
    t0 = time.perf_counter()
    if runtime is None:
        ds = lib.CachedDataset(paths, reader_config=cfg, runtime=None)
    else:
        ds = runtime.cached_dataset(paths, reader_config=cfg)
    assert len(ds) == 8 * n, (len(ds), n)
    times["open"] = time.perf_counter() - t0
    marks["open"], fds["open"] = tree_memory(), tree_fds()
    t1 = time.perf_counter()
    it = iter(ds)
    next(it)
    times["first"] = time.perf_counter() - t1
    marks["first"], fds["first"] = tree_memory(), tree_fds()
    for _ in range(READS):
        next(it)
    marks["read"], fds["read"] = tree_memory(), tree_fds()
    from datasetrt.runtime.descriptors import default_limit

    del it
    return {
        "config": config,
        "caches": n,
        "samples": 8 * n,
        "times_s": times,
        "marks": marks,
        "fds": fds,
        "budget": default_limit(),
        "open_private_per_cache": (_private(marks["open"]) - _private(marks["base"])) / n,
        "read_private_per_cache": (_private(marks["read"]) - _private(marks["base"])) / n,
        "read_file_per_cache": (marks["read"]["file"] - marks["base"]["file"]) / n,
        "max_fds": max(max(v) for v in fds.values()),
    }


def merged(runs: list[dict]) -> dict:
    """One row for the runs of one (caches, config): the median-open run's figures, its open and
    first-sample times replaced by the medians over `runs`, every run's times kept (`runs_s`)."""
    done = [r for r in runs if "error" not in r]
    if not done:
        return runs[0]
    by_open = sorted(done, key=lambda r: r["times_s"]["open"])
    row = dict(by_open[(len(by_open) - 1) // 2])
    row["runs_s"] = {k: [r["times_s"][k] for r in done] for k in ("open", "first")}
    row["times_s"] = {**row["times_s"], **{k: statistics.median(v) for k, v in row["runs_s"].items()}}
    row["failed_runs"] = len(runs) - len(done)
    return row


def _spread(r: dict, key: str, scale: float, fmt: str) -> str:
    runs = r.get("runs_s", {}).get(key, [])
    if len(runs) < 2:
        return ""
    return f" ({min(runs) * scale:{fmt}}-{max(runs) * scale:{fmt}})"


def render(rows: list[dict]) -> str:
    lines = [
        "| caches | reader | open | first sample | anon+shmem per cache (open) | (after 1,001 samples) | file-backed per cache "
        "| processes | descriptors, largest process (budget) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['caches']:,} | {r['config']} | **failed**: {r['error'][:150]} |" + " |" * 6)
            continue
        t = r["times_s"]
        lines.append(
            f"| {r['caches']:,} | {r['config']} | {t['open']:.2f} s{_spread(r, 'open', 1, '.2f')} "
            f"| {t['first'] * 1e3:,.0f} ms{_spread(r, 'first', 1e3, ',.0f')} "
            f"| {r['open_private_per_cache']:,.0f} B | {r['read_private_per_cache']:,.0f} B | {r['read_file_per_cache']:,.0f} B "
            f"| {r['marks']['read']['processes']} | {r['max_fds']:,} ({r['budget']:,}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="10000,100000")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=Path("bench-out/scale_caches.json"))
    parser.add_argument("--run", choices=CONFIGS, default=None)
    parser.add_argument("--many", type=Path, default=None)
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(args.run, args.many, args.n)), flush=True)
        return
    counts = [int(c) for c in args.counts.split(",")]
    configs = args.configs.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-scale-caches-"))
    results = []
    wall = time.perf_counter()
    try:
        if args.many is not None and len(list(args.many.iterdir())) >= max(counts):
            many = args.many
        else:
            t = time.perf_counter()
            many = make_caches(workdir, max(counts))
            print(f"wrote {max(counts):,} caches in {time.perf_counter() - t:.0f} s", flush=True)
        for n in counts:
            runs: dict[str, list[dict]] = {c: [] for c in configs}
            for rep in range(args.repeats):
                for config in configs if rep % 2 == 0 else configs[::-1]:
                    child = child_process(
                        ["-m", "benchmarks.scale_caches", "--run", config, "--many", str(many), "--n", str(n)],
                        args.timeout,
                    )
                    if child.figures is None or child.returncode != 0:
                        r = {"config": config, "caches": n, "error": child.tail()}
                    else:
                        r = child.figures
                    runs[config].append(r)
                    print(render([r]).splitlines()[-1], flush=True)
            results.extend(merged(runs[c]) for c in configs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nmachine: {machine_facts()}; wall {time.perf_counter() - wall:.0f} s")
    print(render(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine_facts(), "rows": results}, indent=1))


if __name__ == "__main__":
    main()
