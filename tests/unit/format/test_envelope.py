"""Sample envelope: float/string JSON text, metadata typing and the exact record-0 bytes of `tiny`.

Reference: dataset_rt-0.4.8-behaviour.md §2.5 (type mapping) and §4 (JSON float/string forms).
"""

from __future__ import annotations

import enum
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasetrt.errors import SourceError
from datasetrt.format import envelope
from datasetrt.format.envelope import MetadataSchema, format_float

# Observed serde_json forms (§4).
SERDE_FLOATS = [
    (1e-5, "0.00001"),
    (9.9e-6, "9.9e-6"),
    (1e-7, "1e-7"),
    (0.000025, "0.000025"),
    (0.1, "0.1"),
    (1e15, "1000000000000000.0"),
    (9999999999999998.0, "9999999999999998.0"),
    (1e16, "1e+16"),
    (1.2345678901234568e17, "1.2345678901234568e+17"),
    (5e-324, "5e-324"),
    (-0.0, "-0.0"),
    (1.0, "1.0"),
    (-1e-5, "-0.00001"),
    (1.5e-5, "0.000015"),
    (-2.5e-7, "-2.5e-7"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
]


@pytest.mark.parametrize(("value", "text"), SERDE_FLOATS)
def test_format_float_matches_observed_serde_forms(value, text):
    assert format_float(value) == text


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_format_float_round_trips_bit_exactly(x):
    text = format_float(x)
    assert _bits(float(text)) == _bits(x)
    assert _bits(json.loads(text)) == _bits(x)
    # serde never pads the exponent and always signs a positive one.
    if "e" in text:
        exp = text.split("e")[1]
        assert exp[0] in "+-" and not exp[1:].startswith("0")
    else:
        assert ("." in text and 1e-5 <= abs(x) < 1e16) or x == 0.0


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ('a"b', r'"a\"b"'),
        ("a\\b", r'"a\\b"'),
        ("a\nb", r'"a\nb"'),
        ("a\tb", r'"a\tb"'),
        ("a\x01b", r'"a\u0001b"'),
        ("a\x1fb", r'"a\u001fb"'),
        ("a/b", '"a/b"'),
        ("<tag>", '"<tag>"'),
        ("é", '"é"'),
        ("\u2028", '"\u2028"'),
        ("😀", '"😀"'),
        ("\x7f", '"\x7f"'),
    ],
)
def test_string_escaping_matches_serde(raw, escaped):
    js, _ = MetadataSchema({"s": raw}).encode({"s": raw})
    assert js == ('{"s":' + escaped + "}").encode("utf-8")
    assert json.loads(js) == {"s": raw}


def test_keys_are_sorted_and_escaped_compact():
    md = {"z": 1, "a": 2.5, "m\n": "x", "B": True}
    js, values = MetadataSchema(md).encode(md)
    assert js == b'{"B":true,"a":2.5,"m\\n":"x","z":1}'
    assert values == (True, 2.5, "x", 1)


def test_reference_record_zero_of_tiny_is_byte_exact():
    """§4: record 0 of `tiny` = u64 LE json_len | compact JSON | payload b"zero"."""
    md = {"label": "a", "score": 1.5, "kept": True, "index": 0}
    js, _ = MetadataSchema(md).encode(md)
    record = len(js).to_bytes(8, "little") + js + b"zero"
    expected = bytes.fromhex(
        "2f00000000000000"
        "7b22696e646578223a302c226b657074223a747275652c22"
        "6c6162656c223a2261222c2273636f7265223a312e357d"
        "7a65726f"
    )
    assert record == expected


def test_schema_items_and_kinds():
    schema = MetadataSchema({"s": "x", "b": False, "i": 3, "f": 0.5})
    assert schema.items == [("b", "bool"), ("f", "float"), ("i", "int"), ("s", "string")]


class Color(enum.IntEnum):
    RED = 1


class Shade(str, enum.Enum):  # noqa: UP042 (a str subclass whose str() is not its value)
    DARK = "dark"


class BadFloat(float):
    def __float__(self):
        raise ZeroDivisionError("a subclass's __float__ is never called")


@pytest.mark.parametrize(
    ("value", "kind", "plain"),
    [
        (True, "bool", True),
        (np.bool_(False), "bool", False),
        (7, "int", 7),
        (np.int64(-3), "int", -3),
        (np.int32(5), "int", 5),
        (2**63 - 1, "int", 2**63 - 1),
        (-(2**63), "int", -(2**63)),
        (0.5, "float", 0.5),
        (np.float32(0.1), "float", float(np.float32(0.1))),
        ("x", "string", "x"),
        (Color.RED, "int", 1),
        (Shade.DARK, "string", "dark"),
        (BadFloat(0.25), "float", 0.25),
    ],
)
def test_normalize_value_kinds(value, kind, plain):
    got_kind, got = envelope.normalize_value("k", value)
    assert got_kind == kind and got == plain and type(got) is type(plain)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf, np.float64("nan")])
