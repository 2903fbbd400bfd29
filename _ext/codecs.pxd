# Native twin of datasetrt/values/codecs.py (the codec table): codec ids, the kernels' codec limits, and
# each codec's encode/decode helpers behind one dispatch, used by codec.pyx (writer) and gather.pyx
# (reader). Adding a codec touches this file (id, limits, one branch per helper), its row in
# datasetrt/values/codecs.py, clibs.pxd when the library needs new declarations, and the docs. A codec with
# per-cache state (zstd_dict) also has a branch in the state helpers (`decode_state_init`,
# `encode_state_init`) and reads its state in `decode` / `encode`; training a state is
# datasetrt/format/dictionary.py's.
#
# The helpers are `noexcept nogil` and report F_* fault codes (faults.pxd); callers raise them
# through faults.raise_fault. Nothing read from disk is trusted: a stored payload's declared
# decoded size is checked for plausibility (`decoded_size`) before anything is sized from it, and
# `decode` succeeds only when exactly the stored bytes decode to exactly that size.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from clibs cimport (
    LZ4_compressBound, LZ4_compress_default, LZ4_decompress_safe,
    ZSTD_CCtx, ZSTD_CDict, ZSTD_CONTENTSIZE_ERROR, ZSTD_CONTENTSIZE_UNKNOWN, ZSTD_DCtx, ZSTD_DDict, ZSTD_compressBound,
    ZSTD_compressCCtx, ZSTD_compress_usingCDict, ZSTD_createCCtx, ZSTD_createCDict, ZSTD_createDCtx, ZSTD_createDDict,
    ZSTD_decompressDCtx, ZSTD_decompress_usingDDict, ZSTD_findFrameCompressedSize, ZSTD_freeCCtx, ZSTD_freeCDict,
    ZSTD_freeDCtx, ZSTD_freeDDict, ZSTD_getDictID_fromDict,
    ZSTD_getDictID_fromFrame, ZSTD_getErrorName, ZSTD_getFrameContentSize, ZSTD_isError, ZSTD_maxCLevel,
    ZSTD_minCLevel, ZSTD_sizeof_DDict,
)
from faults cimport F_ARGUMENT, F_CODEC, F_DECODE, F_ENCODE, F_INPUT_LIMIT, F_LEVEL, F_NOMEM, F_OK, F_STATE


cdef enum CodecId:  # == Codec.codec_id in datasetrt/values/codecs.py
    CODEC_NONE = 0
    CODEC_LZ4 = 1
    CODEC_ZSTD = 2
    CODEC_ZSTD_DICT = 3


cdef enum:
    LZ4_PREFIX_BYTES = 4          # u32 LE decoded length before the block
    LZ4_MAX_BLOCK = 0x7E000000    # LZ4_MAX_INPUT_SIZE: the largest block, raw or stored
    # Largest decoded/stored ratios a valid payload can have: an LZ4 block yields at most ~255 bytes
    # per input byte (plus a small constant); a zstd frame under 32 KiB per byte (an RLE block:
    # 4 bytes -> 128 KiB). A size header beyond these is hostile and refused before anything is
    # sized from it.
    LZ4_MAX_RATIO = 255
    LZ4_RATIO_SLACK = 64
    ZSTD_RATIO_SHIFT = 15


# Per cache and process, for a codec with per-cache state (zstd_dict: the cache's dictionary,
# prepared once from its file): read-only after init, so every reading thread shares it. `state_id`
# identifies the state (the dictionary id its frames name); `nbytes` is the memory it holds.
cdef struct CacheDecodeState:
    int codec_id
    ZSTD_DDict* zstd
    uint64_t state_id
    size_t nbytes


# Per cache being written: the writer's side of the same state (thread-safe to share: a CDict is
# read-only once built).
cdef struct CacheEncodeState:
    int codec_id
    ZSTD_CDict* zstd
    uint64_t state_id


# Per reading thread/process: the library contexts decoding reuses, and the details of the last
# F_STATE fault (what the record names, what its cache's state is).
cdef struct DecodeContext:
    ZSTD_DCtx* zstd
    uint64_t state_found
    uint64_t state_expected


