# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Record gather kernel: index lookup, pread, integrity check, envelope split, decompress.

Boundary: raw file descriptors, mapped indexes and flat numpy tables in; decoded bytes out. It knows
the record byte layout (docs/storage-format.md) and nothing of tables, sampling or processes.

Trust: the caller validated the manifest and the table (row -> cache position, sample_id in range),
but nothing read from disk is trusted: every index entry, offset, length, JSON length and codec size
prefix is bounds-checked before it is used, and a record's XXH3-64 is checked (when the cache has a
checksum sidecar) before any of its bytes are interpreted.

The inner loop runs with the GIL released; a failure stops the loop with a fault code (faults.pxd)
and `_raise_fault` words it (cache directory, sample, shard) and raises it through the kernels'
one choke point, `faults.raise_fault`. Codecs are decoded through the codec table's helpers
(codecs.pxd), so this loop names no codec but the identity one, whose records are read in place.
A codec with per-cache state (zstd_dict) gets its cache's `DecodeState` (codec.pyx) from the
per-cache state table (`codec_state`), which the caller fills once per cache (`CacheHandle.codec_state`).
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.errno cimport EINTR, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memmove
from posix.types cimport off_t
from posix.unistd cimport pread

from clibs cimport XXH3_64bits
from codecs cimport CODEC_NONE, DecodeContext, decode, decode_context_free, decode_context_init, decoded_size
from faults cimport (
    F_ARGUMENT, F_BOUNDS, F_CHECKSUM, F_CODEC, F_DECODE, F_DECODED_LIMIT, F_ENVELOPE, F_IO, F_NOMEM, F_NOT_OPEN, F_OK,
    F_OUT_FULL, F_PAYLOAD_SPEC, F_SAMPLE_RANGE, F_SHARD_ID, F_SHORT_READ, F_STATE, F_UTF8, raise_fault,
)
from layout cimport CHECKSUM_ROW_BYTES, INDEX_ROW_BYTES, RECORD_HEADER_BYTES

from datasetrt.errors import os_error_text
from datasetrt.values.codecs import CODEC_BY_ID

# The record sizes this kernel indexes by (layout.pxd), for the twin check against format/layout.py.
RECORD_LAYOUT = {
    "INDEX_ROW_BYTES": INDEX_ROW_BYTES,
    "CHECKSUM_ROW_BYTES": CHECKSUM_ROW_BYTES,
    "RECORD_HEADER_BYTES": RECORD_HEADER_BYTES,
}

# Hand-written C: neither Cython nor libc has a strict UTF-8 validator or an unaligned LE load.
cdef extern from *:
    """
    /* Offset of the first byte that breaks strict UTF-8 (as CPython's decoder: no overlongs,
       surrogates or code points above U+10FFFF), or -1 when all n bytes are valid. */
    static inline int64_t drt_utf8_invalid_at(const uint8_t* p, uint64_t n) {
        uint64_t i = 0;
        while (i < n) {
            uint8_t c = p[i];
            if (c < 0x80) { i++; continue; }
            uint64_t need; uint8_t lo = 0x80, hi = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) need = 1;
            else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; else if (c == 0xED) hi = 0x9F; }
            else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; else if (c == 0xF4) hi = 0x8F; }
            else return (int64_t)i;
            if (n - i - 1 < need) return (int64_t)i;
            if (p[i + 1] < lo || p[i + 1] > hi) return (int64_t)i;
            for (uint64_t k = 2; k <= need; k++)
                if ((p[i + k] & 0xC0) != 0x80) return (int64_t)i;
            i += need + 1;
        }
        return -1;
    }
    static inline uint64_t drt_load_u64le(const uint8_t* p) {
        uint64_t v; memcpy(&v, p, 8);
    #if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }
    """
    uint64_t drt_load_u64le(const uint8_t* p) nogil
    int64_t drt_utf8_invalid_at(const uint8_t* p, uint64_t n) nogil


cdef enum:
    SPAN_MAX_ROWS = 4096
    SPAN_MAX_BYTES = 4194304  # compressed runs are staged in the scratch buffer: keep it bounded
    # An in-place run of uncompressed records is checked and moved down right after its pread: it
    # must still be in the CPU's L2 cache then (1 MiB per core here), or the check and the memmove
    # read it back from DRAM (a whole 37.5 MiB batch of 150 KiB records in one pread did).
    INPLACE_SPAN_BYTES = 262144


