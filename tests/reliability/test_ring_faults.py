"""The reader's shared memory under failing syscalls and a small /dev/shm (runtime/shm.py).

Contract (docs/reliability.md, docs/memory-guide.md "Shared memory and /dev/shm"): a ring is an
anonymous memfd, so the size of /dev/shm never limits it (a read with a 1 MiB /dev/shm works);
running out of descriptors when a ring is created first gives back the unused shard descriptors
and tries once more, then is a `CacheIOError` with `errno` EMFILE naming the memfd; a reservation
the kernel refuses is a `ResourceLimitError`. The faults run in a child with the LD_PRELOAD shim
(tests/reliability/faultshim.c, faultrun.py); the small /dev/shm in a mount namespace of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.reliability import write_template
from tests.reliability.faultrun import ROOT, RUN_DEADLINE_S, run_faulted

RING_BYTES = 3 << 20


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory):
    return write_template(tmp_path_factory.mktemp("ring-faults"), "c", 40)


def test_out_of_descriptors_at_ring_creation_is_a_typed_error(faultshim, tmp_path):
    outcome = run_faulted(faultshim, "memfd_create errno=EMFILE", tmp_path / "log", "ring", size=RING_BYTES)
    assert len(outcome["faults"]) == 2  # the call, and the one retry after closing unused shard files
    error = outcome["error"]
    assert error["type"] == "CacheIOError" and "RuntimeError" in error["bases"] and error["errno"] == 24
    assert error["message"].startswith("I/O error: Too many open files (os error 24): memfd:datasetrt-")
    assert "cannot create the reader's shared memory" in error["message"] and "ulimit -n" in error["message"]
    assert outcome["leaked"] == [] and outcome["lost"] == []


def test_a_read_that_runs_out_of_descriptors_for_its_ring_fails_typed(faultshim, tmp_path, small_cache):
    outcome = run_faulted(
        faultshim, "memfd_create errno=EMFILE", tmp_path / "log", "read", paths=[str(small_cache)], parallel=True
    )
    assert outcome["faults"] and outcome["error"]["type"] == "CacheIOError" and outcome["error"]["errno"] == 24


def test_a_ring_is_retried_once_after_unused_shard_descriptors_are_closed(faultshim, tmp_path, small_cache):
    outcome = run_faulted(
        faultshim, "memfd_create errno=EMFILE nth=1", tmp_path / "log", "read", paths=[str(small_cache)]
    )
    assert len(outcome["faults"]) == 1 and "error" not in outcome
    assert outcome["samples"] == list(range(40))


def test_a_refused_reservation_is_a_resource_limit(faultshim, tmp_path):
    outcome = run_faulted(faultshim, "posix_fallocate errno=ENOSPC", tmp_path / "log", "ring", size=RING_BYTES)
    assert len(outcome["faults"]) == 1 and outcome["faults"][0].startswith("posix_fallocate 28 memfd:datasetrt-")
    assert outcome["error"]["type"] == "ResourceLimitError" and "MemoryError" in outcome["error"]["bases"]
    assert "cannot reserve 3.0 MiB of shared memory" in outcome["error"]["message"]
    assert outcome["leaked"] == []


def test_a_read_with_a_1_mib_dev_shm_succeeds(small_cache):
    """The parallel read's ring (several MiB) lives in memfds: a /dev/shm of 1 MiB (a tmpfs
    mounted in a mount namespace of the child's own) does not limit it."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to give the child a 1 MiB /dev/shm")
    request = json.dumps({"op": "read", "paths": [str(small_cache)], "parallel": True})
    script = 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$0" -m tests.reliability.faultrun "$1"'
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("LD_PRELOAD", None)
    proc = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, request],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_S,
    )
    if proc.returncode != 0 and ("unshare failed" in proc.stderr or "mount:" in proc.stderr):
        pytest.skip(f"cannot mount a private /dev/shm here (needs CAP_SYS_ADMIN): {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["dev_shm_bytes"] == 1 << 20 and outcome["rings"]  # the read did map a ring
    assert "error" not in outcome and outcome["samples"] == list(range(40))
