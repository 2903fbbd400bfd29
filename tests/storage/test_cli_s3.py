"""The `datasetrt` command on object-store URLs against moto's server (through the counting proxy):
`convert --out s3://...`, `inspect` of a cache and of a base prefix (healthy and damaged),
`validate` (deep: every file downloaded and hashed), `prune` of a killed writer's leftovers beside
a published cache (dry run first), storage options from flags and from the standard environment
(one real `python -m datasetrt` subprocess), and no credential in any output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datasetrt.cli import main
from datasetrt.format.claims import CLAIM_NAME
from tests.servers.moto import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, REGION
from tests.storage.conftest import make_store

ROWS = {"train": 30, "valid": 12}


def flags(proxy, tmp_path) -> list[str]:
    return [
        "--storage-option",
        f"endpoint={proxy.endpoint}",
        "--storage-option",
        f"region={REGION}",
        "--storage-option",
        f"access_key_id={FAKE_ACCESS_KEY_ID}",
        "--storage-option",
        f"secret_access_key={FAKE_SECRET_ACCESS_KEY}",
        "--storage-option",
        "allow_http=true",
    ]


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert FAKE_SECRET_ACCESS_KEY not in out + err  # never a credential in the output
    return code, out, err


@pytest.fixture
def base(bucket, s3_proxy, tmp_path, capsys) -> str:
    """Two caches converted from Parquet files to s3://<bucket>/caches."""
    paths = []
    for name, n in ROWS.items():
        table = pa.table({"data": [bytes([i % 251]) * (i + 1) for i in range(n)], "label": [i % 3 for i in range(n)]})
        pq.write_table(table, tmp_path / f"{name}.parquet")
        paths.append(str(tmp_path / f"{name}.parquet"))
    url = f"s3://{bucket}/caches"
    argv = ["convert", *paths, "--out", url, "--codec", "zstd", "--no-progress", "--cache-dir", str(tmp_path / "w")]
    code, out, err = run(capsys, [*argv, *flags(s3_proxy, tmp_path)])
    assert code == 0, (out, err)
    assert out.splitlines() == [f"ok   {url}/train", f"ok   {url}/valid"]
    return url


def test_inspect_a_cache_and_a_base_prefix(base, s3_proxy, tmp_path, capsys):
    code, out, err = run(capsys, ["inspect", f"{base}/train", *flags(s3_proxy, tmp_path)])
    assert code == 0 and err == ""
    assert f"cache       {base}/train" in out and "samples     30" in out and "compression zstd" in out
    assert "metadata.arrow           30 rows, 1 columns, sha256 ok" in out and "status      ok" in out
    code, out, err = run(capsys, ["inspect", base, "--json", *flags(s3_proxy, tmp_path)])
    docs = json.loads(out)
    assert code == 0 and [(d["path"], d["sample_count"], d["status"]) for d in docs] == [
        (f"{base}/train", 30, "ok"),
        (f"{base}/valid", 12, "ok"),
    ]
    shards = make_store(s3_proxy, base.split("/")[2], "caches/valid").list("shards")
    assert docs[1]["shard_bytes"] == sum(info.size for info in shards)
    assert s3_proxy.count("GET", "caches/*/shards/*") == 0  # inspect reads no payload


