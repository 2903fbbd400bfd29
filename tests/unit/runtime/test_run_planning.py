"""Ring planning over many caches (runtime/run.py `planned_record_bytes`): the record size comes
from at most PLAN_SCAN_CACHES index scans, taken in decreasing order of each cache's largest
shard, and never falls below a cache's average stored record. Oracle: the stored sizes read
straight from each index.bin with numpy, and a count of the scans made.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.format.reader import CacheHandle
from datasetrt.runtime import run
from tests.conftest import ListSource, writer_config


def _write(tmp_path, name, sizes):
    items = [(bytes([k % 251]) * size, {"k": k}) for k, size in enumerate(sizes)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(ListSource(name, items), tmp_path / name, writer_config=writer_config())
    return res.path


def _largest_stored(path) -> int:
    index = np.fromfile(path / "index.bin", dtype="<u8").reshape(-1, 3)
    return int(index[:, 2].max())


@pytest.fixture
def scans(monkeypatch):
    """The caches whose index `planned_record_bytes` scanned, in order."""
    seen: list[str] = []
    original = CacheHandle.scan_index

    def counting(self, fn):
        seen.append(str(self.path))
        return original(self, fn)

    monkeypatch.setattr(CacheHandle, "scan_index", counting)
    return seen


def _copies(tmp_path, seed, count):
    out = []
    for i in range(count):
        dst = tmp_path / "copies" / f"c{i:04d}"
        shutil.copytree(seed, dst)
        out.append(dst)
    return out


def test_scans_are_bounded_and_the_result_exact_for_identical_caches(tmp_path, scans):
    seed = _write(tmp_path, "small", [64, 80, 72, 64])
    handles = [CacheHandle.open(p) for p in _copies(tmp_path, seed, run.PLAN_SCAN_CACHES + 40)]
    assert run.planned_record_bytes(handles) == _largest_stored(seed)
    assert len(scans) == run.PLAN_SCAN_CACHES


def test_the_cache_with_the_largest_shard_is_scanned_first_and_ends_the_scan(tmp_path, scans):
    seed = _write(tmp_path, "small", [64, 80, 72, 64])
    big = _write(tmp_path, "big", [64, 20_000, 64])
    paths = _copies(tmp_path, seed, 300)
    paths.insert(123, big)  # anywhere among them
    handles = [CacheHandle.open(p) for p in paths]
    assert run.planned_record_bytes(handles) == _largest_stored(big)
    # No small cache's shard can hold a record as large as the one already seen: one scan.
    assert scans == [str(big)]


def test_an_unscanned_cache_still_counts_its_average_record(tmp_path, monkeypatch, scans):
    """With the scan budget spent, a cache left unscanned still raises the planned size to its
    average stored record (its shard bytes over its samples), from the manifest alone."""
    seed = _write(tmp_path, "small", [64] * 8)
    even = _write(tmp_path, "even", [3000] * 4)  # average = largest
    monkeypatch.setattr(run, "PLAN_SCAN_CACHES", 0)
    handles = [CacheHandle.open(p) for p in (seed, even)]
    planned = run.planned_record_bytes(handles)
    assert scans == []
    stored = np.fromfile(even / "index.bin", dtype="<u8").reshape(-1, 3)[:, 2]
    assert planned == int(stored.sum()) // len(stored) <= _largest_stored(even)
