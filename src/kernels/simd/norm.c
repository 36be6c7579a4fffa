/* RMSNorm forward and backward over rows × dim.
 *
 * The backward's dw is a sum over rows. To keep it race-free and identical
 * for any thread count, rows are cut into a number of chunks that depends on
 * `rows` only; each chunk sums into its own buffer and the buffers are added
 * into dw in chunk order.
 * dx may be NULL when only dw is wanted (the backward to w alone). */
#include "kiln/kernels.h"

#include <stdlib.h>

#define KILN_NORM_PAR (1 << 15) /* elements; below this run on one thread */
#define KILN_NORM_CHUNKS 32

/* 1 / sqrt(mean(x^2) + eps); the sum of squares in float with a vector of
 * partial sums, the rest in double. */
static float row_rstd(const float *restrict x, int64_t dim, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; j++) ss += x[j] * x[j];
    return kiln_rms_rstd(ss, (float)dim, eps); /* as compiled row groups compute it */
}

void kiln_k_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t dim,
                    float eps) {
#pragma omp parallel for schedule(static) if (rows * dim > KILN_NORM_PAR && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim; /* y may be x: no restrict */
        float *yr = y + r * dim;
        float rs = row_rstd(xr, dim, eps);
        /* (x * r) * w, in Hugging Face's order */
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) yr[j] = w[j] * (xr[j] * rs);
    }
}

/* One row: xhat = x r, g = dy w, dx = r (g - xhat mean(g xhat));
 * accumulates dy * xhat into acc when acc is non-NULL. dx NULL: only acc
 * (then acc must not be NULL). */
static void row_backward(const float *xr, const float *w, const float *dyr, float *dxr,
                         float *restrict acc,
                         int64_t dim, float eps) {
    float rs = row_rstd(xr, dim, eps);
    if (!dxr) { /* dw only */
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) acc[j] += dyr[j] * (xr[j] * rs);
        return;
    }
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < dim; j++) dot += dyr[j] * w[j] * (xr[j] * rs);
    float c = dot / (float)dim;
    if (acc) { /* before dx, so dx may overwrite dy */
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) acc[j] += dyr[j] * (xr[j] * rs);
    }
#pragma omp simd
    for (int64_t j = 0; j < dim; j++) {
        float xh = xr[j] * rs;
        dxr[j] = rs * (dyr[j] * w[j] - xh * c);
    }
}

void kiln_k_rmsnorm_backward(const float *x, const float *w, const float *dy, float *dx,
                             float *dw, int64_t rows, int64_t dim, float eps) {
#define DXROW(r) (dx ? dx + (r) * dim : NULL)
    bool par = rows * dim > KILN_NORM_PAR && rows > 1;
    if (!dw) {
        if (!dx) return;
#pragma omp parallel for schedule(static) if (par)
        for (int64_t r = 0; r < rows; r++)
            row_backward(x + r * dim, w, dy + r * dim, DXROW(r), NULL, dim, eps);
        return;
    }
    int64_t nc = rows < KILN_NORM_CHUNKS ? rows : KILN_NORM_CHUNKS;
    if (nc < 1) return;
    int64_t per = (rows + nc - 1) / nc;
    float *part = calloc((size_t)(nc * dim), sizeof(float));
    if (!part) {
        /* out of memory: one thread, rows straight into dw (same maths,
         * different rounding of the dw sum) */
        for (int64_t r = 0; r < rows; r++)
            row_backward(x + r * dim, w, dy + r * dim, DXROW(r), dw, dim, eps);
        return;
    }
#pragma omp parallel if (par)
    {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nc; c++) {
            int64_t lo = c * per, hi = lo + per < rows ? lo + per : rows;
            for (int64_t r = lo; r < hi; r++)
                row_backward(x + r * dim, w, dy + r * dim, DXROW(r), part + c * dim, dim,
                             eps);
        }
        /* reduce over chunks in order, columns split among threads */
#pragma omp for schedule(static)
        for (int64_t j0 = 0; j0 < dim; j0 += 256) {
            int64_t j1 = j0 + 256 < dim ? j0 + 256 : dim;
            float *restrict p0 = part;
            for (int64_t c = 1; c < nc; c++) {
                const float *restrict pc = part + c * dim;
#pragma omp simd
                for (int64_t j = j0; j < j1; j++) p0[j] += pc[j];
            }
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) dw[j] += p0[j];
        }
    }
    free(part);
}
#undef DXROW
