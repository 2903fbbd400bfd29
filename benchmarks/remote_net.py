"""The shaped network of the object-storage benchmark (benchmarks.remote): a network namespace made
for the run, joined to this one by a veth pair whose two ends rate-limit their egress with a
token bucket (`tc qdisc ... tbf`), so every byte a reader child receives from the servers crosses
a link of a known bandwidth.

Layout (names carry this process's pid, so parallel runs never share one):

    this namespace                               namespace drtbench-<pid> (the reader children)
    servers on HOST_IP:port  <- veth drb<pid>h ==== veth drb<pid>n -> clients reach HOST_IP
    tbf RATE on drb<pid>h (the downloads)         tbf RATE on drb<pid>n (the requests)

The servers (the counting proxy, the TLS front) listen on the host end's address; a reader child
enters the namespace (`enter()`, setns(2) before it starts any thread) and reaches them only over
the link. Latency is not added here (the kernel has no netem): the proxy holds each request's
first byte (benchmarks.remote_servers).

`ShapedLink.create(rate)` returns the link, or None with the reason it cannot be made (not root,
no `ip` / `tc`, a command refused); the caller then runs unshaped on loopback and says so.
`close()` deletes the namespace (the kernel removes the veth pair with it); it is idempotent and
`create` also removes the namespaces of earlier runs whose process no longer exists, so a killed
run leaves nothing behind past the next one.

Boundary: only namespaces and links this module names `drtbench-*` / `drb*`; no traffic leaves
the machine (the pair's /30 is not routed anywhere else). Nothing here measures speed.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

NS_PREFIX = "drtbench-"
CLONE_NEWNET = 0x40000000
BURST = "256kb"  # tbf bucket: a few 64 KiB GSO segments, so the rate holds for big writes too
QUEUE_LATENCY = "50ms"  # tbf: how long a packet may wait in the bucket's queue before it is dropped


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale() -> None:
    """Delete `drtbench-<pid>` namespaces whose process is gone (a killed earlier run)."""
    out = _run("ip", "netns", "list")
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{NS_PREFIX}(\d+)", name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "netns", "del", name)


@dataclass
class ShapedLink:
    """The namespace, the veth pair and its token buckets (see the module docstring)."""

    namespace: str
    host_dev: str
    ns_dev: str
    host_ip: str
    ns_ip: str
    rate: str
    closed: bool = False

    @property
    def ns_path(self) -> str:
        return f"/run/netns/{self.namespace}"

    @classmethod
    def create(cls, rate: str) -> tuple[ShapedLink | None, str]:
        """(link, "") or (None, why not)."""
        if os.geteuid() != 0:
            return None, "not root (network namespaces need CAP_NET_ADMIN)"
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                return None, f"no `{tool}` command"
        _sweep_stale()
        pid = os.getpid()
        octet = 16 + pid % 224
        sub = (pid // 224) % 64 * 4
        link = cls(
            namespace=f"{NS_PREFIX}{pid}",
            host_dev=f"drb{pid}h"[:15],
            ns_dev=f"drb{pid}n"[:15],
            host_ip=f"10.213.{octet}.{sub + 1}",
            ns_ip=f"10.213.{octet}.{sub + 2}",
            rate=rate,
        )
        steps = [
            ("ip", "netns", "add", link.namespace),
            ("ip", "link", "add", link.host_dev, "type", "veth", "peer", "name", link.ns_dev),
            ("ip", "link", "set", link.ns_dev, "netns", link.namespace),
            ("ip", "addr", "add", f"{link.host_ip}/30", "dev", link.host_dev),
            ("ip", "link", "set", link.host_dev, "up"),
            ("ip", "-n", link.namespace, "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_dev),
            ("ip", "-n", link.namespace, "link", "set", link.ns_dev, "up"),
            ("ip", "-n", link.namespace, "link", "set", "lo", "up"),
            *[
                (*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", BURST)
                + ("latency", QUEUE_LATENCY)
                for prefix, dev in ((("ip", "netns", "exec", link.namespace), link.ns_dev), ((), link.host_dev))
            ],
        ]
        for step in steps:
            out = _run(*step)
            if out.returncode != 0:
                link.close()
                return None, f"`{' '.join(step)}` failed: {out.stderr.strip()[:200]}"
        return link, ""

    def sent_bytes(self) -> int:
        """Bytes the host end's token bucket has sent into the namespace (the downloads, headers
        and TCP/TLS framing included)."""
        out = _run("tc", "-s", "qdisc", "show", "dev", self.host_dev)
        m = re.search(r"Sent (\d+) bytes", out.stdout)
        return int(m.group(1)) if m else 0

    def describe(self) -> str:
        return (
            f"veth {self.host_dev} ({self.host_ip}) <-> {self.ns_dev} ({self.ns_ip}) in netns {self.namespace}, "
            f"tbf rate {self.rate} burst {BURST} each way"
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _run("ip", "netns", "del", self.namespace)
        _run("ip", "link", "del", self.host_dev)  # gone with the namespace already, unless it never moved

    def __enter__(self) -> ShapedLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def enter(ns_path: str) -> int:
    """Move this process into the network namespace at `ns_path` (call before starting any
    thread: setns changes only the calling thread); returns the namespace's inode."""
    fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns_path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    return os.stat("/proc/self/ns/net").st_ino


def namespace_inode(ns_path: str) -> int:
    return os.stat(ns_path).st_ino
