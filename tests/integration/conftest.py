"""Fixtures shared by the integration tests: one reader runtime per module, a dataset opener, and
ragged token documents written as a cache (the packing tests)."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from tests.conftest import ListSource, writer_config

TOKEN_SPEC = drt.PayloadSpec("int32", (None,))


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


def token_documents(n: int, seed: int) -> list:
    """`n` ragged int32 documents (lognormal lengths up to 300; document i's tokens start at
    1000 (i + 1), so every token names its document) with metadata {"i": i}."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(3.0, 1.0, n).astype(np.int64), 300)
    return [(np.arange(k, dtype=np.int32) + 1000 * (i + 1), {"i": i}) for i, k in enumerate(lengths)]


def write_token_cache(directory, items: list):
    """`items` written as one zstd cache typed `TOKEN_SPEC`; returns its path."""
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(
            [ListSource("docs", items)], directory, writer_config=writer_config("zstd", payload_spec=TOKEN_SPEC)
        )
    assert isinstance(res, drt.CacheWriteSuccess), res
    return res.path
