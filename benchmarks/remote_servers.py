"""The servers of the object-storage benchmark (benchmarks.remote): moto's S3 server behind the
tests' FaultProxy, which here also counts every response's bytes with its arrival time, and an
optional TLS front (a throw-away CA made at run time) for clients that only speak HTTPS.

Chain of one request: client -> [TLSFront, https] -> CountingProxy (http, counts) -> moto.
Every contender goes through the same CountingProxy, so "bytes fetched" and "requests" are
measured at one place, outside the client. Both listen on `host` (loopback, or the host end of
the benchmark's shaped link, benchmarks.remote_net); the proxy holds every request `latency_s`
before forwarding it (a first-byte latency per request, concurrent requests each held their own).

Boundary: starts and stops servers on loopback (or the shaped link's address) and makes
certificates in a temporary directory;
imports no library under test (the proxy and moto come from tests/servers, the CA from the
`cryptography` package). Nothing here measures speed.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.servers.proxy import FaultProxy, _Handler, _Server


@dataclass(frozen=True)
class Served:
    """One response the proxy sent: when the request arrived (time.time()), what it was, and the
    body bytes forwarded (0 for HEAD)."""

    at: float
    method: str
    key: str
    range: str | None
    status: int
    nbytes: int
    done: float = 0.0  # when the upstream answer was complete (time.time())


class _HostServer(_Server):
    """The FaultProxy's server, listening on `host` rather than 127.0.0.1."""

    def __init__(self, proxy: FaultProxy, port: int, host: str) -> None:
        self.proxy = proxy
        ThreadingHTTPServer.__init__(self, (host, port), _Handler)


class CountingProxy(FaultProxy):
    """FaultProxy on `host` that also records `served` (one `Served` per forwarded request) and
    holds each request `latency_s` before forwarding it."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", latency_s: float = 0.0, **kwargs) -> None:
        self.served: list[Served] = []
        self._served_lock = threading.Lock()
        self.host = host
        self.latency_s = latency_s
        super().__init__(upstream, **kwargs)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """FaultProxy.start on `host`."""
        assert self._server is None and self._resetter is None, "already up"
        self._stopping.clear()
        self._server = _HostServer(self, self.port, self.host)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fault-proxy", daemon=True
        )
        self._thread.start()

    def _forward(self, method, target, headers, body):
        at = time.time()
        if self.latency_s > 0:
            time.sleep(self.latency_s)  # the injected first-byte latency of this request
        status, reason, out, data = super()._forward(method, target, headers, body)
        from tests.servers.proxy import _split_path

        _bucket, key, _query = _split_path(target)
        nbytes = len(data) if method != "HEAD" else 0
        rec = Served(at, method, key, headers.get("Range"), status, nbytes, time.time())
        with self._served_lock:
            self.served.append(rec)
        return status, reason, out, data

    def forget(self) -> None:
        """Drop the records and rules (between contenders)."""
        self.reset()
        with self._served_lock:
            self.served.clear()

    def between(self, t0: float, t1: float, key_prefix: str = "") -> list[Served]:
        """Responses to requests that arrived in [t0, t1) for keys under `key_prefix`."""
        with self._served_lock:
            return [s for s in self.served if t0 <= s.at < t1 and s.key.startswith(key_prefix)]


def summarize(served: list[Served]) -> dict:
    """Requests, GETs, body bytes, and how often each object was fetched whole or in part."""
    gets = [s for s in served if s.method == "GET"]
    per_key: dict[str, int] = {}
    for s in gets:
        per_key[s.key] = per_key.get(s.key, 0) + 1
    return {
        "requests": len(served),
        "gets": len(gets),
        "ranged_gets": sum(1 for s in gets if s.range),
        "heads": sum(1 for s in served if s.method == "HEAD"),
        "lists": sum(1 for s in gets if s.key == "" or s.key.endswith("/")),
        "errors": sum(1 for s in served if s.status >= 400),
        "bytes": sum(s.nbytes for s in served),
        "max_gets_per_object": max(per_key.values(), default=0),
        "refetched": sorted(k for k, n in per_key.items() if n > 1),
        "peak_gets_in_flight": _peak([(s.at, s.done) for s in gets]),
        "objects": len(per_key),
    }


def _peak(spans: list[tuple[float, float]]) -> int:
    """Most spans open at once (a span: a GET from its arrival to its upstream answer)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


# ---------------------------------------------------------------------------- TLS


def make_ca(directory: Path, hosts: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 / localhost (and the IP addresses
    `hosts`) signed by it, written to `directory`: (ca.pem, server.pem, server.key). EC P-256
    keys, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "datasetrt benchmark CA (throw-away)")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(h)) for h in ("127.0.0.1", *hosts)] + [x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem, cert_pem, key_pem = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_pem, cert_pem, key_pem


class TLSFront:
    """Terminates TLS on `host`:`port` (0: the kernel picks) and relays each connection's
    plaintext to `upstream_host`:`upstream_port`, byte for byte (two threads per connection).
    `endpoint` is https://HOST:PORT. `close()` stops listening and cuts every connection."""

    def __init__(
        self,
        upstream_port: int,
        cert: Path,
        key: Path,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        upstream_host: str = "127.0.0.1",
    ) -> None:
        self.upstream_port = upstream_port
        self.upstream_host = upstream_host
        self.host = host
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(str(cert), str(key))
        self.ctx.set_alpn_protocols(["http/1.1"])  # never h2: the proxy behind speaks HTTP/1.1
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tls-front", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"https://{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(60)
            conn = self.ctx.wrap_socket(raw, server_side=True)
            conn.settimeout(None)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        try:
            up = socket.create_connection((self.upstream_host, self.upstream_port))
        except OSError:
            conn.close()
            return
        for s in (conn, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._conns.update((conn, up))
        t = threading.Thread(target=self._pipe, args=(up, conn), daemon=True)
        t.start()
        self._pipe(conn, up)
        t.join()
        with self._lock:
            self._conns.difference_update((conn, up))
        for s in (conn, up):
            try:
                s.close()
            except OSError:
                pass

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 18)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ssl.SSLError):
            pass
        # Either side done ends the connection both ways (plain socket shutdown, below the TLS
        # layer, so the other direction's blocked recv returns at once).
        for s in (src, dst):
            try:
                socket.socket.shutdown(s, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)

    def __enter__(self) -> TLSFront:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
