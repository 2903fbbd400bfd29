"""Cache writer: bad inputs as values (nothing left on disk), names, layout and manifest, progress.

Reference: dataset_rt-0.4.8-behaviour.md §2.5 and §4. Interrupts, the profiler, existing targets,
locks, races, disk full and reuse are in test_writer_faults.py; shard rotation, groups and the
sidecar in test_shards.py; compression and the ordered commit in test_blocks.py.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pytest

import datasetrt as drt
from tests.conftest import QUIET, sample_items
from tests.unit.format.sources import index_rows, write_one

OK = [(b"x", {"a": 1})]


class Raw:
    """A source yielding exactly the given items (no CacheInput wrapping)."""

    def __init__(self, name, items):
        self.name = name
        self.items = items

    def __iter__(self):
        return iter(self.items)


class NoName:
    def __iter__(self):
        return iter(OK)


class Boom:
    name = "boom"

    def __iter__(self):
        yield (b"x", {"a": 1})
        raise RuntimeError("boom!")


class NonIterator:
    name = "nonit"

    def __iter__(self):
        return 5


class BadLenTuple(tuple):
    def __len__(self):
        raise ZeroDivisionError("bad len")


def _late_failure():
    """300 good items (several committed blocks on disk), then a kind change."""
    return Raw("late", [(b"p" * 100, {"a": i}) for i in range(300)] + [(b"x", {"a": 1.0})])


def _d(*items):
    return lambda: Raw("d", list(items))


PLAIN, VALUES = "CacheSource.name must be a plain path segment", "metadata values must be bool, int, float, or str"
ARROW_EMPTY = "Arrow error: Invalid argument error: must either specify a row count or at least one column"
# (id, source factory, expected label, expected message; "{base}" is the absolute base path)
BAD_INPUTS = [
    ("empty-source", lambda: Raw("e", []), "e", "cache source yielded no samples"),
    ("name-empty", lambda: Raw("", OK), "source[1]", "CacheSource.name must not be empty"),
    ("name-dot", lambda: Raw(".", OK), "source[1]", PLAIN),
    ("name-dotdot", lambda: Raw("..", OK), "source[1]", PLAIN),
    ("name-slash", lambda: Raw("a/b", OK), "source[1]", PLAIN),
    ("name-nul", lambda: Raw("a\0b", OK), "a\0b", "I/O error: file name contained an unexpected NUL byte"),
    ("name-tmp", lambda: Raw("tmp", OK), "tmp", "cache path already exists: {base}/tmp"),
    ("name-long", lambda: Raw("n" * 256, OK), "n" * 256, "I/O error: File name too long (os error 36)"),
    ("name-long-utf8", lambda: Raw("é" * 128, OK), "é" * 128, "I/O error: File name too long (os error 36)"),
    ("name-int", lambda: Raw(5, OK), "source[1]", "Python error: TypeError: 'int' object is not an instance of 'str'"),
    ("name-missing", NoName, "source[1]", "Python error: AttributeError: 'NoName' object has no attribute 'name'"),
    ("data-str", _d(("x", {"a": 1})), "d", "data must be bytes-like"),
    ("data-object", _d((object(), {"a": 1})), "d", "data must be bytes-like"),
    ("data-datetime-array", _d((np.array(["2020"], "M8[D]"), {"a": 1})), "d", "data must be bytes-like"),
    ("item-raises", _d(BadLenTuple((b"x", {"a": 1}))), "d", "Python error: ZeroDivisionError: bad len"),
    ("item-list", _d([b"x", {"a": 1}]), "d", "CacheSource must yield CacheInput tuples"),
    ("item-bytes", _d(b"x"), "d", "CacheSource must yield CacheInput tuples"),
    ("item-3-tuple", _d((b"x", {"a": 1}, 3)), "d", "CacheInput must contain data and metadata"),
    ("md-mappingproxy", _d((b"x", MappingProxyType({"a": 1}))), "d", "metadata must be a dict"),
    ("md-list", _d((b"x", [("a", 1)])), "d", "metadata must be a dict"),
    ("md-int-key", _d((b"x", {1: 1})), "d", "metadata keys must be strings"),
    ("value-none", _d((b"x", {"a": None})), "d", VALUES),
    ("value-list", _d((b"x", {"a": [1]})), "d", VALUES),
    ("value-bytes", _d((b"x", {"a": b"1"})), "d", VALUES),
    ("kind-int-float", _d((b"x", {"a": 1}), (b"x", {"a": 1.0})), "d", "metadata field 'a' expected int, got float"),
    ("kind-bool-int", _d((b"x", {"a": True}), (b"x", {"a": 1})), "d", "metadata field 'a' expected bool, got int"),
    (
        "keys-fewer",
        _d((b"x", {"a": 1, "b": 2}), (b"x", {"a": 1})),
        "d",
        "metadata keys must be identical for every sample",
    ),
    (
        "keys-more",
        _d((b"x", {"a": 1}), (b"x", {"a": 1, "b": 2})),
        "d",
        "metadata keys must be identical for every sample",
    ),
    ("keys-renamed", _d((b"x", {"a": 1, "b": 2}), (b"x", {"a": 1, "c": 2})), "d", "metadata field 'b' is missing"),
    ("md-empty", _d((b"x", {})), "d", ARROW_EMPTY),
    ("source-raises", Boom, "boom", "Python error: RuntimeError: boom!"),
    ("iter-non-iterator", NonIterator, "nonit", "Python error: TypeError: iter() returned non-iterator of type 'int'"),
    ("late-failure", _late_failure, "late", "metadata field 'a' expected int, got float"),
]

# What datasetrt adds after dataset-rt's text (the start of each message stays dataset-rt's, users
# match on it): the sample's position in its source, the column and the value (id -> suffix).
DETAIL = {
    "data-str": ": sample 0: got str",
    "data-object": ": sample 0: got object",
    "data-datetime-array": ": sample 0: got ndarray",
    "item-list": ": sample 0: got list",
    "item-bytes": ": sample 0: got bytes",
    "item-3-tuple": ": sample 0: got a tuple of 3 items",
    "md-mappingproxy": ": sample 0: got mappingproxy",
    "md-list": ": sample 0: got list",
    "md-int-key": ": sample 0: key int 1",
    "value-none": ": sample 0, column 'a': got NoneType None",
    "value-list": ": sample 0, column 'a': got list [1]",
    "value-bytes": ": sample 0, column 'a': got bytes b'1'",
    "kind-int-float": ": sample 1: value 1.0",
    "kind-bool-int": ": sample 1: value 1",
    "keys-fewer": ": sample 1: keys ['a'], expected ['a', 'b']",
    "keys-more": ": sample 1: keys ['a', 'b'], expected ['a']",
    "keys-renamed": ": sample 1: keys ['a', 'c'], expected ['a', 'b']",
    "name-dot": ": got '.'",
    "name-dotdot": ": got '..'",
    "name-slash": ": got 'a/b'",
    "md-empty": ": sample 0: the metadata is an empty dict {}; a source's samples need at least one metadata column",
    "late-failure": ": sample 300: value 1.0",
}

# Deliberate differences from dataset-rt 0.4.8 (which accepts these and produces unreadable or
# colliding data): (id, source factory, label, regex the message must match).
DELIBERATE = [
    ("nan", _d((b"x", {"a": float("nan")})), "d", r"finite float"),
    ("inf", _d((b"x", {"a": 1.0}), (b"x", {"a": float("-inf")})), "d", r"finite float"),
    ("int-over-int64", _d((b"x", {"a": 2**63})), "d", r"outside the int64 range"),
    ("int-under-int64", _d((b"x", {"a": -(2**63) - 1})), "d", r"outside the int64 range"),
    ("col-cache_id", _d((b"x", {"cache_id": 1})), "d", r"'cache_id' is reserved"),
    ("col-sample_id", _d((b"x", {"sample_id": 1})), "d", r"'sample_id' is reserved"),
    ("col-weight", _d((b"x", {"weight": 1.0})), "d", r"'weight' is reserved"),
]


def _write_between(runtime, base, bad):
    results = runtime.write_cache([Raw("before", OK), bad, Raw("after", OK)], base, writer_config=QUIET)
    assert results[0] == drt.CacheWriteSuccess("before", base / "before")
    assert results[2] == drt.CacheWriteSuccess("after", base / "after")
    return results[1]


def assert_nothing_left(base, keep=("before", "after")):
    """Only the good caches remain: no cache, staging dir or lock, and no staging root."""
    assert sorted(os.listdir(base)) == sorted(keep)


@pytest.mark.parametrize(("case", "source", "label", "message"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_an_error_value_with_reference_message(runtime, tmp_path, case, source, label, message):
    base = tmp_path / "base"
    result = _write_between(runtime, base, source())
    assert result == drt.CacheWriteError(label, message.format(base=base.absolute()) + DETAIL.get(case, ""))
    assert_nothing_left(base)


@pytest.mark.parametrize(("source", "label", "pattern"), [c[1:] for c in DELIBERATE], ids=[c[0] for c in DELIBERATE])
def test_deliberate_rejections_differ_from_dataset_rt(runtime, tmp_path, source, label, pattern):
    """datasetrt rejects NaN/inf, ints outside int64 and reserved column names; dataset-rt 0.4.8
    writes them (NaN makes every later read fail, big ints become floats, the names collide)."""
    base = tmp_path / "base"
    result = _write_between(runtime, base, source())
    assert isinstance(result, drt.CacheWriteError) and result.source_name == label
    assert re.search(pattern, result.message), result.message
    assert_nothing_left(base)


def test_non_iterator_leaves_no_staging_dir(runtime, tmp_path):
    """Deliberate difference: dataset-rt 0.4.8 leaks <base>/tmp/<name> in this case."""
    runtime.write_cache([NonIterator()], tmp_path, writer_config=QUIET)
    assert os.listdir(tmp_path) == []  # no staging dir, and the emptied staging root is removed
    assert not (tmp_path / "nonit").exists()


@pytest.mark.parametrize(
    "name", ["n" * 255, "é" * 127 + "n", ".a.lock", "-", " x "], ids=["255", "254+1", "lock", "dash", "spaces"]
)
def test_unusual_valid_names_up_to_255_bytes(runtime, tmp_path, name):
    (result,) = runtime.write_cache([Raw(name, OK)], tmp_path, writer_config=QUIET)
    assert result == drt.CacheWriteSuccess(name, tmp_path / name)
    assert os.listdir(tmp_path) == [name] and (tmp_path / name / "manifest.json").is_file()


def test_duplicate_names_raise_before_anything_is_created(runtime, tmp_path):
    base = tmp_path / "root"
    with pytest.raises(ValueError, match=re.escape(f"duplicate generated cache path: {(base / 'd').absolute()}")):
        runtime.write_cache([Raw("d", OK), Raw("x", OK), Raw("d", OK)], base, writer_config=QUIET)
    assert not base.exists()


def test_case_different_names_are_not_duplicates(runtime, tmp_path):
    results = runtime.write_cache([Raw("d", OK), Raw("D", OK)], tmp_path, writer_config=QUIET)
    assert [type(r) for r in results] == [drt.CacheWriteSuccess] * 2


def test_base_path_is_a_file(runtime, tmp_path):
    base = tmp_path / "file"
    base.write_bytes(b"")
    results = runtime.write_cache([Raw("a", OK), Raw("b", OK)], base, writer_config=QUIET)
    assert [r.source_name for r in results] == ["a", "b"]
    assert all(isinstance(r, drt.CacheWriteError) and "Not a directory" in r.message for r in results)
    assert base.read_bytes() == b""


def test_no_sources(runtime, tmp_path):
    assert runtime.write_cache([], tmp_path / "none", writer_config=QUIET) == []


def test_single_source_and_relative_path(runtime, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (result,) = runtime.write_cache(Raw("one", OK), "rel", writer_config=QUIET)
    assert result == drt.CacheWriteSuccess("one", Path("rel") / "one")
    assert (tmp_path / "rel" / "one" / "manifest.json").is_file()


# -- progress -----------------------------------------------------------------------------------


@pytest.mark.parametrize("show", [True, False])
def test_progress_goes_to_stderr_only_when_enabled(runtime, tmp_path, capfd, show):
    cfg = drt.WriterConfig(show_progress=show)
    runtime.write_cache([Raw("a", OK * 5)], tmp_path, writer_config=cfg)
    out, err = capfd.readouterr()
    assert out == ""
    assert bool(err.strip()) is show


# -- payload ownership ------------------------------------------------------------------------------


class ReusedBuffers:
    """Reuses (and resizes) one bytearray and one numpy array across samples, as loaders do."""

    name = "reuse"

    def __iter__(self):
        buf = bytearray()
        arr = np.zeros(4, np.uint8)
        for i in range(150):
            buf.clear()
            buf.extend(bytes([65 + i % 26]) * (i % 7 + 1))
            yield (buf, {"i": i, "arr": False})
            arr[:] = i
            yield (arr, {"i": i, "arr": True})


def test_reused_and_resized_buffers_are_copied_at_yield(runtime, tmp_path):
    (result,) = runtime.write_cache([ReusedBuffers()], tmp_path, writer_config=QUIET)
    assert isinstance(result, drt.CacheWriteSuccess), result
    ds = runtime.cached_dataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    got = [(s.metadata["i"], s.metadata["arr"], s.data) for s in ds]
    want = []
    for i in range(150):
        want.append((i, False, bytes([65 + i % 26]) * (i % 7 + 1)))
        want.append((i, True, bytes([i]) * 4))
    assert got == want


# -- layout, manifest ------------------------------------------------------------------------------


def _cache_id(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") & (2**63 - 1)


TINY = [
    (b"zero", {"index": 0, "kept": True, "label": "a", "score": 1.5}),
    (b"one", {"index": 1, "kept": False, "label": "b", "score": 2.5}),
    (b"two", {"index": 2, "kept": True, "label": "c", "score": 3.5}),
]


def test_tiny_matches_reference_manifest(runtime, tmp_path):
    """§4: shard, index and identity fields of `tiny` equal dataset-rt's verbatim manifest."""
    cache, m = write_one(runtime, tmp_path, "tiny", TINY)
    assert list(m)[:8] == [
        "format_version",
        "cache_id",
        "source_name",
        "sample_count",
        "metadata_schema",
        "metadata_sha256",
        "index_sha256",
        "shards",
    ]
    assert (m["format_version"], m["cache_id"], m["source_name"], m["sample_count"]) == (
        3,
        671225450407077731,
        "tiny",
        3,
    )
    assert m["metadata_schema"] == [
        {"name": "index", "kind": "int"},
        {"name": "kept", "kind": "bool"},
        {"name": "label", "kind": "string"},
        {"name": "score", "kind": "float"},
    ]
    assert m["index_sha256"] == "669d75dbbeb916ec9fb98f10d525e003380ca6120f8f19282b2b11f15c7a6824"
    assert m["shards"] == [
        {
            "name": "000000.bin",
            "uncompressed_byte_len": 10,
            "byte_len": 176,
            "compression": {"algo": "none", "ratio": 1.0},
            "sha256": "2258026e884317474bc083e96682a9f2b6f07d9afc4624d2e69a92fa94132daa",
        }
    ]
    assert index_rows(cache) == [(0, 0, 59), (0, 59, 59), (0, 118, 58)]
    assert (cache / "manifest.json").read_text().startswith('{\n  "format_version": 3,\n  "cache_id": ')
    table = pa.ipc.open_file(cache / "metadata.arrow").read_all()
    assert table.schema == pa.schema(
        [
            pa.field("index", pa.int64(), False),
            pa.field("kept", pa.bool_(), False),
            pa.field("label", pa.string(), False),
            pa.field("score", pa.float64(), False),
        ]
    )
    assert table.to_pylist() == [md for _, md in TINY]
    assert not (tmp_path / "tmp").exists()


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
def test_manifest_fields_match_files(runtime, tmp_path, algo):
    items = sample_items(60, tag="m")
    cache, m = write_one(runtime, tmp_path, "m", items, algo=algo, max_shard_bytes=3000)
    assert len(m["shards"]) > 2 and m["cache_id"] == _cache_id("m") and m["sample_count"] == 60
    assert m["metadata_sha256"] == hashlib.sha256((cache / "metadata.arrow").read_bytes()).hexdigest()
    assert m["index_sha256"] == hashlib.sha256((cache / "index.bin").read_bytes()).hexdigest()
    index = index_rows(cache)
    for shard_id, shard in enumerate(m["shards"]):
        raw = (cache / "shards" / shard["name"]).read_bytes()
        assert shard["sha256"] == hashlib.sha256(raw).hexdigest()
        assert shard["byte_len"] == len(raw)
        rows = [k for k, (s, _, _) in enumerate(index) if s == shard_id]
        assert shard["uncompressed_byte_len"] == sum(len(items[k][0]) for k in rows)
        assert shard["compression"]["algo"] == algo and shard["compression"]["ratio"] == 1.0
    assert sorted(os.listdir(cache / "shards")) == [s["name"] for s in m["shards"]]


def test_ratio_must_be_one_without_compression(runtime, tmp_path):
    cfg = drt.WriterConfig(show_progress=False, shard_compression=drt.ShardCompression(algo="none", ratio=2))
    with pytest.raises(ValueError, match=re.escape("shard_compression.ratio must be 1.0 when algo is 'none'")):
        runtime.write_cache([Raw("a", OK)], tmp_path / "b", writer_config=cfg)
    assert not (tmp_path / "b").exists()
