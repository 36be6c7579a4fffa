/* Causal attention, fused (kiln_k_flash_attn and its backward) against the
 * decomposed path eager runs (batched GEMM Q·Kᵀ, mask add, softmax, P·V, and
 * their backward), on B=8, H=8, D=64 for T = 256 and 1024.
 * Prints median and best ms of each and GFLOP/s of the median, counting
 * causal work: forward 4·B·H·T·T·D/2, backward 2.5× that (whatever either path
 * actually computes). Also the max difference between the two outputs.
 * Where the CPU has a native bf16 product (AMX-BF16 tiles, else AVX512-BF16's
 * VDPBF16PS) the fused kernels also run with bf16 products
 * (kiln_k_flash_attn_ex), timed and compared against the fp32 ones.
 * Usage: attention [threads] [repeats] [BxHxT ...]
 * Shapes given on the command line replace the two defaults; above T = 2048
 * only the fused kernels run (the decomposed path would hold B·H·T² scores
 * twice). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"

typedef struct {
    int64_t B, H, T, D;
    float scale;
    float *q, *k, *v, *dout, *mask;
    float *out, *lse, *dq, *dk, *dv; /* fused */
    float *S, *dP, *o2, *dq2, *dk2, *dv2; /* decomposed */
} bench_ctx;

static float *rnd(int64_t n, uint64_t seed) {
    float *p = kiln_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return p;
}

static void bgemm(const bench_ctx *c, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb,
                  float *C, int64_t ldc, int64_t sc, float alpha) {
    kiln_gemm_desc d = {.transA = ta, .transB = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                        .ldc = ldc, .batch = c->B * c->H, .strideA = sa, .strideB = sb,
                        .strideC = sc, .alpha = alpha, .beta = 0.0f};
    if (kiln_gemm_f32(&d, A, B, C) != KILN_OK) {
        fprintf(stderr, "gemm: %s\n", kiln_last_error());
        exit(1);
    }
}

static void decomposed_fwd(bench_ctx *c) {
    const int64_t T = c->T, D = c->D, BH = c->B * c->H;
    bgemm(c, false, true, T, T, D, c->q, D, T * D, c->k, D, T * D, c->S, T, T * T, c->scale);
    for (int64_t i = 0; i < BH; i++) kiln_k_add(c->S + i * T * T, c->mask, c->S + i * T * T, T * T);
    kiln_k_softmax(c->S, c->S, BH * T, T);
    bgemm(c, false, false, T, D, T, c->S, T, T * T, c->v, D, T * D, c->o2, D, T * D, 1.0f);
}

static void decomposed_bwd(bench_ctx *c) {
    const int64_t T = c->T, D = c->D, BH = c->B * c->H;
    bgemm(c, true, false, T, D, T, c->S, T, T * T, c->dout, D, T * D, c->dv2, D, T * D, 1.0f);
    bgemm(c, false, true, T, T, D, c->dout, D, T * D, c->v, D, T * D, c->dP, T, T * T, 1.0f);
    kiln_k_softmax_backward(c->S, c->dP, c->dP, BH * T, T);
    bgemm(c, false, false, T, D, T, c->dP, T, T * T, c->k, D, T * D, c->dq2, D, T * D, c->scale);
    bgemm(c, true, false, T, D, T, c->dP, T, T * T, c->q, D, T * D, c->dk2, D, T * D, c->scale);
}

static void fused_fwd(bench_ctx *c) {
    kiln_k_flash_attn(c->q, c->k, c->v, NULL, c->out, c->lse, c->B, c->H, c->H, c->T, c->T, c->D,
                      c->scale);
}

static void fused_bwd(bench_ctx *c) {
    kiln_k_flash_attn_backward(c->q, c->k, c->v, NULL, c->out, c->lse, c->dout, c->dq, c->dk, c->dv,
                               c->B, c->H, c->H, c->T, c->T, c->D, c->scale);
}

/* the same with bf16 products (kiln_k_flash_attn_ex: AMX tiles where the
 * CPU has them, else VDPBF16PS) */
