"""storage/node_cache.py: one verified download per file per node, resumes, integrity, disk limit, pins."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading

import pytest

from datasetrt.errors import DiskLimitError, IntegrityError, StorageUnreachableError
from datasetrt.storage.node_cache import NodeCache
from tests.storage._workers import ensure_many
from tests.storage.conftest import DEADLINE_S, MiB, make_store, payload, sha, wait_until

SHARD = "shards/000000.bin"
KEY = "caches/a/shards/000000.bin"


@pytest.fixture
def remote(s3_proxy, bucket):
    """A store with three 1 MiB shards; returns (store, {name: data})."""
    store = make_store(s3_proxy, bucket)
    files = {f"shards/00000{i}.bin": payload(MiB, seed=i) for i in range(3)}
    for name, data in files.items():
        store.put(name, data)
    s3_proxy.reset()
    return store, files


def test_ensure_downloads_once_then_hits_without_a_request(s3_proxy, remote, tmp_path):
    store, files = remote
    cache = NodeCache(tmp_path / "node")
    mirror = cache.mirror(store)
    data = files[SHARD]
    path = mirror.ensure(SHARD, size=len(data), sha256=sha(data))
    assert path == mirror.dir / SHARD and path.read_bytes() == data
    assert mirror.dir.parent == cache.root and mirror.dir.name.startswith("a-")
    assert json.loads((mirror.work / "SOURCE").read_text()) == {"url": store.url, "version": ""}
    before = path.stat().st_mtime_ns
    assert mirror.ensure(SHARD, size=len(data), sha256=sha(data)) == path
    assert mirror.ensure(SHARD, size=len(data), sha256=sha(data), pin=True) == path
    assert s3_proxy.count("GET", KEY) == 1
    assert path.stat().st_mtime_ns == before  # hits set the access time only: readers use mtime as identity
    assert cache.usage_bytes() == len(data) and mirror.has(SHARD, len(data))
    assert [p.name for p in mirror.work.rglob("*.part-*")] == []
    cache.release_all()
    assert cache.mirror(store, version="v2").dir != mirror.dir  # another version of the cache, another mirror


def test_many_processes_one_download_per_file(s3_proxy, remote, tmp_path, no_leaks):
    store, files = remote
    specs = [(name, len(data), sha(data)) for name, data in files.items()]
    s3_proxy.delay("caches/a/shards/*", 0.3, times=len(files), method="GET")  # the first fetch is slow: others wait
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    root = str(tmp_path / "node")
    procs = [
        ctx.Process(target=ensure_many, args=(store, root, None, specs, barrier, results, i % 2 == 0)) for i in range(4)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=DEADLINE_S) for _ in procs]
    for proc in procs:
        proc.join(DEADLINE_S)
    results.close()
    results.join_thread()
    assert [kind for _, kind, _ in outcomes] == ["ok"] * 4, outcomes
    assert len({tuple(paths) for _, _, paths in outcomes}) == 1
    for name, data in files.items():
        assert s3_proxy.count("GET", f"caches/a/{name}") == 1, name
        assert (NodeCache(root).mirror(store).path(name)).read_bytes() == data


def test_a_cut_body_resumes_from_the_bytes_received(s3_proxy, remote, tmp_path):
    store, files = remote
    data = files[SHARD]
    s3_proxy.cut(KEY, after_bytes=400_000)
    path = NodeCache(tmp_path).mirror(store).ensure(SHARD, size=len(data), sha256=sha(data))
    assert path.read_bytes() == data
    assert [r.range for r in s3_proxy.matching("GET", KEY)] == [None, f"bytes=400000-{len(data) - 1}"]


def test_a_failed_download_is_resumed_by_the_next_call_from_the_partial(s3_proxy, remote, tmp_path):
    store, files = remote
    data = files[SHARD]
    mirror = NodeCache(tmp_path).mirror(store)
    s3_proxy.cut(KEY, after_bytes=200_000, times=None)  # 4 attempts x 200 kB < 1 MiB: the budget runs out
    with pytest.raises(StorageUnreachableError):
        mirror.ensure(SHARD, size=len(data), sha256=sha(data))
    [partial] = mirror.work.rglob("*.part-*")
    have = partial.stat().st_size
    assert 0 < have < len(data) and partial.read_bytes() == data[:have]
    s3_proxy.reset()
    assert mirror.ensure(SHARD, size=len(data), sha256=sha(data)).read_bytes() == data
    assert [r.range for r in s3_proxy.matching("GET", KEY)] == [f"bytes={have}-"]


def test_a_bad_partial_is_refetched_once_from_byte_zero(s3_proxy, remote, tmp_path):
    store, files = remote
    data = files[SHARD]
    mirror = NodeCache(tmp_path).mirror(store)
    partial = mirror.work / f"{SHARD}.part-{len(data)}"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 1000)  # garbage left by a dead process (or a crash)
    assert mirror.ensure(SHARD, size=len(data), sha256=sha(data)).read_bytes() == data
    assert [r.range for r in s3_proxy.matching("GET", KEY)] == ["bytes=1000-", None]


def test_a_corrupted_object_is_fetched_twice_then_an_integrity_error(s3_proxy, remote, tmp_path):
    store, files = remote
    data = files[SHARD]
    store.put(SHARD, data[:-1] + b"\xff")  # same size, one byte off
    s3_proxy.reset()
    mirror = NodeCache(tmp_path).mirror(store)
    with pytest.raises(IntegrityError) as info:
        mirror.ensure(SHARD, size=len(data), sha256=sha(data))
    assert f"{store.url}/{SHARD}" in str(info.value) and sha(data) in str(info.value)
    assert [r.range for r in s3_proxy.matching("GET", KEY)] == [None, None]
    assert not mirror.has(SHARD) and list(mirror.work.rglob("*.part-*")) == []


def test_a_truncated_object_is_an_integrity_error_before_its_body(s3_proxy, remote, tmp_path):
    store, files = remote
    data = files[SHARD]
    store.put(SHARD, data[:1000])
    s3_proxy.reset()
    mirror = NodeCache(tmp_path).mirror(store)
    with pytest.raises(IntegrityError, match=f"1000 bytes, the cache's manifest says {len(data)}"):
        mirror.ensure(SHARD, size=len(data), sha256=sha(data))
    assert s3_proxy.count("GET", KEY) == 1 and not mirror.has(SHARD)


def test_disk_limit_evicts_unpinned_files_least_recently_used_first(s3_proxy, remote, tmp_path):
    store, files = remote
    (a, da), (b, db), (c, dc) = files.items()
    cache = NodeCache(tmp_path, limit_bytes=2 * MiB + 100)
    mirror = cache.mirror(store)
    mirror.ensure(a, size=MiB, sha256=sha(da))
    mirror.ensure(b, size=MiB, sha256=sha(db))
    mirror.ensure(a, size=MiB, sha256=sha(da))  # a is now more recent than b
    mirror.ensure(c, size=MiB, sha256=sha(dc))
    assert mirror.has(a) and not mirror.has(b) and mirror.has(c)
    assert cache.usage_bytes() == 2 * MiB <= cache.limit_bytes


def test_disk_limit_refuses_what_cannot_fit_with_pins_held(s3_proxy, remote, tmp_path):
    store, files = remote
    (a, da), (b, db), (c, dc) = files.items()
    cache = NodeCache(tmp_path, limit_bytes=2 * MiB + 100)
    mirror = cache.mirror(store)
    mirror.ensure(a, size=MiB, sha256=sha(da), pin=True)
    other = NodeCache(tmp_path, limit_bytes=2 * MiB + 100)  # another process's view: its own locks
    other.mirror(store).ensure(b, size=MiB, sha256=sha(db), pin=True)
    with pytest.raises(DiskLimitError) as info:
        mirror.ensure(c, size=MiB, sha256=sha(dc))
    error = info.value
    assert isinstance(error, MemoryError) and (error.limit_bytes, error.need_bytes) == (2 * MiB + 100, MiB)
    assert str(2 * MiB + 100) in str(error) and f"{store.url}/{c}" in str(error)
    assert s3_proxy.count("GET", f"caches/a/{c}") == 0 and list(mirror.work.rglob("*.part-*")) == []
    other.release_all()
    mirror.ensure(c, size=MiB, sha256=sha(dc))
    assert mirror.has(a) and not mirror.has(b) and mirror.has(c)
    with pytest.raises(DiskLimitError):
        NodeCache(tmp_path / "tiny", limit_bytes=MiB - 1).mirror(store).ensure(a, size=MiB, sha256=sha(da))
    cache.release_all()


def test_evict_skips_files_another_process_holds(s3_proxy, remote, tmp_path):
    store, files = remote
    (a, da), (b, db) = list(files.items())[:2]
    mirror = NodeCache(tmp_path).mirror(store)
    mirror.ensure(a, size=MiB, sha256=sha(da), pin=True)
    mirror.ensure(b, size=MiB, sha256=sha(db))
    holder = NodeCache(tmp_path)
    assert holder.mirror(store).pin(b) and not holder.mirror(store).pin("shards/999999.bin")
    with open(mirror.path(a), "rb") as reader:  # a reader that has the file open keeps reading it
        assert mirror.evict([a, b]) == MiB  # a (our own pin, dropped) goes; b (held elsewhere) stays
        assert reader.read() == da
    assert not mirror.has(a) and mirror.has(b)
    holder.release_all()
    assert mirror.evict([b, "shards/999999.bin"]) == MiB and not mirror.has(b)
    assert NodeCache(tmp_path).usage_bytes() == 0


def test_pins_and_evictions_leave_no_descriptor_open(remote, tmp_path):
    from tests.storage.conftest import open_fds

    store, files = remote
    cache = NodeCache(tmp_path)
    mirror = cache.mirror(store)
    specs = [(name, len(data), sha(data)) for name, data in files.items()]
    for name, size, digest in specs:
        mirror.ensure(name, size=size, sha256=digest)
    before = open_fds()
    for _ in range(3):
        for name, size, digest in specs:
            mirror.ensure(name, size=size, sha256=digest, pin=True)
            mirror.ensure(name, size=size, sha256=digest, pin=True)
        assert cache.pinned_count() == len(specs)
        mirror.unpin(specs[0][0])
        mirror.unpin(specs[0][0])
        assert cache.pinned_count() == len(specs) - 1
        cache.release_all()
        cache.make_room(1)
    assert mirror.evict([name for name, _, _ in specs]) == 3 * MiB
    assert open_fds() == before and cache.pinned_count() == 0


def test_install_places_fetched_bytes_atomically_and_verified(remote, tmp_path):
    store, _ = remote
    mirror = NodeCache(tmp_path).mirror(store)
    manifest = b'{"format_version": 3}'
    path = mirror.install("manifest.json", manifest, sha256=sha(manifest))
    assert path.read_bytes() == manifest and mirror.install("manifest.json", manifest) == path
    with pytest.raises(IntegrityError, match="index.bin"):
        mirror.install("index.bin", b"x", sha256=sha(b"y"))
    assert not mirror.has("index.bin")


def test_files_of_unknown_size_are_fetched_whole_and_bounded(s3_proxy, remote, tmp_path):
    store, files = remote
    mirror = NodeCache(tmp_path).mirror(store)
    path = mirror.ensure(SHARD, size=None, sha256=None)
    assert path.read_bytes() == files[SHARD]
    assert mirror.ensure(SHARD, size=None, sha256=None) == path and s3_proxy.count("GET", KEY) == 1
    from datasetrt.errors import ObjectSizeError

    with pytest.raises(ObjectSizeError):
        mirror.ensure("shards/000001.bin", size=None, sha256=None, max_bytes=1000)


def test_forked_child_of_a_process_that_used_the_store_goes_through_the_helper(s3_proxy, remote, tmp_path, no_leaks):
    """obstore's runtime hangs after fork; the child's operations run in an exec'd helper."""
    import psutil

    from tests.storage.conftest import wait_until

    store, files = remote
    store.head(SHARD)  # this process's runtime is now started
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    specs = [(name, len(data), sha(data)) for name, data in files.items()]
    proc = ctx.Process(target=_forked_ensure, args=(store, str(tmp_path), specs, results))
    proc.start()
    kind, paths, helper = results.get(timeout=DEADLINE_S)
    proc.join(DEADLINE_S)
    results.close()
    results.join_thread()
    assert kind == "ok" and proc.exitcode == 0, paths
    assert helper is not None and helper != os.getpid()
    wait_until(lambda: not psutil.pid_exists(helper) or psutil.Process(helper).status() == psutil.STATUS_ZOMBIE)
    for name, data in files.items():
        assert NodeCache(tmp_path).mirror(store).path(name).read_bytes() == data
        assert s3_proxy.count("GET", f"caches/a/{name}") == 1


