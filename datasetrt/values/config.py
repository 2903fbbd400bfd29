"""Frozen pydantic configuration models, field-compatible with dataset-rt 0.4.8.

Boundary: no I/O, no processes. Fields, defaults and constraints follow the reference (§1.2);
fields marked "datasetrt" are additions that dataset-rt does not have, as is `PayloadSpec` (typed
payloads; numpy is imported only when a spec needs it).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from datasetrt.errors import CacheFormatError, ConfigError
from datasetrt.values.codecs import (
    CODEC_NAMES,
    CONFIG_LEVEL_DEFAULT,
    CONFIG_LEVEL_MAX,
    CONFIG_LEVEL_MIN,
    DICT_BYTES_DEFAULT,
    DICT_MAX_BYTES,
    DICT_MIN_BYTES,
)
from datasetrt.values.payloads import PAYLOAD_DTYPES, describe, dims_product, dtypes_listed, shape_problem
from datasetrt.values.payloads import manifest_form as _manifest_form

# The codec table's names ("none", "lz4", "zstd", "zstd_dict"); a Literal so pydantic reports `literal_error`.
CompressionAlgo = Literal[CODEC_NAMES]  # type: ignore[valid-type]
SamplingMode = Literal["draws", "permutation", "locality"]

DEFAULT_MAX_SHARD_BYTES = 64 * 1024 * 1024
ZSTD_DEFAULT_LEVEL = CONFIG_LEVEL_DEFAULT
_MISSING: Any = object()


class ShardCompression(BaseModel):
    """Per-record payload compression policy of a cache.

    `algo="zstd"`, `algo="zstd_dict"`, `level` and `dict_bytes` are datasetrt additions (dataset-rt
    0.4.8 can read neither zstd nor zstd_dict caches). Algorithms, the level default and bounds
    come from the codec table (datasetrt/values/codecs.py); codecs without levels ignore `level`.
    `dict_bytes` is the most bytes zstd_dict's trained dictionary may have (1 KiB..1 MiB, default
    32 KiB; other codecs ignore it); the writer trains it from the first records of each source
    (format/dictionary.py). `ratio` is advisory, as in dataset-rt: it is recorded in the manifest
    and never checked.
    Unknown keys are accepted and dropped, as dataset-rt's pydantic default does.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    algo: CompressionAlgo = "none"
    ratio: float = Field(default=1.0, gt=0)
    level: int = Field(default=CONFIG_LEVEL_DEFAULT, ge=CONFIG_LEVEL_MIN, le=CONFIG_LEVEL_MAX)
    dict_bytes: int = Field(default=DICT_BYTES_DEFAULT, ge=DICT_MIN_BYTES, le=DICT_MAX_BYTES)


