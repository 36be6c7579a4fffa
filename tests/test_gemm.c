/* kiln_gemm_f32 / kiln_gemm_bf16 against a naive double-precision product:
 * all transpose combinations, odd sizes, padded leading dimensions, batches
 * with strides and broadcasts, alpha, beta=1, the primitive cache, errors.
 * kiln's own kernel (kiln_k_gemm_f32) in every form this CPU runs: edge
 * tiles, block boundaries, strides, alpha, beta 0 over NaN, beta 1, NaN and
 * Inf reaching exactly their rows and columns, the thread count. kiln's bf16
 * kernel (kiln_k_gemm_bf16) in every form, and the avx512 form both through
 * VDPBF16PS and emulated, bit for bit against a scalar reference of the
 * instruction's sums: the same edges, odd K, denormals, underflow, overflow,
 * NaN/Inf, the thread count. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"
#include "test.h"

size_t kiln_gemm_cache_entries(void); /* defined in src/kernels/gemm.c for tests */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

typedef struct {
    bool tA, tB;
    int64_t M, N, K, padA, padB, padC, batch;
    int sA, sB; /* 1: own matrix per batch element, 0: broadcast */
    float alpha, beta;
    bool bf16;
    const char *impl; /* fp32 through this implementation (kiln_gemm_f32_impl), NULL: the choice */
} gcase;

/* Rows and columns of an operand as stored. */
static void stored(bool t, int64_t r, int64_t c, int64_t *sr, int64_t *sc) {
    *sr = t ? c : r;
    *sc = t ? r : c;
}

static double at(const float *X, bool t, int64_t ld, int64_t i, int64_t j) {
    return t ? X[j * ld + i] : X[i * ld + j];
}

/* Returns max |C - ref| / max |ref|, and checks padding of C is untouched. */
static double run_case(const gcase *g, bool *pad_ok) {
    int64_t ar, ac, br, bc;
    stored(g->tA, g->M, g->K, &ar, &ac);
    stored(g->tB, g->K, g->N, &br, &bc);
    kiln_gemm_desc d = {
        .transA = g->tA, .transB = g->tB, .M = g->M, .N = g->N, .K = g->K,
        .lda = ac + g->padA, .ldb = bc + g->padB, .ldc = g->N + g->padC,
        .batch = g->batch, .alpha = g->alpha, .beta = g->beta,
    };
    d.strideA = g->sA ? ar * d.lda + 3 : 0; /* +3: batch strides need not be packed */
    d.strideB = g->sB ? br * d.ldb + 5 : 0;
    d.strideC = g->M * d.ldc + 1;
    int64_t nA = (g->sA ? g->batch : 1) * (ar * d.lda + 3);
    int64_t nB = (g->sB ? g->batch : 1) * (br * d.ldb + 5);
    int64_t nC = g->batch * d.strideC;
    float *A = malloc((size_t)nA * 4), *B = malloc((size_t)nB * 4), *C = malloc((size_t)nC * 4),
          *C0 = malloc((size_t)nC * 4);
    uint16_t *Ah = malloc((size_t)nA * 2), *Bh = malloc((size_t)nB * 2);
    for (int64_t i = 0; i < nA; i++) {
        A[i] = frand();
        if (g->bf16) A[i] = kiln_bf16_to_f32(Ah[i] = kiln_f32_to_bf16(A[i]));
    }
    for (int64_t i = 0; i < nB; i++) {
        B[i] = frand();
        if (g->bf16) B[i] = kiln_bf16_to_f32(Bh[i] = kiln_f32_to_bf16(B[i]));
    }
    for (int64_t i = 0; i < nC; i++) C0[i] = C[i] = frand();
    kiln_status st = g->bf16 ? kiln_gemm_bf16(&d, Ah, Bh, C)
                     : g->impl ? kiln_gemm_f32_impl(g->impl, &d, A, B, C)
                               : kiln_gemm_f32(&d, A, B, C);
    CHECK(st == KILN_OK, "status %d: %s", (int)st, kiln_last_error());
    double maxerr = 0, maxref = 0;
    *pad_ok = true;
    for (int64_t b = 0; b < g->batch; b++) {
        const float *Ab = A + b * d.strideA, *Bb = B + b * d.strideB;
        for (int64_t i = 0; i < g->M; i++) {
            for (int64_t j = 0; j < g->N; j++) {
                double s = 0;
                for (int64_t k = 0; k < g->K; k++)
                    s += at(Ab, g->tA, d.lda, i, k) * at(Bb, g->tB, d.ldb, k, j);
                int64_t ci = b * d.strideC + i * d.ldc + j;
                double ref = g->alpha * s + (g->beta != 0 ? g->beta * (double)C0[ci] : 0.0);
                maxerr = fmax(maxerr, fabs(C[ci] - ref));
                maxref = fmax(maxref, fabs(ref));
            }
            for (int64_t j = g->N; j < d.ldc; j++)
                if (C[b * d.strideC + i * d.ldc + j] != C0[b * d.strideC + i * d.ldc + j]) *pad_ok = false;
        }
    }
    free(A), free(B), free(C), free(C0), free(Ah), free(Bh);
    return maxerr / (maxref > 0 ? maxref : 1.0);
}

#define RUN(tol, ...)                                                                   \
    do {                                                                                \
        gcase g_ = {__VA_ARGS__};                                                       \
        bool pad_ok_;                                                                   \
        double e_ = run_case(&g_, &pad_ok_);                                            \
        CHECK(e_ < (tol) && pad_ok_,                                                    \
              "%s tA=%d tB=%d M=%lld N=%lld K=%lld batch=%lld bf16=%d: rel err %.3g, pad %s", \
              g_.impl ? g_.impl : "chosen", g_.tA, g_.tB, (long long)g_.M, (long long)g_.N,     \
              (long long)g_.K, (long long)g_.batch, g_.bf16, e_, pad_ok_ ? "ok" : "CLOBBERED"); \
    } while (0)

static void test_shapes(void) {
    static const int64_t sizes[][3] = {{37, 24, 13}, {1, 1, 1}, {2048, 8, 3}, {5, 67, 130}, {64, 48, 32}};
    for (int t = 0; t < 4; t++) {
        bool tA = t & 1, tB = t & 2;
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            int64_t M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
            RUN(1e-5, .tA = tA, .tB = tB, .M = M, .N = N, .K = K, .batch = 1, .alpha = 1);
            /* padded rows, alpha, accumulate */
            RUN(1e-5, .tA = tA, .tB = tB, .M = M, .N = N, .K = K, .padA = 3, .padB = 7, .padC = 2,
                .batch = 1, .alpha = -0.5f, .beta = 1);
        }
        /* batches: own matrices, broadcast A, broadcast B */
        RUN(1e-5, .tA = tA, .tB = tB, .M = 9, .N = 11, .K = 7, .padA = 1, .padC = 4, .batch = 3,
            .sA = 1, .sB = 1, .alpha = 1);
        RUN(1e-5, .tA = tA, .tB = tB, .M = 9, .N = 11, .K = 7, .padB = 2, .batch = 4, .sA = 0,
            .sB = 1, .alpha = 2, .beta = 1);
        RUN(1e-5, .tA = tA, .tB = tB, .M = 16, .N = 5, .K = 33, .batch = 2, .sA = 1, .sB = 0,
            .alpha = 1, .beta = 1);
        /* bf16 operands, fp32 accumulation */
        RUN(1e-3, .tA = tA, .tB = tB, .M = 37, .N = 24, .K = 13, .batch = 1, .alpha = 1, .bf16 = true);
        RUN(1e-3, .tA = tA, .tB = tB, .M = 64, .N = 80, .K = 96, .padA = 2, .padC = 1, .batch = 3,
            .sA = 1, .sB = 1, .alpha = 0.25f, .beta = 1, .bf16 = true);
    }
}

