# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Stateless exactly-once orders (keyed Feistel permutations) and the quota interleave of mixtures.

Boundary: pure integer arithmetic on numpy buffers. No Polars, no I/O, no processes; arguments are
validated by the Python planner (datasetrt/sampling), only buffer sizes are checked here.

Algorithm (the executable statement is tests/reference/perm.py):

* key of epoch ``e`` of the order labelled ``label`` under ``seed``:
  ``mix(e ^ mix(label ^ mix(seed ^ K)))`` with ``mix`` the SplitMix64 finaliser (as
  ``draws.derive_seed``) and ``K = 0x4453545250455244`` (b"DSTRPERD"); never ``seed + epoch``.
  ``mix`` is a bijection, so two epochs (or labels) of one seed never share a key;
* permutation of ``[0, n)``: a Feistel network on ``b = bit_length(n - 1)`` bits, split into a low
  half of ``b // 2`` bits and a high half of ``b - b // 2`` bits; ``ROUNDS`` rounds, round ``r``
  replaces one half by ``half ^ (mix(other ^ k_r) & mask)`` (high half on even rounds, low half on
  odd ones), ``k_r = mix(key ^ (r + 1) * 0x9E3779B97F4A7C15)``. Each round is an involution, so the
  network is a bijection on ``[0, 2**b)``; cycle-walking (re-encrypt while the value is ``>= n``)
  makes it a bijection on ``[0, n)``. ``2**b < 2n``, so fewer than 2 encryptions per position on
  average; O(1) memory whatever ``n``;
* position ``p`` of the concatenated epochs is element ``p mod n`` of epoch ``p // n``;
* repeat counts: with ``ends`` the inclusive running sums of the counts, position value ``y`` reads
  row ``bisect_right(ends, y)`` (O(log rows));
* quota interleave of integer weights ``w`` (sum ``D``): step ``t`` picks, among the streams with
  ``c_i * D < (t + 1) * w_i`` (taking one more keeps it within its upper quota), the one with the
  earliest deadline ``(c_i + 1) / w_i`` (lowest index on ties). This is Balinski and Young's quota
  method (earliest-deadline-first on unit jobs): every prefix of ``n`` picks holds each stream
  within 1 of ``n * w_i / D``, and after ``D`` steps every count is ``w_i``, so the schedule is
  periodic with period ``D``.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int16_t, int64_t, uint32_t, uint64_t

import numpy as np

from planning cimport bisect_right, clzll, splitmix_mix

cdef enum:
    ROUNDS = 6

cdef uint64_t _PERM_DOMAIN = 0x4453545250455244ULL    # b"DSTRPERD"
cdef uint64_t _STREAM_DOMAIN = 0x445354525354524DULL  # b"DSTRSTRM"
cdef uint64_t _GOLDEN = 0x9E3779B97F4A7C15ULL


cdef struct Feistel:
    uint64_t keys[ROUNDS]
    uint64_t n          # the permuted domain is [0, n)
    int lo_bits
    uint64_t lo_mask
    uint64_t hi_mask


cdef inline uint64_t _epoch_key(uint64_t seed, uint64_t label, uint64_t epoch) noexcept nogil:
    return splitmix_mix(epoch ^ splitmix_mix(label ^ splitmix_mix(seed ^ _PERM_DOMAIN)))


cdef inline void _feistel_init(Feistel* f, uint64_t key, uint64_t n) noexcept nogil:
    """Round keys and half widths of the permutation of [0, n) keyed by ``key``; requires n >= 1."""
    cdef int bits = 64 - clzll(n - 1) if n > 1 else 0
    cdef int r
    f.n = n
    f.lo_bits = bits >> 1
    f.lo_mask = (<uint64_t>1 << f.lo_bits) - 1
    f.hi_mask = (<uint64_t>1 << (bits - f.lo_bits)) - 1
    for r in range(ROUNDS):
        f.keys[r] = splitmix_mix(key ^ (<uint64_t>(r + 1) * _GOLDEN))


