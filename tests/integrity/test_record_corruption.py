"""Reference §6, record rows, and the per-record checksum that datasetrt adds.

dataset-rt only checks record bytes with validate_cache=True (a sha256 of each whole shard at
load). datasetrt also writes a per-record XXH3-64 sidecar (`checksums.xxh3`, named in the
manifest's "datasetrt" extension field) and checks every record against it on every read, so
damage is caught by default, at the record that is damaged, naming cache and sample.
"""

from __future__ import annotations

import json
import shutil

import pytest

import datasetrt as drt
from datasetrt.errors import CacheFormatError, CacheIOError, IntegrityError, RecordJSONError
from tests.conftest import ListSource, sample_items, writer_config
from tests.integrity.corrupt import (
    assert_fault,
    drop_sidecar,
    edit_manifest,
    flip_byte,
    load_manifest,
    make_record,
    payload_offset,
    probe,
    read_index,
    read_record,
    replace_records,
    set_index_row,
    shard_file,
    split_record,
)


def _dataset(runtime, cache, validate=False, **kw):
    return runtime.cached_dataset(
        [cache], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=validate, **kw)
    )


def _cache_id(cache):
    return load_manifest(cache)["cache_id"]


# -- payload byte flipped --------------------------------------------------------------------------


def test_flipped_payload_byte_detected_on_read(runtime, any_cache):
    """Improvement over dataset-rt, which silently returns the corrupted bytes by default: the
    sidecar check fails the read of exactly that record, for none, lz4 and zstd caches."""
    flip_byte(shard_file(any_cache), payload_offset(any_cache, 1))
    out = probe(runtime, any_cache, validate=False)
    assert_fault(
        out,
        "iter",
        IntegrityError,
        ValueError,
        "record checksum mismatch for",
        f"{any_cache} sample 1",
        shard_file(any_cache),
    )
    ds = _dataset(runtime, any_cache)
    assert ds.get_item(_cache_id(any_cache), 0).sample_id == 0  # undamaged records still read
    with pytest.raises(IntegrityError, match="record checksum mismatch for .* sample 1"):
        ds.get_item(_cache_id(any_cache), 1)


def test_flipped_payload_byte_with_validate_cache(runtime, any_cache):
    """validate_cache=True: refused at open by the shard sha256, as dataset-rt, and the message
    names the damaged sample (found by the per-record checksums), as a default read does."""
    flip_byte(shard_file(any_cache), payload_offset(any_cache, 1))
    out = probe(runtime, any_cache, validate=True)
    assert_fault(
        out,
        "open",
        IntegrityError,
        ValueError,
        f"checksum mismatch for {shard_file(any_cache)}: damaged record: sample 1 of {any_cache}",
    )


def test_damaged_records_and_damage_outside_them_with_validate_cache(runtime, cache):
    for sample in (2, 4):
        flip_byte(shard_file(cache), payload_offset(cache, sample))
    out = probe(runtime, cache, validate=True)
    assert_fault(out, "open", IntegrityError, ValueError, "damaged records (2 of 5): samples 2, 4 of")
    for sample in (2, 4):
        flip_byte(shard_file(cache), payload_offset(cache, sample))  # restored
    with open(shard_file(cache), "ab") as f:  # bytes past the last record, rehashed nowhere
        f.write(b"\0")
    edit_manifest(cache, lambda doc: doc["shards"][0].update(byte_len=doc["shards"][0]["byte_len"] + 1))
    out = probe(runtime, cache, validate=True)
    assert_fault(out, "open", IntegrityError, ValueError, "each of its 5 records matches its per-record checksum")


def test_flipped_envelope_byte_detected_on_read(runtime, any_cache):
    """A flipped byte of the embedded JSON is caught by the same check, before it is parsed."""
    _, offset, _ = read_index(any_cache)[3]
    flip_byte(shard_file(any_cache), offset + 9, mask=0x01)
    out = probe(runtime, any_cache, validate=False)
    assert_fault(out, "iter", IntegrityError, ValueError, "record checksum mismatch for", f"{any_cache} sample 3")


