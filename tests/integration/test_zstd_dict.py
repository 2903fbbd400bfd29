"""zstd_dict caches (issue 14) end to end: what the writer stores, reproducible writes, the plain
zstd fallback, and the same samples on every read path (in-process, get_item, iter_batches, reader
workers under fork and spawn, torch DataLoader workers, validate_cache=True, the CLI)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import zstandard

import datasetrt as drt
from datasetrt import cli
from tests.conftest import ListSource, json_like_items

DICT_BYTES = 4096


def _config(algo: str = "zstd_dict", **kw) -> drt.WriterConfig:
    comp = drt.ShardCompression(algo=algo, dict_bytes=DICT_BYTES, **kw)
    return drt.WriterConfig(show_progress=False, shard_compression=comp, max_shard_bytes=16 << 10)


def _write(base: Path, sources, config=None, workers: int = 2) -> list[Path]:
    with drt.DatasetRuntime(num_workers=workers) as rt:
        results = rt.write_cache(sources, base, writer_config=config or _config())
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results), results
    return [r.path for r in results]


def _files(cache: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cache)): p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}


ITEMS_A = json_like_items(300, tag="a")
ITEMS_B = json_like_items(200, seed=1000, tag="b")


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Two zstd_dict caches (different dictionaries, several shards each) and one uncompressed cache."""
    base = tmp_path_factory.mktemp("zstd-dict")
    a, b = _write(base, [ListSource("a", ITEMS_A), ListSource("b", ITEMS_B)])
    [c] = _write(base, [ListSource("c", ITEMS_A[:40])], drt.WriterConfig(show_progress=False))
    return [a, b, c]


EXPECTED = [p for p, _ in ITEMS_A] + [p for p, _ in ITEMS_B] + [p for p, _ in ITEMS_A[:40]]


def _ordered(caches, runtime=None, **cfg):
    return drt.CachedDataset(caches, reader_config=drt.ReaderConfig(seed=3, shuffle=False, **cfg), runtime=runtime)


def test_the_writer_stores_a_dictionary_every_frame_names(caches):
    a = caches[0]
    doc = json.loads((a / "manifest.json").read_text())
    entry = doc["datasetrt"]["zstd_dictionary"]
    data = (a / "dictionary.zstd").read_bytes()
    assert entry["file"] == "dictionary.zstd" and entry["byte_len"] == len(data) <= DICT_BYTES
    assert {s["compression"]["algo"] for s in doc["shards"]} == {"zstd_dict"} and len(doc["shards"]) > 1
    assert all(s["compression"]["level"] == 3 for s in doc["shards"])
    dict_id = zstandard.ZstdCompressionDict(data).dict_id()
    assert entry["dict_id"] == dict_id != 0
    b_id = json.loads((caches[1] / "manifest.json").read_text())["datasetrt"]["zstd_dictionary"]["dict_id"]
    assert b_id != dict_id  # each cache trains its own
    # every stored payload is one frame naming the dictionary, decoded by an independent decoder
    index = (a / "index.bin").read_bytes()
    decoder = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(data))
    stored_total = 0
    for sid, (payload, _) in enumerate(ITEMS_A):
        shard, offset, length = (int.from_bytes(index[24 * sid + k : 24 * sid + k + 8], "little") for k in (0, 8, 16))
        record = (a / "shards" / doc["shards"][shard]["name"]).read_bytes()[offset : offset + length]
        stored = record[8 + int.from_bytes(record[:8], "little") :]
        assert zstandard.get_frame_parameters(stored).dict_id == dict_id
        assert decoder.decompress(stored) == payload
        stored_total += len(stored)
    plain = sum(len(zstandard.ZstdCompressor(level=3).compress(p)) for p, _ in ITEMS_A)
    assert stored_total < plain  # the point of the codec: small similar records compress better


def test_writes_are_reproducible_with_and_without_compression_threads(tmp_path):
    one = _write(tmp_path / "one", [ListSource("a", ITEMS_A)], workers=1)[0]
    two = _write(tmp_path / "two", [ListSource("a", ITEMS_A)], workers=2)[0]
    again = _write(tmp_path / "again", [ListSource("a", ITEMS_A)], workers=2)[0]
    assert _files(one) == _files(two) == _files(again)


