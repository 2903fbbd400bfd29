"""Sources: peak tree PSS of a conversion as the input grows 10x (Parquet, Arrow IPC, JSON Lines
.gz), and build throughput of one Parquet input with local `write_cache`, Ray with 1 worker and Ray
with 2 workers.

Each measured conversion runs in a fresh child interpreter (this file with --child), sampled with
benchmarks.common.PeakPss on the child's process tree every 50 ms (for Ray: the driver, raylet, GCS and workers all
descend from the child), so imports and earlier runs do not leak into the figures. Inputs are
generated a row group / batch at a time (never whole in memory). Records: 1-7 KiB binary payloads
(hex text in JSON Lines), an int label and a string tag.

Usage: python -m benchmarks.sources [--quick] [--skip-ray] [--out bench-out/sources.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from benchmarks.common import Measurement, child_process, machine_facts, save_json

MIB = 2**20
ROWS_PER_CHUNK = 2048  # rows per generated row group / record batch / JSON chunk (~8 MiB)


def chunk(start: int, rows: int) -> pa.Table:
    """Rows [start, start+rows): payload sizes 1-7 KiB, deterministic bytes."""
    rng = np.random.default_rng(start)
    sizes = 1024 + (np.arange(start, start + rows) * 2654435761 % 6144)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    payload = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    ids = np.arange(start, start + rows)
    return pa.table({"data": payload, "label": ids % 10, "tag": pa.array(np.char.add("t", (ids % 97).astype(str)))})


def generate(kind: str, path: Path, total_bytes: int) -> int:
    """Write about `total_bytes` of payload as `kind`; returns the payload bytes written."""
    written = start = 0
    writer: object | None = None
    out = gzip.open(path, "wt", compresslevel=1) if kind == "jsonl" else None  # noqa: SIM115 (closed in the finally below)
    try:
        while written < total_bytes:
            t = chunk(start, ROWS_PER_CHUNK)
            if kind == "parquet":
                writer = writer or pq.ParquetWriter(path, t.schema, compression="zstd")
                writer.write_table(t, row_group_size=ROWS_PER_CHUNK)
            elif kind == "arrow":
                writer = writer or pa.ipc.new_file(path, t.schema)
                writer.write_table(t)
            else:
                import polars as pl

                frame = pl.from_arrow(t).with_columns(pl.col("data").bin.encode("hex"))
                out.write(frame.write_ndjson())
            written += int(pa.compute.sum(pa.compute.binary_length(t.column("data"))).as_py())
            start += ROWS_PER_CHUNK
    finally:
        if writer is not None:
            writer.close()
        if out is not None:
            out.close()
    return int(written)


def child(args: argparse.Namespace) -> None:
    """Convert args.input once and print {"seconds", "rows"} (Ray: after ray.init, untimed)."""
    import datasetrt as drt

    config = drt.WriterConfig(show_progress=False)
    if args.ray_workers:
        import ray

        from datasetrt.ray import write_caches

        ray.init(num_cpus=args.ray_workers, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        start = time.perf_counter()
        build = write_caches(
            ray.data.read_parquet(str(args.input)),
            args.out_dir,
            rows_per_cache=args.rows_per_cache,
            payload="data",
            writer_config=config,
        )
        seconds = time.perf_counter() - start
        assert build.ok, build.results
        rows = build.rows
        ray.shutdown()
    else:
        from datasetrt.sources import open_path

        source = open_path(args.input, "bench", payload="data")
        start = time.perf_counter()
        with drt.DatasetRuntime(num_workers=1) as rt:
            (result,) = rt.write_cache([source], args.out_dir, writer_config=config)
        seconds = time.perf_counter() - start
        assert isinstance(result, drt.CacheWriteSuccess), result
        rows = len(drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0)))
    print(json.dumps({"seconds": seconds, "rows": rows}))


def run_child(input_path: Path, out: Path, ray_workers: int = 0, rows_per_cache: int = 0) -> tuple[dict, int]:
    """(child's JSON, peak tree PSS bytes of the child and its descendants, sampled from here)."""
    args = ["-m", "benchmarks.sources", "--child", "--input", str(input_path), "--out-dir", str(out)]
    child = child_process(
        [*args, "--ray-workers", str(ray_workers), "--rows-per-cache", str(rows_per_cache)], peak_pss=True
    )
    if child.returncode != 0 or child.figures is None:
        raise RuntimeError(f"child failed ({child.returncode}): {child.stderr[-3000:]}")
    return child.figures, child.peak_pss_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MiB -> 80 MiB inputs instead of 40 -> 400")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--kinds", nargs="+", default=["parquet", "arrow", "jsonl"])
    parser.add_argument("--out", type=Path, default=Path("bench-out/sources.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ray-workers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rows-per-cache", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    small = (8 if args.quick else 40) * MIB
    workdir = Path(tempfile.mkdtemp(prefix="datasetrt-bench-sources-"))
    ms: list[Measurement] = []
    suffix = {"parquet": "parquet", "arrow": "arrow", "jsonl": "jsonl.gz"}
    try:
        print("| input | payload MiB | rows | peak tree PSS MiB | MiB/s |")
        print("|---|---:|---:|---:|---:|")
        inputs = {}
        for kind in args.kinds:
            for scale in (1, 10):
                path = workdir / f"in-{kind}-{scale}.{suffix[kind]}"
                payload = generate(kind, path, small * scale)
                inputs[(kind, scale)] = (path, payload)
                info, peak = run_child(path, workdir / f"out-{kind}-{scale}")
                mib = payload / MIB
                ms.append(Measurement(f"{kind} {mib:.0f} MiB", "peak tree PSS", "MiB", [peak / MIB], False))
                print(
                    f"| {kind} x{scale} | {mib:,.0f} | {info['rows']:,} | {peak / MIB:,.0f} | "
                    f"{mib / info['seconds']:,.0f} |"
                )
                shutil.rmtree(workdir / f"out-{kind}-{scale}")
                if kind != "parquet" or args.skip_ray:
                    path.unlink()
        if not args.skip_ray and ("parquet", 10) in inputs:
            path, payload = inputs[("parquet", 10)]
            mib = payload / MIB
            rows = int(pq.read_metadata(path).num_rows)
            print(f"\nbuild throughput, Parquet {mib:,.0f} MiB, {rows:,} rows (caches of {rows // 8:,} rows for Ray)")
            print("| contender | seconds | MiB/s | peak tree PSS MiB |")
            print("|---|---:|---:|---:|")
            for label, workers in (("local write_cache (1 thread)", 0), ("Ray, 1 worker", 1), ("Ray, 2 workers", 2)):
                info, peak = run_child(path, workdir / f"build-{workers}", workers, -(-rows // 8))
                ms.append(Measurement(f"build parquet {mib:.0f} MiB", label, "MiB/s", [mib / info["seconds"]]))
                print(f"| {label} | {info['seconds']:.1f} | {mib / info['seconds']:,.0f} | {peak / MIB:,.0f} |")
                shutil.rmtree(workdir / f"build-{workers}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"machine: {machine_facts()}")
    save_json(args.out, ms, {"benchmark": "sources", "small_bytes": small})


if __name__ == "__main__":
    main()
