"""Cache locations: a local path, or an object-store URL parsed into scheme, bucket and prefix.

Boundary: pure parsing and joining of strings; no I/O, no object-store client, no file layouts
beyond "a cache is files under a prefix".

`parse_location(x)` is the one place a user's cache path is read:

- a `str` with no `scheme://` (or any `os.PathLike`) is a local path and comes back as the
  `pathlib.Path` it always was; `file:///abs/path` (or `file://localhost/abs/path`, percent-
  decoded) is the same local path;
- `s3://bucket/prefix` (also `s3a://`), `gs://bucket/prefix` (also `gcs://`), `az://container/prefix`
  (also `azure://`, `adl://`, `abfs://`, `abfss://`; `abfs[s]://container@account.dfs.core.windows.net/prefix`
  names the account too) comes back as a `RemoteLocation`.

A URL never passes through `pathlib.Path` (which turns `s3://b/x` into `s3:/b/x`); a string or
path that looks like such a mangled URL (`s3:/b/x`) is refused rather than read as a local
directory. Invariants of a `RemoteLocation`: the prefix has no leading or trailing `/`, no empty,
`.` or `..` segment and no control character, so `s3://b/p/` and `s3://b/p` are one cache with
one canonical `url`, which is the cache's identity in messages and in the node-local cache.
Object keys are the prefix joined with a relative file name (`shards/000000.bin`); the path is
taken literally (no percent-decoding), as S3 keys are.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from datasetrt.errors import ConfigError

# URL scheme -> canonical scheme (the one `url` and the store use).
SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "azure": "az",
    "adl": "az",
    "abfs": "abfs",
    "abfss": "abfss",
}
KINDS = {"s3": "s3", "gs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}

_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
# "s3:/bucket/x" (one slash): what Path() makes of a URL.
_MANGLED_RE = re.compile(r"^(" + "|".join(sorted(SCHEMES, key=len, reverse=True)) + r"|file):/(?!/)", re.I)
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_AZURE_AUTHORITY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*@[A-Za-z0-9][A-Za-z0-9.-]*$")
_BAD_CHARS_RE = re.compile(r"[\x00-\x1f\x7f\\?#]")


@dataclass(frozen=True)
class RemoteLocation:
    """A cache (or a directory of caches) in an object store.

    `scheme` is canonical (`s3`, `gs`, `az`, `abfs`, `abfss`); `bucket` the bucket or container
    (for `abfs[s]` with an account, `container@account.dfs.core.windows.net`); `prefix` the key
    prefix without leading or trailing `/` ("" for the bucket's root)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def kind(self) -> str:
        """The store family: "s3", "gcs" or "azure"."""
        return KINDS[self.scheme]

    @property
    def url(self) -> str:
        """Canonical URL, without a trailing slash: the identity of the location."""
        root = f"{self.scheme}://{self.bucket}"
        return f"{root}/{self.prefix}" if self.prefix else root

    @property
    def bucket_url(self) -> str:
        """URL of the bucket (container) itself."""
        return f"{self.scheme}://{self.bucket}"

    @property
    def name(self) -> str:
        """Last segment of the prefix ("" at a bucket's root), as `Path.name` for local caches."""
        return self.prefix.rpartition("/")[2]

    def key(self, name: str = "") -> str:
        """The object key of file `name` (a relative, '/'-separated path) under this location."""
        rel = relative_name(name) if name else ""
        if not rel:
            return self.prefix
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, name: str) -> str:
        """The URL of file `name` under this location (for messages)."""
        return f"{self.bucket_url}/{self.key(name)}"

    def child(self, name: str) -> RemoteLocation:
        """The location `name` (one or more segments) below this one, e.g. a cache in a base dir."""
        return RemoteLocation(self.scheme, self.bucket, self.key(name))

    def __str__(self) -> str:
        return self.url

    def __fspath__(self) -> str:  # never a file-system path: fail loudly where code expects one
        raise TypeError(f"{self.url} is an object-store location, not a local path")


