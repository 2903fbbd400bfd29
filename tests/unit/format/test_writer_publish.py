"""Publication (format/publish.py: Publisher, Staging): staged caches are synced once per batch (syncfs, or
concurrent fsyncs of every file and directory) before any of them is renamed into place; the
staging root <base>/tmp is removed once a write leaves it empty (dataset-rt leaves it, and it is no
cache: `CachedDataset(sorted(glob("caches/*")))` and `datasetrt validate caches/*` tripped on it),
and never while another writer uses it. Crash tests: tests/reliability/test_write_batch_faults.py.

Other writers are simulated as in test_writer_faults: a lock file held with flock in this process
conflicts exactly like one held by another process; real concurrency uses forked writers.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.format import publish
from tests.conftest import QUIET, ListSource, sample_items
from tests.unit.format.sources import Raw

OK = [(b"x", {"a": 1})]


def _files_under(path: Path) -> set[Path]:
    return {path, *path.rglob("*")}


def _recording_syncs(monkeypatch) -> list:
    """Record the publisher's syncs ("syncfs", or the set of paths fsynced) and renames in order;
    a rename asserts that the last sync covered every file and directory of the staging dir."""
    log: list = []
    real_syncfs, real_fsyncs, real_rename = publish.syncfs, publish.fsync_paths, publish.rename_noreplace

    def rename(src, dst):
        last = next(entry for entry in reversed(log) if entry != "rename")
        assert last == "syncfs" or _files_under(Path(src)) <= last, f"{src} renamed before it was synced"
        log.append("rename")
        real_rename(src, dst)

    monkeypatch.setattr(publish, "syncfs", lambda fd: (log.append("syncfs"), real_syncfs(fd))[1])
    monkeypatch.setattr(publish, "fsync_paths", lambda paths: (log.append(set(paths)), real_fsyncs(paths))[1])
    monkeypatch.setattr(publish, "rename_noreplace", rename)
    return log


def _kinds(log: list) -> list:
    return ["fsync" if isinstance(entry, set) else entry for entry in log]


@pytest.mark.skipif(not publish.SYNCFS_REPORTS_ERRORS, reason="syncfs does not report errors on this kernel")
def test_one_sync_per_batch_before_its_renames(runtime, tmp_path, monkeypatch):
    """Full batches sync the filesystem once; the short last one (under SYNCFS_MIN_CACHES) fsyncs
    its own files."""
    log = _recording_syncs(monkeypatch)
    batch = publish.Publisher.BATCH_CACHES
    n = 2 * batch + 3
    results = runtime.write_cache([Raw(f"s{k:03d}", OK) for k in range(n)], tmp_path, writer_config=QUIET)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results)
    assert _kinds(log) == (["syncfs"] + ["rename"] * batch) * 2 + ["fsync"] + ["rename"] * 3


def test_fsync_fallback_syncs_every_file_and_directory_before_the_rename(runtime, tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "SYNCFS_REPORTS_ERRORS", False)
    monkeypatch.setattr(publish.Publisher, "SYNCFS_MIN_CACHES", 1)  # would syncfs, but it cannot report errors
    log = _recording_syncs(monkeypatch)
    items = [(bytes([k]) * 5000, {"k": k}) for k in range(40)]
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=30_000)  # several shards
    results = runtime.write_cache([Raw("a", items), Raw("b", OK)], tmp_path, writer_config=config)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results)
    assert _kinds(log) == ["fsync", "rename", "rename"]
    assert len(list((tmp_path / "a" / "shards").iterdir())) > 3


def test_a_sync_error_fails_the_whole_batch_and_publishes_nothing(runtime, tmp_path, monkeypatch):
    def failing_sync(*_):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(publish, "syncfs", failing_sync)
    monkeypatch.setattr(publish, "fsync_paths", failing_sync)
    results = runtime.write_cache([Raw("a", OK), Raw("b", OK)], tmp_path, writer_config=QUIET)
    assert results == [drt.CacheWriteError(n, "I/O error: Input/output error (os error 5)") for n in "ab"]
    assert os.listdir(tmp_path) == []


def test_write_leaves_no_staging_root_and_a_glob_of_the_base_opens(runtime, tmp_path):
    results = runtime.write_cache(
        [ListSource(n, sample_items(3, tag=n)) for n in ("a", "b")], tmp_path / "caches", writer_config=QUIET
    )
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results)
    assert sorted(os.listdir(tmp_path / "caches")) == ["a", "b"]
    ds = drt.CachedDataset(
        sorted(glob.glob(str(tmp_path / "caches" / "*"))),
        reader_config=drt.ReaderConfig(seed=0, shuffle=False),
        runtime=None,
    )
    assert len(list(ds)) == 6
    ds.close()


def test_a_root_another_writer_uses_is_kept(runtime, tmp_path):
    (tmp_path / "tmp").mkdir()
    lock = tmp_path / "tmp" / publish.lock_file_name("other")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "other" is being written by someone else
    try:
        (result,) = runtime.write_cache([Raw("mine", OK)], tmp_path, writer_config=QUIET)
        assert isinstance(result, drt.CacheWriteSuccess)
        assert os.listdir(tmp_path / "tmp") == [lock.name]
    finally:
        os.close(fd)


def test_a_root_removed_between_mkdir_and_lock_is_recreated(runtime, tmp_path, monkeypatch):
    """Another writer may remove the (empty) root after this one created it and before it created
    its lock file in it: the lock is retried in a new root."""
    (tmp_path / "tmp").mkdir()
    real = publish._lock_file
    removed = []

    def lock_after_removal(lock_path, name, base):
        if not removed:
            os.rmdir(lock_path.parent)  # what the other writer's remove_empty_staging_root does
            removed.append(lock_path.parent)
        return real(lock_path, name, base)

    monkeypatch.setattr(publish, "_lock_file", lock_after_removal)
    (result,) = runtime.write_cache([Raw("w", OK)], tmp_path, writer_config=QUIET)
    assert result == drt.CacheWriteSuccess("w", tmp_path / "w") and removed
    assert os.listdir(tmp_path) == ["w"]


def test_stale_lock_of_a_published_cache_is_dropped_but_a_held_one_kept(runtime, tmp_path):
    """A writer killed between its rename and its unlock leaves a free lock file next to a
    published cache; the next write of that name (an error value: the cache exists) drops it."""
    runtime.write_cache([Raw("a", OK), Raw("b", OK)], tmp_path, writer_config=QUIET)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / publish.lock_file_name("a")).write_bytes(b"")
    held = os.open(tmp_path / "tmp" / publish.lock_file_name("b"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        results = runtime.write_cache([Raw("a", OK), Raw("b", OK)], tmp_path, writer_config=QUIET)
        assert [type(r).__name__ for r in results] == ["CacheWriteError", "CacheWriteError"]
        assert os.listdir(tmp_path / "tmp") == [publish.lock_file_name("b")]
    finally:
        os.close(held)
    runtime.write_cache([Raw("b", OK)], tmp_path, writer_config=QUIET)
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def _fork_writer(base, names, result_w):
    """A child that writes `names` two per write_cache call (each call ends by removing the root
    it emptied) and reports the result kinds as one JSON line."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            kinds = []
            with drt.DatasetRuntime(num_workers=1) as rt:
                for k in range(0, len(names), 2):
                    results = rt.write_cache([Raw(n, OK) for n in names[k : k + 2]], base, writer_config=QUIET)
                    kinds += [type(r).__name__ for r in results]
            os.write(result_w, json.dumps(kinds).encode() + b"\n")
            code = 0
        finally:
            os._exit(code)
    return pid


