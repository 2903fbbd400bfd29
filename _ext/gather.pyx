# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Record gather kernels: index lookup, pread, integrity check, envelope split, decompress, in two
output layouts: `gather` (each record's JSON then its payload) and `gather_batch` (payloads back
to back in their final batch layout).

Boundary: a reader's `CacheTable` (table.pyx: mapped indexes, shard descriptors and sizes), the
rows to read and caller-provided buffers in; decoded bytes out. It knows the record byte layout
(docs/storage-format.md) and nothing of tables, sampling or processes; it imports no numpy.

Trust: the caller validated the manifest and the rows (every cache position names a cache of the
table, mapped before the gather), but nothing read from disk is trusted: every index entry, offset, length, JSON length and
codec size prefix is bounds-checked before it is used, and a record's XXH3-64 is checked (when
the cache has a checksum sidecar) before any of its bytes are interpreted.

One path per record, shared by both kernels, each step a `noexcept nogil` helper that either
succeeds or fills a `FaultInfo` and stops the loop:
  _locate        the index entry: sample range, shard id, bounds within the shard, open shard
  _read_run      one pread of the run of neighbouring records from there (in place or staged), or
                 one memcpy when the shard is mapped (`CacheTable.map_shard`): either way the bytes
                 land in the output or the scratch first, and every check reads that copy, so a
                 file changed after the check cannot change what is returned
  _check_record  XXH3-64 against the sidecar, JSON length, JSON UTF-8
  _payload_size  the codec's declared decoded size, bounded by the shard's uncompressed_byte_len
  _decode        the codec's decode into the output (a codec with per-cache state gets its cache's)
