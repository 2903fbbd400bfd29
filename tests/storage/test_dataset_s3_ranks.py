"""Datasets over s3:// caches read and written by several processes of one node, end to end through
moto's server and the counting proxy. Readers: two "rank" processes (spawned, as torchrun starts
them), each with its own CachedDataset and reader workers, or each with a world_size=2 torch
DataLoader whose workers are forked or spawned, all sharing one node cache (every shard downloaded
once, every sample exact against a local copy); a loader stopped mid-epoch and resumed in a fresh
process, with a fresh or the same warm node cache (the rest of the epoch is exactly what an
uninterrupted run reads). Writers: two racing writers of one cache name (exactly one publishes;
a reader sees its whole cache), and a writer killed mid-upload (no cache; its objects listed).

Every wait is bounded (reports, joins, holds); every storage config has a retry budget.
"""

from __future__ import annotations

import collections
import os
import warnings

import pytest

import datasetrt as drt
from datasetrt.errors import MissingManifestError
from datasetrt.format.claims import CLAIM_NAME
from datasetrt.format.upload import unpublished
from datasetrt.storage.objects import ObjectStore
from datasetrt.storage.urls import parse_remote
from tests.servers.moto import s3_options
from tests.storage._s3data import (
    SPAWN,
    Leaks,
    Processes,
    batch_rows,
    bounded,
    loader_rows,
    samples_of,
    shard_gets,
    shard_keys,
    sources,
    storage,
    write,
    write_both,
)
from tests.storage.conftest import DEADLINE_S

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
LOADER = {"seed": 7, "batch_size": 8, "collate_fn": loader_rows, "verbose": False}
WRITTEN = {"a": 60, "b": 45}  # the racing writers' caches


@pytest.fixture(scope="module")
def written(moto_server, tmp_path_factory):
    return write_both(moto_server, tmp_path_factory.mktemp("written"), "ranks")


@pytest.fixture
def leaks():
    snapshot = Leaks()
    yield snapshot
    snapshot.check()


def at_rank(rank: int, world: int) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)})


