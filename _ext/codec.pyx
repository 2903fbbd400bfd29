# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Per-record payload codecs (lz4 size-prefixed block, zstd frame) and the XXH3-64 record hash.

Boundary: byte buffers in, byte buffers out; no files, no tables, no processes. The GIL is released
around every codec and hash call so a writer thread pool compresses in parallel.

Wire forms (docs/storage-format.md):
* lz4: u32 LE decoded length, then one raw LZ4 block (lz4_flex `compress_prepend_size`, which is
  what dataset-rt 0.4.8 writes and reads).
* zstd: one zstd frame with the content size in its header (datasetrt only).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from clibs cimport (
    LZ4_compressBound, LZ4_compress_default, LZ4_decompress_safe,
    ZSTD_CCtx, ZSTD_DCtx, ZSTD_createCCtx, ZSTD_freeCCtx, ZSTD_compressBound, ZSTD_compressCCtx,
    ZSTD_createDCtx, ZSTD_freeDCtx, ZSTD_decompressDCtx, ZSTD_getFrameContentSize,
    ZSTD_findFrameCompressedSize, ZSTD_isError, ZSTD_getErrorName, ZSTD_minCLevel, ZSTD_maxCLevel,
    XXH3_64bits,
)

cdef extern from *:
    """
    #define DRT_LZ4_MAX_INPUT 0x7E000000
    #define DRT_ZSTD_UNKNOWN ZSTD_CONTENTSIZE_UNKNOWN
    #define DRT_ZSTD_ERROR ZSTD_CONTENTSIZE_ERROR
    """
    const size_t DRT_LZ4_MAX_INPUT
    const unsigned long long DRT_ZSTD_UNKNOWN
    const unsigned long long DRT_ZSTD_ERROR

cdef extern from "xxhash.h" nogil:
    ctypedef struct XXH3_state_t
    XXH3_state_t* XXH3_createState()
    int XXH3_freeState(XXH3_state_t* state)
    int XXH3_64bits_reset(XXH3_state_t* state)
    int XXH3_64bits_update(XXH3_state_t* state, const void* data, size_t length)
    unsigned long long XXH3_64bits_digest(const XXH3_state_t* state)

ZSTD_LEVEL_MIN = ZSTD_minCLevel()
ZSTD_LEVEL_MAX = ZSTD_maxCLevel()


def xxh3_64(const uint8_t[::1] data not None):
    """XXH3-64 (seed 0) of a contiguous buffer, as a Python int in [0, 2^64)."""
    cdef uint64_t h
    cdef size_t n = data.shape[0]
    with nogil:
        h = XXH3_64bits(&data[0] if n else NULL, n)
    return h


def xxh3_64_pairs(heads, bodies, uint64_t[::1] out not None):
    """out[i] = XXH3-64 (seed 0) of heads[i] + bodies[i], hashed as one stream without joining
    them (the writer's record = envelope head + stored payload). Both sequences hold `bytes`; the GIL
    is released for the whole batch. O(total bytes)."""
    cdef tuple hs = tuple(heads), bs = tuple(bodies)  # owned references while the GIL is released
    cdef Py_ssize_t n = len(hs), i
    if len(bs) != n or out.shape[0] < n:
        raise ValueError("xxh3_64_pairs: heads, bodies and out must have matching lengths")
    if n == 0:
        return
    cdef const char** ptrs = <const char**>malloc(2 * n * sizeof(char*))
    cdef size_t* lens = <size_t*>malloc(2 * n * sizeof(size_t))
    cdef XXH3_state_t* state = XXH3_createState()
    try:
        if ptrs == NULL or lens == NULL or state == NULL:
            raise MemoryError("xxh3_64_pairs")
        for i in range(n):
            h = hs[i]
            b = bs[i]
            if not PyBytes_Check(h) or not PyBytes_Check(b):
                raise TypeError("xxh3_64_pairs takes lists of bytes")
            ptrs[2 * i] = PyBytes_AS_STRING(h)
            lens[2 * i] = PyBytes_GET_SIZE(h)
            ptrs[2 * i + 1] = PyBytes_AS_STRING(b)
            lens[2 * i + 1] = PyBytes_GET_SIZE(b)
        with nogil:
            for i in range(n):
                XXH3_64bits_reset(state)
                XXH3_64bits_update(state, ptrs[2 * i], lens[2 * i])
                XXH3_64bits_update(state, ptrs[2 * i + 1], lens[2 * i + 1])
                out[i] = XXH3_64bits_digest(state)
    finally:
        XXH3_freeState(state)
        free(ptrs)
        free(lens)


