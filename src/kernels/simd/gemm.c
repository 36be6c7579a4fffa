/* kiln's own fp32 GEMM (kiln/kernels.h kiln_k_gemm_f32):
 *   C = alpha op(A) op(B) + beta C,  row-major, beta 0 (C not read) or 1.
 *
 * GotoBLAS/BLIS structure. The loops, outermost first:
 *   jc: N in panels of whole NR slivers, as many as fit about 4 MB packed
 *       over ALL of K: op(B)[.., jc..] is packed, K block by K block (K in
 *       blocks of at most KC, balanced: K = 600 is 3 x 200 with KC 256),
 *       into kc x NR column slivers zero-padded past N; the threads fill
 *       the one shared panel together, then one barrier.
 *       Where such a panel (at least 4 slivers) is narrower than N, the
 *       schedule is K-outer instead: for each K block in order, panels of
 *       that block alone (about 4 MB: 2048 columns at KC 512), each packed
 *       and then computed as below with the task over that one K block. A
 *       packed (or streamed in place) op(A) is then read once per K block
 *       rather than once per panel: the all-K schedule read the head's
 *       2048 x 512 x 8192 NN A (64 MB, packed: its rows alias in L1) four
 *       times. Zen 5, 2 threads, in one process (throwaway driver, median
 *       of 9 calls, the same bits): 2048 x 512 x 8192 NN 298 -> 334
 *       GFLOP/s; 124M-class 1024 x 768 x 3072 NN and NT 291 -> 334; 1B-class
 *       1024 x 2048 x 8192 NN 246 -> 331, NT 253 -> 336; the one-panel
 *       shapes unchanged. C is then read and written once per K block.
 *     task: (row chunk of about MC rows) x (column chunk of at most 512
 *           columns), taken dynamically, each over the panel's K blocks (all
 *           of K, or the one), so a task owns its block of C and no barrier
 *           separates the K blocks within a panel
 *       pc: the K blocks in order; op(A)[ic.., pc..] is packed into MR x kc
 *           row slivers (zero-padded past M) in the thread's own buffer
 *           (L2); when a row chunk's A over all of K fits 2 MB it is kept
 *           and the thread's next task on the same rows reuses it (K-outer:
 *           the K block's A, for the next task on the same rows in it)
 *         jr: the task's NR slivers of the panel (one sliver in L1)
 *           ir: the MR slivers of the A block: the micro-kernel keeps its
 *               MR x NR tile of C in registers over the whole kc loop (a
 *               broadcast of A times NR/lanes vectors of B per k), then
 *               C = alpha acc (first K block, beta 0) or C + alpha acc.
 * Edge tiles (M, N not multiples of MR, NR) run the same kernel into a
 * scratch tile and copy the valid part with the same two roundings (alpha
 * acc, then the add), so an element's bits do not depend on where it sits.
 *
 * Packing: op(A) stored transposed (K x M) and op(B) stored as is (K x N)
 * are row copies; the other two cases transpose 16 x 16 (avx512) or 8 x 8
 * (avx2) squares in registers; the portable form copies element-wise. In
 * the avx512 and avx2 forms op(A) = A stored M x K is not packed at all,
 * nor, in the avx512 form, A stored transposed where lda is at most
 * GEMM_ADIRECT_LDA: the micro-kernel reads its full slivers in place
 * (element (i, k) at i lda + k, or i + k lda, instead of k MR + i; the same
 * values in the same order, so the same bits), only a last partial sliver is
 * packed; in the avx512 form A stored M x K with a row stride that aliases
 * in L1 is packed all the same (GEMM_AROW_ALIAS). (avx2, Zen 3, the same
 * 15 products in one process: +1.4-2.2% in
 * geometric mean, +15-20% on the fused head's 256 x 512 x 8192, whose rows
 * of A over all of K exceeded the packed-A cache and were packed again per
 * panel of B.)
 *
 * Forms (registers: the tile plus the B vectors plus a broadcast):
 *   avx512  MR x NR = 14 x 32: 28 zmm accumulators, 2 B vectors, FMA
 *   avx2    6 x 16: 12 ymm accumulators, 2 B vectors, FMA
 *   portable 4 x 8: 8 xmm-sized (GCC vector extension) accumulators, mul+add
 * Block sizes: a KC x NR sliver of B of 64 KB (avx512) or 32 KB (avx2; L1 is 32-48
 * KB), an MC x KC block of A well inside a 512 KB (Zen 2/3) to 1 MB (Zen
 * 4/5) L2, a panel of B (all of K) about 4 MB of L3. The avx512 form's KC
 * is 512 (a 64 KB sliver of B, streamed from L2): fewer passes over C, and
 * on a Zen 5 the step's products ran 5% faster than with 256 (384: the
 * same as 256; 768 and 1024: as 512); the avx2 form's KC is 512 too (a 32
 * KB sliver): on a Zen 3 (AVX2, 512 KB L2) the small model's 12 products
 * and the fused head's 3, both forms in one process, ran 1.3-3.5% faster
 * in geometric mean than with 256 (+2% on a Zen 5).
 *
 * Threads: OpenMP on the caller's count (serial below 2^19 multiply-adds,
 * or when called inside a parallel region). Per panel the threads pack it
 * together (dynamic items of one sliver of one K block, then the implicit
 * barrier), then take tasks dynamically, at least about 4 per thread (row
 * and column chunks split further until there are): dynamic tasks keep a
 * thread the machine slows down from holding the others at the barrier. K
 * is never split and the K blocking depends on K alone, so every element is
 * the same sequence of operations whichever thread computes it: the
 * result's bits do not depend on the thread count.
 *
 * alpha is applied to each K block's sum as it is stored (once per element
 * when K <= KC; with alpha 1 exactly the plain sum). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_grid.h"
#include "simd_tr.h"
#include "kiln/kernels.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define GEMM_MR 14
#define GEMM_NR 32
#define GEMM_KC 512
#define GEMM_MC 168
#elif defined(__AVX2__)
#define GEMM_MR 6
#define GEMM_NR 16
#define GEMM_KC 512
#define GEMM_MC 144
#else
#define GEMM_MR 4
#define GEMM_NR 8
#define GEMM_KC 256
#define GEMM_MC 128
#endif
#define MR GEMM_MR
#define NR GEMM_NR

/* op(A) = Aᵀ is read in place up to this lda (floats); measured on a Zen 5
 * (2 threads), the small and 124M models' weight-gradient shapes: avx512
 * +4-10% at lda 512-2048, -1% at 8192; avx2 (6-row slivers, so three times
 * the pages per multiply-add) up to 27% slower at lda 2048: never */
