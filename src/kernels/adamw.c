/* AdamW, in torch.optim.AdamW's exact form (single-tensor path):
 *   p *= 1 - lr wd
 *   m  = lerp(m, g, 1 - b1)          (m + (1-b1)(g - m), torch's lerp for w < .5)
 *   v  = v b2 + ((1 - b2) g) g
 *   denom = sqrt(v) / sqrt(bc2) + eps
 *   p += (-lr / bc1) m / denom
 * Scalars that torch forms from Python floats are formed in double here.
 *
 * sqrtf in a loop does not vectorise under gcc's default -fmath-errno, so the
 * AVX-512 path uses intrinsics; it does the same IEEE operations in the same
 * order as the scalar loop, so both give identical bits. */
#include "kiln/kernels.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define KILN_ADAMW_PAR (1 << 15)

typedef struct {
    float decay, b1, omb1, lerp_hi, b2, omb2, bc2s, eps, neg_step;
    bool lerp_lo;
} adamw_consts;

static void adamw_scalar(float *p, const float *g, float *m, float *v, int64_t lo, int64_t hi,
                         const adamw_consts *k) {
    for (int64_t i = lo; i < hi; i++) {
        float gi = g[i];
        float pi = p[i] * k->decay;
        float mi = k->lerp_lo ? m[i] + k->omb1 * (gi - m[i]) : gi - (gi - m[i]) * k->lerp_hi;
        float vi = v[i] * k->b2 + k->omb2 * gi * gi;
        float denom = sqrtf(vi) / k->bc2s + k->eps;
        p[i] = pi + k->neg_step * mi / denom;
        m[i] = mi;
        v[i] = vi;
    }
}

#ifdef __AVX512F__
static void adamw_avx512(float *p, const float *g, float *m, float *v, int64_t lo, int64_t hi,
                         const adamw_consts *k) {
    const __m512 decay = _mm512_set1_ps(k->decay), omb1 = _mm512_set1_ps(k->omb1),
                 lerp_hi = _mm512_set1_ps(k->lerp_hi), b2 = _mm512_set1_ps(k->b2),
                 omb2 = _mm512_set1_ps(k->omb2), bc2s = _mm512_set1_ps(k->bc2s),
                 eps = _mm512_set1_ps(k->eps), nstep = _mm512_set1_ps(k->neg_step);
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16) {
        __m512 gi = _mm512_loadu_ps(g + i), mi = _mm512_loadu_ps(m + i);
        __m512 vi = _mm512_loadu_ps(v + i), pi = _mm512_loadu_ps(p + i);
        pi = _mm512_mul_ps(pi, decay);
        __m512 diff = _mm512_sub_ps(gi, mi);
        mi = k->lerp_lo ? _mm512_add_ps(mi, _mm512_mul_ps(omb1, diff))
                        : _mm512_sub_ps(gi, _mm512_mul_ps(diff, lerp_hi));
        vi = _mm512_add_ps(_mm512_mul_ps(vi, b2), _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2s), eps);
        pi = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(nstep, mi), denom));
        _mm512_storeu_ps(p + i, pi);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
    }
    adamw_scalar(p, g, m, v, i, hi, k);
}
#define ADAMW_RANGE adamw_avx512
#else
#define ADAMW_RANGE adamw_scalar
#endif

void kiln_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
    adamw_consts k;
    double w = 1.0 - (double)beta1;
    k.decay = (float)(1.0 - (double)lr * (double)wd);
    k.b1 = beta1;
    k.omb1 = (float)w;
    k.lerp_lo = w < 0.5;
    k.lerp_hi = (float)(1.0 - w);
    k.b2 = beta2;
    k.omb2 = (float)(1.0 - (double)beta2);
    k.bc2s = (float)sqrt((double)bc2);
    k.eps = eps;
    k.neg_step = (float)(-((double)lr / (double)bc1));
    const int64_t blk = 4096;
    int64_t nb = (n + blk - 1) / blk;
#pragma omp parallel for schedule(static) if (n > KILN_ADAMW_PAR)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * blk, hi = lo + blk < n ? lo + blk : n;
        ADAMW_RANGE(p, g, m, v, lo, hi, &k);
    }
}
