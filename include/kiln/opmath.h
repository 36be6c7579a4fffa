/* kiln opmath: the scalar math of the ops, written once.
 *
 * The kernels use these functions; the code generator embeds this file's
 * text verbatim at the top of every generated module (the Makefile turns it
 * into a C string, build/gen/opmath_text.h), and the ops' C expressions call
 * them. So eager kernels, the graph interpreter (which runs the kernels) and
 * compiled code evaluate the same expression in the same order, and fused
 * element-wise groups give the same bits compiled as eager.
 *
 * Rules for this file: libc headers only, static inline functions, no other
 * kiln header and no kiln symbol (generated modules must not resolve kiln
 * symbols); plain C that `#pragma omp simd` loops vectorise (no libm call
 * in per-element code). Multiply-adds that should fuse are written as fmaf:
 * kiln (-std=c11) and generated modules (-ffp-contract=off in the default
 * module flags) never contract a*b+c on their own, so both round alike.
 * Owned by core (it has no dependencies); core.h includes it for the bf16
 * conversions.
 */
#ifndef KILN_OPMATH_H
#define KILN_OPMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) in float, relative error < 5e-7 against double for
 * x in [-87.33, 88.37]. Below that the true value is subnormal: it returns
 * 0 from about -87.7 down (absolute error < 1.2e-38); above 88.376 it returns
 * +inf (exact overflow is at 88.72). NaN propagates. Plain C so that
 * `#pragma omp simd` loops vectorise it. The clamps are written so they
 * become single vmaxps/vminps that pass NaN through, and the range ends need
 * no select: k = -127 builds a scale of +0, k = 128 one of +inf. The exponent
 * comes from bit arithmetic, not a float->int conversion, so NaN and inf
 * inputs are not undefined behaviour. */
/* Its constants, also used by the hand-vectorised forms (kernels/simd_exp.h),
 * which repeat these operations lane-wise in the same order: the clamp, the
 * round-to-integer shift 1.5*2^23, ln2 split in two (Cody-Waite) and the
 * Taylor coefficients of e^r to r^7 (P7 = 1/7! ... P0 = 1). */
#define KILN_EXP_XMIN (-88.0f)
#define KILN_EXP_XMAX 89.0f
#define KILN_EXP_LOG2E 1.44269504088896341f
#define KILN_EXP_SHIFT 12582912.0f
#define KILN_EXP_LN2_HI (-0.693359375f)
#define KILN_EXP_LN2_LO 2.12194440e-4f
#define KILN_EXP_P7 1.98412698e-4f
#define KILN_EXP_P6 1.38888889e-3f
#define KILN_EXP_P5 8.33333333e-3f
#define KILN_EXP_P4 4.16666667e-2f
#define KILN_EXP_P3 1.66666667e-1f
#define KILN_EXP_P2 0.5f
#define KILN_EXP_P1 1.0f
#define KILN_EXP_P0 1.0f
#define KILN_EXP_BIAS (127u - 0x4B400000u) /* shift's bits + this = k + 127 */
static inline float kiln_expf_fast(float x) {
    float xc = x < KILN_EXP_XMIN ? KILN_EXP_XMIN : x;
    xc = xc > KILN_EXP_XMAX ? KILN_EXP_XMAX : xc;
    /* k = round(x / ln2) via the 1.5*2^23 trick; its bits hold k */
    float kf = fmaf(xc, KILN_EXP_LOG2E, KILN_EXP_SHIFT);
    uint32_t kb;
    memcpy(&kb, &kf, sizeof kb);
    kf -= KILN_EXP_SHIFT;
    float r = fmaf(kf, KILN_EXP_LN2_HI, xc); /* Cody-Waite split of ln2 */
    r = fmaf(kf, KILN_EXP_LN2_LO, r);
    float p = KILN_EXP_P7; /* Taylor to r^7 on |r| <= ln2/2 */
    p = fmaf(p, r, KILN_EXP_P6);
    p = fmaf(p, r, KILN_EXP_P5);
    p = fmaf(p, r, KILN_EXP_P4);
    p = fmaf(p, r, KILN_EXP_P3);
    p = fmaf(p, r, KILN_EXP_P2);
    p = fmaf(p, r, KILN_EXP_P1);
    p = fmaf(p, r, KILN_EXP_P0);
    uint32_t sb = (kb + KILN_EXP_BIAS) << 23; /* 2^k, k in [-127, 128] */
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}

