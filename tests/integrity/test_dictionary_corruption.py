"""The zstd_dict dictionary file and its manifest entry (issue 14): one row per corruption.

A damaged, missing or foreign dictionary is a typed error at open (size, sha256 and header id are
checked when the cache is opened, default reads included); a dictionary that passes those checks
but is not the one the records were compressed with is a CacheFormatError at the first record read,
naming cache and sample. Every row runs on both read paths (reader workers and in-process) and with
validate_cache False and True.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard

import datasetrt as drt
from datasetrt.errors import CacheFormatError, CacheIOError, IntegrityError, ManifestJSONError
from tests.conftest import ListSource, json_like_items
from tests.integrity.corrupt import (
    assert_fault,
    edit_manifest,
    flip_byte,
    load_manifest,
    make_record,
    manifest_path,
    probe,
    read_record,
    rehash,
    replace_records,
    sha256_of,
    split_record,
)

N_RECORDS = 40


def _write(base: Path, name: str, seed: int) -> Path:
    comp = drt.ShardCompression(algo="zstd_dict", dict_bytes=1024)
    config = drt.WriterConfig(show_progress=False, shard_compression=comp, max_shard_bytes=1500)
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache(
            ListSource(name, json_like_items(N_RECORDS, seed=seed, tag=name)), base, writer_config=config
        )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return Path(result.path)


@pytest.fixture(scope="session")
def _templates(tmp_path_factory):
    base = tmp_path_factory.mktemp("dict-templates")
    own = _write(base, "victim", 0)
    foreign = _write(base / "foreign", "victim", 5000)  # same name, other records: another dictionary
    assert (
        load_manifest(own)["datasetrt"]["zstd_dictionary"]["dict_id"]
        != load_manifest(foreign)["datasetrt"]["zstd_dictionary"]["dict_id"]
    )
    return own, foreign


@pytest.fixture
def dict_cache(_templates, tmp_path):
    return Path(shutil.copytree(_templates[0], tmp_path / "victim"))


@pytest.fixture
def foreign(_templates):
    return _templates[1]


def _dict(c: Path) -> Path:
    return c / "dictionary.zstd"


def _entry(c: Path) -> dict:
    return load_manifest(c)["datasetrt"]["zstd_dictionary"]


def _set_entry(key, value):
    return lambda c, _f: edit_manifest(c, lambda d: d["datasetrt"]["zstd_dictionary"].__setitem__(key, value))


def _truncate(c, _f):
    _dict(c).write_bytes(_dict(c).read_bytes()[:-5])


def _extend(c, _f):
    with open(_dict(c), "ab") as f:
        f.write(b"\0" * 3)


def _transplant(c, foreign):
    """Another cache's dictionary with its manifest entry: consistent with itself, not with the frames."""
    shutil.copyfile(_dict(foreign), _dict(c))
    edit_manifest(c, lambda d: d["datasetrt"].__setitem__("zstd_dictionary", _entry(foreign)))


def _garbage_tables(c, _f):
    """The header (magic + id) kept, the entropy tables and content zeroed; entry rehashed: passes
    the checks at open, but the codec library cannot load it."""
    data = _dict(c).read_bytes()
    _dict(c).write_bytes(data[:8] + b"\0" * (len(data) - 8))
    edit_manifest(c, lambda d: d["datasetrt"]["zstd_dictionary"].__setitem__("sha256", sha256_of(_dict(c))))


def _plain_frame(c, _f):
    """Record 1's payload replaced by a plain zstd frame (no dictionary id); sidecar and shas redone."""
    js, _stored = split_record(read_record(c, 1))
    replace_records(c, {1: make_record(js, zstandard.ZstdCompressor(level=3).compress(json_like_items(2)[1][0]))})


@dataclass(frozen=True)
class Expect:
    stage: str
    cls: type
    builtin: type
    fragments: Callable[[Path, Path], list]  # (cache dir, foreign cache dir) -> message fragments


def _at_open(cls, builtin, *texts):
    return Expect("open", cls, builtin, lambda c, f: [*texts, _dict(c)])


SHA = _at_open(IntegrityError, ValueError, "checksum mismatch for")
LENGTH = _at_open(CacheFormatError, ValueError, "dictionary length mismatch for")
MISSING = _at_open(CacheIOError, RuntimeError, "I/O error: No such file or directory (os error 2)")