cdef class Scratch:
    """Per-reader scratch: a growable staging buffer for compressed records and the codecs'
    decoding contexts (codecs.pxd DecodeContext).

    Not thread-safe; one per reading thread/process. Memory held: the largest compressed run
    staged so far plus the contexts (one ZSTD_DCtx, ~100 KiB).
    """
    cdef uint8_t* buf
    cdef size_t cap
    cdef DecodeContext codecs

    def __cinit__(self):
        self.buf = NULL
        self.cap = 0
        if decode_context_init(&self.codecs) != F_OK:
            decode_context_free(&self.codecs)
            raise_fault(F_NOMEM, "cannot allocate the codecs' decoding contexts")

    def __dealloc__(self):
        free(self.buf)
        decode_context_free(&self.codecs)

    @property
    def capacity(self):
        return self.cap

    cdef int reserve(self, size_t n) noexcept nogil:
        cdef uint8_t* p
        if n <= self.cap:
            return 0
        p = <uint8_t*>realloc(self.buf, n)
        if p == NULL:
            return -1
        self.buf = p
        self.cap = n
        return 0


cdef struct FaultInfo:
    int code
    int codec
    Py_ssize_t row
    uint64_t a
    uint64_t b
    int64_t shard


cdef inline int _pread_full(int fd, uint8_t* dst, size_t n, uint64_t offset, FaultInfo* f) noexcept nogil:
    cdef ssize_t got
    cdef size_t done = 0
    while done < n:
        got = pread(fd, dst + done, n - done, <off_t>(offset + done))
        if got < 0:
            if errno == EINTR:
                continue
            f.code = F_IO
            f.a = <uint64_t>errno
            return -1
        if got == 0:
            f.code = F_SHORT_READ
            f.a = done
            f.b = n
            return -1
        done += <size_t>got
    return 0


cdef Py_ssize_t _span_end(
    Py_ssize_t i, Py_ssize_t n_rows, const int64_t* row_cache, const uint64_t* row_sample,
    const uint64_t* index_addr, const uint64_t* index_rows, int64_t c, uint64_t shard_id,
    uint64_t span_off, uint64_t first_len, uint64_t limit, uint64_t shard_len, uint64_t* total,
) noexcept nogil:
    """End row (exclusive) of the run of rows from i whose records lie back to back in one shard
    of cache c starting at span_off, within `limit` bytes in all; `total` gets their byte count.
    Rows that fail any check end the run (their own iteration reports the fault)."""
    cdef Py_ssize_t j = i + 1
    cdef uint64_t end = span_off + first_len, sid, off, rec_len
    cdef const uint8_t* entry
    total[0] = first_len
    while j < n_rows and j - i < SPAN_MAX_ROWS:
        if row_cache[j] != c:
            break
        sid = row_sample[j]
        if sid >= index_rows[c]:
            break
        entry = <const uint8_t*>index_addr[c] + sid * INDEX_ROW_BYTES
        if drt_load_u64le(entry) != shard_id:
            break
        off = drt_load_u64le(entry + 8)
        rec_len = drt_load_u64le(entry + 16)
        if off != end or rec_len < RECORD_HEADER_BYTES or rec_len > shard_len - off or rec_len > limit - total[0]:
            break
        total[0] += rec_len
        end += rec_len
        j += 1
    return j


