"""The torch integration over exactly-once orders and mixtures: passes cut from the plan for
DataLoader workers (fork, spawn) and ranks, each row once per epoch across ranks, exact resume of
loaders and of `iter(ds)` passes (`to_torch_iterable_dataset().state_dict()`)."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import datasetrt as drt  # noqa: E402
from datasetrt._native.draws import derive_seed  # noqa: E402
from datasetrt.errors import ConfigError  # noqa: E402
from datasetrt.integrations.torch import to_torch_iterable_dataset  # noqa: E402
from datasetrt.sampling import Curriculum, EpochPermutation, Mixture, Stage, Stream  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
SIZES = {"t0": 24, "t1": 3, "t2": 13}  # 40 rows


def keys(batch) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in batch]


@pytest.fixture
def paths(write_caches):
    return [str(p) for p in write_caches(SIZES)]


def mixture(paths) -> Mixture:
    return Mixture(
        {"big": 0.5, "tiny": 0.25, "mid": 0.25},
        {"big": Stream.by_cache(paths[0]), "tiny": Stream.by_cache(paths[1]), "mid": Stream.by_cache(paths[2])},
    )


def curriculum(paths) -> Curriculum:
    mix = mixture(paths)
    return Curriculum(
        [
            Stage(Mixture({"tiny": 1}, dict(mix.streams)), batches=2),
            Stage(mix, samples=12),
            Stage(Mixture({"big": 0.5, "mid": 0.5}, dict(mix.streams))),
        ],
        batch_size=4,
    )


def open_ds(paths, mixed=False, seed=0):
    """mixed: False (exactly-once order), True (a mixture) or "curriculum"."""
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=seed, sampling="permutation"))
    if mixed == "curriculum":
        ds.set_curriculum(curriculum(paths))
    elif mixed:
        ds.set_mixture(mixture(paths))
    return ds


def loader(ds, **kw):
    return ds.to_torch_dataloader(
        **{"verbose": False, "collate_fn": keys, "num_workers": 0, "seed": 5, "batch_size": 4, **kw}
    )


def epochs(dl, n=2) -> list[list[tuple[int, int]]]:
    return [[k for b in dl for k in b] for _ in range(n)]


def every(ds) -> list[tuple[int, int]]:
    table = ds.get_metadata()
    return list(zip(table["cache_id"].to_list(), table["sample_id"].to_list()))


def test_loader_passes_are_exactly_once_epochs_of_the_plan(paths):
    ds = open_ds(paths)
    rows = every(ds)
    got = epochs(loader(ds), 3)
    plan = EpochPermutation(derive_seed(5, 0, 0), len(rows))
    for e, epoch in enumerate(got):
        assert epoch == [rows[r] for r in plan.rows(e * len(rows), len(rows)).tolist()]
    assert got[0] != got[1] and sorted(got[2]) == sorted(rows)
    split = epochs(loader(ds, worker_partition="split"), 2)  # dataset-rt's split selection, then the order
    assert all(sorted(e) == sorted(rows) for e in split) and split[0] != split[1]


@pytest.mark.parametrize("mixed", [False, True, "curriculum"], ids=["permutation", "mixture", "curriculum"])
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_yield_the_serial_batches(paths, mixed, context, tmp_path):
    ds = open_ds(paths, mixed)
    expected = epochs(loader(ds), 3)
    got = epochs(loader(ds, num_workers=2, multiprocessing_context=context, work_dir=tmp_path), 3)
    assert got == expected
    if mixed == "curriculum":  # pass 0: 8 of the tiny stream, then 12 of the mixture, then the last stage
        big, tiny, mid = ds.cache_identity().cache_ids.tolist()
        assert {c for c, _ in got[0][:8]} == {tiny} and {c for e in got[1:] for c, _ in e} == {big, mid}
    elif mixed:  # every pass of 40 holds exactly 20 / 10 / 10 of the streams
        big, tiny, mid = ds.cache_identity().cache_ids.tolist()
        for epoch in got:
            assert Counter(c for c, _ in epoch) == {big: 20, tiny: 10, mid: 10}
    else:
        assert all(sorted(e) == sorted(every(ds)) for e in got)


def rank_epochs(monkeypatch, paths, world, mixed=False, **kw):
    out = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out.append(epochs(loader(open_ds(paths, mixed), **kw), 2))
    return out


@pytest.mark.parametrize("mixed", [False, True], ids=["permutation", "mixture"])
def test_two_ranks_are_disjoint_and_cover_each_epoch_once(monkeypatch, paths, mixed):
    single = epochs(loader(open_ds(paths, mixed)), 2)
    ranks = rank_epochs(monkeypatch, paths, 2, mixed)
    for e in range(2):
        a, b = ranks[0][e], ranks[1][e]
        assert len(a) == len(b) == 20
        assert Counter(a + b) == Counter(single[e])  # the single-rank pass, divided
        if not mixed:  # (a mixture's 3-row stream repeats its rows within a pass)
            assert not set(a) & set(b) and sorted(a + b) == sorted(every(open_ds(paths)))
    padded = rank_epochs(monkeypatch, paths, 3, batch_size=3)  # 40 rows: 14 per rank, 2 read twice
    for e in range(2):
        seen = Counter(k for r in range(3) for k in padded[r][e])
        assert set(seen) == set(every(open_ds(paths))) and sum(seen.values()) == 42
        assert sorted(seen.values()).count(2) == 2


def consume(dl, n):
    out = []
    while len(out) < n:
        for b in dl:
            out.append(b)
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("mixed", [False, True, "curriculum"], ids=["permutation", "mixture", "curriculum"])
def test_loader_resume_at_several_points(paths, mixed):
    ds = open_ds(paths, mixed)
    full = consume(loader(ds, batch_size=3), 35)  # 14 batches per pass: two passes and a half
    for cut in (0, 1, 7, 13, 14, 20, 29):
        dl = loader(ds, batch_size=3)
        head = consume(dl, cut)
        state = json.loads(json.dumps(dl.state_dict()))
        again = loader(ds, batch_size=3)
        again.load_state_dict(state)
        assert head + consume(again, 35 - cut) == full
    with_workers = loader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork")
    head = consume(with_workers, 9)
    again = loader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork")
    again.load_state_dict(with_workers.state_dict())
    assert head + consume(again, 26) == full


def test_loader_state_of_another_order_is_refused(paths):
    state = loader(open_ds(paths, mixed=True)).state_dict()
    assert state["sampling"].startswith("mixture:")
    for other in (open_ds(paths), drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=0))):
        with pytest.raises(ConfigError, match="the sampling order"):
            loader(other).load_state_dict(state)
    plain = loader(drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=0))).state_dict()
    assert "sampling" not in plain  # draws-mode states are unchanged
    with pytest.raises(ConfigError, match="the sampling order"):
        loader(open_ds(paths)).load_state_dict(plain)


@pytest.mark.parametrize("mixed", [False, True], ids=["permutation", "mixture"])
def test_iter_ds_passes_resume_mid_epoch(paths, mixed):
    """`to_torch_iterable_dataset()` in the main process is iter(ds): its state resumes a pass
    mid-epoch, and the next passes are the next epochs."""
    reference = open_ds(paths, mixed)
    full = [keys(reference) for _ in range(3)]
    for cut in (0, 1, 17, 39):
        tds = open_ds(paths, mixed).to_torch_iterable_dataset()
        it = iter(tds)
        head = [(s.cache_id, s.sample_id) for _, s in zip(range(cut), it)]
        state = json.loads(json.dumps(tds.state_dict()))
        resumed = open_ds(paths, mixed).to_torch_iterable_dataset()
        resumed.load_state_dict(state)
        rest = [keys(resumed) for _ in range(3)]
        assert head + rest[0] == full[0] and rest[1:] == full[1:]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_iterable_dataset_workers_read_one_epoch(paths, context):
    ds = open_ds(paths, mixed=True)
    serial = keys(open_ds(paths, mixed=True))
    dl = torch.utils.data.DataLoader(
        to_torch_iterable_dataset(ds, block_rows=4),
        batch_size=4,
        num_workers=2,
        collate_fn=keys,
        multiprocessing_context=context,
    )
    assert [k for b in dl for k in b] == serial