# Per writer thread: the codec, its level, the library context encoding reuses, the cache's codec
# state (borrowed; NULL for codecs without) and, after an F_ENCODE, the library's error text (or NULL).
cdef struct EncodeContext:
    int codec_id
    int level
    ZSTD_CCtx* zstd
    const CacheEncodeState* state
    const char* error


# -- reading --------------------------------------------------------------------------------------

cdef inline int decode_context_init(DecodeContext* ctx) noexcept nogil:
    ctx.state_found = 0
    ctx.state_expected = 0
    ctx.zstd = ZSTD_createDCtx()
    return F_OK if ctx.zstd != NULL else F_NOMEM


cdef inline void decode_context_free(DecodeContext* ctx) noexcept nogil:
    if ctx.zstd != NULL:
        ZSTD_freeDCtx(ctx.zstd)
        ctx.zstd = NULL


cdef inline int decoded_size(int codec_id, const uint8_t* payload, uint64_t plen,
                             const void* cache_state, uint64_t* dsize) noexcept nogil:
    """F_OK with *dsize the decoded size the stored payload payload[0:plen] declares, once it is
    plausible for plen bytes. F_DECODE when there is no size header (*dsize = 0) or it is
    impossible (*dsize = the declared size); F_CODEC for an unknown id. O(1)."""
    cdef uint64_t n
    cdef unsigned long long z
    dsize[0] = 0
    if codec_id == CODEC_NONE:
        dsize[0] = plen
        return F_OK
    if codec_id == CODEC_LZ4:
        if plen < LZ4_PREFIX_BYTES:
            return F_DECODE
        n = payload[0] | (<uint64_t>payload[1] << 8) | (<uint64_t>payload[2] << 16) | (<uint64_t>payload[3] << 24)
        dsize[0] = n
        if (n > LZ4_MAX_BLOCK or plen - LZ4_PREFIX_BYTES > LZ4_MAX_BLOCK
                or n > (plen - LZ4_PREFIX_BYTES) * LZ4_MAX_RATIO + LZ4_RATIO_SLACK):
            return F_DECODE
        return F_OK
    if codec_id == CODEC_ZSTD or codec_id == CODEC_ZSTD_DICT:  # the dictionary does not change the header
        z = ZSTD_getFrameContentSize(payload, plen)
        if z == ZSTD_CONTENTSIZE_UNKNOWN or z == ZSTD_CONTENTSIZE_ERROR:
            return F_DECODE
        dsize[0] = z
        if (z >> ZSTD_RATIO_SHIFT) > plen:
            return F_DECODE
        return F_OK
    return F_CODEC


cdef inline int decode(int codec_id, const uint8_t* payload, uint64_t plen, uint8_t* dst, uint64_t dsize,
                       DecodeContext* ctx, const void* cache_state) noexcept nogil:
    """Decode payload[0:plen], whose `decoded_size` was dsize, into dst[0:dsize]. F_OK only when
    exactly plen stored bytes decode to exactly dsize bytes; else F_DECODE (F_CODEC: unknown id).
    `cache_state` is the record's cache's `CacheDecodeState` for a codec with per-cache state (NULL for
    the others); F_STATE (details in ctx.state_found / state_expected) when the record names another
    state than its cache's, or the cache has none. O(plen + dsize)."""
    cdef int got
    cdef size_t zgot
    cdef const CacheDecodeState* state = <const CacheDecodeState*>cache_state
    if codec_id == CODEC_NONE:
        memcpy(dst, payload, plen)
        return F_OK
    if codec_id == CODEC_LZ4:
        got = LZ4_decompress_safe(<const char*>(payload + LZ4_PREFIX_BYTES), <char*>dst,
                                  <int>(plen - LZ4_PREFIX_BYTES), <int>dsize)
        return F_OK if got >= 0 and <uint64_t>got == dsize else F_DECODE
    if codec_id == CODEC_ZSTD:
        if ZSTD_findFrameCompressedSize(payload, plen) != plen:
            return F_DECODE
        zgot = ZSTD_decompressDCtx(ctx.zstd, dst, dsize, payload, plen)
        return F_OK if not ZSTD_isError(zgot) and zgot == dsize else F_DECODE
    if codec_id == CODEC_ZSTD_DICT:
        if ZSTD_findFrameCompressedSize(payload, plen) != plen:
            return F_DECODE
        # The frame header names the dictionary it was compressed with: it must be this cache's.
        ctx.state_found = ZSTD_getDictID_fromFrame(payload, plen)
        ctx.state_expected = state.state_id if state != NULL and state.codec_id == codec_id else 0
        if ctx.state_expected == 0 or ctx.state_found != ctx.state_expected:
            return F_STATE
        zgot = ZSTD_decompress_usingDDict(ctx.zstd, dst, dsize, payload, plen, state.zstd)
        return F_OK if not ZSTD_isError(zgot) and zgot == dsize else F_DECODE
    return F_CODEC


