"""Shared pieces of the dataset-level S3 tests (test_dataset_s3_faults.py, test_dataset_s3_ranks.py):
the caches they write and read, exact comparison against a local copy, leak snapshots, bounded
calls, and processes started like torchrun ranks (spawn) that report back through a queue.

Boundary: builds, runs and observes; asserts nothing but a call's bound and a snapshot's leaks.
"""

from __future__ import annotations

import collections
import gc
import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasetrt as drt
from tests.conftest import ListSource, sample_items, writer_config
from tests.servers.moto import s3_options
from tests.storage.conftest import DEADLINE_S

SIZES = {"a": 200, "b": 150, "c": 100}  # 450 samples; 2 KiB shards: about 40 shards in all
SHARD_BYTES = 2 << 10
SPAWN = mp.get_context("spawn")


def storage(endpoint: str, cache_dir: Path | str, **kw: Any) -> drt.StorageConfig:
    """A StorageConfig with a retry budget: `endpoint` is the proxy's (or moto's) URL."""
    kw.setdefault("retry_attempts", 6)
    kw.setdefault("retry_budget_s", DEADLINE_S)
    return drt.StorageConfig(options=s3_options(endpoint), cache_dir=str(cache_dir), **kw)


def sources(seed: int = 0, sizes: dict[str, int] = SIZES, payload_bytes: int | None = None) -> list[ListSource]:
    return [
        ListSource(name, sample_items(n, seed=seed + k, tag=f"{name}{seed}", payload_bytes=payload_bytes))
        for k, (name, n) in enumerate(sizes.items())
    ]


def write(
    runtime, base: str | Path, srcs: list, config: drt.StorageConfig | None = None, algo: str = "zstd", **kw
) -> list[str]:
    """Write `srcs` under `base` (a local directory or an s3:// URL); every write must succeed."""
    kw.setdefault("max_shard_bytes", SHARD_BYTES)
    cfg = writer_config(algo, **kw, **({"storage": config} if config is not None else {}))
    results = runtime.write_cache(srcs, str(base), writer_config=cfg)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results), results
    return [str(r.path) for r in results]


def write_both(moto_server, tmp: Path, tag: str) -> tuple[str, list[str], list[str]]:
    """The caches of `sources()` at s3://<new bucket>/caches (written straight to moto) and a
    local copy: (bucket, urls, local paths)."""
    bucket = f"dsrt-{tag}-{os.getpid()}"
    moto_server.create_bucket(bucket)
    with drt.DatasetRuntime(num_workers=2) as rt:
        urls = write(rt, f"s3://{bucket}/caches", sources(), storage(moto_server.endpoint, tmp / "w"))
        local = write(rt, tmp / "local", sources())
    return bucket, urls, local


def samples_of(ds) -> list[tuple[int, int, bytes, str]]:
    return [(s.cache_id, s.sample_id, bytes(s.data), s.metadata["label"]) for s in ds]


def loader_rows(batch) -> list[tuple[int, int, bytes]]:
    """collate_fn of the torch loaders (module-level: picklable for spawn workers)."""
    return [(s.cache_id, s.sample_id, bytes(s.data)) for s in batch]


def shard_gets(proxy) -> collections.Counter:
    return collections.Counter(r.key for r in proxy.matching("GET", "*/shards/*"))


def shard_keys(urls: list[str], config: drt.StorageConfig) -> set[str]:
    """The object keys of every shard of the caches at `urls` (from their manifests)."""
    keys = set()
    for url in urls:
        ds = drt.CachedDataset([url], reader_config=drt.ReaderConfig(seed=0, storage=config))
        handle = ds._handles[0]
        keys |= {handle.remote.location.key(f"shards/{s.name}") for s in handle.manifest.shards}
        ds.close()
    return keys


