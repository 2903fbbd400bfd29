"""The codec table (datasetrt/values/codecs.py) and its native twins (_ext/codecs.pxd, _ext/layout.pxd).

Config validation, manifest parsing, the writer and the gatherer all read the table, so these tests
check the table's own invariants and that the compiled kernels agree with it: every id encodes the
codec the table names it (checked with independent decoders), limits and record sizes match.
"""

from __future__ import annotations

import typing

import lz4.block
import pytest
import zstandard
from pydantic import ValidationError

import datasetrt as drt
from datasetrt import errors
from datasetrt._native import codec, gather
from datasetrt.api import CompressionAlgo
from datasetrt.format import layout
from datasetrt.format.dictionary import train_state
from datasetrt.values import codecs

PAYLOAD = b"datasetrt codec table " * 300
# Training samples for codecs with per-cache state (zstd_dict): 400 similar small records.
SAMPLES = [
    f'{{"id": {i}, "name": "record-{i % 37}", "tags": ["t{i % 5}", "u{i % 3}"], "score": {i * 0.5}}}'.encode()
    for i in range(400)
]


def _state_bytes(row) -> bytes | None:
    """The trained per-cache state of a codec that has one (zstd_dict: a dictionary), else None."""
    if not row.cache_state:
        return None
    return train_state(SAMPLES, 4096)


def _encoder(row, level: int) -> codec.Encoder:
    state = _state_bytes(row)
    return codec.Encoder(row.codec_id, level, codec.EncodeState(row.codec_id, state, level) if state else None)


# Independent decoders of each codec's stored form (docs/storage-format.md); `state` is the codec's
# per-cache state (zstd_dict: the dictionary file's bytes).
REFERENCE_DECODERS = {
    "none": lambda stored, state: stored,
    "lz4": lambda stored, state: lz4.block.decompress(stored),  # u32 LE size prefix + raw block
    "zstd": lambda stored, state: zstandard.ZstdDecompressor().decompress(stored),  # frame with content size
    # frame with content size and the dictionary's id, compressed with that dictionary
    "zstd_dict": lambda stored, state: zstandard.ZstdDecompressor(
        dict_data=zstandard.ZstdCompressionDict(state)
    ).decompress(stored),
}


def test_names_and_ids_are_unique_and_indexed():
    assert len({c.name for c in codecs.CODECS}) == len({c.codec_id for c in codecs.CODECS}) == len(codecs.CODECS)
    assert codecs.CODEC_NAMES == ("none", "lz4", "zstd", "zstd_dict")
    assert [c.name for c in codecs.CODECS if c.cache_state] == ["zstd_dict"]
    assert {c.name: c.codec_id for c in codecs.CODECS} == codecs.CODEC_IDS
    assert all(codecs.CODEC_BY_ID[c.codec_id] is c is codecs.CODEC_BY_NAME[c.name] for c in codecs.CODECS)
    assert [c.name for c in codecs.CODECS if c.stores_raw] == ["none"]
    assert set(REFERENCE_DECODERS) == set(codecs.CODEC_NAMES)


def test_config_reads_the_table():
    assert typing.get_args(CompressionAlgo) == codecs.CODEC_NAMES
    fields = drt.ShardCompression.model_fields
    assert fields["level"].default == codecs.CONFIG_LEVEL_DEFAULT == 3
    assert (codecs.CONFIG_LEVEL_MIN, codecs.CONFIG_LEVEL_MAX) == (-7, 22)
    assert fields["dict_bytes"].default == codecs.DICT_BYTES_DEFAULT == 32 << 10
    drt.ShardCompression(dict_bytes=codecs.DICT_MIN_BYTES)
    drt.ShardCompression(dict_bytes=codecs.DICT_MAX_BYTES)
    for bad in (codecs.DICT_MIN_BYTES - 1, codecs.DICT_MAX_BYTES + 1):
        with pytest.raises(ValidationError):
            drt.ShardCompression(algo="zstd_dict", dict_bytes=bad)
    for name in codecs.CODEC_NAMES:
        assert drt.ShardCompression(algo=name).algo == name
    with pytest.raises(ValidationError):
        drt.ShardCompression(level=codecs.CONFIG_LEVEL_MAX + 1)


