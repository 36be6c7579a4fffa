/* AdamW, in torch.optim.AdamW's exact form (single-tensor path):
 *   p *= 1 - lr wd
 *   m  = lerp(m, g, 1 - b1)          (m + (1-b1)(g - m), torch's lerp for w < .5)
 *   v  = v b2 + ((1 - b2) g) g
 *   denom = sqrt(v) / sqrt(bc2) + eps
 *   p += (-lr / bc1) m / denom
 * Scalars that torch forms from Python floats are formed in double here.
 *
 * The optimiser step runs kiln_k_adamw_multi: every parameter's blocks in one
 * parallel loop (one fork/join per step instead of one per parameter), with
 * the clipping factor applied to g as it is read and g zeroed as it is
 * consumed, so clip + AdamW + zeroing is one pass over p, g, m and v. g times
 * the clipping factor is the same float product kiln_k_scale stores, so the
 * result is bit-identical to scale, then update, then zero.
 *
 * sqrtf in a loop does not vectorise under gcc's default -fmath-errno, so the
 * AVX-512 and AVX2 paths use intrinsics; they do the same IEEE operations in
 * the same order as the scalar loop, so all give identical bits. */
#include "kiln/kernels.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define KILN_ADAMW_PAR (1 << 15)
#define KILN_ADAMW_BLOCK 4096

typedef struct {
    float omb1, lerp_hi, b2, omb2, bc2s, eps, neg_step, gscale;
    bool lerp_lo;
} adamw_consts;

/* gz: NULL, or g itself (zeroed after it is read) */
static void adamw_scalar(float *p, const float *g, float *m, float *v, float *gz, int64_t lo, int64_t hi, float decay,
                         const adamw_consts *k) {
    for (int64_t i = lo; i < hi; i++) {
        float gi = g[i] * k->gscale;
        float pi = p[i] * decay;
        float mi = k->lerp_lo ? m[i] + k->omb1 * (gi - m[i]) : gi - (gi - m[i]) * k->lerp_hi;
        float vi = v[i] * k->b2 + k->omb2 * gi * gi;
        float denom = sqrtf(vi) / k->bc2s + k->eps;
        p[i] = pi + k->neg_step * mi / denom;
        m[i] = mi;
        v[i] = vi;
        if (gz) gz[i] = 0.0f;
    }
}

#if defined(__AVX512F__)
static void adamw_range(float *p, const float *g, float *m, float *v, float *gz, int64_t lo, int64_t hi, float dec,
                        const adamw_consts *k) {
    const __m512 decay = _mm512_set1_ps(dec), omb1 = _mm512_set1_ps(k->omb1), lerp_hi = _mm512_set1_ps(k->lerp_hi),
                 b2 = _mm512_set1_ps(k->b2), omb2 = _mm512_set1_ps(k->omb2), bc2s = _mm512_set1_ps(k->bc2s),
                 eps = _mm512_set1_ps(k->eps), nstep = _mm512_set1_ps(k->neg_step), gs = _mm512_set1_ps(k->gscale),
                 zero = _mm512_setzero_ps();
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16) {
        __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), gs), mi = _mm512_loadu_ps(m + i);
        __m512 vi = _mm512_loadu_ps(v + i), pi = _mm512_loadu_ps(p + i);
        pi = _mm512_mul_ps(pi, decay);
        __m512 diff = _mm512_sub_ps(gi, mi);
        mi = k->lerp_lo ? _mm512_add_ps(mi, _mm512_mul_ps(omb1, diff)) : _mm512_sub_ps(gi, _mm512_mul_ps(diff, lerp_hi));
        vi = _mm512_add_ps(_mm512_mul_ps(vi, b2), _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2s), eps);
        pi = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(nstep, mi), denom));
        _mm512_storeu_ps(p + i, pi);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        if (gz) _mm512_storeu_ps(gz + i, zero);
    }
    adamw_scalar(p, g, m, v, gz, i, hi, dec, k);
}
#elif defined(__AVX2__)
static void adamw_range(float *p, const float *g, float *m, float *v, float *gz, int64_t lo, int64_t hi, float dec,
                        const adamw_consts *k) {
    const __m256 decay = _mm256_set1_ps(dec), omb1 = _mm256_set1_ps(k->omb1), lerp_hi = _mm256_set1_ps(k->lerp_hi),
                 b2 = _mm256_set1_ps(k->b2), omb2 = _mm256_set1_ps(k->omb2), bc2s = _mm256_set1_ps(k->bc2s),
                 eps = _mm256_set1_ps(k->eps), nstep = _mm256_set1_ps(k->neg_step), gs = _mm256_set1_ps(k->gscale),
                 zero = _mm256_setzero_ps();
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs), mi = _mm256_loadu_ps(m + i);
        __m256 vi = _mm256_loadu_ps(v + i), pi = _mm256_loadu_ps(p + i);
        pi = _mm256_mul_ps(pi, decay);
        __m256 diff = _mm256_sub_ps(gi, mi);
        mi = k->lerp_lo ? _mm256_add_ps(mi, _mm256_mul_ps(omb1, diff)) : _mm256_sub_ps(gi, _mm256_mul_ps(diff, lerp_hi));
        vi = _mm256_add_ps(_mm256_mul_ps(vi, b2), _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2s), eps);
        pi = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(nstep, mi), denom));
        _mm256_storeu_ps(p + i, pi);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        if (gz) _mm256_storeu_ps(gz + i, zero);
    }
    adamw_scalar(p, g, m, v, gz, i, hi, dec, k);
}
#else
#define adamw_range adamw_scalar
#endif

