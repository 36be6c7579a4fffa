/* bench/gemm_spread: how far apart are a GEMM's fastest call and its typical
 * one on this machine, and what does that cost kiln's choice?
 *
 * For each shape, every candidate kiln_gemm_f32 chooses among (oneDNN's
 * matmul primitive, dnnl_sgemm, kiln's kernel, OpenBLAS's and BLIS's OpenMP
 * builds where installed) runs in interleaved rounds (one call each per
 * round) for the given seconds. Printed per candidate: the fastest call, the
 * median and the 90th-percentile call, and the mean over all calls, in
 * GFLOP/s and as a share of the fp32 FMA peak probed before and after (the
 * best probe kept). On an idle machine the four agree within a few percent;
 * on a shared one the gap between the fastest call and the mean is what the
 * neighbours take, which no kernel can win back.
 *
 * Then the choice as kiln makes it, replayed on the recorded calls: kiln
 * times every candidate over a few interleaved rounds and keeps the one with
 * the fastest call. For windows of 3, 5 and 8 consecutive rounds the rule
 * picks a candidate; the loss is that candidate's mean over all calls
 * against the best mean, averaged over the windows. The same for the rules
 * "lowest median" and "lowest mean" of the window, for comparison.
 *
 * Usage: bench/gemm_spread [seconds per shape] [MxNxK:TN ...]
 *   default 30 seconds and the small model's forward (2048x1376x512:NT),
 *   input-gradient (2048x512x512:NN) and weight-gradient (512x1376x2048:TN)
 *   products; the two letters are op(A) and op(B) (T: stored transposed).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kernels.h"

enum { NI = 5, MAX_ROUNDS = 20000 };
static const char *const g_impl[NI] = {"onednn", "sgemm", "kiln", "openblas", "blis"};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(const double *v, int n) {
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return NAN;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_d);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

static float *fill(int64_t n, uint64_t seed) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; p && i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
    return p;
}

/* t[i][r]: candidate i's seconds in round r */
static double *g_t[NI];

/* the mean loss (share) of choosing by rule over windows of w rounds:
 * 0 fastest call, 1 median, 2 mean */
static double replay(int n, int w, int rule, const bool *avail, const double *mean) {
    double best = INFINITY, loss = 0;
    for (int i = 0; i < NI; i++)
        if (avail[i]) best = fmin(best, mean[i]);
    int windows = 0;
    for (int s = 0; s + w <= n; s += w, windows++) {
        int pick = -1;
        double ps = INFINITY;
        for (int i = 0; i < NI; i++) {
            if (!avail[i]) continue;
            double sc = rule == 0 ? INFINITY : 0;
            if (rule == 1) sc = median_of(g_t[i] + s, w);
            for (int r = s; r < s + w; r++) sc = rule == 0 ? fmin(sc, g_t[i][r]) : rule == 2 ? sc + g_t[i][r] / w : sc;
            if (sc < ps) ps = sc, pick = i;
        }
        loss += mean[pick] / best - 1.0;
    }
    return windows ? loss / windows : NAN;
}

