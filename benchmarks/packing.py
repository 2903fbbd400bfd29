"""Sequence packing: padding and packed rows per second of datasetrt's packing modes against
Grain's first-fit packing (`grain.experimental.FirstFitPackIterDataset`) on the same documents.

Documents: lognormal lengths (mean ~300 tokens, sigma 1, at least 1 token), int32 tokens; rows of
L = 2048 tokens in batches of B = 8 rows (Grain: 8 packing bins, `shuffle_bins=False`). Grain
refuses a document longer than a row, so its input is truncated to L first; datasetrt's
"whole" mode with `overlong="truncate"` is the same rule, and the run checks that both give the
same rows, byte for byte (sha256 of the row tokens in order).

Contenders: the packing arithmetic alone (`sampling.packing.Packer` fed 256 documents at a
time, in memory: what Grain's figure measures), then datasetrt end to end (`ds.iter_packed` over
a cache of the same documents, `shuffle=False` so the order is the documents', codec none and
zstd, in-process and with 2 reader workers). Grain runs in its own interpreter (the peers'
venv, `--grain-python`), on the documents as a list of numpy arrays.

Figures: pad fraction (padding / row tokens), dropped fraction (truncated tokens / document
tokens), rows per second (median of repeats).

Usage: python -m benchmarks.packing [--docs N] [--repeats R] [--quick | --smoke] [--grain-python PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROW_LEN, ROWS = 2048, 8
GRAIN_PYTHON = "/tmp/peervenv/bin/python"


def lengths_of(docs: int, seed: int = 0) -> np.ndarray:
    """Lognormal document lengths, mean ~300 tokens (exp(mu + sigma^2 / 2) with sigma = 1)."""
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(np.log(300) - 0.5, 1.0, docs).astype(np.int64))


def documents(lengths: np.ndarray) -> list[np.ndarray]:
    """Document d's tokens: (d * 7919 + i) mod 50,000 + 1 (never 0, the pad id)."""
    return [((d * 7919 + np.arange(n)) % 50_000 + 1).astype(np.int32) for d, n in enumerate(lengths)]


def _summary(name: str, rows: int, pad: int, dropped: int, doc_tokens: int, times: list[float], digest: str) -> dict:
    return {
        "name": name,
        "rows": rows,
        "pad_fraction": pad / max(1, rows * ROW_LEN),
        "dropped_fraction": dropped / max(1, doc_tokens),
        "rows_per_s": rows / statistics.median(times),
        "digest": digest,
    }


# -- Grain (runs in the peers' interpreter: imports neither datasetrt nor this project's venv) --------


def grain_run(lengths_path: str, repeats: int) -> list[dict]:
    """Grain's first-fit packing of the documents (truncated to a row), two ways: its iterator
    as `to_iter_dataset()` makes it (default ReadOptions: a prefetching thread pool), and with
    prefetch off (`num_threads=0, prefetch_buffer_size=0`: the packing alone)."""
    import grain
    from grain import experimental

    lengths = np.load(lengths_path)
    docs = [{"tokens": d[:ROW_LEN]} for d in documents(lengths)]
    dropped = int(np.maximum(lengths - ROW_LEN, 0).sum())
    out = []
    for label, options in (
        ("default ReadOptions", None),
        ("prefetch off", grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)),
    ):
        times, rows, pad, digest = [], 0, 0, ""
        for _ in range(repeats):
            h = hashlib.sha256()
            rows = pad = 0
            t0 = time.perf_counter()
            source = grain.MapDataset.source(docs)
            source = source.to_iter_dataset() if options is None else source.to_iter_dataset(read_options=options)
            packed = experimental.FirstFitPackIterDataset(
                source, length_struct={"tokens": ROW_LEN}, num_packing_bins=ROWS, shuffle_bins=False
            )
            for row in packed:
                rows += 1
                pad += int((row["tokens_segment_ids"] == 0).sum())
                h.update(np.ascontiguousarray(row["tokens"], dtype=np.int32).tobytes())
            times.append(time.perf_counter() - t0)
            digest = h.hexdigest()
        name = f"Grain {grain.__version__} FirstFitPackIterDataset, {label}"
        out.append(_summary(name, rows, pad, dropped, int(lengths.sum()), times, digest))
    return out


# -- datasetrt ----------------------------------------------------------------------------------------


def _count(batches, h) -> tuple[int, int]:
    rows = pad = 0
    for b in batches:
        rows += len(b)
        pad += int((b.segment_ids == 0).sum())
        h.update(np.ascontiguousarray(b.tokens, dtype=np.int32).tobytes())
    return rows, pad


def pure_run(lengths: np.ndarray, mode: str, overlong: str, repeats: int) -> dict:
    from datasetrt.sampling.packing import Packer, packed_stream

    docs = documents(lengths)
    values = np.concatenate(docs)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    ids = np.arange(len(lengths), dtype=np.uint64)
    chunks = [(values, offsets[i : i + 257], ids[i : i + 256], ids[i : i + 256]) for i in range(0, len(lengths), 256)]
    times, rows, pad, dropped, digest = [], 0, 0, 0, ""
    for _ in range(repeats):
        h = hashlib.sha256()
        packer = Packer(ROWS, ROW_LEN, mode=mode, overlong=overlong)
        t0 = time.perf_counter()
        rows, pad = _count(packed_stream(packer, chunks), h)
        times.append(time.perf_counter() - t0)
        dropped, digest = packer.dropped, h.hexdigest()
    name = f'datasetrt Packer "{mode}"' + (f', overlong="{overlong}"' if mode == "whole" else "")
    return _summary(name, rows, pad, dropped, int(lengths.sum()), times, digest)