Staging is bounded by the caller's buffer: a record is staged only when its stored bytes fit in
what is left of the output or in SPAN_MAX_BYTES; a larger one ends the call with its stored size
as the need, before a byte of it is read, so the scratch never grows past max(SPAN_MAX_BYTES, the
output's size) and the caller checks the need against its memory limit.
After the loop, `_raise_fault` words the fault (cache directory, sample, shard file) and raises it
through the kernels' one choke point, `faults.raise_fault`, so a fault reads the same whichever
kernel met it. Codecs are decoded through the codec table's helpers (codecs.pxd), so this module
names no codec but the identity one, whose records are read in place.
"""

from libc.errno cimport EINTR, errno
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memmove
from posix.types cimport off_t
from posix.unistd cimport pread

from codecs cimport CODEC_NONE, DecodeContext, decode, decode_context_free, decode_context_init, decoded_size
from datasetrt._native.table cimport CacheArrays, CacheTable
from faults cimport (
    F_ARGUMENT, F_BOUNDS, F_CHECKSUM, F_CODEC, F_DECODE, F_DECODED_LIMIT, F_ENVELOPE, F_IO, F_NOMEM, F_NOT_OPEN, F_OK,
    F_OUT_FULL, F_PAYLOAD_SPEC, F_SAMPLE_RANGE, F_SHARD_ID, F_SHORT_READ, F_STATE, F_UTF8, raise_fault,
)
from layout cimport CHECKSUM_ROW_BYTES, INDEX_ROW_BYTES, RECORD_HEADER_BYTES

from datasetrt.errors import os_error_text
from datasetrt.values.codecs import CODEC_BY_ID


cdef extern from "xxh3_wide.h" nogil:
    # XXH3_64bits with AVX2 where the CPU has it (the baseline libxxhash is SSE2): same values.
    uint64_t drt_xxh3_64(const void* data, size_t length)

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
    # An in-place run of uncompressed records (gather_batch) is checked and moved down right after
    # its pread: it must still be in the CPU's L2 cache then, or the check and the memmove read it
    # back from memory.
    INPLACE_SPAN_BYTES = 262144


cdef struct Staging:
    uint8_t* buf
    size_t cap


cdef class Scratch:
    """Per-reader scratch: a growable staging buffer for runs of records that are not read in place
    (compressed ones, among others) and the codecs' decoding contexts (codecs.pxd DecodeContext).

    Not thread-safe; one per reading thread/process. Memory held: the largest run staged so far
    (at most SPAN_MAX_BYTES, or one record when that is larger, which then fit in the caller's
    output buffer) plus one ZSTD_DCtx.
    """
    cdef Staging staging
    cdef DecodeContext codecs

    def __cinit__(self):
        self.staging.buf = NULL
        self.staging.cap = 0
        if decode_context_init(&self.codecs) != F_OK:
            decode_context_free(&self.codecs)
            raise_fault(F_NOMEM, "cannot allocate the codecs' decoding contexts")

    def __dealloc__(self):
        free(self.staging.buf)
        decode_context_free(&self.codecs)

    @property
    def capacity(self):
        """Bytes of the staging buffer now."""
        return self.staging.cap


cdef inline int _reserve(Staging* s, size_t n) noexcept nogil:
    cdef uint8_t* p
    if n <= s.cap:
        return 0
    p = <uint8_t*>realloc(s.buf, n)
    if p == NULL:
        return -1
    s.buf = p
    s.cap = n
    return 0


# -- one record's path: the helpers both kernels use ----------------------------------------------

cdef struct FaultInfo:
    int code        # F_* (faults.pxd); F_OK while the loop runs, F_OUT_FULL when `out` filled
    int codec       # codec id of the row's shard (-1 before it is known)
    Py_ssize_t row  # the row that failed
    uint64_t a      # details, by code (see _raise_fault)
    uint64_t b
    int64_t shard   # flat shard index (-1 before it is known)


cdef struct Rows:
    const int64_t* cache    # per row: cache position in the table
    const uint64_t* sample  # per row: sample_id within its cache
    Py_ssize_t n


cdef struct RecordAt:
    int64_t shard       # flat shard index (shard_base[c] + shard_id)
    uint64_t shard_id   # shard number within its cache
    uint64_t off        # byte offset of the stored record in its shard
    uint64_t rec_len    # stored record bytes (header + JSON + stored payload)


cdef struct Run:
    Py_ssize_t stop       # rows before `stop` (from the row that started it) were read with this run
    uint64_t off          # shard offset of the run's first byte
    const uint8_t* base   # the run's first byte in memory: in the output (in place) or the scratch buffer


cdef inline void _fault_init(FaultInfo* f) noexcept nogil:
    f.code = F_OK
    f.codec = -1
    f.row = -1
    f.a = 0
    f.b = 0
    f.shard = -1


cdef inline int _locate(const CacheArrays* t, int64_t c, uint64_t sid, RecordAt* r, FaultInfo* f) noexcept nogil:
    """The index entry of (cache c, sample sid), checked against the shard table before use: 0,
    or -1 with the fault in f (F_SAMPLE_RANGE, F_SHARD_ID, F_BOUNDS, F_ENVELOPE, F_NOT_OPEN)."""
    cdef const uint8_t* entry
    if sid >= t.index_rows[c]:
        f.code = F_SAMPLE_RANGE
        return -1
    entry = t.index[c] + sid * INDEX_ROW_BYTES
    r.shard_id = drt_load_u64le(entry)
    r.off = drt_load_u64le(entry + 8)
    r.rec_len = drt_load_u64le(entry + 16)
    if r.shard_id >= <uint64_t>t.shard_count[c]:
        f.code = F_SHARD_ID
        f.a = r.shard_id
        return -1
    r.shard = t.shard_base[c] + <int64_t>r.shard_id
    f.shard = r.shard
    f.codec = t.shard_codec[r.shard]
    if r.off > t.shard_len[r.shard] or r.rec_len > t.shard_len[r.shard] - r.off:
        f.code = F_BOUNDS
        f.a = r.off
        f.b = r.rec_len
        return -1
    if r.rec_len < RECORD_HEADER_BYTES:
        f.code = F_ENVELOPE
        return -1
    if t.shard_fd[r.shard] < 0:
        f.code = F_NOT_OPEN
        return -1
    return 0


cdef Py_ssize_t _span_end(const CacheArrays* t, const Rows* rows, Py_ssize_t i, const RecordAt* r, uint64_t limit,
                          uint64_t* total) noexcept nogil:
    """End row (exclusive) of the run of rows from i whose records lie back to back in r's shard
    from r.off on, within `limit` bytes in all (limit >= r.rec_len); `total` gets their byte
    count. A row that fails any check ends the run (its own `_locate` reports the fault)."""
    cdef Py_ssize_t j = i + 1
    cdef int64_t c = rows.cache[i]
    cdef uint64_t end = r.off + r.rec_len, sid, off, rec_len, shard_len = t.shard_len[r.shard]
    cdef const uint8_t* entry
    total[0] = r.rec_len
    while j < rows.n and j - i < SPAN_MAX_ROWS:
        if rows.cache[j] != c:
            break
        sid = rows.sample[j]
        if sid >= t.index_rows[c]:
            break
        entry = t.index[c] + sid * INDEX_ROW_BYTES
        if drt_load_u64le(entry) != r.shard_id:
            break
        off = drt_load_u64le(entry + 8)
        rec_len = drt_load_u64le(entry + 16)
        if off != end or rec_len < RECORD_HEADER_BYTES or rec_len > shard_len - off or rec_len > limit - total[0]:
            break
        total[0] += rec_len
        end += rec_len
        j += 1
    return j


cdef inline int _pread_full(int fd, uint8_t* dst, size_t n, uint64_t offset, FaultInfo* f) noexcept nogil:
    """Read exactly n bytes at `offset` (retrying on EINTR): 0, or -1 with F_IO (a = errno) or
    F_SHORT_READ (a = bytes read, b = n: the file shrank since it was checked)."""
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


cdef inline int _read_run(const CacheArrays* t, const Rows* rows, Py_ssize_t i, const RecordAt* r, uint8_t* dst,
                          uint64_t limit, Staging* staging, Run* run, FaultInfo* f) noexcept nogil:
    """Read the run of neighbouring records that starts at row i (record r; at most `limit` bytes,
    limit >= r.rec_len) with one pread, or one memcpy from the shard's mapping when it has one: into `dst` (in place; the caller made room for `limit`
    bytes) or, when dst is NULL, into the staging buffer, grown as needed (F_NOMEM). `run` then
    says which rows it holds and where. 0, or -1 with the fault in f."""
    cdef uint64_t total
    run.stop = _span_end(t, rows, i, r, limit, &total)
    if dst == NULL:
        if _reserve(staging, total) != 0:
            f.code = F_NOMEM
            f.a = total
            return -1
        dst = staging.buf
    if t.shard_map[r.shard] != NULL:  # a mapped shard: the same bytes, copied without a syscall
        memcpy(dst, t.shard_map[r.shard] + r.off, total)
    elif _pread_full(t.shard_fd[r.shard], dst, total, r.off, f) != 0:
        return -1
    run.off = r.off
    run.base = dst
    return 0


cdef inline int _check_record(const CacheArrays* t, int64_t c, uint64_t sid, const uint8_t* rec, uint64_t rec_len,
                              uint64_t* jlen, FaultInfo* f) noexcept nogil:
    """The stored record rec[0:rec_len] before any of its bytes are used: XXH3-64 against the
    sidecar (when cache c has one mapped), the JSON length, the JSON's UTF-8. 0 with *jlen (the
    JSON's length), or -1 with F_CHECKSUM, F_ENVELOPE or F_UTF8."""
    cdef uint64_t expect
    cdef int64_t bad_at
    if t.checksums[c] != NULL:
        expect = drt_load_u64le(t.checksums[c] + sid * CHECKSUM_ROW_BYTES)
        if drt_xxh3_64(rec, rec_len) != expect:
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


