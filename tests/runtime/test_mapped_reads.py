"""Reader workers read uncompressed local shards from a read-only mapping (runtime/gatherer.py
`map_shards`): the batches are the in-process read's, byte for byte; a shard truncated under a
worker kills only that worker, and the read fails with a WorkerCrashedError naming the shard,
having returned nothing wrong and leaving no process or descriptor behind.

Waits are bounded polls on progress (tests.reliability.wait_until); nothing sleeps.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import WorkerCrashedError
from tests.reliability import fd_count, live_children, wait_until

ROWS = 1200
TOKENS = 512
BATCH = 64


def _write(base: Path, algo: str = "none") -> tuple[Path, np.ndarray]:
    """A typed int32[512] cache of ROWS records in shards of ~128 KiB; returns it and its rows."""
    rows = (np.arange(ROWS * TOKENS, dtype=np.int64) * 2654435761 % 32000).astype("<i4").reshape(ROWS, TOKENS)

    class Source:
        name = "tokens"

        def __iter__(self):
            for i, row in enumerate(rows):
                yield drt.CacheInput(row.tobytes(), {"n": i})

    cfg = drt.WriterConfig(
        show_progress=False,
        shard_compression=drt.ShardCompression(algo=algo),
        payload_spec=drt.PayloadSpec("<i4", (TOKENS,)),
        max_shard_bytes=128 << 10,
    )
    rt = drt.DatasetRuntime(num_workers=1)
    try:
        [res] = rt.write_cache([Source()], base, writer_config=cfg)
    finally:
        rt.close()
    assert isinstance(res, drt.CacheWriteSuccess), res
    return Path(res.path), rows


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> tuple[Path, np.ndarray]:
    return _write(tmp_path_factory.mktemp("mapped-reads"))


def _config() -> drt.ReaderConfig:
    return drt.ReaderConfig(seed=5, shuffle=True)


def _in_process(cache: Path, epochs: int = 1) -> list[list[np.ndarray]]:
    """The in-process read's batches, epoch after epoch (each pass over a dataset is its next epoch)."""
    ds = drt.CachedDataset([cache], reader_config=_config(), runtime=None)
    return [[b.to_numpy().copy() for b in ds.iter_batches(BATCH)] for _epoch in range(epochs)]


def _same(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def _mapped_by(pid: int, path: Path) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip().endswith(str(path)) for line in f)
    except OSError:
        return False


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_shuffled_int32_batches_equal_in_process(tokens, start_method):
    cache, rows = tokens
    epochs = _in_process(cache, 2)
    rt = drt.DatasetRuntime(num_workers=2, start_method=start_method)
    try:
        rt.start_workers()
        ds = rt.cached_dataset([cache], reader_config=_config())
        for expected in epochs:  # the second epoch reuses the workers' readers and mappings
            got, sample_ids = [], []
            for b in ds.iter_batches(BATCH):
                got.append(b.to_numpy().copy())
                sample_ids.append(np.asarray(b.sample_id).copy())
            assert sum(len(b) for b in got) == ROWS and len(got) == len(expected)
            _same(got, expected)
            np.testing.assert_array_equal(np.concatenate(got), rows[np.concatenate(sample_ids)])
        shards = sorted((cache / "shards").iterdir())
        assert len(shards) > 4
        # The workers read them mapped: each shard file is in some worker's address space.
        for shard in shards:
            assert any(_mapped_by(pid, shard) for pid in rt.worker_pids), shard
    finally:
        rt.close()


def test_compressed_shards_stay_on_pread(tmp_path):
    cache, _rows = _write(tmp_path / "lz4", "lz4")
    [expected] = _in_process(cache)
    rt = drt.DatasetRuntime(num_workers=2, start_method="fork")
    try:
        rt.start_workers()
        got = [b.to_numpy().copy() for b in rt.cached_dataset([cache], reader_config=_config()).iter_batches(BATCH)]
        assert len(got) == len(expected)
        _same(got, expected)
        for shard in (cache / "shards").iterdir():
            assert not any(_mapped_by(pid, shard) for pid in rt.worker_pids), shard
    finally:
        rt.close()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_shard_truncated_under_a_worker_is_a_typed_error_naming_it(tokens, tmp_path, start_method):
    source, _rows = tokens
    cache = tmp_path / "cache"
    shutil.copytree(source, cache)
    expected = _in_process(cache, 2)[1]  # the read below is the dataset's second epoch
    gc.collect()
    fds, children = fd_count(), len(live_children())
    rt = drt.DatasetRuntime(num_workers=2, start_method=start_method)
    try:
        rt.start_workers()
        ds = rt.cached_dataset([cache], reader_config=_config())
        assert sum(len(b) for b in ds.iter_batches(BATCH)) == ROWS  # the workers map the shards
        shard = sorted((cache / "shards").iterdir())[1]
        assert any(_mapped_by(pid, shard) for pid in rt.worker_pids)
        os.truncate(shard, 4096)  # under the live mappings: the pages past 4096 are gone
        got: list[np.ndarray] = []
        with pytest.raises(WorkerCrashedError) as info:
            for b in ds.iter_batches(BATCH):
                got.append(b.to_numpy().copy())
        # Nothing wrong returned: every batch delivered before the error is the intact read's.
        _same(got, expected)
        assert len(got) < len(expected)
        message = str(info.value)
        # SIGBUS past the truncated file's end; a copy racing the truncation can also fault as SIGSEGV
        assert any(f"signal {int(sig)}" in message for sig in (signal.SIGBUS, signal.SIGSEGV)), message
        assert str(shard) in message and "is now 4096 bytes" in message, message
        assert info.value.shards[0] == str(shard)
    finally:
        rt.close()
    del ds, info  # the dataset's in-process reader holds its shard descriptors; the traceback, the read's frames

    def settled() -> bool:
        gc.collect()
        return len(live_children()) == children and fd_count() == fds

    # No process or descriptor left behind (children take a moment to be reaped: poll, bounded).
    wait_until(settled, 60.0, "workers and descriptors to go")
