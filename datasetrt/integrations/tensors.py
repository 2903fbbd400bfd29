"""numpy batch arrays -> torch tensors sharing their memory (`SampleBatch.to_torch`).

Boundary: torch (imported here, lazily by the caller) and numpy arrays in; no datasetrt
internals. `torch.from_numpy` keeps the array, and so the batch's buffer or ring slot, alive for
as long as the tensor lives (no copy).
"""

from __future__ import annotations

from typing import Any

from datasetrt.arrays import RaggedArrays


def as_tensors(value: Any) -> Any:
    """A numpy array as a tensor over the same memory, or `RaggedArrays` of them."""
    import torch

    if isinstance(value, RaggedArrays):
        return RaggedArrays(*(torch.from_numpy(v) for v in value))
    return torch.from_numpy(value)
