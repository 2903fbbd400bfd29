/* XXH3-64 (seed 0) of one buffer with AVX2 when the CPU has it, the baseline build otherwise.
 *
 * The codec libraries (libxxhash.a, or xxhash.h inlined) are built for the x86-64 baseline, whose
 * XXH3 runs on SSE2. Here xxhash.h is included a second time with XXH_INLINE_ALL (it renames
 * what it inlines XXH_INLINE_*, so both builds coexist in one module) under GCC's avx2 target,
 * and `drt_xxh3_64` picks one at run time (`__builtin_cpu_supports`, checked once per process).
 * Both compute the same function: XXH3's result never depends on the vector unit.
 * Elsewhere than x86-64 with GCC or Clang, `drt_xxh3_64` is the baseline XXH3_64bits.
 */
#ifndef DATASETRT_XXH3_WIDE_H
#define DATASETRT_XXH3_WIDE_H

#include <stddef.h>
#include <stdint.h>
#include "xxhash.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(XXH_INLINE_ALL)
/* The baseline build, named before the second include renames XXH3_64bits to its inlined copy. */
static inline uint64_t drt_xxh3_64_baseline(const void* data, size_t length) { return XXH3_64bits(data, length); }

#pragma GCC push_options
#pragma GCC target("avx2")
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include "xxhash.h"
static uint64_t drt_xxh3_64_avx2(const void* data, size_t length) {
    return XXH_INLINE_XXH3_64bits(data, length);
}
#pragma GCC pop_options
/* Every other use in this module means the baseline library functions again. */
#undef XXH_INLINE_ALL
#undef XXH_VECTOR
#undef XXH3_64bits
#undef XXH3_createState
#undef XXH3_freeState
#undef XXH3_64bits_reset
#undef XXH3_64bits_update
#undef XXH3_64bits_digest

static int drt_xxh3_avx2 = -1;  /* -1 until the first call asks the CPU */

static inline uint64_t drt_xxh3_64(const void* data, size_t length) {
    if (length <= 240) /* XXH3's short inputs use no vector unit */
        return drt_xxh3_64_baseline(data, length);
    if (drt_xxh3_avx2 < 0)
        drt_xxh3_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return drt_xxh3_avx2 ? drt_xxh3_64_avx2(data, length) : drt_xxh3_64_baseline(data, length);
}
#else
static inline uint64_t drt_xxh3_64(const void* data, size_t length) { return XXH3_64bits(data, length); }
#endif

#endif
