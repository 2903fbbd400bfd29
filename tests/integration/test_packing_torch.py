"""Packed rows through torch: `to_torch_batches(rows, pack=row_len)` with 0 and 2 forked
DataLoader workers (spawned ones: test_packing_torch_spawn.py) gives the window's documents whole (each token once), the same rows for the
same workers, resumes a pass exactly, and refuses what does not apply."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError, LoaderStateError, PackingError
from tests.integration.conftest import token_documents, write_token_cache

torch = pytest.importorskip("torch")

ROWS, ROW_LEN = 4, 64


def _items(n=240):
    return token_documents(n, seed=1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return write_token_cache(tmp_path_factory.mktemp("packed-torch"), _items())


def _open(path, runtime=None):
    return drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=5, sampling="permutation"), runtime=runtime)


def _loader(path, workers, mode="split", runtime=None):
    return _open(path, runtime).to_torch_batches(
        ROWS, pack=ROW_LEN, pack_mode=mode, num_workers=workers, multiprocessing_context="fork"
    )


def _rows(items):
    return [{k: v.clone() if torch.is_tensor(v) else v for k, v in item.items()} for item in items]


def _equal(a, b):
    keys = ("tokens", "segment_ids", "positions", "cu_seqlens", "sample_id")
    return len(a) == len(b) and all(all(torch.equal(x[k], y[k]) for k in keys) for x, y in zip(a, b))


ALL_TOKENS = np.sort(np.concatenate([t for t, _ in _items()]))


@pytest.mark.parametrize("mode", ["split", "whole"])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_token_once_and_same_rows_per_worker_count(cache, mode, workers):
    items = _rows(_loader(cache, workers, mode))
    first = items[0]
    assert first["tokens"].shape == (ROWS, ROW_LEN) and first["tokens"].dtype == torch.int32
    assert first["segment_ids"].dtype == first["positions"].dtype == first["cu_seqlens"].dtype == torch.int32
    assert int(first["cu_seqlens"][-1]) == ROWS * ROW_LEN and isinstance(first["max_seqlen"], int)
    tokens = torch.cat([b["tokens"][b["segment_ids"] > 0] for b in items]).numpy()
    assert np.array_equal(np.sort(tokens), ALL_TOKENS)
    assert _equal(items, _rows(_loader(cache, workers, mode)))  # deterministic
    if workers == 0:  # in the main process: the dataset's own packed rows
        ref = list(_open(cache).iter_packed(ROWS, ROW_LEN, mode=mode))
        assert all(np.array_equal(b["tokens"].numpy(), r.tokens) for b, r in zip(items, ref)) and len(ref) == len(items)


def test_reader_workers_behind_the_loader(cache):
    with drt.DatasetRuntime(num_workers=2) as rt:
        items = _rows(_loader(cache, 0, runtime=rt))
    assert _equal(items, _rows(_loader(cache, 0)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["split", "whole"])
def test_resume_a_pass(cache, workers, mode):
    full = _rows(_loader(cache, workers, mode))
    for k in (1, 3, len(full) - 2):
        loader = _loader(cache, workers, mode)
        it = iter(loader)
        head = _rows(next(it) for _ in range(k))
        state = loader.state_dict()
        del it
        resumed = _loader(cache, workers, mode)
        resumed.load_state_dict(state)
        assert _equal(head + _rows(resumed), full)


def test_passes_read_successive_windows(cache):
    loader = _loader(cache, 0)
    one, two = _rows(loader), _rows(loader)
    assert not _equal(one, two)
    tokens = torch.cat([b["tokens"][b["segment_ids"] > 0] for b in two]).numpy()
    assert np.array_equal(np.sort(tokens), ALL_TOKENS)  # each pass is an epoch


def test_refusals(cache):
    ds = _open(cache)
    with pytest.raises(ConfigError, match="columns= does not apply"):
        ds.to_torch_batches(ROWS, pack=ROW_LEN, columns=["i"])
    with pytest.raises(ConfigError, match="pack mode"):
        ds.to_torch_batches(ROWS, pack=ROW_LEN, pack_mode="best")
    loader = _loader(cache, 2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(LoaderStateError, match="num_workers=2, this one has 1"):
        _loader(cache, 0).load_state_dict(state)
    with pytest.raises(LoaderStateError, match="not a packed loader state"):
        _loader(cache, 2).load_state_dict({"kind": "other"})
    bad = {**state, "shares": [{**s, "row_len": 32} for s in state["shares"]]}
    with pytest.raises(PackingError, match="row_len is 32"):
        _loader(cache, 2).load_state_dict(bad)
