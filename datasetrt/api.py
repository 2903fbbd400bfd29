"""The public API, name for name with `dataset_rt.api` 0.4.8 (plus datasetrt's additions).

Boundary: re-exports only.
"""

from datasetrt.config import (
    DEFAULT_SHARD_COMPRESSION,
    DEFAULT_WRITER_CONFIG,
    DEFAULT_WRITER_PROFILER_CONFIG,
    CompressionAlgo,
    PayloadSpec,
    ReaderConfig,
    ShardCompression,
    WriterConfig,
    WriterProfilerConfig,
)
from datasetrt.arrays import RaggedArrays
from datasetrt.dataset import CachedDataset
from datasetrt.dataset_runtime import DatasetRuntime
from datasetrt.sampling.curriculum import Curriculum, Stage
from datasetrt.sampling.mixture import Mixture, Stream
from datasetrt.records import (
    AbsentManifestTarget,
    BytesLike,
    CachedSample,
    CacheInput,
    CacheSource,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Metadata,
    MetadataValue,
    Ok,
    Result,
    SampleBatch,
    SizedTorchIterableDataset,
)

for _cls in (ReaderConfig, WriterConfig, ShardCompression, WriterProfilerConfig, PayloadSpec, CachedDataset,
             DatasetRuntime):
    _cls.__module__ = "datasetrt.api"
del _cls

__all__ = [
    "CacheInput", "CacheSource", "CacheSourcesDatasetError", "CacheSourcesDatasetResult",
    "CacheSourcesDatasetSuccess", "CacheWriteError", "CacheWriteResult", "CacheWriteSuccess",
    "CachedDataset", "CachedSample", "DatasetRuntime", "ReaderConfig", "ShardCompression",
    "SizedTorchIterableDataset", "WriterConfig", "WriterProfilerConfig", "AbsentManifestTarget", "Err",
    "ManifestUpdateEntry", "ManifestUpdateError", "ManifestUpdateReport", "Ok", "Result",
    "DEFAULT_SHARD_COMPRESSION", "DEFAULT_WRITER_CONFIG", "DEFAULT_WRITER_PROFILER_CONFIG",
    "CompressionAlgo", "BytesLike", "Metadata", "MetadataValue", "SampleBatch", "RaggedArrays", "PayloadSpec",
    "Mixture", "Stream", "Stage", "Curriculum",
]
