"""`to_torch_batches(rows, pack=row_len)`: a DataLoader of packed token rows (docs/packing.md).

Boundary: torch's DataLoader around the dataset's `iter_packed` (integration seam); the packing
itself, its shares and states are the dataset's `PackedBatches`. No planning or I/O of its own.

Each pass reads the dataset's next window (reserved in the main process when `iter(loader)`
starts). With K DataLoader workers on rank r of R, worker w packs share `r * K + s` of `R * K`
(s = (w + first) mod K, `first` being where a resumed pass rotates the round-robin), in its own
process, so every item is whole rows of one share. Torch hands items out round-robin over the
workers (its `in_order`), skipping workers whose share is done; the loader records each item's
share state, so its state — the window, each share's (position, offset, batches) and the share
of the next item — resumes the pass exactly.

A forked worker packs from the inherited dataset. A spawned (or forkserver) one receives the
pass's share states (each naming the window: its dataset start and length) and a recipe
(spawn.py: cache directories, the reader config with its seed, the caches' key, a snapshot of
the population the window was reserved in); it reopens the caches and plans that window over
the imported population, so it packs the same rows, byte for byte, as a forked one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from datasetrt.dataset.seam import DatasetSeam
from datasetrt.errors import ConfigError, LoaderStateError
from datasetrt.integrations.torch.lifeline import DieWithParent
from datasetrt.integrations.torch.options import check_main_guard
from datasetrt.integrations.torch.spawn import _PlanReader, _Recipe, _Snapshots

__all__ = ["DatasetRTPackedLoader", "PackedIterable", "to_torch_packed"]

STATE_KIND = "datasetrt.packed_loader"
STATE_VERSION = 1


class PackedIterable(IterableDataset):
    """The shares of one pass: worker w packs share `rank * K + (w + first) % K` from its
    state in `shares` (PackedBatches states; None: nothing to read) and yields
    `PackedRows.to_torch()` dicts with a "packing_state" entry [share, position, offset, batches].
    `ds` is the dataset in the process that built it and its forked workers; a spawned copy has
    None there and reopens the dataset from its recipe (`__reduce__`)."""

    def __init__(self, ds: DatasetSeam | None, options: dict, rank: int, world_size: int) -> None:
        self.ds, self.options, self.rank, self.world_size = ds, options, rank, world_size
        self.shares: list[dict] | None = None
        self.first = 0
        self.population: Any = None  # the population of the pass's window (set when the pass starts)
        self._recipe: _Recipe | None = None  # in a spawned copy: how to reopen the dataset
        self._reader: _PlanReader | None = None  # in a spawned copy: the reopened dataset
        self._snapshots = _Snapshots(self)

    def _packed(self, rank: int, world_size: int, in_process: bool) -> Any:
        """A PackedBatches of share `rank` of `world_size` in this process: over the dataset
        (main process, forked worker), or over the dataset and population the recipe reopens."""
        if self.ds is not None:
            return self.ds.iter_packed(**self.options, rank=rank, world_size=world_size, in_process=in_process)
        if self._reader is None or self._reader.pid != os.getpid():
            if self._recipe is None:
                raise RuntimeError("PackedIterable has neither a dataset nor a recipe to read through")
            self._reader = _PlanReader.open(self._recipe)
        reader = self._reader
        packed = reader.ds.iter_packed(**self.options, rank=rank, world_size=world_size, in_process=True)
        packed.use_population(reader.population, reader.check_embedded)
        return packed

    def __iter__(self) -> Iterator[dict]:
        if self.shares is None:
            raise LoaderStateError("iterate the loader, not its dataset")
        info = get_worker_info()
        k, w = (1, 0) if info is None else (info.num_workers, info.id)
        s = (w + self.first) % k
        packed = self._packed(self.rank * k + s, self.world_size * k, info is not None)
        packed.load_state_dict(self.shares[s])
        for batch in packed:
            item = batch.to_torch()
            item["packing_state"] = [s, batch.state["position"], batch.state["offset"], batch.state["batches"]]
            yield item

    def __reduce__(self) -> Any:
        """What a spawned (or forkserver) worker receives: the recipe (the population snapshot
        written once per population into this object's temp dir, removed with it), the packing,
        the ranks and the pass's share states; never the dataset."""
        if self.ds is None:
            recipe = self._recipe
        else:
            population = self.population if self.population is not None else self.ds.cursor_state().population
            recipe = self._snapshots.recipe(self.ds, population)
        return _rebuild_packed, (recipe, self.options, self.rank, self.world_size, self.shares, self.first)

    @property
    def snapshot_dir(self) -> Path | None:
        """The temp dir holding population snapshots for spawned workers (None until needed)."""
        return self._snapshots.directory


def _rebuild_packed(
    recipe: _Recipe | None, options: dict, rank: int, world_size: int, shares: list[dict] | None, first: int
) -> PackedIterable:
    obj = PackedIterable(None, options, rank, world_size)
    obj._recipe, obj.shares, obj.first = recipe, shares, first
    return obj


class _Pass:
    """The main-process side of one pass: hands items on and records their share states."""

    def __init__(self, loader: DatasetRTPackedLoader, inner: Iterator[dict]) -> None:
        self.loader, self.inner = loader, inner

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> dict:
        item = next(self.inner)
        s, position, offset, batches = (int(v) for v in item.pop("packing_state"))
        loader = self.loader
        loader._shares[s] = {**loader._shares[s], "position": position, "offset": offset, "batches": batches}
        loader._next = (s + 1) % loader._workers
        return item


class DatasetRTPackedLoader(DataLoader):
    """A DataLoader of packed batches: dicts of tensors "tokens" `[rows, row_len]`,
    "segment_ids", "positions" (int32 `[rows, row_len]`), "cu_seqlens" (int32), "cache_id",
    "sample_id" (int64, per segment) and "max_seqlen" (int). `state_dict()` / `load_state_dict()`
    resume a pass exactly (same dataset, seed, packing, ranks and num_workers)."""

    def __init__(self, ds: DatasetSeam, options: dict, rank: int, world_size: int, **kwargs: Any) -> None:
        super().__init__(PackedIterable(ds, options, rank, world_size), batch_size=None, **kwargs)
        self._ds, self._options = ds, options
        self._workers = max(1, self.num_workers)
        self._shares: list[dict] = []
        self._next = 0
        self._loaded = False

    def _fresh_pass(self) -> None:
        ds, k, dataset = self._ds, self._workers, self.dataset
        assert isinstance(dataset, PackedIterable)
        template = ds.iter_packed(**self._options)
        template.reserve()  # the window of this pass, in the main process
        state = template.state_dict()
        world = dataset.world_size * k
        self._shares = [{**state, "rank": dataset.rank * k + s, "world_size": world} for s in range(k)]
        self._next = 0

    def __iter__(self) -> Iterator[dict]:  # type: ignore[override]
        if not self._loaded:
            self._fresh_pass()
        self._loaded = False
        dataset = self.dataset
        assert isinstance(dataset, PackedIterable)
        dataset.shares, dataset.first = [dict(s) for s in self._shares], self._next
        dataset.population = self._ds.cursor_state().population  # what spawned workers plan the window over
        if isinstance(self.worker_init_fn, DieWithParent):  # workers started now die with this process
            self.worker_init_fn.parent_pid = os.getpid()
        return _Pass(self, super().__iter__())

    def state_dict(self) -> dict:
        """Plain values: the packing, the workers, each share's PackedBatches state and the share
        of the next item (empty shares before the first pass)."""
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "num_workers": self._workers,
            "next": self._next,
            "shares": [dict(s) for s in self._shares],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next `iter(loader)` continue the pass `state` was taken in. The dataset's
        cursor moves past that pass's window. LoaderStateError for a state of another loader."""
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND or state.get("version") != STATE_VERSION:
            raise LoaderStateError("not a packed loader state")
        if state.get("num_workers") != self._workers:
            raise LoaderStateError(
                f"the state is of a loader with num_workers={state.get('num_workers')}, this one has {self._workers}"
            )
        shares, first = state.get("shares"), state.get("next")
        if not shares:
            return
        if not isinstance(shares, list) or len(shares) != self._workers or type(first) is not int:
            raise LoaderStateError("inconsistent packed loader state")
        dataset = self.dataset
        assert isinstance(dataset, PackedIterable)
        for s, share in enumerate(shares):  # checked here (PackingError), not in a worker
            probe = self._ds.iter_packed(
                **self._options, rank=dataset.rank * self._workers + s, world_size=dataset.world_size * self._workers
            )
            probe.load_state_dict(share)
        self._shares, self._next, self._loaded = [dict(s) for s in shares], first % self._workers, True


def to_torch_packed(
    ds: DatasetSeam,
    rows: int,
    row_len: int,
    *,
    mode: str = "split",
    overlong: str = "split",
    pad: Any = 0,
    drop_last: bool = False,
    read_size: int = 256,
    num_workers: int = 0,
    multiprocessing_context: Any = "spawn",
    pin_memory: bool = False,
    timeout: float = 0,
    worker_init_fn: Any = None,
    prefetch_factor: int | None = None,
) -> DatasetRTPackedLoader:
    """`CachedDataset.to_torch_batches(rows, pack=row_len, ...)`: see the module docstring.
    Rank and world size from torch.distributed or RANK / WORLD_SIZE (`capture_replica`).
    DataLoader workers start with `multiprocessing_context` ("spawn", as the unpacked loaders;
    "inherit", a start method or a context): forked ones inherit the dataset, spawned and
    forkserver ones reopen it from a recipe (the dataset itself does not pickle)."""
    from datasetrt.integrations.torch.distributed import capture_replica

    if type(num_workers) is not int or num_workers < 0:
        raise ConfigError(f"num_workers must be an integer >= 0 with pack=, got {num_workers!r}")
    context = _context(multiprocessing_context) if num_workers else None
    check_main_guard(context, "to_torch_batches(pack=...)")
    replica = capture_replica()
    options = {
        "rows": rows,
        "row_len": row_len,
        "mode": mode,
        "overlong": overlong,
        "pad": pad,
        "drop_last": drop_last,
        "read_size": read_size,
    }
    ds.iter_packed(**options, rank=replica.rank, world_size=replica.world_size)  # checks the arguments here
    kwargs: dict = {"num_workers": num_workers, "pin_memory": pin_memory, "timeout": timeout}
    if num_workers:
        kwargs.update(
            multiprocessing_context=context, worker_init_fn=DieWithParent(worker_init_fn), persistent_workers=False
        )
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    return DatasetRTPackedLoader(ds, options, replica.rank, replica.world_size, **kwargs)


def _context(value: Any) -> BaseContext:
    """The multiprocessing context `value` names ("inherit": the platform's default start method)."""
    if isinstance(value, BaseContext):
        return value
    if not (isinstance(value, str) and (value == "inherit" or value in get_all_start_methods())):
        raise ConfigError("multiprocessing_context must be 'inherit', an available start method, or BaseContext")
    return get_context(None if value == "inherit" else value)
