"""The on-disk contract of a cache: file names and byte layouts, the manifest, the writer and the
reader, deep validation, migration, and publishing to an object-store prefix (docs/storage-format.md).

Boundary: files and bytes; no tables, sampling or processes (layer 2 of docs/architecture.md).
"""
