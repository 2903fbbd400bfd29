"""Node cache under faults: a killed downloader, a full disk (a small tmpfs), and a mirror the
local reader opens."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from datasetrt.errors import DiskFullError
from datasetrt.storage.node_cache import NodeCache
from tests.storage._workers import ensure_one
from tests.storage.conftest import DEADLINE_S, MiB, make_store, payload, sha, wait_until

SHARD = "shards/000000.bin"
KEY = "caches/a/shards/000000.bin"


def test_a_killed_downloaders_partial_is_resumed_not_restarted(s3_proxy, bucket, tmp_path, no_leaks):
    store = make_store(s3_proxy, bucket)
    data = payload(4 * MiB, seed=11)
    store.put(SHARD, data)
    s3_proxy.reset()
    stall = s3_proxy.stall(KEY, after_bytes=2 * MiB)
    ctx = multiprocessing.get_context("spawn")
    root = tmp_path / "node"
    proc = ctx.Process(target=ensure_one, args=(store, str(root), SHARD, len(data), sha(data)))
    proc.start()
    partial = NodeCache(root).mirror(store).work / f"{SHARD}.part-{len(data)}"
    assert stall.reached.wait(DEADLINE_S)
    wait_until(lambda: partial.exists() and partial.stat().st_size > 0, what="the downloader to write its partial")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(DEADLINE_S)
    assert proc.exitcode == -signal.SIGKILL
    stall.release()
    have = partial.stat().st_size
    assert 0 < have < len(data) and partial.read_bytes() == data[:have]
    path = NodeCache(root).mirror(store).ensure(SHARD, size=len(data), sha256=sha(data))
    assert path.read_bytes() == data
    assert [r.range for r in s3_proxy.matching("GET", KEY)] == [None, f"bytes={have}-"]


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` (skips the test where mounting is not permitted)."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path: Path) -> None:
    """Write `path` until the file system is full."""
    with open(path, "wb", buffering=0) as f:
        block = b"\0" * 65536
        while True:
            try:
                f.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                block = block[: len(block) // 2]
                if not block:
                    return


def test_a_file_the_disk_cannot_hold_is_refused_before_downloading(s3_proxy, bucket, tmp_path):
    store = make_store(s3_proxy, bucket)
    data = payload(2 * MiB, seed=12)
    store.put(SHARD, data)
    with small_tmpfs(tmp_path / "fs", "1m") as fs:
        mirror = NodeCache(fs).mirror(store)
        with pytest.raises(DiskFullError) as info:
            mirror.ensure(SHARD, size=len(data), sha256=sha(data))
        assert info.value.errno == errno.ENOSPC and info.value.path == str(fs)
        assert s3_proxy.count("GET", KEY) == 0 and list(mirror.work.rglob("*.part-*")) == []


def test_enospc_mid_download_is_a_typed_error_and_leaves_no_partial(s3_proxy, bucket, tmp_path):
    store = make_store(s3_proxy, bucket)
    data = payload(MiB + MiB // 2, seed=13)
    store.put(SHARD, data)
    s3_proxy.reset()
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        mirror = NodeCache(fs).mirror(store)
        partial = mirror.work / f"{SHARD}.part-{len(data)}"
        stall = s3_proxy.stall(KEY, after_bytes=512 * 1024, resume=True)
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(mirror.ensure, SHARD, size=len(data), sha256=sha(data))
            assert stall.reached.wait(DEADLINE_S)
            wait_until(lambda: partial.exists() and partial.stat().st_size > 0, what="the partial to grow")
            filler = fs / "filler"
            fill(filler)  # someone else fills the disk mid-download
            stall.release()
            with pytest.raises(DiskFullError) as info:
                done.result(timeout=DEADLINE_S)
        error = info.value
        assert error.errno == errno.ENOSPC and error.path == str(fs) and f"{store.url}/{SHARD}" in str(error)
        assert not partial.exists() and not mirror.has(SHARD)
        filler.unlink()
        s3_proxy.reset()
        assert mirror.ensure(SHARD, size=len(data), sha256=sha(data)).read_bytes() == data


def test_a_mirror_opens_with_the_local_reader(s3_proxy, bucket, tmp_path):
    """Upload a cache written by datasetrt, mirror its files, read it back from the mirror."""
    import datasetrt as drt
    from tests.conftest import ListSource, sample_items

    items = sample_items(40, tag="m")
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache(
            ListSource("remote", items), tmp_path / "local", writer_config=drt.WriterConfig(show_progress=False)
        )
    local = Path(result.path)
    store = make_store(s3_proxy, bucket, "caches/remote")
    names = [p.relative_to(local).as_posix() for p in sorted(local.rglob("*")) if p.is_file()]
    for name in names:
        store.put(name, local / name)
    mirror = NodeCache(tmp_path / "node").mirror(store)
    for name in names:
        data = (local / name).read_bytes()
        mirror.ensure(name, size=len(data), sha256=sha(data))
    ds = drt.CachedDataset([str(mirror.dir)], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    try:
        assert [s.data for s in ds] == [data for data, _ in items]
    finally:
        ds.close()
