# The SplitMix64 finaliser shared by the seed derivations of draws.pyx and perm.pyx.
# A bijection on u64 (mix(0) == 0), so mix(x ^ key) keeps distinct inputs distinct.
from libc.stdint cimport uint64_t


cdef inline uint64_t splitmix_mix(uint64_t z) noexcept nogil:
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)
