"""Fixtures of the integrity suite: a small fresh cache per test, both reader modes, both read paths.

`runtime` overrides the shared one: one DatasetRuntime per read path for the whole session (its
reader worker processes start once), parametrized over the multiprocess reader ("parallel", the
default users get) and the in-process reader ("inprocess"), so every fault is checked on the path
where it crosses a process boundary as well as where it is raised directly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import datasetrt as drt

N_SAMPLES = 5  # sample 0 has an empty payload; samples 1..4 have 37..148 bytes


@pytest.fixture(scope="session", params=["parallel", "inprocess"])
def runtime(request):
    rt = drt.DatasetRuntime(num_workers=2, parallel_reads=request.param == "parallel")
    yield rt
    rt.close()


@pytest.fixture
def cache(write_caches):
    """One uncompressed cache of N_SAMPLES samples, with the XXH3 sidecar."""
    return write_caches({"victim": N_SAMPLES})[0]


@pytest.fixture(params=["none", "lz4", "zstd"])
def any_cache(request, write_caches):
    """One cache of N_SAMPLES samples per compression algorithm."""
    return write_caches({f"victim-{request.param}": N_SAMPLES}, algo=request.param)[0]


@pytest.fixture(params=[False, True], ids=["default", "validate"])
def validate(request):
    """validate_cache of the reader."""
    return request.param


@pytest.fixture(scope="session")
def opener():
    """A runtime for tests that only open caches (no read path to vary)."""
    rt = drt.DatasetRuntime(num_workers=1, parallel_reads=False)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def _template_cache(tmp_path_factory, opener):
    from tests.conftest import ListSource, sample_items, writer_config

    base = tmp_path_factory.mktemp("template")
    (result,) = opener.write_cache(
        [ListSource("victim", sample_items(N_SAMPLES, tag="victim"))], base, writer_config=writer_config()
    )
    return result.path


@pytest.fixture
def fresh_cache(_template_cache, tmp_path):
    """A private copy of one session-wide uncompressed cache (same content as `cache`)."""
    import shutil

    return Path(shutil.copytree(_template_cache, tmp_path / "victim"))
