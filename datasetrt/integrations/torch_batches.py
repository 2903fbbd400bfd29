"""`CachedDataset.to_torch_batches`: a torch DataLoader whose workers produce whole typed batches,
gathered straight into shared-memory tensors.

Boundary: imported lazily by `CachedDataset.to_torch_batches`. It reuses the plan, rank layout,
worker shares, recipes and resume of `integrations/torch.py` (`_LoaderPlan`, `_Spec`, `_Share`,
`LoaderDataset`, `DatasetRTDataLoader`), and in the workers the batch gather of the runtime
(`Gatherer.gather_batch_into`) and the typed views of `datasetrt.arrays`; it knows no byte
layouts. (Built as a module of its own while the torch integration is being split into a
package; it moves into `integrations/torch/` with it.)

One item per batch: the DataLoader runs with `batch_size=None` (no collate). Worker w of K reads
the rank's batches w, w+K, ... of the plan (torch gathers workers round-robin, so the batches
come out in plan order for any K), each one gathered by the batch kernel into a
`torch.UntypedStorage._new_shared` storage in its final layout: the tensors the worker returns
are views of that storage, so torch passes a file descriptor to the main process, not the bytes.
A batch is a dict: "payload" (dense spec, or ragged with `length`: `[n, *shape]`) or
"values" / "offsets" / "shapes" (ragged; untyped caches read as ragged uint8), "cache_id" and
"sample_id" (uint64), and each requested metadata column (a tensor when numeric, else a list).
`batch_transform(dict)` runs in the worker on each batch. With `num_workers=0` the main process
reads through the dataset itself (its DatasetRuntime's reader processes and leased ring slots
when it has them). State, ranks and resume: exactly `to_torch_dataloader`'s (one delivered item
is one batch), docs/pytorch.md.
"""

from __future__ import annotations

import itertools
import secrets
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import get_context
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from datasetrt import arrays
from datasetrt._native.batch import project_rows
from datasetrt._native.draws import derive_seed
from datasetrt.errors import ArgumentTypeError, ConfigError, LoaderStateError
from datasetrt.integrations.torch import (
    DatasetRTDataLoader,
    LoaderDataset,
    _agree,
    _is_auto,
    _check_count,
    _LoaderPlan,
    _Share,
    _Snapshots,
    _Spec,
    _worker_identity,
    _next_pass,
    available_cpus,
    capture_replica,
    rank_count,
    rank_share,
)
from datasetrt.payloads import PayloadCheck
from datasetrt.runtime.local import BufferPool
from datasetrt.sampling.planner import Window, advance

if TYPE_CHECKING:
    from datasetrt.dataset import CachedDataset


class _Typed:
    """How a batch's payloads become tensors: the spec (dtype, shape; untyped = ragged uint8),
    its length rule, the projection (`length`, `pad`) and the metadata `columns`."""

    def __init__(self, spec: Any, length: int | None, pad: Any, columns: tuple[str, ...]) -> None:
        self.dtype, self.shape = ("uint8", (None,)) if spec is None else (spec.dtype, spec.shape)
        self.check = PayloadCheck() if spec is None else PayloadCheck.of(spec.dtype, spec.shape)
        self.length, self.pad, self.columns = length, pad, columns
        self.dense = None not in self.shape
        if length is not None and self.dense:
            raise ConfigError(f"length= projects the ragged dim of a payload spec; {spec} is dense")


