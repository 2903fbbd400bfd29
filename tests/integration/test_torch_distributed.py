"""Multi-rank `to_torch_dataloader` (docs/distributed.md): every rank's share of one global plan
(ranks simulated in-process through the torchrun environment variables), exact and elastic
resume, and real
`torchrun --standalone --nproc-per-node=2` launches (gloo, CPU) checked against the in-process plan.
The rank-share arithmetic against reference §3.3 and the layouts are torch-free:
tests/unit/integrations/test_torch_plan.py.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import warnings
from collections import Counter
from itertools import chain

import polars as pl
import pytest

torch = pytest.importorskip("torch")

import datasetrt as drt  # noqa: E402
from datasetrt._native.draws import derive_seed  # noqa: E402
from datasetrt.errors import ConfigError  # noqa: E402
from datasetrt.integrations.torch import distributed as dtorch  # noqa: E402
from datasetrt.integrations.torch.distributed import capture_replica  # noqa: E402
from datasetrt.integrations.torch.plan import rank_count, rank_share  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
CONFIGS = {  # 43 rows (caches of 29 + 14)
    "shuffled_pad": {"seed": 7, "batch_size": 4},
    "sequential_drop": {"shuffle": False, "batch_size": 6, "drop_last": True},
    "weighted_split": {
        "seed": 11,
        "worker_partition": "split",
        "batch_size": 3,
        "samples_per_epoch": 25,
        "update": True,
    },
    "random_seed": {"seed": "random", "batch_size": 8, "samples_per_epoch": 20},
}


def weighted_view(df):
    return df.filter(pl.col("kept")).with_columns(weight=pl.col("score") + 1.0)


def ids(batch) -> list[list[int]]:
    return [[s.cache_id, s.sample_id] for s in batch]


@pytest.fixture
def paths(write_caches):
    return [str(p) for p in write_caches({"d0": 29, "d1": 14})]


def open_ds(paths, update=False, runtime=None):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=0), runtime=runtime)
    if update:
        ds.update_metadata(weighted_view(ds.get_metadata()))
    return ds


def make(ds, kw, **more):
    kw = {k: v for k, v in kw.items() if k != "update"}
    return ds.to_torch_dataloader(**{"verbose": False, "collate_fn": ids, "num_workers": 0, **kw, **more})


def at_rank(monkeypatch, rank, world):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def rank_runs(monkeypatch, paths, kw, world, epochs=2, **more):
    """{rank: (loader, [epoch batches])} with ranks simulated through RANK / WORLD_SIZE."""
    out = {}
    for r in range(world):
        at_rank(monkeypatch, r, world)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dl = make(open_ds(paths, kw.get("update", False)), kw, **more)
        out[r] = (dl, [list(dl) for _ in range(epochs)])
    return out


def single_plan(monkeypatch, paths, kw, epochs=2):
    """Per epoch, the flat sample list of the single-process (R=1) loader."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dl = make(open_ds(paths, kw.get("update", False)), kw)
        return [[s for b in dl for s in b] for _ in range(epochs)]


def is_subsequence(part, whole) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def check_shares(plan_epochs, rank_epochs, world, batch_size, drop_last):
    """The ranks' samples together are the single-process plan with dataset-rt's pad/drop rule,
    each rank in plan order, with equal batch counts."""
    for e, plan in enumerate(plan_epochs):
        n = len(plan)
        per = rank_count(n, world, batch_size, drop_last)
        extended = [plan[i % n] for i in range(per * world)]
        mine = [[s for b in rank_epochs[r][e] for s in b] for r in range(world)]
        assert {len(rank_epochs[r][e]) for r in range(world)} == {math.ceil(per / batch_size)}
        assert all(len(m) == per and is_subsequence(m, extended) for m in mine)
        assert Counter(map(tuple, list(chain.from_iterable(mine)))) == Counter(map(tuple, extended))


# -- in-process ranks (RANK / WORLD_SIZE) -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["shuffled_pad", "sequential_drop", "weighted_split"])
@pytest.mark.parametrize("world", [2, 3])
def test_env_ranks_share_the_single_process_plan(monkeypatch, paths, name, world):
    kw = CONFIGS[name]
    runs = rank_runs(monkeypatch, paths, kw, world)
    check_shares(
        single_plan(monkeypatch, paths, kw),
        [runs[r][1] for r in range(world)],
        world,
        kw["batch_size"],
        kw.get("drop_last", False),
    )
    n = kw.get("samples_per_epoch", 43)
    share = rank_share(n, world, kw["batch_size"], kw.get("drop_last", False))
    for r, (dl, _) in runs.items():
        assert (dl.rank, dl.world_size, len(dl.dataset)) == (r, world, share.per_rank)
        assert (dl.padded_rows, dl.dropped_rows, dl.global_samples_per_pass) == (
            share.padded,
            share.discarded,
            share.effective,
        )
        if kw.get("shuffle", True):
            assert dl.dataset.worker_seeds == (derive_seed(kw["seed"], r, 0),)


