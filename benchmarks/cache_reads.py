"""The suite's read contenders on the cache itself: datasetrt's per-sample, batch and `.to_numpy()`
paths, with reader workers or in-process, and dataset-rt 0.4.8 on the same cache files; for
datasetrt also the CPU seconds per GiB of the consumer process and of its reader workers.

Boundary: runs inside one contender's fresh child process (benchmarks.run --child) and returns
the figure dict of common.new_result; imports only the contender's own library.
"""

from __future__ import annotations

import resource
import time

import numpy as np

from benchmarks.caches import datasetrt_pass, rt_lib
from benchmarks.common import Digest, new_result, record_rep
from benchmarks.suite import BATCH, BATCHES, PREFETCH, TO_NUMPY


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
    "samples" - per-sample iteration, `np.stack` of `np.frombuffer(sample.data)` per 256 (the
    per-sample user path); "batches" - `iter_batches(batch)` and one `np.frombuffer(b.data).reshape`;
    "to_numpy" - `iter_batches(batch)` and `b.to_numpy()`. Same return as caches.datasetrt_pass;
    `on_rows(array)` sees every array in order when given."""
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
