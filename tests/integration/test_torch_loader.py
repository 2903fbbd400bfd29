"""`CachedDataset.to_torch_dataloader(...)`: dataset-rt 0.4.8's arguments and messages, the same
batches as dataset-rt with num_workers=0, the same batches with any number of fork/spawn workers,
and exact resume through `state_dict()` / `load_state_dict()`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

import datasetrt as drt  # noqa: E402
from datasetrt._native import draws  # noqa: E402
from datasetrt.errors import ConfigError, DatasetRTError  # noqa: E402
from datasetrt.integrations.torch import LoaderStateError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
QUIET = {"verbose": False, "collate_fn": None}


def keys(batch) -> list[tuple]:
    return [(s.cache_id, s.sample_id, s.data) for s in batch]


def as_list(batch):
    return list(batch)


def with_worker(sample):
    """sample_transform_fn run in the worker: what it read, and that worker's derived seed."""
    info = get_worker_info()
    return (sample.cache_id, sample.sample_id, info.id if info else -1, info.dataset.worker_seed if info else None)


def weighted_view(df: pl.DataFrame) -> pl.DataFrame:
    base = df.filter(pl.col("kept")).with_columns(weight=pl.col("score") + 1.0)
    return pl.concat([base, base.filter(pl.col("index") % 4 == 0)])


@pytest.fixture
def paths(write_caches):
    return write_caches({"l0": 29, "l1": 14})


def open_ds(paths, *, update=False, epoch_len=None, runtime=None):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=0), runtime=runtime)
    if update:
        ds.update_metadata(weighted_view(ds.get_metadata()))
    if epoch_len is not None:
        ds.set_epoch_len(epoch_len)
    return ds


def run(loader, epochs=2) -> list[list[tuple]]:
    return [keys(b) for _ in range(epochs) for b in loader]


def loader(ds, **kw):
    kw = {"verbose": False, "collate_fn": as_list, "num_workers": 0, **kw}
    return ds.to_torch_dataloader(**kw)


CONFIGS = [
    {"seed": 3, "batch_size": 4},
    {"shuffle": False, "batch_size": 5},
    {"seed": 11, "worker_partition": "split", "batch_size": 3},
    {"shuffle": False, "batch_size": 6, "drop_last": True},
    {"seed": 5, "worker_partition": "split", "batch_size": 4, "drop_last": True},
    {"seed": 2**64 - 1, "batch_size": 8, "samples_per_epoch": 50},
    {"shuffle": False, "worker_partition": "replicate", "batch_size": 7, "samples_per_epoch": 30},
]


# -- dataset-rt parity (num_workers=0) ------------------------------------------------------------


@pytest.mark.interop
@pytest.mark.parametrize("update", [False, True])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_same_batches_as_dataset_rt(paths, config, update):
    rt = pytest.importorskip("dataset_rt")
    theirs = rt.DatasetRuntime(num_workers=1).cached_dataset(paths, reader_config=rt.ReaderConfig(seed=0))
    ours = open_ds(paths)
    for ds in (theirs, ours):
        if update:
            ds.update_metadata(weighted_view(ds.get_metadata()))
        if "samples_per_epoch" not in config:
            ds.set_epoch_len(31)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = run(loader(theirs, **config), epochs=3)
        got = run(loader(ours, **config), epochs=3)
    assert got == expected


@pytest.mark.interop
def test_default_collate_matches_dataset_rt(paths):
    rt = pytest.importorskip("dataset_rt")
    theirs = rt.DatasetRuntime(num_workers=1).cached_dataset(paths, reader_config=rt.ReaderConfig(seed=0))
    a = next(iter(theirs.to_torch_dataloader(num_workers=0, seed=4, batch_size=5, verbose=False)))
    b = next(iter(open_ds(paths).to_torch_dataloader(num_workers=0, seed=4, batch_size=5, verbose=False)))
    assert isinstance(b, drt.CachedSample) and type(b.data) is tuple
    assert b.data == a.data and torch.equal(b.cache_id, a.cache_id) and torch.equal(b.sample_id, a.sample_id)
    assert b.metadata.keys() == a.metadata.keys()
    for k, v in a.metadata.items():
        assert torch.equal(b.metadata[k], v) if isinstance(v, torch.Tensor) else b.metadata[k] == v