cdef inline int decode_state_init(CacheDecodeState* state, int codec_id, const uint8_t* data, size_t n) noexcept nogil:
    """Prepare a cache's decoding state from its stored bytes data[0:n] (zstd_dict: the dictionary
    file). F_OK; F_STATE when the bytes are not a state of this codec (not a zstd dictionary with
    an id, or one the library refuses); F_CODEC for a codec without per-cache state; F_NOMEM.
    O(n); the state copies what it keeps."""
    state.codec_id = codec_id
    state.zstd = NULL
    state.state_id = 0
    state.nbytes = 0
    if codec_id != CODEC_ZSTD_DICT:
        return F_CODEC
    state.state_id = ZSTD_getDictID_fromDict(data, n)
    if state.state_id == 0:
        return F_STATE
    state.zstd = ZSTD_createDDict(data, n)
    if state.zstd == NULL:
        return F_STATE
    state.nbytes = ZSTD_sizeof_DDict(state.zstd)
    return F_OK


cdef inline void decode_state_free(CacheDecodeState* state) noexcept nogil:
    if state.zstd != NULL:
        ZSTD_freeDDict(state.zstd)
        state.zstd = NULL


# -- writing --------------------------------------------------------------------------------------

cdef inline int level_range(int codec_id, int* lo, int* hi) noexcept nogil:
    """The levels the linked library accepts for a levelled codec (F_OK), else F_CODEC."""
    if codec_id == CODEC_ZSTD or codec_id == CODEC_ZSTD_DICT:
        lo[0] = ZSTD_minCLevel()
        hi[0] = ZSTD_maxCLevel()
        return F_OK
    return F_CODEC


cdef inline int encode_state_init(CacheEncodeState* state, int codec_id, int level, const uint8_t* data,
                                  size_t n) noexcept nogil:
    """Prepare a cache's encoding state at `level` from its stored bytes data[0:n] (zstd_dict: a
    trained dictionary; the level is fixed here, as a CDict fixes it). F_OK, F_LEVEL, F_STATE (not
    a dictionary with an id), F_CODEC (no per-cache state) or F_NOMEM. O(n)."""
    cdef int lo, hi
    state.codec_id = codec_id
    state.zstd = NULL
    state.state_id = 0
    if codec_id != CODEC_ZSTD_DICT:
        return F_CODEC
    level_range(codec_id, &lo, &hi)
    if level < lo or level > hi:
        return F_LEVEL
    state.state_id = ZSTD_getDictID_fromDict(data, n)
    if state.state_id == 0:
        return F_STATE
    state.zstd = ZSTD_createCDict(data, n, level)
    return F_OK if state.zstd != NULL else F_NOMEM


cdef inline void encode_state_free(CacheEncodeState* state) noexcept nogil:
    if state.zstd != NULL:
        ZSTD_freeCDict(state.zstd)
        state.zstd = NULL


