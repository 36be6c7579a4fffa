/* kiln_expf_fast (include/kiln/opmath.h) on 8 AVX2 lanes (and 16 AVX-512 ones): its constants and
 * its operations in the same order, so the same bits as the scalar function
 * (and as its compiler-vectorised uses). Private to src/kernels; kiln_k_exp
 * (elementwise.c) runs it so tests compare it with the scalar bit for bit. */
#ifndef KILN_SIMD_EXP_H
#define KILN_SIMD_EXP_H
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "kiln/opmath.h"
static inline __m256 kiln_exp8(__m256 x) {
    __m256 xc = _mm256_max_ps(_mm256_set1_ps(KILN_EXP_XMIN), x); /* NaN stays NaN, as in the scalar */
    xc = _mm256_min_ps(_mm256_set1_ps(KILN_EXP_XMAX), xc);
    __m256 kf = _mm256_fmadd_ps(xc, _mm256_set1_ps(KILN_EXP_LOG2E), _mm256_set1_ps(KILN_EXP_SHIFT));
    const __m256i kb = _mm256_castps_si256(kf);
    kf = _mm256_sub_ps(kf, _mm256_set1_ps(KILN_EXP_SHIFT));
    __m256 r = _mm256_fmadd_ps(kf, _mm256_set1_ps(KILN_EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(kf, _mm256_set1_ps(KILN_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(KILN_EXP_P7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KILN_EXP_P0));
    const __m256i sb = _mm256_slli_epi32(_mm256_add_epi32(kb, _mm256_set1_epi32((int)KILN_EXP_BIAS)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(sb));
}
#endif
#if defined(__AVX512F__)
/* the same on 16 AVX-512 lanes: the same operations, so the same bits */
static inline __m512 kiln_exp16(__m512 x) {
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(KILN_EXP_XMIN), x);
    xc = _mm512_min_ps(_mm512_set1_ps(KILN_EXP_XMAX), xc);
    __m512 kf = _mm512_fmadd_ps(xc, _mm512_set1_ps(KILN_EXP_LOG2E), _mm512_set1_ps(KILN_EXP_SHIFT));
    const __m512i kb = _mm512_castps_si512(kf);
    kf = _mm512_sub_ps(kf, _mm512_set1_ps(KILN_EXP_SHIFT));
    __m512 r = _mm512_fmadd_ps(kf, _mm512_set1_ps(KILN_EXP_LN2_HI), xc);
    r = _mm512_fmadd_ps(kf, _mm512_set1_ps(KILN_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(KILN_EXP_P7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P0));
    const __m512i sb = _mm512_slli_epi32(_mm512_add_epi32(kb, _mm512_set1_epi32((int)KILN_EXP_BIAS)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(sb));
}

/* kiln_exp16 for arguments at most 0 (a softmax's s - max: the flash
 * forward), three instructions fewer: no upper clamp, and 2^k applied by
 * VSCALEFPS instead of built from k's bits. Arguments below -86.5 give
 * e^-86.5 (2.6e-38): the result stays a normal number, since a denormal
 * one takes a slow microcode assist on Intel cores (the bits trick of
 * kiln_exp16 gives 0 there instead); a caller masks the lanes that must
 * be 0 (keys a row does not see). From -86.5 to 0, kiln_expf_fast's bits. */
static inline __m512 kiln_exp16_le0(__m512 x) {
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-86.5f), x);
    __m512 kf = _mm512_fmadd_ps(xc, _mm512_set1_ps(KILN_EXP_LOG2E), _mm512_set1_ps(KILN_EXP_SHIFT));
    kf = _mm512_sub_ps(kf, _mm512_set1_ps(KILN_EXP_SHIFT));
    __m512 r = _mm512_fmadd_ps(kf, _mm512_set1_ps(KILN_EXP_LN2_HI), xc);
    r = _mm512_fmadd_ps(kf, _mm512_set1_ps(KILN_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(KILN_EXP_P7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KILN_EXP_P0));
    return _mm512_scalef_ps(p, kf);
}
#endif
#endif
