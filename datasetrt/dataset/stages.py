"""Curriculum reads of a `CachedDataset`: where its consumer is in the plan, `advance()` at a batch
boundary the consumer has not read, the stage each batch comes from, and the dataset's resume
state (docs/sampling.md, "Advancing a dataset's curriculum").

Boundary: plan positions, windows and iterators of already-read items; no I/O of its own (the
dataset hands in `open_read(window)`, which reads through its runtime's workers or in-process),
no Polars, no processes, no torch. "The consumer" is the dataset's latest curriculum iterator
(`iter(ds)`, `iter_batches`): one consumer at a time, as with a training loop.

How an advance reaches rows planned ahead: every read of a curriculum window notes the plan's
`revision` when it opens; `CurriculumPlan.advance` bumps it. After an advance the read hands out
nothing more from what it planned before (its in-process chunk, or the worker run's prefetched
batches and ring slots, closed with the run), and opens a new read of the rest of its window from
the consumer's next unread position, planned with the new stages. Rows before the new boundary
are the same under both plans, so re-reading them changes nothing the consumer sees.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, overload

from datasetrt.errors import LoaderStateError, SamplingStateError
from datasetrt.sampling.curriculum import CurriculumPlan, StageInfo

DATASET_STATE_KIND = "datasetrt.CachedDataset"
DATASET_STATE_VERSION = 1


class _Read:
    """One live curriculum iterator: its plan, the next plan position it delivers, its window's end."""

    __slots__ = ("plan", "position", "end")

    def __init__(self, plan: CurriculumPlan, position: int, end: int) -> None:
        self.plan, self.position, self.end = plan, position, end


