"""PyTorch integration: a sized `IterableDataset` over a `CachedDataset` and a `DataLoader` with
dataset-rt 0.4.8's arguments, real `num_workers` (fork and spawn), several ranks and exact resume.
Docs: docs/pytorch.md, docs/distributed.md.

Boundary: imported lazily by `CachedDataset.to_torch_*` (the core never imports torch). It
reaches the dataset only through the dataset's integration seam (docs/python-api.md,
"Integration seam": plan a window, read windows here, the cursor state, populations and cache
identity) and knows no planner, reader, runtime or byte layout. The multiprocess runtime is never
used inside torch workers: torch's workers are the processes.

Modules (names are exported here lazily, so importing the package, or `plan`, needs no torch):
- `plan`: torch-free — rank and worker shares (`rank_count`, `RankShare`, `_Layout`, `_Share`),
  the loader's pass layout (`_Spec`) and main-process pass progress;
- `snapshot`, `spawn`: torch-free — the population snapshot file and the recipe a spawned
  DataLoader worker reopens the dataset from (the reading side per process);
- `base`: what both torch datasets share; `iterable`: `CachedIterableDataset`;
  `loader_dataset`: the loader's plan and `LoaderDataset`;
- `options`: `to_torch_dataloader`'s checks and "auto" values; `loader`: `DatasetRTDataLoader`,
  `to_torch_dataloader`; `lifeline`: torch-free — `DieWithParent`, the loaders' `worker_init_fn`
  (their workers exit with the process that started them, then the user's function runs);
  `distributed`: `capture_replica`, rank 0's seed and plan shared;
- `batches`: `to_torch_batches`, the loader's plan read as whole typed batches (one dict of
  tensors per item) gathered in the workers straight into shared-memory tensors;
- `packed`: `to_torch_batches(rows, pack=row_len)`, the dataset's packed rows (`iter_packed`)
  through a DataLoader, with exact resume;
- `mapped`: `CachedMapDataset`, a map-style dataset over the active table for your own sampler.
"""

from __future__ import annotations

from typing import Any

# public name -> the submodule that defines it (plan's and the errors' need no torch)
_EXPORTS = {
    "to_torch_iterable_dataset": "iterable",
    "CachedIterableDataset": "iterable",
    "ITER_STATE_KIND": "iterable",
    "ITER_STATE_VERSION": "iterable",
    "to_torch_dataloader": "loader",
    "DatasetRTDataLoader": "loader",
    "STATE_KIND": "loader",
    "STATE_VERSION": "loader",
    "LoaderDataset": "loader_dataset",
    "capture_replica": "distributed",
    "Replica": "distributed",
    "available_cpus": "options",
    "LOGGER_NAME": "options",
    "MAX_SAMPLE_BUDGET": "options",
    "rank_count": "plan",
    "rank_share": "plan",
    "RankShare": "plan",
    "LoaderStateError": None,
    "to_torch_batches": "batches",
    "to_torch_map_dataset": "mapped",
    "CachedMapDataset": "mapped",
    "DatasetRTBatchLoader": "batches",
    "BatchLoaderDataset": "batches",
    "to_torch_packed": "packed",
    "DatasetRTPackedLoader": "packed",
}
_TORCH_FREE = {"plan", "options", None}
_DATASET_METHODS = {"to_torch_iterable_dataset", "to_torch_dataloader", "to_torch_batches", "to_torch_map_dataset"}
INSTALL_TORCH = "pip install 'datasetrt[torch]'"


def missing_torch(feature: str) -> str:
    """The message of a torch feature used without torch: "<feature> requires PyTorch to be
    installed: pip install 'datasetrt[torch]'" (dataset-rt's wording, naming the feature asked for)."""
    return f"{feature} requires PyTorch to be installed: {INSTALL_TORCH}"


__all__ = sorted(_EXPORTS)


def require_torch(feature: str = "datasetrt.integrations.torch") -> None:
    """Raise `MissingExtraError(missing_torch(feature))` (an ImportError) when torch.utils.data
    cannot be imported."""
    try:
        import torch.utils.data  # noqa: F401
    except ImportError as exc:
        from datasetrt.errors import MissingExtraError

        raise MissingExtraError(missing_torch(feature)) from exc


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _EXPORTS[name]
    if module not in _TORCH_FREE:
        require_torch(f"CachedDataset.{name}" if name in _DATASET_METHODS else f"{__name__}.{name}")
    if module is None:
        from datasetrt.errors import LoaderStateError

        return LoaderStateError
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
