"""Column mapping and batch conversion (datasetrt/sources/columns.py) through RecordBatchSource:
payload kinds, metadata kinds, renames, typed layouts, every refusal with its location, and the
mapping's keywords in every source's signature."""

from __future__ import annotations

import inspect

import numpy as np
import pyarrow as pa
import pytest

from datasetrt import PayloadSpec
from datasetrt.errors import ArgumentTypeError, ConfigError, SourceInputError
from datasetrt.sources import (
    ArrowSource,
    BatchSource,
    Columns,
    HFDatasetSource,
    JsonLinesSource,
    ParquetSource,
    RecordBatchSource,
    open_path,
)


def items(table, **columns):
    source = RecordBatchSource("t", table, **columns)
    out = [(bytes(memoryview(d)) if not isinstance(d, np.ndarray) else d, m) for d, m in source]
    return out, source


def refused(table, match, **columns):
    with pytest.raises(SourceInputError, match=match) as info:
        list(RecordBatchSource("t", table, **columns))
    return str(info.value)


@pytest.mark.parametrize(
    "payload_type", [pa.binary(), pa.large_binary(), pa.binary_view(), pa.string(), pa.large_string(), pa.string_view()]
)
def test_byte_payloads_of_every_binary_and_string_type(payload_type):
    values = [b"a", b"", b"xyz" * 100, "\u00e9t\u00e9".encode()]
    column = pa.array(
        [v if pa.types.is_binary(payload_type) or "binary" in str(payload_type) else v.decode() for v in values],
        type=payload_type,
    )
    out, source = items(pa.table({"p": column, "i": [0, 1, 2, 3]}), payload="p")
    assert [d for d, _ in out] == values
    assert [m for _, m in out] == [{"i": i} for i in range(4)]
    assert source.payload_spec is None


def test_fixed_size_binary_payload_and_sliced_batches_keep_their_offsets():
    table = pa.table({"p": pa.array([bytes([i]) * 4 for i in range(10)], pa.binary(4)), "i": list(range(10))})
    out, _ = items(table.slice(3, 5), payload="p")
    assert [d for d, _ in out] == [bytes([i]) * 4 for i in range(3, 8)]
    out, _ = items(pa.table({"p": [b"a", b"bb", b"ccc", b"d"], "i": [0, 1, 2, 3]}).slice(1, 2), payload="p")
    assert out == [(b"bb", {"i": 1}), (b"ccc", {"i": 2})]


def test_metadata_kinds_are_plain_python_values():
    table = pa.table(
        {
            "p": [b"x", b"y"],
            "flag": [True, False],
            "i8": pa.array([-1, 2], pa.int8()),
            "u32": pa.array([1, 2**32 - 1], pa.uint32()),
            "u64": pa.array([0, 2**63 - 1], pa.uint64()),
            "f16": pa.array([0.5, 1.5], pa.float16()),
            "f32": pa.array([0.25, 2.0], pa.float32()),
            "s": pa.array(["a", "b"], pa.large_string()),
            "cat": pa.array(["en", "de"]).dictionary_encode(),
        }
    )
    out, _ = items(table)
    first = out[0][1]
    assert first == {"flag": True, "i8": -1, "u32": 1, "u64": 0, "f16": 0.5, "f32": 0.25, "s": "a", "cat": "en"}
    assert [type(first[k]) for k in ("flag", "i8", "f16", "s")] == [bool, int, float, str]
    assert out[1][1]["u64"] == 2**63 - 1 and out[1][1]["cat"] == "de"


def test_selected_metadata_renames_and_index_column():
    table = pa.table({"p": [b"a", b"b", b"c"], "lang": ["en", "de", "fr"], "n": [1, 2, 3], "skip": [0, 0, 0]})
    source = RecordBatchSource(
        "t", table, payload="p", metadata=["lang", "n"], rename={"lang": "language"}, index_column="row", first_row=100
    )
    assert [m for _, m in source] == [
        {"language": "en", "n": 1, "row": 100},
        {"language": "de", "n": 2, "row": 101},
        {"language": "fr", "n": 3, "row": 102},
    ]


