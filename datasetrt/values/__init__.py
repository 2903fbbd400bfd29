"""Layer 1: the values every layer shares, with no I/O.

`config` (frozen pydantic configurations: `ReaderConfig`, `WriterConfig`, `PayloadSpec`, ...),
`codecs` (the codec table), `payloads` (the typed-payload rules, numpy-free for reader workers),
`arrays` (typed views of a batch's bytes, tensors through a lazy torch import) and `records`
(`CacheInput`, `CachedSample`, the source protocols).

Boundary: imports only `datasetrt.errors`, `datasetrt._native` and third-party value libraries.
"""
