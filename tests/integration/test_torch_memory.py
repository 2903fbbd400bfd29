"""Issue 4's memory requirement: per-worker PSS of `to_torch_dataloader` must not grow with the
table size beyond what is mapped and shared.

Tree PSS (parent + torch workers; PSS splits each shared page between the processes mapping it,
so the sum counts it once) is sampled while K=1 and K=4 fork workers read 200 shuffled batches
of 256 from a weighted, filtered population (`update_metadata`) of ~1,000,000 rows, and the same
over ~10,000 rows. The K=4 - K=1 growth over the big table may exceed the small table's (3 x the
per-worker constant) only by a small slack. A torch DataLoader over the same 1M rows held as a
Python list of dicts (the copy-on-write growth torch users hit: every row a worker touches
un-shares the page holding its refcount) is measured the same way and must grow more.

Fork on purpose: spawned workers import torch again (~200 MiB PSS each, docs/memory-guide.md),
a constant per worker that would swamp, not reveal, growth with the table. With fork the workers
share the parent's population arrays (numpy, copy-on-write, never written) and map index.bin /
checksums read-only; spawn ships the same population as a mapped Arrow snapshot instead.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from pathlib import Path

import polars as pl
import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import datasetrt as drt  # noqa: E402
from benchmarks.common import PeakPss, tree_pss_bytes  # noqa: E402
from datasetrt.format.layout import cache_id_for  # noqa: E402

pytestmark = [
    pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

MIB = 1 << 20
BIG, SMALL = 1_000_000, 10_000
COPIES = 4  # one written cache + 3 hard-linked copies with their own manifests
BATCHES, BATCH_SIZE = 200, 256
SLACK = 48 * MIB  # 16 MiB per extra worker: a private copy of >= ~17 B per row fails
REPEATS = 2


class TinySource:
    """`count` 8-byte payloads with metadata {"label": str, "n": int, "x": float}."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        make = drt.CacheInput
        for i in range(self.count):
            yield make(i.to_bytes(8, "little"), {"label": f"l{i % 5}", "n": i, "x": i * 0.5})


