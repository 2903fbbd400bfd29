"""CSV / TSV files (datasetrt/sources/delimited.py), written by pyarrow.csv: the payload column read
as its text's bytes, inferred metadata kinds, dates kept as text, open_path by suffix, and every
refusal naming the file and the row (and the line, where pyarrow names it)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from datasetrt.errors import SourceInputError
from datasetrt.sources import CsvSource, default_name, open_path


def _items(source):
    return [(bytes(d), m) for d, m in source]


def test_csv_rows_become_records_with_typed_metadata(tmp_path):
    table = pa.table(
        {"text": ["hello", "wörld", "42"], "n": [1, 2, 3], "f": [0.5, 1.5, 2.5], "day": ["2020-01-01"] * 3}
    )
    pacsv.write_csv(table, tmp_path / "t.csv")
    source = open_path(tmp_path / "t.csv", payload="text")
    assert isinstance(source, CsvSource) and default_name(tmp_path / "t.csv") == "t"
    assert _items(source) == [
        (b"hello", {"n": 1, "f": 0.5, "day": "2020-01-01"}),
        ("wörld".encode(), {"n": 2, "f": 1.5, "day": "2020-01-01"}),
        (b"42", {"n": 3, "f": 2.5, "day": "2020-01-01"}),  # the payload's text, never a number
    ]


def test_tsv_and_compressed_files(tmp_path):
    table = pa.table({"text": ["a", "b"], "label": ["x,y", "z"]})
    with pa.CompressedOutputStream(str(tmp_path / "t.tsv.gz"), "gzip") as out:
        pacsv.write_csv(table, out, pacsv.WriteOptions(delimiter="\t"))
    assert _items(CsvSource("t", tmp_path / "t.tsv.gz", payload="text")) == [
        (b"a", {"label": "x,y"}),
        (b"b", {"label": "z"}),
    ]


def test_a_null_metadata_value_is_refused_by_file_and_row(tmp_path):
    pacsv.write_csv(pa.table({"text": ["a", "b", "c"], "n": [1, None, 3]}), tmp_path / "t.csv")
    with pytest.raises(SourceInputError, match=r"t\.csv: row 1: metadata column 'n' \(int64\) is null"):
        list(CsvSource("t", tmp_path / "t.csv", payload="text"))


def test_a_value_of_another_type_in_a_later_block_names_row_and_line(tmp_path):
    n = 20_000
    numbers = [str(i) for i in range(n - 1)] + ["x"]
    pacsv.write_csv(pa.table({"text": [f"t{i}" for i in range(n)], "n": numbers}), tmp_path / "t.csv")
    with pytest.raises(SourceInputError) as info:
        list(CsvSource("t", tmp_path / "t.csv", payload="text", batch_bytes=1 << 18))
    assert str(info.value).startswith(f"{tmp_path / 't.csv'}: row {n - 1} (line {n + 1}): cannot read: ")
    assert "invalid value 'x'" in str(info.value)
    source = CsvSource("t", tmp_path / "t.csv", payload="text", column_types={"n": pa.string()})
    assert _items(source)[-1] == (f"t{n - 1}".encode(), {"n": "x"})  # column_types fixes the type


def test_a_row_with_extra_fields_names_row_and_line(tmp_path):
    pacsv.write_csv(pa.table({"text": ["a", "b"], "n": [1, 2]}), tmp_path / "t.csv")
    with open(tmp_path / "t.csv", "a") as f:  # a third row with one field too many
        pacsv.write_csv(pa.table({"text": ["c"], "n": [3], "m": [4]}), tmp_path / "row.csv")
        f.write((tmp_path / "row.csv").read_text().splitlines()[1] + "\n")
    with pytest.raises(SourceInputError, match=r"t\.csv: row 2 \(line 4\): cannot read: .*Expected 2 columns, got 3"):
        list(CsvSource("t", tmp_path / "t.csv", payload="text"))
