"""The suite's write section: write MiB/s of datasetrt, dataset-rt 0.4.8 and loaderx for each
workload and codec, plus many small caches in one `write_cache` call; every written cache or
store is read back and its payloads compared with the generated ones in write order.

Each contender writes in a fresh child (`run_write`) with the payloads already in memory; only
the write call is timed: datasetrt and dataset-rt `DatasetRuntime(num_workers=W).write_cache`
(dataset-rt has no zstd), loaderx building its Dense / Ragged store (raw and zstd; it has no lz4).

Boundary: the parent side (`bench_writes`, `bench_many_small`) launches children and reads their
output back with datasetrt or loaderx; the child side imports only its contender's library.
"""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks.caches import rt_lib, write_cache
from benchmarks.common import Digest, median, new_result, record_rep
from benchmarks.peers import build_loaderx, load_flat, loaderx_digest
from benchmarks.suite import LOADERX, OURS, RT, SEED, contender_child
from benchmarks.workloads import MANY_SMALL, MANY_SMALL_BYTES, MANY_SMALL_RECORDS, Source, many_small_payloads


def run_write(spec: dict) -> dict:
    """Write the workload's payloads (loaded from the flat file before any timing) `repeats`
    times, each into a fresh directory; only the write call is timed (datasetrt / dataset-rt:
    `DatasetRuntime(num_workers=W).write_cache`, runtime created beforehand; loaderx: build_loaderx,
    its Dense / Ragged store). Repeat 0 is kept on disk for the parent to read back ("path") and,
    as for reads, is timed only when it is the only repeat; the others are deleted."""
    result = new_result()
    contender, repeats = spec["contender"], spec["repeats"]
    if spec.get("sources"):  # many small caches: the payloads are generated, not loaded
        payloads = many_small_payloads(spec["sources"])
        n, nbytes = len(payloads), sum(map(len, payloads))
    else:
        payloads_file, offsets = load_flat(spec["flat"])
        with open(payloads_file, "rb") as f:
            payloads = [f.read(int(n)) for n in np.diff(offsets)]
        n, nbytes = len(payloads), int(offsets[-1])
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    if contender == LOADERX:

        def write(dest: Path) -> Path:
            build_loaderx(dest, payloads, spec["fixed_size"], spec["dtype"], spec["codec"])
            return dest

        runtime = None
    else:
        lib = rt_lib(contender)
        runtime = lib.DatasetRuntime(num_workers=spec["workers"])
        source = Source("suite", payloads, lib.CacheInput)
        lib.WriterConfig(show_progress=False, shard_compression=lib.ShardCompression(algo=spec["algo"]))  # lazy imports

        def write(dest: Path) -> Path:
            if spec.get("sources"):
                return write_many(lib, runtime, dest, payloads)
            return write_cache(lib, runtime, dest, source, spec["algo"])

    for rep in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        path = write(out / f"rep{rep}")
        dt = time.perf_counter() - t0
        record_rep(result, rep, repeats, n, nbytes, dt, t0, [])
        if rep == 0:
            result["path"] = str(path)
        else:
            shutil.rmtree(out / f"rep{rep}")
    if hasattr(runtime, "close"):
        runtime.close()
    return result


def write_many(lib, runtime, dest: Path, payloads: list[bytes]) -> Path:
    """One `write_cache` of len(payloads) / 20 sources named s00000, s00001, ... (no compression)."""
    k = MANY_SMALL_RECORDS
    sources = [Source(f"s{i // k:05d}", payloads[i : i + k], lib.CacheInput) for i in range(0, len(payloads), k)]
    cfg = lib.WriterConfig(show_progress=False, shard_compression=lib.ShardCompression(algo="none"))
    results = runtime.write_cache(sources, dest, writer_config=cfg)
    assert all(isinstance(r, lib.CacheWriteSuccess) for r in results), [
        r for r in results if not isinstance(r, lib.CacheWriteSuccess)
    ][:3]
    return dest


