# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Chunk post-processing kernels: pack payloads contiguously; join embedded JSON for one parse;
slice spans into bytes objects; project ragged records to one length.

Boundary: byte buffers and offset arrays in, buffers out; no files, no tables.

The spans come from a gather (already bounds-checked against the disk), but each entry point still
checks that every (offset, length) it copies lies inside its buffers, in O(n), before touching
memory: a caller bug is a ConfigError raised through faults.raise_fault, never a stray write.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy

from faults cimport F_ARGUMENT, raise_fault


cdef Py_ssize_t _bad_span(const int64_t[::1] off, const int64_t[::1] length, Py_ssize_t n,
                          Py_ssize_t size) noexcept nogil:
    """First i < n whose [off[i], off[i] + length[i]) is not inside [0, size), or -1."""
    cdef Py_ssize_t i
    for i in range(n):
        if off[i] < 0 or length[i] < 0 or off[i] > size or length[i] > size - off[i]:
            return i
    return -1


cdef int _check_spans(str kernel, str what, const int64_t[::1] off, const int64_t[::1] length, Py_ssize_t n,
                      Py_ssize_t size) except -1:
    """Raise (F_ARGUMENT) unless spans [0, n) of (off, length) exist and lie inside `size` bytes."""
    cdef Py_ssize_t bad
    if n < 0 or off.shape[0] < n or length.shape[0] < n:
        raise_fault(F_ARGUMENT, f"{kernel}: {n} rows asked of {what} spans of {off.shape[0]} and {length.shape[0]}")
    with nogil:
        bad = _bad_span(off, length, n, size)
    if bad >= 0:
        raise_fault(F_ARGUMENT, f"{kernel}: {what} span {bad} (offset {off[bad]}, length {length[bad]}) "
                                f"lies outside its {size}-byte buffer")
    return 0


cdef inline bint _is_ws(uint8_t c) noexcept nogil:
    return c == 32 or c == 9 or c == 10 or c == 13


cdef int64_t _single_object(const uint8_t* p, int64_t n) noexcept nogil:
    """1 if p[0:n] is exactly one JSON object at the structural level (braces and brackets
    balanced outside strings, depth returning to zero only at the last non-space byte), else 0.
    Token-level validity is left to the JSON parser."""
    cdef int64_t i = 0, depth = 0, end = n
    cdef bint in_str = False
    cdef uint8_t c
    while i < n and _is_ws(p[i]):
        i += 1
    while end > i and _is_ws(p[end - 1]):
        end -= 1
    if i >= end or p[i] != 123:  # '{'
        return 0
    while i < end:
        c = p[i]
        if in_str:
            if c == 92:  # backslash: skip the escaped byte
                i += 1
            elif c == 34:
                in_str = False
        elif c == 34:
            in_str = True
        elif c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth < 0 or (depth == 0 and i != end - 1):
                return 0
        i += 1
    return 1 if depth == 0 and not in_str else 0


def json_array(const uint8_t[::1] data, const int64_t[::1] json_off, const int64_t[::1] json_len, Py_ssize_t n):
    """(bytes "[j0,j1,...]", -1) when every record's JSON is structurally one object, so one
    json.loads of the result yields exactly n dicts aligned with the records; else (None, i)
    with i the first record that is not (the caller parses it alone for the error)."""
    cdef Py_ssize_t i
    cdef int64_t total = 2
    cdef const uint8_t* base = &data[0] if data.shape[0] else NULL
    _check_spans("json_array", "JSON", json_off, json_len, n, data.shape[0])
    for i in range(n):
        if not _single_object(base + json_off[i], json_len[i]):
            return None, i
        total += json_len[i] + 1
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* dst = PyBytes_AS_STRING(out)
    cdef int64_t pos = 1
    dst[0] = 91  # '['
    with nogil:
        for i in range(n):
            if i:
                dst[pos] = 44  # ','
                pos += 1
            memcpy(dst + pos, base + json_off[i], json_len[i])
            pos += json_len[i]
        dst[pos] = 93  # ']'
    return out[:pos + 1], -1


