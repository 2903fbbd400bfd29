"""numpy source (datasetrt/sources/arrays.py): dense, scalar and ragged payloads, metadata arrays,
memory-mapped input, argument checks and row-named errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from datasetrt import PayloadSpec
from datasetrt.errors import ArgumentTypeError, ConfigError, SourceInputError
from datasetrt.sources import NumpySource


def test_dense_records_with_metadata_arrays():
    data = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    labels = np.arange(10) % 3
    names = np.array([f"n{i}" for i in range(10)])
    source = NumpySource("x", data, metadata={"label": labels, "name": names, "ok": labels > 0}, batch_bytes=64)
    out = list(source)
    assert len(source) == 10 and source.payload_spec == PayloadSpec("float32", (2, 3))
    for i, (d, m) in enumerate(out):
        np.testing.assert_array_equal(d, data[i])
        assert m == {"label": int(labels[i]), "name": f"n{i}", "ok": bool(labels[i] > 0)}


def test_scalar_records_and_the_index_column():
    source = NumpySource("s", np.array([5, 6, 7], dtype=np.int64), index_column="row")
    out = list(source)
    assert source.payload_spec == PayloadSpec("int64", ())
    assert [(bytes(memoryview(d)), m) for d, m in out] == [
        (np.int64(v).tobytes(), {"row": i}) for i, v in enumerate([5, 6, 7])
    ]


def test_ragged_records_by_offsets():
    tokens = np.arange(12, dtype=np.int32)
    offsets = np.array([0, 4, 4, 9, 12])
    source = NumpySource("r", tokens, offsets=offsets, index_column="row", batch_bytes=8)
    out = list(source)
    assert source.payload_spec == PayloadSpec("int32", (None,))
    assert [d.tolist() for d, _ in out] == [[0, 1, 2, 3], [], [4, 5, 6, 7, 8], [9, 10, 11]]
    assert [m["row"] for _, m in out] == [0, 1, 2, 3]


def test_memory_mapped_input(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(4000, dtype=np.uint16).reshape(1000, 4))
    data = np.load(path, mmap_mode="r")
    out = list(NumpySource("m", data, index_column="i", batch_bytes=256))
    assert len(out) == 1000 and out[999][0].tolist() == [3996, 3997, 3998, 3999]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"data": [1, 2]}, ArgumentTypeError, "numpy array"),
        ({"data": np.array(["a"])}, ConfigError, "not a number or bool dtype"),
        ({"data": np.array(3)}, ConfigError, "at least one dimension"),
        ({"data": np.arange(4), "offsets": [0, 2, 5]}, ConfigError, "end at len"),
        ({"data": np.arange(4), "offsets": [0, 3, 2, 4]}, ConfigError, "never decrease"),
        ({"data": np.arange(4), "metadata": {"m": np.arange(3)}}, ConfigError, "1-D of length 4"),
        ({"data": np.arange(4), "metadata": {"data": np.arange(4)}}, ConfigError, "taken by the payload"),
    ],
)
def test_argument_checks(kwargs, error, match):
    with pytest.raises(error, match=match):
        NumpySource("bad", **kwargs)


def test_bad_metadata_values_name_the_row():
    scores = np.array([0.5, 1.5, np.nan, 2.0])
    with pytest.raises(SourceInputError) as info:
        list(NumpySource("n", np.zeros((4, 2), np.uint8), metadata={"score": scores}))
    assert (
        str(info.value) == "numpy arrays of source 'n': row 2: metadata column 'score' (double) is nan; "
        "float metadata must be finite"
    )
    with pytest.raises(SourceInputError, match="column 'when' has type timestamp"):
        list(
            NumpySource(
                "t", np.zeros((2, 2)), metadata={"when": np.array(["2024-01-01", "2024-01-02"], "datetime64[s]")}
            )
        )


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">u2"])
def test_arrays_of_the_other_byte_order_hold_the_same_records(dtype):
    """docs/python-api.md: any byte order is accepted; records hold the little-endian bytes."""
    native = np.arange(24).astype(dtype.replace(">", "<")).reshape(6, 4)
    swapped = native.astype(dtype)
    assert swapped.dtype.byteorder == ">" and swapped.dtype.name == native.dtype.name
    labels = np.arange(6, dtype=">i8")
    dense = NumpySource("be", swapped, metadata={"label": labels}, batch_bytes=40)
    assert dense.payload_spec == PayloadSpec(native.dtype.name, (4,))
    out = list(dense)
    assert [bytes(memoryview(d)) for d, _ in out] == [row.tobytes() for row in native]
    assert [m["label"] for _, m in out] == list(range(6))
    offsets = np.array([0, 5, 5, 24])
    ragged = list(NumpySource("rag", swapped.reshape(-1), offsets=offsets, index_column="i"))
    assert [bytes(memoryview(d)) for d, _ in ragged] == [
        native.reshape(-1)[lo:hi].tobytes() for lo, hi in itertools.pairwise(offsets)
    ]