#if defined(__AVX512F__)
#define GEMM_ADIRECT_LDA 4096
#else
#define GEMM_ADIRECT_LDA 0
#endif
/* op(A) = A stored M x K: full slivers read in place along A's rows (avx512
 * and avx2; the portable form packs) */
#if defined(__AVX512F__) || defined(__AVX2__)
#define GEMM_AROW 1
#else
#define GEMM_AROW 0
#endif
/* ... except, in the avx512 form, where A's row stride is a multiple of
 * KILN_L1_SET_PERIOD bytes (gemm_grid.h): the sliver's 14 rows then fall in
 * one set of the L1 data cache, more rows than it has ways. Zen 4 (2
 * threads), 2048 x 512 x 8192 NN (lda 8192): 153 GFLOP/s in place, 182
 * packed; at lda 512 and 1376 packing measured the same or up to 3% slower.
 * The avx2 form's 6 rows fit the ways: in place stays faster there. */
#if defined(__AVX512F__)
#define GEMM_AROW_ALIAS KILN_L1_SET_PERIOD
#else
#define GEMM_AROW_ALIAS 0
#endif

/* serial below this many multiply-adds */
#define GEMM_PAR_MIN (1 << 19)

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- micro-kernels: c[MR x NR] (row stride ldc) = alpha a.b (first) or
 * c + alpha a.b; a's element (i, k) at a[i ais + k as] (packed: ais 1, as
 * MR; read in place: see the driver), b: kc x NR packed ----------------- */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void ukernel(int64_t kc, const float *restrict a, int64_t as,
                                                          int64_t ais, const float *restrict b, float *c,
                                                          int64_t ldc, float alpha, bool first) {
    __m512 acc[MR][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        __asm__("" : "+v"(b0), "+v"(b1));
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i * ais]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += as;
        b += NR;
    }
    const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        __m512 r0 = _mm512_mul_ps(al, acc[i][0]), r1 = _mm512_mul_ps(al, acc[i][1]);
        if (!first) {
            r0 = _mm512_add_ps(_mm512_loadu_ps(c + i * ldc), r0);
            r1 = _mm512_add_ps(_mm512_loadu_ps(c + i * ldc + 16), r1);
        }
        _mm512_storeu_ps(c + i * ldc, r0);
        _mm512_storeu_ps(c + i * ldc + 16, r1);
    }
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) void ukernel(int64_t kc, const float *restrict a, int64_t as,
                                                          int64_t ais, const float *restrict b, float *c,
                                                          int64_t ldc, float alpha, bool first) {
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        __asm__("" : "+x"(b0), "+x"(b1));
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i * ais);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += as;
        b += NR;
    }
    const __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        __m256 r0 = _mm256_mul_ps(al, acc[i][0]), r1 = _mm256_mul_ps(al, acc[i][1]);
        if (!first) {
            r0 = _mm256_add_ps(_mm256_loadu_ps(c + i * ldc), r0);
            r1 = _mm256_add_ps(_mm256_loadu_ps(c + i * ldc + 8), r1);
        }
        _mm256_storeu_ps(c + i * ldc, r0);
        _mm256_storeu_ps(c + i * ldc + 8, r1);
    }
}
#else
/* GCC/clang vector extension: SSE2 on x86-64, whatever the target has
 * elsewhere; -ffp-contract=off keeps the multiply and the add separate. */
