"""Writer-side typed payloads: what a source yields -> the stored bytes of a `PayloadSpec`, checked.

Boundary: Python objects -> bytes; no files, no codecs, no tables. Reads torch tensors and other
producers through `__dlpack__` (numpy's `from_dlpack`), so it never imports torch.

Accepted per sample (docs/python-api.md, "Typed payloads"):
* typed producers — numpy arrays (and numpy scalars), `__dlpack__` producers (torch tensors,
  CuPy/JAX arrays on the CPU) and buffer-protocol objects with a typed format (`array.array("i")`,
  a memoryview cast to "f", ...): their dtype must be the spec's and their shape the spec's, the
  ragged dim free; any byte order and strides are accepted and stored little-endian, C order;
* untyped byte buffers — `bytes`, `bytearray`, memoryviews (or any buffer) of format B, b or c: taken
  as the stored bytes when their length fits the spec (`PayloadSpec.fits`).
Anything else, or a mismatch, is a SourceError naming the source, the sample index, what the spec
expects and what the sample is; the writer reports it as the source's CacheWriteError.
Cost: one copy of each payload (the same copy as untyped writes) plus O(ndim) checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from datasetrt.errors import SourceError
from datasetrt.values.config import PayloadSpec
from datasetrt.values.payloads import describe

UNTYPED_FORMATS = frozenset(("B", "b", "c"))


class TypedPayloads:
    """Converts one source's samples to stored bytes under `spec` (call with (data, index))."""

    def __init__(self, spec: PayloadSpec, source_name: str) -> None:
        self.spec = spec
        self.where = f"source {source_name!r} sample"
        self.stored_dtype = np.dtype(spec.dtype).newbyteorder("<")
        self.fixed = [(axis, dim) for axis, dim in enumerate(spec.shape) if dim is not None]

    def __call__(self, data: Any, index: int) -> bytes:
        if type(data) is bytes:
            return self._untyped(data, len(data), index)
        if isinstance(data, np.ndarray):
            return self._typed(data, index)
        if hasattr(type(data), "__dlpack__") and not isinstance(data, memoryview):
            try:
                arr = np.from_dlpack(data)
            except Exception as exc:
                raise self._refused(
                    index,
                    f"a {type(data).__name__!r} that cannot be read through __dlpack__ ({type(exc).__name__}: {exc})",
                ) from None
            return self._typed(arr, index)
        try:
            view = memoryview(data)
        except (TypeError, ValueError, BufferError):
            raise self._refused(
                index,
                f"a {type(data).__name__!r} object, which is not bytes-like, an array, "
                "a tensor or a __dlpack__ producer",
            ) from None
        if view.format in UNTYPED_FORMATS:
            with view:
                return self._untyped(view, view.nbytes, index)
        try:
            arr = np.asarray(view)
        except (TypeError, ValueError) as exc:
            raise self._refused(index, f"a buffer of format {view.format!r} ({exc})") from None
        return self._typed(arr, index)

    def _untyped(self, data: Any, nbytes: int, index: int) -> bytes:
        spec = self.spec
        if not spec.fits(nbytes):
            raise SourceError(
                f"{self.where} {index}: payload of {nbytes} bytes does not fit the payload spec "
                f"{spec}: expected {spec.expected_bytes()}"
            )
        return data if type(data) is bytes else bytes(data)

    def _typed(self, arr: np.ndarray, index: int) -> bytes:
        spec = self.spec
        ok = (
            arr.dtype.fields is None
            and arr.dtype.name == spec.dtype
            and arr.ndim == len(spec.shape)
            and all(arr.shape[axis] == dim for axis, dim in self.fixed)
        )
        if not ok:
            raise self._refused(index, describe(_dtype_name(arr.dtype), arr.shape))
        return arr.astype(self.stored_dtype, copy=False).tobytes()

    def _refused(self, index: int, actual: str) -> SourceError:
        return SourceError(
            f"{self.where} {index}: payload does not match the payload spec: expected {self.spec}, got {actual}"
        )


def _dtype_name(dtype: np.dtype) -> str:
    return dtype.name if dtype.fields is None else f"structured {dtype}"
