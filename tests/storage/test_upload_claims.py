"""Writer claims and orphaned uploads (format/claims.py, format/upload.py) against moto's server: a
provably dead writer's claim is taken over and its leftovers cleared; a live one's is an error
naming `datasetrt prune`; a failed upload removes what it put; `unpublished` lists only
cache-shaped prefixes without a manifest and `delete_objects` never removes a published cache nor
one written to meanwhile.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import datasetrt as drt
from datasetrt.format.claims import CLAIM_NAME, claim_text, holder_is_dead, is_cache_object
from datasetrt.format.upload import delete_objects, unpublished
from tests.conftest import ListSource, sample_items, writer_config
from tests.storage.conftest import make_store


def storage(proxy, tmp_path, **kw) -> drt.StorageConfig:
    from tests.servers.fixtures import proxy_options

    kw.setdefault("retry_attempts", 2)
    kw.setdefault("retry_budget_s", 10.0)
    return drt.StorageConfig(options=proxy_options(proxy), cache_dir=str(tmp_path / "node"), **kw)


def dead_claim() -> bytes:
    """The claim of a process that has exited (and was reaped): provably dead on this node."""
    code = "import sys; from datasetrt.format.claims import claim_text; sys.stdout.buffer.write(claim_text())"
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True).stdout


def names(store) -> list[str]:
    return [info.name for info in store.list()]


def write(runtime, base, proxy, tmp_path, name="a", n=12):
    config = writer_config(storage=storage(proxy, tmp_path), max_shard_bytes=1 << 10)
    return runtime.write_cache([ListSource(name, sample_items(n, tag=name))], base, writer_config=config)[0]


def test_a_claim_knows_whether_its_process_is_gone():
    assert not holder_is_dead(claim_text())  # this process
    assert holder_is_dead(dead_claim())
    assert not holder_is_dead(b"not json") and not holder_is_dead(b'{"pid": 1}')  # no proof: not dead
    assert is_cache_object("shards/000001.bin") and is_cache_object(CLAIM_NAME) and is_cache_object("index.bin")
    assert not is_cache_object("shards/notes.txt") and not is_cache_object("sub/manifest.json")


def test_a_dead_writers_claim_is_taken_over_and_its_leftovers_cleared(runtime, bucket, s3_proxy, tmp_path):
    cache = make_store(s3_proxy, bucket, "caches/a")
    cache.put_if_absent(CLAIM_NAME, dead_claim())
    cache.put("shards/000099.bin", b"left by the dead writer")
    result = write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path)
    assert isinstance(result, drt.CacheWriteSuccess), result
    left = names(cache)
    assert "shards/000099.bin" not in left and CLAIM_NAME not in left
    assert not [n for n in left if n.startswith(".datasetrt-takeover-")]
    assert "manifest.json" in left
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, storage=storage(s3_proxy, tmp_path)))
    assert len(ds) == 12


def test_a_live_writers_claim_is_an_error_naming_prune(runtime, bucket, s3_proxy, tmp_path):
    cache = make_store(s3_proxy, bucket, "caches/a")
    cache.put_if_absent(CLAIM_NAME, claim_text())  # this process: alive
    result = write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path)
    assert isinstance(result, drt.CacheWriteError)
    assert "another writer holds" in result.message and f"datasetrt prune s3://{bucket}/caches" in result.message
    assert names(cache) == [CLAIM_NAME]  # nothing uploaded


def test_a_cache_published_after_the_first_look_is_never_uploaded_over(runtime, bucket, s3_proxy, tmp_path):
    assert isinstance(write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path), drt.CacheWriteSuccess)
    puts = s3_proxy.count("PUT", "caches/a/shards/*")
    # the first look misses the manifest (as if another writer published just after it)
    s3_proxy.fail("caches/a/manifest.json", status=404, times=1, method="HEAD")
    result = write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path)
    assert isinstance(result, drt.CacheWriteError) and "cache path already exists" in result.message
    assert s3_proxy.count("PUT", "caches/a/shards/*") == puts  # nothing uploaded over the published cache
    assert CLAIM_NAME not in names(make_store(s3_proxy, bucket, "caches/a"))


def test_a_failed_upload_removes_what_it_put_and_its_claim(runtime, bucket, s3_proxy, tmp_path):
    s3_proxy.fail("caches/a/index.bin", status=403, times=None, method="PUT")
    result = write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path)
    assert isinstance(result, drt.CacheWriteError) and "access denied" in result.message
    assert s3_proxy.count("PUT", "caches/a/shards/*") > 0  # shards went up before the index failed
    assert names(make_store(s3_proxy, bucket, "caches/a")) == []
    s3_proxy.clear_rules()
    assert isinstance(write(runtime, f"s3://{bucket}/caches", s3_proxy, tmp_path), drt.CacheWriteSuccess)


def test_unpublished_lists_only_cache_shaped_prefixes_without_a_manifest(runtime, bucket, s3_proxy, tmp_path):
    assert isinstance(write(runtime, f"s3://{bucket}/base", s3_proxy, tmp_path, "done"), drt.CacheWriteSuccess)
    base = make_store(s3_proxy, bucket, "base")
    mine = claim_text()
    base.put("orphan/" + CLAIM_NAME, mine)
    base.put("orphan/shards/000000.bin", b"x" * 100)
    base.put("notes/readme.txt", b"not a cache")  # not cache-shaped: never listed
    base.put("deeper/c/shards/000000.bin", b"y")  # nested deeper: never listed
    found = unpublished(base, min_age_s=0)
    assert [(f.name, f.url, sorted(i.name for i in f.objects)) for f in found] == [
        ("orphan", f"s3://{bucket}/base/orphan", [CLAIM_NAME, "shards/000000.bin"])
    ]
    assert found[0].size_bytes == 100 + len(mine) and found[0].idle_s is not None and found[0].claim == mine
    assert "pid" in found[0].holder
    assert unpublished(base) == []  # idle for less than the default hour
    # the location of one unpublished cache lists that cache; a published one lists nothing
    [itself] = unpublished(make_store(s3_proxy, bucket, "base/orphan"), min_age_s=0)
    assert itself.name == "" and itself.url == f"s3://{bucket}/base/orphan"
    assert unpublished(make_store(s3_proxy, bucket, "base/done"), min_age_s=0) == []


def test_delete_objects_clears_one_orphan_and_stops_when_it_changed(bucket, s3_proxy):
    base = make_store(s3_proxy, bucket, "base")
    base.put("a/shards/000000.bin", b"1")  # no claim: the clearer claims it first
    base.put("b/" + CLAIM_NAME, dead_claim())
    base.put("b/index.bin", b"2")
    base.put("c/shards/000000.bin", b"3")
    found = {f.name: f for f in unpublished(base, min_age_s=0)}
    assert set(found) == {"a", "b", "c"}
    cleared = delete_objects(base, found["a"], min_age_s=0)
    assert not cleared.stopped and [i.name for i in cleared.objects] == ["shards/000000.bin"]  # and its own claim
    cleared = delete_objects(base, found["b"], min_age_s=0)
    assert not cleared.stopped and sorted(i.name for i in cleared.objects) == [CLAIM_NAME, "index.bin"]
    base.put("c/manifest.json", b"{}")  # published after it was listed: kept whole
    cleared = delete_objects(base, found["c"], min_age_s=0)
    assert cleared.stopped == "it was published meanwhile" and cleared.objects == []
    assert names(base) == ["c/manifest.json", "c/shards/000000.bin"]
    base.put("d/shards/000000.bin", b"4")
    [young] = unpublished(base, min_age_s=0)
    assert delete_objects(base, young, min_age_s=3600).stopped.startswith("it is being written")
    assert "d/shards/000000.bin" in names(base) and "d/" + CLAIM_NAME not in names(base)


@pytest.mark.parametrize("holder", ["live", "dead"])
def test_a_claim_changed_after_listing_stops_the_clearer(bucket, s3_proxy, holder):
    base = make_store(s3_proxy, bucket, "base")
    base.put("e/" + CLAIM_NAME, dead_claim())
    base.put("e/index.bin", b"5")
    [found] = unpublished(base, min_age_s=0)
    base.put("e/" + CLAIM_NAME, claim_text() if holder == "live" else dead_claim())  # a new writer took it
    cleared = delete_objects(base, found, min_age_s=0)
    assert cleared.stopped == "its claim changed meanwhile"
    assert names(base) == ["e/" + CLAIM_NAME, "e/index.bin"]  # its marker released, nothing else touched
