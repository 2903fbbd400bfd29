"""Writing over an existing cache (datasetrt/format/overwrite.py through `DatasetRuntime.write_cache(
..., if_exists=...)`): dataset-rt's default error, keeping an identical cache, an atomic replace
(a concurrent reader of the name never finds it missing), the refusals, and what is left behind."""

from __future__ import annotations

import os
import threading

import pytest

import datasetrt as drt
from datasetrt.errors import ArgumentTypeError, ConfigError
from datasetrt.format import overwrite
from tests.conftest import ListSource, sample_items

CONFIG = drt.WriterConfig(show_progress=False)


def write(base, sources, **kwargs):
    with drt.DatasetRuntime(num_workers=1) as rt:
        return rt.write_cache(sources, base, writer_config=CONFIG, **kwargs)


def read(path) -> list:
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=None)
    try:
        return [(s.data, s.metadata) for s in ds]
    finally:
        ds.close()


def test_the_default_is_dataset_rts_error_and_touches_nothing(tmp_path):
    [first] = write(tmp_path, [ListSource("a", sample_items(20))])
    before = os.stat(first.path / "manifest.json")
    results = write(tmp_path, [ListSource("a", sample_items(30)), ListSource("b", sample_items(5))])
    assert results == [
        drt.CacheWriteError("a", f"cache path already exists: {(tmp_path / 'a').absolute()}"),
        drt.CacheWriteSuccess("b", tmp_path / "b"),
    ]
    assert os.stat(first.path / "manifest.json").st_ino == before.st_ino and len(read(first.path)) == 20
    assert write(tmp_path, [ListSource("a", sample_items(30))], if_exists="error") == results[:1]


def test_skip_identical_keeps_the_same_cache_and_refuses_a_different_one(tmp_path):
    items = sample_items(40, seed=3)
    [first] = write(tmp_path, [ListSource("a", items)])
    kept = os.stat(first.path / "manifest.json")
    assert write(tmp_path, [ListSource("a", items)], if_exists="skip_identical") == [
        drt.CacheWriteSuccess("a", tmp_path / "a")
    ]
    assert os.stat(first.path / "manifest.json").st_ino == kept.st_ino  # the existing files, untouched
    [changed] = write(tmp_path, [ListSource("a", items[:-1])], if_exists="skip_identical")
    assert isinstance(changed, drt.CacheWriteError)
    assert changed.message.startswith(f"cache path already exists: {(tmp_path / 'a').absolute()}: it holds a ")
    assert "sample_count" in changed.message and "if_exists='replace' overwrites it" in changed.message
    assert read(first.path) == [(d, m) for d, m in items]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no staging dir left


def test_skip_identical_refuses_what_is_no_published_cache(tmp_path):
    (tmp_path / "a").mkdir()  # a directory without a manifest (an interrupted copy, say)
    (tmp_path / "f").write_bytes(b"not a cache")
    results = write(
        tmp_path, [ListSource("a", sample_items(5)), ListSource("f", sample_items(5))], if_exists="skip_identical"
    )
    for result in results:
        assert isinstance(result, drt.CacheWriteError) and "it is not a published cache" in result.message
    assert "(os error 2)" in results[0].message and "(os error 20)" in results[1].message
    assert (tmp_path / "f").read_bytes() == b"not a cache"


def test_replace_swaps_in_the_new_cache_and_removes_the_old(tmp_path):
    [old] = write(tmp_path, [ListSource("a", sample_items(30, seed=1))])
    (tmp_path / "f").write_bytes(b"in the way")
    new_items = sample_items(12, seed=2)
    results = write(tmp_path, [ListSource("a", new_items), ListSource("f", new_items)], if_exists="replace")
    assert results == [drt.CacheWriteSuccess("a", tmp_path / "a"), drt.CacheWriteSuccess("f", tmp_path / "f")]
    assert read(old.path) == read(tmp_path / "f") == [(d, m) for d, m in new_items]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "f"]  # old cache and staging removed
    fresh = write(tmp_path, [ListSource("c", new_items)], if_exists="replace")  # a free name: a plain write
    assert fresh == [drt.CacheWriteSuccess("c", tmp_path / "c")]


def test_a_reader_of_the_name_never_finds_it_missing_during_replaces(tmp_path):
    write(tmp_path, [ListSource("a", sample_items(10))])
    manifest = tmp_path / "a" / "manifest.json"
    stop, missing, looks = threading.Event(), [], [0]

    def look() -> None:
        while not stop.is_set() or looks[0] == 0:
            looks[0] += 1
            if not manifest.exists():
                missing.append(looks[0])

    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        counts = []
        for n in range(6):
            [result] = write(tmp_path, [ListSource("a", sample_items(10 + n))], if_exists="replace")
            assert isinstance(result, drt.CacheWriteSuccess), result
            counts.append(len(read(tmp_path / "a")))
    finally:
        stop.set()
        watcher.join()
    assert counts == [10 + n for n in range(6)] and looks[0] > 0 and missing == []


def test_replace_where_the_filesystem_cannot_exchange_fails_that_source(tmp_path, monkeypatch):
    [old] = write(tmp_path, [ListSource("a", sample_items(8))])
    monkeypatch.setattr(overwrite, "_renameat2", None)  # as a libc without renameat2
    [result] = write(tmp_path, [ListSource("a", sample_items(9))], if_exists="replace")
    assert isinstance(result, drt.CacheWriteError)
    assert result.message.startswith(f"cache path already exists: {old.path.absolute()}: it cannot be replaced")
    assert len(read(old.path)) == 8 and sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_bad_policies_and_urls_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"if_exists must be one of \('error', 'skip_identical', 'replace'\)"):
        write(tmp_path, [ListSource("a", sample_items(3))], if_exists="overwrite")
    with pytest.raises(ArgumentTypeError, match="if_exists must be a str"):
        write(tmp_path, [ListSource("a", sample_items(3))], if_exists=True)
    with pytest.raises(ConfigError, match="for caches in local directories"):
        write("s3://bucket/caches", [ListSource("a", sample_items(3))], if_exists="replace")
    assert list(tmp_path.iterdir()) == []
