"""Object stores: one remote cache location's objects through obstore, with typed errors and a retry budget.

Boundary: objects by name under one `RemoteLocation` (bytes, ranges, sizes, create-only puts,
listings, deletes, downloads into a local file); knows nothing of what the bytes mean (manifests,
shards, layouts) nor of the node-local cache that decides where downloads go.

Configuration: `ObjectStore(location, storage_options, retry=RetryPolicy())`. `storage_options`
holds obstore's own keys for the store family (S3: `endpoint`, `region`, `access_key_id`,
`secret_access_key`, `session_token`, `skip_signature`, ...; the `aws_`-prefixed and other
aliases obstore accepts work too) and its HTTP client keys (`allow_http`, `timeout`,
`connect_timeout`, `read_timeout`, `proxy_url`, ...). Explicit options win over the standard
environment, which obstore reads itself (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_*`, `AZURE_*`).
Client timeouts default to connect 5 s, read (a stalled body) 30 s, whole request 300 s.

Credentials never leave this module in text: `repr`/`str` show only the URL; error messages are
built here from the operation, the object's URL, the HTTP status and the store's error code, and
every value of a secret-looking option or environment variable (names with key, secret, token,
password, sas or credential) is replaced by `***` in them; obstore's exceptions are not chained.

Retries (`RetryPolicy`, default 10 attempts within 120 s, backoff from 0.1 s doubling to at most
15 s with jitter): obstore's own retry loop, configured from the policy, retries 5xx and 429
answers, connection errors, timeouts and a response body cut short (resumed with a range request
from the bytes already received) — each operation makes at most `attempts` requests and starts no
retry later than `budget_s` after its first; a multipart upload gives each part that budget. It
never retries other 4xx answers (403, 404, 412, 416 fail at once). What is left after the budget
is a `StorageUnreachableError`.

Error mapping: not found (also a missing bucket) -> ObjectNotFoundError; 401/403 ->
StorageAccessError; a create-only put that lost -> ObjectExistsError; unreachable / 5xx / 429
after the budget -> StorageUnreachableError; anything else -> StorageError; an object larger
than a bounded read allows -> ObjectSizeError; an object whose size is not the expected one on a
download -> IntegrityError.

Fork: obstore's runtime does not survive `fork()` (a forked child that touches a store its
parent used hangs). A process forked after this module made its first request therefore runs
its operations through a helper process started with exec (`storage/bridge.py`), transparently;
processes started by spawn or forkserver, or forked before any request, use obstore directly.

Size: over 500 lines because every operation (get, range, head, put, create-only put, list, delete,
download) maps obstore's errors through the same redaction and retry policy kept in this module.
"""

from __future__ import annotations

import builtins
import datetime
import errno as errno_codes
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasetrt.errors import (
    CacheIOError,
    ConfigError,
    DiskFullError,
    IntegrityError,
    MissingExtraError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectSizeError,
    StorageAccessError,
    StorageError,
    StorageUnreachableError,
)
from datasetrt.storage.secrets import redact, secret_values
from datasetrt.storage.urls import RemoteLocation, parse_remote, relative_name

EXTRA_HINT = "pip install 'datasetrt[s3]'"
DEFAULT_PART_BYTES = 8 << 20  # multipart part size and threshold (S3's minimum part is 5 MiB)
PUT_CONCURRENCY = 4  # parts in flight per upload: memory is about PUT_CONCURRENCY x part_bytes
STREAM_CHUNK_BYTES = 256 << 10  # downloads are written in chunks of at least this size

