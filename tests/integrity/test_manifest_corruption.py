"""Reference §6, manifest rows: each corruption of manifest.json, in both reader modes.

Each case asserts the datasetrt class, the dataset-rt builtin it also is, the reference wording,
the offending path, and the stage where it surfaces (open / get_metadata / iteration).
"""

from __future__ import annotations

import shutil

import pytest

import datasetrt as drt
from datasetrt.errors import CacheFormatError, ManifestJSONError, MissingManifestError
from tests.integrity.corrupt import (
    assert_fault,
    edit_manifest,
    load_manifest,
    manifest_path,
    probe,
    write_manifest_text,
)

# -- manifest missing / unreadable ----------------------------------------------------------------


def test_manifest_missing(opener, fresh_cache, validate):
    manifest_path(fresh_cache).unlink()
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(out, "open", MissingManifestError, ValueError, "missing manifest", manifest_path(fresh_cache))


def test_cache_path_missing(opener, tmp_path, validate):
    gone = tmp_path / "no-such-cache"
    out = probe(opener, gone, validate=validate)
    assert_fault(out, "open", MissingManifestError, ValueError, "missing manifest", gone / "manifest.json")


@pytest.mark.parametrize(
    "text, wording",
    [
        ("{", "JSON error: EOF while parsing an object at line 1 column 1"),
        ("", "JSON error: EOF while parsing a value at line 1 column 0"),
        ('{"format_version": 3', "JSON error: EOF while parsing an object"),
        ('{"format_version', "JSON error: EOF while parsing a string"),
        ('{"shards": [', "JSON error: EOF while parsing a list"),
    ],
    ids=["open-brace", "empty", "object", "string", "list"],
)
def test_manifest_truncated_json(opener, fresh_cache, validate, text, wording):
    write_manifest_text(fresh_cache, text)
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(out, "open", ManifestJSONError, RuntimeError, wording, manifest_path(fresh_cache))


# -- version and identity fields ------------------------------------------------------------------


@pytest.mark.parametrize("version", [99, 1])
def test_unsupported_format_version(opener, fresh_cache, validate, version):
    edit_manifest(fresh_cache, lambda d: d.__setitem__("format_version", version))
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out,
        "open",
        ManifestJSONError,
        RuntimeError,
        f"JSON error: unsupported format version {version}",
        manifest_path(fresh_cache),
    )


def test_v3_without_cache_id(opener, fresh_cache, validate):
    edit_manifest(fresh_cache, lambda d: d.pop("cache_id"))
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out, "open", ManifestJSONError, RuntimeError, "JSON error: missing field `cache_id`", manifest_path(fresh_cache)
    )


def test_negative_cache_id(opener, fresh_cache, validate):
    edit_manifest(fresh_cache, lambda d: d.__setitem__("cache_id", -1))
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out,
        "open",
        ManifestJSONError,
        RuntimeError,
        "invalid value: integer `-1`, expected u64",
        "`cache_id`",
        manifest_path(fresh_cache),
    )


def test_missing_source_name(opener, fresh_cache, validate):
    edit_manifest(fresh_cache, lambda d: d.pop("source_name"))
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out,
        "open",
        ManifestJSONError,
        RuntimeError,
        "JSON error: missing field `source_name`",
        manifest_path(fresh_cache),
    )


# -- edits dataset-rt accepts ---------------------------------------------------------------------


def _extra_field(d):
    d["comment"] = {"written_by": "someone else"}


def _rename_source(d):
    d["source_name"] = "renamed"


def _none_ratio_2(d):
    d["shards"][0]["compression"]["ratio"] = 2.0


def _wrong_uncompressed_len(d):
    d["shards"][0]["uncompressed_byte_len"] += 1000


@pytest.mark.parametrize(
    "edit",
    [_extra_field, _rename_source, _none_ratio_2, _wrong_uncompressed_len],
    ids=["extra-field", "source-name", "none-ratio-2", "uncompressed-len"],
)
def test_accepted_manifest_edits(runtime, cache, validate, edit):
    before = probe(runtime, cache, validate=validate)
    edit_manifest(cache, edit)
    after = probe(runtime, cache, validate=validate)
    assert after.stage is None, repr(after.error)
    assert after.samples == before.samples


