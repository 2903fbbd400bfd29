"""`datasetrt` console command: inspect and validate caches, run the demo job.

Boundary: argument parsing and printing over the public API and the format layer.

  datasetrt inspect CACHE_DIR [--json]     manifest summary, schema, counts, sizes, the zstd_dict
                                           dictionary (checked at open: size, sha256, id)
  datasetrt validate CACHE_DIR...          deep validation (sha256 of every file, the dictionary
                                           loaded, metadata decode, index bounds, every record
                                           read and checked); exit 1 if any cache fails
  datasetrt convert SRC... --out DIR ...   caches from Parquet / Arrow IPC / JSON Lines (convert.py)
  datasetrt demo [--caches N ...]          the main job on generated data (datasetrt/demo.py)
  datasetrt --version
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datasetrt import __version__, convert, demo
from datasetrt.errors import DatasetRTError


def _inspect(cache_dir: Path, as_json: bool) -> int:
    from datasetrt.format.reader import CacheHandle

    handle = CacheHandle.open(cache_dir)
    m = handle.manifest
    shard_bytes = sum(s.byte_len for s in m.shards)
    raw_bytes = sum(s.uncompressed_byte_len for s in m.shards)
    algos = sorted({s.algo for s in m.shards})
    d = m.dictionary
    summary = {
        "path": str(cache_dir),
        "format_version": m.format_version,
        "cache_id": m.cache_id,
        "source_name": m.source_name,
        "sample_count": m.sample_count,
        "schema": [{"name": n, "kind": k} for n, k in m.metadata_schema],
        "shards": len(m.shards),
        "shard_bytes": shard_bytes,
        "payload_bytes": raw_bytes,
        "compression": algos,
        "record_checksums": m.checksums is not None,
        "zstd_dictionary": None if d is None else {"file": d.file, "dict_id": d.dict_id, "byte_len": d.byte_len,
                                                   "sha256": d.sha256},
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"cache       {cache_dir}")
    print(f"source      {m.source_name}  (cache_id {m.cache_id if m.cache_id is not None else 'positional (v2)'})")
    print(f"format      v{m.format_version}, compression {', '.join(algos) or 'none'}, "
          f"record checksums {'yes' if m.checksums else 'no'}")
    print(f"samples     {m.sample_count:,}")
    print(f"shards      {len(m.shards)} files, {shard_bytes:,} bytes stored, {raw_bytes:,} payload bytes")
    if d is not None:
        print(f"dictionary  {d.file}: {d.byte_len:,} bytes, dictionary id {d.dict_id}, sha256 {d.sha256[:16]}... (checked)")
    print("schema")
    for name, kind in m.metadata_schema:
        print(f"  {name:<24} {kind}")
    return 0


def _validate(cache_dirs: list[Path]) -> int:
    from datasetrt.config import ReaderConfig
    from datasetrt.dataset import CachedDataset

    failures = 0
    for cache_dir in cache_dirs:
        try:
            ds = CachedDataset([cache_dir], reader_config=ReaderConfig(seed=0, shuffle=False, validate_cache=True))
            count = 0
            for _ in ds:
                count += 1
            ds.close()
        except DatasetRTError as exc:
            failures += 1
            print(f"FAIL {cache_dir}: {type(exc).__name__}: {exc}")
        else:
            print(f"ok   {cache_dir}: {count:,} samples verified")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="datasetrt", description="Inspect and validate datasetrt / dataset-rt caches.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="manifest summary, schema, counts, sizes")
    p_inspect.add_argument("cache_dir", type=Path)
    p_inspect.add_argument("--json", action="store_true", help="machine-readable output")
    p_validate = sub.add_parser("validate", help="deep checksum validation; non-zero exit on any failure")
    p_validate.add_argument("cache_dirs", type=Path, nargs="+")
    convert.add_parser(sub)
    parser.add_argument("--version", action="version", version=f"datasetrt {__version__}")
    demo.add_arguments(sub.add_parser("demo", help=demo.SUMMARY, description=demo.SUMMARY))
    args = parser.parse_args(argv)
    if args.command == "convert":
        return convert.run(args)
    if args.command == "demo":
        return demo.run(args)
    try:
        if args.command == "inspect":
            return _inspect(args.cache_dir, args.json)
        return _validate(args.cache_dirs)
    except DatasetRTError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
