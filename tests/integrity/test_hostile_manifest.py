"""Hostile manifests: each is refused at open by the manifest parser itself (ManifestJSONError,
a RuntimeError as dataset-rt's "JSON error: ..."), with a message naming manifest.json and the
field, before any other file is opened or anything is sized from a manifest value.

Several of these go beyond dataset-rt 0.4.8, which tries to open a shard named "../000000.bin",
and panics on a duplicated metadata_schema name under validate_cache=True.
"""

from __future__ import annotations

import json
import tracemalloc

import pytest

from datasetrt.errors import ManifestJSONError
from datasetrt.format.manifest import MAX_SAMPLE_COUNT
from tests.integrity.corrupt import (
    assert_fault,
    edit_manifest,
    load_manifest,
    manifest_path,
    probe,
    write_manifest_text,
)

U63, U64 = 2**63, 2**64


def _refused(opener, cache, *fragments):
    """Both reader modes refuse the cache at open with a parser error naming manifest + fields."""
    for validate in (False, True):
        out = probe(opener, cache, validate=validate)
        assert_fault(out, "open", ManifestJSONError, RuntimeError, "JSON error", manifest_path(cache), *fragments)


# -- shard names ------------------------------------------------------------------------------------

BAD_SHARD_NAMES = [
    "..",
    ".",
    "../000000.bin",
    "/etc/passwd",
    "/tmp/000000.bin",
    "000000.bin\0",
    "000000.bin\0.txt",
    "000000.bin/../x",
    "sub/000000.bin",
    "000000.bin\n",
    "",
    "000000.BIN",
    "0.bin",
    "000000.bin ",
    "٠٠٠٠٠٠.bin",  # Arabic-Indic digits match \d but not [0-9]
]


@pytest.mark.parametrize("name", BAD_SHARD_NAMES, ids=[repr(n) for n in BAD_SHARD_NAMES])
def test_hostile_shard_name(opener, fresh_cache, name):
    edit_manifest(fresh_cache, lambda d: d["shards"][0].__setitem__("name", name))
    _refused(opener, fresh_cache, "invalid shard name", "shards[0]")


# -- integers ------------------------------------------------------------------------------------------


def _set_field(where, key, value):
    def edit(d):
        target = d if where == "top" else d["shards"][0]
        target[key] = value

    return edit


INT_FIELDS = [
    ("top", "sample_count"),
    ("top", "cache_id"),
    ("top", "format_version"),
    ("shard", "byte_len"),
    ("shard", "uncompressed_byte_len"),
]
HUGE = [U63, U63 + 1, U64 - 1, U64, U64 + 1, 2**70, 10**40]


OUT_OF_RANGE = [
    (where, key, value)
    for where, key in INT_FIELDS
    for value in HUGE + [-1, -U63, -(U64 + 1)]
    if not (key == "cache_id" and 0 <= value < U64)  # cache_id is a u64
]


@pytest.mark.parametrize("where, key, value", OUT_OF_RANGE, ids=[f"{k}={v}" for _, k, v in OUT_OF_RANGE])
def test_integer_out_of_range(opener, fresh_cache, where, key, value):
    edit_manifest(fresh_cache, _set_field(where, key, value))
    _refused(opener, fresh_cache, f"`{key}`")


@pytest.mark.parametrize("value", [MAX_SAMPLE_COUNT + 1, U63 - 1], ids=["index-size-overflows-off_t", "2**63-1"])
def test_sample_count_whose_index_size_overflows(opener, fresh_cache, value):
    """sample_count x 24 bytes must fit a file size, or the field is refused as such."""
    edit_manifest(fresh_cache, lambda d: d.__setitem__("sample_count", value))
    _refused(opener, fresh_cache, "`sample_count`", str(MAX_SAMPLE_COUNT))


