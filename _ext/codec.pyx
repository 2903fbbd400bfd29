# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Codec kernel: payload encoding with any codec of the table (`Encoder`), the per-cache codec
states of writers (`EncodeState`) and readers (`DecodeState`: a zstd_dict dictionary prepared
once; format/dictionary.py trains it), and the XXH3-64 record hash of the writer.

Boundary: byte buffers in, byte buffers and prepared states out; no files, no tables, no processes.
The GIL is released around every codec and hash call so a writer thread pool encodes in parallel.
Codec ids, limits and the per-codec helpers are the codec table's native twin (codecs.pxd;
datasetrt/values/codecs.py); wire forms are in docs/storage-format.md. Decoding itself is the
gather kernel's (gather.pyx), which reads a cache's `DecodeState` through the reader's
`CacheTable`. Failures raise through faults.raise_fault.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc

from clibs cimport (
    XXH3_64bits_digest, XXH3_64bits_reset, XXH3_64bits_update, XXH3_createState, XXH3_freeState, XXH3_state_t,
)
from codecs cimport (
    CacheDecodeState, CacheEncodeState, EncodeContext, decode_state_free, decode_state_init, encode, encode_bound,
    encode_context_free, encode_context_init, encode_state_free, encode_state_init, level_range, max_input,
)
from faults cimport F_ARGUMENT, F_CODEC, F_INPUT_LIMIT, F_LEVEL, F_NOMEM, F_OK, F_STATE, F_TYPE, raise_fault

from datasetrt.values.codecs import CODEC_BY_ID


def xxh3_64_pairs(heads, bodies, uint64_t[::1] out not None):
    """out[i] = XXH3-64 (seed 0) of heads[i] + bodies[i], hashed as one stream without joining
    them (the writer's record = envelope head + stored payload). Both sequences hold `bytes`; the GIL
    is released for the whole batch. O(total bytes)."""
    cdef tuple hs = tuple(heads), bs = tuple(bodies)  # owned references while the GIL is released
    cdef Py_ssize_t n = len(hs), i
    if len(bs) != n or out.shape[0] < n:
        raise_fault(F_ARGUMENT, "xxh3_64_pairs: heads, bodies and out must have matching lengths")
    if n == 0:
        return
    cdef const char** ptrs = <const char**>malloc(2 * n * sizeof(char*))
    cdef size_t* lens = <size_t*>malloc(2 * n * sizeof(size_t))
    cdef XXH3_state_t* state = XXH3_createState()
    try:
        if ptrs == NULL or lens == NULL or state == NULL:
            raise_fault(F_NOMEM, f"xxh3_64_pairs: cannot allocate hash state for {n} records")
        for i in range(n):
            h = hs[i]
            b = bs[i]
            if not PyBytes_Check(h) or not PyBytes_Check(b):
                raise_fault(F_TYPE, "xxh3_64_pairs takes lists of bytes")
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


def _row(int codec_id):
    row = CODEC_BY_ID.get(codec_id)
    if row is None:
        raise_fault(F_ARGUMENT, f"unknown codec id {codec_id}")
    return row


cdef int _raise_level(str name, int codec_id, int level) except -1:
    cdef int lo = 0, hi = 0
    level_range(codec_id, &lo, &hi)
    return raise_fault(F_LEVEL, f"{name} level {level} outside [{lo}, {hi}]")


cdef class EncodeState:
    """A cache's codec state as the writer uses it (zstd_dict: its dictionary prepared at `level`,
    one ZSTD_CDict), built from the state's stored bytes. Read-only once built, so one instance is
    shared by every writer thread's `Encoder`. `state_id` is what its records name (the dictionary
    id). ConfigError for a codec without state or a bad level; CacheFormatError (F_STATE) when the
    bytes are not a state of the codec."""
    cdef CacheEncodeState state
    cdef readonly str name

    def __cinit__(self, int codec_id, const uint8_t[::1] data not None, int level):
        self.state.zstd = NULL
        self.name = _row(codec_id).name
        cdef int status
        cdef size_t n = data.shape[0]
        with nogil:
            status = encode_state_init(&self.state, codec_id, level, &data[0] if n else NULL, n)
        if status == F_CODEC:
            raise_fault(F_ARGUMENT, f"{self.name} has no per-cache state")
        if status == F_LEVEL:
            _raise_level(self.name, codec_id, level)
        if status == F_STATE:
            raise_fault(status, f"{n} bytes are not a {self.name} dictionary (no dictionary id)")
        if status != F_OK:
            raise_fault(status, f"cannot prepare a {self.name} dictionary of {n} bytes")

    def __dealloc__(self):
        encode_state_free(&self.state)

    @property
    def state_id(self):
        return self.state.state_id


