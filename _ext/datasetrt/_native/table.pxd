# Declarations of datasetrt._native.table (_ext/table.pyx): the reader's table of caches and shards
# that the gather kernels read (gather.pyx cimports it).
#
# This file sits at the path of its module's full name (not beside the other .pxd files) because it
# declares a cdef class: a cimport of `datasetrt._native.table` makes the importing kernel load that
# module at run time to find the class, so the name must be the installed one.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t


# What the gather kernels' nogil loops read. Cache c (its position in the reader's catalog) owns
# the flat shards shard_base[c] .. shard_base[c] + shard_count[c] - 1. Every array is owned by the
# CacheTable and never changes shape, except `shard_fd`, which it borrows (see CacheTable).
cdef struct CacheArrays:
    Py_ssize_t n_caches
    Py_ssize_t n_shards
    # per cache
    const uint8_t** index       # mapped index.bin: index_rows[c] rows of INDEX_ROW_BYTES; NULL until mapped
    uint64_t* index_rows        # the cache's sample_count (rows of its index)
    int64_t* shard_base
    int64_t* shard_count
    const uint8_t** checksums   # mapped checksum sidecar (CHECKSUM_ROW_BYTES per sample), or NULL: not verified
    const void** codec_state    # the cache's CacheDecodeState (codecs.pxd), or NULL for codecs without one
    # per flat shard
    const int32_t* shard_fd     # open descriptor, or -1 while closed
    const uint8_t** shard_map   # the shard mapped whole (at least shard_len bytes), or NULL: read with pread
    uint64_t* shard_len         # byte_len: every read stays below it
    uint64_t* shard_ulen        # uncompressed_byte_len: no payload decodes larger
    uint8_t* shard_codec        # codec id (codecs.pxd CodecId)


cdef class CacheTable:
    cdef CacheArrays arrays
    cdef const int32_t[::1] _fds
    cdef uint8_t* _mapped
    cdef list _held
    cdef list _shard_maps
    cdef readonly list labels
    cdef readonly list shard_names
    cdef readonly Py_ssize_t unmapped
