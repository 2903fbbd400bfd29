"""Frozen pydantic configuration models, field-compatible with dataset-rt 0.4.8.

Boundary: no I/O, no processes. Fields, defaults and constraints follow the reference (§1.2);
fields marked "datasetrt" are additions that dataset-rt does not have.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CompressionAlgo = Literal["none", "lz4", "zstd"]
SamplingMode = Literal["draws", "permutation"]

DEFAULT_MAX_SHARD_BYTES = 64 * 1024 * 1024
ZSTD_DEFAULT_LEVEL = 3


class ShardCompression(BaseModel):
    """Per-record payload compression policy of a cache.

    `algo="zstd"` and `level` are datasetrt additions (dataset-rt 0.4.8 cannot read zstd caches).
    `ratio` is advisory, as in dataset-rt: it is recorded in the manifest and never checked.
    Unknown keys are accepted and dropped, as dataset-rt's pydantic default does.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    algo: CompressionAlgo = "none"
    ratio: float = Field(default=1.0, gt=0)
    level: int = Field(default=ZSTD_DEFAULT_LEVEL, ge=-7, le=22)


class WriterProfilerConfig(BaseModel):
    """Where to write the writer's per-stage timing JSON when enabled."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = False
    path: Path = Path("dataset_rt_profile.json")


class WriterConfig(BaseModel):
    """How caches are written.

    `num_processes`, `process_timeout_seconds` are kept for compatibility; datasetrt compresses with
    the runtime's worker threads (`DatasetRuntime(num_workers=...)`) and ignores them.
    `record_checksums` (datasetrt): write the per-record XXH3-64 sidecar that makes reads verify
    every record by default.
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

    @model_validator(mode="after")
    def _permutation_shuffles(self) -> ReaderConfig:
        if self.sampling == "permutation" and not self.shuffle:
            raise ValueError("sampling='permutation' is a shuffled order: it needs shuffle=True "
                             "(shuffle=False reads the ordered window with sampling='draws')")
        return self


DEFAULT_SHARD_COMPRESSION = ShardCompression()
DEFAULT_WRITER_PROFILER_CONFIG = WriterProfilerConfig()
DEFAULT_WRITER_CONFIG = WriterConfig()

