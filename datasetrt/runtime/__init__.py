"""Reading planned rows: in-process gathers, reader worker processes, shared-memory rings, the
reorder of completions into plan order, the memory bound, and the plan-driven shard prefetch.

Boundary: windows and caches in, chunks and batches out; never Polars or torch (reader workers
import only what `tests/unit/test_layers.py` allows them). Layer 4 of docs/architecture.md.
"""