static adamw_consts adamw_setup(float beta1, float beta2, float eps, float lr, float bc1, float bc2, float gscale) {
    adamw_consts k;
    double w = 1.0 - (double)beta1;
    k.omb1 = (float)w;
    k.lerp_lo = w < 0.5;
    k.lerp_hi = (float)(1.0 - w);
    k.b2 = beta2;
    k.omb2 = (float)(1.0 - (double)beta2);
    k.bc2s = (float)sqrt((double)bc2);
    k.eps = eps;
    k.neg_step = (float)(-((double)lr / (double)bc1));
    k.gscale = gscale;
    return k;
}

static float adamw_decay(float lr, float wd) { return (float)(1.0 - (double)lr * (double)wd); }

void kiln_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
    adamw_consts k = adamw_setup(beta1, beta2, eps, lr, bc1, bc2, 1.0f); /* g * 1.0f == g */
    float decay = adamw_decay(lr, wd);
    int64_t nb = (n + KILN_ADAMW_BLOCK - 1) / KILN_ADAMW_BLOCK;
#pragma omp parallel for schedule(static) if (n > KILN_ADAMW_PAR)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * KILN_ADAMW_BLOCK, hi = lo + KILN_ADAMW_BLOCK < n ? lo + KILN_ADAMW_BLOCK : n;
        adamw_range(p, g, m, v, NULL, lo, hi, decay, &k);
    }
}

static int64_t blocks_of(int64_t n) { return (n + KILN_ADAMW_BLOCK - 1) / KILN_ADAMW_BLOCK; }

void kiln_k_adamw_multi(const kiln_adamw_slot *s, int count, float gscale, float lr, float beta1, float beta2,
                        float eps, float bc1, float bc2) {
    adamw_consts k = adamw_setup(beta1, beta2, eps, lr, bc1, bc2, gscale);
    int64_t nb = 0, elems = 0;
    for (int j = 0; j < count; j++) nb += blocks_of(s[j].n), elems += s[j].n;
#pragma omp parallel if (elems > KILN_ADAMW_PAR)
    {
        /* a static schedule hands each thread increasing block numbers, so a
         * private cursor (slot j covers blocks [first, first + blocks)) only
         * moves forward */
        int j = 0;
        int64_t first = 0;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            while (b >= first + blocks_of(s[j].n)) first += blocks_of(s[j++].n);
            int64_t lo = (b - first) * KILN_ADAMW_BLOCK, hi = lo + KILN_ADAMW_BLOCK;
            if (hi > s[j].n) hi = s[j].n;
            adamw_range(s[j].p, s[j].g, s[j].m, s[j].v, s[j].g, lo, hi, adamw_decay(lr, s[j].wd), &k);
        }
    }
}