def _forked_ensure(store, root, specs, results):
    from datasetrt.storage import bridge

    try:
        mirror = NodeCache(root).mirror(store)
        paths = [str(mirror.ensure(name, size=size, sha256=digest)) for name, size, digest in specs]
        results.put(("ok", paths, bridge.helper_pid()))
    except BaseException as exc:
        results.put(("error", repr(exc), None))


def test_a_waiter_for_a_download_is_not_blocked_by_the_pin_the_downloader_then_takes(s3_proxy, remote, tmp_path):
    """A look-ahead (thread A) downloads and pins a file while a read (thread B) waits for that
    download; A keeps its pin until B is done (as a prefetcher does until the read reaches the
    file). B must get the file once A's download lands, not wait on A's pin."""
    store, files = remote
    data = files[SHARD]
    mirror = NodeCache(tmp_path / "node").mirror(store)
    stall = s3_proxy.stall(KEY, 1000, resume=True)
    done: dict[str, object] = {}

    def downloader():
        done["a"] = mirror.ensure(SHARD, size=len(data), sha256=sha(data), pin=True)

    def reader():
        done["b_tid"] = threading.get_native_id()
        done["b"] = mirror.ensure(SHARD, size=len(data), sha256=sha(data))

    a = threading.Thread(target=downloader)
    a.start()
    wait_until(stall.reached.is_set, what="the download to be under way")
    b = threading.Thread(target=reader)
    b.start()
    wait_until(lambda: _waits_on_a_lock(done.get("b_tid")), what="the reader to wait for the download's lock")
    stall.release()
    a.join(DEADLINE_S)
    b.join(DEADLINE_S)
    assert not a.is_alive() and not b.is_alive(), "the reader waited on the downloader's pin"
    assert done["a"] == done["b"] == mirror.dir / SHARD
    assert s3_proxy.count("GET", KEY) == 1
    mirror.cache.release_all()


def _waits_on_a_lock(tid) -> bool:
    if tid is None:
        return False
    try:
        with open(f"/proc/self/task/{tid}/wchan") as f:
            return "lock" in f.read()
    except FileNotFoundError:
        return False
