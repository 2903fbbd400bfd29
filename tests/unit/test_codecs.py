"""The codec table (datasetrt/codecs.py) and its native twins (_ext/codecs.pxd, _ext/layout.pxd).

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
from datasetrt import codecs, errors
from datasetrt._native import codec, gather
from datasetrt.api import CompressionAlgo
from datasetrt.format import layout

PAYLOAD = b"datasetrt codec table " * 300

# Independent decoders of each codec's stored form (docs/storage-format.md).
REFERENCE_DECODERS = {
    "none": lambda stored: stored,
    "lz4": lambda stored: lz4.block.decompress(stored),  # u32 LE size prefix + raw block
    "zstd": lambda stored: zstandard.ZstdDecompressor().decompress(stored),  # frame with content size
}


def test_names_and_ids_are_unique_and_indexed():
    assert len({c.name for c in codecs.CODECS}) == len({c.codec_id for c in codecs.CODECS}) == len(codecs.CODECS)
    assert codecs.CODEC_NAMES == ("none", "lz4", "zstd")
    assert codecs.CODEC_IDS == {c.name: c.codec_id for c in codecs.CODECS}
    assert all(codecs.CODEC_BY_ID[c.codec_id] is c is codecs.CODEC_BY_NAME[c.name] for c in codecs.CODECS)
    assert [c.name for c in codecs.CODECS if c.stores_raw] == ["none"]
    assert set(REFERENCE_DECODERS) == set(codecs.CODEC_NAMES)


def test_config_reads_the_table():
    assert typing.get_args(CompressionAlgo) == codecs.CODEC_NAMES
    fields = drt.ShardCompression.model_fields
    assert fields["level"].default == codecs.CONFIG_LEVEL_DEFAULT == 3
    assert (codecs.CONFIG_LEVEL_MIN, codecs.CONFIG_LEVEL_MAX) == (-7, 22)
    for name in codecs.CODEC_NAMES:
        assert drt.ShardCompression(algo=name).algo == name
    with pytest.raises(ValidationError):
        drt.ShardCompression(level=codecs.CONFIG_LEVEL_MAX + 1)


@pytest.mark.parametrize("row", codecs.CODECS, ids=lambda c: c.name)
def test_each_native_id_encodes_the_codec_the_table_names(row):
    level = row.level.default if row.level is not None else 0
    encoder = codec.Encoder(row.codec_id, level)
    assert encoder.name == row.name
    assert encoder.max_payload_bytes == row.max_payload_bytes
    for payload in (PAYLOAD, b""):
        assert REFERENCE_DECODERS[row.name](encoder.encode(payload)) == payload


def test_levels_the_config_accepts_exist_in_the_library():
    for row in codecs.CODECS:
        if row.level is not None:
            for level in (row.level.config_min, row.level.default, row.level.config_max):
                codec.Encoder(row.codec_id, level).encode(PAYLOAD)
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
            with pytest.raises(errors.SourceError, match=f"payload of {limit + 1} bytes exceeds the lz4 block limit of {limit} bytes"):
                codec.Encoder(codecs.CODEC_IDS["lz4"]).encode(view)
        finally:
            view.release()


def test_record_layout_twin_matches_format_layout():
    assert gather.RECORD_LAYOUT == {
        "INDEX_ROW_BYTES": layout.INDEX_ROW_BYTES,
        "CHECKSUM_ROW_BYTES": layout.CHECKSUM_ROW_BYTES,
        "RECORD_HEADER_BYTES": layout.RECORD_HEADER_BYTES,
    }
