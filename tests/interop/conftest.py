"""Interop fixtures: one runtime per library for the whole session (both are cheap to keep)."""

from __future__ import annotations

import pytest

from tests.interop._interop import LIBS


@pytest.fixture(scope="session")
def runtimes():
    """{"rt": dataset_rt.DatasetRuntime, "drt": datasetrt.DatasetRuntime}, two workers each."""
    made = {label: lib.DatasetRuntime(num_workers=2) for label, lib in LIBS.items()}
    yield made
    made["drt"].close()
