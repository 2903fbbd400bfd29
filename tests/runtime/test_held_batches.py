"""Batches leased from ring slots: a consumer may keep batches, views, memoryviews and tensors
across many later batches (fork and spawn, 1 and 2 workers) and their bytes never change; a
consumer holding more than its share of the ring gets copies instead of blocking or being
overwritten; released and dropped batches return their slots; an abandoned iterator leaves
its held batches readable and nothing behind (no /dev/shm entry, descriptor or process)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.runtime.sample_batch import SampleBatch
from tests.runtime.conftest import active_run, child_pids, shm_entries, wait_pids_gone, write_cache

SPEC = drt.PayloadSpec("int32", (64,))


def _tokens(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 1 << 30, 64, dtype=np.int32), {"i": i}) for i in range(n)]


@pytest.fixture(scope="module", params=["none", "zstd"])
def cache(tmp_path_factory, request):
    return write_cache(tmp_path_factory.mktemp("held"), "tok", _tokens(600), request.param, payload_spec=SPEC)


def _want(cache, shuffle):
    ref = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=4, shuffle=shuffle))
    return np.stack([SPEC.decode(s.data) for s in ref])


def _open(cache, runtime, shuffle, epoch=600):
    ds = drt.CachedDataset(
        [cache], reader_config=drt.ReaderConfig(seed=4, shuffle=shuffle, prefetch_size=64), runtime=runtime
    )
    ds.set_epoch_len(epoch)
    return ds


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("workers", [1, 2])
def test_kept_batches_views_and_tensors_keep_their_bytes(cache, runtimes, method, workers):
    pytest.importorskip("torch")
    ds = _open(cache, runtimes(method, workers), shuffle=True)
    want = _want(cache, True)
    kept, position = [], 0
    for k, batch in enumerate(ds.iter_batches(16)):
        n = len(batch)
        if k % 4 == 0:
            kept.append((position, batch))
        elif k % 4 == 1:
            kept.append((position, batch.to_numpy()[::2]))  # a strided view
        elif k % 4 == 2:
            kept.append((position, batch.to_torch()))
        else:
            kept.append((position, memoryview(batch.data)))
        position += n
        if k % 4 == 3:
            del batch  # the loop variable must not be what keeps anything alive
    assert position == 600
    for first, held in kept:
        if isinstance(held, SampleBatch):
            got, rows = held.to_numpy(), slice(first, first + len(held))
        elif isinstance(held, np.ndarray):
            got, rows = held, slice(first, first + 2 * len(held), 2)
        elif isinstance(held, memoryview):
            got = np.frombuffer(held, dtype="<i4").reshape(-1, 64)
            rows = slice(first, first + len(got))
        else:
            got, rows = held.numpy(), slice(first, first + len(held))
        assert np.array_equal(got, want[rows])


def test_holding_every_batch_gets_copies_not_a_hang(cache, runtimes):
    ds = _open(cache, runtimes("fork", 2), shuffle=False)
    it = ds.iter_batches(16)
    held = [next(it)]
    run = active_run(runtimes("fork", 2))
    held += list(it)
    slots, leased = run.ring.slots, run.ring.leased
    assert leased == slots - 2 and run.copies == len(held) - leased  # the rest were copied out
    assert np.array_equal(np.concatenate([b.to_numpy() for b in held]), _want(cache, False))


def test_dropped_and_released_batches_return_their_slots(cache, runtimes):
    ds = _open(cache, runtimes("fork", 2), shuffle=False)
    it = ds.iter_batches(16)
    first = next(it)
    run = active_run(runtimes("fork", 2))
    assert run.ring.leased == 1
    view = first.to_numpy()
    first.release()
    assert run.ring.leased == 1  # a view made from it still reads the slot
    del view
    assert run.ring.leased == 0
    with next(it) as batch:
        assert run.ring.leased == 1 and len(batch) == 16
    assert run.ring.leased == 0
    for _batch in it:  # the usual loop: the previous batch is held while the next is read
        assert run.ring.leased <= 2
    assert run.copies == 0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_abandoned_iterator_leaves_held_batches_readable_and_nothing_behind(cache, method):
    want = _want(cache, True)
    fds_before = set(os.listdir("/proc/self/fd"))
    children_before = child_pids()
    runtime = drt.DatasetRuntime(num_workers=2, start_method=method)
    runtime.start_workers()
    pids = runtime.worker_pids
    ds = _open(cache, runtime, shuffle=True)
    it = ds.iter_batches(16)
    held = [next(it) for _ in range(5)]
    tensor = held[2].to_numpy()
    del it  # abandoned mid-window: its run closes, the ring file goes
    gc.collect()
    assert shm_entries() == []
    runtime.close()  # and the workers
    assert wait_pids_gone(pids) == []
    assert child_pids() <= children_before
    for k, batch in enumerate(held):  # still the same bytes: the parent's mapping outlives the run
        assert np.array_equal(batch.to_numpy(), want[16 * k : 16 * (k + 1)])
    assert np.array_equal(tensor, want[32:48])
    del held, tensor, batch
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) <= fds_before


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_epochs_share_one_ring_and_held_batches_of_an_earlier_epoch_keep_their_bytes(cache, runtimes, method):
    """Each epoch's run takes the ring the last one left idle (runtime/pool.py); batches held from
    an earlier epoch keep their slots leased (the new run works with the others) and their bytes,
    and every epoch reads what the in-process reader reads for the same window."""
    runtime = runtimes(method, 2)
    ds, ref = _open(cache, runtime, shuffle=True), _open(cache, None, shuffle=True)
    held, rings = [], set()
    for _epoch in range(3):
        want = np.concatenate([b.to_numpy() for b in ref.iter_batches(16)])  # the same window, in-process
        batches = list(ds.iter_batches(16))  # every batch of the epoch held until its end
        rings.add(runtime._worker_pool.idle_ring.key)
        assert np.array_equal(np.concatenate([b.to_numpy() for b in batches]), want)
        held.append((want, batches[-2:]))  # two leased batches of each epoch stay held
        del batches
    assert len(rings) == 1  # one ring served the three epochs
    for want, last_two in held:
        got = np.concatenate([b.to_numpy() for b in last_two])  # (600 = 37 x 16 + 8 rows)
        assert len(got) == 24 and np.array_equal(got, want[-24:])
