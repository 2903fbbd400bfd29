"""A cache's files as data: each one a regular file inside the cache directory, read within the
size stat'ed for it, opened so that nothing on the path can block.

Boundary: paths, stat results and bytes of single files; knows no cache layout (callers name the
files and their expected sizes), no codecs, no tables. Imports only `os` and `stat`, so reader
workers use it freely.

The rules (docs/security.md, "Hostile caches"):
- Regular files only. A FIFO, socket, device (`/dev/zero`) or directory where a cache file should
  be is refused (`CacheFormatError` naming the file and what it is) at the stat made when the
  cache is opened, and again by `read_regular` on the opened descriptor (`fstat`), so a file
  swapped for a FIFO later is refused rather than waited on: every open is `O_NONBLOCK`, which
  makes opening a FIFO return at once (it has no writer) instead of blocking.
- Inside the cache directory. A cache file (or the `shards/` directory) that is a symbolic link
  must resolve inside the cache directory (`check_file` / `check_dir` with `inside`, the
  directory's resolved path); links that leave it are refused naming the link and its target,
  unless the reader opted in (`ReaderConfig(allow_external_links=True)`, then `inside` is None).
  Hard links cannot be told from the file they name and are not refused.
- Bounded. `read_regular` reads at most the size the caller expects (the size stat'ed at open,
  or a manifest-declared size) and refuses a file of another size, so a file that grew, or
  one that never ends, costs no more than what was declared.
"""

from __future__ import annotations

import errno
import os
import stat

from datasetrt.errors import CacheFormatError, CacheIOError

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
HASH_CHUNK_BYTES = 8 << 20


