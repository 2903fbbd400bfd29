"""`CachedDataset.to_torch_batches` (datasetrt/integrations/torch/batches.py): whole typed batches
from torch workers (fork and spawn) with the same plan as `to_torch_dataloader` for the same
arguments (the same samples in the same batches, ranks included), tensors in shared memory held
across the whole run, `batch_transform` in the worker, `pin_memory`, exact resume, metadata
columns, ragged values and projection, every codec, and num_workers=0 over a DatasetRuntime."""

from __future__ import annotations

import os
import warnings
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import datasetrt as drt  # noqa: E402
from datasetrt.errors import ArgumentTypeError, ConfigError  # noqa: E402
from tests.conftest import ListSource, json_like_items, writer_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create:UserWarning", "ignore:.*pin_memory.*:UserWarning"
)
SPEC = drt.PayloadSpec("int32", (8,))


def ids(batch):
    """A collate_fn for the reference loader: the (cache_id, sample_id) pairs of a batch."""
    return [[s.cache_id, s.sample_id] for s in batch]


class Boxed:
    """An object the worker ring cannot look into (module level: picklable)."""

    def __init__(self, tensor):
        self.tensor = tensor


def reshape_views(item):
    """A batch_transform returning strided and reinterpreted views of the batch, a new tensor and
    an opaque object holding a view."""
    payload = item["payload"]
    return {
        "shifted": payload[:, 1:],
        "column": payload[:, 0],
        "raw": payload.view(torch.uint8),
        "total": payload.sum(dim=1),
        "ids": (item["cache_id"], [item["sample_id"]]),
        "box": Boxed(payload[1:]),
    }


def box_only(item):
    """A batch_transform whose only view of the batch is inside an opaque object."""
    return {"box": Boxed(item["payload"]), "ids": (item["cache_id"].clone(), [item["sample_id"].clone()])}


def tag_worker(item):
    """A batch_transform (module level: spawn pickles it by name)."""
    item["pid"] = os.getpid()
    return item


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    base = tmp_path_factory.mktemp("tb")
    out = []
    with drt.DatasetRuntime(num_workers=1) as rt:
        for k, n in enumerate((37, 26)):
            items = [
                (np.arange(8, dtype=np.int32) + 1000 * k + i, {"i": i, "score": i / 4, "label": f"l{i % 3}"})
                for i in range(n)
            ]
            [res] = rt.write_cache(
                [ListSource(f"t{k}", items)], base, writer_config=writer_config("lz4", payload_spec=SPEC)
            )
            out.append(str(res.path))
    return out


def _ds(paths, shuffle=False, runtime=None):
    return drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=2, shuffle=shuffle), runtime=runtime)


def _payloads(paths):
    """(cache_id, sample_id) -> payload bytes, read sample by sample."""
    return {(s.cache_id, s.sample_id): bytes(s.data) for s in _ds(paths)}


def _check(items, reference, payloads, key="payload"):
    """Each item holds the reference loader's samples, in order, with their payload bytes."""
    assert len(items) == len(reference)
    for got, want in zip(items, reference):
        pairs = [[int(c), int(s)] for c, s in zip(got["cache_id"], got["sample_id"])]
        assert pairs == want
        assert got["cache_id"].dtype == torch.uint64 and got["sample_id"].dtype == torch.uint64
        if key == "payload":
            assert got["payload"].dtype == torch.int32 and tuple(got["payload"].shape) == (len(want), 8)
        assert got[key].numpy().tobytes() == b"".join(payloads[tuple(p)] for p in want)


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_batches_as_to_torch_dataloader(caches, method, shuffle):
    kw = {"shuffle": shuffle, **({"seed": 9} if shuffle else {})}
    reference = _ds(caches).to_torch_dataloader(**kw, batch_size=5, collate_fn=ids, num_workers=0, verbose=False)
    want = [list(reference) for _ in range(2)]
    dl = _ds(caches).to_torch_batches(
        5, **kw, num_workers=2, multiprocessing_context=method, batch_transform=tag_worker, columns=["i", "label"]
    )
    assert len(dl) == len(want[0]) == 13
    payloads = _payloads(caches)
    held = []
    for _epoch in range(2):
        got = list(dl)
        held.append(got)
        assert len({b["pid"] for b in got}) == 2 and os.getpid() not in {b["pid"] for b in got}  # in the workers
        for b in got:
            assert b["i"].dtype == torch.int64 and b["label"] == [f"l{int(i) % 3}" for i in b["i"]]
            assert b["i"].tolist() == b["sample_id"].tolist()
    for got, reference_epoch in zip(held, want):  # both epochs held to the end: bytes unchanged
        _check(got, reference_epoch, payloads)


