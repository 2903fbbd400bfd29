"""Retries: only what is retryable, within the budget's attempts; resumed bodies; a server down then up."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from datasetrt.errors import ObjectNotFoundError, StorageUnreachableError
from datasetrt.storage.objects import RetryPolicy
from tests.servers.proxy import FaultProxy
from tests.storage.conftest import DEADLINE_S, FAST, MiB, make_store, payload, wait_until

KEY = "caches/a/shards/000000.bin"
NAME = "shards/000000.bin"


@pytest.fixture
def stored(s3_proxy, bucket):
    data = payload(MiB, seed=7)
    store = make_store(s3_proxy, bucket)
    store.put(NAME, data)
    s3_proxy.reset()
    return store, data


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_answers_are_retried_within_the_attempts(s3_proxy, stored, status):
    store, data = stored
    s3_proxy.fail(KEY, status=status, times=FAST.attempts - 1, method="GET")
    assert store.get(NAME, max_bytes=len(data)) == data
    assert s3_proxy.count("GET", KEY) == FAST.attempts


@pytest.mark.parametrize("status", [503, 429])
def test_past_the_attempts_a_typed_unreachable_error(s3_proxy, stored, status):
    store, data = stored
    s3_proxy.fail(KEY, status=status, times=None, method="GET")
    with pytest.raises(StorageUnreachableError) as info:
        store.get(NAME, max_bytes=len(data))
    assert s3_proxy.count("GET", KEY) == FAST.attempts  # never more requests than the budget allows
    error = info.value
    assert isinstance(error, ConnectionError) and error.status == status and error.operation == "get"
    assert f"s3://{stored[0].location.bucket}/{KEY}" in str(error)
    assert f"after {FAST.attempts - 1} retries" in str(error)


def test_the_time_budget_stops_retries_before_the_attempts_run_out(s3_proxy, bucket):
    policy = RetryPolicy(attempts=1000, budget_s=0.2, initial_backoff_s=0.02, max_backoff_s=0.05)
    store = make_store(s3_proxy, bucket, retry=policy)
    s3_proxy.fail(None, status=503, times=None)
    with pytest.raises(StorageUnreachableError):
        store.head(NAME)
    assert 1 <= s3_proxy.count("HEAD") < policy.attempts


def test_puts_are_retried_and_a_failed_put_changes_nothing(s3_proxy, bucket):
    store = make_store(s3_proxy, bucket)
    s3_proxy.fail("caches/a/manifest.json", status=503, times=2, method="PUT")
    store.put_if_absent("manifest.json", b"{}")
    assert s3_proxy.count("PUT", "caches/a/manifest.json") == 3
    assert store.get("manifest.json", max_bytes=10) == b"{}"


def test_not_found_is_never_retried(s3_proxy, bucket):
    store = make_store(s3_proxy, bucket)
    with pytest.raises(ObjectNotFoundError):
        store.get("missing.bin", max_bytes=10)
    assert s3_proxy.count("GET") == 1


def test_connection_refused_is_unreachable_after_the_budget(moto_server, bucket):
    proxy = FaultProxy(moto_server.endpoint)
    proxy.stop()  # its port now refuses connections
    try:
        store = make_store(proxy, bucket)
        with pytest.raises(StorageUnreachableError, match="unreachable") as info:
            store.head(NAME)
        assert info.value.status is None and f"after {FAST.attempts - 1} retries" in str(info.value)
    finally:
        proxy.close()


def test_slow_answers_are_waited_for(s3_proxy, stored):
    store, data = stored
    s3_proxy.delay(KEY, 0.2, method="GET")
    assert store.get(NAME, max_bytes=len(data)) == data
    assert s3_proxy.count("GET", KEY) == 1


def test_a_body_cut_short_is_resumed_from_the_bytes_received(s3_proxy, stored, tmp_path):
    store, data = stored
    s3_proxy.cut(KEY, after_bytes=300_000)
    assert store.get(NAME, max_bytes=len(data)) == data
    assert [r.range for r in s3_proxy.matching("GET", KEY)] == [None, f"bytes=300000-{len(data) - 1}"]
    s3_proxy.reset()
    s3_proxy.cut(KEY, after_bytes=200_000, times=None)  # every answer cut: the attempts run out
    with pytest.raises(StorageUnreachableError):
        store.download(NAME, tmp_path / "partial", start=0, size=len(data))
    ranges = [r.range for r in s3_proxy.matching("GET", KEY)]
    assert len(ranges) == FAST.attempts and ranges[1] == f"bytes=200000-{len(data) - 1}"


def test_server_down_then_up_mid_download(s3_proxy, bucket, tmp_path):
    patient = RetryPolicy(attempts=500, budget_s=DEADLINE_S, initial_backoff_s=0.02, max_backoff_s=0.1)
    store = make_store(s3_proxy, bucket, retry=patient)
    data = payload(4 * MiB, seed=8)
    store.put(NAME, data)
    stall = s3_proxy.stall(KEY, after_bytes=1 * MiB)
    target = tmp_path / "partial"
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(store.download, NAME, target, start=0, size=len(data))
        assert stall.reached.wait(DEADLINE_S)
        s3_proxy.down()  # the stalled connection is reset; every new one too
        wait_until(lambda: s3_proxy.reset_connections >= 2, what="the client to retry against the dead server")
        s3_proxy.up()
        assert done.result(timeout=DEADLINE_S) == len(data)
    assert target.read_bytes() == data
    resumed = s3_proxy.matching("GET", KEY)[-1]
    assert resumed.range is not None and resumed.range.startswith("bytes=") and resumed.range != "bytes=0-"


def test_each_part_of_a_multipart_upload_is_retried_on_its_own(s3_proxy, bucket, tmp_path):
    store = make_store(s3_proxy, bucket)
    data = payload(11 * MiB, seed=9)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    s3_proxy.fail(KEY, status=503, times=FAST.attempts - 1, method="PUT")  # spread over parts, none past its budget
    store.put(NAME, path, part_bytes=5 * MiB)
    parts = s3_proxy.matching("PUT", KEY)
    assert len(parts) == 3 + FAST.attempts - 1  # three parts plus one retry per injected failure
    assert store.get(NAME, max_bytes=len(data)) == data
