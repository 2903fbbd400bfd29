"""Compiled kernels (built from _ext/*.pyx): draws, codec, gather. Hot loops only.

Boundary: no Polars, no Torch, no processes.
"""
