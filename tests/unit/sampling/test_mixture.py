"""datasetrt.sampling.mixture: stream selections, exact proportions and their refusals, resolved
stream rows. Every refusal is a typed error (subclassing ValueError or TypeError) naming the
stream or value."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import datasetrt as drt
from datasetrt.errors import (
    ArgumentTypeError,
    EmptyStreamError,
    SamplingConfigError,
    UnknownStreamError,
)
from datasetrt.sampling import Mixture, Stream, StreamRows
from datasetrt.sampling.mixture import MAX_PERIOD

WEB, CODE, BOOKS = (
    Stream.by_column("source", "web"),
    Stream.by_column("source", "code", "nb"),
    Stream.by_cache("c/books"),
)
STREAMS = {"web": WEB, "code": CODE, "books": BOOKS}


def test_public_names():
    assert drt.Mixture is Mixture and drt.Stream is Stream
    assert {"Mixture", "Stream", "Stage", "Curriculum"} <= set(drt.__all__)


def test_proportions_are_exact_and_give_integer_weights():
    mix = Mixture({"web": 0.5, "code": 0.3, "books": 0.2}, STREAMS)
    assert dict(mix.proportions) == {"web": Fraction(1, 2), "code": Fraction(3, 10), "books": Fraction(1, 5)}
    assert mix.period == 10 and mix.weights == (5, 3, 2) and mix.names == ("web", "code", "books")
    # floats that do not sum to 1 in binary still do as decimals
    mix = Mixture({"web": 0.1, "code": 0.2, "books": 0.7}, STREAMS)
    assert mix.weights == (1, 2, 7)
    thirds = Mixture({"web": Fraction(1, 3), "code": "1/3", "books": Fraction(1, 3)}, STREAMS)
    assert thirds.weights == (1, 1, 1) and thirds.period == 3
    quarters = Mixture({"web": Decimal("0.25"), "code": "0.25", "books": 1 / 2}, STREAMS)
    assert quarters.weights == (1, 1, 2) and quarters.period == 4
    partial = Mixture({"web": 1}, STREAMS)  # streams left out get 0
    assert partial.weights == (1, 0, 0)


@pytest.mark.parametrize(
    "props, match",
    [
        ({"web": 0.5, "code": 0.3}, r"sum to 1, they sum to 0\.8"),
        ({"web": 0.6, "code": 0.3, "books": 0.2}, r"sum to 1, they sum to 1\.1"),
        ({"web": 1 / 3, "code": 1 / 3, "books": 1 / 3}, r"Fraction\(1, 3\)"),
        ({"web": 1.2, "code": -0.2}, r"stream 'code' is negative: -0\.2"),
        ({"web": float("nan"), "code": 1}, r"stream 'web' is not a finite number"),
        ({"web": "x", "code": 1}, r"stream 'web' is not a finite number"),
        ({"web": 0.5, "code": 0.5000001, "books": -0.0000001}, r"negative"),
        (
            {"web": Fraction(1, MAX_PERIOD + 1), "code": 1 - Fraction(1, MAX_PERIOD + 1)},
            r"common denominator is 1048577.*stream 'web'",
        ),
    ],
)
def test_bad_proportions_are_refused(props, match):
    with pytest.raises(SamplingConfigError, match=match):
        Mixture(props, STREAMS)


def test_unknown_stream_and_types_are_refused():
    with pytest.raises(UnknownStreamError, match=r"unknown stream 'video'.*'web', 'code', 'books'"):
        Mixture({"web": 0.5, "video": 0.5}, STREAMS)
    with pytest.raises(ArgumentTypeError):
        Mixture({"web": True}, STREAMS)
    with pytest.raises(ArgumentTypeError):
        Mixture({}, STREAMS)
    with pytest.raises(ArgumentTypeError):
        Mixture({"web": 1}, {"web": "source == web"})
    with pytest.raises(SamplingConfigError, match="order"):
        Mixture({"web": 1}, STREAMS, order="random")
    with pytest.raises(SamplingConfigError, match="on_exhausted"):
        Mixture({"web": 1}, STREAMS, on_exhausted="loop")


def test_stream_selections():
    assert Stream.by_cache("a", Path("b"), 7).caches == ("a", "b", 7)
    assert Stream.by_column("lang", "py", "rs").values == ("py", "rs")
    for bad in (lambda: Stream.by_cache(), lambda: Stream.by_column("c")):
        with pytest.raises(SamplingConfigError):
            bad()
    for bad in (
        lambda: Stream.by_cache(1.5),
        lambda: Stream.by_column("", 1),
        lambda: Stream.by_column("c", None),
        lambda: Stream.by_column("c", float("inf")),
    ):
        with pytest.raises(ArgumentTypeError):
            bad()
    with pytest.raises(SamplingConfigError, match="u64"):
        Stream.by_cache(-1)


def test_shorthands_name_streams_by_value_or_cache():
    by_value = Mixture.by_column("source", {"web": 0.75, "code": 0.25})
    assert by_value.names == ("web", "code") and by_value.streams["code"] == Stream.by_column("source", "code")
    by_int = Mixture.by_column("shard", {0: 0.5, 1: 0.5}, on_exhausted="stop")
    assert by_int.names == ("0", "1") and by_int.on_exhausted == "stop"
    by_cache = Mixture.by_cache({Path("c/a"): 0.5, 17: 0.5}, order="weighted")
    assert by_cache.names == ("c/a", "17") and by_cache.streams["17"] == Stream.by_cache(17)
    with pytest.raises(SamplingConfigError, match="same stream"):
        Mixture.by_cache({"1": 0.5, 1: 0.5})


def test_mixtures_compare_by_value():
    a = Mixture({"web": 0.5, "code": 0.5}, STREAMS)
    assert a == Mixture({"code": "1/2", "web": Fraction(1, 2)}, STREAMS) and hash(a) == hash(
        Mixture({"web": 0.5, "code": 0.5}, STREAMS)
    )
    assert a != Mixture({"web": 0.5, "code": 0.5}, STREAMS, on_exhausted="stop")
    assert "Mixture({'web': '1/2'" in repr(a)


def test_stream_rows_validation():
    rows = StreamRows({"a": [0, 2, 4], "b": np.array([1, 3], dtype=np.uint32)}, {"a": np.array([1.0, 2.0, 1.0])})
    assert rows.names == ("a", "b") and rows.rows["b"].dtype == np.int64 and rows.weights["b"] is None
    assert not rows.rows["a"].flags.writeable
    assert rows.digest("a") != rows.digest("b") and len(rows.digest("a")) == 32
    assert StreamRows({"a": [0, 2, 4]}).digest("a") != rows.digest("a")  # weights are part of the identity
    with pytest.raises(EmptyStreamError, match="stream 'b' selects no active row"):
        StreamRows({"a": [1], "b": []})
    with pytest.raises(SamplingConfigError, match="negative"):
        StreamRows({"a": [1, -2]})
    with pytest.raises(SamplingConfigError, match="2 weights for 3 rows"):
        StreamRows({"a": [1, 2, 3]}, {"a": [1.0, 1.0]})
    with pytest.raises(SamplingConfigError, match="weight 0.0 of table row 2"):
        StreamRows({"a": [1, 2, 3]}, {"a": [1.0, 0.0, 1.0]})
    with pytest.raises(UnknownStreamError):
        StreamRows({"a": [1]}, {"z": [1.0]})
    with pytest.raises(ArgumentTypeError):
        StreamRows({"a": [[1, 2]]})
    with pytest.raises(ArgumentTypeError):
        StreamRows({"a": [0.5]})
