# Inline helpers shared by the planning kernels (draws.pyx, perm.pyx). Logic only where both need
# the identical code: the SplitMix64 finaliser of the seed derivations, the sorted-array search and
# the leading-zero count.
from libc.stdint cimport int64_t, uint32_t, uint64_t

# A compiler builtin (count of leading zero bits; x must be non-zero): Cython and libc have none.
cdef extern from *:
    int clzll "__builtin_clzll"(unsigned long long x) noexcept nogil

ctypedef fused sorted_t:
    double
    int64_t
    uint32_t


cdef inline uint64_t splitmix_mix(uint64_t z) noexcept nogil:
    """SplitMix64 finaliser (no increment): a bijection on u64 (mix(0) == 0), so mix(x ^ key)
    keeps distinct inputs distinct."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline Py_ssize_t bisect_right(const sorted_t* a, Py_ssize_t m, sorted_t x) noexcept nogil:
    """Number of entries of the sorted a[0:m] that are <= x (O(log m))."""
    cdef Py_ssize_t lo = 0, hi = m, mid
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo
