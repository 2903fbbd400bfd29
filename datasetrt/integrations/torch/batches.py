"""`CachedDataset.to_torch_batches`: a torch DataLoader whose items are whole typed batches (a
dict of tensors each), read by its workers straight into shared-memory tensors.

Boundary: torch's `DataLoader` and shared storages. The plan, rank layout, worker shares, spawn
recipes and resume are the loader's (loader.py, loader_dataset.py, plan.py, spawn.py: the same
arguments give the same plan as `to_torch_dataloader`, so the same samples in the same batches);
the dataset is reached only through its integration seam (`read_window_batches`,
`sample_columns`); the typed views are `SampleBatch.to_numpy`'s. No byte layout is known here.

One item per batch: torch runs with `batch_size=None` (no collate). DataLoader worker w of K
reads the rank's batches w, w+K, ... (`_Share`); torch takes workers round-robin, so the batches
come out in plan order for any K. Each batch is gathered in the worker, in its final layout, into
a slot of the worker's ring of shared storage (`LendingBuffers`, lending.py: the ring reaches the
main process once per pass, each batch as slot numbers and views, rebuilt there by `Receiver`),
or into a fresh `torch.UntypedStorage._new_shared` storage when no slot is free or the batch
outgrows one (`SharedBuffers`: torch's transfer passes its file descriptor, not the bytes). A
`length=` projection is a new array, copied into such a buffer once. The ids, offsets, shapes and
number columns go into the same buffer's tail: one storage per batch.
Without DataLoader workers the main process reads through the dataset as `iter_batches` does (its
runtime's reader processes and leased ring slots, when it has them); the tensors are then views
of the leased slot, which returns to the ring when they are gone.

An item: "payload" (dense spec, or ragged with `length`: `[n, *shape]` of the spec's dtype) or
"values" / "offsets" / "shapes" (ragged, `RaggedArrays`' meaning; untyped caches read as ragged
uint8), "cache_id" and "sample_id" (uint64 `[n]`), and each requested metadata column of the
caches' own tables (a tensor for numbers and booleans, else a list). `batch_transform(item)`
runs on each item where it is read (in the worker).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data._utils.pin_memory import pin_memory

from datasetrt.errors import ArgumentTypeError, ConfigError
from datasetrt.integrations.torch.lending import MAX_SLOT_BYTES, Receiver, WorkerRing
from datasetrt.integrations.torch.lifeline import DieWithParent
from datasetrt.integrations.torch.loader import DatasetRTDataLoader, _LoaderIterator, _plan_loader
from datasetrt.integrations.torch.loader_dataset import LoaderDataset, _LoaderPlan
from datasetrt.integrations.torch.options import check_arguments, is_auto
from datasetrt.integrations.torch.plan import _Spec
from datasetrt.integrations.torch.spawn import _Recipe
from datasetrt.values.arrays import RaggedArrays, pad_item

if TYPE_CHECKING:
    from datasetrt.dataset.seam import DatasetSeam
    from datasetrt.integrations.torch.packed import DatasetRTPackedLoader


@dataclass(frozen=True)
class _Typed:
    """How a batch becomes an item: `length` / `pad` (project the ragged dim; None: no
    projection) and the metadata `columns` to add. Small and picklable (spawn ships it)."""

    length: int | None
    pad: Any
    columns: tuple[str, ...]


class SharedBuffers:
    """Batch buffers in torch shared memory, for `read_window_batches(..., buffers=)`: `take(n)`
    returns a uint8 numpy view of a fresh shared storage of n bytes (never recycled: the storage
    travels to the main process), followed by a private tail of `tail_bytes` for the batch's small
    arrays. `tensor(array)` gives an array inside one of the last buffers handed out as a tensor
    view of that storage (else `torch.from_numpy`); `small(array)` copies a small array into the
    tail of the buffer holding `payload` and returns a view of it there (else `torch.from_numpy`).

    Why one storage per batch: torch's worker->main transfer sends each distinct storage's file
    descriptor over its own `resource_sharer` connection (and first copies a storage that is not
    shared into a new shared one); tensors that are views of one storage pickle it once. Payload,
    ids, offsets and number columns in one storage: one transfer per batch instead of 3 to 5."""

    KEEP = 2  # a batch may take a second, larger buffer when its first one was too small
    ALIGN = 64  # every array in a storage starts at a multiple of this many bytes

    def __init__(self, tail_bytes: int = 0) -> None:
        self.tail_bytes = tail_bytes
        # (uint8 tensor over the whole storage, address, payload bytes, next free tail byte)
        self._handed: list[list] = []

    @classmethod
    def _aligned(cls, nbytes: int) -> int:
        return -(-nbytes // cls.ALIGN) * cls.ALIGN

    def take(self, nbytes: int) -> np.ndarray:
        storage = torch.UntypedStorage._new_shared(max(self._aligned(nbytes) + self.tail_bytes, 1))
        return self._hand(torch.empty(0, dtype=torch.uint8).set_(storage), nbytes)

    def _hand(self, buffer: torch.Tensor, nbytes: int) -> np.ndarray:
        """Record `buffer` (uint8, payload then tail) as handed out; its first `nbytes` as numpy."""
        self._handed = [[buffer, buffer.data_ptr(), nbytes, self._aligned(nbytes)], *self._handed][: self.KEEP]
        return buffer[:nbytes].numpy()

    def _holding(self, array: np.ndarray) -> list | None:
        address, nbytes = array.__array_interface__["data"][0], array.nbytes
        if array.flags.c_contiguous:
            for handed in self._handed:
                _, base, size, _ = handed
                if base <= address and address + nbytes <= base + size:
                    return handed
        return None

    @staticmethod
    def _view(whole: torch.Tensor, start: int, array: np.ndarray) -> torch.Tensor:
        return whole[start : start + array.nbytes].view(_torch_dtype(array.dtype)).reshape(array.shape)

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        """`array` (C-contiguous) as a tensor over the same memory: a view of the shared storage
        holding it, or `torch.from_numpy` for memory of its own."""
        handed = self._holding(array)
        if handed is None:
            return torch.from_numpy(array)
        return self._view(handed[0], array.__array_interface__["data"][0] - handed[1], array)

    def copy_in(self, array: np.ndarray) -> np.ndarray:
        """A copy of `array` in a fresh buffer of this object (its tail free for `small`)."""
        out = self.take(array.nbytes).view(array.dtype).reshape(array.shape)
        out[...] = array
        return out

    def small(self, array: np.ndarray, payload: np.ndarray) -> torch.Tensor:
        """A copy of `array` (numbers, any layout) in the tail of the storage holding `payload`,
        as a tensor view of it; `torch.from_numpy(array)` when `payload` is not in one of the
        last buffers or the tail is full."""
        handed = self._holding(payload)
        if handed is not None:
            whole, start = handed[0], handed[3]
            end = start + array.nbytes
            if end <= len(whole):
                view = self._view(whole, start, array)
                view.numpy()[...] = array
                handed[3] = self._aligned(end)
                return view
        return _own(array)


class LendingBuffers(SharedBuffers):
    """A DataLoader worker's `SharedBuffers` whose batches go into the slots of its `WorkerRing`
    (lending.py: the ring's storage reaches the main process once, each batch as slot numbers
    and views) while a slot is free and a batch fits one, else into a fresh storage each."""

    def __init__(self, tail_bytes: int = 0) -> None:
        super().__init__(tail_bytes)
        self._ring: WorkerRing | None = None
        self._no_ring = False

    def take(self, nbytes: int) -> np.ndarray:
        need = self._aligned(nbytes) + self.tail_bytes
        if self._ring is None and not self._no_ring:  # sized by the first batch, a full one
            self._no_ring = need > MAX_SLOT_BYTES
            self._ring = None if self._no_ring else WorkerRing(need)
        slot = None if self._ring is None else self._ring.take(need)
        return super().take(nbytes) if slot is None else self._hand(slot, nbytes)

    def lend(self, item: Any) -> Any:
        """`item` as it travels to the main process (`WorkerRing.lend`)."""
        return item if self._ring is None else self._ring.lend(item)


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """torch's dtype for a numpy dtype (as `torch.from_numpy` maps it), looked up once per dtype."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _own(array: np.ndarray) -> torch.Tensor:
    """`array` as a tensor over its own memory (a copy when read-only: zero-copy Arrow arrays
    are, and torch tensors are writable)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


class _OwnMemory:
    """The main process's `SharedBuffers` stand-in: tensors over the arrays' own memory (the
    batch's ring slot or private buffer), nothing copied, nothing sent."""

    tensor = staticmethod(_own)

    @staticmethod
    def small(array: np.ndarray, payload: np.ndarray) -> torch.Tensor:
        return _own(array)

    def copy_in(self, array: np.ndarray) -> np.ndarray:
        return array

    def lend(self, item: Any) -> Any:
        return item


def _item(
    batch: Any, ds: DatasetSeam, typed: _Typed, buffers: SharedBuffers | _OwnMemory, transform: Callable | None
) -> Any:
    """A `SampleBatch` as the loader's dict of tensors (views of its memory and of `buffers`),
    then released (the tensors keep what they need), then `transform`ed."""
    arrays = batch.to_numpy(typed.length, typed.pad)
    item: dict[str, Any] = {}
    if isinstance(arrays, RaggedArrays):
        payload = arrays.values
        item["values"] = buffers.tensor(payload)
        item["offsets"], item["shapes"] = buffers.small(arrays.offsets, payload), buffers.small(arrays.shapes, payload)
    else:
        # a `length=` projection is new memory: into a shared buffer now, so its tail takes the ids
        payload = buffers.copy_in(arrays) if typed.length is not None else arrays
        item["payload"] = buffers.tensor(payload)
    # .view: ids read out of a ring slot are numpy's ulonglong, which torch.from_numpy refuses
    item["cache_id"] = buffers.small(batch.cache_id.view(np.uint64), payload)
    item["sample_id"] = buffers.small(batch.sample_id.view(np.uint64), payload)
    if typed.columns:
        for name, values in ds.sample_columns(batch.cache_id, batch.sample_id, typed.columns).items():
            item[name] = values.tolist() if values.dtype.kind not in "biuf" else buffers.small(values, payload)
    batch.release()
    return item if transform is None else transform(item)


class BatchLoaderDataset(LoaderDataset):
    """`loader.dataset` of `to_torch_batches`: `LoaderDataset`'s plan, layout and passes, read as
    whole batches; `len()` is this rank's batches per pass."""

    def __init__(
        self,
        dataset: DatasetSeam,
        plan: _LoaderPlan,
        spec: _Spec,
        transform: Callable | None,
        worker_seeds: tuple[int, ...],
        work_dir: str | None,
        typed: _Typed,
    ) -> None:
        super().__init__(dataset, plan, spec, transform, worker_seeds, work_dir)
        self.typed = typed

    def __len__(self) -> int:
        return self._spec.layout().batches

    def __iter__(self) -> Iterator[Any]:
        where = self._pass_here()
        if where is None:
            return iter(())
        window, reader = where
        buffers: _OwnMemory | LendingBuffers
        if reader is None:  # main process: the dataset's own batch path (ring slots, if it has workers)
            ds, buffers = self._require_dataset(), _OwnMemory()
            batches = ds.read_window_batches(window, self._spec.batch, with_metadata=False)
        else:
            ds, buffers = reader.ds, LendingBuffers(self._tail_bytes(reader.ds))
            batches = reader.read_batches(window, self._spec.batch, buffers)
        # `map`: no frame here keeps an item once it is handed to torch
        made = map(
            functools.partial(_item, ds=ds, typed=self.typed, buffers=buffers, transform=self.sample_transform_fn),
            batches,
        )
        return map(buffers.lend, made)

    def _tail_bytes(self, ds: DatasetSeam) -> int:
        """Room after a batch's payload for its small arrays (`SharedBuffers`): ids, offsets and
        shapes of a ragged batch, number columns; 8 bytes per value at most, each array aligned."""
        spec = ds.payload_spec
        per_row = 2 + 1 + (1 if spec is None else len(spec.shape)) + len(self.typed.columns)
        return 8 * (self._spec.batch * per_row + 1) + SharedBuffers.ALIGN * (4 + len(self.typed.columns))

    def __reduce__(self) -> Any:
        _rebuild, args = super().__reduce__()
        return _rebuild_batch_dataset, (*args, self.typed)


def _rebuild_batch_dataset(
    recipe: _Recipe | None,
    spec: _Spec,
    transform: Callable | None,
    worker_seeds: tuple[int, ...],
    pass_: tuple[int, int, int],
    typed: _Typed,
) -> BatchLoaderDataset:
    obj = BatchLoaderDataset._rebuilt(recipe)
    obj._init_passes(None, spec, transform, worker_seeds, pass_)
    obj.typed = typed
    return obj


class DatasetRTBatchLoader(DatasetRTDataLoader):
    """`to_torch_batches`' DataLoader: `DatasetRTDataLoader` (passes, ranks, `state_dict` /
    `load_state_dict`) whose items are whole batches. One item is one batch of the same plan, so
    its states are `to_torch_dataloader`'s: either loader resumes the other's state when built
    with the same arguments."""

    def _identity(self) -> dict:
        # torch's own drop_last is False here (batch_size=None); the plan's is the loader's
        return {**super()._identity(), "drop_last": self._plan.drop_last}

    # as DatasetRTDataLoader's: torch types `__iter__` as its `_BaseDataLoaderIter`, which ours wraps
    def __iter__(self) -> _LoaderIterator:  # type: ignore[override]
        tracked = super().__iter__()
        if self.num_workers > 0:  # items lent from the workers' rings become tensors here
            receiver: Receiver | None
            if not self.persistent_workers:  # one per pass: its workers and their rings end with it
                receiver = Receiver(self.num_workers)
            elif (receiver := getattr(self, "_receiver", None)) is None:  # one for the workers' life
                receiver = self._receiver = Receiver(self.num_workers)
            if getattr(tracked._it, "_pin_memory", False):  # torch's pin thread passed them through
                device = tracked._it._pin_memory_device
                tracked.deliver = lambda item: pin_memory(receiver.receive(item), device)
            else:
                tracked.deliver = receiver.receive
        return tracked


def _reader_workers_suffice(
    dataset: DatasetSeam,
    num_workers: Any,
    batch_transform: Callable | None,
    timeout: float,
    prefetch_factor: Any,
    persistent_workers: Any,
) -> bool:
    """`num_workers="auto"` means no torch worker when the dataset's reader processes already
    gather each batch into shared memory (the tensors are views of their ring slot: 2.2-3.4x the
    torch-worker path in docs/benchmarks.md's runs) and nothing asks for torch workers: no
    `batch_transform` to run in them and no worker-only option (`timeout`, `prefetch_factor`,
    `persistent_workers`) set."""
    return (
        is_auto(num_workers)
        and batch_transform is None
        and dataset.reads_with_workers
        and timeout == 0
        and is_auto(prefetch_factor)
        and is_auto(persistent_workers)
    )


def to_torch_batches(
    dataset: DatasetSeam,
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
    """`CachedDataset.to_torch_batches(batch_size, ...)` (docs/pytorch.md). `shuffle` defaults to
    the dataset's `ReaderConfig.shuffle`; `seed`, `samples_per_epoch`, `num_workers`,
    `drop_last`, `pin_memory`, `timeout`, `multiprocessing_context`, `worker_init_fn`,
    `prefetch_factor`, `persistent_workers` and `work_dir` as in `to_torch_dataloader` (the
    same plan for the same arguments: the same samples in the same batches, on every rank).
    `num_workers="auto"` is 0 (the main process reads through the dataset's reader processes)
    when the dataset has them and no `batch_transform`, `timeout`, `prefetch_factor` or
    `persistent_workers` is given, else `to_torch_dataloader`'s "auto".
    `columns`: metadata columns of the caches' tables to add; `length` / `pad`: project a ragged
    spec's ragged dim to `length` (truncate / pad); `batch_transform(item) -> Any` runs on each
    item in the worker (picklable for spawn). With an initialised process group of world_size >
    1 this is a collective call, as `to_torch_dataloader`. `pack=row_len`: batches of `batch_size`
    packed rows of the dataset's window instead (`iter_packed`'s `pack_mode`, `overlong`, `pad`,
    `drop_last`; docs/packing.md); arguments that choose another order are a ConfigError."""
    if pack is not None:
        unsupported = {
            "shuffle": shuffle is not None,
            "seed": seed != "random",
            "samples_per_epoch": samples_per_epoch is not None,
            "columns": bool(columns),
            "length": length is not None,
            "batch_transform": batch_transform is not None,
            "persistent_workers": persistent_workers not in ("auto", False),
            "work_dir": work_dir is not None,
        }
        given = [name for name, set_ in unsupported.items() if set_]
        if given:
            raise ConfigError(f"to_torch_batches(pack=...) reads the dataset's own order: {given[0]}= does not apply")
        from datasetrt.integrations.torch.packed import to_torch_packed

        return to_torch_packed(
            dataset,
            batch_size,
            pack,
            mode=pack_mode,
            overlong=overlong,
            pad=pad,
            drop_last=drop_last,
            num_workers=0 if num_workers == "auto" else num_workers,  # type: ignore[arg-type]
            multiprocessing_context="fork"
            if multiprocessing_context == "spawn" and num_workers == "auto"
            else multiprocessing_context,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            prefetch_factor=None if prefetch_factor == "auto" else prefetch_factor,  # type: ignore[arg-type]
        )
    if shuffle is None:
        shuffle = dataset.reader_config.shuffle
    if _reader_workers_suffice(dataset, num_workers, batch_transform, timeout, prefetch_factor, persistent_workers):
        num_workers = 0
    check_arguments(
        shuffle=shuffle,
        seed=seed,
        samples_per_epoch=samples_per_epoch,
        worker_partition=None,
        batch_size=batch_size,
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=pin_memory,
        timeout=timeout,
        native_num_workers="auto",
        multiprocessing_context=multiprocessing_context,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        verbose=False,
        dataloader_kwargs=None,
    )
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise ArgumentTypeError("columns must be a list of metadata column names")
    spec = dataset.payload_spec
    if length is not None:
        if type(length) is not int or length < 0:
            raise ConfigError(f"length must be an integer >= 0 or None, got {length!r}")
        if spec is not None and spec.dense:
            raise ConfigError(f"length= projects the ragged dim of a payload spec; {spec} is dense")
        pad_item(pad, "uint8" if spec is None else spec.dtype)  # a bad pad fails here, not in a worker
    if columns:  # a missing column fails here, not in a worker
        empty = np.empty(0, dtype=np.uint64)
        dataset.sample_columns(empty, empty, list(columns))
    built = _plan_loader(
        dataset,
        "to_torch_batches",
        shuffle=shuffle,
        seed=seed,
        samples_per_epoch=samples_per_epoch,
        partition=None,
        batch_size=batch_size,
        drop_last=drop_last,
        work_dir=work_dir,
        worker_args={
            "num_workers": num_workers,
            "native_num_workers": "auto",
            "timeout": timeout,
            "persistent_workers": persistent_workers,
            "prefetch_factor": prefetch_factor,
            "multiprocessing_context": multiprocessing_context,
            "sample_transform_fn": batch_transform,
            "transform_name": "batch_transform",
        },
    )
    settings = built.settings
    adapter = BatchLoaderDataset(
        dataset,
        built.plan,
        built.spec,
        batch_transform,
        built.worker_seeds,
        built.work,
        _Typed(length, pad, tuple(columns)),
    )
    loader = DatasetRTBatchLoader(
        adapter,
        batch_size=None,
        num_workers=settings.processes,
        pin_memory=pin_memory,
        timeout=timeout,
        multiprocessing_context=settings.context,
        worker_init_fn=DieWithParent(worker_init_fn) if settings.processes > 0 else worker_init_fn,
        prefetch_factor=settings.prefetch,
        persistent_workers=settings.persistent,
    )
    loader._setup_resume(built.plan, built.explicit_seed, built.partition, built.share)
    return loader
