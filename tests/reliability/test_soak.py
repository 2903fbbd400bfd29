"""Soak: a short run in the default suite (CI), the long one opt-in with `-m slow`
(DATASETRT_SOAK_ITERATIONS sets its length, default 20,000): thousands of iterators over many caches, in-process and
through forked workers, with random filter/weight updates between them. Descriptors, children,
/dev/shm run directories and PSS must stay flat: the last quarter's maximum may not exceed the
warm-up baseline by more than a small allowance (allocator noise), never grow with iterations.
"""

from __future__ import annotations

import gc
import os
import random

import polars as pl
import psutil
import pytest

import datasetrt as drt
from tests.reliability import fd_count, live_children, reader_config, shm_entries, trackers, write_template

N_CACHES = 12
LONG_ITERATIONS = int(os.environ.get("DATASETRT_SOAK_ITERATIONS", "20000"))
PSS_ALLOWANCE = 64 << 20


def pss() -> int:
    return psutil.Process().memory_full_info().pss


@pytest.mark.parametrize(
    "iterations",
    [
        pytest.param(400, id="short"),
        pytest.param(LONG_ITERATIONS, id="long", marks=pytest.mark.slow),
    ],
)
def test_soak_iterators_with_weight_updates_stay_flat(tmp_path, iterations):
    algos = ["none", "lz4", "zstd"]
    caches = [
        write_template(tmp_path, f"soak-{k}", 200 + 13 * k, algos[k % 3], max_shard_bytes=8 << 10)
        for k in range(N_CACHES)
    ]
    rng = random.Random(6)
    with drt.DatasetRuntime(num_workers=2, start_method="fork") as rt:
        datasets = [
            drt.CachedDataset(caches, reader_config=reader_config(False, seed=k, shuffle=True), runtime=rt)
            for k in range(2)
        ]
        datasets.append(drt.CachedDataset(caches, reader_config=reader_config(False, seed=9)))
        base = datasets[0].get_metadata()

        def step(i: int) -> None:
            ds = datasets[i % len(datasets)]
            if rng.random() < 0.2:  # random filter + weights
                keep = base.filter(pl.col("index") % rng.randint(1, 4) == 0)
                weights = [rng.uniform(0.1, 5.0) for _ in range(keep.height)]
                ds.update_metadata(keep.with_columns(weight=pl.Series(weights)))
            ds.set_epoch_len(rng.randint(1, 400))
            it = iter(ds)
            for _ in range(rng.randint(0, 400)):  # often abandoned part-way
                if next(it, None) is None:
                    break
            del it

        for i in range(200):  # warm-up: pools, readers, allocator arenas
            step(i)
        gc.collect()
        fds, children, shm, mem = fd_count(), len(live_children()), shm_entries(), pss()
        tracker_count = len(trackers())
        peak_fds, peak_mem = 0, 0
        for i in range(iterations):
            step(i)
            if i >= 3 * iterations // 4 and i % 50 == 0:
                gc.collect()
                peak_fds, peak_mem = max(peak_fds, fd_count()), max(peak_mem, pss())
        gc.collect()
        assert fd_count() == fds and peak_fds <= fds
        assert len(live_children()) == children
        assert len(trackers()) == tracker_count
        assert shm_entries() == shm
        assert peak_mem - mem < PSS_ALLOWANCE, f"PSS grew {(peak_mem - mem) >> 20} MiB"