/* Every implementation the choice may pick, each forced: the four
 * transposes with padded rows, alpha and accumulation, and batches with
 * their own, broadcast A and broadcast B operands at unpacked strides.
 * OpenBLAS and BLIS where this build opens them (test_gemm_choice checks
 * which builds do). */
static void test_every_impl(void) {
    static const char *const impl[] = {"onednn", "sgemm", "kiln", "openblas", "blis"};
    for (size_t i = 0; i < sizeof impl / sizeof *impl; i++) {
        if (!kiln_gemm_f32_impl_available(impl[i])) {
            CHECK(i >= 3, "%s is not available", impl[i]);
            printf("test_gemm: %s is not a candidate in this build\n", impl[i]);
            continue;
        }
        for (int t = 0; t < 4; t++) {
            bool tA = t & 1, tB = t & 2;
            RUN(1e-5, .tA = tA, .tB = tB, .M = 37, .N = 24, .K = 130, .padA = 3, .padB = 7, .padC = 2, .batch = 1,
                .alpha = -0.5f, .beta = 1, .impl = impl[i]);
            RUN(1e-5, .tA = tA, .tB = tB, .M = 9, .N = 11, .K = 7, .padA = 1, .padC = 4, .batch = 3, .sA = 1, .sB = 1,
                .alpha = 1, .impl = impl[i]);
            RUN(1e-5, .tA = tA, .tB = tB, .M = 9, .N = 11, .K = 7, .padB = 2, .batch = 4, .sA = 0, .sB = 1, .alpha = 2,
                .beta = 1, .impl = impl[i]);
            RUN(1e-5, .tA = tA, .tB = tB, .M = 16, .N = 5, .K = 33, .batch = 2, .sA = 1, .sB = 0, .alpha = 1, .beta = 1,
                .impl = impl[i]);
        }
    }
}

/* Attention-style views: per-head matrices interleaved in a B×T×H×D
 * buffer (batch stride D, row stride H·D): Q·Kᵀ and P·V per head. */
static void test_interleaved_heads(void) {
    enum { T = 12, H = 3, D = 8 };
    float q[T * H * D], k[T * H * D], s[H * T * T];
    for (int i = 0; i < T * H * D; i++) q[i] = frand(), k[i] = frand();
    kiln_gemm_desc d = {.transB = true, .M = T, .N = T, .K = D, .lda = H * D, .ldb = H * D,
                        .ldc = T, .batch = H, .strideA = D, .strideB = D, .strideC = T * T,
                        .alpha = 0.5f};
    CHECK_OK(kiln_gemm_f32(&d, q, k, s));
    double err = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                double r = 0;
                for (int c = 0; c < D; c++) r += (double)q[i * H * D + h * D + c] * k[j * H * D + h * D + c];
                err = fmax(err, fabs(s[h * T * T + i * T + j] - 0.5 * r));
            }
    CHECK(err < 1e-5, "interleaved Q.K^T err %g", err);
    float o[T * H * D];
    kiln_gemm_desc d2 = {.M = T, .N = D, .K = T, .lda = T, .ldb = H * D, .ldc = H * D, .batch = H,
                         .strideA = T * T, .strideB = D, .strideC = D, .alpha = 1};
    CHECK_OK(kiln_gemm_f32(&d2, s, k, o));
    err = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < T; i++)
            for (int c = 0; c < D; c++) {
                double r = 0;
                for (int j = 0; j < T; j++) r += (double)s[h * T * T + i * T + j] * k[j * H * D + h * D + c];
                err = fmax(err, fabs(o[i * H * D + h * D + c] - r));
            }
    CHECK(err < 1e-5, "interleaved P.V err %g", err);
}

static void test_sgemm_and_edges(void) {
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, C[4] = {9, 9, 9, 9};
    /* A 2×3, B 3×2: [[4,5],[10,11]] */
    CHECK_OK(kiln_sgemm(false, false, 2, 2, 3, 1.0f, A, B, 0.0f, C));
    CHECK(C[0] == 4 && C[1] == 5 && C[2] == 10 && C[3] == 11, "sgemm %g %g %g %g", C[0], C[1], C[2], C[3]);
    /* Aᵀ·A with A stored 2×3 → 3×3 */
    float G[9];
    CHECK_OK(kiln_sgemm(true, false, 3, 3, 2, 1.0f, A, A, 0.0f, G));
    CHECK(G[0] == 17 && G[4] == 29 && G[8] == 45 && G[1] == 22, "AtA %g %g %g", G[0], G[4], G[8]);
    /* K = 0: beta 0 clears, beta 1 keeps */
    float Z[4] = {1, 2, 3, 4};
    CHECK_OK(kiln_sgemm(false, false, 2, 2, 0, 1.0f, A, B, 1.0f, Z));
    CHECK(Z[0] == 1 && Z[3] == 4, "K=0 beta=1 changed C");
    CHECK_OK(kiln_sgemm(false, false, 2, 2, 0, 1.0f, A, B, 0.0f, Z));
    CHECK(Z[0] == 0 && Z[3] == 0, "K=0 beta=0 did not clear C");
    /* M = 0: nothing to do, not an error */
    CHECK_OK(kiln_sgemm(false, false, 0, 2, 3, 1.0f, A, B, 0.0f, Z));
}

static void test_errors(void) {
    float A[4] = {0}, B[4] = {0}, C[4] = {0};
    kiln_status st = kiln_sgemm(false, false, 2, 2, 2, 1.0f, A, B, 0.5f, C);
    CHECK(st == KILN_ERR_INVALID, "beta=0.5 -> %d", (int)st);
    CHECK(strstr(kiln_last_error(), "gemm M=2 N=2 K=2") != NULL, "message: %s", kiln_last_error());
    kiln_gemm_desc d = {.M = 2, .N = 2, .K = 2, .lda = 1, .ldb = 2, .ldc = 2, .batch = 1, .alpha = 1};
    st = kiln_gemm_f32(&d, A, B, C);
    CHECK(st == KILN_ERR_INVALID, "lda too small -> %d", (int)st);
    st = kiln_gemm_f32(NULL, A, B, C);
    CHECK(st == KILN_ERR_INVALID, "NULL desc -> %d", (int)st);
}

