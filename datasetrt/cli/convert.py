"""`datasetrt convert`: write one cache per Parquet / Arrow IPC / JSON Lines / CSV file or directory,
or per .npy file.

Boundary: command-line arguments over `datasetrt.sources` and the public write API (imported when
the command runs, so `datasetrt --help` stays light); knows no cache byte layout.

  datasetrt convert SRC... --out BASE [--payload-column C] [--metadata-columns C...]
                    [--rename A=B...] [--index-column NAME] [--dtype D [--shape S]]
                    [--column-types C=T,...] [--block-bytes N] [--max-line-bytes N]
                    [--codec none|lz4|zstd|zstd_dict] [--level N] [--dict-bytes N] [--name NAME...]
                    [--workers N] [--no-progress] [--overwrite | --skip-identical]
                    [--storage-option KEY=VALUE...] [--cache-dir DIR]

Each SRC (a file, or a directory of files of one kind) becomes the cache BASE/NAME (NAME defaults to
the file name without its data suffixes, or the directory's name). A CSV file's first line names
its columns (CsvSource). A .npy file is one array whose rows (axis 0) are the payloads, typed by
its dtype and trailing shape, with the row number as the only metadata column (`--index-column`,
default "index"; NumpySource). BASE is a directory or an
object-store URL (s3://bucket/prefix, gs://, az://): each cache is then written to a staging
directory under the node-local cache (--cache-dir), uploaded and published with its manifest last
(format/upload.py), and reached with the environment and --storage-option (cli/remote.py). Typed payloads: `--dtype` /
`--shape` give the PayloadSpec, else a list payload column's type gives it (list<int32> ->
int32[None]); every SRC must then have the same spec (byte payloads: none), which each manifest
records. JSON Lines and CSV: `--column-types` gives column types (JSON Lines infers the others over
every file, CSV from its first block); JSON Lines only: `--block-bytes` / `--max-line-bytes` the
text parsed at a time and the longest line.
A cache name already taken under BASE fails that source, as `write_cache` does;
`--overwrite` replaces it atomically and `--skip-identical` keeps it when it is the cache this
run writes (`write_cache(if_exists=...)`, local BASE only). Exit status 0 when every cache was
written (or kept), 1 when any source failed (its error is printed; nothing of it is published), 2
on a usage error (conflicting specs included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from datasetrt.cli.remote import add_storage_arguments, storage_config
from datasetrt.values.codecs import CODEC_NAMES, DICT_BYTES_DEFAULT


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="write caches from Parquet, Arrow, JSON Lines, CSV or .npy files",
        description="Write one cache per SRC under --out: a Parquet, Arrow IPC / Feather, JSON Lines or CSV "
        "file, a directory of files of one of those kinds, or a .npy file (its rows are the payloads).",
    )
    p.add_argument("sources", type=Path, nargs="+", metavar="SRC")
    p.add_argument(
        "--out",
        required=True,
        metavar="BASE",
        help="base of the caches: a directory, or an object-store URL (s3://bucket/prefix, gs://, az://)",
    )
    p.add_argument(
        "--payload-column",
        metavar="C",
        help="payload column (binary, string or list of numbers); default: the only binary column",
    )
    p.add_argument(
        "--metadata-columns",
        nargs="*",
        metavar="C",
        help="metadata columns (default: every other column; give none for no column)",
    )
    p.add_argument(
        "--rename", action="extend", nargs="+", default=[], metavar="A=B", help="store metadata column A as B"
    )
    p.add_argument(
        "--index-column",
        metavar="NAME",
        help="add the source row number as metadata column NAME (.npy: the only column, default 'index')",
    )
    p.add_argument(
        "--dtype",
        metavar="D",
        help="typed payloads of this numpy dtype (int32, float16, ...): list values "
        "are cast exactly, byte payloads must fit; default: inferred from a list payload column",
    )
    p.add_argument(
        "--shape",
        metavar="S",
        help="with --dtype: comma-separated dims, None for the ragged one "
        "(512, None,3; '' for scalars); default None (one ragged dim)",
    )
    p.add_argument(
        "--column-types",
        action="extend",
        nargs="+",
        default=[],
        metavar="C=T,...",
        help="JSON Lines and CSV: column types (int64, int32, float64, string, bool, list<int32>, ...); "
        "the other columns are inferred",
    )
    p.add_argument(
        "--block-bytes", type=int, metavar="N", help="JSON Lines: bytes of text parsed at a time (default 1 MiB)"
    )
    p.add_argument(
        "--max-line-bytes",
        type=int,
        metavar="N",
        help="JSON Lines: the longest line read, at least --block-bytes (default 64 MiB; parsing it costs about 8x that)",
    )
    p.add_argument("--codec", choices=CODEC_NAMES, default="none", help="payload compression")
    p.add_argument("--level", type=int, default=3, help="zstd / zstd_dict level (default 3)")
    p.add_argument(
        "--dict-bytes",
        type=int,
        default=DICT_BYTES_DEFAULT,
        metavar="N",
        help=f"zstd_dict: most bytes of the dictionary trained per cache (default {DICT_BYTES_DEFAULT})",
    )
    p.add_argument(
        "--name", action="extend", nargs="+", default=[], metavar="NAME", help="cache names, one per SRC in order"
    )
    p.add_argument("--workers", type=int, default=2, help="compression threads (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument(
        "--overwrite",
        dest="if_exists",
        action="store_const",
        const="replace",
        default="error",
        help="replace a cache of the same name under --out, atomically (default: that source fails)",
    )
    existing.add_argument(
        "--skip-identical",
        dest="if_exists",
        action="store_const",
        const="skip_identical",
        help="keep a cache of the same name when it is the one this run writes (else that source fails)",
    )
    add_storage_arguments(p, cache_dir=True)


def _renames(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"--rename takes A=B, got {pair!r}")
        out[old] = new
    return out


def _column_types(items: list[str]) -> dict | None:
    """--column-types NAME=TYPE,... (repeatable) as {name: pyarrow type}, or None."""
    from datasetrt.sources.jsonl import parse_column_types

    return {k: v for item in items for k, v in parse_column_types(item).items()} or None


def _given_spec(dtype: str | None, shape: str | None) -> Any:
    """The PayloadSpec of --dtype / --shape, or None; ValueError / ConfigError for bad values."""
    from datasetrt.values.config import PayloadSpec

    if dtype is None:
        if shape is not None:
            raise ValueError("--shape needs --dtype")
        return None
    text = "None" if shape is None else shape
    try:
        dims = tuple(None if d.strip() == "None" else int(d) for d in text.split(",")) if text.strip() else ()
    except ValueError:
        raise ValueError(f"--shape takes comma-separated integers and None, got {shape!r}") from None
    return PayloadSpec(dtype, dims)


def _common_spec(paths: list[Path], sources: list) -> Any:
    """The payload spec every source gives (None: byte payloads); ValueError naming two SRC that
    differ. A source whose spec cannot be read (a file pyarrow cannot open, a missing column) is
    left to the write, which reports it as that source's failure."""
    from datasetrt.errors import SourceError
    from datasetrt.sources.base import describe_spec

    first: tuple[Path, Any] | None = None
    for path, source in zip(paths, sources):
        try:
            spec = source.payload_spec
        except SourceError:
            continue
        if first is None:
            first = path, spec
        elif spec != first[1]:
            raise ValueError(
                f"payload specs differ: {first[0]} gives {describe_spec(first[1])}, {path} gives {describe_spec(spec)}; "
                f"convert them in separate runs, or give --dtype/--shape to cast both to one spec"
            )
    return None if first is None else first[1]


