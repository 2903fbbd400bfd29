"""format/dictionary.py and the manifest's `datasetrt.zstd_dictionary` entry: the training sample's
bounds, training and its fallback, the checked load of the file, and the strict manifest parse."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from datasetrt.errors import CacheFormatError, CacheIOError, IntegrityError, ManifestJSONError
from datasetrt.format import dictionary
from datasetrt.format.manifest import DictionaryFile, ShardEntry, new_manifest, parse_manifest
from datasetrt.values.codecs import DICT_MAX_BYTES
from tests.conftest import json_like_items

PAYLOADS = [p for p, _ in json_like_items(400)]


def _trained(payloads=PAYLOADS, dict_bytes=4096) -> dictionary.Trained:
    sample = dictionary.TrainingSample(dict_bytes)
    sample.add(payloads)
    return dictionary.train(sample, "zstd_dict")


# -- the training sample --------------------------------------------------------------------------


def test_sample_takes_the_first_records_up_to_32x_the_dictionary_size():
    sample = dictionary.TrainingSample(1024)
    assert sample.limit_bytes == 32 * 1024
    blocks = [[bytes([k]) * 1000] * 10 for k in range(5)]  # 50 records of 1000 bytes
    full = [sample.add(block) for block in blocks]
    # the record that crosses 32,768 bytes (the 33rd) is the last one in; later blocks add nothing
    assert full == [False, False, False, True, True]
    assert len(sample.payloads) == 33 and sample.nbytes == 33_000
    assert sample.payloads == [p for block in blocks for p in block][:33]


def test_sample_stops_at_the_record_limit_when_payloads_are_tiny():
    sample = dictionary.TrainingSample(1024)
    assert sample.add([b""] * (dictionary.SAMPLE_MAX_RECORDS + 10))
    assert len(sample.payloads) == dictionary.SAMPLE_MAX_RECORDS and sample.nbytes == 0


# -- training -------------------------------------------------------------------------------------


def test_training_is_deterministic_and_bounded_by_dict_bytes():
    first, again = _trained(), _trained()
    assert first.algo == "zstd_dict" and first.reason is None
    assert first.dictionary == again.dictionary
    assert 256 <= len(first.dictionary) <= 4096
    assert dictionary.dictionary_id(first.dictionary) != 0


# [b"x"] * 8 and * 10: fastCover's training share holds 6 and 7 bytes, which crash zstd's trainer
# (SIGSEGV / SIGFPE) unless refused first; this test process would die.
@pytest.mark.parametrize(
    "payloads",
    [PAYLOADS[:6], [b""] * 500, [b"x"] * 8, [b"x"] * 10],
    ids=["six-records", "empty-payloads", "8-one-byte", "10-one-byte"],
)
def test_a_sample_that_cannot_train_falls_back_to_plain_zstd(payloads):
    trained = _trained(payloads)
    assert trained.algo == dictionary.FALLBACK_ALGO == "zstd" and trained.dictionary is None
    assert "zstd_dict training failed" in trained.reason
    assert _trained(payloads) == trained  # deterministic too


def test_dictionary_id_reads_the_header_only():
    data = _trained().dictionary
    assert dictionary.dictionary_id(data) == int.from_bytes(data[4:8], "little")
    assert dictionary.dictionary_id(b"\x00" * 64) == 0
    assert dictionary.dictionary_id(data[:7]) == 0


# -- the checked load -----------------------------------------------------------------------------


@pytest.fixture
def stored(tmp_path):
    data = _trained().dictionary
    (tmp_path / "dictionary.zstd").write_bytes(data)
    entry = DictionaryFile(
        "dictionary.zstd", dictionary.dictionary_id(data), len(data), hashlib.sha256(data).hexdigest()
    )
    return tmp_path, entry, data


def test_read_checked_returns_the_verified_bytes(stored):
    cache, entry, data = stored
    got, st = dictionary.read_checked(cache, entry)
    assert got == data and st.st_size == len(data)


def test_read_checked_refuses_each_damage_with_a_typed_error_naming_the_file(stored):
    cache, entry, data = stored
    path = cache / "dictionary.zstd"
    with pytest.raises(
        CacheFormatError,
        match=f"dictionary id mismatch for {path}: the file has id {entry.dict_id}, the manifest says 7",
    ):
        dictionary.read_checked(cache, replace(entry, dict_id=7))
    path.write_bytes(data[:-1])
    with pytest.raises(CacheFormatError, match=f"dictionary length mismatch for {path}"):
        dictionary.read_checked(cache, entry)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(IntegrityError, match=f"checksum mismatch for {path}"):
        dictionary.read_checked(cache, entry)
    path.unlink()
    with pytest.raises(CacheIOError, match=f"No such file or directory .* {path}"):
        dictionary.read_checked(cache, entry)


# -- the manifest entry ---------------------------------------------------------------------------

SHA = "ab" * 32


def _manifest(
    algo="zstd_dict", entry: DictionaryFile | None = DictionaryFile("dictionary.zstd", 12345, 4096, SHA)
) -> dict:
    shard = ShardEntry("000000.bin", 10, 10, algo, 1.0, SHA, level=3)
    m = new_manifest(
        cache_id=1,
        source_name="s",
        sample_count=0,
        metadata_schema=(),
        metadata_sha256=SHA,
        index_sha256=SHA,
        shards=(shard,),
        dictionary=entry,
    )
    return json.loads(m.to_json())


def _parse(doc):
    return parse_manifest(json.dumps(doc).encode(), "m/manifest.json")


def test_entry_round_trips_in_the_datasetrt_section():
    doc = _manifest()
    assert doc["datasetrt"]["zstd_dictionary"] == {
        "file": "dictionary.zstd",
        "dict_id": 12345,
        "byte_len": 4096,
        "sha256": SHA,
    }
    assert _parse(doc).dictionary == DictionaryFile("dictionary.zstd", 12345, 4096, SHA)
    assert _parse(_manifest("zstd", None)).dictionary is None


BAD_ENTRIES = [
    ({"extra": 1}, "unknown field `extra`, expected one of `file`, `dict_id`, `byte_len`, `sha256`"),
    ({"file": "../x"}, 'invalid value: `"../x"` for field `file`, expected a plain file name'),
    ({"file": "a/b"}, "expected a plain file name"),
    ({"dict_id": 0}, "expected a dictionary id in [1, 4294967295]"),
    ({"dict_id": 2**32}, "expected an integer in [0, 4294967295]"),
    ({"dict_id": "1"}, "for field `dict_id`"),
    ({"byte_len": 0}, f"expected a dictionary size in [1, {DICT_MAX_BYTES}]"),
    ({"byte_len": DICT_MAX_BYTES + 1}, f"expected an integer in [0, {DICT_MAX_BYTES}]"),
    ({"sha256": "x"}, "expected 64 lowercase hex digits"),
]


@pytest.mark.parametrize(
    "change, message", BAD_ENTRIES, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(BAD_ENTRIES)]
)
def test_entry_is_parsed_strictly(change, message):
    doc = _manifest()
    doc["datasetrt"]["zstd_dictionary"].update(change)
    with pytest.raises(ManifestJSONError) as info:
        _parse(doc)
    assert (
        message in str(info.value)
        and "datasetrt.zstd_dictionary" in str(info.value)
        and "m/manifest.json" in str(info.value)
    )


def test_entry_and_shards_must_agree():
    doc = _manifest()
    del doc["datasetrt"]
    with pytest.raises(
        ManifestJSONError,
        match=r"shards\[0\] use zstd_dict but `datasetrt.zstd_dictionary` is missing: m/manifest.json",
    ):
        _parse(doc)
    doc = _manifest("zstd")
    with pytest.raises(ManifestJSONError, match="names a dictionary but no shard uses zstd_dict: m/manifest.json"):
        _parse(doc)
