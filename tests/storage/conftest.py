"""Storage tests run against moto's real S3 server (started once per session) through a
fault-injecting proxy (one per test); see tests/servers/.

Waiting for an external event (a process reaching a point, a file growing) is a bounded poll
with a deadline; nothing sleeps to synchronise and nothing asserts on timing. Retry budgets are
short in backoff (milliseconds) but generous in attempts, so a busy machine changes nothing.
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from datasetrt.storage.objects import ObjectStore, RetryPolicy
from datasetrt.storage.urls import parse_remote
from tests.servers.fixtures import *  # noqa: F403  (moto_server, moto_auth_server, s3_proxy, bucket, s3_env)
from tests.servers.fixtures import proxy_options

FAST = RetryPolicy(attempts=4, budget_s=60.0, initial_backoff_s=0.005, max_backoff_s=0.02)
DEADLINE_S = 60.0  # hang guard of every bounded wait here
# threads of the test's own servers (the proxy restarted by down()/up(), and its request threads
# that serve a client's idle keep-alive connections): not the code under test
SERVER_THREADS = ("fault-proxy", "(process_request_thread)")
MiB = 1 << 20


def make_store(
    proxy, bucket_name: str, prefix: str = "caches/a", *, retry: RetryPolicy = FAST, **options
) -> ObjectStore:
    return ObjectStore(parse_remote(f"s3://{bucket_name}/{prefix}"), proxy_options(proxy, **options), retry=retry)


def wait_until(predicate, timeout_s: float = DEADLINE_S, what: str = "condition"):
    """Bounded poll for an external event; returns the predicate's truthy value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.005)  # poll interval of an external event, not synchronisation


def payload(size: int, seed: int = 0) -> bytes:
    """`size` deterministic, incompressible-looking bytes."""
    import hashlib

    block = hashlib.sha256(f"seed-{seed}".encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def no_leaks(moto_server):
    """Fails the test if it leaves a child process (other than the session's servers) or a Python
    thread behind."""
    me = psutil.Process()
    servers = {c.pid for c in me.children(recursive=True)}
    threads = {t.ident for t in threading.enumerate()}
    yield
    extra = wait_until_settled(me, servers, threads)
    assert not extra, extra


def wait_until_settled(me, servers, threads, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        kids = {c.pid for c in me.children(recursive=True) if c.pid not in servers and _alive(c) and not _tracker(c)}
        extra_threads = [
            t.name
            for t in threading.enumerate()
            if t.ident not in threads and t.is_alive() and not any(n in t.name for n in SERVER_THREADS)
        ]
        if not kids and not extra_threads:
            return None
        if time.monotonic() > deadline:
            return {"children": kids, "threads": extra_threads}
        time.sleep(0.01)  # poll: processes and threads we stopped are finishing


def _tracker(proc) -> bool:
    """multiprocessing's resource tracker: one per session, started by the first Queue/Barrier."""
    try:
        return "resource_tracker" in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return True


def _alive(proc) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
