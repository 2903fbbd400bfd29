"""Shuffle quality of datasetrt's orders beside MosaicML Streaming's shard-aware shuffles, on the
same records: S shards of R records (default 64 x 2,000), batches of B (default 256).

Orders (each one epoch's sequence of record ids; record id = storage order, shard after shard):
a full permutation (`sampling="permutation"`, `EpochPermutation`), datasetrt's locality-aware
epochs (`sampling="locality"`, `LocalityPermutation`) with W in {1, 2, 4, 8, 16} shards per
window, dataset-rt's draws with replacement (`sampling="draws"`), and Streaming's shuffles
(`streaming.base.shuffle.get_shuffle`: py1e, py1br, py1b, py1s, py2s, naive, where the installed
version has them) as one node, one rank, one worker reads them (`get_partitions` then the
shuffle, as `StreamingDataset` does), with Streaming's defaults for one node (num_canonical_nodes
1, or 64 for py1s / py2s; shuffle_block_size max(4,000,000 // NCN, 2^18)) and with a block of 8
shards' records (the cache a W=8 locality order needs). Streaming runs in a child process of the
peer interpreter (`--peer-python`, default /tmp/peervenv/bin/python): it imports only
`streaming.base.shuffle` and `streaming.base.partition` (pure numpy) and hands the orders back as
.npy files; without that interpreter the peer rows are skipped.

The metrics (docs/sampling.md, "Shuffle quality"):
- diversity: mean distinct shards per aligned batch of B, divided by its expectation under a
  uniformly random permutation (exact, hypergeometric): 1.0 mixes batches as a full shuffle does.
- |rho| storage: |Spearman correlation| between a record's epoch position and its storage index:
  how much of the storage order leaks into the epoch (0: none).
- |rho| epochs: |Spearman correlation| between a record's positions in epochs 0 and 1 (0:
  independent epochs; "n/a" for draws, whose epochs repeat records).
- shard KS: mean over shards of the Kolmogorov-Smirnov distance between the epoch positions of
  the shard's records (divided by the epoch length) and the uniform distribution: how far a
  shard's records are from being spread over the whole epoch (about 0.87/sqrt(records per shard)
  for a full shuffle; about 0.75 when each shard is read in one go at a random point).
- cache shards: the most shards open at once (first record read, last not yet), i.e. the node
  cache, in shards, that downloads each shard once per epoch.
- LRU loads: shard downloads per epoch through an LRU node cache of 9 shards (W=8 plus the one
  being fetched), as a multiple of the shard count (1.0: each shard once).
Then a rank table: datasetrt's locality order (W=8) on R ranks reading steps of R batches, as the
torch loaders lay it out, rank-local (`RankedLocality`, the default) vs the plain interleaved
layout: distinct shards a rank reads per epoch, the fraction of its reads from its own shards.

Usage: python -m benchmarks.shuffle_quality [--smoke] [--shards S] [--records R] [--batch B]
       [--peer-python PATH | --no-peers] [--out PATH.md]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasetrt._native import draws
from datasetrt.sampling import EpochPermutation
from datasetrt.sampling.locality import LocalityPermutation
from datasetrt.sampling.ranks import RankedLocality, RankSplit

SEED = 20240601
WINDOWS = (1, 2, 4, 8, 16)
PEER_ALGOS = ("py1e", "py1br", "py1b", "py1s", "py2s", "naive")
LRU_SHARDS = 9
PEER_PYTHON = "/tmp/peervenv/bin/python"

PEER_SCRIPT = r"""
import importlib.metadata, importlib.util, json, os, sys, types
import numpy as np

args = json.loads(sys.argv[1])
root = importlib.util.find_spec("streaming").submodule_search_locations[0]
for name, sub in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
    module = types.ModuleType(name)  # the packages' __init__ import torch and torchvision: skipped
    module.__path__ = [sub]
    sys.modules[name] = module
from streaming.base.partition import get_partitions
from streaming.base.shuffle import algos, get_shuffle

