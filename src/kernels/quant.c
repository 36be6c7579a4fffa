/* ggml's block formats: dequantization as ggml's to_float, quantization as
 * ggml's reference quantizers (ggml-quants.c, quantize_row_*_ref), the same
 * float operations in the same order so the bytes and values agree bit for
 * bit (the build's -ffp-contract=off keeps a*b+c two roundings, as ggml's
 * portable code computes it). Blocks are read and written as bytes (no
 * struct casts: a row may start at any byte). */
#include <float.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include "kiln/quant.h"

#define QK 256 /* values per K-quant super-block (ggml's QK_K) */
#define GROUP_MAX_EPS 1e-15f

static const kiln_qtype_info g_types[] = {
    {KILN_QT_F32, "f32", 1, 4, false},     {KILN_QT_F16, "f16", 1, 2, false},
    {KILN_QT_BF16, "bf16", 1, 2, false},   {KILN_QT_Q8_0, "q8_0", 32, 34, true},
    {KILN_QT_Q4_0, "q4_0", 32, 18, true},  {KILN_QT_Q4_1, "q4_1", 32, 20, true},
    {KILN_QT_Q5_0, "q5_0", 32, 22, true},  {KILN_QT_Q5_1, "q5_1", 32, 24, true},
    {KILN_QT_Q4_K, "q4_k", QK, 144, true}, {KILN_QT_Q5_K, "q5_k", QK, 176, true},
    {KILN_QT_Q6_K, "q6_k", QK, 210, true},
};
#define N_TYPES ((int)(sizeof g_types / sizeof g_types[0]))

int kiln_qtype_count(void) { return N_TYPES; }
const kiln_qtype_info *kiln_qtype_at(int i) { return i >= 0 && i < N_TYPES ? &g_types[i] : NULL; }
const kiln_qtype_info *kiln_qtype_find(int id) {
    for (int i = 0; i < N_TYPES; i++)
        if ((int)g_types[i].type == id) return &g_types[i];
    return NULL;
}
const kiln_qtype_info *kiln_qtype_by_name(const char *name) {
    for (int i = 0; name && i < N_TYPES; i++)
        if (!strcasecmp(g_types[i].name, name)) return &g_types[i];
    return NULL;
}
size_t kiln_q_row_bytes(kiln_qtype t, int64_t n) {
    const kiln_qtype_info *q = kiln_qtype_find((int)t);
    if (!q || n < 0 || n % q->block) return 0;
    return (size_t)(n / q->block) * (size_t)q->bytes;
}

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kiln_f16_to_f32(h);
}
static inline void f2h(uint8_t *p, float f) {
    uint16_t h = kiln_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* ggml's nearest_int: round to nearest even through the float mantissa
 * (exact for |x| < 2^22; beyond it, ggml's bits, reproduced). */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}
/* C's float -> int truncation, defined where C leaves it undefined as x86's
 * cvttss2si defines it (INT_MIN), which is what ggml's compiled code gives. */
static inline int trunc_int(float f) { return f > -2147483648.f && f < 2147483648.f ? (int)f : INT32_MIN; }
static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int imin(int a, int b) { return a < b ? a : b; }

/* ---- dequantization --------------------------------------------------- */

static void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

static void deq_q8_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const float d = h2f(x);
        for (int j = 0; j < 32; j++) y[j] = (int8_t)x[2 + j] * d;
    }
}