@pytest.mark.parametrize(
    "value",
    [5.0, 5.5, "5", True, False, None, [5], {"v": 5}],
    ids=["float", "fraction", "string", "true", "false", "null", "list", "map"],
)
@pytest.mark.parametrize("where, key", INT_FIELDS, ids=[k for _, k in INT_FIELDS])
def test_integer_field_with_wrong_type(opener, fresh_cache, where, key, value):
    edit_manifest(fresh_cache, _set_field(where, key, value))
    _refused(opener, fresh_cache, f"`{key}`")


def test_huge_values_allocate_nothing(opener, fresh_cache):
    """Refusal happens before anything is sized from the manifest: opening with every count and
    length near 2**64 allocates no more than a few MiB."""

    def edit(d):
        d["sample_count"] = U64 - 1
        d["shards"][0].update(byte_len=U64 - 1, uncompressed_byte_len=U64 - 1)

    edit_manifest(fresh_cache, edit)
    tracemalloc.start()
    try:
        out = probe(opener, fresh_cache, validate=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_fault(out, "open", ManifestJSONError, RuntimeError, "`sample_count`")
    assert peak < 8 << 20


# -- strings: sha256, names, kinds ---------------------------------------------------------------------


def _sidecar(d):
    return d["datasetrt"]["record_checksums"]


SHA_FIELDS = {
    "metadata_sha256": lambda d, v: d.__setitem__("metadata_sha256", v),
    "index_sha256": lambda d, v: d.__setitem__("index_sha256", v),
    "shards[0].sha256": lambda d, v: d["shards"][0].__setitem__("sha256", v),
    "record_checksums.sha256": lambda d, v: _sidecar(d).__setitem__("sha256", v),
}
BAD_SHA = ["z" * 64, "A" * 64, "ab", "0" * 65, "0" * 63 + "\n", "", 5, None]


@pytest.mark.parametrize("value", BAD_SHA, ids=[repr(v)[:12] for v in BAD_SHA])
@pytest.mark.parametrize("field", list(SHA_FIELDS))
def test_sha256_not_hex(opener, fresh_cache, field, value):
    edit_manifest(fresh_cache, lambda d: SHA_FIELDS[field](d, value))
    _refused(opener, fresh_cache, "`sha256`" if "." in field else f"`{field}`")


SCHEMA_EDITS = {
    "unknown-kind": (lambda s: s[0].__setitem__("kind", "double"), ["unknown variant `double`", "metadata_schema[0]"]),
    "kind-wrong-type": (lambda s: s[1].__setitem__("kind", 3), ["`kind`", "metadata_schema[1]"]),
    "duplicate-name": (lambda s: s.append(dict(s[0])), ["duplicate metadata column `index`"]),
    "name-missing": (lambda s: s[2].pop("name"), ["missing field `name`", "metadata_schema[2]"]),
    "name-not-string": (lambda s: s[2].__setitem__("name", None), ["`name`", "metadata_schema[2]"]),
    "item-not-map": (lambda s: s.__setitem__(3, ["score", "float"]), ["expected a map", "metadata_schema[3]"]),
}


@pytest.mark.parametrize("key", list(SCHEMA_EDITS))
def test_hostile_metadata_schema(opener, fresh_cache, key):
    edit, fragments = SCHEMA_EDITS[key]
    edit_manifest(fresh_cache, lambda d: edit(d["metadata_schema"]))
    _refused(opener, fresh_cache, *fragments)


@pytest.mark.parametrize("value", [{"name": "index"}, "index", None])
def test_metadata_schema_not_a_list(opener, fresh_cache, value):
    edit_manifest(fresh_cache, lambda d: d.__setitem__("metadata_schema", value))
    _refused(opener, fresh_cache, "`metadata_schema`")


BAD_SIDECAR_FILES = [
    "../checksums.xxh3",
    "sub/checksums.xxh3",
    "/etc/passwd",
    "checksums.xxh3/",
    "",
    ".",
    "..",
    "checksums\0.xxh3",
]


@pytest.mark.parametrize("name", BAD_SIDECAR_FILES, ids=[repr(n) for n in BAD_SIDECAR_FILES])
def test_hostile_sidecar_file_name(opener, fresh_cache, name):
    edit_manifest(fresh_cache, lambda d: _sidecar(d).__setitem__("file", name))
    _refused(opener, fresh_cache, "`file`", "record_checksums")


def test_unknown_sidecar_algo(opener, fresh_cache):
    edit_manifest(fresh_cache, lambda d: _sidecar(d).__setitem__("algo", "md5"))
    _refused(opener, fresh_cache, "record_checksums")


@pytest.mark.parametrize("ratio", [0, -1.0, float("inf"), float("nan"), "1.0", None], ids=str)
def test_hostile_compression_ratio(opener, fresh_cache, ratio):
    edit_manifest(fresh_cache, lambda d: d["shards"][0]["compression"].__setitem__("ratio", ratio))
    _refused(opener, fresh_cache, "`ratio`", "shards[0].compression")


# -- the JSON document itself --------------------------------------------------------------------------


def _with_field(cache, key, raw_value):
    text = manifest_path(cache).read_text()
    return text.replace('"format_version": 3,', f'"format_version": 3, "{key}": {raw_value},', 1)


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("where", ["document", "extra-field", "sample_count"])
def test_deeply_nested_json(opener, fresh_cache, where, depth):
    """Deep nesting is a typed error, never a RecursionError (nor a crash) escaping the parser."""
    nested = "[" * depth + "]" * depth
    if where == "document":
        text = nested
    elif where == "extra-field":
        text = _with_field(fresh_cache, "comment", nested)
    else:
        text = manifest_path(fresh_cache).read_text().replace('"sample_count": 5', f'"sample_count": {nested}')
    write_manifest_text(fresh_cache, text)
    out = probe(opener, fresh_cache, validate=False)
    assert_fault(out, "open", ManifestJSONError, RuntimeError, "JSON error", manifest_path(fresh_cache))


@pytest.mark.parametrize("doc", ["[]", "5", '"manifest"', "null", "true"])
def test_document_not_a_map(opener, fresh_cache, doc):
    write_manifest_text(fresh_cache, doc)
    _refused(opener, fresh_cache, "expected a map")


def test_duplicate_field(opener, fresh_cache):
    """As dataset-rt ("duplicate manifest field"): two readers must not pick different values."""
    write_manifest_text(fresh_cache, _with_field(fresh_cache, "sample_count", 999999))
    _refused(opener, fresh_cache, "duplicate manifest field `sample_count`")


def test_integer_literal_too_long(opener, fresh_cache):
    text = manifest_path(fresh_cache).read_text().replace('"sample_count": 5', '"sample_count": 1' + "0" * 5000)
    write_manifest_text(fresh_cache, text)
    _refused(opener, fresh_cache, "number out of range")


def test_manifest_not_utf8(opener, fresh_cache):
    raw = manifest_path(fresh_cache).read_bytes().replace(b'"victim"', b'"vic\xfftim"')
    write_manifest_text(fresh_cache, raw)
    _refused(opener, fresh_cache, "not UTF-8")


def test_manifest_is_a_directory(opener, fresh_cache):
    manifest_path(fresh_cache).unlink()
    manifest_path(fresh_cache).mkdir()
    _refused(opener, fresh_cache, "is a directory")


def test_valid_edge_values_still_open(opener, fresh_cache):
    """The limits are not over-tight: cache_id 2**64-1, an empty extension map and an extra field open."""

    def edit(d):
        d["cache_id"] = U64 - 1
        d["comment"] = {"nested": [1, [2, [3]]]}

    edit_manifest(fresh_cache, edit)
    out = probe(opener, fresh_cache, validate=True)
    assert out.stage is None, repr(out.error)
    assert load_manifest(fresh_cache)["cache_id"] == U64 - 1
    json.dumps(out.samples[0].metadata)
