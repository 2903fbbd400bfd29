"""The one exception tree of datasetrt.

Boundary: imports nothing from the package. Each class also subclasses the builtin that dataset-rt
0.4.8 raises for the same case, so `except ValueError` / `except RuntimeError` / `except IndexError`
/ `except TypeError` written against dataset-rt keep working. Messages start with (or contain) the
reference wording and add the offending path, column or value.
"""

from __future__ import annotations


class DatasetRTError(Exception):
    """Base class of every error datasetrt raises on purpose."""


# --- configuration and arguments -------------------------------------------------------------


class ConfigError(DatasetRTError, ValueError):
    """A configuration value or argument is invalid (dataset-rt: ValueError)."""


class ArgumentTypeError(DatasetRTError, TypeError):
    """An argument has the wrong type (dataset-rt: TypeError)."""


class ArgumentOverflowError(DatasetRTError, OverflowError):
    """An integer argument is outside its range, e.g. a seed outside u64 (dataset-rt: OverflowError)."""


class SampleIndexError(DatasetRTError, IndexError):
    """A (cache_id, sample_id) lookup is out of range (dataset-rt: IndexError)."""


# --- caches on disk ----------------------------------------------------------------------------


class CacheFormatError(DatasetRTError, ValueError):
    """A cache breaks the format contract: shapes, lengths, schema, records (dataset-rt: ValueError)."""


class MissingManifestError(CacheFormatError):
    """The directory has no manifest.json, so it is not a published cache."""


class ManifestJSONError(DatasetRTError, RuntimeError):
    """manifest.json is not valid JSON or misses/mistypes a field (dataset-rt: RuntimeError "JSON error: ...")."""


class RecordJSONError(DatasetRTError, RuntimeError):
    """A record's embedded metadata JSON cannot be parsed (dataset-rt: RuntimeError "JSON error: ...")."""


class ArrowFormatError(DatasetRTError, RuntimeError):
    """metadata.arrow cannot be decoded as an Arrow IPC file (dataset-rt: RuntimeError "Arrow error: ...")."""


class IntegrityError(CacheFormatError):
    """Bytes on disk do not match a recorded checksum: file sha256 or per-record XXH3-64."""


