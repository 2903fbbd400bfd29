"""`loader.dataset` of `to_torch_dataloader`: the loader's sampling plan, fixed when the loader is
built, and the torch dataset that reads this rank's share of pass e of it, in the main process or
divided among DataLoader workers.

Boundary: reaches the dataset only through its integration seam (`population_rows`,
`population_from_rows`, `plan_window`, `read_window`, `cache_identity`); the pass arithmetic is
plan.py's, the spawned side spawn.py's. dataset-rt's loader semantics (split selection, seeds)
live here; what a window's rows are is the dataset's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from datasetrt._native.draws import derive_seed
from datasetrt.errors import CacheFormatError
from datasetrt.integrations.torch.base import _caches_digest, _PlanDataset, _rows_digest, _worker_identity
from datasetrt.integrations.torch.plan import _Share, _Spec
from datasetrt.integrations.torch.spawn import _PlanReader, _Recipe

if TYPE_CHECKING:
    from datasetrt.dataset.seam import DatasetSeam


class _LoaderPlan:
    """The loader's sampling plan, fixed when the loader is built (as dataset-rt exports the table):
    the dataset's active rows at that time (all physical rows, weight 1.0, before any
    update_metadata), ordered per `worker_partition` exactly as dataset-rt's single consumer sees
    them; pass e reads window [e*count, (e+1)*count) of one stream (draw offset or cursor) seeded
    `derive_seed(common_seed, 0, 0)`. Shuffled plans always use the weighted sampler, as
    dataset-rt's loaders do (the plan's population always has rows and weights). `count` is the
    single-rank samples per pass whatever the world size: ranks divide each window (`_Layout`),
    they do not change it.
    """

    def __init__(
        self,
        ds: DatasetSeam,
        *,
        shuffle: bool,
        common_seed: int | None,
        partition: str,
        budget: int,
        count: int,
        batch_size: int,
        drop_last: bool,
    ) -> None:
        self._ds = ds
        self._source = ds.cursor_state().population  # the rows (and stream order) the plan selects from
        base = ds.population_rows(self._source, expand_physical=True)
        # expand_physical gives rows for the physical population too, and datasets keep their weights
        if base is None or base.weights is None:  # pragma: no cover
            raise CacheFormatError("the dataset's active rows carry no weights")
        self.base = base
        self.base_weights: np.ndarray = base.weights  # base.weights, known present
        self.shuffle, self.partition, self.budget = shuffle, partition, budget
        self.count, self.batch_size, self.drop_last = count, batch_size, drop_last
        self.common_seed = common_seed
        self.frozen = False
        self._population: Any = None
        self._digest: str | None = None

    @property
    def plan_seed(self) -> int:
        """The plan stream's seed: derived from the common seed when shuffled (set by the time a
        spec is built), else 0."""
        if not self.shuffle:
            return 0
        if self.common_seed is None:
            raise RuntimeError("the shuffled loader plan has no common seed yet")
        return derive_seed(self.common_seed, 0, 0)

    @property
    def population(self) -> Any:
        """Built once: dataset-rt's split selection (rows [0, count) when the budget equals the
        rows, a seeded permutation for shuffled split), else the rows as they are."""
        if self._population is None:
            base, rows = self.base, len(self.base)
            size = self.count if self.partition == "split" and self.budget == rows else rows
            order: np.ndarray | None
            if self.partition == "split" and self.shuffle:
                order = np.random.default_rng(self.common_seed).permutation(rows)[:size]
            else:
                order = None if size == rows else np.arange(size, dtype=np.int64)
            if order is None:
                self._population = self._ds.population_from_rows(
                    base.cache_pos, base.sample_id, self.base_weights, source=self._source
                )
            else:
                self._population = self._ds.population_from_rows(
                    base.cache_pos[order],
                    base.sample_id[order],
                    self.base_weights[order],
                    source=self._source,
                    selection=order,
                )
        return self._population

    def freeze(self) -> Any:
        """Fix the plan (first pass or first pickle) and return its population."""
        self.frozen = True
        return self.population

    def table_digest(self) -> str:
        """Identity of the active rows the plan was built from (positions, ids, weights)."""
        if self._digest is None:
            self._digest = _rows_digest(self.base.cache_pos, self.base.sample_id, self.base_weights)
        return self._digest

    def caches_digest(self) -> str:
        return _caches_digest(self._ds)

    def order_identity(self) -> str:
        """The dataset's order over the plan's rows ("draws", "permutation", "mixture:..." or "curriculum:...")."""
        return self._ds.order_identity(self._source)


def _stream(ds: DatasetSeam, population: Any, spec: _Spec, plan_world: int) -> Any:
    """The loader's plan stream over `population` as `plan_world` ranks read it: a window from
    plan position 0 whose pass e is `spec.pass_window(stream, e)` (a locality-aware order plans
    each epoch-long pass so that each of `plan_world` ranks reads its own shards; other orders do
    not depend on it). In the parent this also computes the plan's tables once, before any worker
    forks."""
    layout = (plan_world, spec.batch, spec.drop_last) if spec.shuffle else None
    return ds.plan_window(
        0, spec.stride, population=population, shuffle=spec.shuffle, seed=spec.seed, rank_layout=layout
    )


class LoaderDataset(_PlanDataset):
    """`loader.dataset` of `to_torch_dataloader`: `len()` is this rank's samples per pass; pass e
    reads this rank's layout of window e of the global plan. Main process (`num_workers=0`): read
    through the dataset (its runtime's reader processes, if it has them). Worker w of K: the
    rank's batches w, w+K, ... in-process. `sample_transform_fn` runs per sample where the sample
    is read. A pass's order is planned for `plan_world` ranks (`_pass`): the loader's world size,
    except for the rest of an epoch a state taken on another world size resumes (docs/sampling.md,
    "Ranks")."""

    def __init__(
        self,
        dataset: DatasetSeam,
        plan: _LoaderPlan,
        spec: _Spec,
        transform: Callable | None,
        worker_seeds: tuple[int, ...],
        work_dir: str | None,
    ) -> None:
        self._setup(dataset, None, work_dir)
        self._init_passes(plan, spec, transform, worker_seeds, (0, 0, spec.world))

    def _init_passes(
        self,
        plan: _LoaderPlan | None,
        spec: _Spec,
        transform: Callable | None,
        worker_seeds: tuple[int, ...],
        pass_: tuple[int, int, int],
    ) -> None:
        self._plan = plan  # None in a spawned copy
        self._spec = spec
        self.sample_transform_fn = transform
        self.worker_seeds = worker_seeds
        # (epoch, plan rows already consumed, plan world) of the next pass the loader starts
        self._pass = pass_

    def _require_plan(self) -> _LoaderPlan:
        """The plan; held wherever the dataset is (the building process and its forked workers)."""
        if self._plan is None:
            raise RuntimeError(
                "LoaderDataset has no plan in this process: a spawned copy reads only through its recipe"
            )
        return self._plan

    def __len__(self) -> int:
        return self._spec.layout().per_rank

    @property
    def worker_seed(self) -> int:
        """derive_seed(seed, rank, worker) of the calling DataLoader worker (worker 0 in the main
        process): a reproducible seed for random transforms; 0 for sequential loaders."""
        worker, _workers, _in = _worker_identity()
        return self.worker_seeds[worker] if worker < len(self.worker_seeds) else 0

    def _begin(self, epoch: int, rows: int, plan_world: int) -> None:
        """Parent side, before torch starts the pass (and maybe its workers): fix the plan and
        compute its tables here, once, so forked workers share them."""
        _stream(self._require_dataset(), self._require_plan().freeze(), self._spec, plan_world)
        self._pass = (epoch, rows, plan_world)

    def __iter__(self) -> Iterator[Any]:
        where = self._pass_here()
        if where is None:
            return iter(())
        window, reader = where
        if reader is None:
            return self._require_dataset().read_window(window, self.sample_transform_fn)
        return reader.read(window, self.sample_transform_fn)

    def _pass_here(self) -> tuple[Any, _PlanReader | None] | None:
        """What this process reads of the pass it starts now: (window, None) in the main process
        (read through the dataset: the rest of the pass, or this rank's share of it), (share,
        reader) in DataLoader worker w of K (its share of the rank's batches, read in-process by
        `reader`); None when this rank has nothing left in the pass. Every batch of `spec.batch`
        consecutive positions of the returned window is one batch of the loader."""
        worker, workers, in_worker = _worker_identity()
        main = not in_worker and self._dataset is not None
        spec = self._spec
        if main:
            epoch, rows, plan_world = self._pass
            self._pass = (epoch + 1, 0, spec.world)
        else:
            k = self._next_pass()
            epoch, rows, plan_world = self._pass
            if k:  # a persistent worker's later pass: a whole epoch, planned for this world size
                epoch, rows, plan_world = epoch + k, 0, spec.world
        layout = spec.layout(rows)
        if layout.per_rank == 0:
            return None
        if main:
            stream = _stream(self._require_dataset(), self._require_plan().freeze(), spec, plan_world)
            if spec.world == 1:  # the rest of the pass is one contiguous window
                return spec.pass_window(stream, epoch, rows), None
            return _Share(spec.pass_window(stream, epoch), layout=layout), None
        reader = self._reader_here(self._require_plan().freeze() if self._dataset is not None else None)
        window = spec.pass_window(_stream(reader.ds, reader.population, spec, plan_world), epoch)
        return _Share(window, worker, workers, layout=layout), reader

    def __reduce__(self) -> Any:
        """Ship paths, config, the plan parameters and a snapshot path; never the table."""
        recipe = self._recipe_shipped
        spec = self._spec
        if self._dataset is not None and spec.stride > 0:
            recipe = self._recipe_for(self._require_plan().freeze())
        return _rebuild_loader_dataset, (recipe, spec, self.sample_transform_fn, self.worker_seeds, self._pass)


def _rebuild_loader_dataset(
    recipe: _Recipe | None,
    spec: _Spec,
    transform: Callable | None,
    worker_seeds: tuple[int, ...],
    pass_: tuple[int, int, int],
) -> LoaderDataset:
    obj = LoaderDataset._rebuilt(recipe)
    obj._init_passes(None, spec, transform, worker_seeds, pass_)
    return obj
