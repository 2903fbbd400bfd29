"""`datasetrt` console command: inspect and validate caches, write them from files, prune an object
store, measure memory, run the demo job.

Boundary: argument parsing and printing over the public API and the format layer.

  datasetrt inspect PATH... [--json]        manifest summary, payload spec, schema, counts, sizes, the
                                            zstd_dict dictionary, and every damaged file, without reading
                                            payloads (datasetrt/cli/inspect.py); exit 1 if any is damaged
  datasetrt validate PATH...                deep validation (sha256 of every file, the dictionary
                                            loaded, metadata decode, index bounds, every record
                                            read and checked; a shard that fails its sha256 names its
                                            damaged samples); exit 1 if any cache fails
  datasetrt convert SRC... --out BASE ...   caches from Parquet / Arrow IPC / JSON Lines / CSV / .npy
                                            (convert.py)
  datasetrt prune URL... [--min-age S] [--dry-run]
                                            remove unpublished caches' objects from an object store
                                            (a writer killed before its manifest; prune.py)
  datasetrt pss [options] -- COMMAND...     PSS/USS/RSS of a command's process tree (or --pid PID):
                                            report, --csv, --json, --png (datasetrt/cli/pss.py)
  datasetrt demo [--caches N ...]           the main job on generated data (datasetrt/cli/demo.py)
  datasetrt docs [TOPIC] [--path]           the installed documentation pages (datasetrt/cli/docs.py)
  datasetrt --version

A PATH is a cache directory or an object-store URL (s3://bucket/prefix, gs://, az://); a base (a
directory, or a URL prefix, without a manifest whose children are caches) names each cache one
level below it. `validate` downloads a remote cache's files into the node-local cache
(--cache-dir, default $DATASETRT_CACHE_DIR or ~/.cache/datasetrt) and checks each; `inspect`
lists objects and downloads only metadata.arrow (and a dictionary) to a temporary directory.
Object stores are reached with the standard environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, GOOGLE_*, AZURE_*) and `--storage-option KEY=VALUE` (repeatable,
wins over the environment; cli/remote.py); no output shows a credential.
`validate` says "no such directory" for a missing local path, and for a directory that is neither
a cache nor a base, which caches lie deeper below it and how to name them (cli/remote.py).
A writers' staging root (`<base>/tmp` without a manifest) is reported as "staging directory, not a
cache" by inspect and validate, not as a failure, so `datasetrt validate caches/*` works.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from datasetrt import __version__
from datasetrt.cli import convert, demo, docs, prune
from datasetrt.cli.remote import add_storage_arguments, storage_config
from datasetrt.errors import DatasetRTError

DESCRIPTION = (
    "Inspect, validate, write and prune datasetrt / dataset-rt caches, in local directories or object "
    "stores (s3://, gs://, az:// URLs). `datasetrt COMMAND --help` describes each command."
)


def _validate(paths: list[str], storage: Any) -> int:
    from datasetrt.cli.inspect import STAGING_NOTE, is_staging_dir, remote_store
    from datasetrt.cli.remote import local_caches, not_a_cache, remote_caches
    from datasetrt.dataset.cached import CachedDataset
    from datasetrt.storage.urls import parse_location
    from datasetrt.values.config import ReaderConfig

    config = ReaderConfig(seed=0, shuffle=False, validate_cache=True, storage=storage)
    failures = 0
    for text in paths:
        location = parse_location(text)
        caches: list[Path | str]
        if isinstance(location, Path):
            problem = None if is_staging_dir(location) else not_a_cache(location)
            if problem is not None:
                failures += 1
                print(f"FAIL {location}: {problem}")
                continue
            caches = list(local_caches(location))
        else:
            try:
                found, _top = remote_caches(remote_store(location, storage))
            except DatasetRTError as exc:
                failures += 1
                print(f"FAIL {location.url}: {type(exc).__name__}: {exc}")
                continue
            caches = [cache.url for cache in found] or [location.url]  # none: the open names what is missing
        for cache in caches:
            if isinstance(cache, Path) and is_staging_dir(cache):
                print(f"skip {cache}: {STAGING_NOTE}")
                continue
            try:
                ds = CachedDataset([cache], reader_config=config)
                count = 0
                for _ in ds:
                    count += 1
                ds.close()
            except DatasetRTError as exc:
                failures += 1
                print(f"FAIL {cache}: {type(exc).__name__}: {exc}")
            else:
                print(f"ok   {cache}: {count:,} samples verified")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="datasetrt", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_inspect = sub.add_parser(
        "inspect",
        help="shallow report of caches: manifest, payload spec, sizes, damage",
        description="Report each cache (a directory or URL; a base: each cache below it) without reading "
        "payloads: manifest summary, payload spec, schema, counts, sizes, and every damaged file. A shallow check: "
        "no shard is hashed and no record read (`datasetrt validate` does both). Exit 1 if any is damaged.",
    )
    p_inspect.add_argument(
        "paths", nargs="+", metavar="PATH", help="cache or base: a directory or s3:// gs:// az:// URL"
    )
    p_inspect.add_argument("--json", action="store_true", help="machine-readable output")
    add_storage_arguments(p_inspect)
    p_validate = sub.add_parser(
        "validate",
        help="deep check of caches: every file's sha256, every record read",
        description="Check each cache (a directory or URL; a base: each cache below it) deeply: the sha256 of "
        "every file, metadata decode, index bounds, every record read and checked. A remote cache's files are "
        "downloaded into the node-local cache first. Exit 1 if any cache fails.",
    )
    p_validate.add_argument(
        "paths", nargs="+", metavar="PATH", help="cache or base: a directory or s3:// gs:// az:// URL"
    )
    add_storage_arguments(p_validate, cache_dir=True)
    convert.add_parser(sub)
    prune.add_parser(sub)
    sub.add_parser(
        "pss",
        add_help=False,
        help="memory (PSS/USS/RSS) of a command's process tree",
    )
    demo.add_arguments(
        sub.add_parser("demo", help="the main job on generated data: write, reweight, read", description=demo.SUMMARY)
    )
    docs.add_parser(sub)
    parser.add_argument("--version", action="version", version=f"datasetrt {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["pss"]:  # its own parser: everything after `--` is the measured command
        from datasetrt.cli import pss

        return pss.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "convert":
        return convert.run(args)
    if args.command == "prune":
        return prune.run(args)
    if args.command == "demo":
        return demo.run(args)
    if args.command == "docs":
        return docs.run(args)
    try:
        storage = storage_config(args)
    except (ValueError, DatasetRTError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "inspect":
            from datasetrt.cli import inspect

            return inspect.run(args.paths, args.json, storage=storage)
        return _validate(args.paths, storage)
    except DatasetRTError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
