"""Hostile caches that pass validate_cache=True at open (tests/reliability/hostile.py): what a read
of them gives is an empty read or a typed error from datasetrt.errors, never a bare Python
exception (docs/reliability.md, "Hostile caches that validate").

- a cache of 0 samples reads as an empty epoch in every order (shuffle=False included) and on
  both read paths; asking for positions of it (`set_epoch_len`) is an `EmptyStreamError`;
- a record whose embedded JSON holds a 100,000-digit integer is a `RecordJSONError` naming the
  cache and the sample (Python refuses to convert more than `sys.get_int_max_str_digits()`
  digits with a plain ValueError).
"""

from __future__ import annotations

import sys

import pytest

import datasetrt as drt
from datasetrt.errors import EmptyStreamError, RecordJSONError
from tests.integrity.corrupt import load_manifest
from tests.reliability import WORKER_TIMEOUT_S, write_template
from tests.reliability.hostile import empty_cache, huge_int_record

ORDERS = [
    pytest.param({"shuffle": False}, id="ordered"),
    pytest.param({"shuffle": True}, id="draws"),
    pytest.param({"shuffle": True, "sampling": "permutation"}, id="permutation"),
    pytest.param({"shuffle": True, "sampling": "locality"}, id="locality"),
]


@pytest.fixture(scope="module", params=["parallel", "inprocess"])
def reader_rt(request):
    rt = drt.DatasetRuntime(num_workers=2, parallel_reads=request.param == "parallel")
    yield rt
    rt.close()


def _open(rt, path, *, validate: bool = True, **order):
    config = drt.ReaderConfig(seed=0, validate_cache=validate, worker_timeout_s=WORKER_TIMEOUT_S, **order)
    return rt.cached_dataset([path], reader_config=config)


# -- a cache of 0 samples -------------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
def test_a_cache_of_no_samples_reads_as_an_empty_epoch(tmp_path, reader_rt, order):
    ds = _open(reader_rt, empty_cache(tmp_path, "empty"), **order)
    try:
        assert len(ds) == 0
        assert ds.get_metadata().height == 0
        assert list(ds) == [] and list(ds) == []  # two epochs: the cursor over no rows stays put
        assert list(ds.iter_batches(4)) == []
    finally:
        ds.close()


@pytest.mark.parametrize("order", ORDERS[:2])
def test_positions_of_a_cache_of_no_samples_are_a_typed_error(tmp_path, reader_rt, order):
    cache = empty_cache(tmp_path, "empty")
    ds = _open(reader_rt, cache, **order)
    try:
        ds.set_epoch_len(4)
        with pytest.raises(EmptyStreamError, match="cannot plan 4 positions over an empty population") as info:
            list(ds)
        assert isinstance(info.value, ValueError)  # what the draw kernel raised before, for shuffle=True
        with pytest.raises(drt.errors.SampleIndexError):
            ds.get_item(load_manifest(cache)["cache_id"], 0)
    finally:
        ds.close()


def test_an_empty_cache_beside_a_full_one_reads_the_full_one(tmp_path, reader_rt):
    empty, full = empty_cache(tmp_path / "a", "empty"), write_template(tmp_path / "b", "full", 4)
    ds = reader_rt.cached_dataset(
        [empty, full], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    )
    try:
        assert [s.sample_id for s in ds] == [0, 1, 2, 3]
    finally:
        ds.close()


# -- a 100,000-digit integer in a record's JSON -----------------------------------------------------


@pytest.mark.parametrize("validate", [False, True], ids=["default", "validate"])
def test_a_huge_integer_in_a_record_is_a_record_json_error(tmp_path, reader_rt, validate):
    cache = huge_int_record(tmp_path, "huge", digits=100_000, sample_id=1)
    assert 100_000 > sys.get_int_max_str_digits() > 0  # the interpreter refuses it, as in production
    ds = _open(reader_rt, cache, validate=validate, shuffle=False)
    try:
        with pytest.raises(RecordJSONError) as info:
            list(ds)
        assert isinstance(info.value, RuntimeError)  # dataset-rt: RuntimeError("JSON error: ...")
        message = str(info.value)
        assert message.startswith("JSON error: ") and f"{cache} sample 1" in message
        assert f"({sys.get_int_max_str_digits()} digits)" in message  # names the limit
        assert len(message) < 1000  # and never echoes the digits
        with pytest.raises(RecordJSONError, match="sample 1"):
            ds.get_item(_cache_id(ds), 1)
        assert ds.get_item(_cache_id(ds), 0).metadata["index"] == 0  # the other records still read
        if validate:  # batches parse the embedded JSON only to check it
            with pytest.raises(RecordJSONError, match="sample 1"):
                list(ds.iter_batches(3))
    finally:
        ds.close()


def _cache_id(ds) -> int:
    return int(ds.get_metadata()["cache_id"][0])