cdef inline int encode_context_init(EncodeContext* ctx, int codec_id, int level,
                                    const CacheEncodeState* state) noexcept nogil:
    """F_OK, F_CODEC (unknown id), F_LEVEL (level outside `level_range`), F_ARGUMENT (a codec with
    per-cache state without its state, or a state of another codec) or F_NOMEM. `state` is
    borrowed: it must outlive the context."""
    cdef int lo, hi
    ctx.codec_id = codec_id
    ctx.level = level
    ctx.zstd = NULL
    ctx.state = NULL
    ctx.error = NULL
    if codec_id == CODEC_NONE or codec_id == CODEC_LZ4:
        return F_OK
    if codec_id == CODEC_ZSTD or codec_id == CODEC_ZSTD_DICT:
        level_range(codec_id, &lo, &hi)
        if level < lo or level > hi:
            return F_LEVEL
        if codec_id == CODEC_ZSTD_DICT:
            if state == NULL or state.codec_id != codec_id or state.zstd == NULL:
                return F_ARGUMENT
            ctx.state = state
        ctx.zstd = ZSTD_createCCtx()
        return F_OK if ctx.zstd != NULL else F_NOMEM
    return F_CODEC


cdef inline void encode_context_free(EncodeContext* ctx) noexcept nogil:
    if ctx.zstd != NULL:
        ZSTD_freeCCtx(ctx.zstd)
        ctx.zstd = NULL


cdef inline size_t max_input(int codec_id) noexcept nogil:
    """Largest payload the codec can store (SIZE_MAX: no limit of its own)."""
    if codec_id == CODEC_LZ4:
        return LZ4_MAX_BLOCK
    return <size_t>-1


cdef inline int encode_bound(const EncodeContext* ctx, size_t n, size_t* bound) noexcept nogil:
    """F_OK with *bound the most bytes encoding n bytes can take; F_INPUT_LIMIT past `max_input`."""
    if n > max_input(ctx.codec_id):
        return F_INPUT_LIMIT
    if ctx.codec_id == CODEC_LZ4:
        bound[0] = LZ4_PREFIX_BYTES + <size_t>LZ4_compressBound(<int>n)
    elif ctx.codec_id == CODEC_ZSTD or ctx.codec_id == CODEC_ZSTD_DICT:
        bound[0] = ZSTD_compressBound(n)
    else:
        bound[0] = n
    return F_OK


cdef inline int encode(EncodeContext* ctx, const uint8_t* src, size_t n, uint8_t* dst, size_t cap,
                       size_t* written) noexcept nogil:
    """Encode src[0:n] into dst[0:cap] (cap from `encode_bound`); *written = stored bytes. F_OK or
    F_ENCODE (ctx.error: the library's text, when it gives one). `src` may be NULL when n == 0."""
    cdef uint32_t n32
    cdef int got
    cdef size_t z
    if ctx.codec_id == CODEC_LZ4:
        n32 = <uint32_t>n
        dst[0] = <uint8_t>(n32 & 0xFF)
        dst[1] = <uint8_t>((n32 >> 8) & 0xFF)
        dst[2] = <uint8_t>((n32 >> 16) & 0xFF)
        dst[3] = <uint8_t>((n32 >> 24) & 0xFF)
        got = LZ4_compress_default(<const char*>src if n else <const char*>dst, <char*>(dst + LZ4_PREFIX_BYTES),
                                   <int>n, <int>(cap - LZ4_PREFIX_BYTES))
        if got <= 0 and n > 0:
            return F_ENCODE
        written[0] = LZ4_PREFIX_BYTES + <size_t>(got if got > 0 else 0)
        return F_OK
    if ctx.codec_id == CODEC_ZSTD:
        z = ZSTD_compressCCtx(ctx.zstd, dst, cap, <const void*>src if n else <const void*>dst, n, ctx.level)
        if ZSTD_isError(z):
            ctx.error = ZSTD_getErrorName(z)
            return F_ENCODE
        written[0] = z
        return F_OK
    if ctx.codec_id == CODEC_ZSTD_DICT:  # level and frame parameters (content size, dictionary id) come with the CDict
        z = ZSTD_compress_usingCDict(ctx.zstd, dst, cap, <const void*>src if n else <const void*>dst, n, ctx.state.zstd)
        if ZSTD_isError(z):
            ctx.error = ZSTD_getErrorName(z)
            return F_ENCODE
        written[0] = z
        return F_OK
    if n:
        memcpy(dst, src, n)
    written[0] = n
    return F_OK