/* silu(x) = x * sigmoid(x) = x / (1 + e^-x); large negative x gives
 * e^-x = inf and the quotient -0, as it should. */
static inline float kiln_silu_f(float x) { return x / (1.0f + kiln_expf_fast(-x)); }

/* g * d silu / dx = g * s (1 + x (1 - s)), s = sigmoid(x) */
static inline float kiln_silu_bwd_f(float x, float g) {
    float s = 1.0f / (1.0f + kiln_expf_fast(-x));
    return g * (s * (1.0f + x * (1.0f - s)));
}

/* log sigmoid(x) = min(x, 0) - log(1 + e^-|x|), finite for every finite x */
static inline float kiln_logsigmoid_f(float x) { return (x < 0.0f ? x : 0.0f) - log1pf(kiln_expf_fast(-fabsf(x))); }
/* g * d logsigmoid / dx = g * sigmoid(-x) = g / (1 + e^x) */
static inline float kiln_logsigmoid_bwd_f(float x, float g) { return g / (1.0f + kiln_expf_fast(x)); }
/* g * d tanh / dx = g (1 - tanh^2 x) */
static inline float kiln_tanh_bwd_f(float x, float g) {
    float t = tanhf(x);
    return g * (1.0f - t * t);
}
/* GELU, tanh approximation (PyTorch's approximate="tanh") and its gradient */
static inline float kiln_gelu_tanh_f(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
static inline float kiln_gelu_tanh_bwd_f(float x, float g) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x), t = tanhf(u);
    float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
/* log(1 - e^x) for x < 0, accurate at both ends (log(-expm1(x)) near 0,
 * log1p(-e^x) far below); -inf at 0, NaN above */
static inline float kiln_log1mexp_f(float x) { return x > -0.693147181f ? logf(-expm1f(x)) : log1pf(-expf(x)); }
/* g * d log(1 - e^x) / dx = g * -e^x / (1 - e^x) = -g / expm1(-x) */
static inline float kiln_log1mexp_bwd_f(float x, float g) { return -g / expm1f(-x); }

/* RMSNorm's row factor 1 / sqrt(ss / n + eps) from the row's sum of squares
 * ss (summed in float), in double. */
static inline float kiln_rms_rstd(float ss, float n, float eps) {
    return (float)(1.0 / sqrt((double)ss / (double)n + (double)eps));
}

/* bf16 <-> f32: round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float kiln_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* f rounded to bf16 and held as f32 (round_bf16: the emulated products'
 * operands) */
static inline float kiln_round_bf16f(float f) { return kiln_bf16_to_f32(kiln_f32_to_bf16(f)); }

/* Dropout's mask, counter-based: element i of the op instance `inst` under
 * the micro-batch key `key` (an integer in [0, 2^24) held exactly in a
 * float, so it travels as an ordinary f32 scalar input) is kept when a hash
 * of (key, inst, i) is at least p * 2^32, and kept values are scaled by
 * 1 / (1 - p) (inverted dropout). No state: eager, the interpreter's
 * chunks and compiled loops get the same mask from the same three numbers,
 * and backward recomputes it instead of saving it. */
static inline uint32_t kiln_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x21f0aaadu;
    x ^= x >> 15;
    x *= 0x735a2d97u;
    x ^= x >> 15;
    return x;
}
static inline int kiln_dropout_keep(float key, int64_t inst, int64_t i, float p) {
    uint32_t k = key >= 0.0f && key < 16777216.0f ? (uint32_t)key : 0u;
    uint32_t s = kiln_mix32(k ^ kiln_mix32((uint32_t)inst ^ 0x6c6f7261u));
    uint32_t h = kiln_mix32(kiln_mix32((uint32_t)i ^ s) ^ (uint32_t)((uint64_t)i >> 32));
    uint32_t t = (uint32_t)((double)p * 4294967296.0);
    return h >= t;
}
static inline float kiln_dropout_f(float x, float key, int64_t i, float p, int64_t inst) {
    return kiln_dropout_keep(key, inst, i, p) ? x * (1.0f / (1.0f - p)) : 0.0f;
}

#endif
