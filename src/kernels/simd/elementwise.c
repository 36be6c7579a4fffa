/* Element-wise kernels and whole-array reductions.
 *
 * Threading: OpenMP only above KILN_EW_PAR elements; below that the fork/join
 * costs more than the loop. Reductions use a chunking that depends on n only,
 * so their results are identical for any thread count. */
#include "kiln/kernels.h"
#include "simd_exp.h"


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
void kiln_k_exp(const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, kiln_exp16(_mm512_loadu_ps(x + i)));
#endif
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, kiln_exp8(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = kiln_expf_fast(x[i]);
}

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

/* One chunk of a reduction. Never inlined: kiln_k_sumsq and
 * kiln_k_sumsq_multi must run the same vectorised code (the simd reduction's
 * lane order is the compiler's choice), so their sums agree to the bit. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static double chunk_sum(const float *x, int64_t lo, int64_t hi, bool square) {
    double s = 0.0;
    if (square) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = lo; i < hi; i++) s += (double)x[i];
    }
    return s;
}

static double reduce(const float *x, int64_t n, bool square) {
    double part[KILN_RED_MAX_CHUNKS];
    int64_t nc = red_chunks(n);
    int64_t per = (n + nc - 1) / nc;
#pragma omp parallel for schedule(static) if (n > KILN_EW_PAR)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * per, hi = lo + per < n ? lo + per : n;
        part[c] = chunk_sum(x, lo, hi, square);
    }
    double total = 0.0;
    for (int64_t c = 0; c < nc; c++) total += part[c];
    return total;
}

double kiln_k_sum(const float *x, int64_t n) { return reduce(x, n, false); }
double kiln_k_sumsq(const float *x, int64_t n) { return reduce(x, n, true); }

/* Arrays are taken in runs whose chunks fit in a fixed buffer (one parallel
 * region per run; one run for models up to ~60 large matrices + their small
 * tensors, at most 64 chunks each); a run never splits an array, and the
 * partials are added per array in chunk order, then arrays in order, as
 * the loop over kiln_k_sumsq adds them. */
#define KILN_RED_MULTI_PARTS 8192

double kiln_k_sumsq_multi(const float *const *x, const int64_t *n, int count) {
    double part[KILN_RED_MULTI_PARTS]; /* 64 KB of stack, shared by the region's threads */
    double total = 0.0;
    for (int j0 = 0; j0 < count;) {
        int j1 = j0;
        int64_t parts = 0, elems = 0;
        while (j1 < count && parts + red_chunks(n[j1]) <= KILN_RED_MULTI_PARTS) parts += red_chunks(n[j1]), elems += n[j1++];
#pragma omp parallel if (elems > KILN_EW_PAR)
        {
            int j = j0; /* private cursor: array j's chunks are [first, first + red_chunks(n[j])) */
            int64_t first = 0;
#pragma omp for schedule(static)
            for (int64_t c = 0; c < parts; c++) {
                while (c >= first + red_chunks(n[j])) first += red_chunks(n[j++]);
                int64_t nc = red_chunks(n[j]), per = (n[j] + nc - 1) / nc, lo = (c - first) * per,
                        hi = lo + per < n[j] ? lo + per : n[j];
                part[c] = chunk_sum(x[j], lo, hi, true);
            }
        }
        for (int64_t c = 0; j0 < j1; j0++) {
            double t = 0.0;
            for (int64_t e = c + red_chunks(n[j0]); c < e; c++) t += part[c];
            total += t;
        }
    }
    return total;
}
