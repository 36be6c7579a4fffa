/* bench/gemm: which GEMM should kiln use? Times every candidate on the
 * products of one training step of three model classes, each linear's
 *   forward  y  = x·Wᵀ   (NT: M=n,   N=out, K=in)
 *   backward dx = dy·W   (NN: M=n,   N=in,  K=out)
 *            dW = dyᵀ·x  (TN: M=out, N=in,  K=n)
 * for the attention-sized, MLP up, MLP down and head linears of
 *   small  hidden 512, intermediate 1376, vocab 8192, n = 8·256 tokens
 *   124m   hidden 768, intermediate 3072, vocab 50257, n = 1024
 *   1b     hidden 2048, intermediate 8192, vocab 32000, n = 1024
 * and the 1b MLP-up forward for M (tokens) from 1 to 8192.
 * Columns: kiln-chosen (kiln_gemm_f32 as kiln calls it: the implementation
 * its measurement chose for the shape, shown beside the others, not ranked),
 * then the candidates: oneDNN's matmul primitive (cached, as
 * kiln_gemm_f32 runs it), dnnl_sgemm,
 * OpenBLAS's and BLIS's cblas_sgemm (their OpenMP builds, Debian's
 * libopenblas0-openmp and libblis4-openmp, as kiln opens them at run time;
 * left out when not installed), a plain C blocked kernel (below), and
 * kiln's own kernel (kiln_k_gemm_f32: the active form's, "kiln", and the
 * AVX2 form's, "kiln-avx2", when that is not the active one) and
 * kiln_gemm_bf16 (oneDNN's bf16 matmul, "bf16-matmul") and kiln's own bf16
 * kernel (kiln_k_gemm_bf16 of the active form, "kiln-bf16": AMX tiles where
 * the CPU has AMX-BF16, else VDPBF16PS where it has AVX512-BF16; with AMX
 * also "kiln-vdpbf16", the VDPBF16PS path). Each shape's row gives every candidate's GFLOP/s
 * and the best fp32 one as a share of the fp32 FMA peak measured in the same
 * run; the summary gives the bf16 candidates as shares of the bf16 peak.
 *
 * Usage: bench/gemm [rounds] [reps] [classes], classes a comma list of
 * small, 124m, 1b, sweep (default all). Each round runs every candidate on
 * every shape `reps` times; the median over all rounds is reported, so a
 * transient load on the (shared) machine does not decide the table.
 */
#include <dnnl.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- shapes ------------------------------------------------------------ */
typedef struct {
    char name[48];
    bool tA, tB;
    int64_t M, N, K;
    float *A, *B, *C, *ref;
    uint16_t *Ah, *Bh;
} shape;

enum { MAX_SHAPES = 64 };
static shape g_shapes[MAX_SHAPES];
static int g_nshapes;

static void add_shape(const char *cls, const char *what, int64_t out, int64_t in, bool tA, bool tB, int64_t M,
                      int64_t N, int64_t K) {
    if (g_nshapes == MAX_SHAPES) return;
    shape *s = &g_shapes[g_nshapes++];
    snprintf(s->name, sizeof s->name, "%s %s %lldx%lld %s%s", cls, what, (long long)out, (long long)in,
             tA ? "T" : "N", tB ? "T" : "N");
    s->tA = tA, s->tB = tB, s->M = M, s->N = N, s->K = K;
}

static float *rand_buf(int64_t n, uint64_t seed) {
    float *p = aligned_alloc(64, (size_t)(n * 4 + 63) / 64 * 64);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
    return p;
}

static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *p = aligned_alloc(64, (size_t)(n * 2 + 63) / 64 * 64);
    for (int64_t i = 0; i < n; i++) p[i] = kiln_f32_to_bf16(x[i]);
    return p;
}

static bool wanted(const char *list, const char *name) {
    char buf[128];
    snprintf(buf, sizeof buf, ",%s,", list);
    char key[32];
    snprintf(key, sizeof key, ",%s,", name);
    return !strcmp(list, "all") || strstr(buf, key);
}