cdef inline uint64_t _encrypt(const Feistel* f, uint64_t x) noexcept nogil:
    cdef uint64_t lo = x & f.lo_mask
    cdef uint64_t hi = x >> f.lo_bits
    cdef int r
    for r in range(0, ROUNDS, 2):
        hi ^= splitmix_mix(lo ^ f.keys[r]) & f.hi_mask
        lo ^= splitmix_mix(hi ^ f.keys[r + 1]) & f.lo_mask
    return (hi << f.lo_bits) | lo


cdef inline uint64_t _permute(const Feistel* f, uint64_t x) noexcept nogil:
    """Image of x (< n) under the cycle-walked permutation of [0, n)."""
    x = _encrypt(f, x)
    while x >= f.n:
        x = _encrypt(f, x)
    return x


cdef void _permuted(uint64_t seed, uint64_t label, uint64_t total, int64_t first, Py_ssize_t count,
                    const int64_t* ends, const uint32_t* ends32, Py_ssize_t m, int64_t* out) noexcept nogil:
    """Positions [first, first+count) of the epoch-concatenated order of [0, total); through
    ``ends`` or ``ends32`` (repeat counts; ``ends32`` when total < 2**32) when one is not NULL.
    The round keys change at epoch boundaries."""
    cdef uint64_t epoch = <uint64_t>first // total
    cdef uint64_t t = <uint64_t>first % total
    cdef Feistel f
    cdef Py_ssize_t i
    cdef uint64_t y
    _feistel_init(&f, _epoch_key(seed, label, epoch), total)
    for i in range(count):
        if t == total:
            epoch += 1
            t = 0
            _feistel_init(&f, _epoch_key(seed, label, epoch), total)
        y = _permute(&f, t)
        if ends != NULL:
            out[i] = <int64_t>bisect_right(ends, m, <int64_t>y)
        elif ends32 != NULL:
            out[i] = <int64_t>bisect_right(ends32, m, <uint32_t>y)
        else:
            out[i] = <int64_t>y
        t += 1


cdef object _run_permuted(uint64_t seed, uint64_t label, uint64_t total, int64_t first, Py_ssize_t count,
                          const int64_t* ends, const uint32_t* ends32, Py_ssize_t m):
    """Checks the position range, allocates the int64 result and runs `_permuted` without the GIL."""
    if first < 0 or count < 0:
        raise ValueError("permuted: first and count must be >= 0")
    if count and first > 0x7FFFFFFFFFFFFFFF - count:
        raise OverflowError("permuted: positions past 2**63 - 1")
    result = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] out = result
    if count:
        with nogil:
            _permuted(seed, label, total, first, count, ends, ends32, m, &out[0])
    return result


def permutation_key(uint64_t seed, uint64_t label, uint64_t epoch):
    """Key of epoch ``epoch`` of the order labelled ``label``: ``mix(epoch ^ mix(label ^ mix(seed ^ K)))``."""
    return _epoch_key(seed, label, epoch)


def stream_seed(uint64_t seed, uint64_t label):
    """Draw seed of a weighted (with-replacement) stream: ``mix(label ^ mix(seed ^ K_STREAM))``
    with ``K_STREAM = 0x445354525354524D`` (b"DSTRSTRM"); used with ``draws.weighted_draws``."""
    return splitmix_mix(label ^ splitmix_mix(seed ^ _STREAM_DOMAIN))


def permute_values(uint64_t key, uint64_t n, const int64_t[::1] values):
    """Images of ``values`` (each in [0, n)) under the permutation of [0, n) keyed by ``key``
    itself (not derived); int64. For tests and inspection: O(len(values))."""
    if n < 1:
        raise ValueError("permute_values: n must be >= 1")
    cdef Py_ssize_t count = values.shape[0], i
    result = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] out = result
    cdef Feistel f
    for i in range(count):
        if values[i] < 0 or <uint64_t>values[i] >= n:
            raise ValueError(f"permute_values: value {values[i]} is outside [0, {n})")
    with nogil:
        _feistel_init(&f, key, n)
        for i in range(count):
            out[i] = <int64_t>_permute(&f, <uint64_t>values[i])
    return result


