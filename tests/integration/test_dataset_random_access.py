"""`ds[i]` and `ds[a:b:c]` (datasetrt/dataset/cached.py): rows of the active table in its order,
against the table itself and `get_item`, Python indexing, typed refusals, no cursor moved, reads
with a runtime's workers too, and no Polars or pyarrow imported by a plain index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from datasetrt.errors import ArgumentTypeError, SampleIndexError

ROOT = str(Path(__file__).resolve().parents[2])


def key(sample) -> tuple:
    return (sample.cache_id, sample.sample_id, sample.data, tuple(sorted(sample.metadata.items())))


@pytest.fixture
def paths(write_caches):
    return write_caches({"r0": 23, "r1": 17})


def table_rows(ds) -> list[tuple[int, int]]:
    md = ds.get_metadata()
    return list(zip(md["cache_id"].to_list(), md["sample_id"].to_list()))


def test_rows_follow_the_physical_table_then_the_active_one(paths):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=3), runtime=None)
    ids = table_rows(ds)
    assert len(ids) == 40 and [(s.cache_id, s.sample_id) for s in ds[:]] == ids
    assert key(ds[0]) == key(ds.get_item(*ids[0])) and key(ds[-1]) == key(ds.get_item(*ids[-1]))
    assert [key(s) for s in ds[30:5:-7]] == [key(ds.get_item(*ids[i])) for i in range(30, 5, -7)]
    assert ds[np.int64(24)].sample_id == 1 and ds[40:] == []
    md = ds.get_metadata()
    view = pl.concat([md.filter(pl.col("kept")).reverse(), md.head(3)])  # reordered, with duplicates
    ds.update_metadata(view.with_columns(weight=pl.col("score") + 1.0))
    active = table_rows(ds)
    assert len(active) == len(view) and [(s.cache_id, s.sample_id) for s in ds[:]] == active
    assert [(s.cache_id, s.sample_id) for s in (ds[-3], ds[-2], ds[-1])] == ids[:3]


def test_indexing_errors_are_typed_and_name_the_row(paths):
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=3), runtime=None)
    for bad in (40, -41, 2**64):
        with pytest.raises(SampleIndexError, match=rf"row {bad} is out of range for the active table's 40 rows"):
            ds[bad]
    for bad in (1.0, "3", True, None, (1, 2)):
        with pytest.raises(ArgumentTypeError, match="dataset indices must be integers or slices"):
            ds[bad]


def test_indexing_moves_no_cursor_and_ignores_the_order_and_epoch_length(paths, runtime):
    ordered = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=3, shuffle=False), runtime=None)
    ordered.set_epoch_len(5)
    first = [s.sample_id for s in ordered]
    assert [s.sample_id for s in ordered[:7]] == list(range(7)) and len(ordered) == 5
    assert [s.sample_id for s in ordered] == [5, 6, 7, 8, 9] and first == [0, 1, 2, 3, 4]
    ds = runtime.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=3))  # reader processes
    whole = [key(s) for s in ds[:]]
    shuffled = [key(s) for s in ds]
    assert shuffled != whole  # iteration draws in the sampling order; indexing is the table order
    assert [key(ds[i]) for i in (0, 17, 39)] == [whole[0], whole[17], whole[39]]


READ = """
import json, sys
import datasetrt as drt
ds = drt.CachedDataset(sys.argv[1:], reader_config=drt.ReaderConfig(seed=0), runtime=None)
out = {"ids": [ds[0].sample_id, ds[-1].sample_id, [s.sample_id for s in ds[2:5]]]}
out["imported"] = [m for m in ("polars", "pyarrow") if m in sys.modules]
print(json.dumps(out))
"""


def test_a_plain_index_imports_no_table_library(paths):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", READ, *map(str, paths)], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"ids": [0, 16, [2, 3, 4]], "imported": []}
