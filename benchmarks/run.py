"""Benchmark suite: datasetrt against its peers and the physical limits, one entry point; ends
with issue 11's targets table (benchmarks.targets).

Workloads (generated deterministically, seed 11): fixed 4 KiB and 150 KiB records, variable 1-64
KiB records, a compressible token-like corpus (int32 sequences, zipf token ids, 128-2048 tokens)
written with lz4 and zstd, and int32[512] (fixed 512-token int32 records, 2 KiB, zipf ids; the
datasetrt cache typed `PayloadSpec("<i4", (512,))` when datasetrt has it) read as [256, 512]
int32 arrays; metadata columns label (str), n (int), score (float).

Read contenders, same data and same worker count in one run, each in a fresh subprocess:
  datasetrt                  DatasetRuntime(num_workers=W).cached_dataset(...), per-sample iteration
                             (int32[512]: + np.frombuffer / np.stack per 256, today's user path)
  datasetrt batches          the same, iter_batches(256) (int32[512]: + one frombuffer/reshape)
  datasetrt batches .to_numpy()   int32[512] only, when SampleBatch has to_numpy (issue 11)
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

Write, each workload and codec, each contender in a fresh subprocess with the payloads already in
memory: datasetrt and dataset-rt 0.4.8 `DatasetRuntime(num_workers=W).write_cache` (dataset-rt has
no zstd), loaderx building its Dense / Ragged store (raw and zstd; it has no lz4). Plus many small
caches: N sources of 20 x 64 B records in one write_cache call (N = 2,000 with --full, 100 with
--quick, 50 with --smoke; datasetrt and dataset-rt only). Figures: payload
MiB/s (median, min, max), samples/s, peak tree PSS, ratio to datasetrt; every written cache or store
is read back and its payloads compared with the generated ones in write order.

Open: one dataset over N small caches (hard links of one 8-record cache, distinct manifests; N = 1,
100, 10,000 with --full, 1, 100, 1,000 with --quick, 1, 10 with --smoke), then len(): datasetrt
`CachedDataset(paths, runtime=None)`, dataset-rt `DatasetRuntime(num_workers=1).cached_dataset`,
each N and contender in a fresh subprocess. Figures: seconds (median, min, max), the first open in
the fresh process, peak tree PSS, time relative to datasetrt; lengths must be 8 N.

With more than one timed repeat, repeat 0 is an extra untimed pass (digests; warm-up). No speed is
asserted; the exit status is 1 only when some contender's bytes (or open length) differ.

Usage: python -m benchmarks.run (--quick | --full | --smoke) [--workers 2] [--repeats R] [--workloads A,B]
                                [--out bench-out/suite.json] [--plot FILE.png] [--[no-]stream-peers]
                                [--no-torch] [--baseline FILE] [--save-baseline FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.caches import datasetrt_pass, make_many_caches, open_caches, write_cache
from benchmarks.common import Measurement, exit_on_different_bytes, machine_facts, record_rep, save_json
from benchmarks.peers import (
    BATCH,
    RUNNERS,
    Digest,
    build_loaderx,
    load_flat,
    loaderx_digest,
    new_result,
    run_memmap_gather,
)
from benchmarks.reader import PREFETCH, SEED
from benchmarks.stream_peers import INSTALL_HINT, LITDATA, STREAMING, installed, run_build, run_stream_peer
from benchmarks.targets import DEFAULT_BASELINE, baseline_of, load_baseline, read_targets, render, torch_targets

ROOT = Path(__file__).resolve().parent.parent
OURS = "datasetrt"
BATCHES = "datasetrt batches"
TO_NUMPY = "datasetrt batches .to_numpy()"
INPROC = "datasetrt in-process"
BATCHES_INPROC = "datasetrt batches in-process"
GATHER = "numpy memmap gather (limit)"
PREAD = "pread per record (limit)"
OURS_ALL = (OURS, BATCHES, TO_NUMPY, INPROC, BATCHES_INPROC)
ORDER_FOLLOWERS = {*OURS_ALL, "dataset-rt 0.4.8"}  # same plan, same order
OWN_ORDER = {STREAMING, LITDATA}  # their own shuffle: checked against the written records' multiset
TOKENS512 = "int32[512]"
ROW = {"dtype": "<i4", "shape": [512]}  # the int32[512] workload's records, read as [256, 512] int32 arrays
# (name, kind, size or (lo, hi), count, algos) per mode; counts are multiples of 256 (loaderx steps).
# Many small caches (write section only): N sources of 20 x 64 B records each, one write_cache call.
MANY_SMALL = {"smoke": 50, "quick": 100, "full": 2000}
MANY_SMALL_RECORDS, MANY_SMALL_BYTES = 20, 64
MODES = {
    "smoke": [
        ("4 KiB", "fixed", 4096, 1024, "none"),
        ("1-64 KiB", "var", (1024, 65536), 512, "none"),
        ("tokens", "tokens", (128, 2048), 1024, "lz4,zstd"),
        (TOKENS512, "tok512", 2048, 1024, "none"),
    ],
    "quick": [
        ("4 KiB", "fixed", 4096, 4096, "none,lz4"),
        ("150 KiB", "fixed", 150 * 1024, 512, "none"),
        ("1-64 KiB", "var", (1024, 65536), 1024, "none"),
        ("tokens", "tokens", (128, 2048), 4096, "lz4,zstd"),
        (TOKENS512, "tok512", 2048, 8192, "none,zstd"),
    ],
    "full": [
        ("4 KiB", "fixed", 4096, 16384, "none,lz4"),
        ("150 KiB", "fixed", 150 * 1024, 2048, "none"),
        ("1-64 KiB", "var", (1024, 65536), 4096, "none,lz4"),
        ("tokens", "tokens", (128, 2048), 16384, "lz4,zstd"),
        (TOKENS512, "tok512", 2048, 32768, "none,zstd"),
    ],
}
STREAM_PEER_MODES = {"quick", "full"}  # Streaming / LitData: seconds of imports per child, so not in --smoke
# Timed repeats; one extra untimed digest pass when > 1. --quick's epochs are 2-32 batches, so
# its first passes measure reader start-up (workers launching, then filling each ring slot for the
# first time: 25-33 ms epochs of 150 KiB x 512 before 9-14 ms ones), which "first sample" reports
# apart; 6 timed passes put the median on the steady rate (docs/benchmarks.md).
REPEATS = {"smoke": 1, "quick": 6, "full": 4}
OPEN_COUNTS = {"smoke": (1, 10), "quick": (1, 100, 1000), "full": (1, 100, 10_000)}  # caches per open
RT = "dataset-rt 0.4.8"


# ---------------------------------------------------------------------------- workloads


def make_payloads(kind: str, size, count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]
    if kind == "var":
        lens = rng.integers(size[0], size[1] + 1, count)
        return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in lens]
    if kind == "tok512":
        ids = (rng.zipf(1.3, (count, size // 4)) - 1) % 32000
        return [row.astype("<i4").tobytes() for row in ids]
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


def prepare(
    workdir: Path, name: str, kind: str, size, count: int, algos: list[str], workers: int, stream_peers: bool
) -> dict:
    """Generate one workload and write it everywhere it is read from: the flat file (the torch
    memmap contender and the limits), a datasetrt cache per codec (typed for int32[512] when
    datasetrt has PayloadSpec), datasetrt's shuffled order per codec, a loaderx store per store
    codec, and with `stream_peers` a Streaming MDS directory and a LitData optimized directory per
    store codec (each built in a child process: their imports stay out of this one)."""
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
    expected = Digest()
    for p in payloads:
        expected.add(p)
    dtype = "<i4" if kind in ("tokens", "tok512") else "u1"
    typed = ROW if kind == "tok512" else None
    out = {
        "flat": str(flat),
        "caches": {},
        "loaderx": {},
        "loaderx_errors": {},
        "orders": {},
        "bytes": int(offsets[-1]),
        "count": count,
        "written": expected.result(),
        "fixed_size": size if kind in ("fixed", "tok512") else None,
        "dtype": dtype,
        "typed": typed,
        "stores": {},
    }
    rt = datasetrt.DatasetRuntime(num_workers=workers)
    try:
        for algo in algos:
            path = write_cache(
                datasetrt, rt, workdir / f"cache-{algo}", Source("suite", payloads, datasetrt.CacheInput), algo, typed
            )
            out["caches"][algo] = str(path)
            # datasetrt's shuffled sample order (dataset-rt's plan, which draws with replacement), so
            # the peers can replay it and be compared byte for byte.
            ds = datasetrt.CachedDataset(
                [path], reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=True), runtime=None
            )
            order = np.fromiter((s.sample_id for s in ds), dtype=np.int64)
            np.save(workdir / f"order-{algo}.npy", order)
            out["orders"][algo] = str(workdir / f"order-{algo}.npy")
            out["distinct_shuffled"] = len(np.unique(order))
    finally:
        rt.close()
    for codec in sorted({"raw" if a == "none" else "zstd" for a in algos}):
        store = workdir / f"loaderx-{codec}"
        try:
            build_loaderx(store, payloads, out["fixed_size"], dtype, codec)
            out["loaderx"][codec] = str(store)
        except Exception as exc:
            out["loaderx_errors"][codec] = f"{type(exc).__name__}: {exc}"
        for peer in (STREAMING, LITDATA) if stream_peers else ():
            if not installed(peer):
                out["stores"][(peer, codec)] = {"error": f"not installed ({INSTALL_HINT})"}
                continue
            store = workdir / f"{peer.split()[-1].lower()}-{codec}"
            out["stores"][(peer, codec)] = contender_child(
                {
                    "task": "build",
                    "contender": peer,
                    "flat": str(flat),
                    "typed": typed,
                    "codec": codec,
                    "out": str(store),
                },
                timeout=900,
            )
    return out


# ---------------------------------------------------------------------------- datasetrt / dataset-rt child


def rt_lib(contender: str):
    """The library module of a datasetrt / dataset-rt contender."""
    if contender.startswith("dataset-rt"):
        import dataset_rt as lib
    else:
        import datasetrt as lib
    return lib


def cpu_now(runtime) -> tuple[float, dict[int, float]]:
    """CPU seconds (user + system) used so far by this process (getrusage RUSAGE_SELF: every
    thread) and by each live reader worker of `runtime` (psutil, by pid). RUSAGE_CHILDREN would
    count the workers only once they are reaped, so the live pids are read instead."""
    import psutil

    ru = resource.getrusage(resource.RUSAGE_SELF)
    workers = {}
    for pid in getattr(runtime, "worker_pids", None) or []:
        try:
            t = psutil.Process(pid).cpu_times()
            workers[pid] = t.user + t.system
        except psutil.Error:
            pass
    return ru.ru_utime + ru.ru_stime, workers


def cpu_delta(before: tuple[float, dict[int, float]], after: tuple[float, dict[int, float]]) -> tuple[float, float]:
    """(parent, workers) CPU seconds between two cpu_now() readings; a worker started in between
    counts from zero."""
    return after[0] - before[0], sum(t - before[1].get(pid, 0.0) for pid, t in after[1].items())


def array_pass(
    ds, how: str, batch: int, typed: dict, on_rows=None
) -> tuple[int, int, float, list[float], float | None]:
    """One window of a datasetrt dataset read as [batch, *shape] arrays of `typed["dtype"]`:
    "samples" - per-sample iteration, `np.stack` of `np.frombuffer(sample.data)` per 256 (today's
    user path); "batches" - `iter_batches(batch)` and one `np.frombuffer(b.data).reshape`;
    "to_numpy" - `iter_batches(batch)` and `b.to_numpy()` (issue 11). Same return as
    common.datasetrt_pass; `on_rows(array)` sees every array in order when given."""
    dtype, shape = np.dtype(typed["dtype"]), tuple(typed["shape"])
    n = nbytes = 0
    stamps: list[float] = []
    first_at = None

    def arrays():
        if how == "samples":
            datas = []
            for sample in ds:
                datas.append(sample.data)
                if len(datas) == batch:
                    yield np.stack([np.frombuffer(d, dtype).reshape(shape) for d in datas])
                    datas = []
            if datas:
                yield np.stack([np.frombuffer(d, dtype).reshape(shape) for d in datas])
        else:
            for b in ds.iter_batches(batch):
                yield b.to_numpy() if how == "to_numpy" else np.frombuffer(b.data, dtype).reshape(len(b), *shape)

    t0 = time.perf_counter()
    for arr in arrays():
        if first_at is None:
            first_at = time.perf_counter()
        n += len(arr)
        nbytes += arr.nbytes
        stamps.append(time.perf_counter())
        if on_rows is not None:
            on_rows(arr)
    return n, nbytes, t0, stamps, first_at


def run_rt(spec: dict) -> dict:
    """A datasetrt or dataset-rt read contender. Names: "datasetrt" (per-sample), "datasetrt
    batches" (`iter_batches(256)`), "datasetrt batches .to_numpy()", each on
    `DatasetRuntime(num_workers=W)`; "... in-process" on `CachedDataset(..., runtime=None)`. With
    `spec["typed"]` the payloads are read as [256, *shape] arrays (array_pass). Besides rates:
    parent and reader-worker CPU seconds per GiB delivered for each timed repeat."""
    result = {**new_result(), "cpu_parent_s_per_gib": [], "cpu_workers_s_per_gib": []}
    contender = spec["contender"]
    lib = rt_lib(contender)
    cfg = lib.ReaderConfig(seed=spec["seed"], shuffle=spec["shuffle"], prefetch_size=PREFETCH)
    how = "to_numpy" if contender == TO_NUMPY else "batches" if contender.startswith(BATCHES) else "samples"
    start = time.perf_counter()
    if contender.endswith("in-process"):
        runtime = None
        ds = lib.CachedDataset([spec["cache"]], reader_config=cfg, runtime=None)
    else:
        runtime = lib.DatasetRuntime(num_workers=spec["workers"])
        ds = runtime.cached_dataset([spec["cache"]], reader_config=cfg)
    typed = spec.get("typed")
    repeats = spec["repeats"]
    for rep in range(repeats):
        d = Digest() if rep == 0 else None
        cpu0 = cpu_now(runtime)
        if typed:
            on_rows = (lambda arr: [d.add(row) for row in arr]) if d is not None else None  # noqa: B023 (called within this iteration)
            n, nbytes, t0, stamps, first_at = array_pass(ds, how, BATCH, typed, on_rows)
        else:
            on_sample = (lambda data, _cid, _sid: d.add(data)) if d is not None else None  # noqa: B023 (called within this iteration)
            n, nbytes, t0, stamps, first_at = datasetrt_pass(ds, how == "batches", BATCH, on_sample)
        dt = time.perf_counter() - t0
        parent_s, workers_s = cpu_delta(cpu0, cpu_now(runtime))
        if rep == 0 and first_at is not None:
            result["first_sample_s"] = first_at - start
        if d is not None:
            result.update(d.result())
        if (rep > 0 or repeats == 1) and nbytes:
            result["cpu_parent_s_per_gib"].append(parent_s / (nbytes / 2**30))
            result["cpu_workers_s_per_gib"].append(workers_s / (nbytes / 2**30))
        record_rep(result, rep, repeats, n, nbytes, dt, t0, stamps)
    if hasattr(runtime, "close"):
        runtime.close()
    return result


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
    if contender == "loaderx":

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


def many_small_payloads(sources: int) -> list[bytes]:
    return make_payloads("fixed", MANY_SMALL_BYTES, sources * MANY_SMALL_RECORDS, SEED)


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


def run_open(spec: dict) -> dict:
    """Open one dataset over the first `n` of the many small caches, `repeats` times (open_caches:
    datasetrt `CachedDataset(paths, runtime=None)`, dataset-rt `DatasetRuntime(num_workers=1)
    .cached_dataset(paths)`, runtime created beforehand, plus len()). "first_s" is repeat 0, the
    first open in this fresh process (after the API's own imports); it is timed into "seconds" only
    when it is the only repeat."""
    result = {**new_result(), "seconds": [], "first_s": None}
    contender, repeats = spec["contender"], spec["repeats"]
    lib = rt_lib(contender)
    paths = sorted(Path(spec["many"]).iterdir())[: spec["n"]]
    runtime = None if contender == OURS else lib.DatasetRuntime(num_workers=1)
    lib.ReaderConfig(seed=1), lib.CachedDataset  # resolve the API (datasetrt imports it lazily) before timing
    for rep in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result["count"] = open_caches(lib, runtime, paths)
        dt = time.perf_counter() - t0
        if rep == 0:
            result["first_s"] = dt
        if rep > 0 or repeats == 1:
            result["seconds"].append(dt)
    return result


def run_child(spec: dict) -> dict:
    from benchmarks.common import PeakPss

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


def contender_child(spec: dict, timeout: float) -> dict:
    try:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.run", "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {**new_result(), "error": f"timed out after {timeout:.0f} s", "peak_pss_mib": None}
    if out.returncode != 0:
        if spec["contender"] in OURS_ALL:
            raise RuntimeError(f"{spec['contender']} failed:\n{out.stderr[-3000:]}")
        tail = (out.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {**new_result(), "error": f"exit {out.returncode}: {tail}", "peak_pss_mib": None}
    return json.loads(out.stdout.strip().splitlines()[-1])


READ_RUNNERS = {**RUNNERS, GATHER: run_memmap_gather, STREAMING: run_stream_peer, LITDATA: run_stream_peer}


def read_contenders(kind: str, algo: str, stream_peers: bool) -> list[str]:
    """The read contenders of one row. Byte workloads: datasetrt per-sample and batches (reader
    workers and in-process), dataset-rt (not zstd), loaderx, torch over memmap and the two limits.
    int32[512]: datasetrt per-sample + np.stack, batches + reshape, `.to_numpy()` when SampleBatch
    has it, the in-process pair, loaderx Dense, the numpy memmap gather and the pread limit."""
    if kind == "tok512":
        from datasetrt.runtime.sample_batch import SampleBatch

        ours = [OURS, BATCHES] + ([TO_NUMPY] if hasattr(SampleBatch, "to_numpy") else []) + [INPROC, BATCHES_INPROC]
        peers = ["loaderx", GATHER, PREAD]
    else:
        ours = [OURS, BATCHES, INPROC, BATCHES_INPROC] + ([RT] if algo != "zstd" else [])
        peers = list(RUNNERS)
    return ours + peers + ([STREAMING, LITDATA] if stream_peers else [])


def check_read(
    results: dict[str, dict], shuffle: bool, written_multiset: str, workload: str, failures: list[str]
) -> dict:
    """Sets each result's "check" against datasetrt's bytes: the same ordered digest, else (for a
    contender that does not replay datasetrt's plan) the same multiset; Streaming and LitData on
    shuffled rows (their own permutation) against the multiset of the written records. Returns the
    contenders matched per kind of check."""
    ref = results[OURS]
    matched: dict[str, list[str]] = {"ordered": [], "multiset": [], "written multiset": []}
    for contender, r in results.items():
        if r.get("error"):
            r["check"] = "not compared"
            continue
        if r["digest"] == ref["digest"]:
            r["check"] = "same bytes, same order"
            matched["ordered"].append(contender)
        elif contender in OWN_ORDER and shuffle and r["multiset"] == written_multiset:
            r["check"] = "same bytes as written (multiset)"
            matched["written multiset"].append(contender)
        elif contender not in ORDER_FOLLOWERS and r["multiset"] == ref["multiset"]:
            r["check"] = "same bytes (multiset)"
            matched["multiset"].append(contender)
        else:
            r["check"] = "DIFFERENT BYTES"
            failures.append(
                f"{workload}: {contender} ordered {r['digest']} multiset {r['multiset']} "
                f"vs datasetrt {ref['digest']} {ref['multiset']}"
            )
        if r.get("note"):
            r["check"] += f"; {r['note']}"
    return matched


# ---------------------------------------------------------------------------- write and open (parent side)


def written_digest(contender: str, path: str, fixed: bool) -> dict:
    """Read a contender's written output back in write order: a datasetrt or dataset-rt cache with
    datasetrt (single process), a loaderx store with loaderx."""
    if contender == "loaderx":
        return loaderx_digest(Path(path), fixed)
    import datasetrt

    d = Digest()
    caches = [path]
    if not (Path(path) / "manifest.json").exists():  # many small caches under one base, in name order
        caches = sorted(str(p) for p in Path(path).iterdir() if (p / "manifest.json").exists())
    for sample in datasetrt.CachedDataset(
        caches, reader_config=datasetrt.ReaderConfig(seed=SEED, shuffle=False), runtime=None
    ):
        d.add(sample.data)
    return d.result()


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
            [OURS] + ([RT] if algo != "zstd" else []) + (["loaderx"] if algo != "lz4" and not wl.get("sources") else [])
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
                if contender == "loaderx":
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
                    f"write {workload:28} {contender:27} {_med(r['mib']):>8,.0f} MiB/s {_med(r['rates']):>11,.0f} samples/s"
                    f"  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}",
                    flush=True,
                )
        print(f"same bytes written: {workload}: {', '.join(matched)}", flush=True)
    return rows


def bench_open(workdir: Path, counts: tuple[int, ...], repeats: int, failures: list[str]) -> list[dict]:
    """Open time of a dataset over N small caches (make_many_caches: hard links of one 8-record
    cache under distinct manifests) for each N; each contender and N in a fresh subprocess."""
    paths = make_many_caches(workdir, max(counts))
    rows = []
    for n in counts:
        for contender in (OURS, RT):
            r = contender_child(
                {"task": "open", "contender": contender, "many": str(paths[0].parent), "n": n, "repeats": repeats},
                timeout=600,
            )
            expected = 8 * n
            if r.get("error"):
                r["check"] = "not compared"
            elif r["count"] == expected:
                r["check"] = f"same length ({expected:,} samples)"
            else:
                r["check"] = f"DIFFERENT LENGTH ({r['count']:,}, expected {expected:,})"
                failures.append(f"open {n} caches: {contender} len {r['count']} vs {expected}")
            rows.append(
                {
                    "workload": f"{n:,} caches",
                    "caches": n,
                    "contender": contender,
                    **{k: v for k, v in r.items() if k != "traceback"},
                }
            )
            if r.get("error"):
                print(f"open {n:>6,} caches {contender:27} ERROR {r['error']}", flush=True)
            else:
                print(
                    f"open {n:>6,} caches {contender:27} {_med(r['seconds']) * 1e3:>9.2f} ms  first {r['first_s'] * 1e3:9.2f} ms"
                    f"  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}",
                    flush=True,
                )
    return rows


# ---------------------------------------------------------------------------- report


def _med(xs):
    return statistics.median(xs) if xs else None


def table(rows: list[dict]) -> str:
    lines = [
        "| workload | contender | samples/s (median) | min - max | MiB/s | p95 batch of 256 | first sample | peak tree PSS "
        "| CPU s/GiB parent + workers | vs datasetrt | bytes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = {r["workload"]: _med(r["rates"]) for r in rows if r["contender"] == OURS}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['contender']} | - | - | - | - | - | - | - | - | {r['error']} |")
            continue
        rate = _med(r["rates"])
        cpu = _med(r.get("cpu_parent_s_per_gib") or [])
        cpu_txt = f"{cpu:.2f} + {_med(r['cpu_workers_s_per_gib']):.2f}" if cpu is not None else "-"
        b = base.get(r["workload"])
        p95 = _med(r["p95_batch_ms"])
        first = r["first_sample_s"]
        pss = r.get("peak_pss_mib")
        lines.append(
            f"| {r['workload']} | {r['contender']} | {rate:,.0f} | {min(r['rates']):,.0f} - {max(r['rates']):,.0f} | "
            f"{_med(r['mib']):,.0f} | {f'{p95:.1f} ms' if p95 is not None else '-'} | "
            f"{f'{first * 1e3:.0f} ms' if first is not None else '-'} | {f'{pss:.0f} MiB' if pss else '-'} | {cpu_txt} | "
            f"{f'{rate / b:.2f}x' if b else 'n/a'} | {r['check']} |"
        )
    return "\n".join(lines)


def write_table(rows: list[dict]) -> str:
    lines = [
        "| workload | contender | write MiB/s (median) | min - max | samples/s | peak tree PSS | vs datasetrt | bytes read back |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    base = {r["workload"]: _med(r["mib"]) for r in rows if r["contender"] == OURS}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['contender']} | - | - | - | - | - | {r['error']} |")
            continue
        mib, b, pss = _med(r["mib"]), base.get(r["workload"]), r.get("peak_pss_mib")
        lines.append(
            f"| {r['workload']} | {r['contender']} | {mib:,.0f} | {min(r['mib']):,.0f} - {max(r['mib']):,.0f} | "
            f"{_med(r['rates']):,.0f} | {f'{pss:.0f} MiB' if pss else '-'} | {f'{mib / b:.2f}x' if b else 'n/a'} | {r['check']} |"
        )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"


def open_table(rows: list[dict]) -> str:
    lines = [
        "| caches | contender | open time (median) | min - max | first open (cold process) | peak tree PSS | time vs datasetrt | samples |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    base = {r["workload"]: _med(r["seconds"]) for r in rows if r["contender"] == OURS and not r.get("error")}
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['caches']:,} | {r['contender']} | - | - | - | - | - | {r['error']} |")
            continue
        sec, b, pss = _med(r["seconds"]), base.get(r["workload"]), r.get("peak_pss_mib")
        lines.append(
            f"| {r['caches']:,} | {r['contender']} | {_ms(sec)} | {_ms(min(r['seconds']))} - {_ms(max(r['seconds']))} | "
            f"{_ms(r['first_s'])} | {f'{pss:.0f} MiB' if pss else '-'} | {f'{sec / b:.2f}x' if b else 'n/a'} | {r['check']} |"
        )
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
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return
    mode = args.mode or "quick"
    workloads = MODES[mode]
    if args.workloads is not None:
        wanted = args.workloads.split(",")
        unknown = sorted(set(wanted) - {w[0] for w in workloads})
        if unknown:
            parser.error(f"--workloads: {unknown} not in --{mode}'s {[w[0] for w in workloads]}")
        workloads = [w for w in workloads if w[0] in wanted]
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
        for name, kind, size, count, algos in workloads:
            algo_list = algos.split(",")
            wl = prepare(
                workdir / name.replace(" ", ""), name, kind, size, count, algo_list, args.workers, stream_peers
            )
            sizes[name] = wl["bytes"] / count
            for algo in algo_list:
                codec = "raw" if algo == "none" else "zstd"
                for shuffle in (False, True):
                    workload = f"{name} x {count} {algo} {'shuffled' if shuffle else 'ordered'}"
                    contenders = read_contenders(kind, algo, stream_peers)
                    base_spec = {
                        "cache": wl["caches"][algo],
                        "flat": wl["flat"],
                        "loaderx": wl["loaderx"].get(codec),
                        "fixed": wl["fixed_size"] is not None,
                        "shuffle": shuffle,
                        "typed": wl["typed"],
                        "dtype": wl["dtype"],
                        "row_shape": ROW["shape"],
                        "order": wl["orders"][algo] if shuffle else None,
                        "repeats": repeats,
                        "workers": args.workers,
                        "seed": SEED,
                    }
                    results: dict[str, dict] = {}
                    for contender in contenders:
                        store = wl["stores"].get((contender, codec), {})
                        if contender == "loaderx" and base_spec["loaderx"] is None:
                            r = {
                                **new_result(),
                                "error": f"store build failed: {wl['loaderx_errors'].get(codec)}",
                                "peak_pss_mib": None,
                            }
                        elif contender in OWN_ORDER and store.get("error"):
                            r = {**new_result(), "error": store["error"], "peak_pss_mib": None}
                        else:
                            r = contender_child(
                                {**base_spec, "contender": contender, "store": store.get("path")}, timeout=600
                            )
                        if contender == "loaderx" and algo == "lz4" and not r.get("error"):
                            r["note"] = f"{r.get('note', '')}; store codec {codec} (loaderx has no {algo})".lstrip("; ")
                        if contender in OWN_ORDER and algo == "lz4" and not r.get("error"):
                            r["note"] = f"{r.get('note', '')}; store codec zstd (lz4 rows read the zstd store)"
                        results[contender] = r
                    matched = check_read(results, shuffle, wl["written"]["multiset"], workload, failures)
                    for contender, r in results.items():
                        rows.append(
                            {
                                "workload": workload,
                                "base": name,
                                "algo": algo,
                                "contender": contender,
                                **{k: v for k, v in r.items() if k not in ("traceback",)},
                            }
                        )
                        if r.get("error"):
                            print(
                                f"{workload:34} {contender:27} {'n/a' if r['error'].startswith('no shuffle') else 'ERROR'} {r['error']}",
                                flush=True,
                            )
                        else:
                            print(
                                f"{workload:34} {contender:27} {_med(r['rates']):>11,.0f} samples/s {_med(r['mib']):>8,.0f} MiB/s"
                                f"  first {(r['first_sample_s'] or 0) * 1e3:7.1f} ms  PSS {r['peak_pss_mib'] or 0:5.0f} MiB  {r['check']}",
                                flush=True,
                            )
                    print(
                        f"same bytes: {workload}: ordered digest {', '.join(matched['ordered'])}"
                        + (f"; multiset {', '.join(matched['multiset'])}" if matched["multiset"] else "")
                        + (
                            f"; written multiset {', '.join(matched['written multiset'])}"
                            if matched["written multiset"]
                            else ""
                        ),
                        flush=True,
                    )
            if kind == "tok512" and args.torch:
                from benchmarks import torch_batches

                t_torch = time.perf_counter()
                torch_rows = torch_batches.bench(wl, mode, stream_peers, failures)
                phase_s["torch"] = time.perf_counter() - t_torch
            t_write = time.perf_counter()
            write_rows += bench_writes(
                wl, name, count, algo_list, workdir / name.replace(" ", ""), args.workers, repeats, failures
            )
            phase_s["write"] += time.perf_counter() - t_write
            shutil.rmtree(workdir / name.replace(" ", ""), ignore_errors=True)
        t_write = time.perf_counter()
        n_small = MANY_SMALL[mode]
        written = Digest()
        for payload in many_small_payloads(n_small):
            written.add(payload)
        wl = {
            "flat": None,
            "sources": n_small,
            "written": written.result(),
            "fixed_size": MANY_SMALL_BYTES,
            "dtype": "u1",
        }
        write_rows += bench_writes(
            wl,
            f"{n_small:,}",
            f"{MANY_SMALL_RECORDS} x {MANY_SMALL_BYTES} B",
            ["none"],
            workdir / "many-small",
            args.workers,
            repeats,
            failures,
        )
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
    print(table(rows))
    print(f"\nwrite (payload MiB/s; DatasetRuntime(num_workers={args.workers}) for datasetrt and dataset-rt)\n")
    print(write_table(write_rows))
    print("\nopen (one dataset over N caches of 8 records each, then len())\n")
    print(open_table(open_rows))
    if torch_rows:
        from benchmarks import torch_batches

        print(f"\ntorch end to end ({TOKENS512} records to [256, 512] int32 tensors, 2 torch workers)\n")
        print(torch_batches.table(torch_rows))
    baseline, baseline_note = load_baseline(args.baseline, mode)
    print(f"\nissue 11 targets ({baseline_note})\n")
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
