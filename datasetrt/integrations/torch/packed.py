"""`to_torch_batches(rows, pack=row_len)`: a DataLoader of packed token rows (docs/packing.md).

Boundary: torch's DataLoader around the dataset's `iter_packed` (integration seam); the packing
itself, its shares and states are the dataset's `PackedBatches`. No planning or I/O of its own.

Each pass reads the dataset's next window (reserved in the main process when `iter(loader)`
starts). With K DataLoader workers on rank r of R, worker w packs share `r * K + s` of `R * K`
(s = (w + first) mod K, `first` being where a resumed pass rotates the round-robin), in its own
process (fork: workers inherit the dataset), so every item is whole rows of one share. Torch
hands items out round-robin over the workers (its `in_order`), skipping workers whose share is
done; the loader records each item's share state, so its state — the window, each share's
(position, offset, batches) and the share of the next item — resumes the pass exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from datasetrt.dataset.seam import DatasetSeam
from datasetrt.errors import ConfigError, LoaderStateError

__all__ = ["DatasetRTPackedLoader", "PackedIterable", "to_torch_packed"]

STATE_KIND = "datasetrt.packed_loader"
STATE_VERSION = 1


class PackedIterable(IterableDataset):
    """The shares of one pass: worker w packs share `rank * K + (w + first) % K` from its
    state in `shares` (PackedBatches states; None: nothing to read) and yields
    `PackedRows.to_torch()` dicts with a "packing_state" entry [share, position, offset, batches]."""

    def __init__(self, ds: DatasetSeam, options: dict, rank: int, world_size: int) -> None:
        self.ds, self.options, self.rank, self.world_size = ds, options, rank, world_size
        self.shares: list[dict] | None = None
        self.first = 0

    def __iter__(self) -> Iterator[dict]:
        if self.shares is None:
            raise LoaderStateError("iterate the loader, not its dataset")
        info = get_worker_info()
        k, w = (1, 0) if info is None else (info.num_workers, info.id)
        s = (w + self.first) % k
        packed = self.ds.iter_packed(
            **self.options, rank=self.rank * k + s, world_size=self.world_size * k, in_process=info is not None
        )
        packed.load_state_dict(self.shares[s])
        for batch in packed:
            item = batch.to_torch()
            item["packing_state"] = [s, batch.state["position"], batch.state["offset"], batch.state["batches"]]
            yield item


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
    multiprocessing_context: Any = "fork",
    pin_memory: bool = False,
    timeout: float = 0,
    worker_init_fn: Any = None,
    prefetch_factor: int | None = None,
) -> DatasetRTPackedLoader:
    """`CachedDataset.to_torch_batches(rows, pack=row_len, ...)`: see the module docstring.
    Rank and world size from torch.distributed or RANK / WORLD_SIZE (`capture_replica`).
    DataLoader workers are forked (they inherit the dataset, which does not pickle)."""
    from datasetrt.integrations.torch.distributed import capture_replica

    if type(num_workers) is not int or num_workers < 0:
        raise ConfigError(f"num_workers must be an integer >= 0 with pack=, got {num_workers!r}")
    context = getattr(multiprocessing_context, "get_start_method", lambda: multiprocessing_context)()
    if num_workers and context != "fork":
        raise ConfigError(
            f"to_torch_batches(pack=...) starts DataLoader workers with fork only, got {multiprocessing_context!r}: "
            "use multiprocessing_context='fork', or num_workers=0 (the dataset's reader processes read)"
        )
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
        kwargs.update(multiprocessing_context="fork", worker_init_fn=worker_init_fn, persistent_workers=False)
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    return DatasetRTPackedLoader(ds, options, replica.rank, replica.world_size, **kwargs)
