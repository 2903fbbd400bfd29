"""format/publish.py in-process: the marker of a cache published without a durable rename and the
write that confirms it, lock files created already locked (both ways: O_TMPFILE and a named
temporary), and a release that never raises or closes twice. The same failures with real failing
syscalls (LD_PRELOAD shim): tests/reliability/test_publish_faults.py.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.format import publish
from tests.conftest import QUIET
from tests.unit.format.sources import Raw

OK = [(b"x", {"a": 1})]


def _eio(*_args):
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def _write_without_durable_renames(runtime, base: Path, monkeypatch, names="ab") -> list:
    """A write whose fsync of <base> after the renames fails (every other fsync works)."""
    real = publish.fsync_path
    monkeypatch.setattr(publish, "fsync_path", lambda path: _eio() if Path(path) == base else real(path))
    try:
        return runtime.write_cache([Raw(n, OK) for n in names], base, writer_config=QUIET)
    finally:
        monkeypatch.setattr(publish, "fsync_path", real)


# -- published, the rename not known durable -----------------------------------------------------


def test_not_durable_results_keep_the_tuple_of_dataset_rt(runtime, tmp_path, monkeypatch):
    results = _write_without_durable_renames(runtime, tmp_path, monkeypatch)
    assert results == [drt.CacheWriteSuccess(n, tmp_path / n) for n in "ab"]  # equality: the two fields
    assert [r.durable for r in results] == [False, False]
    name, path = results[0]
    assert (name, path) == ("a", tmp_path / "a") and len(results[0]) == 2
    assert repr(results[0]) == f"CacheWriteSuccess(source_name='a', path={tmp_path / 'a'!r}, durable=False)"
    assert sorted(os.listdir(tmp_path / "tmp")) == [".a.unsynced", ".b.unsynced"]


def test_a_retry_whose_fsync_fails_again_is_still_not_durable_and_keeps_its_marker(runtime, tmp_path, monkeypatch):
    _write_without_durable_renames(runtime, tmp_path, monkeypatch, "a")
    (again,) = _write_without_durable_renames(runtime, tmp_path, monkeypatch, "a")
    assert again == drt.CacheWriteSuccess("a", tmp_path / "a") and again.durable is False
    assert os.listdir(tmp_path / "tmp") == [".a.unsynced"]
    (confirmed,) = runtime.write_cache([Raw("a", OK)], tmp_path, writer_config=QUIET)
    assert confirmed.durable is True and sorted(os.listdir(tmp_path)) == ["a"]


def test_a_marker_naming_another_directory_is_stale(runtime, tmp_path, monkeypatch):
    """The cache was deleted and the name written again by other means: its marker no longer
    names that directory, so a write of the name is the usual refusal and drops the marker."""
    _write_without_durable_renames(runtime, tmp_path, monkeypatch, "a")
    os.rename(tmp_path / "a", tmp_path / "a-old")
    (tmp_path / "a").mkdir()
    (result,) = runtime.write_cache([Raw("a", OK)], tmp_path, writer_config=QUIET)
    assert result == drt.CacheWriteError("a", f"cache path already exists: {tmp_path / 'a'}")
    assert not (tmp_path / "tmp").exists()


def test_from_cache_sources_confirms_a_reused_cache(runtime, tmp_path, monkeypatch):
    _write_without_durable_renames(runtime, tmp_path, monkeypatch, "a")
    outcome = runtime.from_cache_sources(
        [Raw("a", OK)], tmp_path, reader_config=drt.ReaderConfig(seed=0), writer_config=QUIET
    )
    assert isinstance(outcome, drt.CacheSourcesDatasetSuccess), outcome
    (result,) = outcome.results
    assert result == drt.CacheWriteSuccess("a", tmp_path / "a") and result.durable is True
    assert sorted(os.listdir(tmp_path)) == ["a"]
    outcome.dataset.close()


def test_a_marker_is_written_under_its_lock(runtime, tmp_path, monkeypatch):
    """The staging locks are released after the fsync of <base> (so after the marker is written):
    no other writer can remove the staging root in between."""
    seen = []
    real_mark = publish.Staging.mark_unconfirmed

    def mark(self, target):
        seen.append(self._fd is not None and (self.root / publish.lock_file_name(self.name)).exists())
        real_mark(self, target)

    monkeypatch.setattr(publish.Staging, "mark_unconfirmed", mark)
    _write_without_durable_renames(runtime, tmp_path, monkeypatch, "ab")
    assert seen == [True, True]


# -- lock files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tmpfile", [True, False], ids=["O_TMPFILE", "named-temporary"])
def test_a_lock_file_appears_only_locked_and_a_failed_flock_leaves_nothing(tmp_path, monkeypatch, tmpfile):
    if tmpfile and not publish._TMPFILE:
        pytest.skip("no O_TMPFILE (or no /proc) here: the writer uses named temporaries")
    if not tmpfile:
        monkeypatch.setattr(publish, "_TMPFILE", 0)
    root = tmp_path / "tmp"
    root.mkdir()
    lock_path = root / ".a.lock"
    fd = publish._lock_file(lock_path, "a", tmp_path)
    try:
        assert sorted(os.listdir(root)) == [".a.lock"]  # the temporary name (if any) is gone
        assert os.path.samestat(os.fstat(fd), os.stat(lock_path))
        probe = os.open(lock_path, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # linked already locked
        os.close(probe)
    finally:
        os.close(fd)
    os.unlink(lock_path)

    def enolck(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(publish.fcntl, "flock", enolck)
    with pytest.raises(OSError) as info:
        publish._lock_file(lock_path, "a", tmp_path)
    assert info.value.errno == errno.ENOLCK and info.value.filename == str(lock_path)
    assert os.listdir(root) == []


def test_a_lock_file_linked_first_by_another_writer_is_contended_for(runtime, tmp_path, monkeypatch):
    """Two writers create the lock file at once: the one whose link loses opens the winner's
    file and fails fast on its lock, leaving the winner's file alone."""
    real_link, held = os.link, []

    def link_after_another_writer(src, dst, **kw):
        if not held:
            fd = os.open(dst, os.O_RDWR | os.O_CREAT, 0o644)  # the other writer, already locked
            fcntl.flock(fd, fcntl.LOCK_EX)
            held.append(fd)
        return real_link(src, dst, **kw)

    monkeypatch.setattr(publish.os, "link", link_after_another_writer)
    try:
        (result,) = runtime.write_cache([Raw("w", OK)], tmp_path, writer_config=QUIET)
    finally:
        monkeypatch.undo()
        for fd in held:
            os.close(fd)
    assert isinstance(result, drt.CacheWriteError) and "another process is writing cache 'w'" in result.message
    assert os.listdir(tmp_path / "tmp") == [".w.lock"]  # the other writer's