typedef float v4f __attribute__((vector_size(16)));
static inline v4f v4_load(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v4_store(float *p, v4f v) { memcpy(p, &v, sizeof v); }
static inline __attribute__((always_inline)) void ukernel(int64_t kc, const float *restrict a, int64_t as,
                                                          int64_t ais, const float *restrict b, float *c,
                                                          int64_t ldc, float alpha, bool first) {
    v4f acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = (v4f){0, 0, 0, 0};
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        v4f b0 = v4_load(b), b1 = v4_load(b + 4);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const float av = a[i * ais];
            v4f ai = (v4f){av, av, av, av};
            acc[i][0] = acc[i][0] + ai * b0;
            acc[i][1] = acc[i][1] + ai * b1;
        }
        a += as;
        b += NR;
    }
    const v4f al = {alpha, alpha, alpha, alpha};
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        v4f r0 = al * acc[i][0], r1 = al * acc[i][1];
        if (!first) {
            r0 = v4_load(c + i * ldc) + r0;
            r1 = v4_load(c + i * ldc + 4) + r1;
        }
        v4_store(c + i * ldc, r0);
        v4_store(c + i * ldc + 4, r1);
    }
}
#endif

/* A tile of mi x nj (< MR x NR) at c: the kernel into a scratch tile, then
 * the valid part, with the kernel's roundings (alpha acc, then the add). */
static void edge_tile(int64_t kc, const float *a, int64_t as, int64_t ais, const float *b, float *c, int64_t ldc,
                      float alpha, bool first, int64_t mi, int64_t nj) {
    float t[MR * NR] __attribute__((aligned(64)));
    ukernel(kc, a, as, ais, b, t, NR, alpha, true);
    for (int64_t i = 0; i < mi; i++)
        for (int64_t j = 0; j < nj; j++) c[i * ldc + j] = first ? t[i * NR + j] : c[i * ldc + j] + t[i * NR + j];
}

/* ---- packing -------------------------------------------------------------- */
/* The transposing cases (op(B) stored N x K, op(A) stored M x K) read rows
 * of the stored matrix and write columns of the sliver: the vector forms
 * load 16 (avx512) or 8 (avx2) rows of 16 / 8 consecutive k, transpose the
 * square in registers, and store one vector per k. */
