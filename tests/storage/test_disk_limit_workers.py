"""The node cache's limit holds for the whole node while reader worker processes read under it
(datasetrt/runtime/gatherer.py, datasetrt/storage/node_cache.py): the bytes of the files in the
cache directory plus those of files removed from it but still open in any reading process never
exceed `cache_limit_bytes`, against moto's server through the fault proxy.

The disk is sampled by a thread of the test while the read goes on, under the node cache's space
lock (so no eviction or reservation happens halfway through a sample) and with files counted once
per inode (a file renamed or removed during the walk is never counted twice): the mirrors' files,
the partial downloads, and the removed files still open in this process and the reader workers
(/proc/<pid>/fd); the node cache's bookkeeping under .work (empty lock files, one small SOURCE
record per mirror) is not data and not counted. The consumer waits after each batch until a
sample taken after it has finished, so every state the read settles in between batches is seen
whatever the machine's load, including the workers idle while another reader on the node evicts
what they read last.
"""

from __future__ import annotations

import collections
import fcntl
import os
import threading
from pathlib import Path

import datasetrt as drt
from datasetrt.dataset.remote import _small_bytes
from datasetrt.storage.node_cache import _PART_RE, SPACE_LOCK, WORK_DIR
from tests.conftest import ListSource, sample_items, writer_config
from tests.servers.fixtures import proxy_options
from tests.storage.conftest import wait_until

RECORD_BYTES = 2 << 10
SHARD_BYTES = 32 << 10  # about 16 records per shard
SAMPLES = 384  # about two dozen shards
BATCH = 4


def storage(proxy, tmp_path, **kw) -> drt.StorageConfig:
    return drt.StorageConfig(
        options=proxy_options(proxy), cache_dir=str(tmp_path / "node"), retry_attempts=4, retry_budget_s=30.0, **kw
    )


def node_bytes(cache_dir: Path, pids: list[int]) -> tuple[int, int]:
    """(bytes of the files under `cache_dir`, bytes of files removed from it and still open in
    `pids`), each inode counted once; taken under the node cache's space lock."""
    fd = os.open(cache_dir / WORK_DIR / SPACE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        seen: set[tuple[int, int]] = set()
        present = 0
        tops = sorted(cache_dir.iterdir(), key=lambda p: p.name == WORK_DIR)  # mirrors first, then partials
        for top in tops:
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    if top.name == WORK_DIR and not _PART_RE.match(name):
                        continue  # bookkeeping: empty lock files, a mirror's SOURCE record
                    try:
                        st = os.lstat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        present += st.st_size
        prefix = str(cache_dir) + "/"
        removed = 0
        for pid in pids:
            fd_dir = f"/proc/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except FileNotFoundError:
                continue
            for entry in fds:
                try:
                    target = os.readlink(f"{fd_dir}/{entry}")
                    if not (target.startswith(prefix) and target.endswith(" (deleted)")):
                        continue
                    st = os.stat(f"{fd_dir}/{entry}")
                except FileNotFoundError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    removed += st.st_size
        return present, removed
    finally:
        os.close(fd)  # releases the space lock


class DiskSampler:
    """A thread sampling `node_bytes` until stopped: the peak and its parts, the sample count."""

    def __init__(self, cache_dir: Path, pids: list[int]) -> None:
        self.cache_dir, self.pids = cache_dir, pids
        self.samples = 0
        self.peak = (0, 0)  # (present, removed-but-open) of the largest total
        self.peak_removed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-sampler", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                present, removed = node_bytes(self.cache_dir, self.pids)
                if present + removed > sum(self.peak):
                    self.peak = (present, removed)
                self.peak_removed = max(self.peak_removed, removed)
                self.samples += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def one_more(self) -> None:
        """Return once a sample started after this call has finished."""
        target = self.samples + 2  # the one in progress may have started before the call
        wait_until(lambda: self.samples >= target or self.error is not None, what="a disk sample")

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_reader_workers_keep_the_node_within_its_limit(runtime, bucket, s3_proxy, tmp_path):
    cfg = writer_config(max_shard_bytes=SHARD_BYTES, storage=storage(s3_proxy, tmp_path / "w"))
    source = ListSource("a", sample_items(SAMPLES, payload_bytes=RECORD_BYTES))
    [result] = runtime.write_cache([source], f"s3://{bucket}/caches", writer_config=cfg)
    assert isinstance(result, drt.CacheWriteSuccess), result
    url = str(result.path)

    probe = drt.CachedDataset([url], reader_config=drt.ReaderConfig(seed=0, storage=storage(s3_proxy, tmp_path / "p")))
    [handle] = probe._handles
    shard_sizes = [s.byte_len for s in handle.manifest.shards]
    assert len(shard_sizes) >= 16
    # A window of one shard, the next window's first and one of look-ahead: a fraction of the dataset.
    limit = _small_bytes(handle) + 3 * max(shard_sizes)
    assert limit < _small_bytes(handle) + sum(shard_sizes) // 4
    reader = drt.ReaderConfig(
        seed=3,
        shuffle=True,
        sampling="locality",
        window_shards=1,
        prefetch_size=2 * BATCH,
        storage=storage(s3_proxy, tmp_path, cache_limit_bytes=limit),
    )
    ds = runtime.cached_dataset([url], reader_config=reader)
    assert ds.reads_with_workers
    pids = [os.getpid(), *runtime.start_workers()]
    assert len(pids) == 3
    cache_dir = Path(reader.storage.cache_dir)
    alone = drt.CachedDataset([url], reader_config=reader)  # another reader on the node, in this process
    seen: list[tuple[int, int]] = []
    with DiskSampler(cache_dir, pids) as sampler:
        # The workers read an epoch, then sit idle while this process reads one on its own (its
        # downloads evict what the workers read last), then they read again.
        for dataset in (ds, alone, ds):
            for batch in dataset.iter_batches(BATCH):
                seen.extend(zip(batch.cache_id.tolist(), batch.sample_id.tolist()))
                sampler.one_more()
            sampler.one_more()
    assert sampler.error is None, sampler.error
    counts = collections.Counter(seen)
    assert len(counts) == SAMPLES and set(counts.values()) == {3}  # each sample once per epoch
    present, removed = sampler.peak
    assert present + removed <= limit, (
        f"peak {present + removed} bytes ({present} in the directory, {removed} removed but open) "
        f"over the limit of {limit} in {sampler.samples} samples (most removed but open: {sampler.peak_removed})"
    )
    assert sampler.samples > SAMPLES // BATCH
