"""Where cache files live: local paths, object stores (obstore) and the node-local shard cache.

Boundary: file names, sizes and digests; never the bytes' layout (format/) nor tables or plans.
Modules: `urls` (parse a cache path into a local Path or a RemoteLocation), `objects` (an
ObjectStore over one remote location: typed errors, retries, create-only puts, downloads),
`bridge` (obstore operations of a forked child run in a helper process), `secrets` (credential
redaction), `node_cache` (verified local copies shared by every process on a node). obstore is
imported only when a store is built.
"""