#if defined(__AVX512F__)
/* r[i] (row i, 16 columns) -> r[c] (column c, 16 rows) */
static inline __attribute__((always_inline)) void tr16(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int g = 0; g < 4; g++) {
        __m512 lo01 = _mm512_unpacklo_ps(r[4 * g], r[4 * g + 1]), hi01 = _mm512_unpackhi_ps(r[4 * g], r[4 * g + 1]);
        __m512 lo23 = _mm512_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]),
               hi23 = _mm512_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
        /* u[4g + q]: in 128-bit lane j, rows 4g..4g+3 of column 4j + q */
        u[4 * g + 0] = _mm512_shuffle_ps(lo01, lo23, 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(lo01, lo23, 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(hi01, hi23, 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(hi01, hi23, 0xEE);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512 x0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88), x1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xDD);
        __m512 y0 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88), y1 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xDD);
        t[0 + q] = _mm512_shuffle_f32x4(x0, y0, 0x88);
        t[8 + q] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
        t[4 + q] = _mm512_shuffle_f32x4(x1, y1, 0x88);
        t[12 + q] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}
/* dst[k*ds + i] = src[i*ld + k] for i < ni (<= 16), k < nk (<= 16); lanes
 * i < wmask's bits are stored (rows past ni as zeros) */
static inline __attribute__((always_inline)) void tr_block(const float *src, int64_t ld, int64_t ni, int64_t nk,
                                                           float *dst, int64_t ds, __mmask16 wmask) {
    __m512 r[16];
    const __mmask16 km = (__mmask16)(nk >= 16 ? 0xFFFF : (1u << nk) - 1);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = i < ni ? _mm512_maskz_loadu_ps(km, src + i * ld) : _mm512_setzero_ps();
    tr16(r);
    for (int64_t k = 0; k < nk; k++) _mm512_mask_storeu_ps(dst + k * ds, wmask, r[k]);
}
#define GEMM_TR 16
#elif defined(__AVX2__)
/* dst[k*ds + i] = src[i*ld + k] for i < ni (<= 8), k < nk (<= 8); the
 * first w (6 or 8) lanes stored, rows past ni as zeros */
static inline __attribute__((always_inline)) void tr_block(const float *src, int64_t ld, int64_t ni, int64_t nk,
                                                           float *dst, int64_t ds, int w) {
    __m256 r[8];
    if (nk == 8) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) r[i] = i < ni ? _mm256_loadu_ps(src + i * ld) : _mm256_setzero_ps();
    } else {
        float tmp[8][8];
        for (int i = 0; i < 8; i++)
            for (int k = 0; k < 8; k++) tmp[i][k] = i < ni && k < nk ? src[i * ld + k] : 0.0f;
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(tmp[i]);
    }
    kiln_tr8(r);
    for (int64_t k = 0; k < nk; k++) {
        if (w == 8) {
            _mm256_storeu_ps(dst + k * ds, r[k]);
        } else { /* 6 */
            _mm_storeu_ps(dst + k * ds, _mm256_castps256_ps128(r[k]));
            _mm_storel_pi((__m64 *)(dst + k * ds + 4), _mm256_extractf128_ps(r[k], 1));
        }
    }
}
#define GEMM_TR 8
#endif

