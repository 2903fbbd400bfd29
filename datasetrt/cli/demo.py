"""The main job end to end on generated data: write caches, reweight with Polars, read, report.

Boundary: a user of the public API only (what a training script does); needs nothing outside the
installed package (no repository files).

  datasetrt demo [--caches 4] [--samples 20000] [--payload-bytes 4096] [--workers 2] [--workdir DIR]
  python -m datasetrt.cli.demo [same options]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import datasetrt as drt

SUMMARY = "the main job on generated data: write caches, reweight with Polars, read with workers, report"


class SyntheticSource:
    """`count` records of `payload_bytes` with a label, an int and a float column."""

    def __init__(self, name: str, count: int, payload_bytes: int, seed: int) -> None:
        self.name, self.count, self.payload_bytes, self.seed = name, count, payload_bytes, seed

    def __iter__(self):
        block = bytes(range(256)) * (self.payload_bytes // 256 + 1)
        for i in range(self.count):
            start = (i * 31 + self.seed) % 256
            yield drt.CacheInput(
                block[start : start + self.payload_bytes],
                {
                    "label": f"class{(i + self.seed) % 10}",
                    "length": (i * 13) % 1000,
                    "quality": ((i * 7) % 100) / 100.0,
                },
            )


def tree_pss_mib() -> float:
    """PSS of this process and its children (psutil memory_full_info), MiB."""
    import psutil

    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, on `python -m datasetrt.cli.demo`'s parser or the `datasetrt demo` subcommand."""
    parser.add_argument("--caches", type=int, default=4)
    parser.add_argument("--samples", type=int, default=20_000, help="samples per cache")
    parser.add_argument("--payload-bytes", type=int, default=4096)
    parser.add_argument("--workdir", type=Path, default=None, help="keep caches here (default: a temp dir, removed)")
    parser.add_argument("--workers", type=int, default=2, help="DatasetRuntime(num_workers=...)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasetrt.cli.demo", description=SUMMARY)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the job with parsed options; 0 on success, 1 if a cache failed to write."""
    import polars as pl  # here, not at the top: `datasetrt` (cli.py) imports this module for its options

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="datasetrt-demo-"))
    runtime = drt.DatasetRuntime(num_workers=args.workers)
    try:
        # 1. Write: half the caches lz4, half zstd; per-record checksums on by default.
        sources = [SyntheticSource(f"part{k}", args.samples, args.payload_bytes, seed=k) for k in range(args.caches)]
        start = time.perf_counter()
        results = []
        for k, source in enumerate(sources):
            algo = "lz4" if k % 2 == 0 else "zstd"
            cfg = drt.WriterConfig(show_progress=True, shard_compression=drt.ShardCompression(algo=algo))
            results += runtime.write_cache(source, workdir / "caches", writer_config=cfg)
        write_s = time.perf_counter() - start
        failed = [r for r in results if not isinstance(r, drt.CacheWriteSuccess)]
        if failed:
            print(f"write failed: {failed}")
            return 1
        total = args.caches * args.samples
        mib = total * args.payload_bytes / 2**20
        print(
            f"wrote {args.caches} caches, {total:,} samples, {mib:.0f} MiB payload in {write_s:.2f} s "
            f"({mib / write_s:.0f} MiB/s)"
        )

        # 2. Open all caches as one dataset; edit the population with Polars, no payload reads.
        dataset = runtime.cached_dataset([r.path for r in results], reader_config=drt.ReaderConfig(seed=2026))
        table = dataset.get_metadata()
        edited = table.filter(pl.col("quality") >= 0.2).with_columns(
            weight=pl.when(pl.col("label") == "class3").then(5.0).otherwise(pl.col("quality") + 0.5)
        )
        dataset.update_metadata(edited)
        print(f"metadata: {table.height:,} rows -> {edited.height:,} active rows after filter; class3 weighted x5")

        # 3. Read one epoch of weighted draws with the runtime's worker processes.
        start = time.perf_counter()
        counts: dict[str, int] = {}
        payload_bytes = 0
        first_sample_s = None
        for sample in dataset:
            if first_sample_s is None:
                first_sample_s = time.perf_counter() - start
            counts[sample.metadata["label"]] = counts.get(sample.metadata["label"], 0) + 1
            payload_bytes += len(sample.data)
        read_s = time.perf_counter() - start
        n = sum(counts.values())
        assert first_sample_s is not None  # the filtered table keeps most rows, so the epoch drew some
        print(
            f"read {n:,} samples in {read_s:.2f} s: {n / read_s:,.0f} samples/s, "
            f"{payload_bytes / 2**20 / read_s:.0f} MiB/s, first sample after {first_sample_s * 1e3:.1f} ms"
        )
        share = counts.get("class3", 0) / n
        print(f"class3 share of draws: {share:.1%} (weighted x5 of ~10% of rows)")

        # 4. The next window through the batch path: payloads in one buffer, metadata as Arrow.
        start = time.perf_counter()
        rows = batch_bytes = 0
        for batch in dataset.iter_batches(256):
            rows += len(batch)
            batch_bytes += len(batch.data)
        batch_s = time.perf_counter() - start
        print(
            f"read {rows:,} samples as batches of 256 in {batch_s:.2f} s: {rows / batch_s:,.0f} samples/s, "
            f"{batch_bytes / 2**20 / batch_s:.0f} MiB/s"
        )
        print(f"process-tree PSS (parent + {len(runtime.worker_pids)} reader workers): {tree_pss_mib():.0f} MiB")
        dataset.close()
    finally:
        runtime.close()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
