"""Faults in batched publication: a writer of several small caches SIGKILLed while the batch is
staged, right after the batch's data sync, or between two of its renames.

Contract (docs/storage-format.md, "Publication and crash safety"): the writer syncs a batch of
staged caches once (syncfs, or concurrent fsyncs where syncfs cannot report errors), then renames
them into place in input order. Whatever the moment of the kill, every <base>/<name> is absent
or a complete cache that validates, and a rerun publishes the rest.

The child pauses at an exact point by blocking on a pipe the parent never writes: inside a
source, or around the real sync / rename call (wrapped in the child only), so the kill lands
exactly there. Both sync paths (syncfs and the fsync fallback) are exercised.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.format import publish
from tests.conftest import ListSource, sample_items, writer_config
from tests.reliability import probe

NAMES = [f"c{k}" for k in range(5)]
ITEMS = {name: sample_items(20 + k, seed=k, tag=name) for k, name in enumerate(NAMES)}
CONFIG = writer_config("lz4")


class Blocking(ListSource):
    """A source that, after `stop_after` items, reports on `report_fd` and blocks on `hold_fd`."""

    def __init__(self, name, items, stop_after, report_fd, hold_fd):
        super().__init__(name, items)
        self.stop_after, self.report_fd, self.hold_fd = stop_after, report_fd, hold_fd

    def __iter__(self):
        for k, item in enumerate(super().__iter__()):
            if k == self.stop_after:
                os.write(self.report_fd, b"s")
                os.read(self.hold_fd, 1)
            yield item


def _pause_after(function, calls_before_pause: int, report_fd: int, hold_fd: int):
    """`function` that, once it has returned `calls_before_pause` times, reports and blocks."""
    count = [0]

    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        count[0] += 1
        if count[0] == calls_before_pause:
            os.write(report_fd, b"p")
            os.read(hold_fd, 1)
        return result

    return wrapped


def _kill_writer_at(base: Path, moment: str, sync: str) -> None:
    """Fork a child writing NAMES in one batch; SIGKILL it once it reports `moment`."""
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: set up the pause, write, never return into pytest
        try:
            os.close(report_r), os.close(hold_w)
            if sync == "fsync":
                publish.SYNCFS_REPORTS_ERRORS = False
            else:
                publish.Publisher.SYNCFS_MIN_CACHES = 1  # this batch of five syncs the filesystem
            sources = [ListSource(n, ITEMS[n]) for n in NAMES]
            if moment == "staged":  # the 4th source blocks: three caches staged, nothing synced
                sources[3] = Blocking(NAMES[3], ITEMS[NAMES[3]], 5, report_w, hold_r)
            elif moment == "synced":  # the batch is durable, nothing renamed
                name = "syncfs" if sync == "syncfs" else "fsync_paths"
                setattr(publish, name, _pause_after(getattr(publish, name), 1, report_w, hold_r))
            else:  # "renamed-2": two caches renamed into place, three not
                publish.rename_noreplace = _pause_after(publish.rename_noreplace, 2, report_w, hold_r)
            with drt.DatasetRuntime(num_workers=2) as rt:
                rt.write_cache(sources, base, writer_config=CONFIG)
        finally:
            os._exit(1)  # reaching here means the pause never happened
    os.close(report_w), os.close(hold_r)
    try:
        assert os.read(report_r, 1), "the writer exited before reaching the pause"
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(report_r), os.close(hold_w)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _published(base: Path) -> list[str]:
    """Names published under base; each must be a complete cache holding exactly its items."""
    names = sorted(n for n in os.listdir(base) if n != "tmp") if base.exists() else []
    for name in names:
        result = probe(base / name, validate=True)
        assert result.stage is None, f"{name}: a partial cache was published: {result.error!r}"
        assert [(s.data, s.metadata) for s in result.samples] == ITEMS[name]
    return names


@pytest.mark.parametrize("sync", ["syncfs", "fsync"])
@pytest.mark.parametrize(("moment", "expected"), [("staged", []), ("synced", []), ("renamed-2", NAMES[:2])])
def test_killed_batch_publishes_a_complete_prefix_and_a_rerun_the_rest(tmp_path, moment, expected, sync):
    if sync == "syncfs" and not publish.SYNCFS_REPORTS_ERRORS:
        pytest.skip("syncfs does not report errors on this kernel; the writer uses fsync")
    base = tmp_path / "caches"
    _kill_writer_at(base, moment, sync)
    assert _published(base) == expected
    assert os.listdir(base / "tmp"), "the killed writer's staging dirs should be stale, not gone"
    with drt.DatasetRuntime(num_workers=2) as rt:
        results = rt.write_cache([ListSource(n, ITEMS[n]) for n in NAMES], base, writer_config=CONFIG)
    for name, result in zip(NAMES, results):
        if name in expected:
            assert result == drt.CacheWriteError(name, f"cache path already exists: {(base / name).absolute()}")
        else:
            assert result == drt.CacheWriteSuccess(name, base / name)
    assert _published(base) == NAMES
    assert not (base / "tmp").exists(), "stale staging dirs and locks are recovered, then the root removed"
