"""The multiprocess reader yields exactly what the in-process reader (`runtime=None`) yields.

Bit-identical samples (data, metadata, cache_id, sample_id) in the same order, whatever the
number of workers, start method or prefetch_size, for ordered and shuffled windows, before and
after update_metadata, for any epoch length, over several caches of every codec, including
empty records, records that split a task and records larger than a ring slot.
"""

from __future__ import annotations

import itertools
import random

import polars as pl
import pytest

import datasetrt as drt
from datasetrt.runtime import run as run_module
from datasetrt.runtime.pool import WorkerPool
from datasetrt.runtime.run import ParallelRun
from tests.runtime.conftest import MiB, active_run, compressible, pair, varied_items, write_cache

RUNTIMES = [("fork", 1), ("fork", 2), ("fork", 3), ("spawn", 1), ("spawn", 2), ("spawn", 3)]
PREFETCH = [1, 7, 64, 4096]


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Three caches, one per codec, several shards each.

    none: 120 records of 0..300 bytes (sample 0 is empty) and one of 4 KiB.
    lz4:  80 small records, four 300 KiB compressible records in a row (they overflow a 1 MiB slot
          together, so tasks split) and one 3 MiB record (larger than a slot: in-process fallback).
    zstd: 60 small records, an empty one, a 3 MiB compressible one, and 2 KiB of noise.
    """
    base = tmp_path_factory.mktemp("parity")
    noise = bytes((i * 131 + 7) % 251 for i in range(2048))
    return {
        "none": write_cache(
            base, "a", varied_items(120, seed=0, tag="a", extra=[bytes(range(256)) * 16]), "none", max_shard_bytes=8192
        ),
        "lz4": write_cache(
            base,
            "b",
            varied_items(
                80, seed=1, tag="b", extra=[compressible(300 << 10, b"p")] * 4 + [compressible(3 * MiB, b"q")]
            ),
            "lz4",
            max_shard_bytes=8192,
        ),
        "zstd": write_cache(
            base,
            "c",
            varied_items(60, seed=2, tag="c", extra=[b"", compressible(3 * MiB + 17, b"r"), noise]),
            "zstd",
            max_shard_bytes=8192,
        ),
    }


@pytest.fixture(scope="module")
def mixed(caches):
    return [caches["none"], caches["lz4"], caches["zstd"]]


def assert_same(got: list, want: list) -> None:
    """Sample lists are identical; on failure name the first differing position, not 3 MiB diffs."""
    assert len(got) == len(want), f"{len(got)} samples, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g != w:
            pytest.fail(
                f"sample {k} differs: got (cache_id={g.cache_id}, sample_id={g.sample_id}, "
                f"{len(g.data)} B, {g.metadata}), expected (cache_id={w.cache_id}, "
                f"sample_id={w.sample_id}, {len(w.data)} B, {w.metadata})"
            )


def epochs(ds, count: int) -> list:
    return [s for _ in range(count) for s in ds]


# -- update_metadata / set_epoch_len scenarios, applied identically to both datasets ----------------


def _weighted(ds):
    md = ds.get_metadata()
    kept = md.filter(pl.col("kept"))
    table = pl.concat([kept, kept.head(7), kept.tail(3), kept.slice(5, 2)])
    ds.update_metadata(table.with_columns(((pl.col("index") % 4 + 1) * 0.75).alias("weight")))


def _filtered_duplicated(ds):
    md = ds.get_metadata()
    ds.update_metadata(pl.concat([md.filter(pl.col("index") % 5 != 2), md.head(4), md.head(4)]))


SCENARIOS = {
    "physical": (lambda ds: None, 2),
    "epoch_len_long": (lambda ds: ds.set_epoch_len(5 * len(ds) + 3), 2),
    "epoch_len_1": (lambda ds: ds.set_epoch_len(1), 5),
    "weighted": (_weighted, 2),
    "filtered_duplicated": (_filtered_duplicated, 2),
    "weighted_epoch_len_long": (lambda ds: (_weighted(ds), ds.set_epoch_len(4 * len(ds) + 1)), 2),
    "weighted_epoch_len_1": (lambda ds: (_weighted(ds), ds.set_epoch_len(1)), 4),
}


# -- tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("prefetch", PREFETCH, ids=lambda p: f"prefetch{p}")
@pytest.mark.parametrize("method,workers", RUNTIMES, ids=[f"{m}{n}" for m, n in RUNTIMES])
def test_mixed_caches_match_in_process_reader(runtimes, mixed, method, workers, prefetch, shuffle):
    ref, par = pair(mixed, runtimes(method, workers), seed=11, shuffle=shuffle, prefetch_size=prefetch)
    assert_same(epochs(par, 2), epochs(ref, 2))


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize(
    "method,workers,prefetch",
    [("fork", 2, 7), ("spawn", 3, 64), ("spawn", 1, 4096)],
    ids=["fork2-p7", "spawn3-p64", "spawn1-p4096"],
)
def test_scenarios_match_in_process_reader(runtimes, mixed, method, workers, prefetch, scenario, shuffle):
    apply, count = SCENARIOS[scenario]
    ref, par = pair(mixed, runtimes(method, workers), seed=2024, shuffle=shuffle, prefetch_size=prefetch)
    assert_same(epochs(par, 1), epochs(ref, 1))  # before, then after the change
    apply(ref)
    apply(par)
    assert len(par) == len(ref)
    assert_same(epochs(par, count), epochs(ref, count))


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_each_codec_matches_in_process_reader(runtimes, caches, codec, shuffle):
    ref, par = pair([caches[codec]], runtimes("spawn", 2), seed=5, shuffle=shuffle, prefetch_size=64)
    assert_same(epochs(par, 2), epochs(ref, 2))


def test_split_tasks_and_oversized_records_take_their_paths(runtimes, mixed, monkeypatch):
    """The lz4 run of 300 KiB records splits tasks; each 3 MiB record is read in-process."""
    seen, inline = [], []
    on_message, inline_chunk = ParallelRun._on_message, ParallelRun._inline_chunk
    monkeypatch.setattr(ParallelRun, "_on_message", lambda self, msg: (seen.append(msg), on_message(self, msg))[1])
    monkeypatch.setattr(
        ParallelRun, "_inline_chunk", lambda self, pos: (inline.append(pos), inline_chunk(self, pos))[1]
    )
    ref, par = pair(mixed, runtimes("fork", 2), seed=3, shuffle=False, prefetch_size=64)
    got, want = list(par), list(ref)
    assert_same(got, want)
    big = [k for k, s in enumerate(want) if len(s.data) >= 3 * MiB]
    assert len(big) == 2 and inline == big
    assert any(m.rows > 0 and m.need_bytes > 0 for m in seen if hasattr(m, "need_bytes")), "no task split"
    assert any(m.rows == 0 and m.need_bytes > 0 for m in seen if hasattr(m, "need_bytes")), "no fallback"


@pytest.mark.parametrize("batch_size", [None, 16], ids=["samples", "batches"])
def test_tasks_carry_rows_and_cover_the_window(runtimes, mixed, monkeypatch, batch_size):
    """Every task a run sends carries at least one row of its window, and together the tasks
    cover the window (a split task's rest is sent again, so ranges may overlap): no empty task
    past the window's end, which would hold a ring slot the consumer never frees in that run."""
    sent = []
    submit = WorkerPool.submit
    monkeypatch.setattr(
        WorkerPool,
        "submit",
        lambda self, run, task: (sent.append((task.first, task.count)), submit(self, run, task))[1],
    )
    ref, par = pair(mixed, runtimes("fork", 2), seed=4, shuffle=False, prefetch_size=64)
    if batch_size is None:
        assert_same(list(par), list(ref))
    else:
        assert sum(len(b) for b in par.iter_batches(batch_size)) == len(ref)
    assert sent, "no task reached the workers"
    assert all(count >= 1 and first >= 0 and first + count <= len(ref) for first, count in sent), sent
    covered = sorted({k for first, count in sent for k in range(first, first + count)})
    in_process = set()  # records larger than a slot are read by the parent, not sent
    if batch_size is None:
        in_process = {k for k, s in enumerate(ref) if len(s.data) >= 3 * MiB}
    assert set(covered) | in_process == set(range(len(ref)))


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_windows_of_one_sample_over_every_position(runtimes, caches, shuffle):
    """epoch_len=1, once per population row: each window is a single task (or a single
    oversized record read in-process)."""
    ref, par = pair([caches["zstd"]], runtimes("fork", 2), seed=6, shuffle=shuffle, prefetch_size=1)
    for ds in (ref, par):
        ds.set_epoch_len(1)
    rounds = len(ref.get_metadata())
    got, want = epochs(par, rounds), epochs(ref, rounds)
    assert_same(got, want)
    assert shuffle or max(len(s.data) for s in got) > 3 * MiB


def interleave(iterators, seed: int) -> list[list]:
    """Advance the iterators in a fixed pseudo-random order until all are exhausted."""
    rng = random.Random(seed)
    out = [[] for _ in iterators]
    live = list(range(len(iterators)))
    while live:
        k = rng.choice(live)
        for _ in range(rng.randint(1, 9)):
            try:
                out[k].append(next(iterators[k]))
            except StopIteration:
                live.remove(k)
                break
    return out


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("method,workers", [("fork", 2), ("spawn", 3)], ids=["fork2", "spawn3"])
def test_interleaved_iterators_on_one_dataset(runtimes, mixed, method, workers, shuffle):
    ref, par = pair(mixed, runtimes(method, workers), seed=9, shuffle=shuffle, prefetch_size=7)
    for ds in (ref, par):
        ds.set_epoch_len(150)
    want = interleave([iter(ref), iter(ref), iter(ref)], seed=1)
    got = interleave([iter(par), iter(par), iter(par)], seed=1)
    for g, w in zip(got, want):
        assert_same(g, w)
    assert want[0] != want[1]  # each iterator reserved its own window


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_interleaved_iterators_on_two_datasets_sharing_a_runtime(runtimes, caches, shuffle):
    rt = runtimes("spawn", 2)
    ref1, par1 = pair([caches["none"], caches["lz4"]], rt, seed=4, shuffle=shuffle, prefetch_size=1)
    ref2, par2 = pair([caches["zstd"]], rt, seed=8, shuffle=shuffle, prefetch_size=64)
    _weighted(ref2)
    _weighted(par2)
    results = []
    for ds1, ds2 in ((ref1, ref2), (par1, par2)):
        its = [iter(ds1), iter(ds2), iter(ds1)]
        firsts = [next(it) for it in its]  # all three runs are open at once
        if ds1 is par1:
            assert len(rt._worker_pool.handlers) == 3
        results.append([[first, *rest] for first, rest in zip(firsts, interleave(its, seed=7))])
    want, got = results
    for g, w in zip(got, want):
        assert_same(g, w)


def test_five_concurrent_datasets_on_one_worker(runtimes, tmp_path):
    """More open datasets than a worker caches readers for (4): none may lose its reader."""
    paths = [write_cache(tmp_path, f"d{k}", varied_items(60, seed=k, tag=f"d{k}")) for k in range(5)]
    results, opened = [], []
    try:
        for runtime in (None, runtimes("fork", 1)):
            datasets = [
                pair([p], runtime, seed=k, shuffle=bool(k % 2), prefetch_size=7)[runtime is not None]
                for k, p in enumerate(paths)
            ]
            for ds in datasets:
                ds.set_epoch_len(3000)  # longer than the ring: every run keeps reading after the 5th opens
            its = [iter(ds) for ds in datasets]
            opened += its
            firsts = [next(it) for it in its]
            results.append([[first, *rest] for first, rest in zip(firsts, interleave(its, seed=3))])
    finally:
        for it in opened:
            it.close()
    want, got = results
    for g, w in zip(got, want):
        assert_same(g, w)


# -- the head start: a fresh runtime reads the head of its first window in-process ----------------


def _flat(batches) -> list[tuple[bytes, int, int]]:
    """(payload, cache_id, sample_id) of every row of `batches`, in order."""
    return [(bytes(b.payload(i)), int(b.cache_id[i]), int(b.sample_id[i])) for b in batches for i in range(len(b))]


def _handed_over(rt, items, head: int):
    """`items` (an iterator of `rt`'s first window): the first `head`, then - once every worker has
    reported ready - the rest. The workers take over inside the window however slowly they start
    (a loaded machine once let the in-process head read all 20,000 samples); where, before `head`,
    still depends on when they become ready."""
    items = iter(items)
    yield from itertools.islice(items, head)
    pool = rt._worker_pool
    while not pool.all_ready:
        pool.poll(60.0, what="worker start-up")  # routes the WorkerReady messages; raises if none comes
    run = active_run(rt)
    yield from items
    assert run._task_ids > 0, "the workers read none of the window: the head went on to its end"


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("scenario", ["plain", "weighted", "batches"])
def test_first_window_on_a_fresh_runtime_hands_over_without_a_seam(mixed, method, scenario, monkeypatch):
    """Whatever the split between the in-process head and the workers (it depends on when they
    become ready), the window is bit-identical to the in-process reader's: weighted draws,
    oversize records (in-process fallback), task splits and batch alignment included. The head
    is read here until a worker has opened the run (it is ready then), and the workers' first
    task starts after it (batches: the first batch is always read before the pool launches;
    spawn: its workers need ~0.1 s to report ready; a fork may be quicker than the first chunk)."""
    firsts, ready_at_first_task = [], []
    submit = WorkerPool.submit

    def recording_submit(self, run, task):
        if not firsts:
            ready_at_first_task.append(any(r is not None for r in self.ready))
        firsts.append(task.first)
        return submit(self, run, task)

    monkeypatch.setattr(WorkerPool, "submit", recording_submit)
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    try:
        ref, par = pair(mixed, rt, seed=13, shuffle=True, prefetch_size=64)
        for ds in (ref, par):
            if scenario == "weighted":
                _weighted(ds)
            ds.set_epoch_len(20_000)
        if scenario == "batches":
            got, want = _flat(_handed_over(rt, par.iter_batches(37), 20)), _flat(ref.iter_batches(37))
            assert len(got) == 20_000 and got == want
        else:
            assert_same(list(_handed_over(rt, par, 500)), list(ref))
        assert rt._worker_pool.all_ready  # the workers took over before the end
        # The head goes on until a worker has opened the run, so the first task goes to a ready one.
        assert ready_at_first_task == [True], "a task was sent while no worker was ready"
        if method == "spawn" or scenario == "batches":
            assert firsts and min(firsts) > 0, "the workers read the window's head: no in-process head start"
    finally:
        rt.close()


def _offered_then_rest(rt, items):
    """`items` (an iterator of `rt`'s window): items until the run has been offered to a worker,
    then - once a worker has reported RunOpened - the rest (waits on the workers' progress, not
    on time: the head stops at its next item, however loaded the machine)."""
    items = iter(items)
    run = None
    for item in items:
        yield item
        run = run or active_run(rt)
        if run._run.workers:
            break
    assert run is not None
    while not run._opened_by:
        rt._worker_pool.poll(60.0, what="the run's opening")
    yield from items


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("scenario", ["samples", "batches"])
@pytest.mark.parametrize("many", [True, False])
def test_a_run_over_many_caches_reads_its_head_until_a_worker_has_opened_it(mixed, method, scenario, many, monkeypatch):
    """On a ready pool, a run over at least HEAD_START_CACHES caches reads the head of its window
    here while the workers open it (offered after the first item): the first task goes out
    only after a worker reported RunOpened, and starts after the head. Below it, the workers
    read the whole window (`start_workers()`'s promise). Either way the window is the
    in-process reader's, bit for bit."""
    monkeypatch.setattr(run_module, "HEAD_START_CACHES", len(mixed) if many else len(mixed) + 1)
    firsts, opened_at_first_task = [], []
    submit = WorkerPool.submit

    def recording_submit(self, run, task):
        if not firsts:
            opened_at_first_task.append(bool(self.handlers[run.run_id].__self__._opened_by))
        firsts.append(task.first)
        return submit(self, run, task)

    monkeypatch.setattr(WorkerPool, "submit", recording_submit)
    rt = drt.DatasetRuntime(num_workers=2, start_method=method)
    try:
        rt.start_workers()
        ref, par = pair(mixed, rt, seed=13, shuffle=True, prefetch_size=64)
        for ds in (ref, par):
            ds.set_epoch_len(5_000)
        if scenario == "batches":
            read = _offered_then_rest(rt, par.iter_batches(37)) if many else par.iter_batches(37)
            got, want = _flat(read), _flat(ref.iter_batches(37))
            assert len(got) == 5_000 and got == want
        else:
            assert_same(list(_offered_then_rest(rt, par) if many else par), list(ref))
        assert firsts, "the workers read none of the window"
        if many:
            assert opened_at_first_task == [True], "a task was sent before any worker had opened the run"
            assert min(firsts) > 0, "no in-process head start"
        else:
            assert min(firsts) == 0, "a ready pool's run over few caches read its head in-process"
    finally:
        rt.close()
