/* Embedding lookup and its backward (a scatter-add into dW).
 *
 * The backward splits the columns of dW among threads; every thread walks all
 * ids in order over its own columns. No two threads touch the same element and
 * each element is summed in id order, so dW is identical to the serial result
 * for any thread count. Ids outside [0, vocab) are skipped in the backward
 * (the ops layer validates them; this only keeps a bad id from writing out of
 * bounds). */
#include "kiln/kernels.h"

#include <omp.h>
#include <string.h>

#define KILN_EMB_PAR (1 << 15)
#define KILN_EMB_ALIGN 16 /* column ranges start on a 64-byte boundary */

void kiln_k_embedding(const float *W, const int32_t *ids, float *out, int64_t n, int64_t dim) {
#pragma omp parallel for schedule(static) if (n * dim > KILN_EMB_PAR && n > 1)
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * dim, W + (int64_t)ids[i] * dim, (size_t)dim * sizeof(float));
}

void kiln_k_embedding_backward(const float *dout, const int32_t *ids, float *dW, int64_t n,
                               int64_t dim, int64_t vocab) {
#pragma omp parallel if (n * dim > KILN_EMB_PAR && dim >= 2 * KILN_EMB_ALIGN)
    {
        /* one contiguous, vector-aligned column range per thread */
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t nvec = (dim + KILN_EMB_ALIGN - 1) / KILN_EMB_ALIGN;
        int64_t c0 = nvec * t / nt * KILN_EMB_ALIGN, c1 = nvec * (t + 1) / nt * KILN_EMB_ALIGN;
        if (c1 > dim) c1 = dim;
        for (int64_t i = 0; i < n && c0 < c1; i++) {
            int64_t id = ids[i];
            if (id < 0 || id >= vocab) continue;
            float *restrict dst = dW + id * dim;
            const float *restrict src = dout + i * dim;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}
