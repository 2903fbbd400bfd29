"""Mixture configuration: named streams of active rows (`Stream`), their exact proportions
(`Mixture`), and the resolved rows of each stream (`StreamRows`).

Boundary: plain values and numpy arrays; no Polars (table/streams.py turns `Stream` selections
into `StreamRows` once, when a mixture is set), no I/O, no processes. Plans live in plans.py.

Proportions are exact rationals: an int, `Fraction`, `Decimal`, a string ("1/3", "0.25") or a float
read as its shortest decimal (0.3 is 3/10). They must be >= 0 and sum to exactly 1; their common
denominator D (the interleave's period) must be at most MAX_PERIOD.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from datasetrt.errors import ArgumentTypeError, EmptyStreamError, SamplingConfigError, UnknownStreamError

MAX_PERIOD = 1 << 20  # common denominator of the proportions: the interleave table has D entries
MAX_STREAMS = 32767
DIGEST_BLOCK_ROWS = 1 << 16  # rows of a `range` stream hashed at a time (512 KiB)
ORDERS = ("permutation", "weighted")
ON_EXHAUSTED = ("next_epoch", "stop")
Order = Literal["permutation", "weighted"]
OnExhausted = Literal["next_epoch", "stop"]
ColumnValue = str | int | float | bool


@dataclass(frozen=True)
class Stream:
    """A selection of active rows: every row of some caches, or the rows whose `column` holds one
    of `values`. Build with `Stream.by_cache` / `Stream.by_column`; resolved against a table by
    `datasetrt.table.streams.group_streams`."""

    caches: tuple[str | int, ...] = ()
    column: str | None = None
    values: tuple[ColumnValue, ...] = ()

    @classmethod
    def by_cache(cls, *caches: str | os.PathLike | int) -> Stream:
        """Every active row of the given caches: cache directories (as given to the dataset) or
        cache_ids."""
        if not caches:
            raise SamplingConfigError("Stream.by_cache needs at least one cache path or cache_id")
        out: list[str | int] = []
        for cache in caches:
            if isinstance(cache, bool) or not isinstance(cache, (str, os.PathLike, int)):
                raise ArgumentTypeError(f"a cache is a path or a cache_id, got {type(cache).__name__}")
            if isinstance(cache, int) and not 0 <= cache < 1 << 64:
                raise SamplingConfigError(f"cache_id {cache} is not a u64")
            out.append(cache if isinstance(cache, int) else os.fspath(cache))
        return cls(caches=tuple(out))

    @classmethod
    def by_column(cls, column: str, *values: ColumnValue) -> Stream:
        """The active rows whose metadata `column` equals one of `values` (str, int, float or bool)."""
        if not isinstance(column, str) or not column:
            raise ArgumentTypeError(f"column must be a non-empty string, got {column!r}")
        if not values:
            raise SamplingConfigError(f"Stream.by_column({column!r}) needs at least one value")
        for value in values:
            if not isinstance(value, (str, int, float, bool)) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise ArgumentTypeError(
                    f"column {column!r}: a stream value must be a finite str/int/float/bool, got {value!r}"
                )
        return cls(column=column, values=tuple(values))

    def describe(self) -> str:
        if self.column is not None:
            return f"{self.column} in {list(self.values)!r}"
        return f"caches {list(self.caches)!r}"


def _fraction(stream: str, value: Any) -> Fraction:
    """A proportion read exactly (floats by their shortest decimal); >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal, str)):
        raise ArgumentTypeError(f"the proportion of stream {stream!r} must be a number, got {type(value).__name__}")
    try:
        frac = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    except (ValueError, ArithmeticError):
        raise SamplingConfigError(f"the proportion of stream {stream!r} is not a finite number: {value!r}") from None
    if frac < 0:
        raise SamplingConfigError(f"the proportion of stream {stream!r} is negative: {value!r}")
    return frac


def exact_proportions(names: tuple[str, ...], proportions: Mapping[str, Any]) -> tuple[dict[str, Fraction], int]:
    """Validated proportions over `names` (absent names get 0) and their common denominator D."""
    if not isinstance(proportions, Mapping) or not proportions:
        raise ArgumentTypeError("proportions must be a non-empty mapping of stream name to proportion")
    known = set(names)
    for key in proportions:
        if key not in known:
            raise UnknownStreamError(f"proportion given for unknown stream {key!r}; streams: {list(names)!r}")
    fracs = {name: _fraction(name, proportions[name]) if name in proportions else Fraction(0) for name in names}
    total = sum(fracs.values(), Fraction(0))
    if total != 1:
        raise SamplingConfigError(
            f"proportions must sum to 1, they sum to {float(total)!r} ({total}, reading each exactly: "
            f"{', '.join(f'{k}={v}' for k, v in fracs.items())}); write thirds as Fraction(1, 3)"
        )
    period = math.lcm(*(f.denominator for f in fracs.values()))
    if period > MAX_PERIOD:
        worst = max(fracs, key=lambda k: fracs[k].denominator)
        raise SamplingConfigError(
            f"the proportions' common denominator is {period}, past {MAX_PERIOD} (stream {worst!r}: {fracs[worst]}); "
            "round them to fewer decimals"
        )
    return fracs, period