def _shared_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of `nbytes` in a fresh shared-memory storage (torch sends its descriptor
    between processes instead of its bytes)."""
    storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    return torch.empty(0, dtype=torch.uint8).set_(storage)[:nbytes]


class _WorkerBatches:
    """Reads a torch worker's share of a pass as batch dicts (in this process)."""

    def __init__(self, ds: CachedDataset, typed: _Typed, transform: Callable | None) -> None:
        self.ds = ds
        self.reader = ds._reader()
        self.typed = typed
        self.transform = transform
        self.row_bytes = ds._max_record_bytes()
        self._buffers = BufferPool()
        self._table = None

    def share(self, share: _Share) -> Iterator[Any]:
        b = share.layout.batch
        for first in range(0, share.length, b):
            count = min(b, share.length - first)
            rows = share.rows(first, count)
            cache_pos, sample_id = share.population.resolve(rows)
            item = self.batch(np.ascontiguousarray(cache_pos, dtype=np.int64),
                              np.ascontiguousarray(sample_id, dtype=np.uint64))
            yield item if self.transform is None else self.transform(item)

    def batch(self, cache_pos: np.ndarray, sample_id: np.ndarray) -> dict:
        typed, n = self.typed, len(cache_pos)
        projected = typed.length is not None
        nbytes = n * typed.check.record_bytes if typed.dense else n * max(self.row_bytes, 1)
        no_json = np.empty(0, dtype=np.int64)
        offsets = np.empty(n + 1, dtype=np.int64)
        while True:
            # A projection is a copy anyway: gather into a recycled private buffer. Else straight
            # into shared memory, in the final layout.
            shared = None if projected else _shared_bytes(nbytes)
            out = self._buffers.take(nbytes) if projected else shared.numpy()
            done, used, _bottom, need = self.reader.gather_batch_into(cache_pos, sample_id, out, offsets, no_json,
                                                                      no_json, typed.check)
            if done == n:
                break
            nbytes = max(2 * nbytes, used + need * (n - done))
        item: dict[str, Any] = {}
        if projected:
            item["payload"] = self._projection(out[:used], offsets, n)
        elif typed.dense:
            item["payload"] = shared[:used].view(_torch_dtype(typed.dtype)).reshape(n, *typed.shape)
        else:
            values, cu, shapes = arrays.ragged(out[:used], offsets, n, typed.dtype, typed.shape)
            flat = shared[:used].view(_torch_dtype(typed.dtype))
            item["values"] = flat.reshape(values.shape)
            item["offsets"], item["shapes"] = torch.from_numpy(cu), torch.from_numpy(shapes)
        item["cache_id"] = torch.from_numpy(self.ds._catalog.cache_ids[cache_pos])
        item["sample_id"] = torch.from_numpy(sample_id)
        if typed.columns:
            item.update(self.columns(cache_pos, sample_id))
        return item

    def _projection(self, data: np.ndarray, offsets: np.ndarray, n: int) -> torch.Tensor:
        typed = self.typed
        shape = typed.shape
        axis = shape.index(None)
        out_shape = (n, *shape[:axis], typed.length, *shape[axis + 1:])
        dtype = arrays.payload_dtype(typed.dtype)
        out = _shared_bytes(int(np.prod(out_shape, dtype=np.int64)) * dtype.itemsize)
        if out.numel():
            _per_step, outer, inner_bytes = arrays.step_sizes(typed.dtype, shape, axis)
            project_rows(data, offsets, n, outer, inner_bytes, typed.length * inner_bytes,
                         arrays.pad_item(typed.pad, typed.dtype).view(np.uint8), out.numpy())
        return out.view(_torch_dtype(typed.dtype)).reshape(out_shape)

    def columns(self, cache_pos: np.ndarray, sample_id: np.ndarray) -> dict:
        """The requested columns of the caches' own metadata (metadata.arrow) for these rows:
        numbers as tensors, anything else as lists."""
        if self._table is None:
            self._table = self.ds._physical().to_arrow()
        rows = self.ds._catalog.offsets[cache_pos] + sample_id.astype(np.int64)
        part = self._table.take(rows)
        out = {}
        for name in self.typed.columns:
            values = part.column(name).to_numpy()
            out[name] = torch.from_numpy(values) if values.dtype.kind in "biuf" else values.tolist()
        return out


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _sample_batch(batch: Any, reading: _WorkerBatches) -> dict:
    """A main-process SampleBatch (a leased ring slot or a private buffer) as the same dict, zero-copy."""
    typed = reading.typed
    item: dict[str, Any] = {}
    if typed.length is not None or typed.dense:
        item["payload"] = batch.to_torch(typed.length, typed.pad)
    else:
        item["values"], item["offsets"], item["shapes"] = batch.to_torch()
    item["cache_id"], item["sample_id"] = torch.from_numpy(batch.cache_id), torch.from_numpy(batch.sample_id)
    if typed.columns:
        item.update(reading.columns(reading.ds._catalog.positions(batch.cache_id), batch.sample_id))
    batch.release()  # the tensors above keep what they need
    return item if reading.transform is None else reading.transform(item)