# -- compression ---------------------------------------------------------------------------------


def test_unknown_compression_algo(opener, fresh_cache, validate):
    """dataset-rt rejects algo "zstd" (unknown variant); datasetrt reads zstd caches (an
    extension, covered by every `any_cache` test), so an algorithm neither knows stands in."""
    edit_manifest(fresh_cache, lambda d: d["shards"][0]["compression"].__setitem__("algo", "brotli"))
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out,
        "open",
        ManifestJSONError,
        RuntimeError,
        "JSON error: unknown variant `brotli`",
        "shards[0]",
        manifest_path(fresh_cache),
    )


def test_manifest_says_lz4_but_data_is_raw(runtime, cache, validate):
    """Sample 0 has an empty payload: too short for the lz4 size prefix, as in dataset-rt."""
    edit_manifest(cache, lambda d: d["shards"][0]["compression"].__setitem__("algo", "lz4"))
    out = probe(runtime, cache, validate=validate)
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress lz4 payload", f"{cache} sample 0")


def test_manifest_says_lz4_but_data_is_raw_size_prefix(runtime, cache, validate):
    """Sample 1's first raw bytes read as a huge lz4 size: refused before any allocation."""
    edit_manifest(cache, lambda d: d["shards"][0]["compression"].__setitem__("algo", "lz4"))
    ds = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0, validate_cache=validate))
    with pytest.raises(CacheFormatError) as info:
        ds.get_item(ds.get_metadata()["cache_id"][0], 1)
    assert "failed to decompress lz4 payload" in str(info.value)
    assert f"{cache} sample 1" in str(info.value)


# -- identity across caches ----------------------------------------------------------------------


def test_duplicate_cache_id(opener, fresh_cache, validate):
    twin = fresh_cache.parent / "twin"
    shutil.copytree(fresh_cache, twin)
    cache_id = load_manifest(fresh_cache)["cache_id"]
    out = probe(opener, [fresh_cache, twin], validate=validate)
    assert_fault(out, "open", CacheFormatError, ValueError, f"duplicate cache_id {cache_id}", fresh_cache, twin)


# -- metadata schema in the manifest ---------------------------------------------------------------


def test_schema_kind_changed(opener, fresh_cache, validate):
    """dataset-rt: lazy decode says "does not match manifest schema" at get_metadata; its
    validator says "metadata 'index' is not float" at load."""
    edit_manifest(fresh_cache, lambda d: d["metadata_schema"][0].__setitem__("kind", "float"))
    out = probe(opener, fresh_cache, validate=validate)
    meta = fresh_cache / "metadata.arrow"
    if validate:
        assert_fault(out, "open", CacheFormatError, ValueError, "metadata 'index' is not float", meta)
    else:
        assert_fault(
            out,
            "metadata",
            CacheFormatError,
            ValueError,
            "metadata column 'index' does not match manifest schema",
            meta,
        )


def test_schema_column_dropped(opener, fresh_cache, validate):
    edit_manifest(fresh_cache, lambda d: d["metadata_schema"].pop())
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out,
        "open" if validate else "metadata",
        CacheFormatError,
        ValueError,
        "metadata batch column count does not match manifest",
        fresh_cache / "metadata.arrow",
    )


def test_schema_column_renamed(opener, fresh_cache, validate):
    """Names the manifest's column, as dataset-rt. With validate_cache=True datasetrt decodes
    metadata.arrow at open, so it surfaces there (dataset-rt: at get_metadata)."""
    edit_manifest(fresh_cache, lambda d: d["metadata_schema"][0].__setitem__("name", "idx"))
    out = probe(opener, fresh_cache, validate=validate)
    assert_fault(
        out,
        "open" if validate else "metadata",
        CacheFormatError,
        ValueError,
        "metadata column 'idx' does not match manifest schema",
        fresh_cache / "metadata.arrow",
    )
