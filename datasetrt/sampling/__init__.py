"""Pure planning (layer 3): which population row each plan position reads.

Boundary: numpy in, numpy out; no I/O, no Polars, no processes. Modules: `planner` (dataset-rt's
ordered window and shuffled draws, `Window`, `PlanWindow`), `permutation` (exactly-once epochs),
`locality` (exactly-once epochs read a window of shards at a time), `mixture` (streams,
proportions, resolved stream rows), `plans` (mixture plans and their state; streams in
locality-aware epochs with a `Locality`), `curriculum` (stages), `orders` (which plan a
population's windows follow). docs/sampling.md describes the modes and their guarantees.
"""

from datasetrt.sampling.curriculum import Curriculum, CurriculumPlan, Stage, StageInfo
from datasetrt.sampling.mixture import Mixture, Stream, StreamRows
from datasetrt.sampling.permutation import EpochPermutation, repeat_counts, stream_label
from datasetrt.sampling.planner import PlanWindow
from datasetrt.sampling.plans import MixturePlan, StreamProgress

__all__ = [
    "Curriculum",
    "CurriculumPlan",
    "EpochPermutation",
    "Mixture",
    "MixturePlan",
    "PlanWindow",
    "Stage",
    "StageInfo",
    "Stream",
    "StreamProgress",
    "StreamRows",
    "repeat_counts",
    "stream_label",
]
