"""Hostile index entries and records: every offset, length and size header read from disk is
bounds-checked before use, and each fault is a typed error naming cache directory and sample.

Records are rewritten with the checksum sidecar (XXH3-64 of the whole record) and every sha256
recomputed, so the structural check, not a checksum, is what has to catch the damage.
"""

from __future__ import annotations

import json
import tracemalloc

import lz4.block
import pytest
import zstandard

from datasetrt.errors import CacheFormatError, CacheIOError, RecordJSONError
from tests.integrity.corrupt import (
    assert_fault,
    edit_manifest,
    load_manifest,
    make_record,
    probe,
    read_record,
    rehash,
    replace_records,
    set_index_row,
    shard_file,
    split_record,
)

U63, U64 = 2**63, 2**64


# -- index entries -------------------------------------------------------------------------------------

PAST_END = [  # (offset, byte_len) as functions of the shard length
    ("offset-at-end", lambda n: (n, 8)),
    ("straddles-end", lambda n: (n - 4, 8)),
    ("len-one-past", lambda n: (0, n + 1)),
    ("offset-2**63", lambda n: (U63, 8)),
    ("offset-2**64-1", lambda n: (U64 - 1, 1)),
    ("sum-wraps-u64", lambda n: (8, U64 - 8)),
    ("both-2**63", lambda n: (U63, U63)),
    ("len-2**64-1", lambda n: (0, U64 - 1)),
]


@pytest.mark.parametrize("entry", [e for _, e in PAST_END], ids=[i for i, _ in PAST_END])
def test_index_entry_past_shard_end(request, runtime, cache, validate, entry):
    """dataset-rt: "I/O error: failed to fill whole buffer" (or truncated data for len -1).
    datasetrt refuses the entry before reading; with the index re-hashed, validate_cache=True
    refuses it at open."""
    offset, byte_len = entry(shard_file(cache).stat().st_size)
    set_index_row(cache, 3, offset=offset, byte_len=byte_len)
    rehash(cache)
    out = probe(runtime, cache, validate=validate)
    if validate:
        assert_fault(
            out, "open", CacheFormatError, ValueError, "invalid binary record", "index row 3", cache / "index.bin"
        )
        return
    assert_fault(
        out,
        "iter",
        CacheIOError,
        RuntimeError,
        "I/O error: failed to fill whole buffer",
        f"offset {offset}, byte_len {byte_len}",
        f"{cache} sample 3",
        shard_file(cache),
    )


@pytest.mark.parametrize("byte_len", [0, 7])
def test_index_entry_shorter_than_record_header(runtime, cache, byte_len):
    set_index_row(cache, 3, byte_len=byte_len)
    out = probe(runtime, cache, validate=False)
    assert_fault(out, "iter", CacheFormatError, ValueError, "invalid binary record", f"{cache} sample 3")


@pytest.mark.parametrize("shard_id", [1, U63, U64 - 1], ids=str)
def test_index_shard_id_out_of_range(runtime, cache, validate, shard_id):
    set_index_row(cache, 4, shard_id=shard_id)
    rehash(cache)
    out = probe(runtime, cache, validate=validate)
    if validate:
        assert_fault(
            out, "open", CacheFormatError, ValueError, f"index references missing shard {shard_id}", cache / "index.bin"
        )
    else:
        assert_fault(
            out, "iter", CacheFormatError, ValueError, f"index references missing shard {shard_id}", f"{cache} sample 4"
        )


# -- record envelope -------------------------------------------------------------------------------------


@pytest.mark.parametrize("excess", [1, 2**40, U63, U64 - 1 - 2**20], ids=["by-1", "2**40", "2**63", "near-2**64"])
def test_json_length_larger_than_record(runtime, any_cache, validate, excess):
    json_bytes, stored = split_record(read_record(any_cache, 2))
    available = len(json_bytes) + len(stored)
    bad_len = available + excess if excess < U63 else excess
    replace_records(any_cache, {2: make_record(json_bytes, stored, json_len=bad_len)})
    out = probe(runtime, any_cache, validate=validate)
    assert_fault(out, "iter", CacheFormatError, ValueError, "invalid binary record", f"{any_cache} sample 2")


# -- lz4 -------------------------------------------------------------------------------------------------


