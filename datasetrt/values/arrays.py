"""Typed views of a batch's payload bytes: the dense `[n, *shape]` array, ragged values with
cu_seqlens offsets and per-record shapes, and the fixed-length projection (`SampleBatch.to_numpy`).

Boundary: numpy and the projection kernel only; no files, tables or processes, torch only in
`as_tensors`, imported at its first call. Layer 1; `SampleBatch` (runtime/sample_batch.py) imports it lazily.

Input everywhere: `data`, a 1-D uint8 array holding n payloads back to back (payload i is
data[offsets[i] : offsets[i+1]], `offsets` int64 of n+1 entries, offsets[0] = 0), and the
cache's spec as (dtype name, shape); no spec reads as `("uint8", (None,))`. Bytes are
little-endian, C order (docs/storage-format.md). Dense and ragged results are views of `data`
(zero-copy: they keep it, and so the batch's ring slot, alive); a projection is a new array,
unless every record already has the projected length (then a view).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from datasetrt._native.batch import project_rows
from datasetrt.errors import ArgumentTypeError, ConfigError
from datasetrt.values.payloads import describe


class RaggedArrays(NamedTuple):
    """A batch of ragged records: `values` (the records' elements back to back; shape
    `[total, *shape[1:]]` when the ragged dim is the first, else 1-D), `offsets` (int64, n+1:
    cu_seqlens in elements along the ragged dim, offsets[0] = 0) and `shapes` (int64 `[n, ndim]`:
    each record's shape). Record i: `values[offsets[i]:offsets[i+1]]` (ragged dim first), else
    `values.reshape(-1)[offsets[i] * unit : offsets[i+1] * unit].reshape(shapes[i])` with unit
    the product of the other dims."""

    values: Any
    offsets: Any
    shapes: Any


RaggedArrays.__module__ = "datasetrt.api"


def payload_dtype(dtype: str) -> np.dtype:
    """The stored (little-endian) numpy dtype of a spec's dtype name."""
    return np.dtype(dtype).newbyteorder("<")


def dense(data: np.ndarray, n: int, dtype: str, shape: tuple) -> np.ndarray:
    """`[n, *shape]` view of n dense records (the caller's batch checked every length)."""
    return data.view(payload_dtype(dtype)).reshape(n, *shape)


def step_sizes(dtype: str, shape: tuple, axis: int) -> tuple[int, int, int]:
    """(elements per step along ragged dim `axis`, outer blocks before it, bytes per step within
    a block) of spec (dtype, shape)."""
    itemsize = payload_dtype(dtype).itemsize
    inner = int(np.prod(list(shape[axis + 1 :]), dtype=np.int64))
    outer = int(np.prod(list(shape[:axis]), dtype=np.int64))
    return outer * inner, outer, inner * itemsize


def ragged(data: np.ndarray, offsets: np.ndarray, n: int, dtype: str, shape: tuple) -> RaggedArrays:
    """`RaggedArrays` view of n ragged records (offsets in bytes -> in steps along the ragged dim)."""
    axis = shape.index(None)
    per_step, _outer, _inner_bytes = step_sizes(dtype, shape, axis)
    step_bytes = per_step * payload_dtype(dtype).itemsize
    values = data.view(payload_dtype(dtype))
    if axis == 0:
        values = values.reshape(-1, *shape[1:])
    cu = offsets // step_bytes
    shapes = np.empty((n, len(shape)), dtype=np.int64)
    shapes[:] = [0 if d is None else d for d in shape]
    np.subtract(cu[1:], cu[:-1], out=shapes[:, axis])
    return RaggedArrays(values, cu, shapes)


def projected(
    data: np.ndarray, offsets: np.ndarray, n: int, dtype: str, shape: tuple, length: Any, pad: Any
) -> np.ndarray:
    """`[n, *shape]` with the ragged dim set to `length`: each record truncated to `length` steps
    along it, or padded with `pad` (o41's rule). A view when every record already has `length`
    steps and the ragged dim is the first; else a new array. O(n x outer + bytes out)."""
    if type(length) is bool or not isinstance(length, (int, np.integer)):
        raise ArgumentTypeError(f"length must be an integer, got {type(length).__name__}")
    length = int(length)
    if length < 0:
        raise ConfigError(f"length must be >= 0, got {length}")
    if None not in shape:
        raise ConfigError(
            f"length= projects the ragged dim of a payload spec; {describe(dtype, shape)} is dense "
            "(use to_numpy() without length)"
        )
    axis = shape.index(None)
    stored = payload_dtype(dtype)
    item = pad_item(pad, dtype)
    per_step, outer, inner_bytes = step_sizes(dtype, shape, axis)
    out_shape = (n, *shape[:axis], length, *shape[axis + 1 :])
    step_bytes = per_step * stored.itemsize
    if axis == 0 and n and step_bytes and bool((np.diff(offsets) == length * step_bytes).all()):
        return data.view(stored).reshape(out_shape)
    out = np.empty(out_shape, dtype=stored)
    if out.size:
        project_rows(
            data,
            offsets,
            n,
            outer,
            inner_bytes,
            length * inner_bytes,
            item.view(np.uint8),
            out.reshape(-1).view(np.uint8),
        )
    return out


def pad_item(pad: Any, dtype: str) -> np.ndarray:
    """`pad` as one stored item of `dtype` (a 1-element array); ConfigError when it is not one."""
    try:
        item = np.array(pad, dtype=payload_dtype(dtype))
    except (OverflowError, ValueError, TypeError) as exc:
        raise ConfigError(f"pad={pad!r} is not a {dtype} value: {exc}") from None
    if item.ndim != 0:
        raise ConfigError(f"pad must be one {dtype} value, got an array of shape {item.shape}")
    return item.reshape(1)


def as_tensors(value: Any) -> Any:
    """A numpy array as a torch tensor over the same memory (`torch.from_numpy`, no copy), or
    `RaggedArrays` of them; torch is imported here, at the first call. A tensor keeps the array,
    and so the batch's buffer or ring slot, alive for as long as it lives."""
    from datasetrt.errors import MissingExtraError

    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError("SampleBatch.to_torch requires PyTorch: pip install 'datasetrt[torch]'") from exc
    if isinstance(value, RaggedArrays):
        return RaggedArrays(*(torch.from_numpy(v) for v in value))
    return torch.from_numpy(value)
