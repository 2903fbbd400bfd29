# Native twin of datasetrt/format/layout.py: the record-layout sizes the kernels index by
# (docs/storage-format.md). tests/unit/values/test_codecs.py checks them (gather.RECORD_LAYOUT) against the Python ones.

cdef enum:
    INDEX_ROW_BYTES = 24      # u64 LE shard_id | u64 LE offset | u64 LE byte_len
    CHECKSUM_ROW_BYTES = 8    # u64 LE XXH3-64 of the whole stored record
    RECORD_HEADER_BYTES = 8   # u64 LE json_len
