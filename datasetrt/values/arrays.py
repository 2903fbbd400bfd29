"""Typed views of a batch's payload bytes: the dense `[n, *shape]` array, ragged values with
cu_seqlens offsets and per-record shapes, and the fixed-length projection (`SampleBatch.to_numpy`).

Boundary: numpy and the projection kernel only; no files, tables or processes, torch only in
`as_tensors` and jax only in `as_jax`, each imported at its first call. Layer 1; `SampleBatch` (runtime/sample_batch.py) imports it lazily.

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

JAX_ALIGN = 64  # XLA's CPU client imports a DLPack buffer in place only when it starts 64-byte aligned


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
    out = aligned_empty(out_shape, stored)
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


def aligned_empty(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-order array whose data starts `JAX_ALIGN`-byte aligned (so DLPack
    consumers that need alignment, as XLA's CPU client does, import it in place)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + JAX_ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % JAX_ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


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


def as_jax(value: Any) -> Any:
    """A numpy array as a `jax.Array` on the CPU device, or `RaggedArrays` of them; jax is imported
    here, at the first call. The payload array goes through DLPack (`jax.dlpack.from_dlpack`): JAX
    imports it in place (zero-copy: the jax array keeps the numpy array, and so the batch's buffer
    or ring slot, alive) when it is writable and starts `JAX_ALIGN`-byte aligned, as ring slot
    payloads do; otherwise JAX copies it. `offsets` and `shapes` of a ragged batch are small new
    arrays, converted with `jnp.asarray` (JAX's default integer dtype). A 64-bit payload dtype
    needs `jax_enable_x64`: without it JAX would narrow the values (int64 -> int32, wrapping),
    so that is a ConfigError instead; the same for offsets past int32 range."""
    from datasetrt.errors import MissingExtraError

    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise MissingExtraError("SampleBatch.to_jax requires JAX: pip install 'datasetrt[jax]'") from exc
    x64 = bool(jax.config.read("jax_enable_x64"))
    if isinstance(value, RaggedArrays):
        values, offsets, shapes = value
        if not x64 and len(offsets) and int(offsets[-1]) > np.iinfo(np.int32).max:
            raise ConfigError(
                f"to_jax: ragged offsets up to {int(offsets[-1])} need 64-bit integers; "
                'enable them with jax.config.update("jax_enable_x64", True)'
            )
        return RaggedArrays(_jax_payload(values, x64, jax), jnp.asarray(offsets), jnp.asarray(shapes))
    return _jax_payload(value, x64, jax)


def _jax_payload(array: np.ndarray, x64: bool, jax: Any) -> Any:
    if array.dtype.itemsize == 8 and array.dtype.kind in "iuf" and not x64:
        raise ConfigError(
            f"to_jax: {array.dtype} payloads need 64-bit JAX types (without them JAX narrows the values "
            'to 32 bits); enable them with jax.config.update("jax_enable_x64", True)'
        )
    if not array.flags.writeable:  # numpy exports no read-only array through DLPack
        return jax.numpy.array(array)
    return jax.dlpack.from_dlpack(array)
