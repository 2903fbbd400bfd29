"""`datasetrt convert` on JSON Lines (datasetrt/cli/convert.py): `--column-types`, `--block-bytes`
and `--max-line-bytes` reach the source; a refused mix is the source's failure (exit 1), a bad
option a usage error (exit 2)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

import datasetrt as drt
from datasetrt.cli import main


def read(path):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    return [(s.data, s.metadata) for s in ds]


def convert(tmp_path, *args):
    return main(["convert", *map(str, args), "--out", str(tmp_path / "out"), "--no-progress"])


def write_mixed(tmp_path):
    path = tmp_path / "events.jsonl"
    with open(path, "w") as f:
        for i in range(6000):
            f.write(json.dumps({"text": f"e{i}", "n": i + 0.5 if i == 5000 else i, "id": 2**53 + i}) + "\n")
    return path


def test_column_types_read_a_mixed_column_as_float(tmp_path, capsys):
    path = write_mixed(tmp_path)
    assert convert(tmp_path, path, "--payload-column", "text", "--block-bytes", 65536) == 1
    out = capsys.readouterr().out
    assert "FAIL events" in out and "record 5000: column 'n' holds the float 5000.5 but record 0" in out
    assert not (tmp_path / "out" / "events").exists()
    code = convert(tmp_path, path, "--payload-column", "text", "--column-types", "n=float64,text=string")
    assert code == 0, capsys.readouterr()
    got = read(tmp_path / "out" / "events")
    assert got[5000] == (b"e5000", {"n": 5000.5, "id": 2**53 + 5000})
    assert got[1] == (b"e1", {"n": 1.0, "id": 2**53 + 1}) and type(got[1][1]["n"]) is float


def test_column_types_give_a_typed_payload_and_max_line_bytes_bounds_a_line(tmp_path, capsys):
    path = tmp_path / "tokens.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"ids": [1, 2, 3], "k": 0}) + "\n")
        f.write(json.dumps({"ids": list(range(50_000)), "k": 1}) + "\n")
    assert (
        convert(
            tmp_path,
            path,
            "--payload-column",
            "ids",
            "--column-types",
            "ids=list<int32>",
            "--block-bytes",
            65536,
            "--max-line-bytes",
            100_000,
        )
        == 1
    )
    assert "tokens.jsonl: record 1: the line is longer than max_line_bytes (100000)" in capsys.readouterr().out
    assert convert(tmp_path, path, "--payload-column", "ids", "--column-types", "ids=list<int32>") == 0
    ds = drt.CachedDataset([tmp_path / "out" / "tokens"], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert str(ds.payload_spec) == "int32[None]"
    assert [ds.payload_spec.decode(s.data).tolist() for s in ds] == [[1, 2, 3], list(range(50_000))]


def test_bad_json_options_are_usage_errors(tmp_path, capsys):
    path = write_mixed(tmp_path)
    assert convert(tmp_path, path, "--payload-column", "text", "--column-types", "n=number") == 2
    assert "unknown column type 'number'" in capsys.readouterr().err
    assert convert(tmp_path, path, "--payload-column", "text", "--block-bytes", 10) == 2
    assert "block_bytes must be an int in" in capsys.readouterr().err
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "p.parquet")
    assert convert(tmp_path, tmp_path / "p.parquet", "--column-types", "text=string") == 2
    assert "column_types do not apply to ParquetSource" in capsys.readouterr().err