class PayloadSpec(BaseModel):
    """The type of every payload of a cache (datasetrt): a numpy dtype and a shape.

    `dtype`: anything `numpy.dtype()` accepts, or a `torch.dtype`, among bool, int8..int64,
    uint8..uint64, float16/32/64 and complex64/128; stored as the numpy name ("int32"). Payload
    bytes are little-endian, C order. `shape`: ints >= 0 (dense dims) and at most one None, the
    ragged dim, whose length a record's byte length gives (its other dims must then be > 0);
    `()` is a scalar. Construct positionally or by keyword: `PayloadSpec("int32", (512,))`.
    A bad dtype or shape is a ConfigError naming it (a pydantic ValidationError when it arrives
    nested, e.g. `WriterConfig(payload_spec={...})`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: str
    shape: tuple[int | None, ...]

    def __init__(self, dtype: Any = _MISSING, shape: Any = _MISSING, **fields: Any) -> None:
        if dtype is not _MISSING:
            fields["dtype"] = dtype
        if shape is not _MISSING:
            fields["shape"] = shape
        super().__init__(**_canonical_spec(fields))

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, data: Any) -> Any:
        return _canonical_spec(data) if isinstance(data, dict) else data

    @property
    def dense(self) -> bool:
        """True when every record has exactly `shape` (no ragged dim)."""
        return None not in self.shape

    @property
    def ragged_axis(self) -> int | None:
        """Index of the ragged (None) dim, or None for a dense spec."""
        return self.shape.index(None) if None in self.shape else None

    @property
    def itemsize(self) -> int:
        return PAYLOAD_DTYPES[self.dtype]

    @property
    def record_bytes(self) -> int | None:
        """Bytes of every record of a dense spec; None when ragged."""
        return dims_product(self.shape) * self.itemsize if self.dense else None

    @property
    def unit_bytes(self) -> int | None:
        """Bytes per step along the ragged dim (a record's length is a multiple of it); None when dense."""
        axis = self.ragged_axis
        return None if axis is None else dims_product(self.shape, axis) * self.itemsize

    def fits(self, nbytes: int) -> bool:
        """True when a payload of `nbytes` bytes is a record of this spec."""
        unit = self.unit_bytes
        if unit is None:  # dense
            return nbytes == self.record_bytes
        return nbytes % unit == 0

    def expected_bytes(self) -> str:
        """What `fits` wants, in words: "2048 bytes" or "a multiple of 8 bytes"."""
        return f"{self.record_bytes} bytes" if self.dense else f"a multiple of {self.unit_bytes} bytes"

    def __str__(self) -> str:
        return describe(self.dtype, self.shape)

    def decode(self, buffer: Any) -> Any:
        """One payload as a numpy array of this spec: a zero-copy view of `buffer` (any
        buffer-protocol object, e.g. `CachedSample.data`), read-only when the buffer is. The
        ragged dim's length is the byte length over `unit_bytes`. CacheFormatError when the
        length does not fit. O(1)."""
        import numpy as np  # lazily: configs are built where numpy is not wanted

        with memoryview(buffer) as view:
            nbytes = view.nbytes
        if not self.fits(nbytes):
            raise CacheFormatError(
                f"payload of {nbytes} bytes does not fit payload spec {self}: expected {self.expected_bytes()}"
            )
        shape = self.shape
        axis, unit = self.ragged_axis, self.unit_bytes
        if axis is not None and unit is not None:  # ragged (a dense spec has neither)
            shape = (*shape[:axis], nbytes // unit, *shape[axis + 1 :])
        return np.frombuffer(buffer, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(shape)

    def manifest_form(self) -> dict[str, Any]:
        """The manifest's `datasetrt.payload_spec` value (docs/storage-format.md)."""
        return _manifest_form(self.dtype, self.shape)


def _canonical_spec(fields: dict) -> dict:
    """`fields` with `dtype` as its canonical numpy name and `shape` as a tuple, both checked;
    ConfigError naming the offending value otherwise. Missing keys are left to pydantic."""
    fields = dict(fields)
    if "dtype" in fields:
        fields["dtype"] = _canonical_dtype(fields["dtype"])
    if "shape" in fields:
        fields["shape"] = _canonical_shape(fields["shape"])
        if "dtype" in fields:
            problem = shape_problem(fields["dtype"], fields["shape"])
            if problem is not None:
                raise ConfigError(f"PayloadSpec shape {fields['shape']}: {problem}")
    return fields


def _canonical_dtype(value: Any) -> str:
    if type(value) is str and value in PAYLOAD_DTYPES:
        return value  # the canonical form (manifests, model_dump): no numpy needed
    supported = f"use one of {dtypes_listed()}"
    kind = type(value)
    if kind.__module__ == "torch" and kind.__name__ == "dtype":  # torch.int32 -> "int32", by name
        name = str(value).removeprefix("torch.")
        if name not in PAYLOAD_DTYPES:
            raise ConfigError(f"PayloadSpec dtype {value} has no numpy equivalent: {supported}")
        return name
    if value is None:
        raise ConfigError(f"PayloadSpec dtype must be given: {supported}")
    import numpy as np  # lazily: configs are built where numpy is not wanted

    try:
        dt = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"PayloadSpec dtype {value!r} is not a numpy dtype ({exc}): {supported}") from None
    if dt.fields is not None or dt.subdtype is not None or dt.name not in PAYLOAD_DTYPES:
        raise ConfigError(f"PayloadSpec dtype {value!r} ({dt}) is not supported: {supported}")
    return dt.name


def _canonical_shape(value: Any) -> tuple[int | None, ...]:
    if isinstance(value, (str, bytes)) or value is None:
        raise ConfigError(f"PayloadSpec shape must be a tuple of ints and at most one None, got {value!r}")
    try:
        dims = (operator.index(value),) if not isinstance(value, bool) and hasattr(value, "__index__") else tuple(value)
    except TypeError:
        raise ConfigError(f"PayloadSpec shape must be a tuple of ints and at most one None, got {value!r}") from None
    shape: list[int | None] = []
    for dim in dims:
        if dim is None:
            shape.append(None)
            continue
        try:
            if isinstance(dim, bool):
                raise TypeError
            shape.append(operator.index(dim))
        except TypeError:
            raise ConfigError(f"PayloadSpec shape {value!r}: dimension {dim!r} is not an integer or None") from None
    return tuple(shape)


class WriterProfilerConfig(BaseModel):
    """Where to write the writer's per-stage timing JSON when enabled."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = False
    path: Path = Path("dataset_rt_profile.json")


class StorageConfig(BaseModel):
    """Where caches at object-store URLs (`s3://`, `gs://`, `az://`) are reached and kept (datasetrt;
    docs/object-storage.md). Local paths ignore it.

    `options`: obstore's store and client options (S3: `endpoint`, `region`, `access_key_id`,
    `secret_access_key`, `session_token`, `allow_http`, ...), over the standard environment
    (`AWS_*`, `GOOGLE_*`, `AZURE_*`), which is read as obstore reads it. Values are held as
    secrets: never shown by `repr`, `str`, validation errors or any datasetrt message.
    `cache_dir`: the node-local cache every process on the node shares (default: the
    `DATASETRT_CACHE_DIR` environment variable, else `~/.cache/datasetrt`). `cache_limit_bytes`:
    the most bytes it may hold (default: none beyond the disk), part of the bound checked before a
    read starts. `fetch_concurrency`: downloads in flight ahead of a read. `prefetch_shards`: how
    many shards a read fetches ahead of the one it reads, in the order its plan first needs them
    (0: none; each shard is then fetched when a read reaches it). `retry_attempts` /
    `retry_budget_s`: how long one request keeps trying (attempts, and seconds after the first).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    options: tuple[tuple[str, SecretStr | bool | int | float], ...] = ()  # given as a mapping
    cache_dir: str | None = None
    cache_limit_bytes: int | None = Field(default=None, gt=0)
    fetch_concurrency: int = Field(default=4, ge=1, le=64)
    prefetch_shards: int = Field(default=16, ge=0, le=4096)
    retry_attempts: int = Field(default=10, ge=1)
    retry_budget_s: float = Field(default=120.0, gt=0)

    @field_validator("options", mode="before")
    @classmethod
    def _options_mapping(cls, value: Any) -> Any:
        """A mapping of option names to values, kept as sorted pairs (the model stays hashable)."""
        if isinstance(value, Mapping):
            for key in value:
                if not isinstance(key, str):
                    raise ValueError(f"storage option names must be strings, got {type(key).__name__}")
            return tuple(sorted(value.items()))
        return value

    def plain_options(self) -> dict[str, str | bool | int | float]:
        """The options with their values revealed, for building a store (never for display)."""
        return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in self.options}

    def resolved_cache_dir(self) -> str:
        """`cache_dir`, or its default (DATASETRT_CACHE_DIR, else ~/.cache/datasetrt), absolute."""
        import os

        chosen = self.cache_dir or os.environ.get("DATASETRT_CACHE_DIR") or os.path.join("~", ".cache", "datasetrt")
        return os.path.abspath(os.path.expanduser(chosen))

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield (name, {key: "***" for key, _ in value}) if name == "options" else (name, value)


