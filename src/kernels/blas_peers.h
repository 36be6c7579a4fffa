/* OpenBLAS and BLIS (their OpenMP builds, opened at run time) as
 * candidates of kiln_gemm_f32's choice: src/kernels/blas_peers.c. Private
 * to src/kernels. */
#ifndef KILN_BLAS_PEERS_H
#define KILN_BLAS_PEERS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/core.h"

/* KILN_ASAN: an AddressSanitizer build (gcc's or clang's), which cannot
 * open a library RTLD_DEEPBIND and tags its GEMM choices apart */
#if defined(__SANITIZE_ADDRESS__)
#define KILN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_ASAN 1
#endif
#endif

enum { KILN_BLAS_OPENBLAS = 0, KILN_BLAS_BLIS = 1, KILN_BLAS_PEERS = 2 };

/* "OpenBLAS 0.3.21", "BLIS 0.9.0 (zen3)", or NULL when that library is not
 * a candidate here (missing, not the OpenMP build, a sanitizer build). */
const char *kiln_blas_peer_version(int which);
/* why a peer is no candidate ("not installed (package)", "not opened in a
 * sanitizer build", "BLIS 0.9.0 has only its generic kernels for this
 * CPU", ...), NULL when it is one */
const char *kiln_blas_peer_absent(int which);
/* Which are candidates, and their versions, for the choices' machine tag
 * (no spaces, tabs or slashes). */
void kiln_blas_peers_tag(char *out, size_t n);
/* C = alpha op(A) op(B) + beta C (row-major) by library `which`'s
 * cblas_sgemm; KILN_ERR_UNSUPPORTED when it is not a candidate,
 * KILN_ERR_RANGE past its 32-bit sizes. */
kiln_status kiln_blas_peer_sgemm(int which, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                 int64_t ldc);
#endif