static void test_cache(void) {
    kiln_gemm_cache_clear();
    CHECK(kiln_gemm_cache_entries() == 0, "entries after clear %zu", kiln_gemm_cache_entries());
    float A[64], B[64], C[64];
    for (int i = 0; i < 64; i++) A[i] = frand(), B[i] = frand();
    CHECK_OK(kiln_sgemm(false, true, 8, 8, 8, 1.0f, A, B, 0.0f, C));
    CHECK_OK(kiln_sgemm(false, true, 8, 8, 8, 1.0f, B, A, 0.0f, C)); /* other pointers, same shape */
    CHECK(kiln_gemm_cache_entries() == 1, "same shape twice: %zu entries", kiln_gemm_cache_entries());
    CHECK_OK(kiln_sgemm(false, true, 8, 8, 8, 1.0f, A, B, 1.0f, C));
    CHECK_OK(kiln_sgemm(false, false, 8, 8, 8, 1.0f, A, B, 0.0f, C));
    CHECK(kiln_gemm_cache_entries() == 3, "beta and transB are keys: %zu entries", kiln_gemm_cache_entries());
    /* the thread count is part of the key: a primitive made for more threads
     * must not run with fewer (results stay correct either way) */
    int nthr = omp_get_max_threads();
    omp_set_num_threads(1);
    float C1[64];
    CHECK_OK(kiln_sgemm(false, true, 8, 8, 8, 1.0f, A, B, 0.0f, C1));
    omp_set_num_threads(nthr);
    CHECK(kiln_gemm_cache_entries() == (nthr > 1 ? 4u : 3u), "thread count key: %zu entries",
          kiln_gemm_cache_entries());
    CHECK_OK(kiln_sgemm(false, true, 8, 8, 8, 1.0f, A, B, 0.0f, C));
    double dmax = 0;
    for (int i = 0; i < 64; i++) dmax = fmax(dmax, fabs(C[i] - C1[i]));
    CHECK(dmax < 1e-5, "1-thread result differs by %g", dmax);
    const char *be = kiln_gemm_backend();
    CHECK(be && strstr(be, "oneDNN"), "backend %s", be ? be : "(null)");
    kiln_gemm_cache_clear();
    CHECK(kiln_gemm_cache_entries() == 0, "entries after clear %zu", kiln_gemm_cache_entries());
}

/* Cached primitives run from several threads at once (each thread has its
 * own scratchpad), sharing shapes and primitives. */
typedef struct {
    const float *A, *B;
    float C[96 * 80];
    int bad;
} thread_arg;

static void *thread_body(void *p) {
    thread_arg *t = p;
    for (int it = 0; it < 20; it++) {
        int64_t M = it % 2 ? 96 : 80; /* two shapes, both shared between the threads */
        if (kiln_sgemm(false, true, M, 80, 200, 1.0f, t->A, t->B, 0.0f, t->C) != KILN_OK) t->bad++;
        for (int64_t i = 0; i < M; i += 17)
            for (int64_t j = 0; j < 80; j += 13) {
                double r = 0;
                for (int k = 0; k < 200; k++) r += (double)t->A[i * 200 + k] * t->B[j * 200 + k];
                if (fabs(t->C[i * 80 + j] - r) > 1e-3) t->bad++;
            }
    }
    return NULL;
}

static void test_threads(void) {
    float *A = malloc(96 * 200 * 4), *B = malloc(80 * 200 * 4);
    for (int i = 0; i < 96 * 200; i++) A[i] = frand();
    for (int i = 0; i < 80 * 200; i++) B[i] = frand();
    enum { NT = 3 };
    thread_arg *args = calloc(NT, sizeof *args);
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        args[i].A = A, args[i].B = B;
        pthread_create(&th[i], NULL, thread_body, &args[i]);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].bad == 0, "thread %d: %d bad results", i, args[i].bad);
    }
    free(args), free(A), free(B);
}


/* ---- kiln_k_gemm_f32, every form ---------------------------------------- */
typedef struct {
    bool tA, tB;
    int64_t M, N, K, padA, padB, padC;
    float alpha, beta;
} kcase;

typedef struct {
    int64_t lda, ldb, ldc, nA, nB, nC;
    float *A, *B, *C0;
    double *ref, *mag; /* alpha op(A) op(B) + beta C0 in double; |alpha| sum |a||b| + |beta C0| */
} kdata;

static void kdata_make(const kcase *c, kdata *d) {
    int64_t ar, ac, br, bc;
    stored(c->tA, c->M, c->K, &ar, &ac);
    stored(c->tB, c->K, c->N, &br, &bc);
    d->lda = ac + c->padA, d->ldb = bc + c->padB, d->ldc = c->N + c->padC;
    d->nA = ar * d->lda, d->nB = br * d->ldb, d->nC = c->M * d->ldc;
    d->A = malloc((size_t)d->nA * 4), d->B = malloc((size_t)d->nB * 4), d->C0 = malloc((size_t)d->nC * 4);
    for (int64_t i = 0; i < d->nA; i++) d->A[i] = frand();
    for (int64_t i = 0; i < d->nB; i++) d->B[i] = frand();
    for (int64_t i = 0; i < d->nC; i++) d->C0[i] = c->beta != 0 ? frand() : NAN; /* beta 0: C is not read */
    for (int64_t i = 0; i < c->M; i++) /* the padding of C: must stay as it is */
        for (int64_t j = c->N; j < d->ldc; j++) d->C0[i * d->ldc + j] = 1234.5f;
    d->ref = malloc((size_t)(c->M * c->N) * sizeof(double));
    d->mag = malloc((size_t)(c->M * c->N) * sizeof(double));
    /* op(A)'s row i and op(B)'s columns, contiguous in double */
    double *row = malloc((size_t)c->K * sizeof(double)), *cols = malloc((size_t)(c->N * c->K) * sizeof(double));
    for (int64_t j = 0; j < c->N; j++)
        for (int64_t k = 0; k < c->K; k++) cols[j * c->K + k] = at(d->B, c->tB, d->ldb, k, j);
    for (int64_t i = 0; i < c->M; i++) {
        for (int64_t k = 0; k < c->K; k++) row[k] = at(d->A, c->tA, d->lda, i, k);
        for (int64_t j = 0; j < c->N; j++) {
            const double *col = cols + j * c->K;
            double s = 0, m = 0;
            for (int64_t k = 0; k < c->K; k++) {
                double p = row[k] * col[k];
                s += p, m += fabs(p);
            }
            double c0 = c->beta != 0 ? (double)c->beta * d->C0[i * d->ldc + j] : 0.0;
            d->ref[i * c->N + j] = c->alpha * s + c0;
            d->mag[i * c->N + j] = fabs(c->alpha) * m + fabs(c0);
        }
    }
    free(row), free(cols);
}

static void kdata_free(kdata *d) { free(d->A), free(d->B), free(d->C0), free(d->ref), free(d->mag); }

/* One form on one case: within 2 (K + 2) eps (|alpha| sum |a||b| + |beta c|)
 * of the double product per element (K roundings of the sums, alpha, the
 * adds of the K blocks), NaN-free, the padding of C untouched. Returns the
 * worst error in units of that bound. */
static double kcheck(const kiln_simd_table *t, const char *form, const kcase *c, const kdata *d) {
    float *C = malloc((size_t)d->nC * 4);
    memcpy(C, d->C0, (size_t)d->nC * 4);
    bool ok = t->gemm_f32(c->tA, c->tB, c->M, c->N, c->K, c->alpha, d->A, d->lda, d->B, d->ldb, c->beta, C, d->ldc);
    CHECK(ok, "%s: kiln_k_gemm_f32 returned false", form);
    double worst = 0;
    int64_t bad = 0, pad_bad = 0, bi = 0, bj = 0;
    for (int64_t i = 0; i < c->M; i++) {
        for (int64_t j = 0; j < c->N; j++) {
            double r = d->ref[i * c->N + j], bound = 2.0 * (double)(c->K + 2) * FLT_EPSILON * d->mag[i * c->N + j];
            double e = fabs((double)C[i * d->ldc + j] - r);
            double u = bound > 0 ? e / bound : (e > 0 ? INFINITY : 0);
            if (!(u <= 1.0)) {
                if (!bad) bi = i, bj = j;
                bad++;
            }
            if (u > worst || isnan(u)) worst = isnan(u) ? INFINITY : u;
        }
        for (int64_t j = c->N; j < d->ldc; j++) pad_bad += C[i * d->ldc + j] != 1234.5f;
    }
    CHECK(bad == 0 && pad_bad == 0,
          "%s tA=%d tB=%d M=%lld N=%lld K=%lld pads %lld/%lld/%lld alpha %g beta %g: %lld elements past the "
          "bound (first [%lld,%lld]: %g vs %g), %lld padding elements written",
          form, c->tA, c->tB, (long long)c->M, (long long)c->N, (long long)c->K, (long long)c->padA,
          (long long)c->padB, (long long)c->padC, c->alpha, c->beta, (long long)bad, (long long)bi, (long long)bj,
          bad ? C[bi * d->ldc + bj] : 0.0, bad ? d->ref[bi * c->N + bj] : 0.0, (long long)pad_bad);
    free(C);
    return worst;
}

