"""Sequence packing through a dataset (`ds.iter_packed`, `PackedBatches`): ragged int32 token
caches of every codec, in-process and with reader workers, both modes; the packed rows against
the documents `iter_batches` reads; resume mid-epoch (mid-document included) reproduces the
remaining rows and the dataset's cursor; two ranks' rows are disjoint and cover the window."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError, PackingError
from datasetrt.sampling.packing import Packer, packed_stream
from tests.conftest import ListSource, writer_config

CODECS = ["none", "zstd", "zstd_dict"]
SPEC = drt.PayloadSpec("int32", (None,))
ROWS, ROW_LEN = 4, 64


@pytest.fixture(scope="module")
def workers():
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()
    yield rt
    rt.close()


def _items(n=300, seed=0):
    """Documents whose tokens name them: doc i is 1000 * (i + 1) + [0, n_i); lengths lognormal
    (mean ~30, some over a row of 64), a few empty."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(3.0, 0.9, n).astype(np.int64), 400)
    lengths[::37] = 0
    return [(np.arange(n_i, dtype=np.int32) + 1000 * (i + 1), {"i": i}) for i, n_i in enumerate(lengths)]


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    base = tmp_path_factory.mktemp("packing")
    out = {}
    with drt.DatasetRuntime(num_workers=1) as rt:
        for algo in CODECS:
            [res] = rt.write_cache(
                [ListSource(f"docs-{algo}", _items())],
                base / algo,
                writer_config=writer_config(algo, payload_spec=SPEC),
            )
            assert isinstance(res, drt.CacheWriteSuccess), res
            out[algo] = res.path
    return out


def _open(path, runtime=None, seed=3, sampling="permutation"):
    return drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=seed, sampling=sampling), runtime=runtime)


def _reference(path, mode, overlong="split", seed=3, sampling="permutation", rows=ROWS):
    """The window's documents as iter_batches reads them, packed by the pure Packer in one feed."""
    ds = _open(path, seed=seed, sampling=sampling)
    chunks = []
    for batch in ds.iter_batches(50, with_metadata=False):
        values, offsets, _ = batch.to_numpy()
        chunks.append((values.copy(), offsets.copy(), batch.cache_id.copy(), batch.sample_id.copy()))
    return list(packed_stream(Packer(rows, ROW_LEN, mode=mode, overlong=overlong, pad=-1), chunks))


