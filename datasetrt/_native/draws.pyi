"""Stub of datasetrt._native.draws (_ext/draws.pyx): dataset-rt 0.4.8's shuffle draws."""

from typing import Any

import numpy as np

from datasetrt._native._buffers import BufferLike

def uniform_draws(seed: int, n: int, start: int, count: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Draws start .. start+count-1 of gen_range(0..n): uint64, each in [0, n)."""

def weighted_cumulative(weights: BufferLike) -> tuple[np.ndarray[Any, np.dtype[np.float64]], float]:
    """(cum, scale): the n-1 running sums (float64) and rand's UniformFloat scale of the float64 weights."""

def weighted_draws(
    seed: int, cum: BufferLike, scale: float, start: int, count: int
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Draws start .. start+count-1 of WeightedIndex<f64> over weighted_cumulative's tables: uint64 positions."""

def derive_seed(common: int, rank: int, worker: int) -> int:
    """dataset-rt's per-(rank, worker) seed."""
