"""format/results.py: `CacheWriteSuccess` keeps dataset-rt's two-field tuple (unpacking, indexing,
equality, `_fields`) and adds `durable`, which survives pickling (processes, Ray) and `_replace`."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import datasetrt as drt

PATH = Path("/caches/a")


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_durable_survives_pickling_under_the_public_name(durable, protocol):
    result = drt.CacheWriteSuccess("a", PATH, durable=durable)
    data = pickle.dumps(result, protocol)
    assert b"datasetrt.api" in data and b"_CacheWriteSuccessFields" not in data
    back = pickle.loads(data)
    assert type(back) is drt.CacheWriteSuccess and back == result and back.durable is durable


def test_the_tuple_is_dataset_rts():
    result = drt.CacheWriteSuccess("a", PATH, durable=False)
    assert tuple(result) == ("a", PATH) and result._fields == ("source_name", "path")
    assert result == drt.CacheWriteSuccess("a", PATH) == ("a", PATH)  # durability is not part of equality
    assert (result.source_name, result.path, result[1]) == ("a", PATH, PATH)
    assert drt.CacheWriteSuccess("a", PATH).durable is True
    with pytest.raises(TypeError):
        drt.CacheWriteSuccess("a", PATH, False)  # keyword-only: never a third field


def test_repr_and_replace():
    result = drt.CacheWriteSuccess("a", PATH, durable=False)
    assert repr(result) == "CacheWriteSuccess(source_name='a', path=PosixPath('/caches/a'), durable=False)"
    assert repr(drt.CacheWriteSuccess("a", PATH)) == "CacheWriteSuccess(source_name='a', path=PosixPath('/caches/a'))"
    moved = result._replace(path=Path("/b"))
    assert moved == ("a", Path("/b")) and moved.durable is False
    assert result._replace(durable=True).durable is True
    assert drt.CacheWriteSuccess.__module__ == "datasetrt.api"
