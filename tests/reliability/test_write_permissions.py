"""Permission denied while writing: a forked child that drops to an unprivileged user writes into
a base directory it may not modify. Each source becomes a CacheWriteError naming the I/O error;
caches already published there are untouched and nothing half-written appears.

Root ignores permission bits, so the write runs as `nobody` in a child; the test is skipped only
where the process cannot change user (not root)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

import datasetrt as drt
from tests.conftest import ListSource, sample_items, writer_config
from tests.reliability import write_template


def _run_as_nobody(base, names):
    """Fork; in the child become `nobody`, write `names` into `base`, send the results back as JSON
    through a pipe (the child may not be able to reach any file the parent can read)."""
    nobody = pwd.getpwnam("nobody")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(read_fd)
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with drt.DatasetRuntime(num_workers=1) as rt:
                results = rt.write_cache(
                    [ListSource(n, sample_items(5, tag=n)) for n in names], base, writer_config=writer_config()
                )
            os.write(write_fd, json.dumps([[type(r).__name__, *map(str, r)] for r in results]).encode())
            code = 0
        except BaseException as exc:
            os.write(write_fd, json.dumps(["raised", repr(exc)]).encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    payload = json.loads(b"".join(chunks) or b"null")
    assert os.waitstatus_to_exitcode(status) == 0, payload
    return payload


@pytest.fixture(params=["unreachable", "read-only"])
def base_dir(request, tmp_path):
    """unreachable: under pytest's 0700 tmp dir; read-only: traversable (0755) but not writable."""
    if request.param == "unreachable":
        yield tmp_path / "base"
        return
    root = Path(tempfile.mkdtemp(prefix="datasetrt-perm-"))
    os.chmod(root, 0o755)
    try:
        yield root / "base"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")
def test_permission_denied_is_a_write_error_and_keeps_published_caches(base_dir):
    base = base_dir
    published = write_template(base, "earlier", 6)  # base and the cache: owned by root, 0755
    (base / "tmp").mkdir(mode=0o755)  # an empty staging root, as dataset-rt leaves one
    before = {p: p.stat().st_mtime_ns for p in published.rglob("*")}
    results = _run_as_nobody(base, ["denied-a", "denied-b"])
    assert [r[0] for r in results] == ["CacheWriteError", "CacheWriteError"]
    for _kind, _name, message in results:
        assert "Permission denied" in message and "os error 13" in message, message
    assert sorted(p.name for p in base.iterdir()) == ["earlier", "tmp"]
    assert list((base / "tmp").iterdir()) == []  # no staging, no lock files left behind
    assert {p: p.stat().st_mtime_ns for p in published.rglob("*")} == before
    ds = drt.CachedDataset([published], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True))
    assert len(list(ds)) == 6