def write_caches(base: Path, rows: int) -> list[Path]:
    """`rows` samples in COPIES caches: one written, the others hard links of its files with a
    rewritten manifest (own source_name and cache_id), as benchmarks.foundation.make_many_caches."""
    rt = drt.DatasetRuntime(num_workers=1)
    try:
        [written] = rt.write_cache(
            [TinySource("c0", rows // COPIES)], base, writer_config=drt.WriterConfig(show_progress=False)
        )
    finally:
        rt.close()
    assert isinstance(written, drt.CacheWriteSuccess), written
    seed = Path(written.path)
    manifest = json.loads((seed / "manifest.json").read_text())
    paths = [seed]
    for k in range(1, COPIES):
        name = f"c{k}"
        d = base / name
        (d / "shards").mkdir(parents=True)
        for rel in (
            "index.bin",
            "metadata.arrow",
            "checksums.xxh3",
            *(f"shards/{s['name']}" for s in manifest["shards"]),
        ):
            os.link(seed / rel, d / rel)
        (d / "manifest.json").write_text(json.dumps(dict(manifest, source_name=name, cache_id=cache_id_for(name))))
        paths.append(d)
    return paths


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """{"big": paths of 1M rows, "small": paths of 10k rows}; written once, in parallel threads."""
    base = tmp_path_factory.mktemp("torch-memory")
    out: dict[str, list[Path]] = {}
    errors: list[BaseException] = []

    def job(key: str, rows: int) -> None:
        try:
            out[key] = write_caches(base / key, rows)
        except BaseException as error:  # re-raised in the test thread
            errors.append(error)

    threads = [threading.Thread(target=job, args=item) for item in (("big", BIG), ("small", SMALL))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def weighted(paths: list[Path]) -> drt.CachedDataset:
    """A dataset whose active table is filtered (drops n % 10 == 0) with non-uniform weights, so
    the loader plan is a weighted population with its own arrays (and snapshot under spawn)."""
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, shuffle=True), runtime=None)
    df = ds.get_metadata()
    ds.update_metadata(df.filter(pl.col("n") % 10 != 0).with_columns(weight=(pl.col("n") % 7 + 1).cast(pl.Float64)))
    return ds


def measure(make_loader, batches: int = BATCHES) -> dict[str, int]:
    """Tree PSS before the loader exists, and its peak while `batches` batches are read (sampled
    every 20 ms by PeakPss's thread); workers are shut down before returning."""
    gc.collect()
    base = tree_pss_bytes()
    loader = make_loader()
    read = 0
    with PeakPss(interval_s=0.02) as pss:
        it = iter(loader)
        for _ in range(batches):
            next(it)
            read += 1
        pss.sample()
    it._shutdown_workers()
    del it, loader
    gc.collect()
    assert read == batches
    return {"base": base, "peak": pss.peak, "growth": pss.peak - base}


def ours(ds: drt.CachedDataset, workers: int):
    """Passes of BATCHES x BATCH_SIZE weighted draws (with replacement), whatever the table size."""
    return lambda: ds.to_torch_dataloader(
        num_workers=workers,
        batch_size=BATCH_SIZE,
        multiprocessing_context="fork",
        persistent_workers=True,
        seed=1,
        shuffle=True,
        verbose=False,
        samples_per_epoch=BATCHES * BATCH_SIZE,
    )


class ListOfDicts(Dataset):
    """The usual map-style dataset: one Python dict per row, held in a list."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def plain(dataset: Dataset, workers: int):
    return lambda: DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context="fork",
        persistent_workers=True,
        generator=torch.Generator().manual_seed(1),
    )


def mib(value: int) -> str:
    return f"{value / MIB:7.1f} MiB"


def report(name: str, k1: dict[str, int], k4: dict[str, int]) -> int:
    growth = k4["growth"] - k1["growth"]
    print(
        f"\n{name}: K=1 tree PSS {mib(k1['peak'])} (+{mib(k1['growth'])} over {mib(k1['base'])}); "
        f"K=4 {mib(k4['peak'])} (+{mib(k4['growth'])} over {mib(k4['base'])}); K4 - K1 growth {mib(growth)}"
    )
    return growth


@pytest.fixture(scope="module")
def figures(caches):
    """K=1 and K=4 growth of to_torch_dataloader over the small and the big weighted table."""
    small, big = weighted(caches["small"]), weighted(caches["big"])
    assert 8_000 <= len(small) < SMALL and 800_000 <= len(big) < BIG
    measure(ours(small, 1), batches=10)  # warm-up: one-time imports and allocations of the parent
    out = {}
    for name, ds in (("small", small), ("big", big)):
        # the least growth of REPEATS runs each: a peak catches transient allocations too
        k1 = min((measure(ours(ds, 1)) for _ in range(REPEATS)), key=lambda m: m["growth"])
        k4 = min((measure(ours(ds, 4)) for _ in range(REPEATS)), key=lambda m: m["growth"])
        out[name] = report(f"datasetrt {name} ({len(ds):,} rows)", k1, k4)
    return out


def test_worker_pss_does_not_grow_with_table_size(figures):
    per_worker = figures["small"] / 3
    print(f"per-worker constant (10k rows): {mib(int(per_worker))}; 1M-row K4 - K1: {mib(figures['big'])}")
    assert figures["big"] <= figures["small"] + SLACK, (
        f"4 fork workers over ~1M rows grow tree PSS by {mib(figures['big'])} over 1 worker, "
        f"against {mib(figures['small'])} over ~10k rows (+{mib(SLACK)} slack allowed)"
    )


def test_list_of_dicts_grows_more(figures):
    """The failure the requirement guards against, demonstrated: the same rows as Python dicts."""
    rows = [{"data": i.to_bytes(8, "little"), "label": f"l{i % 5}", "n": i, "x": i * 0.5} for i in range(BIG)]
    dataset = ListOfDicts(rows)
    try:
        k1, k4 = measure(plain(dataset, 1)), measure(plain(dataset, 4))
    finally:
        del dataset, rows
        gc.collect()
    growth = report(f"torch list of dicts ({BIG:,} rows)", k1, k4)
    print(f"list-of-dicts K4 - K1 growth {mib(growth)} vs datasetrt {mib(figures['big'])}")
    assert growth > figures["big"]