/* dst[k*NR + j] = op(B)[pc + k][j0 + j] for j < nj, 0 past it */
static void pack_b(bool transB, const float *B, int64_t ldb, int64_t pc, int64_t kc, int64_t j0, int64_t nj,
                   float *restrict dst) {
    if (!transB) {
        const float *src = B + pc * ldb + j0;
        if (nj == NR) {
            for (int64_t k = 0; k < kc; k++) memcpy(dst + k * NR, src + k * ldb, NR * sizeof(float));
        } else {
            for (int64_t k = 0; k < kc; k++) {
                memcpy(dst + k * NR, src + k * ldb, (size_t)nj * sizeof(float));
                memset(dst + k * NR + nj, 0, (size_t)(NR - nj) * sizeof(float));
            }
        }
        return;
    }
    const float *src = B + j0 * ldb + pc;
#if defined(GEMM_TR)
    /* NR / GEMM_TR column groups of GEMM_TR rows of the stored B */
    for (int64_t g = 0; g < NR / GEMM_TR; g++) {
        int64_t ng = imin(GEMM_TR, nj - g * GEMM_TR);
        for (int64_t k0 = 0; k0 < kc; k0 += GEMM_TR) {
#if defined(__AVX512F__)
            tr_block(src + g * GEMM_TR * ldb + k0, ldb, ng, imin(GEMM_TR, kc - k0), dst + k0 * NR + g * GEMM_TR, NR,
                     0xFFFF);
#else
            tr_block(src + g * GEMM_TR * ldb + k0, ldb, ng, imin(GEMM_TR, kc - k0), dst + k0 * NR + g * GEMM_TR, NR,
                     GEMM_TR);
#endif
        }
    }
#else
    int64_t k0 = 0;
    for (; k0 + 8 <= kc; k0 += 8) {
        for (int64_t j = 0; j < nj; j++) {
            const float *s = src + j * ldb + k0;
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) dst[(k0 + kk) * NR + j] = s[kk];
        }
    }
    for (int64_t j = 0; j < nj; j++)
        for (int64_t k = k0; k < kc; k++) dst[k * NR + j] = src[j * ldb + k];
    for (int64_t k = 0; k < kc; k++)
        for (int64_t j = nj; j < NR; j++) dst[k * NR + j] = 0.0f;
#endif
}

/* op(A) = Aᵀ, nsl (1 or 2) full slivers from row i0 of op(A), sliver s at
 * dst + s MR kc: nsl MR consecutive floats of each of A's rows in one pass.
 * Two at a time read each row's lines once where a sliver at a time reads
 * them twice: Zen 5, 2 threads, old and new kernels alternately (throwaway
 * driver): 8192 x 512 x 2048 TN (lda 8192, so packed) 339.5 -> 349.9 and
 * 357.6 -> 371.8 GFLOP/s, 50257 x 768 x 1024 TN 360.8 -> 369.6, 8192 x 2048
 * x 1024 TN 362.6 -> 368.6; the same bits. */
static inline __attribute__((always_inline)) void pack_at(const float *A, int64_t lda, int64_t i0, int64_t pc,
                                                          int64_t kc, const int nsl, float *restrict dst) {
    const float *src = A + pc * lda + i0;
    for (int64_t k = 0; k < kc; k++) {
        const float *s = src + k * lda;
        for (int sl = 0; sl < nsl; sl++)
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) dst[sl * MR * kc + k * MR + i] = s[sl * MR + i];
    }
}

/* dst[k*MR + i] = op(A)[i0 + i][pc + k] for i < mi, 0 past it */
static void pack_a(bool transA, const float *A, int64_t lda, int64_t i0, int64_t mi, int64_t pc, int64_t kc,
                   float *restrict dst) {
    if (transA && mi == MR) {
        pack_at(A, lda, i0, pc, kc, 1, dst);
        return;
    }
    if (transA) {
        const float *src = A + pc * lda + i0;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t i = 0; i < MR; i++) dst[k * MR + i] = i < mi ? src[k * lda + i] : 0.0f;
        return;
    }
    const float *src = A + i0 * lda + pc;
#if defined(__AVX512F__)
    for (int64_t k0 = 0; k0 < kc; k0 += 16)
        tr_block(src + k0, lda, mi, imin(16, kc - k0), dst + k0 * MR, MR, (__mmask16)((1u << MR) - 1));
#elif defined(__AVX2__)
    for (int64_t k0 = 0; k0 < kc; k0 += 8) tr_block(src + k0, lda, mi, imin(8, kc - k0), dst + k0 * MR, MR, MR);
#else
    int64_t k0 = 0;
    for (; k0 + 8 <= kc; k0 += 8) {
        for (int64_t i = 0; i < mi; i++) {
            const float *s = src + i * lda + k0;
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) dst[(k0 + kk) * MR + i] = s[kk];
        }
    }
    for (int64_t i = 0; i < mi; i++)
        for (int64_t k = k0; k < kc; k++) dst[k * MR + i] = src[i * lda + k];
    for (int64_t k = 0; k < kc; k++)
        for (int64_t i = mi; i < MR; i++) dst[k * MR + i] = 0.0f;
#endif
}

