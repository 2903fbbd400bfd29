"""Typed payload rules: the dtypes a `PayloadSpec` may name, the shape rule and the byte sizes.

Boundary: pure Python (no numpy, no pydantic, no I/O), so the manifest parser, which reader
worker processes run, checks a cache's spec with the same rules as `config.PayloadSpec` without
importing either. Layer 1, beside `config.py`.

A spec is (dtype, shape): `dtype` a canonical numpy name of `PAYLOAD_DTYPES`, stored on disk
little-endian in C order; `shape` a tuple of ints >= 0 (dense dims) with at most one None (the
ragged dim, whose length each record's byte length gives). Its byte sizes must fit in a u63.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Canonical numpy name -> item size in bytes, in the order messages list them.
PAYLOAD_DTYPES: dict[str, int] = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
}
_U63_MAX = (1 << 63) - 1


def dtypes_listed() -> str:
    return ", ".join(PAYLOAD_DTYPES)


def dims_product(shape: tuple, skip: int | None = None) -> int:
    """Product of the dims of `shape` other than index `skip` (1 for none)."""
    product = 1
    for axis, dim in enumerate(shape):
        if axis != skip:
            product *= dim
    return product


def shape_problem(dtype: str, shape: tuple) -> str | None:
    """None when `shape` (a tuple of ints and Nones) is a valid spec shape for `dtype` (a key of
    PAYLOAD_DTYPES), else what is wrong with it, in words. O(ndim)."""
    ragged = [axis for axis, dim in enumerate(shape) if dim is None]
    if len(ragged) > 1:
        return f"at most one dimension may be None (ragged), got {len(ragged)}"
    for dim in shape:
        if dim is not None and (type(dim) is not int or dim < 0):
            return f"dimensions must be integers >= 0 or None, got {dim!r}"
    axis = ragged[0] if ragged else None
    unit = dims_product(shape, axis) * PAYLOAD_DTYPES[dtype]
    if axis is not None and unit == 0:
        return "a ragged spec's other dimensions must be > 0 (the ragged length is inferred from the byte length)"
    if unit > _U63_MAX:
        return f"a record of {unit} bytes is too large"
    return None


def describe(dtype: str, shape: tuple) -> str:
    """`int32[512]`, `int32[None, 2]`, `float32[]` (a scalar): a spec as messages show it."""
    return f"{dtype}[{', '.join('None' if d is None else str(d) for d in shape)}]"


def manifest_form(dtype: str, shape: tuple) -> dict[str, Any]:
    """The manifest's `datasetrt.payload_spec` value: {"dtype": "int32", "shape": [512]} (None as null)."""
    return {"dtype": dtype, "shape": list(shape)}


@dataclass(frozen=True, slots=True)
class PayloadCheck:
    """The length rule a batch gather checks every decoded payload against (plain data: it
    travels to reader workers inside the slot layout). `record_bytes >= 0`: exactly that many bytes
    (a dense spec); `unit_bytes > 1`: a multiple of it (ragged); -1 and 0: any length (an untyped
    cache, or a ragged spec whose unit is one byte). `label` names the spec in messages."""

    record_bytes: int = -1
    unit_bytes: int = 0
    label: str = "bytes"

    @classmethod
    def of(cls, dtype: str | None, shape: tuple | None) -> PayloadCheck:
        """The rule of spec (dtype, shape); no spec (None, None): any length. A dtype needs a
        shape (TypeError otherwise)."""
        if dtype is None:
            return cls()
        if shape is None:
            raise TypeError(f"PayloadCheck.of: dtype {dtype!r} without a shape")
        ragged = [axis for axis, dim in enumerate(shape) if dim is None]
        if not ragged:
            return cls(dims_product(shape) * PAYLOAD_DTYPES[dtype], 0, describe(dtype, shape))
        return cls(-1, dims_product(shape, ragged[0]) * PAYLOAD_DTYPES[dtype], describe(dtype, shape))