def written_digest(contender: str, path: str, fixed: bool) -> dict:
    """Read a contender's written output back in write order: a datasetrt or dataset-rt cache with
    datasetrt (single process), a loaderx store with loaderx."""
    if contender == LOADERX:
        return loaderx_digest(Path(path), fixed)
    import datasetrt

    caches = [path]
    if not (Path(path) / "manifest.json").exists():  # many small caches under one base, in name order
        caches = sorted(str(p) for p in Path(path).iterdir() if (p / "manifest.json").exists())
    ds = datasetrt.CachedDataset(caches, reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=False), runtime=None)
    return Digest.of(sample.data for sample in ds)


def bench_writes(
    wl: dict,
    name: str,
    count: int | str,
    algos: list[str],
    outdir: Path,
    workers: int,
    repeats: int,
    failures: list[str],
) -> list[dict]:
    """Write MiB/s of each contender for each codec of one workload; the written bytes read back
    and compared with the generated payloads (write order). `wl["sources"]`: many small caches."""
    rows = []
    for algo in algos:
        workload = f"{name} x {count} {algo}"
        # dataset-rt has no zstd; loaderx has raw and zstd but no lz4 (and no many-caches layout)
        contenders = (
            [OURS] + ([RT] if algo != "zstd" else []) + ([LOADERX] if algo != "lz4" and not wl.get("sources") else [])
        )
        matched = []
        for contender in contenders:
            spec = {
                "task": "write",
                "contender": contender,
                "flat": wl["flat"],
                "sources": wl.get("sources"),
                "algo": algo,
                "workers": workers,
                "repeats": repeats,
                "out": str(outdir / f"write-{contender.split()[0]}-{algo}"),
                "fixed_size": wl["fixed_size"],
                "dtype": wl["dtype"],
                "codec": "raw" if algo == "none" else "zstd",
            }
            r = contender_child(spec, timeout=600)
            if not r.get("error"):
                try:
                    got = written_digest(contender, r["path"], wl["fixed_size"] is not None)
                except Exception as exc:  # unreadable output is a finding like different bytes
                    got = {"digest": f"read back failed: {type(exc).__name__}: {exc}"}
                if got["digest"] == wl["written"]["digest"]:
                    r["check"] = "same bytes, same order"
                    matched.append(contender)
                else:
                    r["check"] = "DIFFERENT BYTES"
                    failures.append(
                        f"write {workload}: {contender} wrote {got['digest']} vs generated {wl['written']['digest']}"
                    )
                if contender == LOADERX:
                    r["check"] += "; payloads only (no metadata, no checksums)"
                shutil.rmtree(spec["out"], ignore_errors=True)
            else:
                r["check"] = "not compared"
            rows.append(
                {
                    "workload": workload,
                    "base": name,
                    "algo": algo,
                    "contender": contender,
                    **{k: v for k, v in r.items() if k not in ("traceback", "path")},
                }
            )
            if r.get("error"):
                print(f"write {workload:28} {contender:27} ERROR {r['error']}", flush=True)
            else:
                print(
                    f"write {workload:28} {contender:27} {median(r['mib']):>8,.0f} MiB/s {median(r['rates']):>11,.0f} samples/s"
                    f"  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}",
                    flush=True,
                )
        print(f"same bytes written: {workload}: {', '.join(matched)}", flush=True)
    return rows


def bench_many_small(mode: str, outdir: Path, workers: int, repeats: int, failures: list[str]) -> list[dict]:
    """The many-small write: MANY_SMALL[mode] sources of 20 x 64 B records in one write_cache call
    (datasetrt and dataset-rt), read back and compared like every other write."""
    n_small = MANY_SMALL[mode]
    wl = {
        "flat": None,
        "sources": n_small,
        "written": Digest.of(many_small_payloads(n_small)),
        "fixed_size": MANY_SMALL_BYTES,
        "dtype": "u1",
    }
    return bench_writes(
        wl, f"{n_small:,}", f"{MANY_SMALL_RECORDS} x {MANY_SMALL_BYTES} B", ["none"], outdir, workers, repeats, failures
    )
