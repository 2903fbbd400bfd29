# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Shuffle draws bit-compatible with dataset-rt 0.4.8 (rand 0.8 + rand_chacha ChaCha8Rng).

Boundary: pure integer/float arithmetic on numpy buffers. No Polars, no I/O, no processes.

Algorithm (the executable statement is tests/reference/rng048.py):

* draw ``d`` (a global u64 index) uses a fresh ``ChaCha8Rng::seed_from_u64(seed ^ rotl64(d, 32))``;
* ``seed_from_u64`` expands the u64 with 8 PCG32 steps into the 256-bit ChaCha key;
* ChaCha8: 4 double rounds, 64-bit block counter in words 12/13 from 0, stream 0 in words 14/15;
  ``next_u64`` joins two consecutive u32 words (low first);
* uniform ``gen_range(0..n)``: rand 0.8 ``UniformInt<u64>::sample_single`` (widening multiply with
  rejection zone ``(n << lz(n)) - 1``);
* weighted: rand 0.8 ``WeightedIndex<f64>``: ``UniformFloat(0, total)`` then ``bisect_right`` over
  the n-1 leading cumulative sums.

All draw loops run with the GIL released and write into a preallocated numpy array.
"""

from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from planning cimport bisect_right, clzll, splitmix_mix

import numpy as np

# The compiler's 128-bit integer (rand's widening multiply): Cython and libc have no such type.
cdef extern from *:
    ctypedef unsigned long long uint128_t "unsigned __int128"


# --------------------------------------------------------------------------------------------
# ChaCha8Rng as seeded by rand_core's seed_from_u64
# --------------------------------------------------------------------------------------------

cdef struct DrawRng:
    uint32_t key[8]
    uint64_t ctr      # next block counter to generate
    uint32_t buf[16]  # current output block
    int idx           # next unread word of buf; 16 = exhausted


cdef inline uint32_t _rotl32(uint32_t x, int r) noexcept nogil:
    return (x << r) | (x >> (32 - r))


cdef inline void _qr(uint32_t* s, int a, int b, int c, int d) noexcept nogil:
    s[a] += s[b]; s[d] ^= s[a]; s[d] = _rotl32(s[d], 16)
    s[c] += s[d]; s[b] ^= s[c]; s[b] = _rotl32(s[b], 12)
    s[a] += s[b]; s[d] ^= s[a]; s[d] = _rotl32(s[d], 8)
    s[c] += s[d]; s[b] ^= s[c]; s[b] = _rotl32(s[b], 7)


cdef inline void _chacha8_block(const uint32_t* key, uint64_t ctr, uint32_t* out) noexcept nogil:
    """One 64-byte ChaCha8 block (state + initial state) for ``key`` at block ``ctr``, stream 0."""
    cdef uint32_t init[16]
    cdef uint32_t s[16]
    cdef int i
    init[0] = 0x61707865u
    init[1] = 0x3320646Eu
    init[2] = 0x79622D32u
    init[3] = 0x6B206574u
    for i in range(8):
        init[4 + i] = key[i]
    init[12] = <uint32_t>ctr
    init[13] = <uint32_t>(ctr >> 32)
    init[14] = 0
    init[15] = 0
    for i in range(16):
        s[i] = init[i]
    for i in range(4):
        _qr(s, 0, 4, 8, 12)
        _qr(s, 1, 5, 9, 13)
        _qr(s, 2, 6, 10, 14)
        _qr(s, 3, 7, 11, 15)
        _qr(s, 0, 5, 10, 15)
        _qr(s, 1, 6, 11, 12)
        _qr(s, 2, 7, 8, 13)
        _qr(s, 3, 4, 9, 14)
    for i in range(16):
        out[i] = s[i] + init[i]


cdef inline void _rng_seed(DrawRng* rng, uint64_t state) noexcept nogil:
    """rand_core ``seed_from_u64``: 8 PCG32 outputs become the key words, in order."""
    cdef int i
    cdef uint32_t xs, rot
    for i in range(8):
        state = state * 6364136223846793005ULL + 11634580027462260723ULL
        xs = <uint32_t>(((state >> 18) ^ state) >> 27)
        rot = <uint32_t>(state >> 59)
        rng.key[i] = (xs >> rot) | (xs << ((32 - rot) & 31))
    rng.ctr = 0
    rng.idx = 16


cdef inline void _rng_for_draw(DrawRng* rng, uint64_t seed, uint64_t d) noexcept nogil:
    """The per-draw generator: ``seed_from_u64(seed ^ rotl64(d, 32))``."""
    _rng_seed(rng, seed ^ ((d << 32) | (d >> 32)))


cdef inline uint32_t _next_u32(DrawRng* rng) noexcept nogil:
    if rng.idx >= 16:
        _chacha8_block(rng.key, rng.ctr, rng.buf)
        rng.ctr += 1
        rng.idx = 0
    rng.idx += 1
    return rng.buf[rng.idx - 1]


cdef inline uint64_t _next_u64(DrawRng* rng) noexcept nogil:
    cdef uint64_t lo = _next_u32(rng)
    cdef uint64_t hi = _next_u32(rng)
    return lo | (hi << 32)


# --------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------

cdef inline uint64_t _gen_range(DrawRng* rng, uint64_t n, uint64_t zone) noexcept nogil:
    """rand 0.8 ``UniformInt<u64>::sample_single(0..n)``; requires n >= 1."""
    cdef uint128_t m
    while True:
        m = <uint128_t>_next_u64(rng) * <uint128_t>n
        if <uint64_t>m <= zone:
            return <uint64_t>(m >> 64)


cdef inline double _bits_to_double(uint64_t bits) noexcept nogil:
    cdef double x
    memcpy(&x, &bits, sizeof(double))
    return x


cdef inline uint64_t _double_to_bits(double x) noexcept nogil:
    cdef uint64_t bits
    memcpy(&bits, &x, sizeof(double))
    return bits


# 1 - 2**-52, the largest value rand's UniformFloat<f64> sampler can produce for the unit interval.
cdef double _ONE_MINUS_EPS = _bits_to_double(0x3FEFFFFFFFFFFFFEULL)


cdef inline Py_ssize_t _weighted(DrawRng* rng, const double* cum, Py_ssize_t m,
                                 double scale) noexcept nogil:
    """rand 0.8 ``WeightedIndex<f64>`` sample: u in [0, 1) from 52 bits, times scale, bisect."""
    cdef double u = _bits_to_double((_next_u64(rng) >> 12) | (<uint64_t>1023 << 52)) - 1.0
    return bisect_right(cum, m, u * scale)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def uniform_draws(uint64_t seed, uint64_t n, uint64_t start, Py_ssize_t count):
    """Draws ``start .. start+count-1`` of ``gen_range(0..n)``; uint64 array of length ``count``.

    ``seed``/``start`` must be in [0, 2**64) (OverflowError otherwise); ``n >= 1`` (ValueError);
    the draw index wraps mod 2**64. Each result is in [0, n). O(count), one ChaCha8 block per draw
    except for rejected samples (probability < 1/2 per attempt, tiny unless n is near 2**63+).
    """
    if n < 1:
        raise ValueError("uniform_draws: n must be >= 1")
    if count < 0:
        raise ValueError("uniform_draws: count must be >= 0")
    result = np.empty(count, dtype=np.uint64)
    cdef uint64_t[::1] out = result
    cdef uint64_t zone = (n << clzll(n)) - 1
    cdef Py_ssize_t i
    cdef DrawRng rng
    with nogil:
        for i in range(count):
            _rng_for_draw(&rng, seed, start + <uint64_t>i)
            out[i] = _gen_range(&rng, n, zone)
    return result


def weighted_cumulative(const double[::1] weights):
    """Prepare ``WeightedIndex<f64>`` tables from a 1-D contiguous float64 array (n >= 1).

    Returns ``(cum, scale)``: ``cum`` is a float64 array of the n-1 running sums
    ``w0, w0+w1, ..., w0+..+w[n-2]`` (left-to-right additions, as rand does) and ``scale`` is
    rand's ``UniformFloat(0, total)`` scale (``total`` stepped down until
    ``scale * (1 - 2**-52) < total``). Weights are validated (finite, > 0) by the caller; only a
    sum that overflows to a non-finite total is rejected here (rand would panic). O(n).
    """
    cdef Py_ssize_t n = weights.shape[0]
    if n < 1:
        raise ValueError("weighted_cumulative: need at least one weight")
    cum_arr = np.empty(n - 1, dtype=np.float64)
    cdef double[::1] cum = cum_arr
    cdef double total = weights[0]
    cdef double scale
    cdef Py_ssize_t i
    with nogil:
        for i in range(1, n):
            cum[i - 1] = total
            total += weights[i]
    if not (total - total == 0.0):  # inf or nan
        raise ValueError("weighted_cumulative: the weights' sum is not finite")
    scale = total
    while scale * _ONE_MINUS_EPS >= total:
        scale = _bits_to_double(_double_to_bits(scale) - 1)
    return cum_arr, scale


def weighted_draws(uint64_t seed, const double[::1] cum, double scale, uint64_t start,
                   Py_ssize_t count):
    """Draws ``start .. start+count-1`` of ``WeightedIndex<f64>``; uint64 positions in [0, n).

    ``cum`` and ``scale`` come from :func:`weighted_cumulative` (n = len(cum) + 1). ``seed``/``start``
    must be in [0, 2**64); the draw index wraps mod 2**64. O(count * log n), one ChaCha8 block
    per draw.
    """
    if count < 0:
        raise ValueError("weighted_draws: count must be >= 0")
    result = np.empty(count, dtype=np.uint64)
    cdef uint64_t[::1] out = result
    cdef Py_ssize_t m = cum.shape[0]
    cdef const double* cum_p = &cum[0] if m > 0 else NULL
    cdef Py_ssize_t i
    cdef DrawRng rng
    with nogil:
        for i in range(count):
            _rng_for_draw(&rng, seed, start + <uint64_t>i)
            out[i] = <uint64_t>_weighted(&rng, cum_p, m, scale)
    return result


def derive_seed(uint64_t common, uint32_t rank, uint32_t worker):
    """dataset-rt's per-(rank, worker) seed: ``mix(((rank << 32) | worker) ^ mix(common ^ K))``.

    ``mix`` is the SplitMix64 finaliser *without* the golden-gamma increment and
    ``K = 0x4453545253454544`` (b"DSTRSEED"); all arithmetic mod 2**64. ``common`` in [0, 2**64),
    ``rank``/``worker`` in [0, 2**32) (OverflowError otherwise). Returns a Python int.
    """
    cdef uint64_t key = splitmix_mix(common ^ 0x4453545253454544ULL)
    return splitmix_mix(((<uint64_t>rank << 32) | worker) ^ key)
