/* kiln_expf_fast (include/kiln/opmath.h) on 8 AVX2 lanes (and 16 AVX-512 ones): its constants and
 * its operations in the same order, so the same bits as the scalar function
 * (and as its compiler-vectorised uses). Private to src/kernels; kiln_k_exp
 * (elementwise.c) runs it so tests compare it with the scalar bit for bit. */
#ifndef KILN_SIMD_EXP_H
#define KILN_SIMD_EXP_H
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "kiln/opmath.h"
/* The shared core on any width (V: the vector type's intrinsic prefix,
 * _mm256 or _mm512; I: its integer cast, si256 or si512): from the clamped
 * argument xc, k in kf (and its bits, shifted, in kb) and the polynomial
 * e^r in p, the scalar function's operations in its order. */
#define KILN_EXP_CORE(V, I, xc, kf, kb, p)                                             \
    do {                                                                               \
        kf = V##_fmadd_ps(xc, V##_set1_ps(KILN_EXP_LOG2E), V##_set1_ps(KILN_EXP_SHIFT)); \
        kb = V##_castps_##I(kf);                                                       \
        kf = V##_sub_ps(kf, V##_set1_ps(KILN_EXP_SHIFT));                              \
        const __typeof__(xc) r_ = V##_fmadd_ps(kf, V##_set1_ps(KILN_EXP_LN2_LO),        \
                                               V##_fmadd_ps(kf, V##_set1_ps(KILN_EXP_LN2_HI), xc)); \
        p = V##_set1_ps(KILN_EXP_P7);                                                  \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P6));                             \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P5));                             \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P4));                             \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P3));                             \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P2));                             \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P1));                             \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(KILN_EXP_P0));                             \
    } while (0)

static inline __m256 kiln_exp8(__m256 x) {
    __m256 xc = _mm256_max_ps(_mm256_set1_ps(KILN_EXP_XMIN), x); /* NaN stays NaN, as in the scalar */
    xc = _mm256_min_ps(_mm256_set1_ps(KILN_EXP_XMAX), xc);
    __m256 kf, p;
    __m256i kb;
    KILN_EXP_CORE(_mm256, si256, xc, kf, kb, p);
    const __m256i sb = _mm256_slli_epi32(_mm256_add_epi32(kb, _mm256_set1_epi32((int)KILN_EXP_BIAS)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(sb));
}
#endif
#if defined(__AVX512F__)
/* the same on 16 AVX-512 lanes: the same operations, so the same bits */
static inline __m512 kiln_exp16(__m512 x) {
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(KILN_EXP_XMIN), x);
    xc = _mm512_min_ps(_mm512_set1_ps(KILN_EXP_XMAX), xc);
    __m512 kf, p;
    __m512i kb;
    KILN_EXP_CORE(_mm512, si512, xc, kf, kb, p);
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
    __m512 kf, p;
    __m512i kb;
    KILN_EXP_CORE(_mm512, si512, xc, kf, kb, p);
    (void)kb;
    return _mm512_scalef_ps(p, kf);
}
#endif
#endif
