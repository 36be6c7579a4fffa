/* Cross-entropy over rows of logits (n × V) with integer targets.
 *
 * The forward's sum over rows uses a chunking that depends on n only, each
 * chunk summed in double and the chunks added in order, so the loss is
 * identical for any thread count. dlogits may be logits (in place). */
#include "kiln/kernels.h"

#define KILN_CE_PAR (1 << 15)
#define KILN_CE_CHUNKS 64

static float ce_row_max(const float *x, int64_t V) { return kiln_row_max(x, V); }

/* -log softmax(x)[t] = m + log(sum exp(x - m)) - x[t] */
static double ce_row_loss(const float *x, int64_t V, int32_t t) {
    float m = ce_row_max(x, V);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; j++) s += kiln_expf_fast(x[j] - m);
    return (double)m + log((double)s) - (double)x[t];
}

double kiln_k_cross_entropy(const float *logits, const int32_t *targets, int64_t n, int64_t V,
                            int32_t ignore_index, int64_t *count) {
    double part[KILN_CE_CHUNKS];
    int64_t cnt[KILN_CE_CHUNKS];
    int64_t nc = n < KILN_CE_CHUNKS ? n : KILN_CE_CHUNKS;
    if (nc < 1) {
        if (count) *count = 0;
        return 0.0;
    }
    int64_t per = (n + nc - 1) / nc;
#pragma omp parallel for schedule(static) if (n * V > KILN_CE_PAR && n > 1)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * per, hi = lo + per < n ? lo + per : n;
        double s = 0.0;
        int64_t k = 0;
        for (int64_t r = lo; r < hi; r++) {
            if (targets[r] == ignore_index) continue;
            s += ce_row_loss(logits + r * V, V, targets[r]);
            k++;
        }
        part[c] = s;
        cnt[c] = k;
    }
    double total = 0.0;
    int64_t k = 0;
    for (int64_t c = 0; c < nc; c++) {
        total += part[c];
        k += cnt[c];
    }
    if (count) *count = k;
    return total;
}

void kiln_k_cross_entropy_backward(const float *logits, const int32_t *targets, float g,
                                   float *dlogits, int64_t n, int64_t V, int32_t ignore_index) {
#pragma omp parallel for schedule(static) if (n * V > KILN_CE_PAR && n > 1)
    for (int64_t r = 0; r < n; r++) {
        const float *x = logits + r * V;
        float *d = dlogits + r * V;
        int32_t t = targets[r];
        if (t == ignore_index) {
            for (int64_t j = 0; j < V; j++) d[j] = 0.0f;
            continue;
        }
        float m = ce_row_max(x, V);
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; j++) {
            float e = kiln_expf_fast(x[j] - m);
            d[j] = e;
            s += e;
        }
        float scale = g / s;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) d[j] *= scale;
        d[t] -= g;
    }
}
