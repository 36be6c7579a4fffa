/* The f32 -> bf16 conversion kernels (the state they read is
 * kernels/convert.c): VCVTNE2PS2BF16 where the CPU has AVX512-BF16 (chosen
 * at run time in every form, through a target attribute), else the scalar
 * rounding, which the compiler vectorises for the form's instruction set. */
#include <immintrin.h>
#include <omp.h>
#include "kiln/kernels.h"

static void cvt_scalar(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kiln_f32_to_bf16(x[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bf16"))) static void cvt_native(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo); /* the second operand fills the low half */
        _mm512_storeu_si512((void *)(y + i), (__m512i)r);
    }
    if (i < n) { /* tail through the same instruction, so denormals behave alike */
        float buf[32] = {0};
        uint16_t out[32];
        for (int64_t j = i; j < n; j++) buf[j - i] = x[j];
        __m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(buf + 16), _mm512_loadu_ps(buf));
        _mm512_storeu_si512((void *)out, (__m512i)r);
        for (int64_t j = i; j < n; j++) y[j] = out[j - i];
    }
}
#endif

/* Splits large arrays over the OpenMP threads (memory bound: a few MB). */
#define PAR_MIN (1 << 16)
void kiln_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n) {
    bool native = kiln_bf16_native();
    int64_t chunks = n >= PAR_MIN ? (n + PAR_MIN - 1) / PAR_MIN : 1;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t a = c * PAR_MIN, len = c == chunks - 1 ? n - a : PAR_MIN;
#if defined(__x86_64__) && defined(__GNUC__)
        if (native) {
            cvt_native(x + a, y + a, len);
            continue;
        }
#endif
        (void)native;
        cvt_scalar(x + a, y + a, len);
    }
}

void kiln_k_round_bf16(const float *x, float *y, int64_t n) {
    int64_t chunks = n >= PAR_MIN ? (n + PAR_MIN - 1) / PAR_MIN : 1;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t a = c * PAR_MIN, len = c == chunks - 1 ? n - a : PAR_MIN;
        for (int64_t i = a; i < a + len; i++) y[i] = kiln_round_bf16f(x[i]);
    }
}

/* y[i] = x[i] widened exactly (bf16 -> fp32: a 16-bit shift), over the
 * threads for large arrays: the emulated bf16 products widen both operands
 * on every call */
void kiln_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t chunks = n >= PAR_MIN ? (n + PAR_MIN - 1) / PAR_MIN : 1;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t a = c * PAR_MIN, e = c == chunks - 1 ? n : a + PAR_MIN;
#pragma omp simd
        for (int64_t i = a; i < e; i++) y[i] = kiln_bf16_to_f32(x[i]);
    }
}