cdef inline int _payload_size(const CacheArrays* t, int64_t c, const RecordAt* r, int codec, const uint8_t* payload,
                              uint64_t plen, uint64_t* dsize, FaultInfo* f) noexcept nogil:
    """The decoded size of the stored payload payload[0:plen] as its codec declares it (the stored
    size itself when uncompressed), once plausible for plen bytes (F_DECODE, F_CODEC) and within
    the shard's uncompressed_byte_len (F_DECODED_LIMIT). 0 with *dsize, or -1."""
    cdef int status = decoded_size(codec, payload, plen, t.codec_state[c], dsize)
    if status != F_OK:
        f.code = status
        f.a = dsize[0] if status == F_DECODE else <uint64_t>codec
        f.b = plen
        return -1
    if dsize[0] > t.shard_ulen[r.shard]:
        f.code = F_DECODED_LIMIT
        f.a = dsize[0]
        f.b = t.shard_ulen[r.shard]
        return -1
    return 0


cdef inline int _decode(const CacheArrays* t, int64_t c, int codec, const uint8_t* payload, uint64_t plen,
                        uint8_t* dst, uint64_t dsize, DecodeContext* ctx, FaultInfo* f) noexcept nogil:
    """Decode payload[0:plen] (`_payload_size` said dsize) into dst[0:dsize]: 0, or -1 with
    F_DECODE, or F_STATE when the record names another codec state than cache c's (a: what the
    record names, b: the cache's, 0 for none)."""
    cdef int status = decode(codec, payload, plen, dst, dsize, ctx, t.codec_state[c])
    if status != F_OK:
        f.code = status
        if status == F_STATE:
            f.a = ctx.state_found
            f.b = ctx.state_expected
        return -1
    return 0