def test_inspect_names_every_damaged_object_and_what_is_missing(base, bucket, s3_proxy, tmp_path, capsys):
    store = make_store(s3_proxy, bucket, "caches/valid")
    shard = "shards/000000.bin"
    store.put(shard, store.get(shard, max_bytes=1 << 20)[:-3])  # truncated
    store.delete(["checksums.xxh3"])
    code, out, err = run(capsys, ["inspect", f"{base}/valid", *flags(s3_proxy, tmp_path)])
    assert code == 1
    assert (
        "samples     12" in out
        and "metadata.arrow           12 rows" in out
        and "status      damaged (2 problems)" in out
    )
    assert err.splitlines() == [
        f"error: {base}/valid/{shard}: {store.head(shard).size:,} bytes, expected {store.head(shard).size + 3:,} "
        "(the manifest's byte_len)",
        f"error: {base}/valid/checksums.xxh3: cannot be read: no such object in the store",
    ]
    metadata = bytearray(store.get("metadata.arrow", max_bytes=1 << 20))
    metadata[len(metadata) // 2] ^= 0xFF
    store.put("metadata.arrow", bytes(metadata))
    code, out, err = run(capsys, ["inspect", f"{base}/valid", *flags(s3_proxy, tmp_path)])
    assert (
        code == 1 and f"error: {base}/valid/metadata.arrow: " in err and "/tmp" not in err
    )  # the URL, not a temp path
    code, out, err = run(capsys, ["inspect", f"s3://{bucket}/nothing", *flags(s3_proxy, tmp_path)])
    assert code == 1 and "holds nothing" in out and f"missing manifest: s3://{bucket}/nothing/manifest.json" in err


def test_validate_downloads_and_checks_every_file(base, bucket, s3_proxy, tmp_path, capsys):
    node = ["--cache-dir", str(tmp_path / "node")]
    code, out, err = run(capsys, ["validate", base, *node, *flags(s3_proxy, tmp_path)])
    assert code == 0, (out, err)
    assert out.splitlines() == [f"ok   {base}/train: 30 samples verified", f"ok   {base}/valid: 12 samples verified"]
    assert s3_proxy.count("GET", "caches/*/shards/*") > 0
    store = make_store(s3_proxy, bucket, "caches/train")
    data = bytearray(store.get("shards/000000.bin", max_bytes=1 << 20))
    data[-1] ^= 0xFF
    store.put("shards/000000.bin", bytes(data))  # same size, other bytes: only a hash finds it
    code, out, err = run(
        capsys, ["validate", f"{base}/train", "--cache-dir", str(tmp_path / "n2"), *flags(s3_proxy, tmp_path)]
    )
    assert code == 1 and out.startswith(f"FAIL {base}/train: IntegrityError") and "shards/000000.bin" in out


def test_prune_removes_a_killed_writers_leftovers_and_nothing_else(base, bucket, s3_proxy, tmp_path, capsys):
    killed = make_store(s3_proxy, bucket, "caches/killed")
    claim = b'{"host": "gone", "pid": 1, "time": 0}'  # another node's: never provably dead here
    killed.put_if_absent(CLAIM_NAME, claim)
    killed.put("shards/000000.bin", b"a" * 300)
    killed.put("shards/000001.bin", b"b" * 200)  # no index, no metadata, no manifest: killed mid-upload
    everything = [info.name for info in make_store(s3_proxy, bucket, "caches").list()]
    published = [n for n in everything if not n.startswith("killed/")]

    code, out, err = run(capsys, ["prune", base, "--min-age", "3600", *flags(s3_proxy, tmp_path)])
    assert code == 0 and "kept         " in out and "a write may be in progress" in out  # just written: too young
    assert "removed 0 objects" in out
    code, out, err = run(capsys, ["prune", base, "--min-age", "0", "--dry-run", "-v", *flags(s3_proxy, tmp_path)])
    assert code == 0, err
    assert f"would remove {base}/killed/: 3 objects, " in out and "host gone, pid 1" in out
    assert "      shards/000001.bin  200 bytes" in out
    assert [info.name for info in make_store(s3_proxy, bucket, "caches").list()] == everything  # nothing deleted

    code, out, err = run(capsys, ["prune", base, "--min-age", "0", *flags(s3_proxy, tmp_path)])
    assert code == 0, err
    assert f"removed      {base}/killed/: 3 objects" in out
    assert out.splitlines()[-1] == f"removed 3 objects, {500 + len(claim)} bytes"
    assert [info.name for info in make_store(s3_proxy, bucket, "caches").list()] == published
    code, out, err = run(capsys, ["validate", base, "--cache-dir", str(tmp_path / "n"), *flags(s3_proxy, tmp_path)])
    assert code == 0 and out.count("ok   ") == 2  # the published caches are whole

    code, out, err = run(capsys, ["prune", f"{base}/train", "--min-age", "0", *flags(s3_proxy, tmp_path)])
    assert code == 0 and "0 unpublished cache(s)" in out  # a published cache itself: nothing under it


def test_usage_errors_exit_2_without_echoing_a_value(capsys, tmp_path):
    code, _, err = run(capsys, ["inspect", "s3://b/x", "--storage-option", FAKE_SECRET_ACCESS_KEY])
    assert code == 2 and "KEY=VALUE" in err
    code, _, err = run(capsys, ["prune", str(tmp_path), "--min-age", "0"])
    assert code == 2 and "is a local path" in err
    code, _, err = run(capsys, ["prune", "s3://b/x", "--min-age", "-1"])
    assert code == 2


def test_a_refused_credential_is_reported_without_it(moto_auth_server, tmp_path, capsys):
    opts = [f"endpoint={moto_auth_server.endpoint}", f"region={REGION}", "allow_http=true"]
    opts += [f"access_key_id={FAKE_ACCESS_KEY_ID}", f"secret_access_key={FAKE_SECRET_ACCESS_KEY}"]
    argv = [arg for opt in opts for arg in ("--storage-option", opt)]
    code, _, err = run(capsys, ["inspect", "s3://denied/caches", *argv])
    assert code == 1 and "StorageAccessError" in err
    code, _, err = run(capsys, ["prune", "s3://denied/caches", *argv])
    assert code == 1 and "StorageAccessError" in err


def test_the_console_command_reads_the_standard_environment(base, s3_proxy, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_"))}
    env.update(
        AWS_ENDPOINT_URL=s3_proxy.endpoint,
        AWS_ACCESS_KEY_ID=FAKE_ACCESS_KEY_ID,
        AWS_SECRET_ACCESS_KEY=FAKE_SECRET_ACCESS_KEY,
        AWS_REGION=REGION,
        AWS_ALLOW_HTTP="true",
        AWS_EC2_METADATA_DISABLED="true",
        DATASETRT_CACHE_DIR=str(tmp_path / "envnode"),
    )
    for argv, want in (
        (["inspect", base], f"cache       {base}/valid"),
        (["validate", f"{base}/valid"], f"ok   {base}/valid: 12 samples verified"),
        (["prune", base, "--dry-run"], "would remove 0 objects"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "datasetrt", *argv], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        assert want in done.stdout
        assert FAKE_SECRET_ACCESS_KEY not in done.stdout + done.stderr
    assert (tmp_path / "envnode").is_dir()  # validate's downloads went to DATASETRT_CACHE_DIR
