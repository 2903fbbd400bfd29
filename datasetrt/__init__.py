"""datasetrt: a dataset cache and loader for ML training, drop-in for dataset-rt 0.4.8.

`import datasetrt as drt` exposes the same 23 public names as `dataset_rt`, plus datasetrt's
`PayloadSpec` and `RaggedArrays` (typed payloads) and the sampling configurations `Mixture`, `Stream`, `Stage`,
`Curriculum`; `datasetrt.errors` holds the exception tree. The public names load lazily (PEP 562), so a reader worker process that
imports `datasetrt.runtime.worker` never imports Polars through this package's __init__.

Docstrings name documentation pages as `docs/NAME.md`; the installed package carries them:
`datasetrt docs docs/NAME.md` (or `python -m datasetrt docs NAME`) prints one, `--path` prints
where it is, and `datasetrt docs` lists them.
"""

from datasetrt import errors

__version__ = "0.2.0"  # the one place the version is written (pyproject reads it)

__all__ = [
    "AbsentManifestTarget",
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
    "Curriculum",
    "DatasetRuntime",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Mixture",
    "Ok",
    "PayloadSpec",
    "RaggedArrays",
    "ReaderConfig",
    "Result",
    "ShardCompression",
    "SizedTorchIterableDataset",
    "Stage",
    "StorageConfig",
    "Stream",
    "WriterConfig",
    "WriterProfilerConfig",
    "errors",
]


def __getattr__(name: str):
    if name in __all__:
        from datasetrt import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'datasetrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
