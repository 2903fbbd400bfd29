"""`datasetrt inspect` and `datasetrt validate` on real caches, healthy and damaged."""

from __future__ import annotations

import json

from datasetrt.cli import main


def test_inspect_prints_manifest_summary(write_caches, capsys):
    (path,) = write_caches({"alpha": 7}, algo="lz4")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "7" in out and "lz4" in out and "record checksums yes" in out
    for column in ("index", "kept", "label", "score"):
        assert column in out


def test_inspect_json_is_machine_readable(write_caches, capsys):
    (path,) = write_caches({"beta": 5})
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sample_count"] == 5 and doc["source_name"] == "beta" and doc["record_checksums"] is True
    assert [c["name"] for c in doc["schema"]] == ["index", "kept", "label", "score"]
    assert doc["shard_bytes"] == sum(p.stat().st_size for p in (path / "shards").iterdir())


def test_inspect_missing_manifest_is_an_error_exit(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 1
    assert "missing manifest" in capsys.readouterr().err


def test_validate_passes_healthy_caches(write_caches, capsys):
    paths = write_caches({"a": 4, "b": 3}, algo="zstd")
    assert main(["validate", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert out.count("ok ") == 2 and "4 samples verified" in out


def test_validate_fails_on_a_flipped_shard_byte(write_caches, capsys):
    good, bad = write_caches({"good": 4, "bad": 4})
    shard = bad / "shards" / "000000.bin"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"ok   {good}" in out
    assert f"FAIL {bad}" in out and "checksum mismatch" in out


def test_inspect_reads_everything_it_can_and_names_every_damaged_file(write_caches, capsys):
    good, bad = write_caches({"good": 4, "bad": 6})
    shard = bad / "shards" / "000000.bin"
    shard.write_bytes(shard.read_bytes()[:-3])  # truncated
    (bad / "checksums.xxh3").unlink()
    assert main(["inspect", str(good), str(bad)]) == 1
    out, err = capsys.readouterr()
    first, second = out.split("\n\n")
    assert "samples     4" in first and "status      ok" in first and "DAMAGED" not in first
    assert "metadata.arrow           4 rows, 4 columns, sha256 ok" in first
    # the damaged cache: its manifest summary, what still reads, and each damaged file
    assert "samples     6" in second and "index.bin                144 bytes, 6 rows" in second
    assert "metadata.arrow           6 rows" in second
    assert f"shards/000000.bin        DAMAGED: {shard.stat().st_size:,} bytes, expected" in second
    assert "checksums.xxh3           DAMAGED: cannot be read: No such file or directory" in second
    assert "status      damaged (2 problems)" in second
    assert err.splitlines() == [
        f"error: {shard}: {shard.stat().st_size:,} bytes, expected {shard.stat().st_size + 3:,} "
        "(the manifest's byte_len)",
        f"error: {bad}/checksums.xxh3: cannot be read: No such file or directory (os error 2)",
    ]


def test_inspect_damaged_metadata_and_missing_manifest(write_caches, tmp_path, capsys):
    (cache,) = write_caches({"m": 5})
    table = cache / "metadata.arrow"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table.write_bytes(bytes(data))
    assert main(["inspect", str(cache)]) == 1
    out, err = capsys.readouterr()
    assert "samples     5" in out and "shards/000000.bin" in out and "metadata.arrow           DAMAGED: " in out
    assert err.startswith(f"error: {table}: ")
    (cache / "manifest.json").unlink()
    assert main(["inspect", str(cache)]) == 1
    out, err = capsys.readouterr()
    assert "holds checksums.xxh3, index.bin, metadata.arrow, shards/" in out
    assert (
        "manifest.json            DAMAGED: MissingManifestError: missing manifest" in out and "missing manifest" in err
    )


def test_inspect_json_for_several_directories_is_a_list(write_caches, capsys):
    paths = write_caches({"j1": 2, "j2": 3})
    (paths[1] / "index.bin").write_bytes(b"\0" * 5)
    assert main(["inspect", *map(str, paths), "--json"]) == 1
    docs = json.loads(capsys.readouterr().out)
    assert [(d["source_name"], d["status"], d["sample_count"]) for d in docs] == [("j1", "ok", 2), ("j2", "damaged", 3)]
    assert docs[1]["problems"] == [{"file": "index.bin", "problem": "5 bytes, expected 72 (24 per sample x 3 samples)"}]
    assert docs[0]["problems"] == [] and docs[0]["metadata_rows"] == 2


def test_a_staging_root_is_named_not_failed(write_caches, capsys):
    paths = write_caches({"s1": 2, "s2": 2})
    base = paths[0].parent
    (base / "tmp").mkdir()  # as dataset-rt leaves it (datasetrt removes it when a write empties it)
    (base / "tmp" / ".s3.lock").write_bytes(b"")
    entries = sorted(map(str, base.iterdir()))
    assert main(["validate", *entries]) == 0
    out = capsys.readouterr().out
    assert f"skip {base / 'tmp'}: staging directory, not a cache" in out and out.count("ok ") == 2
    assert main(["inspect", *entries]) == 0
    out = capsys.readouterr().out
    assert "staging directory, not a cache" in out and out.count("status      ok") == 2


def test_a_base_directory_names_each_cache_below_it(write_caches, capsys):
    paths = write_caches({"b1": 2, "b2": 3})
    base = paths[0].parent
    (base / "tmp").mkdir()  # a staging root beside them is not a cache of the base
    assert main(["inspect", str(base), "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert [(d["path"], d["sample_count"]) for d in docs] == [(str(paths[0]), 2), (str(paths[1]), 3)]
    assert main(["validate", str(base)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"ok   {paths[0]}: 2 samples verified",
        f"ok   {paths[1]}: 3 samples verified",
    ]


def test_validate_names_the_damaged_sample_of_a_flipped_payload_byte(write_caches, capsys):
    import struct

    (cache,) = write_caches({"flip": 6})
    _, offset, length = struct.unpack_from("<QQQ", (cache / "index.bin").read_bytes(), 24 * 4)
    shard = cache / "shards" / "000000.bin"
    data = bytearray(shard.read_bytes())
    data[offset + length - 1] ^= 0x01  # the last payload byte of sample 4
    shard.write_bytes(bytes(data))
    assert main(["validate", str(cache)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"FAIL {cache}: IntegrityError: checksum mismatch for {shard}: damaged record: sample 4 of {cache} "
        "(per-record checksum mismatch)"
    ]


def test_validate_says_what_a_path_that_names_no_cache_is(write_caches, tmp_path, capsys):
    paths = write_caches({"d1": 2, "d2": 2}, base=tmp_path / "runs" / "today")
    (tmp_path / "file.txt").write_text("x")
    args = [tmp_path / "missing", tmp_path / "file.txt", tmp_path, tmp_path / "runs", tmp_path / "runs" / "today"]
    assert main(["validate", *map(str, args)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        f"FAIL {tmp_path / 'missing'}: no such directory",
        f"FAIL {tmp_path / 'file.txt'}: not a directory (a cache is a directory holding manifest.json)",
    ]
    for line in out[2:4]:  # two levels above the caches: each is named, with their base
        assert line.endswith(
            f"caches deeper below it: {paths[0]}, {paths[1]}; name a cache or its base directory ({paths[0].parent})"
        )
    assert out[4:] == [f"ok   {paths[0]}: 2 samples verified", f"ok   {paths[1]}: 2 samples verified"]


def test_inspect_shows_the_payload_spec_and_says_it_is_shallow(write_caches, tmp_path, runtime, capsys):
    import numpy as np

    import datasetrt as drt
    from datasetrt.sources import NumpySource

    (untyped,) = write_caches({"u": 2})
    source = NumpySource("typed", np.zeros((3, 4), np.int16), index_column="i")
    config = drt.WriterConfig(show_progress=False, payload_spec=source.payload_spec)
    (typed,) = runtime.write_cache([source], tmp_path / "typed", writer_config=config)
    assert main(["inspect", str(untyped), str(typed.path)]) == 0
    first, second = capsys.readouterr().out.split("\n\n")
    assert "payload     bytes (no payload spec)" in first and "payload     int16[4]" in second
    for report in (first, second):
        assert "check       shallow: " in report and "`datasetrt validate PATH` is the deep check" in report
    assert main(["inspect", str(typed.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["payload_spec"] == "int16[4]" and doc["check"].startswith("shallow")


def test_help_describes_every_subcommand_on_one_line(monkeypatch, capsys):
    import pytest

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("  COMMAND") + 1
    block = lines[start : lines.index("", start)]
    assert [line.split()[0] for line in block] == ["inspect", "validate", "convert", "prune", "pss", "demo", "docs"]
    assert all(len(line.split()) > 3 for line in block)  # a name, then its description on the same line