def _one_storage(item, keys):
    """Every tensor `keys` of `item` is a view of one storage (torch sent one descriptor)."""
    return len({item[k].untyped_storage().data_ptr() for k in keys}) == 1


def test_worker_batches_are_views_of_the_worker_ring_returned_when_dropped(caches):
    from datasetrt.integrations.torch.lending import SLOTS

    dl = _ds(caches).to_torch_batches(8, num_workers=1, multiprocessing_context="fork", columns=["i", "score"])
    payloads = _payloads(caches)
    for _epoch in range(2):
        for item in dl:
            [ring] = dl._receiver._rings.values()  # the worker's ring storage, sent once (persistent worker)
            low, high = ring.data_ptr(), ring.data_ptr() + ring.numel()
            # payload, ids and number columns are views of the ring: no copy, no transfer of their own
            assert all(low <= item[k].data_ptr() < high for k in ("payload", "cache_id", "sample_id", "i", "score"))
            assert item["i"].tolist() == item["sample_id"].tolist() and item["score"].dtype == torch.float64
            assert item["score"].tolist() == [i / 4 for i in item["i"].tolist()]
            pairs = zip(item["cache_id"].tolist(), item["sample_id"].tolist())
            assert item["payload"].numpy().tobytes() == b"".join(payloads[p] for p in pairs)
        del item
        assert ring[:SLOTS].tolist() == [0] * SLOTS  # every slot back once its tensors are gone
    held = list(dl)  # 8 batches held at once: the ring's slots, then a fresh shared storage each
    assert len(held) == 8 and sum(b["payload"].is_shared() for b in held) >= len(held) - SLOTS
    for b in held:
        pairs = zip(b["cache_id"].tolist(), b["sample_id"].tolist())
        assert b["payload"].numpy().tobytes() == b"".join(payloads[p] for p in pairs)


@pytest.mark.parametrize("transform", [reshape_views, box_only])
def test_transformed_views_are_rebuilt_and_opaque_results_keep_their_slots(caches, transform):
    """Strided, reinterpreted and nested views of the ring come out as the transform made them;
    an object the ring cannot look into keeps its batch's slot lent for good (its tensor travels
    as torch sends it), so every held item keeps its bytes however many batches follow; an early
    break (items torch drops) costs slots, never bytes."""
    want = {(c, s): bytes(d) for (c, s), d in _payloads(caches).items()}
    dl = _ds(caches).to_torch_batches(4, num_workers=1, multiprocessing_context="fork", batch_transform=transform)
    for _ in dl:
        break  # persistent worker: the items it had prefetched are dropped with their slots
    held = list(dl)
    assert len(held) == 16
    for got in held:
        ids = list(zip(got["ids"][0].tolist(), got["ids"][1][0].tolist()))
        rows = np.frombuffer(b"".join(want[p] for p in ids), dtype=np.int32).reshape(len(ids), 8)
        if transform is box_only:
            assert got["box"].tensor.tolist() == rows.tolist()
            continue
        assert got["shifted"].tolist() == rows[:, 1:].tolist() and got["shifted"].stride() == (8, 1)
        assert got["column"].tolist() == rows[:, 0].tolist() and got["raw"].numpy().tobytes() == rows.tobytes()
        assert got["total"].tolist() == rows.sum(axis=1).tolist() and got["box"].tensor.tolist() == rows[1:].tolist()