def permuted(uint64_t seed, uint64_t label, int64_t total, int64_t first, Py_ssize_t count):
    """Positions ``first .. first+count-1`` of the exactly-once order of ``[0, total)``: position
    ``p`` is element ``p % total`` of epoch ``p // total``'s permutation (keyed by
    ``permutation_key(seed, label, epoch)``). int64 array of length ``count``; O(count) time,
    O(1) memory besides the result, GIL released. ``total >= 1``; positions stay below 2**63."""
    if total < 1:
        raise ValueError("permuted: total must be >= 1")
    return _run_permuted(seed, label, <uint64_t>total, first, count, NULL, NULL, 0)


def permuted_repeats(uint64_t seed, uint64_t label, ends, int64_t first, Py_ssize_t count):
    """As :func:`permuted` over ``total = ends[-1]`` positions per epoch, each value mapped to the
    row whose repeat range holds it: ``ends`` are the inclusive running sums of the rows' repeat
    counts (strictly increasing, ends[0] >= 1; an int64 buffer, or a uint32 numpy array when
    total < 2**32), so row ``i`` appears ``ends[i] - ends[i-1]`` times per epoch. Returns int64
    rows; O(count * log rows), GIL released."""
    cdef const int64_t[::1] wide
    cdef const uint32_t[::1] narrow
    cdef Py_ssize_t m
    if getattr(ends, "dtype", None) == np.uint32:
        narrow = ends
        m = narrow.shape[0]
        if m < 1 or narrow[m - 1] < 1:
            raise ValueError("permuted_repeats: need at least one row with a repeat count >= 1")
        return _run_permuted(seed, label, <uint64_t>narrow[m - 1], first, count, NULL, &narrow[0], m)
    wide = ends
    m = wide.shape[0]
    if m < 1 or wide[m - 1] < 1:
        raise ValueError("permuted_repeats: need at least one row with a repeat count >= 1")
    return _run_permuted(seed, label, <uint64_t>wide[m - 1], first, count, &wide[0], NULL, m)


def quota_schedule(const int64_t[::1] weights):
    """One period of the quota interleave of integer ``weights`` (each >= 0, sum D >= 1): int16
    ``stream[t]``, the stream picked at step ``t`` of the period. O(D * streams) time (the products
    stay below 2**63 for D < 2**31), O(D) memory. At most 32767 streams.
    """
    cdef Py_ssize_t m = weights.shape[0], i, best
    if m < 1 or m > 32767:
        raise ValueError("quota_schedule: need 1 to 32767 streams")
    cdef int64_t total = 0
    for i in range(m):
        if weights[i] < 0:
            raise ValueError("quota_schedule: weights must be >= 0")
        total += weights[i]
    if total < 1 or total > 0x7FFFFFFF:
        raise ValueError("quota_schedule: the weights must sum to between 1 and 2**31 - 1")
    stream_arr = np.empty(total, dtype=np.int16)
    picked_arr = np.zeros(m, dtype=np.int64)
    cdef int16_t[::1] stream = stream_arr
    cdef int64_t[::1] picked = picked_arr
    cdef int64_t t
    with nogil:
        for t in range(total):
            best = -1
            for i in range(m):
                if weights[i] == 0 or picked[i] * total >= (t + 1) * weights[i]:
                    continue
                if best < 0 or (picked[i] + 1) * weights[best] < (picked[best] + 1) * weights[i]:
                    best = i
            stream[t] = <int16_t>best
            picked[best] += 1
    return stream_arr


cdef inline int64_t _picks_before(const int64_t* occ, int64_t a, int64_t b, int64_t r) noexcept nogil:
    """Entries of the sorted occ[a:b] that are < r."""
    cdef int64_t lo = a, hi = b, mid
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        if occ[mid] < r:
            lo = mid + 1
        else:
            hi = mid
    return lo - a


