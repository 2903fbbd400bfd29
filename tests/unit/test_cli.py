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