def test_fresh_storage_batches_carry_their_ids_in_one_storage(caches, monkeypatch):
    from datasetrt.integrations.torch import lending

    monkeypatch.setattr(lending, "SLOTS", 0)  # no ring slot: torch's own transfer, one storage per batch
    dl = _ds(caches).to_torch_batches(16, num_workers=1, multiprocessing_context="fork", columns=["i"])
    for item in dl:
        assert item["payload"].is_shared() and _one_storage(item, ["payload", "cache_id", "sample_id", "i"])


def test_auto_workers_are_the_runtime_readers_unless_a_transform_needs_torch_workers(caches):
    from datasetrt.integrations.torch.options import available_cpus

    torch_auto = min(4, max(0, available_cpus() - 1))
    assert _ds(caches).to_torch_batches(8).num_workers == torch_auto  # no reader processes
    with drt.DatasetRuntime(num_workers=2) as rt:
        ds = _ds(caches, runtime=rt)
        dl = ds.to_torch_batches(8)
        assert dl.num_workers == 0
        reference = _ds(caches).to_torch_dataloader(
            shuffle=False, batch_size=8, collate_fn=ids, num_workers=0, verbose=False
        )
        _check(list(dl), list(reference), _payloads(caches))
        assert ds.to_torch_batches(8, batch_transform=tag_worker).num_workers == torch_auto
        assert ds.to_torch_batches(8, prefetch_factor=3).num_workers == torch_auto
        assert ds.to_torch_batches(8, num_workers=1).num_workers == 1


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd", "zstd_dict"])
def test_every_codec_untyped_held_byte_for_byte(tmp_path, algo):
    items = json_like_items(300, tag=algo)
    comp = drt.ShardCompression(algo=algo, **({"dict_bytes": 4096} if algo == "zstd_dict" else {}))
    config = drt.WriterConfig(show_progress=False, shard_compression=comp, max_shard_bytes=16 << 10)
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource("c", items)], tmp_path, writer_config=config)
    paths = [str(res.path)]
    reference = list(
        _ds(paths).to_torch_dataloader(
            shuffle=True, seed=5, batch_size=32, collate_fn=ids, num_workers=0, verbose=False
        )
    )
    held = list(_ds(paths).to_torch_batches(32, shuffle=True, seed=5, num_workers=2, multiprocessing_context="fork"))
    payloads = _payloads(paths)
    _check(held, reference, payloads, key="values")
    for got in held:  # untyped caches read as ragged uint8
        lengths = [len(payloads[(int(c), int(s))]) for c, s in zip(got["cache_id"], got["sample_id"])]
        assert got["values"].dtype == torch.uint8
        assert got["offsets"].tolist() == np.cumsum([0, *lengths]).tolist()
        assert got["shapes"][:, 0].tolist() == lengths


@pytest.mark.parametrize("pin_memory", [False, True])
def test_main_process_reads_through_the_runtime_zero_copy(caches, pin_memory):
    with drt.DatasetRuntime(num_workers=2) as rt:
        rt.start_workers()
        reference = _ds(caches).to_torch_dataloader(
            shuffle=False, batch_size=8, collate_fn=ids, num_workers=0, verbose=False
        )
        dl = _ds(caches, runtime=rt).to_torch_batches(
            8, num_workers=0, pin_memory=pin_memory, batch_transform=tag_worker
        )
        held = list(dl)  # every batch held while the ring keeps serving (leased slots, copies when exhausted)
        assert {b["pid"] for b in held} == {os.getpid()}
        _check(held, list(reference), _payloads(caches))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_resume_continues_with_the_remaining_batches(caches, method):
    kw = {"shuffle": True, "seed": 4, "num_workers": 2, "multiprocessing_context": method}
    full = _ds(caches).to_torch_batches(6, **kw)
    first, second = ([b["sample_id"].tolist() for b in full] for _ in range(2))
    dl = _ds(caches).to_torch_batches(6, **kw)
    it = iter(dl)
    head = [next(it)["sample_id"].tolist() for _ in range(4)]
    state = dl.state_dict()
    assert state["batches"] == 4 and state["rows"] == 24
    del it
    resumed = _ds(caches).to_torch_batches(6, **{**kw, "num_workers": 1})  # another worker count
    resumed.load_state_dict(state)
    rest = [b["sample_id"].tolist() for b in resumed]
    assert head + rest == first
    assert [b["sample_id"].tolist() for b in resumed] == second  # later epochs follow the same stream
    # one item is one batch of the same plan: the per-sample loader resumes the same state
    plain = _ds(caches).to_torch_dataloader(batch_size=6, seed=4, num_workers=0, verbose=False, collate_fn=ids)
    plain.load_state_dict(state)
    assert [[s for _c, s in batch] for batch in plain] == rest
    other = _ds(caches).to_torch_dataloader(batch_size=5, seed=4, num_workers=0, verbose=False)
    with pytest.raises(ConfigError, match="batch_size differs"):
        other.load_state_dict(state)


