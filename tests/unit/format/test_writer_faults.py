"""Writer faults: interrupts, the profiler, existing targets, stale staging, concurrent writers,
the publish race, disk full, and from_cache_sources reuse.

Reference: dataset_rt-0.4.8-behaviour.md §2.5. Process-level faults use fork + waitpid; lock
contention is simulated in-process (flock locks belong to an open file description, so a second
open + flock in this process conflicts exactly like another process would).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import pytest

import datasetrt as drt
from datasetrt.format import durable, publish, shards
from datasetrt.format.writer import StageProfile, write_sources
from tests.conftest import QUIET
from tests.unit.format.sources import Raw, assert_big_failed_small_written, write_past_fsize_limit

OK = [(b"x", {"a": 1})]
STAGES = {
    "compression",
    "disk_write",
    "finish_index",
    "finish_manifest",
    "finish_metadata",
    "ingress_wait",
    "metadata_validate",
    "publish",
    "python_extract",
    "python_next",
    "record_encode",
    "shard_flush",
}


class Interrupting:
    """Yields `before` good items (several committed blocks), then raises `exc`."""

    def __init__(self, name, exc, before=1):
        self.name, self.exc, self.before = name, exc, before

    def __iter__(self):
        for i in range(self.before):
            yield (b"x" * 10, {"a": i})
        raise self.exc


class MustNotIterate:
    def __init__(self, name):
        self.name = name

    def __iter__(self):
        raise AssertionError(f"source {self.name!r} must not be iterated")


# -- interrupts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)], ids=["KeyboardInterrupt", "SystemExit"])
def test_interrupt_propagates_and_cleans_up(runtime, tmp_path, exc):
    sources = [Raw("a", OK), Interrupting("ki", exc, before=300), MustNotIterate("c")]
    with pytest.raises(type(exc)):
        runtime.write_cache(sources, tmp_path, writer_config=QUIET)
    assert sorted(os.listdir(tmp_path)) == ["a"]  # no staging dir or lock left, no staging root
    ds = runtime.cached_dataset([tmp_path / "a"], reader_config=drt.ReaderConfig(seed=0))
    assert [(s.data, s.metadata) for s in ds] == [(b"x", {"a": 1})]


# -- profiler -----------------------------------------------------------------------------------


def _profiled(tmp_path):
    path = tmp_path / "profile.json"
    cfg = drt.WriterConfig(show_progress=False, profiler=drt.WriterProfilerConfig(enabled=True, path=path))
    return cfg, path


def test_profiler_json_layout_and_stage_names(runtime, tmp_path):
    cfg, path = _profiled(tmp_path)
    runtime.write_cache([Raw("a", OK), Raw("b", OK * 3)], tmp_path / "base", writer_config=cfg)
    doc = json.loads(path.read_text())
    assert doc["format_version"] == 1 and isinstance(doc["elapsed_ns"], int)
    assert [s["source_name"] for s in doc["sources"]] == ["a", "b"]
    for source in doc["sources"]:
        assert {st["name"] for st in source["stages"]} == STAGES
        assert all(set(st) == {"name", "calls", "total_ns", "bytes"} for st in source["stages"])
        calls = {st["name"]: st["calls"] for st in source["stages"]}
        assert calls["publish"] == 1 and calls["finish_manifest"] == 1 and calls["python_next"] >= 1


def test_profiler_json_written_on_keyboard_interrupt(runtime, tmp_path):
    cfg, path = _profiled(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache([Raw("a", OK), Interrupting("ki", KeyboardInterrupt())], tmp_path / "b", writer_config=cfg)
    assert json.loads(path.read_text())["format_version"] == 1


def test_profiler_on_keyboard_interrupt_keeps_finished_and_interrupted_sources(runtime, tmp_path):
    cfg, path = _profiled(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache([Raw("a", OK), Interrupting("ki", KeyboardInterrupt())], tmp_path / "b", writer_config=cfg)
    doc = json.loads(path.read_text())
    assert [s["source_name"] for s in doc["sources"]] == ["a", "ki"]
    assert {st["name"] for st in doc["sources"][0]["stages"]} == STAGES


def test_write_sources_fills_profiles_in_place_before_an_interrupt(tmp_path):
    cfg, _ = _profiled(tmp_path)
    profiles: list = []
    with pytest.raises(KeyboardInterrupt):
        write_sources(
            [Raw("a", OK), Interrupting("ki", KeyboardInterrupt())],
            tmp_path,
            cfg,
            pool=None,
            progress=None,
            profiles=profiles,
        )
    assert [name for name, _ in profiles] == ["a", "ki"]
    assert all(isinstance(p, StageProfile) for _, p in profiles)
    assert profiles[1][1].stages["python_next"][0] == 1 and profiles[1][1].stages["publish"][0] == 0


# -- existing targets and the publish race ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["dir", "file", "empty-dir", "dangling-symlink"])
def test_existing_target_is_an_error_and_untouched(runtime, tmp_path, kind):
    target = tmp_path / "ex"
    if kind == "file":
        target.write_bytes(b"keep")
    elif kind == "dangling-symlink":
        target.symlink_to(tmp_path / "nowhere")
    else:
        target.mkdir()
        if kind == "dir":
            (target / "keep").write_bytes(b"keep")
    before = sorted(os.listdir(target)) if target.is_dir() else None
    results = runtime.write_cache([Raw("ex", OK), Raw("ok", OK)], tmp_path, writer_config=QUIET)
    assert results[0] == drt.CacheWriteError("ex", f"cache path already exists: {target.absolute()}")
    assert isinstance(results[1], drt.CacheWriteSuccess)
    assert (sorted(os.listdir(target)) if target.is_dir() else None) == before
    assert kind != "file" or target.read_bytes() == b"keep"
    assert not (tmp_path / "tmp").exists()


def test_publish_refuses_a_target_created_after_the_check(runtime, tmp_path, monkeypatch):
    target = tmp_path / "race"
    original = shards.StagedCache.finish

    def finish_then_race(self):
        original(self)
        target.mkdir()  # another party creates the target between the check and the rename

    monkeypatch.setattr(shards.StagedCache, "finish", finish_then_race)
    (result,) = runtime.write_cache([Raw("race", OK)], tmp_path, writer_config=QUIET)
    assert result == drt.CacheWriteError("race", f"cache path already exists: {target.absolute()}")
    assert target.is_dir() and os.listdir(target) == []
    assert not (tmp_path / "tmp").exists()


def test_rename_noreplace_fallback_refuses_existing(tmp_path, monkeypatch):
    monkeypatch.setattr(durable, "_renameat2", None)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    with pytest.raises(FileExistsError):
        durable.rename_noreplace(src, dst)
    dst.rmdir()
    durable.rename_noreplace(src, dst)
    assert dst.is_dir() and not src.exists()


# -- stale staging and concurrent writers ------------------------------------------------------------


def test_stale_staging_dir_from_a_dead_writer_is_recovered(runtime, tmp_path):
    stale = tmp_path / "tmp" / "s"
    (stale / "shards").mkdir(parents=True)
    (stale / "shards" / "000000.bin").write_bytes(b"garbage")
    (stale / "manifest.json").write_text("{")
    (tmp_path / "tmp" / ".s.lock").write_bytes(b"")  # left behind, but nobody holds it
    (result,) = runtime.write_cache([Raw("s", OK)], tmp_path, writer_config=QUIET)
    assert result == drt.CacheWriteSuccess("s", tmp_path / "s")
    assert not (tmp_path / "tmp").exists()  # the stale dir and lock are gone, and so is the root
    ds = runtime.cached_dataset([result.path], reader_config=drt.ReaderConfig(seed=0, validate_cache=True))
    assert [s.data for s in ds] == [b"x"]


def _hold_lock(path: Path, flock=fcntl.flock) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


@pytest.mark.parametrize("name", ["w", "w" * 255], ids=["short", "255-bytes"])
def test_live_writer_lock_is_respected(runtime, tmp_path, name):
    live = tmp_path / "tmp" / name
    (live / "shards").mkdir(parents=True)
    (live / "in-progress").write_bytes(b"other writer")
    lock = ".w.lock" if name == "w" else f".{hashlib.sha256(name.encode()).hexdigest()}.lock"
    assert publish.lock_file_name(name) == lock
    fd = _hold_lock(tmp_path / "tmp" / lock)
    try:
        results = runtime.write_cache([Raw(name, OK), Raw("ok", OK)], tmp_path, writer_config=QUIET)
    finally:
        os.close(fd)
    assert isinstance(results[0], drt.CacheWriteError) and results[0].source_name == name
    assert "another process is writing" in results[0].message
    assert isinstance(results[1], drt.CacheWriteSuccess)
    assert (live / "in-progress").read_bytes() == b"other writer"  # the live writer's staging is untouched
    assert not (tmp_path / name).exists()


def test_lock_on_an_unlinked_inode_is_not_trusted(runtime, tmp_path, monkeypatch):
    """A writer that opened the lock file just before its holder unlinked it must not proceed
    while a third writer holds the new lock file of the same name."""
    lock_path = tmp_path / "tmp" / ".w.lock"
    lock_path.parent.mkdir()
    lock_path.touch()  # the holder's lock file, which this writer opens (a missing one is created locked)
    real_flock = fcntl.flock
    held = []

    def flock_after_handover(fd, op):
        if not held:  # between our open() and flock(): holder unlinks, a new writer locks a new file
            os.unlink(lock_path)
            held.append(_hold_lock(lock_path, real_flock))
        return real_flock(fd, op)

    monkeypatch.setattr(publish.fcntl, "flock", flock_after_handover)
    try:
        (result,) = runtime.write_cache([Raw("w", OK)], tmp_path, writer_config=QUIET)
    finally:
        monkeypatch.undo()
        for fd in held:
            os.close(fd)
    assert isinstance(result, drt.CacheWriteError) and "another process is writing" in result.message
    assert not (tmp_path / "w").exists()


# -- disk full ------------------------------------------------------------------------------------


def test_disk_full_is_an_io_error_value_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE in a forked child: writes past 64 KiB fail with EFBIG (SIGXFSZ ignored)."""
    items = [(bytes([i % 251]) * 4096, {"a": i}) for i in range(64)]
    big, small = write_past_fsize_limit(tmp_path, 64 * 1024, 1, items)
    assert_big_failed_small_written(tmp_path, big, small)


