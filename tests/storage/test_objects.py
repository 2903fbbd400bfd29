"""storage/objects.py against moto's S3 server: round trips, multipart, ranges, listings, typed errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from datasetrt.errors import (
    ConfigError,
    IntegrityError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectSizeError,
    StorageAccessError,
    StorageError,
)
from datasetrt.storage.objects import ObjectStore, RetryPolicy
from datasetrt.storage.urls import parse_remote
from tests.servers.moto import s3_options
from tests.storage.conftest import FAST, MiB, make_store, payload


def test_small_round_trip_head_list_delete(s3_proxy, bucket):
    store = make_store(s3_proxy, bucket)
    info = store.put("manifest.json", b'{"a": 1}')
    assert info.etag
    assert store.get("manifest.json", max_bytes=100) == b'{"a": 1}'
    head = store.head("manifest.json")
    assert (head.name, head.size, head.etag) == ("manifest.json", 8, info.etag)
    store.put("shards/000000.bin", b"x" * 10)
    store.put("shards/000001.bin", bytearray(b"y" * 3))
    make_store(s3_proxy, bucket, "caches/ab").put("manifest.json", b"other cache")  # a sibling prefix
    assert [o.name for o in store.list()] == ["manifest.json", "shards/000000.bin", "shards/000001.bin"]
    assert [(o.name, o.size) for o in store.list("shards")] == [("shards/000000.bin", 10), ("shards/000001.bin", 3)]
    store.delete(["shards/000000.bin", "never-existed.bin"])
    assert [o.name for o in store.list("shards")] == ["shards/000001.bin"]
    keys = {(r.method, r.key) for r in s3_proxy.requests}
    assert ("PUT", "caches/a/manifest.json") in keys  # keys are the prefix joined with the name


def test_bucket_root_location(s3_proxy, bucket):
    store = ObjectStore(parse_remote(f"s3://{bucket}"), s3_options(s3_proxy.endpoint), retry=FAST)
    store.put("manifest.json", b"{}")
    assert [o.name for o in store.list()] == ["manifest.json"]
    assert s3_proxy.count("PUT", "manifest.json") == 1


def test_large_put_is_multipart_streamed_from_a_file(s3_proxy, bucket, tmp_path):
    data = payload(13 * MiB, seed=1)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    store = make_store(s3_proxy, bucket)
    store.put("shards/000000.bin", path, part_bytes=5 * MiB)
    parts = s3_proxy.matching("PUT", "caches/a/shards/000000.bin")
    assert len(parts) == 3 and all("partNumber" in r.query for r in parts)
    posts = s3_proxy.matching("POST", "caches/a/shards/000000.bin")
    assert [sorted(r.query) for r in posts] == [["uploads"], ["uploadId"]]
    assert store.head("shards/000000.bin").size == len(data)
    assert store.get("shards/000000.bin", max_bytes=len(data)) == data
    small = tmp_path / "small.bin"
    small.write_bytes(b"s" * 1000)
    s3_proxy.reset()
    store.put("small.bin", small)  # under the threshold: one plain PUT
    assert [r.query for r in s3_proxy.matching("PUT")] == [{}]
    with pytest.raises(ConfigError, match="5 MiB"):
        store.put("x", b"x", part_bytes=1 * MiB)


def test_ranges(s3_proxy, bucket):
    data = payload(100_000, seed=2)
    store = make_store(s3_proxy, bucket)
    store.put("shards/000000.bin", data)
    assert store.get_range("shards/000000.bin", 0, 1) == data[:1]
    assert store.get_range("shards/000000.bin", 4096, 70_000) == data[4096:70_000]
    assert s3_proxy.matching("GET")[-1].range == "bytes=4096-69999"
    with pytest.raises(StorageError, match="ends at 100000"):
        store.get_range("shards/000000.bin", 99_990, 100_010)
    with pytest.raises(StorageError, match="HTTP 416"):
        store.get_range("shards/000000.bin", 200_000, 200_010)
    with pytest.raises(ConfigError):
        store.get_range("shards/000000.bin", 5, 5)


def test_bounded_get_refuses_a_larger_object_without_reading_it(s3_proxy, bucket):
    store = make_store(s3_proxy, bucket)
    store.put("metadata.arrow", payload(3 * MiB))
    with pytest.raises(ObjectSizeError, match="3145728 bytes, more than the 1024") as info:
        store.get("metadata.arrow", max_bytes=1024)
    assert info.value.url == f"s3://{bucket}/caches/a/metadata.arrow" and info.value.operation == "get"


def test_not_found_names_the_object_and_is_a_file_not_found(s3_proxy, bucket):
    store = make_store(s3_proxy, bucket)
    for call in (lambda: store.get("manifest.json", max_bytes=10), lambda: store.head("manifest.json")):
        with pytest.raises(ObjectNotFoundError) as info:
            call()
        assert isinstance(info.value, FileNotFoundError)
        assert f"s3://{bucket}/caches/a/manifest.json" in str(info.value) and "not found" in str(info.value)
    assert s3_proxy.count("GET") == 1 and s3_proxy.count("HEAD") == 1  # a 404 is not retried
    missing = make_store(s3_proxy, "no-such-bucket-here")
    with pytest.raises(ObjectNotFoundError, match="bucket not found"):
        missing.get("manifest.json", max_bytes=10)


def test_create_only_put(s3_proxy, bucket):
    store = make_store(s3_proxy, bucket)
    store.put_if_absent("manifest.json", b"first")
    with pytest.raises(ObjectExistsError) as info:
        store.put_if_absent("manifest.json", b"second")
    assert isinstance(info.value, FileExistsError) and "manifest.json" in str(info.value)
    assert store.get("manifest.json", max_bytes=100) == b"first"
    assert [r.if_none_match for r in s3_proxy.matching("PUT")] == ["*", "*"]


def test_denied_by_a_server_that_checks_credentials(moto_auth_server, bucket):
    store = ObjectStore(parse_remote(f"s3://{bucket}/caches/a"), s3_options(moto_auth_server.endpoint), retry=FAST)
    for call in (lambda: store.get("manifest.json", max_bytes=10), lambda: store.put("x.bin", b"x")):
        with pytest.raises(StorageAccessError) as info:
            call()
        assert isinstance(info.value, PermissionError) and info.value.status == 403
        assert "access denied" in str(info.value) and "InvalidAccessKeyId" in str(info.value)


@pytest.mark.parametrize(("status", "what"), [(403, "access denied"), (401, "not authenticated")])
def test_denied_and_unauthenticated_are_not_retried(s3_proxy, bucket, status, what):
    store = make_store(s3_proxy, bucket)
    store.put("manifest.json", b"{}")
    s3_proxy.fail("caches/a/manifest.json", status=status, times=None, method="GET")
    with pytest.raises(StorageAccessError, match=what):
        store.get("manifest.json", max_bytes=10)
    assert s3_proxy.count("GET", "caches/a/manifest.json") == 1


def test_download_appends_and_checks_the_size(s3_proxy, bucket, tmp_path):
    data = payload(2 * MiB + 17, seed=3)
    store = make_store(s3_proxy, bucket)
    store.put("shards/000000.bin", data)
    path = tmp_path / "part"
    path.write_bytes(data[:1000])
    assert store.download("shards/000000.bin", path, start=1000, size=len(data)) == len(data)
    assert path.read_bytes() == data
    assert s3_proxy.matching("GET")[-1].range == "bytes=1000-"
    with pytest.raises(IntegrityError, match="manifest says 99"):
        store.download("shards/000000.bin", tmp_path / "other", start=0, size=99)
    with pytest.raises(ConfigError, match="resume offset"):
        store.download("shards/000000.bin", path, start=5, size=len(data))


def test_invalid_options_are_config_errors_naming_the_key_not_the_value(s3_proxy, bucket):
    with pytest.raises(ConfigError, match="bogus_option") as info:
        make_store(s3_proxy, bucket, bogus_option="sekrit-value-123")
    assert "sekrit-value-123" not in str(info.value)
    with pytest.raises(ConfigError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ConfigError, match="budget_s"):
        RetryPolicy(budget_s=0)


def test_stores_pickle_without_their_client_and_repr_shows_only_the_url(s3_proxy, bucket):
    import pickle

    store = make_store(s3_proxy, bucket)
    store.put("a.bin", b"a")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.get("a.bin", max_bytes=1) == b"a"
    assert repr(copy) == str(copy) == f"ObjectStore('s3://{bucket}/caches/a')"
    assert store.with_location(store.location.child("sub")).url == f"s3://{bucket}/caches/a/sub"


WITHOUT_OBSTORE = textwrap.dedent("""
    import sys
    sys.modules["obstore"] = None
    sys.modules["obstore.store"] = None
    from datasetrt.errors import MissingExtraError
    from datasetrt.storage.objects import ObjectStore
    try:
        ObjectStore("s3://bkt/caches/a")
    except MissingExtraError as exc:
        print(isinstance(exc, ImportError), exc)
""")


def test_without_obstore_the_feature_names_the_extra():
    out = subprocess.run([sys.executable, "-c", WITHOUT_OBSTORE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "True object-store caches (s3:// URLs) require obstore to be installed: pip install 'datasetrt[s3]'"
    )
