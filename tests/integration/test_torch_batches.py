"""`CachedDataset.to_torch_batches`: whole typed batches from torch workers (fork and spawn),
the same plan as `to_torch_dataloader` with the same arguments (so the same samples in the same
batches, ranks included), tensors in shared memory, `batch_transform` in the worker,
`pin_memory`, exact resume, columns, ragged projection, and num_workers=0 on a DatasetRuntime."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import datasetrt as drt  # noqa: E402
from datasetrt.errors import ConfigError  # noqa: E402
from tests.conftest import ListSource, writer_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
SPEC = drt.PayloadSpec("int32", (8,))


def ids(batch):
    return [[s.cache_id, s.sample_id] for s in batch]


def tag_worker(batch):
    """A batch_transform (module level: spawn pickles it by name)."""
    batch["pid"] = os.getpid()
    return batch


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    base = tmp_path_factory.mktemp("tb")
    out = []
    with drt.DatasetRuntime(num_workers=1) as rt:
        for k, n in enumerate((37, 26)):
            items = [(np.arange(8, dtype=np.int32) + 1000 * k + i, {"i": i, "score": i / 4, "label": f"l{i % 3}"})
                     for i in range(n)]
            [res] = rt.write_cache([ListSource(f"t{k}", items)], base, writer_config=writer_config("lz4", payload_spec=SPEC))
            out.append(str(res.path))
    return out


def _ds(paths, shuffle=False, runtime=None):
    return drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=2, shuffle=shuffle), runtime=runtime)


def _payload_of(paths):
    ref = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=0))
    return {(s.cache_id, s.sample_id): SPEC.decode(s.data) for s in ref}


def _check(batches, reference, payloads):
    """Each batch holds the reference loader's samples, in order, with their payload bytes."""
    assert len(batches) == len(reference)
    for got, want in zip(batches, reference):
        pairs = [[int(c), int(s)] for c, s in zip(got["cache_id"], got["sample_id"])]
        assert pairs == want
        assert got["payload"].dtype == torch.int32 and tuple(got["payload"].shape) == (len(want), 8)
        assert np.array_equal(got["payload"].numpy(), np.stack([payloads[tuple(p)] for p in want]))


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_batches_as_to_torch_dataloader(caches, method, shuffle):
    kw = {"shuffle": shuffle, "batch_size": 5, **({"seed": 9} if shuffle else {})}
    reference = _ds(caches).to_torch_dataloader(**kw, collate_fn=ids, num_workers=0, verbose=False)
    want = [list(reference) for _ in range(2)]
    batch_size = kw.pop("batch_size")
    dl = _ds(caches).to_torch_batches(batch_size, **kw, num_workers=2, multiprocessing_context=method,
                                      batch_transform=tag_worker, columns=["i", "label"])
    payloads = _payload_of(caches)
    for epoch in range(2):
        got = list(dl)
        _check(got, want[epoch], payloads)
        assert all(b["pid"] != os.getpid() for b in got)  # the transform ran in the workers
        assert {b["pid"] for b in got} == set(dl._iterator._workers_pids if hasattr(dl._iterator, "_workers_pids")
                                               else {b["pid"] for b in got})
        for b in got:
            assert b["i"].dtype == torch.int64 and b["label"] == [f"l{int(i) % 3}" for i in b["i"]]
    assert len(dl) == len(want[0])


def test_main_process_reads_through_the_runtime_zero_copy(caches):
    with drt.DatasetRuntime(num_workers=2) as rt:
        rt.start_workers()
        reference = _ds(caches).to_torch_dataloader(shuffle=False, batch_size=16, collate_fn=ids, num_workers=0,
                                                    verbose=False)
        dl = _ds(caches, runtime=rt).to_torch_batches(16, num_workers=0, pin_memory=True)
        got = list(dl)
        _check(got, list(reference), _payload_of(caches))


def test_resume_continues_with_the_remaining_batches(caches):
    kw = {"shuffle": True, "seed": 4, "num_workers": 2, "multiprocessing_context": "fork"}
    dl = _ds(caches).to_torch_batches(6, **kw)
    first = list(dl)
    dl2 = _ds(caches).to_torch_batches(6, **kw)
    it = iter(dl2)
    head = [next(it) for _ in range(4)]
    state = dl2.state_dict()
    resumed = _ds(caches).to_torch_batches(6, **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [b["sample_id"].tolist() for b in head + rest] == [b["sample_id"].tolist() for b in first]
    assert state["items"] == "batches"
    plain = _ds(caches).to_torch_dataloader(batch_size=6, seed=4, num_workers=0, verbose=False)
    with pytest.raises(ConfigError, match="items differs"):
        plain.load_state_dict(state)


def test_two_ranks_share_the_plan(monkeypatch, caches):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    payloads = _payload_of(caches)
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            reference = _ds(caches).to_torch_dataloader(batch_size=4, seed=3, collate_fn=ids, num_workers=0, verbose=False)
            dl = _ds(caches).to_torch_batches(4, shuffle=True, seed=3, num_workers=2, multiprocessing_context="fork")
        _check(list(dl), list(reference), payloads)
        assert dl.rank == rank and dl.world_size == 2


def test_ragged_values_and_projection(tmp_path):
    spec = drt.PayloadSpec("int16", (None,))
    items = [(np.arange(i % 7, dtype=np.int16) + i, {"i": i}) for i in range(30)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource("r", items)], tmp_path, writer_config=writer_config("zstd", payload_spec=spec))
    ds = _ds([res.path])
    [ragged] = list(ds.to_torch_batches(30, num_workers=1, multiprocessing_context="fork"))
    assert ragged["offsets"].tolist() == np.cumsum([0] + [i % 7 for i in range(30)]).tolist()
    assert ragged["shapes"][:, 0].tolist() == [i % 7 for i in range(30)]
    assert ragged["values"].tolist() == np.concatenate([d for d, _ in items]).tolist()
    [fixed] = list(ds.to_torch_batches(30, num_workers=1, multiprocessing_context="fork", length=4, pad=-1))
    assert fixed["payload"].shape == (30, 4) and fixed["payload"][3].tolist() == [3, 4, 5, -1]
    with pytest.raises(ConfigError, match="pad=.* is not a int16 value"):
        ds.to_torch_batches(30, length=4, pad=1 << 20)
    with pytest.raises(ConfigError, match="no metadata column 'nope'"):
        ds.to_torch_batches(30, columns=["nope"])
