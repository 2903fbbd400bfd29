"""A real S3 API server for tests and benchmarks: moto's server mode in a subprocess on loopback.

Boundary: starts, probes and stops the server process, and makes buckets over plain HTTP; it
installs nothing (moto[server] comes from the dev extra) and never patches a client in-process.

`MotoServer()` runs `python -m moto.server -H 127.0.0.1 -p 0`: the kernel picks a free port, which
the server prints and this class reads from its output, so there is no race for a port. The child
asks the kernel to SIGTERM it if the process that started it dies (PR_SET_PDEATHSIG), so a killed
test run leaves no server behind. `require_auth=True` starts it with IAM authentication enforced
from the first request (INITIAL_NO_AUTH_ACTION_COUNT=0): every request signed with keys moto did
not issue is refused with 403 InvalidAccessKeyId, a real "denied" from the server.

moto's behaviour this project relies on (moto 5.2, checked by tests/storage): PutObject and
CompleteMultipartUpload honour `If-None-Match: *` (412 PreconditionFailed when the key exists),
ranges are served with 206 / 416, and multipart uploads complete. Its conditional check and the
write are not one atomic step (a threaded server checks, then writes, without a lock), so two
racing create-only PUTs could both succeed against moto (not seen in 60 rounds of 8 racing
writers, but not excluded by its code); FaultProxy (serialize_creates=True, its default) makes
them atomic in front of it (see tests/servers/proxy.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

START_TIMEOUT_S = 60.0  # hang guard: moto imports Flask and its backends on start (1-3 s idle)
_RUNNING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")
# Inside the child: die with the parent, then run moto's server as `python -m moto.server` would.
_BOOT = (
    "import ctypes, runpy, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "  # PR_SET_PDEATHSIG
    "sys.argv = ['moto.server'] + sys.argv[1:]; "
    "runpy.run_module('moto.server', run_name='__main__', alter_sys=True)"
)

FAKE_ACCESS_KEY_ID = "AKIADATASETRTTEST01"
FAKE_SECRET_ACCESS_KEY = "dsrt-fake-secret-9f3c2b7e41d8a6"  # a value tests search messages for
REGION = "us-east-1"


class MotoServer:
    """One moto server process; `endpoint` is its http://127.0.0.1:PORT. `close()` stops it."""

    def __init__(self, *, require_auth: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        if require_auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self.output: list[str] = []
        self._port_found = threading.Event()
        self.port = 0
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, "-H", "127.0.0.1", "-p", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._drain, name="moto-output", daemon=True)
        self._reader.start()
        try:
            if not self._port_found.wait(START_TIMEOUT_S) or not self.port:
                raise RuntimeError("moto server did not start:\n" + "".join(self.output[-40:]))
            self._probe()
        except BaseException:
            self.close()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if len(self.output) < 1000:
                self.output.append(line)
            if not self.port and (m := _RUNNING.search(line)):
                self.port = int(m.group(1))
                self._port_found.set()
        self._port_found.set()  # exited: wake the waiter

    def _probe(self) -> None:
        """One request the server must answer (any HTTP status counts)."""
        try:
            urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=START_TIMEOUT_S).read()
        except urllib.error.HTTPError:
            pass

    def create_bucket(self, name: str) -> None:
        """Create `name` (unsigned PUT /name: moto without enforced auth accepts it)."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        urllib.request.urlopen(request, timeout=START_TIMEOUT_S).read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._reader.join(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def s3_options(endpoint: str, **extra: object) -> dict[str, object]:
    """storage_options for a test server: fake but non-empty credentials, plain HTTP allowed."""
    return {
        "endpoint": endpoint,
        "region": REGION,
        "access_key_id": FAKE_ACCESS_KEY_ID,
        "secret_access_key": FAKE_SECRET_ACCESS_KEY,
        "allow_http": True,
        **extra,
    }
