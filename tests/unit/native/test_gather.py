"""_native.gather: both kernels (record layout and batch layout) detect and word every record
fault the same way, because they share one path per record (_locate, _read_run, _check_record,
_payload_size, _decode); an OS error keeps its errno."""

from __future__ import annotations

import errno
import os
import shutil

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import CacheIOError, ConfigError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.local import LocalReader
from datasetrt.values.payloads import PayloadCheck
from tests.conftest import ListSource, writer_config
from tests.integrity.corrupt import (
    edit_manifest,
    make_record,
    payload_offset,
    read_record,
    replace_records,
    set_index_row,
    shard_file,
    split_record,
)

N = 8
ITEMS = [(bytes(range(i, i + 40)) * 3, {"i": i, "tag": f"t{i}"}) for i in range(N)]
NO_JSON = np.empty(0, dtype=np.int64)


@pytest.fixture(params=["none", "lz4"])
def cache(request, tmp_path):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource("c", ITEMS)], tmp_path, writer_config=writer_config(request.param))
    assert isinstance(res, drt.CacheWriteSuccess), res
    return res.path


def _readers(path, n=3):
    return [LocalReader([CacheHandle.open(path)]) for _ in range(n)]


def _record_fault(reader, ids):
    try:
        reader.read_chunk(np.zeros(len(ids), np.int64), np.asarray(ids, np.uint64))
    except Exception as exc:
        return exc
    finally:
        reader.close()
    raise AssertionError("the record gather read a damaged cache")


def _batch_fault(reader, ids, keep_json):
    n = len(ids)
    json = (np.zeros(n, np.int64), np.zeros(n, np.int64)) if keep_json else (NO_JSON, NO_JSON)
    try:
        reader.gather_batch_into(
            np.zeros(n, np.int64),
            np.asarray(ids, np.uint64),
            np.zeros(1 << 16, np.uint8),
            np.zeros(n + 1, np.int64),
            *json,
            PayloadCheck(),
        )
    except Exception as exc:
        return exc
    finally:
        reader.close()
    raise AssertionError("the batch gather read a damaged cache")


def _same_fault(readers, ids, cls, *fragments):
    """The record gather and the batch gather (JSON dropped, JSON kept), one reader each, raise
    `cls` with one and the same message, which holds every fragment."""
    records, dropped, kept = readers
    faults = [_record_fault(records, ids), _batch_fault(dropped, ids, False), _batch_fault(kept, ids, True)]
    for exc in faults:
        assert type(exc) is cls, repr(exc)
        for fragment in fragments:
            assert str(fragment) in str(exc), (fragment, str(exc))
    assert len({str(exc) for exc in faults}) == 1, [str(exc) for exc in faults]
    return faults


def _rewrite(path, sample_id, json_bytes=None, json_len=None):
    json, stored = split_record(read_record(path, sample_id))
    replace_records(path, {sample_id: make_record(json if json_bytes is None else json_bytes, stored, json_len)})


CORRUPTIONS = {
    "sample-range": (lambda p: None, [0, N], drt.errors.SampleIndexError, f"sample_id {N} is out of range"),
    "shard-id": (lambda p: set_index_row(p, 3, shard_id=7), [2, 3], drt.errors.CacheFormatError, "missing shard 7"),
    "bounds": (
        lambda p: set_index_row(p, 3, offset=shard_file(p).stat().st_size - 4, byte_len=8),
        [2, 3],
        CacheIOError,
        "lies outside shard",
    ),
    "short-record": (lambda p: set_index_row(p, 3, byte_len=4), [3], drt.errors.CacheFormatError, "invalid binary"),
    "checksum": (
        lambda p: _flip(shard_file(p), payload_offset(p, 3)),
        [0, 1, 2, 3, 4],
        drt.errors.IntegrityError,
        "record checksum mismatch",
    ),
    "json-length": (lambda p: _rewrite(p, 3, json_len=10**6), [3], drt.errors.CacheFormatError, "invalid binary"),
    "json-utf8": (lambda p: _rewrite(p, 3, b'{"i": "\xff"}'), [2, 3], drt.errors.RecordJSONError, "not valid UTF-8"),
    "decoded-limit": (
        lambda p: edit_manifest(p, lambda d: d["shards"][0].__setitem__("uncompressed_byte_len", 100)),
        [1],
        drt.errors.CacheFormatError,
        "exceeds the shard's uncompressed_byte_len 100",
    ),
}


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_both_kernels_word_a_record_fault_the_same(cache, name):
    damage, ids, cls, fragment = CORRUPTIONS[name]
    damage(cache)
    _same_fault(_readers(cache), ids, cls, fragment, str(cache))


def test_a_shard_that_shrank_after_open_is_the_same_short_read(cache):
    readers = _readers(cache)
    os.truncate(shard_file(cache), shard_file(cache).stat().st_size - 10)
    [exc, *_] = _same_fault(readers, list(range(N)), CacheIOError, "failed to fill whole buffer", f"{cache} sample")
    assert (exc.errno, exc.path) == (None, str(shard_file(cache)))


def test_an_os_read_error_keeps_its_errno_and_the_shard_path(cache):
    """A shard replaced by a directory after open: open(2) succeeds, pread(2) fails with EISDIR."""
    shard = shard_file(cache)
    readers = _readers(cache)
    shard.unlink()
    shard.mkdir()
    faults = _same_fault(readers, [0], CacheIOError, f"(os error {errno.EISDIR}): shard {shard}: {cache} sample 0")
    for exc in faults:
        assert str(exc).startswith(f"I/O error: {os.strerror(errno.EISDIR)} (os error {errno.EISDIR})")
        assert (exc.errno, exc.path) == (errno.EISDIR, str(shard))


def test_rows_and_outputs_must_have_matching_lengths(cache):
    reader = LocalReader([CacheHandle.open(cache)])
    out = np.zeros(4096, np.uint8)
    with pytest.raises(ConfigError, match="3 cache positions but 2 sample ids"):
        reader.gather_into(np.zeros(3, np.int64), np.zeros(2, np.uint64), out, *np.zeros((4, 3), np.int64))
    with pytest.raises(ConfigError, match="3 rows need 3 JSON and payload spans"):
        reader.gather_into(np.zeros(3, np.int64), np.zeros(3, np.uint64), out, *np.zeros((4, 2), np.int64))
    reader.close()


def test_a_copied_cache_reads_the_same_through_both_kernels(cache, tmp_path):
    """Control: the undamaged cache (and a copy of it) reads through every path."""
    copy = shutil.copytree(cache, tmp_path / "copy")
    reader = LocalReader([CacheHandle.open(cache), CacheHandle.open(copy)])
    cache_pos = np.repeat(np.array([0, 1], np.int64), N)
    sample_id = np.tile(np.arange(N, dtype=np.uint64), 2)
    chunk = reader.read_chunk(cache_pos, sample_id)
    records = [bytes(chunk.data[o : o + n]) for o, n in zip(chunk.data_off, chunk.data_len)]
    assert records == [d for d, _ in ITEMS] * 2
    out, offsets = np.zeros(1 << 16, np.uint8), np.zeros(2 * N + 1, np.int64)
    done, used, _bottom, need = reader.gather_batch_into(
        cache_pos, sample_id, out, offsets, NO_JSON, NO_JSON, PayloadCheck()
    )
    assert (done, need) == (2 * N, 0) and bytes(out[:used]) == b"".join(records)
    reader.close()
