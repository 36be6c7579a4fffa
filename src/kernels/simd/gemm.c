/* kiln's own fp32 GEMM (kiln/kernels.h kiln_k_gemm_f32). Placeholder form:
 * a plain triple loop, to be replaced by the packed, register-blocked
 * kernels. */
#include "kiln/kernels.h"

bool kiln_k_gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#pragma omp parallel for schedule(static) if (M * N * K > (1 << 18))
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (transA ? A[k * lda + i] : A[i * lda + k]) * (transB ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = alpha * s + (beta != 0.0f ? C[i * ldc + j] : 0.0f);
        }
    return true;
}
