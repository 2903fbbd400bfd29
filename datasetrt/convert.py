"""`datasetrt convert`: write one cache per Parquet / Arrow IPC / JSON Lines file or directory.

Boundary: command-line arguments over `datasetrt.sources` and the public write API (imported when
the command runs, so `datasetrt --help` stays light); knows no cache byte layout.

  datasetrt convert SRC... --out DIR [--payload-column C] [--metadata-columns C...]
                    [--rename A=B...] [--index-column NAME] [--codec none|lz4|zstd] [--level N]
                    [--name NAME...] [--workers N] [--no-progress]

Each SRC (a file, or a directory of files of one kind) becomes the cache DIR/NAME (NAME defaults to
the file name without its data suffixes, or the directory's name). Exit status 0 when every cache
was written, 1 when any source failed (its error is printed; nothing of it is published), 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="write caches from Parquet, Arrow IPC / Feather or JSON Lines files",
                       description="Write one cache per SRC (a file, or a directory of files of one kind) under --out.")
    p.add_argument("sources", type=Path, nargs="+", metavar="SRC")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="base directory of the caches")
    p.add_argument("--payload-column", metavar="C",
                   help="payload column (binary, string or list of numbers); default: the only binary column")
    p.add_argument("--metadata-columns", nargs="*", metavar="C",
                   help="metadata columns (default: every other column; give none for no column)")
    p.add_argument("--rename", action="extend", nargs="+", default=[], metavar="A=B",
                   help="store metadata column A as B")
    p.add_argument("--index-column", metavar="NAME", help="add the source row number as metadata column NAME")
    p.add_argument("--codec", choices=("none", "lz4", "zstd"), default="none", help="payload compression")
    p.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    p.add_argument("--name", action="extend", nargs="+", default=[], metavar="NAME",
                   help="cache names, one per SRC in order")
    p.add_argument("--workers", type=int, default=2, help="compression threads (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _renames(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"--rename takes A=B, got {pair!r}")
        out[old] = new
    return out


def run(args: argparse.Namespace) -> int:
    import datasetrt as drt
    from datasetrt.errors import DatasetRTError
    from datasetrt.sources import open_path

    try:
        renames = _renames(args.rename)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.name and len(args.name) != len(args.sources):
        print(f"error: --name takes one name per SRC ({len(args.sources)}), got {len(args.name)}", file=sys.stderr)
        return 2
    names = args.name or [None] * len(args.sources)
    try:
        sources = [open_path(path, name, payload=args.payload_column, metadata=args.metadata_columns,
                             rename=renames, index_column=args.index_column)
                   for path, name in zip(args.sources, names)]
        config = drt.WriterConfig(show_progress=not args.no_progress,
                                  shard_compression=drt.ShardCompression(algo=args.codec, level=args.level))
        with drt.DatasetRuntime(num_workers=max(1, args.workers)) as rt:
            results = rt.write_cache(sources, args.out, writer_config=config)
    except (DatasetRTError, ValueError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for result in results:
        if isinstance(result, drt.CacheWriteSuccess):
            print(f"ok   {result.path}")
        else:
            failed += 1
            print(f"FAIL {result.source_name}: {result.message}")
    return 1 if failed else 0
