"""`datasetrt prune URL...`: remove the objects of unpublished caches in an object store (a writer
killed, or failed, after it uploaded some files but before its manifest), listing each.

Boundary: command-line arguments and output over `format/upload.py` (`unpublished`,
`delete_objects`); knows no object beyond what those return.

  datasetrt prune URL... [--min-age SECONDS] [--dry-run] [--verbose] [--storage-option KEY=VALUE ...]

URL is a base prefix (its caches are one level below it: s3://bucket/caches) or one unpublished
cache (s3://bucket/caches/part-0). Only a prefix that holds nothing but the names a cache or its
writer puts there and no manifest.json is a candidate: a published cache, anything nested deeper
and data that is not a cache are never touched. A candidate is removed only when none of its
objects is younger than --min-age (default 3600 s: a writer still uploading keeps adding objects);
the removal takes the cache's lock, looks again (published meanwhile, or written to: kept) and
deletes the writer's claim last. --dry-run lists what would go and deletes nothing; --verbose
lists every object. Exit status 0 when every candidate old enough was removed (or listed), 1 when
a URL could not be listed or a removal failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from datasetrt.cli.remote import add_storage_arguments, storage_config

SUMMARY = "remove the objects of unpublished caches (a writer killed before its manifest) under object-store URLs"
DEFAULT_MIN_AGE_S = 3600.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prune",
        help="remove unpublished caches' objects from object stores",
        description=SUMMARY + "; never a published cache or an active write",
    )
    p.add_argument("urls", nargs="+", metavar="URL", help="base prefix of caches, or one unpublished cache")
    p.add_argument(
        "--min-age",
        type=float,
        default=DEFAULT_MIN_AGE_S,
        metavar="SECONDS",
        help=f"remove only caches whose youngest object is at least this old (default {DEFAULT_MIN_AGE_S:.0f}; "
        "longer than any writer pauses between two uploads)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="list every object")
    add_storage_arguments(p)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from datasetrt.errors import DatasetRTError
    from datasetrt.format.remote import Storage
    from datasetrt.storage.urls import RemoteLocation, parse_location

    out = out or sys.stdout
    err = err or sys.stderr
    if not args.min_age >= 0:
        print("error: --min-age must be a number of seconds >= 0", file=err)
        return 2
    try:
        storage = Storage.of(storage_config(args))
        locations = [parse_location(url) for url in args.urls]
    except (ValueError, DatasetRTError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    remote: list[RemoteLocation] = []
    for url, location in zip(args.urls, locations):
        if not isinstance(location, RemoteLocation):
            print(
                f"error: {url} is a local path: prune removes unpublished caches in object stores "
                "(a local writer's staging directory is removed by the next write of its name)",
                file=err,
            )
            return 2
        remote.append(location)
    failed = 0
    for location in remote:
        try:
            failed += _prune(storage.store(location), args, out, err)
        except DatasetRTError as exc:
            failed += 1
            print(f"error: {location.url}: {type(exc).__name__}: {exc}", file=err)
    return 1 if failed else 0


def _prune(store: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """One URL: list, then remove (or only list); returns the number of failed removals."""
    from datasetrt.errors import DatasetRTError
    from datasetrt.format.upload import delete_objects, unpublished

    found = unpublished(store, min_age_s=0.0)

    def old_enough(f: Any) -> bool:
        return args.min_age == 0 or (f.idle_s is not None and f.idle_s >= args.min_age)

    old = [f for f in found if old_enough(f)]
    young = [f for f in found if not old_enough(f)]
    verb = "would remove" if args.dry_run else "removed"
    print(f"prune {store.url}: {len(old)} unpublished cache(s) idle >= {args.min_age:g} s", file=out)
    failed = removed_objects = removed_bytes = 0
    for f in old:
        if args.dry_run:
            objects = f.objects
        else:
            try:
                cleared = delete_objects(store, f, min_age_s=args.min_age)
            except DatasetRTError as exc:
                failed += 1
                print(f"error: {f.url}/: {type(exc).__name__}: {exc}", file=err)
                continue
            if cleared.stopped:
                print(f"  kept         {f.url}/: {cleared.stopped}", file=out)
                continue
            objects = cleared.objects
        size = sum(info.size for info in objects)
        removed_objects += len(objects)
        removed_bytes += size
        print(f"  {verb:<12} {f.url}/: {len(objects)} objects, {size:,} bytes, {_idle(f.idle_s)}; {f.holder}", file=out)
        if args.verbose:
            for info in objects:
                print(f"      {info.name}  {info.size:,} bytes", file=out)
    for f in young:
        print(
            f"  kept         {f.url}/: {_idle(f.idle_s)} < --min-age {args.min_age:g} s (a write may be in progress)",
            file=out,
        )
    print(f"{verb} {removed_objects} objects, {removed_bytes:,} bytes", file=out)
    return failed


def _idle(idle_s: float | None) -> str:
    return "idle for an unknown time" if idle_s is None else f"idle {idle_s:,.0f} s"
