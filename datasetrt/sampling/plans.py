"""Mixture plans: plan position -> stream (quota interleave) -> that stream's own order -> population row.

Boundary: numpy in, numpy out; no Polars, no I/O, no processes. The hot loops are
`datasetrt._native.perm` (interleave table, Feistel orders) and `datasetrt._native.draws`.

Position model. A plan is a run of segments, one per stage (a mixture is one stage). Segment g
covers plan positions [start_g, end_g) (end None: unbounded) and holds `bases_g[s]`, the samples
stream s delivered before start_g. At relative position r the segment picks stream
`sched_g[r mod D_g]` (one period of the quota interleave of the stage's integer weights), and
stream s's c-th pick in the segment reads stream position `bases_g[s] + c` of its own order:
element `j mod L_s` of stream epoch `j // L_s` (an exactly-once permutation keyed by the stream's
name, or weighted draws `j`; with a `Locality`, the stream's locality-aware exactly-once order
over its rows' shards, locality.py, keyed by its name too). So rows of any position range cost O(count + streams log D), with
no state beyond integers: a resume point is (stage, start, end, bases, position).

Guarantee (per segment): after n samples, stream s has delivered within 1 of n x p_s, for every
n (the quota method; tests/unit/sampling/test_plans.py checks it against a sequential simulation).

Size: over 500 lines because mixtures and curricula share one segment model (positions, bases,
resume states, validation on load); splitting them would split that model across modules.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeGuard

import numpy as np

from datasetrt._native import draws, perm
from datasetrt.errors import PlanRangeError, SamplingConfigError, SamplingStateError, UnknownStreamError
from datasetrt.sampling.locality import Locality, LocalityPermutation
from datasetrt.sampling.mixture import Mixture, StreamRows
from datasetrt.sampling.permutation import MAX_POSITIONS_PER_EPOCH, repeat_counts, stream_label

STATE_VERSION = 1
MAX_POSITION = (1 << 63) - 1


@dataclass(frozen=True)
class StageSpec:
    """One stage as the plan needs it: integer weights over the plan's streams (sum = period),
    its length in samples (None: until the plan ends) and what happens when a stream runs out."""

    name: str
    weights: tuple[int, ...]
    period: int
    samples: int | None
    on_exhausted: str


@dataclass(frozen=True)
class StreamProgress:
    """Where a stream is at a plan position: samples it delivered, its epoch and the position in it."""

    name: str
    samples: int
    epoch: int
    epoch_position: int


@functools.lru_cache(maxsize=32)
def _interleave(weights: tuple[int, ...]) -> perm.Interleave:
    """The (shared, immutable) interleave period of integer weights; built in O(D x streams)."""
    return perm.Interleave(np.array(weights, dtype=np.int64))


class _Draws:
    """A weighted stream's with-replacement draws: stream position j is draw j of its own draw
    stream (`stream_seed(seed, label)`), uniform over its rows when every weight is 1."""

    __slots__ = ("rows_of", "seed", "cum_scale")

    def __init__(self, name: str, rows: range | np.ndarray, weights: np.ndarray | None, seed: int) -> None:
        self.rows_of = rows
        self.seed = perm.stream_seed(seed, stream_label(name))
        self.cum_scale = None if weights is None or bool((weights == 1.0).all()) else draws.weighted_cumulative(weights)

    def rows(self, first: int, count: int) -> np.ndarray:
        if self.cum_scale is None:
            local = draws.uniform_draws(self.seed, len(self.rows_of), first, count)
        else:
            local = draws.weighted_draws(self.seed, self.cum_scale[0], self.cum_scale[1], first, count)
        rows_of = self.rows_of
        return local.astype(np.int64) + rows_of.start if isinstance(rows_of, range) else rows_of[local]


class _LocalStream:
    """An exactly-once stream read in its locality-aware order: stream position j is plan
    position j of `order` (over the stream's rows), mapped to population rows."""

    __slots__ = ("rows_of", "order")

    def __init__(self, rows: range | np.ndarray, order: LocalityPermutation) -> None:
        self.rows_of, self.order = rows, order

    def rows(self, first: int, count: int) -> np.ndarray:
        local = self.order.rows(first, count)
        rows_of = self.rows_of
        return local + rows_of.start if isinstance(rows_of, range) else rows_of[local]


def _contiguous(rows: range | np.ndarray) -> range | np.ndarray:
    """`rows` as a range when they are consecutive (a cache of the physical table): no array."""
    if isinstance(rows, range):
        return rows
    if int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool((np.diff(rows) == 1).all()):
        return range(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _row_namer(streams: StreamRows, name: str) -> Callable[[int], str]:
    """How a refusal names row i of stream `name`: the stream, the row and its table row."""
    return lambda i: f"stream {name!r} row {i} (table row {int(streams.rows[name][i])})"


def _stream_tables(
    names: tuple[str, ...], streams: StreamRows, order: str, seed: int, locality: Locality | None = None
) -> tuple[perm.StreamTables, Sequence[_Draws | _LocalStream] | None, np.ndarray]:
    """The kernel's per-stream tables (the streams' row arrays, referenced; the running sums of
    repeat counts for exactly-once streams, refusing non-integer weights), the streams the kernel
    leaves to Python (weighted streams' draws, or every stream's locality order: the kernel then
    writes stream positions) and the stream positions per stream epoch (int64). O(rows) once per
    plan."""
    permuted = order == "permutation"
    if locality is not None and not permuted:
        raise SamplingConfigError(
            f"sampling='locality' reads each stream in exactly-once epochs; a mixture with order={order!r} "
            "draws with replacement over every shard (use order='permutation')"
        )
    counts_of: list[np.ndarray | None] = []
    for name in names:
        weights = streams.weights[name] if permuted else None
        counts_of.append(None if weights is None else repeat_counts(weights, _row_namer(streams, name)))
    ends = [None if c is None else np.cumsum(c) for c in counts_of]
    if any(e is not None and int(e[-1]) > MAX_POSITIONS_PER_EPOCH for e in ends):
        raise SamplingConfigError("a stream has more than 2**62 positions per epoch")
    rows = [_contiguous(streams.rows[n]) for n in names]
    labels = [stream_label(n) for n in names]
    if locality is not None:
        local: list[_LocalStream] = []
        for rows_of, counts, label in zip(rows, counts_of, labels):
            blocks = locality.blocks[slice(rows_of.start, rows_of.stop) if isinstance(rows_of, range) else rows_of]
            order_of = LocalityPermutation(seed, blocks, locality.window_blocks, counts, label=label)
            local.append(_LocalStream(rows_of, order_of))
        tables = perm.StreamTables(labels, rows, [None] * len(names), False)
        return tables, local, np.array([s.order.positions_per_epoch for s in local], dtype=np.int64)
    tables = perm.StreamTables(labels, rows, ends, permuted)
    if permuted:
        return tables, None, tables.per_epoch
    return tables, [_Draws(n, streams.rows[n], streams.weights[n], seed) for n in names], tables.per_epoch


@dataclass(frozen=True)
class _Segment:
    stage: int
    start: int
    end: int | None
    bases: np.ndarray  # int64 per stream: samples delivered before `start`
    inter: perm.Interleave


def _stage_of(mixture: Mixture, names: tuple[str, ...], name: str, samples: int | None) -> StageSpec:
    weights = dict(zip(mixture.names, mixture.weights))
    return StageSpec(name, tuple(weights.get(s, 0) for s in names), mixture.period, samples, mixture.on_exhausted)


class SegmentedPlan:
    """The shared engine of MixturePlan and CurriculumPlan (see the module docstring).

    `rows(first, count)` -> int64 population rows; `streams_at` -> int16 stream index per position;
    `stages_at` -> int16 stage index per position; `progress(position)` -> per-stream samples and
    epochs; `state_dict(position)` / `load_state_dict(state)` -> position. `batch_size` aligns
    stage boundaries (1 for a plain mixture). With `locality` (order "permutation" only), each
    stream's exactly-once epochs follow its locality-aware order (`LocalityPermutation` over the
    stream's rows and their blocks, keyed by the stream's name); the state then names the window
    size and each stream's blocks, and a state of other blocks is refused.
    """

    KIND = "datasetrt.sampling.plan"

    def __init__(
        self,
        names: tuple[str, ...],
        stages: Sequence[StageSpec],
        streams: StreamRows,
        seed: int,
        order: str,
        batch_size: int = 1,
        locality: Locality | None = None,
    ) -> None:
        if type(seed) is not int or not 0 <= seed < 1 << 64:
            raise SamplingConfigError(f"seed must be a u64, got {seed!r}")
        missing = [n for n in names if n not in streams.rows]
        if missing:
            raise UnknownStreamError(
                f"no rows were resolved for stream {missing[0]!r}; resolved: {list(streams.names)!r}"
            )
        self.names = names
        self.stages = tuple(stages)
        self.seed = seed
        self.order = order
        self.batch_size = batch_size
        self._streams = streams
        self._tables, self._finish, sizes = _stream_tables(names, streams, order, seed, locality)
        sizes.flags.writeable = False
        self.stream_sizes = sizes  # stream positions per stream epoch (int64)
        self.window_blocks = None if locality is None else locality.window_blocks
        self._block_digests: list[str] | None = None
        self._segments = self._chain(self._segment(0, 0, np.zeros(len(names), dtype=np.int64)))
        self.revision = 0  # +1 at every advance() or load_state_dict(): rows planned before may be stale

    # -- segments -------------------------------------------------------------------------------
    # `_segments` is an immutable tuple from the plan's first reachable stage to its last, replaced
    # as a whole by advance() and load_state_dict() (which bump `revision`): a reader holding the
    # old tuple stays consistent, and a reader that planned ahead compares revisions to re-plan.

    def _segment(self, stage: int, start: int, bases: np.ndarray, end: int | None = None) -> _Segment:
        """Segment of `stage` from `start` with `bases`; its natural end unless `end` is given."""
        spec = self.stages[stage]
        inter = _interleave(spec.weights)
        if end is None:
            end = self._natural_end(stage, start, bases, inter)
        bases.flags.writeable = False
        return _Segment(stage, start, end, bases, inter)

    def _natural_end(self, stage: int, start: int, bases: np.ndarray, inter: perm.Interleave) -> int | None:
        spec = self.stages[stage]
        end = None if spec.samples is None else start + spec.samples
        if spec.on_exhausted == "stop":
            left = self.stream_sizes - bases % self.stream_sizes  # samples left in each stream's epoch, >= 1
            stop = min(inter.position_of(s, int(left[s])) for s in np.flatnonzero(inter.weights).tolist())
            if stage + 1 < len(self.stages):
                stop -= stop % self.batch_size  # a stage change happens at a batch boundary
            end = start + stop if end is None else min(end, start + stop)
        return end

    def _chain(self, first: _Segment) -> tuple[_Segment, ...]:
        """`first` and the segments of the stages after it, up to the plan's end. O(stages x
        streams log D)."""
        chain = [first]
        last = first
        while last.end is not None and last.stage + 1 < len(self.stages):
            bases = last.bases + last.inter.count_before(last.end - last.start)
            last = self._segment(last.stage + 1, last.end, bases)
            chain.append(last)
        return tuple(chain)

    @property
    def length(self) -> int | None:
        """Plan positions in all (None: unbounded)."""
        return self._segments[-1].end

    def _locate(self, position: int, segments: tuple[_Segment, ...] | None = None) -> int:
        """Index of the segment holding `position` (start <= position < end); the last segment
        for the end position of a finite plan. Empty segments are skipped."""
        segments = segments or self._segments
        if position < segments[0].start:
            raise PlanRangeError(
                f"position {position} is before this plan's first stage start "
                f"{segments[0].start} (a resumed plan starts at its state's stage)"
            )
        for i in range(len(segments) - 1, -1, -1):
            seg = segments[i]
            if seg.start <= position and (seg.end is None or position < seg.end):
                return i
        if position == segments[-1].end:
            return len(segments) - 1
        raise PlanRangeError(f"position {position} is past the end of the plan ({segments[-1].end} positions)")

    def _segment_at(self, position: int) -> _Segment:
        segments = self._segments
        return segments[self._locate(position, segments)]

    def _pieces(self, first: int, count: int):
        """(segment, first, count) pieces covering positions [first, first+count)."""
        if type(first) is not int or type(count) is not int or first < 0 or count < 0 or first + count > MAX_POSITION:
            raise PlanRangeError(f"invalid plan range first={first!r} count={count!r}")
        segments = self._segments
        while count > 0:
            seg = segments[self._locate(first, segments)]
            take = count if seg.end is None else min(count, seg.end - first)
            if take <= 0:
                raise PlanRangeError(f"positions [{first}, {first + count}) run past the end of the plan ({seg.end})")
            yield seg, first, take
            first, count = first + take, count - take

    # -- rows -----------------------------------------------------------------------------------

    def rows(self, first: int, count: int) -> np.ndarray:
        """Population rows (int64) of plan positions [first, first+count). O(count + streams log D)."""
        parts = [self._segment_rows(seg, a, n) for seg, a, n in self._pieces(first, count)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _segment_rows(self, seg: _Segment, first: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        picks = np.empty(count, dtype=np.int16)
        self._tables.block(self.seed, seg.inter, first - seg.start, seg.bases, out, picks)
        if self._finish is not None:  # weighted or locality streams: the kernel wrote stream positions
            for s, stream in enumerate(self._finish):
                where = np.flatnonzero(picks == s)
                if where.size:  # a stream's picks in a segment read consecutive stream positions
                    out[where] = stream.rows(int(out[where[0]]), len(where))
        return out

    def streams_at(self, first: int, count: int) -> np.ndarray:
        """Stream index (int16, into `names`) of plan positions [first, first+count)."""
        parts = [seg.inter.picks(a - seg.start, n) for seg, a, n in self._pieces(first, count)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int16)

    def stages_at(self, first: int, count: int) -> np.ndarray:
        """Stage index (int16) of plan positions [first, first+count)."""
        parts = [np.full(n, seg.stage, dtype=np.int16) for seg, _a, n in self._pieces(first, count)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int16)

    def stage_at(self, position: int) -> int:
        """The stage plan position `position` belongs to (the last stage at the plan's end)."""
        return self._segment_at(position).stage

    def stream_positions(self, position: int) -> np.ndarray:
        """Samples each stream delivered before plan position `position` (int64, `names` order)."""
        seg = self._segment_at(position)
        return seg.bases + seg.inter.count_before(position - seg.start)

    def progress(self, position: int) -> tuple[StreamProgress, ...]:
        """Per stream: samples delivered before `position`, its current epoch and position in it."""
        done = self.stream_positions(position).tolist()
        sizes = self.stream_sizes.tolist()
        return tuple(StreamProgress(n, j, j // L, j % L) for n, j, L in zip(self.names, done, sizes))

    # -- state ----------------------------------------------------------------------------------

    @property
    def order_name(self) -> str:
        """How the streams are ordered: "permutation", "weighted" or "locality:<window blocks>"."""
        return self.order if self.window_blocks is None else f"locality:{self.window_blocks}"

    def block_digests(self) -> list[str] | None:
        """Per stream, `blocks_digest` of its rows' blocks (None without locality); computed once."""
        if self._block_digests is None and self.window_blocks is not None:
            self._block_digests = [s.order.blocks_digest() for s in self._finish or () if isinstance(s, _LocalStream)]
        return self._block_digests

    def _identity(self) -> dict:
        identity = self._base_identity()
        if self.window_blocks is not None:  # absent otherwise: states of other orders are unchanged
            identity["locality"] = {"window_blocks": self.window_blocks, "stream_blocks": self.block_digests()}
        return identity

    def _base_identity(self) -> dict:
        return {
            "seed": self.seed,
            "order": self.order,
            "batch_size": self.batch_size,
            "streams": list(self.names),
            "stream_sizes": self.stream_sizes.tolist(),
            "stream_digests": [self._streams.digest(n) for n in self.names],
            "stages": [
                {
                    "name": s.name,
                    "weights": list(s.weights),
                    "period": s.period,
                    "samples": s.samples,
                    "on_exhausted": s.on_exhausted,
                }
                for s in self.stages
            ],
        }

    def state_dict(self, position: int) -> dict:
        """The plan at `position` (the next sample to deliver) as plain ints, strings and lists:
        identity (fingerprint, seed, order, batch_size, streams, stream_sizes, stream_digests,
        stages) and position (position, stage, stage_start, stage_end, stage_stream_positions,
        stream_positions, stream_epochs). JSON- and torch.save-able."""
        seg = self._segment_at(position)
        done = seg.bases + seg.inter.count_before(position - seg.start)
        identity = self._identity()
        return {
            "kind": self.KIND,
            "version": STATE_VERSION,
            "fingerprint": _fingerprint(identity),
            **identity,
            "position": position,
            "stage": seg.stage,
            "stage_start": seg.start,
            "stage_end": seg.end,
            "stage_stream_positions": seg.bases.tolist(),
            "stream_positions": done.tolist(),
            "stream_epochs": (done // self.stream_sizes).tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> int:
        """Continue from `state` (taken by `state_dict` on an equal plan); returns its position.
        A state of another plan is refused naming the first difference; the plan is unchanged
        on any error."""
        if not isinstance(state, Mapping) or state.get("kind") != self.KIND:
            raise SamplingStateError(
                f"not a {self.KIND} state (kind {state.get('kind') if isinstance(state, Mapping) else None!r})"
            )
        if state.get("version") != STATE_VERSION:
            raise SamplingStateError(f"unsupported sampling state version {state.get('version')!r}")
        mine = self._identity()
        diff = _difference(state, mine, self.names)
        if diff is not None:
            raise SamplingStateError(f"sampling state does not match this plan: {diff}")
        if state.get("fingerprint") != _fingerprint(mine):
            raise SamplingStateError("sampling state does not match this plan: its fingerprint differs (edited state)")
        segment, position = self._resume_point(state)
        self._segments = self._chain(segment)
        self.revision += 1
        return position

    def _resume_point(self, state: Mapping[str, Any]) -> tuple[_Segment, int]:
        m = len(self.names)
        stage, start, end, position = (state.get(k) for k in ("stage", "stage_start", "stage_end", "position"))
        bases = state.get("stage_stream_positions")
        if (
            not (_count(stage) and _count(start) and _count(position))
            or stage >= len(self.stages)
            or position > MAX_POSITION
        ):
            raise SamplingStateError("sampling state has an invalid stage or position")
        if not (isinstance(bases, list) and len(bases) == m and all(type(b) is int and b >= 0 for b in bases)):
            raise SamplingStateError("sampling state has invalid stage_stream_positions")
        if start % self.batch_size or position < start:
            raise SamplingStateError(
                f"sampling state: stage_start {start} is not a batch boundary at or before position {position}"
            )
        bases_arr = np.array(bases, dtype=np.int64)
        natural = self._segment(stage, start, bases_arr)
        if end is not None:
            if type(end) is not int or position > end or (natural.end is not None and end > natural.end):
                raise SamplingStateError(f"sampling state: stage_end {end!r} is outside the stage")
            if end != natural.end and end % self.batch_size:
                raise SamplingStateError(f"sampling state: stage_end {end} is not a batch boundary")
        elif natural.end is not None:
            raise SamplingStateError("sampling state: stage_end is missing for a bounded stage")
        segment = _Segment(stage, start, end, bases_arr, natural.inter)
        done = bases_arr + natural.inter.count_before(position - start)
        if state.get("stream_positions") != done.tolist():
            raise SamplingStateError(
                "sampling state is inconsistent: stream_positions do not follow from the stage start and position"
            )
        epochs = (done // self.stream_sizes).tolist()
        if state.get("stream_epochs") != epochs:
            raise SamplingStateError(
                f"sampling state is inconsistent: stream_epochs {state.get('stream_epochs')!r} do not follow "
                f"from stream_positions (expected {epochs})"
            )
        return segment, position


def _count(value: object) -> TypeGuard[int]:
    """True for an int >= 0 of exactly type int (not a bool): what a state's stage and positions hold."""
    return type(value) is int and value >= 0


def _fingerprint(identity: dict) -> str:
    return hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=16).hexdigest()


def _difference(state: Mapping[str, Any], mine: dict, names: tuple[str, ...]) -> str | None:
    """The first difference between a state's identity and this plan's, in words (None: equal)."""
    for key in ("streams", "stream_sizes", "seed", "order", "batch_size"):
        if state.get(key) != mine[key]:
            return f"{key.replace('_', ' ')} differ (state {state.get(key)!r}, here {mine[key]!r})"
    diff = _locality_difference(state.get("locality"), mine.get("locality"), names)
    if diff is not None:
        return diff
    for name, theirs, ours in zip(names, state.get("stream_digests") or [None] * len(names), mine["stream_digests"]):
        if theirs != ours:
            return f"the rows or weights of stream {name!r} differ"
    stages = state.get("stages")
    if not isinstance(stages, list) or len(stages) != len(mine["stages"]):
        return f"the number of stages differs (state {len(stages) if isinstance(stages, list) else stages!r}, here {len(mine['stages'])})"
    for g, (theirs, ours) in enumerate(zip(stages, mine["stages"])):
        where = f"stage {g} ({ours['name']!r})"
        if not isinstance(theirs, Mapping):
            return f"{where} is not a stage"
        for key in ("name", "samples", "on_exhausted"):
            if theirs.get(key) != ours[key]:
                return f"{where}: {key} differs (state {theirs.get(key)!r}, here {ours[key]!r})"
        try:
            theirs_p = [Fraction(w, theirs["period"]) for w in theirs["weights"]]
        except (KeyError, TypeError, ZeroDivisionError):
            return f"{where}: its proportions are unreadable"
        ours_p = [Fraction(w, ours["period"]) for w in ours["weights"]]
        for name, a, b in zip(names, theirs_p, ours_p):
            if a != b:
                return f"{where}: the proportion of stream {name!r} differs (state {a}, here {b})"
        if len(theirs_p) != len(ours_p):
            return f"{where}: the proportions differ"
    return None


def _locality_difference(theirs: Any, ours: dict | None, names: tuple[str, ...]) -> str | None:
    """The first difference between a state's locality identity and this plan's (None: equal)."""
    if theirs == ours:
        return None
    if not isinstance(theirs, Mapping) or ours is None:
        return f"the stream orders differ (state locality {theirs!r}, here {ours!r})"
    if theirs.get("window_blocks") != ours["window_blocks"]:
        return (
            f"the locality window differs (state {theirs.get('window_blocks')!r} shards, here {ours['window_blocks']})"
        )
    blocks = theirs.get("stream_blocks")
    for name, a, b in zip(names, blocks if isinstance(blocks, list) else [None] * len(names), ours["stream_blocks"]):
        if a != b:
            return f"the shards of the rows of stream {name!r} differ"
    return "the locality orders differ"


class MixturePlan(SegmentedPlan):
    """The plan of one `Mixture` over resolved `StreamRows` under `seed`: a single unbounded stage
    (bounded with on_exhausted="stop": the plan ends at the first position whose stream has
    completed its epoch)."""

    KIND = "datasetrt.sampling.mixture"

    def __init__(self, mixture: Mixture, streams: StreamRows, seed: int, *, locality: Locality | None = None) -> None:
        if not isinstance(mixture, Mixture):
            raise SamplingConfigError(f"MixturePlan needs a Mixture, got {type(mixture).__name__}")
        names = mixture.names
        stages = [_stage_of(mixture, names, "mixture", None)]
        super().__init__(names, stages, streams, seed, mixture.order, locality=locality)
        self.mixture = mixture
