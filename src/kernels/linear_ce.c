/* Fused final linear + cross-entropy: the N×V logits never exist at once.
 *
 * Only rows whose target counts are computed at all: their indices are
 * listed and taken `chunk` at a time. A chunk whose rows are consecutive in h
 * is used in place; otherwise its rows are gathered into a scratch block (and
 * its dh rows scattered back), so padding costs neither GEMM time nor exp.
 * Per chunk: logits = h_c·Wᵀ (GEMM), then per row the loss and, in place,
 * dlogits = softmax − onehot; then dh_c = dlogits·W and dW += dlogitsᵀ·h_c.
 *
 * The loss is summed in double in row order after each chunk, so it does
 * not depend on the thread count given the GEMM's logits.
 */
#include <omp.h>

#include "kiln/kernels.h"

#define LCE_TARGET_BYTES (8u << 20) /* logits scratch aimed at about this */

static int64_t choose_chunk(int64_t V) {
    int64_t c = (int64_t)LCE_TARGET_BYTES / ((int64_t)sizeof(float) * (V > 0 ? V : 1));
    c = c < 256 ? 256 : c > 1024 ? 1024 : c;
    return c & ~(int64_t)15;
}

/* Loss of one row of logits x (length V) with target t; when grad, x is
 * overwritten with softmax(x) − onehot(t). */
static double lce_row(float *x, int64_t V, int32_t t, bool grad) {
    const float m = kiln_row_max(x, V);
    const double xt = x[t];
    float s = 0.0f;
    if (grad) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; j++) {
            float e = kiln_expf_fast(x[j] - m);
            x[j] = e;
            s += e;
        }
        const float inv = 1.0f / s;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) x[j] *= inv;
        x[t] -= 1.0f;
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; j++) s += kiln_expf_fast(x[j] - m);
    }
    return (double)m + log((double)s) - xt;
}

double kiln_k_linear_cross_entropy(const float *h, const float *W, const int32_t *targets, int64_t N,
                                   int64_t C, int64_t V, int32_t ignore_index, int64_t chunk,
                                   int64_t *count, float *dh, float *dW) {
    if (count) *count = 0;
    if (N <= 0 || V <= 0) {
        if (dW && V > 0) memset(dW, 0, (size_t)(V * C) * sizeof(float));
        return 0.0;
    }
    if (chunk <= 0) chunk = choose_chunk(V);
    if (chunk > N) chunk = N;
    const bool grad = dh || dW;
    /* scratch: counted-row indices, per-row losses, logits, gathered h and dh */
    size_t bytes = (size_t)N * sizeof(int64_t) + (size_t)chunk * sizeof(double) +
                   (size_t)(chunk * V + 2 * chunk * C) * sizeof(float);
    char *scratch = kiln_alloc(bytes);
    if (!scratch) return NAN;
    int64_t *idx = (int64_t *)scratch;
    double *rloss = (double *)(idx + N);
    float *logits = (float *)(rloss + chunk);
    float *hbuf = logits + chunk * V, *dhbuf = hbuf + chunk * C;
    int64_t cnt = 0;
    for (int64_t n = 0; n < N; n++)
        if (targets[n] != ignore_index) idx[cnt++] = n;
    if (count) *count = cnt;
    /* ignored rows get zero dh; dW is written by the first chunk's product
     * (beta 0) and accumulated by the rest, so it needs clearing only when
     * no row counts */
    if (dh && cnt < N) memset(dh, 0, (size_t)(N * C) * sizeof(float));
    if (dW && cnt == 0) memset(dW, 0, (size_t)(V * C) * sizeof(float));

    double total = 0.0;
    kiln_status st = KILN_OK;
    for (int64_t s0 = 0; s0 < cnt && st == KILN_OK; s0 += chunk) {
        const int64_t cn = cnt - s0 < chunk ? cnt - s0 : chunk;
        const int64_t *ri = idx + s0;
        const bool contiguous = ri[cn - 1] - ri[0] == cn - 1;
        const float *hc = h + ri[0] * C;
        if (!contiguous) {
            for (int64_t r = 0; r < cn; r++) memcpy(hbuf + r * C, h + ri[r] * C, (size_t)C * sizeof(float));
            hc = hbuf;
        }
        kiln_gemm_desc d = {.transA = false, .transB = true, .M = cn, .N = V, .K = C, .lda = C,
                            .ldb = C, .ldc = V, .batch = 1, .alpha = 1.0f, .beta = 0.0f};
        st = kiln_gemm_f32(&d, hc, W, logits);
        if (st) break;
#pragma omp parallel for schedule(static) if (cn * V > (1 << 15) && cn > 1)
        for (int64_t r = 0; r < cn; r++) rloss[r] = lce_row(logits + r * V, V, targets[ri[r]], grad);
        for (int64_t r = 0; r < cn; r++) total += rloss[r];
        if (dh) {
            float *dhc = contiguous ? dh + ri[0] * C : dhbuf;
            kiln_gemm_desc e = {.transA = false, .transB = false, .M = cn, .N = C, .K = V,
                                .lda = V, .ldb = C, .ldc = C, .batch = 1, .alpha = 1.0f,
                                .beta = 0.0f};
            st = kiln_gemm_f32(&e, logits, W, dhc);
            if (st) break;
            if (!contiguous)
                for (int64_t r = 0; r < cn; r++)
                    memcpy(dh + ri[r] * C, dhbuf + r * C, (size_t)C * sizeof(float));
        }
        if (dW) {
            kiln_gemm_desc e = {.transA = true, .transB = false, .M = V, .N = C, .K = cn,
                                .lda = V, .ldb = C, .ldc = C, .batch = 1, .alpha = 1.0f,
                                .beta = s0 ? 1.0f : 0.0f};
            st = kiln_gemm_f32(&e, logits, hc, dW);
        }
    }
    kiln_dealloc(scratch);
    return st == KILN_OK ? total : NAN;
}
