"""runtime/gatherer.py + the batch gather kernel: payloads back to back in their final layout,
byte-identical to the record gather on every codec and order; embedded JSON kept or dropped;
the payload spec's length rule; a buffer too small for in-place reads, or for the batch; a mapping
that runs out of descriptors."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import CacheFormatError, ConfigError
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime.local import LocalReader
from datasetrt.values.payloads import PayloadCheck
from tests.conftest import ListSource, sample_items, writer_config

NO_JSON = np.empty(0, dtype=np.int64)


def _write(tmp_path, name, items, algo="none", **kw):
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource(name, items)], tmp_path / algo, writer_config=writer_config(algo, **kw))
    assert isinstance(res, drt.CacheWriteSuccess), res
    return res.path


def _reader(*paths):
    return LocalReader([CacheHandle.open(p) for p in paths])


def _rows(ids, cache=0):
    return np.full(len(ids), cache, dtype=np.int64), np.asarray(ids, dtype=np.uint64)


def _records(reader, cache_pos, sample_id):
    """(payloads, JSON texts) through the record gather, the reference."""
    chunk = reader.read_chunk(cache_pos, sample_id)
    data = chunk.data
    payloads = [bytes(data[o : o + n]) for o, n in zip(chunk.data_off, chunk.data_len)]
    texts = [bytes(data[o : o + n]) for o, n in zip(chunk.json_off, chunk.json_len)]
    return payloads, texts


def _batch(reader, cache_pos, sample_id, out_bytes, check=PayloadCheck(), keep_json=False):
    n = len(cache_pos)
    out = np.zeros(out_bytes, dtype=np.uint8)
    offsets = np.full(n + 1, -1, dtype=np.int64)
    json = (np.zeros(n, np.int64), np.zeros(n, np.int64)) if keep_json else (NO_JSON, NO_JSON)
    result = reader.gather_batch_into(cache_pos, sample_id, out, offsets, *json, check)
    return result, out, offsets, json


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("order", ["ordered", "shuffled", "repeats"])
@pytest.mark.parametrize("keep_json", [False, True])
def test_batch_gather_equals_record_gather(tmp_path, algo, order, keep_json):
    path = _write(tmp_path, "c", sample_items(120, seed=3), algo)
    reader = _reader(path)
    ids = {
        "ordered": np.arange(120),
        "shuffled": np.random.default_rng(1).permutation(120),
        "repeats": np.array([5, 5, 6, 7, 7, 7, 0, 119, 118]),
    }[order]
    cache_pos, sample_id = _rows(ids)
    want_payloads, want_json = _records(reader, cache_pos, sample_id)
    total = sum(map(len, want_payloads)) + (sum(map(len, want_json)) if keep_json else 0)
    (done, used, json_bottom, need), out, offsets, json = _batch(
        reader, cache_pos, sample_id, 40_000, keep_json=keep_json
    )
    assert (done, need) == (len(ids), 0)
    assert offsets[0] == 0 and used == offsets[-1] == sum(map(len, want_payloads))
    assert bytes(out[:used]) == b"".join(want_payloads)  # back to back: the final layout
    assert [bytes(out[a:b]) for a, b in itertools.pairwise(offsets)] == want_payloads
    if keep_json:
        assert [bytes(out[o : o + n]) for o, n in zip(*json)] == want_json
        assert json_bottom == len(out) - sum(map(len, want_json)) and used <= json_bottom
        assert total <= len(out)
    reader.close()


@pytest.mark.parametrize("algo", ["none", "zstd"])
def test_a_full_buffer_returns_the_rows_done_and_what_the_next_needs(tmp_path, algo):
    items = [(bytes([i]) * 1000, {"i": i}) for i in range(10)]
    reader = _reader(_write(tmp_path, "c", items, algo))
    cache_pos, sample_id = _rows(range(10))
    (done, used, _bottom, need), out, offsets, _ = _batch(reader, cache_pos, sample_id, 3500)
    assert (done, used, need) == (3, 3000, 1000)
    assert offsets[:4].tolist() == [0, 1000, 2000, 3000] and bytes(out[:3000]) == b"".join(d for d, _ in items[:3])
    (done, *_), _, _, _ = _batch(reader, cache_pos, sample_id, 0)
    assert done == 0
    reader.close()


def test_exact_buffer_reads_the_tail_records_through_scratch(tmp_path):
    """A buffer of exactly the payload bytes: the last records do not fit in place (header and
    JSON too), so they are staged; the bytes are the same."""
    items = [(bytes(range(i, i + 64)), {"index": i, "pad": "x" * i}) for i in range(50)]
    reader = _reader(_write(tmp_path, "c", items))
    cache_pos, sample_id = _rows(range(50))
    (done, used, _b, need), out, _offsets, _ = _batch(
        reader, cache_pos, sample_id, 50 * 64, PayloadCheck(64, 0, "uint8[64]")
    )
    assert (done, used, need) == (50, 3200, 0)
    assert bytes(out) == b"".join(d for d, _ in items)
    reader.close()


@pytest.mark.parametrize("algo", ["none", "lz4"])
def test_payloads_that_break_the_spec_are_typed_errors_naming_cache_sample_and_lengths(tmp_path, algo):
    items = [(b"\0" * 8, {"i": 0}), (b"\0" * 8, {"i": 1}), (b"\0" * 12, {"i": 2})]
    path = _write(tmp_path, "c", items, algo)
    reader = _reader(path)
    cache_pos, sample_id = _rows(range(3))
    with pytest.raises(
        CacheFormatError,
        match=rf"payload of 12 bytes does not fit payload spec int32\[2\] "
        rf"\(expected 8 bytes\): {re.escape(str(path))} sample 2",
    ):
        _batch(reader, cache_pos, sample_id, 1000, PayloadCheck(8, 0, "int32[2]"))
    with pytest.raises(
        CacheFormatError,
        match="payload of 12 bytes does not fit payload spec int64.None. "
        r"\(expected a multiple of 8 bytes\).* sample 2",
    ):
        _batch(reader, cache_pos, sample_id, 1000, PayloadCheck(-1, 8, "int64[None]"))
    (done, *_), *_ = _batch(reader, cache_pos, sample_id, 1000, PayloadCheck(-1, 4, "int32[None]"))
    assert done == 3
    reader.close()


def test_the_kernel_refuses_too_few_offsets(tmp_path):
    reader = _reader(_write(tmp_path, "c", sample_items(4)))
    cache_pos, sample_id = _rows(range(4))
    with pytest.raises(ConfigError, match="4 rows need 5 offsets"):
        reader.gather_batch_into(
            cache_pos, sample_id, np.zeros(100, np.uint8), np.zeros(4, np.int64), NO_JSON, NO_JSON, PayloadCheck()
        )
    reader.close()


def test_two_caches_in_one_batch(tmp_path):
    a = _write(tmp_path / "a", "a", sample_items(30, seed=1, tag="a"))
    b = _write(tmp_path / "b", "b", sample_items(30, seed=2, tag="b"), "zstd")
    reader = _reader(a, b)
    cache_pos = np.array([0, 1, 1, 0, 0, 1], dtype=np.int64)
    sample_id = np.array([3, 3, 4, 4, 5, 29], dtype=np.uint64)
    want, _ = _records(reader, cache_pos, sample_id)
    (done, used, _b, _n), out, _offsets, _ = _batch(reader, cache_pos, sample_id, 10_000)
    assert done == 6 and bytes(out[:used]) == b"".join(want)
    reader.close()


def test_running_out_of_descriptors_while_mapping_relieves_the_budget_by_errno(tmp_path, monkeypatch):
    """Mapping an index needs a descriptor for a moment: EMFILE/ENFILE (read from the error's
    errno, never from its text) closes the budget's idle shards and maps again; any other I/O
    error, even one whose message mentions os error 24, propagates."""
    import errno

    from datasetrt.errors import CacheIOError
    from datasetrt.runtime.descriptors import DescriptorBudget

    class Budget(DescriptorBudget):
        relieved = 0

        def relieve(self) -> None:
            Budget.relieved += 1
            super().relieve()

    path = _write(tmp_path, "c", sample_items(4))
    real = CacheHandle.index_map
    failures = [CacheIOError.from_os(errno.EMFILE, "index.bin")]

    def index_map(handle):
        if failures:
            raise failures.pop()
        return real(handle)

    monkeypatch.setattr(CacheHandle, "index_map", index_map)
    reader = LocalReader([CacheHandle.open(path)], budget=Budget(limit=64))
    chunk = reader.read_chunk(*_rows(range(4)))
    assert chunk.rows == 4 and Budget.relieved == 1
    reader.close()

    failures.append(CacheIOError("I/O error: Too many open files (os error 24): worded, without errno"))
    reader = LocalReader([CacheHandle.open(path)], budget=Budget(limit=64))
    with pytest.raises(CacheIOError, match="without errno"):
        reader.read_chunk(*_rows(range(4)))
    assert Budget.relieved == 1
    reader.close()


@pytest.mark.parametrize("order", ["ordered", "shuffled"])
@pytest.mark.parametrize("out_bytes", [40_000, 700])
def test_mapped_shards_read_what_pread_reads(tmp_path, order, out_bytes):
    """`map_shards=True` (reader workers): uncompressed shards are copied out of their mapping;
    both kernels return pread's bytes, in place, staged, with the JSON kept or dropped."""
    from datasetrt.runtime.gatherer import Gatherer

    path = _write(tmp_path, "c", sample_items(120, seed=4), max_shard_bytes=4096)
    handles = [CacheHandle.open(path)]
    mapped = Gatherer(handles, map_shards=True)
    plain = Gatherer(handles)
    ids = np.arange(120) if order == "ordered" else np.random.default_rng(2).permutation(120)
    cache_pos, sample_id = _rows(ids)
    for keep_json in (False, True):
        got = [_batch(g, cache_pos, sample_id, out_bytes, keep_json=keep_json) for g in (mapped, plain)]
        assert got[0][0] == got[1][0] and got[0][0][0] > 0
        np.testing.assert_array_equal(got[0][1], got[1][1])
        np.testing.assert_array_equal(got[0][2], got[1][2])
    outs = []
    for g in (mapped, plain):
        out, spans = np.zeros(out_bytes, np.uint8), [np.zeros(120, np.int64) for _ in range(4)]
        outs.append((g.gather_into(cache_pos, sample_id, out, *spans), out, spans))
    assert outs[0][0] == outs[1][0]
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert mapped.mapped_shards == len(handles[0].manifest.shards) > 1 and plain.mapped_shards == 0
    mapped.close()
    plain.close()