cdef class Encoder:
    """Encodes payloads into the stored form of one codec of the table (`Codec.codec_id`).

    `level` is checked against the linked library for levelled codecs and ignored by the others.
    A codec with per-cache state (zstd_dict) needs that cache's `state` (an `EncodeState`, kept
    alive by the encoder; its level is the state's). Holds the codec's library context (zstd: one
    ZSTD_CCtx), so it is thread-confined: one per writer thread.
    """
    cdef EncodeContext ctx
    cdef readonly str name
    cdef readonly object state

    def __cinit__(self, int codec_id, int level=0, EncodeState state=None):
        self.ctx.zstd = NULL
        self.name = _row(codec_id).name
        self.state = state
        status = encode_context_init(&self.ctx, codec_id, level, &state.state if state is not None else NULL)
        if status == F_CODEC:
            raise_fault(F_ARGUMENT, f"unknown codec id {codec_id}")
        if status == F_LEVEL:
            _raise_level(self.name, codec_id, level)
        if status == F_ARGUMENT:
            raise_fault(status, f"{self.name} encodes with its cache's dictionary: pass state=EncodeState(...) of {self.name}")
        if status != F_OK:
            raise_fault(status, f"cannot create a {self.name} compression context")

    def __dealloc__(self):
        encode_context_free(&self.ctx)

    @property
    def max_payload_bytes(self):
        """Largest payload this codec can store, or None when it has no limit of its own."""
        limit = max_input(self.ctx.codec_id)
        return None if limit == <size_t>-1 else limit

    def encode(self, const uint8_t[::1] data not None):
        """The stored form of one payload (a new bytes object). O(len)."""
        cdef size_t n = data.shape[0], bound = 0, written = 0
        cdef int status = encode_bound(&self.ctx, n, &bound)
        if status == F_INPUT_LIMIT:
            raise_fault(status, f"payload of {n} bytes exceeds the {self.name} block limit of "
                                f"{max_input(self.ctx.codec_id)} bytes")
        out = PyBytes_FromStringAndSize(NULL, bound)
        cdef uint8_t* dst = <uint8_t*>PyBytes_AS_STRING(out)
        with nogil:
            status = encode(&self.ctx, &data[0] if n else NULL, n, dst, bound, &written)
        if status != F_OK:
            detail = f": {self.ctx.error.decode()}" if self.ctx.error != NULL else ""
            raise_fault(status, f"{self.name} compression failed{detail}")
        return out if written == bound else out[:written]


cdef class DecodeState:
    """One cache's codec state as readers use it (zstd_dict: its dictionary, one ZSTD_DDict),
    prepared from the state's stored bytes (the caller checked them against the manifest).

    Read-only once built: every reading thread of the process shares it. `address` is what a
    reader's `CacheTable` points its cache at (valid while this object lives; the table keeps a
    reference); `state_id` is what the cache's records name (the dictionary id); `nbytes` the
    memory it holds (~ the dictionary size plus its entropy tables). CacheFormatError (F_STATE)
    naming `label` when the bytes are not a state of the codec; ConfigError for a codec without
    per-cache state.
    """
    cdef CacheDecodeState state
    cdef readonly str label

    def __cinit__(self, int codec_id, const uint8_t[::1] data not None, str label not None):
        self.state.zstd = NULL
        self.label = label
        row = CODEC_BY_ID.get(codec_id)
        cdef int status
        cdef size_t n = data.shape[0]
        with nogil:
            status = decode_state_init(&self.state, codec_id, &data[0] if n else NULL, n)
        if status == F_CODEC:
            raise_fault(F_ARGUMENT, f"codec id {codec_id} has no per-cache state: {label}")
        if status == F_STATE:
            raise_fault(status, f"{row.name} dictionary is not a zstd dictionary the library can load ({n} bytes): {label}")
        if status != F_OK:
            raise_fault(status, f"cannot prepare the {row.name} dictionary ({n} bytes): {label}")

    def __dealloc__(self):
        decode_state_free(&self.state)

    @property
    def address(self):
        """Address of the prepared state (a codecs.pxd CacheDecodeState); valid while this lives."""
        return <size_t>&self.state

    @property
    def state_id(self):
        return self.state.state_id

    @property
    def nbytes(self):
        return self.state.nbytes
