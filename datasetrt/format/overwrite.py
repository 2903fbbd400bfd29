"""What a local write does when its cache's name is already taken: the `if_exists` policies of
`DatasetRuntime.write_cache`.

  "error" (the default, dataset-rt's): the source fails with
      CacheWriteError(name, "cache path already exists: <path>") and nothing is touched;
  "skip_identical": the source is staged as usual, then compared with the existing cache; the same
      cache (equal manifests: format, cache_id, count, schema, codec, payload spec and the sha256
      of every file) is kept as it is and reported as a success at its path; a different one (or a
      directory that is no published cache) fails as "error" does, saying what differs;
  "replace": the source is staged as usual, then swapped with whatever holds the name in one
      renameat2(RENAME_EXCHANGE): a reader of the name sees the old cache or the new one, never a
      mix or nothing; the old one ends in the staging dir, which is removed.

Boundary: the decision at publication time, one manifest comparison and the exchange rename. The
staging lock, the durability of the staged files (synced before `publish_over` runs) and the
removal of the staging dir are format/publish.py's. Local directories only: an object store has no
atomic replace (`DatasetRuntime.write_cache` refuses the other policies for URLs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
from pathlib import Path

from datasetrt.errors import ArgumentTypeError, ConfigError, os_error_text
from datasetrt.format.durable import rename_noreplace
from datasetrt.format.results import CacheWriteError, CacheWriteResult, CacheWriteSuccess

IF_EXISTS = ("error", "skip_identical", "replace")
DEFAULT_IF_EXISTS = "error"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest read for the comparison is refused past this size

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


def check_if_exists(value: object) -> str:
    """`value` when it is one of IF_EXISTS; ArgumentTypeError / ConfigError naming it otherwise."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"if_exists must be a str, one of {IF_EXISTS}, got {type(value).__name__}")
    if value not in IF_EXISTS:
        raise ConfigError(f"if_exists must be one of {IF_EXISTS}, got {value!r}")
    return value


def publish_over(staged: Path, target: Path, name: str, if_exists: str) -> CacheWriteResult:
    """The result of publishing the durable staged cache `staged` as `target`, which a no-replace
    rename found taken. "replace" exchanges the two (the old cache is then at `staged`, for the
    caller to remove); "skip_identical" keeps `target` when it is the same cache; otherwise the
    source fails with "cache path already exists: <path>" (and, when compared, what differs)."""
    taken = f"cache path already exists: {target.absolute()}"
    if if_exists == "replace":
        try:
            rename_exchange(staged, target)
        except FileNotFoundError:  # removed since the no-replace rename failed: publish as usual
            try:
                rename_noreplace(staged, target)
            except FileExistsError:
                return CacheWriteError(name, f"{taken} (created again while it was being replaced)")
        except OSError as exc:
            return CacheWriteError(
                name,
                f"{taken}: it cannot be replaced atomically here ({os.strerror(exc.errno or 0)}); remove it, "
                "or write to another directory",
            )
        return CacheWriteSuccess(name, target)
    if if_exists == "skip_identical":
        difference = cache_difference(staged, target)
        if difference is None:
            return CacheWriteSuccess(name, target)
        return CacheWriteError(name, f"{taken}: {difference} (if_exists='replace' overwrites it)")
    return CacheWriteError(name, taken)


def cache_difference(staged: Path, existing: Path) -> str | None:
    """None when the published cache `existing` is the cache staged at `staged` (their manifests
    hold the same values; the manifest records every file's sha256, so equal manifests mean equal
    files as written), else what differs in words. The existing files are not re-hashed
    (`datasetrt validate` does that)."""
    mine = _manifest(staged / MANIFEST)
    try:
        theirs = _manifest(existing / MANIFEST)
    except OSError as exc:
        return f"it is not a published cache (no readable {MANIFEST}: {os_error_text(exc)})"
    except ValueError as exc:
        return f"it is not a published cache ({exc})"
    if theirs == mine:
        return None
    if not isinstance(theirs, dict) or not isinstance(mine, dict):
        return "it holds a different cache (its manifest differs)"
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    return f"it holds a different cache (its manifest differs in {', '.join(differ)})"


def _manifest(path: Path) -> object:
    """The parsed JSON of a manifest, read within MAX_MANIFEST_BYTES (ValueError past it or when
    it is no JSON; OSError when it cannot be read)."""
    with open(path, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError(f"its {MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its {MANIFEST} is not JSON: {exc}") from None


def rename_exchange(a: Path, b: Path) -> None:
    """Atomically swap the directory entries `a` and `b` (Linux renameat2(RENAME_EXCHANGE); both
    must exist). OSError with EINVAL / ENOSYS where the kernel or filesystem cannot exchange,
    FileNotFoundError when either is absent."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), str(b))
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        if err == errno.ENOENT:
            raise FileNotFoundError(err, os.strerror(err), str(b))
        raise OSError(err, os.strerror(err), str(b))
