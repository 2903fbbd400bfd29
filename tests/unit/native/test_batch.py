"""_native.batch: the span checks every entry point makes before it copies (a caller bug is a
ConfigError raised through the kernels' choke point, never a write outside a buffer)."""

from __future__ import annotations

import numpy as np
import pytest

from datasetrt import errors
from datasetrt._native import batch

DATA = np.frombuffer(b'{"a":1}xyz{"b":2}pq', dtype=np.uint8)
JSON_OFF, JSON_LEN = np.array([0, 10], dtype=np.int64), np.array([7, 7], dtype=np.int64)
DATA_OFF, DATA_LEN = np.array([7, 17], dtype=np.int64), np.array([3, 2], dtype=np.int64)


def test_in_bounds_spans_are_packed_joined_and_listed():
    assert batch.json_array(DATA, JSON_OFF, JSON_LEN, 2) == (b'[{"a":1},{"b":2}]', -1)
    assert batch.slice_bytes(DATA, DATA_OFF, DATA_LEN, 2) == [b"xyz", b"pq"]
    out, out_off = np.zeros(8, dtype=np.uint8), np.zeros(2, dtype=np.int64)
    assert batch.pack_payloads(DATA, DATA_OFF, DATA_LEN, 2, out, out_off, 3) == 8
    assert bytes(out[3:]) == b"xyzpq" and out_off.tolist() == [3, 6]


@pytest.mark.parametrize(
    ("off", "length", "n"),
    [([7, 18], [3, 2], 2), ([-1, 17], [3, 2], 2), ([7, 17], [3, -2], 2), ([7, 17], [3, 2], 3)],
    ids=["past-end", "negative-offset", "negative-length", "more-rows-than-spans"],
)
def test_spans_outside_the_buffer_are_refused(off, length, n):
    off, length = np.array(off, dtype=np.int64), np.array(length, dtype=np.int64)
    for call in (
        lambda: batch.slice_bytes(DATA, off, length, n),
        lambda: batch.json_array(DATA, off, length, n),
        lambda: batch.pack_payloads(DATA, off, length, n, np.zeros(64, np.uint8), np.zeros(4, np.int64), 0),
    ):
        with pytest.raises(errors.ConfigError, match="span|rows asked"):
            call()


def test_pack_payloads_refuses_an_output_too_small():
    out = np.zeros(7, dtype=np.uint8)
    with pytest.raises(errors.ConfigError, match="5 payload bytes from offset 3 do not fit a 7-byte buffer"):
        batch.pack_payloads(DATA, DATA_OFF, DATA_LEN, 2, out, np.zeros(2, np.int64), 3)
    assert not out.any()  # nothing was written
