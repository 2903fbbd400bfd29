"""iter_batches: the same samples, in the same order, as the per-sample iterator, without a
Python object per sample; metadata is the table's rows (active table after update_metadata)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError


@pytest.fixture(scope="module")
def rt():
    runtime = drt.DatasetRuntime(num_workers=2, start_method="fork")
    yield runtime
    runtime.close()


def _flatten(batches):
    out = []
    for b in batches:
        assert b.offsets[0] == 0 and b.offsets[-1] == len(b.data) and len(b.offsets) == len(b) + 1
        assert b.data.dtype == np.uint8 and b.cache_id.dtype == np.uint64 and b.sample_id.dtype == np.uint64
        for i in range(len(b)):
            out.append((bytes(b.payload(i)), int(b.cache_id[i]), int(b.sample_id[i])))
    return out


def _pairs(paths, runtime, shuffle, **cfg):
    def make():
        return drt.CachedDataset(
            paths,
            reader_config=drt.ReaderConfig(seed=5, shuffle=shuffle, **cfg),
            runtime=runtime,
        )

    return make(), make()


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_batches_equal_samples(write_caches, rt, algo, shuffle, parallel, batch_size):
    paths = write_caches({"a": 90, "b": 45}, algo=algo)
    per_sample, batched = _pairs(paths, rt if parallel else None, shuffle)
    for ds in (per_sample, batched):
        ds.set_epoch_len(200)
    expected = [(s.data, s.cache_id, s.sample_id) for s in per_sample]
    batches = list(batched.iter_batches(batch_size))
    assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert _flatten(batches) == expected


def test_windows_continue_like_iterators(write_caches, rt):
    paths = write_caches({"a": 30})
    per_sample, batched = _pairs(paths, rt, shuffle=True)
    for ds in (per_sample, batched):
        ds.set_epoch_len(12)
    first = [(s.data, s.cache_id, s.sample_id) for s in per_sample] + [
        (s.data, s.cache_id, s.sample_id) for s in per_sample
    ]
    got = _flatten(batched.iter_batches(5)) + _flatten(batched.iter_batches(5))
    assert got == first


def test_metadata_is_the_table_rows_in_order(write_caches, rt):
    paths = write_caches({"a": 40, "b": 20})
    ds, _ = _pairs(paths, rt, shuffle=False)
    table = ds.get_metadata()
    batches = list(ds.iter_batches(16))
    md = pl.from_arrow(__import__("pyarrow").concat_tables([b.metadata for b in batches]))
    assert md.equals(table)


def test_metadata_after_update_is_the_active_table(write_caches, rt):
    paths = write_caches({"a": 40})
    ds, ref = _pairs(paths, rt, shuffle=True)
    for d in (ds, ref):
        table = d.get_metadata()
        d.update_metadata(table.filter(pl.col("kept")).with_columns(weight=pl.col("score") + 1.0, extra=pl.lit("x")))
    expected = list(ref)
    batches = list(ds.iter_batches(9))
    rows = [r for b in batches for r in b.metadata.to_pylist()]
    assert [(r["cache_id"], r["sample_id"]) for r in rows] == [(s.cache_id, s.sample_id) for s in expected]
    assert all(r["extra"] == "x" and r["kept"] for r in rows)
    assert [r["index"] for r in rows] == [s.metadata["index"] for s in expected]


def test_metadata_read_after_a_later_update_is_still_the_planned_table(write_caches, rt):
    """A batch's metadata is built on first access, but from the table its window was planned
    from: an update_metadata (or a physical table decoded only later) in between changes nothing."""
    paths = write_caches({"a": 30})
    for filtered in (False, True):
        ds, _ = _pairs(paths, rt, shuffle=True)
        if filtered:
            ds.update_metadata(ds.get_metadata().filter(pl.col("kept")).with_columns(tag=pl.lit("first")))
        planned = ds.get_metadata()
        batches = list(ds.iter_batches(7))  # no metadata read yet
        ds.update_metadata(ds.get_metadata().head(3).with_columns(tag=pl.lit("second")))
        rows = [r for b in batches for r in b.metadata.to_pylist()]
        assert [(r["cache_id"], r["sample_id"]) for r in rows] == [
            (int(c), int(s)) for b in batches for c, s in zip(b.cache_id, b.sample_id)
        ]
        keys = {(r["cache_id"], r["sample_id"]) for r in planned.to_dicts()}
        assert all((r["cache_id"], r["sample_id"]) in keys for r in rows)
        assert all(r.get("tag", "first") == "first" for r in rows)
        assert batches[0].metadata is batches[0].metadata  # built once


@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
def test_recycled_batch_buffers_never_change_what_the_consumer_holds(write_caches, rt, parallel):
    """Payload buffers are reused only when unreachable: a kept batch, a numpy view, a memoryview
    or a torch tensor of a batch's data keeps its bytes; dropped batches' buffers are reused."""
    torch = pytest.importorskip("torch")
    paths = write_caches({"a": 300, "b": 200})
    ds, ref = _pairs(paths, rt if parallel else None, shuffle=True)
    for d in (ds, ref):
        d.set_epoch_len(3000)
    want = [(bytes(s.data), s.cache_id, s.sample_id) for s in ref]
    kept, views, mviews, tensors, bases = [], [], [], [], set()
    position = 0
    for k, batch in enumerate(ds.iter_batches(16)):
        bases.add(batch.data.__array_interface__["data"][0])  # where the bytes are: a ring slot or a pooled buffer
        if k % 5 == 0:
            kept.append((position, batch))
        elif k % 5 == 1:
            views.append((position, batch.offsets.copy(), batch.data[:]))
        elif k % 5 == 2:
            mviews.append((position, batch.offsets.copy(), memoryview(batch.data)))
        elif k % 5 == 3:
            tensors.append((position, batch.offsets.copy(), torch.frombuffer(batch.data, dtype=torch.uint8)))
        position += len(batch)
    assert position == 3000
    for first, batch in kept:
        assert [bytes(batch.payload(i)) for i in range(len(batch))] == [w[0] for w in want[first : first + len(batch)]]
    for first, offsets, data in views + mviews + tensors:
        raw = bytes(data.numpy()) if hasattr(data, "numpy") else bytes(data)
        got = [raw[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
        assert got == [w[0] for w in want[first : first + len(got)]]
    # every fifth batch was dropped at once, so some buffers (slots) came back and were written
    # again at the same address (and 4 of 5 stayed held)
    assert len(bases) < 3000 // 16


def test_drop_last_and_without_metadata(write_caches):
    paths = write_caches({"a": 10})
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, shuffle=False))
    batches = list(ds.iter_batches(4, drop_last=True, with_metadata=False))
    assert [len(b) for b in batches] == [4, 4] and all(b.metadata is None for b in batches)
    assert [int(s) for b in batches for s in b.sample_id] == list(range(8))


def test_large_records_span_chunks(write_caches, rt, tmp_path):
    from tests.conftest import ListSource, writer_config

    items = [(bytes([i]) * (300_000 + i), {"i": i}) for i in range(12)]
    [res] = rt.write_cache([ListSource("big", items)], tmp_path / "big", writer_config=writer_config("lz4"))
    ds = drt.CachedDataset([res.path], reader_config=drt.ReaderConfig(seed=1, shuffle=False), runtime=rt)
    got = _flatten(ds.iter_batches(5))
    assert [d for d, _, _ in got] == [d for d, _ in items]


@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
def test_uncompressed_runs_longer_than_one_in_place_read(rt, tmp_path, parallel):
    """Ordered uncompressed records of 10-190 KiB: the batch gather reads neighbours in place in
    runs of at most 256 KiB (_ext/gather.pyx INPLACE_SPAN_BYTES), so runs end at every kind of
    boundary inside a batch; every payload must land whole, in order."""
    from tests.conftest import ListSource, writer_config

    rng = np.random.default_rng(3)
    items = [
        (rng.integers(0, 256, int(rng.integers(10_000, 190_000)), dtype=np.uint8).tobytes(), {"i": i})
        for i in range(40)
    ]
    [res] = rt.write_cache([ListSource("mid", items)], tmp_path / "mid", writer_config=writer_config("none"))
    ds = drt.CachedDataset(
        [res.path], reader_config=drt.ReaderConfig(seed=1, shuffle=False), runtime=rt if parallel else None
    )
    for batch_size in (1, 3, 16, 40):
        got = _flatten(ds.iter_batches(batch_size))
        assert [d for d, _, _ in got] == [d for d, _ in items]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None])
def test_bad_batch_size(write_caches, bad):
    paths = write_caches({"a": 3})
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1))
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        ds.iter_batches(bad)


def test_reservation_at_first_next(write_caches):
    paths = write_caches({"a": 6})
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, shuffle=False))
    ds.set_epoch_len(2)
    unused = ds.iter_batches(2)  # never advanced: reserves nothing
    assert [int(s) for b in ds.iter_batches(2) for s in b.sample_id] == [0, 1]
    del unused