def test_payload_inference_takes_the_only_binary_column():
    out, _ = items(pa.table({"n": [1], "blob": [b"z"]}))
    assert out == [(b"z", {"n": 1})]
    refused(pa.table({"a": [b"1"], "b": [b"2"]}), r"binary columns: a, b; name the payload column")
    refused(pa.table({"a": ["1"], "n": [2]}), r"no binary column")


@pytest.mark.parametrize(
    "columns, match",
    [
        ({"payload": "nope"}, r"payload column 'nope' not found \(columns: p, n\)"),
        ({"payload": "p", "metadata": ["n", "gone"]}, r"metadata column\(s\) 'gone' not found"),
        ({"payload": "p", "rename": {"x": "y"}}, r"rename names column\(s\) 'x' that are not metadata columns"),
        ({"payload": "p", "rename": {"n": "weight"}}, r"'weight' is reserved"),
        ({"payload": "p", "metadata": []}, r"no metadata columns: a cache needs at least one"),
        ({"payload": "p", "index_column": "n"}, r"two metadata columns would be named 'n'"),
    ],
)
def test_mapping_refusals_name_the_columns(columns, match):
    message = refused(pa.table({"p": [b"a"], "n": [1]}), match, **columns)
    assert message.startswith("Arrow data of source 't'")


def test_argument_errors_at_construction():
    with pytest.raises(ArgumentTypeError):
        Columns(3)
    with pytest.raises(ArgumentTypeError):
        Columns("p", "n")  # a str is not a list of columns
    with pytest.raises(ConfigError, match="both the payload and metadata"):
        Columns("p", ["p"])
    with pytest.raises(ConfigError, match="at most one dimension may be None"):
        Columns("p", payload_spec=("int32", (None, None)))
    with pytest.raises(ConfigError, match="either columns"):
        RecordBatchSource("t", pa.table({"p": [b""]}), columns=Columns("p"), payload="p")


@pytest.mark.parametrize(
    "column, type_text, what",
    [
        (pa.array([[1], [2]]), "list<item: int64>", "nested metadata"),
        (pa.array([{"a": 1}, {"a": 2}]), "struct<a: int64>", "nested metadata"),
        (pa.array([b"x", b"y"]), "binary", "unsupported metadata type"),
        (pa.array([1, 2], pa.timestamp("s")), "timestamp[s]", "unsupported metadata type"),
        (pa.array([None, None]), "null", "unsupported metadata type"),
    ],
)
def test_metadata_types_refused_by_name_and_type(column, type_text, what):
    message = refused(pa.table({"p": pa.array([b"a", b"b"]), "bad": column}), what, payload="p")
    assert f"column 'bad' has type {type_text}" in message


def test_every_refused_column_of_a_schema_is_named_in_one_error():
    table = pa.table(
        {"p": [b"a"], "l": [[1]], "t": pa.array([1], pa.timestamp("s")), "weight": [1.0], "ok": [1], "b": [b"x"]}
    )
    message = refused(table, "nested metadata", payload="p", metadata=["l", "t", "weight", "ok", "b", "gone"])
    for part in (
        "metadata column(s) 'gone' not found",
        "metadata column name 'weight' is reserved",
        "nested metadata: column 'l' has type list<item: int64>",
        "unsupported metadata type: column 't' has type timestamp[s]",
        "unsupported metadata type: column 'b' has type binary; metadata values must be bool, int, float or string "
        "(flatten or cast them, or leave them out)",
    ):
        assert part in message
    assert "'ok'" not in message
    message = refused(table, "payload column 'q' not found", payload="q", metadata=["l", "ok"])
    assert "column 'l' has type list<item: int64>" in message  # the metadata is checked too


@pytest.mark.parametrize(
    "column, match",
    [
        (pa.array([1, None, 3]), r"batch 0, row 1 \(row 1 of the batch\): metadata column 'm' \(int64\) is null"),
        (pa.array([1.0, 2.0, float("nan")]), r"row 2 of the batch\): metadata column 'm' \(double\) is nan"),
        (pa.array([0.0, float("inf"), 1.0], pa.float32()), r"row 1 .*is inf; float metadata must be finite"),
        (pa.array([0, 1, 2**63], pa.uint64()), r"row 2 .*is 9223372036854775808, outside the int64 range"),
    ],
)
def test_metadata_values_refused_by_row(column, match):
    refused(pa.table({"p": [b"a", b"b", b"c"], "m": column}), match, payload="p")