class Mixture:
    """Named streams with exact proportions, interleaved so that after any n samples every stream
    has delivered within 1 of n x its proportion; each stream reads its rows in its own order.

    `streams`: stream name -> `Stream`; `proportions`: stream name -> proportion (streams left
    out get 0; unknown names are refused). `order`: "permutation" (each row of a stream once per
    stream epoch, integer weights as repeat counts) or "weighted" (with-replacement draws by the
    rows' weights, a stream epoch counting as many draws as the stream has rows). `on_exhausted`:
    "next_epoch" (a stream that completes its epoch starts the next one) or "stop" (the mixture
    ends when any stream with a positive proportion completes its epoch). Immutable.
    """

    __slots__ = ("streams", "proportions", "period", "weights", "order", "on_exhausted")

    def __init__(
        self,
        proportions: Mapping[str, Any],
        streams: Mapping[str, Stream],
        *,
        order: Order = "permutation",
        on_exhausted: OnExhausted = "next_epoch",
    ) -> None:
        if not isinstance(streams, Mapping) or not streams:
            raise ArgumentTypeError("streams must be a non-empty mapping of stream name to Stream")
        if len(streams) > MAX_STREAMS:
            raise SamplingConfigError(f"{len(streams)} streams: at most {MAX_STREAMS}")
        for name, stream in streams.items():
            if not isinstance(name, str) or not name:
                raise ArgumentTypeError(f"stream names must be non-empty strings, got {name!r}")
            if not isinstance(stream, Stream):
                raise ArgumentTypeError(f"stream {name!r} must be a Stream, got {type(stream).__name__}")
        if order not in ORDERS:
            raise SamplingConfigError(f"order must be one of {ORDERS}, got {order!r}")
        if on_exhausted not in ON_EXHAUSTED:
            raise SamplingConfigError(f"on_exhausted must be one of {ON_EXHAUSTED}, got {on_exhausted!r}")
        names = tuple(streams)
        fracs, period = exact_proportions(names, proportions)
        self.streams = MappingProxyType(dict(streams))
        self.proportions = MappingProxyType(fracs)
        self.period = period
        self.weights = tuple(int(f * period) for f in fracs.values())  # integer weights, sum = period
        self.order = order
        self.on_exhausted = on_exhausted

    @classmethod
    def by_column(cls, column: str, proportions: Mapping[ColumnValue, Any], **options: Any) -> Mixture:
        """One stream per value of `column` named `str(value)`: {"web": 0.5, "code": 0.5}."""
        streams = {str(value): Stream.by_column(column, value) for value in proportions}
        return cls(_renamed(proportions, len(streams)), streams, **options)

    @classmethod
    def by_cache(cls, proportions: Mapping[str | os.PathLike | int, Any], **options: Any) -> Mixture:
        """One stream per cache (a directory as given to the dataset, or a cache_id), named `str(key)`."""
        streams = {str(os.fspath(c) if not isinstance(c, int) else c): Stream.by_cache(c) for c in proportions}
        return cls(_renamed(proportions, len(streams)), streams, **options)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.streams)

    def _key(self) -> tuple:
        return (tuple(self.streams.items()), tuple(self.proportions.items()), self.order, self.on_exhausted)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mixture) and self._key() == other._key()

    def __reduce__(self) -> tuple:
        return _rebuild_mixture, (dict(self.proportions), dict(self.streams), self.order, self.on_exhausted)

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        props = ", ".join(f"{k!r}: {str(v)!r}" for k, v in self.proportions.items())
        return f"Mixture({{{props}}}, order={self.order!r}, on_exhausted={self.on_exhausted!r})"


def _rebuild_mixture(proportions: dict, streams: dict, order: Order, on_exhausted: OnExhausted) -> Mixture:
    return Mixture(proportions, streams, order=order, on_exhausted=on_exhausted)


def _renamed(proportions: Mapping[Any, Any], unique: int) -> dict[str, Any]:
    renamed = {str(os.fspath(k) if isinstance(k, os.PathLike) else k): v for k, v in proportions.items()}
    if len(renamed) != unique or len(renamed) != len(proportions):
        raise SamplingConfigError(f"two keys of {list(proportions)!r} name the same stream")
    return renamed


