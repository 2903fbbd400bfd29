"""`CachedDataset`'s integration seam (docs/python-api.md, "Integration seam"), without torch:
windows (peek, reserve, plan, sub), reading any window-like object here or through the runtime,
populations across processes, the cursor state and the caches' identity."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.dataset.seam import CursorState
from datasetrt.errors import ConfigError, LoaderStateError


def key(sample) -> tuple:
    return (sample.cache_id, sample.sample_id, sample.data, tuple(sorted(sample.metadata.items())))


def weighted_view(df: pl.DataFrame) -> pl.DataFrame:
    base = df.filter(pl.col("kept")).with_columns(weight=pl.col("score") + 1.0)
    return pl.concat([base, base.filter(pl.col("index") % 4 == 0)])


@pytest.fixture
def paths(write_caches):
    return write_caches({"s0": 23, "s1": 17})


def open_ds(paths, *, shuffle=True, update=False, epoch_len=None, runtime=None):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=5, shuffle=shuffle), runtime=runtime)
    if update:
        ds.update_metadata(weighted_view(ds.get_metadata()))
    if epoch_len is not None:
        ds.set_epoch_len(epoch_len)
    return ds


class Reversed:
    """A window-like object that is not a planner window: a window's positions backwards."""

    def __init__(self, window):
        self.window, self.population, self.length = window, window.population, window.length

    def rows(self, first, count):
        return self.window.rows(0, self.length)[::-1][first : first + count].copy()


# -- windows --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("update", [False, True])
def test_peek_reserve_and_plan_windows_follow_iteration(paths, shuffle, update):
    ds = open_ds(paths, shuffle=shuffle, update=update, epoch_len=11)
    twin = open_ds(paths, shuffle=shuffle, update=update, epoch_len=11)
    peeked = ds.peek_window()
    assert ds.peek_window().start == peeked.start  # peeking moves nothing
    reserved = ds.reserve_window()
    assert (reserved.start, reserved.length) == (peeked.start, 11)
    assert ds.peek_window().start == peeked.sub(11, 11).start  # the cursor moved past it
    first, second = [key(s) for s in twin], [key(s) for s in twin]
    assert [key(s) for s in ds.read_window(reserved)] == first
    both = ds.plan_window(peeked.start, 22)  # one window over both passes, cut with sub
    assert [key(s) for s in ds.read_window(both.sub(11, 11))] == second
    assert [key(s) for s in ds.read_window(both)] == first + second


def test_read_window_takes_any_window_in_process_or_through_the_runtime(paths):
    with drt.DatasetRuntime(num_workers=2, start_method="fork") as rt:
        ds = open_ds(paths, update=True, epoch_len=30, runtime=rt)
        window = ds.peek_window()
        forward = [key(s) for s in ds.read_window(window, in_process=True)]
        assert rt.worker_pids == []  # in_process never starts the runtime's workers
        assert [key(s) for s in ds] == forward
        rt.start_workers()
        backward = Reversed(window)
        assert [key(s) for s in ds.read_window(backward)] == forward[::-1]  # one run through the workers
        assert [key(s) for s in ds.read_window(backward, in_process=True)] == forward[::-1]
        assert list(ds.read_window(window, lambda s: s.sample_id)) == [k[1] for k in forward]
        assert list(ds.read_window(window.sub(3, 0))) == []


def test_read_window_can_toggle_the_embedded_metadata_check(paths):
    ds = open_ds(paths, epoch_len=12)
    window = ds.peek_window()
    plain = [key(s) for s in ds.read_window(window, in_process=True)]
    assert [key(s) for s in ds.read_window(window, in_process=True, check_embedded=True)] == plain


class Buffers:
    """`read_window_batches(buffers=)`: hands out its own arrays and remembers them."""

    def __init__(self):
        self.handed = []

    def take(self, nbytes):
        self.handed.append(np.zeros(nbytes + 5, dtype=np.uint8))
        return self.handed[-1]


def test_read_window_batches_in_process_through_the_runtime_and_into_given_buffers(paths):
    with drt.DatasetRuntime(num_workers=2, start_method="fork") as rt:
        ds = open_ds(paths, update=True, epoch_len=30, runtime=rt)
        window = ds.peek_window()
        samples = [key(s) for s in ds.read_window(window, in_process=True)]
        backward = Reversed(window)
        buffers = Buffers()
        given = list(ds.read_window_batches(backward, 7, in_process=True, buffers=buffers))
        assert rt.worker_pids == []  # in_process never starts the runtime's workers
        assert [len(b) for b in given] == [7, 7, 7, 7, 2]
        for batch in given:  # each batch's bytes live in one of the given buffers
            assert any(np.shares_memory(batch.data, buf) for buf in buffers.handed)
        rt.start_workers()
        through = list(ds.read_window_batches(backward, 7))  # leased ring slots of the workers
        for batches in (given, through):
            got = [
                (int(b.cache_id[i]), int(b.sample_id[i]), bytes(b.payload(i))) for b in batches for i in range(len(b))
            ]
            assert got == [k[:3] for k in samples[::-1]]
        assert list(ds.read_window_batches(window.sub(3, 0), 4)) == []
        with pytest.raises(ConfigError, match="buffers= needs in_process=True"):
            ds.read_window_batches(window, 4, buffers=buffers)