def test_a_source_too_small_to_train_is_written_as_plain_zstd(tmp_path):
    [cache] = _write(tmp_path, [ListSource("tiny", ITEMS_A[:6])])
    doc = json.loads((cache / "manifest.json").read_text())
    assert [s["compression"] for s in doc["shards"]] == [{"algo": "zstd", "ratio": 1.0, "level": 3}]
    assert "zstd_dictionary" not in doc["datasetrt"] and not (cache / "dictionary.zstd").exists()
    assert [s.data for s in _ordered([cache])] == [p for p, _ in ITEMS_A[:6]]
    [again] = _write(tmp_path / "again", [ListSource("tiny", ITEMS_A[:6])])
    assert _files(again) == _files(cache)


def test_in_process_reads_get_item_and_batches(caches):
    ds = _ordered(caches)
    assert [s.data for s in ds] == EXPECTED
    assert [bytes(b.payload(i)) for b in ds.iter_batches(64) for i in range(len(b))] == EXPECTED
    ids = [json.loads((c / "manifest.json").read_text())["cache_id"] for c in caches]
    assert ds.get_item(ids[1], 57).data == ITEMS_B[57][0]
    assert ds.get_item(ids[0], 299).data == ITEMS_A[299][0]
    strict = _ordered(caches, validate_cache=True)
    assert [s.data for s in strict] == EXPECTED
    strict.close()
    ds.close()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reader_workers_read_what_the_process_reads(caches, start_method):
    shuffled = lambda runtime: drt.CachedDataset(caches, reader_config=drt.ReaderConfig(seed=11), runtime=runtime)  # noqa: E731
    local = [(s.cache_id, s.sample_id, s.data) for s in shuffled(None)]
    with drt.DatasetRuntime(num_workers=2, start_method=start_method) as rt:
        rt.start_workers()  # every read below goes through the workers
        assert [s.data for s in _ordered(caches, rt)] == EXPECTED
        assert [(s.cache_id, s.sample_id, s.data) for s in shuffled(rt)] == local
        batched = [bytes(b.payload(i)) for b in _ordered(caches, rt).iter_batches(100) for i in range(len(b))]
        assert batched == EXPECTED


def test_torch_dataloader_workers(caches):
    pytest.importorskip("torch")
    ds = _ordered(caches)
    truth = {(s.cache_id, s.sample_id): s.data for s in _ordered(caches)}
    loader = lambda **kw: ds.to_torch_dataloader(seed=4, batch_size=32, verbose=False, collate_fn=list, **kw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        serial = [(s.cache_id, s.sample_id, s.data) for batch in loader(num_workers=0) for s in batch]
        assert len(serial) == len(EXPECTED) and all(truth[k[:2]] == k[2] for k in serial)
        for context in ("fork", "spawn"):
            got = [
                (s.cache_id, s.sample_id, s.data)
                for batch in loader(num_workers=2, multiprocessing_context=context)
                for s in batch
            ]
            assert got == serial, context


def test_cli_inspect_shows_and_validate_checks_the_dictionary(caches, capsys):
    a = caches[0]
    entry = json.loads((a / "manifest.json").read_text())["datasetrt"]["zstd_dictionary"]
    assert cli.main(["inspect", str(a), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["zstd_dictionary"] == entry
    assert cli.main(["inspect", str(a)]) == 0
    out = capsys.readouterr().out
    assert f"dictionary.zstd: {entry['byte_len']:,} bytes, dictionary id {entry['dict_id']}" in out
    assert "compression zstd_dict" in out
    assert cli.main(["validate", str(a)]) == 0
    assert f"ok   {a}: 300 samples verified" in capsys.readouterr().out
    (a.parent / "copy").mkdir()
    bad = a.parent / "copy" / "a"
    bad.mkdir()
    for name, data in _files(a).items():
        (bad / name).parent.mkdir(parents=True, exist_ok=True)
        (bad / name).write_bytes(data)
    data = bytearray((bad / "dictionary.zstd").read_bytes())
    data[-1] ^= 0xFF
    (bad / "dictionary.zstd").write_bytes(bytes(data))
    assert cli.main(["validate", str(bad)]) == 1
    assert f"FAIL {bad}: IntegrityError: checksum mismatch for {bad / 'dictionary.zstd'}" in capsys.readouterr().out