@pytest.mark.parametrize("row", codecs.CODECS, ids=lambda c: c.name)
def test_each_native_id_encodes_the_codec_the_table_names(row):
    level = row.level.default if row.level is not None else 0
    encoder = _encoder(row, level)
    assert encoder.name == row.name
    assert encoder.max_payload_bytes == row.max_payload_bytes
    state = _state_bytes(row)
    for payload in (PAYLOAD, b"", SAMPLES[7]):
        assert REFERENCE_DECODERS[row.name](encoder.encode(payload), state) == payload


def test_levels_the_config_accepts_exist_in_the_library():
    for row in codecs.CODECS:
        if row.level is not None:
            for level in (row.level.config_min, row.level.default, row.level.config_max):
                _encoder(row, level).encode(PAYLOAD)
            assert row.level.manifest_min <= row.level.config_min and row.level.config_max <= row.level.manifest_max


def test_encoder_refuses_unknown_ids_and_levels_as_typed_errors():
    unknown = max(codecs.CODEC_BY_ID) + 1
    with pytest.raises(errors.ConfigError, match=f"unknown codec id {unknown}"):
        codec.Encoder(unknown)
    with pytest.raises(errors.ConfigError, match=r"zstd level 1000 outside \[-\d+, 22\]") as info:
        codec.Encoder(codecs.CODEC_IDS["zstd"], 1000)
    assert isinstance(info.value, ValueError)  # the builtin callers caught before


def test_lz4_payload_limit_is_a_source_error_before_anything_is_read():
    import mmap

    limit = codecs.LZ4_MAX_BLOCK_BYTES
    with mmap.mmap(-1, limit + 1) as big:  # anonymous and never touched: costs no memory
        view = memoryview(big)
        try:
            with pytest.raises(
                errors.SourceError, match=f"payload of {limit + 1} bytes exceeds the lz4 block limit of {limit} bytes"
            ):
                codec.Encoder(codecs.CODEC_IDS["lz4"]).encode(view)
        finally:
            view.release()


def test_record_layout_twin_matches_format_layout():
    assert gather.RECORD_LAYOUT == {
        "INDEX_ROW_BYTES": layout.INDEX_ROW_BYTES,
        "CHECKSUM_ROW_BYTES": layout.CHECKSUM_ROW_BYTES,
        "RECORD_HEADER_BYTES": layout.RECORD_HEADER_BYTES,
    }


def test_state_codecs_refuse_to_encode_without_their_state():
    row = codecs.CODEC_BY_NAME["zstd_dict"]
    with pytest.raises(errors.ConfigError, match="zstd_dict encodes with its cache's dictionary"):
        codec.Encoder(row.codec_id, 3)
    with pytest.raises(errors.ConfigError, match="zstd has no per-cache state"):
        codec.EncodeState(codecs.CODEC_IDS["zstd"], _state_bytes(row), 3)
    with pytest.raises(errors.CacheFormatError, match="not a zstd_dict dictionary"):
        codec.EncodeState(row.codec_id, b"not a dictionary" * 10, 3)
    with pytest.raises(errors.ConfigError, match="zstd_dict level 99 outside"):
        codec.EncodeState(row.codec_id, _state_bytes(row), 99)


def test_training_is_deterministic_and_its_failure_is_a_codec_error():
    row = codecs.CODEC_BY_NAME["zstd_dict"]
    first, again = _state_bytes(row), _state_bytes(row)
    assert first == again and 256 <= len(first) <= 4096
    assert codec.EncodeState(row.codec_id, first, 3).state_id == int.from_bytes(first[4:8], "little") != 0
    few = SAMPLES[:3]
    with pytest.raises(errors.CodecError, match="zstd_dict training failed on 3 samples") as info:
        train_state(few, 4096)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(errors.ConfigError, match="capacity 100 is under zstd's 256-byte floor"):
        train_state(SAMPLES, 100)