def test_a_shard_shorter_than_its_manifest_is_not_mapped(tmp_path):
    """A shard already shorter than its byte_len when the reader maps it stays on pread, whose
    error names it (a mapping would raise SIGBUS past the file's end)."""
    from datasetrt.errors import CacheIOError
    from datasetrt.runtime.gatherer import Gatherer

    path = _write(tmp_path, "c", sample_items(60, seed=5, payload_bytes=200), max_shard_bytes=4096)
    handles = [CacheHandle.open(path)]
    shard = handles[0].shard_paths()[0]
    with open(shard, "r+b") as f:
        f.truncate(100)
    reader = Gatherer(handles, map_shards=True)
    assert reader.mapped_shards == 0  # nothing mapped before the first gather
    cache_pos, sample_id = _rows(np.arange(60))
    with pytest.raises(CacheIOError, match=re.escape(str(shard))):
        _batch(reader, cache_pos, sample_id, 40_000)
    assert reader.mapped_shards == len(handles[0].manifest.shards) - 1


def test_lazy_handles_open_only_the_caches_a_read_needs_and_refuse_a_changed_one(tmp_path):
    import os

    from datasetrt.runtime.gatherer import Gatherer, LazyHandles, cache_layout

    paths = [_write(tmp_path / f"c{i}", f"c{i}", sample_items(4 + i)) for i in range(3)]
    opened = [CacheHandle.open(p) for p in paths]
    dirs = [str(h.path.absolute()) for h in opened]
    identities, layouts = [h.identity for h in opened], [cache_layout(h) for h in opened]
    eager = _records(_reader(*paths), *_rows([3, 0], cache=2))

    lazy = LazyHandles(dirs, identities, layouts)
    reader = LocalReader(lazy)  # type: ignore[arg-type]  # a reader worker's Gatherer, in-process here
    assert isinstance(reader, Gatherer) and lazy.opened() == 0  # building the reader's table opened nothing
    assert _records(reader, *_rows([3, 0], cache=2)) == eager
    assert lazy.opened() == 1 and lazy[2].identity == identities[2]

    stale = LazyHandles(dirs, identities, [layouts[1], layouts[0], layouts[2]])
    with pytest.raises(CacheFormatError, match=re.escape(f"cache changed on disk since it was opened: {dirs[0]}")):
        stale[0]  # the first use opens and checks
    os.utime(os.path.join(dirs[0], "manifest.json"), ns=(1, 1))  # another identity than the parent's
    with pytest.raises(CacheFormatError, match="cache changed on disk since it was opened"):
        LazyHandles(dirs, identities, layouts)[0]
    reader.close()
