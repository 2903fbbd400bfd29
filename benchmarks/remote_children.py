"""The reader and writer children of the object-storage benchmark (benchmarks.remote), run in the
main venv, one fresh process each: datasetrt's write of the records to s3://bench/drt, datasetrt's
timed epochs (cold, warm, the paired local-disk reference) and the GET floor. Each prints one JSON
line of figures; the orchestration (servers, the shaped link, sampling, the report) stays in
benchmarks.remote.

Usage: python -m benchmarks.remote_children --child SPEC (started by benchmarks.remote).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, Digest
from benchmarks.remote_peers import median_pass

SEED = 11
BATCH = 256
WORKERS = 2
BUCKET = "bench"
OURS_PREFIX = "drt"  # datasetrt's prefix under the bucket


def s3_options(endpoint: str) -> dict:
    from tests.servers.moto import s3_options as options

    return options(endpoint)


def child_write(spec: dict) -> dict:
    """datasetrt writes the records as one cache under s3://bench/drt (through the proxy)."""
    import datasetrt as drt
    from benchmarks.remote_records import read_records

    rows = read_records(spec["records"], spec["size"])

    class Records:
        name = "records"

        def __iter__(self):
            for i in range(len(rows)):
                yield drt.CacheInput(rows[i].tobytes(), {"label": i % 1000})

    storage = drt.StorageConfig(options=spec["options"], cache_dir=spec["cache_dir"])
    cfg = drt.WriterConfig(show_progress=False, max_shard_bytes=spec["shard_bytes"], storage=storage)
    t0 = time.perf_counter()
    with drt.DatasetRuntime(num_workers=WORKERS) as rt:
        [result] = rt.write_cache([Records()], f"s3://{BUCKET}/{OURS_PREFIX}", writer_config=cfg)
    if not isinstance(result, drt.CacheWriteSuccess):
        return {"error": f"write_cache: {result}"}
    return {"url": str(result.path), "write_s": time.perf_counter() - t0}


def pass_figures(tally, seconds: float, first_s: float | None, first_n: int | None, wall0: float) -> dict:
    """One timed pass: its time, first batch (seconds, samples), what it delivered, its wall span."""
    return {
        "s": seconds,
        "first_batch_s": first_s,
        "first_n": first_n or 0,
        "samples": tally.samples,
        "bytes": tally.bytes,
        "wall": [wall0, time.time()],
        "order_head": tally.order_head(),
    }


