"""Packed rows through spawned DataLoader workers: `to_torch_batches(rows, pack=row_len,
num_workers=2, multiprocessing_context="spawn")` packs the same rows as forked workers and as
`iter_packed` share by share (a filtered table included: the population travels as a snapshot),
resumes a pass exactly, removes its snapshot dir with the loader, and is refused in a script
that would build it again in each worker."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError
from tests.integration.conftest import token_documents, write_token_cache

torch = pytest.importorskip("torch")

ROWS, ROW_LEN, WORKERS = 4, 64, 2
KEYS = ("tokens", "segment_ids", "positions", "cu_seqlens", "sample_id")


def _items(n=160):
    return token_documents(n, seed=2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return write_token_cache(tmp_path_factory.mktemp("packed-spawn"), _items())


def _open(path, filtered=False):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=11, sampling="permutation"))
    if filtered:  # an active table of its own: spawned workers map it from a snapshot
        ds.update_metadata(ds.get_metadata().filter(pl.col("i") % 3 != 0))
    return ds


def _loader(ds, context):
    return ds.to_torch_batches(ROWS, pack=ROW_LEN, num_workers=WORKERS, multiprocessing_context=context)


def _rows(items):
    return [{k: item[k].clone() for k in KEYS} for item in items]


def _equal(a, b):
    return len(a) == len(b) and all(all(torch.equal(x[k], y[k]) for k in KEYS) for x, y in zip(a, b))


def _round_robin(shares):
    """The items torch's in-order loader yields when worker w yields `shares[w]`."""
    out, its = [], [iter(s) for s in shares]
    while its:
        for it in list(its):
            try:
                out.append(next(it))
            except StopIteration:
                its.remove(it)
    return out


def _shares(path, filtered):
    """Each share of the dataset's first window, packed by `iter_packed` (a dataset each)."""
    shares = []
    for s in range(WORKERS):
        packed = _open(path, filtered).iter_packed(ROWS, ROW_LEN, rank=s, world_size=WORKERS)
        shares.append([{k: torch.from_numpy(np.asarray(getattr(b, k))) for k in KEYS} for b in packed])
    return shares


def test_spawn_workers_pack_as_forked_ones_and_remove_their_snapshot(cache):
    forked = _loader(_open(cache, filtered=True), "fork")
    fork_passes = [_rows(forked), _rows(forked)]
    spawned = _loader(_open(cache, filtered=True), "spawn")
    first = _rows(spawned)
    where = spawned.dataset.snapshot_dir
    assert where is not None and len(list(where.rglob("population.arrow"))) == 1
    second = _rows(spawned)  # the next window, from the same snapshot
    assert len(list(where.rglob("population.arrow"))) == 1
    assert _equal(first, fork_passes[0]) and _equal(second, fork_passes[1])
    assert not _equal(first, second)
    expected = _round_robin(_shares(cache, filtered=True))
    assert all(torch.equal(x[k].to(y[k].dtype), y[k]) for x, y in zip(expected, first) for k in KEYS)
    assert len(expected) == len(first)
    kept = {int(i) for i in _open(cache, filtered=True).get_metadata()["i"]}
    ids = torch.cat([b["sample_id"] for b in first]).tolist()
    assert set(ids) == {i for i in range(len(_items())) if i in kept}  # the filtered table, every document
    del spawned
    gc.collect()
    assert not where.exists()


def test_resume_a_spawned_pass(cache):
    full = _rows(_loader(_open(cache), "fork"))
    loader = _loader(_open(cache), "spawn")
    it = iter(loader)
    head = _rows(next(it) for _ in range(3))
    state = loader.state_dict()
    del it
    assert loader.dataset.snapshot_dir is None  # the physical population: nothing to snapshot
    resumed = _loader(_open(cache), "spawn")
    resumed.load_state_dict(state)
    assert _equal(head + _rows(resumed), full)
    forked = _loader(_open(cache), "fork")  # the same state, continued by forked workers
    forked.load_state_dict(state)
    assert _equal(head + _rows(forked), full)


def test_start_methods(cache):
    expected = _rows(_loader(_open(cache, filtered=True), "fork"))
    assert _equal(_rows(_loader(_open(cache, filtered=True), "forkserver")), expected)
    ds = _open(cache)
    with pytest.raises(ConfigError, match="multiprocessing_context must be"):
        ds.to_torch_batches(ROWS, pack=ROW_LEN, num_workers=2, multiprocessing_context="threads")
    default = ds.to_torch_batches(ROWS, pack=ROW_LEN, num_workers=2)  # the unpacked loaders' default
    assert default.multiprocessing_context.get_start_method() == "spawn"
    assert ds.to_torch_batches(ROWS, pack=ROW_LEN).num_workers == 0  # "auto": the main process reads


SCRIPT = """
import sys

import datasetrt as drt

ds = drt.CachedDataset([sys.argv[1]], reader_config=drt.ReaderConfig(seed=0))
loader = ds.to_torch_batches(4, pack=16, num_workers=1)
print("built")
"""


def test_an_unguarded_script_is_refused_before_any_worker_starts(cache, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, str(script), str(cache)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1 and "built" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("datasetrt.errors.LoaderStateError: multiprocessing_context='spawn' starts DataLoader")
    assert f"{script}, and its line 7, which is running to_torch_batches(pack=...)" in last
