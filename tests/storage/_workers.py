"""Entry points of the storage tests' worker processes (started with multiprocessing's spawn).

Boundary: each function builds what it needs from picklable arguments and reports back through
a queue; nothing here asserts.
"""

from __future__ import annotations

import os
import traceback

from datasetrt.errors import ObjectExistsError
from datasetrt.storage.node_cache import NodeCache


def race_put_if_absent(store, names: list[str], data: bytes, barrier, results) -> None:
    """For each name: wait at `barrier` (all writers), then try to create it; report
    (name, "won" / "lost" / "error", data or traceback)."""
    for name in names:
        try:
            barrier.wait(60)
            store.put_if_absent(name, data)
            results.put((name, "won", data))
        except ObjectExistsError:
            results.put((name, "lost", data))
        except BaseException:
            results.put((name, "error", traceback.format_exc()))


def ensure_many(store, root: str, limit_bytes, files, barrier, results, pin: bool = False) -> None:
    """Wait at `barrier`, then ensure every (name, size, sha256) of `files` in the node cache at `root`."""
    try:
        cache = NodeCache(root, limit_bytes=limit_bytes)
        mirror = cache.mirror(store)
        if barrier is not None:
            barrier.wait(60)
        paths = [str(mirror.ensure(name, size=size, sha256=digest, pin=pin)) for name, size, digest in files]
        results.put((os.getpid(), "ok", paths))
        cache.release_all()
    except BaseException as exc:
        results.put((os.getpid(), "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def ensure_one(store, root: str, name: str, size: int, digest: str) -> None:
    """Ensure one file (the test kills this process mid-download)."""
    NodeCache(root).mirror(store).ensure(name, size=size, sha256=digest)