def test_two_ranks_share_the_plan(monkeypatch, caches):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    payloads = _payloads(caches)
    single = _ds(caches).to_torch_dataloader(batch_size=4, seed=3, collate_fn=ids, num_workers=0, verbose=False)
    whole = Counter(tuple(p) for batch in single for p in batch)
    seen = Counter()
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            reference = _ds(caches).to_torch_dataloader(
                batch_size=4, seed=3, collate_fn=ids, num_workers=0, verbose=False
            )
            dl = _ds(caches).to_torch_batches(4, shuffle=True, seed=3, num_workers=2, multiprocessing_context="fork")
            main = _ds(caches).to_torch_batches(4, shuffle=True, seed=3, num_workers=0)
        want = list(reference)
        assert dl.rank == rank and dl.world_size == 2 and dl.padded_rows == reference.padded_rows == 1
        _check(list(dl), want, payloads)
        _check(list(main), want, payloads)
        seen.update(tuple(p) for batch in want for p in batch)
    # the ranks together read the single-rank plan, plus one padding row read twice
    assert whole - seen == Counter() and sum((seen - whole).values()) == 1


def test_ragged_values_projection_and_argument_errors(tmp_path):
    spec = drt.PayloadSpec("int16", (None,))
    items = [(np.arange(i % 7, dtype=np.int16) + i, {"i": i}) for i in range(30)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(
            [ListSource("r", items)], tmp_path, writer_config=writer_config("zstd", payload_spec=spec)
        )
    ds = _ds([res.path])
    [ragged] = list(ds.to_torch_batches(30, num_workers=1, multiprocessing_context="fork"))
    assert ragged["offsets"].tolist() == np.cumsum([0] + [i % 7 for i in range(30)]).tolist()
    assert ragged["shapes"][:, 0].tolist() == [i % 7 for i in range(30)]
    assert ragged["values"].tolist() == np.concatenate([d for d, _ in items]).tolist()
    assert _one_storage(ragged, ["values", "offsets", "shapes", "cache_id", "sample_id"])
    [fixed] = list(ds.to_torch_batches(30, num_workers=1, multiprocessing_context="spawn", length=4, pad=-1))
    assert fixed["payload"].shape == (30, 4) and fixed["payload"][3].tolist() == [3, 4, 5, -1]
    assert _one_storage(fixed, ["payload", "cache_id", "sample_id"]) and fixed["sample_id"].tolist() == list(range(30))
    with pytest.raises(ConfigError, match="pad=.* is not a int16 value"):
        ds.to_torch_batches(30, length=4, pad=1 << 20)
    with pytest.raises(ConfigError, match="no metadata column 'nope'"):
        ds.to_torch_batches(30, columns=["nope"])
    with pytest.raises(ArgumentTypeError, match="columns must be a list"):
        ds.to_torch_batches(30, columns="i")
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        ds.to_torch_batches(0)
    with pytest.raises(ArgumentTypeError, match="batch_transform must be picklable"):
        ds.to_torch_batches(30, num_workers=1, batch_transform=lambda item: item)
