"""The metadata table: the caches' catalog, the Polars/Arrow table users filter and reweight, its
validation, and its grouping into the streams of a mixture.

Boundary: tables and rows; no processes and no payload bytes. Layer 3 of docs/architecture.md.
"""