def gather(
    const uint64_t[::1] index_addr, const uint64_t[::1] index_rows,
    const int64_t[::1] shard_base, const int64_t[::1] shard_count, const uint64_t[::1] cksum_addr,
    const uint64_t[::1] codec_state,
    const int32_t[::1] shard_fd, const uint64_t[::1] shard_len, const uint64_t[::1] shard_ulen,
    const uint8_t[::1] shard_codec,
    const int64_t[::1] row_cache, const uint64_t[::1] row_sample,
    uint8_t[::1] out, int64_t[::1] json_off, int64_t[::1] json_len,
    int64_t[::1] data_off, int64_t[::1] data_len,
    Scratch scratch not None, list cache_labels not None, list shard_names not None,
):
    """Read rows [0, len(row_cache)) into `out`, in order, until done or `out` is full.

    Per cache c: index_addr[c] is the mapped index.bin (index_rows[c] rows of 24 bytes),
    shards shard_base[c] .. shard_base[c]+shard_count[c]-1 of the flat shard tables, and
    cksum_addr[c] the mapped u64 LE checksum sidecar or 0, codec_state[c] the `DecodeState.address`
    of the cache's codec state or 0 (codecs without per-cache state). Per row i: for row i, bytes
    out[json_off[i] : +json_len[i]] are the embedded JSON and out[data_off[i] : +data_len[i]] the
    decoded payload. Returns (rows_done, out_used, need_bytes): need_bytes > 0 only when row
    rows_done alone does not fit in the remaining space of `out` (the caller grows or drains it).
    Complexity O(rows + bytes). Records that lie back to back in one shard (ordered reads) are
    fetched with one pread per run of up to SPAN_MAX_ROWS rows / SPAN_MAX_BYTES (compressed)
    or the rest of `out` (uncompressed, read in place); each record is still checked alone.
    """
    cdef Py_ssize_t n_rows = row_cache.shape[0]
    cdef Py_ssize_t i = 0
    cdef size_t pos = 0, cap = out.shape[0], need = 0
    cdef int64_t c, s
    cdef uint64_t sid, shard_id, off, rec_len, jlen, plen, dsize, expect
    cdef const uint8_t* entry
    cdef const uint8_t* rec
    cdef const uint8_t* payload
    cdef uint8_t* dst
    cdef int codec, status
    cdef int64_t bad_at
    cdef Py_ssize_t span_stop = 0
    cdef uint64_t span_off = 0, span_total = 0
    cdef uint8_t* span_base = NULL
    cdef FaultInfo f
    f.code = F_OK
    f.row = -1
    f.a = 0
    f.b = 0
    f.shard = -1
    f.codec = -1
    if out.shape[0] == 0:
        cap = 0
    with nogil:
        while i < n_rows:
            c = row_cache[i]
            sid = row_sample[i]
            if sid >= index_rows[c]:
                f.code = F_SAMPLE_RANGE
                break
            entry = <const uint8_t*>index_addr[c] + sid * INDEX_ROW_BYTES
            shard_id = drt_load_u64le(entry)
            off = drt_load_u64le(entry + 8)
            rec_len = drt_load_u64le(entry + 16)
            if shard_id >= <uint64_t>shard_count[c]:
                f.code = F_SHARD_ID
                f.a = shard_id
                break
            s = shard_base[c] + <int64_t>shard_id
            f.shard = s
            f.a = off
            f.b = rec_len
            if off > shard_len[s] or rec_len > shard_len[s] - off:
                f.code = F_BOUNDS
                break
            if rec_len < RECORD_HEADER_BYTES:
                f.code = F_ENVELOPE
                break
            f.a = 0
            f.b = 0
            if shard_fd[s] < 0:
                f.code = F_NOT_OPEN
                break
            codec = shard_codec[s]
            f.codec = codec
            if i < span_stop:
                rec = span_base + (off - span_off)  # already read with the run it belongs to
            elif codec == CODEC_NONE:
                if rec_len > cap - pos:
                    need = rec_len
                    f.code = F_OUT_FULL
                    break
                span_stop = _span_end(i, n_rows, &row_cache[0], &row_sample[0], &index_addr[0], &index_rows[0],
                                      c, shard_id, off, rec_len, cap - pos, shard_len[s], &span_total)
                dst = &out[0] + pos
                if _pread_full(shard_fd[s], dst, span_total, off, &f) != 0:
                    break
                span_base = dst
                span_off = off
                rec = dst
            else:
                span_stop = _span_end(i, n_rows, &row_cache[0], &row_sample[0], &index_addr[0], &index_rows[0],
                                      c, shard_id, off, rec_len, max(rec_len, SPAN_MAX_BYTES), shard_len[s], &span_total)
                if scratch.reserve(span_total) != 0:
                    f.code = F_NOMEM
                    f.a = span_total
                    break
                if _pread_full(shard_fd[s], scratch.buf, span_total, off, &f) != 0:
                    break
                span_base = scratch.buf
                span_off = off
                rec = scratch.buf
            if cksum_addr[c] != 0:
                expect = drt_load_u64le(<const uint8_t*>cksum_addr[c] + sid * CHECKSUM_ROW_BYTES)
                if XXH3_64bits(rec, rec_len) != expect:
                    f.code = F_CHECKSUM
                    f.a = expect
                    break
            jlen = drt_load_u64le(rec)
            if jlen > rec_len - RECORD_HEADER_BYTES:
                f.code = F_ENVELOPE
                f.a = jlen
                f.b = rec_len
                break
            bad_at = drt_utf8_invalid_at(rec + RECORD_HEADER_BYTES, jlen)
            if bad_at >= 0:
                f.code = F_UTF8
                f.a = <uint64_t>bad_at
                break
            plen = rec_len - RECORD_HEADER_BYTES - jlen
            payload = rec + RECORD_HEADER_BYTES + jlen
            if codec == CODEC_NONE:  # stored raw: the record was read in place into `out`
                json_off[i] = pos + RECORD_HEADER_BYTES
                json_len[i] = jlen
                data_off[i] = pos + RECORD_HEADER_BYTES + jlen
                data_len[i] = plen
                pos += rec_len
                i += 1
                continue
            # Encoded: decoded size from the codec's header (checked for plausibility by the codec),
            # bounded by the shard's declared total, then decoded straight into `out`.
            status = decoded_size(codec, payload, plen, <const void*>codec_state[c], &dsize)
            if status != F_OK:
                f.code = status
                f.a = dsize if status == F_DECODE else <uint64_t>codec
                f.b = plen
                break
            if dsize > shard_ulen[s]:
                f.code = F_DECODED_LIMIT
                f.a = dsize
                f.b = shard_ulen[s]
                break
            if jlen + dsize > cap - pos:
                need = jlen + dsize
                f.code = F_OUT_FULL
                break
            dst = &out[0] + pos
            memcpy(dst, rec + RECORD_HEADER_BYTES, jlen)
            status = decode(codec, payload, plen, dst + jlen, dsize, &scratch.codecs, <const void*>codec_state[c])
            if status != F_OK:
                f.code = status
                if status == F_STATE:  # what the record names vs its cache's state
                    f.a = scratch.codecs.state_found
                    f.b = scratch.codecs.state_expected
                break
            json_off[i] = pos
            json_len[i] = jlen
            data_off[i] = pos + jlen
            data_len[i] = dsize
            pos += jlen + dsize
            i += 1
    if f.code == F_OK or f.code == F_OUT_FULL:
        return i, pos, need
    f.row = i
    _raise_fault(&f, row_cache, row_sample, cache_labels, shard_names)


