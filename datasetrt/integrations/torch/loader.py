"""The loader: `to_torch_dataloader` (dataset-rt 0.4.8's arguments) builds a `DatasetRTDataLoader`,
a real torch `DataLoader` whose batches are the loader plan in order (this rank's share of it
under several ranks), with exact resume on any worker count and world size.

Boundary: torch's `DataLoader`; the plan and its dataset are loader_dataset.py's, the options
options.py's, the ranks distributed.py's (called through the module, so tests can stand in for
torch.distributed). The state format (STATE_KIND, versions 1 and 2) is documented in
docs/pytorch.md and docs/distributed.md. A new option: its check in options.py, its use here.
"""

from __future__ import annotations

import os
import secrets
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, get_worker_info

from datasetrt._native.draws import derive_seed
from datasetrt.errors import ConfigError, LoaderStateError
from datasetrt.integrations.torch import distributed
from datasetrt.integrations.torch.base import _check_identity, _with_order, refuse_advance
from datasetrt.integrations.torch.lifeline import DieWithParent
from datasetrt.integrations.torch.loader_dataset import LoaderDataset, _LoaderPlan
from datasetrt.integrations.torch.options import (
    MAX_SAMPLE_BUDGET,
    WorkerSettings,
    _loader_event,
    check_arguments,
    check_collate_picklable,
    check_main_guard,
    worker_settings,
)
from datasetrt.integrations.torch.plan import RankShare, _Layout, _Spec, rank_count, rank_share

if TYPE_CHECKING:
    from datasetrt.dataset.seam import DatasetSeam

STATE_KIND = "datasetrt.torch.DataLoader"
STATE_VERSION = 2  # DataLoader states; version 1 (single rank, no `rows`) is still accepted


class _LoaderIterator:
    """The torch iterator of one pass, counting delivered batches for `state_dict()`; the pass's
    order was planned for `plan_world` ranks."""

    def __init__(self, it: Any, epoch: int, layout: _Layout, prior: int, plan_world: int) -> None:
        self._it = it
        self.epoch, self.layout, self.prior, self.plan_world = epoch, layout, prior, plan_world
        self.yielded = 0
        self.exhausted = False
        self.deliver: Callable[[Any], Any] | None = None  # what the main process does to each item first

    def __iter__(self) -> _LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self.exhausted = True
            raise
        self.yielded += 1
        return batch if self.deliver is None else self.deliver(batch)

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        if name == "_it":
            raise AttributeError(name)
        return getattr(self._it, name)


