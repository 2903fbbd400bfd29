"""Staged shards (shards.py): records reach the shard in ~1 MiB groups; large records go to the
file with writev and are hashed in place (no joined record), small ones are joined per group;
groups are written on the runtime's pool or inline, with writeback hints; rotation at
max_shard_bytes and the checksum sidecar. Whatever the path, the files must be the
record-by-record layout byte for byte: checked against a reference built here, against
dataset-rt 0.4.8, and between 1 and 2 workers.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from pathlib import Path

import numpy as np
import pytest
import xxhash

import datasetrt as drt
from datasetrt._native import codec
from datasetrt.format import shards as shards_mod
from datasetrt.format.envelope import MetadataSchema
from datasetrt.values.codecs import CODEC_IDS
from tests.conftest import QUIET, sample_items
from tests.unit.format.sources import (
    Raw,
    assert_big_failed_small_written,
    cache_records,
    index_rows,
    write_one,
    write_past_fsize_limit,
)

BIG = shards_mod.LARGE_RECORD_BYTES
OK = [(b"x", {"a": 1})]


def _payload(i: int, size: int):
    data = (bytes([i % 251]) + bytes(range(256)) * (size // 256 + 1))[:size]
    kind = i % 3  # bytes, bytearray and numpy buffers (the writer copies the last two at yield)
    return data if kind == 0 else bytearray(data) if kind == 1 else np.frombuffer(data, dtype=np.uint8)


def _items(n: int) -> list:
    """Sizes on both sides of LARGE_RECORD_BYTES, empty payloads and records over the shard limit."""
    sizes = [0, 7, BIG - 40, BIG, 150 * 1024, 3 * BIG + 5, 1, 300 * 1024, 4096]
    return [(_payload(i, sizes[i % len(sizes)]), {"i": i, "s": f"r{i % 7}", "f": i * 0.5}) for i in range(n)]


def _reference(items, algo: str, max_shard: int):
    """(shard files, index rows, record checksums) of the record-by-record layout."""
    schema = MetadataSchema(items[0][1])
    shards: list[bytearray] = []
    index, sums = [], []
    for data, md in items:
        payload = bytes(memoryview(data).cast("B"))
        stored = codec.Encoder(CODEC_IDS["lz4"]).encode(payload) if algo == "lz4" else payload
        js = schema.encode(md)[0]
        record = len(js).to_bytes(8, "little") + js + stored
        if not shards or (len(shards[-1]) > 0 and len(shards[-1]) + len(record) > max_shard):
            shards.append(bytearray())
        index.append((len(shards) - 1, len(shards[-1]), len(record)))
        shards[-1] += record
        sums.append(xxhash.xxh3_64_intdigest(record))
    return [bytes(s) for s in shards], index, sums


def _write(tmp_path: Path, items, workers: int, **cfg) -> Path:
    algo = cfg.pop("algo", "none")
    config = drt.WriterConfig(show_progress=False, shard_compression=drt.ShardCompression(algo=algo), **cfg)
    rt = drt.DatasetRuntime(num_workers=workers)
    try:
        (result,) = rt.write_cache([Raw("r", items)], tmp_path / f"w{workers}", writer_config=config)
    finally:
        rt.close()
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def _shard_files(cache: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((cache / "shards").iterdir())]


# (GROUP_BYTES, LARGE_RECORD_BYTES, WRITEBACK_BYTES): the defaults; every record its own group and
# never joined, with a writeback hint per group; whole blocks as one group, always joined.
PATHS = {"default": None, "record-groups-in-place": (1, 0, 1), "block-groups-joined": (1 << 40, 1 << 40, 1 << 40)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("algo", "max_shard", "prefetch"),
    [
        ("none", 64 << 20, 64),  # one shard, 64-record blocks
        ("none", 400_000, 5),  # rotation inside blocks; oversized records alone in their shard
        ("none", 2_000_000, 300),  # 256-record blocks spanning several shards
        ("lz4", 5_000, 16),  # compressed records are small: joined groups
    ],
)
def test_groups_match_the_record_by_record_layout(tmp_path, monkeypatch, path, workers, algo, max_shard, prefetch):
    if PATHS[path] is not None:
        for name, value in zip(("GROUP_BYTES", "LARGE_RECORD_BYTES", "WRITEBACK_BYTES"), PATHS[path]):
            monkeypatch.setattr(shards_mod, name, value)
    items = _items(90)
    cache = _write(tmp_path, items, workers, algo=algo, max_shard_bytes=max_shard, prefetch_size=prefetch)
    shards, index, sums = _reference(items, algo, max_shard)
    assert _shard_files(cache) == shards
    assert [tuple(r) for r in np.fromfile(cache / "index.bin", dtype="<u8").reshape(-1, 3).tolist()] == index
    assert np.fromfile(cache / "checksums.xxh3", dtype="<u8").tolist() == sums
    manifest = json.loads((cache / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["shards"]] == [hashlib.sha256(s).hexdigest() for s in shards]
    assert [s["byte_len"] for s in manifest["shards"]] == [len(s) for s in shards]
    if max_shard < 64 << 20:
        assert len(shards) >= 3
    ds = drt.CachedDataset(
        [cache], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True), runtime=None
    )
    assert [s.data for s in ds] == [bytes(memoryview(d).cast("B")) for d, _ in items]


def test_large_records_byte_identical_to_dataset_rt(tmp_path):
    rt_lib = pytest.importorskip("dataset_rt")
    items = [(bytes(memoryview(d).cast("B")), md) for d, md in _items(60)]
    ours = _write(tmp_path, items, 2, max_shard_bytes=500_000)
    theirs_rt = rt_lib.DatasetRuntime(num_workers=2)
    cfg = rt_lib.WriterConfig(show_progress=False, max_shard_bytes=500_000)
    (result,) = theirs_rt.write_cache([Raw("r", items)], tmp_path / "rt", writer_config=cfg)
    theirs = Path(result.path)
    assert _shard_files(ours) == _shard_files(theirs)
    assert (ours / "index.bin").read_bytes() == (theirs / "index.bin").read_bytes()
    shards = lambda p: json.loads((p / "manifest.json").read_text())["shards"]  # noqa: E731
    assert shards(ours) == shards(theirs)


@pytest.mark.parametrize("algo", ["none", "zstd"])
def test_pool_and_inline_groups_are_byte_identical(tmp_path, algo):
    items = _items(70)
    trees = []
    for workers in (1, 2):
        cache = _write(tmp_path, items, workers, algo=algo, max_shard_bytes=700_000, prefetch_size=9)
        trees.append({str(p.relative_to(cache)): p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()})
    assert trees[0] == trees[1]


# -- writev -------------------------------------------------------------------------------------


def test_writev_all_resumes_partial_writes_and_splits_past_iov_max(tmp_path, monkeypatch):
    real = os.writev
    calls = []

    def stingy(fd, buffers):  # at most 1000 bytes per call, often mid-buffer
        calls.append(len(buffers))
        assert len(buffers) <= shards_mod._IOV_MAX
        budget, out = 1000, []
        for b in buffers:
            if budget <= 0:
                break
            out.append(memoryview(b)[:budget])
            budget -= len(out[-1])
        return real(fd, out)

    monkeypatch.setattr(shards_mod.os, "writev", stingy)
    chunks = [bytes([i % 256]) * (i % 13) for i in range(3000)]  # empty buffers included
    path = tmp_path / "out"
    with open(path, "wb", buffering=0) as f:
        shards_mod.writev_all(f.fileno(), chunks)
    assert path.read_bytes() == b"".join(chunks)
    assert len(calls) > len(b"".join(chunks)) // 1000
    assert chunks[5] == bytes([5]) * 5  # the caller's list is not modified


def test_cache_written_through_partial_writes_is_unchanged(tmp_path, monkeypatch):
    items = _items(40)
    real = os.writev
    monkeypatch.setattr(shards_mod.os, "writev", lambda fd, bufs: real(fd, [memoryview(bufs[0])[:4097], *bufs[1:2]]))
    cache = _write(tmp_path, items, 2, max_shard_bytes=900_000)
    assert _shard_files(cache) == _reference(items, "none", 900_000)[0]


def test_xxh3_64_pairs_hashes_the_concatenation():
    rng = np.random.default_rng(5)
    heads = [rng.bytes(int(n)) for n in rng.integers(0, 300, 50)]
    bodies = [rng.bytes(int(n)) for n in rng.integers(0, 400_000, 50)]
    out = array("Q", bytes(8 * 50))
    codec.xxh3_64_pairs(heads, bodies, out)
    assert out.tolist() == [xxhash.xxh3_64_intdigest(h + b) for h, b in zip(heads, bodies)]
    codec.xxh3_64_pairs([], [], array("Q"))
    with pytest.raises(ValueError):
        codec.xxh3_64_pairs(heads, bodies[:-1], out)
    with pytest.raises(TypeError):
        codec.xxh3_64_pairs([bytearray(b"x")], [b"y"], out)


def test_start_writeback_is_only_a_hint(tmp_path):
    path = tmp_path / "f"
    with open(path, "wb", buffering=0) as f:
        f.write(b"x" * 10_000)
        shards_mod.start_writeback(f.fileno(), 0, 10_000)
        shards_mod.start_writeback(f.fileno(), 0, 0)
    r, w = os.pipe()
    try:
        shards_mod.start_writeback(w, 0, 100)  # ESPIPE is ignored: the closing fsync reports real errors
    finally:
        os.close(r)
        os.close(w)
    assert path.read_bytes() == b"x" * 10_000


# -- failures while a group is in flight on the pool -------------------------------------------------


class InterruptAfter:
    def __init__(self, name, items, exc):
        self.name, self.items, self.exc = name, items, exc

    def __iter__(self):
        yield from self.items
        raise self.exc


def test_interrupt_with_a_group_in_flight_cleans_up(tmp_path):
    items = [(bytes([i]) * (200 * 1024), {"a": i}) for i in range(130)]
    rt = drt.DatasetRuntime(num_workers=2)
    try:
        with pytest.raises(KeyboardInterrupt):
            rt.write_cache([InterruptAfter("ki", items, KeyboardInterrupt())], tmp_path, writer_config=QUIET)
        assert os.listdir(tmp_path) == []
        (ok,) = rt.write_cache([Raw("after", items[:3])], tmp_path, writer_config=QUIET)
        assert isinstance(ok, drt.CacheWriteSuccess)
    finally:
        rt.close()


def test_write_error_on_the_pool_is_an_io_error_value(tmp_path):
    """RLIMIT_FSIZE in a forked child: the pool thread's writev fails with EFBIG (SIGXFSZ ignored)."""
    items = [(bytes([i % 251]) * (100 * 1024), {"a": i}) for i in range(200)]
    big, small = write_past_fsize_limit(tmp_path, 1 << 20, 2, items)
    assert_big_failed_small_written(tmp_path, big, small)