/* the forms this CPU runs (the others printed as skipped) */
static int kforms(const kiln_simd_table **tabs, const char **names) {
    int n = 0;
    for (int f = 0; f < KILN_FORM_COUNT; f++) {
        const kiln_simd_table *t = kiln_simd_table_of((kiln_form)f);
        if (!t) {
            printf("  kiln_k_gemm_f32 %-8s skipped: %s\n", kiln_form_name((kiln_form)f),
                   kiln_form_built((kiln_form)f) ? "this CPU cannot run it" : "not built here");
            continue;
        }
        tabs[n] = t, names[n] = kiln_form_name((kiln_form)f), n++;
    }
    return n;
}

static void test_kernel_shapes(void) {
    const kiln_simd_table *tabs[KILN_FORM_COUNT];
    const char *names[KILN_FORM_COUNT];
    int nf = kforms(tabs, names);
    /* edges around every form's MR (14, 6, 4) and NR (32, 16, 8); K past
     * KC (512 avx512 and avx2, 256 portable) and balanced into blocks; M past MC;
     * N past NC (4096); A stored M x K with rows 4 KB apart (lda 1024,
     * unpadded), which the avx512 form packs instead of reading in place;
     * K so long that a panel of B over all of K is narrower than N (30 x
     * 300 x 8200: the K-outer schedule in every form); op(A) = Aᵀ with A's
     * rows more than 4096 floats long (4117 x 37 x 29 transposed: packed,
     * not read in place, two slivers at a time and a last one of 1 row) */
    static const int64_t shapes[][3] = {
        {1, 1, 1},     {7, 13, 5},     {13, 31, 9},    {14, 32, 16},   {15, 33, 17},  {5, 17, 3},
        {6, 16, 7},    {7, 15, 2},     {3, 7, 4},      {4, 8, 5},      {5, 9, 6},     {29, 65, 257},
        {1, 300, 40},  {300, 1, 40},   {300, 200, 600}, {20, 4200, 24}, {257, 515, 1031}, {29, 40, 1024},
        {30, 300, 8200}, {4117, 37, 29},
    };
    double worst[KILN_FORM_COUNT] = {0};
    int runs = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++)
            for (int v = 0; v < 3; v++) {
                /* v 0: packed, alpha 1, beta 0; 1: padded strides, alpha, beta 0; 2: accumulate */
                kcase c = {.tA = tr & 1, .tB = tr & 2, .M = shapes[s][0], .N = shapes[s][1], .K = shapes[s][2],
                           .padA = v ? 3 : 0, .padB = v ? 5 : 0, .padC = v ? 7 : 0,
                           .alpha = v == 0 ? 1.0f : v == 1 ? -0.75f : 2.5f, .beta = v == 2 ? 1.0f : 0.0f};
                if (shapes[s][0] * shapes[s][1] * shapes[s][2] > 50000000 && v != 2) continue; /* big: once */
                kdata d;
                kdata_make(&c, &d);
                for (int f = 0; f < nf; f++) worst[f] = fmax(worst[f], kcheck(tabs[f], names[f], &c, &d));
                kdata_free(&d);
                runs++;
            }
    for (int f = 0; f < nf; f++)
        printf("  kiln_k_gemm_f32 %-8s %d cases: worst error %.3f of the bound 2(K+2) eps sum|a||b|\n", names[f],
               runs, worst[f]);
}

/* NaN and Inf in A and B reach exactly the rows and columns they touch */
static void test_kernel_specials(void) {
    const kiln_simd_table *tabs[KILN_FORM_COUNT];
    const char *names[KILN_FORM_COUNT];
    int nf = kforms(tabs, names);
    const int64_t M = 37, N = 45, K = 29;
    for (int tr = 0; tr < 4; tr++) {
        bool tA = tr & 1, tB = tr & 2;
        int64_t lda = (tA ? M : K) + 2, ldb = (tB ? K : N) + 1;
        float *A = malloc((size_t)((tA ? K : M) * lda) * 4), *B = malloc((size_t)((tB ? N : K) * ldb) * 4);
        float *C = malloc((size_t)(M * N) * 4);
        for (int64_t i = 0; i < (tA ? K : M) * lda; i++) A[i] = 0.25f + 0.5f * fabsf(frand()); /* positive */
        for (int64_t i = 0; i < (tB ? N : K) * ldb; i++) B[i] = 0.25f + 0.5f * fabsf(frand());
        /* op(A)[3][7] = NaN, op(A)[36][0] = +Inf, op(B)[28][44] = NaN, op(B)[5][16] = -Inf */
        A[tA ? 7 * lda + 3 : 3 * lda + 7] = NAN;
        A[tA ? 0 * lda + 36 : 36 * lda + 0] = INFINITY;
        B[tB ? 44 * ldb + 28 : 28 * ldb + 44] = NAN;
        B[tB ? 16 * ldb + 5 : 5 * ldb + 16] = -INFINITY;
        for (int f = 0; f < nf; f++) {
            for (int64_t i = 0; i < M * N; i++) C[i] = NAN; /* beta 0: never read */
            CHECK(tabs[f]->gemm_f32(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N), "%s", names[f]);
            int64_t wrong = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    float c = C[i * N + j];
                    /* row 36 x column 16: +Inf times -Inf's column, both infinite: -Inf + Inf = NaN */
                    bool want_nan = i == 3 || j == 44 || (i == 36 && j == 16);
                    bool want_pinf = !want_nan && i == 36, want_ninf = !want_nan && j == 16;
                    bool ok = want_nan ? isnan(c) : want_pinf ? c == INFINITY : want_ninf ? c == -INFINITY
                                                                                          : isfinite(c) && c > 0;
                    wrong += !ok;
                }
            CHECK(wrong == 0, "%s tA=%d tB=%d: %lld elements where NaN/Inf went wrong", names[f], tA, tB,
                  (long long)wrong);
        }
        free(A), free(B), free(C);
    }
}

/* the result's bits do not depend on the thread count, nor on the
 * schedule: 40 x 300 x 8200 runs K-outer (panels of B over one K block),
 * and its first 100 columns computed alone run all-K (one panel over every
 * K block), the other 200 K-outer again, all with the same bits */