DEFAULT_STORAGE_CONFIG = StorageConfig()


class WriterConfig(BaseModel):
    """How caches are written.

    `num_processes`, `process_timeout_seconds` are kept for compatibility; datasetrt compresses with
    the runtime's worker threads (`DatasetRuntime(num_workers=...)`) and ignores them.
    `record_checksums` (datasetrt): write the per-record XXH3-64 sidecar that makes reads verify
    every record by default.
    `payload_spec` (datasetrt): the type of every payload (`PayloadSpec`), recorded in the
    manifest; the writer then checks and converts each payload (docs/python-api.md).
    `storage` (datasetrt): how a base at an object-store URL is reached (`StorageConfig`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_processes: int = Field(default=0, ge=0)
    process_timeout_seconds: float = Field(default=3600.0, gt=0)
    prefetch_size: int = Field(default=64, gt=0)
    max_shard_bytes: int = Field(default=DEFAULT_MAX_SHARD_BYTES, gt=0)
    shard_compression: ShardCompression = ShardCompression()
    show_progress: bool = True
    validate_cache: bool = False
    profiler: WriterProfilerConfig = WriterProfilerConfig()
    record_checksums: bool = True
    payload_spec: PayloadSpec | None = None
    storage: StorageConfig = DEFAULT_STORAGE_CONFIG

    @field_validator("process_timeout_seconds")
    @classmethod
    def _finite_timeout(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("process_timeout_seconds must be finite")
        return value


class ReaderConfig(BaseModel):
    """How a dataset is read. `seed` is required (a u64; checked when the dataset is built).

    `verify_records` (datasetrt): check each record's XXH3-64 against the cache's checksum sidecar
    on every read (on by default; caches without a sidecar get structural checks only).
    `memory_limit_bytes` (datasetrt): the bound the multiprocess reader must fit in before it
    starts (default None = half of physical memory or the cgroup limit, whichever is lower).
    `worker_timeout_s` (datasetrt): how long the parent waits without any worker progress.
    `sampling` (datasetrt): "draws" (default) is dataset-rt 0.4.8's order, bit for bit: with
    shuffle=True, seeded draws with replacement; with shuffle=False, the ordered cyclic window.
    "permutation" is exactly-once epochs (each active row once per epoch, integer weights as repeat
    counts, a different seeded order every epoch; docs/sampling.md); it needs shuffle=True.
    "locality" is exactly-once epochs that visit the shards in a seeded order and permute the
    records of `window_shards` shards at a time, so a read needs only those shards at once
    (object storage, datasets larger than memory; docs/sampling.md); it needs shuffle=True.
    `storage` (datasetrt): how caches at object-store URLs are reached and kept on this node
    (`StorageConfig`).
    `allow_external_links` (datasetrt): read caches whose files (or shards/) are symbolic links
    out of the cache directory. Off by default: a cache is data, and a link out of it is refused
    at open, naming the file and its target (docs/security.md); links inside it are always fine.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int
    prefetch_size: int = Field(default=64, gt=0)
    shuffle: bool = True
    validate_cache: bool = False
    verify_records: bool = True
    memory_limit_bytes: int | None = Field(default=None, gt=0)
    worker_timeout_s: float = Field(default=300.0, gt=0)
    sampling: SamplingMode = "draws"
    window_shards: int = Field(default=8, ge=1)
    storage: StorageConfig = DEFAULT_STORAGE_CONFIG
    allow_external_links: bool = False

    @model_validator(mode="after")
    def _permutation_shuffles(self) -> ReaderConfig:
        if self.sampling != "draws" and not self.shuffle:
            raise ValueError(
                f"sampling={self.sampling!r} is a shuffled order: it needs shuffle=True "
                "(shuffle=False reads the ordered window with sampling='draws')"
            )
        return self


DEFAULT_SHARD_COMPRESSION = ShardCompression()
DEFAULT_WRITER_PROFILER_CONFIG = WriterProfilerConfig()
DEFAULT_WRITER_CONFIG = WriterConfig()