cdef Rows _rows(const int64_t[::1] cache_pos, const uint64_t[::1] sample_id, str kernel) except *:
    """The rows of a call (cache_pos int64, sample_id uint64, equally long)."""
    cdef Rows rows
    if sample_id.shape[0] != cache_pos.shape[0]:
        raise_fault(F_ARGUMENT, f"{kernel}: {cache_pos.shape[0]} cache positions but {sample_id.shape[0]} sample ids")
    rows.n = cache_pos.shape[0]
    rows.cache = &cache_pos[0] if rows.n else NULL
    rows.sample = &sample_id[0] if rows.n else NULL
    return rows


cdef int _raise_fault(CacheTable table, const FaultInfo* f, const Rows* rows, check=None) except -1:
    """Word the fault of row f.row (naming cache, sample and shard) and raise it through
    raise_fault; `check` is gather_batch's payload rule (for F_PAYLOAD_SPEC)."""
    cdef int64_t c = rows.cache[f.row]
    cdef uint64_t sid = rows.sample[f.row]
    label = table.labels[c]
    where = f"{label} sample {sid}"
    shard = table.shard_names[f.shard] if f.shard >= 0 else "?"
    path = shard if f.shard >= 0 else None
    codec = CODEC_BY_ID[f.codec].name if f.codec in CODEC_BY_ID else f"id {f.codec}"
    os_errno = None
    if f.code == F_SAMPLE_RANGE:
        message = f"sample_id {sid} is out of range for {label}"
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
    elif f.code == F_PAYLOAD_SPEC:
        expected = f"{check.record_bytes} bytes" if check.record_bytes >= 0 else f"a multiple of {check.unit_bytes} bytes"
        message = (f"payload of {f.a} bytes does not fit payload spec {check.label} (expected {expected}): "
                   f"{where} (shard {shard})")
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


# -- the record layout: each record's JSON, then its payload ---------------------------------------