static void test_kernel_threads(void) {
    const kiln_simd_table *tabs[KILN_FORM_COUNT];
    const char *names[KILN_FORM_COUNT];
    int nf = kforms(tabs, names);
    static const int64_t shapes[][3] = {{300, 200, 600}, {16, 700, 300}, {517, 45, 270}, {2, 5000, 64}, {40, 300, 8200}};
    int nthr = omp_get_max_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++) {
            kcase c = {.tA = tr & 1, .tB = tr & 2, .M = shapes[s][0], .N = shapes[s][1], .K = shapes[s][2],
                       .padA = 1, .padC = 2, .alpha = 0.5f, .beta = (float)(tr == 3)};
            int64_t ar, ac, br, bc;
            stored(c.tA, c.M, c.K, &ar, &ac);
            stored(c.tB, c.K, c.N, &br, &bc);
            int64_t lda = ac + 1, ldb = bc, ldc = c.N + 2;
            float *A = malloc((size_t)(ar * lda) * 4), *B = malloc((size_t)(br * ldb) * 4);
            float *C1 = malloc((size_t)(c.M * ldc) * 4), *Cn = malloc((size_t)(c.M * ldc) * 4);
            for (int64_t i = 0; i < ar * lda; i++) A[i] = frand();
            for (int64_t i = 0; i < br * ldb; i++) B[i] = frand();
            for (int f = 0; f < nf; f++) {
                for (int64_t i = 0; i < c.M * ldc; i++) C1[i] = (float)(i % 11) * 0.125f;
                omp_set_num_threads(1);
                tabs[f]->gemm_f32(c.tA, c.tB, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, C1, ldc);
                for (int th = 2; th <= 3; th++) {
                    for (int64_t i = 0; i < c.M * ldc; i++) Cn[i] = (float)(i % 11) * 0.125f;
                    omp_set_num_threads(th);
                    tabs[f]->gemm_f32(c.tA, c.tB, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, Cn, ldc);
                    CHECK(!memcmp(C1, Cn, (size_t)(c.M * ldc) * 4),
                          "%s tA=%d tB=%d %lldx%lldx%lld: %d threads differ from 1 in bits", names[f], c.tA, c.tB,
                          (long long)c.M, (long long)c.N, (long long)c.K, th);
                }
                if (c.K > 8000) { /* the columns in two products */
                    const int64_t n1 = 100;
                    for (int64_t i = 0; i < c.M * ldc; i++) Cn[i] = (float)(i % 11) * 0.125f;
                    tabs[f]->gemm_f32(c.tA, c.tB, c.M, n1, c.K, c.alpha, A, lda, B, ldb, c.beta, Cn, ldc);
                    tabs[f]->gemm_f32(c.tA, c.tB, c.M, c.N - n1, c.K, c.alpha, A, lda, B + (c.tB ? n1 * ldb : n1), ldb,
                                      c.beta, Cn + n1, ldc);
                    CHECK(!memcmp(C1, Cn, (size_t)(c.M * ldc) * 4),
                          "%s tA=%d tB=%d %lldx%lldx%lld: columns 0-%lld and the rest computed apart differ in bits",
                          names[f], c.tA, c.tB, (long long)c.M, (long long)c.N, (long long)c.K, (long long)n1 - 1);
                }
            }
            omp_set_num_threads(nthr);
            free(A), free(B), free(C1), free(Cn);
        }
}


/* ---- kiln_k_gemm_bf16, every form, bit for bit ----------------------------
 * The reference: VDPBF16PS's sums in scalar C. Per element and K block (K
 * in blocks of at most 1024, balanced, each an even count: the kernel's rule,
 * fixed by K alone), acc = +0, then per pair of k (an odd block's last pair
 * with a zero partner) acc = step(acc, a[2i+1], b[2i+1]), acc = step(acc,
 * a[2i], b[2i]); step is one fused multiply-add rounded to nearest even,
 * denormal inputs as zeros of their sign, a result tiny after rounding to 24
 * bits (|x| < 2^-126 - 2^-151) a zero of its sign. Here the fused operation
 * is a double sum (the product of two bf16 is exact in double, and double
 * rounding of a sum to 53 then 24 bits is the correct rounding). Then C =
 * alpha acc (first block, beta 0) or C + alpha acc. */
static float bf_in(uint16_t h) {
    if (!(h & 0x7f80)) h &= 0x8000; /* DAZ */
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static float bf_step(float acc, float a, float b) {
    double d = (double)acc + (double)a * (double)b;
    if (fabs(d) < 0x1p-126 - 0x1p-151) return signbit(d) ? -0.0f : 0.0f; /* FTZ */
    return (float)d;
}
static int64_t bf_kblock(int64_t K) {
    int64_t nkb = (K + 1023) / 1024, kcb = (K + nkb - 1) / nkb;
    return (kcb + 1) / 2 * 2;
}
/* C (ldc) = alpha op(A) op(B) + beta C as VDPBF16PS sums it */
static void bf_ref(bool tA, bool tB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int64_t kcb = bf_kblock(K);
    /* op(A)'s rows and op(B)'s columns as floats, each converted once */
    float *av = malloc((size_t)(M * K + 1) * sizeof(float)), *bv = malloc((size_t)(N * K + 1) * sizeof(float));
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) av[i * K + k] = bf_in(tA ? A[k * lda + i] : A[i * lda + k]);
    for (int64_t j = 0; j < N; j++)
        for (int64_t k = 0; k < K; k++) bv[j * K + k] = bf_in(tB ? B[j * ldb + k] : B[k * ldb + j]);
    for (int64_t i = 0; i < M; i++) {
        const float *a = av + i * K;
        for (int64_t j = 0; j < N; j++) {
            const float *b = bv + j * K;
            float c = C[i * ldc + j];
            for (int64_t pc = 0; pc < K; pc += kcb) {
                const int64_t kc = K - pc < kcb ? K - pc : kcb;
                float acc = 0.0f;
                for (int64_t k = 0; k < kc; k += 2) {
                    float a1 = k + 1 < kc ? a[pc + k + 1] : 0.0f, b1 = k + 1 < kc ? b[pc + k + 1] : 0.0f;
                    acc = bf_step(acc, a1, b1);
                    acc = bf_step(acc, a[pc + k], b[pc + k]);
                }
                c = pc == 0 && beta == 0.0f ? alpha * acc : c + alpha * acc;
            }
            C[i * ldc + j] = c;
        }
    }
    free(av), free(bv);
}

/* the bf16 runs: each form this CPU runs, and the avx512 form's emulation
 * (kiln_bf16_force_emulation) where the CPU has AVX512-BF16 */
