"""SampleBatch indexing: Python sequence semantics for payload(i), typed errors out of range."""

from __future__ import annotations

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import ArgumentTypeError, SampleIndexError
from datasetrt.runtime.sample_batch import SampleBatch
from tests.conftest import ListSource, writer_config


def _batch(payloads: list[bytes]) -> SampleBatch:
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    data = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    ids = np.arange(len(payloads), dtype=np.uint64)
    return SampleBatch(data, offsets, np.zeros(len(payloads), dtype=np.uint64), ids)


PAYLOADS = [bytes([k]) * (k + 1) for k in range(8)]


def test_negative_indices_count_from_the_end():
    batch = _batch(PAYLOADS)
    for k in range(1, 9):
        assert bytes(batch.payload(-k)) == PAYLOADS[8 - k]
    assert bytes(batch.payload(np.int64(-1))) == PAYLOADS[-1]
    assert [bytes(batch.payload(i)) for i in range(len(batch))] == PAYLOADS


@pytest.mark.parametrize("i", [8, 9, -9, 1 << 70])
def test_out_of_range_is_a_sample_index_error_naming_index_and_length(i):
    batch = _batch(PAYLOADS)
    with pytest.raises(SampleIndexError, match=rf"batch index {i} is out of range for a batch of 8 samples"):
        batch.payload(i)
    with pytest.raises(IndexError):  # what code written for sequences catches
        batch.payload(i)


def test_non_integer_index_is_a_type_error():
    batch = _batch(PAYLOADS)
    for bad in (1.0, "1", None):
        with pytest.raises(ArgumentTypeError, match="batch indices must be integers"):
            batch.payload(bad)
    assert bytes(batch.payload(np.uint8(3))) == PAYLOADS[3]


def test_empty_payloads_are_not_confused_with_out_of_range():
    batch = _batch([b"", b"x", b""])
    assert bytes(batch.payload(-1)) == b"" and bytes(batch.payload(-2)) == b"x"
    with pytest.raises(SampleIndexError):
        batch.payload(3)


def test_batches_from_a_dataset_index_like_sequences(tmp_path):
    items = [(f"p{k}".encode(), {"k": k}) for k in range(8)]
    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache([ListSource("eight", items)], tmp_path, writer_config=writer_config())
    ds = drt.CachedDataset([res.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=None)
    [batch] = list(ds.iter_batches(8))
    assert bytes(batch.payload(-1)) == b"p7" and bytes(batch.payload(-8)) == b"p0"
    with pytest.raises(SampleIndexError, match="batch index 8 is out of range for a batch of 8 samples"):
        batch.payload(8)
    ds.close()