cdef int _raise_fault(FaultInfo* f, const int64_t[::1] row_cache, const uint64_t[::1] row_sample,
                      list cache_labels, list shard_names) except -1:
    """Word a gather fault (naming cache, sample and shard) and raise it through raise_fault."""
    cdef int64_t c = row_cache[f.row]
    cdef uint64_t sid = row_sample[f.row]
    where = f"{cache_labels[c]} sample {sid}"
    shard = shard_names[f.shard] if f.shard >= 0 else "?"
    path = shard if f.shard >= 0 else None
    os_errno = None
    codec = CODEC_BY_ID[f.codec].name if f.codec in CODEC_BY_ID else f"id {f.codec}"
    if f.code == F_SAMPLE_RANGE:
        message = f"sample_id {sid} is out of range for {cache_labels[c]}"
    elif f.code == F_SHARD_ID:
        message = f"index references missing shard {f.a}: {where}"
    elif f.code == F_BOUNDS:
        # dataset-rt reports this as the short read it causes (RuntimeError "I/O error: failed to
        # fill whole buffer"); datasetrt refuses it before reading, so no truncated record escapes.
        message = (f"I/O error: failed to fill whole buffer: index entry (offset {f.a}, byte_len {f.b}) "
                   f"lies outside shard {shard}: {where}")
    elif f.code == F_IO:
        os_errno = <int>f.a
        message = f"I/O error: {os_error_text(os_errno)}: shard {shard}: {where}"
    elif f.code == F_SHORT_READ:
        message = (f"I/O error: failed to fill whole buffer (read {f.a} of {f.b} bytes; shard {shard} "
                   f"changed on disk?): {where}")
    elif f.code == F_CHECKSUM:
        message = f"record checksum mismatch for {where} (shard {shard})"
    elif f.code == F_ENVELOPE:
        message = f"invalid binary record: {where} (shard {shard})"
    elif f.code == F_DECODE:
        detail = f" (declared decoded size {f.a} is impossible for {f.b} stored bytes)" if f.a else ""
        message = f"failed to decompress {codec} payload{detail}: {where} (shard {shard})"
    elif f.code == F_DECODED_LIMIT:
        message = (f"failed to decompress {codec} payload: decoded size {f.a} exceeds the shard's "
                   f"uncompressed_byte_len {f.b}: {where} (shard {shard})")
    elif f.code == F_UTF8:
        message = f"JSON error: embedded metadata is not valid UTF-8 (byte {f.a}): {where} (shard {shard})"
    elif f.code == F_NOT_OPEN:
        message = f"shard {shard} is not open for reading: {where}"
    elif f.code == F_NOMEM:
        message = f"cannot allocate {f.a} bytes of read scratch for {where}"
    elif f.code == F_CODEC:
        message = f"unknown codec id {f.a} for shard {shard}: {where}"
    elif f.code == F_STATE and f.b == 0:
        message = f"{codec} payload needs its cache's dictionary, but none is loaded: {where} (shard {shard})"
    elif f.code == F_STATE:
        message = (f"{codec} payload was compressed with dictionary id {f.a}, but the cache's dictionary has id "
                   f"{f.b}: {where} (shard {shard})")
    else:
        message = f"gather fault {f.code}: {where}"
    return raise_fault(f.code, message, os_errno, path)