NPY_INDEX_COLUMN = "index"  # a .npy source's metadata column (its row number) without --index-column


def _is_npy(path: Path) -> bool:
    return path.name.lower().endswith(".npy")


def _npy_source(path: Path, name: str | None, args: argparse.Namespace, renames: dict, given: Any) -> Any:
    """The NumpySource of a .npy file: record i is row i of the array (axis 0; a 1-D array gives
    scalar records), mapped read-only so it is read a slice at a time; the only metadata is the
    row number (--index-column, default NPY_INDEX_COLUMN). ConfigError naming the file for what
    cannot be read as a numeric array, and for column options a .npy file has no columns for."""
    import numpy as np

    from datasetrt.errors import ConfigError, DatasetRTError
    from datasetrt.sources import NumpySource

    if args.payload_column is not None or args.metadata_columns:
        raise ConfigError(
            f"{path}: a .npy file has no columns: its rows are the payloads and its only metadata is the row "
            f"number (--index-column, default {NPY_INDEX_COLUMN!r}); leave out --payload-column / --metadata-columns"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"{path}: cannot read as a .npy array: {exc}") from None
    if not isinstance(data, np.ndarray):
        raise ConfigError(f"{path}: not a .npy array file (an .npz archive?)")
    try:
        return NumpySource(
            name if name is not None else path.name[: -len(".npy")] or path.name,
            data,
            rename=renames,
            payload_spec=given,
            index_column=args.index_column or NPY_INDEX_COLUMN,
        )
    except (DatasetRTError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import datasetrt as drt
    from datasetrt.errors import DatasetRTError
    from datasetrt.sources import open_path

    try:
        renames = _renames(args.rename)
        column_types = _column_types(args.column_types)
        given = _given_spec(args.dtype, args.shape)
        storage = storage_config(args)
    except (ValueError, DatasetRTError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.name and len(args.name) != len(args.sources):
        print(f"error: --name takes one name per SRC ({len(args.sources)}), got {len(args.name)}", file=sys.stderr)
        return 2
    names = args.name or [None] * len(args.sources)
    try:
        sources = [
            _npy_source(path, name, args, renames, given)
            if _is_npy(path)
            else open_path(
                path,
                name,
                payload=args.payload_column,
                metadata=args.metadata_columns,
                rename=renames,
                index_column=args.index_column,
                payload_spec=given,
                column_types=column_types,
                block_bytes=args.block_bytes,
                max_line_bytes=args.max_line_bytes,
            )
            for path, name in zip(args.sources, names)
        ]
        config = drt.WriterConfig(
            show_progress=not args.no_progress,
            payload_spec=_common_spec(args.sources, sources),
            shard_compression=drt.ShardCompression(algo=args.codec, level=args.level, dict_bytes=args.dict_bytes),
            storage=storage,
        )
        with drt.DatasetRuntime(num_workers=max(1, args.workers)) as rt:
            results = rt.write_cache(sources, args.out, writer_config=config, if_exists=args.if_exists)
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
