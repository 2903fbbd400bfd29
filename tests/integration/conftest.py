"""Fixtures shared by the integration tests: one reader runtime per module, a dataset opener."""

from __future__ import annotations

import pytest

import datasetrt as drt


@pytest.fixture(scope="module")
def reader_runtime():
    """One runtime (and reader worker pool) for the module, closed at the end."""
    rt = drt.DatasetRuntime(num_workers=2)
    yield rt
    rt.close()


@pytest.fixture
def open_ds(reader_runtime):
    def _open(paths, seed=7, shuffle=False):
        return reader_runtime.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=seed, shuffle=shuffle))

    return _open