# -- rotation and the sidecar ------------------------------------------------------------------------


def test_rotation_equalrecords(runtime, tmp_path):
    """max_shard_bytes=40 and 25-byte records: a new shard whenever current + record > 40."""
    cache, m = write_one(runtime, tmp_path, "r", [(b"p" * 10, {"a": 1})] * 5, max_shard_bytes=40)
    assert [s["name"] for s in m["shards"]] == [f"{i:06d}.bin" for i in range(5)]
    assert index_rows(cache) == [(i, 0, 25) for i in range(5)]


def test_rotation_oversized_record_sits_alone(runtime, tmp_path):
    sizes = [5, 5, 100, 5, 5]  # records of 20, 20, 115, 20, 20 bytes
    cache, m = write_one(runtime, tmp_path, "r", [(b"p" * n, {"a": 1}) for n in sizes], max_shard_bytes=40)
    assert index_rows(cache) == [(0, 0, 20), (0, 20, 20), (1, 0, 115), (2, 0, 20), (2, 20, 20)]
    assert [s["byte_len"] for s in m["shards"]] == [40, 115, 40]


def test_checksum_sidecar_holds_xxh3_of_each_record(runtime, tmp_path):
    cache, m = write_one(runtime, tmp_path, "x", sample_items(30), algo="lz4", max_shard_bytes=2000)
    ext = m["datasetrt"]["record_checksums"]
    sidecar = (cache / ext["file"]).read_bytes()
    assert ext["algo"] == "xxh3_64" and ext["sha256"] == hashlib.sha256(sidecar).hexdigest()
    assert np.frombuffer(sidecar, dtype="<u8").tolist() == [xxhash.xxh3_64_intdigest(r) for r in cache_records(cache)]


def test_record_checksums_off_writes_no_sidecar(runtime, tmp_path):
    cache, m = write_one(runtime, tmp_path, "x", OK, record_checksums=False)
    assert "datasetrt" not in m and sorted(os.listdir(cache)) == [
        "index.bin",
        "manifest.json",
        "metadata.arrow",
        "shards",
    ]