static void make_shapes(const char *classes) {
    static const struct { const char *name; int64_t hid, inter, vocab, n; } cls[] = { /* (I is complex.h's) */
        {"small", 512, 1376, 8192, 8 * 256}, {"124m", 768, 3072, 50257, 1024}, {"1b", 2048, 8192, 32000, 1024}};
    for (int c = 0; c < 3; c++) {
        if (!wanted(classes, cls[c].name)) continue;
        int64_t h = cls[c].hid, f = cls[c].inter, lin[][2] = {{h, h}, {f, h}, {h, f}, {cls[c].vocab, h}}, n = cls[c].n;
        for (int i = 0; i < 4; i++) {
            int64_t out = lin[i][0], in = lin[i][1];
            add_shape(cls[c].name, "fwd", out, in, false, true, n, out, in);
            add_shape(cls[c].name, "dx ", out, in, false, false, n, in, out);
            add_shape(cls[c].name, "dW ", out, in, true, false, out, in, n);
        }
    }
    static const int64_t ms[] = {1, 16, 128, 1024, 8192};
    for (int i = 0; wanted(classes, "sweep") && i < 5; i++) {
        char what[16];
        snprintf(what, sizeof what, "M=%lld", (long long)ms[i]);
        add_shape("1b", what, 8192, 2048, false, true, ms[i], 8192, 2048);
    }
    for (int i = 0; i < g_nshapes; i++) {
        shape *s = &g_shapes[i];
        s->A = rand_buf(s->M * s->K, 1 + 2 * (uint64_t)i);
        s->B = rand_buf(s->K * s->N, 2 + 2 * (uint64_t)i);
        s->C = aligned_alloc(64, (size_t)(s->M * s->N * 4 + 63) / 64 * 64);
        s->ref = aligned_alloc(64, (size_t)(s->M * s->N * 4 + 63) / 64 * 64);
        s->Ah = to_bf16(s->A, s->M * s->K);
        s->Bh = to_bf16(s->B, s->K * s->N);
    }
}

/* Row strides of the operands as stored, packed. */
static int64_t lda_of(const shape *s) { return s->tA ? s->M : s->K; }
static int64_t ldb_of(const shape *s) { return s->tB ? s->K : s->N; }

/* ---- a plain C blocked kernel ------------------------------------------ */
/* Goto-style: B is packed into KC×NR panels, A into KC×MR panels, and an
 * MR×NR register tile (8 rows × 2 AVX-512 vectors = 16 accumulators) is
 * updated by broadcast-FMA. Threads split the M blocks of each B panel. */
enum { MR = 8, NR = 32, KC = 256, MC = 128, NC = 2048 };

static inline float elem(const float *X, bool t, int64_t ld, int64_t r, int64_t c) {
    return t ? X[c * ld + r] : X[r * ld + c];
}

static void pack_b(const shape *s, int64_t pc, int64_t kc, int64_t jc, int64_t nc, float *Bp) {
    int64_t np = (nc + NR - 1) / NR, ldb = ldb_of(s);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        float *dst = Bp + p * kc * NR;
        int64_t j0 = jc + p * NR, nj = nc - p * NR < NR ? nc - p * NR : NR;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < NR; j++)
                dst[k * NR + j] = j < nj ? elem(s->B, s->tB, ldb, pc + k, j0 + j) : 0.0f;
    }
}

static void pack_a(const shape *s, int64_t ic, int64_t mc, int64_t pc, int64_t kc, float *Ap) {
    int64_t lda = lda_of(s);
    for (int64_t p = 0; p < (mc + MR - 1) / MR; p++) {
        float *dst = Ap + p * kc * MR;
        int64_t i0 = ic + p * MR, ni = mc - p * MR < MR ? mc - p * MR : MR;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t i = 0; i < MR; i++)
                dst[k * MR + i] = i < ni ? elem(s->A, s->tA, lda, i0 + i, pc + k) : 0.0f;
    }
}