# -- batch mode: payloads back to back in their final layout ------------------------------------
# `gather_batch` shares the record checks of `gather` (bounds, XXH3, envelope, UTF-8, codec sizes)
# through the helpers below; it writes no JSON between payloads, so the payload bytes of a batch
# are its final `[n, *shape]` (dense) or values (ragged) layout as they land.


cdef struct RecordAt:
    int64_t shard       # flat shard index (shard_base[c] + shard_id)
    uint64_t shard_id   # shard number within its cache
    uint64_t off        # byte offset of the stored record in its shard
    uint64_t rec_len    # stored record bytes (header + JSON + stored payload)


cdef inline int _locate(int64_t c, uint64_t sid, const uint64_t* index_addr, const uint64_t* index_rows,
                        const int64_t* shard_base, const int64_t* shard_count, const uint64_t* shard_len,
                        const int32_t* shard_fd, RecordAt* r, FaultInfo* f) noexcept nogil:
    """The index entry of (cache c, sample sid), checked against the shard table before use: 0,
    or -1 with the fault in f (the codes and fields `gather` reports for the same faults)."""
    cdef const uint8_t* entry
    if sid >= index_rows[c]:
        f.code = F_SAMPLE_RANGE
        return -1
    entry = <const uint8_t*>index_addr[c] + sid * INDEX_ROW_BYTES
    r.shard_id = drt_load_u64le(entry)
    r.off = drt_load_u64le(entry + 8)
    r.rec_len = drt_load_u64le(entry + 16)
    if r.shard_id >= <uint64_t>shard_count[c]:
        f.code = F_SHARD_ID
        f.a = r.shard_id
        return -1
    r.shard = shard_base[c] + <int64_t>r.shard_id
    f.shard = r.shard
    if r.off > shard_len[r.shard] or r.rec_len > shard_len[r.shard] - r.off:
        f.code = F_BOUNDS
        f.a = r.off
        f.b = r.rec_len
        return -1
    if r.rec_len < RECORD_HEADER_BYTES:
        f.code = F_ENVELOPE
        return -1
    if shard_fd[r.shard] < 0:
        f.code = F_NOT_OPEN
        return -1
    return 0


cdef inline int _check_record(const uint8_t* rec, uint64_t rec_len, uint64_t cksum_addr, uint64_t sid,
                              uint64_t* jlen, FaultInfo* f) noexcept nogil:
    """The stored record rec[0:rec_len] before any of its bytes are used: XXH3-64 against the
    sidecar (when cksum_addr != 0), the JSON length, the JSON's UTF-8. 0 with *jlen, or -1."""
    cdef uint64_t expect
    cdef int64_t bad_at
    if cksum_addr != 0:
        expect = drt_load_u64le(<const uint8_t*>cksum_addr + sid * CHECKSUM_ROW_BYTES)
        if XXH3_64bits(rec, rec_len) != expect:
            f.code = F_CHECKSUM
            f.a = expect
            return -1
    jlen[0] = drt_load_u64le(rec)
    if jlen[0] > rec_len - RECORD_HEADER_BYTES:
        f.code = F_ENVELOPE
        f.a = jlen[0]
        f.b = rec_len
        return -1
    bad_at = drt_utf8_invalid_at(rec + RECORD_HEADER_BYTES, jlen[0])
    if bad_at >= 0:
        f.code = F_UTF8
        f.a = <uint64_t>bad_at
        return -1
    return 0


