/* Softmax over the last dim, rows × n, and its backward.
 * Stable (subtracts the row max). A row that is entirely -inf (fully masked)
 * gives zeros, not NaN. NaN in a row makes that row NaN. y may be x and dx
 * may be dy (in place). */
#include "kiln/kernels.h"

#define KILN_SM_PAR (1 << 15)

static void softmax_row(const float *x, float *y, int64_t n) {
    float m = kiln_row_max(x, n);
    if (m == -INFINITY) {
        for (int64_t j = 0; j < n; j++) y[j] = 0.0f;
        return;
    }
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        float e = kiln_expf_fast(x[j] - m);
        y[j] = e;
        s += e;
    }
    float inv = 1.0f / s;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j] *= inv;
}

void kiln_k_softmax(const float *x, float *y, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n > KILN_SM_PAR && rows > 1)
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * n, y + r * n, n);
}

void kiln_k_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows,
                             int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n > KILN_SM_PAR && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * n, *dyr = dy + r * n;
        float *dxr = dx + r * n;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < n; j++) dot += dyr[j] * yr[j];
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dxr[j] = yr[j] * (dyr[j] - dot);
    }
}