# -- from_cache_sources reuse -----------------------------------------------------------------------


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_reused_directory_without_manifest_is_an_error_value(runtime, tmp_path):
    """Deliberate difference: dataset-rt 0.4.8 raises ValueError("missing manifest: ...") here."""
    (tmp_path / "broken" / "shards").mkdir(parents=True)
    out = runtime.from_cache_sources(
        [MustNotIterate("broken"), Raw("good", OK)],
        tmp_path,
        reader_config=drt.ReaderConfig(seed=0),
        writer_config=QUIET,
    )
    assert isinstance(out, drt.CacheSourcesDatasetSuccess)
    bad, good = out.results
    assert isinstance(bad, drt.CacheWriteError) and bad.source_name == "broken"
    assert "missing manifest" in bad.message
    assert good == drt.CacheWriteSuccess("good", tmp_path / "good")
    assert out.dataset.cache_paths == [tmp_path / "good"]
    alone = runtime.from_cache_sources(
        [MustNotIterate("broken")], tmp_path, reader_config=drt.ReaderConfig(seed=0), writer_config=QUIET
    )
    assert isinstance(alone, drt.CacheSourcesDatasetError)
    assert alone.message.startswith("no caches were written: broken: missing manifest")


def test_valid_reused_cache_is_not_rewritten(runtime, tmp_path):
    runtime.write_cache([Raw("r", OK * 3)], tmp_path, writer_config=QUIET)
    before = _mtimes(tmp_path / "r")
    out = runtime.from_cache_sources(
        [MustNotIterate("r"), Raw("n", OK)], tmp_path, reader_config=drt.ReaderConfig(seed=0), writer_config=QUIET
    )
    assert isinstance(out, drt.CacheSourcesDatasetSuccess)
    assert out.results == [drt.CacheWriteSuccess("r", tmp_path / "r"), drt.CacheWriteSuccess("n", tmp_path / "n")]
    assert _mtimes(tmp_path / "r") == before
    assert len(out.dataset) == 4


def test_reuse_with_validate_cache_detects_a_flipped_shard_byte(runtime, tmp_path):
    runtime.write_cache([Raw("v", OK * 3)], tmp_path, writer_config=QUIET)
    shard = tmp_path / "v" / "shards" / "000000.bin"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    cfg = drt.WriterConfig(show_progress=False, validate_cache=True)
    out = runtime.from_cache_sources(
        [MustNotIterate("v")], tmp_path, reader_config=drt.ReaderConfig(seed=0), writer_config=cfg
    )
    assert isinstance(out, drt.CacheSourcesDatasetError)
    (result,) = out.results
    assert result.source_name == "v" and result.message.startswith("checksum mismatch for ")
    assert result.message == (  # dataset-rt's text, then the damaged sample by its per-record checksum
        f"checksum mismatch for {shard}: damaged record: sample 2 of {tmp_path / 'v'} (per-record checksum mismatch)"
    )