def gather_batch(
    const uint64_t[::1] index_addr, const uint64_t[::1] index_rows,
    const int64_t[::1] shard_base, const int64_t[::1] shard_count, const uint64_t[::1] cksum_addr,
    const uint64_t[::1] codec_state,
    const int32_t[::1] shard_fd, const uint64_t[::1] shard_len, const uint64_t[::1] shard_ulen,
    const uint8_t[::1] shard_codec,
    const int64_t[::1] row_cache, const uint64_t[::1] row_sample,
    uint8_t[::1] out, int64_t[::1] offsets, int64_t[::1] json_off, int64_t[::1] json_len,
    int64_t record_bytes, uint64_t unit_bytes, size_t start, size_t json_bottom,
    Scratch scratch not None, list cache_labels not None, list shard_names not None, str spec_label not None,
):
    """Read rows [0, n) into `out` in their final batch layout, in order, until done or `out` is full.

    The decoded payload of row i is out[offsets[i] : offsets[i+1]] (`offsets` int64, n+1 entries,
    offsets[0] = start): payloads lie back to back from out[start] (a call continuing an earlier
    one passes that call's returned payload end and JSON bottom as `start` and `json_bottom`; a
    first call 0 and len(out)), so out[:offsets[n]] is the batch's `[n, *shape]` array (dense
    spec) or ragged values, as written. Embedded JSON: when `json_off` and `json_len` have n
    entries, row i's JSON is kept at out[json_off[i] : +json_len[i]], stacked down from
    `json_bottom` (always above the payloads); when they are empty, it is
    checked (length, UTF-8) and dropped. The payload spec is checked on each decoded length before
    anything is written: `record_bytes >= 0` -> exactly that many bytes; `unit_bytes > 1` -> a
    multiple of it; a mismatch is a CacheFormatError naming the cache, the sample, the length and
    `spec_label`. Every other check is `gather`'s (index bounds, XXH3, envelope, UTF-8, codec sizes,
    the record's codec state against its cache's: `codec_state` as in `gather`).

    Returns (rows_done, payload_end, json_bottom, need_bytes): rows_done < n when `out` is full,
    and need_bytes > 0 when row rows_done alone (payload, plus its JSON when kept) does not fit in
    what is left. O(rows + bytes).

    Uncompressed records, JSON dropped: a run of neighbouring records is read with one pread
    straight into `out` at the write position, and each payload is then moved down over its own
    header and JSON (memmove of bytes still in the CPU cache; docs/architecture.md has the
    measurement that chose this over preadv). A record that does not fit in place, compressed
    records (runs of at most SPAN_MAX_BYTES) and records whose JSON is kept are staged in the
    scratch buffer, then decoded (or copied) into place.
    """
    cdef Py_ssize_t n_rows = row_cache.shape[0]
    cdef Py_ssize_t i = 0
    cdef bint keep_json = json_off.shape[0] > 0
    cdef size_t pos = start, need = 0, json_top = json_bottom, kept
    cdef int64_t c
    cdef uint64_t sid, jlen, plen, dsize, limit
    cdef RecordAt r
    cdef const uint8_t* rec
    cdef const uint8_t* payload
    cdef uint8_t* base = &out[0] if out.shape[0] else NULL
    cdef int codec, status
    cdef Py_ssize_t span_stop = 0
    cdef uint64_t span_off = 0, span_total = 0
    cdef const uint8_t* span_base = NULL
    cdef FaultInfo f
    if start > json_bottom or json_bottom > <size_t>out.shape[0]:
        raise_fault(F_ARGUMENT, f"gather_batch: start {start} and json_bottom {json_bottom} must satisfy "
                                f"start <= json_bottom <= len(out) = {out.shape[0]}")
    if offsets.shape[0] < n_rows + 1 or (keep_json and (json_off.shape[0] < n_rows or json_len.shape[0] < n_rows)):
        raise_fault(F_ARGUMENT, f"gather_batch: {n_rows} rows need {n_rows + 1} offsets (got {offsets.shape[0]}) and, "
                                f"with JSON kept, {n_rows} JSON spans (got {json_off.shape[0]}, {json_len.shape[0]})")
    f.code = F_OK
    f.row = -1
    f.a = 0
    f.b = 0
    f.shard = -1
    f.codec = -1
    if n_rows:
        offsets[0] = start
    with nogil:
        while i < n_rows:
            c = row_cache[i]
            sid = row_sample[i]
            if _locate(c, sid, &index_addr[0], &index_rows[0], &shard_base[0], &shard_count[0], &shard_len[0],
                       &shard_fd[0], &r, &f) != 0:
                break
            codec = shard_codec[r.shard]
            f.codec = codec
            if i < span_stop:
                rec = span_base + (r.off - span_off)  # read with the run it belongs to
            elif codec == CODEC_NONE and not keep_json and r.rec_len <= json_top - pos:
                limit = min(json_top - pos, max(<uint64_t>INPLACE_SPAN_BYTES, r.rec_len))
                span_stop = _span_end(i, n_rows, &row_cache[0], &row_sample[0], &index_addr[0], &index_rows[0],
                                      c, r.shard_id, r.off, r.rec_len, limit, shard_len[r.shard], &span_total)
                if _pread_full(shard_fd[r.shard], base + pos, span_total, r.off, &f) != 0:
                    break
                span_base = base + pos
                span_off = r.off
                rec = span_base
            else:
                limit = r.rec_len if codec == CODEC_NONE and not keep_json else max(r.rec_len, SPAN_MAX_BYTES)
                span_stop = _span_end(i, n_rows, &row_cache[0], &row_sample[0], &index_addr[0], &index_rows[0],
                                      c, r.shard_id, r.off, r.rec_len, limit, shard_len[r.shard], &span_total)
                if scratch.reserve(span_total) != 0:
                    f.code = F_NOMEM
                    f.a = span_total
                    break
                if _pread_full(shard_fd[r.shard], scratch.buf, span_total, r.off, &f) != 0:
                    break
                span_base = scratch.buf
                span_off = r.off
                rec = scratch.buf
            if _check_record(rec, r.rec_len, cksum_addr[c], sid, &jlen, &f) != 0:
                break
            plen = r.rec_len - RECORD_HEADER_BYTES - jlen
            payload = rec + RECORD_HEADER_BYTES + jlen
            status = decoded_size(codec, payload, plen, <const void*>codec_state[c], &dsize)
            if status != F_OK:
                f.code = status
                f.a = dsize if status == F_DECODE else <uint64_t>codec
                f.b = plen
                break
            if dsize > shard_ulen[r.shard]:
                f.code = F_DECODED_LIMIT
                f.a = dsize
                f.b = shard_ulen[r.shard]
                break
            if (record_bytes >= 0 and dsize != <uint64_t>record_bytes) or (unit_bytes > 1 and dsize % unit_bytes != 0):
                f.code = F_PAYLOAD_SPEC
                f.a = dsize
                break
            kept = jlen if keep_json else 0
            if dsize + kept > json_top - pos:
                need = dsize + kept
                f.code = F_OUT_FULL
                break
            if keep_json:
                json_top -= jlen
                memcpy(base + json_top, rec + RECORD_HEADER_BYTES, jlen)
                json_off[i] = json_top
                json_len[i] = jlen
            if codec == CODEC_NONE:
                if dsize:
                    memmove(base + pos, payload, dsize)  # in place: down over its own header and JSON
            else:
                status = decode(codec, payload, plen, base + pos, dsize, &scratch.codecs, <const void*>codec_state[c])
                if status != F_OK:
                    f.code = status
                    if status == F_STATE:  # what the record names vs its cache's state
                        f.a = scratch.codecs.state_found
                        f.b = scratch.codecs.state_expected
                    break
            pos += dsize
            offsets[i + 1] = pos
            i += 1
    if f.code == F_OK or f.code == F_OUT_FULL:
        return i, pos, json_top, need
    f.row = i
    if f.code == F_PAYLOAD_SPEC:
        expected = f"{record_bytes} bytes" if record_bytes >= 0 else f"a multiple of {unit_bytes} bytes"
        raise_fault(F_PAYLOAD_SPEC, f"payload of {f.a} bytes does not fit payload spec {spec_label} (expected {expected}): "
                                    f"{cache_labels[row_cache[i]]} sample {row_sample[i]} (shard {shard_names[f.shard]})")
    _raise_fault(&f, row_cache, row_sample, cache_labels, shard_names)
