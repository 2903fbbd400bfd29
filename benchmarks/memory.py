"""Memory benchmark: steady and peak PSS of the whole process tree while reading one epoch.

Workload: one cache of `count` records of 4 KiB (200,000; --quick: 20,000; PayloadSource content,
no compression), plus the same payloads in one raw file for the plain torch loaders. Every
configuration runs in its own fresh process under `scripts/pss --interval 0.05` (sampled from
outside: the sampler is not in the tree), reads one full epoch, shuffled (seed 11), and marks the
epoch with PSS_MARK_FILE (steady-start before the reader/loader iterator is created, steady-end
after its last item). Peak = the largest tree-PSS sample of the process's whole life (imports
included); steady = the median of the last half of the samples taken during the epoch.

Readers (K = worker processes; 0 = in the calling process):
  drt-runtime         datasetrt `CachedDataset` per-sample iteration: K=0 `runtime=None`, K=1/2/4
                      `DatasetRuntime(num_workers=K, start_method=fork|spawn)`; prefetch_size=1024
  drt-loader          datasetrt `ds.to_torch_dataloader(batch_size=64, num_workers=K,
                      multiprocessing_context=fork|spawn)` over `CachedDataset(runtime=None)`
  dataset-rt-runtime  dataset-rt 0.4.8 `DatasetRuntime(num_workers=K)` (native threads), iteration
  dataset-rt-loader   dataset-rt 0.4.8 `to_torch_dataloader(batch_size=64, num_workers=0/2)`
                      (its dataset on `DatasetRuntime(num_workers=1)`)
  torch-dicts         plain `torch.utils.data.DataLoader(batch_size=64, shuffle=True,
                      num_workers=K, fork)` over a map-style dataset holding one Python dict per
                      record (sample id, offset, length, metadata dict); items pread from the file
  torch-numpy         the same dataset with the metadata and offsets in numpy arrays
Torch processes run with torch.set_num_threads(1) (as torch does in its workers).

Usage:
  python -m benchmarks.memory [--quick] [--out bench-out/memory.json]    all configurations
  python -m benchmarks.memory --prepare DIR [--count N]                  write the workload only
  scripts/pss -- python -m benchmarks.memory --run READER --workers K [--method fork|spawn] --workdir DIR
                                                                         one configuration, by hand
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.caches import PayloadSource
from benchmarks.common import ROOT, Measurement, child_process, machine_facts, save_json
from benchmarks.memory_readers import BATCH, PREFETCH, run_one

PSS_TOOL = ROOT / "scripts" / "pss"
PAYLOAD = 4096
INTERVAL = 0.05
MIB = 2**20
LABELS = {
    "drt-runtime": "datasetrt CachedDataset / DatasetRuntime",
    "drt-loader": "datasetrt to_torch_dataloader",
    "dataset-rt-runtime": "dataset-rt 0.4.8 DatasetRuntime",
    "dataset-rt-loader": "dataset-rt 0.4.8 to_torch_dataloader",
    "torch-dicts": "torch DataLoader, list of dicts",
    "torch-numpy": "torch DataLoader, numpy arrays",
}
CONFIGS: list[tuple[str, int, str | None]] = [
    ("drt-runtime", 0, None),
    *[("drt-runtime", k, m) for m in ("fork", "spawn") for k in (1, 2, 4)],
    ("drt-loader", 0, None),
    *[("drt-loader", k, m) for m in ("fork", "spawn") for k in (1, 2, 4)],
    *[("dataset-rt-runtime", k, None) for k in (1, 2, 4)],
    ("dataset-rt-loader", 0, None),
    ("dataset-rt-loader", 2, "fork"),
    ("dataset-rt-loader", 2, "spawn"),
    *[("torch-dicts", k, "fork" if k else None) for k in (0, 1, 2, 4)],
    *[("torch-numpy", k, "fork" if k else None) for k in (0, 1, 2, 4)],
]


# --------------------------------------------------------------------------------------------
# workload and driver


def prepare(workdir: Path, count: int) -> None:
    import numpy as np

    import datasetrt

    workdir.mkdir(parents=True, exist_ok=True)
    rt = datasetrt.DatasetRuntime(num_workers=2)
    cfg = datasetrt.WriterConfig(show_progress=False, shard_compression=datasetrt.ShardCompression(algo="none"))
    [res] = rt.write_cache(
        [PayloadSource("memory", count, PAYLOAD, datasetrt.CacheInput)], workdir / "caches", writer_config=cfg
    )
    rt.close()
    assert isinstance(res, datasetrt.CacheWriteSuccess), res
    (workdir / "cache-path.txt").write_text(str(res.path))
    offsets = np.zeros(count + 1, dtype=np.int64)
    with open(workdir / "payloads.bin", "wb") as f:
        for i, (payload, _) in enumerate(PayloadSource("memory", count, PAYLOAD, lambda d, m: (d, m))):
            f.write(payload)
            offsets[i + 1] = offsets[i] + len(payload)
    np.save(workdir / "offsets.npy", offsets)


def command_for(reader: str, workers: int, method: str | None, workdir: str) -> list[str]:
    cmd = ["-m", "benchmarks.memory", "--run", reader, "--workers", str(workers)]
    if method:
        cmd += ["--method", method]
    return cmd + ["--workdir", workdir]


def measure(reader: str, workers: int, method: str | None, workdir: Path, timeout_s: float) -> dict:
    """Run one configuration under scripts/pss (common.child_process: its own session, killed whole on
    the timeout); figures or {"error"}."""
    with tempfile.TemporaryDirectory(prefix="datasetrt-bench-memory-") as tmp:
        summary_path = Path(tmp) / "pss.json"
        args = [str(PSS_TOOL), "--interval", str(INTERVAL), "--quiet", "--json", str(summary_path), "--"]
        child = child_process([*args, sys.executable, *command_for(reader, workers, method, str(workdir))], timeout_s)
        if child.timed_out:
            return {"error": f"timed out after {timeout_s:.0f} s"}
        if child.returncode != 0 or child.figures is None or not summary_path.exists():
            return {"error": f"exit {child.returncode}: {child.tail()}"}
        pss = json.loads(summary_path.read_text())
    total = pss["total"]
    total = pss["total"]
    return {
        **child.figures,
        "steady_pss": total["steady_pss"],
        "peak_pss": total["peak_pss"],
        "steady_uss": total["steady_uss"],
        "steady_rss": total["steady_rss"],
        "processes": total["processes"],
        "steady_samples": pss["steady_samples"],
        "per_process": [
            {k: p[k] for k in ("pid", "name", "steady_pss", "peak_pss", "steady_uss")} for p in pss["processes"]
        ],
    }


def render(rows: list[dict]) -> str:
    base = {r["reader"]: r for r in rows if r["workers"] == 0 and "error" not in r}
    lines = [
        "| reader | K | start | steady tree PSS | peak tree PSS | steady tree USS | per worker vs K=0 | processes | epoch |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        head = f"| {LABELS[r['reader']]} | {r['workers']} | {r['method'] or '-'} "
        if "error" in r:
            lines.append(head + f"| **failed**: {r['error']} | | | | | |")
            continue
        b = base.get(r["reader"])
        per = f"{(r['steady_pss'] - b['steady_pss']) / r['workers'] / MIB:+,.0f} MiB" if b and r["workers"] else "-"
        lines.append(
            head
            + f"| {r['steady_pss'] / MIB:,.0f} MiB | {r['peak_pss'] / MIB:,.0f} MiB | {r['steady_uss'] / MIB:,.0f} MiB "
            f"| {per} | {r['processes']} | {r['epoch_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 records instead of 200,000")
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument(
        "--out", type=Path, default=None, help="default bench-out/memory.json (memory-quick.json with --quick)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per configuration")
    parser.add_argument("--only", default=None, help="comma-separated readers to run (default: all)")
    parser.add_argument(
        "--prepare", type=Path, default=None, metavar="DIR", help="write the workload into DIR and exit"
    )
    parser.add_argument("--run", choices=sorted(LABELS), default=None, help="run one configuration in this process")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--method", choices=("fork", "spawn"), default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    count = args.count or (20_000 if args.quick else 200_000)
    if args.run:
        print(json.dumps(run_one(args.run, args.workers, args.method, args.workdir)), flush=True)
        return
    if args.prepare:
        prepare(args.prepare, count)
        print(f"wrote {count:,} x {PAYLOAD // 1024} KiB records to {args.prepare}")
        return
    out = args.out or Path("bench-out/memory-quick.json" if args.quick else "bench-out/memory.json")
    timeout_s = args.timeout or (120.0 if args.quick else 900.0)
    only = set(args.only.split(",")) if args.only else None
    wall = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-memory-"))
    rows: list[dict] = []
    try:
        prepare(workdir, count)
        for reader, workers, method in CONFIGS:
            if only and reader not in only:
                continue
            t = time.perf_counter()
            r = {
                "reader": reader,
                "workers": workers,
                "method": method,
                **measure(reader, workers, method, workdir, timeout_s),
                "wall_s": time.perf_counter() - t,
            }
            if "error" not in r:
                assert r["samples"] == count, f"{reader} K={workers} {method}: read {r['samples']} of {count} samples"
            rows.append(r)
            figures = r.get("error") or (
                f"steady {r['steady_pss'] / MIB:7,.0f} MiB  peak {r['peak_pss'] / MIB:7,.0f} MiB  "
                f"USS {r['steady_uss'] / MIB:7,.0f} MiB  {r['processes']} processes  "
                f"epoch {r['epoch_s']:.1f} s"
            )
            print(f"{LABELS[reader]:40} K={workers} {method or '-':5} {figures}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - wall
    print(
        f"\nmachine: {machine_facts()}; {count:,} x {PAYLOAD // 1024} KiB records, one shuffled epoch per fresh "
        f"process, scripts/pss every {INTERVAL} s; wall {wall:.0f} s"
    )
    print(render(rows))
    measurements = [
        Measurement(
            f"{r['reader']} K={r['workers']} {r['method'] or '-'}",
            LABELS[r["reader"]],
            "MiB steady PSS",
            [r["steady_pss"] / MIB],
            higher_is_better=False,
        )
        for r in rows
        if "error" not in r
    ]
    save_json(
        out,
        measurements,
        {
            "count": count,
            "payload_bytes": PAYLOAD,
            "batch": BATCH,
            "prefetch_size": PREFETCH,
            "interval_s": INTERVAL,
            "wall_s": wall,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