class BatchLoaderDataset(LoaderDataset):
    """`loader.dataset` of `to_torch_batches`: the same plan, layout and passes as
    `to_torch_dataloader`'s dataset, read as whole batches (one item per batch)."""

    def __init__(self, dataset: CachedDataset, plan: _LoaderPlan, spec: _Spec, transform: Callable | None,
                 worker_seeds: tuple[int, ...], work_dir: str | None, typed: _Typed) -> None:
        super().__init__(dataset, plan, spec, transform, worker_seeds, work_dir)
        self.typed = typed
        self._batches: _WorkerBatches | None = None

    def __len__(self) -> int:
        return self._spec.layout().batches

    def __iter__(self) -> Iterator[Any]:
        worker, workers, in_worker = _worker_identity()
        main = not in_worker and self._dataset is not None
        if main:
            epoch, rows = self._pass
            self._pass = (epoch + 1, 0)
        else:
            k = _next_pass(self)
            epoch, rows = self._pass
            epoch, rows = epoch + k, (rows if k == 0 else 0)
        spec = self._spec
        layout = spec.layout(rows)
        if layout.per_rank == 0:
            return iter(())
        reader = None if main else self._worker_reader()
        ds = self._dataset if main else reader.ds
        if self._batches is None or self._batches.ds is not ds:
            self._batches = _WorkerBatches(ds, self.typed, self.sample_transform_fn)
        if main and spec.world == 1:
            # The rest of the pass is one window: the dataset's own batch path (its runtime's
            # reader processes and leased ring slots, when it has them).
            batches = ds._window_batches(self._plan.window(epoch, rows), spec.batch, spec.drop_last, False)
            return map(_sample_batch, batches, itertools.repeat(self._batches))
        population = self._plan.freeze() if main else reader.population
        start = advance(spec.shuffle, 0, epoch * spec.stride, len(population))
        window = Window(population, spec.shuffle, spec.seed, start, spec.stride)
        return self._batches.share(_Share(window, 0 if main else worker, 1 if main else workers, layout=layout))

    def __reduce__(self) -> Any:
        recipe_fn, args = super().__reduce__()
        return _rebuild_batch_dataset, (args, self.typed)


def _rebuild_batch_dataset(args: tuple, typed: _Typed) -> BatchLoaderDataset:
    from datasetrt.integrations.torch import _rebuild_loader_dataset

    base = _rebuild_loader_dataset(*args)
    obj = BatchLoaderDataset.__new__(BatchLoaderDataset)
    obj.__dict__.update(base.__dict__)
    obj._snapshots = _Snapshots(obj)
    obj.typed, obj._batches = typed, None
    return obj


class DatasetRTBatchLoader(DatasetRTDataLoader):
    """`to_torch_batches`' DataLoader: `DatasetRTDataLoader` (passes, ranks, state_dict /
    load_state_dict) whose items are whole batches (`batch_size=None` to torch)."""

    def _identity(self) -> dict:
        return {**super()._identity(), "drop_last": self._plan.drop_last, "items": "batches"}


