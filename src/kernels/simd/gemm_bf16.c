/* kiln's own bf16 GEMM (kiln/kernels.h kiln_k_gemm_bf16). Placeholder: a
 * scalar emulation of VDPBF16PS's sums, to be replaced by packed kernels. */
#include <string.h>

#include "kiln/kernels.h"

static float daz(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&x, &u, sizeof u);
    return x;
}

static float wide(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return daz(f);
}

bool kiln_k_gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                      int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#pragma omp parallel for schedule(static) if (M * N * K > (1 << 18))
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t k = 0; k < K; k += 2) {
                float a1 = 0, b1 = 0;
                if (k + 1 < K) {
                    a1 = wide(transA ? A[(k + 1) * lda + i] : A[i * lda + k + 1]);
                    b1 = wide(transB ? B[j * ldb + k + 1] : B[(k + 1) * ldb + j]);
                }
                float a0 = wide(transA ? A[k * lda + i] : A[i * lda + k]);
                float b0 = wide(transB ? B[j * ldb + k] : B[k * ldb + j]);
                s = daz(s + a1 * b1);
                s = daz(s + a0 * b0);
            }
            C[i * ldc + j] = alpha * s + (beta != 0.0f ? C[i * ldc + j] : 0.0f);
        }
    return true;
}