# obstore's ClientConfig keys (HTTP client); every other option goes to the store's config.
CLIENT_KEYS = frozenset(
    (
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "default_headers",
        "http1_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "root_certificate",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    )
)
CLIENT_DEFAULTS = {"connect_timeout": "5s", "read_timeout": "30s", "timeout": "300s"}
_ENV_PREFIX = {"s3": "AWS_", "gcs": "GOOGLE_", "azure": "AZURE_"}

_STATUS_RE = re.compile(r"status code: (\d{3})")
_RETRIES_RE = re.compile(r"after (\d+) retries")
_CODE_RE = re.compile(r"<Code>([^<]{1,80})</Code>")
_BODY_RE = re.compile(r":\s*<\?xml.*|:\s*<Error>.*", re.S)

# The pid of the process whose obstore runtime has started (None: none in this address space).
_RUNTIME_PID: int | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How long an operation keeps trying: at most `attempts` requests (first try included) and no
    retry started later than `budget_s` after the first; waits grow from `initial_backoff_s` by
    2x per retry up to `max_backoff_s`, with jitter."""

    attempts: int = 10
    budget_s: float = 120.0
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 15.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"RetryPolicy.attempts must be an integer >= 1, got {self.attempts!r}")
        for name in ("budget_s", "initial_backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"RetryPolicy.{name} must be a number > 0, got {value!r}")

    def obstore_config(self) -> dict[str, Any]:
        return {
            "max_retries": self.attempts - 1,
            "retry_timeout": datetime.timedelta(seconds=self.budget_s),
            "backoff": {
                "init_backoff": datetime.timedelta(seconds=self.initial_backoff_s),
                "max_backoff": datetime.timedelta(seconds=max(self.max_backoff_s, self.initial_backoff_s)),
                "base": 2,
            },
        }


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or a head returns: `name` relative to the store's location; `modified` the
    store's last-modified time (unix seconds) when it gives one."""

    name: str
    size: int
    etag: str | None
    version: str | None
    modified: float | None = None


@dataclass(frozen=True)
class PutInfo:
    etag: str | None
    version: str | None


class ObjectStore:
    """The objects under one remote location; see the module docstring. Thread-safe; picklable
    (a pickle carries the options, so never log one); cheap to copy into worker processes."""

    def __init__(
        self,
        location: RemoteLocation | str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.location = parse_remote(location) if isinstance(location, str) else location
        if not isinstance(self.location, RemoteLocation):
            raise ConfigError(f"ObjectStore needs an object-store location, got {location!r}")
        options = dict(storage_options or {})
        for key in options:
            if not isinstance(key, str):
                raise ConfigError(f"storage_options keys must be strings, got {type(key).__name__}")
        self._options = options
        self.retry = retry if retry is not None else RetryPolicy()
        self._secrets = secret_values(options)
        self._store: Any = None
        self._store_pid: int | None = None
        self._obstore_store()  # configuration errors (and a missing extra) surface here, not mid-read

    # -- identity -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.location.url

    def url_of(self, name: str) -> str:
        return self.location.url_of(name)

    def __repr__(self) -> str:
        return f"ObjectStore({self.location.url!r})"

    __str__ = __repr__

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "options": self._options, "retry": self.retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.location = state["location"]
        self._options = state["options"]
        self.retry = state["retry"]
        self._secrets = secret_values(self._options)
        self._store = None
        self._store_pid = None

    def with_location(self, location: RemoteLocation) -> ObjectStore:
        """The same configuration for another location (e.g. one cache of a base directory)."""
        return ObjectStore(location, self._options, retry=self.retry)

    # -- operations -----------------------------------------------------------------------------

    def get(self, name: str, *, max_bytes: int) -> bytes:
        """The whole object `name`; refuses (ObjectSizeError) an object larger than `max_bytes`
        from its size before reading its body."""
        return self._call("get", name, max_bytes)

    def get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `name`, exactly; StorageError when the object is shorter."""
        if not 0 <= start < end:
            raise ConfigError(f"get_range needs 0 <= start < end, got {start}, {end}")
        return self._call("get_range", name, start, end)

    def head(self, name: str) -> ObjectInfo:
        """Size, etag and version of `name` without its body."""
        return self._call("head", name)

    def put(
        self,
        name: str,
        data: bytes | bytearray | memoryview | os.PathLike[str],
        *,
        part_bytes: int = DEFAULT_PART_BYTES,
    ) -> PutInfo:
        """Write `name` (overwriting). `data` is bytes or a local file's path; anything above
        `part_bytes` goes up as a multipart upload of `part_bytes` parts, streamed from the file
        (at most PUT_CONCURRENCY parts in memory); it appears atomically when complete."""
        if part_bytes < 5 << 20:
            raise ConfigError(f"part_bytes must be at least 5 MiB (S3's minimum part), got {part_bytes}")
        if isinstance(data, os.PathLike):
            data = Path(os.fspath(data)).resolve()
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        return self._call("put", name, data, part_bytes)

    def put_if_absent(self, name: str, data: bytes | bytearray | memoryview) -> PutInfo:
        """Create `name` only if no object has that name (`If-None-Match: *`, one request): of
        writers racing on one name exactly one succeeds, the others get ObjectExistsError."""
        return self._call("put_if_absent", name, bytes(data))

    def list(self, name_prefix: str = "") -> list[ObjectInfo]:
        """Every object under the location (under `name_prefix` below it, segment-wise), sorted by name."""
        return self._call("list", name_prefix)

    def delete(self, names: Iterable[str]) -> None:
        """Delete `names` (missing ones are not an error)."""
        names = [relative_name(n) for n in names]
        if names:
            self._call("delete", names)

    def download(self, name: str, path: os.PathLike[str] | str, *, start: int, size: int) -> int:
        """Append bytes [start, size) of `name` to the local file `path`, whose length must be
        `start` (a resumed download); returns the file's new length (`size`). The object must be
        exactly `size` bytes (IntegrityError otherwise, before its body is read). A full file
        system raises DiskFullError naming the file's directory; the bytes written stay."""
        if not 0 <= start <= size:
            raise ConfigError(f"download needs 0 <= start <= size, got {start}, {size}")
        return self._call("download", name, str(Path(os.fspath(path)).resolve()), start, size)

    # -- dispatch -------------------------------------------------------------------------------

    def _call(self, op: str, *args: Any) -> Any:
        global _RUNTIME_PID
        pid = os.getpid()
        if _RUNTIME_PID is not None and pid != _RUNTIME_PID:
            from datasetrt.storage.bridge import bridge_call

            return bridge_call(self, op, args)
        _RUNTIME_PID = pid
        return self.run_local(op, args)

    def run_local(self, op: str, args: tuple[Any, ...]) -> Any:
        """Run `op` in this process (the bridge's helper calls this)."""
        method = getattr(self, f"_op_{op}")
        return method(*args)

    def _obstore_store(self) -> Any:
        if self._store is not None and self._store_pid == os.getpid():
            return self._store
        try:
            import obstore.store as obs_store
        except ImportError:
            raise MissingExtraError(
                f"object-store caches ({self.location.scheme}:// URLs) require obstore to be installed: {EXTRA_HINT}"
            ) from None
        config: dict[str, Any] = {}
        # obstore replaces the environment's client settings (AWS_ALLOW_HTTP, ...) wholesale when
        # client options are given, so carry them over; the defaults fill only what neither sets.
        env_prefix = _ENV_PREFIX[self.location.kind]
        client: dict[str, Any] = {}
        for key in CLIENT_KEYS:
            value = os.environ.get(env_prefix + key.upper())
            if value is not None:
                client[key] = value
            elif key in CLIENT_DEFAULTS:
                client[key] = CLIENT_DEFAULTS[key]
        for key, value in self._options.items():
            low = key.lower()
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            (client if low in CLIENT_KEYS else config)[low] = value
        try:
            from_url: Any = obs_store.from_url  # the options are a user mapping, validated by obstore
            store = from_url(
                self.location.bucket_url,
                config=config,
                client_options=client,
                retry_config=self.retry.obstore_config(),
            )
        except Exception as exc:  # UnknownConfigurationKeyError, ValueError: name the option, never its value
            detail = redact(_summary(str(exc)), self._secrets)
            raise ConfigError(f"invalid storage_options for {self.location.url}: {detail}") from None
        self._store, self._store_pid = store, os.getpid()
        return store

    def _key(self, name: str) -> str:
        return self.location.key(name)

    def _error(self, exc: BaseException, op: str, name: str | None) -> Exception:
        url = self.location.url_of(name) if name else self.location.url
        return map_error(exc, op, url, self._secrets)

    # -- local implementations (obstore calls) --------------------------------------------------

    def _op_get(self, name: str, max_bytes: int) -> bytes:
        import obstore as obs

        try:
            result = obs.get(self._obstore_store(), self._key(name))
            size = result.meta["size"]
            if size > max_bytes:
                raise ObjectSizeError(
                    f"get {self.url_of(name)}: the object is {size} bytes, more than the {max_bytes} this read allows",
                    url=self.url_of(name),
                    operation="get",
                )
            out = bytearray()
            for chunk in result.stream(min_chunk_size=STREAM_CHUNK_BYTES):
                out += chunk
                if len(out) > max_bytes:
                    raise ObjectSizeError(
                        f"get {self.url_of(name)}: the body is longer than the {max_bytes} bytes this read allows",
                        url=self.url_of(name),
                        operation="get",
                    )
            return bytes(out)
        except StorageError:
            raise
        except Exception as exc:
            raise self._error(exc, "get", name) from None

    def _op_get_range(self, name: str, start: int, end: int) -> bytes:
        import obstore as obs

        try:
            result = obs.get(self._obstore_store(), self._key(name), options={"range": (start, end)})
            data = bytes(result.bytes())
        except Exception as exc:
            raise self._error(exc, "get_range", name) from None
        if len(data) != end - start:
            raise StorageError(
                f"get_range {self.url_of(name)}: bytes {start}..{end} asked, the object ends at {start + len(data)}",
                url=self.url_of(name),
                operation="get_range",
            )
        return data

    def _op_head(self, name: str) -> ObjectInfo:
        import obstore as obs

        try:
            meta = obs.head(self._obstore_store(), self._key(name))
        except Exception as exc:
            raise self._error(exc, "head", name) from None
        return ObjectInfo(name, meta["size"], meta["e_tag"], meta["version"], _unix(meta.get("last_modified")))

    def _op_put(self, name: str, data: bytes | Path, part_bytes: int) -> PutInfo:
        import obstore as obs

        try:
            result = obs.put(
                self._obstore_store(),
                self._key(name),
                data,
                mode="overwrite",
                chunk_size=part_bytes,
                max_concurrency=PUT_CONCURRENCY,
            )
        except Exception as exc:
            raise self._error(exc, "put", name) from None
        return PutInfo(result["e_tag"], result["version"])

    def _op_put_if_absent(self, name: str, data: bytes) -> PutInfo:
        import obstore as obs

        try:
            result = obs.put(self._obstore_store(), self._key(name), data, mode="create", use_multipart=False)
        except Exception as exc:
            raise self._error(exc, "put_if_absent", name) from None
        return PutInfo(result["e_tag"], result["version"])

    def _op_list(self, name_prefix: str) -> builtins.list[ObjectInfo]:
        import obstore as obs

        base = self.location.prefix
        prefix = self._key(name_prefix) if name_prefix else base
        strip = len(base) + 1 if base else 0
        try:
            metas = obs.list(self._obstore_store(), prefix or None).collect()
        except Exception as exc:
            raise self._error(exc, "list", name_prefix or None) from None
        out = [
            ObjectInfo(m["path"][strip:], m["size"], m["e_tag"], m["version"], _unix(m.get("last_modified")))
            for m in metas
        ]
        return sorted(out, key=lambda info: info.name)

    def _op_delete(self, names: builtins.list[str]) -> None:
        import obstore as obs

        try:
            obs.delete(self._obstore_store(), [self._key(n) for n in names])
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._error(exc, "delete", names[0] if len(names) == 1 else None) from None

    def _op_download(self, name: str, path: str, start: int, size: int) -> int:
        import obstore as obs

        url = self.url_of(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            have = os.fstat(fd).st_size
            if have != start:
                raise ConfigError(f"download of {url}: {path} is {have} bytes, the resume offset is {start}")
            if start == size:
                return size
            os.lseek(fd, start, os.SEEK_SET)
            try:
                options: Any = {"range": {"offset": start}} if start else None
                result = obs.get(self._obstore_store(), self._key(name), options=options)
                total = result.meta["size"]
                if total != size:
                    raise IntegrityError(
                        f"{url}: the object is {total} bytes, the cache's manifest says {size} "
                        f"(truncated, grown or replaced in the store)"
                    )
                written = start
                for chunk in result.stream(min_chunk_size=STREAM_CHUNK_BYTES):
                    if written + len(chunk) > size:
                        raise IntegrityError(f"{url}: the body is longer than the object's {size} bytes")
                    _write_all(fd, chunk, path, url)
                    written += len(chunk)
            except (StorageError, IntegrityError, CacheIOError):
                raise
            except Exception as exc:
                raise self._error(exc, "get", name) from None
            if written != size:
                raise StorageUnreachableError(
                    f"get {url}: the body ended after {written} of {size} bytes",
                    url=url,
                    operation="get",
                )
            return written
        finally:
            os.close(fd)


def _write_all(fd: int, chunk: bytes, path: str, url: str) -> None:
    view = memoryview(chunk)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as exc:
            if exc.errno in (errno_codes.ENOSPC, errno_codes.EDQUOT):
                raise DiskFullError.from_os(exc, os.path.dirname(path), f"while downloading {url}") from None
            raise CacheIOError.from_os(exc, path, f"while downloading {url}") from None
        view = view[n:]


def _unix(when: Any) -> float | None:
    """A store's last-modified datetime as unix seconds (None when absent)."""
    return when.timestamp() if isinstance(when, datetime.datetime) else None


def _summary(text: str) -> str:
    """obstore's message without its debug dump and XML body, on one line."""
    head = text.split("\n\nDebug source", 1)[0]
    head = _BODY_RE.sub("", head)
    return " ".join(head.split())[:400]


def map_error(exc: BaseException, op: str, url: str, secrets: Iterable[str] = ()) -> Exception:
    """The typed error for obstore's `exc` during `op` on `url` (see the module docstring)."""
    text = str(exc)
    status_match = _STATUS_RE.search(text)
    status = int(status_match.group(1)) if status_match else None
    code_match = _CODE_RE.search(text)
    code = code_match.group(1) if code_match else None
    retries = _RETRIES_RE.search(text)
    parts = []
    if status is not None:
        parts.append(f"HTTP {status}" + (f" {code}" if code else ""))
    if retries:
        parts.append(f"after {retries.group(1)} retries")
    detail = redact(f"{'; '.join(parts)}{': ' if parts else ''}{_summary(text)}", secrets)
    name = type(exc).__name__
    kind: type[StorageError]
    if isinstance(exc, FileNotFoundError) or name == "NotFoundError":
        kind = ObjectNotFoundError
        what = "bucket not found" if code == "NoSuchBucket" else "object not found"
    elif name in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
        kind = StorageAccessError
        what = "not authenticated" if name == "UnauthenticatedError" or status == 401 else "access denied"
    elif name in ("AlreadyExistsError", "PreconditionError") and op == "put_if_absent":
        kind = ObjectExistsError
        what = "the object already exists (another writer created it first)"
    elif status is not None and (status >= 500 or status == 429):
        kind = StorageUnreachableError
        what = "the store kept failing"
    elif status is None and name == "GenericError":
        kind = StorageUnreachableError
        what = "the store is unreachable"
    else:
        kind = StorageError
        what = "failed"
    return kind(f"{op} {url}: {what} ({detail})", url=url, operation=op, status=status)
