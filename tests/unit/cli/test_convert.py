"""`datasetrt convert` (datasetrt/cli/convert.py): caches from files with the column options, the
progress bar, failures as exit status 1 and usage errors as 2."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datasetrt as drt
from datasetrt.cli import main


def read(path):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    return [(s.data, s.metadata) for s in ds]


def test_convert_parquet_and_jsonl_with_renames_names_and_codec(tmp_path, capsys):
    pq.write_table(pa.table({"text": ["a", "bb"], "lang": ["en", "de"], "n": [1, 2]}), tmp_path / "p.parquet")
    with gzip.open(tmp_path / "q.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "c", "lang": "fr", "n": 3}) + "\n")
    code = main(
        [
            "convert",
            str(tmp_path / "p.parquet"),
            str(tmp_path / "q.jsonl.gz"),
            "--out",
            str(tmp_path / "out"),
            "--payload-column",
            "text",
            "--metadata-columns",
            "lang",
            "--rename",
            "lang=language",
            "--codec",
            "zstd",
            "--name",
            "first",
            "second",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured
    assert f"ok   {tmp_path / 'out' / 'first'}" in captured.out and "datasetrt write" in captured.err
    assert read(tmp_path / "out" / "first") == [(b"a", {"language": "en"}), (b"bb", {"language": "de"})]
    assert read(tmp_path / "out" / "second") == [(b"c", {"language": "fr"})]


def test_convert_default_names_index_column_and_failures(tmp_path, capsys):
    pq.write_table(pa.table({"blob": [b"x", b"y"]}), tmp_path / "train.parquet")
    pq.write_table(pa.table({"blob": [b"x", None]}), tmp_path / "bad.parquet")
    code = main(
        [
            "convert",
            str(tmp_path / "train.parquet"),
            str(tmp_path / "bad.parquet"),
            "--out",
            str(tmp_path / "out"),
            "--index-column",
            "row",
            "--no-progress",
        ]
    )
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
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "datasetrt.cli",
            "convert",
            str(tmp_path / "a.parquet"),
            "--out",
            str(tmp_path / "out"),
            "--codec",
            "lz4",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert read(tmp_path / "out" / "a") == [(b"x", {"n": 1})]


def decoded(path):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    return ds.payload_spec, [ds.payload_spec.decode(s.data).tolist() for s in ds]


def test_convert_typed_columns_record_their_spec(tmp_path, capsys):
    ids = [[1, 2, 3], [], [4]]
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32())), "n": [0, 1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"ids": pa.array([[5, 6]], pa.list_(pa.int32())), "n": [3]}), tmp_path / "b.parquet")
    xyz = [[0.5, 1.0, 2.0], [3.0, 4.0, 5.0]]
    pq.write_table(pa.table({"xyz": pa.array(xyz, pa.list_(pa.float64(), 3)), "n": [0, 1]}), tmp_path / "x.parquet")
    out = tmp_path / "out"
    assert (
        main(
            [
                "convert",
                str(tmp_path / "a.parquet"),
                str(tmp_path / "b.parquet"),
                "--out",
                str(out),
                "--payload-column",
                "ids",
                "--no-progress",
            ]
        )
        == 0
    )
    assert decoded(out / "a") == (drt.PayloadSpec("int32", (None,)), ids)
    assert decoded(out / "b") == (drt.PayloadSpec("int32", (None,)), [[5, 6]])
    assert (
        main(
            [
                "convert",
                str(tmp_path / "x.parquet"),
                "--out",
                str(out),
                "--name",
                "x16",
                "--payload-column",
                "xyz",
                "--dtype",
                "float16",
                "--shape",
                "3",
                "--no-progress",
            ]
        )
        == 0
    )
    assert decoded(out / "x16") == (drt.PayloadSpec("float16", (3,)), xyz)
    assert (
        main(
            [
                "convert",
                str(tmp_path / "a.parquet"),
                "--out",
                str(out),
                "--name",
                "a8",
                "--payload-column",
                "ids",
                "--dtype",
                "uint8",
                "--no-progress",
            ]
        )
        == 0
    )  # --shape defaults to one ragged dim
    assert decoded(out / "a8") == (drt.PayloadSpec("uint8", (None,)), ids)
    capsys.readouterr()
    code = main(
        [
            "convert",
            str(tmp_path / "a.parquet"),
            "--out",
            str(out),
            "--name",
            "bad",
            "--payload-column",
            "ids",
            "--dtype",
            "int32",
            "--shape",
            "2",
            "--no-progress",
        ]
    )
    assert code == 1 and not (out / "bad").exists()
    assert (
        f"FAIL bad: Python error: SourceInputError: {tmp_path / 'a.parquet'}: row group 0, row 0 (row 0 of the row "
        f"group): payload column 'ids' holds 3 elements; payload spec int32[2] needs 2 elements"
    ) in capsys.readouterr().out


def test_convert_refuses_specs_that_differ_across_inputs(tmp_path, capsys):
    pq.write_table(pa.table({"p": pa.array([[1]], pa.list_(pa.int32())), "n": [0]}), tmp_path / "i.parquet")
    pq.write_table(pa.table({"p": pa.array([[1.5]], pa.list_(pa.float32())), "n": [0]}), tmp_path / "f.parquet")
    pq.write_table(pa.table({"p": [b"\x01\x00\x00\x00"], "n": [0]}), tmp_path / "b.parquet")
    for other, text in (("f", "float32[None]"), ("b", "none (bytes)")):
        code = main(
            [
                "convert",
                str(tmp_path / "i.parquet"),
                str(tmp_path / f"{other}.parquet"),
                "--out",
                str(tmp_path / "out"),
                "--payload-column",
                "p",
                "--no-progress",
            ]
        )
        assert code == 2 and not (tmp_path / "out").exists()
        assert (
            f"payload specs differ: {tmp_path / 'i.parquet'} gives int32[None], {tmp_path / f'{other}.parquet'} "
            f"gives {text}; convert them in separate runs, or give --dtype/--shape"
        ) in capsys.readouterr().err
    assert (
        main(
            [
                "convert",
                str(tmp_path / "i.parquet"),
                str(tmp_path / "b.parquet"),
                "--out",
                str(tmp_path / "out"),
                "--payload-column",
                "p",
                "--dtype",
                "int32",
                "--shape",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    assert decoded(tmp_path / "out" / "b") == (drt.PayloadSpec("int32", (1,)), [[1]])
    for bad, message in (
        (["--shape", "3"], "--shape needs --dtype"),
        (["--dtype", "int32", "--shape", "x"], "--shape takes comma-separated integers and None, got 'x'"),
        (["--dtype", "object"], "PayloadSpec dtype"),
    ):
        assert main(["convert", str(tmp_path / "i.parquet"), "--out", str(tmp_path / "o2"), *bad]) == 2
        assert message in capsys.readouterr().err


def test_convert_with_a_trained_dictionary(tmp_path, capsys):
    texts = [json.dumps({"user": f"u{i % 17}", "event": ("click", "view")[i % 2], "n": i}) for i in range(200)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "events.parquet")
    args = [
        "convert",
        str(tmp_path / "events.parquet"),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        "--payload-column",
        "text",
        "--index-column",
        "row",
        "--codec",
        "zstd_dict",
        "--dict-bytes",
        "2048",
        "--level",
        "5",
    ]
    assert main(args) == 0, capsys.readouterr()
    manifest = json.loads((tmp_path / "out" / "events" / "manifest.json").read_text())
    assert manifest["shards"][0]["compression"] == {"algo": "zstd_dict", "ratio": 1.0, "level": 5}
    assert manifest["datasetrt"]["zstd_dictionary"]["byte_len"] <= 2048
    assert [d for d, _ in read(tmp_path / "out" / "events")] == [t.encode() for t in texts]
    assert (
        main(
            [
                "convert",
                str(tmp_path / "events.parquet"),
                "--out",
                str(tmp_path / "other"),
                "--codec",
                "zstd_dict",
                "--dict-bytes",
                "100",
            ]
        )
        == 2
    )
    assert "dict_bytes" in capsys.readouterr().err


def test_convert_again_over_existing_caches(tmp_path, capsys):
    """A rerun fails the taken names (dataset-rt's default), --skip-identical keeps the same caches
    and fails a changed one, --overwrite replaces it atomically; the flags exclude each other."""
    src, out = tmp_path / "a.parquet", tmp_path / "out"
    pq.write_table(pa.table({"blob": [b"x", b"y"], "n": [1, 2]}), src)
    convert = ["convert", str(src), "--out", str(out), "--no-progress"]
    assert main(convert) == 0
    manifest = (out / "a" / "manifest.json").stat()
    capsys.readouterr()
    assert main(convert) == 1
    assert f"FAIL a: cache path already exists: {out / 'a'}" in capsys.readouterr().out
    assert main([*convert, "--skip-identical"]) == 0
    assert capsys.readouterr().out.strip() == f"ok   {out / 'a'}"
    assert (out / "a" / "manifest.json").stat().st_ino == manifest.st_ino  # kept, not rewritten
    pq.write_table(pa.table({"blob": [b"x", b"z", b"w"], "n": [1, 2, 3]}), src)
    assert main([*convert, "--skip-identical"]) == 1
    assert "it holds a different cache" in capsys.readouterr().out
    assert read(out / "a") == [(b"x", {"n": 1}), (b"y", {"n": 2})]
    assert main([*convert, "--overwrite"]) == 0
    assert read(out / "a") == [(b"x", {"n": 1}), (b"z", {"n": 2}), (b"w", {"n": 3})]
    assert sorted(p.name for p in out.iterdir()) == ["a"]  # the old cache and the staging dir are gone
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:  # argparse's usage error
        main([*convert, "--overwrite", "--skip-identical"])
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
