/* Element-wise kernels and whole-array reductions.
 *
 * Threading: OpenMP only above KILN_EW_PAR elements; below that the fork/join
 * costs more than the loop. Reductions use a chunking that depends on n only,
 * so their results are identical for any thread count. */
#include "kiln/kernels.h"


#define KILN_EW_PAR (1 << 15)

void kiln_k_add(const float *a, const float *b, float *out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > KILN_EW_PAR)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void kiln_k_mul(const float *a, const float *b, float *out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > KILN_EW_PAR)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

void kiln_k_scale(const float *x, float s, float *out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > KILN_EW_PAR)
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * s;
}

void kiln_k_axpy(float a, const float *x, float *y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > KILN_EW_PAR)
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* silu and its backward: the expressions of kiln/opmath.h, which compiled
 * code runs too */
void kiln_k_silu(const float *x, float *out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > KILN_EW_PAR)
    for (int64_t i = 0; i < n; i++) out[i] = kiln_silu_f(x[i]);
}

void kiln_k_silu_backward(const float *x, const float *gout, float *gin, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > KILN_EW_PAR)
    for (int64_t i = 0; i < n; i++) gin[i] = kiln_silu_bwd_f(x[i], gout[i]);
}

/* ---- reductions: fixed chunks of the array, each summed in double with a
 * fixed vector order, then the chunk sums added in index order. */
#define KILN_RED_MAX_CHUNKS 64
#define KILN_RED_MIN_CHUNK 4096

static int64_t red_chunks(int64_t n) {
    int64_t c = (n + KILN_RED_MIN_CHUNK - 1) / KILN_RED_MIN_CHUNK;
    if (c > KILN_RED_MAX_CHUNKS) c = KILN_RED_MAX_CHUNKS;
    return c < 1 ? 1 : c;
}

static double reduce(const float *x, int64_t n, bool square) {
    double part[KILN_RED_MAX_CHUNKS];
    int64_t nc = red_chunks(n);
    int64_t per = (n + nc - 1) / nc;
#pragma omp parallel for schedule(static) if (n > KILN_EW_PAR)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * per, hi = lo + per < n ? lo + per : n;
        double s = 0.0;
        if (square) {
#pragma omp simd reduction(+ : s)
            for (int64_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        } else {
#pragma omp simd reduction(+ : s)
            for (int64_t i = lo; i < hi; i++) s += (double)x[i];
        }
        part[c] = s;
    }
    double total = 0.0;
    for (int64_t c = 0; c < nc; c++) total += part[c];
    return total;
}

double kiln_k_sum(const float *x, int64_t n) { return reduce(x, n, false); }
double kiln_k_sumsq(const float *x, int64_t n) { return reduce(x, n, true); }