def test_a_root_removed_before_the_unnamed_lock_file_is_made_is_recreated(runtime, tmp_path, monkeypatch):
    """Another writer may remove the empty staging root between this writer's lookup of it and
    the creation of its unnamed lock file in it (ext4 then says EPERM, not ENOENT): the root is
    made again and the lock retried."""
    if not publish._TMPFILE:
        pytest.skip("no O_TMPFILE (or no /proc) here: the writer uses named temporaries")
    real_open, removed = os.open, []

    def open_after_removal(path, flags, *args, **kw):
        if flags & publish._TMPFILE == publish._TMPFILE and not removed:
            os.rmdir(tmp_path / "tmp")  # what the other writer's remove_empty_staging_root does
            removed.append(path)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(publish.os, "open", open_after_removal)
    (result,) = runtime.write_cache([Raw("w", OK)], tmp_path, writer_config=QUIET)
    monkeypatch.undo()
    assert result == drt.CacheWriteSuccess("w", tmp_path / "w") and removed
    assert os.listdir(tmp_path) == ["w"]


def test_without_hard_links_the_lock_file_is_created_by_name(runtime, tmp_path, monkeypatch):
    """vfat, exFAT and some FUSE file systems refuse link(2) (EPERM): the lock file is then
    created by name, as dataset-rt does."""

    def no_links(*_args, **_kw):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(publish.os, "link", no_links)
    results = runtime.write_cache([Raw("a", OK), Raw("b", OK)], tmp_path, writer_config=QUIET)
    monkeypatch.undo()
    assert results == [drt.CacheWriteSuccess(n, tmp_path / n) for n in "ab"]
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_release_closes_once_and_raises_nothing(tmp_path, monkeypatch):
    staging = publish.Staging(tmp_path, "a")
    staging.acquire()
    fd = staging._fd
    closed = []
    real_close = os.close

    def failing_close(number):
        closed.append(number)
        real_close(number)  # released, as Linux does, then the error
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(publish.os, "close", failing_close)  # (os.close itself: rmtree's closes fail too)
    monkeypatch.setattr(publish.os, "unlink", _eio)
    staging.release()
    staging.release()
    monkeypatch.undo()
    assert closed.count(fd) == 1 and staging._fd is None
    assert ".a.lock" in os.listdir(tmp_path / "tmp")  # its unlink failed: a free lock (and a stale dir)
    with pytest.raises(OSError):
        os.fstat(fd)
    nxt = publish.Staging(tmp_path, "a")  # the next writer of the name takes both over
    assert os.listdir(nxt.acquire()) == []
    nxt.release()
    assert os.listdir(tmp_path / "tmp") == []
