"""The writer's failure paths after staging, with real failing syscalls: a write of two sources runs
in a child with the fault-injection shim preloaded (tests/reliability/faultshim.c, faultrun.py),
which fails one chosen call with a chosen errno.

Contract (docs/reliability.md, "Writer failure paths"): whatever fails, write_cache returns one
result per source, each saying what is true of its cache; no descriptor is leaked or closed twice
(a second close of a released number could close a descriptor someone else was given since); a
lock file is never left behind by a writer that created it; a published cache is never reported
as failed, and a cache whose rename is not known durable is a `CacheWriteSuccess(durable=False)`
that the next write of the name confirms.
"""

from __future__ import annotations

import os
from pathlib import Path

import datasetrt as drt
from tests.conftest import ListSource, sample_items, writer_config
from tests.reliability import probe
from tests.reliability.faultrun import run_faulted

SOURCES = [["a", 5], ["b", 7]]


def _glob_literal(path: Path) -> str:
    """`path` as an fnmatch(3) pattern matching only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in str(path))


def _write(faultshim, tmp_path, rules: str) -> tuple[Path, dict]:
    base = tmp_path / "caches"
    return base, run_faulted(faultshim, rules, tmp_path / "faults.log", "write", base=str(base), sources=SOURCES)


def _results(outcome: dict) -> list[tuple]:
    assert "error" not in outcome, f"write_cache raised: {outcome['error']}"
    return [(r["type"], r["name"], r["durable"]) for r in outcome["results"]]


def _assert_complete(base: Path, names=("a", "b")) -> None:
    for name, n in SOURCES:
        if name in names:
            result = probe(base / name, validate=True)
            assert result.stage is None, result.error
            assert [(s.data, s.metadata) for s in result.samples] == sample_items(n, tag=name)


def _rewrite(base: Path) -> list:
    with drt.DatasetRuntime(num_workers=2) as rt:
        return rt.write_cache(
            [ListSource(n, sample_items(k, tag=n)) for n, k in SOURCES], base, writer_config=writer_config()
        )


# -- 9: releasing a lock ---------------------------------------------------------------------------


def test_a_failing_close_of_a_lock_file_still_reports_every_cache(faultshim, tmp_path):
    """close(2) of the first cache's lock fails with EIO (Linux releases the descriptor anyway):
    both caches are published and reported, nothing is closed twice or leaked, no lock is left."""
    base, outcome = _write(faultshim, tmp_path, "close path=*.lock nth=1 errno=EIO")
    assert outcome["faults"] == [f"close 5 {base}/tmp/.a.lock"]
    assert _results(outcome) == [("CacheWriteSuccess", "a", True), ("CacheWriteSuccess", "b", True)]
    assert outcome["leaked"] == [] and outcome["lost"] == []
    assert sorted(os.listdir(base)) == ["a", "b"]  # no lock file, so no staging root either
    _assert_complete(base)


def test_a_failing_unlink_of_a_lock_file_leaves_a_free_lock_the_next_write_drops(faultshim, tmp_path):
    base, outcome = _write(faultshim, tmp_path, "unlink path=*.lock nth=1 errno=EIO")
    assert outcome["faults"] == [f"unlink 5 {base}/tmp/.a.lock"]
    assert _results(outcome) == [("CacheWriteSuccess", "a", True), ("CacheWriteSuccess", "b", True)]
    assert outcome["leaked"] == [] and outcome["lost"] == []
    assert os.listdir(base / "tmp") == [".a.lock"]  # unlocked: it blocks no writer
    _assert_complete(base)
    results = _rewrite(base)
    assert [type(r).__name__ for r in results] == ["CacheWriteError"] * 2
    assert all("cache path already exists" in r.message for r in results)
    assert sorted(os.listdir(base)) == ["a", "b"]  # the write that found "a" published dropped its lock


# -- 10: the fsync of <base> after the renames -----------------------------------------------------


def test_a_failing_fsync_of_the_base_reports_published_caches_as_not_durable(faultshim, tmp_path):
    base = tmp_path / "caches"
    _, outcome = _write(faultshim, tmp_path, f"fsync path={_glob_literal(base)} nth=1 errno=EIO")
    assert outcome["faults"] == [f"fsync 5 {base}"]
    assert _results(outcome) == [("CacheWriteSuccess", "a", False), ("CacheWriteSuccess", "b", False)]
    assert [r["path"] for r in outcome["results"]] == [str(base / "a"), str(base / "b")]
    assert outcome["leaked"] == [] and outcome["lost"] == []
    _assert_complete(base)
    assert sorted(os.listdir(base / "tmp")) == [".a.unsynced", ".b.unsynced"]
    # The retry fsyncs <base> again (it succeeds now) and reports the same caches, durable.
    retry = _rewrite(base)
    assert retry == [drt.CacheWriteSuccess("a", base / "a"), drt.CacheWriteSuccess("b", base / "b")]
    assert all(r.durable for r in retry)
    assert sorted(os.listdir(base)) == ["a", "b"]  # markers consumed, staging root removed
    again = _rewrite(base)  # confirmed once: a later write of the names is the usual refusal
    assert [r.message for r in again] == [f"cache path already exists: {base / n}" for n in "ab"]


# -- 11: flock fails ------------------------------------------------------------------------------


def test_a_failing_flock_is_a_typed_error_and_leaves_no_lock_file(faultshim, tmp_path):
    base, outcome = _write(faultshim, tmp_path, "flock errno=ENOLCK")
    assert len(outcome["faults"]) == 2 and all(f.startswith("flock 37 ") for f in outcome["faults"])
    assert _results(outcome) == [("CacheWriteError", "a", None), ("CacheWriteError", "b", None)]
    for result, name in zip(outcome["results"], "ab"):
        assert result["message"] == f"I/O error: No locks available (os error 37): {base}/tmp/.{name}.lock"
    assert outcome["leaked"] == [] and outcome["lost"] == []
    assert os.listdir(base) == []  # no lock file, no staging dir, no staging root
    assert [type(r).__name__ for r in _rewrite(base)] == ["CacheWriteSuccess"] * 2


def test_a_lock_file_that_was_there_is_kept_when_flock_fails(faultshim, tmp_path):
    """A lock file this writer did not create may be another writer's: it stays."""
    base = tmp_path / "caches"
    (base / "tmp").mkdir(parents=True)
    (base / "tmp" / ".a.lock").touch()
    _, outcome = _write(faultshim, tmp_path, "flock path=*/.a.lock errno=ENOLCK")
    assert outcome["faults"] == [f"flock 37 {base}/tmp/.a.lock"]
    assert _results(outcome) == [("CacheWriteError", "a", None), ("CacheWriteSuccess", "b", True)]
    assert os.listdir(base / "tmp") == [".a.lock"] and outcome["leaked"] == []
