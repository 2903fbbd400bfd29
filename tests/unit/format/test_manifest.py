"""datasetrt.format.manifest on bytes: every field's type and range rule, the round trip of
`to_json`, and the messages (manifest path + field). Files on disk are tests/integrity's; these
call the parser directly, so each rule is checked by itself and quickly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datasetrt.errors import ManifestJSONError, MissingManifestError
from datasetrt.format.manifest import (
    MAX_SAMPLE_COUNT,
    ChecksumSidecar,
    ShardEntry,
    new_manifest,
    parse_manifest,
    read_manifest,
)
from datasetrt.values.codecs import MANIFEST_LEVEL_MAX, MANIFEST_LEVEL_MIN

PATH = Path("/caches/c/manifest.json")
SHA = "ab" * 32


def manifest(**kw):
    fields = {
        "cache_id": 2**64 - 1,
        "source_name": "c",
        "sample_count": 3,
        "metadata_schema": (("index", "int"), ("label", "string")),
        "metadata_sha256": SHA,
        "index_sha256": SHA,
        "shards": (
            ShardEntry("000000.bin", 30, 20, "zstd", 1.5, SHA, level=3),
            ShardEntry("000001.bin", 9, 9, "none", 1.0, SHA),
        ),
        "checksums": ChecksumSidecar("checksums.xxh3", "xxh3_64", SHA),
    }
    return new_manifest(**{**fields, **kw})


def doc(**kw) -> dict:
    return json.loads(manifest(**kw).to_json())


def parse(d) -> object:
    return parse_manifest(json.dumps(d).encode(), PATH)


def refused(d, *fragments):
    with pytest.raises(ManifestJSONError) as info:
        parse(d)
    message = str(info.value)
    assert message.startswith("JSON error") and str(PATH) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_round_trip():
    m = manifest()
    assert parse_manifest(m.to_json().encode(), PATH) == m
    text = m.to_json()
    assert text.endswith("}\n") and text.startswith('{\n  "format_version": 3,\n  "cache_id": 18446744073709551615')
    assert list(json.loads(text)) == [
        "format_version",
        "cache_id",
        "source_name",
        "sample_count",
        "metadata_schema",
        "metadata_sha256",
        "index_sha256",
        "shards",
        "datasetrt",
    ]


def test_v2_has_no_cache_id_and_unknown_keys_are_kept():
    d = doc()
    d["format_version"], d["note"] = 2, {"x": [1]}
    del d["cache_id"]
    m = parse(d)
    assert m.format_version == 2 and m.cache_id is None and m.extra == {"note": {"x": [1]}}
    assert json.loads(m.to_json())["note"] == {"x": [1]}


def test_compression_is_required_and_level_optional():
    """A shard without `compression` is refused, as dataset-rt 0.4.8 refuses it (v2 and v3,
    checked against the real package): a default of "none" once read a compressed shard whose key
    was damaged ("bompression", found by the corruption fuzzer) as raw payloads, silently."""
    d = doc()
    m = parse(d)
    assert (m.shards[0].algo, m.shards[0].ratio, m.shards[0].level) == ("zstd", 1.5, 3)
    d["shards"][1]["bompression"] = d["shards"][1].pop("compression")
    refused(d, "missing field `compression`", "in shards[1]")
    d["format_version"] = 2
    del d["cache_id"]
    refused(d, "missing field `compression`", "in shards[1]")


@pytest.mark.parametrize("level", [MANIFEST_LEVEL_MIN, -1, 0, 1, MANIFEST_LEVEL_MAX])
def test_zstd_levels_in_range_are_accepted(level):
    d = doc()
    d["shards"][0]["compression"]["level"] = level
    assert parse(d).shards[0].level == level


@pytest.mark.parametrize("level", [MANIFEST_LEVEL_MAX + 1, MANIFEST_LEVEL_MIN - 1, 2**63, True, 3.0, "3"])
def test_zstd_level_out_of_range_or_not_an_integer_is_refused(level):
    """The library's range (-131072..22), as serde's i32 check plus zstd's: a level outside it is
    refused at parse time, naming the field."""
    assert (MANIFEST_LEVEL_MIN, MANIFEST_LEVEL_MAX) == (-131072, 22)
    d = doc()
    d["shards"][0]["compression"]["level"] = level
    refused(d, "for field `level`", "expected a zstd level", "in shards[0].compression")


@pytest.mark.parametrize(
    "key, value, fragments",
    [
        ("format_version", 4, ["unsupported format version 4"]),
        ("format_version", 1, ["unsupported format version 1"]),
        ("sample_count", MAX_SAMPLE_COUNT + 1, ["`sample_count`", f"[0, {MAX_SAMPLE_COUNT}]"]),
        ("sample_count", -1, ["integer `-1`, expected u64 for field `sample_count`"]),
        ("sample_count", 3.0, ["`sample_count`"]),
        ("sample_count", True, ["`sample_count`"]),
        ("cache_id", 2**64, ["`cache_id`"]),
        ("cache_id", -1, ["integer `-1`, expected u64 for field `cache_id`"]),
        ("source_name", 5, ["`source_name`", "expected a string"]),
        ("metadata_sha256", SHA.upper(), ["`metadata_sha256`", "64 lowercase hex digits"]),
        ("index_sha256", SHA[:-1], ["`index_sha256`"]),
        ("shards", {}, ["`shards`", "expected a sequence"]),
        ("metadata_schema", None, ["`metadata_schema`"]),
    ],
)
def test_top_level_fields(key, value, fragments):
    d = doc()
    d[key] = value
    refused(d, *fragments)


def test_sample_count_at_its_maximum_is_accepted():
    d = doc()
    d["sample_count"] = MAX_SAMPLE_COUNT
    assert parse(d).sample_count == MAX_SAMPLE_COUNT


@pytest.mark.parametrize(
    "key",
    [
        "format_version",
        "source_name",
        "sample_count",
        "metadata_schema",
        "metadata_sha256",
        "index_sha256",
        "shards",
        "cache_id",
    ],
)
def test_missing_field(key):
    d = doc()
    del d[key]
    refused(d, f"missing field `{key}`")


@pytest.mark.parametrize(
    "shard, fragments",
    [
        ({"name": "../000000.bin"}, ["invalid shard name", "shards[0]"]),
        ({"byte_len": -1}, ["expected u64 for field `byte_len` in shards[0]"]),
        ({"uncompressed_byte_len": 2**63}, ["`uncompressed_byte_len`", "in shards[0]"]),
        ({"sha256": "x"}, ["`sha256`", "in shards[0]"]),
        ({"compression": {"algo": "brotli", "ratio": 1.0}}, ["unknown variant `brotli`", "`none`, `lz4`, `zstd`"]),
        ({"compression": {"algo": "lz4", "ratio": 0}}, ["`ratio`", "a positive finite number"]),
        ({"compression": {"algo": "lz4", "ratio": float("inf")}}, ["`ratio`"]),
        ({"compression": {"algo": "lz4", "ratio": "1"}}, ["`ratio`"]),
        ({"compression": "lz4"}, ["expected a map in shards[0].compression"]),
    ],
)
def test_shard_fields(shard, fragments):
    d = doc()
    d["shards"][0].update(shard)
    refused(d, *fragments)


def test_ratio_may_be_an_integer():
    d = doc()
    d["shards"][0]["compression"]["ratio"] = 2
    assert parse(d).shards[0].ratio == 2.0


def test_ratio_and_compression_are_required_as_dataset_rt_requires_them():
    """dataset-rt 0.4.8's serde refuses a shard without `compression` and a compression without
    `ratio` ("missing field", checked against the real package); so does the parser."""
    d = doc()
    del d["shards"][0]["compression"]["ratio"]
    refused(d, "missing field `ratio`", "in shards[0].compression")
    d = doc()
    del d["shards"][1]["compression"]
    refused(d, "missing field `compression`", "in shards[1]")


@pytest.mark.parametrize(
    "schema, fragments",
    [
        ([{"name": "a", "kind": "int"}, {"name": "a", "kind": "float"}], ["duplicate metadata column `a`"]),
        ([{"name": "a", "kind": "bytes"}], ["unknown variant `bytes`", "in metadata_schema[0]"]),
        ([{"name": "a"}], ["missing field `kind` in metadata_schema[0]"]),
        (["a"], ["expected a map in metadata_schema[0]"]),
    ],
)
def test_metadata_schema(schema, fragments):
    d = doc()
    d["metadata_schema"] = schema
    refused(d, *fragments)


@pytest.mark.parametrize(
    "sidecar",
    [
        {"file": "../x", "algo": "xxh3_64", "sha256": SHA},
        {"file": "", "algo": "xxh3_64", "sha256": SHA},
        {"file": "..", "algo": "xxh3_64", "sha256": SHA},
        {"file": "a\0b", "algo": "xxh3_64", "sha256": SHA},
        {"file": "c.xxh3", "algo": "crc32", "sha256": SHA},
    ],
)
def test_hostile_sidecar(sidecar):
    d = doc()
    d["datasetrt"]["record_checksums"] = sidecar
    refused(d, "for field `file`, expected a plain file name with algo xxh3_64 in datasetrt.record_checksums")


def test_sidecar_is_optional_and_the_extension_is_not_extra():
    d = doc()
    del d["datasetrt"]
    m = parse(d)
    assert m.checksums is None and m.extra == {} and m.payload_spec is None
    d["datasetrt"] = {"future": 1}
    assert parse(d).checksums is None


def test_payload_spec():
    d = doc()
    d["datasetrt"]["payload_spec"] = {"dtype": "float32", "shape": [None, 3]}
    m = parse(d)
    assert m.payload_spec == ("float32", (None, 3))
    assert json.loads(m.to_json())["datasetrt"]["payload_spec"] == {"dtype": "float32", "shape": [None, 3]}
    for bad, fragment in [
        ({"dtype": "float32", "shape": [3], "x": 1}, "unknown field `x`"),
        ({"dtype": "f4", "shape": [3]}, "`dtype`"),
        ({"dtype": "float32", "shape": [None, None]}, "`shape`"),
    ]:
        d["datasetrt"]["payload_spec"] = bad
        refused(d, fragment, "datasetrt.payload_spec")


def test_read_manifest_errors(tmp_path):
    with pytest.raises(MissingManifestError, match="missing manifest"):
        read_manifest(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(MissingManifestError):
        read_manifest(tmp_path / "file")
    (tmp_path / "dir" / "manifest.json").mkdir(parents=True)
    with pytest.raises(ManifestJSONError, match="manifest is a directory"):
        read_manifest(tmp_path / "dir")
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "manifest.json").write_text(manifest().to_json())
    assert read_manifest(tmp_path / "ok") == manifest()


def test_an_unreadable_manifest_is_an_io_error_naming_it(tmp_path):
    """Any OSError but absent/not-a-directory/is-a-directory (here ELOOP) is CacheIOError with errno + path."""
    from datasetrt.errors import CacheIOError

    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "manifest.json").symlink_to(tmp_path / "loop" / "manifest.json")
    with pytest.raises(
        CacheIOError, match=f"I/O error: .* \\(os error 40\\): {tmp_path / 'loop' / 'manifest.json'}"
    ) as info:
        read_manifest(tmp_path / "loop")
    assert (info.value.errno, info.value.path) == (40, str(tmp_path / "loop" / "manifest.json"))


def test_dictionary_id_and_size_at_their_limits_are_accepted():
    """zstd dictionary ids are u32 (2**32 - 1 is valid) and a size is 1..DICT_MAX_BYTES; the values
    just outside are refused in tests/unit/format/test_dictionary.py."""
    from datasetrt.format.manifest import DictionaryFile
    from datasetrt.values.codecs import DICT_MAX_BYTES

    shards = (ShardEntry("000000.bin", 10, 10, "zstd_dict", 1.0, SHA, level=3),)
    for dict_id, byte_len in [(2**32 - 1, 1), (1, DICT_MAX_BYTES)]:
        d = doc(shards=shards, dictionary=DictionaryFile("dictionary.zstd", dict_id, byte_len, SHA))
        assert parse(d).dictionary == DictionaryFile("dictionary.zstd", dict_id, byte_len, SHA)


def test_a_v2_manifest_without_the_extension_keeps_its_one_unknown_key():
    """7 v2 fields + 1 unknown key is as many keys as the known set less one: the unknown key is
    still kept (an early size shortcut once dropped it)."""
    d = doc(checksums=None)
    d["format_version"], d["note"] = 2, "kept"
    del d["cache_id"]
    assert "datasetrt" not in d and len(d) == 8
    m = parse(d)
    assert m.extra == {"note": "kept"}
    assert json.loads(m.to_json())["note"] == "kept"


@pytest.mark.parametrize("value", [-1, "x", 2**64])
def test_a_v2_manifest_s_cache_id_key_is_not_read(value):
    """v2 has no cache_id: a key of that name is ignored whatever it holds (dataset-rt 0.4.8's v2
    struct has no such field), never refused as an invalid u64."""
    d = doc()
    d["format_version"], d["cache_id"] = 2, value
    m = parse(d)
    assert m.cache_id is None and "cache_id" not in m.extra


def test_parsed_manifests_and_their_entries_are_immutable():
    """Readers share one parsed Manifest per cache: no field of it or of its entries can be set."""
    from dataclasses import FrozenInstanceError

    from datasetrt.format.manifest import DictionaryFile

    shards = (ShardEntry("000000.bin", 30, 20, "zstd_dict", 1.0, SHA, level=3),)
    m = parse(doc(shards=shards, dictionary=DictionaryFile("dictionary.zstd", 7, 100, SHA)))
    for entry, field in [
        (m, "sample_count"),
        (m.shards[0], "byte_len"),
        (m.checksums, "sha256"),
        (m.dictionary, "dict_id"),
    ]:
        with pytest.raises(FrozenInstanceError):
            setattr(entry, field, 1)


def test_a_long_bad_value_is_shown_as_its_first_80_characters_of_json():
    d = doc()
    d["sample_count"] = "9" * 200
    message = refused(d, "for field `sample_count`")
    assert f'invalid value: `"{"9" * 79}` for field' in message, message


def test_to_json_refuses_a_non_finite_ratio():
    """NaN and infinities are not JSON (dataset-rt's serde parser refuses them): a manifest holding
    one is never written."""
    for ratio in (float("nan"), float("inf")):
        m = manifest(shards=(ShardEntry("000000.bin", 9, 9, "none", ratio, SHA),))
        with pytest.raises(ValueError, match="not JSON compliant"):
            m.to_json()


def test_to_json_writes_non_ascii_as_utf8_like_serde():
    """serde_json writes strings raw (UTF-8), never as \\u escapes: a source name with é and 😀
    is in the file as those characters."""
    text = manifest(source_name="café-😀").to_json()
    assert '"source_name": "café-😀"' in text and "\\u" not in text
    assert parse_manifest(text.encode(), PATH).source_name == "café-😀"