def pack_payloads(const uint8_t[::1] data, const int64_t[::1] data_off, const int64_t[::1] data_len,
                  Py_ssize_t n, uint8_t[::1] out, int64_t[::1] out_off, Py_ssize_t start):
    """Copy payloads [0, n) back to back into out[start:], writing their start offsets into
    out_off[0:n]; returns the end offset. The caller sized `out` (at least start + sum of data_len)."""
    cdef Py_ssize_t i
    cdef int64_t pos = start, total = 0
    cdef const uint8_t* base = &data[0] if data.shape[0] else NULL
    cdef uint8_t* dst = &out[0] if out.shape[0] else NULL
    _check_spans("pack_payloads", "payload", data_off, data_len, n, data.shape[0])
    for i in range(n):
        total += data_len[i]
    if out_off.shape[0] < n or start < 0 or start > out.shape[0] or total > out.shape[0] - start:
        raise_fault(F_ARGUMENT, f"pack_payloads: {total} payload bytes from offset {start} do not fit "
                                f"a {out.shape[0]}-byte buffer (or out_off has {out_off.shape[0]} < {n} rows)")
    with nogil:
        for i in range(n):
            out_off[i] = pos
            if data_len[i]:
                memcpy(dst + pos, base + data_off[i], data_len[i])
            pos += data_len[i]
    return pos


def slice_bytes(const uint8_t[::1] data, const int64_t[::1] off, const int64_t[::1] length, Py_ssize_t n):
    """Spans [0, n) of `data` (span i: data[off[i] : off[i] + length[i]], int64 offsets and
    lengths) as a list of new bytes objects: the per-sample path's one copy of payloads (and of
    embedded JSON, when it is parsed record by record) into objects the consumer owns."""
    cdef Py_ssize_t i
    cdef const char* base = <const char*>&data[0] if data.shape[0] else NULL
    _check_spans("slice_bytes", "byte", off, length, n, data.shape[0])
    out = [None] * n
    for i in range(n):
        out[i] = PyBytes_FromStringAndSize(base + off[i], length[i])
    return out


def project_rows(const uint8_t[::1] data, const int64_t[::1] offsets, Py_ssize_t n, Py_ssize_t outer,
                 Py_ssize_t inner_bytes, Py_ssize_t step_bytes_out, const uint8_t[::1] pad_item, uint8_t[::1] out):
    """Project n ragged records to one fixed length along their ragged dim (o41's rule: truncate,
    or pad with `pad_item`), into `out` (n x outer x step_bytes_out bytes, C order).

    Record i is data[offsets[i] : offsets[i+1]]: `outer` blocks (the dims before the ragged one)
    of k_i steps of `inner_bytes` (the dims after it times the item size). Each block becomes
    step_bytes_out bytes: its first min(k_i * inner_bytes, step_bytes_out) bytes, then copies
    of `pad_item` (one item, whose size divides inner_bytes). Every span is checked to lie
    inside `data` / `out` first (F_ARGUMENT otherwise). O(n x outer x step_bytes_out).
    """
    cdef Py_ssize_t i, o, k, rec_bytes, block_in, take, filled, chunk, item = pad_item.shape[0]
    cdef const uint8_t* src
    cdef uint8_t* dst
    cdef const uint8_t* base = &data[0] if data.shape[0] else NULL
    cdef uint8_t* out_base = &out[0] if out.shape[0] else NULL
    if (n < 0 or outer <= 0 or inner_bytes <= 0 or step_bytes_out < 0 or item <= 0 or inner_bytes % item
            or step_bytes_out % item or offsets.shape[0] < n + 1 or out.shape[0] < n * outer * step_bytes_out):
        raise_fault(F_ARGUMENT, f"project_rows: {n} rows of {outer} x {inner_bytes}-byte steps into "
                                f"{step_bytes_out}-byte blocks do not fit their buffers (item {item} bytes, "
                                f"{offsets.shape[0]} offsets, out {out.shape[0]} bytes)")
    for i in range(n):
        rec_bytes = offsets[i + 1] - offsets[i]
        if offsets[i] < 0 or rec_bytes < 0 or offsets[i + 1] > data.shape[0] or rec_bytes % (outer * inner_bytes):
            raise_fault(F_ARGUMENT, f"project_rows: record {i} (offset {offsets[i]}, {rec_bytes} bytes) is not "
                                    f"{outer} blocks of whole {inner_bytes}-byte steps inside a {data.shape[0]}-byte buffer")
    with nogil:
        dst = out_base
        for i in range(n):
            block_in = (offsets[i + 1] - offsets[i]) // outer
            take = block_in if block_in < step_bytes_out else step_bytes_out
            for o in range(outer):
                src = base + offsets[i] + o * block_in
                if take:
                    memcpy(dst, src, take)
                filled = take
                if filled < step_bytes_out:
                    memcpy(dst + filled, &pad_item[0], item)  # then double the padded span
                    filled += item
                    while filled < step_bytes_out:
                        chunk = filled - take
                        if chunk > step_bytes_out - filled:
                            chunk = step_bytes_out - filled
                        memcpy(dst + filled, dst + take, chunk)
                        filled += chunk
                dst += step_bytes_out
    return n * outer * step_bytes_out
