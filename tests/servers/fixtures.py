"""pytest fixtures for tests against a real S3 API server: import them into a conftest.py.

Boundary: starts and stops servers and proxies, makes buckets and storage options; asserts nothing.

- `moto_server` (session): one moto server for the whole run (tests/servers/moto.py).
- `moto_auth_server` (session, started on first use): a second one that enforces IAM auth, so
  fake keys are really refused (403).
- `s3_proxy` (function): a FaultProxy in front of `moto_server`, its rules and counts fresh.
- `bucket` (function): a new, uniquely named bucket on `moto_server`.
- `s3_env` (function, autouse where imported): the AWS_* / GOOGLE_* / AZURE_* variables of the
  developer's shell are removed, so nothing reaches a real account or a metadata endpoint.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.servers.moto import MotoServer, s3_options
from tests.servers.proxy import FaultProxy

_bucket_numbers = itertools.count()
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "OBJECT_STORE_")


@pytest.fixture(scope="session")
def moto_server():
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def moto_auth_server():
    with MotoServer(require_auth=True) as server:
        yield server


@pytest.fixture
def s3_proxy(moto_server):
    with FaultProxy(moto_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def bucket(moto_server) -> str:
    name = f"dsrt-{os.getpid()}-{next(_bucket_numbers)}"
    moto_server.create_bucket(name)
    return name


@pytest.fixture(autouse=True)
def s3_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES):
            monkeypatch.delenv(name)
    # obstore looks for instance credentials when it has none; never let it reach for them.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def proxy_options(proxy: FaultProxy, **extra: object) -> dict[str, object]:
    """storage_options that reach moto through `proxy` with the fake credentials."""
    return s3_options(proxy.endpoint, **extra)