CacheLocation = Path | RemoteLocation


def relative_name(name: str) -> str:
    """`name` checked as a relative '/'-separated file name inside a cache ("shards/000000.bin"):
    no empty, `.` or `..` segment, no leading '/', no control character or backslash."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"invalid file name in a cache: {name!r}")
    segments = name.split("/")
    if any(s in ("", ".", "..") for s in segments) or _BAD_CHARS_RE.search(name):
        raise ConfigError(f"invalid file name in a cache: {name!r}")
    return name


def is_url(value: object) -> bool:
    """True when `value` is a string of the form `scheme://...` (any scheme)."""
    return isinstance(value, str) and _URL_RE.match(value) is not None


def parse_location(value: str | os.PathLike[str]) -> CacheLocation:
    """A local `Path` or a `RemoteLocation` for `value` (see the module docstring). Raises
    ConfigError naming `value` for a malformed or unsupported URL or a mangled one."""
    if isinstance(value, RemoteLocation):
        return value
    if not isinstance(value, str):
        try:
            text = os.fspath(value)
        except TypeError:
            raise ConfigError(f"a cache path must be a str or os.PathLike, not {type(value).__name__}") from None
        if isinstance(text, bytes):
            raise ConfigError(f"a cache path must be a str, not bytes: {text!r}")
        if _MANGLED_RE.match(text):
            raise ConfigError(_mangled(text))
        return value if isinstance(value, Path) else Path(text)  # a Path as given: no second parse
    match = _URL_RE.match(value)
    if match is None:
        if _MANGLED_RE.match(value):
            raise ConfigError(_mangled(value))
        return Path(value)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return _file_path(value, rest)
    if scheme not in SCHEMES:
        supported = ", ".join(f"{s}://" for s in SCHEMES)
        raise ConfigError(f"unsupported cache URL scheme {scheme}:// in {value!r} (supported: file://, {supported})")
    return _remote(value, SCHEMES[scheme], rest)


def parse_remote(value: str) -> RemoteLocation:
    """`parse_location` for a value that must be remote."""
    location = parse_location(value)
    if not isinstance(location, RemoteLocation):
        raise ConfigError(f"not an object-store URL: {value!r}")
    return location


def _mangled(text: str) -> str:
    return (
        f"cache path {text!r} looks like a URL that lost a slash (pathlib.Path turns 's3://b/x' into "
        f"'s3:/b/x'): pass the URL as a string"
    )


def _file_path(value: str, rest: str) -> Path:
    host, slash, path = rest.partition("/")
    if host not in ("", "localhost") or not slash:
        raise ConfigError(f"malformed file URL {value!r}: expected file:///absolute/path")
    if "?" in path or "#" in path:
        raise ConfigError(f"malformed file URL {value!r}: a query or fragment is not a path")
    return Path("/" + urllib.parse.unquote(path))


def _remote(value: str, scheme: str, rest: str) -> RemoteLocation:
    if _BAD_CHARS_RE.search(rest) or any(c.isspace() for c in rest):
        raise ConfigError(
            f"malformed cache URL {value!r}: no whitespace, control character, backslash, '?' or '#' allowed"
        )
    bucket, _, path = rest.partition("/")
    if scheme in ("abfs", "abfss") and "@" in bucket:
        if not _AZURE_AUTHORITY_RE.match(bucket):
            raise ConfigError(f"malformed cache URL {value!r}: bad container@account {bucket!r}")
    elif not _BUCKET_RE.match(bucket):
        raise ConfigError(f"malformed cache URL {value!r}: missing or invalid bucket name {bucket!r}")
    segments = path.split("/") if path else []
    if segments and segments[-1] == "":
        segments.pop()  # one trailing slash: s3://b/p/ is s3://b/p
    if any(s in ("", ".", "..") for s in segments):
        raise ConfigError(f"malformed cache URL {value!r}: empty, '.' or '..' path segment")
    return RemoteLocation(scheme, bucket, "/".join(segments))