/* ---- driver --------------------------------------------------------------- */
#define GEMM_NCC 512       /* columns of a task at most */
#define GEMM_PANEL (4 << 20) /* bytes of B packed at once */
#define GEMM_ACACHE (2 << 20) /* a thread keeps its rows of A packed over all of K up to this */

/* what every task of one product shares */
typedef struct {
    bool transA, adirect, arow;
    int64_t lda, ldc;
    float alpha;
    const float *A;
    float *C;
} gemm_op;

/* One K block (pc, kc) of one task: the row slivers from ic (mc rows, msl
 * slivers) times the panel's column slivers ns0..ns1 (the panel starts at
 * column jc, nc columns, sliver s at bp0 + s kstride). ab: the packed A
 * block, packed here first unless pack_a_now is false. */
static void task_block(const gemm_op *g, int64_t ic, int64_t mc, int64_t msl, int64_t jc, int64_t nc, int64_t ns0,
                       int64_t ns1, int64_t pc, int64_t kc, bool first, float *ab, bool pack_a_now,
                       const float *bp0, int64_t kstride) {
    for (int64_t r = 0; r < msl && pack_a_now; r++)
        if (g->transA && !g->adirect && mc - (r + 1) * MR >= MR) { /* this sliver and the next, both full */
            pack_at(g->A, g->lda, ic + r * MR, pc, kc, 2, ab + r * MR * kc);
            r++;
        } else if (!(g->adirect || g->arow) || mc - r * MR < MR)
            pack_a(g->transA, g->A, g->lda, ic + r * MR, imin(MR, mc - r * MR), pc, kc, ab + r * MR * kc);
    const int64_t lda = g->lda, ldc = g->ldc;
    for (int64_t sl = ns0; sl < ns1; sl++) {
        const float *bp = bp0 + sl * kstride;
        const int64_t j = jc + sl * NR, nj = imin(NR, nc - sl * NR);
        for (int64_t r = 0; r < msl; r++) {
            const int64_t i = ic + r * MR, mi = imin(MR, mc - r * MR);
            float *c = g->C + i * ldc + j;
            /* the sliver: in place down A's columns (Aᵀ), in place along
             * A's rows, or packed (a partial one always) */
            const int how = mi < MR ? 0 : g->adirect ? 1 : g->arow ? 2 : 0;
            const float *ap = how == 1 ? g->A + pc * lda + i : how == 2 ? g->A + i * lda + pc : ab + r * MR * kc;
            if (mi == MR && nj == NR) {
                if (how == 1)
                    ukernel(kc, ap, lda, 1, bp, c, ldc, g->alpha, first);
                else if (how == 2)
                    ukernel(kc, ap, 1, lda, bp, c, ldc, g->alpha, first);
                else
                    ukernel(kc, ap, MR, 1, bp, c, ldc, g->alpha, first);
            } else
                edge_tile(kc, ap, how == 1 ? lda : how == 2 ? 1 : MR, how == 2 ? lda : 1, bp, c, ldc, g->alpha, first,
                          mi, nj);
        }
    }
}

