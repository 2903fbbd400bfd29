"""A plain read never imports Polars or pyarrow in the parent process (together ~65 MiB of PSS).

They load only when metadata is touched (get_metadata, update_metadata, iter_batches with
metadata, validate_cache, weighted runs) or a cache is written. Each check runs in a fresh
interpreter, since the test process itself has both imported long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import datasetrt as drt

ROOT = str(Path(__file__).resolve().parents[2])

WRITE = textwrap.dedent("""
    import json, sys
    import datasetrt as drt
    from tests.conftest import ListSource, sample_items
    sources = [ListSource("left", sample_items(40, seed=0, tag="left")),
               ListSource("right", sample_items(25, seed=1, tag="right"))]
    rt = drt.DatasetRuntime(num_workers=1)
    results = rt.write_cache(sources, sys.argv[1], writer_config=drt.WriterConfig(show_progress=False))
    rt.close()
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results), results
    print(json.dumps([str(r.path) for r in results]))
""")

# argv: mode ("local" | "workers"), then the cache paths. Prints the samples of four reads and
# whether Polars / pyarrow were imported; never touches metadata.
READ = textwrap.dedent("""
    import hashlib, json, sys
    import datasetrt as drt
    mode, paths = sys.argv[1], sys.argv[2:]
    rt = drt.DatasetRuntime(num_workers=1) if mode == "workers" else None

    def open_ds(shuffle):
        config = drt.ReaderConfig(seed=1, shuffle=shuffle)
        if rt is None:
            return drt.CachedDataset(paths, reader_config=config, runtime=None)
        return rt.cached_dataset(paths, reader_config=config)

    def rows(samples):
        return [[s.cache_id, s.sample_id, hashlib.sha256(s.data).hexdigest(), s.metadata] for s in samples]

    out = {}
    ds = open_ds(False)
    out["len"] = len(ds)
    out["ordered"] = rows(ds)
    ds.set_epoch_len(7)
    out["epoch"] = [rows(ds), rows(ds), len(ds)]
    shuffled = open_ds(True)
    shuffled.set_epoch_len(100)  # more than the population: wraps into the next permutation
    out["shuffled"] = rows(shuffled)
    out["batches"] = [[b.cache_id.tolist(), b.sample_id.tolist()] for b in open_ds(True).iter_batches(9, with_metadata=False)]
    # with metadata (the default) but never reading it: the Arrow slice is never built
    out["batches_md"] = [[b.cache_id.tolist(), b.sample_id.tolist()] for b in open_ds(True).iter_batches(9)]
    if rt is not None:
        rt.close()
    out["polars"] = "polars" in sys.modules
    out["pyarrow"] = "pyarrow" in sys.modules
    print(json.dumps(out))
""")

# The lazy import really happens, and the read before it equals the reads after it.
READ_THEN_METADATA = textwrap.dedent("""
    import hashlib, json, sys
    import datasetrt as drt
    paths = sys.argv[1:]
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, shuffle=True), runtime=None)

    def rows(samples):
        return [[s.cache_id, s.sample_id, hashlib.sha256(s.data).hexdigest(), s.metadata] for s in samples]

    before = rows(ds)
    assert "polars" not in sys.modules and "pyarrow" not in sys.modules
    md = ds.get_metadata()
    out = {"imported": ["polars" in sys.modules, "pyarrow" in sys.modules], "before": before,
           "columns": md.columns, "metadata": md.drop("weight").rows(), "after": rows(ds)}
    ds.update_metadata(md.with_columns(weight=md["index"].cast(float) + 1.0))
    out["weighted"] = rows(ds)
    print(json.dumps(out))
""")


def run_python(code: str, *args: object) -> dict | list:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache_paths(tmp_path_factory) -> list[str]:
    """Two caches written by a separate interpreter (writing may import pyarrow)."""
    return run_python(WRITE, tmp_path_factory.mktemp("lazy") / "caches")


def rows(samples) -> list:
    import hashlib

    return [[s.cache_id, s.sample_id, hashlib.sha256(s.data).hexdigest(), s.metadata] for s in samples]


def reference(paths: list[str], shuffle: bool, epoch_len: int | None = None, passes: int = 1) -> list:
    """Samples of `passes` consecutive reads of one dataset, as read by this (Polars-importing)
    process: the lazy imports change no result."""
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, shuffle=shuffle), runtime=None)
    if epoch_len is not None:
        ds.set_epoch_len(epoch_len)
    return [row for _ in range(passes) for row in rows(ds)]


@pytest.mark.parametrize("mode", ["local", "workers"])
def test_plain_read_imports_neither_polars_nor_pyarrow(cache_paths, mode):
    out = run_python(READ, mode, *cache_paths)
    assert (out["polars"], out["pyarrow"]) == (False, False)
    assert out["len"] == 65
    assert out["ordered"] == reference(cache_paths, False)
    assert len(out["ordered"]) == 65
    ds = drt.CachedDataset(cache_paths, reader_config=drt.ReaderConfig(seed=1, shuffle=False), runtime=None)
    list(ds)  # the same cursor as the script's: after one full ordered pass
    ds.set_epoch_len(7)
    assert out["epoch"] == [rows(ds), rows(ds), 7]
    assert out["shuffled"] == reference(cache_paths, True, 100)
    for key in ("batches", "batches_md"):
        assert [[cid, sid] for cid, sid, *_ in reference(cache_paths, True)] == [
            [cid, sid] for cids, sids in out[key] for cid, sid in zip(cids, sids)
        ]


def test_metadata_imports_polars_lazily(cache_paths):
    out = run_python(READ_THEN_METADATA, *cache_paths)
    assert out["imported"] == [True, True]
    assert out["before"] + out["after"] == reference(cache_paths, True, passes=2)
    md = drt.CachedDataset(cache_paths, reader_config=drt.ReaderConfig(seed=1), runtime=None).get_metadata()
    assert out["columns"] == md.columns
    assert out["metadata"] == json.loads(json.dumps(md.drop("weight").rows()))
    ds = drt.CachedDataset(cache_paths, reader_config=drt.ReaderConfig(seed=1, shuffle=True), runtime=None)
    list(ds), ds.get_metadata(), list(ds)  # the script's sequence
    ds.update_metadata(md.with_columns(weight=md["index"].cast(float) + 1.0))
    assert out["weighted"] == rows(ds)
