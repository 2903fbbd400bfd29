"""`SampleBatch`: a batch of consecutive plan positions as one payload buffer, with typed views.

Boundary: the batch value and its views (numpy, torch and jax imported lazily, by the typed methods);
built by `runtime/batches.py` (`BatchMaker`) over a leased ring slot or a private buffer, never
by the consumer. No I/O.
"""

from __future__ import annotations

import operator
from typing import Any

from datasetrt.errors import ArgumentTypeError, SampleIndexError
from datasetrt.sampling.curriculum import StageInfo


class Deferred:
    """A value computed on first use, once (`SampleBatch.metadata`)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Any) -> None:
        self.compute = compute


class SampleBatch:
    """A batch of consecutive plan positions without a Python object per sample (datasetrt).

    `data` (uint8) holds the payloads back to back; payload i is data[offsets[i]:offsets[i+1]]
    (`offsets` int64, len n+1). `cache_id`/`sample_id` are uint64 arrays of length n.
    `metadata` is a pyarrow Table with the dataset table's rows for these samples (the table the
    window was planned from, so weights and extra columns come along), or None when not
    requested. It is built on first access — a consumer that never reads it never imports
    pyarrow or Polars — and always from the table as it was when the window was reserved.
    `payload_spec` is the caches' `PayloadSpec` (None: untyped), which `to_numpy` follows.
    `stage` is the curriculum `StageInfo` its samples come from (`CachedDataset.iter_batches` of
    a dataset reading a curriculum: its first sample's stage, the only one when batches are cut at
    the curriculum's batch size from a batch boundary), None otherwise.

    Ownership: with reader workers, `data` and `offsets` are views of the shared-memory ring slot
    the workers gathered the batch into, leased to this batch: the slot returns to the ring only
    when the batch and every array, view, memoryview or tensor made from it are gone (or after
    `release()` / the end of a `with batch:` block, once the views made from it are gone too).
    Otherwise they are the batch's own buffers. Either way nothing else writes them while they
    are reachable; `cache_id`, `sample_id` and `metadata` are always the batch's own.
    """

    __slots__ = ("_data", "_offsets", "cache_id", "sample_id", "_metadata", "payload_spec", "stage", "__weakref__")

    def __init__(
        self, data: Any, offsets: Any, cache_id: Any, sample_id: Any, metadata: Any = None, payload_spec: Any = None
    ) -> None:
        self._data = data
        self._offsets = offsets
        self.cache_id = cache_id
        self.sample_id = sample_id
        self._metadata = metadata
        self.payload_spec = payload_spec
        self.stage: StageInfo | None = None

    @property
    def data(self) -> Any:
        if self._data is None:
            raise _released()
        return self._data

    @property
    def offsets(self) -> Any:
        if self._offsets is None:
            raise _released()
        return self._offsets

    @property
    def metadata(self) -> Any:
        value = self._metadata
        if isinstance(value, Deferred):
            value = value.compute()
            self._metadata = value
        return value

    @property
    def released(self) -> bool:
        """True after `release()`."""
        return self._data is None

    def __len__(self) -> int:
        return len(self.cache_id)

    def payload(self, i: int) -> memoryview:
        """Zero-copy view of payload i; Python indexing: -1 is the last payload, and an index
        outside [-len, len) raises SampleIndexError (an IndexError) naming it and the length."""
        offsets = self.offsets
        k = batch_position(i, len(self.cache_id))
        return memoryview(self.data)[int(offsets[k]) : int(offsets[k + 1])]

    # -- typed access (datasetrt/values/arrays.py; numpy is imported on first use) ----------------------

    def to_numpy(self, length: int | None = None, pad: Any = 0) -> Any:
        """The payloads as arrays of `payload_spec` (an untyped cache reads as ragged uint8).

        Dense spec: one `[n, *shape]` array. Ragged: `RaggedArrays(values, offsets, shapes)`
        (offsets are int64 cu_seqlens along the ragged dim). Both are zero-copy views of `data`.
        `length=L` (ragged only): one `[n, *shape]` array with the ragged dim L, each record
        truncated to L or padded with `pad` (a new array; a view when every record already has L
        steps along a leading ragged dim). O(1) for views; O(n + bytes) for a projection.
        """
        from datasetrt.values import arrays

        dtype, shape = self._spec()
        data, offsets, n = self.data, self.offsets, len(self)
        if length is not None:
            return arrays.projected(data, offsets, n, dtype, shape, length, pad)
        if None not in shape:
            return arrays.dense(data, n, dtype, shape)
        return arrays.ragged(data, offsets, n, dtype, shape)

    def to_torch(self, length: int | None = None, pad: Any = 0) -> Any:
        """`to_numpy(length, pad)` as torch tensors sharing its memory (`torch.from_numpy`, no
        copy): a tensor, or `RaggedArrays` of tensors. The tensors keep the batch's memory (its
        ring slot) alive like any view."""
        from datasetrt.values.arrays import as_tensors

        return as_tensors(self.to_numpy(length, pad))

    def to_jax(self, length: int | None = None, pad: Any = 0) -> Any:
        """`to_numpy(length, pad)` as `jax.Array`s on JAX's CPU device, through DLPack: an array,
        or `RaggedArrays` of arrays. Zero-copy when the numpy array is writable and starts
        64-byte aligned (reader workers' ring slots always are; a private or projected buffer
        may not be, and then JAX copies it); a zero-copy array keeps the batch's memory (its
        ring slot) alive like any view. 64-bit payload dtypes need `jax_enable_x64` (else
        ConfigError: JAX would narrow them). MissingExtraError when jax is not installed."""
        from datasetrt.values.arrays import as_jax

        return as_jax(self.to_numpy(length, pad))

    def __dlpack__(self, **kwargs: Any) -> Any:
        """DLPack capsule of the dense `[n, *shape]` array (CPU; zero-copy), for `torch.from_dlpack`,
        `jax.dlpack`, `cupy.from_dlpack`, `np.from_dlpack`. Ragged batches have no single array:
        use `to_numpy()` (values/offsets/shapes) or `to_numpy(length=L)`."""
        return self._dense("__dlpack__").__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dense("__dlpack_device__").__dlpack_device__()

    def columns(self, names: Any) -> dict:
        """Metadata columns of these samples as numpy arrays, by name (zero-copy from Arrow for
        numeric and boolean columns without nulls in one chunk; strings are object arrays).
        Needs the batch's metadata (`iter_batches(..., with_metadata=True)`, the default)."""
        from datasetrt.errors import ArgumentTypeError, ConfigError

        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ArgumentTypeError("columns() takes a list of column names")
        table = self.metadata
        if table is None:
            raise ConfigError("this batch has no metadata (iter_batches(..., with_metadata=False))")
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise ConfigError(f"no metadata column {missing[0]!r}; the columns are {table.column_names}")
        return {n: table.column(n).to_numpy() for n in names}

    # -- lifetime --------------------------------------------------------------------------------

    def release(self) -> None:
        """Drop this batch's references to its payload memory (idempotent). A ring slot returns
        to the reader once nothing else made from the batch (arrays, views, tensors) is alive
        either; using `data`, `offsets` or the typed methods afterwards raises BatchReleasedError."""
        self._data = None
        self._offsets = None

    def __enter__(self) -> SampleBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _spec(self) -> tuple[str, tuple]:
        spec = self.payload_spec
        return ("uint8", (None,)) if spec is None else (spec.dtype, spec.shape)

    def _dense(self, what: str) -> Any:
        dtype, shape = self._spec()
        if None in shape:
            from datasetrt.errors import ConfigError
            from datasetrt.values.payloads import describe

            raise ConfigError(
                f"{what}: a batch of ragged payloads ({describe(dtype, shape)}) has no single array; "
                "use to_numpy() (values, offsets, shapes) or to_numpy(length=L)"
            )
        return self.to_numpy()

    def __repr__(self) -> str:
        state = "released" if self.released else f"{len(self.data)} payload bytes"
        spec = "untyped" if self.payload_spec is None else str(self.payload_spec)
        return f"SampleBatch(n={len(self)}, {spec}, {state})"


def _released() -> Exception:
    from datasetrt.errors import BatchReleasedError

    return BatchReleasedError("this SampleBatch was released (release() or the end of its with block)")


def batch_position(i: Any, length: int) -> int:
    """The position in [0, length) that index `i` names, with Python's sequence semantics
    (negative counts from the end). Raises ArgumentTypeError for a non-integer (numpy integers are
    integers) and SampleIndexError naming `i` and `length` when out of range. O(1)."""
    try:
        k = operator.index(i)
    except TypeError:
        raise ArgumentTypeError(f"batch indices must be integers, not {type(i).__name__}") from None
    if not -length <= k < length:
        raise SampleIndexError(f"batch index {k} is out of range for a batch of {length} samples")
    return k + length if k < 0 else k


SampleBatch.__module__ = "datasetrt.api"