def lz4_compress(const uint8_t[::1] data not None):
    """Compress one payload into the size-prefixed lz4 block form. O(len)."""
    cdef size_t n = data.shape[0]
    if n > DRT_LZ4_MAX_INPUT:
        raise ValueError(f"payload of {n} bytes exceeds the lz4 block limit of {DRT_LZ4_MAX_INPUT} bytes")
    cdef int bound = LZ4_compressBound(<int>n)
    out = PyBytes_FromStringAndSize(NULL, 4 + bound)
    cdef char* dst = PyBytes_AS_STRING(out)
    cdef uint32_t n32 = <uint32_t>n
    cdef int written
    dst[0] = <char>(n32 & 0xFF); dst[1] = <char>((n32 >> 8) & 0xFF)
    dst[2] = <char>((n32 >> 16) & 0xFF); dst[3] = <char>((n32 >> 24) & 0xFF)
    with nogil:
        written = LZ4_compress_default(<const char*>&data[0] if n else <const char*>dst, dst + 4, <int>n, bound)
    if written <= 0 and n > 0:
        raise RuntimeError("lz4 compression failed")
    return out[:4 + written]


def lz4_decompress(const uint8_t[::1] data not None, size_t max_decoded):
    """Decode the size-prefixed lz4 form; the prefix must be <= max_decoded and match the block."""
    cdef size_t n = data.shape[0]
    if n < 4:
        raise ValueError("failed to decompress lz4 payload: missing size prefix")
    cdef uint32_t size = data[0] | (<uint32_t>data[1] << 8) | (<uint32_t>data[2] << 16) | (<uint32_t>data[3] << 24)
    if size > max_decoded:
        raise ValueError(f"failed to decompress lz4 payload: size prefix {size} exceeds limit {max_decoded}")
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef char* dst = PyBytes_AS_STRING(out)
    cdef int got
    with nogil:
        got = LZ4_decompress_safe(<const char*>&data[4] if n > 4 else <const char*>dst, dst, <int>(n - 4), <int>size)
    if got != <int>size:
        raise ValueError("failed to decompress lz4 payload: corrupt block")
    return out


cdef class ZstdCompressor:
    """One reusable zstd compression context; not thread-safe: one per writer thread."""
    cdef ZSTD_CCtx* cctx
    cdef int level

    def __cinit__(self, int level=3):
        if level < ZSTD_minCLevel() or level > ZSTD_maxCLevel():
            raise ValueError(f"zstd level {level} outside [{ZSTD_minCLevel()}, {ZSTD_maxCLevel()}]")
        self.level = level
        self.cctx = ZSTD_createCCtx()
        if self.cctx == NULL:
            raise MemoryError("ZSTD_createCCtx failed")

    def __dealloc__(self):
        if self.cctx != NULL:
            ZSTD_freeCCtx(self.cctx)

    def compress(self, const uint8_t[::1] data not None):
        """One zstd frame with the content size recorded in its header."""
        cdef size_t n = data.shape[0]
        cdef size_t bound = ZSTD_compressBound(n)
        out = PyBytes_FromStringAndSize(NULL, bound)
        cdef char* dst = PyBytes_AS_STRING(out)
        cdef size_t written
        with nogil:
            written = ZSTD_compressCCtx(self.cctx, dst, bound, <const void*>&data[0] if n else <const void*>dst, n, self.level)
        if ZSTD_isError(written):
            raise RuntimeError(f"zstd compression failed: {ZSTD_getErrorName(written).decode()}")
        return out[:written]


def zstd_decompress(const uint8_t[::1] data not None, size_t max_decoded):
    """Decode one zstd frame whose header declares a content size <= max_decoded."""
    cdef size_t n = data.shape[0]
    cdef unsigned long long size = ZSTD_getFrameContentSize(&data[0] if n else NULL, n)
    if size == DRT_ZSTD_UNKNOWN or size == DRT_ZSTD_ERROR:
        raise ValueError("failed to decompress zstd payload: frame header has no content size")
    if size > max_decoded:
        raise ValueError(f"failed to decompress zstd payload: content size {size} exceeds limit {max_decoded}")
    out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>size)
    cdef ZSTD_DCtx* dctx = ZSTD_createDCtx()
    if dctx == NULL:
        raise MemoryError("ZSTD_createDCtx failed")
    cdef size_t got
    cdef char* dst = PyBytes_AS_STRING(out)
    with nogil:
        got = ZSTD_decompressDCtx(dctx, dst, <size_t>size, &data[0], n)
    ZSTD_freeDCtx(dctx)
    if ZSTD_isError(got) or got != size:
        raise ValueError("failed to decompress zstd payload: corrupt frame")
    return out