ROWS = [
    # id, mutate(cache, foreign), validate_cache=False, validate_cache=True ("same": as False)
    ("dictionary-missing", lambda c, f: _dict(c).unlink(), MISSING, "same"),
    ("dictionary-byte-flipped", lambda c, f: flip_byte(_dict(c), 100), SHA, "same"),
    ("dictionary-header-flipped", lambda c, f: flip_byte(_dict(c), 5), SHA, "same"),
    ("dictionary-truncated", _truncate, LENGTH, "same"),
    ("dictionary-extended", _extend, LENGTH, "same"),
    ("dictionary-emptied", lambda c, f: _dict(c).write_bytes(b""), LENGTH, "same"),
    ("entry-sha256", _set_entry("sha256", "0" * 64), SHA, "same"),
    ("entry-byte-len", _set_entry("byte_len", 7), LENGTH, "same"),
    (
        "entry-dict-id",
        _set_entry("dict_id", 12345),
        _at_open(CacheFormatError, ValueError, "dictionary id mismatch for", "the manifest says 12345"),
        "same",
    ),
    (
        "entry-file-absent",
        _set_entry("file", "other.zstd"),
        Expect("open", CacheIOError, RuntimeError, lambda c, f: ["No such file or directory", c / "other.zstd"]),
        "same",
    ),
    (
        "entry-removed",
        lambda c, f: edit_manifest(c, lambda d: d["datasetrt"].pop("zstd_dictionary")),
        Expect(
            "open",
            ManifestJSONError,
            RuntimeError,
            lambda c, f: ["shards[0] use zstd_dict but `datasetrt.zstd_dictionary` is missing", manifest_path(c)],
        ),
        "same",
    ),
    (
        "foreign-dictionary",
        _transplant,
        Expect(
            "iter",
            CacheFormatError,
            ValueError,
            lambda c, f: [  # the frame's own id: checked in the test
                "zstd_dict payload was compressed with dictionary id",
                f"but the cache's dictionary has id {_entry(f)['dict_id']}",
                f"{c} sample 0",
            ],
        ),
        "same",
    ),
    (
        "dictionary-tables-garbage",
        _garbage_tables,
        Expect(
            "iter",
            CacheFormatError,
            ValueError,
            lambda c, f: ["dictionary is not a zstd dictionary the library can load", _dict(c)],
        ),
        Expect(
            "open",
            CacheFormatError,
            ValueError,
            lambda c, f: ["dictionary is not a zstd dictionary the library can load", _dict(c)],
        ),
    ),
    (
        "frame-without-dictionary-id",
        _plain_frame,
        Expect(
            "iter",
            CacheFormatError,
            ValueError,
            lambda c, f: [
                "zstd_dict payload was compressed with dictionary id 0, but the cache's dictionary has id",
                f"{c} sample 1",
            ],
        ),
        "same",
    ),
]


@pytest.mark.parametrize("mutate, default, validated", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_dictionary_corruption(runtime, dict_cache, foreign, validate, mutate, default, validated):
    own_id = _entry(dict_cache)["dict_id"]
    mutate(dict_cache, foreign)
    expect = default if validated == "same" or not validate else validated
    out = probe(runtime, dict_cache, validate=validate)
    err = assert_fault(out, expect.stage, expect.cls, expect.builtin, *expect.fragments(dict_cache, foreign))
    if mutate is _transplant:
        assert f"compressed with dictionary id {own_id}," in str(err)


def test_dictionary_replaced_after_open_is_refused(runtime, dict_cache, foreign):
    """The dictionary is read again (and checked again) where it is loaded for reading: a file
    swapped in after the dataset opened never decodes a record."""
    ds = runtime.cached_dataset([dict_cache], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    tmp = dict_cache / "dictionary.zstd.new"
    shutil.copyfile(_dict(foreign), tmp)
    os.replace(tmp, _dict(dict_cache))
    try:
        with pytest.raises(CacheFormatError) as info:  # IntegrityError (in-process) or "changed on disk" (workers)
            list(ds)
        assert str(dict_cache) in str(info.value)
    finally:
        ds.close()


def test_undamaged_copy_reads(runtime, dict_cache, validate):
    out = probe(runtime, dict_cache, validate=validate)
    assert out.stage is None, repr(out.error)
    assert [s.data for s in out.samples] == [p for p, _ in json_like_items(N_RECORDS, tag="victim")]
    rehash(dict_cache)  # rehash keeps what it does not know about: the entry still matches
    assert _entry(dict_cache)["sha256"] == sha256_of(_dict(dict_cache))


@pytest.mark.parametrize(
    "mutate", [_transplant, _garbage_tables, _plain_frame], ids=["foreign", "garbage-tables", "plain-frame"]
)
def test_reader_workers_report_the_same_typed_error(dict_cache, foreign, mutate):
    """Workers started first, so the records are read (and the dictionary loaded) in a worker
    process: the fault comes back as the same class, naming the cache."""
    mutate(dict_cache, foreign)
    with drt.DatasetRuntime(num_workers=1, start_method="fork") as rt:
        rt.start_workers()
        ds = rt.cached_dataset([dict_cache], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
        with pytest.raises(CacheFormatError) as info:
            list(ds)
        ds.close()
    assert str(dict_cache) in str(info.value) and not isinstance(info.value, drt.errors.WorkerError)
