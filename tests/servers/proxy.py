"""A fault-injecting HTTP proxy in front of an S3 API server, for tests and benchmarks.

Boundary: speaks plain HTTP/1.1 to clients and forwards to one upstream (moto's server); knows S3
only as far as path-style URLs (`/<bucket>/<key>?<query>`) go. It changes nothing it forwards
(the Host header included, so SigV4 signatures still match upstream) unless a rule says so.

Rules match a request by object key (an `fnmatch` pattern, `None` for any) and optionally method,
and each is used up after `times` matches (`times=None`: forever). They are applied in the order
they were added, first match wins:

- `fail(key, status=503, times=N)`: answer with `status` and an S3-style XML error body; the
  request never reaches upstream (so a failed PUT changes nothing).
- `delay(key, seconds)`: forward, then hold the response `seconds` before sending it.
- `cut(key, after_bytes=K)`: send the headers (the full Content-Length) and K body bytes, then
  close the connection (FIN, so the client receives exactly K bytes): a body cut short.
- `stall(key, after_bytes=K)`: send K body bytes, then wait until the returned `Stall` is released
  (or the proxy stops); `stall.reached` is set when the K bytes are out. After release the
  connection is cut, or, with `resume=True`, the rest of the body follows.
- `hold(key)`: forward, then hold the whole answer (status line included) until the returned
  `Stall` is released (or the proxy stops); `stall.reached` is set once upstream has answered.
  Any method (a HEAD or a PUT has no body to `stall` in): the request has taken effect upstream,
  the client just has not heard so yet.

Create-only PUTs (`If-None-Match: *`) of one key are forwarded one at a time
(`serialize_creates=True`, the default): moto checks the condition and then writes without a lock,
so two racing creates could both succeed against it, where S3 makes the check and the write one
step; the proxy restores S3's guarantee so tests see the client's behaviour, not moto's race.

Every request is recorded (`requests`, `count(...)`) when it arrives: method, bucket, key, query,
and the Range / If-None-Match headers, so tests can assert "one GET per shard" or "the retry was a
range request from byte N". `stop()` / `start()` take the proxy down and up on the same port
(refusing connections in between); `down()` / `up()` instead answer every connection with a
reset while counting them (`reset_connections`), so a test can wait until a client has retried
against a dead server before bringing it back. Every connection is shut down on stop, so no
handler thread outlives `close()`.
"""

from __future__ import annotations

import fnmatch
import http.client
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers", "transfer-encoding")
)
OWN_HEADERS = frozenset(("server", "date"))  # send_response writes its own
HANG_GUARD_S = 60.0  # a stall nobody releases ends after this; upstream requests time out after it too


@dataclass(frozen=True)
class RequestRecord:
    """One request as the proxy received it (before any rule was applied)."""

    method: str
    bucket: str
    key: str
    query: dict[str, str]
    range: str | None
    if_none_match: str | None


@dataclass
class Stall:
    """Handle of a `stall` rule: `reached` is set once the first K bytes of a matching response
    were sent; `release()` lets the held response end (cut, or resumed)."""

    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class _Rule:
    action: str  # "fail" | "delay" | "cut" | "stall" | "hold"
    key: str | None
    method: str | None
    times: int | None
    status: int = 503
    seconds: float = 0.0
    after_bytes: int = 0
    resume: bool = False
    stall: Stall | None = None

    def matches(self, method: str, key: str) -> bool:
        if self.method is not None and self.method != method:
            return False
        return self.key is None or fnmatch.fnmatchcase(key, self.key)


def _split_path(raw_path: str) -> tuple[str, str, dict[str, str]]:
    """(bucket, key, query) of a path-style S3 request target."""
    parts = urllib.parse.urlsplit(raw_path)
    path = urllib.parse.unquote(parts.path).lstrip("/")
    bucket, _, key = path.partition("/")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    return bucket, key, query


