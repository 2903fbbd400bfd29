"""Benchmark suite: datasetrt against its peers and the physical limits, one entry point that
composes the sections and ends with the targets table (benchmarks.targets).

Workloads (benchmarks.workloads, generated deterministically, seed 11): fixed 4 KiB and 150 KiB
records, variable 1-64 KiB records, a compressible token-like corpus (int32 zipf token ids,
128-2048 tokens) written with lz4 and zstd, and int32[512] (fixed 512-token int32 records, typed
`PayloadSpec("<i4", (512,))` when datasetrt has it) read as [256, 512] int32 arrays.

Read contenders (benchmarks.reads), same data and same worker count in one run, each in a fresh
subprocess:
  datasetrt                  DatasetRuntime(num_workers=W).cached_dataset(...), per-sample iteration
                             (int32[512]: + np.frombuffer / np.stack per 256, the per-sample user path)
  datasetrt batches          the same, iter_batches(256) (int32[512]: + one frombuffer/reshape)
  datasetrt batches .to_numpy()   int32[512] only, when SampleBatch has to_numpy
  datasetrt in-process, datasetrt batches in-process   the same on CachedDataset(..., runtime=None)
  dataset-rt 0.4.8           the real package on the same cache files (cannot read zstd; not int32[512])
  loaderx                    the same payloads in a loaderx Dense (fixed size) / Ragged store, its Loader
  torch DataLoader (memmap)  map-style dataset over a flat numpy memmap of the payloads (not int32[512])
  memmap copy (limit)        one copy of the whole flat payload file from the page cache (not int32[512])
  numpy memmap gather (limit)     int32[512] only: mm[order[s:s+256]] on an [N, 512] int32 memmap
  pread per record (limit)   os.pread of each record from the flat payload file
  MosaicML Streaming, LitData     their local stores of the same records through their torch
                             loaders (benchmarks.stream_peers; --quick / --full, or --stream-peers)
Read figures: samples/s and MiB/s (median, min, max over repeats), p95 latency of 256-sample
batches, time to first sample, peak PSS of the contender's process tree, and for datasetrt the CPU
seconds per GiB delivered of the consumer process (getrusage RUSAGE_SELF) and of its live reader
workers (psutil, by pid). Every contender's payload bytes are checked equal to datasetrt's: the
ordered digest where it reproduces datasetrt's order, else the multiset (Streaming and LitData
shuffle with their own permutation: their shuffled rows are checked against the written records).

Torch end to end (benchmarks.torch_batches) on the int32[512] workload: to_torch_dataloader with a
per-sample transform, to_torch_batches when it exists, Streaming and LitData, 2 torch workers,
fork (and spawn except with --smoke); --no-torch skips it.

Write (benchmarks.writes), each workload and codec, each contender in a fresh subprocess with the
payloads already in memory: datasetrt and dataset-rt 0.4.8 `DatasetRuntime(num_workers=W).write_cache`
(dataset-rt has no zstd), loaderx building its Dense / Ragged store (raw and zstd; it has no lz4).
Plus many small caches: N sources of 20 x 64 B records in one write_cache call (N = 2,000 with
--full, 100 with --quick, 50 with --smoke; datasetrt and dataset-rt only). Figures: payload MiB/s
(median, min, max), samples/s, peak tree PSS, ratio to datasetrt; every written cache or store is
read back and its payloads compared with the generated ones in write order.

Open (benchmarks.opens): one dataset over N small caches (hard links of one 8-record cache,
distinct manifests; N = 1, 100, 10,000 with --full, 1, 100, 1,000 with --quick, 1, 10 with
--smoke), then len(): datasetrt `CachedDataset(paths, runtime=None)`, dataset-rt
`DatasetRuntime(num_workers=1).cached_dataset`, each N and contender in a fresh subprocess.
Figures: seconds (median, min, max), the first open in the fresh process, peak tree PSS, time
relative to datasetrt; lengths must be 8 N.

With more than one timed repeat, repeat 0 is an extra untimed pass (digests; warm-up). No speed is
asserted; the exit status is 1 only when some contender's bytes (or open length) differ.

Usage: python -m benchmarks.run (--quick | --full | --smoke) [--workers 2] [--repeats R] [--workloads A,B]
                                [--out bench-out/suite.json] [--plot FILE.png] [--[no-]stream-peers]
                                [--no-torch] [--baseline FILE] [--save-baseline FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.cache_reads import run_rt
from benchmarks.common import Measurement, PeakPss, exit_on_different_bytes, machine_facts, save_json
from benchmarks.opens import OPEN_COUNTS, bench_open, run_open
from benchmarks.peers import RUNNERS, run_memmap_gather
from benchmarks.reads import bench_reads
from benchmarks.report import open_table, plot, read_table, torch_table, write_table
from benchmarks.stream_peers import run_build, run_stream_peer
from benchmarks.suite import BATCH, GATHER, LITDATA, PREFETCH, STREAMING, TOKENS512
from benchmarks.targets import (
    DEFAULT_BASELINE,
    TITLE,
    baseline_of,
    load_baseline,
    read_targets,
    render,
    torch_targets,
)
from benchmarks.workloads import MODES, prepare
from benchmarks.writes import bench_many_small, bench_writes, run_write

STREAM_PEER_MODES = {"quick", "full"}  # Streaming / LitData: seconds of imports per child, so not in --smoke
# Timed repeats; one extra untimed digest pass when > 1. --quick's epochs are a few batches, so its
# first passes measure reader start-up (workers launching, then filling each ring slot for the
# first time), which "first sample" reports apart; enough timed passes put the median on the
# steady rate (docs/benchmarks.md).
REPEATS = {"smoke": 1, "quick": 6, "full": 4}
READ_RUNNERS = {**RUNNERS, GATHER: run_memmap_gather, STREAMING: run_stream_peer, LITDATA: run_stream_peer}


def run_task(spec: dict) -> dict:
    """One suite task in this fresh child process (`--child SPEC`), under a tree-PSS sampler:
    "write", "open", "build" (a Streaming / LitData store) or a read by `spec["contender"]`."""
    with PeakPss() as pss:
        task = spec.get("task", "read")
        if task == "write":
            result = run_write(spec)
        elif task == "open":
            result = run_open(spec)
        elif task == "build":
            result = run_build(spec)
        else:
            result = READ_RUNNERS.get(spec["contender"], run_rt)(spec)
    result["peak_pss_mib"] = pss.peak / 2**20
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", const="quick", dest="mode")
    mode.add_argument("--full", action="store_const", const="full", dest="mode")
    mode.add_argument("--smoke", action="store_const", const="smoke", dest="mode", help="tiny data, one repeat (tests)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (plus one untimed digest pass)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/suite.json"))
    parser.add_argument("--plot", type=Path, default=None, help="PNG of MiB/s by record size (needs matplotlib)")
    parser.add_argument(
        "--stream-peers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="MosaicML Streaming and LitData contenders (default: with --quick and --full)",
    )
    parser.add_argument(
        "--torch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch end to end on the int32[512] workload (benchmarks.torch_batches)",
    )
    parser.add_argument(
        "--baseline", type=Path, default=DEFAULT_BASELINE, help="figures the 'vs baseline' targets compare with"
    )
    parser.add_argument(
        "--save-baseline", type=Path, default=None, help="record this run's datasetrt CPU / PSS figures as a baseline"
    )
    parser.add_argument(
        "--workloads",
        default=None,
        help="comma-separated names of the mode's workloads to run (default: all of them; "
        "the many-small write and the open section always run)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.mode = args.mode or "quick"
    args.workload_list = MODES[args.mode]
    if args.workloads is not None:
        wanted = args.workloads.split(",")
        names = [w[0] for w in args.workload_list]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"--workloads: {unknown} not in --{args.mode}'s {names}")
        args.workload_list = [w for w in args.workload_list if w[0] in wanted]
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(run_task(json.loads(args.child))))
        return
    mode = args.mode
    stream_peers = mode in STREAM_PEER_MODES if args.stream_peers is None else args.stream_peers
    timed_repeats = args.repeats or REPEATS[mode]
    repeats = timed_repeats + (1 if timed_repeats > 1 else 0)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-suite-"))
    rows: list[dict] = []
    torch_rows: list[dict] = []
    write_rows: list[dict] = []
    open_rows: list[dict] = []
    sizes: dict[str, float] = {}
    failures: list[str] = []
    phase_s = {"write": 0.0, "open": 0.0, "torch": 0.0}
    try:
        for name, kind, size, count, algos in args.workload_list:
            algo_list = algos.split(",")
            wl_dir = workdir / name.replace(" ", "")
            wl = prepare(wl_dir, name, kind, size, count, algo_list, args.workers, stream_peers)
            sizes[name] = wl["bytes"] / count
            rows += bench_reads(wl, name, kind, count, algo_list, stream_peers, args.workers, repeats, failures)
            if kind == "tok512" and args.torch:
                from benchmarks import torch_batches

                t_torch = time.perf_counter()
                torch_rows = torch_batches.bench(wl, mode, stream_peers, failures)
                phase_s["torch"] = time.perf_counter() - t_torch
            t_write = time.perf_counter()
            write_rows += bench_writes(wl, name, count, algo_list, wl_dir, args.workers, repeats, failures)
            phase_s["write"] += time.perf_counter() - t_write
            shutil.rmtree(wl_dir, ignore_errors=True)
        t_write = time.perf_counter()
        write_rows += bench_many_small(mode, workdir / "many-small", args.workers, repeats, failures)
        phase_s["write"] += time.perf_counter() - t_write
        t_open = time.perf_counter()
        open_rows = bench_open(workdir / "open", OPEN_COUNTS[mode], repeats, failures)
        phase_s["open"] = time.perf_counter() - t_open
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started
    print(
        f"\nmachine: {machine_facts()}; mode={mode}, workers={args.workers}, prefetch_size={PREFETCH}, "
        f"batch={BATCH}, timed repeats={timed_repeats}, wall {wall:.0f} s (of which write {phase_s['write']:.0f} s, "
        f"open {phase_s['open']:.0f} s, torch {phase_s['torch']:.0f} s)\n"
    )
    print("read\n")
    print(read_table(rows))
    print(f"\nwrite (payload MiB/s; DatasetRuntime(num_workers={args.workers}) for datasetrt and dataset-rt)\n")
    print(write_table(write_rows))
    print("\nopen (one dataset over N caches of 8 records each, then len())\n")
    print(open_table(open_rows))
    if torch_rows:
        print(f"\ntorch end to end ({TOKENS512} records to [256, 512] int32 tensors, 2 torch workers)\n")
        print(torch_table(torch_rows))
    baseline, baseline_note = load_baseline(args.baseline, mode)
    print(f"\n{TITLE} ({baseline_note})\n")
    print(render(read_targets(rows, baseline) + torch_targets(torch_rows)))
    if args.save_baseline:
        args.save_baseline.write_text(
            json.dumps(
                {**baseline_of(rows, mode), "recorded": time.strftime("%Y-%m-%d"), "machine": machine_facts()}, indent=2
            )
            + "\n"
        )
        print(f"\nbaseline written: {args.save_baseline}")
    measurements = [
        Measurement(r["workload"], r["contender"], "samples/s", r["rates"]) for r in rows if not r.get("error")
    ]
    measurements += [
        Measurement(f"write {r['workload']}", r["contender"], "MiB/s", r["mib"])
        for r in write_rows
        if not r.get("error")
    ]
    measurements += [
        Measurement(f"open {r['workload']}", r["contender"], "s", r["seconds"], higher_is_better=False)
        for r in open_rows
        if not r.get("error")
    ]
    save_json(
        args.out,
        measurements,
        {
            "mode": mode,
            "workers": args.workers,
            "prefetch_size": PREFETCH,
            "batch": BATCH,
            "wall_s": wall,
            "phase_s": phase_s,
            "record_bytes_mean": sizes,
            "open_counts": list(OPEN_COUNTS[mode]),
            "rows": rows,
            "write_rows": write_rows,
            "open_rows": open_rows,
            "torch_rows": torch_rows,
        },
    )
    if args.plot:
        try:
            plot(rows, sizes, args.plot)
            print(f"\nplot: {args.plot}")
        except ImportError:
            print("\nplot skipped: matplotlib is not installed")
    exit_on_different_bytes(failures)


if __name__ == "__main__":
    main()
