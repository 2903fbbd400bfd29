"""datasetrt: a dataset cache and loader for ML training, drop-in for dataset-rt 0.4.8.

`import datasetrt as drt` exposes the same 23 public names as `dataset_rt`; `datasetrt.errors`
holds the exception tree.
"""

from datasetrt import errors
from datasetrt.api import (
    AbsentManifestTarget,
    CachedDataset,
    CachedSample,
    CacheInput,
    CacheSource,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    DatasetRuntime,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
    ReaderConfig,
    Result,
    ShardCompression,
    SizedTorchIterableDataset,
    WriterConfig,
    WriterProfilerConfig,
)

__version__ = "0.1.0"

__all__ = [
    "CacheInput", "CacheSource", "CacheSourcesDatasetError", "CacheSourcesDatasetResult",
    "CacheSourcesDatasetSuccess", "CacheWriteError", "CacheWriteResult", "CacheWriteSuccess",
    "CachedDataset", "CachedSample", "DatasetRuntime", "ReaderConfig", "ShardCompression",
    "SizedTorchIterableDataset", "WriterConfig", "WriterProfilerConfig", "AbsentManifestTarget", "Err",
    "ManifestUpdateEntry", "ManifestUpdateError", "ManifestUpdateReport", "Ok", "Result", "errors",
]