sizes = np.array(args["shard_sizes"], dtype=np.int64)
total = int(sizes.sum())
out = {"version": importlib.metadata.version("mosaicml-streaming"), "algos": sorted(algos), "runs": []}
for k, cfg in enumerate(args["configs"]):
    algo = cfg["algo"]
    run = {"algo": algo, "block": cfg["block"], "files": []}
    out["runs"].append(run)
    if algo not in algos:
        run["error"] = "not in this version"
        continue
    ncn = 64 if algo in ("py1s", "py2s") else 1
    block = cfg["block"] or max(4_000_000 // ncn, 1 << 18)
    run.update(ncn=ncn, block_size=block)
    try:
        for epoch in args["epochs"]:
            ids = get_partitions("relaxed", total, ncn, 1, 1, 1, args["batch"], 0, None).reshape(-1)
            ids = ids[ids != -1]
            order = get_shuffle(algo, sizes, ncn, args["seed"], epoch, block)[ids]
            path = os.path.join(args["out"], f"{k}-{epoch}.npy")
            np.save(path, order.astype(np.int64))
            run["files"].append(path)
    except Exception as exc:  # a peer failure is a row's note
        run["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass
class Row:
    name: str
    epochs: list[np.ndarray] | None  # record ids per epoch (None: the row is a note)
    note: str = ""


# -- metrics ----------------------------------------------------------------------------------


def expected_distinct(shard_sizes: np.ndarray, batch: int) -> float:
    """E[distinct shards among `batch` records drawn without replacement from all records]."""
    total = int(shard_sizes.sum())

    def log_choose(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    miss = [
        0.0 if total - n < batch else math.exp(log_choose(total - n, batch) - log_choose(total, batch))
        for n in shard_sizes.tolist()
    ]
    return float(len(shard_sizes) - sum(miss))


def diversity(shard: np.ndarray, batch: int, expected: float) -> float:
    whole = len(shard) // batch * batch
    rows = np.sort(shard[:whole].reshape(-1, batch), axis=1)
    distinct = (np.diff(rows, axis=1) != 0).sum(axis=1) + 1
    return float(distinct.mean()) / expected


def ranks_of(values: np.ndarray) -> np.ndarray:
    out = np.empty(len(values), dtype=np.float64)
    out[np.argsort(values, kind="stable")] = np.arange(len(values), dtype=np.float64)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(ranks_of(a), ranks_of(b))[0, 1])


def shard_ks(shard: np.ndarray, shards: int) -> float:
    """Mean over shards of the KS distance of the shard's records' positions / n from U(0, 1)."""
    n = len(shard)
    by_shard = np.argsort(shard, kind="stable")  # positions grouped by shard, increasing within one
    bounds = np.searchsorted(shard[by_shard], np.arange(shards + 1))
    out = []
    for s in range(shards):
        x = by_shard[bounds[s] : bounds[s + 1]] / n
        if len(x):
            i = np.arange(1, len(x) + 1) / len(x)
            out.append(max(float((i - x).max()), float((x - (i - 1 / len(x))).max())))
    return float(np.mean(out))


def cache_shards(shard: np.ndarray, shards: int) -> int:
    """Most shards open at once: read from before, and read again later."""
    n = len(shard)
    first = np.full(shards, n, dtype=np.int64)
    last = np.full(shards, -1, dtype=np.int64)
    np.minimum.at(first, shard, np.arange(n))
    np.maximum.at(last, shard, np.arange(n))
    seen = first < n
    events = np.zeros(n + 1, dtype=np.int64)
    np.add.at(events, first[seen], 1)
    np.add.at(events, last[seen] + 1, -1)
    return int(np.cumsum(events).max())


def lru_loads(shard: np.ndarray, capacity: int) -> int:
    """Shard loads through an LRU cache of `capacity` shards (runs of one shard collapsed)."""
    runs = shard[np.r_[True, shard[1:] != shard[:-1]]].tolist()
    cache: OrderedDict[int, None] = OrderedDict()
    loads = 0
    for s in runs:
        if s in cache:
            cache.move_to_end(s)
            continue
        loads += 1
        cache[s] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return loads


def measure(row: Row, label: np.ndarray, shard_sizes: np.ndarray, batch: int) -> list[str]:
    assert row.epochs is not None
    first, second = row.epochs
    shard = label[first]
    expected = expected_distinct(shard_sizes, batch)
    exactly_once = bool((np.bincount(first, minlength=len(label)) == 1).all())
    if exactly_once:
        pos0, pos1 = np.empty_like(first), np.empty_like(second)
        pos0[first], pos1[second] = np.arange(len(first)), np.arange(len(second))
        epochs = f"{abs(spearman(pos0, pos1)):.3f}"
    else:
        epochs = "n/a"
    shards = len(shard_sizes)
    return [
        row.name,
        f"{diversity(shard, batch, expected):.3f}",
        f"{abs(spearman(np.arange(len(first)), first)):.3f}",
        epochs,
        f"{shard_ks(shard, shards):.3f}",
        str(cache_shards(shard, shards)),
        f"{lru_loads(shard, LRU_SHARDS) / shards:.1f}",
    ]


# -- orders -----------------------------------------------------------------------------------


def datasetrt_rows(shard_sizes: np.ndarray, windows: tuple[int, ...]) -> list[Row]:
    label = np.repeat(np.arange(len(shard_sizes)), shard_sizes)
    n = len(label)
    full = EpochPermutation(SEED, n)
    rows = [Row('datasetrt sampling="permutation" (full permutation)', [full.rows(0, n), full.rows(n, n)])]
    for w in windows:
        order = LocalityPermutation(SEED, label, w)
        rows.append(Row(f'datasetrt sampling="locality", W={w}', [order.rows(0, n), order.rows(n, n)]))
    drawn = [draws.uniform_draws(SEED, n, e * n, n).astype(np.int64) for e in range(2)]
    rows.append(Row('datasetrt sampling="draws" (dataset-rt, with replacement)', drawn))
    return rows


def peer_rows(shard_sizes: np.ndarray, batch: int, peer_python: str | None, block: int) -> list[Row]:
    """Streaming's orders from the peer interpreter; notes when it is missing or fails."""
    if peer_python is None:
        return []
    if not Path(peer_python).exists():
        return [Row("MosaicML Streaming", None, f"skipped: no peer interpreter at {peer_python}")]
    configs = [{"algo": a, "block": None} for a in PEER_ALGOS]
    configs += [{"algo": a, "block": block} for a in ("py1e", "py1br", "py1b")]
    with tempfile.TemporaryDirectory(prefix="shuffle-quality-") as out:
        args = {
            "shard_sizes": shard_sizes.tolist(),
            "batch": batch,
            "seed": SEED % (1 << 31),
            "epochs": [0, 1],
            "configs": configs,
            "out": out,
        }
        proc = subprocess.run(
            [peer_python, "-c", PEER_SCRIPT, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
            return [Row("MosaicML Streaming", None, f"peer run failed: {tail[0]}")]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        rows = []
        for run in report["runs"]:
            name = f"Streaming {report['version']} {run['algo']}"
            if "block_size" not in run:
                pass
            elif run["block"] is None:
                name += f" (defaults: NCN {run['ncn']}, block {run['block_size']:,})"
            else:
                name += f" (block {run['block']:,} = 8 shards)"
            if "error" in run:
                if all(r.name != name for r in rows):  # a missing algorithm: one note
                    rows.append(Row(name, None, run["error"]))
            else:
                rows.append(Row(name, [np.load(f) for f in run["files"]]))
        return rows


# -- ranks ------------------------------------------------------------------------------------


def rank_table(shard_sizes: np.ndarray, batch: int, window: int, worlds: tuple[int, ...]) -> list[list[str]]:
    label = np.repeat(np.arange(len(shard_sizes)), shard_sizes)
    n = len(label)
    base = LocalityPermutation(SEED, label, window)
    expected = expected_distinct(shard_sizes, batch)
    out = []
    for world in worlds:
        split = RankSplit(world, batch, False)
        rank, _j = split.locate(np.arange(n), n)
        for name, plan in (("rank-local", RankedLocality(base, split)), ("interleaved", base)):
            if world == 1 and name == "interleaved":
                continue
            rows = plan.rows(0, n)
            owner = plan.rank_blocks(0, n) if isinstance(plan, RankedLocality) else None
            touched, own, div = [], [], []
            for r in range(world):
                mine = rows[rank == r]
                touched.append(len(np.unique(label[mine])))
                div.append(diversity(label[mine], batch, expected))
                if owner is not None:
                    own.append(float((owner[rank == r] == r).mean()))
            out.append(
                [
                    str(world),
                    name if world > 1 else "(one rank)",
                    f"{np.mean(touched):.1f} / {max(touched)}",
                    f"{min(own):.3f}" if own else "-",
                    f"{np.mean(div):.3f}",
                ]
            )
    return out


# -- output -----------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (8 x 50 records, batch 16): checks the run")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--records", type=int, default=2_000, help="records per shard")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--peer-python", default=PEER_PYTHON, help="interpreter with mosaicml-streaming")
    parser.add_argument("--no-peers", action="store_true", help="datasetrt's rows only")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here (markdown)")
    args = parser.parse_args(argv)
    shards, records, batch = (8, 50, 16) if args.smoke else (args.shards, args.records, args.batch)
    windows = (1, 2, 4) if args.smoke else WINDOWS
    shard_sizes = np.full(shards, records, dtype=np.int64)
    label = np.repeat(np.arange(shards), shard_sizes)

    rows = datasetrt_rows(shard_sizes, windows)
    rows += peer_rows(shard_sizes, batch, None if args.no_peers else args.peer_python, 8 * records)
    header = [
        "order",
        "diversity",
        "abs rho storage",
        "abs rho epochs",
        "shard KS",
        "cache shards",
        f"LRU({LRU_SHARDS}) loads / shards",
    ]
    body = []
    for row in rows:
        body.append(
            measure(row, label, shard_sizes, batch)
            if row.epochs is not None
            else [row.name, row.note, "", "", "", "", ""]
        )
    worlds = (1, 2, 4) if args.smoke else (1, 2, 4, 8)
    window = min(8, windows[-1])
    uneven = np.random.default_rng(SEED).integers(records // 2, records * 3 // 2 + 1, shards)
    rank_header = ["ranks", "layout", "shards per rank (mean / max)", "own-shard reads (min rank)", "diversity"]
    text = (
        f"{shards} shards x {records:,} records, batches of {batch}, seed {SEED}\n\n"
        + table(header, body)
        + f"\n\nRanks (W={window}, batches of {batch} per rank, one epoch), shards of {records:,} records:\n\n"
        + table(rank_header, rank_table(shard_sizes, batch, window, worlds))
        + f"\n\nThe same with shards of {records // 2:,} to {records * 3 // 2:,} records ({int(uneven.sum()):,} in all):\n\n"
        + table(rank_header, rank_table(uneven, batch, window, worlds))
    )
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
