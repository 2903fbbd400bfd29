"""`CachedDataset.to_torch_iterable_dataset()` with real torch DataLoaders (CPU).

num_workers=0 is `iter(dataset)`; with workers (fork, spawn) each worker reads its own blocks of
the one window `iter(dataset)` would reserve next, in-process, and the union is that window.
Spawned workers get paths, config and a population snapshot path, never the table.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import warnings

import numpy as np
import polars as pl
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

import datasetrt as drt  # noqa: E402
from datasetrt.errors import CacheFormatError, ConfigError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def key(sample) -> tuple:
    return (sample.cache_id, sample.sample_id, sample.data, tuple(sorted(sample.metadata.items())))


def first(batch):
    return batch[0]


def keep_list(batch):
    return list(batch)


def weighted_view(df: pl.DataFrame) -> pl.DataFrame:
    """Filtered, reweighted and with duplicated rows: a population unlike the physical one."""
    base = df.filter(pl.col("kept")).with_columns(weight=pl.col("score") + 1.0)
    return pl.concat([base, base.filter(pl.col("index") % 4 == 0)])


@pytest.fixture
def paths(write_caches):
    return write_caches({"t0": 61, "t1": 40})


def open_ds(paths, *, shuffle=True, seed=7, update=False, epoch_len=None):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=seed, shuffle=shuffle), runtime=None)
    if update:
        ds.update_metadata(weighted_view(ds.get_metadata()))
    if epoch_len is not None:
        ds.set_epoch_len(epoch_len)
    return ds


def interleave(plan: list, workers: int, block: int, batch: int) -> list:
    """The batches torch yields when worker w reads plan blocks w, w+K, ... and batches them."""
    blocks = [plan[i : i + block] for i in range(0, len(plan), block)]
    per_worker = [[s for b in blocks[w::workers] for s in b] for w in range(workers)]
    batches = [[ws[i : i + batch] for i in range(0, len(ws), batch)] for ws in per_worker]
    out = []
    for r in range(max(len(b) for b in batches)):
        out += [b[r] for b in batches if r < len(b)]
    return out


# -- shape and main-process behaviour -----------------------------------------------------------


def test_sized_iterable_dataset(paths):
    ds = open_ds(paths)
    tds = ds.to_torch_iterable_dataset()
    assert isinstance(tds, IterableDataset)
    assert isinstance(tds, drt.SizedTorchIterableDataset)
    assert len(tds) == len(ds) == 101
    ds.set_epoch_len(13)
    assert len(tds) == 13
    assert len(DataLoader(tds, batch_size=4)) == 4


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("update", [False, True])
def test_num_workers_zero_is_iter_dataset(paths, shuffle, update):
    ds = open_ds(paths, shuffle=shuffle, update=update, epoch_len=37)
    twin = open_ds(paths, shuffle=shuffle, update=update, epoch_len=37)
    loader = DataLoader(ds.to_torch_iterable_dataset(), batch_size=None, num_workers=0)
    for _epoch in range(3):  # each pass reserves the next window, as iter(ds) does
        assert [key(s) for s in loader] == [key(s) for s in twin]
    it = iter(ds.to_torch_iterable_dataset())
    assert key(next(it)) == key(next(iter(twin)))  # reservation happens at the first next()


# -- DataLoader workers (fork) -----------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("update", [False, True])
def test_fork_workers_read_the_plan_in_order(paths, shuffle, update):
    ds = open_ds(paths, shuffle=shuffle, update=update, epoch_len=53)
    ds.set_epoch_len(53)
    next(iter(ds))  # start from a non-zero cursor / draw offset
    tds = ds.to_torch_iterable_dataset()
    loader = DataLoader(tds, batch_size=1, num_workers=3, collate_fn=first, multiprocessing_context="fork")
    got = [key(s) for s in loader]
    plan = [key(s) for s in ds]  # the window iter(ds) reserves next: the parent was not advanced
    assert got == plan
    assert len(got) == len(tds) == 53


def test_fork_workers_batches_are_deterministic_and_cover_the_plan(paths):
    ds = open_ds(paths, update=True, epoch_len=45)
    loader = DataLoader(
        ds.to_torch_iterable_dataset(),
        batch_size=4,
        num_workers=2,
        collate_fn=keep_list,
        multiprocessing_context="fork",
    )
    got = [[key(s) for s in b] for b in loader]
    plan = [key(s) for s in ds]
    assert got == interleave(plan, workers=2, block=1, batch=4)
    assert sorted(k for b in got for k in b) == sorted(plan)  # each planned sample once


def test_block_rows_equal_to_batch_size_gives_plan_order(paths):
    from datasetrt.integrations.torch import to_torch_iterable_dataset

    ds = open_ds(paths, epoch_len=50)
    tds = to_torch_iterable_dataset(ds, block_rows=4)
    loader = DataLoader(tds, batch_size=4, num_workers=3, collate_fn=keep_list, multiprocessing_context="fork")
    got = [[key(s) for s in b] for b in loader]
    plan = [key(s) for s in ds]
    assert [k for b in got for k in b] == plan
    assert [len(b) for b in got] == [4] * 12 + [2]
    with pytest.raises(ConfigError, match="block_rows"):
        to_torch_iterable_dataset(ds, block_rows=0)


def test_persistent_workers_continue_the_stream(paths):
    ds = open_ds(paths, update=True, epoch_len=21)
    loader = DataLoader(
        ds.to_torch_iterable_dataset(),
        batch_size=1,
        num_workers=2,
        collate_fn=first,
        multiprocessing_context="fork",
        persistent_workers=True,
    )
    epochs = [[key(s) for s in loader] for _ in range(3)]
    assert epochs == [[key(s) for s in ds] for _ in range(3)]  # windows 1, 2, 3 from the state at start


def test_more_workers_than_samples(paths):
    ds = open_ds(paths, shuffle=False, epoch_len=2)
    loader = DataLoader(
        ds.to_torch_iterable_dataset(), batch_size=1, num_workers=3, collate_fn=first, multiprocessing_context="fork"
    )
    assert [key(s) for s in loader] == [key(s) for s in ds]


def test_torch_workers_do_not_use_the_multiprocess_runtime(paths):
    with drt.DatasetRuntime(num_workers=2, start_method="fork") as rt:
        ds = rt.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=3))
        ds.update_metadata(weighted_view(ds.get_metadata()))
        ds.set_epoch_len(40)
        warm = [key(s) for s in ds]  # the runtime's reader processes read this window
        pids = rt.worker_pids
        assert len(pids) == 2
        loader = DataLoader(
            ds.to_torch_iterable_dataset(),
            batch_size=1,
            num_workers=2,
            collate_fn=first,
            multiprocessing_context="fork",
        )
        got = [key(s) for s in loader]
        assert rt.worker_pids == pids
        assert got == [key(s) for s in ds] and got != warm


# -- what crosses to a spawned worker ---------------------------------------------------------------


def test_pickle_ships_paths_config_and_a_snapshot_path(paths):
    ds = open_ds(paths, update=True, epoch_len=33)
    next(iter(ds))
    tds = ds.to_torch_iterable_dataset()
    blob = pickle.dumps(tds)
    assert len(blob) < 2048  # no table, no index, no population arrays
    assert tds.snapshot_dir is not None and any(tds.snapshot_dir.rglob("population.arrow"))
    assert len(pickle.dumps(tds)) == len(blob)  # same population: the snapshot is written once
    assert len(list(tds.snapshot_dir.rglob("population.arrow"))) == 1
    copy = pickle.loads(blob)  # what a spawned worker gets; iterated outside a DataLoader = worker 0 of 1
    assert len(copy) == 33
    assert [key(s) for s in copy] == [key(s) for s in ds]
    assert [key(s) for s in copy] == [key(s) for s in ds]  # its second pass is the next window
    with pytest.raises(TypeError, match="pickle"):
        pickle.dumps(ds)


def test_physical_population_needs_no_snapshot(paths):
    ds = open_ds(paths, epoch_len=20)
    tds = ds.to_torch_iterable_dataset()
    copy = pickle.loads(pickle.dumps(tds))
    assert tds.snapshot_dir is None
    assert [key(s) for s in copy] == [key(s) for s in ds]


def test_snapshot_dir_removed_when_wrapper_is_collected(paths):
    ds = open_ds(paths, update=True)
    tds = ds.to_torch_iterable_dataset()
    pickle.dumps(tds)
    where = tds.snapshot_dir
    assert where.is_dir()
    del tds
    gc.collect()
    assert not where.exists()


def test_changed_caches_are_refused_in_workers(paths):
    ds = open_ds(paths, update=True)
    tds = ds.to_torch_iterable_dataset()  # owns the snapshot the copy maps
    copy = pickle.loads(pickle.dumps(tds))
    manifest = paths[1] / "manifest.json"
    st = manifest.stat()
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(CacheFormatError, match="caches changed"):
        next(iter(copy))


def test_spawn_workers_read_the_updated_population(paths):
    ds = open_ds(paths, update=True, epoch_len=47)
    next(iter(ds))
    tds = ds.to_torch_iterable_dataset()
    loader = DataLoader(
        tds, batch_size=1, num_workers=2, collate_fn=first, multiprocessing_context="spawn", persistent_workers=True
    )
    epochs = [[key(s) for s in loader] for _ in range(2)]
    assert epochs == [[key(s) for s in ds] for _ in range(2)]
    where = tds.snapshot_dir
    assert len(list(where.rglob("population.arrow"))) == 1
    del loader, tds, epochs
    gc.collect()
    assert not where.exists()


# -- PyTorch missing --------------------------------------------------------------------------------


def test_missing_torch_raises_import_error(paths, monkeypatch):
    ds = open_ds(paths)
    monkeypatch.delitem(sys.modules, "datasetrt.integrations.torch")
    monkeypatch.setitem(sys.modules, "torch.utils.data", None)
    with pytest.raises(ImportError, match="CachedDataset.to_torch_iterable_dataset requires PyTorch to be installed"):
        ds.to_torch_iterable_dataset()


def test_parent_cursor_is_untouched_by_worker_passes(paths):
    ds = open_ds(paths, shuffle=False, epoch_len=10)
    loader = DataLoader(
        ds.to_torch_iterable_dataset(), batch_size=1, num_workers=2, collate_fn=first, multiprocessing_context="fork"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torch length warning: exactly len(ds) samples
        list(loader)
    assert [s.sample_id for s in ds] == list(range(10))
    assert np.array_equal([s.sample_id for s in ds], np.arange(10, 20))


# -- main-process resume ----------------------------------------------------------------------------


def consume(tds, n: int) -> list:
    """The first n samples over as many passes as needed (a break leaves a pass mid-window)."""
    out: list = []
    while len(out) < n:
        for s in DataLoader(tds, batch_size=None, num_workers=0):
            out.append(key(s))
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_main_process_passes(paths, shuffle):
    make = lambda: open_ds(paths, shuffle=shuffle, update=True, epoch_len=9).to_torch_iterable_dataset()  # noqa: E731
    full = consume(make(), 30)
    for cut in [0, 1, 8, 9, 10, 22, 27]:
        tds = make()
        head = consume(tds, cut)
        state = pickle.loads(pickle.dumps(tds.state_dict()))
        fresh = make()
        fresh.load_state_dict(state)
        assert fresh.state_dict() == state  # a loaded, not yet started state reads back unchanged
        assert head + consume(fresh, 30 - cut) == full


def test_resume_refusals_for_the_torch_dataset(paths):
    tds = open_ds(paths, update=True, epoch_len=9).to_torch_iterable_dataset()
    consume(tds, 4)
    state = tds.state_dict()
    assert state["pass"]["consumed"] == 4
    with pytest.raises(drt.errors.DatasetRTError, match="before the torch dataset is iterated"):
        tds.load_state_dict(state)
    others = [
        (open_ds(paths, epoch_len=9), "active table"),
        (open_ds(paths, update=True, seed=8), "seed differs"),
        (open_ds(paths, shuffle=False, update=True), "shuffle differs"),
    ]
    for other, what in others:
        with pytest.raises(ConfigError, match=what):
            other.to_torch_iterable_dataset().load_state_dict(state)
    copy = pickle.loads(pickle.dumps(tds))
    with pytest.raises(RuntimeError, match="in the process that built it"):
        copy.state_dict()
