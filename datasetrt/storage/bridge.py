"""The object-store helper process of a forked child: obstore operations run outside a forked runtime.

Boundary: moves `ObjectStore` operations and their results (or typed errors) over a pipe to a
helper process and back; knows no operation's meaning.

obstore's async runtime does not survive `fork()`: its threads are gone in the child, and a
request there hangs. `ObjectStore._call` sends every operation of a process forked after the
parent's first request here. The helper is started with exec (`python -c ...`), never by
multiprocessing (whose spawn would re-run the user's `__main__`), with the parent's `sys.path`
and environment, so it builds the same store from the pickled `ObjectStore` and keeps it (and its
connections) for later calls. One helper per process, started on first use; calls from threads
are serialised. The helper exits when the pipe closes (its parent exited, even by `os._exit` or
a signal) and is also asked to die with its parent (PR_SET_PDEATHSIG); an `atexit` hook closes
the pipe and reaps it on a normal exit. Frames are a u64 LE length + a pickle; the pickles carry
storage options and are never logged.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any, BinaryIO

from datasetrt.errors import StorageError
from datasetrt.storage.secrets import redact

_FRAME = struct.Struct("<Q")
_BOOT = "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); from datasetrt.storage.bridge import serve; serve()"
REAP_TIMEOUT_S = 10.0


def _write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_FRAME.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (length,) = _FRAME.unpack(head)
    payload = stream.read(length)
    if len(payload) < length:
        return None
    return payload


class _Helper:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, json.dumps(sys.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.process = process
        return process

    def call(self, store: Any, op: str, args: tuple[Any, ...]) -> Any:
        request = pickle.dumps((store, op, args), protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            process = self.process if self.process is not None and self.process.poll() is None else self._start()
            assert process.stdin is not None and process.stdout is not None
            try:
                _write_frame(process.stdin, request)  # type: ignore[arg-type]
                reply = _read_frame(process.stdout)  # type: ignore[arg-type]
            except OSError:
                reply = None
            if reply is None:
                self.close_locked()
                raise StorageError(
                    f"{op} {store.url}: the object-store helper process of this forked process exited",
                    url=store.url,
                    operation=op,
                )
        status, value = pickle.loads(reply)
        if status == "ok":
            return value
        raise value

    def close_locked(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            process.wait(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # inherited from a parent: its helper is the parent's to close
        with self.lock:
            self.close_locked()


_helper: _Helper | None = None
_helper_lock = threading.Lock()


def bridge_call(store: Any, op: str, args: tuple[Any, ...]) -> Any:
    """Run `store.run_local(op, args)` in this process's helper and return (or raise) its result."""
    global _helper
    with _helper_lock:
        if _helper is None or _helper.pid != os.getpid():
            _helper = _Helper()  # a helper inherited through fork belongs to the parent
            atexit.register(_helper.close)
        helper = _helper
    return helper.call(store, op, args)


def helper_pid() -> int | None:
    """pid of this process's helper, if one runs (for tests)."""
    helper = _helper
    if helper is None or helper.pid != os.getpid() or helper.process is None:
        return None
    return helper.process.pid


def serve() -> None:
    """The helper's main loop: one request at a time until the pipe closes."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    inbox = sys.stdin.buffer
    outbox = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing printed may corrupt the frames
    stores: dict[bytes, Any] = {}
    while True:
        frame = _read_frame(inbox)
        if frame is None:
            return
        store: Any = None
        try:
            store, op, args = pickle.loads(frame)
            state = pickle.dumps(store.__getstate__())
            store = stores.setdefault(state, store)
            reply: tuple[str, Any] = ("ok", store.run_local(op, args))
        except Exception as exc:
            if not _picklable(exc):
                exc = StorageError(redact(f"{type(exc).__name__}: {exc}", getattr(store, "_secrets", ())))
            reply = ("err", exc)
        _write_frame(outbox, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def _picklable(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return True