/* c (MR×NR, row stride ldc) = or += a-panel · b-panel */
#if defined(__AVX512F__)
static void ukernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, bool acc) {
    __m512 r[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        r[i][0] = acc ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
        r[i][1] = acc ? _mm512_loadu_ps(c + i * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(b + k * NR), b1 = _mm512_load_ps(b + k * NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 ai = _mm512_set1_ps(a[k * MR + i]);
            r[i][0] = _mm512_fmadd_ps(ai, b0, r[i][0]);
            r[i][1] = _mm512_fmadd_ps(ai, b1, r[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(c + i * ldc, r[i][0]);
        _mm512_storeu_ps(c + i * ldc + 16, r[i][1]);
    }
}
#else
/* Without AVX-512: the same blocking, the compiler vectorises the rows. */
static void ukernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, bool acc) {
    float r[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) r[i][j] = acc ? c[i * ldc + j] : 0.0f;
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++) {
            float ai = a[k * MR + i];
#pragma omp simd
            for (int j = 0; j < NR; j++) r[i][j] += ai * b[k * NR + j];
        }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) c[i * ldc + j] = r[i][j];
}
#endif

static float *g_bpack;
static void plain_gemm(const shape *s) {
    int64_t M = s->M, N = s->N, K = s->K;
    if (!g_bpack) g_bpack = aligned_alloc(64, (size_t)KC * NC * 4);
#pragma omp parallel
    {
        float *Ap = aligned_alloc(64, (size_t)MC * KC * 4);
        float edge[MR * NR] __attribute__((aligned(64))) = {0};
        for (int64_t jc = 0; jc < N; jc += NC) {
            int64_t nc = N - jc < NC ? N - jc : NC;
            for (int64_t pc = 0; pc < K; pc += KC) {
                int64_t kc = K - pc < KC ? K - pc : KC;
                pack_b(s, pc, kc, jc, nc, g_bpack); /* ends with a barrier */
#pragma omp for schedule(dynamic, 1)
                for (int64_t ic = 0; ic < M; ic += MC) {
                    int64_t mc = M - ic < MC ? M - ic : MC;
                    pack_a(s, ic, mc, pc, kc, Ap);
                    for (int64_t jr = 0; jr < nc; jr += NR)
                        for (int64_t ir = 0; ir < mc; ir += MR) {
                            const float *a = Ap + ir * kc, *b = g_bpack + jr * kc;
                            float *c = s->C + (ic + ir) * N + jc + jr;
                            int64_t mi = mc - ir < MR ? mc - ir : MR, nj = nc - jr < NR ? nc - jr : NR;
                            if (mi == MR && nj == NR) {
                                ukernel(kc, a, b, c, N, pc > 0);
                                continue;
                            }
                            for (int64_t i = 0; i < mi; i++)
                                for (int64_t j = 0; j < nj; j++)
                                    edge[i * NR + j] = pc > 0 ? c[i * N + j] : 0.0f;
                            ukernel(kc, a, b, edge, NR, true);
                            for (int64_t i = 0; i < mi; i++)
                                for (int64_t j = 0; j < nj; j++) c[i * N + j] = edge[i * NR + j];
                        }
                } /* implicit barrier: g_bpack is reused next */
            }
        }
        free(Ap);
    }
}

/* ---- candidates --------------------------------------------------------- */
/* kiln_gemm_f32 as kiln calls it: the implementation its measurement
 * chose for the shape (the first call measures, or reads the choice from
 * kiln's cache) */
static int run_chosen(const shape *s) {
    return kiln_sgemm(s->tA, s->tB, s->M, s->N, s->K, 1.0f, s->A, s->B, 0.0f, s->C) != KILN_OK;
}
static int run_dnnl_sgemm(const shape *s) {
    return dnnl_sgemm(s->tA ? 'T' : 'N', s->tB ? 'T' : 'N', s->M, s->N, s->K, 1.0f, s->A,
                      lda_of(s), s->B, ldb_of(s), 0.0f, s->C, s->N) != dnnl_success;
}
/* one of kiln_gemm_f32's implementations, forced, as it runs them when it
 * chooses them: oneDNN's matmul primitive (cached), OpenBLAS's and BLIS's
 * OpenMP builds (src/kernels/blas_peers.c: opened at run time, on kiln's
 * OpenMP threads; left out where not installed) */
static int run_named(const shape *s, const char *impl) {
    kiln_gemm_desc d = {.transA = s->tA, .transB = s->tB, .M = s->M, .N = s->N, .K = s->K, .lda = lda_of(s),
                        .ldb = ldb_of(s), .ldc = s->N, .batch = 1, .alpha = 1.0f, .beta = 0.0f};
    return kiln_gemm_f32_impl(impl, &d, s->A, s->B, s->C) != KILN_OK;
}
static int run_kiln(const shape *s) { return run_named(s, "onednn"); }
static int run_openblas(const shape *s) { return run_named(s, "openblas"); }
static int run_blis(const shape *s) { return run_named(s, "blis"); }
/* kiln's own kernel (src/kernels/simd/gemm.c): the active form's, and the
 * AVX2 form's where that is not the active one (what an AVX2-only machine
 * runs), one call per matrix as dnnl_sgemm's candidate */
static int run_kiln_table(const shape *s, const kiln_simd_table *t) {
    if (!t) return 1;
    return !t->gemm_f32(s->tA, s->tB, s->M, s->N, s->K, 1.0f, s->A, lda_of(s), s->B, ldb_of(s), 0.0f, s->C,
                        s->N);
}
static int run_kiln_own(const shape *s) { return run_kiln_table(s, kiln_simd); }
static int run_kiln_avx2(const shape *s) { return run_kiln_table(s, kiln_simd_table_of(KILN_FORM_AVX2)); }
static int run_plain(const shape *s) {
    plain_gemm(s);
    return 0;
}
static int run_bf16(const shape *s) {
    kiln_gemm_desc d = {.transA = s->tA, .transB = s->tB, .M = s->M, .N = s->N, .K = s->K,
                        .lda = lda_of(s), .ldb = ldb_of(s), .ldc = s->N, .batch = 1,
                        .alpha = 1.0f, .beta = 0.0f};
    return kiln_gemm_bf16(&d, s->Ah, s->Bh, s->C) != KILN_OK;
}
/* kiln's own bf16 kernel (src/kernels/simd/gemm_bf16.c), the active form's:
 * on AMX tiles where the CPU has them ("kiln-bf16"), and its VDPBF16PS path
 * beside it there ("kiln-vdpbf16", AMX turned off for the call) */
static int run_kiln_bf16(const shape *s) {
    return !kiln_simd->gemm_bf16(s->tA, s->tB, s->M, s->N, s->K, 1.0f, s->Ah, lda_of(s), s->Bh, ldb_of(s), 0.0f,
                                 s->C, s->N);
}
static int run_kiln_vdp(const shape *s) {
    kiln_bf16_amx_off(true);
    int r = run_kiln_bf16(s);
    kiln_bf16_amx_off(false);
    return r;
}

typedef struct {
    const char *name;
    int (*run)(const shape *);
    double tol;  /* max |C - ref| / max |ref| */
    bool bf16;   /* bf16 operands: not in the fp32 ranking, measured against the bf16 peak */
    bool chosen; /* kiln's choice among the others: shown, not ranked */
} candidate;

static const candidate g_cands[] = {
    {"kiln-chosen", run_chosen, 1e-4, false, true},
    {"onednn-matmul", run_kiln, 1e-4, false, false},  {"dnnl_sgemm", run_dnnl_sgemm, 1e-4, false, false},
    {"openblas", run_openblas, 1e-4, false, false},    {"blis", run_blis, 1e-4, false, false},
    {"kiln", run_kiln_own, 1e-4, false, false},        {"kiln-avx2", run_kiln_avx2, 1e-4, false, false},
    {"plain-c", run_plain, 1e-4, false, false},        {"bf16-matmul", run_bf16, 2e-2, true, false},
    {"kiln-bf16", run_kiln_bf16, 2e-2, true, false},   {"kiln-vdpbf16", run_kiln_vdp, 2e-2, true, false},
};
enum { CHOSEN = 0, OPENBLAS = 3, BLIS = 4, KILN_AVX2 = 6, CAND_BF16_MATMUL = 8, CAND_KILN_BF16 = 9, CAND_KILN_VDP = 10 };
static bool g_skip[16]; /* candidates not available here */
enum { N_CANDS = sizeof g_cands / sizeof *g_cands, MAX_SAMPLES = 64 };

static double g_samples[N_CANDS][MAX_SHAPES][MAX_SAMPLES];
static int g_nsamples[N_CANDS][MAX_SHAPES];
static double g_err[N_CANDS][MAX_SHAPES];

static void set_threads(int n) {
    omp_set_num_threads(n);
    kiln_gemm_cache_clear(); /* not needed (the thread count is in the key); frees memory */
}

static double rel_err(const shape *s) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < s->M * s->N; i++) {
        e = fmax(e, fabs((double)s->C[i] - s->ref[i]));
        m = fmax(m, fabs((double)s->ref[i]));
    }
    return e / (m > 0 ? m : 1);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static double gflops(const shape *s, double sec) { return 2.0 * s->M * s->N * s->K / sec * 1e-9; }