def kind_of(mode: int) -> str:
    """What a file of stat mode `mode` is, in words ("a FIFO", "a character device", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def resolved_dir(path: str | os.PathLike[str], parents: dict[str, str] | None = None) -> str:
    """The cache directory `path` with every symbolic link resolved (what `inside` means).

    With `parents` (a memo shared by the caches one call opens: parent directory -> resolved
    path), a directory that is not itself a link and whose path has no `..` component resolves
    as its parent's resolved path (resolved once per memo) joined with its name, which is what
    `realpath` gives for it: one lstat per cache instead of one per path component. Anything
    else (a link, `..`, a path that cannot be stat'ed) is resolved by `realpath` in full."""
    name = os.fspath(path)
    if parents is not None and ".." not in name.split(os.sep):
        full = os.path.abspath(name)
        parent, base = os.path.split(full)
        try:
            plain_dir = bool(base) and stat.S_ISDIR(os.lstat(full).st_mode)
        except OSError:
            plain_dir = False
        if plain_dir:
            resolved = parents.get(parent)
            if resolved is None:
                resolved = parents[parent] = os.path.realpath(parent)
            return os.path.join(resolved, base)
    return os.path.realpath(name)


def _within(target: str, inside: str) -> bool:
    return target == inside or target.startswith(inside.rstrip(os.sep) + os.sep)


def _link_rule(path: str, inside: str | None) -> None:
    """Refuse `path` (a symbolic link) when it resolves outside `inside` (None: any target)."""
    if inside is None:
        return
    target = os.path.realpath(path)
    if not _within(target, inside):
        raise CacheFormatError(
            f"cache file is a symbolic link to {target}, outside the cache directory {inside}: {path} "
            "(ReaderConfig(allow_external_links=True) reads caches assembled from links)"
        )


def check_file(path: str, inside: str | None) -> os.stat_result:
    """The stat of cache file `path`: a regular file (after its links, which must resolve inside
    `inside` unless it is None). CacheIOError when it cannot be stat'ed (naming it) or is a
    directory (EISDIR), CacheFormatError when it is a link that leaves the cache or another kind
    of file. One lstat (plus a stat and a realpath for a link)."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            _link_rule(path, inside)
            st = os.stat(path)
    except OSError as exc:
        raise CacheIOError.from_os(exc, path) from None
    _refuse_irregular(st.st_mode, path)
    return st


def _refuse_irregular(mode: int, path: str | os.PathLike[str]) -> None:
    """A directory is the OS's EISDIR (CacheIOError, as reading it would be); any other kind of
    file that is not regular is a CacheFormatError naming what it is."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise CacheIOError.from_os(errno.EISDIR, os.fspath(path))
    raise CacheFormatError(f"cache file is {kind_of(mode)}, not a regular file: {os.fspath(path)}")


def check_dir(path: str, inside: str | None, *, missing_ok: bool = False) -> None:
    """Cache directory `path` (shards/) is a directory, and a link to one only inside `inside`
    (`missing_ok`: a missing one passes, for callers that name what is missing in it). One lstat
    (plus a stat and a realpath for a link)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        if missing_ok and exc.errno == errno.ENOENT:
            return
        raise CacheIOError.from_os(exc, path) from None
    try:
        if stat.S_ISLNK(st.st_mode):
            _link_rule(path, inside)
            st = os.stat(path)
    except OSError as exc:
        raise CacheIOError.from_os(exc, path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheFormatError(f"cache directory entry is {kind_of(st.st_mode)}, not a directory: {path}")


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """(descriptor, fstat) of `path` opened read-only without blocking, refused (and closed) when
    it is not a regular file (`_refuse_irregular`). OSError from the open propagates (callers
    word it); the caller closes the descriptor."""
    fd = os.open(path, READ_FLAGS)
    try:
        st = os.fstat(fd)
        _refuse_irregular(st.st_mode, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(
    path: str | os.PathLike[str], *, size: int | None = None, max_bytes: int | None = None, what: str = "file"
) -> tuple[bytes, os.stat_result]:
    """The whole of regular file `path` and its fstat, reading no more than it was declared to
    hold: `size` (exact, e.g. the size stat'ed at open: another size is a CacheFormatError
    "changed on disk") or, without one, its fstat size, which must not exceed `max_bytes`
    (CacheFormatError naming the file, its size and the bound). A file shorter than its fstat
    size when read is a CacheFormatError too. OS errors are CacheIOError naming the file (with
    its errno)."""
    name = os.fspath(path)
    try:
        fd, st = open_regular(path)
    except OSError as exc:
        raise CacheIOError.from_os(exc, name) from None
    try:
        if size is not None and st.st_size != size:
            raise CacheFormatError(
                f"{what} changed on disk since it was opened ({st.st_size} bytes, was {size}): {name}"
            )
        if max_bytes is not None and st.st_size > max_bytes:
            raise CacheFormatError(f"{what} is {st.st_size} bytes, more than the {max_bytes} it may hold: {name}")
        want = st.st_size
        chunks = []
        got = 0
        while got < want:
            chunk = os.read(fd, min(want - got, HASH_CHUNK_BYTES))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise CacheIOError.from_os(exc, name) from None
    finally:
        os.close(fd)
    if got != want:
        raise CacheFormatError(f"{what} changed on disk while it was read ({got} of {want} bytes): {name}")
    return b"".join(chunks) if len(chunks) != 1 else chunks[0], st


def sha256_regular(path: str | os.PathLike[str], size: int) -> str:
    """Hex sha256 of regular file `path`, which must hold exactly `size` bytes (the size the
    manifest or the open-time stat declared): at most `size` bytes are read, so a FIFO, a device
    or a file that grew never makes hashing run on. CacheFormatError for another size or kind,
    CacheIOError (naming the file) for OS errors. O(size)."""
    import hashlib  # lazily: reader workers never hash files

    name = os.fspath(path)
    try:
        fd, st = open_regular(path)
    except OSError as exc:
        raise CacheIOError.from_os(exc, name) from None
    digest = hashlib.sha256()
    try:
        if st.st_size != size:
            raise CacheFormatError(f"file changed on disk since it was opened ({st.st_size} bytes, was {size}): {name}")
        got = 0
        while got < size:
            chunk = os.read(fd, min(size - got, HASH_CHUNK_BYTES))
            if not chunk:
                break
            digest.update(chunk)
            got += len(chunk)
    except OSError as exc:
        raise CacheIOError.from_os(exc, name) from None
    finally:
        os.close(fd)
    if got != size:
        raise CacheFormatError(f"file changed on disk while it was hashed ({got} of {size} bytes): {name}")
    return digest.hexdigest()