def _lz4_cache(write_caches):
    return write_caches({"victim-lz4": 5}, algo="lz4")[0]


def _lz4_with_prefix(cache, sample_id, declared, data=None):
    json_bytes, stored = split_record(read_record(cache, sample_id))
    data = lz4.block.decompress(stored) if data is None else data
    block = lz4.block.compress(data, store_size=False)
    return make_record(json_bytes, declared.to_bytes(4, "little") + block)


def _peak_during(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_lz4_size_prefix_larger_than_uncompressed_byte_len(runtime, write_caches):
    cache = _lz4_cache(write_caches)
    ulen = load_manifest(cache)["shards"][0]["uncompressed_byte_len"]
    replace_records(cache, {1: _lz4_with_prefix(cache, 1, ulen + 1)})
    out = probe(runtime, cache, validate=False)
    assert_fault(
        out,
        "iter",
        CacheFormatError,
        ValueError,
        "failed to decompress lz4 payload",
        f"decoded size {ulen + 1} exceeds",
        "uncompressed_byte_len",
        f"{cache} sample 1",
    )


@pytest.mark.parametrize("declared", [2**31 - 1, 2**32 - 1, 0x7E000000 - 1], ids=hex)
def test_lz4_huge_size_prefix_allocates_nothing(runtime, write_caches, declared):
    """Even when the manifest's uncompressed_byte_len is itself hostile (2**62), a size prefix a
    small block cannot decode to is refused before any buffer is sized from it."""
    cache = _lz4_cache(write_caches)
    replace_records(cache, {1: _lz4_with_prefix(cache, 1, declared)})
    edit_manifest(cache, lambda d: d["shards"][0].__setitem__("uncompressed_byte_len", 2**62))
    out, peak = _peak_during(lambda: probe(runtime, cache, validate=False))
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress lz4 payload", f"{cache} sample 1")
    assert peak < 64 << 20, f"peak traced allocation {peak} bytes"


@pytest.mark.parametrize("delta", [-1, +1, +100])
def test_lz4_size_prefix_disagrees_with_block(runtime, write_caches, delta):
    cache = _lz4_cache(write_caches)
    _json_bytes, stored = split_record(read_record(cache, 4))
    actual = len(lz4.block.decompress(stored))
    replace_records(cache, {4: _lz4_with_prefix(cache, 4, actual + delta)})
    out = probe(runtime, cache, validate=False)
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress lz4 payload", f"{cache} sample 4")


@pytest.mark.parametrize(
    "stored", [b"", b"\x05\x00\x00", b"\x05\x00\x00\x00\xff\xff\xff"], ids=["empty", "short", "garbage"]
)
def test_lz4_payload_malformed(runtime, write_caches, stored):
    cache = _lz4_cache(write_caches)
    json_bytes, _ = split_record(read_record(cache, 2))
    replace_records(cache, {2: make_record(json_bytes, stored)})
    out = probe(runtime, cache, validate=False)
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress lz4 payload", f"{cache} sample 2")


# -- zstd ------------------------------------------------------------------------------------------------


def _zstd_frames(data):
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)
    assert frame[4] & 0x20 and frame[5] == len(data)  # single-segment, 1-byte content size field
    lie = bytearray(frame)
    lie[5] = len(data) - 1
    grow = bytearray(frame)
    grow[5] = len(data) + 50
    return {
        "bad-magic": b"\x00" + frame[1:],
        "truncated": frame[:-3],
        "trailing-bytes": frame + b"\x00\x01",
        "two-frames": frame + frame,
        "no-content-size": zstandard.ZstdCompressor(write_content_size=False).compress(data),
        "content-size-too-small": bytes(lie),
        "content-size-too-large": bytes(grow),
        "block-header-garbled": frame[:6] + bytes([frame[6] ^ 0x06]) + frame[7:],
        "empty": b"",
    }


ZSTD_CASES = list(_zstd_frames(b"0123456789" * 20))


@pytest.mark.parametrize("case", ZSTD_CASES)
def test_zstd_frame_corrupted(runtime, write_caches, case):
    cache = write_caches({"victim-zstd": 5}, algo="zstd")[0]
    json_bytes, stored = split_record(read_record(cache, 3))
    data = zstandard.ZstdDecompressor().decompress(stored)
    frame = _zstd_frames(data)[case]
    replace_records(cache, {3: make_record(json_bytes, frame)})
    out = probe(runtime, cache, validate=False)
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress zstd payload", f"{cache} sample 3")