/* Times candidate c on every shape: one warm-up call, then reps samples. */
static int time_candidate(int c, int reps) {
    if (g_skip[c]) return 0;
    for (int i = 0; i < g_nshapes; i++) {
        const shape *s = &g_shapes[i];
        if (g_cands[c].run(s)) {
            fprintf(stderr, "%s failed on %s: %s\n", g_cands[c].name, s->name, kiln_last_error());
            return 1;
        }
        g_err[c][i] = fmax(g_err[c][i], rel_err(s));
        for (int r = 0; r < reps && g_nsamples[c][i] < MAX_SAMPLES; r++) {
            double t0 = now();
            g_cands[c].run(s);
            g_samples[c][i][g_nsamples[c][i]++] = now() - t0;
        }
    }
    usleep(200000); /* let spinning worker threads (OpenBLAS, OpenMP) go idle */
    return 0;
}

static double report_one_thread(int c, int reps) {
    memset(g_nsamples[c], 0, sizeof g_nsamples[c]);
    set_threads(1);
    if (time_candidate(c, reps)) return 0;
    double lg = 0;
    for (int i = 0; i < g_nshapes; i++) {
        double t = median(g_samples[c][i], g_nsamples[c][i]);
        printf("| %-22s | %-14s | %9.2f | %8.1f |\n", g_shapes[i].name, g_cands[c].name, t * 1e3,
               gflops(&g_shapes[i], t));
        lg += log(gflops(&g_shapes[i], t));
    }
    set_threads(2);
    return exp(lg / g_nshapes);
}