class StreamRows:
    """The resolved streams: per name, the int64 population rows it selects (table order, >= 0)
    and their float64 weights (None: every weight 1). Built once per mixture from the active table
    (table/streams.py) or directly from arrays; immutable afterwards. Streams are expected to be
    disjoint (the table grouping refuses overlaps); a row in two streams is read once per stream.
    A stream of consecutive rows may be given as a `range` (step 1): it is kept as one, so neither
    it nor its plan holds an array (O(1) memory whatever its length; same plan and digest as the
    equivalent array).
    """

    __slots__ = ("names", "rows", "weights", "_digests")

    def __init__(self, rows: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray] | None = None) -> None:
        if not isinstance(rows, Mapping) or not rows:
            raise ArgumentTypeError("StreamRows needs a non-empty mapping of stream name to row array")
        weights = weights or {}
        self.names = tuple(rows)
        self.rows: dict[str, np.ndarray] = {}
        self.weights: dict[str, np.ndarray | None] = {}
        for name, arr in rows.items():
            if isinstance(arr, range):
                if arr.step != 1 or not len(arr) or arr.start < 0:
                    raise SamplingConfigError(
                        f"stream {name!r}: a range of rows must be non-empty, of step 1, from row >= 0 (got {arr!r})"
                    )
                self.rows[name] = arr
                self.weights[name] = self._weights(name, weights.get(name), len(arr), arr.start)
                continue
            arr = np.asarray(arr)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ArgumentTypeError(f"stream {name!r}: rows must be a 1-D integer array")
            if arr.size == 0:
                raise EmptyStreamError(f"stream {name!r} selects no active row")
            arr = np.ascontiguousarray(arr, dtype=np.int64)
            if int(arr.min()) < 0:
                raise SamplingConfigError(f"stream {name!r}: row {int(arr.min())} is negative")
            arr.flags.writeable = False
            self.rows[name] = arr
            self.weights[name] = self._weights(name, weights.get(name), len(arr), arr)
        unknown = set(weights) - set(self.rows)
        if unknown:
            raise UnknownStreamError(f"weights given for unknown streams {sorted(unknown)!r}")
        self._digests: dict[str, str] = {}

    @staticmethod
    def _weights(name: str, w: Any, n: int, rows: np.ndarray | int) -> np.ndarray | None:
        """Checked float64 weights of a stream of `n` rows (`rows`: its array, or its first row)."""
        if w is None:
            return None
        w = np.ascontiguousarray(w, dtype=np.float64)
        if w.shape != (n,):
            raise SamplingConfigError(f"stream {name!r}: {len(w)} weights for {n} rows")
        bad = np.flatnonzero(~(np.isfinite(w) & (w > 0)))
        if bad.size:
            row = int(bad[0]) + rows if isinstance(rows, int) else int(rows[bad[0]])
            raise SamplingConfigError(
                f"stream {name!r}: weight {float(w[bad[0]])!r} of table row {row} is not positive and finite"
            )
        w.flags.writeable = False
        return w

    def index(self, n_rows: int) -> np.ndarray:
        """The streams as one int16 column over `n_rows` population rows: the index (into `names`)
        of the stream each row belongs to, -1 for rows of no stream. O(rows), vectorised."""
        index = np.full(n_rows, -1, dtype=np.int16)
        for i, name in enumerate(self.names):
            rows = self.rows[name]
            index[slice(rows.start, rows.stop) if isinstance(rows, range) else rows] = i
        return index

    @classmethod
    def from_index(cls, names: tuple[str, ...], index: np.ndarray, weights: np.ndarray | None = None) -> StreamRows:
        """The streams of an `index()` column (one int16 entry per population row), with the rows'
        float64 `weights` (None: every weight 1). O(rows x streams), vectorised; EmptyStreamError
        if a stream has no row in `index`."""
        rows = {name: np.flatnonzero(index == i) for i, name in enumerate(names)}
        if weights is None:
            return cls(rows)
        return cls(rows, {name: weights[r] for name, r in rows.items()})

    def digest(self, name: str) -> str:
        """BLAKE2b-128 of a stream's rows and weights (hex); computed once, O(rows)."""
        if name not in self._digests:
            h = hashlib.blake2b(digest_size=16)
            rows = self.rows[name]
            if isinstance(rows, range):  # the bytes of the equivalent array, 2^16 rows at a time
                for first in range(rows.start, rows.stop, DIGEST_BLOCK_ROWS):
                    h.update(np.arange(first, min(first + DIGEST_BLOCK_ROWS, rows.stop), dtype=np.int64).tobytes())
            else:
                h.update(rows.tobytes())
            w = self.weights[name]
            h.update(b"ones" if w is None else w.tobytes())
            self._digests[name] = h.hexdigest()
        return self._digests[name]

    def __repr__(self) -> str:
        return "StreamRows({" + ", ".join(f"{k!r}: {len(v)} rows" for k, v in self.rows.items()) + "})"
