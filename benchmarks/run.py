"""Benchmark suite: datasetrt against its peers and the physical limits, one entry point.

Workloads (generated deterministically, seed 11): fixed 4 KiB records, fixed 150 KiB records,
variable 1-64 KiB records, and a compressible token-like corpus (int32 sequences, zipf token ids,
128-2048 tokens) written with lz4 and zstd; metadata columns label (str), n (int), score (float).

Contenders, same data and same worker count in one run, each in a fresh subprocess:
  datasetrt                  DatasetRuntime(num_workers=W).cached_dataset(...), per-sample iteration
  datasetrt batches          the same, iter_batches(256)
  dataset-rt 0.4.8           the real package on the same cache files (cannot read zstd)
  loaderx                    the same payloads in a loaderx Dense (fixed size) / Ragged store, its Loader
  torch DataLoader (memmap)  map-style dataset over a flat numpy memmap of the payloads
  memmap copy (limit)        one copy of the whole flat payload file from the page cache
  pread per record (limit)   os.pread of each record from the flat payload file
Figures: samples/s and MiB/s (median, min, max over repeats), p95 latency of 256-sample batches,
time to first sample, peak PSS of the contender's process tree. Every contender's payload bytes are
checked equal to datasetrt's: the ordered digest where it reproduces datasetrt's order, else the
multiset. No speed is asserted.

Usage: python -m benchmarks.run (--quick | --full | --smoke) [--workers 2] [--repeats R]
                                [--out bench-out/suite.json] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Measurement, datasetrt_pass, machine_facts, record_rep, save_json
from benchmarks.peers import BATCH, RUNNERS, Digest, build_loaderx, new_result
from benchmarks.reader import PREFETCH, SEED

ROOT = Path(__file__).resolve().parent.parent
OURS = "datasetrt"
ORDER_FOLLOWERS = {"datasetrt", "datasetrt batches", "dataset-rt 0.4.8"}  # same plan, same order
# (name, kind, size or (lo, hi), count, algos) per mode; counts are multiples of 256 (loaderx steps).
MODES = {
    "smoke": [("4 KiB", "fixed", 4096, 1024, "none"), ("1-64 KiB", "var", (1024, 65536), 512, "none"),
              ("tokens", "tokens", (128, 2048), 1024, "lz4,zstd")],
    "quick": [("4 KiB", "fixed", 4096, 4096, "none"), ("150 KiB", "fixed", 150 * 1024, 512, "none"),
              ("1-64 KiB", "var", (1024, 65536), 1024, "none"), ("tokens", "tokens", (128, 2048), 4096, "lz4,zstd")],
    "full": [("4 KiB", "fixed", 4096, 16384, "none,lz4"), ("150 KiB", "fixed", 150 * 1024, 2048, "none"),
             ("1-64 KiB", "var", (1024, 65536), 4096, "none,lz4"), ("tokens", "tokens", (128, 2048), 16384, "lz4,zstd")],
}
REPEATS = {"smoke": 1, "quick": 2, "full": 4}  # timed repeats; one extra untimed digest pass when > 1


# ---------------------------------------------------------------------------- workloads


def make_payloads(kind: str, size, count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]
    if kind == "var":
        lens = rng.integers(size[0], size[1] + 1, count)
        return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in lens]
    lens = rng.integers(size[0], size[1] + 1, count)
    return [((rng.zipf(1.3, int(n)) - 1) % 32000).astype("<i4").tobytes() for n in lens]


class Source:
    """A CacheSource over prepared payloads; metadata label / n / score."""

    def __init__(self, name: str, payloads: list[bytes], make_input) -> None:
        self.name = name
        self.payloads = payloads
        self.count = len(payloads)
        self.make_input = make_input

    def __iter__(self):
        for i, p in enumerate(self.payloads):
            yield self.make_input(p, {"label": f"class{i % 10}", "n": i, "score": i * 0.5 + 0.25})


def prepare(workdir: Path, name: str, kind: str, size, count: int, algos: list[str], workers: int) -> dict:
    import datasetrt

    payloads = make_payloads(kind, size, count, SEED)
    flat = workdir / "flat"
    flat.mkdir(parents=True)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    with open(flat / "payloads.bin", "wb") as f:
        for p in payloads:
            f.write(p)
    np.save(flat / "offsets.npy", offsets)
    out = {"flat": str(flat), "caches": {}, "loaderx": {}, "loaderx_errors": {}, "orders": {}, "bytes": int(offsets[-1]), "count": count}
    rt = datasetrt.DatasetRuntime(num_workers=workers)
    try:
        for algo in algos:
            cfg = datasetrt.WriterConfig(show_progress=False, shard_compression=datasetrt.ShardCompression(algo=algo))
            [res] = rt.write_cache([Source("suite", payloads, datasetrt.CacheInput)], workdir / f"cache-{algo}", writer_config=cfg)
            assert isinstance(res, datasetrt.CacheWriteSuccess), res
            out["caches"][algo] = str(res.path)
            # datasetrt's shuffled sample order (dataset-rt's plan, which draws with replacement), so
            # the peers can replay it and be compared byte for byte.
            ds = datasetrt.CachedDataset([res.path], reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=True), runtime=None)
            order = np.fromiter((s.sample_id for s in ds), dtype=np.int64)
            np.save(workdir / f"order-{algo}.npy", order)
            out["orders"][algo] = str(workdir / f"order-{algo}.npy")
            out["distinct_shuffled"] = int(len(np.unique(order)))
    finally:
        rt.close()
    dtype = "<i4" if kind == "tokens" else "u1"
    for codec in sorted({"raw" if a == "none" else "zstd" for a in algos}):
        store = workdir / f"loaderx-{codec}"
        try:
            build_loaderx(store, payloads, size if kind == "fixed" else None, dtype, codec)
            out["loaderx"][codec] = str(store)
        except Exception as exc:
            out["loaderx_errors"][codec] = f"{type(exc).__name__}: {exc}"
    return out


# ---------------------------------------------------------------------------- datasetrt / dataset-rt child


def run_rt(spec: dict) -> dict:
    result = new_result()
    contender = spec["contender"]
    if contender.startswith("dataset-rt"):
        import dataset_rt as lib
    else:
        import datasetrt as lib
    cfg = lib.ReaderConfig(seed=spec["seed"], shuffle=spec["shuffle"], prefetch_size=PREFETCH)
    start = time.perf_counter()
    runtime = lib.DatasetRuntime(num_workers=spec["workers"])
    ds = runtime.cached_dataset([spec["cache"]], reader_config=cfg)
    repeats = spec["repeats"]
    for rep in range(repeats):
        d = Digest() if rep == 0 else None
        on_sample = (lambda data, _cid, _sid: d.add(data)) if d is not None else None
        n, nbytes, t0, stamps, first_at = datasetrt_pass(ds, contender == "datasetrt batches", BATCH, on_sample)
        dt = time.perf_counter() - t0
        if rep == 0 and first_at is not None:
            result["first_sample_s"] = first_at - start
        if d is not None:
            result.update(d.result())
        record_rep(result, rep, repeats, n, nbytes, dt, t0, stamps)
    if hasattr(runtime, "close"):
        runtime.close()
    return result


def run_child(spec: dict) -> dict:
    from benchmarks.pss import PeakPss

    with PeakPss() as pss:
        runner = RUNNERS.get(spec["contender"], run_rt)
        result = runner(spec)
    result["peak_pss_mib"] = pss.peak / 2**20
    return result


def contender_child(spec: dict, timeout: float) -> dict:
    try:
        out = subprocess.run([sys.executable, "-m", "benchmarks.run", "--child", json.dumps(spec)],
                             capture_output=True, text=True, check=False, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**new_result(), "error": f"timed out after {timeout:.0f} s", "peak_pss_mib": None}
    if out.returncode != 0:
        if spec["contender"] in (OURS, "datasetrt batches"):
            raise RuntimeError(f"{spec['contender']} failed:\n{out.stderr[-3000:]}")
        tail = (out.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {**new_result(), "error": f"exit {out.returncode}: {tail}", "peak_pss_mib": None}
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- report


def _med(xs):
    return statistics.median(xs) if xs else None


def table(rows: list[dict]) -> str:
    lines = ["| workload | contender | samples/s (median) | min - max | MiB/s | p95 batch of 256 | first sample | peak tree PSS | vs datasetrt | bytes |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = {r["workload"]: _med(r["rates"]) for r in rows if r["contender"] == OURS}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['contender']} | - | - | - | - | - | - | - | {r['error']} |")
            continue
        rate = _med(r["rates"])
        b = base.get(r["workload"])
        p95 = _med(r["p95_batch_ms"])
        first = r["first_sample_s"]
        pss = r.get("peak_pss_mib")
        lines.append(
            f"| {r['workload']} | {r['contender']} | {rate:,.0f} | {min(r['rates']):,.0f} - {max(r['rates']):,.0f} | "
            f"{_med(r['mib']):,.0f} | {f'{p95:.1f} ms' if p95 is not None else '-'} | "
            f"{f'{first * 1e3:.0f} ms' if first is not None else '-'} | {f'{pss:.0f} MiB' if pss else '-'} | "
            f"{f'{rate / b:.2f}x' if b else 'n/a'} | {r['check']} |")
    return "\n".join(lines)


def plot(rows: list[dict], sizes: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    chosen = [r for r in rows if r["workload"].endswith(" ordered") and not r.get("error") and r["mib"]]
    for contender in dict.fromkeys(r["contender"] for r in chosen):
        pts = {}
        for r in chosen:
            if r["contender"] == contender and r["base"] not in pts:  # first codec of each workload
                pts[r["base"]] = _med(r["mib"])
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


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", const="quick", dest="mode")
    mode.add_argument("--full", action="store_const", const="full", dest="mode")
    mode.add_argument("--smoke", action="store_const", const="smoke", dest="mode", help="tiny data, one repeat (tests)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (plus one untimed digest pass)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/suite.json"))
    parser.add_argument("--plot", type=Path, default=None, help="PNG of MiB/s by record size (needs matplotlib)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return
    mode = args.mode or "quick"
    timed_repeats = args.repeats or REPEATS[mode]
    repeats = timed_repeats + (1 if timed_repeats > 1 else 0)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-suite-"))
    rows: list[dict] = []
    sizes: dict[str, float] = {}
    failures: list[str] = []
    try:
        for name, kind, size, count, algos in MODES[mode]:
            algo_list = algos.split(",")
            wl = prepare(workdir / name.replace(" ", ""), name, kind, size, count, algo_list, args.workers)
            sizes[name] = wl["bytes"] / count
            for algo in algo_list:
                codec = "raw" if algo == "none" else "zstd"
                for shuffle in (False, True):
                    workload = f"{name} x {count} {algo} {'shuffled' if shuffle else 'ordered'}"
                    contenders = [OURS, "datasetrt batches"] + (["dataset-rt 0.4.8"] if algo != "zstd" else []) + list(RUNNERS)
                    base_spec = {"cache": wl["caches"][algo], "flat": wl["flat"], "loaderx": wl["loaderx"].get(codec),
                                 "fixed": kind == "fixed", "shuffle": shuffle,
                                 "order": wl["orders"][algo] if shuffle else None, "repeats": repeats,
                                 "workers": args.workers, "seed": SEED}
                    results: dict[str, dict] = {}
                    for contender in contenders:
                        if contender == "loaderx" and base_spec["loaderx"] is None:
                            r = {**new_result(), "error": f"store build failed: {wl['loaderx_errors'].get(codec)}", "peak_pss_mib": None}
                        else:
                            r = contender_child({**base_spec, "contender": contender}, timeout=600)
                        if contender == "loaderx" and algo == "lz4" and not r.get("error"):
                            r["note"] = f"{r.get('note', '')}; store codec {codec} (loaderx has no {algo})".lstrip("; ")
                        results[contender] = r
                    ref = results[OURS]
                    matched = {"ordered": [], "multiset": []}
                    for contender, r in results.items():
                        if r.get("error"):
                            r["check"] = "not compared"
                            continue
                        if r["digest"] == ref["digest"]:
                            r["check"] = "same bytes, same order"
                            matched["ordered"].append(contender)
                        elif contender not in ORDER_FOLLOWERS and r["multiset"] == ref["multiset"]:
                            r["check"] = "same bytes (multiset)"
                            matched["multiset"].append(contender)
                        else:
                            r["check"] = "DIFFERENT BYTES"
                            failures.append(f"{workload}: {contender} ordered {r['digest']} multiset {r['multiset']} "
                                            f"vs datasetrt {ref['digest']} {ref['multiset']}")
                        if r.get("note"):
                            r["check"] += f"; {r['note']}"
                    for contender, r in results.items():
                        rows.append({"workload": workload, "base": name, "algo": algo, "contender": contender,
                                     **{k: v for k, v in r.items() if k not in ("traceback",)}})
                        if r.get("error"):
                            print(f"{workload:34} {contender:27} {'n/a' if r['error'].startswith('no shuffle') else 'ERROR'} {r['error']}", flush=True)
                        else:
                            print(f"{workload:34} {contender:27} {_med(r['rates']):>11,.0f} samples/s {_med(r['mib']):>8,.0f} MiB/s"
                                  f"  first {(r['first_sample_s'] or 0) * 1e3:7.1f} ms  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}", flush=True)
                    print(f"same bytes: {workload}: ordered digest {', '.join(matched['ordered'])}"
                          + (f"; multiset {', '.join(matched['multiset'])}" if matched["multiset"] else ""), flush=True)
            shutil.rmtree(workdir / name.replace(" ", ""), ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started
    print(f"\nmachine: {machine_facts()}; mode={mode}, workers={args.workers}, prefetch_size={PREFETCH}, "
          f"batch={BATCH}, timed repeats={timed_repeats}, wall {wall:.0f} s\n")
    print(table(rows))
    measurements = [Measurement(r["workload"], r["contender"], "samples/s", r["rates"]) for r in rows if not r.get("error")]
    save_json(args.out, measurements, {"mode": mode, "workers": args.workers, "prefetch_size": PREFETCH, "batch": BATCH,
                                       "wall_s": wall, "record_bytes_mean": sizes, "rows": rows})
    if args.plot:
        try:
            plot(rows, sizes, args.plot)
            print(f"\nplot: {args.plot}")
        except ImportError:
            print("\nplot skipped: matplotlib is not installed")
    if failures:
        print("\nDIFFERENT BYTES:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nall contenders produced the same bytes")


if __name__ == "__main__":
    main()