def test_null_payload_names_row_column_and_type():
    batches = [pa.record_batch({"p": [b"a", b"b"], "n": [0, 1]}), pa.record_batch({"p": [b"c", None], "n": [2, 3]})]
    message = refused(batches, r"payload column 'p' \(binary\) is null", payload="p")
    assert "batch 1, row 3 (row 1 of the batch)" in message


def test_batches_with_another_schema_are_refused():
    batches = [pa.record_batch({"p": [b"a"], "n": [0]}), pa.record_batch({"p": [b"c"], "n": [0.5]})]
    refused(batches, r"record batch 1 has schema", payload="p")


def test_typed_layouts_inferred_from_list_types():
    table = pa.table(
        {
            "ragged": pa.array([[1, 2], [], [3]], pa.list_(pa.int32())),
            "fixed": pa.array([[1, 2, 3]] * 3, pa.list_(pa.float32(), 3)),
            "points": pa.array([[[1, 2]], [[3, 4], [5, 6]], []], pa.large_list(pa.list_(pa.float64(), 2))),
            "grid": pa.array([[[1, 2, 3], [4, 5, 6]]] * 3, pa.list_(pa.list_(pa.int8(), 3), 2)),
            "flags": pa.array([[True, False], [True], []], pa.list_(pa.bool_())),
            "n": [0, 1, 2],
        }
    )
    cases = {
        "ragged": (np.int32, (None,)),
        "fixed": (np.float32, (3,)),
        "points": (np.float64, (None, 2)),
        "grid": (np.int8, (2, 3)),
        "flags": (np.bool_, (None,)),
    }
    for column, (dtype, shape) in cases.items():
        out, source = items(table, payload=column, metadata=["n"])
        assert source.payload_spec == PayloadSpec(dtype, shape)
        expected = table.column(column).to_pylist()
        for (data, _), want in zip(out, expected):
            assert data.dtype == dtype
            np.testing.assert_array_equal(
                data,
                np.array(want, dtype=dtype).reshape(-1, *shape[1:])
                if shape[0] is None
                else np.array(want, dtype=dtype),
            )


@pytest.mark.parametrize(
    "column", [pa.array([[[1]], [[2, 3]]]), pa.array([["a"], ["b"]]), pa.array([{"x": 1}, {"x": 2}])]
)
def test_payload_types_refused(column):
    message = refused(pa.table({"p": column, "n": [0, 1]}), r"payload", payload="p")
    assert "payload column 'p'" in message and str(column.type) in message


def test_null_payload_element_names_the_record_and_index():
    column = pa.array([[1, 2], [3, None, 5]], pa.list_(pa.int64()))
    message = refused(
        pa.table({"p": column, "n": [0, 1]}), r"has a null element \(index 1 of the record\)", payload="p"
    )
    assert "row 1" in message


def test_given_spec_casts_exactly_and_refuses_what_does_not_fit():
    table = pa.table({"p": pa.array([[1, 2, 3, 4], [5, 6, 7, 8]]), "n": [0, 1]})
    out, source = items(table, payload="p", payload_spec=("int16", (2, 2)))
    assert source.payload_spec == PayloadSpec("int16", (2, 2))
    np.testing.assert_array_equal(out[1][0], np.array([[5, 6], [7, 8]], np.int16))
    out, _ = items(table, payload="p", payload_spec=("uint8", (2, None)))  # ragged inner axis
    assert out[0][0].shape == (2, 2)
    big = pa.table({"p": pa.array([[1], [70000]]), "n": [0, 1]})
    refused(
        big,
        r"row 1 .*value 70000 \(int64\) does not fit payload spec dtype int16",
        payload="p",
        payload_spec=("int16", (None,)),
    )
    refused(
        table,
        r"row 0 .*holds 4 elements; payload spec int64\[3\] needs 3 elements",
        payload="p",
        payload_spec=("int64", (3,)),
    )
    refused(table, r"needs a multiple of 3 elements", payload="p", payload_spec=("int64", (None, 3)))