typedef struct {
    const kiln_simd_table *t;
    const char *name;
    bool emulate, amx;
} bfrun;
static int bf_runs(bfrun *r) {
    int n = 0;
    for (int f = 0; f < KILN_FORM_COUNT; f++) {
        const kiln_simd_table *t = kiln_simd_table_of((kiln_form)f);
        if (!t) continue;
        bool native = f == KILN_FORM_AVX512 && kiln_cpu_has_avx512bf16();
        r[n++] = (bfrun){t, native ? "avx512 (VDPBF16PS)" : kiln_form_name((kiln_form)f), false, false};
        if (native) r[n++] = (bfrun){t, "avx512 (emulated)", true, false};

    }
    return n;
}
static bool bf_call(const bfrun *r, bool tA, bool tB, int64_t M, int64_t N, int64_t K, float alpha,
                    const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C,
                    int64_t ldc) {
    kiln_bf16_force_emulation(r->emulate);
    kiln_bf16_amx_off(!r->amx);
    bool ok = r->t->gemm_bf16(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    kiln_bf16_force_emulation(false);
    kiln_bf16_amx_off(false);
    return ok;
}
static bool bf_same(float x, float y) { return (isnan(x) && isnan(y)) || !memcmp(&x, &y, sizeof x); }

/* bf16 values: 0 ordinary (frand), 1 near the underflow (products about
 * 2^-126: the sums flush), 2 extremes (denormals, tiny, huge, NaN, Inf) */
static uint16_t bf_val(int kind) {
    if (kind == 0) return kiln_f32_to_bf16(frand());
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(g_rng >> 32), e;
    if (kind == 1) {
        e = 61 + r % 7; /* 2^-66 .. 2^-60 */
        if (r % 23 == 0) e = 0; /* a denormal */
    } else {
        uint32_t c = r % 16;
        e = c < 6 ? 127 - 3 + (r >> 4) % 7 : c < 9 ? 1 + (r >> 4) % 20 : c < 12 ? 254 - (r >> 4) % 20 : c < 14 ? 0
                                                                                                         : (r >> 4) % 255;
        if (r % 997 == 0) e = 255; /* Inf or NaN */
    }
    return (uint16_t)(((r >> 12) & 1) << 15 | e << 7 | ((r >> 20) & 0x7f));
}

typedef struct {
    bool tA, tB;
    int64_t M, N, K, padA, padB, padC;
    float alpha, beta;
    int kind;
} bfcase;

/* every run against the reference, bit for bit (NaN as NaN), C's padding
 * untouched; returns the elements checked */
static int64_t bf_check(const bfrun *runs, int nr, const bfcase *c) {
    int64_t ar, ac, br, bc;
    stored(c->tA, c->M, c->K, &ar, &ac);
    stored(c->tB, c->K, c->N, &br, &bc);
    const int64_t lda = ac + c->padA, ldb = bc + c->padB, ldc = c->N + c->padC;
    uint16_t *A = malloc((size_t)(ar * lda) * 2), *B = malloc((size_t)(br * ldb) * 2);
    float *C0 = malloc((size_t)(c->M * ldc) * 4), *R = malloc((size_t)(c->M * ldc) * 4),
          *C = malloc((size_t)(c->M * ldc) * 4);
    for (int64_t i = 0; i < ar * lda; i++) A[i] = bf_val(c->kind);
    for (int64_t i = 0; i < br * ldb; i++) B[i] = bf_val(c->kind);
    for (int64_t i = 0; i < c->M * ldc; i++)
        C0[i] = c->beta != 0 ? (c->kind == 1 ? 0x1p-120f : 1.0f) * frand() : NAN; /* beta 0: never read */
    for (int64_t i = 0; i < c->M; i++)
        for (int64_t j = c->N; j < ldc; j++) C0[i * ldc + j] = 1234.5f;
    memcpy(R, C0, (size_t)(c->M * ldc) * 4);
    bf_ref(c->tA, c->tB, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, R, ldc);
    for (int f = 0; f < nr; f++) {
        memcpy(C, C0, (size_t)(c->M * ldc) * 4);
        bool ok = bf_call(&runs[f], c->tA, c->tB, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, C, ldc);
        CHECK(ok, "%s: kiln_k_gemm_bf16 returned false", runs[f].name);
        int64_t bad = 0, pad_bad = 0, bi = -1, bj = -1;
        for (int64_t i = 0; i < c->M; i++) {
            for (int64_t j = 0; j < c->N; j++)
                if (!bf_same(C[i * ldc + j], R[i * ldc + j]) && !bad++) bi = i, bj = j;
            for (int64_t j = c->N; j < ldc; j++) pad_bad += C[i * ldc + j] != 1234.5f;
        }
        CHECK(bad == 0 && pad_bad == 0,
              "bf16 %s tA=%d tB=%d M=%lld N=%lld K=%lld pads %lld/%lld/%lld alpha %g beta %g kind %d: %lld elements "
              "differ from the reference's bits (first [%lld,%lld]: %a vs %a), %lld padding elements written",
              runs[f].name, c->tA, c->tB, (long long)c->M, (long long)c->N, (long long)c->K, (long long)c->padA,
              (long long)c->padB, (long long)c->padC, c->alpha, c->beta, c->kind, (long long)bad, (long long)bi,
              (long long)bj, bad ? C[bi * ldc + bj] : 0.0, bad ? R[bi * ldc + bj] : 0.0, (long long)pad_bad);
    }
    free(A), free(B), free(C0), free(R), free(C);
    return c->M * c->N;
}

static void test_bf16_shapes(void) {
    bfrun runs[KILN_FORM_COUNT + 1];
    int nr = bf_runs(runs);
    /* odd K; MR (14, 6, 4) and NR (32, 16, 8) +- 1; K at and past the block
     * (1024) and balanced into even blocks (1025: 2 x 514, 2049: 3 x 684); a
     * long K whose packed B over all of K is more than one panel (50001:
     * the K-outer schedule); A stored M x K
     * with rows 4 KB apart (lda 2048, unpadded: packed, not read in place) */
    static const int64_t shapes[][3] = {
        {1, 1, 1},     {1, 1, 2},     {2, 3, 3},      {7, 13, 5},     {13, 31, 9},    {14, 32, 16},
        {15, 33, 17},  {5, 17, 3},    {6, 16, 7},     {7, 15, 2},     {3, 7, 4},      {4, 8, 5},
        {5, 9, 6},     {29, 65, 255}, {17, 40, 256},  {16, 33, 257},  {9, 70, 511},   {30, 20, 513},
        {1, 300, 40},  {300, 1, 41},  {100, 90, 600}, {20, 4200, 24}, {257, 515, 1031}, {3, 300, 50001},
        {17, 40, 1024}, {16, 33, 1025}, {9, 21, 2049}, {29, 40, 2048},
    };
    int64_t cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++)
            for (int v = 0; v < 3; v++) {
                /* v 0: packed, alpha 1, beta 0 over NaN; 1: padded strides, alpha, beta 0; 2: accumulate */
                bfcase c = {.tA = tr & 1, .tB = tr & 2, .M = shapes[s][0], .N = shapes[s][1], .K = shapes[s][2],
                            .padA = v ? 3 : 0, .padB = v ? 5 : 0, .padC = v ? 7 : 0,
                            .alpha = v == 0 ? 1.0f : v == 1 ? -0.75f : 2.5f, .beta = v == 2 ? 1.0f : 0.0f};
                if (shapes[s][0] * shapes[s][1] * shapes[s][2] > 40000000 && v != 2) continue; /* big: once */
                bf_check(runs, nr, &c);
                cases++;
            }
    printf("  kiln_k_gemm_bf16: %lld cases x %d runs (", (long long)cases, nr);
    for (int f = 0; f < nr; f++) printf("%s%s", f ? ", " : "", runs[f].name);
    printf(") equal to the VDPBF16PS reference bit for bit\n");
}

/* denormal inputs, products that underflow (sums flushed), huge products,
 * NaN/Inf, against the reference; and a few sums whose bits are known from
 * the instruction (the rounding and flushing rules) */
