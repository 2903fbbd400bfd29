"""manifest_json.py: manifest.json's bytes -> a document strictly as serde reads it (UTF-8, no
repeated key, serde's EOF / syntax wording), and typed field access naming path and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from datasetrt.errors import ManifestJSONError
from datasetrt.format.manifest import parse_manifest
from datasetrt.format.manifest_json import Fields, decode_document

PATH = Path("/caches/c/manifest.json")


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"\xff{}", "manifest is not UTF-8"),
        (b'{"format_version": 3, "format_version": 3}', "duplicate manifest field `format_version`"),
        (b'{"format_version": 3,', "EOF while parsing an object at line 1 column 21"),
        (b'{"a": [1, 2', "EOF while parsing a list"),
        (b'{"a": "x', "EOF while parsing a string"),
        (b'{"a": "x\\"', "EOF while parsing a string"),  # an escaped quote does not end the string
        (b'{"a": "x\\"", "b": [1', "EOF while parsing a list"),  # ... and the character after it is not escaped
        (b'{\n  "a": 1,', "EOF while parsing an object at line 2 column 9"),  # the column counts from the last newline
        (b"", "EOF while parsing a value at line 1 column 0"),
        (b'{"a": 1}}', "syntax error"),
        (b"[" * 100_000, "JSON error"),
        (b'{"sample_count": ' + b"9" * 5000 + b"}", "number out of range"),
        (b"[]", "expected a map"),
    ],
)
def test_malformed_documents(raw, fragment):
    with pytest.raises(ManifestJSONError, match=fragment) as info:
        parse_manifest(raw, PATH)
    assert str(PATH) in str(info.value)


def test_a_repeated_key_is_refused_in_nested_objects_too():
    assert decode_document(b'{"a": {"b": 1}, "c": [{"d": 2}]}', PATH) == {"a": {"b": 1}, "c": [{"d": 2}]}
    with pytest.raises(ManifestJSONError, match="duplicate manifest field `d`"):
        decode_document(b'{"c": [{"d": 2, "d": 3}]}', PATH)


def test_fields_check_type_and_range_and_say_where():
    f = Fields(PATH, {"n": 5, "neg": -1, "s": "x", "sha": "ab" * 32, "r": 2, "l": [1]}, " in shards[3]")
    assert (f.uint("n", maximum=5), f.string("s"), f.sha256("sha"), f.number("r"), f.array("l")) == (
        5,
        "x",
        "ab" * 32,
        2.0,
        [1],
    )
    with pytest.raises(
        ManifestJSONError,
        match=f"invalid value: `5` for field `n`, expected an integer in \\[0, 4\\] in shards\\[3\\]: {PATH}",
    ):
        f.uint("n", maximum=4)
    with pytest.raises(ManifestJSONError, match="integer `-1`, expected u64 for field `neg`"):
        f.uint("neg")
    with pytest.raises(ManifestJSONError, match=f"missing field `absent` in shards\\[3\\]: {PATH}"):
        f.string("absent")
    with pytest.raises(ManifestJSONError, match="expected 64 lowercase hex digits"):
        f.sha256("s")
    with pytest.raises(ManifestJSONError, match="invalid type, expected a map in x"):
        Fields(PATH, [], " in x")
