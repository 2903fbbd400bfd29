# Shared C declarations of the codec and hash libraries the kernels link (liblz4, libzstd,
# libxxhash). zstd's dictionary builder is not here: Debian's libzstd.a cannot link it into a shared
# object (its zdict objects are PIE), so training runs through `zstandard` (format/dictionary.py).
# Declarations only: no logic lives here (codec ids, limits and helpers: codecs.pxd).
from libc.stdint cimport uint64_t

cdef extern from "lz4.h" nogil:
    int LZ4_compressBound(int inputSize)
    int LZ4_compress_default(const char* src, char* dst, int srcSize, int dstCapacity)
    int LZ4_decompress_safe(const char* src, char* dst, int compressedSize, int dstCapacity)
    int LZ4_MAX_INPUT_SIZE

cdef extern from "zstd.h" nogil:
    ctypedef struct ZSTD_CCtx
    ctypedef struct ZSTD_DCtx
    size_t ZSTD_compressBound(size_t srcSize)
    ZSTD_CCtx* ZSTD_createCCtx()
    size_t ZSTD_freeCCtx(ZSTD_CCtx* cctx)
    size_t ZSTD_compressCCtx(ZSTD_CCtx* cctx, void* dst, size_t dstCapacity,
                             const void* src, size_t srcSize, int compressionLevel)
    ZSTD_DCtx* ZSTD_createDCtx()
    size_t ZSTD_freeDCtx(ZSTD_DCtx* dctx)
    size_t ZSTD_decompressDCtx(ZSTD_DCtx* dctx, void* dst, size_t dstCapacity,
                               const void* src, size_t srcSize)
    unsigned long long ZSTD_getFrameContentSize(const void* src, size_t srcSize)
    size_t ZSTD_findFrameCompressedSize(const void* src, size_t srcSize)
    unsigned ZSTD_isError(size_t code)
    const char* ZSTD_getErrorName(size_t code)
    int ZSTD_minCLevel()
    int ZSTD_maxCLevel()
    unsigned long long ZSTD_CONTENTSIZE_UNKNOWN
    unsigned long long ZSTD_CONTENTSIZE_ERROR
    # Dictionaries (stable API since zstd 1.4.0): prepared once, read-only and thread-safe to share.
    ctypedef struct ZSTD_CDict
    ctypedef struct ZSTD_DDict
    ZSTD_CDict* ZSTD_createCDict(const void* dictBuffer, size_t dictSize, int compressionLevel)
    size_t ZSTD_freeCDict(ZSTD_CDict* cdict)
    size_t ZSTD_compress_usingCDict(ZSTD_CCtx* cctx, void* dst, size_t dstCapacity,
                                    const void* src, size_t srcSize, const ZSTD_CDict* cdict)
    ZSTD_DDict* ZSTD_createDDict(const void* dictBuffer, size_t dictSize)
    size_t ZSTD_freeDDict(ZSTD_DDict* ddict)
    size_t ZSTD_decompress_usingDDict(ZSTD_DCtx* dctx, void* dst, size_t dstCapacity,
                                      const void* src, size_t srcSize, const ZSTD_DDict* ddict)
    unsigned ZSTD_getDictID_fromDict(const void* dict, size_t dictSize)
    unsigned ZSTD_getDictID_fromCDict(const ZSTD_CDict* cdict)
    unsigned ZSTD_getDictID_fromDDict(const ZSTD_DDict* ddict)
    unsigned ZSTD_getDictID_fromFrame(const void* src, size_t srcSize)
    size_t ZSTD_sizeof_DDict(const ZSTD_DDict* ddict)

cdef extern from "xxhash.h" nogil:
    ctypedef unsigned long long XXH64_hash_t
    XXH64_hash_t XXH3_64bits(const void* data, size_t length)
    # Streaming state: one record hashed from its parts without joining them (the writer).
    ctypedef struct XXH3_state_t
    XXH3_state_t* XXH3_createState()
    int XXH3_freeState(XXH3_state_t* state)
    int XXH3_64bits_reset(XXH3_state_t* state)
    int XXH3_64bits_update(XXH3_state_t* state, const void* data, size_t length)
    XXH64_hash_t XXH3_64bits_digest(const XXH3_state_t* state)
