"""`PackedBatches`: a dataset's planned order of token documents packed into `[rows, row_len]` batches.

Boundary: reads documents through the dataset's integration seam (`reserve_window`,
`plan_window`, `read_window_batches`, the cursor state) and packs them with
`sampling.packing`; no byte layouts, no packing arithmetic of its own.

State: the window being read (its dataset start and length), the rank's share of it, and the
position of the next batch in that share — `position` (documents of the share wholly packed)
and `offset` (tokens of the next document already packed): a few integers, since packing is a
pure function of the plan and the document lengths (docs/packing.md).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from datasetrt.dataset.seam import DatasetSeam
from datasetrt.errors import ArgumentTypeError, ConfigError, PackingError
from datasetrt.sampling.packing import PackedRows, Packer, check_packing, packed_stream, share_bounds

__all__ = ["PackedBatches"]

STATE_VERSION = 1


def _documents(
    ds: DatasetSeam,
    window: Any,
    first: int,
    count: int,
    read_size: int,
    in_process: bool,
    check_embedded: bool | None = None,
) -> Iterator[tuple]:
    """(values, offsets, cache_id, sample_id) of window positions [first, first + count), read
    `read_size` documents at a time (the dataset's reader workers, if it has them, unless
    `in_process`; embedded metadata checked as `check_embedded` says, None: as validate_cache)."""
    if count <= 0:
        return
    batches = ds.read_window_batches(
        window.sub(first, count), read_size, with_metadata=False, in_process=in_process, check_embedded=check_embedded
    )
    for batch in batches:
        with batch:
            arrays = batch.to_numpy()
            if isinstance(arrays, np.ndarray):  # a dense spec (k,): every document k tokens
                n, k = arrays.shape
                yield arrays.reshape(-1), np.arange(n + 1, dtype=np.int64) * k, batch.cache_id, batch.sample_id
            else:
                yield arrays.values.reshape(-1), arrays.offsets, batch.cache_id, batch.sample_id


class PackedBatches:
    """An iterator of `PackedRows` over one window of `ds` (len(ds) positions, the order
    `iter_batches` reads), packed `rows` x `row_len` (`sampling.packing` modes and overlong rules).

    Reserves its window at the first `next()`, as `iter_batches` does, unless a state was loaded.
    With `world_size` > 1 each rank (each holding the same dataset, seed and state) reads the
    contiguous share `share_bounds(window length, rank, world_size)` of the window and packs it on
    its own: ranks' batches are whole rows, their documents disjoint, together the window.
    Documents are read `read_size` at a time through the dataset's reader workers (if it has
    them), or by this process with `in_process` (code that is itself a worker process).
    `use_population` makes it read windows of another population than the dataset's current one
    (a process that reopened the dataset and imported the population its owner reads).
    """

    def __init__(
        self,
        ds: DatasetSeam,
        rows: int,
        row_len: int,
        *,
        mode: str = "split",
        overlong: str = "split",
        pad: Any = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        read_size: int = 256,
        in_process: bool = False,
    ) -> None:
        self.rows, self.row_len = check_packing(rows, row_len, mode, overlong)
        world_size, rank, read_size = (
            _int(n, v) for n, v in (("world_size", world_size), ("rank", rank), ("read_size", read_size))
        )
        if world_size < 1 or not 0 <= rank < world_size or read_size < 1:
            raise ConfigError(
                f"packing needs 0 <= rank < world_size and read_size >= 1, got rank {rank}, world_size {world_size}, read_size {read_size}"
            )
        spec = ds.payload_spec
        if spec is not None and len(spec.shape) != 1:
            raise ConfigError(f"packing takes 1-D token payloads (PayloadSpec(dtype, (None,))), not {spec}")
        self.mode, self.overlong, self.pad, self.drop_last = mode, overlong, pad, drop_last
        self.rank, self.world_size, self.read_size = rank, world_size, read_size
        self.in_process = bool(in_process)
        self._ds = ds
        self._window: Any = None
        self._cursor: dict | None = None  # the dataset's cursor after the window was reserved
        self._position = 0  # documents of the share wholly packed before the next batch
        self._offset = 0
        self._batches = 0
        self._base = 0  # `_position` when the current read started
        self._it: Iterator[PackedRows] | None = None
        self._population: Any = None  # None: the dataset's current population
        self._check_embedded: bool | None = None

    def use_population(self, population: Any, check_embedded: bool | None = None) -> None:
        """Read windows of `population` (`import_population`'s, in a process that reopened the
        dataset: a spawned DataLoader worker) instead of the dataset's current one, checking
        embedded metadata as `check_embedded` says (None: as validate_cache says). Such a
        PackedBatches only continues a loaded state (`load_state_dict`, called after this): it
        reserves no window and leaves the dataset's cursor alone. Before `load_state_dict`."""
        if self._it is not None or self._window is not None:
            raise PackingError("use_population: call it before load_state_dict and the first next()")
        self._population, self._check_embedded = population, check_embedded

    def _config(self) -> dict:
        return {
            "rows": self.rows,
            "row_len": self.row_len,
            "mode": self.mode,
            "overlong": self.overlong,
            "rank": self.rank,
            "world_size": self.world_size,
            "order": self._ds.order_identity(self._population),
        }

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> PackedRows:
        if self._it is None:
            self._it = self._start()
        batch = next(self._it)
        self._position = self._base + batch.state["consumed"]
        self._offset = batch.state["offset"]
        self._batches += 1
        batch.state = self.state_dict()
        return batch

    def reserve(self) -> None:
        """Reserve the window now, as the first `next()` does (nothing if already reserved or
        loaded from a state): `state_dict()` then names it."""
        if self._window is None:
            if self._population is not None:
                raise PackingError("a PackedBatches reading a given population continues a loaded state only")
            self._window = self._ds.reserve_window()
            self._cursor = self._ds.cursor_state().as_dict()

    def _start(self) -> Iterator[PackedRows]:
        self.reserve()
        lo, hi = share_bounds(self._window.length, self.rank, self.world_size)
        self._base = self._position
        first = lo + self._position
        packer = Packer(
            self.rows, self.row_len, mode=self.mode, overlong=self.overlong, pad=self.pad, offset=self._offset
        )
        documents = _documents(
            self._ds, self._window, first, hi - first, self.read_size, self.in_process, self._check_embedded
        )
        return packed_stream(packer, documents, drop_last=self.drop_last)

    def state_dict(self) -> dict:
        """Plain ints and strings: the packing's configuration and order, the window (dataset start
        and length; None before the first `next()`), the dataset's cursor after it, the share
        position and offset of the next batch, and the batches handed out."""
        window = None if self._window is None else [int(self._window.start), int(self._window.length)]
        return {
            "version": STATE_VERSION,
            **self._config(),
            "window": window,
            "cursor": self._cursor,
            "position": self._position,
            "offset": self._offset,
            "batches": self._batches,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict()` of the same packing (rows, row_len, mode, overlong, rank,
        world_size) over a dataset with the same caches, table, order and seed: the next batch is
        the one that followed the state, bit for bit, and the dataset's cursor moves past the
        window as the interrupted run's had. Before the first `next()` only; `PackingError`
        (nothing changes) for a state of another packing or order, or an inconsistent one."""
        if self._it is not None:
            raise PackingError("load_state_dict: this PackedBatches has started; load into a new one")
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise PackingError("not a PackedBatches state (version missing or unknown)")
        config = self._config()
        differs = [k for k, v in config.items() if state.get(k) != v]
        if differs:
            raise PackingError(
                f"the state is of another packing: {differs[0]} is {state.get(differs[0])!r}, here {config[differs[0]]!r}"
            )
        window, position, offset, batches = (state.get(k) for k in ("window", "position", "offset", "batches"))
        ints = [position, offset, batches] + ([] if window is None else list(window))
        if not all(type(v) is int and v >= 0 for v in ints) or (window is not None and len(window) != 2):
            raise PackingError(
                f"inconsistent packing state: window {window!r}, position {position!r}, offset {offset!r}"
            )
        if window is None:
            return
        position, offset, batches = int(position), int(offset), int(batches)  # type: ignore[arg-type]
        lo, hi = share_bounds(window[1], self.rank, self.world_size)
        if lo + position > hi or (offset and lo + position >= hi):
            raise PackingError(
                f"inconsistent packing state: position {position} outside a share of {hi - lo} documents"
            )
        if self._population is not None:  # another process's window: its cursor is not this dataset's
            self._window = self._ds.plan_window(window[0], window[1], population=self._population)
            self._cursor = dict(state.get("cursor") or {})
        else:
            cursor = self._ds.cursor_state_from(state.get("cursor") or {})
            self._window = self._ds.plan_window(window[0], window[1])
            self._ds.restore_cursor_state(cursor)
            self._cursor = cursor.as_dict()
        self._position, self._offset, self._batches = position, offset, batches


def _int(name: str, value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer, got {type(value).__name__}") from None
