"""Shared helpers of the writer tests: an in-memory source, one-source writes and their records,
and a write under a file-size limit."""

from __future__ import annotations

import json
import os
import resource
import signal
from pathlib import Path

import numpy as np

import datasetrt as drt
from tests.conftest import QUIET


class Raw:
    """A named source over a list of (payload, metadata) items."""

    def __init__(self, name, items):
        self.name, self.items = name, items

    def __iter__(self):
        return iter(self.items)


def write_past_fsize_limit(tmp_path, limit_bytes: int, num_workers: int, items: list) -> tuple[list, list]:
    """Write source "big" (`items`) then "small" (one record) in a forked child whose
    RLIMIT_FSIZE is `limit_bytes` (SIGXFSZ ignored, so writes past it fail with EFBIG); returns
    each result as [type name, source name, message or path]. The child never returns into pytest."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
            rt = drt.DatasetRuntime(num_workers=num_workers)
            results = rt.write_cache(
                [Raw("big", items), Raw("small", [(b"x", {"a": 1})])], tmp_path, writer_config=QUIET
            )
            rt.close()
            os.write(write_end, json.dumps([[type(r).__name__, str(r[0]), str(r[1])] for r in results]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        payload = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    big, small = json.loads(payload)
    return big, small


def assert_big_failed_small_written(tmp_path, big: list, small: list) -> None:
    """The over-limit source is an EFBIG CacheWriteError with nothing left behind; the next is written."""
    assert big[:2] == ["CacheWriteError", "big"]
    assert big[2].startswith("I/O error: File too large (os error 27)"), big[2]
    assert small[:2] == ["CacheWriteSuccess", "small"]
    assert sorted(os.listdir(tmp_path)) == ["small"]


def write_one(runtime, base, name, items, **cfg):
    """Write `items` as cache `name` under `base` (`algo` picks the codec): (path, manifest dict)."""
    cfg.setdefault("show_progress", False)
    algo = cfg.pop("algo", "none")
    config = drt.WriterConfig(shard_compression=drt.ShardCompression(algo=algo), **cfg)
    (result,) = runtime.write_cache([Raw(name, items)], base, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path, json.loads((result.path / "manifest.json").read_text())


def index_rows(cache: Path) -> list[tuple[int, int, int]]:
    """index.bin as (shard, offset, length) rows."""
    return [tuple(r) for r in np.fromfile(cache / "index.bin", dtype="<u8").reshape(-1, 3).tolist()]


def cache_records(cache: Path) -> list[bytes]:
    """Every record's bytes, in index order."""
    shards = [p.read_bytes() for p in sorted((cache / "shards").iterdir())]
    return [shards[s][o : o + n] for s, o, n in index_rows(cache)]


def split_record(record: bytes) -> tuple[bytes, bytes]:
    """(JSON, stored payload) of one record."""
    n = int.from_bytes(record[:8], "little")
    return record[8 : 8 + n], record[8 + n :]