def test_byte_payload_lengths_checked_against_a_given_spec():
    table = pa.table({"p": [b"\x01\x00\x00\x00", b"\x02\x00\x00\x00\x03\x00\x00\x00", b"\x04\x00"], "n": [0, 1, 2]})
    refused(
        table,
        r"row 2 .*holds 2 bytes; payload spec int32\[None\] needs a multiple of 4 bytes",
        payload="p",
        payload_spec=("int32", (None,)),
    )
    refused(
        table,
        r"row 1 .*holds 8 bytes; payload spec int32\[1\] needs 4 bytes",
        payload="p",
        payload_spec=("int32", (1,)),
    )


def test_encoded_file_struct_payload_is_its_bytes_field():
    column = pa.array([{"bytes": b"\x89PNG1", "path": "a.png"}, {"bytes": b"\x89PNG22", "path": None}])
    out, source = items(pa.table({"img": column, "n": [0, 1]}), payload="img")
    assert out == [(b"\x89PNG1", {"n": 0}), (b"\x89PNG22", {"n": 1})] and source.payload_spec is None
    path_only = pa.array([{"bytes": b"x", "path": None}, {"bytes": None, "path": "b.png"}])
    refused(
        pa.table({"img": path_only, "n": [0, 1]}), r"row 1 .*has no bytes \(a file stored by path only\)", payload="img"
    )


def test_payload_spec_is_known_before_iteration_and_one_shot_inputs_keep_their_first_batch():
    table = pa.table({"p": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.uint16())), "n": [0, 1, 2]})
    spec = PayloadSpec("uint16", (None,))
    for data in (
        table,
        table.to_batches(max_chunksize=2),
        iter(table.to_batches(max_chunksize=2)),
        pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=1)),
    ):
        source = RecordBatchSource("t", data, payload="p")
        assert source.payload_spec == spec
        assert [d.tolist() for d, _ in source] == [[1, 2], [3], [4, 5, 6]]
    assert RecordBatchSource("t", [], payload="p").payload_spec is None  # nothing to type
    assert RecordBatchSource("t", table.select(["n"]).append_column("b", pa.array([b"x"] * 3))).payload_spec is None


def test_a_given_payload_spec_is_the_sources_spec_as_a_payload_spec_or_a_pair():
    table = pa.table({"p": pa.array([[1, 2], [3, 4]]), "n": [0, 1]})
    for given in (PayloadSpec("int8", (2,)), ("int8", (2,)), ("int8", [2])):
        source = RecordBatchSource("t", table, payload="p", payload_spec=given)
        assert source.payload_spec == PayloadSpec("int8", (2,)) and source.columns.payload_spec == source.payload_spec
    with pytest.raises(ArgumentTypeError, match="PayloadSpec or a \\(dtype, shape\\) pair"):
        Columns("p", payload_spec="int8")
    with pytest.raises(ConfigError, match="PayloadSpec dtype"):
        Columns("p", payload_spec=("float128", (2,)))
    refused(
        pa.table({"p": pa.array([[[]]], pa.list_(pa.list_(pa.int8(), 0))), "n": [0]}),
        r"'p' has type .*: PayloadSpec shape \(None, 0\)",
        payload="p",
    )


@pytest.mark.parametrize(
    "build", [HFDatasetSource, ParquetSource, ArrowSource, JsonLinesSource, RecordBatchSource, open_path]
)
def test_every_source_shows_the_column_keywords_in_its_signature(build):
    """help() and IDEs list the mapping's keywords (no `**columns`), with BatchSource's defaults."""
    mapping = {
        name: param.default
        for name, param in inspect.signature(BatchSource.__init__).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(mapping) == {"payload", "metadata", "rename", "payload_spec", "index_column", "batch_bytes", "columns"}
    params = inspect.signature(build).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert {name: params[name].default for name in mapping} == mapping
    assert all(params[name].kind is inspect.Parameter.KEYWORD_ONLY for name in mapping)
