"""Ordered block compression (blocks.py): records decode with the reference codecs, the envelope is
never compressed, and threads never change the bytes (the ordered commit).

zstd_dict's training and fallback are in test_dictionary.py and tests/integration/test_zstd_dict.py.
"""

from __future__ import annotations

from pathlib import Path

import lz4.block
import pytest
import zstandard

import datasetrt as drt
from datasetrt.format import blocks, shards
from datasetrt.format.envelope import MetadataSchema
from tests.conftest import sample_items
from tests.unit.format.sources import cache_records, split_record, write_one


def _decode(algo: str, stored: bytes) -> bytes:
    if algo == "lz4":
        assert int.from_bytes(stored[:4], "little") == len(lz4.block.decompress(stored))
        return lz4.block.decompress(stored)
    if algo == "zstd":
        return zstandard.ZstdDecompressor().decompress(stored)
    return stored


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
def test_records_decode_with_reference_codecs(runtime, tmp_path, algo):
    items = sample_items(40, tag="c") + [(b"", {"index": 99, "kept": True, "label": "e", "score": 0.0})]
    cache, m = write_one(runtime, tmp_path, "c", items, algo=algo)
    records = cache_records(cache)
    schema = MetadataSchema(items[0][1])
    for record, (payload, md) in zip(records, items, strict=True):
        js, stored = split_record(record)
        assert js == schema.encode(md)[0]  # the envelope itself is never compressed
        assert _decode(algo, stored) == payload
    if algo == "zstd":
        assert m["shards"][0]["compression"] == {"algo": "zstd", "ratio": 1.0, "level": 3}


def test_lz4_record_is_size_prefixed_block(runtime, tmp_path):
    cache, _ = write_one(runtime, tmp_path, "h", [(b"hello", {"a": 1})], algo="lz4")
    assert split_record(cache_records(cache)[0])[1] == bytes.fromhex("05000000 50 68656c6c6f")


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("algo", ["lz4", "zstd"])
def test_thread_pool_output_is_byte_identical(tmp_path, algo, monkeypatch):
    """Ordered commit: 3 compression threads and 1 produce the same files, byte for byte."""
    monkeypatch.setattr(blocks, "POOL_MIN_BYTES", 0)  # these small blocks and groups go to the pool too
    monkeypatch.setattr(shards, "POOL_MIN_BYTES", 0)
    items = sample_items(500, tag="p")
    trees = []
    for workers in (1, 3):
        rt = drt.DatasetRuntime(num_workers=workers)
        try:
            write_one(rt, tmp_path / f"w{workers}", "p", items, algo=algo, max_shard_bytes=8192, prefetch_size=8)
        finally:
            rt.close()
        trees.append(_tree(tmp_path / f"w{workers}" / "p"))
    assert len([k for k in trees[0] if k.startswith("shards/")]) > 5
    assert trees[0] == trees[1]