static int run_shape(const char *spec, double secs, double *peak) {
    long long M, N, K;
    char ta, tb;
    if (sscanf(spec, "%lldx%lldx%lld:%c%c", &M, &N, &K, &ta, &tb) != 5 || M < 1 || N < 1 || K < 1 ||
        (ta != 'N' && ta != 'T') || (tb != 'N' && tb != 'T')) {
        fprintf(stderr, "gemm_spread: '%s' is not MxNxK:XY with X, Y each N or T (e.g. 2048x512x512:NT)\n", spec);
        return 2;
    }
    const bool tA = ta == 'T', tB = tb == 'T';
    float *A = fill(M * K, 1), *B = fill(K * N, 2), *C = malloc((size_t)(M * N) * sizeof(float));
    if (!A || !B || !C) {
        fprintf(stderr, "gemm_spread: no memory for %s\n", spec);
        free(A), free(B), free(C);
        return 1;
    }
    kiln_gemm_desc d = {.transA = tA, .transB = tB, .M = M, .N = N, .K = K, .lda = tA ? M : K, .ldb = tB ? K : N,
                        .ldc = N, .batch = 1, .alpha = 1.0f, .beta = 0.0f};
    bool avail[NI];
    for (int i = 0; i < NI; i++) {
        avail[i] = kiln_gemm_f32_impl_available(g_impl[i]);
        if (avail[i] && kiln_gemm_f32_impl(g_impl[i], &d, A, B, C) != KILN_OK) { /* warm-up */
            fprintf(stderr, "gemm_spread: %s failed on %s: %s\n", g_impl[i], spec, kiln_last_error());
            avail[i] = false;
        }
    }
    int n = 0;
    const double start = now();
    while (n < MAX_ROUNDS && now() - start < secs) {
        for (int i = 0; i < NI; i++) {
            if (!avail[i]) continue;
            double t0 = now();
            kiln_gemm_f32_impl(g_impl[i], &d, A, B, C);
            g_t[i][n] = now() - t0;
        }
        n++;
    }
    *peak = fmax(*peak, kiln_fma_peak_gflops(0.5));
    const double gf = 2.0 * (double)M * (double)N * (double)K * 1e-9, pk = *peak;
    printf("\n%s (%lld x %lld x %lld, op(A) %c, op(B) %c): %d interleaved rounds in %.0f s, fp32 peak %.1f GFLOP/s\n\n",
           spec, M, N, K, ta, tb, n, now() - start, pk);
    printf("| candidate | fastest call | median call | 90th percentile | mean over all calls |\n|---|---:|---:|---:|---:|\n");
    double mean[NI] = {0};
    for (int i = 0; i < NI; i++) {
        if (!avail[i]) {
            printf("| %s | not here | | | |\n", g_impl[i]);
            continue;
        }
        double sum = 0;
        for (int r = 0; r < n; r++) sum += g_t[i][r];
        mean[i] = sum / n;
        double *c = malloc((size_t)n * sizeof *c);
        if (!c) {
            free(A), free(B), free(C);
            return 1;
        }
        memcpy(c, g_t[i], (size_t)n * sizeof *c);
        qsort(c, (size_t)n, sizeof *c, cmp_d);
        const double f = gf / c[0], p50 = gf / c[n / 2], p90 = gf / c[n * 9 / 10], mn = gf / mean[i];
        printf("| %s | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f (%.0f%%) |\n", g_impl[i], f, 100 * f / pk, p50,
               100 * p50 / pk, p90, 100 * p90 / pk, mn, 100 * mn / pk);
        free(c);
    }
    printf("\nkiln's rule (the fastest call of a few interleaved rounds) replayed on these calls: the chosen "
           "candidate's mean against the best mean, averaged over the windows\n\n| rounds | fastest call (kiln) | "
           "lowest median | lowest mean |\n|---:|---:|---:|---:|\n");
    for (int w = 3; w <= 8; w += w == 3 ? 2 : 3)
        printf("| %d | %.2f%% | %.2f%% | %.2f%% |\n", w, 100 * replay(n, w, 0, avail, mean),
               100 * replay(n, w, 1, avail, mean), 100 * replay(n, w, 2, avail, mean));
    free(A), free(B), free(C);
    return 0;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 30;
    if (!(secs > 0) || secs > 3600) {
        fprintf(stderr, "usage: %s [seconds per shape, 0 < s <= 3600] [MxNxK:XY ...]\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < NI; i++)
        if (!(g_t[i] = calloc(MAX_ROUNDS, sizeof(double)))) return 1;
    printf("kiln GEMM spread: %d threads, kiln kernels %s\n", omp_get_max_threads(), kiln_form_describe());
    double peak = kiln_fma_peak_gflops(0.5);
    static const char *const dflt[] = {"2048x1376x512:NT", "2048x512x512:NN", "512x1376x2048:TN"};
    int rc = 0;
    if (argc > 2)
        for (int a = 2; a < argc && !rc; a++) rc = run_shape(argv[a], secs, &peak);
    else
        for (int a = 0; a < 3 && !rc; a++) rc = run_shape(dflt[a], secs, &peak);
    for (int i = 0; i < NI; i++) free(g_t[i]);
    return rc;
}