def cache_of(lengths: np.ndarray, base: Path, algo: str) -> Path:
    import datasetrt as drt

    class Docs:
        name = f"docs-{algo}"

        def __iter__(self):
            for i, d in enumerate(documents(lengths)):
                yield drt.CacheInput(d, {"i": i})

    config = drt.WriterConfig(
        show_progress=False,
        payload_spec=drt.PayloadSpec("int32", (None,)),
        shard_compression=drt.ShardCompression(algo=algo),
    )
    with drt.DatasetRuntime(num_workers=2) as rt:
        [res] = rt.write_cache([Docs()], base, writer_config=config)
    assert isinstance(res, drt.CacheWriteSuccess), res
    return res.path


def dataset_run(
    lengths: np.ndarray, path: Path, algo: str, mode: str, overlong: str, workers: int, repeats: int
) -> dict:
    import datasetrt as drt

    times, rows, pad, digest = [], 0, 0, ""
    runtime = drt.DatasetRuntime(num_workers=workers) if workers else None
    try:
        if runtime is not None:
            runtime.start_workers()
        ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=runtime)
        for _ in range(repeats):
            h = hashlib.sha256()
            t0 = time.perf_counter()
            rows, pad = _count(ds.iter_packed(ROWS, ROW_LEN, mode=mode, overlong=overlong), h)
            times.append(time.perf_counter() - t0)
            digest = h.hexdigest()
    finally:
        if runtime is not None:
            runtime.close()
    dropped = int(np.maximum(lengths - ROW_LEN, 0).sum()) if overlong == "truncate" else 0
    where = f"{workers} reader workers" if workers else "in-process"
    name = f'datasetrt iter_packed "{mode}"' + (f" {overlong}" if mode == "whole" else "") + f", {algo}, {where}"
    return _summary(name, rows, pad, dropped, int(lengths.sum()), times, digest)


def table(results: list[dict]) -> str:
    lines = ["| contender | rows | pad fraction | dropped fraction | rows/s |", "|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r['name']} | {r['rows']:,} | {r['pad_fraction']:.4f} | {r['dropped_fraction']:.4f} | {r['rows_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2,000 documents, 2 repeats")
    parser.add_argument("--smoke", action="store_true", help="300 documents, 1 repeat (tests)")
    parser.add_argument("--grain-python", default=GRAIN_PYTHON)
    parser.add_argument("--grain-worker", help=argparse.SUPPRESS)
    parser.add_argument("--no-dataset", action="store_true", help="skip the end-to-end reads")
    args = parser.parse_args(argv)
    if args.grain_worker:
        print(json.dumps(grain_run(args.grain_worker, args.repeats)))
        return 0
    if args.quick:
        args.docs, args.repeats = 2_000, 2
    if args.smoke:
        args.docs, args.repeats = 300, 1
    lengths = lengths_of(args.docs)
    print(
        f"{args.docs:,} documents, mean {lengths.mean():.0f} tokens (max {lengths.max():,}); rows of {ROW_LEN}, batches of {ROWS}"
    )
    results = [
        pure_run(lengths, "split", "split", args.repeats),
        pure_run(lengths, "whole", "split", args.repeats),
        pure_run(lengths, "whole", "truncate", args.repeats),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        lengths_path = str(Path(tmp) / "lengths.npy")
        np.save(lengths_path, lengths)
        grain: list[dict] | None = None
        if Path(args.grain_python).exists():
            done = subprocess.run(
                [
                    args.grain_python,
                    "-m",
                    "benchmarks.packing",
                    "--grain-worker",
                    lengths_path,
                    "--repeats",
                    str(args.repeats),
                ],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent.parent,
                env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PATH": "/usr/bin:/bin"},
                timeout=3600,
            )
            if done.returncode == 0:
                grain = json.loads(done.stdout.strip().splitlines()[-1])
                results.extend(grain)
            else:
                print("Grain run failed:", done.stderr[-2000:], file=sys.stderr)
        else:
            print(f"no Grain interpreter at {args.grain_python}: Grain not measured", file=sys.stderr)
        if not args.no_dataset:
            for algo in ("none", "zstd"):
                path = cache_of(lengths, Path(tmp) / algo, algo)
                for workers in (0, 2):
                    results.append(dataset_run(lengths, path, algo, "split", "split", workers, args.repeats))
                    results.append(dataset_run(lengths, path, algo, "whole", "truncate", workers, args.repeats))
    print(table(results))
    expected = {"split": results[0]["digest"], "whole": results[2]["digest"]}
    ours = [r for r in results[3:] if r["name"].startswith("datasetrt")]
    different = [r["name"] for r in ours if r["digest"] != expected[r["name"].split('"')[1]]]
    print("every datasetrt read gave the Packer's rows (sha256):", not different)
    if different:
        return 1
    if grain is not None:
        same = all(g["digest"] == results[2]["digest"] for g in grain)
        print(f'Grain\'s rows == datasetrt "whole" overlong="truncate" rows (sha256): {same}')
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
