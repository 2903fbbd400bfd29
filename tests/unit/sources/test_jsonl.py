"""JSON Lines reading (datasetrt/sources/jsonl.py through JsonLinesSource): lines longer than a
block, types over every file, exact integers, refused int/float mixes, file-relative records in
errors. Every input is written by Python's json module; caches are written and read back through
the real writer and dataset."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError, SourceInputError
from datasetrt.sources import JsonLinesSource, open_path
from datasetrt.sources.jsonl import parse_column_types, parse_type
from tests.conftest import writer_config

BLOCK = 1 << 16  # the smallest block: a few thousand short records per block


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def read_back(source, tmp_path):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache([source], tmp_path / "caches", writer_config=writer_config())
    assert isinstance(result, drt.CacheWriteSuccess), result
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    return [(s.data, s.metadata) for s in ds]


def many(n, **columns):
    """n records {"text": "t<i>", "n": i}, with `columns` (record -> row overrides) applied."""
    rows = [{"text": f"t{i}", "n": i} for i in range(n)]
    for record, row in columns.items():
        rows[int(record.lstrip("r"))] = row
    return rows


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_3_mib_line_converts_with_the_defaults(tmp_path, suffix):
    long = "x" * (3 << 20)
    rows = [{"text": "a", "n": 0}, {"text": long, "n": 1}, {"text": "b", "n": 2}]
    path = write_jsonl(tmp_path / f"long{suffix}", rows, gzip.open if suffix.endswith(".gz") else open)
    got = read_back(JsonLinesSource("long", path, payload="text"), tmp_path)
    assert got == [(b"a", {"n": 0}), (long.encode(), {"n": 1}), (b"b", {"n": 2})]


def test_a_line_longer_than_max_line_bytes_is_refused_naming_its_record(tmp_path):
    rows = [{"text": "a" * 100, "n": i} for i in range(2000)] + [{"text": "y" * 200_000, "n": 1}]
    path = write_jsonl(tmp_path / "l.jsonl", rows)
    source = JsonLinesSource("l", path, payload="text", block_bytes=BLOCK, max_line_bytes=100_000)
    with pytest.raises(
        SourceInputError, match=r"l.jsonl: record 2000: the line is longer than max_line_bytes \(100000\)"
    ):
        list(source)
    assert len(list(JsonLinesSource("l", path, payload="text", block_bytes=BLOCK, max_line_bytes=300_000))) == 2001


def test_an_int_column_turning_float_after_the_first_block_is_refused_naming_the_record(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", many(30_000, r25000={"text": "z", "n": 25000.5}))
    assert path.stat().st_size > 4 * BLOCK  # record 25000 lies blocks after the first
    with pytest.raises(SourceInputError) as info:
        list(JsonLinesSource("n", path, payload="text", block_bytes=BLOCK))
    assert str(info.value).startswith(
        f"{path}: record 25000: column 'n' holds the float 25000.5 but record 0 holds the integer 0"
    )
    assert "--column-types n=float64" in str(info.value)


def test_a_float_type_reads_the_mixed_column_exactly(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", many(30_000, r25000={"text": "z", "n": 25000.5}))
    for types in ({"n": pa.float64()}, {"n": "float64"}):
        records = list(JsonLinesSource("n", path, payload="text", block_bytes=BLOCK, column_types=types))
        values = [r.metadata["n"] for r in records]
        assert values == [float(i) for i in range(25000)] + [25000.5] + [float(i) for i in range(25001, 30000)]
        assert all(type(v) is float for v in values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1, 2, 2.5, 3], "record 2: column 'n' holds the float 2.5 but record 0 holds the integer 1"),
        ([1.5, 1.0, 2.0, 3, 4], "record 3: column 'n' holds the integer 3 but record 0 holds the float 1.5"),
        ([None, 4.0, 7], "record 2: column 'n' holds the integer 7 but record 1 holds the float 4.0"),
    ],
)
def test_a_mixed_column_is_refused_naming_the_first_record_that_differs(tmp_path, values, message):
    path = write_jsonl(tmp_path / "m.jsonl", [{"text": "t", "n": v} for v in values])
    with pytest.raises(SourceInputError, match=f"m.jsonl: {message}"):
        list(JsonLinesSource("m", path, payload="text", metadata=["n"]))


def test_whole_floats_stay_floats_and_a_later_integer_is_found(tmp_path):
    rows = [{"text": f"t{i}", "w": float(i % 10)} for i in range(20_000)]
    path = write_jsonl(tmp_path / "w.jsonl", rows)
    assert [r.metadata["w"] for r in JsonLinesSource("w", path, payload="text", block_bytes=BLOCK)][:3] == [
        0.0,
        1.0,
        2.0,
    ]
    rows[15_000] = {"text": "z", "w": 3}
    write_jsonl(tmp_path / "w.jsonl", rows)
    with pytest.raises(SourceInputError, match="w.jsonl: record 15000: column 'w' holds the integer 3 but record 0"):
        list(JsonLinesSource("w", path, payload="text", block_bytes=BLOCK))
    # a key json writes with escapes (non-ASCII) is checked line by line
    rows = [{"text": "t", "\u00e9": 1.0}, {"text": "t", "\u00e9": 2}]
    path = write_jsonl(tmp_path / "e.jsonl", rows)
    with pytest.raises(SourceInputError, match="e.jsonl: record 1: column '\u00e9' holds the integer 2"):
        list(JsonLinesSource("e", path, payload="text"))


def test_integers_beyond_2_53_come_back_exact(tmp_path):
    big = 9007199254740993  # 2**53 + 1: a float64 would read 9007199254740992
    rows = [{"text": f"t{i}", "id": i} for i in range(5000)] + [
        {"text": "big", "id": big},
        {"text": "max", "id": 2**63 - 1},
    ]
    path = write_jsonl(tmp_path / "ids.jsonl", rows)
    got = read_back(JsonLinesSource("ids", path, payload="text", block_bytes=BLOCK), tmp_path)
    assert got[5000:] == [(b"big", {"id": big}), (b"max", {"id": 2**63 - 1})]


def test_integers_no_type_holds_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [{"text": "a", "id": 1}, {"text": "b", "id": 2**64 + 1}])
    with pytest.raises(
        SourceInputError, match=f"b.jsonl: record 1: column 'id' holds the integer {2**64 + 1}, beyond int64"
    ):
        list(JsonLinesSource("b", path, payload="text"))
    path = write_jsonl(tmp_path / "f.jsonl", [{"text": "a", "x": 0.5}, {"text": "b", "x": 9007199254740993}])
    with pytest.raises(
        SourceInputError, match="f.jsonl: record 1: column 'x' holds the integer 9007199254740993, which float64"
    ):
        list(JsonLinesSource("f", path, payload="text", column_types={"x": "float64"}))
    with pytest.raises(
        SourceInputError, match="f.jsonl: record 1: column 'x' holds the integer 9007199254740993 but record 0"
    ):
        list(JsonLinesSource("f", path, payload="text"))


def test_errors_after_the_first_block_name_the_record_in_the_file(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", many(30_000, r27000={"text": "z", "n": "seven"}))
    with pytest.raises(SourceInputError, match=r"e.jsonl: record 27000: column 'n': cannot read: .*number to string"):
        list(JsonLinesSource("e", path, payload="text", block_bytes=BLOCK))
    with pytest.raises(SourceInputError, match=r"e.jsonl: record 27000: column 'n': cannot read: .*number to string"):
        list(
            JsonLinesSource(
                "e",
                path,
                payload="text",
                metadata=["n"],
                block_bytes=BLOCK,
                column_types={"n": "int64", "text": "string"},
            )
        )
    path = write_jsonl(tmp_path / "z.jsonl", many(30_000, r26000={"text": None, "n": 1}))
    with pytest.raises(SourceInputError, match=r"z.jsonl: record 26000: payload column 'text' \(string\) is null"):
        list(JsonLinesSource("z", path, payload="text", block_bytes=BLOCK))


def test_records_count_from_each_file_and_types_span_every_file(tmp_path):
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "a.jsonl", many(10))
    write_jsonl(tmp_path / "d" / "b.jsonl", many(10, r4={"text": "x", "n": 4.5}))
    with pytest.raises(
        SourceInputError, match=r"b.jsonl: record 4: column 'n' holds the float 4.5 but \S*a.jsonl: record 0"
    ):
        list(JsonLinesSource("d", tmp_path / "d", payload="text"))
    write_jsonl(tmp_path / "d" / "b.jsonl", many(10, r6={"text": None, "n": 6}))
    with pytest.raises(SourceInputError, match=r"b.jsonl: record 6: payload column 'text'"):
        list(JsonLinesSource("d", tmp_path / "d", payload="text"))


def test_types_are_inferred_over_the_whole_input(tmp_path):
    rows = [{"ids": [], "n": i} for i in range(5000)] + [{"ids": [1, 2], "n": 5000}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    source = JsonLinesSource("t", path, payload="ids", block_bytes=BLOCK)
    assert source.payload_spec == drt.PayloadSpec("int64", (None,))  # list<null> in the first block
    assert list(source)[-1].metadata == {"n": 5000}


def test_a_whole_schema_reads_only_its_columns_without_inferring(tmp_path):
    rows = [{"text": f"t{i}", "n": i, "odd": "s" if i < 3000 else 1} for i in range(6000)]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    source = JsonLinesSource("s", path, payload="text", schema=pa.schema({"text": pa.string(), "n": pa.int32()}))
    records = list(source)
    assert len(records) == 6000 and records[-1].metadata == {"n": 5999}
    with pytest.raises(SourceInputError, match="column 'odd'"):  # inferred, the column conflicts
        list(JsonLinesSource("s", path, payload="text", block_bytes=BLOCK))
    typed = JsonLinesSource("s", path, payload="text", metadata=["n"], column_types={"text": "string", "n": "int64"})
    assert len(list(typed)) == 6000  # every column read has a type: no inference, `odd` ignored


def test_list_payloads_mixing_integers_and_floats(tmp_path):
    path = write_jsonl(tmp_path / "v.jsonl", [{"v": [0.5, 1.5], "n": 0}, {"v": [1, 2.5], "n": 1}])
    with pytest.raises(SourceInputError, match=r"v.jsonl: record 1: column 'v' holds the integer 1 but record 0"):
        list(JsonLinesSource("v", path, payload="v"))
    source = JsonLinesSource("v", path, payload="v", column_types={"v": "list<float32>"})
    assert source.payload_spec == drt.PayloadSpec("float32", (None,))
    assert [bytes(r.data) for r in source][1] == pa.array([1, 2.5], pa.float32()).buffers()[1].to_pybytes()
    # whole floats beside a list of integers are floats; an integer among them is found
    rows = [{"v": [0.0, i + 0.5], "ids": [i, 2], "n": i} for i in range(3000)]
    path = write_jsonl(tmp_path / "w.jsonl", rows)
    assert JsonLinesSource("w", path, payload="v", metadata=["n"]).payload_spec == drt.PayloadSpec("float64", (None,))
    rows[2500] = {"v": [1.0, 2], "ids": [], "n": 2500}
    path = write_jsonl(tmp_path / "w.jsonl", rows)
    with pytest.raises(SourceInputError, match=r"w.jsonl: record 2500: column 'v' holds the integer 2 but record 0"):
        list(JsonLinesSource("w", path, payload="v", metadata=["n"], block_bytes=BLOCK))
    nested = [{"v": [[0.5], [1.0]], "n": 0}, {"v": [[2.0], [3]], "n": 1}]
    with pytest.raises(SourceInputError, match=r"x.jsonl: record 1: column 'v' holds the integer 3 but record 0"):
        list(JsonLinesSource("x", write_jsonl(tmp_path / "x.jsonl", nested), payload="v", metadata=["n"]))


def test_blank_lines_are_not_records(tmp_path):
    (tmp_path / "b.jsonl").write_text('{"text": "a", "n": 1}\n\n  \n{"text": "b", "n": 2.5}\n')
    with pytest.raises(SourceInputError, match="b.jsonl: record 1: column 'n' holds the float 2.5"):
        list(JsonLinesSource("b", tmp_path / "b.jsonl", payload="text"))


def test_type_names_and_option_errors(tmp_path):
    assert parse_type("list<int32>") == pa.list_(pa.int32())
    assert parse_type(" large_list<list<float64>> ") == pa.large_list(pa.list_(pa.float64()))
    assert parse_column_types("a=int64,b=list<bool>,c=string") == {
        "a": pa.int64(),
        "b": pa.list_(pa.bool_()),
        "c": pa.string(),
    }
    for bad in ("a", "a=", "=int64", "a=integer"):
        with pytest.raises(ConfigError):
            parse_column_types(bad)
    path = write_jsonl(tmp_path / "o.jsonl", [{"text": "a"}])
    for kw in (
        {"column_types": {"n": "int64"}, "schema": {"text": "string"}},
        {"column_types": {"n": pa.float16()}},  # the JSON reader cannot produce it
        {"block_bytes": 100},
        {"max_line_bytes": 1000},  # below block_bytes (1 MiB): a line of a block would pass it
        {"block_bytes": 1 << 30},
    ):
        with pytest.raises(ConfigError):
            JsonLinesSource("o", path, payload="text", **kw)
    (tmp_path / "o.parquet").touch()
    with pytest.raises(ConfigError, match="column_types do not apply to ParquetSource"):
        open_path(tmp_path / "o.parquet", column_types={"n": "int64"})