class Call:
    """`fn()` running in a thread of its own; `result(timeout_s)` joins it within that bound, so a
    hang fails the test instead of hanging it."""

    def __init__(self, fn: Callable[[], Any], what: str = "the read") -> None:
        self.what = what
        self._out: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), name="bounded-call", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._out["value"] = fn()
        except BaseException as exc:  # re-raised by result()
            self._out["error"] = exc

    def result(self, timeout_s: float = 2 * DEADLINE_S) -> Any:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"{self.what} did not finish within {timeout_s:.0f} s")
        if "error" in self._out:
            raise self._out.pop("error")
        return self._out.get("value")


def bounded(fn: Callable[[], Any], timeout_s: float = 2 * DEADLINE_S, what: str = "the read") -> Any:
    """`fn()`, failing the test if it has not returned within `timeout_s`."""
    return Call(fn, what).result(timeout_s)


def batch_rows(batches, rows: list | None = None) -> list[tuple[int, int, bytes]]:
    """(cache_id, sample_id, payload) of every row of `batches`, appended to `rows` (which keeps
    what was read when the read raises), each batch released once copied."""
    rows = [] if rows is None else rows
    for b in batches:
        rows += [(int(c), int(s), bytes(b.payload(i))) for i, (c, s) in enumerate(zip(b.cache_id, b.sample_id))]
        b.release()
    return rows


def _fd_targets() -> collections.Counter:
    """What this process's descriptors point at, but sockets and anonymous inodes (obstore's
    pooled connections and runtime, the proxy's listeners: theirs to close)."""
    out: collections.Counter = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        if not target.startswith(("socket:", "anon_inode:")):
            out["pipe" if target.startswith("pipe:") else target] += 1
    return out


def _shm() -> set[str]:
    return {e for e in os.listdir("/dev/shm") if e.startswith("datasetrt")}


class Leaks:
    """A snapshot of descriptors (files, memfds, pipes) and datasetrt's /dev/shm entries;
    `check()` fails on any new one (after collecting garbage: dropped readers close theirs)."""

    def __init__(self) -> None:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # a session-wide process whose pipe is not a leak
        SPAWN.Barrier(1)  # multiprocessing's shared heap (its /dev/shm arena stays mapped for the session)
        gc.collect()
        self.fds = _fd_targets()
        self.shm = _shm()

    def check(self) -> None:
        gc.collect()
        extra_fds = _fd_targets() - self.fds
        extra_shm = _shm() - self.shm
        assert not extra_fds and not extra_shm, {"descriptors": dict(extra_fds), "shm": extra_shm}


def _child(target: Callable[..., Any], args: tuple, results) -> None:
    try:
        results.put(("ok", os.getpid(), target(*args)))
    except BaseException as exc:
        results.put(("error", os.getpid(), f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Processes:
    """Processes started with spawn (as torchrun starts ranks), each running `target(*args)`
    (importable) and reporting ("ok", pid, value) or ("error", pid, traceback) on one queue.
    Leaving the block kills what still runs and reaps everything."""

    def __init__(self, jobs: list[tuple[Callable[..., Any], tuple]]) -> None:
        self.results = SPAWN.Queue()
        self.procs = [SPAWN.Process(target=_child, args=(target, args, self.results)) for target, args in jobs]

    def __enter__(self) -> Processes:
        for proc in self.procs:
            proc.start()
        return self

    def next(self, timeout_s: float = 4 * DEADLINE_S) -> tuple[str, int, Any]:
        """The next report (bounded)."""
        try:
            return self.results.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no process reported within {timeout_s:.0f} s") from None

    def values(self, timeout_s: float = 4 * DEADLINE_S) -> dict[int, Any]:
        """Every process's value by pid; a failed one fails the test with its traceback."""
        out = {}
        for _ in self.procs:
            status, pid, value = self.next(timeout_s)
            assert status == "ok", value
            out[pid] = value
        return out

    def kill(self, proc) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(DEADLINE_S)

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(DEADLINE_S)
        for proc in self.procs:
            proc.close()
        self.results.close()
        self.results.join_thread()
