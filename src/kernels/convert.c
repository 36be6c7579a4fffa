/* f32 -> bf16 conversion of whole arrays, for the bf16 matrix products of
 * mixed precision (autocast). Round to nearest even, as kiln_f32_to_bf16.
 *
 * With AVX512-BF16 the conversion is one VCVTNE2PS2BF16 per 32 values. That
 * instruction always treats denormal inputs as zero (it ignores MXCSR), so
 * a denormal f32 becomes a signed bf16 zero there, where the scalar
 * kiln_f32_to_bf16 would round it to a bf16 denormal; every other input
 * (normal, zero, inf, NaN) converts bit-identically. Without the
 * instructions the scalar loop runs (the compiler vectorises it). */
#include <immintrin.h>
#include <omp.h>
#include "kiln/kernels.h"

static int g_force_emulation = 0;

bool kiln_cpu_has_avx512bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

void kiln_bf16_force_emulation(bool on) { __atomic_store_n(&g_force_emulation, on ? 1 : 0, __ATOMIC_RELAXED); }

bool kiln_bf16_native(void) {
    return !__atomic_load_n(&g_force_emulation, __ATOMIC_RELAXED) && kiln_cpu_has_avx512bf16();
}

const char *kiln_bf16_path(void) {
    return kiln_bf16_native() ? "native AVX512-BF16 (oneDNN bf16 GEMM, fp32 accumulate)"
                              : "emulated (operands rounded to bf16, fp32 GEMM: bf16 numerics, no speed-up)";
}

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
        for (int64_t i = a; i < a + len; i++) y[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(x[i]));
    }
}