@pytest.mark.parametrize("attempt", range(3))
def test_concurrent_writers_of_other_names_share_and_remove_the_root(tmp_path, attempt):
    """Two processes each write 60 one-record caches into one base at once, in 30 calls each: the
    root is emptied and removed (or found in use) 60 times while the other creates it and its locks."""
    base = tmp_path / "caches"
    read_end, write_end = os.pipe()
    names = {side: [f"{side}{k:03d}" for k in range(60)] for side in "pq"}
    pids = [_fork_writer(base, names[side], write_end) for side in "pq"]
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        reports = [json.loads(line) for line in f.read().splitlines()]
    statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert statuses == [0, 0]
    assert reports == [["CacheWriteSuccess"] * 60] * 2
    assert sorted(os.listdir(base)) == sorted(names["p"] + names["q"])


def test_io_error_messages_name_the_file_the_os_named():
    """`io_error_message` is `CacheIOError.from_os`'s text (dataset-rt's "I/O error: ... (os error N)")."""
    assert publish.io_error_message(OSError(errno.ENOSPC, "No space left on device", "/b/tmp/c/x")) == (
        "I/O error: No space left on device (os error 28): /b/tmp/c/x"
    )
    assert (
        publish.io_error_message(OSError(errno.EIO, "Input/output error"))
        == "I/O error: Input/output error (os error 5)"
    )