def test_warning_on_rank_zero_only(monkeypatch, paths):
    kw = {"seed": 1, "batch_size": 4}
    for rank, expected in [
        (
            0,
            [
                "samples_per_epoch adjusted: requested 43 global samples, effective 45; "
                "padded 2 for equal rank batch counts"
            ],
        ),
        (1, []),
        (2, []),
    ]:
        at_rank(monkeypatch, rank, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make(open_ds(paths), kw)
        assert [str(w.message) for w in caught if w.category is UserWarning] == expected


def test_workers_and_runtime_yield_the_rank_batches(monkeypatch, paths, runtime):
    kw = {"seed": 5, "batch_size": 3, "samples_per_epoch": 40}
    serial = rank_runs(monkeypatch, paths, kw, 2, epochs=3)
    forked = rank_runs(monkeypatch, paths, kw, 2, epochs=3, num_workers=2, multiprocessing_context="fork")
    assert all(forked[r][1] == serial[r][1] for r in range(2))
    at_rank(monkeypatch, 1, 2)
    dl = make(open_ds(paths, runtime=runtime), kw)  # num_workers=0: the runtime's reader processes read
    assert [list(dl) for _ in range(3)] == serial[1][1]


def test_topology_sources_and_refusals(monkeypatch, paths):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (capture_replica().rank, capture_replica().world_size) == (0, 1)
    at_rank(monkeypatch, 1, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert capture_replica() == dtorch.Replica(1, 4, 2, False)
    with pytest.raises(ConfigError, match="pass an explicit seed"):
        make(open_ds(paths), {"batch_size": 2})  # seed="random" without a process group
    assert make(open_ds(paths), {"shuffle": False, "batch_size": 2}).rank == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "5")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE must be between 1 and the world size 4"):
        capture_replica()
    at_rank(monkeypatch, 4, 4)
    with pytest.raises(ConfigError, match="0 <= RANK < WORLD_SIZE"):
        capture_replica()


def test_rank_zero_seed_is_adopted_and_plan_mismatch_refused(monkeypatch, paths):
    sent = []

    def broadcast(objects, src):  # one process plays rank 0, then rank 1
        if objects[0] is None:
            objects[0] = sent[-1]
        else:
            sent.append(objects[0])

    monkeypatch.setattr(dtorch.torch_distributed, "broadcast_object_list", broadcast)
    for rank, batch in [(0, 4), (1, 4), (1, 3)]:
        monkeypatch.setattr(dtorch, "capture_replica", lambda r=rank: dtorch.Replica(r, 2, 2, True))
        if batch == 3:
            with pytest.raises(ConfigError, match="rank 1 differs from rank 0: batch_size .rank 0 4, here 3."):
                make(open_ds(paths), {"batch_size": batch})
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                seeds = make(open_ds(paths), {"batch_size": batch}).seed
            assert seeds == sent[0][0]


# -- resume: exact per rank, elastic across world sizes ------------------------------------------------


def resume(monkeypatch, paths, kw, state, rank, world, epochs=2, **more):
    at_rank(monkeypatch, rank, world)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dl = make(open_ds(paths, kw.get("update", False)), kw, **more)
    dl.load_state_dict(json.loads(json.dumps(state)))
    return [list(dl) for _ in range(epochs)]


@pytest.mark.parametrize("name", ["shuffled_pad", "sequential_drop", "weighted_split"])
def test_resume_is_exact_per_rank(monkeypatch, paths, name):
    kw = CONFIGS[name]
    full = rank_runs(monkeypatch, paths, kw, 2)
    for cut in (1, len(full[0][0]) - 1):
        for r in range(2):
            at_rank(monkeypatch, r, 2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                dl = make(open_ds(paths, kw.get("update", False)), kw)
            it = iter(dl)
            head = [next(it) for _ in range(cut)]
            state = dl.state_dict()
            assert (state["epoch"], state["batches"], state["world_size"]) == (0, cut, 2)
            assert state["rows"] == cut * 2 * kw["batch_size"]
            rest = resume(monkeypatch, paths, kw, state, r, 2, num_workers=2, multiprocessing_context="fork")
            assert [head + rest[0], rest[1]] == full[r][1]


def test_elastic_resume_continues_the_global_sequence(monkeypatch, paths):
    kw = {"seed": 3, "batch_size": 4}  # 43 rows per pass
    plan = single_plan(monkeypatch, paths, kw, epochs=2)
    at_rank(monkeypatch, 0, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dl = make(open_ds(paths), kw)
    it = iter(dl)
    [next(it) for _ in range(3)]  # every rank delivered 3 batches: plan positions [0, 24) are consumed
    state = dl.state_dict()
    assert state["rows"] == 24
    one = resume(monkeypatch, paths, kw, state, 0, 1)  # one rank: exactly the rest of the plan, then epoch 1
    assert [[s for b in e for s in b] for e in one] == [plan[0][24:], plan[1]]
    three = {r: resume(monkeypatch, paths, kw, state, r, 3) for r in range(3)}
    rest = plan[0][24:] + plan[0][:2]  # 19 rows on 3 ranks: 7 each, the pass's first 2 rows padded
    assert Counter(tuple(s) for r in range(3) for b in three[r][0] for s in b) == Counter(map(tuple, rest))
    assert {len(three[r][0]) for r in range(3)} == {2}
    fresh = rank_runs(monkeypatch, paths, kw, 3)
    assert all(three[r][1] == fresh[r][1][1] for r in range(3))  # then epoch 1 as 3 ranks read it
    v1 = {k: v for k, v in state.items() if k not in ("rows", "world_size", "rank")}
    v1.update(version=1, batches=6)  # a single-rank state of the previous format: 6 batches of 4
    assert resume(monkeypatch, paths, kw, v1, 0, 1)[0] == one[0]


# -- torchrun --standalone --nproc-per-node=2 ----------------------------------------------------------------

SCRIPT = """
import json, sys, warnings
import polars as pl
import torch.distributed as dist
import datasetrt as drt

{weighted_view}

def ids(batch):
    return [[s.cache_id, s.sample_id] for s in batch]

def main():
    args = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = {{"rank": rank, "world": dist.get_world_size(), "runs": {{}}}}
    extra = {{"num_workers": args["workers"], "verbose": False, "collate_fn": ids}}
    for name, kw in args["configs"].items():
        kw = dict(kw)
        if args["workers"]:  # spawn (dataset-rt's default) costs a torch import per worker: once
            extra["multiprocessing_context"] = "spawn" if name == "weighted_split" else "fork"
        def build(**more):
            ds = drt.CachedDataset(args["paths"], reader_config=drt.ReaderConfig(seed=0))
            if kw.get("update"):
                ds.update_metadata(weighted_view(ds.get_metadata()))
            return ds.to_torch_dataloader(**({{k: v for k, v in kw.items() if k != "update"}} | extra | more))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dl = build()
        epochs = [list(dl) for _ in range(2)]
        it = iter(dl2 := build(**({{"seed": dl.seed}} if dl.seed is not None else {{}})))
        head = next(it)
        state = dl2.state_dict()
        del it
        dl3 = build()
        dl3.load_state_dict(state)
        out["runs"][name] = {{
            "epochs": epochs, "batches": len(dl), "seed": dl.seed, "padded": dl.padded_rows,
            "dropped": dl.dropped_rows, "resumed": [head] + list(dl3), "state_seed": state["seed"],
            "warnings": [str(w.message) for w in caught if w.category is UserWarning
                         and "samples_per_epoch" in str(w.message)]}}
    with open(f"{{args['out']}}/rank{{rank}}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def torchrun(tmp_path, paths, workers, tag):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT.format(weighted_view=inspect.getsource(weighted_view)))
    out = tmp_path / tag
    out.mkdir()
    args = json.dumps({"paths": paths, "workers": workers, "configs": CONFIGS, "out": str(out)})
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script), args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def check_launch(monkeypatch, paths, ranks):
    """Each rank's batches are the in-process rank simulation's (hence their union is the
    single-process plan with the pad/drop rule), warnings on rank 0 only, exact resume."""
    assert [(o["rank"], o["world"]) for o in ranks] == [(0, 2), (1, 2)]
    for name, kw in CONFIGS.items():
        got = [o["runs"][name] for o in ranks]
        seed = got[0]["seed"]
        assert got[1]["seed"] == seed and got[0]["state_seed"] == seed  # rank 0's random seed, broadcast
        explicit = {**kw, "seed": seed} if kw.get("shuffle", True) else kw
        expected = rank_runs(monkeypatch, paths, explicit, 2)
        assert [g["epochs"] for g in got] == [expected[r][1] for r in range(2)]
        check_shares(
            single_plan(monkeypatch, paths, explicit),
            [g["epochs"] for g in got],
            2,
            kw["batch_size"],
            kw.get("drop_last", False),
        )
        share = rank_share(kw.get("samples_per_epoch", 43), 2, kw["batch_size"], kw.get("drop_last", False))
        assert [g["warnings"] for g in got] == [[share.message] if share.message else [], []]
        assert all(
            (g["padded"], g["dropped"], g["batches"]) == (share.padded, share.discarded, len(expected[0][1][0]))
            for g in got
        )
        assert all(g["resumed"] == g["epochs"][0] for g in got)


def test_torchrun_two_ranks_and_rerun(monkeypatch, paths, tmp_path):
    first = torchrun(tmp_path, paths, 0, "first")
    check_launch(monkeypatch, paths, first)
    again = torchrun(tmp_path, paths, 0, "again")
    for a, b in zip(first, again, strict=True):
        for name in CONFIGS:
            if name != "random_seed":
                assert a["runs"][name] == b["runs"][name]
    assert first[0]["runs"]["random_seed"]["seed"] != again[0]["runs"]["random_seed"]["seed"]


def test_torchrun_one_worker_per_rank(monkeypatch, paths, tmp_path):
    check_launch(monkeypatch, paths, torchrun(tmp_path, paths, 1, "workers"))