static void fused_fwd_bf16(bench_ctx *c) {
    kiln_k_flash_attn_ex(c->q, c->k, c->v, NULL, NULL, c->o2, c->lse, c->B, c->H, c->H, c->T, c->T, c->D, c->scale, 0,
                         true);
}
static void fused_bwd_bf16(bench_ctx *c) {
    kiln_k_flash_attn_backward_ex(c->q, c->k, c->v, NULL, NULL, c->o2, c->lse, c->dout, c->dq2, c->dk2, c->dv2, c->B,
                                  c->H, c->H, c->T, c->T, c->D, c->scale, 0, true);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median and best seconds of `reps` runs after one warm-up */
static void timeit(void (*fn)(bench_ctx *), bench_ctx *c, int reps, double *med, double *best) {
    double t[64];
    fn(c);
    for (int i = 0; i < reps; i++) {
        double t0 = omp_get_wtime();
        fn(c);
        t[i] = omp_get_wtime() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_d);
    *med = t[reps / 2];
    *best = t[0];
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* peak: the GFLOP/s the median is a share of (the fp32 FMA peak, twice it
 * for bf16 products), 0 for none */
static void report(const char *name, double med, double best, double flops, double peak) {
    printf("  %-31s median %9.2f ms  best %9.2f ms  %7.1f GFLOP/s", name, med * 1e3, best * 1e3, flops / med / 1e9);
    if (peak > 0) printf("  %5.1f%% of %.0f", 100.0 * flops / med / 1e9 / peak, peak);
    printf("\n");
}

static void free_ctx(bench_ctx *c) {
    float *bufs[] = {c->q, c->k, c->v, c->dout, c->mask, c->out, c->lse, c->dq, c->dk, c->dv,
                     c->o2, c->dq2, c->dk2, c->dv2, c->S, c->dP};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kiln_dealloc(bufs[i]);
}

int main(int argc, char **argv) {
    if (argc > 1) omp_set_num_threads(atoi(argv[1]));
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 64) reps = 7;
    printf("threads %d, repeats %d, gemm %s\n", omp_get_max_threads(), reps, kiln_gemm_backend());
    int64_t shapes[16][3] = {{8, 8, 256}, {8, 8, 1024}};
    int nshape = 2;
    if (argc > 3) {
        nshape = 0;
        for (int i = 3; i < argc && nshape < 16; i++) {
            long long b, h, t;
            if (sscanf(argv[i], "%lldx%lldx%lld", &b, &h, &t) != 3 || b < 1 || h < 1 || t < 1) {
                fprintf(stderr, "attention: shape '%s' is not BxHxT (e.g. 1x8x4096)\n", argv[i]);
                return 2;
            }
            shapes[nshape][0] = b, shapes[nshape][1] = h, shapes[nshape][2] = t, nshape++;
        }
    }
    for (int ti = 0; ti < nshape; ti++) {
        bench_ctx c = {.B = shapes[ti][0], .H = shapes[ti][1], .T = shapes[ti][2], .D = 64, .scale = 0.125f};
        const bool decomposed = c.T <= 2048;
        const int64_t T = c.T, n = c.B * c.H * T * c.D, nn = decomposed ? c.B * c.H * T * T : 1;
        c.q = rnd(n, 1), c.k = rnd(n, 2), c.v = rnd(n, 3), c.dout = rnd(n, 4);
        c.mask = kiln_alloc((size_t)(decomposed ? T * T : 1) * sizeof(float));
        for (int64_t i = 0; decomposed && i < T; i++)
            for (int64_t j = 0; j < T; j++) c.mask[i * T + j] = j <= i ? 0.0f : -INFINITY;
        c.out = rnd(n, 5), c.lse = rnd(c.B * c.H * T, 6), c.dq = rnd(n, 7), c.dk = rnd(n, 8),
        c.dv = rnd(n, 9);
        c.o2 = rnd(n, 10), c.dq2 = rnd(n, 11), c.dk2 = rnd(n, 12), c.dv2 = rnd(n, 13);
        c.S = rnd(nn, 14), c.dP = rnd(nn, 15);
        const double ff = 4.0 * (double)(c.B * c.H) * (double)T * (double)T * (double)c.D / 2.0;
        double m, b;
        printf("B=%lld H=%lld T=%lld D=%lld causal (fwd %.2f GFLOP, bwd %.2f GFLOP counted)\n",
               (long long)c.B, (long long)c.H, (long long)T, (long long)c.D, ff / 1e9, 2.5 * ff / 1e9);
        /* the fp32 FMA peak, probed just before this shape's kernels run */
        const double peak = kiln_fma_peak_gflops(0.3), bpeak = 2.0 * peak;
        printf("  fp32 FMA peak %.1f GFLOP/s (probed now; bf16 products against twice it)\n", peak);
        timeit(fused_fwd, &c, reps, &m, &b);
        report("fused forward", m, b, ff, peak);
        double ffm = m;
        timeit(fused_bwd, &c, reps, &m, &b);
        report("fused backward", m, b, 2.5 * ff, peak);
        double fbm = m;
        if (kiln_bf16_native() && kiln_form_active() == KILN_FORM_AVX512 && c.D % 32 == 0) {
            /* (o2 and the d*2 buffers are the decomposed path's, rewritten below) */
            const char *path = kiln_bf16_amx() ? "AMX" : "VDPBF16PS";
            char label[64];
            timeit(fused_fwd_bf16, &c, reps, &m, &b);
            snprintf(label, sizeof label, "fused forward, bf16 %s", path);
            report(label, m, b, ff, bpeak);
            const double bfm = m;
            timeit(fused_bwd_bf16, &c, reps, &m, &b);
            snprintf(label, sizeof label, "fused backward, bf16 %s", path);
            report(label, m, b, 2.5 * ff, bpeak);
            printf("  bf16 on %s against fp32: forward %.2fx, backward %.2fx; max |bf16 - fp32| out %.2g\n", path,
                   ffm / bfm, fbm / m, maxdiff(c.out, c.o2, n));
        }
        if (!decomposed) {
            free_ctx(&c);
            continue;
        }
        timeit(decomposed_fwd, &c, reps, &m, &b);
        report("decomposed forward", m, b, ff, peak);
        double dfm = m;
        decomposed_fwd(&c); /* backward needs this forward's P */
        timeit(decomposed_bwd, &c, reps, &m, &b);
        report("decomposed backward", m, b, 2.5 * ff, peak);
        printf("  speed-up fused/decomposed: forward %.2fx, backward %.2fx, fwd+bwd %.2fx\n",
               dfm / ffm, m / fbm, (dfm + m) / (ffm + fbm));
        printf("  max |fused - decomposed|: out %.2g dq %.2g dk %.2g dv %.2g; "
               "T×T scratch avoided: %.0f MiB\n",
               maxdiff(c.out, c.o2, n), maxdiff(c.dq, c.dq2, n), maxdiff(c.dk, c.dk2, n),
               maxdiff(c.dv, c.dv2, n), 2.0 * (double)nn * 4 / 1048576.0);
        free_ctx(&c);
    }
    return 0;
}