/* Measured peaks, to read the table against: independent FMA (fp32) and
 * vdpbf16ps (bf16 pairs, fp32 accumulate) chains on every thread. */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
static double peak_gflops(bool bf16) {
    enum { CH = 12 };
    const long iters = 4000000;
    double best = 0;
    for (int trial = 0; trial < 7; trial++) {
        float sink = 0;
        double t0 = now();
#pragma omp parallel reduction(+ : sink)
        {
            __m512 acc[CH];
            __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(1e-7f);
            __m512bh xb = _mm512_cvtne2ps_pbh(x, x), yb = _mm512_cvtne2ps_pbh(y, y);
            for (int i = 0; i < CH; i++) acc[i] = _mm512_set1_ps((float)i);
            for (long k = 0; k < iters; k++) {
#pragma GCC unroll 12
                for (int i = 0; i < CH; i++)
                    acc[i] = bf16 ? _mm512_dpbf16_ps(acc[i], xb, yb) : _mm512_fmadd_ps(acc[i], x, y);
            }
            for (int i = 1; i < CH; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
            sink += _mm512_reduce_add_ps(acc[0]);
        }
        double t = now() - t0;
        double flop = (double)iters * CH * (bf16 ? 64 : 32) * omp_get_max_threads();
        if (sink != 0.0f && flop / t * 1e-9 > best) best = flop / t * 1e-9;
    }
    return best;
}
#else
/* No AVX512-BF16 here: the fp32 peak from kiln's own probe; bf16 has no
 * native peak to report (0 = not available on this CPU). */
static double peak_gflops(bool bf16) { return bf16 ? 0.0 : kiln_fma_peak_gflops(0.5); }
#endif

/* Per-call cost of binding pointers: 3 memory objects created and destroyed
 * (what kiln_gemm does) against 3 set_data_handle calls on kept objects. */
static void binding_cost(void) {
    dnnl_engine_t eng;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0)) return;
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {2048, 512}, strides = {512, 1};
    dnnl_memory_desc_init_by_strides(&md, 2, dims, dnnl_f32, strides);
    float *buf = g_shapes[0].A;
    enum { ITERS = 20000 };
    dnnl_memory_t m[3];
    double t0 = now();
    for (int i = 0; i < ITERS; i++) {
        for (int j = 0; j < 3; j++) dnnl_memory_create(&m[j], &md, eng, buf + j);
        for (int j = 0; j < 3; j++) dnnl_memory_destroy(m[j]);
    }
    double t_create = (now() - t0) / ITERS;
    for (int j = 0; j < 3; j++) dnnl_memory_create(&m[j], &md, eng, buf);
    t0 = now();
    for (int i = 0; i < ITERS; i++)
        for (int j = 0; j < 3; j++) dnnl_memory_set_data_handle(m[j], buf + (i + j) % 7);
    double t_set = (now() - t0) / ITERS;
    for (int j = 0; j < 3; j++) dnnl_memory_destroy(m[j]);
    dnnl_engine_destroy(eng);

    float a[64], b[64], c[64];
    for (int i = 0; i < 64; i++) a[i] = b[i] = 0.5f;
    kiln_sgemm(false, true, 8, 8, 8, 1.0f, a, b, 0.0f, c);
    t0 = now();
    for (int i = 0; i < ITERS; i++) kiln_sgemm(false, true, 8, 8, 8, 1.0f, a, b, 0.0f, c);
    double t_call = (now() - t0) / ITERS;
    t0 = now();
    for (int i = 0; i < ITERS; i++) dnnl_sgemm('N', 'T', 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8);
    double t_sg = (now() - t0) / ITERS;
    printf("\nPointer binding per call: create+destroy 3 memory objects %.2f us, "
           "set_data_handle x3 %.2f us.\n", t_create * 1e6, t_set * 1e6);
    printf("Whole call on an 8x8x8 product: kiln_sgemm (its choice) %.2f us, dnnl_sgemm %.2f us.\n",
           t_call * 1e6, t_sg * 1e6);
}