class CacheIOError(DatasetRTError, RuntimeError):
    """An operating-system error while reading or writing a cache (dataset-rt: RuntimeError "I/O error: ...").

    `errno` is the OS error number when the error came from the OS (None otherwise: a short read,
    an offset out of bounds) and `path` the file or directory it concerns; code that must react
    to a kind of failure (EMFILE, ENOSPC) reads `errno`, never the message. Build one from an
    `OSError` with `from_os`, the one place the "I/O error: ... (os error N): path" text is made."""

    def __init__(self, message: str, *, errno: int | None = None, path: object = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.path = None if path is None else str(path)

    def __reduce__(self):  # keep errno and path through pickling (and so across processes)
        return _rebuild_io_error, (type(self), str(self), self.errno, self.path)

    @classmethod
    def from_os(cls, exc: OSError | int, path: object, detail: str | None = None) -> CacheIOError:
        """The error for `exc` (an `OSError`, or a bare errno) on `path`:
        "I/O error: <strerror> (os error <errno>): <path>[: <detail>]"."""
        number = exc if isinstance(exc, int) else exc.errno
        message = f"I/O error: {os_error_text(exc)}: {path}" + (f": {detail}" if detail else "")
        return cls(message, errno=number, path=path)


def os_error_text(exc: OSError | int) -> str:
    """ "<strerror> (os error <errno>)" for an `OSError` or a bare errno, as dataset-rt words OS
    errors (the text of `CacheIOError.from_os`, and of write results that report one)."""
    import os

    if isinstance(exc, int):
        return f"{os.strerror(exc)} (os error {exc})"
    if exc.errno is None:
        return str(exc)
    return f"{exc.strerror or os.strerror(exc.errno)} (os error {exc.errno})"


def _rebuild_io_error(cls: type, message: str, errno: int | None, path: str | None) -> CacheIOError:
    return cls(message, errno=errno, path=path)


# --- metadata table ----------------------------------------------------------------------------


class MetadataValidationError(DatasetRTError, ValueError):
    """update_metadata got a table that breaks a rule of the samples-metadata contract."""


# --- sampling plans ----------------------------------------------------------------------------


class SamplingConfigError(ConfigError):
    """A sampling mode, stream, mixture or curriculum is invalid: proportions that do not sum to 1,
    negative values, stage lengths off batch boundaries, overlapping streams."""


class UnknownStreamError(SamplingConfigError):
    """A proportion, cache or column names a stream, cache or column that does not exist."""


class EmptyStreamError(SamplingConfigError):
    """A stream selects no active row."""


class RepeatCountError(SamplingConfigError):
    """An exactly-once order got a weight that is not a positive integer (weights are repeat counts)."""


class SamplingStateError(ConfigError):
    """A sampling state belongs to another plan (streams, proportions, stages, seed or rows differ)
    or is inconsistent, or `advance()` has no next stage to move to."""


class PackingError(ConfigError):
    """Sequence packing refused a document (longer than a row with overlong='error'), or a packing
    state belongs to another packing (row shape, mode, order, rank) or is inconsistent."""


class PlanRangeError(DatasetRTError, IndexError):
    """Plan positions past the end of a finite plan (a stopped mixture or a finished curriculum)."""


# --- writing -----------------------------------------------------------------------------------


class SourceError(DatasetRTError, ValueError):
    """A CacheSource yielded something the writer refuses; reported as a CacheWriteError value."""


class SourceInputError(SourceError):
    """A `datasetrt.sources` adapter met input it cannot turn into CacheInput: a missing column, a
    null payload, nested or unsupported metadata, a value that does not fit. The message names the
    file (or dataset), the row group / record batch and row, the column and its type."""


class PayloadSpecMismatchError(ConfigError):
    """A write's payload types disagree: a source's `payload_spec` differs from
    `WriterConfig.payload_spec`, or (the writer config giving none) from another source's of the
    same write. Raised before anything is written; the message names the source(s) and both specs."""


class DuplicateSourceError(DatasetRTError, ValueError):
    """Two sources in one write call map to the same cache path."""


class CodecError(DatasetRTError, RuntimeError):
    """A codec library failed to encode a payload it had accepted (a library fault, not bad input)."""


# --- resources ---------------------------------------------------------------------------------


class ResourceLimitError(DatasetRTError, MemoryError):
    """A configuration or record would exceed the memory limit (dataset-rt has no equivalent)."""


class MetadataTypeError(DatasetRTError, TypeError, AttributeError):
    """update_metadata got something that is not a polars.DataFrame (dataset-rt: AttributeError)."""


# --- installation ------------------------------------------------------------------------------


class MissingExtraError(DatasetRTError, ImportError):
    """An optional feature's packages are not installed. The message names the feature and ends with
    the command that installs its extra (pyproject.toml: torch, ray, hf, bench), e.g.
    "... requires PyTorch to be installed: pip install 'datasetrt[torch]'"."""


# --- worker processes --------------------------------------------------------------------------


class WorkerError(DatasetRTError, RuntimeError):
    """A reader worker process failed; the message names the worker, the traceback is attached."""


class WorkerCrashedError(WorkerError):
    """A reader worker process exited or was killed (exit code or signal in the message).

    `worker` is the worker's index (None for the process that forks them); `shards` the shard
    files the worker's unfinished tasks were reading, when the run knows them, a file found
    shorter than its manifest says first (and named in the message): a worker reading a mapped
    shard dies of SIGBUS when the file is truncated under it."""

    def __init__(self, message: str, *, worker: int | None = None, shards: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.worker = worker
        self.shards = shards


class WorkerTimeoutError(WorkerError):
    """Reader workers made no progress within the configured timeout."""


# --- PyTorch integration -----------------------------------------------------------------------


class BatchReleasedError(DatasetRTError, ValueError):
    """A `SampleBatch` used after `release()` (or the end of its `with` block), like I/O on a
    closed file."""


class LoaderStateError(DatasetRTError, RuntimeError):
    """A torch-side operation at the wrong time or place: load_state_dict after iteration began,
    state_dict away from the owning process, a loader built inside a DataLoader worker."""


# --- object storage and the node-local shard cache ----------------------------------------------


class StorageError(DatasetRTError, RuntimeError):
    """An object-store operation failed. `url` is the object's (or prefix's) URL, `operation` the
    operation ("get", "put", "head", ...), `status` the HTTP status when the store answered one.
    The message names the operation and the URL; it never holds a credential."""

    def __init__(
        self, message: str, *, url: str | None = None, operation: str | None = None, status: int | None = None
    ):
        super().__init__(message)
        self.url = url
        self.operation = operation
        self.status = status

    def __reduce__(self):  # keep the fields through pickling (and so across processes)
        return _rebuild_storage_error, (type(self), str(self), self.url, self.operation, self.status)


def _rebuild_storage_error(
    cls: type, message: str, url: str | None, operation: str | None, status: int | None
) -> StorageError:
    return cls(message, url=url, operation=operation, status=status)


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or its bucket) does not exist."""


class StorageAccessError(StorageError, PermissionError):
    """The store refused the credentials (unauthenticated) or the operation (denied)."""


class StorageUnreachableError(StorageError, ConnectionError):
    """The store could not be reached or kept failing: connection refused or reset, timeouts,
    5xx or throttling answers, bodies cut short, until the retry budget ran out."""


class ObjectExistsError(StorageError, FileExistsError):
    """A create-only put found the object already there: another writer published first."""


class ObjectSizeError(StorageError):
    """An object is larger than the read allows (a bounded read refused it before reading it all)."""


class DiskLimitError(ResourceLimitError):
    """The node-local shard cache cannot hold an object within its configured byte limit, even after
    evicting every file nobody holds. `limit_bytes` and `need_bytes` say by how much."""

    def __init__(self, message: str, *, limit_bytes: int | None = None, need_bytes: int | None = None):
        super().__init__(message)
        self.limit_bytes = limit_bytes
        self.need_bytes = need_bytes

    def __reduce__(self):
        return _rebuild_disk_limit_error, (type(self), str(self), self.limit_bytes, self.need_bytes)


def _rebuild_disk_limit_error(
    cls: type, message: str, limit_bytes: int | None, need_bytes: int | None
) -> DiskLimitError:
    return cls(message, limit_bytes=limit_bytes, need_bytes=need_bytes)


class DiskFullError(CacheIOError):
    """The file system of the node-local shard cache ran out of space (ENOSPC); `path` is the cache
    directory and `errno` is ENOSPC."""
