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
 *
 * bf16 (a head under autocast): the three products take bf16 operands as
 * the bf16 MATMUL does (h and W rounded to bf16, fp32 accumulation), the
 * softmax and the loss stay fp32, and the output gradient is rounded to
 * bf16 after it was multiplied by the seed: the compiler hands the fused
 * op the loss's incoming gradient (the trainer's token normalisation) as
 * the seed, so dlogits are rounded where eager rounds them, not before a
 * later scaling (which would round differently unless the scale were a
 * power of two).
 */
#include <omp.h>

#include "kiln/kernels.h"

/* Logits scratch aimed at about this, in chunks of 256 to LCE_MAX_ROWS
 * rows; the input-gradient product (chunk x C x V) is the one a short
 * chunk slows most. Measured on a Zen 3 (AVX2, 2 threads): at vocab 8192
 * (the small model) 1024 rows instead of 256 took head + loss from 331-334
 * to 298-305 ms per step (two alternating pairs, `kiln bench --profile`),
 * peak RSS +40 MB; at vocab 32000 (124M, 4096 rows of 768) the kernel
 * alone, five alternating pairs, 256 rows median 3943 ms, 512 rows 3559
 * (1.11x), 1024 no better; in the 124M step head + loss went from
 * 21.0-22.8% of it to 19.7-20.2%, peak RSS 4987 -> 5111 MB. On a Zen 5
 * (AVX-512, 2 threads) the small model's whole batch (2048 rows, 64 MB of
 * logits) instead of 1024: fp32 head + loss 167.9, 169.7, 164.6 -> 163.9,
 * 151.7, 159.7 ms per step, bf16 89.5, 90.5, 100.6 -> 88.4, 89.4, 93.7
 * (three alternating pairs each), peak RSS +48 MB: the three products of
 * 2048 rows ran faster than those of 1024 (oneDNN's and `dnnl_sgemm`'s
 * choice among them too). 64 MB gives 2048 rows up to vocab 8192, 1024 up
 * to 16384, 512 at 32000, 256 from 65536 on. */
#define LCE_TARGET_BYTES (64u << 20)
#define LCE_MAX_ROWS 2048

static int64_t choose_chunk(int64_t V) {
    int64_t c = (int64_t)LCE_TARGET_BYTES / ((int64_t)sizeof(float) * (V > 0 ? V : 1));
    c = c < 256 ? 256 : c > LCE_MAX_ROWS ? LCE_MAX_ROWS : c;
    return c & ~(int64_t)15;
}

/* Loss of one row of logits x (length V) with target t; when grad, x is
 * overwritten with seed·(softmax(x) − onehot(t)), in the very operations
 * kiln_k_cross_entropy_backward uses (e·(seed/s), then −seed at t), so a
 * bf16 head rounds the same dlogits eager rounds. */
static double lce_row(float *x, int64_t V, int32_t t, bool grad, float seed, float cap, float *th) {
    if (cap > 0) { /* soft-capped logits, as kiln_softcap computes them; th keeps tanh for the gradient */
        const float inv = (float)(1.0 / (double)cap);
        for (int64_t j = 0; j < V; j++) {
            float u = tanhf(x[j] * inv);
            if (th) th[j] = u;
            x[j] = u * cap;
        }
    }
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
        const float inv = seed / s;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) x[j] *= inv;
        x[t] -= seed;
        if (cap > 0) /* through the cap: d(c tanh(z/c))/dz = 1 - tanh^2(z/c) */
#pragma omp simd
            for (int64_t j = 0; j < V; j++) x[j] *= 1.0f - th[j] * th[j];
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; j++) s += kiln_expf_fast(x[j] - m);
    }
    return (double)m + log((double)s) - xt;
}

double kiln_k_linear_cross_entropy(const float *h, const float *W, const int32_t *targets, int64_t N,
                                   int64_t C, int64_t V, int32_t ignore_index, int64_t chunk,
                                   int64_t *count, float *dh, float *dW) {
    kiln_lce_opts o = {.seed = 1.0f};
    return kiln_k_linear_cross_entropy_ex(h, W, targets, N, C, V, ignore_index, chunk, count, dh, dW, &o);
}

/* The layout of the scratch block (bytes from its start). In bf16 the
 * operands are held in the GEMM's form: uint16 natively, bf16-rounded
 * fp32 when emulated (esz 2 or 4); the fp32 logits are rounded in place
 * when emulated and converted into d16 natively. */
typedef struct {
    size_t idx, rloss, logits, hbuf, dhbuf, w16, d16, total;
} lce_layout;

static size_t up64(size_t b) { return (b + 63) & ~(size_t)63; }

static lce_layout layout(int64_t N, int64_t C, int64_t V, int64_t chunk, bool bf16, bool native) {
    lce_layout l;
    size_t hes = bf16 && native ? 2 : 4; /* gathered h: rounded in bf16 */
    l.idx = 0;
    l.rloss = up64((size_t)N * sizeof(int64_t));
    l.logits = l.rloss + up64((size_t)chunk * sizeof(double));
    l.hbuf = l.logits + up64((size_t)(chunk * V) * sizeof(float));
    l.dhbuf = l.hbuf + up64((size_t)(chunk * C) * hes);
    l.w16 = l.dhbuf + up64((size_t)(chunk * C) * sizeof(float));
    l.d16 = l.w16 + (bf16 ? up64((size_t)(V * C) * hes) : 0);
    l.total = l.d16 + (bf16 && native ? up64((size_t)(chunk * V) * 2) : 0);
    return l;
}

static int64_t pick_chunk(int64_t N, int64_t V, int64_t chunk) {
    if (chunk <= 0) chunk = choose_chunk(V);
    return chunk > N ? N : chunk;
}