bool kiln_k_gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if ((double)M * (double)N * (double)K < (double)GEMM_PAR_MIN) nt = 1;
    if (nt < 1) nt = 1;
    const int64_t nkb = cdiv(K, GEMM_KC), kcb = cdiv(K, nkb); /* K blocks, balanced: fixed by K */
    /* B panels of nsp slivers (at least 4), at most about GEMM_PANEL bytes:
     * over every K block where one such panel covers N (the all-K
     * schedule), else over one K block (the K-outer schedule) */
    int64_t nkp, nsp; /* K blocks and slivers in a panel */
    const bool kouter = kiln_gemm_panels(cdiv(N, NR), nkb, kcb * NR * 4, GEMM_PANEL, &nkp, &nsp);
    /* tasks of a panel: nm row chunks (whole MR slivers, at most about MC
     * rows) times nn column chunks (whole NR slivers, at most GEMM_NCC
     * columns), each over the panel's K blocks; at least about 4 per thread */
    const int64_t ms = cdiv(M, MR);
    int64_t nm = cdiv(ms, imax(1, GEMM_MC / MR)), nn = cdiv(nsp, GEMM_NCC / NR);
    kiln_gemm_task_grid(nt, ms, nsp, &nm, &nn);
    const int64_t mcp = cdiv(ms, nm) * MR; /* rows of the largest chunk */
    const bool acache = !kouter && (size_t)(nkb * kcb * mcp) * 4 <= GEMM_ACACHE;
    const int64_t ablk = acache ? kcb * mcp : 0; /* floats between the K blocks of the packed A */
    const size_t bsz = ((size_t)(nkp * kcb * nsp * NR) + 16) / 16 * 16,
                 asz = ((size_t)(kcb * mcp * (acache ? nkb : 1)) + 16) / 16 * 16;
    const size_t bytes = (bsz + asz * (size_t)nt) * sizeof(float);
    float *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!buf) return false;
    float *const bpack = buf, *const apack0 = buf + bsz;
    const bool acc0 = beta != 0.0f;
    /* op(A) = Aᵀ with A stored K x M: a full sliver (MR of A's columns) is
     * read in place, stride lda, instead of packed (avx512 form, lda up to
     * GEMM_ADIRECT_LDA: wider strides touch a page per k) */
    const bool adirect = transA && lda <= GEMM_ADIRECT_LDA;
    /* op(A) = A stored M x K (avx512, avx2): a full sliver is read in place
     * too, its rows lda apart (no transposing pack; +2-3% on the forward
     * and input-gradient shapes on a Zen 5), unless the rows alias in L1
     * (GEMM_AROW_ALIAS) */
    const bool arow = !transA && GEMM_AROW && !(GEMM_AROW_ALIAS && (lda * 4) % GEMM_AROW_ALIAS == 0);
    const gemm_op g = {.transA = transA, .adirect = adirect, .arow = arow, .lda = lda, .ldc = ldc,
                       .alpha = alpha, .A = A, .C = C};

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *const apack = apack0 + asz * (size_t)omp_get_thread_num();
        int64_t a_key = -1; /* what apack holds: a row chunk (all-K, acache) or a (K block, row chunk) */
        /* K-outer: the K blocks in order, each a sequence of panels; all-K:
         * one pass whose panels hold every K block */
        for (int64_t b0 = 0; b0 < nkb; b0 += nkp) {
            for (int64_t jc = 0; jc < N; jc += nsp * NR) {
                const int64_t nc = imin(nsp * NR, N - jc), ns = cdiv(nc, NR);
                /* the panel: its K block b (of nkp), sliver s at bpack + (b nsp + s) kcb NR */
#pragma omp for schedule(dynamic, 4)
                for (int64_t item = 0; item < nkp * ns; item++) {
                    const int64_t b = item / ns, sl = item % ns, pc = (b0 + b) * kcb, kc = imin(kcb, K - pc);
                    pack_b(transB, B, ldb, pc, kc, jc + sl * NR, imin(NR, nc - sl * NR),
                           bpack + (b * nsp + sl) * kcb * NR);
                }
                /* (implicit barrier: the panel is packed) */
#pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < nm * nn; task++) {
                    int64_t ms0, ic, mc, msl, ns0, ns1;
                    if (!kiln_gemm_task(task, nm, nn, ms, ns, MR, M, &ms0, &ic, &mc, &msl, &ns0, &ns1)) continue;
                    const int64_t key = kiln_gemm_a_key(kouter, acache, b0, ms, ms0);
                    const bool a_ready = key >= 0 && a_key == key;
                    a_key = key;
                    /* every element: C = alpha acc (first K block, beta 0)
                     * or C + alpha acc, K block after K block: the bits
                     * depend on K alone, not on the schedule */
                    for (int64_t b = 0; b < nkp; b++) {
                        const int64_t pc = (b0 + b) * kcb, kc = imin(kcb, K - pc);
                        task_block(&g, ic, mc, msl, jc, nc, ns0, ns1, pc, kc, pc == 0 && !acc0, apack + b * ablk,
                                   !a_ready, bpack + b * nsp * kcb * NR, kcb * NR);
                    }
                }
                /* (implicit barrier: the panel is free for the next one) */
            }
        }
    }
    free(buf);
    return true;
}
