"""The public API, name for name with `dataset_rt.api` 0.4.8 (plus datasetrt's additions).

Boundary: re-exports only.
"""

from datasetrt.dataset.cached import CachedDataset
from datasetrt.dataset.runtime import (
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
    DatasetRuntime,
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
from datasetrt.sampling.curriculum import Curriculum, Stage
from datasetrt.sampling.mixture import Mixture, Stream
from datasetrt.values.arrays import RaggedArrays
from datasetrt.values.config import (
    DEFAULT_SHARD_COMPRESSION,
    DEFAULT_WRITER_CONFIG,
    DEFAULT_WRITER_PROFILER_CONFIG,
    CompressionAlgo,
    PayloadSpec,
    ReaderConfig,
    ShardCompression,
    StorageConfig,
    WriterConfig,
    WriterProfilerConfig,
)
from datasetrt.values.records import (
    BytesLike,
    CachedSample,
    CacheInput,
    CacheSource,
    Metadata,
    MetadataValue,
    SizedTorchIterableDataset,
)

for _cls in (
    ReaderConfig,
    WriterConfig,
    ShardCompression,
    StorageConfig,
    WriterProfilerConfig,
    PayloadSpec,
    CachedDataset,
    DatasetRuntime,
):
    _cls.__module__ = "datasetrt.api"
del _cls

__all__ = [
    "DEFAULT_SHARD_COMPRESSION",
    "DEFAULT_WRITER_CONFIG",
    "DEFAULT_WRITER_PROFILER_CONFIG",
    "AbsentManifestTarget",
    "BytesLike",
    "CacheInput",
    "CacheSource",
    "CacheSourcesDatasetError",
    "CacheSourcesDatasetResult",
    "CacheSourcesDatasetSuccess",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "CachedDataset",
    "CachedSample",
    "CompressionAlgo",
    "Curriculum",
    "DatasetRuntime",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Metadata",
    "MetadataValue",
    "Mixture",
    "Ok",
    "PayloadSpec",
    "RaggedArrays",
    "ReaderConfig",
    "Result",
    "SampleBatch",
    "ShardCompression",
    "SizedTorchIterableDataset",
    "Stage",
    "StorageConfig",
    "Stream",
    "WriterConfig",
    "WriterProfilerConfig",
]