static void test_bf16_specials(void) {
    bfrun runs[KILN_FORM_COUNT + 1];
    int nr = bf_runs(runs);
    for (int kind = 1; kind <= 2; kind++)
        for (int tr = 0; tr < 4; tr++) {
            bfcase c = {.tA = tr & 1, .tB = tr & 2, .M = 37, .N = 45, .K = 299, .padA = 1, .padB = 2,
                        .alpha = 1.0f, .beta = (float)(tr == 1), .kind = kind};
            bf_check(runs, nr, &c);
            c.M = 15, c.N = 33, c.K = 7, c.alpha = 0.5f;
            bf_check(runs, nr, &c);
        }
    /* 1 x 1 x 4: acc = +0, then fma(a1, b1), fma(a0, b0), fma(a3, b3), fma(a2, b2) */
    static const struct {
        float a[4], b[4], want;
        const char *what;
    } dir[] = {
        {{0, 0, 0, 0x1p-63f}, {0, 0, 0, 0x1p-63f}, 0x1p-126f, "2^-126: not flushed"},
        {{0x1p-126f, 0x1p-63f, 0, 0}, {-0x1p-24f, 0x1p-63f, 0, 0}, 0.0f,
         "2^-126 - 2^-150 exactly: tiny after rounding, flushed"},
        {{0x1p-126f, 0x1p-63f, 0, 0}, {-0x1p-26f, 0x1p-63f, 0, 0}, 0x1p-126f,
         "2^-126 - 2^-152: rounds up to 2^-126, kept"},
        {{0x1p-126f, 0x1p-63f, 0, 0}, {-0x1p-25f, 0x1p-63f, 0, 0}, 0x1p-126f,
         "2^-126 - 2^-151: the tie rounds to even, 2^-126"},
        {{0x1p-126f, 0x1p-63f, 0, 0}, {0x1p-25f, -0x1p-63f, 0, 0}, -0x1p-126f, "the same, negative"},
        {{0x1p64f, -0x1.fep127f, 0, 0}, {0x1p64f, 1.0f, 0, 0}, 0x1p120f,
         "-0x1.fep127 + 2^128: fused, the product does not overflow"},
        {{0x1p-70f, 1.0f, 0, 0}, {0x1p-70f, 1.0f, 0, 0}, 1.0f, "1 + 2^-140"},
        {{0x1p-70f, 0, 0, 0}, {0x1p-70f, 0, 0, 0}, 0.0f, "0 + 2^-140: the sum is flushed"},
        {{0x1p-75f, 0x1.02p-63f, 0, 0x1p-126f}, {0x1p-74f, 0x1p-63f, 0, -0x1p-24f}, 0x1.02p-126f,
         "(2^-126 + 2^-133 + 2^-149) - 2^-150: fused, the tie to even (separate: the product rounds to 0)"},
        {{0x1p-130f, 0, 0, 0}, {0x1p100f, 0, 0, 0}, 0.0f, "a denormal input is zero"},
        {{-0x1p-130f, -0x1p-63f, -1.0f, -1.0f}, {1.0f, 0x1p-70f, 0, 0}, -0.0f,
         "-2^-133 flushed to -0, then -0 products (a denormal input: a zero of its sign)"},
        {{-2.0f, -0x1p-63f, 1.0f, -1.0f}, {0.0f, 0x1p-70f, 0, 0}, 0.0f, "-0 + +0 = +0"},
        {{INFINITY, 1.0f, 0, 0}, {0.0f, 1.0f, 0, 0}, NAN, "Inf x 0 = NaN"},
    };
    int bad = 0;
    for (size_t d = 0; d < sizeof dir / sizeof *dir; d++) {
        uint16_t a[4], b[4];
        bool exact = true;
        for (int k = 0; k < 4; k++) {
            a[k] = kiln_f32_to_bf16(dir[d].a[k]), b[k] = kiln_f32_to_bf16(dir[d].b[k]);
            exact = exact && bf_same(kiln_bf16_to_f32(a[k]), dir[d].a[k]) && bf_same(kiln_bf16_to_f32(b[k]), dir[d].b[k]);
        }
        CHECK(exact, "directed case %zu: inputs are bf16", d);
        float r = NAN;
        bf_ref(false, false, 1, 1, 4, 1.0f, a, 4, b, 1, 0.0f, &r, 1);
        CHECK(bf_same(r, dir[d].want), "reference: %s: %a, want %a", dir[d].what, r, dir[d].want);
        for (int f = 0; f < nr; f++) {
            float c = NAN;
            bf_call(&runs[f], false, false, 1, 1, 4, 1.0f, a, 4, b, 1, 0.0f, &c, 1);
            if (!bf_same(c, dir[d].want)) bad++;
            CHECK(bf_same(c, dir[d].want), "%s: %s: %a, want %a", runs[f].name, dir[d].what, c, dir[d].want);
        }
    }
    printf("  kiln_k_gemm_bf16: denormals, underflowing and overflowing products, NaN/Inf, %zu directed sums: "
           "%s\n", sizeof dir / sizeof *dir, bad ? "FAILED" : "bit for bit");
}

/* the bits do not depend on the thread count nor on the schedule (40 x 300
 * x 8200 K-outer, its columns apart all-K and K-outer, as for fp32); the
 * avx512 form's VDPBF16PS path equals the portable form's emulation bit
 * for bit */
static void test_bf16_threads(void) {
    bfrun runs[KILN_FORM_COUNT + 1];
    int nr = bf_runs(runs);
    static const int64_t shapes[][3] = {{300, 200, 600}, {16, 700, 301}, {517, 45, 270}, {2, 5000, 64}, {40, 300, 8200}};
    int nthr = omp_get_max_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++) {
            bool tA = tr & 1, tB = tr & 2, acc = tr == 3;
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ar, ac, br, bc;
            stored(tA, M, K, &ar, &ac);
            stored(tB, K, N, &br, &bc);
            int64_t lda = ac + 1, ldb = bc, ldc = N + 2;
            uint16_t *A = malloc((size_t)(ar * lda) * 2), *B = malloc((size_t)(br * ldb) * 2);
            float *C1 = malloc((size_t)(M * ldc) * 4), *Cn = malloc((size_t)(M * ldc) * 4),
                  *P = malloc((size_t)(M * ldc) * 4);
            for (int64_t i = 0; i < ar * lda; i++) A[i] = bf_val(s == 1 ? 1 : 0);
            for (int64_t i = 0; i < br * ldb; i++) B[i] = bf_val(s == 1 ? 1 : 0);
            for (int f = 0; f < nr; f++) {
                for (int64_t i = 0; i < M * ldc; i++) C1[i] = (float)(i % 11) * 0.125f;
                omp_set_num_threads(1);
                bf_call(&runs[f], tA, tB, M, N, K, 0.5f, A, lda, B, ldb, (float)acc, C1, ldc);
                for (int th = 2; th <= 3; th++) {
                    for (int64_t i = 0; i < M * ldc; i++) Cn[i] = (float)(i % 11) * 0.125f;
                    omp_set_num_threads(th);
                    bf_call(&runs[f], tA, tB, M, N, K, 0.5f, A, lda, B, ldb, (float)acc, Cn, ldc);
                    CHECK(!memcmp(C1, Cn, (size_t)(M * ldc) * 4),
                          "bf16 %s tA=%d tB=%d %lldx%lldx%lld: %d threads differ from 1 in bits", runs[f].name, tA,
                          tB, (long long)M, (long long)N, (long long)K, th);
                }
                omp_set_num_threads(nthr);
                if (K > 8000) { /* K-outer; its first 100 columns alone all-K, the rest K-outer: the same bits */
                    const int64_t n1 = 100;
                    for (int64_t i = 0; i < M * ldc; i++) Cn[i] = (float)(i % 11) * 0.125f;
                    bf_call(&runs[f], tA, tB, M, n1, K, 0.5f, A, lda, B, ldb, (float)acc, Cn, ldc);
                    bf_call(&runs[f], tA, tB, M, N - n1, K, 0.5f, A, lda, B + (tB ? n1 * ldb : n1), ldb, (float)acc,
                            Cn + n1, ldc);
                    CHECK(!memcmp(C1, Cn, (size_t)(M * ldc) * 4),
                          "bf16 %s tA=%d tB=%d %lldx%lldx%lld: columns 0-%lld and the rest computed apart differ in "
                          "bits", runs[f].name, tA, tB, (long long)M, (long long)N, (long long)K, (long long)n1 - 1);
                }
                if (f == 0)
                    memcpy(P, C1, (size_t)(M * ldc) * 4);
                else
                    CHECK(!memcmp(C1, P, (size_t)(M * ldc) * 4), "bf16 %s tA=%d tB=%d %lldx%lldx%lld: differs from %s",
                          runs[f].name, tA, tB, (long long)M, (long long)N, (long long)K, runs[0].name);
            }
            free(A), free(B), free(C1), free(Cn), free(P);
        }
}