def _same(a, b):
    fields = ("tokens", "segment_ids", "positions", "cu_seqlens", "cache_id", "sample_id")
    return len(a) == len(b) and all(
        all(np.array_equal(getattr(x, f), getattr(y, f)) for f in fields) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("algo", CODECS)
@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
@pytest.mark.parametrize("mode", ["split", "whole"])
def test_packs_the_window(caches, workers, algo, parallel, mode):
    ds = _open(caches[algo], workers if parallel else None)
    got = list(ds.iter_packed(ROWS, ROW_LEN, mode=mode, pad=-1, read_size=32))
    assert _same(got, _reference(caches[algo], mode))
    assert all(b.tokens.shape == (ROWS, ROW_LEN) and b.tokens.dtype == np.int32 for b in got[:-1])
    # every token of the window exactly once, each at its position in its document
    tokens = np.concatenate([b.tokens[b.segment_ids > 0] for b in got])
    want = np.concatenate([t for t, _ in _items()])
    assert np.array_equal(np.sort(tokens), np.sort(want))
    if mode == "split":  # concatenate and chunk: the documents back to back, in plan order
        order = [s.sample_id for s in _open(caches[algo])]
        stream = np.concatenate([_items()[i][0] for i in order])
        assert np.array_equal(np.concatenate([b.tokens.reshape(-1) for b in got])[: len(stream)], stream)
        assert all(b.pad_fraction == 0 for b in got[:-1])  # only the last rows pad
    for b in got:  # a segment is one document: its tokens are consecutive in it
        for r in range(len(b)):
            for s in np.unique(b.segment_ids[r][b.segment_ids[r] > 0]):
                seg = b.tokens[r][b.segment_ids[r] == s]
                assert np.all(np.diff(seg) == 1) and len(set(seg // 1000)) == 1
    assert ds.cursor_state().draw_offset == len(ds)  # the window was reserved as iter_batches does


def test_whole_mode_keeps_documents_whole(caches):
    got = list(_open(caches["none"]).iter_packed(ROWS, ROW_LEN, mode="whole", overlong="truncate"))
    for b in got:  # every segment starts its document (truncated documents keep their first row_len tokens)
        for r in range(len(b)):
            row = b.tokens[r]
            starts = np.flatnonzero((b.positions[r] == 0) & (b.segment_ids[r] > 0))
            assert np.all(row[starts] % 1000 == 0)
    dropped = sum(max(0, len(t) - ROW_LEN) for t, _ in _items())
    kept = sum(int((b.segment_ids > 0).sum()) for b in got)
    assert kept == sum(len(t) for t, _ in _items()) - dropped


@pytest.mark.parametrize("algo", CODECS)
@pytest.mark.parametrize("parallel", [False, True], ids=["inline", "workers"])
@pytest.mark.parametrize("mode", ["split", "whole"])
def test_resume_mid_epoch(caches, workers, algo, parallel, mode):
    runtime = workers if parallel else None
    full = list(_open(caches[algo], runtime).iter_packed(ROWS, ROW_LEN, mode=mode, read_size=16))
    ks = [k for k in range(1, len(full)) if full[k - 1].state["offset"]] if mode == "split" else []
    for k in sorted({1, len(full) // 2, len(full) - 1, *ks[:1]}):  # mid-document too (offset > 0)
        first = _open(caches[algo], runtime)
        packed = first.iter_packed(ROWS, ROW_LEN, mode=mode, read_size=16)
        head = [next(packed) for _ in range(k)]
        state = packed.state_dict()
        assert state == head[-1].state and state["batches"] == k
        assert isinstance(state["position"], int) and isinstance(state["offset"], int)
        resumed_ds = _open(caches[algo], runtime)
        resumed = resumed_ds.iter_packed(ROWS, ROW_LEN, mode=mode, read_size=7)  # other read sizes: same rows
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert _same(head + rest, full)
        # the dataset continues past the window as the uninterrupted one does
        after = [int(s.sample_id) for s in first]
        assert [int(s.sample_id) for s in resumed_ds] == after
    if mode == "split":
        assert ks, "some batch ends inside a document"


def test_state_refusals(caches):
    ds = _open(caches["none"])
    packed = ds.iter_packed(ROWS, ROW_LEN)
    next(packed)
    state = packed.state_dict()
    with pytest.raises(PackingError, match="row_len is 64, here 32"):
        _open(caches["none"]).iter_packed(ROWS, 32).load_state_dict(state)
    with pytest.raises(PackingError, match="mode is 'split', here 'whole'"):
        _open(caches["none"]).iter_packed(ROWS, ROW_LEN, mode="whole").load_state_dict(state)
    with pytest.raises(PackingError, match="order is 'permutation'"):
        _open(caches["none"], sampling="draws").iter_packed(ROWS, ROW_LEN).load_state_dict(state)
    with pytest.raises(PackingError, match="inconsistent"):
        _open(caches["none"]).iter_packed(ROWS, ROW_LEN).load_state_dict({**state, "position": -1})
    with pytest.raises(PackingError, match="outside a share"):
        _open(caches["none"]).iter_packed(ROWS, ROW_LEN).load_state_dict({**state, "position": 10_000})
    with pytest.raises(PackingError, match="has started"):
        packed.load_state_dict(state)
    with pytest.raises(ConfigError, match="pack mode"):
        ds.iter_packed(ROWS, ROW_LEN, mode="best")
    with pytest.raises(ConfigError, match="rank"):
        ds.iter_packed(ROWS, ROW_LEN, rank=2, world_size=2)


def test_overlong_error_names_the_sample(caches):
    ds = _open(caches["none"])
    with pytest.raises(
        PackingError, match=r"more than a row of 64 \(overlong='error'\) \(cache_id \d+, sample_id \d+\)"
    ):
        list(ds.iter_packed(ROWS, ROW_LEN, mode="whole", overlong="error"))


def test_dense_and_untyped_documents(tmp_path):
    items = [(np.arange(10, dtype=np.int16) + 100 * i, {"i": i}) for i in range(9)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [dense] = rt.write_cache(
            [ListSource("dense", items)],
            tmp_path / "d",
            writer_config=writer_config(payload_spec=drt.PayloadSpec("int16", (10,))),
        )
        [raw] = rt.write_cache(
            [ListSource("raw", [(bytes(range(i + 1)), {"i": i}) for i in range(9)])],
            tmp_path / "u",
            writer_config=writer_config(),
        )
    got = list(_open(dense.path).iter_packed(2, 16))
    assert got[0].tokens.dtype == np.int16 and got[0].tokens.shape == (2, 16)
    assert np.array_equal(
        np.sort(np.concatenate([b.tokens[b.segment_ids > 0] for b in got])),
        np.sort(np.concatenate([t for t, _ in items])),
    )
    untyped = list(_open(raw.path).iter_packed(2, 8, mode="whole"))
    assert untyped[0].tokens.dtype == np.uint8 and sum(int((b.segment_ids > 0).sum()) for b in untyped) == 45


def test_refuses_payloads_that_are_not_1d(tmp_path):
    items = [(np.zeros((2, 3), np.float32), {"i": i}) for i in range(8)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(
            [ListSource("grid", items)],
            tmp_path,
            writer_config=writer_config(payload_spec=drt.PayloadSpec("float32", (2, 3))),
        )
    with pytest.raises(ConfigError, match="1-D token payloads"):
        _open(res.path).iter_packed(ROWS, ROW_LEN)


@pytest.mark.parametrize("mode", ["split", "whole"])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_disjoint_and_cover(caches, workers, mode, world):
    shares = [
        list(
            _open(caches["zstd"], workers if r % 2 else None).iter_packed(
                ROWS, ROW_LEN, mode=mode, rank=r, world_size=world
            )
        )
        for r in range(world)
    ]
    assert all(len(b) <= ROWS for s in shares for b in s) and all(len(b) == ROWS for s in shares for b in s[:-1])
    ids = [np.unique(np.concatenate([b.sample_id for b in s])) for s in shares]
    for a in range(world):
        for b in range(a + 1, world):
            assert not set(ids[a].tolist()) & set(ids[b].tolist())  # each document on one rank
    tokens = np.concatenate([b.tokens[b.segment_ids > 0] for s in shares for b in s])
    assert np.array_equal(np.sort(tokens), np.sort(np.concatenate([t for t, _ in _items()])))
    # a rank resumes its own share exactly
    k = len(shares[1]) // 2
    packed = _open(caches["zstd"]).iter_packed(ROWS, ROW_LEN, mode=mode, rank=1, world_size=world)
    for _ in range(k):
        next(packed)
    again = _open(caches["zstd"]).iter_packed(ROWS, ROW_LEN, mode=mode, rank=1, world_size=world)
    again.load_state_dict(packed.state_dict())
    assert _same(list(again), shares[1][k:])
    with pytest.raises(PackingError, match="rank is 1, here 0"):
        _open(caches["zstd"]).iter_packed(ROWS, ROW_LEN, mode=mode, rank=0, world_size=world).load_state_dict(
            packed.state_dict()
        )


def test_deterministic_for_a_seed_and_new_per_seed(caches):
    a = list(_open(caches["none"], seed=11).iter_packed(ROWS, ROW_LEN))
    b = list(_open(caches["none"], seed=11).iter_packed(ROWS, ROW_LEN))
    c = list(_open(caches["none"], seed=12).iter_packed(ROWS, ROW_LEN))
    assert _same(a, b) and not _same(a, c)


def test_drop_last_and_successive_windows(caches):
    ds = _open(caches["none"])
    full = list(ds.iter_packed(ROWS, ROW_LEN))
    rows = next(r for r in range(3, 9) if len(list(_open(caches["none"]).iter_packed(r, ROW_LEN))[-1]) < r)
    short = list(_open(caches["none"]).iter_packed(rows, ROW_LEN))
    dropped = list(_open(caches["none"]).iter_packed(rows, ROW_LEN, drop_last=True))
    assert len(short[-1]) < rows and _same(dropped, short[:-1])
    second = list(ds.iter_packed(ROWS, ROW_LEN))  # the next window: the next epoch's order
    assert second[0].state["window"] == [len(ds), len(ds)] and not _same(second, full)


def test_a_state_continued_over_an_imported_population(caches):
    """What a spawned DataLoader worker does: reopen the caches, import the owner's (filtered)
    population, and continue the owner's state over it, leaving its own cursor alone."""
    import polars as pl

    owner = _open(caches["zstd"])
    owner.update_metadata(owner.get_metadata().filter(pl.col("i") % 4 != 1))
    packed = owner.iter_packed(ROWS, ROW_LEN)
    head = [next(packed) for _ in range(2)]
    rest = list(packed)
    reopened = _open(caches["zstd"])  # the physical table: another order of other rows
    population = reopened.import_population(owner.export_population(owner.cursor_state().population))
    other = reopened.iter_packed(ROWS, ROW_LEN)
    other.use_population(population)
    other.load_state_dict(head[-1].state)
    assert _same(list(other), rest)
    assert reopened.cursor_state().as_dict() == _open(caches["zstd"]).cursor_state().as_dict()
    plain = reopened.iter_packed(ROWS, ROW_LEN)
    plain.load_state_dict(head[-1].state)
    assert not _same(list(plain), rest)  # the same window of the physical table is other rows
    unloaded = reopened.iter_packed(ROWS, ROW_LEN)
    unloaded.use_population(population)
    with pytest.raises(PackingError, match="continues a loaded state only"):
        next(unloaded)
    with pytest.raises(PackingError, match="before load_state_dict"):
        other.use_population(population)