def test_shuffled_loader_is_derive_seed_weighted_draws(paths):
    """Reference §3.4 item 7: shuffle, workers=0, seed 3 == weighted_draws(derive_seed(3,0,0), ones)."""
    ds = open_ds(paths)
    physical = [(int(c), int(s)) for c, s in ds.get_metadata().select("cache_id", "sample_id").iter_rows()]
    cum, scale = draws.weighted_cumulative(np.ones(len(physical)))
    rows = draws.weighted_draws(draws.derive_seed(3, 0, 0), cum, scale, 0, 2 * len(physical))
    got = [k[:2] for b in run(loader(ds, seed=3, batch_size=6)) for k in b]
    assert got == [physical[r] for r in rows]


# -- arguments ---------------------------------------------------------------------------------------


def _no_lambda_pickle(s):
    return s


BAD = [
    ({"seed": 1, "shuffle": False}, "seed requires shuffle=True; use 'random' for sequential reading"),
    ({"seed": None}, "seed must be 'random' or an unsigned 64-bit integer"),
    ({"seed": -1}, "seed must be 'random' or an unsigned 64-bit integer"),
    ({"seed": 2**64}, "seed must be 'random' or an unsigned 64-bit integer"),
    ({"seed": True}, "seed must be 'random' or an unsigned 64-bit integer"),
    ({"batch_size": 0}, "batch_size must be a positive integer fitting sys.maxsize"),
    ({"batch_size": 2.0}, "batch_size must be a positive integer fitting sys.maxsize"),
    ({"num_workers": -1}, "num_workers must be 'auto' or an integer between 0 and 4294967295"),
    ({"num_workers": "many"}, "num_workers must be 'auto' or an integer between 0 and 4294967295"),
    ({"native_num_workers": 0}, "native_num_workers must be 'auto' or an integer between 1 and 9223372036854775807"),
    ({"num_workers": 0, "timeout": 1}, "timeout must be zero with num_workers=0"),
    ({"timeout": -1.0}, "timeout must be finite and nonnegative"),
    ({"num_workers": 0, "persistent_workers": True}, "persistent_workers=True requires num_workers > 0"),
    ({"persistent_workers": "yes"}, "persistent_workers must be a boolean or 'auto'"),
    ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor requires num_workers > 0"),
    ({"worker_partition": "both"}, "worker_partition must be 'split', 'replicate', or None"),
    (
        {"multiprocessing_context": "nope"},
        "multiprocessing_context must be 'inherit', an available start method, or BaseContext",
    ),
    (
        {"dataloader_kwargs": {"sampler": None, "batch_size": 2, "generator": None}},
        "dataloader_kwargs contains reserved arguments: batch_size, sampler",
    ),
    ({"samples_per_epoch": 0}, "samples_per_epoch must be a positive integer <= 9007199254740992 or None"),
    ({"shuffle": 1}, "shuffle must be a boolean"),
    ({"drop_last": "yes"}, "drop_last must be a boolean"),
    ({"pin_memory": None}, "pin_memory must be a boolean"),
    ({"verbose": 0}, "verbose must be a boolean"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_validation_messages(paths, kwargs, message):
    with pytest.raises(ValueError) as info:
        open_ds(paths).to_torch_dataloader(**kwargs)
    assert str(info.value) == message
    assert isinstance(info.value, ConfigError)


@pytest.mark.interop
@pytest.mark.parametrize(("kwargs", "message"), BAD[::3], ids=[m[:40] for _, m in BAD[::3]])
def test_validation_messages_are_dataset_rt_s(paths, kwargs, message):
    rt = pytest.importorskip("dataset_rt")
    theirs = rt.DatasetRuntime(num_workers=1).cached_dataset(paths, reader_config=rt.ReaderConfig(seed=0))
    with pytest.raises(ValueError, match=None) as info:
        theirs.to_torch_dataloader(**kwargs)
    assert str(info.value) == message


def test_other_argument_errors(paths, tmp_path):
    ds = open_ds(paths)
    with pytest.raises(TypeError, match="sample_transform_fn must be picklable for multiprocess loading"):
        ds.to_torch_dataloader(num_workers=1, sample_transform_fn=lambda s: s, verbose=False)
    with pytest.raises(ValueError, match="Path does not point to a directory"):
        ds.to_torch_dataloader(num_workers=0, work_dir=tmp_path / "missing", verbose=False)
    ds.set_epoch_len(2**53 + 1)
    with pytest.raises(ConfigError, match="inherited samples_per_epoch must be between 1 and 9007199254740992"):
        ds.to_torch_dataloader(num_workers=0, verbose=False)


def test_unpicklable_collate_fn_is_refused_at_build_time_unless_forked(paths):
    """torch pickles collate_fn into spawned workers; a lambda used to fail at the first next()."""
    ds = open_ds(paths)
    for method in ("spawn", "forkserver"):
        with pytest.raises(TypeError, match=f"collate_fn must be picklable with multiprocessing_context='{method}'"):
            ds.to_torch_dataloader(num_workers=1, collate_fn=lambda b: b, multiprocessing_context=method, verbose=False)
    dl = ds.to_torch_dataloader(
        num_workers=1,
        batch_size=8,
        collate_fn=lambda b: len(b),  # fork pickles nothing
        multiprocessing_context="fork",
        persistent_workers=False,
        verbose=False,
    )
    assert sum(dl) == len(ds)


def test_defaults_and_torch_settings(paths, caplog):
    ds = open_ds(paths)
    caplog.set_level(logging.INFO, logger="datasetrt.loader")
    dl = ds.to_torch_dataloader(num_workers=0)
    assert isinstance(dl, DataLoader) and dl.batch_size == 1 and not dl.drop_last
    assert dl.seed is not None and dl.persistent_workers is False and dl.prefetch_factor is None
    assert f"event=loader_ready pid={os.getpid()} rank=0 seed={dl.seed} worker_seeds=0:" in caplog.text
    dl = ds.to_torch_dataloader(
        num_workers=2,
        seed=9,
        batch_size=4,
        verbose=False,
        pin_memory=True,
        multiprocessing_context="fork",
        dataloader_kwargs={"in_order": True},
    )
    assert dl.persistent_workers is True and dl.prefetch_factor == 2 and dl.num_workers == 2
    assert dl.multiprocessing_context.get_start_method() == "fork" and dl.pin_memory is True
    assert len(dl) == 11 and len(dl.dataset) == 43
    assert dl.dataset.worker_seeds == (draws.derive_seed(9, 0, 0), draws.derive_seed(9, 0, 1))
    with pytest.warns(
        UserWarning,
        match="samples_per_epoch adjusted: requested 43 global samples, effective 40; "
        "discarded 3 for equal rank batch counts",
    ):
        dl = ds.to_torch_dataloader(num_workers=0, batch_size=5, drop_last=True, verbose=False)
    assert len(dl) == 8


def _cgroup_cpus() -> int | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except OSError:
        return None
    return None if quota == "max" else int(quota) // int(period)


@pytest.mark.filterwarnings("ignore:samples_per_epoch adjusted:UserWarning")
@pytest.mark.parametrize(
    ("cpus", "local"), [(1, 1), (2, 1), (4, 1), (5, 1), (6, 1), (64, 1), (2, 2), (8, 2), (9, 2), (8, 4), (16, 3)]
)
def test_auto_num_workers_is_min_4_cpus_per_local_rank_minus_1(paths, monkeypatch, cpus, local):
    """Documented (pytorch.md): num_workers="auto" = min(4, cpus // local_ranks - 1), where cpus
    is what this process may use (affinity, cgroup quota) and local_ranks is LOCAL_WORLD_SIZE."""
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setenv("WORLD_SIZE", str(local))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    usable = min(cpus, _cgroup_cpus() or cpus)
    want = min(4, max(0, usable // local - 1))
    dl = open_ds(paths).to_torch_dataloader(seed=3, batch_size=2, verbose=False, num_workers="auto")
    assert dl.num_workers == want
    assert dl.persistent_workers is (want > 0) and dl.prefetch_factor == (2 if want else None)


# -- workers: same batches as num_workers=0 -----------------------------------------------------------


@pytest.mark.parametrize("config", [*CONFIGS[:3], CONFIGS[4], {"seed": 1, "batch_size": 16}], ids=range(5))
@pytest.mark.parametrize(("workers", "persistent"), [(2, True), (3, False)])
def test_fork_workers_yield_the_serial_batches(paths, config, workers, persistent):
    ds = open_ds(paths, update=True, epoch_len=37)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = run(loader(ds, **config), epochs=3)
        got = run(
            loader(ds, **config, num_workers=workers, persistent_workers=persistent, multiprocessing_context="fork"),
            epochs=3,
        )
    assert got == expected


def test_transform_collate_worker_seeds_and_pin_memory(paths):
    ds = open_ds(paths, epoch_len=20)
    serial = [k[:2] for b in run(loader(ds, seed=8, batch_size=3), epochs=1) for k in b]
    dl = loader(
        ds,
        seed=8,
        batch_size=3,
        num_workers=2,
        multiprocessing_context="fork",
        sample_transform_fn=with_worker,
        pin_memory=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pin_memory without an accelerator
        batches = list(dl)
    assert [len(b) for b in batches] == [3] * 6 + [2]
    assert [r[:2] for b in batches for r in b] == serial
    for i, b in enumerate(batches):  # batch i came from worker i % 2, which applied the transform
        assert {(r[2], r[3]) for r in b} == {(i % 2, draws.derive_seed(8, 0, i % 2))}
    default = next(
        iter(ds.to_torch_dataloader(num_workers=2, seed=8, batch_size=3, verbose=False, multiprocessing_context="fork"))
    )
    assert isinstance(default.sample_id, torch.Tensor) and default.sample_id.tolist() == [s for _, s in serial[:3]]


def test_spawn_workers_yield_the_serial_batches(paths, tmp_path):
    ds = open_ds(paths, update=True, epoch_len=33)
    expected = run(loader(ds, seed=21, batch_size=4), epochs=2)
    dl = loader(ds, seed=21, batch_size=4, num_workers=2, multiprocessing_context="spawn", work_dir=tmp_path)
    assert run(dl, epochs=2) == expected
    where = dl.dataset.snapshot_dir
    assert where.parent == tmp_path
    assert len(list(where.rglob("population.arrow"))) == 1
    del dl
    gc.collect()
    assert not where.exists()


def test_spawn_workers_refuse_a_cache_whose_index_changed(paths):
    """Documented (pytorch.md): a spawned worker reopens the caches and refuses them when
    manifest.json or index.bin is not the file the dataset opened (here index.bin is rewritten
    with the same bytes: a new inode and mtime), instead of reading another cache's rows."""
    ds = open_ds(paths)
    dl = loader(ds, seed=4, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    index = paths[1] / "index.bin"
    data = index.read_bytes()
    index.unlink()
    index.write_bytes(data)
    with pytest.raises(
        drt.errors.CacheFormatError, match=f"caches changed since the torch dataset was created.*{paths[1]}"
    ):
        next(iter(dl))


def test_abandoned_epoch_with_persistent_workers(paths):
    ds = open_ds(paths, epoch_len=24)
    serial = run(loader(ds, seed=2, batch_size=4), epochs=2)
    dl = loader(ds, seed=2, batch_size=4, num_workers=2, multiprocessing_context="fork")
    it = iter(dl)
    head = [keys(next(it)) for _ in range(2)]
    assert head == serial[:2]
    assert [keys(b) for b in dl] == serial[6:12]  # the next iter() is epoch 1, in full


# -- resume --------------------------------------------------------------------------------------------


def consume(dl, n: int) -> list:
    """The first n batches over as many epochs as needed (a break leaves an epoch mid-way)."""
    out: list = []
    while len(out) < n:
        for b in dl:
            out.append(keys(b))
            if len(out) == n:
                break
    return out


def resumed(make, state, total: int, done: int) -> list:
    dl = make()
    dl.load_state_dict(json.loads(json.dumps(state)))  # states are plain data
    return consume(dl, total - done)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1], CONFIGS[4]], ids=range(3))
def test_resume_at_every_batch_serial(paths, config):
    ds = open_ds(paths, update=True, epoch_len=23)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        make = lambda: loader(ds, **config)  # noqa: E731
        full = run(make(), epochs=3)
        for cut in range(len(full)):
            dl = make()
            head = consume(dl, cut)
            assert head + resumed(make, dl.state_dict(), len(full), cut) == full


def test_resume_with_workers_and_a_random_seed(paths):
    ds = open_ds(paths, update=True, epoch_len=30)
    serial = loader(ds, seed=17, batch_size=4)
    full = run(serial, epochs=3)
    per_epoch = len(serial)
    for cut, workers, persistent in [(3, 2, True), (per_epoch, 2, False), (per_epoch + 5, 3, True)]:
        dl = loader(
            ds,
            seed=17,
            batch_size=4,
            num_workers=workers,
            persistent_workers=persistent,
            multiprocessing_context="fork",
        )
        head = consume(dl, cut)
        state = dl.state_dict()
        assert (state["epoch"], state["batches"]) == divmod(cut, per_epoch)
        make = lambda: loader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")  # noqa: E731
        assert head + resumed(make, state, len(full), cut) == full  # seed="random" adopts the state's


def test_resume_refusals(paths, write_caches, tmp_path):
    ds = open_ds(paths, update=True)
    dl = loader(ds, seed=5, batch_size=4)
    consume(dl, 2)
    state = dl.state_dict()
    with pytest.raises(LoaderStateError, match="before the loader is iterated"):
        dl.load_state_dict(state)
    assert isinstance(LoaderStateError("x"), (DatasetRTError, RuntimeError))
    refusals = {
        "seed differs": loader(ds, seed=6, batch_size=4),
        "batch_size differs": loader(ds, seed=5, batch_size=2),
        "shuffle differs": loader(ds, shuffle=False, batch_size=4),
        "worker_partition differs": loader(ds, seed=5, batch_size=4, worker_partition="split"),
        "active table": loader(open_ds(paths), seed=5, batch_size=4),
        "caches differ": loader(open_ds(write_caches({"other": 43}, base=tmp_path / "o")), seed=5, batch_size=4),
    }
    for what, other in refusals.items():
        with pytest.raises(ConfigError, match=what):
            other.load_state_dict(state)
    with pytest.raises(ConfigError, match="not a datasetrt DataLoader state"):
        loader(ds, seed=5, batch_size=4).load_state_dict({"epoch": 0})
    with pytest.raises(ConfigError, match="invalid position"):
        loader(ds, seed=5, batch_size=4).load_state_dict({**state, "batches": -1})


def test_resume_refuses_a_changed_drop_last_or_samples_per_epoch(paths):
    """Documented (pytorch.md): a state of another plan is refused. 40 samples in batches of 4
    make the same plan length with and without drop_last, so drop_last is the only difference."""
    ds = open_ds(paths)
    dl = loader(ds, seed=5, batch_size=4, samples_per_epoch=40)
    consume(dl, 2)
    state = dl.state_dict()
    refusals = {
        "drop_last differs": loader(ds, seed=5, batch_size=4, samples_per_epoch=40, drop_last=True),
        "samples_per_epoch differs": loader(ds, seed=5, batch_size=4, samples_per_epoch=36),
    }
    for what, other in refusals.items():
        with pytest.raises(ConfigError, match=f"^DataLoader state does not match: {what}"):
            other.load_state_dict(state)
    same = loader(ds, seed=5, batch_size=4, samples_per_epoch=40)
    same.load_state_dict(state)  # the unchanged loader resumes
    assert len(list(same)) == 10 - 2


def test_loader_is_fixed_at_creation_and_reads_through_the_runtime(paths):
    with drt.DatasetRuntime(num_workers=2, start_method="fork") as rt:
        parallel = open_ds(paths, update=True, epoch_len=26, runtime=rt)
        dl = loader(parallel, seed=13, batch_size=5)
        parallel.update_metadata(parallel.get_metadata().head(3))  # later updates do not reach the loader
        got = run(dl)
        assert len(rt.worker_pids) == 2  # num_workers=0: the dataset's reader processes did the reading
    assert got == run(loader(open_ds(paths, update=True, epoch_len=26), seed=13, batch_size=5))
