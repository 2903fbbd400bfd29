"""`datasetrt` console command: inspect and validate caches, run the demo job.

Boundary: argument parsing and printing over the public API and the format layer.

  datasetrt inspect CACHE_DIR... [--json]  manifest summary, schema, counts, sizes, the zstd_dict
                                           dictionary, and every damaged file
                                           (datasetrt/cli/inspect.py); exit 1 if any is damaged
  datasetrt validate CACHE_DIR...          deep validation (sha256 of every file, the dictionary
                                           loaded, metadata decode, index bounds, every record
                                           read and checked); exit 1 if any cache fails
  datasetrt pss [options] -- COMMAND...    PSS/USS/RSS of a command's process tree (or --pid PID):
                                           report, --csv, --json, --png (datasetrt/cli/pss.py)
  datasetrt convert SRC... --out DIR ...   caches from Parquet / Arrow IPC / JSON Lines (convert.py)
  datasetrt demo [--caches N ...]          the main job on generated data (datasetrt/cli/demo.py)
  datasetrt --version
A writers' staging root (`<base>/tmp` without a manifest) is reported as "staging directory, not a
cache" by both, not as a failure, so `datasetrt validate caches/*` works.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from datasetrt import __version__
from datasetrt.cli import convert, demo
from datasetrt.errors import DatasetRTError


def _validate(cache_dirs: list[Path]) -> int:
    from datasetrt.cli.inspect import STAGING_NOTE, is_staging_dir
    from datasetrt.dataset.cached import CachedDataset
    from datasetrt.values.config import ReaderConfig

    failures = 0
    for cache_dir in cache_dirs:
        if is_staging_dir(cache_dir):
            print(f"skip {cache_dir}: {STAGING_NOTE}")
            continue
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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["pss"]:  # its own parser: everything after `--` is the measured command
        from datasetrt.cli import pss

        return pss.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="datasetrt", description="Inspect and validate datasetrt / dataset-rt caches."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pss", add_help=False, help="memory (PSS/USS/RSS) of a command's process tree: datasetrt pss --help")
    p_inspect = sub.add_parser("inspect", help="manifest summary, schema, counts, sizes, damaged files")
    p_inspect.add_argument("cache_dirs", type=Path, nargs="+")
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
            from datasetrt.cli import inspect

            return inspect.run(args.cache_dirs, args.json)
        return _validate(args.cache_dirs)
    except DatasetRTError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
