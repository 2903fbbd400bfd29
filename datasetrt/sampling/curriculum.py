"""Curricula: an ordered list of stages, each a `Mixture` and a length, changing at batch boundaries.

Boundary: plain values and numpy arrays (through plans.py); no Polars, no I/O, no processes.

Streams are shared by name across stages (their definitions must agree), and a stream continues
where it stopped: its position and epoch carry over from stage to stage. `CurriculumPlan` is the
one mutable plan: `advance(position)` ends the current stage at the first batch boundary at or
after `position` (positions before it keep their rows) and starts the next stage there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from datasetrt.errors import ArgumentTypeError, SamplingConfigError, SamplingStateError
from datasetrt.sampling.locality import Locality
from datasetrt.sampling.mixture import Mixture, Stream, StreamRows
from datasetrt.sampling.plans import SegmentedPlan, _stage_of


@dataclass(frozen=True, slots=True)
class StageInfo:
    """A curriculum stage as reads report it: its `index` in the curriculum and its `name`
    (`SampleBatch.stage`, `CachedDataset.stage`; docs/sampling.md). Immutable, compared and
    hashed by value."""

    index: int
    name: str


StageInfo.__module__ = "datasetrt.api"


@dataclass(frozen=True)
class Stage:
    """A curriculum stage: a mixture for `samples` samples or `batches` batches (give one; the
    last stage may give neither: it runs until the plan ends). `name` defaults to "stage<i>"."""

    mixture: Mixture
    samples: int | None = None
    batches: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mixture, Mixture):
            raise ArgumentTypeError(f"a Stage needs a Mixture, got {type(self.mixture).__name__}")
        if self.samples is not None and self.batches is not None:
            raise SamplingConfigError("give a stage's length in samples or in batches, not both")
        for key in ("samples", "batches"):
            value = getattr(self, key)
            if value is not None and (type(value) is not int or value < 0):
                raise SamplingConfigError(f"a stage's {key} must be an integer >= 0, got {value!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ArgumentTypeError(f"a stage name must be a non-empty string, got {self.name!r}")


class Curriculum:
    """Stages in order, with the batch size their lengths and boundaries are counted in.

    Every stage length is a whole number of batches (`samples` must be a multiple of
    `batch_size`), so each batch comes from one stage whatever the number of ranks or workers.
    All stages share one `order`; a stream named in several stages must be the same `Stream`.
    """

    __slots__ = ("stages", "batch_size", "names", "streams", "order")

    def __init__(self, stages: Sequence[Stage], *, batch_size: int) -> None:
        if type(batch_size) is not int or batch_size < 1:
            raise SamplingConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        stages = list(stages)
        if not stages:
            raise SamplingConfigError("a curriculum needs at least one stage")
        names: list[str] = []
        streams: dict[str, Stream] = {}
        owner: dict[str, str] = {}
        for i, stage in enumerate(stages):
            if not isinstance(stage, Stage):
                raise ArgumentTypeError(f"stage {i} must be a Stage, got {type(stage).__name__}")
            name = stage.name or f"stage{i}"
            if name in names:
                raise SamplingConfigError(f"two stages are named {name!r}")
            names.append(name)
            if stage.mixture.order != stages[0].mixture.order:
                raise SamplingConfigError(
                    f"stage {i} ({name!r}) has order {stage.mixture.order!r}, stage 0 has "
                    f"{stages[0].mixture.order!r}: a curriculum uses one order"
                )
            if stage.samples is not None and stage.samples % batch_size:
                raise SamplingConfigError(
                    f"stage {i} ({name!r}): {stage.samples} samples is not a whole number of batches of {batch_size}"
                )
            if stage.samples is None and stage.batches is None and i + 1 < len(stages):
                raise SamplingConfigError(
                    f"stage {i} ({name!r}) has no length; only the last stage may run until the plan ends"
                )
            for sname, stream in stage.mixture.streams.items():
                if sname in streams and streams[sname] != stream:
                    raise SamplingConfigError(
                        f"stream {sname!r} is {stream.describe()} in stage {i} ({name!r}) but "
                        f"{streams[sname].describe()} in stage {owner[sname]!r}"
                    )
                streams.setdefault(sname, stream)
                owner.setdefault(sname, name)
        self.stages = tuple(stages)
        self.batch_size = batch_size
        self.names = tuple(names)
        self.streams = streams
        self.order = stages[0].mixture.order

    def samples(self, i: int) -> int | None:
        """Length of stage i in samples (None: until the plan ends)."""
        stage = self.stages[i]
        return stage.batches * self.batch_size if stage.batches is not None else stage.samples

    def __repr__(self) -> str:
        return f"Curriculum({list(self.names)!r}, batch_size={self.batch_size})"


class CurriculumPlan(SegmentedPlan):
    """The plan of a `Curriculum` over resolved `StreamRows` under `seed`.

    Adds to the shared plan (rows, streams_at, stages_at, stage_at, progress, state_dict,
    load_state_dict): `advance(position)` and `stage_info(position)`. The state records the current stage, its start (and end
    when advanced), the per-stream positions at its start, and the position: resuming from it
    gives the same rows as the run it was taken from, across stage boundaries and advances.
    """

    KIND = "datasetrt.sampling.curriculum"

    def __init__(
        self, curriculum: Curriculum, streams: StreamRows, seed: int, *, locality: Locality | None = None
    ) -> None:
        if not isinstance(curriculum, Curriculum):
            raise SamplingConfigError(f"CurriculumPlan needs a Curriculum, got {type(curriculum).__name__}")
        names = tuple(curriculum.streams)
        specs = [
            _stage_of(stage.mixture, names, curriculum.names[i], curriculum.samples(i))
            for i, stage in enumerate(curriculum.stages)
        ]
        super().__init__(names, specs, streams, seed, curriculum.order, curriculum.batch_size, locality)
        self.curriculum = curriculum

    def advance(self, position: int) -> int:
        """Move to the next stage early: the stage holding `position` (the next sample to
        deliver) ends at the first batch boundary at or after it; returns that boundary (where the
        next stage starts). Rows before it are unchanged. Refused on the last stage."""
        if type(position) is not int or position < 0:
            raise SamplingStateError(f"advance(): invalid position {position!r}")
        segments = self._segments
        index = self._locate(position, segments)
        seg = segments[index]
        if seg.stage + 1 == len(self.stages):
            raise SamplingStateError(
                f"advance(): stage {seg.stage} ({self.stages[seg.stage].name!r}) is the last stage"
            )
        boundary = -(-position // self.batch_size) * self.batch_size
        if seg.end is not None and boundary >= seg.end:
            return seg.end  # the stage already ends within this batch
        self._segments = segments[:index] + self._chain(replace(seg, end=boundary))
        self.revision += 1
        return boundary

    def stage_info(self, position: int) -> StageInfo:
        """The `StageInfo` (index, name) of the stage plan position `position` belongs to."""
        stage = self.stage_at(position)
        return StageInfo(stage, self.curriculum.names[stage])


def order_identity(order: Mixture | Curriculum, streams: StreamRows) -> str:
    """ "mixture:" or "curriculum:" and a BLAKE2b-128 digest (hex) of the configuration: streams,
    their rows and weights, proportions, options, stages. Resume states compare it."""
    if isinstance(order, Curriculum):
        kind, parts = (
            "curriculum",
            [
                f"{order!r}",
                *(
                    f"{name}:{stage.mixture!r}:{order.samples(i)}"
                    for i, (name, stage) in enumerate(zip(order.names, order.stages))
                ),
            ],
        )
    else:
        kind, parts = "mixture", [repr(order)]
    h = hashlib.blake2b("|".join(parts).encode(), digest_size=16)
    for name, stream in order.streams.items():
        h.update(f"|{name}|{stream.describe()}|{streams.digest(name)}".encode())
    return f"{kind}:{h.hexdigest()}"