class StageReads:
    """One dataset's curriculum reads: the live iterator (None between iterators), the end of the
    window a loaded state was taken in (its rest is the next window reserved), and the owners that
    read the dataset's plan where `advance()` cannot reach them (`hold`). Called under the
    dataset's lock where it says so; plain Python values only."""

    __slots__ = ("live", "resume_end", "_holders")

    def __init__(self) -> None:
        self.live: _Read | None = None
        self.resume_end: tuple[CurriculumPlan, int] | None = None
        self._holders: weakref.WeakSet = weakref.WeakSet()

    def position(self, plan: CurriculumPlan, draw_offset: int) -> int:
        """The plan position of the consumer's next unread sample: the live iterator's, else the
        dataset's draw offset (where the next iterator starts)."""
        live = self.live
        return live.position if live is not None and live.plan is plan else draw_offset

    def hold(self, owner: object) -> None:
        """`owner` reads the dataset's plan in copies `advance()` cannot change (DataLoader
        workers of `to_torch_iterable_dataset`): `advance()` is refused while it lives."""
        self._holders.add(owner)

    def advance(self, plan: CurriculumPlan, draw_offset: int) -> int:
        """End the current stage at the first batch boundary at or after the consumer's next
        unread position; returns that boundary. Under the dataset's lock."""
        holders = sorted({type(h).__name__ for h in self._holders})
        if holders:
            raise LoaderStateError(
                f"advance(): a torch dataset ({', '.join(holders)}, from to_torch_iterable_dataset) reads this "
                "dataset's curriculum; its DataLoader workers plan from their own copy, which advance() cannot "
                "change. Advance through iter(ds) / iter_batches without it (docs/sampling.md)"
            )
        return plan.advance(self.position(plan, draw_offset))

    def cut(self, window: Any) -> Any:
        """`window` ending where the window a loaded state was taken in ended, if it starts there."""
        pending = self.resume_end
        if pending is None or pending[0] is not getattr(window, "plan", None) or not window.start < pending[1]:
            return window
        return window.sub(0, min(window.length, pending[1] - window.start))

    def reads(self, window: Any, open_read: Callable[[Any], Iterator[Any]], batches: bool) -> Iterator[Any]:
        """The items of `window` read by `open_read`, in order: samples (`batches` False) or
        `SampleBatch`es. A window of another plan than a curriculum's is `open_read(window)` as
        it is; a curriculum's batches get their `stage`, the consumer's position is recorded as
        items are handed out, and the rest of the window is re-planned after an `advance()`
        (module docstring)."""
        plan = getattr(window, "plan", None)
        if not isinstance(plan, CurriculumPlan):
            return open_read(window)
        return self._curriculum_reads(window, open_read, batches)

    def _curriculum_reads(self, window: Any, open_read: Callable[[Any], Iterator[Any]], batches: bool) -> Iterator[Any]:
        plan: CurriculumPlan = window.plan
        end = window.start + window.length
        read = _Read(plan, window.start, end)
        self.live = read
        box: list[Any] = []
        try:
            finished = False
            while not finished and read.position < read.end:
                if plan.length is not None and plan.length < read.end:  # an advance moved a stopping plan's end
                    read.end = max(read.position, plan.length)
                    continue
                revision = plan.revision
                items = open_read(window.sub(read.position - window.start, read.end - read.position))
                try:
                    for item in items:
                        if plan.revision != revision:
                            break  # planned before an advance(): not handed out, re-planned below
                        if batches:
                            item.stage = plan.stage_info(read.position)
                            read.position += len(item)
                        else:
                            read.position += 1
                        box.append(item)
                        del item
                        # handed out from the box: while suspended this frame holds no batch, so the
                        # consumer's references alone decide when its ring slot returns
                        yield box.pop()
                        if plan.revision != revision:
                            break
                    else:
                        finished = True
                finally:
                    close = getattr(items, "close", None)
                    if close is not None:
                        close()
        finally:
            if self.live is read:
                self.live = None

    # -- the dataset's state ----------------------------------------------------------------------

    def state(self, plan: CurriculumPlan, draw_offset: int, epoch_len: int | None, identity: str) -> dict:
        """The dataset's resume state at the consumer's next unread position (under the lock)."""
        live = self.live if self.live is not None and self.live.plan is plan else None
        if live is not None:
            position, end = live.position, (live.end if live.position < live.end else None)
        else:
            pending = self.resume_end
            position, end = draw_offset, (pending[1] if pending is not None and pending[0] is plan else None)
        return {
            "kind": DATASET_STATE_KIND,
            "version": DATASET_STATE_VERSION,
            "sampling": identity,
            "epoch_len": epoch_len,
            "position": position,
            "window_end": end,
            "plan": plan.state_dict(position),
        }

    def load(self, plan: CurriculumPlan, state: Mapping[str, Any], identity: str) -> tuple[int, int | None]:
        """Check `state` against this dataset and load its plan state; returns (position,
        epoch_len) for the dataset to take. Nothing changes on error (under the lock)."""
        if not isinstance(state, Mapping) or state.get("kind") != DATASET_STATE_KIND:
            raise SamplingStateError(f"not a dataset state (expected kind {DATASET_STATE_KIND!r})")
        if state.get("version") != DATASET_STATE_VERSION:
            raise SamplingStateError(f"unsupported dataset state version {state.get('version')!r}")
        if self.live is not None and self.live.plan is plan:
            raise SamplingStateError(
                "load_state_dict(): an iterator of this dataset is still reading; close it (or let it finish) first"
            )
        if state.get("sampling") != identity:
            raise SamplingStateError(
                f"the state is of another order (state {state.get('sampling')!r}, here "
                f"{identity!r}): set the same curriculum over the same table first"
            )
        position, end, epoch_len = state.get("position"), state.get("window_end"), state.get("epoch_len")
        if type(position) is not int or position < 0 or not (end is None or (type(end) is int and end > position)):
            raise SamplingStateError(f"dataset state has an invalid position {position!r} or window_end {end!r}")
        if not (epoch_len is None or (type(epoch_len) is int and epoch_len >= 1)):
            raise SamplingStateError(f"dataset state has an invalid epoch_len {epoch_len!r}")
        plan_state = state.get("plan")
        if not isinstance(plan_state, Mapping) or plan_state.get("position") != position:
            raise SamplingStateError("dataset state: its plan state is not at its position")
        plan.load_state_dict(plan_state)
        self.resume_end = None if end is None else (plan, end)
        return position, epoch_len


def stage_of(plan: Any, position: int) -> StageInfo | None:
    """The `StageInfo` of `position` under `plan` (None: not a curriculum)."""
    return plan.stage_info(position) if isinstance(plan, CurriculumPlan) else None


@overload
def curriculum_plan(plan: Any, method: str) -> CurriculumPlan: ...
@overload
def curriculum_plan(plan: Any, method: None) -> CurriculumPlan | None: ...
def curriculum_plan(plan: Any, method: str | None) -> CurriculumPlan | None:
    """`plan` if it is a curriculum's; else None, or with `method` SamplingStateError naming it."""
    if isinstance(plan, CurriculumPlan):
        return plan
    if method is not None:
        raise SamplingStateError(
            f"{method} needs a curriculum (set_curriculum); other orders resume through the torch loaders' states"
        )
    return None
