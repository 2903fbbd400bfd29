"""Layer 5: the dataset and the runtime that orchestrate every layer below.

`cached` (`CachedDataset`: the sampling state, its windows and the public reads), `runtime`
(`DatasetRuntime`: writer threads and reader processes shared by writes and datasets), `stages`
(a curriculum's live read, `advance()`, the dataset's resume state) and `seam` (the value types
and protocol of the integration seam).

Boundary: no byte layouts (format/), slot layouts or processes (runtime/) of its own; the public
names are `datasetrt.api`'s.
"""
