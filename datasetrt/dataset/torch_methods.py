"""The torch conversions of `CachedDataset`: its `to_torch_*` methods, forwarding to
`datasetrt.integrations.torch` (imported when called, so the core never imports torch).

Boundary: signatures and forwarding only; the loaders, their checks and plans live in
`integrations/torch/`. The signatures repeat the adapters' (tests/interop/test_signatures.py
checks they stay equal), so help() and IDEs show the arguments without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasetrt.integrations.torch.batches import DatasetRTBatchLoader
    from datasetrt.integrations.torch.iterable import CachedIterableDataset
    from datasetrt.integrations.torch.loader import DatasetRTDataLoader
    from datasetrt.integrations.torch.mapped import CachedMapDataset
    from datasetrt.integrations.torch.packed import DatasetRTPackedLoader


class TorchConversions:
    """`CachedDataset`'s torch methods (a base class of it; `self` is the dataset)."""

    def to_torch_iterable_dataset(self) -> CachedIterableDataset:
        """A sized `torch.utils.data.IterableDataset` over this dataset (docs/pytorch.md)."""
        from datasetrt.integrations.torch import to_torch_iterable_dataset

        return to_torch_iterable_dataset(self)

    def to_torch_map_dataset(self, sample_transform_fn: Callable | None = None) -> CachedMapDataset:
        """A map-style `torch.utils.data.Dataset` over the active table's rows as they are now
        (`dataset[i]` is `self[i]` through `sample_transform_fn`; `len()` the row count), for a
        DataLoader with your own sampler or batch sampler; reads in the process that indexes it
        (each DataLoader worker, fork or spawn) and batches of indexes at once (`__getitems__`)
        (docs/pytorch.md)."""
        from datasetrt.integrations.torch import to_torch_map_dataset

        return to_torch_map_dataset(self, sample_transform_fn)

    def to_torch_dataloader(
        self,
        *,
        shuffle: bool = True,
        seed: int | str = "random",
        samples_per_epoch: int | None = None,
        worker_partition: str | None = None,
        work_dir: Any = None,
        batch_size: int = 1,
        num_workers: int | str = "auto",
        sample_transform_fn: Callable | None = None,
        collate_fn: Callable | None = None,
        drop_last: bool = False,
        pin_memory: bool = False,
        timeout: float = 0,
        native_num_workers: int | str = "auto",
        multiprocessing_context: Any = "spawn",
        worker_init_fn: Callable | None = None,
        prefetch_factor: int | str = "auto",
        persistent_workers: bool | str = "auto",
        verbose: bool = True,
        dataloader_kwargs: Mapping | None = None,
    ) -> DatasetRTDataLoader:
        """A `torch.utils.data.DataLoader` (a `DatasetRTDataLoader`) with dataset-rt 0.4.8's
        keyword-only arguments, defaults and checks: `batch_size` samples per batch from this
        dataset's plan (`shuffle`, `seed`: "random" or a u64; `samples_per_epoch`: samples per pass,
        default `len(self)`), read by `num_workers` torch workers ("auto": from the CPUs) started
        with `multiprocessing_context` ("spawn"; "inherit", a start method or a context), each
        applying `sample_transform_fn` per sample; `collate_fn`, `drop_last`, `pin_memory`,
        `timeout`, `worker_init_fn`, `prefetch_factor`, `persistent_workers` and
        `dataloader_kwargs` go to torch; exact resume with `state_dict()` / `load_state_dict()`.
        `worker_partition`, `work_dir`, `native_num_workers` and `verbose` are dataset-rt's
        (docs/pytorch.md)."""
        from datasetrt.integrations.torch import to_torch_dataloader

        return to_torch_dataloader(
            self,
            shuffle=shuffle,
            seed=seed,
            samples_per_epoch=samples_per_epoch,
            worker_partition=worker_partition,
            work_dir=work_dir,
            batch_size=batch_size,
            num_workers=num_workers,
            sample_transform_fn=sample_transform_fn,
            collate_fn=collate_fn,
            drop_last=drop_last,
            pin_memory=pin_memory,
            timeout=timeout,
            native_num_workers=native_num_workers,
            multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            verbose=verbose,
            dataloader_kwargs=dataloader_kwargs,
        )

    def to_torch_batches(
        self,
        batch_size: int,
        *,
        shuffle: bool | None = None,
        seed: int | str = "random",
        samples_per_epoch: int | None = None,
        columns: Sequence[str] = (),
        length: int | None = None,
        pad: Any = 0,
        batch_transform: Callable | None = None,
        num_workers: int | str = "auto",
        drop_last: bool = False,
        pin_memory: bool = False,
        timeout: float = 0,
        multiprocessing_context: Any = "spawn",
        worker_init_fn: Callable | None = None,
        prefetch_factor: int | str = "auto",
        persistent_workers: bool | str = "auto",
        work_dir: Any = None,
        pack: int | None = None,
        pack_mode: str = "split",
        overlong: str = "split",
    ) -> DatasetRTBatchLoader | DatasetRTPackedLoader:
        """A `torch.utils.data.DataLoader` of whole typed batches of `batch_size` samples (dicts of
        tensors: "payload", or "values"/"offsets"/"shapes" when ragged, "cache_id", "sample_id" and
        the metadata `columns`) whose workers gather each batch straight into shared-memory
        tensors. `length` / `pad` project a ragged payload to `length` steps; `batch_transform`
        runs on each batch in the worker; `shuffle` defaults to this dataset's
        `ReaderConfig.shuffle`; the other arguments are `to_torch_dataloader`'s, and the same
        arguments give the same samples in the same batches (docs/pytorch.md). `pack=row_len`:
        batches of `batch_size` packed rows of the dataset's window instead (`iter_packed`'s
        `pack_mode`, `overlong`, `pad`, `drop_last`; docs/packing.md)."""
        from datasetrt.integrations.torch import to_torch_batches

        return to_torch_batches(
            self,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            samples_per_epoch=samples_per_epoch,
            columns=columns,
            length=length,
            pad=pad,
            batch_transform=batch_transform,
            num_workers=num_workers,
            drop_last=drop_last,
            pin_memory=pin_memory,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            work_dir=work_dir,
            pack=pack,
            pack_mode=pack_mode,
            overlong=overlong,
        )