static void deq_q4_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = h2f(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            const int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

static void deq_q4_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 20, y += 32) {
        const float d = h2f(x), m = h2f(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            const int x0 = qs[j] & 0x0F, x1 = qs[j] >> 4;
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

/* The 32 fifth bits of a q5_0/q5_1 block: bit j for value j. */
static inline uint32_t qh_bits(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void deq_q5_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 22, y += 32) {
        const float d = h2f(x);
        const uint32_t qh = qh_bits(x + 2);
        const uint8_t *qs = x + 6;
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((qs[j] & 0x0Fu) | ((qh >> j) & 1u) << 4) - 16;
            const int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4) - 16;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

static void deq_q5_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 24, y += 32) {
        const float d = h2f(x), m = h2f(x + 2);
        const uint32_t qh = qh_bits(x + 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((qs[j] & 0x0Fu) | ((qh >> j) & 1u) << 4);
            const int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

static void deq_q4_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 144) {
        const float d = h2f(x), min = h2f(x + 2);
        const uint8_t *sc8 = x + 4, *q = x + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK; j += 64) {
            get_scale_min_k4(is + 0, sc8, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, sc8, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void deq_q5_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 176) {
        const float d = h2f(x), min = h2f(x + 2);
        const uint8_t *sc8 = x + 4, *qh = x + 16, *ql = x + 48;
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QK; j += 64) {
            get_scale_min_k4(is + 0, sc8, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, sc8, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void deq_q6_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 210) {
        const float d = h2f(x + 208);
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int n = 0; n < QK; n += 128) {
            for (int l = 0; l < 32; ++l) {
                int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

static kiln_status check_n(kiln_qtype t, int64_t n, const kiln_qtype_info **out) {
    const kiln_qtype_info *q = kiln_qtype_find((int)t);
    if (!q) return kiln_error(KILN_ERR_UNSUPPORTED, "ggml tensor type %d is not supported", (int)t);
    if (n < 0 || n % q->block)
        return kiln_error(KILN_ERR_SHAPE, "%s needs a multiple of %d values, got %lld", q->name, q->block, (long long)n);
    *out = q;
    return KILN_OK;
}

kiln_status kiln_q_dequantize(kiln_qtype t, const void *src, float *dst, int64_t n) {
    const kiln_qtype_info *q = NULL;
    kiln_status st = check_n(t, n, &q);
    if (st) return st;
    const uint8_t *x = src;
    int64_t nb = n / q->block;
    switch (t) {
    case KILN_QT_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KILN_QT_F16: /* a NaN comes back quiet, as ggml's conversion (a float multiply) gives it */
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, x + 2 * i, 2);
            float f = kiln_f16_to_f32(h);
            if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
                uint32_t u;
                memcpy(&u, &f, 4);
                u |= 0x400000u;
                memcpy(&f, &u, 4);
            }
            dst[i] = f;
        }
        break;
    case KILN_QT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, x + 2 * i, 2);
            dst[i] = kiln_bf16_to_f32(h);
        }
        break;
    case KILN_QT_Q8_0: deq_q8_0(x, dst, nb); break;
    case KILN_QT_Q4_0: deq_q4_0(x, dst, nb); break;
    case KILN_QT_Q4_1: deq_q4_1(x, dst, nb); break;
    case KILN_QT_Q5_0: deq_q5_0(x, dst, nb); break;
    case KILN_QT_Q5_1: deq_q5_1(x, dst, nb); break;
    case KILN_QT_Q4_K: deq_q4_k(x, dst, nb); break;
    case KILN_QT_Q5_K: deq_q5_k(x, dst, nb); break;
    case KILN_QT_Q6_K: deq_q6_k(x, dst, nb); break;
    }
    return KILN_OK;
}

/* ---- quantization (ggml's reference quantizers) ------------------------ */

static void q_q8_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j])); /* MAX(a, b) on non-NaN values */
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        f2h(y, d);
        for (int j = 0; j < 32; ++j) {
            const float x0 = x[j] * id;
            y[2 + j] = (uint8_t)(int8_t)trunc_int(roundf(x0));
        }
    }
}

/* The first of a block's 32 values of the largest magnitude, with its sign
 * (q4_0 and q5_0 scale by it, as ggml's reference quantizers do). */
static float signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void q_q4_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 18) {
        const float max = signed_absmax(x);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(y, d);
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            const uint8_t xi0 = (uint8_t)imin(15, (int8_t)trunc_int(x0 + 8.5f));
            const uint8_t xi1 = (uint8_t)imin(15, (int8_t)trunc_int(x1 + 8.5f));
            y[2 + j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

/* The block's min and max as ggml's q4_1/q5_1 find them (from FLT_MAX). */
static void min_max(const float *x, float *mn, float *mx) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *mn = min, *mx = max;
}

static void put_qh(uint8_t *p, uint32_t qh) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(qh >> (8 * k));
}

