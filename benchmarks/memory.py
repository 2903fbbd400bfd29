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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Measurement, PayloadSource, machine_facts, save_json

ROOT = Path(__file__).resolve().parent.parent
PSS_TOOL = ROOT / "scripts" / "pss"
PAYLOAD = 4096
BATCH = 64
SEED = 11
PREFETCH = 1024
INTERVAL = 0.05
MIB = 2**20
TORCH_READERS = ("drt-loader", "dataset-rt-loader", "torch-dicts", "torch-numpy")
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
# plain torch map-style datasets (module level: picklable by reference)


class _Pread:
    """Reads record bytes from the raw payload file; the descriptor is opened per process."""

    def __init__(self, data_path: str) -> None:
        self.data_path = data_path
        self._fd: int | None = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {"data_path": self.data_path, "_fd": None, "_pid": -1}

    def read(self, offset: int, length: int) -> bytes:
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.data_path, os.O_RDONLY), os.getpid()
        return os.pread(self._fd, length, offset)


class DictRecords(_Pread):
    """One Python dict per record (the pattern whose refcount writes un-share forked pages)."""

    def __init__(self, data_path: str, offsets: list[int]) -> None:
        super().__init__(data_path)
        self.items = [
            {
                "sample_id": i,
                "offset": offsets[i],
                "length": offsets[i + 1] - offsets[i],
                "metadata": {"benchmark_position": i, "wide": f"w{i % 97:04d}"},
            }
            for i in range(len(offsets) - 1)
        ]

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "items": self.items}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        item = self.items[i]
        return {
            "data": self.read(item["offset"], item["length"]),
            "sample_id": item["sample_id"],
            "metadata": dict(item["metadata"]),
        }


class NumpyRecords(_Pread):
    """The same records with offsets, ids and metadata in numpy arrays (a few objects in all)."""

    def __init__(self, data_path: str, offsets) -> None:
        import numpy as np

        super().__init__(data_path)
        n = len(offsets) - 1
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sample_id = np.arange(n, dtype=np.int64)
        self.position = np.arange(n, dtype=np.int64)
        self.wide = np.array([f"w{i:04d}".encode() for i in range(97)], dtype="S5")[np.arange(n) % 97]

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), **{k: getattr(self, k) for k in ("offsets", "sample_id", "position", "wide")}}

    def __len__(self) -> int:
        return len(self.sample_id)

    def __getitem__(self, i: int) -> dict:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return {
            "data": self.read(lo, hi - lo),
            "sample_id": int(self.sample_id[i]),
            "metadata": {"benchmark_position": int(self.position[i]), "wide": self.wide[i].decode()},
        }


# --------------------------------------------------------------------------------------------
# one configuration, in this (fresh) process


def _mark(label: str) -> None:
    path = os.environ.get("PSS_MARK_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{label} {time.time():.6f}\n")


def _batch_len(batch) -> int:
    if isinstance(batch, dict):
        return len(batch["sample_id"])
    return len(batch.sample_id)


def run_one(reader: str, workers: int, method: str | None, workdir: Path) -> dict:
    """Read one epoch; returns {"samples", "epoch_s", "imports_torch"}. Marks the epoch."""
    cache = (workdir / "cache-path.txt").read_text().strip()
    result = {"reader": reader, "workers": workers, "method": method}
    if reader in TORCH_READERS:
        import torch

        torch.set_num_threads(1)
    if reader in ("torch-dicts", "torch-numpy"):
        import numpy as np
        from torch.utils.data import DataLoader

        offsets = np.load(workdir / "offsets.npy")
        dataset = (
            DictRecords(str(workdir / "payloads.bin"), offsets.tolist())
            if reader == "torch-dicts"
            else NumpyRecords(str(workdir / "payloads.bin"), offsets)
        )
        del offsets
        _mark("steady-start")
        t0 = time.perf_counter()
        dl = DataLoader(
            dataset,
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(SEED),
            multiprocessing_context=method if workers else None,
        )
        n = sum(_batch_len(b) for b in dl)
    else:
        lib = __import__("dataset_rt" if reader.startswith("dataset-rt") else "datasetrt")
        cfg = lib.ReaderConfig(seed=SEED, shuffle=True, prefetch_size=PREFETCH)
        runtime = None
        if reader == "drt-runtime":
            if workers:
                runtime = lib.DatasetRuntime(num_workers=workers, start_method=method)
                ds = runtime.cached_dataset([cache], reader_config=cfg)
            else:
                ds = lib.CachedDataset([cache], reader_config=cfg, runtime=None)
        elif reader == "drt-loader":
            ds = lib.CachedDataset([cache], reader_config=cfg, runtime=None)
        else:
            runtime = lib.DatasetRuntime(num_workers=workers if reader == "dataset-rt-runtime" else 1)
            ds = runtime.cached_dataset([cache], reader_config=cfg)
        _mark("steady-start")
        t0 = time.perf_counter()
        if reader.endswith("-runtime"):
            n = 0
            for sample in ds:
                n += len(sample.data) > 0
        else:
            kwargs = {"shuffle": True, "seed": SEED, "batch_size": BATCH, "num_workers": workers, "verbose": False}
            if workers:
                kwargs["multiprocessing_context"] = method
            dl = ds.to_torch_dataloader(**kwargs)
            n = sum(_batch_len(b) for b in dl)
    result["epoch_s"] = time.perf_counter() - t0
    _mark("steady-end")
    result["samples"] = n
    result["imports_torch"] = "torch" in sys.modules
    result["imports_pyarrow"] = "pyarrow" in sys.modules
    result["imports_polars"] = "polars" in sys.modules
    return result


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
    """Run one configuration under scripts/pss in its own session; figures or {"error"}."""
    with tempfile.TemporaryDirectory(prefix="datasetrt-bench-memory-") as tmp:
        summary_path = Path(tmp) / "pss.json"
        argv = [
            sys.executable,
            str(PSS_TOOL),
            "--interval",
            str(INTERVAL),
            "--quiet",
            "--json",
            str(summary_path),
            "--",
            sys.executable,
            *command_for(reader, workers, method, str(workdir)),
        ]
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # this configuration's own session only
            proc.communicate()
            return {"error": f"timed out after {timeout_s:.0f} s"}
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines or not summary_path.exists():
            tail = " / ".join(ln.strip() for ln in err.strip().splitlines()[-2:])[-300:]
            return {"error": f"exit {proc.returncode}: {tail or '(no stderr)'}"}
        child = json.loads(lines[-1])
        pss = json.loads(summary_path.read_text())
    total = pss["total"]
    return {
        **child,
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