def test_verify_records_false_skips_the_record_check(runtime, cache):
    """ReaderConfig(verify_records=False) is the cost switch: no XXH3 per read, so a flipped
    payload byte is returned as stored (dataset-rt's default behaviour)."""
    original = read_record(cache, 1)
    flip_byte(shard_file(cache), payload_offset(cache, 1))
    out = probe(runtime, cache, validate=False, verify_records=False)
    assert out.stage is None, repr(out.error)
    _, payload = split_record(original)
    assert out.samples[1].data != payload
    assert out.samples[1].data[0] == payload[0] ^ 0xFF


@pytest.mark.parametrize(
    "damage, cls, builtin, wording",
    [
        (lambda c: set_index_row(c, 1, byte_len=2**64 - 1), CacheIOError, RuntimeError, "failed to fill whole buffer"),
        (lambda c: set_index_row(c, 1, shard_id=7), CacheFormatError, ValueError, "index references missing shard 7"),
        (
            lambda c: replace_records(c, {1: make_record(b"{}", b"x", json_len=2**40)}, rehash_all=False),
            CacheFormatError,
            ValueError,
            "invalid binary record",
        ),
    ],
    ids=["index-len-minus-1", "index-shard-id", "json-len-huge"],
)
def test_verify_records_false_keeps_structural_checks(request, runtime, cache, damage, cls, builtin, wording):
    """Turning the checksum off never turns the bounds checks off."""
    damage(cache)
    out = probe(runtime, cache, validate=False, verify_records=False)
    assert_fault(out, "iter", cls, builtin, wording, f"{cache} sample 1")


def test_verify_records_false_keeps_codec_checks(runtime, write_caches):
    cache = write_caches({"victim-lz4": 5}, algo="lz4")[0]
    json_bytes, stored = split_record(read_record(cache, 2))
    replace_records(cache, {2: make_record(json_bytes, (2**31).to_bytes(4, "little") + stored[4:])}, rehash_all=False)
    out = probe(runtime, cache, validate=False, verify_records=False)
    assert_fault(out, "iter", CacheFormatError, ValueError, "failed to decompress lz4 payload", f"{cache} sample 2")


# -- caches without a sidecar (written by dataset-rt) ------------------------------------------------


def test_cache_without_sidecar_reads(runtime, any_cache, validate):
    """A cache whose manifest has no "datasetrt" key and no checksums.xxh3 (as dataset-rt writes
    them) opens, validates and reads the same samples."""
    before = probe(runtime, any_cache, validate=validate)
    drop_sidecar(any_cache)
    assert not (any_cache / "checksums.xxh3").exists()
    after = probe(runtime, any_cache, validate=validate)
    assert after.stage is None, repr(after.error)
    assert after.samples == before.samples


def test_cache_without_sidecar_behaves_as_dataset_rt_on_flipped_payload(runtime, cache):
    """Without a sidecar there is nothing to check a record against by default: the flipped
    byte is returned (as dataset-rt); validate_cache=True still refuses the cache at open."""
    drop_sidecar(cache)
    flip_byte(shard_file(cache), payload_offset(cache, 1))
    assert probe(runtime, cache, validate=False).stage is None
    out = probe(runtime, cache, validate=True)
    assert_fault(
        out,
        "open",
        IntegrityError,
        ValueError,
        f"checksum mismatch for {shard_file(cache)}: the cache has no per-record checksums",
    )


def test_sidecar_missing_but_named(runtime, cache, validate):
    """The manifest names a sidecar that is gone: an I/O error at open naming the file."""
    (cache / "checksums.xxh3").unlink()
    out = probe(runtime, cache, validate=validate)
    assert_fault(out, "open", CacheIOError, RuntimeError, "No such file or directory", cache / "checksums.xxh3")


def test_sidecar_wrong_length(runtime, cache, validate):
    with open(cache / "checksums.xxh3", "ab") as f:
        f.write(b"\0" * 8)
    out = probe(runtime, cache, validate=validate)
    assert_fault(
        out, "open", CacheFormatError, ValueError, "checksum sidecar length mismatch", cache / "checksums.xxh3"
    )


# -- embedded JSON -----------------------------------------------------------------------------------


def _relabel(cache, sample_id=0):
    """Same-length edit of the embedded label of one record: "victim-0" -> "victim-9"."""
    json_bytes, stored = split_record(read_record(cache, sample_id))
    meta = json.loads(json_bytes)
    edited = json_bytes.replace(meta["label"].encode(), (meta["label"][:-1] + "9").encode())
    assert len(edited) == len(json_bytes) and edited != json_bytes
    return make_record(edited, stored), meta["label"][:-1] + "9"