class DatasetRTDataLoader(DataLoader):
    """A `torch.utils.data.DataLoader` over a `LoaderDataset`. Each `iter(loader)` starts the next
    pass (epoch) of the loader's plan, decided here in the parent before torch starts or resumes
    its workers, so persistent and non-persistent workers, fork and spawn, and `num_workers=0`
    all yield the same batches in the same order. With several ranks, each reads its share of the
    same global plan (docs/distributed.md). `state_dict()` / `load_state_dict()` resume exactly,
    also on another world size or worker count (docs/pytorch.md, docs/distributed.md).

    Attributes: `rank`, `world_size`; `padded_rows` / `dropped_rows`: rows per pass the ranks read
    twice (padding to equal batch counts) / drop (drop_last) relative to the requested samples;
    `global_samples_per_pass` = world_size * len(loader.dataset)."""

    def _setup_resume(self, plan: _LoaderPlan, explicit_seed: bool, partition: str, share: RankShare) -> None:
        """Right after `__init__`: the plan and what resuming it needs. `_adapter` is
        `self.dataset` (always our `LoaderDataset`) typed as such; torch types it `Dataset`."""
        if not isinstance(self.dataset, LoaderDataset):
            raise TypeError(f"DatasetRTDataLoader reads a LoaderDataset, not {type(self.dataset).__name__}")
        self._adapter = self.dataset
        self._plan = plan
        self._explicit_seed = explicit_seed
        self._partition = partition
        self._share = share
        self._next_epoch = 0
        self._pending = (0, 0, self.world_size)  # (rows, batches, plan world) where the next pass starts
        self._started = False
        self._current: _LoaderIterator | None = None

    @property
    def seed(self) -> int | None:
        """The loader's common seed (None for sequential loaders)."""
        return self._plan.common_seed

    @property
    def rank(self) -> int:
        return self._adapter._spec.rank

    @property
    def world_size(self) -> int:
        return self._adapter._spec.world

    @property
    def padded_rows(self) -> int:
        """Rows per full pass read twice across ranks so that every rank has the same batch count
        (the first rows of the pass, again); 0 with drop_last."""
        return self._share.padded

    @property
    def dropped_rows(self) -> int:
        """Requested rows per pass that no rank reads (drop_last rounding to whole batches on every rank)."""
        return self._share.discarded

    @property
    def global_samples_per_pass(self) -> int:
        return self._share.effective

    @property
    def batches_per_pass(self) -> int:
        return self._adapter._spec.layout().batches

    # torch types `__iter__` as its `_BaseDataLoaderIter`; ours wraps that and forwards its attributes
    def __iter__(self) -> _LoaderIterator:  # type: ignore[override]
        if isinstance(self.worker_init_fn, DieWithParent):  # workers started now die with this process
            self.worker_init_fn.parent_pid = os.getpid()
        self._drop_lost_workers()
        epoch, (rows, prior, plan_world) = self._next_epoch, self._pending
        self._started = True
        self._next_epoch, self._pending = epoch + 1, (0, 0, self.world_size)
        self._adapter._begin(epoch, rows, plan_world)
        tracked = _LoaderIterator(super().__iter__(), epoch, self._adapter._spec.layout(rows), prior, plan_world)
        self._current = tracked
        return tracked

    def _drop_lost_workers(self) -> None:
        """Persistent workers of which one is gone (killed, crashed) would fail every later pass
        (torch resumes the same workers and waits for the dead one): shut the survivors down and
        forget them, so this pass starts new workers (they read this pass, as a first pass)."""
        stale = getattr(self, "_iterator", None)
        if stale is None or not self.persistent_workers:
            return
        workers = getattr(stale, "_workers", ())
        if getattr(stale, "_shutdown", False) or not all(w.is_alive() for w in workers):
            stale._shutdown_workers()
            self._iterator = None

    def advance(self) -> None:
        """Refused with `LoaderStateError`: the loader's workers plan from their own copy of the
        curriculum (docs/sampling.md, "Advancing a dataset's curriculum")."""
        refuse_advance()

    def _identity(self) -> dict:
        plan = self._plan
        return _with_order(
            {
                "caches": plan.caches_digest(),
                "table": plan.table_digest(),
                "shuffle": plan.shuffle,
                "worker_partition": self._partition,
                "samples_per_epoch": plan.count,
                "batch_size": plan.batch_size,
                "drop_last": bool(self.drop_last),
                "seed": plan.common_seed,
            },
            plan.order_identity(),
        )

    def state_dict(self) -> dict:
        """Where the next batch comes from: {"epoch", "rows" (plan positions of that epoch the
        ranks consumed together, assuming every rank delivered as many batches as this one),
        "batches" (delivered by this rank in that epoch), "world_size", "rank"} plus what the plan
        is (cache and table digests, seed, shuffle, partition, sizes), and "plan_world" when the
        epoch's order was planned for another world size than this one's (the rest of an epoch
        resumed from such a state: docs/sampling.md, "Ranks"). Plain Python values (json- and
        torch.save-able)."""
        cur = self._current
        if cur is None:
            epoch, (rows, batches, plan_world) = self._next_epoch, self._pending
        else:
            layout = cur.layout
            epoch, rows, batches, plan_world = (
                cur.epoch,
                layout.start + cur.yielded * layout.world * layout.batch,
                cur.prior + cur.yielded,
                cur.plan_world,
            )
            if cur.exhausted or cur.yielded >= layout.batches:
                epoch, rows, batches, plan_world = epoch + 1, 0, 0, self.world_size
        planned = {} if plan_world == self.world_size else {"plan_world": plan_world}
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "epoch": epoch,
            "rows": rows,
            "batches": batches,
            "world_size": self.world_size,
            "rank": self.rank,
            **planned,
            **self._identity(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where `state` was taken: the next iteration yields exactly the remaining
        batches of that epoch (the same batches when the world size is the same; otherwise this
        topology's share of the remaining plan positions), later iterations the following epochs.
        Must precede iteration. A state of another plan (caches, table, seed, shuffle, partition,
        sizes) is refused; a loader built with seed="random" adopts the state's seed."""
        if self._started:
            raise LoaderStateError(
                "load_state_dict must be called before the loader is iterated; "
                "build a fresh loader with the same arguments to resume"
            )
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND:
            raise ConfigError(f"not a datasetrt DataLoader state (expected kind {STATE_KIND!r})")
        version = state.get("version")
        if version not in (1, STATE_VERSION):
            raise ConfigError(f"unsupported DataLoader state version {version!r}")
        mine = self._identity()
        seed = state.get("seed")
        # the state's seed, when this loader (seed="random", plan not fixed yet) adopts it; else None
        adopt = (
            seed
            if (
                seed != mine["seed"]
                and not self._explicit_seed
                and self._plan.shuffle
                and not self._plan.frozen
                and type(seed) is int
                and 0 <= seed < 1 << 64
            )
            else None
        )
        _check_identity(state, {k: v for k, v in mine.items() if not (adopt is not None and k == "seed")}, "DataLoader")
        epoch, batches = state.get("epoch"), state.get("batches")
        world: object  # as saved; checked below
        rows: object
        if version == 1:  # single rank: rows = batches * batch_size
            world = 1
            rows = min(batches * self._plan.batch_size, self._plan.count) if type(batches) is int else None
        else:
            world, rows = state.get("world_size"), state.get("rows")
        plan_world = state.get("plan_world", world)  # the world size the epoch's order was planned for
        same = world == self.world_size
        if (
            type(epoch) is not int
            or type(batches) is not int
            or type(rows) is not int
            or type(world) is not int
            or epoch < 0
            or batches < 0
            or world < 1
            or type(plan_world) is not int
            or plan_world < 1
            or not 0 <= rows <= self._plan.count
            or (same and batches > self.batches_per_pass)
        ):
            raise ConfigError(
                f"DataLoader state has an invalid position (epoch {epoch!r}, batches {batches!r}, "
                f"rows {rows!r}, world_size {world!r})"
            )
        if adopt is not None:
            self._plan.common_seed = adopt  # seed="random": continue the saved stream
            rank, workers = self.rank, len(self._adapter.worker_seeds)
            self._adapter.worker_seeds = tuple(derive_seed(adopt, rank, w) for w in range(workers))
            self._adapter._spec = replace(self._adapter._spec, seed=self._plan.plan_seed)
        if not same:
            batches = rows // (self.world_size * self._plan.batch_size)
        if rows == 0:  # a whole epoch is planned for this world size
            plan_world = self.world_size
        if self._adapter._spec.layout(rows).per_rank == 0:
            epoch, rows, batches, plan_world = epoch + 1, 0, 0, self.world_size
        self._next_epoch, self._pending = epoch, (rows, batches, plan_world)


def to_torch_dataloader(
    dataset: DatasetSeam,
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
    """`CachedDataset.to_torch_dataloader(...)`: dataset-rt 0.4.8's arguments, defaults and
    validation messages; a real DataLoader whose batches are the loader plan in order, or this
    rank's share of it when several ranks train (`capture_replica`; docs/distributed.md). With an
    initialised process group of world_size > 1 this is a collective call (one
    `broadcast_object_list`): every rank must call it, with the same arguments."""
    extra = check_arguments(
        shuffle=shuffle,
        seed=seed,
        samples_per_epoch=samples_per_epoch,
        worker_partition=worker_partition,
        batch_size=batch_size,
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=pin_memory,
        timeout=timeout,
        native_num_workers=native_num_workers,
        multiprocessing_context=multiprocessing_context,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        verbose=verbose,
        dataloader_kwargs=dataloader_kwargs,
    )
    built = _plan_loader(
        dataset,
        "to_torch_dataloader",
        shuffle=shuffle,
        seed=seed,
        samples_per_epoch=samples_per_epoch,
        partition=worker_partition,
        batch_size=batch_size,
        drop_last=drop_last,
        work_dir=work_dir,
        worker_args={
            "num_workers": num_workers,
            "native_num_workers": native_num_workers,
            "timeout": timeout,
            "persistent_workers": persistent_workers,
            "prefetch_factor": prefetch_factor,
            "multiprocessing_context": multiprocessing_context,
            "sample_transform_fn": sample_transform_fn,
        },
        collate_fn=collate_fn,
    )
    plan, spec, settings, worker_seeds = built.plan, built.spec, built.settings, built.worker_seeds
    processes, prefetch, context = settings.processes, settings.prefetch, settings.context
    rank, world, share, partition = spec.rank, spec.world, built.share, built.partition
    adapter = LoaderDataset(dataset, plan, spec, sample_transform_fn, worker_seeds, built.work)
    loader = DatasetRTDataLoader(
        adapter,
        batch_size=batch_size,
        num_workers=processes,
        collate_fn=collate_fn,
        drop_last=drop_last,
        pin_memory=pin_memory,
        timeout=timeout,
        multiprocessing_context=context,
        worker_init_fn=DieWithParent(worker_init_fn) if processes > 0 else worker_init_fn,
        prefetch_factor=prefetch,
        persistent_workers=settings.persistent,
        **extra,
    )
    loader._setup_resume(plan, built.explicit_seed, partition, share)
    if verbose:
        seeds = ",".join(f"{w}:{s}" for w, s in enumerate(worker_seeds))
        _loader_event(
            f"event=loader_ready pid={os.getpid()} rank={rank} seed={plan.common_seed} worker_seeds={seeds} "
            f"num_workers={processes} native_threads_per_consumer={settings.threads} partition={partition} "
            f"persistent={settings.persistent} prefetch_factor={prefetch if prefetch is not None else 'disabled'} "
            f"samples={share.requested} samples_per_rank={share.per_rank} batch_size={batch_size} world_size={world} "
            f"padded={share.padded} dropped={share.discarded} shuffle={shuffle} "
            f"multiprocessing_context={context.get_start_method() if context is not None else 'disabled'}"
        )
    return loader


@dataclass(frozen=True)
class _Built:
    """A loader's plan and pass spec as `_plan_loader` fixed them, with what the DataLoader and
    its resume need: the resolved worker settings, per-worker seeds, the rank share, work dir."""

    plan: _LoaderPlan
    spec: _Spec
    settings: WorkerSettings
    worker_seeds: tuple[int, ...]
    share: RankShare
    partition: str
    explicit_seed: bool
    work: str | None


def _plan_loader(
    dataset: DatasetSeam,
    what: str,
    *,
    shuffle: bool,
    seed: int | str,
    samples_per_epoch: int | None,
    partition: str | None,
    batch_size: int,
    drop_last: bool,
    work_dir: Any,
    worker_args: dict,
    collate_fn: Callable | None = None,
) -> _Built:
    """The sampling plan of a loader over `dataset` (arguments already checked by
    `check_arguments`), in this rank's topology: worker settings, the rank share and its warning,
    the common seed (agreed with rank 0 under a process group: a collective call) and the pass
    spec. `what` names the calling method in messages. Shared by `to_torch_dataloader` and
    `to_torch_batches`, so the same arguments give the same plan."""
    fixed_seed = seed if type(seed) is int else None  # an explicit seed; None for seed="random"
    explicit_seed = fixed_seed is not None
    if get_worker_info() is not None:
        raise LoaderStateError(f"{what} must run before DataLoader workers start")
    replica = distributed.capture_replica()
    rank, world = replica.rank, replica.world_size
    if shuffle and not explicit_seed and world > 1 and not replica.group:
        raise ConfigError(
            f"seed='random' with WORLD_SIZE={world} needs an initialised torch.distributed process "
            f"group to share rank 0's seed; pass an explicit seed (the same on every rank)"
        )
    settings = worker_settings(**worker_args, local_world_size=replica.local_world_size)
    check_collate_picklable(collate_fn, settings.context)
    check_main_guard(settings.context, what)

    budget = samples_per_epoch if samples_per_epoch is not None else len(dataset)
    if not 1 <= budget <= MAX_SAMPLE_BUDGET:
        raise ConfigError(f"inherited samples_per_epoch must be between 1 and {MAX_SAMPLE_BUDGET}")
    share = rank_share(budget, world, batch_size, drop_last)
    count = rank_count(budget, 1, batch_size, drop_last)  # global plan positions per pass, any world size
    if rank == 0 and share.message is not None:
        warnings.warn(share.message, UserWarning, stacklevel=4)
    work = None
    if work_dir is not None:
        from pydantic import DirectoryPath, TypeAdapter

        work = str(TypeAdapter(DirectoryPath).validate_python(work_dir))
    partition = partition or ("replicate" if shuffle else "split")

    plan = _LoaderPlan(
        dataset,
        shuffle=shuffle,
        common_seed=None,
        partition=partition,
        budget=budget,
        count=count,
        batch_size=batch_size,
        drop_last=drop_last,
    )
    common = (fixed_seed if fixed_seed is not None else secrets.randbits(64)) if shuffle else None
    if replica.group and world > 1:
        fingerprint = {
            "caches": plan.caches_digest(),
            "table": plan.table_digest(),
            "shuffle": shuffle,
            "worker_partition": partition,
            "samples_per_epoch": budget,
            "batch_size": batch_size,
            "drop_last": drop_last,
            "seed": seed,
        }
        common = distributed._agree(replica, fingerprint, common)
    plan.common_seed = common
    consumers = max(1, settings.processes)
    # a common seed exactly when shuffled (rank 0's shuffle is this rank's: `_agree` checks it)
    if common is None:
        worker_seeds: tuple[int, ...] = (0,) * consumers
    else:
        worker_seeds = tuple(derive_seed(common, rank, w) for w in range(consumers))
    spec = _Spec(shuffle, plan.plan_seed, count, batch_size, drop_last, rank, world)
    return _Built(plan, spec, settings, worker_seeds, share, partition, explicit_seed, work)
