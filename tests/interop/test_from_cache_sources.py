"""`from_cache_sources` on both libraries: write missing caches, reuse existing ones, keep input order.

A reused cache is taken as is: its source must not even be iterated (the sources here are
"poisoned" and fail the test if they are). Results and the dataset's caches follow the input
order, and both libraries produce the same sample streams over the same directory, whichever
library wrote which cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop._interop import LIBS, Source, identities, plain_items, take, tricky_items, writer_config

pytestmark = pytest.mark.interop

ITEMS = {"a": plain_items(12, "a"), "b": plain_items(7, "b"), "c": plain_items(16, "c"), "d": plain_items(5, "d")}


def _call(runtimes, label, names, base, *, poisoned=(), seed=0, shuffle=True, items=ITEMS, algo="none"):
    lib = LIBS[label]
    sources = [Source(lib, n, items[n], poisoned=n in poisoned) for n in names]
    result = runtimes[label].from_cache_sources(
        sources,
        base,
        reader_config=lib.ReaderConfig(seed=seed, shuffle=shuffle),
        writer_config=writer_config(lib, algo),
    )
    return result, sources


def _summary(results):
    return [(type(r).__name__, r.source_name, Path(r.path) if hasattr(r, "path") else r.message) for r in results]


@pytest.mark.parametrize("label", list(LIBS))
def test_write_then_reuse_in_input_order(runtimes, tmp_path, label):
    first, sources = _call(runtimes, label, ["a", "b", "c"], tmp_path)
    assert type(first).__name__ == "CacheSourcesDatasetSuccess", first
    assert _summary(first.results) == [("CacheWriteSuccess", n, tmp_path / n) for n in "abc"]
    assert [s.iterations for s in sources] == [1, 1, 1]

    again, sources = _call(runtimes, label, ["c", "a"], tmp_path, poisoned={"a", "b", "c"}, shuffle=False)
    assert type(again).__name__ == "CacheSourcesDatasetSuccess", again
    assert _summary(again.results) == [("CacheWriteSuccess", n, tmp_path / n) for n in "ca"]
    assert [Path(p) for p in again.dataset.cache_paths] == [tmp_path / "c", tmp_path / "a"]
    got = take(again.dataset)
    assert [k[0] for k in got] == [d for d, _ in ITEMS["c"] + ITEMS["a"]]
    assert [sid for _, sid in identities(got)] == list(range(16)) + list(range(12))


@pytest.mark.parametrize("algo", ["none", "lz4"])
def test_same_streams_from_both_libraries(runtimes, tmp_path, algo):
    items = {n: tricky_items(10 + k, n) for k, n in enumerate("abcd")}
    for shuffle in (False, True):
        got = {}
        for label in LIBS:
            result, _ = _call(
                runtimes, label, ["d", "b", "a"], tmp_path / label, seed=17, shuffle=shuffle, items=items, algo=algo
            )
            assert _summary(result.results) == [("CacheWriteSuccess", n, tmp_path / label / n) for n in "dba"]
            got[label] = take(result.dataset, iterators=2)
        assert got["drt"] == got["rt"]


@pytest.mark.parametrize("writer,reuser", [("rt", "drt"), ("drt", "rt")])
def test_reuse_caches_written_by_the_other_library(runtimes, tmp_path, writer, reuser):
    first, _ = _call(runtimes, writer, ["a", "b"], tmp_path)
    assert type(first).__name__ == "CacheSourcesDatasetSuccess"
    mixed, sources = _call(runtimes, reuser, ["b", "c", "a"], tmp_path, poisoned={"a", "b"}, seed=5)
    assert _summary(mixed.results) == [("CacheWriteSuccess", n, tmp_path / n) for n in "bca"]
    assert [s.iterations for s in sources] == [0, 1, 0]
    # The writer library now reuses all three (including the one the other library wrote).
    again, _ = _call(runtimes, writer, ["b", "c", "a"], tmp_path, poisoned={"a", "b", "c"}, seed=5)
    assert take(again.dataset, iterators=2) == take(mixed.dataset, iterators=2)


def test_failed_source_is_a_value_in_its_position(runtimes, tmp_path):
    items = dict(ITEMS, empty=[])
    got = {}
    for label in LIBS:
        result, _ = _call(runtimes, label, ["a", "empty", "d"], tmp_path / label, items=items, shuffle=False)
        assert type(result).__name__ == "CacheSourcesDatasetSuccess"
        summary = [
            (kind, name, str(p).replace(str(tmp_path / label), "")) for kind, name, p in _summary(result.results)
        ]
        got[label] = (summary, take(result.dataset))
    assert got["drt"] == got["rt"]
    assert got["rt"][0][1] == ("CacheWriteError", "empty", "cache source yielded no samples")


def test_all_failed_and_empty_lists(runtimes, tmp_path):
    items = {"x": [], "y": []}
    for label in LIBS:
        none_ok, _ = _call(runtimes, label, ["x", "y"], tmp_path / label, items=items)
        assert type(none_ok).__name__ == "CacheSourcesDatasetError"
        assert none_ok.message == (
            "no caches were written: x: cache source yielded no samples; y: cache source yielded no samples"
        )
        assert [r.source_name for r in none_ok.results] == ["x", "y"]
        empty, _ = _call(runtimes, label, [], tmp_path / label)
        assert type(empty).__name__ == "CacheSourcesDatasetError"
        assert (list(empty.results), empty.message) == ([], "no cache sources were provided")
