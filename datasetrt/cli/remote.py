"""Object-store URLs on the command line: the storage flags every cache-taking subcommand shares,
and which caches a path or URL names (a cache, or a base holding caches one level below it).

Boundary: argument values to a `StorageConfig` and locations to cache lists, over `storage/` and
the format layer's file names; prints nothing (its callers own the output).

Storage options come from the standard environment, which obstore reads itself (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, `GOOGLE_*`,
`AZURE_*`), and from `--storage-option KEY=VALUE` flags (obstore's option names, as
`StorageConfig.options`), which win. Values are held as secrets: no message shows one, and a
malformed flag is reported by its key only.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasetrt.format.layout import MANIFEST_NAME

STORAGE_HELP = (
    "object-store option KEY=VALUE for s3:// gs:// az:// URLs (repeatable; obstore's names: endpoint, "
    "region, access_key_id, secret_access_key, allow_http, ...); the standard environment "
    "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) is read too, these win over it"
)


def add_storage_arguments(parser: argparse.ArgumentParser, *, cache_dir: bool = False) -> None:
    """`--storage-option KEY=VALUE` (repeatable) and, with `cache_dir`, `--cache-dir DIR`."""
    parser.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE", dest="storage_options", help=STORAGE_HELP
    )
    if cache_dir:
        parser.add_argument(
            "--cache-dir",
            metavar="DIR",
            help="node-local cache that remote files are downloaded into "
            "(default: $DATASETRT_CACHE_DIR, else ~/.cache/datasetrt)",
        )


def storage_options(pairs: list[str]) -> dict[str, str]:
    """The `--storage-option` flags as a mapping; ValueError naming the flag's key (never its
    value) for a malformed one."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError("--storage-option takes KEY=VALUE (an argument without '=' or without a key was given)")
        out[key] = value
    return out


def storage_config(args: argparse.Namespace) -> Any:
    """The `StorageConfig` of the parsed flags (ValueError for a malformed flag)."""
    from datasetrt.values.config import StorageConfig

    options = storage_options(args.storage_options)
    return StorageConfig.model_validate({"options": options, "cache_dir": getattr(args, "cache_dir", None)})


@dataclass(frozen=True)
class RemoteCacheObjects:
    """One cache under a listed URL: its location's `store` and the sizes of its objects by name
    (relative to the cache), from one listing."""

    store: Any  # datasetrt.storage.objects.ObjectStore
    sizes: dict[str, int]

    @property
    def url(self) -> str:
        return str(self.store.url)


def remote_caches(store: Any) -> tuple[list[RemoteCacheObjects], list[str]]:
    """The caches at `store`'s location from one listing: the location itself when it holds a
    manifest, else each first-level prefix below it that does (a base), by name. Also the names
    at the top of the location (for a report of what is there instead), "name/" for prefixes."""
    infos = store.list()
    if any(info.name == MANIFEST_NAME for info in infos):
        return [RemoteCacheObjects(store, {info.name: info.size for info in infos})], []
    groups: dict[str, dict[str, int]] = {}
    for info in infos:
        head, sep, rest = info.name.partition("/")
        if sep:
            groups.setdefault(head, {})[rest] = info.size
    caches = [
        RemoteCacheObjects(store.with_location(store.location.child(name)), sizes)
        for name, sizes in sorted(groups.items())
        if MANIFEST_NAME in sizes
    ]
    top = sorted({info.name.partition("/")[0] + ("/" if "/" in info.name else "") for info in infos})
    return caches, top


def local_caches(path: Path) -> list[Path]:
    """The caches a local directory names: itself when it holds a manifest (or is not a
    directory), else its subdirectories that hold one (a base directory), by name; [path] when
    there are none (its report says what is missing)."""
    if not path.is_dir() or (path / MANIFEST_NAME).exists():
        return [path]
    children = sorted(p for p in path.iterdir() if p.is_dir() and (p / MANIFEST_NAME).is_file())
    return children or [path]


CACHES_BELOW_DEPTH = 4  # how deep `not_a_cache` looks for caches under a directory that is neither
CACHES_SHOWN = 5  # caches a message names


def not_a_cache(path: Path) -> str | None:
    """Why local `path` names no cache, or None when it does (it holds a manifest, or a base whose
    subdirectories do: `local_caches`). The problem says "no such directory" / "not a directory",
    or, for a directory without a manifest and without caches one level below, which caches lie
    deeper (up to CACHES_BELOW_DEPTH levels) and how to name them. O(directories walked)."""
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "not a directory (a cache is a directory holding manifest.json)"
    if local_caches(path) != [path] or (path / MANIFEST_NAME).exists():
        return None
    found = caches_below(path, CACHES_BELOW_DEPTH)
    if not found:
        return f"not a cache (no {MANIFEST_NAME}) and no cache below it"
    bases = sorted({str(p.parent) for p in found})
    shown = ", ".join(str(p) for p in found[:CACHES_SHOWN]) + (
        f" and {len(found) - CACHES_SHOWN} more" if len(found) > CACHES_SHOWN else ""
    )
    return (
        f"not a cache (no {MANIFEST_NAME}) nor a base (no cache one level below it); caches deeper below it: "
        f"{shown}; name a cache or its base directory ({' '.join(bases[:CACHES_SHOWN])})"
    )


def caches_below(path: Path, depth: int) -> list[Path]:
    """The cache directories (holding a manifest) under `path`, at most `depth` levels below it,
    by path; a cache's own subdirectories and symlinked directories are not entered."""
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        below: list[Path] = []
        for d in level:
            try:
                children = sorted(c for c in d.iterdir() if c.is_dir() and not c.is_symlink())
            except OSError:
                continue
            for child in children:
                (found if (child / MANIFEST_NAME).is_file() else below).append(child)
        level = below
    return sorted(found)
