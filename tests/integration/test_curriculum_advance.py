"""A dataset reading a curriculum: `advance()` at a batch boundary the consumer has not read,
stages reported by batches and positions, and `state_dict()` / `load_state_dict()` resuming
bit-identically to the uninterrupted run (mid-stage, across stages, after an advance), in-process
and with 2 reader worker processes that planned batches ahead (datasetrt/dataset/stages.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import LoaderStateError, SamplingStateError
from datasetrt.sampling import Curriculum, CurriculumPlan, Mixture, Stage, StageInfo, Stream, StreamRows

SIZES = {"a": 7, "b": 13, "c": 1, "d": 30, "e": 9}  # len(ds) = 60 positions per window
B = 4  # the curriculum's batch size


def curriculum(paths) -> Curriculum:
    streams = {
        "small": Stream.by_cache(paths[2]),
        "big": Stream.by_cache(paths[3]),
        "rest": Stream.by_cache(paths[0], paths[1], paths[4]),
    }
    return Curriculum(
        [
            Stage(Mixture({"small": 1}, streams), batches=3, name="warmup"),  # [0, 12)
            Stage(Mixture({"big": 0.5, "rest": 0.5}, streams), samples=40, name="main"),  # [12, 52)
            Stage(Mixture({"rest": 1}, streams), name="anneal"),
        ],
        batch_size=B,
    )


@pytest.fixture(params=[0, 2], ids=["in-process", "2-reader-workers"])
def readers(request):
    """None (in-process reads) or a runtime with 2 reader worker processes, started."""
    if not request.param:
        yield None
        return
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    rt.start_workers()
    yield rt
    rt.close()


def open_ds(paths, readers=None):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=8, prefetch_size=64), runtime=readers)
    ds.set_curriculum(curriculum(paths))
    return ds


def reference(ds, paths):
    """The curriculum's plan over ds's table, and the (cache_id, sample_id) of each table row."""
    table = ds.get_metadata()
    every = list(zip(table["cache_id"].to_list(), table["sample_id"].to_list()))
    cache_ids = table["cache_id"].unique(maintain_order=True).to_list()
    column = np.array([c for c, _ in every], dtype=np.uint64)
    rows = {
        name: np.flatnonzero(np.isin(column, [cache_ids[k] for k in ks]))
        for name, ks in (("small", [2]), ("big", [3]), ("rest", [0, 1, 4]))
    }
    return CurriculumPlan(curriculum(paths), StreamRows(rows), seed=8), every


def batch_ids(batch) -> list[tuple[int, int]]:
    return [(int(c), int(s)) for c, s in zip(batch.cache_id, batch.sample_id)]


def read_batches(ds, windows, advance_after=(), state_after=(), states=None):
    """`windows` windows of iter_batches(B): per batch (stage, ids). ds.advance() after the
    batches counted in `advance_after`, then ds.state_dict() into `states` after those in `state_after`."""
    out, n = [], 0
    for _ in range(windows):
        for batch in ds.iter_batches(B, with_metadata=False):
            out.append((batch.stage, batch_ids(batch)))
            n += 1
            if n in advance_after:
                ds.advance()
            if n in state_after:
                states[n] = json.loads(json.dumps(ds.state_dict()))  # plain values
    return out


def test_advance_mid_stage_ends_it_at_the_next_batch_boundary_in_process(write_caches):
    paths = write_caches(SIZES)
    ds = open_ds(paths)
    plan, every = reference(ds, paths)
    assert ds.stage == StageInfo(0, "warmup") and ds.read_position == 0
    it = iter(ds)
    got = [next(it) for _ in range(18)]  # 18 samples: inside "main" ([12, 52)), mid-batch
    assert ds.read_position == 18 and ds.stage == StageInfo(1, "main")
    assert ds.stage_at(ds.read_position - 1) == StageInfo(1, "main")  # the sample just handed out
    assert ds.advance() == 20  # the first batch boundary at or after 18
    assert ds.stage == StageInfo(1, "main") and ds.stage_at(20) == StageInfo(2, "anneal")
    got += list(it)
    assert plan.advance(18) == 20
    assert [(s.cache_id, s.sample_id) for s in got] == [every[r] for r in plan.rows(0, 60).tolist()]
    assert ds.stage == StageInfo(2, "anneal")
    with pytest.raises(SamplingStateError, match="last stage"):
        ds.advance()
    # the refusal changed nothing: the next window continues the same plan
    assert [(s.cache_id, s.sample_id) for s in ds] == [every[r] for r in plan.rows(60, 60).tolist()]


def test_batches_say_their_stage_and_advance_drops_batches_planned_ahead(write_caches, readers):
    paths = write_caches(SIZES)
    ds = open_ds(paths, readers)
    plan, every = reference(ds, paths)
    got = read_batches(ds, 2, advance_after=(4,))  # after 4 batches: position 16, in "main"
    assert plan.advance(16) == 16  # the consumer's next unread position is a boundary: at once
    assert [ids for _, ids in got] == [[every[r] for r in plan.rows(B * k, B).tolist()] for k in range(30)]
    stages = [stage.name for stage, _ in got]
    assert stages == ["warmup"] * 3 + ["main"] + ["anneal"] * 26
    assert [stage.index for stage, _ in got[:5]] == [0, 0, 0, 1, 2]
    if readers is not None:
        assert readers._worker_pool.handlers == {}  # the run planned before advance() was closed


def test_resume_is_bit_identical_mid_stage_across_stages_and_after_advance(write_caches, readers):
    paths = write_caches(SIZES)
    states: dict[int, dict] = {}
    # uninterrupted: 2 windows (30 batches), advance() after batch 5 (position 20, in "main");
    # states mid-"warmup", mid-"main" before advance(), right after it, in "anneal", in window 2
    full = read_batches(open_ds(paths, readers), 2, advance_after=(5,), state_after=(2, 4, 5, 7, 20), states=states)
    assert [s.name for s, _ in full[:7]] == ["warmup"] * 3 + ["main"] * 2 + ["anneal"] * 2
    for n, state in states.items():
        resumed = open_ds(paths, readers)
        resumed.load_state_dict(state)
        assert resumed.read_position == B * n
        left = 15 - n % 15  # batches left in the window the state was taken in
        # a state taken before advance() does not hold it: the resumed run calls it where the first did
        again = (5 - n,) if n < 5 else ()
        tail = read_batches(resumed, 1, advance_after=again)
        assert len(tail) == left
        tail += read_batches(resumed, 2 - (n + left) // 15, advance_after=())
        assert tail == full[n:], n


def test_per_sample_resume_mid_batch_after_advance(write_caches, readers):
    paths = write_caches(SIZES)
    ds = open_ds(paths, readers)
    it = iter(ds)
    head = [next(it) for _ in range(18)]
    assert ds.advance() == 20
    state = ds.state_dict()
    assert state["position"] == 18 and state["window_end"] == 60 and state["plan"]["stage_end"] == 20
    rest = list(it) + list(ds)
    resumed = open_ds(paths, readers)
    resumed.load_state_dict(state)
    assert list(resumed) + list(resumed) == rest  # the rest of the window, then the next one
    assert len(head) + len(rest) == 120


def test_bad_calls_raise_typed_errors_and_leave_the_dataset_usable(write_caches):
    paths = write_caches(SIZES)
    plain = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=8))
    assert plain.stage is None and plain.read_position is None and plain.stage_at(0) is None
    for call in (plain.advance, plain.state_dict, lambda: plain.load_state_dict({})):
        with pytest.raises(SamplingStateError, match="needs a curriculum"):
            call()
    ds = open_ds(paths)
    expected = [(s.cache_id, s.sample_id) for s in open_ds(paths)]
    state = ds.state_dict()
    other = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=9))
    other.set_curriculum(curriculum(paths))
    with pytest.raises(SamplingStateError, match="seed differ"):
        other.load_state_dict(state)
    with pytest.raises(SamplingStateError, match="another order"):
        ds.load_state_dict({**state, "sampling": "curriculum:0"})
    with pytest.raises(SamplingStateError, match="not at its position"):
        ds.load_state_dict({**state, "position": 4})
    it = iter(ds)
    next(it)
    with pytest.raises(SamplingStateError, match="still reading"):
        ds.load_state_dict(state)
    assert [(s.cache_id, s.sample_id) for s in ds] != []  # a new iterator reads the next window
    it.close()
    fresh = open_ds(paths)
    fresh.load_state_dict(state)
    assert [(s.cache_id, s.sample_id) for s in fresh] == expected


def test_a_torch_iterable_dataset_over_the_curriculum_refuses_advance(write_caches):
    pytest.importorskip("torch")
    paths = write_caches(SIZES)
    ds = open_ds(paths)
    torch_ds = ds.to_torch_iterable_dataset()
    with pytest.raises(LoaderStateError, match="advance\\(\\) cannot change"):
        ds.advance()
    with pytest.raises(LoaderStateError, match="DataLoader workers"):
        torch_ds.advance()
    del torch_ds
    assert ds.advance() == 0  # nothing read yet: "warmup" ends before its first batch
    assert ds.stage == StageInfo(1, "main")
    loader = ds.to_torch_dataloader(batch_size=B)
    with pytest.raises(LoaderStateError, match="own copy of the curriculum"):
        loader.advance()
