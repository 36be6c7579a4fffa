/* An 8 x 8 block of floats transposed in AVX2 registers (shared by the
 * GEMM's packing and flash attention's key-block layout). Private to
 * src/kernels/simd. */
#ifndef KILN_SIMD_TR_H
#define KILN_SIMD_TR_H
#if defined(__AVX2__)
#include <immintrin.h>
/* r[i] = row i of the block on entry, column i on return */
static inline __attribute__((always_inline)) void kiln_tr8(__m256 r[8]) {
    __m256 u[8];
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        __m256 lo01 = _mm256_unpacklo_ps(r[4 * g], r[4 * g + 1]), hi01 = _mm256_unpackhi_ps(r[4 * g], r[4 * g + 1]);
        __m256 lo23 = _mm256_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]),
               hi23 = _mm256_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
        /* u[4g + q]: in 128-bit lane j, rows 4g..4g+3 of column 4j + q */
        u[4 * g + 0] = _mm256_shuffle_ps(lo01, lo23, 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(lo01, lo23, 0xEE);
        u[4 * g + 2] = _mm256_shuffle_ps(hi01, hi23, 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(hi01, hi23, 0xEE);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        r[q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x20);
        r[4 + q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x31);
    }
}
#endif
#endif
