"""Writer-side typed payloads (format/typed.py via WriterConfig(payload_spec=...)): what is accepted
(numpy arrays, torch tensors, __dlpack__ producers, typed and untyped buffers) and stored as
little-endian C-order bytes, and what is refused: a per-source CacheWriteError naming the source,
sample index, expected and actual, with nothing published and later sources still written."""

from __future__ import annotations

import array
import json

import numpy as np
import pytest

import datasetrt as drt
from tests.conftest import writer_config
from tests.unit.format.sources import Raw

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


def _write(tmp_path, spec, payloads, algo="none", extra_sources=()):
    rt = drt.DatasetRuntime(num_workers=1)
    try:
        items = [(p, {"i": i}) for i, p in enumerate(payloads)]
        config = writer_config(algo, payload_spec=spec)
        return rt.write_cache([Raw("typed", items), *extra_sources], tmp_path / "caches", writer_config=config)
    finally:
        rt.close()


def _read(path, spec):
    ds = drt.CachedDataset([path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec == spec
    return [s.data for s in ds]


def _refused(tmp_path, spec, payloads, *match):
    after = Raw("after", [(bytes(spec.record_bytes or 0), {"i": 0})])  # fits the spec
    results = _write(tmp_path, spec, payloads, extra_sources=[after])
    assert isinstance(results[0], drt.CacheWriteError), results[0]
    assert results[0].source_name == "typed"
    for text in match:
        assert text in results[0].message, (text, results[0].message)
    assert isinstance(results[1], drt.CacheWriteSuccess)  # later sources are still written
    assert not (tmp_path / "caches" / "typed").exists()  # nothing published
    assert not (tmp_path / "caches" / "tmp").exists()  # no staging dir left, so no staging root
    return results[0].message


@pytest.mark.parametrize("algo", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("name", FAMILIES)
def test_every_dtype_family_round_trips_as_little_endian_bytes(tmp_path, name, algo):
    rng = np.random.default_rng(len(name))
    values = [(rng.integers(0, 200, size=(2, 3)) % (2 if name == "bool" else 200)).astype(name) for _ in range(5)]
    spec = drt.PayloadSpec(name, (2, 3))
    (result,) = _write(tmp_path, spec, values, algo)
    assert isinstance(result, drt.CacheWriteSuccess), result
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["datasetrt"]["payload_spec"] == {"dtype": name, "shape": [2, 3]}
    datas = _read(result.path, spec)
    assert datas == [v.astype(np.dtype(name).newbyteorder("<")).tobytes() for v in values]
    assert all((spec.decode(d) == v).all() for d, v in zip(datas, values))


def test_ragged_records_take_their_length_from_the_bytes(tmp_path):
    spec = drt.PayloadSpec("int32", (None, 2))
    values = [np.arange(2 * n, dtype=np.int32).reshape(n, 2) for n in (3, 0, 1, 7)]
    (result,) = _write(tmp_path, spec, values, "lz4")
    datas = _read(result.path, spec)
    assert [spec.decode(d).shape for d in datas] == [(3, 2), (0, 2), (1, 2), (7, 2)]
    assert all((spec.decode(d) == v).all() for d, v in zip(datas, values))


def test_scalars_and_non_contiguous_or_big_endian_arrays(tmp_path):
    spec = drt.PayloadSpec("float64", ())
    (result,) = _write(tmp_path, spec, [np.float64(1.5), np.array(2.5), np.array(3.5, dtype=">f8")])
    assert [spec.decode(d).item() for d in _read(result.path, spec)] == [1.5, 2.5, 3.5]
    spec = drt.PayloadSpec("int16", (2, 2))
    base = np.arange(16, dtype=">i2").reshape(4, 4)
    (result,) = _write(tmp_path / "b", spec, [base[::2, ::2], base[1:3, 1:3].T])
    assert [spec.decode(d).tolist() for d in _read(result.path, spec)] == [[[0, 2], [8, 10]], [[5, 9], [6, 10]]]


def test_untyped_buffers_are_accepted_when_their_length_fits(tmp_path):
    spec = drt.PayloadSpec("uint16", (None,))
    raw = np.array([1, 2, 3], dtype="<u2").tobytes()
    payloads = [raw, bytearray(raw), memoryview(raw), memoryview(raw).cast("b"), memoryview(raw).cast("c"), b""]
    (result,) = _write(tmp_path, spec, payloads)
    assert _read(result.path, spec) == [raw] * 5 + [b""]


def test_typed_buffers_and_dlpack_producers(tmp_path):
    spec = drt.PayloadSpec("int32", (None,))

    class Producer:  # a __dlpack__ producer that is not a numpy array
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kwargs):
            return self.arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    payloads = [
        array.array("i", [1, 2]),
        Producer(np.array([3, 4, 5], dtype=np.int32)),
        memoryview(array.array("i", [6])),
    ]
    (result,) = _write(tmp_path, spec, payloads)
    assert [spec.decode(d).tolist() for d in _read(result.path, spec)] == [[1, 2], [3, 4, 5], [6]]


def test_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    spec = drt.PayloadSpec(torch.float32, (2, 2))
    t = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    payloads = [t[:, :2], t[:, 2:].t(), torch.ones(2, 2)]
    (result,) = _write(tmp_path, spec, payloads, "zstd")
    assert [spec.decode(d).tolist() for d in _read(result.path, spec)] == [p.tolist() for p in payloads]
    message = _refused(
        tmp_path / "grad",
        spec,
        [torch.ones(2, 2), torch.ones(2, 2, requires_grad=True)],
        "source 'typed' sample 1",
        "__dlpack__",
        "float32[2, 2]",
    )
    assert "detach" in message
    _refused(tmp_path / "bf16", spec, [torch.ones(2, 2, dtype=torch.bfloat16)], "sample 0", "float32[2, 2]")


@pytest.mark.parametrize(
    ("payload", "actual"),
    [
        (np.zeros((2, 3), dtype=np.int64), "int64[2, 3]"),
        (np.zeros((3, 2), dtype=np.int32), "int32[3, 2]"),
        (np.zeros(6, dtype=np.int32), "int32[6]"),
        (np.zeros((2, 3), dtype=np.uint8), "uint8[2, 3]"),
        (array.array("f", [0.0] * 6), "float32[6]"),
        (np.zeros((2, 3), dtype=[("a", "<i4")]), "[2, 3]"),
    ],
    ids=["dtype", "shape", "ndim", "bytes-dtype", "typed-buffer", "structured"],
)
def test_typed_mismatches_name_sample_expected_and_actual(tmp_path, payload, actual):
    spec = drt.PayloadSpec("int32", (2, 3))
    good = np.zeros((2, 3), dtype=np.int32)
    _refused(tmp_path, spec, [good, good, payload], "source 'typed' sample 2", "expected int32[2, 3]", actual)


@pytest.mark.parametrize(
    ("shape", "payload", "words"),
    [
        ((2, 3), bytes(20), ["20 bytes", "expected 24 bytes"]),
        ((None, 3), bytes(10), ["10 bytes", "expected a multiple of 12 bytes"]),
        ((), b"\x00" * 3, ["3 bytes", "expected 4 bytes"]),
    ],
    ids=["dense", "ragged-not-a-multiple", "scalar"],
)
def test_untyped_length_mismatches(tmp_path, shape, payload, words):
    _refused(tmp_path, drt.PayloadSpec("int32", shape), [payload], "source 'typed' sample 0", *words)


def test_ragged_typed_mismatch_on_a_fixed_dim(tmp_path):
    spec = drt.PayloadSpec("float32", (None, 4))
    _refused(
        tmp_path,
        spec,
        [np.zeros((5, 4), np.float32), np.zeros((5, 3), np.float32)],
        "sample 1",
        "expected float32[None, 4]",
        "float32[5, 3]",
    )


def test_objects_that_are_not_payloads_are_refused(tmp_path):
    spec = drt.PayloadSpec("int32", ())
    _refused(tmp_path, spec, [3], "sample 0", "int")
    _refused(tmp_path / "b", spec, ["text"], "sample 0")


def test_without_a_spec_nothing_changes(tmp_path):
    (result,) = _write(tmp_path, None, [np.arange(3, dtype=np.int64), b"raw"])
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert "payload_spec" not in manifest["datasetrt"]
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
    assert ds.payload_spec is None
    assert [s.data for s in ds] == [np.arange(3, dtype=np.int64).tobytes(), b"raw"]