static void q_q4_1(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 20) {
        float min, max;
        min_max(x, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(y, d);
        f2h(y + 2, min);
        for (int j = 0; j < 16; ++j) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)imin(15, (int8_t)trunc_int(x0 + 0.5f));
            const uint8_t xi1 = (uint8_t)imin(15, (int8_t)trunc_int(x1 + 0.5f));
            y[4 + j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void q_q5_0(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 22) {
        const float max = signed_absmax(x);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(y, d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            const uint8_t xi0 = (uint8_t)imin(31, (int8_t)trunc_int(x0 + 16.5f));
            const uint8_t xi1 = (uint8_t)imin(31, (int8_t)trunc_int(x1 + 16.5f));
            y[6 + j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= (uint32_t)((xi0 >> 4) & 1) << j | (uint32_t)((xi1 >> 4) & 1) << (j + 16);
        }
        put_qh(y + 2, qh);
    }
}

static void q_q5_1(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 24) {
        float min, max;
        min_max(x, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(y, d);
        f2h(y + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)trunc_int(x0 + 0.5f), xi1 = (uint8_t)trunc_int(x1 + 0.5f); /* no clamp, as ggml */
            y[8 + j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= (uint32_t)((xi0 >> 4) & 1) << j | (uint32_t)((xi1 >> 4) & 1) << (j + 16);
        }
        put_qh(y + 4, qh);
    }
}

static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        float w = weights[i];
        best_error += w * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                float w = weights[i];
                cur_error += w * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* make_qx_quants with rmse_type 1 and no weights (all q6_k's reference uses). */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* The shared part of q4_k and q5_k: per 32-value sub-block a scale and a
 * min (make_qkx2_quants), quantized to 6 bits against the super-block's
 * largest, then the values requantized with the stored scales. */
static void qk_scales_mins(const float *x, uint8_t *blk, uint8_t *L, int nmax, float rmin, int nstep) {
    uint8_t Laux[32];
    float weights[32], mins[QK / 32], scales[QK / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        float scale = scales[j];
        if (scale > max_scale) max_scale = scale;
        float min = mins[j];
        if (min > max_min) max_min = min;
    }
    uint8_t *sc8 = blk + 4;
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK / 32; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            sc8[j] = ls;
            sc8[j + 4] = lm;
        } else {
            sc8[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc8[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc8[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    f2h(blk, max_scale / 63.f);
    f2h(blk + 2, max_min / 63.f);
    uint8_t sc, m;
    for (int j = 0; j < QK / 32; ++j) {
        get_scale_min_k4(j, sc8, &sc, &m);
        const float d = h2f(blk) * sc;
        if (!d) continue;
        const float dm = h2f(blk + 2) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void q_q4_k(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[QK];
    for (int64_t i = 0; i < nb; i++, x += QK, y += 144) {
        qk_scales_mins(x, y, L, 15, -1.f, 20);
        uint8_t *q = y + 16;
        for (int j = 0; j < QK; j += 64) {
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
    }
}

static void q_q5_k(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[QK];
    for (int64_t i = 0; i < nb; i++, x += QK, y += 176) {
        qk_scales_mins(x, y, L, 31, -0.5f, 15);
        uint8_t *qh = y + 16, *ql = y + 48;
        memset(qh, 0, QK / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK; n += 64) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                int l2 = L[n + j + 32];
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 <<= 2;
            m2 <<= 2;
            ql += 32;
        }
    }
}

static void q_q6_k(const float *x, uint8_t *y, int64_t nb) {
    int8_t L[QK];
    float scales[QK / 16];
    for (int64_t i = 0; i < nb; i++, x += QK, y += 210) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK / 16; ++ib) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(y, 0, 210);
            f2h(y + 208, 0.f);
            continue;
        }
        int8_t *sc = (int8_t *)(y + 192);
        float iscale = -128.f / max_scale;
        f2h(y + 208, 1 / iscale);
        for (int ib = 0; ib < QK / 16; ++ib) sc[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK / 16; ++j) {
            float d = h2f(y + 208) * sc[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16 * j + ii] / d);
                l = imax(-32, imin(31, l));
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t *ql = y, *qh = y + 128;
        for (int j = 0; j < QK; j += 128) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}

kiln_status kiln_q_quantize(kiln_qtype t, const float *src, void *dst, int64_t n) {
    const kiln_qtype_info *q = NULL;
    kiln_status st = check_n(t, n, &q);
    if (st) return st;
    uint8_t *y = dst;
    int64_t nb = n / q->block;
    switch (t) {
    case KILN_QT_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KILN_QT_F16:
        for (int64_t i = 0; i < n; i++) f2h(y + 2 * i, src[i]);
        break;
    case KILN_QT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = kiln_f32_to_bf16(src[i]);
            memcpy(y + 2 * i, &h, 2);
        }
        break;
    case KILN_QT_Q8_0: q_q8_0(src, y, nb); break;
    case KILN_QT_Q4_0: q_q4_0(src, y, nb); break;
    case KILN_QT_Q4_1: q_q4_1(src, y, nb); break;
    case KILN_QT_Q5_0: q_q5_0(src, y, nb); break;
    case KILN_QT_Q5_1: q_q5_1(src, y, nb); break;
    case KILN_QT_Q4_K: q_q4_k(src, y, nb); break;
    case KILN_QT_Q5_K: q_q5_k(src, y, nb); break;
    case KILN_QT_Q6_K: q_q6_k(src, y, nb); break;
    }
    return KILN_OK;
}
