"""numpy source: payloads from one array (a record per row, or ragged records by offsets) and
metadata from 1-D arrays.

Boundary: wraps numpy arrays as Arrow arrays (zero-copy) for the shared column mapping; no cache
format, no files, no processes.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from datasetrt.errors import ArgumentTypeError, ConfigError
from datasetrt.sources.base import BATCH_BYTES, BatchSource, Part
from datasetrt.sources.columns import LEAF_DTYPES, Where
from datasetrt.values.config import PayloadSpec

PAYLOAD = "data"  # the payload column's name inside the Arrow batches this source builds


class NumpySource(BatchSource):
    """Payloads from numpy, one cache.

    `data` of shape [N, *shape]: record i is data[i] (`payload_spec` PayloadSpec(data.dtype, shape)).
    With `offsets` (int, len N+1, non-decreasing, offsets[0] == 0 and offsets[-1] == len(data)):
    `data` is [M, *inner] and record i is data[offsets[i]:offsets[i+1]] (ragged: PayloadSpec(
    data.dtype, (None, *inner)); offsets are cu_seqlens). A given `payload_spec` casts and reshapes
    as for list columns (see `Columns`). `metadata` maps names to 1-D arrays of length N (bool,
    int, uint, float, str). Arrays are read in slices of about `batch_bytes`, so an
    `np.load(..., mmap_mode="r")` array is read a slice at a time; arrays of either byte order are
    accepted (a non-native slice is swapped as it is read). Errors name the row.
    """

    def __init__(
        self,
        name: str,
        data: Any,
        *,
        offsets: Any = None,
        metadata: Mapping[str, Any] | None = None,
        rename: Mapping[str, str] | None = None,
        payload_spec: Any = None,
        index_column: str | None = None,
        batch_bytes: int | None = None,
    ) -> None:
        if not isinstance(data, np.ndarray):
            raise ArgumentTypeError(f"data must be a numpy array, got {type(data).__name__}")
        if data.dtype.newbyteorder("=") not in LEAF_DTYPES.values():
            raise ConfigError(f"data dtype {data.dtype} is not a number or bool dtype")
        if data.ndim == 0:
            raise ConfigError("data must have at least one dimension (one record per row)")
        self.data = data
        self.offsets = None
        if offsets is not None:
            offsets = np.asarray(offsets)
            if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) == 0:
                raise ConfigError("offsets must be a 1-D integer array of length N+1")
            offsets = offsets.astype(np.int64)
            if offsets[0] != 0 or offsets[-1] != len(data) or (np.diff(offsets) < 0).any():
                raise ConfigError(f"offsets must start at 0, never decrease and end at len(data) = {len(data)}")
            self.offsets = offsets
        if payload_spec is None:  # the array's own layout: a scalar record has shape ()
            shape = data.shape[1:] if offsets is None else (None, *data.shape[1:])
            payload_spec = PayloadSpec(data.dtype.name, tuple(shape))
        metadata = dict(metadata or {})
        if PAYLOAD in metadata:
            raise ConfigError(f"metadata column name {PAYLOAD!r} is taken by the payload here; rename it")
        super().__init__(
            name,
            payload=PAYLOAD,
            metadata=list(metadata),
            rename=rename,
            payload_spec=payload_spec,
            index_column=index_column,
            batch_bytes=BATCH_BYTES if batch_bytes is None else batch_bytes,
        )
        self.count = len(data) if self.offsets is None else len(self.offsets) - 1
        self.metadata_arrays = {}
        for key, values in metadata.items():
            values = np.asarray(values)
            if values.ndim != 1 or len(values) != self.count:
                raise ConfigError(
                    f"metadata array {key!r} has shape {values.shape}; it must be 1-D of length {self.count}"
                )
            self.metadata_arrays[key] = values

    def __len__(self) -> int:
        return self.count

    def _parts(self) -> Generator[Part, None, None]:
        if self.count == 0:
            return
        batch = self._batch(0, min(self.count, 1))
        yield Part(f"numpy arrays of source {self.name!r}", batch.schema, self._batches())

    def _batches(self) -> Iterator[tuple[Where, pa.RecordBatch]]:
        label = f"numpy arrays of source {self.name!r}"
        per_row = self.data.nbytes / max(1, self.count)
        rows = self.batch_rows(per_row)
        for start in range(0, self.count, rows):
            yield Where(label, None, 0, start, 0), self._batch(start, min(self.count, start + rows))

    def _batch(self, start: int, stop: int) -> pa.RecordBatch:
        """Rows [start, stop) as a record batch: the payload a (fixed-size) list array over the
        slice's values, the metadata their arrays (zero-copy where numpy and Arrow agree)."""
        if self.offsets is None:
            values = self.data[start:stop]
            payload = _nested(_native(values).reshape(-1), values.shape[1:])
        else:
            lo, hi = int(self.offsets[start]), int(self.offsets[stop])
            values = self.data[lo:hi]
            inner = _nested(_native(values).reshape(-1), values.shape[1:], outer=False)
            payload = pa.LargeListArray.from_arrays(pa.array(self.offsets[start : stop + 1] - lo), inner)
        columns = {PAYLOAD: payload}
        for key, values in self.metadata_arrays.items():
            columns[key] = pa.array(_native(values[start:stop]))
        return pa.RecordBatch.from_pydict(columns)


def _native(values: np.ndarray) -> np.ndarray:
    """`values` C-contiguous in native byte order (Arrow takes no byte-swapped array): itself
    when it already is, else a swapped copy of this slice only."""
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))


def _nested(flat: np.ndarray, shape: tuple, outer: bool = True) -> pa.Array:
    """Fixed-size lists over `flat` for trailing dims `shape` (outer=True also groups by record)."""
    array = pa.array(flat)
    dims = list(shape)
    for size in reversed(dims):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    if outer and not dims:  # scalars: one element per record
        array = pa.FixedSizeListArray.from_arrays(array, 1)
    return array