def child_read(spec: dict) -> dict:
    """datasetrt's cold epoch (construction to last batch), warm epoch, optional digest pass.
    `spec["url"]` is the s3:// cache, or (the local-disk reference) a local directory holding the
    same cache; `limit_bytes` is StorageConfig.cache_limit_bytes."""
    import numpy as np

    import datasetrt as drt
    from benchmarks.remote_records import Tally

    size = spec["size"]
    storage = drt.StorageConfig(
        options=spec["options"],
        cache_dir=spec["cache_dir"],
        cache_limit_bytes=spec.get("limit_bytes"),
        **spec.get("storage", {}),
    )
    cfg = drt.ReaderConfig(
        seed=SEED, shuffle=True, sampling="locality", window_shards=spec["window_shards"], storage=storage
    )
    # The metadata stack a label column needs is imported before the clock, as every contender's
    # libraries are: polars, pyarrow, and pandas, which pyarrow imports on its first pa.array()
    # when it is installed (0.5-0.8 s on datasetrt's first batch here otherwise).
    import polars  # noqa: F401
    import pyarrow

    pyarrow.array([0])

    result: dict = {"passes": {}, "problems": []}
    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t_open = time.time()
    start = time.perf_counter()
    runtime = drt.DatasetRuntime(num_workers=spec["workers"]) if spec["workers"] else None
    ds = drt.CachedDataset([spec["url"]], reader_config=cfg, runtime=runtime)
    result["open_s"] = time.perf_counter() - start

    def one_pass(dataset, name: str, t_start: float | None = None, wall0: float | None = None) -> dict:
        nonlocal profiler
        tally = Tally(spec["expect"])
        wall0 = time.time() if wall0 is None else wall0
        t0 = time.perf_counter() if t_start is None else t_start
        first = first_n = None
        for b in dataset.iter_batches(BATCH):
            if first is None:
                first, first_n = time.perf_counter() - t0, len(b)
            rows = np.frombuffer(b.data, dtype=np.uint8).reshape(len(b), size)
            tally.add_rows(rows, b.columns(["label"])["label"])
            del rows, b
        dt = time.perf_counter() - t0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(spec["profile"])
            profiler = None
        result["problems"] += [f"{name}: {p}" for p in tally.problems()]
        return pass_figures(tally, dt, first, first_n, wall0)

    result["passes"]["cold"] = one_pass(ds, "cold", start, t_open)
    # The local-disk reference beside each warm epoch, in this process: the same files (the
    # mirror this read just filled) opened as a local cache, its epochs in the same order as
    # the remote dataset's (one untimed pass first, so epoch k of both is the same order).
    local = None
    if spec.get("paired_local") and mirror_dir(Path(spec["cache_dir"])) is not None:
        local = drt.CachedDataset([str(mirror_dir(Path(spec["cache_dir"])))], reader_config=cfg, runtime=runtime)
        one_pass(local, "local, untimed")
    warm, local_warm = [], []
    for k in range(spec.get("warm_passes", 1)):
        warm.append(one_pass(ds, f"warm {k}"))
        if local is not None:
            local_warm.append(one_pass(local, f"local {k}"))
    result["passes"]["warm"] = median_pass(warm)
    result["warm_all_s"] = [p["s"] for p in warm]
    if local is not None:
        result["local_paired_s"] = [p["s"] for p in local_warm]
        local.close()
    if spec.get("verify"):
        d = Digest()
        for b in ds.iter_batches(BATCH, with_metadata=False):
            for i in range(len(b)):
                d.add(b.payload(i))
            del b
        result.update(d.result())
    ds.close()
    if runtime is not None:
        runtime.close()
    return result


def child_floor(spec: dict) -> dict:
    """GET every named object into memory, `concurrency` at a time, `repeats` times: MiB/s each."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore as obs
    from obstore.store import S3Store

    opts = dict(spec["options"])
    endpoint = opts.pop("endpoint")
    client = {"allow_http": bool(opts.pop("allow_http", False))}
    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        region=opts["region"],
        access_key_id=opts["access_key_id"],
        secret_access_key=opts["secret_access_key"],
        client_options=client,
    )
    keys = spec["keys"]

    def get(key: str) -> int:
        return len(obs.get(store, key).bytes())

    rates = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(spec["concurrency"]) as pool:
            total = sum(pool.map(get, keys))
        rates.append(total / 2**20 / (time.perf_counter() - t0))
    return {"rates": rates, "bytes": total, "gets": len(keys)}


def run_child(spec: dict) -> None:
    netns_inode = None
    if spec.get("netns"):  # first, before any thread: the whole child reads over the shaped link
        from benchmarks.remote_net import enter

        netns_inode = enter(spec["netns"])
    os.environ.update(spec.get("env", {}))
    task = spec["task"]
    try:
        figures = {"write": child_write, "read": child_read, "floor": child_floor}[task](spec)
    except Exception as exc:  # reported as the row's error (datasetrt's errors are findings too)
        import traceback

        figures = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    figures["netns_inode"] = netns_inode
    print(json.dumps(figures), flush=True)


def mirror_dir(cache_dir: Path) -> Path | None:
    """The one mirror directory a datasetrt run left in its node cache (the cache, now local)."""
    dirs = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")] if cache_dir.exists() else []
    return dirs[0] if len(dirs) == 1 else None


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) != 3 or sys.argv[1] != "--child":
        raise SystemExit("usage: python -m benchmarks.remote_children --child SPEC (started by benchmarks.remote)")
    run_child(json.loads(sys.argv[2]))