def test_zstd_content_size_huge_allocates_nothing(runtime, write_caches):
    """A frame header claiming 2**40 bytes, a hostile manifest uncompressed_byte_len: refused by the
    decoded/stored ratio bound before anything is sized from it."""
    cache = write_caches({"victim-zstd": 5}, algo="zstd")[0]
    json_bytes, _ = split_record(read_record(cache, 3))
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * 70000)
    assert frame[4] >> 6 == 2  # 4-byte content size field after magic + descriptor (+ window byte)
    off = 5 if frame[4] & 0x20 else 6
    frame = frame[:off] + (2**32 - 1).to_bytes(4, "little") + frame[off + 4 :]
    replace_records(cache, {3: make_record(json_bytes, frame)})
    edit_manifest(cache, lambda d: d["shards"][0].__setitem__("uncompressed_byte_len", 2**62))
    out, peak = _peak_during(lambda: probe(runtime, cache, validate=False))
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress zstd payload", f"{cache} sample 3")
    assert peak < 64 << 20, f"peak traced allocation {peak} bytes"


# -- embedded JSON ---------------------------------------------------------------------------------------

NOT_A_MAP = [b"[1]", b'"label"', b"1", b"1.5", b"null", b"true", b" [ ] "]
BAD_UTF8 = [
    b'{"label":"\xff"}',
    b'{"label":"\xc0\xaf"}',
    b'{"label":"\xed\xa0\x80"}',
    b'{"label":"\xf4\x90\x80\x80"}',
    b'{"label":"\xe2\x82"}',
    b'{"label":"x"}\xe2\x82',
]
BAD_JSON = [b"", b"{", b'{"label":', b'{"label":1}}', b"{'label':1}", b'{"a":' + b"[" * 100_000]


def _rewrite_json(cache, sample_id, json_bytes):
    _, stored = split_record(read_record(cache, sample_id))
    replace_records(cache, {sample_id: make_record(json_bytes, stored)})


@pytest.mark.parametrize("doc", NOT_A_MAP, ids=[d.decode().strip() or "blank" for d in NOT_A_MAP])
def test_embedded_json_not_a_map(runtime, any_cache, validate, doc):
    _rewrite_json(any_cache, 1, doc)
    out = probe(runtime, any_cache, validate=validate)
    assert_fault(
        out,
        "iter",
        RecordJSONError,
        RuntimeError,
        "JSON error: invalid type",
        "expected a map",
        f"{any_cache} sample 1",
    )


@pytest.mark.parametrize(
    "doc", BAD_UTF8, ids=["ff", "overlong", "surrogate", "above-10ffff", "cut-3byte", "cut-at-end"]
)
def test_embedded_json_invalid_utf8(runtime, any_cache, validate, doc):
    _rewrite_json(any_cache, 1, doc)
    out = probe(runtime, any_cache, validate=validate)
    assert_fault(out, "iter", RecordJSONError, RuntimeError, "JSON error", "UTF-8", f"{any_cache} sample 1")


@pytest.mark.parametrize(
    "doc", BAD_JSON, ids=["empty", "open-brace", "cut-value", "extra-brace", "single-quotes", "deep"]
)
def test_embedded_json_invalid(runtime, any_cache, validate, doc):
    _rewrite_json(any_cache, 1, doc)
    out = probe(runtime, any_cache, validate=validate)
    assert_fault(out, "iter", RecordJSONError, RuntimeError, "JSON error", f"{any_cache} sample 1")


def test_embedded_json_valid_multibyte_utf8_is_accepted(runtime, cache):
    """The UTF-8 check is not over-strict: 2-, 3- and 4-byte sequences and U+2028 read back."""
    label = "é€😀\u2028\U0010ffff"
    meta = {"index": 1, "kept": True, "label": label, "score": 0.25}
    _rewrite_json(cache, 1, json.dumps(meta, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())
    out = probe(runtime, cache, validate=False)
    assert out.stage is None, repr(out.error)
    assert out.samples[1].metadata["label"] == label