def gather(
    CacheTable table not None,
    const int64_t[::1] cache_pos, const uint64_t[::1] sample_id,
    uint8_t[::1] out, int64_t[::1] json_off, int64_t[::1] json_len, int64_t[::1] data_off, int64_t[::1] data_len,
    Scratch scratch not None,
):
    """Read rows [0, n) (row i: sample sample_id[i] of the table's cache cache_pos[i]) into `out`,
    in order, until done or `out` is full.

    Row i's embedded JSON is out[json_off[i] : +json_len[i]] and its decoded payload
    out[data_off[i] : +data_len[i]] (the four int64 outputs have at least n entries; offsets
    relative to `out`). Returns (rows_done, out_used, need_bytes): need_bytes > 0 only when row
    rows_done alone does not fit in the remaining space of `out` (the caller grows or drains it):
    its decoded size as its codec declares it, before anything is decoded, or (a record over
    SPAN_MAX_BYTES) its stored size, before it is read. The caller checks a need against its
    memory limit before it allocates anything for it.
    O(rows + bytes). Records that lie back to back in one shard (ordered reads) are fetched with
    one pread per run: an uncompressed run straight into `out` (up to the rest of `out`, the
    record then already in its layout), a compressed one staged in `scratch` (at most
    SPAN_MAX_ROWS rows / SPAN_MAX_BYTES, or one record when that is larger) and decoded into
    `out`; each record is still checked alone.
    """
    cdef Rows rows = _rows(cache_pos, sample_id, "gather")
    if json_off.shape[0] < rows.n or json_len.shape[0] < rows.n or data_off.shape[0] < rows.n \
            or data_len.shape[0] < rows.n:
        raise_fault(F_ARGUMENT, f"gather: {rows.n} rows need {rows.n} JSON and payload spans (got {json_off.shape[0]}, "
                                f"{json_len.shape[0]}, {data_off.shape[0]}, {data_len.shape[0]})")
    cdef const CacheArrays* t = &table.arrays
    cdef Py_ssize_t i = 0
    cdef size_t pos = 0, cap = out.shape[0], need = 0
    cdef uint8_t* base = &out[0]
    cdef int64_t c
    cdef uint64_t sid, jlen, plen, dsize
    cdef const uint8_t* rec
    cdef const uint8_t* payload
    cdef int codec
    cdef RecordAt r
    cdef Run run
    cdef FaultInfo f
    run.stop, run.off, run.base = 0, 0, NULL
    _fault_init(&f)
    with nogil:
        while i < rows.n:
            c = rows.cache[i]
            sid = rows.sample[i]
            if _locate(t, c, sid, &r, &f) != 0:
                break
            codec = f.codec
            if i >= run.stop:  # not read with an earlier run: start one here
                if codec == CODEC_NONE:  # read in place: the record is its own layout
                    if r.rec_len > cap - pos:
                        need = r.rec_len
                        f.code = F_OUT_FULL
                        break
                    if _read_run(t, &rows, i, &r, base + pos, cap - pos, &scratch.staging, &run, &f) != 0:
                        break
                elif r.rec_len > cap - pos and r.rec_len > SPAN_MAX_BYTES:  # staged within bounds (module doc)
                    need = r.rec_len
                    f.code = F_OUT_FULL
                    break
                elif _read_run(t, &rows, i, &r, NULL, max(r.rec_len, <uint64_t>SPAN_MAX_BYTES), &scratch.staging, &run,
                               &f) != 0:
                    break
            rec = run.base + (r.off - run.off)
            if _check_record(t, c, sid, rec, r.rec_len, &jlen, &f) != 0:
                break
            plen = r.rec_len - RECORD_HEADER_BYTES - jlen
            payload = rec + RECORD_HEADER_BYTES + jlen
            if _payload_size(t, c, &r, codec, payload, plen, &dsize, &f) != 0:
                break
            if codec == CODEC_NONE:  # at out[pos] already: header, JSON, payload
                json_off[i] = pos + RECORD_HEADER_BYTES
                json_len[i] = jlen
                data_off[i] = pos + RECORD_HEADER_BYTES + jlen
                data_len[i] = plen
                pos += r.rec_len
                i += 1
                continue
            if jlen + dsize > cap - pos:
                need = jlen + dsize
                f.code = F_OUT_FULL
                break
            memcpy(base + pos, rec + RECORD_HEADER_BYTES, jlen)
            if _decode(t, c, codec, payload, plen, base + pos + jlen, dsize, &scratch.codecs, &f) != 0:
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
    _raise_fault(table, &f, &rows)


# -- the batch layout: payloads back to back ------------------------------------------------------
# `gather_batch` writes no JSON between payloads, so the payload bytes of a batch are its final
# `[n, *shape]` (dense) or values (ragged) layout as they land.