static double pct(double g, double peak) { return peak > 0 ? 100.0 * g / peak : 0; }

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3, reps = argc > 2 ? atoi(argv[2]) : 1;
    const char *classes = argc > 3 ? argv[3] : "all";
    if (argc > 4 || rounds < 1 || reps < 1 || rounds * reps > MAX_SAMPLES) {
        fprintf(stderr, "usage: %s [rounds] [reps] [small,124m,1b,sweep], rounds*reps <= %d\n", argv[0], MAX_SAMPLES);
        return 2;
    }
    for (const char *c = classes; strcmp(classes, "all") && *c;) { /* every name in the list is a class */
        size_t n = strcspn(c, ",");
        static const char *const known[] = {"small", "124m", "1b", "sweep"};
        bool ok = false;
        for (int i = 0; i < 4; i++) ok |= n == strlen(known[i]) && !strncmp(c, known[i], n);
        if (!ok) {
            fprintf(stderr, "%s: '%.*s' is not a class: small, 124m, 1b, sweep (a comma list), or all\n", argv[0], (int)n, c);
            return 2;
        }
        c += n + (c[n] == ',');
    }
    printf("kiln GEMM benchmark: the training step's products (classes: %s)\n", classes);
    printf("kiln_gemm backend: %s\n", kiln_gemm_backend());
    { /* the BLAS libraries kiln opens (their OpenMP builds); a missing one's column is left out */
        g_skip[OPENBLAS] = !kiln_gemm_f32_impl_available("openblas");
        g_skip[BLIS] = !kiln_gemm_f32_impl_available("blis");
        if (g_skip[OPENBLAS] || g_skip[BLIS])
            printf("%s%s no candidate here (why: the backend line above): left out\n", g_skip[OPENBLAS] ? "OpenBLAS" : "",
                   g_skip[OPENBLAS] && g_skip[BLIS] ? " and BLIS" : g_skip[BLIS] ? "BLIS" : "");
    }
    /* kiln-avx2 only where it is not the active form already, and runs here */
    g_skip[KILN_AVX2] = kiln_form_active() == KILN_FORM_AVX2 || !kiln_simd_table_of(KILN_FORM_AVX2);
    g_skip[CAND_KILN_VDP] = !kiln_bf16_amx(); /* without AMX kiln-bf16 is that path already */
    printf("kiln kernels: %s%s\n", kiln_form_describe(),
           g_skip[KILN_AVX2] ? "" : "; kiln-avx2 is the AVX2 form of the same kernel");
    printf("threads: %d (OpenMP default); %d rounds x %d reps, median reported\n",
           omp_get_max_threads(), rounds, reps);
    int nthr = omp_get_max_threads();
    double pk = peak_gflops(false), pkb = peak_gflops(true);
    make_shapes(classes);
    if (!g_nshapes) {
        fprintf(stderr, "no shapes: classes are small, 124m, 1b, sweep (or all)\n");
        return 2;
    }
    set_threads(nthr);
    for (int i = 0; i < g_nshapes; i++) { /* reference: oneDNN fp32 */
        shape *s = &g_shapes[i];
        if (run_kiln(s)) {
            fprintf(stderr, "kiln_gemm failed on %s: %s\n", s->name, kiln_last_error());
            return 1;
        }
        memcpy(s->ref, s->C, (size_t)(s->M * s->N) * 4);
    }
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < N_CANDS; c++)
            if (time_candidate(c, reps)) return 1;

    /* measured before and after, best kept: the machine is shared */
    pk = fmax(pk, peak_gflops(false));
    pkb = fmax(pkb, peak_gflops(true));
    if (pkb > 0)
        printf("measured peak, %d threads: fp32 FMA %.1f GFLOP/s, bf16 vdpbf16ps %.1f GFLOP/s\n\n", nthr, pk, pkb);
    else
        printf("measured peak, %d threads: fp32 FMA %.1f GFLOP/s (no AVX512-BF16: no bf16 peak)\n\n", nthr, pk);
    /* one row per shape: every candidate's median GFLOP/s, the best fp32 one as % of the fp32 peak */
    printf("| shape | M x N x K |");
    for (int c = 0; c < N_CANDS; c++)
        if (!g_skip[c]) printf(" %s |", g_cands[c].name);
    printf(" best fp32 | %% of peak |\n|---|---|");
    for (int c = 0; c < N_CANDS; c++)
        if (!g_skip[c]) printf("---:|");
    printf("---|---:|\n");
    double geo[N_CANDS] = {0}, geo_best[N_CANDS] = {0};
    int wins[N_CANDS] = {0}, big = 0, big_ok = 0, chosen_ok = 0, best_ok = 0;
    double big_worst = 1e9, chosen_worst = 1e9;
    for (int i = 0; i < g_nshapes; i++) {
        const shape *s = &g_shapes[i];
        printf("| %s | %lldx%lldx%lld |", s->name, (long long)s->M, (long long)s->N, (long long)s->K);
        int best = -1;
        double bg = 0, bb = 0; /* the best fp32 candidate's median, and the fastest fp32 call of any */
        for (int c = 0; c < N_CANDS; c++) {
            if (g_skip[c]) continue;
            double g = gflops(s, median(g_samples[c][i], g_nsamples[c][i]));
            geo[c] += log(g);
            /* median() sorted the samples: [0] is the fastest call */
            const double gb = gflops(s, g_samples[c][i][0]);
            geo_best[c] += log(gb);
            if (!g_cands[c].bf16 && !g_cands[c].chosen) bb = fmax(bb, gb);
            printf(" %.1f |", g);
            if (!g_cands[c].bf16 && !g_cands[c].chosen && g > bg) bg = g, best = c;
            if (g_err[c][i] > g_cands[c].tol)
                fprintf(stderr, "WARNING: %s on %s differs from oneDNN by %.2e\n", g_cands[c].name, s->name, g_err[c][i]);
        }
        wins[best]++;
        printf(" %s | %.0f%% |\n", g_cands[best].name, pct(bg, pk));
        if ((double)s->M * s->N * s->K >= (double)(1 << 27)) {
            big++;
            big_ok += pct(bg, pk) >= 88.0;
            best_ok += pct(bb, pk) >= 88.0;
            big_worst = fmin(big_worst, pct(bg, pk));
            double gc = gflops(s, median(g_samples[CHOSEN][i], g_nsamples[CHOSEN][i]));
            chosen_ok += pct(gc, pk) >= 88.0;
            chosen_worst = fmin(chosen_worst, pct(gc, pk));
        }
    }
    /* the fastest call beside the median: on a shared machine the gap between
     * them is the neighbours' share, not the kernel's */
    printf("\nGeometric mean over the %d shapes, %d threads (median call, and each shape's fastest call):\n\n"
           "| candidate | GFLOP/s (median) | %% of peak | GFLOP/s (fastest) | %% of peak | shapes won |\n"
           "|---|---:|---:|---:|---:|---:|\n",
           g_nshapes, nthr);
    int win = 0; /* among fp32 candidates; bf16 is a different precision */
    for (int c = 0; c < N_CANDS; c++) {
        if (g_skip[c]) continue;
        geo[c] = exp(geo[c] / g_nshapes);
        geo_best[c] = exp(geo_best[c] / g_nshapes);
        const double ref = g_cands[c].bf16 ? pkb : pk;
        char p1[32] = "-", p2[32] = "-"; /* no bf16 peak on a CPU without AVX512-BF16 */
        if (ref > 0) {
            snprintf(p1, sizeof p1, "%.0f%%%s", pct(geo[c], ref), g_cands[c].bf16 ? " (bf16 peak)" : "");
            snprintf(p2, sizeof p2, "%.0f%%", pct(geo_best[c], ref));
        }
        printf("| %s | %.1f | %s | %.1f | %s | %d |\n", g_cands[c].name, geo[c], p1, geo_best[c], p2,
               g_cands[c].bf16 ? 0 : wins[c]);
        if (!g_cands[c].bf16 && !g_cands[c].chosen && (g_cands[win].chosen || geo[c] > geo[win])) win = c;
    }
    printf("Shapes with M*N*K >= 2^27: %d; the best fp32 candidate reaches 88%% of the fp32 peak on %d (worst %.0f%%), "
           "kiln's choice (kiln-chosen) on %d (worst %.0f%%); the fastest single call on %d.\n",
           big, big_ok, big ? big_worst : 0.0, chosen_ok, big ? chosen_worst : 0.0, best_ok);
    printf("\nfp32 winner: %s (%.1f GFLOP/s); bf16 matmul is %.2fx that, kiln-bf16 %.2fx.\n", g_cands[win].name,
           geo[win], geo[CAND_BF16_MATMUL] / geo[win], geo[CAND_KILN_BF16] / geo[win]);
    /* the bf16 candidates side by side, per shape */
    if (pkb > 0)
        printf("\nbf16, %d threads (%% of the bf16 peak %.1f GFLOP/s):\n\n", nthr, pkb);
    else
        printf("\nbf16, %d threads (no bf16 peak: this CPU has no AVX512-BF16, so bf16 is emulated in fp32):\n\n", nthr);
    printf("| shape | M x N x K | bf16-matmul | kiln-bf16 | kiln / oneDNN |\n|---|---|---:|---:|---:|\n");
    for (int i = 0; i < g_nshapes; i++) {
        const shape *s = &g_shapes[i];
        double go = gflops(s, median(g_samples[CAND_BF16_MATMUL][i], g_nsamples[CAND_BF16_MATMUL][i]));
        double gk = gflops(s, median(g_samples[CAND_KILN_BF16][i], g_nsamples[CAND_KILN_BF16][i]));
        if (pkb > 0)
            printf("| %s | %lldx%lldx%lld | %.1f (%.0f%%) | %.1f (%.0f%%) | %.2f |\n", s->name, (long long)s->M,
                   (long long)s->N, (long long)s->K, go, pct(go, pkb), gk, pct(gk, pkb), gk / go);
        else
            printf("| %s | %lldx%lldx%lld | %.1f | %.1f | %.2f |\n", s->name, (long long)s->M, (long long)s->N,
                   (long long)s->K, go, gk, gk / go);
    }

    printf("\n1 thread:\n\n| shape | candidate | median ms | GFLOP/s |\n|---|---|---:|---:|\n");
    double g1 = report_one_thread(win, reps * rounds > 5 ? 5 : reps * rounds);
    double g1b = report_one_thread(CAND_BF16_MATMUL, reps * rounds > 5 ? 5 : reps * rounds);
    double g1k = report_one_thread(CAND_KILN_BF16, reps * rounds > 5 ? 5 : reps * rounds);
    printf("\n1-thread geometric mean: %s %.1f GFLOP/s (2 threads: %.2fx), bf16-matmul %.1f GFLOP/s, kiln-bf16 %.1f "
           "GFLOP/s\n", g_cands[win].name, g1, geo[win] / g1, g1b, g1k);
    binding_cost();

    kiln_gemm_cache_clear();
    free(g_bpack);
    for (int i = 0; i < g_nshapes; i++) {
        shape *s = &g_shapes[i];
        free(s->A), free(s->B), free(s->C), free(s->ref), free(s->Ah), free(s->Bh);
    }
    return 0;
}
