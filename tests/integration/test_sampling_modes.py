"""Sampling modes at the dataset level: what a CachedDataset does with ReaderConfig.sampling."""

from __future__ import annotations

import itertools

import pytest

import datasetrt as drt
from datasetrt.errors import ConfigError


def test_permutation_mode_is_refused_until_the_read_paths_take_it(write_caches):
    paths = write_caches({"a": 6})
    with pytest.raises(ConfigError, match=r"sampling='permutation'.*EpochPermutation"):
        drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, sampling="permutation"))
    ds = drt.CachedDataset(paths, reader_config=drt.ReaderConfig(seed=1, sampling="draws"))
    assert len(list(itertools.islice(iter(ds), 6))) == 6