cdef class Interleave:
    """One period of the quota interleave of integer ``weights`` (see :func:`quota_schedule`):
    int16 ``stream[t]`` for t in [0, D), and each stream's pick positions within the period
    (int64 ``occ[occ_start[s]:occ_start[s+1]]``, ascending). Immutable; picklable."""

    cdef readonly object weights, stream, occ, occ_start
    cdef readonly int64_t period
    cdef const int64_t[::1] _weights, _occ, _occ_start
    cdef const int16_t[::1] _stream

    def __init__(self, weights):
        self.weights = np.ascontiguousarray(weights, dtype=np.int64)
        self.stream = quota_schedule(self.weights)
        self.occ = np.argsort(self.stream, kind="stable").astype(np.int64)
        self.occ_start = np.concatenate([[0], np.cumsum(self.weights)]).astype(np.int64)
        self.period = self.stream.shape[0]
        self._weights, self._stream, self._occ, self._occ_start = self.weights, self.stream, self.occ, self.occ_start

    def __reduce__(self):
        return Interleave, (self.weights,)

    def picks(self, int64_t first, Py_ssize_t count):
        """Stream (int16) of relative positions [first, first+count)."""
        r0 = first % self.period
        if r0 + count <= self.period:
            return self.stream[r0:r0 + count]
        return self.stream[(np.arange(count, dtype=np.int64) + r0) % self.period]

    def count_before(self, int64_t n):
        """Picks of each stream (int64 array) among relative positions [0, n); O(streams log D)."""
        cdef Py_ssize_t m = self._weights.shape[0], s
        result = np.empty(m, dtype=np.int64)
        cdef int64_t[::1] out = result
        cdef int64_t q = n // self.period, r = n % self.period
        for s in range(m):
            out[s] = q * self._weights[s] + _picks_before(&self._occ[0], self._occ_start[s], self._occ_start[s + 1], r)
        return result

    def position_of(self, Py_ssize_t s, int64_t j):
        """Relative position of stream s's j-th pick (0-based); the stream's weight must be > 0."""
        cdef int64_t w = self._weights[s]
        if w <= 0:
            raise ValueError("Interleave.position_of: the stream has weight 0")
        return (j // w) * self.period + self._occ[self._occ_start[s] + j % w]


cdef struct Cursor:
    int64_t pos     # next stream position
    int64_t epoch   # epoch whose keys are loaded (-1: none yet)
    int64_t t       # position within that epoch
    Feistel f


cdef struct StreamTable:
    uint64_t label
    int64_t per_epoch     # stream positions per stream epoch
    const int64_t* rows   # population rows of the stream; NULL: the contiguous rows from row_base
    int64_t row_base
    int64_t n_rows
    const int64_t* ends   # inclusive running sums of the repeat counts; NULL: every count 1
    bint permuted         # False: weighted stream (the caller draws; the stream position is written)


cdef class StreamTables:
    """The per-stream tables of a mixture plan (built once per plan; the arrays are referenced,
    not copied). ``labels``: u64 key label per stream; ``rows``: per stream an int64 C-contiguous
    array of its population rows, or a ``range`` when they are contiguous (no array at all);
    ``ends``: per stream None (every repeat count 1) or the int64 inclusive running sums of its
    rows' repeat counts; ``permuted``: exactly-once streams (True) or weighted streams (False),
    for which ``block`` writes the stream position and the caller's draw kernel finishes.
    ``per_epoch`` (int64 array): stream positions per stream epoch. Picklable.
    """

    cdef readonly object labels, rows, ends, per_epoch
    cdef readonly bint permuted
    cdef StreamTable* t
    cdef Py_ssize_t m

    def __cinit__(self):
        self.t = NULL

    def __init__(self, labels, rows, ends, bint permuted):
        cdef Py_ssize_t s
        cdef const int64_t[::1] view
        self.m = len(labels)
        if len(rows) != self.m or len(ends) != self.m or self.m < 1:
            raise ValueError("StreamTables: need one rows and one ends entry per label")
        self.labels, self.permuted = tuple(int(x) for x in labels), permuted
        self.rows = tuple(r if isinstance(r, range) else np.ascontiguousarray(r, dtype=np.int64) for r in rows)
        self.ends = tuple(None if e is None else np.ascontiguousarray(e, dtype=np.int64) for e in ends)
        self.t = <StreamTable*>PyMem_Malloc(self.m * sizeof(StreamTable))
        if self.t == NULL:
            raise MemoryError()
        per_epoch = np.empty(self.m, dtype=np.int64)
        for s in range(self.m):
            r, e = self.rows[s], self.ends[s]
            self.t[s].label = self.labels[s]
            self.t[s].permuted = permuted
            if isinstance(r, range):
                if r.step != 1 or len(r) < 1 or r.start < 0:
                    raise ValueError("StreamTables: a range of rows must be non-empty, from >= 0, step 1")
                self.t[s].rows, self.t[s].row_base, self.t[s].n_rows = NULL, r.start, len(r)
            else:
                if r.shape[0] < 1:
                    raise ValueError("StreamTables: a stream needs at least one row")
                view = r
                self.t[s].rows, self.t[s].row_base, self.t[s].n_rows = &view[0], 0, r.shape[0]
            self.t[s].ends = NULL
            if e is not None:
                if not permuted or e.shape[0] != self.t[s].n_rows or e[0] < 1:
                    raise ValueError("StreamTables: repeat counts need one running sum per row (exactly-once only)")
                view = e
                self.t[s].ends = &view[0]
            self.t[s].per_epoch = self.t[s].n_rows if e is None else e[e.shape[0] - 1]
            per_epoch[s] = self.t[s].per_epoch
        per_epoch.flags.writeable = False
        self.per_epoch = per_epoch

    def __dealloc__(self):
        PyMem_Free(self.t)

    def __reduce__(self):
        return StreamTables, (self.labels, self.rows, self.ends, self.permuted)

    def block(self, uint64_t seed, Interleave inter, int64_t rel_first, const int64_t[::1] bases,
              int64_t[::1] out, int16_t[::1] picks):
        """Rows of relative positions [rel_first, rel_first+len(out)) of a segment interleaved by
        ``inter`` whose streams had delivered ``bases`` samples at its start. Writes ``out``
        (population rows; the stream position for weighted streams) and ``picks`` (stream per
        position). O(count + streams log D), GIL released."""
        cdef Py_ssize_t count = out.shape[0], i, s, m = self.m
        cdef int64_t period = inter.period
        if picks.shape[0] != count or bases.shape[0] != m or inter._weights.shape[0] != m:
            raise ValueError("StreamTables.block: inconsistent argument lengths")
        if rel_first < 0:
            raise ValueError("StreamTables.block: rel_first must be >= 0")
        cdef Cursor* cur = <Cursor*>PyMem_Malloc(m * sizeof(Cursor))
        if cur == NULL:
            raise MemoryError()
        cdef int64_t q, r, L, y
        cdef const int16_t* sched = &inter._stream[0]
        cdef StreamTable* tab
        with nogil:
            q = rel_first // period
            r = rel_first % period
            for s in range(m):
                cur[s].pos = bases[s] + q * inter._weights[s] + _picks_before(
                    &inter._occ[0], inter._occ_start[s], inter._occ_start[s + 1], r)
                cur[s].epoch = -1
            for i in range(count):
                s = sched[r]
                picks[i] = <int16_t>s
                r += 1
                if r == period:
                    r = 0
                tab = &self.t[s]
                if not tab.permuted:
                    out[i] = cur[s].pos
                    cur[s].pos += 1
                    continue
                L = tab.per_epoch
                if cur[s].epoch < 0:
                    cur[s].epoch = cur[s].pos // L
                    cur[s].t = cur[s].pos % L
                    _feistel_init(&cur[s].f, _epoch_key(seed, tab.label, <uint64_t>cur[s].epoch), <uint64_t>L)
                elif cur[s].t == L:
                    cur[s].epoch += 1
                    cur[s].t = 0
                    _feistel_init(&cur[s].f, _epoch_key(seed, tab.label, <uint64_t>cur[s].epoch), <uint64_t>L)
                y = <int64_t>_permute(&cur[s].f, <uint64_t>cur[s].t)
                cur[s].t += 1
                cur[s].pos += 1
                if tab.ends != NULL:
                    y = bisect_right(tab.ends, tab.n_rows, y)
                out[i] = tab.row_base + y if tab.rows == NULL else tab.rows[y]
        PyMem_Free(cur)
