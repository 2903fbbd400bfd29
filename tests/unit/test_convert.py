"""`datasetrt convert` (datasetrt/convert.py): caches from files with the column options, the
progress bar, failures as exit status 1 and usage errors as 2."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

import datasetrt as drt
from datasetrt.cli import main


def read(path):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    return [(s.data, s.metadata) for s in ds]


def test_convert_parquet_and_jsonl_with_renames_names_and_codec(tmp_path, capsys):
    pq.write_table(pa.table({"text": ["a", "bb"], "lang": ["en", "de"], "n": [1, 2]}), tmp_path / "p.parquet")
    with gzip.open(tmp_path / "q.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "c", "lang": "fr", "n": 3}) + "\n")
    code = main(["convert", str(tmp_path / "p.parquet"), str(tmp_path / "q.jsonl.gz"), "--out", str(tmp_path / "out"),
                 "--payload-column", "text", "--metadata-columns", "lang", "--rename", "lang=language",
                 "--codec", "zstd", "--name", "first", "second"])
    captured = capsys.readouterr()
    assert code == 0, captured
    assert f"ok   {tmp_path / 'out' / 'first'}" in captured.out and "datasetrt write" in captured.err
    assert read(tmp_path / "out" / "first") == [(b"a", {"language": "en"}), (b"bb", {"language": "de"})]
    assert read(tmp_path / "out" / "second") == [(b"c", {"language": "fr"})]


def test_convert_default_names_index_column_and_failures(tmp_path, capsys):
    pq.write_table(pa.table({"blob": [b"x", b"y"]}), tmp_path / "train.parquet")
    pq.write_table(pa.table({"blob": [b"x", None]}), tmp_path / "bad.parquet")
    code = main(["convert", str(tmp_path / "train.parquet"), str(tmp_path / "bad.parquet"), "--out",
                 str(tmp_path / "out"), "--index-column", "row", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1
    assert read(tmp_path / "out" / "train") == [(b"x", {"row": 0}), (b"y", {"row": 1})]
    assert "FAIL bad: Python error: SourceInputError:" in out and "row group 0, row 1" in out
    assert not (tmp_path / "out" / "bad").exists()


def test_convert_usage_errors_exit_2(tmp_path, capsys):
    pq.write_table(pa.table({"blob": [b"x"], "n": [1]}), tmp_path / "a.parquet")
    assert main(["convert", str(tmp_path / "a.parquet"), "--out", str(tmp_path), "--rename", "nope"]) == 2
    assert "--rename takes A=B" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "a.parquet"), "--out", str(tmp_path), "--name", "x", "y"]) == 2
    assert main(["convert", str(tmp_path / "missing.parquet"), "--out", str(tmp_path)]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_console_command(tmp_path):
    pq.write_table(pa.table({"blob": [b"x"], "n": [1]}), tmp_path / "a.parquet")
    run = subprocess.run([sys.executable, "-m", "datasetrt.cli", "convert", str(tmp_path / "a.parquet"),
                          "--out", str(tmp_path / "out"), "--codec", "lz4"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert read(tmp_path / "out" / "a") == [(b"x", {"n": 1})]
