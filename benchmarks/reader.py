"""Reader benchmark: datasetrt (worker processes, per-sample and batch paths) vs dataset-rt 0.4.8
with the same worker count, in one run, on the same caches.

Workloads: 4 KiB and 150 KiB records, ordered and shuffled, none / lz4 / zstd (dataset-rt cannot
read zstd). Figures per contender: samples/s and MiB/s (median, min, max over repeats), p95
latency of 256-sample batches, time to first sample (cold: includes worker start-up), and peak PSS
of the whole process tree. Each contender runs in its own fresh subprocess so imports and caches
of one never count in another's memory; every contender's output digest must match.

Usage: python -m benchmarks.reader [--quick] [--workers 2] [--repeats R] [--out bench-out/reader.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.caches import PayloadSource, datasetrt_pass, rt_lib
from benchmarks.common import (
    DATASET_RT,
    Measurement,
    PeakPss,
    child_process,
    machine_facts,
    median,
    ratio_table,
    record_rep,
    save_json,
)
from benchmarks.suite import BATCH, PREFETCH, SEED


def _digest_update(h, data: bytes, cache_id: int, sample_id: int) -> None:
    h.update(data)
    h.update(cache_id.to_bytes(8, "little") + sample_id.to_bytes(8, "little"))


def run_child(spec: dict) -> dict:
    """Measure one contender in this (fresh) process; returns figures and an output digest."""
    contender, paths, workers, shuffle, repeats = (
        spec[k] for k in ("contender", "paths", "workers", "shuffle", "repeats")
    )
    result: dict = {"rates": [], "mib": [], "p95_batch_ms": [], "first_sample_s": None}
    with PeakPss() as pss:
        if contender == "page-cache pread (limit)":
            files = sorted(p for d in paths for p in (Path(d) / "shards").iterdir())
            buf = bytearray(max(f.stat().st_size for f in files))
            count = spec["count"]
            for _ in range(repeats):
                start = time.perf_counter()
                for f in files:
                    fd = os.open(f, os.O_RDONLY)
                    os.preadv(fd, [memoryview(buf)[: f.stat().st_size]], 0)
                    os.close(fd)
                dt = time.perf_counter() - start
                result["rates"].append(count / dt)
                result["mib"].append(sum(f.stat().st_size for f in files) / 2**20 / dt)
            result["digest"] = None
            result["peak_pss_mib"] = pss.peak / 2**20
            return result
        lib = rt_lib(contender)
        cfg = lib.ReaderConfig(seed=SEED, shuffle=shuffle, prefetch_size=PREFETCH)
        start = time.perf_counter()
        if contender == "datasetrt in-process":
            runtime = None
            ds = lib.CachedDataset(paths, reader_config=cfg, runtime=None)
        elif contender == "datasetrt (fork)":
            runtime = lib.DatasetRuntime(num_workers=workers, start_method="fork")
            ds = runtime.cached_dataset(paths, reader_config=cfg)
        else:
            runtime = lib.DatasetRuntime(num_workers=workers)
            ds = runtime.cached_dataset(paths, reader_config=cfg)
        digest = hashlib.sha256()
        for rep in range(repeats):
            on_sample = (lambda data, cid, sid: _digest_update(digest, data, cid, sid)) if rep == 0 else None
            n, nbytes, t0, stamps, first_at = datasetrt_pass(ds, contender == "datasetrt batches", BATCH, on_sample)
            dt = time.perf_counter() - t0
            if rep == 0 and first_at is not None:
                result["first_sample_s"] = first_at - start
            record_rep(result, rep, repeats, n, nbytes, dt, t0, stamps)
        result["digest"] = digest.hexdigest()
        if runtime is not None and hasattr(runtime, "close"):
            runtime.close()
    result["peak_pss_mib"] = pss.peak / 2**20
    return result


def write_workload(base: Path, name: str, count: int, payload_bytes: int, algo: str) -> Path:
    import datasetrt

    rt = datasetrt.DatasetRuntime(num_workers=2)
    cfg = datasetrt.WriterConfig(show_progress=False, shard_compression=datasetrt.ShardCompression(algo=algo))
    [res] = rt.write_cache([PayloadSource(name, count, payload_bytes, datasetrt.CacheInput)], base, writer_config=cfg)
    rt.close()
    assert isinstance(res, datasetrt.CacheWriteSuccess), res
    return Path(res.path)


def contender_child(spec: dict) -> dict:
    """One contender in a fresh `python -m benchmarks.reader --child SPEC`; raises when it fails."""
    child = child_process(["-m", "benchmarks.reader", "--child", json.dumps(spec)])
    if child.returncode != 0 or child.figures is None:
        raise RuntimeError(f"{spec['contender']} failed:\n{child.stderr[-3000:]}")
    return child.figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (plus one untimed digest pass)")
    parser.add_argument("--algos", default="none,lz4,zstd")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("bench-out/reader.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return
    repeats = (args.repeats or (2 if args.quick else 4)) + 1
    # 16,384 x 4 KiB is dataset-rt's own benchmark shape (reference section 5); 100,000 shows scaling.
    sizes = [
        (4096, 20_000 if args.quick else 16_384, args.algos),
        (150 * 1024, 600 if args.quick else 4_000, args.algos),
    ]
    if not args.quick:
        sizes.insert(1, (4096, 100_000, "none"))
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-reader-"))
    measurements: list[Measurement] = []
    extra: dict = {"workers": args.workers, "prefetch_size": PREFETCH, "batch": BATCH, "rows": []}
    try:
        for payload_bytes, count, algos in sizes:
            for algo in algos.split(","):
                cache = write_workload(workdir / f"{payload_bytes}-{count}-{algo}", "bench", count, payload_bytes, algo)
                for shuffle in (False, True):
                    workload = f"{payload_bytes // 1024} KiB x {count} {algo} {'shuffled' if shuffle else 'ordered'}"
                    contenders = ["datasetrt", "datasetrt batches", "datasetrt in-process"]
                    if algo != "zstd":
                        contenders.append(DATASET_RT)
                    if algo == "none" and not shuffle:
                        contenders += ["datasetrt (fork)", "page-cache pread (limit)"]
                    digests = {}
                    for contender in contenders:
                        spec = {
                            "contender": contender,
                            "paths": [str(cache)],
                            "workers": args.workers,
                            "shuffle": shuffle,
                            "repeats": repeats,
                            "count": count,
                        }
                        r = contender_child(spec)
                        if r["digest"] is not None:
                            digests[contender] = r["digest"]
                        measurements.append(Measurement(workload, contender, "samples/s", r["rates"]))
                        extra["rows"].append(
                            {
                                "workload": workload,
                                "contender": contender,
                                **{k: v for k, v in r.items() if k != "digest"},
                            }
                        )
                        print(
                            f"{workload:32} {contender:26} {median(r['rates']):>12,.0f} samples/s "
                            f"{median(r['mib']):>8,.0f} MiB/s  p95 batch "
                            f"{median(r['p95_batch_ms']) or 0:7.2f} ms  first "
                            f"{(r['first_sample_s'] or 0) * 1e3:8.1f} ms  peak PSS {r['peak_pss_mib']:7.0f} MiB",
                            flush=True,
                        )
                    assert len(set(digests.values())) == 1, (
                        f"{workload}: contenders returned different samples: {digests}"
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nmachine: {machine_facts()}; workers={args.workers}, prefetch_size={PREFETCH}")
    print(ratio_table(measurements, "datasetrt"))
    save_json(args.out, measurements, extra)


if __name__ == "__main__":
    main()