def test_sample_columns_come_from_the_caches_own_tables(paths):
    ds = open_ds(paths, update=True)  # the active table's order and weights do not matter here
    cache_id = np.array([s.cache_id for s in ds.read_window(ds.peek_window(), in_process=True)], dtype=np.uint64)
    sample_id = np.array([s.sample_id for s in ds.read_window(ds.peek_window(), in_process=True)], dtype=np.uint64)
    cols = ds.sample_columns(cache_id, sample_id, ["index", "label"])
    physical = {
        (int(c), int(s)): (i, lbl)
        for c, s, i, lbl in open_ds(paths).get_metadata().select("cache_id", "sample_id", "index", "label").iter_rows()
    }
    assert [(int(i), lbl) for i, lbl in zip(cols["index"], cols["label"])] == [
        physical[(int(c), int(s))] for c, s in zip(cache_id, sample_id)
    ]
    assert cols["index"].dtype.kind == "i" and cols["label"].dtype == object
    with pytest.raises(ConfigError, match="no metadata column 'nope'"):
        ds.sample_columns(cache_id, sample_id, ["nope"])


# -- populations ----------------------------------------------------------------------------------


def test_population_rows_and_rebuilt_populations(paths):
    ds = open_ds(paths)
    physical = ds.peek_window().population
    assert ds.population_rows() is None and ds.export_population(physical) is None
    rows = ds.population_rows(expand_physical=True)
    assert len(rows) == 40 and rows.weights.tolist() == [1.0] * 40
    assert len(ds.import_population(None)) == 40
    ds.update_metadata(weighted_view(ds.get_metadata()))
    active = ds.population_rows()
    table = ds.get_metadata()
    assert active.sample_id.tolist() == table["sample_id"].to_list()
    window = ds.peek_window()
    export = ds.export_population(window.population)
    assert export.rows == len(active) and set(export.columns) == {"cache_pos", "sample_id", "cum"}
    again = ds.import_population(export)
    planned = [key(s) for s in ds.read_window(window)]
    assert [key(s) for s in ds.read_window(ds.plan_window(window.start, window.length, population=again))] == planned
    picked = ds.population_from_rows(active.cache_pos[::2], active.sample_id[::2], active.weights[::2])
    ordered = ds.plan_window(0, len(picked), population=picked, shuffle=False)
    assert [s.sample_id for s in ds.read_window(ordered)] == active.sample_id[::2].tolist()


def test_cache_identity(paths):
    ds = open_ds(paths)
    caches = ds.cache_identity()
    assert caches.sample_counts.tolist() == [23, 17] and len(caches.cache_ids) == 2
    assert caches.cache_dirs == tuple(str(p.absolute()) for p in paths)
    assert open_ds(paths).cache_identity().key == caches.key
    manifest = paths[1] / "manifest.json"
    st = manifest.stat()
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert open_ds(paths).cache_identity().key != caches.key  # a rewritten cache is another identity


# -- cursor state ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_cursor_state_round_trip(paths, shuffle):
    ds = open_ds(paths, shuffle=shuffle, update=True, epoch_len=9)
    next(iter(ds))
    saved = ds.cursor_state().as_dict()
    assert set(saved) == set(CursorState.FIELDS) and saved["epoch_len"] == 9
    fresh = open_ds(paths, shuffle=shuffle, update=True)
    fresh.restore_cursor_state(fresh.cursor_state_from(saved))
    assert fresh.cursor_state() == ds.cursor_state() and len(fresh) == 9
    assert [key(s) for s in fresh] == [key(s) for s in ds]


def test_cursor_state_refusals(paths):
    ds = open_ds(paths)
    good = ds.cursor_state().as_dict()
    for bad in [
        {"cursor": 40},
        {"cursor": -1},
        {"cursor": True},
        {"draw_offset": 1 << 64},
        {"draw_offset": 1.0},
        {"epoch_len": 0},
        {"epoch_len": "9"},
    ]:
        with pytest.raises(ConfigError, match="invalid cursor state"):
            ds.cursor_state_from({**good, **bad})
    checked = ds.cursor_state_from(good)
    ds.update_metadata(weighted_view(ds.get_metadata()))
    with pytest.raises(LoaderStateError, match="table changed"):
        ds.restore_cursor_state(checked)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_gets_a_fresh_lock(paths):
    """A lock another parent thread holds at the fork would never be released in the child."""
    ds = open_ds(paths)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with ds._lock:
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    try:
        pid = os.fork()
        if pid == 0:  # child: the lock must be free, and the seam usable
            fresh = ds._lock.acquire(blocking=False)
            if fresh:
                ds._lock.release()
                ds.peek_window()
            os._exit(0 if fresh else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_documented_example_runs():
    """docs/python-api.md, "Integration seam": its Python block runs as pasted."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "python-api.md").read_text()
    block = doc.split("## Integration seam", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "python-api.md", "exec"), {})