/* The AMX path (kiln_bf16_amx: TDPBF16PS tiles, all of K in the tiles):
 * its sums are the instruction's own, not VDPBF16PS's (they part in the
 * last bits), so it is held to an error bound against the exact sums of
 * the bf16 products (in double): |C - exact| <= (K + 2) 2^-24 sum|a b| + |C|
 * 2^-24 for the alpha/beta step; its bits do not depend on the thread
 * count; and it runs only where the CPU has AMX (reported otherwise). */
static void test_bf16_amx(void) {
    const kiln_simd_table *t = kiln_simd_table_of(KILN_FORM_AVX512);
    kiln_bf16_amx_off(false);
    if (!t || !kiln_bf16_amx()) {
        printf("  kiln_k_gemm_bf16 on AMX: not run (kiln_bf16_amx() is false: CPU features %s, active form %s)\n",
               kiln_cpu_features_text(), kiln_form_name(kiln_form_active()));
        return;
    }
    static const int64_t shapes[][3] = {
        {1, 1, 1},    {1, 1, 2},     {2, 3, 3},     {7, 13, 5},    {16, 16, 32},  {31, 33, 31},  {32, 32, 32},
        {33, 31, 33}, {15, 17, 65},  {64, 64, 64},  {29, 65, 255}, {16, 33, 257}, {100, 90, 600}, {20, 4200, 24},
        {257, 515, 1031}, {3, 300, 5001}, {300, 200, 600}, {517, 45, 270},
    };
    int nthr = omp_get_max_threads();
    double worst = 0;
    int64_t cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++) {
            /* tr 2: beta 1 with alpha 1 (whole blocks accumulate in the tiles
             * from C), tr 3: beta 1, alpha -0.75 */
            bool tA = tr & 1, tB = tr & 2, acc = tr >= 2;
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ar, ac, br, bc;
            stored(tA, M, K, &ar, &ac);
            stored(tB, K, N, &br, &bc);
            int64_t lda = ac + 3, ldb = bc + 1, ldc = N + 5;
            uint16_t *A = malloc((size_t)(ar * lda) * 2), *B = malloc((size_t)(br * ldb) * 2);
            float *C1 = malloc((size_t)(M * ldc) * 4), *Cn = malloc((size_t)(M * ldc) * 4), *C0 = malloc((size_t)(M * ldc) * 4);
            for (int64_t i = 0; i < ar * lda; i++) A[i] = bf_val(0);
            for (int64_t i = 0; i < br * ldb; i++) B[i] = bf_val(0);
            for (int64_t i = 0; i < M * ldc; i++) C0[i] = acc ? frand() : NAN;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = N; j < ldc; j++) C0[i * ldc + j] = 1234.5f;
            const float alpha = tr == 3 ? -0.75f : 1.0f;
            memcpy(C1, C0, (size_t)(M * ldc) * 4);
            omp_set_num_threads(1);
            CHECK(t->gemm_bf16(tA, tB, M, N, K, alpha, A, lda, B, ldb, (float)acc, C1, ldc), "AMX gemm returned false");
            for (int th = 2; th <= 3; th++) {
                memcpy(Cn, C0, (size_t)(M * ldc) * 4);
                omp_set_num_threads(th);
                t->gemm_bf16(tA, tB, M, N, K, alpha, A, lda, B, ldb, (float)acc, Cn, ldc);
                CHECK(!memcmp(C1, Cn, (size_t)(M * ldc) * 4), "AMX tA=%d tB=%d %lldx%lldx%lld: %d threads differ from 1 in bits",
                      tA, tB, (long long)M, (long long)N, (long long)K, th);
            }
            omp_set_num_threads(nthr);
            int64_t bad = 0, pad_bad = 0;
            for (int64_t i = 0; i < M; i++) {
                for (int64_t j = 0; j < N; j++) {
                    double ex = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double a = bf_in(tA ? A[k * lda + i] : A[i * lda + k]), b = bf_in(tB ? B[j * ldb + k] : B[k * ldb + j]);
                        ex += a * b, mag += fabs(a * b);
                    }
                    double want = (acc ? C0[i * ldc + j] : 0.0) + alpha * ex, got = C1[i * ldc + j];
                    double bound = (double)(K + 2) * 0x1p-24 * fabs(alpha) * mag + 0x1p-23 * fabs(want) + 1e-30;
                    double e = fabs(got - want) / bound;
                    if (!(e <= 1.0)) bad++;
                    if (e > worst) worst = e;
                }
                for (int64_t j = N; j < ldc; j++) pad_bad += C1[i * ldc + j] != 1234.5f;
            }
            CHECK(bad == 0 && pad_bad == 0, "AMX tA=%d tB=%d %lldx%lldx%lld: %lld elements past the error bound, %lld padding elements written",
                  tA, tB, (long long)M, (long long)N, (long long)K, (long long)bad, (long long)pad_bad);
            cases++;
            free(A), free(B), free(C1), free(Cn), free(C0);
        }
    /* NaN and Inf in, NaN and Inf out */
    uint16_t a[64], b[64];
    float c[4];
    for (int k = 0; k < 64; k++) a[k] = kiln_f32_to_bf16(0.5f), b[k] = kiln_f32_to_bf16(0.25f);
    a[5] = kiln_f32_to_bf16(NAN);
    b[32 + 7] = kiln_f32_to_bf16(INFINITY);
    t->gemm_bf16(false, false, 2, 2, 32, 1.0f, a, 32, b, 2, 0.0f, c, 2);
    CHECK(isnan(c[0]) && isnan(c[1]) && isinf(c[3]) && c[3] > 0 && c[2] == 32 * 0.125f,
          "AMX NaN/Inf: %g %g %g %g (want nan nan 4 inf)", c[0], c[1], c[2], c[3]);
    printf("  kiln_k_gemm_bf16 on AMX: %lld cases, worst error %.3f of the bound (K+2) 2^-24 sum|ab|; bits the same on 1, 2 "
           "and 3 threads; NaN/Inf carried\n", (long long)cases, worst);
}

int main(void) {
    test_bf16_amx();
    test_bf16_specials();
    test_bf16_shapes();
    test_bf16_threads();
    test_kernel_shapes();
    test_kernel_specials();
    test_kernel_threads();
    test_shapes();
    test_every_impl();
    test_interleaved_heads();
    test_sgemm_and_edges();
    test_errors();
    test_cache();
    test_threads();
    kiln_gemm_cache_clear();
    TEST_END();
}
