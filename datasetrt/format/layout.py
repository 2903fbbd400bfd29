"""Names, sizes and identities of the on-disk cache contract (format v3, dataset-rt compatible).

Boundary: pure constants and functions; no I/O.
"""

from __future__ import annotations

import re

FORMAT_VERSION = 3
SUPPORTED_FORMAT_VERSIONS = (2, 3)

MANIFEST_NAME = "manifest.json"
METADATA_NAME = "metadata.arrow"
INDEX_NAME = "index.bin"
SHARDS_DIR = "shards"
STAGING_DIR = "tmp"
# datasetrt's per-record checksum sidecar; named in the manifest's "datasetrt" extension field,
# which dataset-rt ignores.
CHECKSUMS_NAME = "checksums.xxh3"
CHECKSUM_ALGO = "xxh3_64"
# The zstd_dict codec's trained dictionary (format/dictionary.py), named in the same field.
DICTIONARY_NAME = "dictionary.zstd"

# Record sizes; the kernels use their twin, _ext/layout.pxd.
INDEX_ROW_BYTES = 24  # u64 LE shard_id | u64 LE offset | u64 LE byte_len
CHECKSUM_ROW_BYTES = 8  # u64 LE XXH3-64 of the whole stored record
RECORD_HEADER_BYTES = 8  # u64 LE json_len

SHARD_NAME_RE = re.compile(r"^[0-9]{6,}\.bin$")
U63_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1

METADATA_KINDS = ("bool", "int", "float", "string")
IDENTITY_COLUMNS = ("cache_id", "sample_id")
WEIGHT_COLUMN = "weight"
RESERVED_COLUMNS = frozenset((*IDENTITY_COLUMNS, WEIGHT_COLUMN))


def shard_name(shard_id: int) -> str:
    """File name of shard `shard_id` under shards/: zero-padded to six digits, as dataset-rt."""
    return f"{shard_id:06d}.bin"


def cache_id_for(source_name: str) -> int:
    """Persistent v3 cache identity: first 8 bytes of sha256(name), big-endian, masked to 63 bits."""
    import hashlib  # lazily: libcrypto is 1.4 MiB per reader worker, which never derives ids

    return int.from_bytes(hashlib.sha256(source_name.encode()).digest()[:8], "big") & U63_MAX
