"""Compiled kernels (built from _ext/*.pyx; typed by the *.pyi stubs beside them). Hot loops only:
draws (ChaCha8 shuffle draws), perm (exactly-once orders, quota interleave), codec (encoding,
per-cache codec states, XXH3), mapped (read-only file mappings), table (a reader's caches and
shards), gather (record and batch gathers), batch (chunk post-processing).

Boundary: no Polars, no Torch, no processes.
"""
