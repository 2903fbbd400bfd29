"""The public API, name for name with `dataset_rt.api` 0.4.8 (plus datasetrt's additions).

Boundary: re-exports only.
"""

from datasetrt.values.config import (
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
from datasetrt.values.arrays import RaggedArrays
from datasetrt.dataset.cached import CachedDataset
from datasetrt.dataset.runtime import DatasetRuntime
from datasetrt.sampling.curriculum import Curriculum, Stage
from datasetrt.sampling.mixture import Mixture, Stream
from datasetrt.dataset.runtime import (
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
)
from datasetrt.format.results import (
    AbsentManifestTarget,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
    Result,
)
from datasetrt.runtime.sample_batch import SampleBatch
from datasetrt.values.records import (
    BytesLike,
    CachedSample,
    CacheInput,
    CacheSource,
    Metadata,
    MetadataValue,
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
