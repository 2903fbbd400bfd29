"""`datasetrt convert` on .npy and CSV files (datasetrt/cli/convert.py's input kinds), end to end:
files written by numpy and pyarrow.csv become caches that read back as the arrays and rows written;
what cannot be converted names the file (and the row)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

import datasetrt as drt
from datasetrt.cli import main


def read(path):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    return [(s.data, s.metadata) for s in ds]


def test_npy_rows_become_typed_records(tmp_path, capsys):
    emb = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    np.save(tmp_path / "emb.npy", emb)
    np.save(tmp_path / "ids.npy", np.arange(5, dtype=">i8"))  # big-endian scalars: one per record
    code = main(["convert", str(tmp_path / "emb.npy"), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "datasetrt write 1/1 sources: 100%" in captured.err and " 300/300 " in captured.err
    ds = drt.CachedDataset([tmp_path / "out" / "emb"], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert str(ds.payload_spec) == "float32[4]"
    rows = list(ds)
    assert [s.metadata for s in rows] == [{"index": i} for i in range(300)]
    assert np.array_equal(np.stack([ds.payload_spec.decode(s.data) for s in rows]), emb)
    assert main(["convert", str(tmp_path / "ids.npy"), "--out", str(tmp_path / "out"), "--index-column", "i"]) == 0
    ids = read(tmp_path / "out" / "ids")
    assert [m for _, m in ids] == [{"i": i} for i in range(5)]
    assert [np.frombuffer(d, "<i8")[0] for d, _ in ids] == list(range(5))


def test_npy_refusals_name_the_file(tmp_path, capsys):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ok.npy", np.zeros((2, 2), np.uint8))
    assert main(["convert", str(tmp_path / "obj.npy"), "--out", str(tmp_path / "out")]) == 2
    assert f"error: ConfigError: {tmp_path / 'obj.npy'}: cannot read as a .npy array" in capsys.readouterr().err
    code = main(["convert", str(tmp_path / "ok.npy"), "--out", str(tmp_path / "out"), "--payload-column", "x"])
    assert code == 2 and "a .npy file has no columns" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_csv_files_convert_and_a_bad_row_fails_its_source_only(tmp_path, capsys):
    good = pa.table({"text": ["a", "bb", "ccc"], "lang": ["en", "de", "fr"], "n": [1, 2, 3]})
    pacsv.write_csv(good, tmp_path / "good.csv")
    pacsv.write_csv(pa.table({"text": ["d", "e"], "lang": ["en", "de"], "n": [4, None]}), tmp_path / "bad.csv")
    code = main(
        [
            "convert",
            str(tmp_path / "good.csv"),
            str(tmp_path / "bad.csv"),
            "--out",
            str(tmp_path / "out"),
            "--payload-column",
            "text",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert read(tmp_path / "out" / "good") == [
        (b"a", {"lang": "en", "n": 1}),
        (b"bb", {"lang": "de", "n": 2}),
        (b"ccc", {"lang": "fr", "n": 3}),
    ]
    assert f"FAIL bad: Python error: SourceInputError: {tmp_path / 'bad.csv'}: row 1: metadata column 'n'" in out
    assert not (tmp_path / "out" / "bad").exists()