def test_embedded_json_changed_detected_on_read(runtime, any_cache):
    """Improvement: dataset-rt returns the edited dict by default; the sidecar catches it."""
    record, _ = _relabel(any_cache)
    replace_records(any_cache, {0: record}, residecar=False, rehash_all=False)
    out = probe(runtime, any_cache, validate=False)
    assert_fault(out, "iter", IntegrityError, ValueError, "record checksum mismatch for", f"{any_cache} sample 0")


def test_embedded_json_changed_and_rehashed(runtime, any_cache, validate):
    """Sidecar and sha256 fields recomputed: default reads return the edited dict (as dataset-rt);
    validate_cache=True compares it with metadata.arrow on iteration and on get_item."""
    record, new_label = _relabel(any_cache)
    replace_records(any_cache, {0: record})
    out = probe(runtime, any_cache, validate=validate)
    if not validate:
        assert out.stage is None, repr(out.error)
        assert out.samples[0].metadata["label"] == new_label
        return
    assert_fault(
        out,
        "iter",
        CacheFormatError,
        ValueError,
        "embedded metadata does not match metadata.arrow for sample 0",
        any_cache,
    )
    ds = _dataset(runtime, any_cache, validate=True)
    with pytest.raises(CacheFormatError, match="embedded metadata does not match metadata.arrow for sample 0"):
        ds.get_item(_cache_id(any_cache), 0)
    assert ds.get_item(_cache_id(any_cache), 1).sample_id == 1


@pytest.mark.parametrize("residecar", [False, True], ids=["sidecar-catches", "sidecar-regenerated"])
def test_embedded_json_not_a_map(runtime, cache, validate, residecar):
    """Record 0's JSON replaced by `[1]`. validate_cache=True: the stale shard sha256 refuses the
    cache at open (as dataset-rt). Default: the sidecar catches it; with the sidecar regenerated
    the parse does, as dataset-rt's "invalid type: sequence, expected a map"."""
    _, stored = split_record(read_record(cache, 0))
    replace_records(cache, {0: make_record(b"[1]", stored)}, residecar=residecar, rehash_all=False)
    out = probe(runtime, cache, validate=validate)
    if validate:  # the record grew, so index.bin's sha256 is the first to disagree
        assert_fault(out, "open", IntegrityError, ValueError, f"checksum mismatch for {cache}")
    elif not residecar:
        assert_fault(out, "iter", IntegrityError, ValueError, "record checksum mismatch for", f"{cache} sample 0")
    else:
        assert_fault(
            out,
            "iter",
            RecordJSONError,
            RuntimeError,
            "JSON error: invalid type",
            "expected a map",
            f"{cache} sample 0",
        )


@pytest.mark.parametrize("residecar", [False, True], ids=["sidecar-catches", "sidecar-regenerated"])
def test_json_len_huge(runtime, cache, validate, residecar):
    """The record header claims more JSON than the record holds: "invalid binary record"."""
    json_bytes, stored = split_record(read_record(cache, 2))
    replace_records(cache, {2: make_record(json_bytes, stored, json_len=10**12)}, residecar=residecar, rehash_all=False)
    out = probe(runtime, cache, validate=validate)
    if validate:
        assert_fault(out, "open", IntegrityError, ValueError, f"checksum mismatch for {shard_file(cache)}")
    elif not residecar:
        assert_fault(out, "iter", IntegrityError, ValueError, "record checksum mismatch for", f"{cache} sample 2")
    else:
        assert_fault(out, "iter", CacheFormatError, ValueError, "invalid binary record", f"{cache} sample 2")


# -- a cache replaced on disk between two datasets -------------------------------------------------------


def test_cache_rewritten_in_place_is_read_fresh(request, runtime, tmp_path):
    """A dataset opened after its cache directory was deleted and rewritten (same path, new
    content) must read the new records, never those of the earlier cache still held open."""
    base = tmp_path / "caches"
    for version in (1, 2):
        if version == 2:
            shutil.rmtree(base / "victim")
        items = sample_items(5, seed=version, payload_bytes=64, tag="victim")
        (written,) = runtime.write_cache([ListSource("victim", items)], base, writer_config=writer_config())
        out = probe(runtime, written.path, validate=False)
        assert out.stage is None, repr(out.error)
        assert [s.data for s in out.samples] == [data for data, _ in items]
