"""sampling="locality" under several ranks (to_torch_dataloader / to_torch_batches with RANK and
WORLD_SIZE): each epoch is re-planned so that each rank reads its own shards, every record once
per epoch over all ranks with equal batch counts, exact resume per rank and elastic resume (the
rest of an epoch keeps the order it started with, divided among the new ranks)."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import datasetrt as drt  # noqa: E402
from datasetrt.integrations.torch.plan import rank_count  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
SIZES = {"a": 230, "b": 170}  # 400 records in 44 shards of about 9
SHARD_BYTES = 2 << 10
WINDOW = 2


def ids(batch) -> list[list[int]]:
    return [[s.cache_id, s.sample_id] for s in batch]


@pytest.fixture
def paths(write_caches):
    return [str(p) for p in write_caches(SIZES, max_shard_bytes=SHARD_BYTES)]


def open_ds(paths, runtime=None):
    config = drt.ReaderConfig(seed=0, sampling="locality", window_shards=WINDOW)
    return drt.CachedDataset(paths, reader_config=config, runtime=runtime)


def at_rank(monkeypatch, rank, world):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def loader(monkeypatch, paths, rank, world, batches=False, **kw):
    at_rank(monkeypatch, rank, world)
    args = {"seed": 4, "num_workers": 0, "verbose": False, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ds = open_ds(paths)
        if batches:
            args.pop("verbose")
            return ds.to_torch_batches(args.pop("batch_size"), **args)
        return ds.to_torch_dataloader(collate_fn=ids, **args)


def epochs_of(dl, n=2) -> list[list[list[list[int]]]]:
    out = []
    for _ in range(n):
        out.append([b if isinstance(b, list) else _batch_ids(b) for b in dl])
    return out


def _batch_ids(item) -> list[list[int]]:
    return [[int(c), int(s)] for c, s in zip(item["cache_id"], item["sample_id"])]


def shard_of(paths) -> dict[tuple[int, int], int]:
    """(cache_id, sample_id) -> a shard id unique across the caches, from each index.bin."""
    ds = open_ds(paths)
    table = ds.get_metadata()
    shards = ds._reads.row_shards(ds._population)
    return dict(zip(zip(table["cache_id"].to_list(), table["sample_id"].to_list()), shards.tolist()))


def samples(batches) -> list[tuple[int, int]]:
    return [tuple(s) for b in batches for s in b]


@pytest.mark.parametrize(("world", "batch", "drop_last"), [(2, 8, False), (3, 5, False), (4, 4, True)])
def test_each_rank_reads_its_own_shards_and_every_record_once_per_epoch(monkeypatch, paths, world, batch, drop_last):
    shards = shard_of(paths)
    every = sorted(shards)
    n = len(every)
    single = epochs_of(loader(monkeypatch, paths, 0, 1, batch_size=batch, drop_last=drop_last))
    runs = [
        epochs_of(loader(monkeypatch, paths, r, world, batch_size=batch, drop_last=drop_last)) for r in range(world)
    ]
    per = rank_count(rank_count(n, 1, batch, drop_last), world, batch, drop_last)
    for e in range(2):
        mine = [samples(runs[r][e]) for r in range(world)]
        assert {len(runs[r][e]) for r in range(world)} == {-(-per // batch)}  # equal batch counts
        assert all(len(m) == per for m in mine)
        together = Counter(s for m in mine for s in m)
        if drop_last:
            assert set(together.values()) == {1} and len(together) == world * per  # no record twice
        else:
            assert set(together) == set(every)  # every record; the padding re-reads the epoch's first ones
            assert sum(together.values()) - n == world * per - n
        touched = [len({shards[s] for s in m}) for m in mine]
        alone = len({shards[s] for s in samples(single[e])})
        # world=1 touches every shard; a rank touches its share of them and a few it spills into
        assert alone == len(set(shards.values()))
        assert max(touched) <= alone // world + 2 * WINDOW + 2, (touched, alone)
    assert runs[0][0] != runs[0][1]  # a new order every epoch


def test_to_torch_batches_and_dataloader_workers_read_the_same_rank_batches(monkeypatch, paths):
    base = [epochs_of(loader(monkeypatch, paths, r, 2, batch_size=8)) for r in range(2)]
    typed = [epochs_of(loader(monkeypatch, paths, r, 2, batches=True, batch_size=8)) for r in range(2)]
    assert typed == base
    forked = epochs_of(
        loader(monkeypatch, paths, 1, 2, batch_size=8, num_workers=2, multiprocessing_context="fork"), n=3
    )
    assert forked[:2] == base[1]
    spawned = loader(monkeypatch, paths, 0, 2, batch_size=8, num_workers=1, multiprocessing_context="spawn")
    assert epochs_of(spawned, n=1) == base[0][:1]


def resume(monkeypatch, paths, state, rank, world, epochs=2, **kw):
    dl = loader(monkeypatch, paths, rank, world, **kw)
    dl.load_state_dict(json.loads(json.dumps(state)))
    return epochs_of(dl, epochs)


def test_resume_is_exact_per_rank_and_elastic_resume_keeps_the_epoch_s_order(monkeypatch, paths):
    kw = {"batch_size": 8}
    full = [epochs_of(loader(monkeypatch, paths, r, 2, **kw)) for r in range(2)]
    states = []
    for r in range(2):
        dl = loader(monkeypatch, paths, r, 2, **kw)
        it = iter(dl)
        head = [next(it) for _ in range(6)]
        states.append(dl.state_dict())
        assert states[-1]["rows"] == 6 * 2 * 8 and "plan_world" not in states[-1]
        rest = resume(monkeypatch, paths, states[-1], r, 2, **kw)
        assert [head + rest[0], rest[1]] == full[r]  # exact, on the same world size
    consumed = [s for r in range(2) for s in samples(full[r][0][:6])]
    every = {s for r in range(2) for s in samples(full[r][0])}
    for world in (3, 1):  # another world size: the rest of epoch 0 in its 2-rank order, then new epochs
        rest = [resume(monkeypatch, paths, states[0], r, world, **kw) for r in range(world)]
        read = Counter(consumed + [s for r in range(world) for s in samples(rest[r][0])])
        assert set(read) == every and sum(read.values()) - len(every) < world * 8  # only padding twice
        fresh = [epochs_of(loader(monkeypatch, paths, r, world, **kw)) for r in range(world)]
        assert all(rest[r][1] == fresh[r][1] for r in range(world))  # epoch 1: planned for `world` ranks
    dl = loader(monkeypatch, paths, 2, 3, **kw)
    dl.load_state_dict(states[0])
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    assert state["plan_world"] == 2 and state["world_size"] == 3 and state["rows"] == 96 + 3 * 8
    again = resume(monkeypatch, paths, state, 0, 1, epochs=1, **kw)
    mid = [s for r in range(3) for s in samples(resume(monkeypatch, paths, states[0], r, 3, epochs=1, **kw)[0][:1])]
    read = Counter(consumed + mid + samples(again[0]))
    assert set(read) == every and set(read.values()) == {1}  # 2 ranks, then 3, then 1: each record once


def test_positions_other_than_an_epoch_read_the_plain_order(monkeypatch, paths):
    """samples_per_epoch other than len(ds): passes are not epochs, so ranks interleave batches of
    the dataset's locality order (exactly as before), never a rank-local one."""
    kw = {"batch_size": 4, "samples_per_epoch": 100}
    single = samples(epochs_of(loader(monkeypatch, paths, 0, 1, **kw), n=1)[0])
    ranks = [samples(epochs_of(loader(monkeypatch, paths, r, 2, **kw), n=1)[0]) for r in range(2)]
    assert [single[k : k + 4] for k in range(0, 96, 8)] == [ranks[0][k : k + 4] for k in range(0, 48, 4)]
    assert np.array_equal(np.sort(np.array(single), axis=0), np.sort(np.array(ranks[0] + ranks[1]), axis=0))
