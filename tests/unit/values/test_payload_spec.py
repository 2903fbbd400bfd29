"""drt.PayloadSpec (config.py) and the typed-payload rules it shares with the manifest parser
(payloads.py): construction from numpy/torch/str dtypes, canonical form, shape rules, sizes, decode."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from pydantic import ValidationError

import datasetrt as drt
from datasetrt import api, errors
from datasetrt.values.payloads import PAYLOAD_DTYPES, shape_problem

FAMILIES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def test_exported_and_constructed_positionally_or_by_keyword():
    assert drt.PayloadSpec is api.PayloadSpec and "PayloadSpec" in drt.__all__ and "PayloadSpec" in api.__all__
    assert drt.PayloadSpec.__module__ == "datasetrt.api"
    spec = drt.PayloadSpec("int32", (512,))
    assert spec == drt.PayloadSpec(dtype="int32", shape=[512]) == drt.PayloadSpec("int32", shape=512)
    assert (spec.dtype, spec.shape) == ("int32", (512,))
    assert repr(spec) == "PayloadSpec(dtype='int32', shape=(512,))" and str(spec) == "int32[512]"
    assert hash(spec) == hash(drt.PayloadSpec("int32", (512,)))
    assert pickle.loads(pickle.dumps(spec)) == spec
    with pytest.raises(ValidationError):
        spec.dtype = "int64"  # frozen


@pytest.mark.parametrize("name", FAMILIES)
def test_every_dtype_family_from_str_numpy_and_type(name):
    dt = np.dtype(name)
    for given in (name, dt, dt.type, dt.str, dt.newbyteorder(">") if dt.itemsize > 1 else dt):
        spec = drt.PayloadSpec(given, (3,))
        assert spec.dtype == name and spec.itemsize == dt.itemsize == PAYLOAD_DTYPES[name]


def test_torch_dtypes_map_by_name():
    torch = pytest.importorskip("torch")
    assert drt.PayloadSpec(torch.int32, ()).dtype == "int32"
    assert drt.PayloadSpec(torch.half, ()).dtype == "float16"
    assert drt.PayloadSpec(torch.bool, ()).dtype == "bool"
    assert drt.PayloadSpec(torch.complex128, ()).dtype == "complex128"
    with pytest.raises(errors.ConfigError, match="torch.bfloat16 has no numpy equivalent"):
        drt.PayloadSpec(torch.bfloat16, ())


@pytest.mark.parametrize(
    "dtype",
    [
        object,
        "O",
        [("a", "i4"), ("b", "f8")],
        "i4,i4",
        "U5",
        "S3",
        "V8",
        "M8[s]",
        "m8[ns]",
        "longdouble",
        ("i4", (2,)),
        None,
        "not-a-dtype",
        3.5,
    ],
)
def test_unsupported_dtypes_are_config_errors_naming_them(dtype):
    with pytest.raises(errors.ConfigError, match="PayloadSpec dtype") as info:
        drt.PayloadSpec(dtype, (2,))
    assert isinstance(info.value, ValueError)
    if dtype is not None:
        assert repr(dtype)[:8] in str(info.value) or str(dtype) in str(info.value)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((None, None), "at most one dimension"),
        ((-1,), "integers >= 0"),
        ((2, -3, None), "integers >= 0"),
        ((None, 0), "other dimensions must be > 0"),
        ((2.5,), "not an integer"),
        ((True,), "not an integer"),
        ("12", "tuple of ints"),
        (None, "tuple of ints"),
        (((2,),), "not an integer"),
        ((1 << 62, 4), "too large"),
    ],
)
def test_bad_shapes_are_config_errors(shape, match):
    with pytest.raises(errors.ConfigError, match=match):
        drt.PayloadSpec("int32", shape)


def test_nested_in_writer_config_and_model_dump_round_trip():
    cfg = drt.WriterConfig(payload_spec={"dtype": "float32", "shape": [None, 3]})
    assert cfg.payload_spec == drt.PayloadSpec("float32", (None, 3))
    assert drt.WriterConfig(**cfg.model_dump()) == cfg
    assert drt.WriterConfig().payload_spec is None
    with pytest.raises(ValidationError, match="at most one dimension"):
        drt.WriterConfig(payload_spec={"dtype": "float32", "shape": [None, None]})
    with pytest.raises(ValidationError):
        drt.PayloadSpec.model_validate({"dtype": "int32", "shape": [1], "extra": 1})


def test_sizes_dense_ragged_and_scalar():
    dense = drt.PayloadSpec("int32", (4, 3))
    assert (dense.dense, dense.ragged_axis, dense.record_bytes, dense.unit_bytes) == (True, None, 48, None)
    ragged = drt.PayloadSpec("float64", (2, None, 3))
    assert (ragged.dense, ragged.ragged_axis, ragged.record_bytes, ragged.unit_bytes) == (False, 1, None, 48)
    scalar = drt.PayloadSpec("complex64", ())
    assert (scalar.dense, scalar.record_bytes) == (True, 8)
    empty = drt.PayloadSpec("uint8", (0, 5))
    assert empty.record_bytes == 0 and empty.fits(0) and not empty.fits(1)
    assert drt.PayloadSpec("int16", (None,)).unit_bytes == 2


def test_decode_is_a_zero_copy_view_with_the_buffers_writability():
    spec = drt.PayloadSpec("int32", (2, 3))
    values = np.arange(6, dtype="<i4").reshape(2, 3)
    data = values.tobytes()
    arr = spec.decode(data)
    assert arr.dtype == np.dtype("<i4") and arr.shape == (2, 3) and (arr == values).all()
    assert not arr.flags.writeable and np.shares_memory(arr, np.frombuffer(data, np.uint8))
    writable = bytearray(data)
    view = spec.decode(writable)
    view[0, 0] = 99
    assert writable[:4] == (99).to_bytes(4, "little")
    ragged = drt.PayloadSpec("uint16", (None, 2))
    assert ragged.decode(np.arange(8, dtype="<u2").tobytes()).shape == (4, 2)
    assert ragged.decode(b"").shape == (0, 2)
    assert drt.PayloadSpec("float64", ()).decode(np.float64(2.5).tobytes()).shape == ()
    assert drt.PayloadSpec("bool", (None,)).decode(b"\x01\x00").tolist() == [True, False]


def test_decode_refuses_lengths_that_do_not_fit():
    with pytest.raises(
        errors.CacheFormatError, match=r"payload of 20 bytes does not fit payload spec int32\[2, 3\]: expected 24 bytes"
    ):
        drt.PayloadSpec("int32", (2, 3)).decode(bytes(20))
    with pytest.raises(errors.CacheFormatError, match="expected a multiple of 8 bytes"):
        drt.PayloadSpec("int32", (None, 2)).decode(bytes(12))


def test_shape_rule_is_the_same_without_pydantic():
    assert shape_problem("int8", (None, 4)) is None and shape_problem("int8", ()) is None
    assert "at most one" in shape_problem("int8", (None, None))
    assert "integers" in shape_problem("int8", (1.0,))