size_t kiln_k_linear_cross_entropy_scratch(int64_t N, int64_t C, int64_t V, int64_t chunk, bool bf16) {
    if (N <= 0 || V <= 0) return 0;
    return layout(N, C, V, pick_chunk(N, V, chunk), bf16, kiln_bf16_native()).total;
}

/* C = A·B with fp32 operands or bf16 ones in the GEMM's form */
static kiln_status gemm(const kiln_gemm_desc *d, const void *A, const void *B, float *C, bool native16) {
    return native16 ? kiln_gemm_bf16(d, A, B, C) : kiln_gemm_f32(d, A, B, C);
}

/* x (n fp32) into the GEMM's bf16 form at dst (see layout) */
static void to_bf16_form(const float *x, void *dst, int64_t n, bool native) {
    if (native) kiln_k_f32_to_bf16(x, dst, n);
    else kiln_k_round_bf16(x, dst, n);
}

double kiln_k_linear_cross_entropy_ex(const float *h, const float *W, const int32_t *targets, int64_t N,
                                      int64_t C, int64_t V, int32_t ignore_index, int64_t chunk,
                                      int64_t *count, float *dh, float *dW, const kiln_lce_opts *o) {
    const bool bf16 = o && o->bf16, native = bf16 && kiln_bf16_native();
    const float seed = o ? o->seed : 1.0f, cap = o ? o->softcap : 0.0f;
    if (count) *count = 0;
    if (N <= 0 || V <= 0) {
        if (dW && V > 0) memset(dW, 0, (size_t)(V * C) * sizeof(float));
        return 0.0;
    }
    chunk = pick_chunk(N, V, chunk);
    const bool grad = dh || dW;
    /* scratch: counted-row indices, per-row losses, logits, gathered h and
     * dh; in bf16 the rounded W and (native) the bf16 dlogits */
    lce_layout L = layout(N, C, V, chunk, bf16, native);
    char *scratch = kiln_alloc(L.total);
    if (!scratch) return NAN;
    int64_t *idx = (int64_t *)(scratch + L.idx);
    double *rloss = (double *)(scratch + L.rloss);
    float *logits = (float *)(scratch + L.logits);
    void *hbuf = scratch + L.hbuf;
    float *dhbuf = (float *)(scratch + L.dhbuf);
    const void *Wg = W; /* W in the GEMM's form */
    if (bf16) {
        to_bf16_form(W, scratch + L.w16, V * C, native);
        Wg = scratch + L.w16;
    }
    void *d16 = scratch + L.d16;
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
        const void *hc = h + ri[0] * C; /* the chunk's h rows in the GEMM's form */
        if (bf16) { /* rounded as the bf16 matmul rounds its operands */
            for (int64_t r = 0, run; r < cn; r += run) {
                for (run = 1; r + run < cn && ri[r + run] == ri[r] + run;) run++;
                if (native) kiln_k_f32_to_bf16(h + ri[r] * C, (uint16_t *)hbuf + r * C, run * C);
                else kiln_k_round_bf16(h + ri[r] * C, (float *)hbuf + r * C, run * C);
            }
            hc = hbuf;
        } else if (!contiguous) {
            for (int64_t r = 0; r < cn; r++) memcpy((float *)hbuf + r * C, h + ri[r] * C, (size_t)C * sizeof(float));
            hc = hbuf;
        }
        kiln_gemm_desc d = {.transA = false, .transB = true, .M = cn, .N = V, .K = C, .lda = C,
                            .ldb = C, .ldc = V, .batch = 1, .alpha = 1.0f, .beta = 0.0f};
        st = gemm(&d, hc, Wg, logits, native);
        if (st) break;
#pragma omp parallel if (cn * V > (1 << 15) && cn > 1)
        {
            float *th = cap > 0 && grad ? kiln_alloc((size_t)V * sizeof(float)) : NULL; /* a row of tanh per thread */
            if (cap > 0 && grad && !th) st = KILN_ERR_OOM;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < cn; r++)
                rloss[r] = th || !(cap > 0 && grad) ? lce_row(logits + r * V, V, targets[ri[r]], grad, seed, cap, th) : NAN;
            kiln_dealloc(th);
        }
        if (st) break;
        for (int64_t r = 0; r < cn; r++) total += rloss[r];
        if (!grad) continue;
        /* the output gradient, already scaled by the seed, in the
         * products' form: rounded to bf16 exactly where eager rounds it */
        const void *dl = logits;
        if (bf16) {
            to_bf16_form(logits, native ? d16 : (void *)logits, cn * V, native);
            if (native) dl = d16;
        }
        if (dh) {
            float *dhc = contiguous ? dh + ri[0] * C : dhbuf;
            kiln_gemm_desc e = {.transA = false, .transB = false, .M = cn, .N = C, .K = V,
                                .lda = V, .ldb = C, .ldc = C, .batch = 1, .alpha = 1.0f,
                                .beta = 0.0f};
            st = gemm(&e, dl, Wg, dhc, native);
            if (st) break;
            if (!contiguous)
                for (int64_t r = 0; r < cn; r++)
                    memcpy(dh + ri[r] * C, dhbuf + r * C, (size_t)C * sizeof(float));
        }
        if (dW) {
            kiln_gemm_desc e = {.transA = true, .transB = false, .M = V, .N = C, .K = cn,
                                .lda = V, .ldb = C, .ldc = C, .batch = 1, .alpha = 1.0f,
                                .beta = s0 ? 1.0f : 0.0f};
            st = gemm(&e, dl, hc, dW, native);
        }
    }
    kiln_dealloc(scratch);
    return st == KILN_OK ? total : NAN;
}
