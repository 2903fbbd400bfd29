"""Faults while writing: a writer process SIGKILLed at chosen moments, and two writers (plus a
reader) racing on one source name.

Publication contract (docs/storage-format.md, "Publication and crash safety"): <base>/<name>
either does not exist or is a complete cache that passes validate_cache=True; a stale staging
directory left by a killed writer never blocks the next write; of two concurrent writers of one
name exactly one publishes and the other gets a CacheWriteError naming the conflict.

Writers run in forked children (os.fork) that report progress through a pipe. A child that must
stop at an exact moment blocks on a second pipe that the parent never writes, so the kill lands
exactly there; the end-of-source kills are deliberately racy (finish, fsync, rename or after).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.errors import MissingManifestError
from tests.conftest import sample_items, writer_config
from tests.reliability import probe, wait_until

N_ITEMS = 700  # > 2 blocks of 256 records, several shards
WRITER = writer_config("lz4", max_shard_bytes=16 << 10)
KILLS = {"n": 0}


class SignallingSource:
    """Yields sample_items(n); writes the count of yielded items (u32) to `progress_fd` after
    each one; after `stop_after` items blocks forever reading `hold_fd` (the parent kills it, or
    writes one byte to release it)."""

    def __init__(self, name, n, progress_fd, stop_after=None, hold_fd=None):
        self.name, self.items = name, sample_items(n, tag="w")
        self.progress_fd, self.stop_after, self.hold_fd = progress_fd, stop_after, hold_fd

    def __iter__(self):
        for k, (data, meta) in enumerate(self.items):
            if k == self.stop_after:
                os.write(self.progress_fd, struct.pack("<I", k))
                os.read(self.hold_fd, 1)  # blocks until the parent releases or kills us
            yield drt.CacheInput(data, meta)
        os.write(self.progress_fd, struct.pack("<I", len(self.items)))


def expected_samples(name: str, n: int = N_ITEMS) -> list[tuple]:
    return [(data, meta) for data, meta in sample_items(n, tag="w")]


def fork_writer(base: Path, name: str, *, stop_after=None, n=N_ITEMS):
    """Fork a child that writes one source; returns (pid, progress read fd, hold write fd,
    result read fd). The child sends the pickled result through the result pipe and _exits."""
    progress_r, progress_w = os.pipe()
    hold_r, hold_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest, no cleanup, just write and exit
        code = 0
        try:
            os.close(progress_r), os.close(hold_w), os.close(result_r)
            with drt.DatasetRuntime(num_workers=1) as rt:
                [res] = rt.write_cache(
                    SignallingSource(name, n, progress_w, stop_after, hold_r), base, writer_config=WRITER
                )
            os.write(result_w, pickle.dumps((type(res).__name__, str(getattr(res, "message", "")))))
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(progress_w), os.close(hold_r), os.close(result_w)
    return pid, progress_r, hold_w, result_r


def read_progress(fd: int) -> int:
    data = os.read(fd, 4)  # blocks until the child reports (its own progress is the event)
    assert len(data) == 4, "writer child exited before reporting progress"
    return struct.unpack("<I", data)[0]


def reap(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return status


def read_result(fd: int):
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return pickle.loads(b"".join(chunks)) if chunks else None


def assert_published_or_absent(target: Path, n: int = N_ITEMS) -> str:
    """<base>/<name> is absent, or a complete cache that validates and holds exactly the items."""
    if not os.path.lexists(target):
        return "absent"
    result = probe(target, validate=True)
    assert result.stage is None, f"a partial cache was published: {result.error!r}"
    assert [(s.data, s.metadata) for s in result.samples] == expected_samples(target.name, n)
    return "complete"


def rerun_succeeds(base: Path, name: str) -> None:
    """The same write in this process succeeds (or finds the cache the child published), and the
    staging area holds nothing of the dead writer afterwards."""
    target = base / name
    with drt.DatasetRuntime(num_workers=2) as rt:
        [res] = rt.write_cache(
            SignallingSource(name, N_ITEMS, os.open(os.devnull, os.O_WRONLY)), base, writer_config=WRITER
        )
    if isinstance(res, drt.CacheWriteError):
        assert "cache path already exists" in res.message and target.exists(), res
    else:
        assert isinstance(res, drt.CacheWriteSuccess), res
    assert assert_published_or_absent(target) == "complete"
    assert not (base / "tmp" / name).exists(), "stale staging directory left behind"


# -- SIGKILL at exact moments ----------------------------------------------------------------------


@pytest.mark.parametrize("stop_after", [0, 1, 255, 256, 513, N_ITEMS - 1])
def test_writer_killed_mid_source_publishes_nothing_and_rerun_recovers(tmp_path, stop_after):
    base = tmp_path / "caches"
    pid, progress, hold, result = fork_writer(base, "victim", stop_after=stop_after)
    try:
        assert read_progress(progress) == stop_after
        # the child is blocked inside the source: the lock is held and staging is populated
        assert (base / "tmp" / "victim").is_dir()
    finally:
        os.kill(pid, signal.SIGKILL)
        status = reap(pid)
        os.close(progress), os.close(hold)
    KILLS["n"] += 1
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert read_result(result) is None
    assert assert_published_or_absent(base / "victim") == "absent"
    assert (base / "tmp" / "victim").exists(), "the killed writer's staging dir should be stale, not gone"
    rerun_succeeds(base, "victim")


@pytest.mark.parametrize("attempt", range(8))
def test_writer_killed_around_finish_and_publish(tmp_path, attempt):
    """Killed right after the source is exhausted: somewhere in compression of the last block,
    metadata/index/sidecar/manifest writing, fsync, rename, or after. Racy by design; every
    landing spot must leave an absent or complete cache."""
    base = tmp_path / "caches"
    pid, progress, hold, result = fork_writer(base, "victim")
    assert read_progress(progress) == N_ITEMS
    os.kill(pid, signal.SIGKILL)
    reap(pid)
    os.close(progress), os.close(hold), os.close(result)
    KILLS["n"] += 1
    assert_published_or_absent(base / "victim")
    rerun_succeeds(base, "victim")


# -- concurrent writers and a reader ---------------------------------------------------------------


def test_second_writer_fails_fast_and_reader_never_sees_partial_cache(tmp_path):
    base = tmp_path / "caches"
    target = base / "shared"
    pid, progress, hold, result = fork_writer(base, "shared", stop_after=300)
    try:
        assert read_progress(progress) == 300
        # a second writer while the first holds the lock
        with drt.DatasetRuntime(num_workers=1) as rt:
            [res] = rt.write_cache(
                SignallingSource("shared", 10, os.open(os.devnull, os.O_WRONLY)), base, writer_config=WRITER
            )
        assert isinstance(res, drt.CacheWriteError), res
        assert "another process is writing cache 'shared'" in res.message
        # a reader during the write: not published yet
        mid = probe(target, validate=False)
        assert isinstance(mid.error, MissingManifestError), mid
        os.write(hold, b"x")  # release the first writer
        assert read_progress(progress) == N_ITEMS
    finally:
        status = reap(pid)
        os.close(progress), os.close(hold)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert read_result(result) == ("CacheWriteSuccess", "")
    assert assert_published_or_absent(target) == "complete"
    with drt.DatasetRuntime(num_workers=1) as rt:  # and a later writer of the same name
        [res] = rt.write_cache(
            SignallingSource("shared", 10, os.open(os.devnull, os.O_WRONLY)), base, writer_config=WRITER
        )
    assert isinstance(res, drt.CacheWriteError) and "cache path already exists" in res.message


@pytest.mark.parametrize("attempt", range(6))
def test_two_racing_writers_exactly_one_publishes(tmp_path, attempt):
    """Two children start the same write at once while this process keeps opening the target:
    exactly one CacheWriteSuccess; the loser names the conflict; the reader only ever sees
    'not published' or the complete cache."""
    base = tmp_path / "caches"
    target = base / "raced"
    writers = [fork_writer(base, "raced", n=300) for _ in range(2)]
    seen: set[str] = set()
    reaped: set[int] = set()

    def both_done():
        outcome = probe(target, validate=True, threaded=False)
        if outcome.stage is None:
            assert [(s.data, s.metadata) for s in outcome.samples] == expected_samples("raced", 300)
            seen.add("complete")
        else:
            assert isinstance(outcome.error, MissingManifestError), repr(outcome.error)
            seen.add("absent")
        for pid, *_ in writers:
            if pid not in reaped and os.waitpid(pid, os.WNOHANG) != (0, 0):
                reaped.add(pid)
        return len(reaped) == len(writers)

    wait_until(both_done, 60.0, "both writers to exit")
    results = []
    for _pid, progress, hold, result in writers:
        os.close(progress), os.close(hold)
        results.append(read_result(result))
    kinds = sorted(kind for kind, _ in results)
    assert kinds == ["CacheWriteError", "CacheWriteSuccess"], results
    [loser] = [msg for kind, msg in results if kind == "CacheWriteError"]
    assert "another process is writing cache 'raced'" in loser or "cache path already exists" in loser, loser
    assert assert_published_or_absent(target, 300) == "complete"
    assert not (base / "tmp" / "raced").exists()
