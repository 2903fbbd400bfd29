"""runtime/protocol.py TaskFailed across the process boundary: what a worker reports (worker.py
`_report`) survives pickling and is re-raised by the parent (run.py) as the same error class
with the same message, a CacheIOError keeps its errno and path, a StorageError its URL, operation
and status."""

from __future__ import annotations

import errno
import pickle

import pytest

from datasetrt.errors import CacheIOError, IntegrityError, StorageUnreachableError, WorkerError
from datasetrt.runtime.protocol import TaskFailed
from datasetrt.runtime.run import ParallelRun
from datasetrt.runtime.worker import _report


class _Conn:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


def _crossed(exc: BaseException) -> TaskFailed:
    """`exc` as the parent receives it from a worker."""
    conn = _Conn()
    try:
        raise exc
    except BaseException as raised:
        _report(conn, 1, 7, 3, raised)
    [data] = conn.sent
    return pickle.loads(data)


def test_an_io_error_keeps_its_errno_and_path_across_processes():
    msg = _crossed(CacheIOError.from_os(errno.EMFILE, "/c/shards/000000.bin", "c sample 4"))
    assert (msg.worker, msg.run_id, msg.task_id) == (1, 7, 3)
    assert (msg.io_errno, msg.io_path) == (errno.EMFILE, "/c/shards/000000.bin")
    with pytest.raises(CacheIOError) as info:
        ParallelRun._raise_failure(msg)
    assert str(info.value) == str(CacheIOError.from_os(errno.EMFILE, "/c/shards/000000.bin", "c sample 4"))
    assert (info.value.errno, info.value.path) == (errno.EMFILE, "/c/shards/000000.bin")
    assert isinstance(info.value.__cause__, WorkerError) and "traceback" in str(info.value.__cause__)


def test_other_errors_carry_no_io_fields_and_keep_their_class():
    msg = _crossed(IntegrityError("record checksum mismatch for c sample 2"))
    assert (msg.io_errno, msg.io_path) == (None, None)
    with pytest.raises(IntegrityError, match="record checksum mismatch for c sample 2"):
        ParallelRun._raise_failure(msg)
    msg = _crossed(CacheIOError("I/O error: failed to fill whole buffer"))
    assert (msg.io_errno, msg.io_path) == (None, None)
    with pytest.raises(CacheIOError) as info:
        ParallelRun._raise_failure(msg)
    assert info.value.errno is None


def test_a_storage_error_keeps_its_url_operation_and_status_across_processes():
    url = "s3://b/caches/a/shards/000001.bin"
    msg = _crossed(StorageUnreachableError(f"get {url}: status 503", url=url, operation="get", status=503))
    assert (msg.store_url, msg.store_operation, msg.store_status) == (url, "get", 503)
    assert (msg.io_errno, msg.io_path) == (None, None)
    with pytest.raises(StorageUnreachableError) as info:
        ParallelRun._raise_failure(msg)
    assert (info.value.url, info.value.operation, info.value.status) == (url, "get", 503)
    assert isinstance(info.value, ConnectionError)  # still the builtin users catch