def _error_body(status: int) -> bytes:
    code = {500: "InternalError", 503: "SlowDown", 429: "SlowDown", 403: "AccessDenied", 401: "Unauthorized"}
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code.get(status, 'InjectedFault')}</Code>"
        f"<Message>injected by the test proxy</Message></Error>"
    ).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close(): no handler thread outlives the proxy
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, proxy: FaultProxy, port: int) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that went away mid-response (cut, killed, stopped) is part of the tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        proxy = self.server.proxy
        bucket, key, query = _split_path(self.path)
        record = RequestRecord(
            self.command, bucket, key, query, self.headers.get("Range"), self.headers.get("If-None-Match")
        )
        body = self._read_body()
        rule = proxy._take_rule(record)
        if rule is not None and rule.action == "fail":
            payload = b"" if self.command == "HEAD" else _error_body(rule.status)
            self.send_response(rule.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if record.if_none_match is not None and self.command in ("PUT", "POST") and proxy.serialize_creates:
            with proxy._create_lock(bucket, key):
                status, reason, headers, data = proxy._forward(self.command, self.path, self.headers, body)
        else:
            status, reason, headers, data = proxy._forward(self.command, self.path, self.headers, body)
        if rule is not None and rule.action == "delay":
            time.sleep(rule.seconds)  # the injected latency itself
        if rule is not None and rule.action == "hold":
            assert rule.stall is not None
            rule.stall.reached.set()
            proxy._wait_released(rule.stall)
        self.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP and name.lower() not in OWN_HEADERS:
                self.send_header(name, value)
        self.end_headers()
        if self.command == "HEAD" or not data:
            return
        if rule is not None and rule.action in ("cut", "stall"):
            head = data[: rule.after_bytes]
            self.wfile.write(head)
            self.wfile.flush()
            if rule.action == "stall":
                assert rule.stall is not None
                rule.stall.reached.set()
                proxy._wait_released(rule.stall)
                if rule.resume and not proxy._stopping.is_set():
                    self.wfile.write(data[len(head) :])
                    return
            self.close_connection = True
            try:  # FIN after exactly K bytes: the client sees a body shorter than Content-Length
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


def _reset(sock: socket.socket) -> None:
    """Close `sock` abruptly (RST), as a dying server would."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class FaultProxy:
    """See the module docstring. Use as a context manager or call `close()`."""

    def __init__(self, upstream: str, *, port: int = 0, serialize_creates: bool = True) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.serialize_creates = serialize_creates
        self._create_locks: dict[tuple[str, str], threading.Lock] = {}
        assert parts.hostname is not None and parts.port is not None, upstream
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self.requests: list[RequestRecord] = []
        self.reset_connections = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._resetter: socket.socket | None = None
        self._resetter_thread: threading.Thread | None = None
        self.port = port
        self.start()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again) on `port` and forward."""
        assert self._server is None and self._resetter is None, "already up"
        self._stopping.clear()
        self._server = _Server(self, self.port)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fault-proxy", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and cut every open connection: clients then get connection refused."""
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            with self._lock:
                connections = list(self._connections)
            for sock in connections:
                _reset(sock)
            server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        resetter, self._resetter = self._resetter, None
        if resetter is not None:
            try:
                resetter.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            resetter.close()
        if self._resetter_thread is not None:
            self._resetter_thread.join()
            self._resetter_thread = None

    def down(self) -> None:
        """Stop forwarding; every new connection is accepted and reset (counted)."""
        self.stop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._resetter = sock
        self._resetter_thread = threading.Thread(target=self._reset_loop, args=(sock,), daemon=True)
        self._resetter_thread.start()

    def up(self) -> None:
        """Back from `down()`: forward again on the same port."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reset_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self._lock:
                self.reset_connections += 1
            _reset(conn)
            conn.close()

    # -- rules ----------------------------------------------------------------------------------

    def _add(self, rule: _Rule) -> _Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def fail(self, key: str | None, *, status: int = 503, times: int | None = 1, method: str | None = None) -> None:
        self._add(_Rule("fail", key, method, times, status=status))

    def delay(self, key: str | None, seconds: float, *, times: int | None = 1, method: str | None = None) -> None:
        self._add(_Rule("delay", key, method, times, seconds=seconds))

    def cut(self, key: str | None, after_bytes: int, *, times: int | None = 1, method: str | None = "GET") -> None:
        self._add(_Rule("cut", key, method, times, after_bytes=after_bytes))

    def stall(
        self,
        key: str | None,
        after_bytes: int,
        *,
        times: int | None = 1,
        method: str | None = "GET",
        resume: bool = False,
    ) -> Stall:
        stall = Stall()
        self._add(_Rule("stall", key, method, times, after_bytes=after_bytes, resume=resume, stall=stall))
        return stall

    def hold(self, key: str | None, *, times: int | None = 1, method: str | None = None) -> Stall:
        stall = Stall()
        self._add(_Rule("hold", key, method, times, stall=stall))
        return stall

    def clear_rules(self) -> None:
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            if rule.stall is not None:
                rule.stall.release()

    def reset(self) -> None:
        """Forget rules and records."""
        self.clear_rules()
        with self._lock:
            self.requests.clear()
            self.reset_connections = 0

    def _take_rule(self, record: RequestRecord) -> _Rule | None:
        with self._lock:
            self.requests.append(record)
            for rule in self._rules:
                if rule.matches(record.method, record.key):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times == 0:
                            self._rules.remove(rule)
                    return rule
        return None

    def _wait_released(self, stall: Stall) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while not stall.released.wait(0.05):
            if self._stopping.is_set() or time.monotonic() > deadline:
                return

    # -- observation ----------------------------------------------------------------------------

    def matching(self, method: str | None = None, key: str | None = None) -> list[RequestRecord]:
        """Requests so far with this method and key (an fnmatch pattern); None matches any."""
        with self._lock:
            records = list(self.requests)
        return [
            r
            for r in records
            if (method is None or r.method == method) and (key is None or fnmatch.fnmatchcase(r.key, key))
        ]

    def count(self, method: str | None = None, key: str | None = None) -> int:
        return len(self.matching(method, key))

    # -- forwarding -----------------------------------------------------------------------------

    def _create_lock(self, bucket: str, key: str) -> threading.Lock:
        with self._lock:
            return self._create_locks.setdefault((bucket, key), threading.Lock())

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(sock)
            else:
                self._connections.discard(sock)

    def _forward(
        self, method: str, target: str, headers: http.client.HTTPMessage, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=HANG_GUARD_S)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            if body or method in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            response = conn.getresponse()
            data = response.read()
            out = [(k, v) for k, v in response.getheaders() if k.lower() != "content-length"]
            if method == "HEAD":
                length = response.getheader("Content-Length")
                if length is not None:
                    out.append(("Content-Length", length))
            else:
                out.append(("Content-Length", str(len(data))))
            return response.status, response.reason, out, data
        finally:
            conn.close()
