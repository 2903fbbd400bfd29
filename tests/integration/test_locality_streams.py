"""Mixtures and curricula under ReaderConfig(sampling="locality"): each stream reads its
exactly-once epochs a window of its own shards at a time, the same through iter(ds),
iter_batches and reader worker processes, resumable exactly (the state names the order)."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import SamplingConfigError, SamplingStateError
from datasetrt.sampling import Curriculum, CurriculumPlan, Mixture, MixturePlan, Stage, Stream, StreamRows
from datasetrt.sampling.locality import Locality

SIZES = {"a": 60, "b": 110, "c": 45}
SHARD_BYTES = 2 << 10  # a few records per shard: many shards per cache
WINDOW = 2


def ids(samples) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in samples]


def batch_ids(batches) -> list[tuple[int, int]]:
    return [(int(c), int(s)) for b in batches for c, s in zip(b.cache_id, b.sample_id)]


def open_ds(paths, seed=13, sampling="locality", runtime=None, window=WINDOW, **kw):
    config = drt.ReaderConfig(seed=seed, sampling=sampling, window_shards=window, **kw)
    return drt.CachedDataset(paths, reader_config=config, runtime=runtime)


def streams(paths) -> dict[str, Stream]:
    return {"a": Stream.by_cache(paths[0]), "bc": Stream.by_cache(paths[1], paths[2])}


def mixture(paths) -> Mixture:
    return Mixture({"a": 0.25, "bc": 0.75}, streams(paths))


def curriculum(paths) -> Curriculum:
    s = streams(paths)
    return Curriculum(
        [
            Stage(Mixture({"a": 1}, s), batches=5, name="warmup"),
            Stage(Mixture({"a": 0.5, "bc": 0.5}, s), batches=20, name="main"),
            Stage(Mixture({"bc": 1}, s), name="anneal"),
        ],
        batch_size=4,
    )


@pytest.fixture
def paths(write_caches):
    return write_caches(SIZES, max_shard_bytes=SHARD_BYTES)


def table_rows(ds) -> tuple[list[tuple[int, int]], dict[str, np.ndarray]]:
    """(cache_id, sample_id) of each population row and the rows of each stream."""
    table = ds.get_metadata()
    every = list(zip(table["cache_id"].to_list(), table["sample_id"].to_list()))
    cache_ids = table["cache_id"].unique(maintain_order=True).to_list()
    column = np.array([c for c, _ in every], dtype=np.uint64)
    rows = {"a": np.flatnonzero(column == cache_ids[0]), "bc": np.flatnonzero(np.isin(column, cache_ids[1:]))}
    return every, rows


def test_a_mixture_reads_each_stream_a_window_of_its_shards_at_a_time(paths):
    ds = open_ds(paths)
    ds.set_mixture(mixture(paths))
    identity = ds.order_identity()
    assert identity.startswith(f"mixture+locality:{WINDOW}:")
    plain = open_ds(paths, sampling="permutation")
    plain.set_mixture(mixture(paths))
    assert plain.order_identity().startswith("mixture:") and plain.order_identity() != identity
    every, rows = table_rows(ds)
    shards = ds._reads.row_shards(ds._population)
    n = 4 * len(ds)
    got = ids(ds) + ids(ds) + batch_ids(ds.iter_batches(7)) + batch_ids(ds.iter_batches(16))
    plan = MixturePlan(mixture(paths), StreamRows(rows), 13, locality=Locality(WINDOW, shards))
    assert got == [every[r] for r in plan.rows(0, n).tolist()]
    assert got[: len(ds)] != ids(plain)  # the mixture no longer ignores sampling="locality"
    index = {key: i for i, key in enumerate(every)}
    picked = np.array([index[key] for key in got])
    for name, stream in zip(plan.names, plan._finish):
        mine = picked[np.isin(picked, rows[name])]
        size = len(rows[name])
        assert len(set(shards[rows[name]].tolist())) > 2 * WINDOW  # many windows per stream epoch
        for e in range(len(mine) // size):
            epoch = mine[e * size : (e + 1) * size]
            assert sorted(epoch.tolist()) == rows[name].tolist()  # each row once per stream epoch
            _order, starts = stream.order.epoch_layout(e)
            for j in range(len(starts) - 1):  # a stream window reads at most WINDOW of its shards
                assert len(set(shards[epoch[starts[j] : starts[j + 1]]].tolist())) <= WINDOW


def test_a_weighted_mixture_is_refused_and_nothing_changes(paths):
    ds = open_ds(paths)
    before = ids(open_ds(paths))
    with pytest.raises(SamplingConfigError, match="order='weighted'"):
        ds.set_mixture(Mixture({"a": 0.5, "bc": 0.5}, streams(paths), order="weighted"))
    assert ds.mixture is None and ids(ds) == before


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reader_workers_read_the_same_mixture_and_curriculum(paths, start_method):
    local, local_cur = open_ds(paths), open_ds(paths)
    local.set_mixture(mixture(paths))
    local_cur.set_curriculum(curriculum(paths))
    with drt.DatasetRuntime(num_workers=2, start_method=start_method) as rt:
        assert len(rt.start_workers()) == 2
        mixed, staged = open_ds(paths, runtime=rt, prefetch_size=4), open_ds(paths, runtime=rt, prefetch_size=4)
        mixed.set_mixture(mixture(paths))
        staged.set_curriculum(curriculum(paths))
        assert mixed.reads_with_workers and staged.reads_with_workers
        for _ in range(2):
            assert ids(mixed) == ids(local)
            assert batch_ids(mixed.iter_batches(5)) == batch_ids(local.iter_batches(5))
            assert batch_ids(staged.iter_batches(4)) == ids(local_cur)


def test_a_curriculum_reads_the_plan_and_resumes_exactly(paths):
    ds = open_ds(paths)
    ds.set_curriculum(curriculum(paths))
    assert ds.order_identity().startswith(f"curriculum+locality:{WINDOW}:")
    every, rows = table_rows(ds)
    plan = CurriculumPlan(
        curriculum(paths), StreamRows(rows), 13, locality=Locality(WINDOW, ds._reads.row_shards(ds._population))
    )
    expected = [every[r] for r in plan.rows(0, 3 * len(ds)).tolist()]
    seen, state = [], None
    for batch in ds.iter_batches(4):
        seen += batch_ids([batch])
        if len(seen) == 92:  # mid "main"
            state = ds.state_dict()
    seen += ids(ds)
    assert seen == expected[: 2 * len(ds)]
    assert state is not None and state["sampling"] == ds.order_identity()
    assert state["plan"]["locality"]["window_blocks"] == WINDOW
    resumed = open_ds(paths)
    resumed.set_curriculum(curriculum(paths))
    resumed.load_state_dict(state)
    rest = batch_ids(resumed.iter_batches(4))
    assert rest == expected[92 : len(ds)]
    for other in (open_ds(paths, sampling="permutation"), open_ds(paths, window=3)):
        other.set_curriculum(curriculum(paths))
        with pytest.raises(SamplingStateError, match="another order"):
            other.load_state_dict(state)


def test_torch_loaders_read_the_mixture_s_locality_order_in_spawned_workers(paths):
    pytest.importorskip("torch")
    ds = open_ds(paths)
    ds.set_mixture(mixture(paths))

    def batches(**kw):
        dl = ds.to_torch_dataloader(seed=3, batch_size=6, verbose=False, collate_fn=ids, **kw)
        return [list(dl) for _ in range(2)]

    main = batches(num_workers=0)
    assert batches(num_workers=1, multiprocessing_context="spawn") == main
    every, rows = table_rows(ds)
    first = [key for batch in main[0] for key in batch]
    for stream_rows in rows.values():  # each stream's rows once per stream epoch
        mine = [key for key in first if key in {every[i] for i in stream_rows}]
        size = len(stream_rows)
        assert len(set(mine[:size])) == len(mine[:size]) and len(mine) > size // 2
    state = ds.to_torch_dataloader(seed=3, batch_size=6, verbose=False).state_dict()
    assert state["sampling"] == ds.order_identity() and state["sampling"].startswith("mixture+locality:")