def to_torch_batches(
    dataset: CachedDataset, batch_size: int, *, shuffle: bool | None = None, seed: int | str = "random",
    samples_per_epoch: int | None = None, columns: Sequence[str] = (), length: int | None = None, pad: Any = 0,
    batch_transform: Callable | None = None, num_workers: int | str = "auto", drop_last: bool = False,
    pin_memory: bool = False, timeout: float = 0, multiprocessing_context: Any = "spawn",
    worker_init_fn: Callable | None = None, prefetch_factor: int | str = "auto",
    persistent_workers: bool | str = "auto", work_dir: Any = None,
) -> DatasetRTBatchLoader:
    """`CachedDataset.to_torch_batches(batch_size, ...)`. `shuffle` defaults to the dataset's
    `ReaderConfig.shuffle`; `seed`, `samples_per_epoch`, `num_workers`, `drop_last`,
    `pin_memory`, `timeout`, `multiprocessing_context`, `worker_init_fn`, `prefetch_factor`,
    `persistent_workers` and `work_dir` as in `to_torch_dataloader` (the same plan for the same
    arguments, so the same samples in the same batches). `columns`: metadata columns to add
    (from the caches' metadata.arrow); `length` / `pad`: project a ragged spec to `[n, ..., length,
    ...]` (o41's rule); `batch_transform(dict) -> Any` runs on each batch in the worker (must be
    picklable for spawn). With an initialised process group of world_size > 1 this is a
    collective call, as `to_torch_dataloader`."""
    if type(batch_size) is not int or not 1 <= batch_size <= sys.maxsize:
        raise ConfigError("batch_size must be a positive integer fitting sys.maxsize")
    if shuffle is None:
        shuffle = dataset.reader_config.shuffle
    for name, value in (("shuffle", shuffle), ("drop_last", drop_last), ("pin_memory", pin_memory)):
        if type(value) is not bool:
            raise ConfigError(f"{name} must be a boolean")
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise ArgumentTypeError("columns must be a list of metadata column names")
    if length is not None and (type(length) is not int or length < 0):
        raise ConfigError(f"length must be an integer >= 0 or None, got {length!r}")
    typed = _Typed(dataset.payload_spec, length, pad, tuple(columns))
    if length is not None:
        arrays.pad_item(pad, typed.dtype)  # refuse a pad value of another type now, not in a worker
    if columns:
        schema = set(dataset._physical().columns)
        missing = [c for c in columns if c not in schema]
        if missing:
            raise ConfigError(f"no metadata column {missing[0]!r}; the columns are {sorted(schema)}")
    explicit_seed = type(seed) is int
    if not explicit_seed and not (isinstance(seed, str) and seed == "random"):
        raise ConfigError("seed must be 'random' or an unsigned 64-bit integer")
    if explicit_seed and not (shuffle and 0 <= seed < 1 << 64):
        raise ConfigError("seed must be an unsigned 64-bit integer, and requires shuffle=True")
    _check_count(num_workers, "num_workers", 0, (1 << 32) - 1)
    _check_count(prefetch_factor, "prefetch_factor", 1, sys.maxsize)
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        raise LoaderStateError("to_torch_batches must run before DataLoader workers start")
    replica = capture_replica()
    rank, world = replica.rank, replica.world_size
    if shuffle and not explicit_seed and world > 1 and not replica.group:
        raise ConfigError(f"seed='random' with WORLD_SIZE={world} needs an initialised torch.distributed process "
                          "group to share rank 0's seed; pass an explicit seed (the same on every rank)")
    processes = min(4, max(0, available_cpus() // replica.local_world_size - 1)) if _is_auto(num_workers) else num_workers
    persistent = processes > 0 if _is_auto(persistent_workers) else bool(persistent_workers)
    prefetch = (2 if processes > 0 else None) if _is_auto(prefetch_factor) else prefetch_factor
    context = None
    if processes > 0:
        context = multiprocessing_context if not isinstance(multiprocessing_context, str) else get_context(
            None if multiprocessing_context == "inherit" else multiprocessing_context)
    budget = samples_per_epoch if samples_per_epoch is not None else len(dataset)
    if type(budget) is not int or budget < 1:
        raise ConfigError(f"samples_per_epoch must be a positive integer or None, got {samples_per_epoch!r}")
    share = rank_share(budget, world, batch_size, drop_last)
    count = rank_count(budget, 1, batch_size, drop_last)
    if rank == 0 and share.message is not None:
        warnings.warn(share.message, UserWarning, stacklevel=3)
    work = None
    if work_dir is not None:
        from pydantic import DirectoryPath, TypeAdapter

        work = str(TypeAdapter(DirectoryPath).validate_python(work_dir))
    partition = "replicate" if shuffle else "split"
    plan = _LoaderPlan(dataset, shuffle=shuffle, common_seed=None, partition=partition, budget=budget,
                       count=count, batch_size=batch_size, drop_last=drop_last)
    common = (seed if explicit_seed else secrets.randbits(64)) if shuffle else None
    if replica.group and world > 1:
        fingerprint = {"caches": plan.caches_digest(), "table": plan.table_digest(), "shuffle": shuffle,
                       "samples_per_epoch": budget, "batch_size": batch_size, "drop_last": drop_last, "seed": seed}
        common = _agree(replica, fingerprint, common)
    plan.common_seed = common
    consumers = max(1, processes)
    worker_seeds = tuple(derive_seed(common, rank, w) for w in range(consumers)) if shuffle else (0,) * consumers
    spec = _Spec(shuffle, plan.plan_seed, count, batch_size, drop_last, rank, world)
    adapter = BatchLoaderDataset(dataset, plan, spec, batch_transform, worker_seeds, work, typed)
    loader = DatasetRTBatchLoader(adapter, batch_size=None, num_workers=processes, pin_memory=pin_memory,
                                  timeout=timeout, multiprocessing_context=context, worker_init_fn=worker_init_fn,
                                  prefetch_factor=prefetch, persistent_workers=persistent)
    loader._setup_resume(plan, explicit_seed, partition, share)
    return loader

