"""Pure planning (layer 3): which population row each plan position reads.

Boundary: numpy in, numpy out; no I/O, no Polars, no processes. Modules: `planner` (dataset-rt's
ordered window and shuffled draws, `Window`, `PlanWindow`), `permutation` (exactly-once epochs).
"""

from datasetrt.sampling.permutation import EpochPermutation, repeat_counts, stream_label
from datasetrt.sampling.planner import PlanWindow

__all__ = ["EpochPermutation", "PlanWindow", "repeat_counts", "stream_label"]