def loader(paths, cfg: drt.ReaderConfig, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a rank share's padding note
        return drt.CachedDataset(paths, reader_config=cfg).to_torch_dataloader(**LOADER, **kw)


def once_each(counts: collections.Counter, keys: set[str]) -> None:
    assert set(counts) == keys and set(counts.values()) == {1}, counts


# -- processes (spawned: importable entry points) --------------------------------------------------


def _rank_reads(rank, urls, cfg, barrier):
    """A rank with its own dataset and reader workers: one epoch of samples, the next as batches."""
    with drt.DatasetRuntime(num_workers=2) as rt:
        ds = drt.CachedDataset(urls, reader_config=cfg, runtime=rt)
        barrier.wait(DEADLINE_S)
        return rank, samples_of(ds), batch_rows(ds.iter_batches(16))


def _rank_loader(rank, urls, cfg, context, barrier):
    """A rank of a world_size=2 job: two epochs of its torch loader (2 workers of `context`)."""
    at_rank(rank, 2)
    dl = loader(urls, cfg, num_workers=2, multiprocessing_context=context)
    barrier.wait(DEADLINE_S)
    return rank, [list(dl) for _ in range(2)]


def _loader_head(urls, cfg, batches):
    """The first `batches` batches of epoch 0, then the loader's state (the run stops here)."""
    dl = loader(urls, cfg, num_workers=2, multiprocessing_context="fork")
    head = []
    for batch in dl:
        head.append(batch)
        if len(head) == batches:
            break
    return head, dl.state_dict()


def _loader_rest(urls, cfg, state):
    dl = loader(urls, cfg, num_workers=2, multiprocessing_context="spawn")
    dl.load_state_dict(state)
    return list(dl)


def _writer(base, endpoint, cache_dir, seed, barrier):
    """write_cache of WRITTEN's sources (contents from `seed`) under `base`: [(kind, name, text)]."""
    with drt.DatasetRuntime(num_workers=1) as rt:
        srcs = sources(seed, WRITTEN)
        config = drt.WriterConfig(show_progress=False, max_shard_bytes=2 << 10, storage=storage(endpoint, cache_dir))
        if barrier is not None:
            barrier.wait(DEADLINE_S)
        results = rt.write_cache(srcs, base, writer_config=config)
    return seed, {r.source_name: (type(r).__name__, str(r[1])) for r in results}


# -- readers ------------------------------------------------------------------------------------------


def test_two_ranks_with_reader_workers_download_each_shard_once_and_read_exactly(
    written, s3_proxy, tmp_path, no_leaks, leaks
):
    _bucket, urls, local = written
    node = storage(s3_proxy.endpoint, tmp_path / "node")
    cfgs = [{"seed": 1 + rank, "sampling": "permutation"} for rank in range(2)]
    barrier = SPAWN.Barrier(2)
    jobs = [(_rank_reads, (r, urls, drt.ReaderConfig(**cfg, storage=node), barrier)) for r, cfg in enumerate(cfgs)]
    with Processes(jobs) as procs:
        got = {rank: (samples, batches) for rank, samples, batches in procs.values().values()}
    for rank, cfg in enumerate(cfgs):
        ds = drt.CachedDataset(local, reader_config=drt.ReaderConfig(**cfg))
        assert got[rank] == (samples_of(ds), bounded(lambda ds=ds: batch_rows(ds.iter_batches(16)))), rank
    once_each(shard_gets(s3_proxy), shard_keys(urls, node))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_world_size_2_torch_loaders_with_workers_download_each_shard_once_and_read_exactly(
    written, s3_proxy, tmp_path, context, monkeypatch, no_leaks, leaks
):
    _bucket, urls, local = written
    node = storage(s3_proxy.endpoint, tmp_path / "node")
    barrier = SPAWN.Barrier(2)
    cfg = drt.ReaderConfig(seed=0, storage=node)
    with Processes([(_rank_loader, (r, urls, cfg, context, barrier)) for r in range(2)]) as procs:
        got = dict(procs.values().values())
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        dl = loader(local, drt.ReaderConfig(seed=0), num_workers=0)
        assert got[rank] == [list(dl) for _ in range(2)], rank
    once_each(shard_gets(s3_proxy), shard_keys(urls, node))


@pytest.mark.parametrize("cache", ["fresh", "warm"])
def test_a_loader_stopped_mid_epoch_resumes_exactly_in_a_fresh_process(
    written, s3_proxy, tmp_path, cache, no_leaks, leaks
):
    _bucket, urls, local = written
    full = list(loader(local, drt.ReaderConfig(seed=0), num_workers=0))  # one uninterrupted epoch
    cut = len(full) // 3
    first = drt.ReaderConfig(seed=0, storage=storage(s3_proxy.endpoint, tmp_path / "node"))
    with Processes([(_loader_head, (urls, first, cut))]) as procs:
        [(head, state)] = procs.values().values()
    assert head == full[:cut] and (state["epoch"], state["batches"]) == (0, cut)
    head_gets = shard_gets(s3_proxy)
    node = tmp_path / ("node" if cache == "warm" else "fresh")
    resumed = first.model_copy(update={"storage": storage(s3_proxy.endpoint, node)})
    with Processes([(_loader_rest, (urls, resumed, state))]) as procs:
        [rest] = procs.values().values()
    assert head + rest == full
    rest_gets = shard_gets(s3_proxy) - head_gets
    assert head_gets and set(head_gets.values()) == {1} and set(rest_gets.values()) <= {1}
    if cache == "warm":  # the node's copies serve the rest: one download per shard per node in all
        assert not set(rest_gets) & set(head_gets)
    else:
        assert rest_gets


# -- writers ------------------------------------------------------------------------------------------


def published(bucket, endpoint, tmp_path, name) -> list:
    """What a reader sees at s3://<bucket>/p/<name>, in order."""
    cfg = drt.ReaderConfig(seed=0, shuffle=False, storage=storage(endpoint, tmp_path / "reader"))
    return samples_of(drt.CachedDataset([f"s3://{bucket}/p/{name}"], reader_config=cfg))


def local_copies(runtime, tmp_path, seeds) -> dict[int, dict[str, list]]:
    """{seed: {cache name: samples}} of each writer's contents, written locally."""
    out = {}
    for seed in seeds:
        paths = write(runtime, tmp_path / f"local{seed}", sources(seed, WRITTEN))
        cfg = drt.ReaderConfig(seed=0, shuffle=False)
        out[seed] = {name: samples_of(drt.CachedDataset([p], reader_config=cfg)) for name, p in zip(WRITTEN, paths)}
    return out


@pytest.mark.parametrize("race", ["together", "one_publishes_while_the_other_looks"])
def test_two_writers_of_one_cache_name_exactly_one_publishes(
    runtime, moto_server, bucket, s3_proxy, tmp_path, race, no_leaks, leaks
):
    base = f"s3://{bucket}/p"
    barrier = SPAWN.Barrier(2)
    held = s3_proxy.hold("p/a/manifest.json", method="HEAD") if race != "together" else None
    jobs = [(_writer, (base, s3_proxy.endpoint, tmp_path / f"w{seed}", seed, barrier)) for seed in (10, 20)]
    results = {}
    with Processes(jobs) as procs:
        if held is not None:  # one writer's first look is held: the other publishes meanwhile
            assert held.reached.wait(4 * DEADLINE_S)
            status, _pid, (seed, first) = procs.next()
            assert status == "ok" and first["a"][0] == "CacheWriteSuccess", first
            results[seed] = first
            held.release()
        while len(results) < 2:
            status, _pid, value = procs.next()
            assert status == "ok", value
            results[value[0]] = value[1]
    want = local_copies(runtime, tmp_path, results)
    for name in WRITTEN:
        kinds = {seed: results[seed][name] for seed in results}
        winners = [seed for seed, (kind, _) in kinds.items() if kind == "CacheWriteSuccess"]
        assert len(winners) == 1, kinds
        [(kind, message)] = [v for seed, v in kinds.items() if seed != winners[0]]
        assert kind == "CacheWriteError", kinds
        assert "cache path already exists" in message or "another writer holds" in message, message
        assert published(bucket, s3_proxy.endpoint, tmp_path, name) == want[winners[0]][name]
    store = ObjectStore(parse_remote(base), s3_options(moto_server.endpoint))
    assert unpublished(store, min_age_s=0) == []  # the loser left nothing behind


def test_a_writer_killed_mid_upload_leaves_no_cache_and_its_objects_listed(
    runtime, moto_server, bucket, s3_proxy, tmp_path, no_leaks, leaks
):
    base = f"s3://{bucket}/p"
    held = s3_proxy.hold("p/a/shards/000001.bin", method="PUT")  # stored upstream; the writer waits
    with Processes([(_writer, (base, s3_proxy.endpoint, tmp_path / "w", 30, None))]) as procs:
        assert held.reached.wait(4 * DEADLINE_S)
        procs.kill(procs.procs[0])
        held.release()
        assert procs.procs[0].exitcode is not None and procs.procs[0].exitcode < 0
    cfg = drt.ReaderConfig(seed=0, storage=storage(s3_proxy.endpoint, tmp_path / "reader"))
    with pytest.raises(MissingManifestError, match=f"{base}/a/manifest.json"):
        drt.CachedDataset([f"{base}/a"], reader_config=cfg)
    store = ObjectStore(parse_remote(base), s3_options(moto_server.endpoint))
    assert unpublished(store) == []  # just written: a writer may be uploading now
    [found] = unpublished(store, min_age_s=0)
    assert (found.name, found.url) == ("a", f"{base}/a") and found.claim is not None
    assert [o.name for o in found.objects] == [CLAIM_NAME, "shards/000000.bin", "shards/000001.bin"]
    # the next writer of the name on this node sees its claim's process is gone and takes over
    with Processes([(_writer, (base, s3_proxy.endpoint, tmp_path / "w2", 40, None))]) as procs:
        [(_seed, again)] = procs.values().values()
    assert again["a"][0] == "CacheWriteSuccess", again
    assert published(bucket, s3_proxy.endpoint, tmp_path, "a") == local_copies(runtime, tmp_path, [40])[40]["a"]
    assert unpublished(store, min_age_s=0) == []