def gather_batch(
    CacheTable table not None,
    const int64_t[::1] cache_pos, const uint64_t[::1] sample_id,
    uint8_t[::1] out, int64_t[::1] offsets, int64_t[::1] json_off, int64_t[::1] json_len,
    check not None, size_t start, size_t json_bottom,
    Scratch scratch not None,
):
    """Read rows [0, n) (as `gather`) into `out` in their final batch layout, in order, until done
    or `out` is full.

    The decoded payload of row i is out[offsets[i] : offsets[i+1]] (`offsets` int64, n+1 entries,
    offsets[0] = start): payloads lie back to back from out[start] (a call continuing an earlier
    one passes that call's returned payload end and JSON bottom as `start` and `json_bottom`; a
    first call 0 and len(out)), so out[:offsets[n]] is the batch's `[n, *shape]` array (dense
    spec) or ragged values, as written. Embedded JSON: when `json_off` and `json_len` have n
    entries, row i's JSON is kept at out[json_off[i] : +json_len[i]], stacked down from
    `json_bottom` (always above the payloads); when they are empty, it is checked (length, UTF-8)
    and dropped. `check` (a `PayloadCheck`: record_bytes, unit_bytes, label) is the payload
    spec's length rule, checked on each decoded length before anything is written:
    `record_bytes >= 0` -> exactly that many bytes; `unit_bytes > 1` -> a multiple of it; a
    mismatch is a CacheFormatError naming the cache, the sample, the length and the spec. Every
    other check is `gather`'s, made by the same helpers.

    Returns (rows_done, payload_end, json_bottom, need_bytes): rows_done < n when `out` is full,
    and need_bytes > 0 when row rows_done alone (payload, plus its JSON when kept; its stored size
    when a record over SPAN_MAX_BYTES would be staged first) does not fit in what is left.
    O(rows + bytes).

    Uncompressed records, JSON dropped: a run of neighbouring records (at most INPLACE_SPAN_BYTES,
    or one record when that is larger) is read with one pread straight into `out` at the write
    position, and each payload is then moved down over its own header and JSON (memmove of bytes
    still in the CPU cache; docs/architecture.md says why this and not preadv). A record that does
    not fit in place, compressed records (runs of at most SPAN_MAX_BYTES) and records whose JSON is
    kept are staged in the scratch buffer, then decoded (or copied) into place.
    """
    cdef Rows rows = _rows(cache_pos, sample_id, "gather_batch")
    cdef bint keep_json = json_off.shape[0] > 0
    if start > json_bottom or json_bottom > <size_t>out.shape[0]:
        raise_fault(F_ARGUMENT, f"gather_batch: start {start} and json_bottom {json_bottom} must satisfy "
                                f"start <= json_bottom <= len(out) = {out.shape[0]}")
    if offsets.shape[0] < rows.n + 1 or (keep_json and (json_off.shape[0] < rows.n or json_len.shape[0] < rows.n)):
        raise_fault(F_ARGUMENT, f"gather_batch: {rows.n} rows need {rows.n + 1} offsets (got {offsets.shape[0]}) and, "
                                f"with JSON kept, {rows.n} JSON spans (got {json_off.shape[0]}, {json_len.shape[0]})")
    cdef int64_t record_bytes = check.record_bytes
    cdef uint64_t unit_bytes = check.unit_bytes
    cdef const CacheArrays* t = &table.arrays
    cdef Py_ssize_t i = 0
    cdef size_t pos = start, need = 0, json_top = json_bottom, kept
    cdef uint8_t* base = &out[0] if out.shape[0] else NULL
    cdef int64_t c
    cdef uint64_t sid, jlen, plen, dsize
    cdef const uint8_t* rec
    cdef const uint8_t* payload
    cdef int codec
    cdef bint in_place
    cdef RecordAt r
    cdef Run run
    cdef FaultInfo f
    run.stop, run.off, run.base = 0, 0, NULL
    _fault_init(&f)
    if rows.n:
        offsets[0] = start
    with nogil:
        while i < rows.n:
            c = rows.cache[i]
            sid = rows.sample[i]
            if _locate(t, c, sid, &r, &f) != 0:
                break
            codec = f.codec
            if i >= run.stop:  # not read with an earlier run: start one here
                in_place = codec == CODEC_NONE and not keep_json
                if in_place and r.rec_len <= json_top - pos:
                    if _read_run(t, &rows, i, &r, base + pos, min(json_top - pos, max(<uint64_t>INPLACE_SPAN_BYTES,
                                 r.rec_len)), &scratch.staging, &run, &f) != 0:
                        break
                elif r.rec_len > json_top - pos and r.rec_len > SPAN_MAX_BYTES:  # staged only within bounds
                    need = r.rec_len
                    f.code = F_OUT_FULL
                    break
                elif _read_run(t, &rows, i, &r, NULL, r.rec_len if in_place else max(r.rec_len, <uint64_t>SPAN_MAX_BYTES),
                               &scratch.staging, &run, &f) != 0:
                    break
            rec = run.base + (r.off - run.off)
            if _check_record(t, c, sid, rec, r.rec_len, &jlen, &f) != 0:
                break
            plen = r.rec_len - RECORD_HEADER_BYTES - jlen
            payload = rec + RECORD_HEADER_BYTES + jlen
            if _payload_size(t, c, &r, codec, payload, plen, &dsize, &f) != 0:
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
            elif _decode(t, c, codec, payload, plen, base + pos, dsize, &scratch.codecs, &f) != 0:
                break
            pos += dsize
            offsets[i + 1] = pos
            i += 1
    if f.code == F_OK or f.code == F_OUT_FULL:
        return i, pos, json_top, need
    f.row = i
    _raise_fault(table, &f, &rows, check)