def test_non_finite_floats_rejected(value):
    """Deliberate difference: dataset-rt 0.4.8 stores NaN/inf and every later read fails."""
    with pytest.raises(SourceError, match="finite"):
        envelope.normalize_value("k", value)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, np.uint64(2**64 - 1)])
def test_ints_outside_int64_rejected(value):
    """Deliberate difference: dataset-rt 0.4.8 silently stores them as float."""
    with pytest.raises(SourceError, match="int64"):
        envelope.normalize_value("k", value)


@pytest.mark.parametrize("name", ["cache_id", "sample_id", "weight"])
def test_reserved_column_names_rejected(name):
    """Deliberate difference: dataset-rt 0.4.8 stores them, then they collide with table columns."""
    with pytest.raises(SourceError, match="reserved"):
        MetadataSchema({name: 1})


def test_every_refused_column_of_the_first_sample_is_named_in_one_error():
    with pytest.raises(SourceError) as info:
        MetadataSchema({"a": [1], "ok": 1, "weight": 1.0, "z": float("nan")}, 0)
    assert str(info.value) == (
        "metadata values must be bool, int, float, or str: sample 0, column 'a': got list [1]; "
        "metadata field 'weight' is reserved: cache_id, sample_id and weight are table columns: sample 0; "
        "metadata field 'z' must be a finite float, got nan: sample 0"
    )


def test_str_subclass_keys_are_accepted_as_plain_str():
    md = {np.str_("a"): 1}
    schema = MetadataSchema(md)
    assert schema.names == ("a",) and type(schema.names[0]) is str
    assert schema.encode(md)[0] == b'{"a":1}'


def test_lone_surrogate_string_value_is_a_source_error():
    schema = MetadataSchema({"a": "ok"})
    with pytest.raises(SourceError, match="metadata values must be bool, int, float, or str"):
        schema.encode({"a": "\ud800"})


@pytest.mark.parametrize(
    "data",
    [bytearray(b"abc"), memoryview(b"abc"), np.frombuffer(b"abc", dtype=np.uint8)],
)
def test_as_payload_copies_buffers(data):
    out = envelope.as_payload(data)
    assert type(out) is bytes and out == b"abc"


def test_as_payload_keeps_bytes_and_accepts_strided_and_0d():
    b = b"xyz"
    assert envelope.as_payload(b) is b
    assert envelope.as_payload(np.arange(6, dtype=np.uint8)[::2]) == b"\x00\x02\x04"
    assert envelope.as_payload(np.array(1.0)) == struct.pack("=d", 1.0)


@pytest.mark.parametrize("data", ["text", None, object(), 5])
def test_as_payload_rejects_non_buffers(data):
    with pytest.raises(SourceError, match="^data must be bytes-like$"):
        envelope.as_payload(data)


# -- differential check against the real dataset-rt (skipped when it is not installed) -----------


def _records(cache: Path) -> list[bytes]:
    index = np.fromfile(cache / "index.bin", dtype="<u8").reshape(-1, 3)
    names = sorted((cache / "shards").iterdir())
    shards = [p.read_bytes() for p in names]
    return [shards[s][o : o + n] for s, o, n in index.tolist()]


def _json_of(record: bytes) -> bytes:
    n = int.from_bytes(record[:8], "little")
    return record[8 : 8 + n]


def test_envelope_bytes_equal_dataset_rt(tmp_path):
    drt_ref = pytest.importorskip("dataset_rt")
    rng = np.random.default_rng(7)
    floats = [float(m * 10.0**e) for m, e in zip(rng.standard_normal(400), rng.integers(-30, 30, 400))]
    floats += [v for v, _ in SERDE_FLOATS] + [float(np.nextafter(1e16, 0)), float(np.nextafter(1e-5, 0))]
    texts = ["", 'q"\\', "\x00\x08\x0c\r\x1f\x7f", "/<>&é\u2028\u2029😀", "\ud7ff\ue000"]
    items = [(b"", {"f": f, "s": texts[i % len(texts)], "i": i - 200, "b": i % 2 == 0}) for i, f in enumerate(floats)]

    class Src:
        name = "diff"

        def __iter__(self):
            return iter(items)

    rt = drt_ref.DatasetRuntime(num_workers=1)
    (res,) = rt.write_cache([Src()], tmp_path, writer_config=drt_ref.WriterConfig(show_progress=False))
    assert isinstance(res, drt_ref.CacheWriteSuccess), res
    got = [_json_of(r) for r in _records(tmp_path / "diff")]
    schema = MetadataSchema(items[0][1])
    assert got == [schema.encode(md)[0] for _, md in items]
