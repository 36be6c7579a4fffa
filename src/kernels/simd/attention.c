/* Flash attention on CPU: causal, padding-masked, grouped-query attention
 * that never forms the T×Tk score matrix; optionally block-diagonal over
 * segment ids (packed documents), skipping the tiles no query can see.
 *
 * Tiles are BQ queries × BK keys. K (and, in the backward, V) is first
 * transposed once into key blocks laid out [D][BK] (zero-padded past the last
 * key), so that a score tile is a register-blocked product broadcasting one
 * query element against 64 consecutive keys; that beats calling the GEMM
 * library per 64×64 tile, whose per-call cost is of the order of the tile's
 * own work. Products that end in D-wide rows (P·V, Pᵀ·dO, dS·K, dSᵀ·Q) use a
 * second kernel vectorised over D.
 *
 * Determinism: every output element is written by one task whose loop order
 * does not depend on the thread count, so results are bitwise identical for
 * any number of threads. The backward runs one task per (batch, kv head,
 * part of the key blocks): the part count comes from the shape alone (about
 * 32 tasks, so that few heads still fill the threads), each task owns its
 * key blocks' dk and dv and adds its dq contributions to a copy of dq of
 * its own, and dq is the sum of the copies in part order; every tile's S
 * and dP are computed once.
 */
#include <string.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiln/kernels.h"
#include "amx.h"
#include "simd_tr.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define KILN_ATT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define BQ 64
#define BK 64
/* Row-block height of the micro-kernels: with AVX-512, 6 rows × 4 vectors of
 * accumulators plus 4 loaded vectors fit the 32 zmm registers; with AVX2, 6
 * rows × 2 vectors plus 2 loaded and one broadcast fit the 16 ymm ones. */
#define MR 6

/* ---- micro-kernels ------------------------------------------------------ */

/* C[r*BK + c] = sum_d A[r*lda + d] * Bt[d*BK + c] for r < nr, c < nc (nc a
 * multiple of 16, at most BK: a causal tile's rows need only their visible
 * keys' columns; the others are left as they were). */
#ifdef KILN_ATT_AVX512
static inline __attribute__((always_inline)) void nt_rows(const float *A, int64_t lda,
                                                          const float *Bt, int64_t D, float *C,
                                                          const int R, const int NV) {
    __m512 acc[MR][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        const float *b = Bt + d * BK;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            bv[v] = _mm512_load_ps(b + 16 * v);
            /* stop gcc from re-loading b as a memory operand of every FMA:
             * that makes the kernel load-bound */
            __asm__("" : "+v"(bv[v]));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 a = _mm512_set1_ps(A[r * lda + d]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_store_ps(C + r * BK + 16 * v, acc[r][v]);
}

#define NT_ROWS(NV)                                                                      \
    do {                                                                                 \
        int64_t r = 0;                                                                   \
        for (; r + MR <= nr; r += MR) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, MR, NV); \
        if (r + 4 <= nr) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, 4, NV), r += 4;       \
        for (; r < nr; r++) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, 1, NV);            \
    } while (0)

static void mk_nt(const float *A, int64_t lda, const float *Bt, int64_t D, float *C, int64_t nr, int64_t nc) {
    switch (nc / 16) {
    case 4: NT_ROWS(4); break;
    case 3: NT_ROWS(3); break;
    case 2: NT_ROWS(2); break;
    case 1: NT_ROWS(1); break;
    }
}
#undef NT_ROWS

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
}

/* C[r*ldc + c] += sum_k A[r*sar + k*sak] * B[k*ldb + c] for rows r < R,
 * columns c in [0, 16*NV) of one 64-wide column chunk (masked by m when
 * MASKED: a chunk of fewer than 64 columns; full chunks load and store
 * without masks, which measured faster on Zen 5). */
static inline __attribute__((always_inline)) void acc_rows(const float *A, int64_t sar,
                                                           int64_t sak, const float *B,
                                                           int64_t ldb, float *C, int64_t ldc,
                                                           int64_t nk, const __mmask16 *m,
                                                           const int R, const int NV, const int MASKED) {
#define ACC_LD(p, v) (MASKED ? _mm512_maskz_loadu_ps(m[v], (p)) : _mm512_loadu_ps(p))
    __m512 acc[MR][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = ACC_LD(C + r * ldc + 16 * v, v);
    for (int64_t k = 0; k < nk; k++) {
        const float *b = B + k * ldb;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            bv[v] = ACC_LD(b + 16 * v, v);
            __asm__("" : "+v"(bv[v]));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 a = _mm512_set1_ps(A[r * sar + k * sak]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
        }
    }
#undef ACC_LD
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            if (MASKED)
                _mm512_mask_storeu_ps(C + r * ldc + 16 * v, m[v], acc[r][v]);
            else
                _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
        }
}

#define ACC_ROWS(NV, MASKED)                                                                   \
    do {                                                                                       \
        int64_t r = 0;                                                                         \
        for (; r + MR <= nr; r += MR)                                                          \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, m, MR, NV, MASKED); \
        if (r + 4 <= nr)                                                                       \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, m, 4, NV, MASKED), r += 4; \
        for (; r < nr; r++)                                                                    \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, m, 1, NV, MASKED); \
    } while (0)

/* C[r*ldc + c] += sum_{k<nk} A[r*sar + k*sak] * B[k*ldb + c], r < nr, c < D. */
static void mk_acc(const float *A, int64_t sar, int64_t sak, const float *B, int64_t ldb, float *C,
                   int64_t ldc, int64_t nr, int64_t nk, int64_t D) {
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
        int64_t left = D - c0;
        __mmask16 m[4] = {tail_mask(left), tail_mask(left - 16), tail_mask(left - 32),
                          tail_mask(left - 48)};
        if (left >= 64) {
            ACC_ROWS(4, 0);
            continue;
        }
        switch ((left + 15) / 16) {
        case 1: ACC_ROWS(1, 1); break;
        case 2: ACC_ROWS(2, 1); break;
        case 3: ACC_ROWS(3, 1); break;
        }
    }
}
#undef ACC_ROWS
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 + FMA (16 ymm registers): blocks of R <= 6 rows × 16 columns, 12
 * accumulators, 2 loaded vectors and one broadcast. */
static inline __attribute__((always_inline)) void nt_rows(const float *A, int64_t lda,
                                                          const float *Bt, int64_t D, float *C,
                                                          int64_t nc, const int R) {
    for (int64_t c0 = 0; c0 < nc; c0 += 16) {
        __m256 acc[MR][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            const float *b = Bt + d * BK + c0;
            __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
            __asm__("" : "+x"(b0), "+x"(b1));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 a = _mm256_broadcast_ss(A + r * lda + d);
                acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(C + r * BK + c0, acc[r][0]);
            _mm256_storeu_ps(C + r * BK + c0 + 8, acc[r][1]);
        }
    }
}

static void mk_nt(const float *A, int64_t lda, const float *Bt, int64_t D, float *C, int64_t nr, int64_t nc) {
    int64_t r = 0;
    for (; r + MR <= nr; r += MR) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, nc, MR);
    if (r + 4 <= nr) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, nc, 4), r += 4;
    if (r + 2 <= nr) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, nc, 2), r += 2;
    for (; r < nr; r++) nt_rows(A + r * lda, lda, Bt, D, C + r * BK, nc, 1);
}

/* C[r*ldc + c] += sum_k A[r*sar + k*sak] * B[k*ldb + c] for rows r < R and
 * the 8*NV columns of one chunk (its last vector masked by mk when MASKED). */
static inline __attribute__((always_inline)) void acc_rows(const float *A, int64_t sar,
                                                           int64_t sak, const float *B,
                                                           int64_t ldb, float *C, int64_t ldc,
                                                           int64_t nk, __m256i mk, const int R,
                                                           const int NV, const int MASKED) {
    __m256 acc[MR][2];
#define ACC_LD(p, v) (MASKED && (v) == NV - 1 ? _mm256_maskload_ps((p), mk) : _mm256_loadu_ps(p))
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) acc[r][v] = ACC_LD(C + r * ldc + 8 * v, v);
    for (int64_t k = 0; k < nk; k++) {
        const float *b = B + k * ldb;
        __m256 bv[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            bv[v] = ACC_LD(b + 8 * v, v);
            __asm__("" : "+x"(bv[v]));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * sar + k * sak);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(a, bv[v], acc[r][v]);
        }
    }
#undef ACC_LD
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            if (MASKED && v == NV - 1)
                _mm256_maskstore_ps(C + r * ldc + 8 * v, mk, acc[r][v]);
            else
                _mm256_storeu_ps(C + r * ldc + 8 * v, acc[r][v]);
        }
}

#define ACC_ROWS(NV, MASKED)                                                                       \
    do {                                                                                           \
        int64_t r = 0;                                                                             \
        for (; r + MR <= nr; r += MR)                                                              \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, mk, MR, NV, MASKED); \
        if (r + 4 <= nr)                                                                           \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, mk, 4, NV, MASKED), r += 4; \
        if (r + 2 <= nr)                                                                           \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, mk, 2, NV, MASKED), r += 2; \
        for (; r < nr; r++)                                                                        \
            acc_rows(A + r * sar, sar, sak, B + c0, ldb, C + r * ldc + c0, ldc, nk, mk, 1, NV, MASKED); \
    } while (0)

/* C[r*ldc + c] += sum_{k<nk} A[r*sar + k*sak] * B[k*ldb + c], r < nr, c < D. */
static void mk_acc(const float *A, int64_t sar, int64_t sak, const float *B, int64_t ldb, float *C,
                   int64_t ldc, int64_t nr, int64_t nk, int64_t D) {
    const __m256i full = _mm256_set1_epi32(-1);
    int64_t c0 = 0;
    for (; c0 + 16 <= D; c0 += 16) {
        const __m256i mk = full;
        ACC_ROWS(2, 0);
    }
    if (c0 + 8 <= D) {
        const __m256i mk = full;
        ACC_ROWS(1, 0);
        c0 += 8;
    }
    if (c0 < D) {
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(D - c0)),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        ACC_ROWS(1, 1);
    }
}
#undef ACC_ROWS
#else /* portable versions */
static void mk_nt(const float *A, int64_t lda, const float *Bt, int64_t D, float *C, int64_t nr, int64_t nc) {
    for (int64_t r = 0; r < nr; r++) {
        float *c = C + r * BK;
        for (int64_t j = 0; j < nc; j++) c[j] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            float a = A[r * lda + d];
            const float *b = Bt + d * BK;
#pragma omp simd
            for (int64_t j = 0; j < nc; j++) c[j] += a * b[j];
        }
    }
}

static void mk_acc(const float *A, int64_t sar, int64_t sak, const float *B, int64_t ldb, float *C,
                   int64_t ldc, int64_t nr, int64_t nk, int64_t D) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t k = 0; k < nk; k++) {
            float a = A[r * sar + k * sak];
            const float *b = B + k * ldb;
            float *c = C + r * ldc;
#pragma omp simd
            for (int64_t j = 0; j < D; j++) c[j] += a * b[j];
        }
}
#endif

/* ---- shared helpers ------------------------------------------------------ */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* One key block: s [nk][D] (rows D apart) -> o [D][BK], zero past nk. */
static void transpose_block(const float *s, int64_t nk, int64_t D, float *o) {
#if defined(__AVX2__)
    if (nk == BK && D % 8 == 0) { /* 8 x 8 blocks in registers */
        for (int64_t c0 = 0; c0 < BK; c0 += 8)
            for (int64_t d0 = 0; d0 < D; d0 += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + (c0 + i) * D + d0);
                kiln_tr8(r);
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + (d0 + j) * BK + c0, r[j]);
            }
        return;
    }
#endif
    for (int64_t d = 0; d < D; d++) {
        float *od = o + d * BK;
        for (int64_t c = 0; c < nk; c++) od[c] = s[c * D + d];
        for (int64_t c = nk; c < BK; c++) od[c] = 0.0f;
    }
}

/* src [B*Hkv][Tk][D] -> dst [B*Hkv][nkb][D][BK], zero past Tk. */
static void transpose_blocks(const float *src, float *dst, int64_t BH, int64_t Tk, int64_t D) {
    int64_t nkb = cdiv(Tk, BK);
#pragma omp parallel for schedule(static) if (BH * Tk * D > (1 << 15))
    for (int64_t t = 0; t < BH * nkb; t++) {
        int64_t bh = t / nkb, kb = t % nkb, j0 = kb * BK;
        transpose_block(src + (bh * Tk + j0) * D, Tk - j0 < BK ? Tk - j0 : BK, D, dst + t * D * BK);
    }
}

/* True when key block [j0, j0+nk) of batch row `pad` holds no real key. */
static bool block_all_pad(const int32_t *pad, int64_t j0, int64_t nk) {
    if (!pad) return false;
    for (int64_t c = 0; c < nk; c++)
        if (pad[j0 + c]) return false;
    return true;
}

static bool block_has_pad(const int32_t *pad, int64_t j0, int64_t nk) {
    if (!pad) return false;
    for (int64_t c = 0; c < nk; c++)
        if (!pad[j0 + c]) return true;
    return false;
}

/* A key block's padding bias: -inf on padded keys, 0 on the others and past
 * nk. pad is read only where the block has padding: the one loop that read
 * it under a has_pad mask (vectorised by gcc as masked loads, all lanes off
 * without padding) still formed addresses from pad, NULL there, and on Zen 5
 * a masked load whose masked-off lanes fall on an unmapped page takes a slow
 * assist: an eighth of the forward's softmax time (perf, bench/attention). */
static void pad_bias(float *bias, const int32_t *pad, bool has_pad, int64_t j0, int64_t nk) {
    if (!has_pad) {
        for (int64_t c = 0; c < BK; c++) bias[c] = 0.0f;
        return;
    }
    for (int64_t c = 0; c < BK; c++) bias[c] = c < nk && !pad[j0 + c] ? -INFINITY : 0.0f;
}

/* Number of visible leading keys of the block for query at absolute position
 * qpos (causal part only), clamped to [0, nk]. */
static int64_t causal_limit(int64_t qpos, int64_t j0, int64_t nk) {
    int64_t lim = qpos - j0 + 1;
    return lim < 0 ? 0 : lim > nk ? nk : lim;
}

/* A tile on the causal diagonal (its first query, at qpos0, does not see
 * the whole key block) is done in groups of TRIM_ROWS rows, each over the
 * keys its last row sees: the products skip the masked upper triangle but
 * for a group's staircase (at T = 256, 4 of the 10 tiles per head are
 * diagonal; a diagonal tile costs 40/64 of a full one). Only exact zeros
 * are skipped (P and dS are 0 past a row's causal limit, and the softmax
 * loops mask, by selection, whatever the skipped columns of S and dP hold). */
#define TRIM_ROWS 16

static bool tile_full(int64_t qpos0, int64_t j0, int64_t nk) { return causal_limit(qpos0, j0, nk) == nk; }

/* S (BK-strided rows) = A·Bt for the tile's nr rows: every row's visible
 * columns, rounded up to 16 */
static void nt_tile(const float *A, int64_t lda, const float *Bt, int64_t D, float *S, int64_t nr, int64_t qpos0,
                    int64_t j0, int64_t nk) {
    if (tile_full(qpos0, j0, nk)) {
        mk_nt(A, lda, Bt, D, S, nr, BK);
        return;
    }
    for (int64_t r0 = 0; r0 < nr; r0 += TRIM_ROWS) {
        const int64_t rn = nr - r0 < TRIM_ROWS ? nr - r0 : TRIM_ROWS, need = causal_limit(qpos0 + r0 + rn - 1, j0, nk);
        if (need > 0) mk_nt(A + r0 * lda, lda, Bt, D, S + r0 * BK, rn, (need + 15) & ~(int64_t)15);
    }
}

/* C's nr query rows += P·B (P's rows BK apart), each over its visible keys */
static void acc_tile_rows(const float *P, const float *B, int64_t ldb, float *C, int64_t ldc, int64_t nr, int64_t nk,
                          int64_t D, int64_t qpos0, int64_t j0) {
    if (tile_full(qpos0, j0, nk)) {
        mk_acc(P, BK, 1, B, ldb, C, ldc, nr, nk, D);
        return;
    }
    for (int64_t r0 = 0; r0 < nr; r0 += TRIM_ROWS) {
        const int64_t rn = nr - r0 < TRIM_ROWS ? nr - r0 : TRIM_ROWS, need = causal_limit(qpos0 + r0 + rn - 1, j0, nk);
        if (need > 0) mk_acc(P + r0 * BK, BK, 1, B, ldb, C + r0 * ldc, ldc, rn, need, D);
    }
}

/* C's nk key rows += Pᵀ·B (B's rows are the tile's queries), each key over
 * the queries that see it: a group of keys from the first query that sees
 * its first key */
static void acc_tile_keys(const float *P, const float *B, int64_t ldb, float *C, int64_t ldc, int64_t nr, int64_t nk,
                          int64_t D, int64_t qpos0, int64_t j0) {
    if (tile_full(qpos0, j0, nk)) {
        mk_acc(P, 1, BK, B, ldb, C, ldc, nk, nr, D);
        return;
    }
    for (int64_t c0 = 0; c0 < nk; c0 += TRIM_ROWS) {
        const int64_t cn = nk - c0 < TRIM_ROWS ? nk - c0 : TRIM_ROWS;
        int64_t rs = c0 + j0 - qpos0; /* the first row with causal_limit > c0 */
        rs = rs < 0 ? 0 : rs;
        if (rs < nr) mk_acc(P + rs * BK + c0, 1, BK, B + rs * ldb, ldb, C + c0 * ldc, ldc, cn, nr - rs, D);
    }
}

/* Sliding window W (0: none): a query at qpos sees keys j > qpos - W. The
 * first visible column of the block for that query, clamped to [0, nk]. */
static int64_t window_start(int64_t W, int64_t qpos, int64_t j0, int64_t nk) {
    if (!W) return 0;
    int64_t lo = qpos - W + 1 - j0;
    return lo < 0 ? 0 : lo > nk ? nk : lo;
}

/* Is the whole key block [j0, j0+nk) before the window of every query from
 * qpos0 on? (Such a tile is skipped, as foreign segments are.) */
static bool before_window(int64_t W, int64_t qpos0, int64_t j0, int64_t nk) { return W && j0 + nk - 1 <= qpos0 - W; }

/* ---- segments ----------------------------------------------------------- */
/* Per (batch row, key block): the smallest and largest segment id of its
 * real keys (min > max when it has none). A query sees a key only with its
 * own segment, so a tile whose queries all have segments outside the key
 * block's range is fully masked and skipped; packed documents have
 * contiguous segments, so this skips exactly the blocks of other documents. */
typedef struct {
    const int32_t *seg; /* [B, Tk] or NULL */
    int32_t *kmin, *kmax;
} seg_info;

static bool seg_ranges(seg_info *si, const int32_t *seg, const int32_t *pad, int64_t B, int64_t Tk, int64_t nkb) {
    si->seg = seg;
    si->kmin = si->kmax = NULL;
    if (!seg) return true;
    si->kmin = malloc((size_t)(2 * B * nkb + 1) * sizeof(int32_t));
    if (!si->kmin) return false;
    si->kmax = si->kmin + B * nkb;
    for (int64_t b = 0; b < B; b++)
        for (int64_t kb = 0; kb < nkb; kb++) {
            int32_t lo = INT32_MAX, hi = INT32_MIN;
            for (int64_t j = kb * BK; j < Tk && j < (kb + 1) * BK; j++) {
                if (pad && !pad[b * Tk + j]) continue;
                int32_t v = seg[b * Tk + j];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            si->kmin[b * nkb + kb] = lo;
            si->kmax[b * nkb + kb] = hi;
        }
    return true;
}

/* For queries [i0, i0+nr) (key positions off+i0..) of row b against key
 * block kb: 0 = no query's segment is in the block's range (skip), 1 = all
 * queries and keys in one segment (no segment masking), 2 = mixed. */
static int seg_tile(const seg_info *si, int64_t b, int64_t Tk, int64_t nkb, int64_t qpos0, int64_t nr, int64_t kb) {
    if (!si->seg) return 1;
    const int32_t lo = si->kmin[b * nkb + kb], hi = si->kmax[b * nkb + kb];
    const int32_t *sq = si->seg + b * Tk + qpos0;
    bool any = false, all_one = lo == hi;
    for (int64_t r = 0; r < nr; r++) {
        bool in = sq[r] >= lo && sq[r] <= hi;
        any |= in;
        all_one &= sq[r] == lo;
    }
    if (!any) return 0;
    if (!all_one) return 2;
    /* one segment on both sides only if every real key has it; padding
     * keys are masked by the pad path */
    return 1;
}

/* ---- bf16 products on AMX tiles or VDPBF16PS ----------------------------- *
 * With bf16 set (the scores' and the output's products were bf16 ones under
 * autocast) and a native bf16 product (AMX tiles where kiln_bf16_amx, else
 * VDPBF16PS where the CPU has AVX512-BF16 and the avx512 form is active),
 * every product of a tile runs on TDPBF16PS or VDPBF16PS with fp32
 * accumulation, its operands rounded to bf16 as eager's bf16 products round
 * theirs: q, k, v and dout, and the probabilities P and their gradient dS
 * before the products that read them; the softmax and its bookkeeping stay
 * fp32 as in the fp32 kernel. Both take the same operand forms; only the
 * tile product differs (amx_mm, dp_mm). Without either (bf16 emulated, or D
 * not a multiple of 32) the fp32 kernel runs, with no rounding. The operand forms, built once per
 * call, zero past T and Tk:
 *   rows   bf16 [BQ][D] per query block (q, dout: the A of S = q·kᵀ, dP)
 *   cols   bf16 [D][BQ] per query block (qᵀ, doutᵀ: the A of dkᵀ, dvᵀ)
 *   pairs  words [D/2][BK] per key block, word (p, j) = (x[j][2p], x[j][2p+1])
 *          (k, v: the B of S and dP)
 *   inter  words [BK/2][D] per key block, word (p, d) = (x[2p][d], x[2p+1][d])
 *          (v, k: the B of P·v and dS·k)
 * and per tile P and dS as rows (the A of P·v, dS·k) or interleaved pairs of
 * rows (the B of doutᵀ·P = dvᵀ and qᵀ·dS = dkᵀ): the backward accumulates
 * dkᵀ and dvᵀ of a key block in a [D][BK] buffer of its own and transposes
 * them once, so no tile is transposed. */
#if KILN_AMX && defined(KILN_ATT_AVX512)
#define ATT_AMX 1
/* The conversions run VCVTNE2PS2BF16 / VCVTNEPS2BF16 (the AMX path implies
 * AVX512-BF16): round to nearest even, denormal inputs to zeros of their
 * sign (the instructions' rule, as in kiln_k_f32_to_bf16). */
#define BF_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
/* 32 floats -> 32 bf16 (16 words: element 2i low, 2i+1 high) */
BF_TARGET static inline __m512i cvt32(const float *x) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}
/* words (x0[i], x1[i]) for 16 i */
BF_TARGET static inline __m512i pair16(const float *x0, const float *x1) {
    const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x0)));
    const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x1)));
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}
/* n valid rows of x (row stride D, D % 32 == 0) -> dst [R][D] bf16, zero
 * rows past n */
BF_TARGET static void form_rows(const float *x, int64_t n, int64_t R, int64_t D, uint16_t *dst) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t d = 0; d < D; d += 32)
            _mm512_storeu_si512((void *)(dst + r * D + d), r < n ? cvt32(x + r * D + d) : _mm512_setzero_si512());
}
/* -> dst [R/2][D] words, word (p, d) = (x[2p][d], x[2p+1][d]), zero rows
 * past n (D % 16 == 0) */
BF_TARGET static void form_inter(const float *x, int64_t n, int64_t R, int64_t D, uint32_t *dst) {
    static const float zero[16] = {0};
    for (int64_t p = 0; p < R / 2; p++) {
        const float *x0 = x + 2 * p * D, *x1 = x0 + D;
        const bool h0 = 2 * p < n, h1 = 2 * p + 1 < n;
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_si512((void *)(dst + p * D + d), pair16(h0 ? x0 + d : zero, h1 ? x1 + d : zero));
    }
}
/* -> dst [D/2][R] words, word (p, j) = (x[j][2p], x[j][2p+1]), zero past n
 * (R % 16 == 0, D % 32 == 0): row j's bf16 pairs, transposed 16 x 16 */
BF_TARGET static void form_pairs(const float *x, int64_t n, int64_t R, int64_t D, uint32_t *dst) {
    for (int64_t j0 = 0; j0 < R; j0 += 16)
        for (int64_t p0 = 0; p0 < D / 2; p0 += 16) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = j0 + i < n ? cvt32(x + (j0 + i) * D + 2 * p0) : _mm512_setzero_si512();
            kiln_tr16_epi32(r);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) _mm512_storeu_si512((void *)(dst + (p0 + c) * R + j0), r[c]);
        }
}
/* -> dst [D][R] bf16 (the transpose; as words [D][R/2], word (d, p) =
 * (x[2p][d], x[2p+1][d])), zero columns past n (R % 32 == 0, D % 16 == 0) */
BF_TARGET static void form_cols(const float *x, int64_t n, int64_t R, int64_t D, uint16_t *dst16) {
    static const float zero[16] = {0};
    uint32_t *dst = (uint32_t *)(void *)dst16;
    for (int64_t p0 = 0; p0 < R / 2; p0 += 16)
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const int64_t j = 2 * (p0 + i);
                r[i] = pair16(j < n ? x + j * D + d0 : zero, j + 1 < n ? x + (j + 1) * D + d0 : zero);
            }
            kiln_tr16_epi32(r);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) _mm512_storeu_si512((void *)(dst + (d0 + c) * (R / 2) + p0), r[c]);
        }
}

/* dst [nk][D] = the transpose of srcT [D][BK] (its first nk columns), in
 * 16 x 16 blocks (D % 16 == 0) */
static void store_transposed(float *dst, const float *srcT, int64_t nk, int64_t D) {
    for (int64_t d0 = 0; d0 < D; d0 += 16)
        for (int64_t j0 = 0; j0 < nk; j0 += 16) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(srcT + (d0 + i) * BK + j0));
            kiln_tr16_epi32(r);
            for (int64_t c = 0; c < 16 && j0 + c < nk; c++) {
                _mm512_storeu_ps(dst + (j0 + c) * D + d0, _mm512_castsi512_ps(r[c]));
            }
        }
}

/* C [R][N] (ldc floats) = or += A [R][KD] (bf16 rows, lda) . B [KD/2][N]
 * (words, ldb): the row groups of 16 below rv (rows past it are left), N a
 * multiple of 32, KD of 32; up to 4 accumulator tiles at a time */
static void amx_mm(float *C, int64_t ldc, bool acc, const uint16_t *A, int64_t lda, const uint32_t *B, int64_t ldb,
                   int64_t rv, int64_t N, int64_t KD) {
    for (int64_t g = 0; g * 16 < rv; g++) {
        const uint16_t *a = A + g * 16 * lda;
        float *c = C + g * 16 * ldc;
        for (int64_t n0 = 0; n0 < N; n0 += 64) {
            const bool four = N - n0 >= 64;
            float *cn = c + n0;
            if (acc) {
                AMX_LOAD(0, cn, ldc * 4);
                AMX_LOAD(1, cn + 16, ldc * 4);
                if (four) {
                    AMX_LOAD(2, cn + 32, ldc * 4);
                    AMX_LOAD(3, cn + 48, ldc * 4);
                }
            } else {
                AMX_ZERO(0);
                AMX_ZERO(1);
                AMX_ZERO(2);
                AMX_ZERO(3);
            }
            for (int64_t k0 = 0; k0 < KD; k0 += 32) {
                const uint32_t *b = B + (k0 / 2) * ldb + n0;
                AMX_LOAD(4, a + k0, lda * 2);
                AMX_LOAD(6, b, ldb * 4);
                AMX_LOAD(7, b + 16, ldb * 4);
                AMX_DP(0, 4, 6);
                AMX_DP(1, 4, 7);
                if (four) {
                    AMX_LOAD(6, b + 32, ldb * 4);
                    AMX_LOAD(7, b + 48, ldb * 4);
                    AMX_DP(2, 4, 6);
                    AMX_DP(3, 4, 7);
                }
            }
            AMX_STORE(0, cn, ldc * 4);
            AMX_STORE(1, cn + 16, ldc * 4);
            if (four) {
                AMX_STORE(2, cn + 32, ldc * 4);
                AMX_STORE(3, cn + 48, ldc * 4);
            }
        }
    }
}

/* The product of amx_mm on VDPBF16PS, for AVX512-BF16 CPUs without AMX:
 * C rows below rv only (rows past it are left), 6 rows x 64 columns of
 * accumulators at a time; each instruction adds to a lane the two products
 * of a bf16 pair, the pair of A broadcast, B's words as they are. */
BF_TARGET static inline __attribute__((always_inline)) void dp_rows(float *C, int64_t ldc, bool acc, const uint16_t *A,
                                                                    int64_t lda, const uint32_t *B, int64_t ldb,
                                                                    int64_t KP, const int R, const int NV) {
    __m512 c[MR][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t p = 0; p < KP; p++) {
        __m512i bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            bv[v] = _mm512_loadu_si512((const void *)(B + p * ldb + 16 * v));
            __asm__("" : "+v"(bv[v])); /* loaded once, not an operand of every instruction */
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            uint32_t w;
            memcpy(&w, A + r * lda + 2 * p, sizeof w);
            const __m512i a = _mm512_set1_epi32((int)w);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)bv[v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
}

#define DP_ROWS(NV)                                                                                  \
    do {                                                                                             \
        int64_t r = 0;                                                                               \
        for (; r + MR <= rv; r += MR) dp_rows(c + r * ldc, ldc, acc, A + r * lda, lda, b, ldb, KP, MR, NV); \
        switch (rv - r) {                                                                            \
        case 5: dp_rows(c + r * ldc, ldc, acc, A + r * lda, lda, b, ldb, KP, 5, NV); break;          \
        case 4: dp_rows(c + r * ldc, ldc, acc, A + r * lda, lda, b, ldb, KP, 4, NV); break;          \
        case 3: dp_rows(c + r * ldc, ldc, acc, A + r * lda, lda, b, ldb, KP, 3, NV); break;          \
        case 2: dp_rows(c + r * ldc, ldc, acc, A + r * lda, lda, b, ldb, KP, 2, NV); break;          \
        case 1: dp_rows(c + r * ldc, ldc, acc, A + r * lda, lda, b, ldb, KP, 1, NV); break;          \
        }                                                                                            \
    } while (0)

BF_TARGET static void dp_mm(float *C, int64_t ldc, bool acc, const uint16_t *A, int64_t lda, const uint32_t *B,
                            int64_t ldb, int64_t rv, int64_t N, int64_t KD) {
    const int64_t KP = KD / 2;
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        float *c = C + n0;
        const uint32_t *b = B + n0;
        if (N - n0 >= 64)
            DP_ROWS(4);
        else /* N is a multiple of 32 */
            DP_ROWS(2);
    }
}
#undef DP_ROWS

/* a tile's product on AMX tiles or on VDPBF16PS */
static void tile_mm(bool amx, float *C, int64_t ldc, bool acc, const uint16_t *A, int64_t lda, const uint32_t *B,
                    int64_t ldb, int64_t rv, int64_t N, int64_t KD) {
    if (amx)
        amx_mm(C, ldc, acc, A, lda, B, ldb, rv, N, KD);
    else
        dp_mm(C, ldc, acc, A, lda, B, ldb, rv, N, KD);
}

/* The causal trim of the VDPBF16PS products, as nt_tile and acc_tile_rows
 * trim the fp32 ones: a tile on the diagonal runs in groups of TRIM_ROWS
 * query rows, each over the keys its last row sees (rounded up to what
 * dp_mm takes: 32 columns, a pair of keys). On AMX tiles the whole tile is
 * computed: AMX works in groups of 16 rows x 32 keys, and no machine here
 * has had AMX to measure a trim on. dvᵀ and dkᵀ (keys as columns, queries
 * as K) are not trimmed: in halves of 32 keys, each from the first query
 * that sees it, the narrower kernel ate the saving (8 x 8 x 256 backward
 * 6.67-7.01 ms untrimmed, 6.74-6.93 trimmed, alternating on a Zen 4). */

/* S [nr][BK] = A·B (A the queries' bf16 rows, B the key block's pairs):
 * a group's columns past the keys it sees are left as they were (the
 * softmax loops mask them by selection; past nk only columns beyond what
 * the trimmed P·v and dS·k read) */
static void tile_scores(bool amx, float *S, const uint16_t *A, int64_t lda, const uint32_t *B, int64_t nr, int64_t D,
                        int64_t qpos0, int64_t j0, int64_t nk) {
    if (amx || tile_full(qpos0, j0, nk)) {
        tile_mm(amx, S, BK, false, A, lda, B, BK, nr, BK, D);
        return;
    }
    for (int64_t r0 = 0; r0 < nr; r0 += TRIM_ROWS) {
        const int64_t rn = nr - r0 < TRIM_ROWS ? nr - r0 : TRIM_ROWS, need = causal_limit(qpos0 + r0 + rn - 1, j0, nk);
        if (need > 0) dp_mm(S + r0 * BK, BK, false, A + r0 * lda, lda, B, BK, rn, (need + 31) & ~(int64_t)31, D);
    }
}

/* C's nr rows = (acc: +=) P·B over the tile's keys (P bf16 rows BK apart,
 * B the key block's inter words): a group over the key pairs it sees (P
 * is zero past a row's causal limit; a group that sees none is stored as
 * it was, or as zeros) */
static void tile_rows_acc(bool amx, float *C, int64_t ldc, bool acc, const uint16_t *P, const uint32_t *B, int64_t ldb,
                          int64_t nr, int64_t N, int64_t qpos0, int64_t j0, int64_t nk) {
    if (amx || tile_full(qpos0, j0, nk)) {
        tile_mm(amx, C, ldc, acc, P, BK, B, ldb, nr, N, BK);
        return;
    }
    for (int64_t r0 = 0; r0 < nr; r0 += TRIM_ROWS) {
        const int64_t rn = nr - r0 < TRIM_ROWS ? nr - r0 : TRIM_ROWS, need = causal_limit(qpos0 + r0 + rn - 1, j0, nk);
        dp_mm(C + r0 * ldc, ldc, acc, P + r0 * BK, BK, B, ldb, rn, N, (need + 1) & ~(int64_t)1);
    }
}
#else
#define ATT_AMX 0
#endif

/* ---- prefetching the next key block ---------------------------------------- */
/* The next key block's kᵀ and v lines (fp32 products) that a run of rows
 * fetches into L2 while its softmax runs: share i of n issues its part of
 * the lines [k0, k1) of kᵀ and [v0, v1) of v, a few per row rather than
 * in one burst (on a Xeon, `perf` put a third of the softmax's samples on
 * the prefetches of a burst of 128). */
typedef struct {
    const char *k, *v;
    int64_t k0, k1, v0, v1;
} att_prefetch;

static inline void prefetch_share(const att_prefetch *pf, int64_t i, int64_t n) {
    if (!pf || !pf->k) return;
    const int64_t nk = pf->k1 - pf->k0, nv = pf->v1 - pf->v0;
    for (int64_t z = pf->k0 + i * nk / n; z < pf->k0 + (i + 1) * nk / n; z++) __builtin_prefetch(pf->k + 64 * z, 0, 2);
    for (int64_t z = pf->v0 + i * nv / n; z < pf->v0 + (i + 1) * nv / n; z++) __builtin_prefetch(pf->v + 64 * z, 0, 2);
}

/* ---- the softmax of a full tile row (AVX2) -------------------------------- */
#if defined(__AVX2__) && defined(__FMA__)
#define KILN_ATT_ROW8 1
#include "simd_exp.h"
static inline __attribute__((unused)) float hmax8(__m256 v) { /* unused in the avx512 form */
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline __attribute__((unused)) float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* Lanes c .. c+7 of a row whose visible keys are lo <= c < lim (and, with
 * segments sk, those of the query's segment sq): all ones where visible */
static inline __m256 vis8(int64_t c, int64_t lim, int64_t lo, const int32_t *sk, int32_t sq) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)lo), idx),
                                     _mm256_cmpgt_epi32(_mm256_set1_epi32((int)lim), idx));
    if (sk)
        in = _mm256_and_si256(in, _mm256_cmpeq_epi32(_mm256_loadu_si256((const __m256i *)(sk + c)), _mm256_set1_epi32(sq)));
    return _mm256_castsi256_ps(in);
}

/* A partly visible row of the forward (a tile on the causal diagonal, a
 * window's edge, padding), 8 keys at a time while 8 remain: s ← s·sc + bias
 * where visible, −inf elsewhere, and *mx the running max (a NaN skipped, as
 * the scalar loop skips it); returns the keys done. gcc leaves the scalar
 * loop with its selection scalar. */
static inline int64_t masked_scores8(float *s, const float *bias, int64_t nk, int64_t lim, int64_t lo,
                                     const int32_t *sk, int32_t sq, float sc, float *mx) {
    const __m256 vs = _mm256_set1_ps(sc), ninf = _mm256_set1_ps(-INFINITY);
    __m256 m = ninf;
    int64_t c = 0;
    for (; c + 8 <= nk; c += 8) {
        __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + c), vs), _mm256_loadu_ps(bias + c));
        x = _mm256_blendv_ps(ninf, x, vis8(c, lim, lo, sk, sq));
        _mm256_storeu_ps(s + c, x);
        m = _mm256_max_ps(x, m);
    }
    const float hm = hmax8(m);
    *mx = hm > *mx ? hm : *mx;
    return c;
}

/* The forward's partly visible row after masked_scores8: s ← exp(s − mu)
 * 8 keys at a time while 8 remain, their sum in *sum (lanes, then the
 * fixed tree of hsum8; the scalar loop adds the rest); returns the keys done */
static inline int64_t exp_sum8(float *s, int64_t nk, float mu, float *sum) {
    const __m256 vmu = _mm256_set1_ps(mu);
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= nk; c += 8) {
        const __m256 p = kiln_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), vmu));
        _mm256_storeu_ps(s + c, p);
        acc = _mm256_add_ps(acc, p);
    }
    *sum = hsum8(acc);
    return c;
}

/* The backward's partly visible row, 8 keys at a time while 8 remain:
 * p = exp(s·sc − L + bias), s ← p and dp ← p·(dp − dl) where visible, 0
 * elsewhere (whatever s and dp held there); the scalar loop's operations,
 * so its bits; returns the keys done. */
static inline int64_t masked_probs8(float *s, float *dp, const float *bias, int64_t nk, int64_t lim, int64_t lo,
                                    const int32_t *sk, int32_t sq, float sc, float L, float dl) {
    const __m256 vs = _mm256_set1_ps(sc), vL = _mm256_set1_ps(L), vdl = _mm256_set1_ps(dl);
    int64_t c = 0;
    for (; c + 8 <= nk; c += 8) {
        const __m256 x = _mm256_add_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(s + c), vs), vL), _mm256_loadu_ps(bias + c));
        const __m256 p = kiln_exp8(x), vis = vis8(c, lim, lo, sk, sq);
        const __m256 pd = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + c), vdl));
        _mm256_storeu_ps(s + c, _mm256_and_ps(p, vis));
        _mm256_storeu_ps(dp + c, _mm256_and_ps(pd, vis));
    }
    return c;
}

/* One row of BK scores with every key visible: s ← exp(s·sc − m_new),
 * updating the running max *m and sum *l; returns the factor that rescales
 * the row's output so far. The generic loops below do the same with
 * horizontal reductions the compiler spills through memory, a chain of
 * dependent loads per row that cost a fifth of the forward. */
#if defined(__AVX512F__)
/* 16 lanes where the form has AVX-512: twice the exponentials per
 * instruction (kiln_exp16_le0: kiln_exp8's bits down to e^-86.5); the
 * row's max and sum reduce in the intrinsics' fixed tree */
static inline float full_row(float *s, float sc, float *m, float *l) {
    __m512 x[BK / 16];
    const __m512 vs = _mm512_set1_ps(sc);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < BK / 16; i++) {
        x[i] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * i), vs);
        mx = _mm512_max_ps(x[i], mx); /* a NaN score is skipped, as by the scalar max */
    }
    const float rmax = _mm512_reduce_max_ps(mx), mnew = rmax > *m ? rmax : *m;
    const float mu = mnew == -INFINITY ? 0.0f : mnew;
    const float alpha = kiln_expf_fast(*m - mu);
    const __m512 vmu = _mm512_set1_ps(mu);
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < BK / 16; i++) {
        const __m512 p = kiln_exp16_le0(_mm512_sub_ps(x[i], vmu));
        _mm512_storeu_ps(s + 16 * i, p);
        sum = _mm512_add_ps(sum, p);
    }
    *l = *l * alpha + _mm512_reduce_add_ps(sum);
    *m = mnew;
    return alpha;
}

/* A row of a tile that sees keys [0, lim) only (causal: a tile on the
 * diagonal, or the last, partial key block), without padding, segments or a
 * window, on 16 lanes over the columns [0, ncol) the products read (ncol a
 * multiple of 16 within what they computed): s ← s·sc, −inf from lim on,
 * then as full_row. The 8-lane loops it replaces ran over all of the tile's
 * keys. */
static inline float causal_row16(float *s, int64_t ncol, int64_t lim, float sc, float *m, float *l) {
    const __m512 vs = _mm512_set1_ps(sc), ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx = ninf;
    for (int64_t c = 0; c < ncol; c += 16) {
        const __m512 x = _mm512_mask_mul_ps(ninf, tail_mask(lim - c), _mm512_loadu_ps(s + c), vs);
        _mm512_storeu_ps(s + c, x);
        mx = _mm512_max_ps(x, mx); /* a NaN score is skipped, as by the scalar max */
    }
    const float rmax = _mm512_reduce_max_ps(mx), mnew = rmax > *m ? rmax : *m;
    const float mu = mnew == -INFINITY ? 0.0f : mnew;
    const float alpha = kiln_expf_fast(*m - mu);
    const __m512 vmu = _mm512_set1_ps(mu);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < ncol; c += 16) {
        const __m512 p = _mm512_maskz_mov_ps(tail_mask(lim - c), kiln_exp16_le0(_mm512_sub_ps(_mm512_loadu_ps(s + c), vmu)));
        _mm512_storeu_ps(s + c, p);
        sum = _mm512_add_ps(sum, p);
    }
    *l = *l * alpha + _mm512_reduce_add_ps(sum);
    *m = mnew;
    return alpha;
}

/* Sixteen rows' lane vectors v[r] reduced together, halves first: lane i
 * with i + 8, then i + 4, i + 2 and i + 1 (_mm512_reduce_add_ps's tree, so
 * the same sums bit for bit as full_row), 30 shuffles for the 16 rows where
 * one row alone takes 6 dependent steps; returns lane r = row r's result. */
#define ROWS16_REDUCE(OP, v, out)                                                                         \
    do {                                                                                                  \
        __m512 w_[8], x_[4], y_[2];                                                                       \
        for (int p_ = 0; p_ < 8; p_++) /* (rows 2p, 2p+1) x 8 lanes */                                    \
            w_[p_] = OP(_mm512_shuffle_f32x4(v[2 * p_], v[2 * p_ + 1], _MM_SHUFFLE(3, 2, 3, 2)),           \
                        _mm512_shuffle_f32x4(v[2 * p_], v[2 * p_ + 1], _MM_SHUFFLE(1, 0, 1, 0)));          \
        for (int q_ = 0; q_ < 4; q_++) /* 128-bit chunk k: row 4q+k x 4 lanes */                          \
            x_[q_] = OP(_mm512_shuffle_f32x4(w_[2 * q_], w_[2 * q_ + 1], _MM_SHUFFLE(3, 1, 3, 1)),         \
                        _mm512_shuffle_f32x4(w_[2 * q_], w_[2 * q_ + 1], _MM_SHUFFLE(2, 0, 2, 0)));        \
        for (int t_ = 0; t_ < 2; t_++) /* chunk k: rows 8t+k and 8t+4+k x 2 lanes */                      \
            y_[t_] = OP(_mm512_shuffle_ps(x_[2 * t_], x_[2 * t_ + 1], _MM_SHUFFLE(1, 0, 1, 0)),            \
                        _mm512_shuffle_ps(x_[2 * t_], x_[2 * t_ + 1], _MM_SHUFFLE(3, 2, 3, 2)));           \
        /* chunk k, lane u: row k + 4u; back to row order */                                              \
        const __m512 z_ = OP(_mm512_shuffle_ps(y_[0], y_[1], _MM_SHUFFLE(2, 0, 2, 0)),                     \
                             _mm512_shuffle_ps(y_[0], y_[1], _MM_SHUFFLE(3, 1, 3, 1)));                    \
        (out) = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z_); \
    } while (0)

/* full_row on sixteen rows at once (every key of the tile visible to each,
 * no padding, sc > 0): the rows' maxima and sums reduced together (ROWS16_REDUCE)
 * and their running max, scale alpha and sum updated on 16 lanes (kiln_exp16
 * gives kiln_expf_fast's bits, kiln_exp16_le0 full_row's), so the same results as full_row row by row
 * without its per-row chain of horizontal steps and scalar exponential;
 * alpha[r] gets each row's rescale factor. */
static inline void full_rows16(float *S, float sc, float *m, float *l, float *alpha, const att_prefetch *pf) {
    const __m512 vs = _mm512_set1_ps(sc);
    __m512 v[16];
    for (int r = 0; r < 16; r++) {
        const float *s = S + r * BK;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int i = 0; i < BK / 16; i++) mx = _mm512_max_ps(_mm512_loadu_ps(s + 16 * i), mx);
        v[r] = mx;
    }
    /* max(s·sc) = max(s)·sc: sc > 0 and rounding is monotonic */
    __m512 rmax;
    ROWS16_REDUCE(_mm512_max_ps, v, rmax);
    rmax = _mm512_mul_ps(rmax, vs);
    const __m512 mold = _mm512_loadu_ps(m), mnew = _mm512_max_ps(rmax, mold);
    const __m512 mu = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mnew, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ), mnew);
    const __m512 va = kiln_exp16(_mm512_sub_ps(mold, mu));
    float mus[16];
    _mm512_storeu_ps(mus, mu);
    for (int r = 0; r < 16; r++) {
        float *s = S + r * BK;
        prefetch_share(pf, r, 16);
        const __m512 vmu = _mm512_set1_ps(mus[r]);
        __m512 sum = _mm512_setzero_ps();
        for (int i = 0; i < BK / 16; i++) {
            const __m512 p = kiln_exp16_le0(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + 16 * i), vs), vmu));
            _mm512_storeu_ps(s + 16 * i, p);
            sum = _mm512_add_ps(sum, p);
        }
        v[r] = sum;
    }
    __m512 rsum;
    ROWS16_REDUCE(_mm512_add_ps, v, rsum);
    _mm512_storeu_ps(l, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l), va), rsum));
    _mm512_storeu_ps(m, mnew);
    _mm512_storeu_ps(alpha, va);
}
#else
static inline float full_row(float *s, float sc, float *m, float *l) {
    __m256 x[BK / 8];
    const __m256 vs = _mm256_set1_ps(sc);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < BK / 8; i++) {
        x[i] = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * i), vs);
        mx = _mm256_max_ps(x[i], mx); /* a NaN score is skipped, as by the scalar max */
    }
    const float rmax = hmax8(mx), mnew = rmax > *m ? rmax : *m;
    const float mu = mnew == -INFINITY ? 0.0f : mnew;
    const float alpha = kiln_expf_fast(*m - mu);
    const __m256 vmu = _mm256_set1_ps(mu);
    __m256 sum = _mm256_setzero_ps();
    for (int i = 0; i < BK / 8; i++) {
        const __m256 p = kiln_exp8(_mm256_sub_ps(x[i], vmu));
        _mm256_storeu_ps(s + 8 * i, p);
        sum = _mm256_add_ps(sum, p);
    }
    *l = *l * alpha + hsum8(sum);
    *m = mnew;
    return alpha;
}
#endif
#endif

/* ---- forward ------------------------------------------------------------ */

/* the keys and values the forward's threads work on at a time: half of a
 * 2 MB L2 (Xeon), all of a 1 MB one (Zen 4 and 5) */
#define HEADS_BYTES ((int64_t)1 << 20)

typedef struct {
    const float *q, *v;
    const int32_t *pad;
    float *out, *lse;
    int64_t H, Hkv, T, Tk, D, nkb;
    float scale;
    seg_info si;
    int64_t window;
    /* bf16 on AMX: q's rows per query block, k's pairs and v's inter per
     * key block (NULL: the fp32 products) */
    const uint16_t *qh;
    const uint32_t *kp, *vi;
    int64_t nqb;
    bool amx; /* the bf16 products on AMX tiles (else VDPBF16PS) */
} fwd_args;

/* Out of memory: nothing sensible to return but NaN (rows of D outputs and
 * their lse). */
static void fwd_nan(float *out, float *lse, int64_t rows, int64_t D) {
    for (int64_t i = 0; i < rows * D; i++) out[i] = NAN;
    for (int64_t i = 0; i < rows; i++) lse[i] = NAN;
}

/* A row of the output accumulated so far times the softmax's rescale
 * factor alpha (nothing to do at 1) */
static inline void rescale_row(float *orow, int64_t D, float alpha) {
    if (alpha == 1.0f) return;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) orow[d] *= alpha;
}

/* One (b, h, query block): online softmax over the visible key blocks,
 * accumulating into the task's own rows of out. */
static void fwd_task(const fwd_args *a, int64_t b, int64_t h, int64_t qb, const float *ktb, float *S, float *m,
                     float *l, float *bias, float *obuf, uint16_t *ph) {
    const int64_t D = a->D, T = a->T, Tk = a->Tk, off = Tk - T;
    const int64_t g = h / (a->H / a->Hkv);
    const int64_t i0 = qb * BQ, nr = T - i0 < BQ ? T - i0 : BQ;
    const float *q = a->q + ((b * a->H + h) * T + i0) * D;
    float *const out = a->out + ((b * a->H + h) * T + i0) * D;
#if ATT_AMX
    /* bf16: the output accumulates in obuf (all BQ rows: the AMX tiles'
     * row groups; rows below nr are zeroed with o below), P in ph (each
     * key block's form_rows writes all of it, rows past nr as zeros) */
    const bool bf = a->qh != NULL;
    float *o = bf ? obuf : out;
    const uint16_t *qh = bf ? a->qh + ((b * a->H + h) * a->nqb + qb) * BQ * D : NULL;
    if (bf && nr < BQ) memset(obuf + nr * D, 0, (size_t)((BQ - nr) * D) * sizeof(float));
#else
    (void)obuf, (void)ph;
    float *o = out;
#endif
    const int32_t *pad = a->pad ? a->pad + b * Tk : NULL;
    const float *vb = a->v + (b * a->Hkv + g) * Tk * D;
    memset(o, 0, (size_t)(nr * D) * sizeof(float));
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0.0f;
    int64_t jend = off + i0 + nr; /* keys < jend may be visible to some row */
    if (jend > Tk) jend = Tk;
    const int32_t *sg = a->si.seg ? a->si.seg + b * Tk : NULL;
    for (int64_t kb = 0; kb * BK < jend; kb++) {
        const int64_t j0 = kb * BK, nk = Tk - j0 < BK ? Tk - j0 : BK;
        if (block_all_pad(pad, j0, nk)) continue;
        const int st = seg_tile(&a->si, b, Tk, a->nkb, off + i0, nr, kb);
        if (!st) continue; /* another document's keys */
        if (before_window(a->window, off + i0, j0, nk)) continue; /* out of every query's window */
        const bool has_pad = block_has_pad(pad, j0, nk), mixed = st == 2;
        /* zeros without padding: branch-free loops below, which gcc
         * vectorises where it does not a conditional load of the bias */
        pad_bias(bias, pad, has_pad, j0, nk);
#if ATT_AMX
        if (bf)
            tile_scores(a->amx, S, qh, D, a->kp + ((b * a->Hkv + g) * a->nkb + kb) * (D / 2) * BK, nr, D, off + i0, j0, nk);
        else
#endif
            nt_tile(q, D, ktb + kb * D * BK, D, S, nr, off + i0, j0, nk);
        /* the next key block's kᵀ and v (fp32 products), fetched while this
         * one's rows go through the softmax, a share of the lines per row */
        const int64_t nkn = (kb + 1) * BK < jend ? (Tk - j0 - BK < BK ? Tk - j0 - BK : BK) : 0;
        const char *const pk = ktb && nkn ? (const char *)(ktb + (kb + 1) * D * BK) : NULL;
        const char *const pv = pk ? (const char *)(vb + (j0 + BK) * D) : NULL;
        const int64_t lk = pk ? D * BK * (int64_t)sizeof(float) / 64 : 0, lv = pk ? nkn * D * (int64_t)sizeof(float) / 64 : 0;
#if ATT_AMX
        const bool whole_tiles = bf && a->amx; /* AMX products read every column of P */
#else
        const bool whole_tiles = false;
#endif
        (void)whole_tiles;
        int64_t r16 = 0; /* rows done sixteen at a time */
#ifdef KILN_ATT_AVX512
        if (a->scale > 0.0f && !mixed && !has_pad && nk == BK && tile_full(off + i0, j0, nk) &&
            !window_start(a->window, off + i0 + nr - 1, j0, nk))
            for (; r16 + 16 <= nr; r16 += 16) {
                const att_prefetch pf = {pk, pv, r16 * lk / nr, (r16 + 16) * lk / nr, r16 * lv / nr, (r16 + 16) * lv / nr};
                float al[16];
                full_rows16(S + r16 * BK, a->scale, m + r16, l + r16, al, &pf);
                for (int64_t r = r16; r < r16 + 16; r++) rescale_row(o + r * D, D, al[r - r16]);
            }
#endif
        for (int64_t r = r16; r < nr; r++) {
            float *s = S + r * BK;
            const att_prefetch pf = {pk, pv, 0, lk, 0, lv};
            prefetch_share(&pf, r, nr);
            const int64_t lim = causal_limit(off + i0 + r, j0, nk), lo = window_start(a->window, off + i0 + r, j0, nk);
            const float sc = a->scale;
            float alpha;
#ifdef KILN_ATT_ROW8
            if (!mixed && !has_pad && lim == BK && nk == BK && !lo) {
                alpha = full_row(s, sc, &m[r], &l[r]);
                goto rescale;
            }
#endif
#ifdef KILN_ATT_AVX512
            if (!mixed && !has_pad && !lo && !whole_tiles) {
                /* the products read the tile's nk columns, or on the
                 * diagonal the keys of the row's group's last row */
                const int64_t rl = r - r % TRIM_ROWS + TRIM_ROWS < nr ? r - r % TRIM_ROWS + TRIM_ROWS - 1 : nr - 1;
                const int64_t need = tile_full(off + i0, j0, nk) ? nk : causal_limit(off + i0 + rl, j0, nk);
                alpha = causal_row16(s, (need + 15) & ~(int64_t)15, lim, sc, &m[r], &l[r]);
                goto rescale;
            }
#endif
            float mx = -INFINITY;
            if (mixed) { /* block-diagonal: keys of the query's own segment only */
                const int32_t sq = sg[off + i0 + r], *sk = sg + j0;
                int64_t c0 = 0;
#ifdef KILN_ATT_ROW8
                c0 = masked_scores8(s, bias, nk, lim, lo, sk, sq, sc, &mx);
#endif
#pragma omp simd reduction(max : mx)
                for (int64_t c = c0; c < nk; c++) {
                    float x = s[c] * sc + bias[c];
                    x = ((c < lim) & (c >= lo) & (sk[c] == sq)) ? x : -INFINITY;
                    s[c] = x;
                    mx = x > mx ? x : mx;
                }
            } else if (lim == nk && !has_pad && !lo) {
#pragma omp simd reduction(max : mx)
                for (int64_t c = 0; c < nk; c++) {
                    float x = s[c] * sc;
                    s[c] = x;
                    mx = x > mx ? x : mx;
                }
            } else {
                int64_t c0 = 0;
#ifdef KILN_ATT_ROW8
                c0 = masked_scores8(s, bias, nk, lim, lo, NULL, 0, sc, &mx);
#endif
#pragma omp simd reduction(max : mx)
                for (int64_t c = c0; c < nk; c++) {
                    float x = s[c] * sc + bias[c];
                    x = ((c < lim) & (c >= lo)) ? x : -INFINITY;
                    s[c] = x;
                    mx = x > mx ? x : mx;
                }
            }
            if (mx == -FLT_MAX) mx = kiln_row_max(s, nk); /* clang's reduction start: see kiln_row_max */
            const float mnew = mx > m[r] ? mx : m[r];
            const float mu = mnew == -INFINITY ? 0.0f : mnew;
            alpha = kiln_expf_fast(m[r] - mu);
            float sum = 0.0f;
            int64_t c1 = 0;
#ifdef KILN_ATT_ROW8
            c1 = exp_sum8(s, nk, mu, &sum);
#endif
#pragma omp simd reduction(+ : sum)
            for (int64_t c = c1; c < nk; c++) {
                float p = kiln_expf_fast(s[c] - mu);
                s[c] = p;
                sum += p;
            }
            l[r] = l[r] * alpha + sum;
            m[r] = mnew;
#ifdef KILN_ATT_ROW8
        rescale:
#endif
            rescale_row(o + r * D, D, alpha);
        }
#if ATT_AMX
        if (bf) { /* P rounded to bf16, then o += P·v */
            form_rows(S, nr, BQ, BK, ph); /* past nk: q·0 = 0 (a trimmed tile: columns past a group's keys unread) */
            tile_rows_acc(a->amx, o, D, true, ph, a->vi + ((b * a->Hkv + g) * a->nkb + kb) * (BK / 2) * D, D, nr, D, off + i0,
                          j0, nk);
            continue;
        }
#endif
        acc_tile_rows(S, vb + j0 * D, D, o, D, nr, nk, D, off + i0, j0);
    }
    float *lse = a->lse + (b * a->H + h) * T + i0;
    for (int64_t r = 0; r < nr; r++) {
        const float *orow = o + r * D;
        float *dst = out + r * D;
        if (l[r] > 0.0f) {
            const float inv = 1.0f / l[r];
#pragma omp simd
            for (int64_t d = 0; d < D; d++) dst[d] = orow[d] * inv;
            lse[r] = m[r] + logf(l[r]);
        } else {
            memset(dst, 0, (size_t)D * sizeof(float));
            lse[r] = -INFINITY;
        }
    }
}

void kiln_k_flash_attn(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                       float *out, float *lse, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                       int64_t Tk, int64_t D, float scale) {
    kiln_k_flash_attn_seg(q, k, v, pad_mask, NULL, out, lse, B, H, Hkv, T, Tk, D, scale);
}

void kiln_k_flash_attn_seg(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                           const int32_t *seg, float *out, float *lse, int64_t B, int64_t H, int64_t Hkv,
                           int64_t T, int64_t Tk, int64_t D, float scale) {
    kiln_k_flash_attn_win(q, k, v, pad_mask, seg, out, lse, B, H, Hkv, T, Tk, D, scale, 0);
}

void kiln_k_flash_attn_win(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                           const int32_t *seg, float *out, float *lse, int64_t B, int64_t H, int64_t Hkv,
                           int64_t T, int64_t Tk, int64_t D, float scale, int64_t window) {
    kiln_k_flash_attn_ex(q, k, v, pad_mask, seg, out, lse, B, H, Hkv, T, Tk, D, scale, window, false);
}

/* this call's bf16 products: 2 on AMX tiles, 1 on VDPBF16PS, 0 none (the
 * fp32 products) */
static int bf16_path(bool bf16, int64_t D) {
#if ATT_AMX
    if (!bf16 || D % 32) return 0;
    return kiln_bf16_amx() ? 2 : kiln_bf16_native() ? 1 : 0;
#else
    (void)bf16, (void)D;
    return 0;
#endif
}

void kiln_k_flash_attn_ex(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                          const int32_t *seg, float *out, float *lse, int64_t B, int64_t H, int64_t Hkv,
                          int64_t T, int64_t Tk, int64_t D, float scale, int64_t window, bool bf16) {
    if (B <= 0 || H <= 0 || T <= 0 || D <= 0) return;
    const int64_t nkb = cdiv(Tk, BK), nqb = cdiv(T, BQ);
    const int path = bf16_path(bf16, D);
    const bool bf = path > 0; /* the bf16 forms (products on AMX or VDPBF16PS) */
    /* the fp32 kernel's k blocks [D][BK], or the bf16 forms: q's rows, k's
     * pairs, v's inter */
    const size_t fp32_kt = (size_t)(B * Hkv * nkb * D * BK) * sizeof(float);
    const size_t nq16 = (size_t)(B * H * nqb * BQ * D), nkv32 = (size_t)(B * Hkv * nkb * BK * D / 2);
    void *kt = nkb ? kiln_alloc(bf ? nq16 * 2 + 2 * nkv32 * 4 : fp32_kt) : NULL;
    seg_info si;
    bool seg_ok = seg_ranges(&si, seg, pad_mask, B, Tk, nkb);
    if ((nkb && !kt) || !seg_ok) { /* out of memory: nothing sensible to return but NaN */
        fwd_nan(out, lse, B * H * T, D);
        kiln_dealloc(kt);
        free(si.kmin);
        return;
    }
    fwd_args a = {q, v, pad_mask, out, lse, H, Hkv, T, Tk, D, nkb, scale, si, window, NULL, NULL, NULL, nqb, path == 2};
#if ATT_AMX
    if (bf && nkb) {
        uint32_t *kp = (uint32_t *)kt, *vi = kp + nkv32;
        uint16_t *qh = (uint16_t *)(vi + nkv32);
#pragma omp parallel for schedule(static) if (B * Hkv * Tk * D > (1 << 15))
        for (int64_t t = 0; t < B * Hkv * nkb; t++) {
            const int64_t bh = t / nkb, kb = t % nkb, j0 = kb * BK, nk = Tk - j0 < BK ? Tk - j0 : BK;
            form_pairs(k + (bh * Tk + j0) * D, nk, BK, D, kp + t * BK * D / 2);
            form_inter(v + (bh * Tk + j0) * D, nk, BK, D, vi + t * BK * D / 2);
        }
#pragma omp parallel for schedule(static) if (B * H * T * D > (1 << 15))
        for (int64_t t = 0; t < B * H * nqb; t++) {
            const int64_t bh = t / nqb, qb = t % nqb, i0 = qb * BQ;
            form_rows(q + (bh * T + i0) * D, T - i0 < BQ ? T - i0 : BQ, BQ, D, qh + t * BQ * D);
        }
        a.qh = qh, a.kp = kp, a.vi = vi;
    }
#endif
    /* (making each (b, kv head)'s kᵀ blocks inside a task per pair, in its
     * scratch, measured no faster on a Zen 3 at 8 x 8 x 256 and 1 x 8 x 4096) */
    if (!a.qh && kt) transpose_blocks(k, kt, B * Hkv, Tk, D);
    const int64_t ntask = B * H * nqb, grp = H / Hkv;
    int64_t hg = Tk > 0 ? HEADS_BYTES / (Tk * D * 2 * (int64_t)sizeof(float)) : B * H; /* a head's fp32 keys and values */
    hg = hg < 1 ? 1 : hg > B * H ? B * H : hg;
    bool failed = false;
#pragma omp parallel if (ntask > 1 && T * Tk * D * B * H > (1 << 16))
    {
        const size_t nscr = BQ * BK + 2 * BQ + BK + (bf ? BQ * D + BQ * BK / 2 : 0);
        float *S = kiln_alloc(nscr * sizeof(float));
        float *m = NULL, *l = NULL, *bias = NULL, *obuf = NULL;
        uint16_t *ph = NULL;
        if (S) {
            m = S + BQ * BK, l = m + BQ, bias = l + BQ, obuf = bf ? bias + BK : NULL;
            ph = bf ? (uint16_t *)(obuf + BQ * D) : NULL;
        } else {
#pragma omp atomic write
            failed = true;
        }
#if ATT_AMX
        if (path == 2) kiln_amx_config();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            if (!S) continue;
            /* groups of hg heads whose keys and values fit HEADS_BYTES,
             * one group after another, and in each the heaviest (last,
             * causal) query blocks first: the threads read the same keys
             * and values at about the same time. Taking the heaviest
             * blocks of every head first ran the 1 x 8 x 4096 forward
             * 6-8% slower on a Xeon (2 MB of keys and values a head: one
             * head a group there); one head a group at 8 x 8 x 256 ran
             * that shape 10% slower. */
            const int64_t gi = t / (hg * nqb), r = t % (hg * nqb), nh = B * H - gi * hg < hg ? B * H - gi * hg : hg;
            const int64_t bh = gi * hg + r % nh, qb = nqb - 1 - r / nh, b = bh / H, g = (bh % H) / grp;
            fwd_task(&a, b, bh % H, qb, kt && !a.qh ? (const float *)kt + (b * Hkv + g) * nkb * D * BK : NULL, S, m,
                     l, bias, obuf, ph);
        }
#if ATT_AMX
        if (path == 2) kiln_amx_release();
#endif
        kiln_dealloc(S);
    }
    if (failed) { /* a thread's scratch: out of memory */
        fwd_nan(out, lse, B * H * T, D);
    }
    kiln_dealloc(kt);
    free(si.kmin);
}

/* ---- backward ----------------------------------------------------------- */

typedef struct {
    const float *q, *k, *v, *dout, *lse, *delta;
    const int32_t *pad;
    float *dq, *dk, *dv;
    int64_t H, Hkv, T, Tk, D, nkb, nqb;
    float scale;
    seg_info si;
    int64_t window;
    /* bf16 on AMX (NULL: the fp32 products): q and dout as rows and as
     * columns per query block, k's and v's pairs, k's inter per key block */
    const uint16_t *qh, *qc, *dh, *dc;
    const uint32_t *kp, *vp, *ki;
    bool amx; /* the bf16 products on AMX tiles (else VDPBF16PS) */
} bwd_args;

/* a thread's scratch for the backward's tiles */
typedef struct {
    float *S, *dP;
    float *kt, *vt;        /* fp32: the key block's kᵀ and vᵀ [D][BK] */
    float *dq, *dkT, *dvT; /* AMX: a tile's dq rows, the key block's dkᵀ and dvᵀ */
    uint32_t *pi, *dsi;    /* AMX: P and dS as interleaved pairs of rows */
    uint16_t *dsh;         /* AMX: dS as bf16 rows */
} bwd_scratch;

/* Does query block qb see any key of key block kb (ignoring padding)?
 * 0 no, 1 yes, 2 yes with segment masking inside the tile. */
static int tile_visible(const bwd_args *a, int64_t b, int64_t qb, int64_t kb) {
    int64_t i0 = qb * BQ, nr = a->T - i0 < BQ ? a->T - i0 : BQ;
    if (a->Tk - a->T + i0 + nr - 1 < kb * BK) return 0;
    const int64_t j0 = kb * BK, nk = a->Tk - j0 < BK ? a->Tk - j0 : BK;
    if (before_window(a->window, a->Tk - a->T + i0, j0, nk)) return 0;
    return seg_tile(&a->si, b, a->Tk, a->nkb, a->Tk - a->T + i0, nr, kb);
}

/* One tile (b, h, qb) × kb: recompute P, form dS = P∘(dP − delta), and add
 * the tile's contributions to whichever of dq (unscaled), dk (unscaled), dv
 * are asked for. S and dP are BQ×BK scratch. bf16: first_kv, the key
 * block's first tile, stores into its dkᵀ and dvᵀ instead of adding. */
static void bwd_tile(const bwd_args *a, int64_t b, int64_t h, int64_t qb, int64_t kb, bool want_q,
                     bool want_kv, bool mixed, bool first_kv, const bwd_scratch *w) {
    (void)first_kv; /* the fp32 products add into dk and dv themselves */
    float *S = w->S, *dP = w->dP;
    const int64_t D = a->D, T = a->T, Tk = a->Tk, off = Tk - T;
    const int64_t g = h / (a->H / a->Hkv);
    const int64_t i0 = qb * BQ, nr = T - i0 < BQ ? T - i0 : BQ;
    const int64_t j0 = kb * BK, nk = Tk - j0 < BK ? Tk - j0 : BK;
    const int32_t *pad = a->pad ? a->pad + b * Tk : NULL;
    const bool has_pad = block_has_pad(pad, j0, nk);
    const int64_t qrow = (b * a->H + h) * T + i0, krow = (b * a->Hkv + g) * Tk + j0;
    const float *q = a->q + qrow * D, *dO = a->dout + qrow * D;
#if ATT_AMX
    const bool bf = a->qh != NULL;
    const int64_t qblk = ((b * a->H + h) * a->nqb + qb) * BQ * D, kblk = ((b * a->Hkv + g) * a->nkb + kb) * BK * D;
    if (bf) {
        tile_scores(a->amx, S, a->qh + qblk, D, a->kp + kblk / 2, nr, D, off + i0, j0, nk);
        tile_scores(a->amx, dP, a->dh + qblk, D, a->vp + kblk / 2, nr, D, off + i0, j0, nk);
    } else
#endif
    {
        nt_tile(q, D, w->kt, D, S, nr, off + i0, j0, nk);
        nt_tile(dO, D, w->vt, D, dP, nr, off + i0, j0, nk);
    }
    const float sc = a->scale;
    /* the padding bias (zeros without padding: one branch-free loop, which
     * gcc vectorises where a conditional load of the bias it does not) */
    float bias[BK];
    pad_bias(bias, pad, has_pad, j0, nk);
    for (int64_t r = 0; r < nr; r++) {
        float *s = S + r * BK, *dp = dP + r * BK;
        const float L = a->lse[qrow + r], dl = a->delta[qrow + r];
        const int64_t lim = L == -INFINITY ? 0 : causal_limit(off + i0 + r, j0, nk);
        const int64_t lo = window_start(a->window, off + i0 + r, j0, nk);
        if (mixed) { /* block-diagonal: keys of the query's own segment only */
            const int32_t *sg = a->si.seg + b * Tk, sq = sg[off + i0 + r], *sk = sg + j0;
            int64_t c0 = 0;
#ifdef KILN_ATT_ROW8
            c0 = masked_probs8(s, dp, bias, nk, lim, lo, sk, sq, sc, L, dl);
#endif
#pragma omp simd
            for (int64_t c = c0; c < nk; c++) {
                float p = kiln_expf_fast(s[c] * sc - L + bias[c]);
                const bool vis = (c < lim) & (c >= lo) & (sk[c] == sq);
                s[c] = vis ? p : 0.0f;
                dp[c] = vis ? p * (dp[c] - dl) : 0.0f; /* a skipped column of dP holds anything */
            }
        } else if (lim == nk && !has_pad && !lo) {
#pragma omp simd
            for (int64_t c = 0; c < nk; c++) {
                float p = kiln_expf_fast(s[c] * sc - L);
                s[c] = p;
                dp[c] = p * (dp[c] - dl);
            }
        } else { /* a padding key adds -inf, whose exp is 0 */
            int64_t c0 = 0;
#ifdef KILN_ATT_ROW8
            c0 = masked_probs8(s, dp, bias, nk, lim, lo, NULL, 0, sc, L, dl);
#endif
#pragma omp simd
            for (int64_t c = c0; c < nk; c++) {
                float p = kiln_expf_fast(s[c] * sc - L + bias[c]);
                const bool vis = (c < lim) & (c >= lo);
                s[c] = vis ? p : 0.0f;
                dp[c] = vis ? p * (dp[c] - dl) : 0.0f; /* a skipped column of dP holds anything */
            }
        }
    }
#if ATT_AMX
    if (bf) {
        /* P and dS rounded to bf16 (rows past nr zero): dvᵀ += doutᵀ·P,
         * dkᵀ += qᵀ·dS into the key block's buffers, dq += dS·k */
        if (want_kv) {
            form_inter(S, nr, BQ, BK, w->pi);
            form_inter(dP, nr, BQ, BK, w->dsi);
            tile_mm(a->amx, w->dvT, BK, !first_kv, a->dc + qblk, BQ, w->pi, BK, D, BK, BQ);
            tile_mm(a->amx, w->dkT, BK, !first_kv, a->qc + qblk, BQ, w->dsi, BK, D, BK, BQ);
        }
        if (want_q) {
            form_rows(dP, nr, BQ, BK, w->dsh);
            tile_rows_acc(a->amx, w->dq, D, false, w->dsh, a->ki + kblk / 2, D, nr, D, off + i0, j0, nk);
            float *dq = a->dq + qrow * D;
            for (int64_t r = 0; r < nr; r++)
#pragma omp simd
                for (int64_t d = 0; d < D; d++) dq[r * D + d] += w->dq[r * D + d];
        }
        return;
    }
#endif
    if (want_kv) {
        acc_tile_keys(S, dO, D, a->dv + krow * D, D, nr, nk, D, off + i0, j0);
        acc_tile_keys(dP, q, D, a->dk + krow * D, D, nr, nk, D, off + i0, j0);
    }
    if (want_q) acc_tile_rows(dP, a->k + krow * D, D, a->dq + qrow * D, D, nr, nk, D, off + i0, j0);
}

static void scale_rows(float *x, int64_t n, float s) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* dk/dv of key block kb of (b, g), summed over the group's heads and the
 * query blocks in order; also dq when want_q (single-task schedule). fp32
 * adds the tiles into dk and dv (zeroed here); bf16 sums them in dkᵀ and
 * dvᵀ (the first visible tile stores) and stores their transposes into dk
 * and dv, which are not zeroed first (8 x 8 x 256 bf16 backward, Zen 5:
 * the zeroing was 6.5% of its samples with the buffers' own) */
static void bwd_kblock(const bwd_args *a, int64_t b, int64_t g, int64_t kb, bool want_q, const bwd_scratch *w) {
    const int64_t j0 = kb * BK, nk = a->Tk - j0 < BK ? a->Tk - j0 : BK;
    const int64_t row = ((b * a->Hkv + g) * a->Tk + j0) * a->D; /* the block's first element in k, v, dk, dv */
    float *const dk = a->dk + row, *const dv = a->dv + row;
    const bool all_pad = block_all_pad(a->pad ? a->pad + b * a->Tk : NULL, j0, nk);
    if (all_pad || !a->qh) {
        memset(dk, 0, (size_t)(nk * a->D) * sizeof(float));
        memset(dv, 0, (size_t)(nk * a->D) * sizeof(float));
    }
    if (all_pad) return;
    const int64_t grp = a->H / a->Hkv;
    if (!a->qh) { /* fp32: the block's kᵀ and vᵀ, made here (in cache) for all its tiles */
        transpose_block(a->k + row, nk, a->D, w->kt);
        transpose_block(a->v + row, nk, a->D, w->vt);
    }
    bool first = true;
    for (int64_t h = g * grp; h < (g + 1) * grp; h++)
        for (int64_t qb = 0; qb < a->nqb; qb++) {
            int vis = tile_visible(a, b, qb, kb);
            if (vis) bwd_tile(a, b, h, qb, kb, want_q, true, vis == 2, first, w), first = false;
        }
#if ATT_AMX
    if (a->qh) { /* the key block's rows of dk and dv from their transposes (zeros: no tile saw the block) */
        if (first) {
            memset(w->dkT, 0, (size_t)(a->D * BK) * sizeof(float));
            memset(w->dvT, 0, (size_t)(a->D * BK) * sizeof(float));
        }
        store_transposed(dk, w->dkT, nk, a->D);
        store_transposed(dv, w->dvT, nk, a->D);
    }
#endif
}

void kiln_k_flash_attn_backward(const float *q, const float *k, const float *v,
                                const int32_t *pad_mask, const float *out, const float *lse,
                                const float *dout, float *dq, float *dk, float *dv, int64_t B,
                                int64_t H, int64_t Hkv, int64_t T, int64_t Tk, int64_t D,
                                float scale) {
    kiln_k_flash_attn_backward_seg(q, k, v, pad_mask, NULL, out, lse, dout, dq, dk, dv, B, H, Hkv, T, Tk, D, scale);
}

void kiln_k_flash_attn_backward_seg(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                                    const int32_t *seg, const float *out, const float *lse, const float *dout,
                                    float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                    int64_t Tk, int64_t D, float scale) {
    kiln_k_flash_attn_backward_win(q, k, v, pad_mask, seg, out, lse, dout, dq, dk, dv, B, H, Hkv, T, Tk, D, scale, 0);
}

void kiln_k_flash_attn_backward_win(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                                    const int32_t *seg, const float *out, const float *lse, const float *dout,
                                    float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                    int64_t Tk, int64_t D, float scale, int64_t window) {
    kiln_k_flash_attn_backward_ex(q, k, v, pad_mask, seg, out, lse, dout, dq, dk, dv, B, H, Hkv, T, Tk, D, scale, window,
                                  false);
}

void kiln_k_flash_attn_backward_ex(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                                   const int32_t *seg, const float *out, const float *lse, const float *dout,
                                   float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                   int64_t Tk, int64_t D, float scale, int64_t window, bool bf16) {
    if (B <= 0 || H <= 0 || D <= 0) return;
    /* dk, dv and dq are zeroed by the tasks that own their rows, just before
     * they accumulate there (in parallel, in cache) */
    if (T <= 0 || Tk <= 0) {
        memset(dk, 0, (size_t)(B * Hkv * (Tk > 0 ? Tk : 0) * D) * sizeof(float));
        memset(dv, 0, (size_t)(B * Hkv * (Tk > 0 ? Tk : 0) * D) * sizeof(float));
        memset(dq, 0, (size_t)(B * H * (T > 0 ? T : 0) * D) * sizeof(float));
        return;
    }
    const int64_t nkb = cdiv(Tk, BK), nqb = cdiv(T, BQ), nkv = B * Hkv * nkb * D * BK;
    const int path = bf16_path(bf16, D);
    const bool bf = path > 0; /* the bf16 forms (products on AMX or VDPBF16PS) */
    /* delta; bf16: then the q/dout forms (4 x nq16 bf16), the k/v forms
     * (3 x nkv / 2 words). (fp32: each key block's kᵀ and vᵀ are made by
     * the task that owns the block, in its scratch: a pass over k and v
     * into memory and back saved, 5% of the backward at 8 x 8 x 256) */
    const int64_t nq16 = B * H * nqb * BQ * D;
    float *buf = kiln_alloc(bf ? (size_t)(B * H * T) * sizeof(float) + (size_t)nq16 * 8 + (size_t)nkv / 2 * 12
                               : (size_t)(B * H * T) * sizeof(float));
    seg_info si;
    bool seg_ok = seg_ranges(&si, seg, pad_mask, B, Tk, nkb);
    if (!buf || !seg_ok) {
        memset(dk, 0, (size_t)(B * Hkv * Tk * D) * sizeof(float));
        memset(dv, 0, (size_t)(B * Hkv * Tk * D) * sizeof(float));
        for (int64_t i = 0; i < B * H * T * D; i++) dq[i] = NAN;
        kiln_dealloc(buf);
        free(si.kmin);
        return;
    }
    float *delta = buf;
#pragma omp parallel for schedule(static) if (B * H * T * D > (1 << 15))
    for (int64_t i = 0; i < B * H * T; i++) {
        const float *o = out + i * D, *g = dout + i * D;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < D; d++) s += o[d] * g[d];
        delta[i] = s;
    }
    bwd_args a = {q, k, v, dout, lse, delta, pad_mask, dq, dk, dv,
                  H, Hkv, T, Tk, D, nkb, nqb, scale, si, window, NULL, NULL, NULL, NULL, NULL, NULL, NULL, path == 2};
#if ATT_AMX
    if (bf) {
        uint16_t *f16 = (uint16_t *)(delta + B * H * T);
        uint32_t *f32 = (uint32_t *)(f16 + 4 * nq16);
        uint16_t *qh = f16, *qc = qh + nq16, *dh = qc + nq16, *dc = dh + nq16;
        uint32_t *kp = f32, *vp = kp + nkv / 2, *ki = vp + nkv / 2;
#pragma omp parallel for schedule(static) if (B * H * T * D > (1 << 15))
        for (int64_t t = 0; t < B * H * nqb; t++) {
            const int64_t bh = t / nqb, i0 = (t % nqb) * BQ, n = T - i0 < BQ ? T - i0 : BQ;
            form_rows(q + (bh * T + i0) * D, n, BQ, D, qh + t * BQ * D);
            form_cols(q + (bh * T + i0) * D, n, BQ, D, qc + t * BQ * D);
            form_rows(dout + (bh * T + i0) * D, n, BQ, D, dh + t * BQ * D);
            form_cols(dout + (bh * T + i0) * D, n, BQ, D, dc + t * BQ * D);
        }
#pragma omp parallel for schedule(static) if (B * Hkv * Tk * D > (1 << 15))
        for (int64_t t = 0; t < B * Hkv * nkb; t++) {
            const int64_t bh = t / nkb, j0 = (t % nkb) * BK, n = Tk - j0 < BK ? Tk - j0 : BK;
            form_pairs(k + (bh * Tk + j0) * D, n, BK, D, kp + t * BK * D / 2);
            form_pairs(v + (bh * Tk + j0) * D, n, BK, D, vp + t * BK * D / 2);
            form_inter(k + (bh * Tk + j0) * D, n, BK, D, ki + t * BK * D / 2);
        }
        a.qh = qh, a.qc = qc, a.dh = dh, a.dc = dc, a.kp = kp, a.vp = vp, a.ki = ki;
    }
#endif
    const int64_t grp = H / Hkv, nq = B * H * T * D;
    const bool small = T * Tk * D * B * H <= (1 << 16);
    /* The key blocks of each (b, kv head) in P parts of about equal work;
     * a task per (b, kv head, part) owns the part's dk, dv and adds its
     * tiles' dq contributions into the part's own dq copy (dq itself when
     * P = 1), and dq is the sum of the copies in part order. P depends on
     * the shape only (enough tasks for ~32 threads, no more parts than key
     * blocks, the copies within 256 MB), never on the thread count, so the
     * bits do not either; S and dP are computed once per tile. */
    int64_t P = small ? 1 : cdiv(32, B * Hkv);
    if (P > nkb) P = nkb;
    while (P > 1 && (double)P * (double)nq * sizeof(float) > 256e6) P--;
    float *dqp = P > 1 ? kiln_alloc((size_t)P * (size_t)nq * sizeof(float)) : NULL;
    if (!dqp) P = 1; /* no memory for the copies: one part (other bits, same sums) */
    int64_t bound[33] = {0};
    {
        /* part boundaries by visible tiles (b = 0's masks: a balance, not
         * a rule of the result) */
        int64_t total = 0, *w = malloc((size_t)nkb * sizeof *w);
        for (int64_t kb = 0; kb < nkb; kb++) {
            w[kb] = 0;
            for (int64_t qb = 0; w && qb < nqb; qb++) w[kb] += tile_visible(&a, 0, qb, kb) != 0;
            total += w ? w[kb] : 1;
        }
        int64_t acc = 0, part = 1;
        for (int64_t kb = 0; kb < nkb && part < P; kb++) {
            acc += w ? w[kb] : 1;
            /* close part `part - 1` once it holds its share, leaving a key
             * block for each part still to come */
            if ((acc * P >= part * total || nkb - kb - 1 == P - part) && nkb - kb - 1 >= P - part)
                bound[part++] = kb + 1;
        }
        while (part < P) bound[part] = bound[part - 1] + 1, part++; /* unreachable: each part gets one */
        bound[P] = nkb;
        free(w);
    }
    bool failed = false;
#pragma omp parallel if (!small && B * Hkv * P > 1)
    {
        /* S, dP; fp32: kᵀ, vᵀ; AMX: dq rows, dkᵀ, dvᵀ, P and dS pairs, dS rows */
        const size_t nw = 2 * BQ * BK + (bf ? BQ * D + 2 * D * BK + BQ * BK + BQ * BK / 2 : 2 * D * BK);
        float *S = kiln_alloc(nw * sizeof(float));
        if (!S) {
#pragma omp atomic write
            failed = true;
        }
        bwd_scratch w = {S, S ? S + BQ * BK : NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        if (!bf && S) w.kt = w.dP + BQ * BK, w.vt = w.kt + D * BK;
        if (bf && S) {
            w.dq = w.dP + BQ * BK, w.dkT = w.dq + BQ * D, w.dvT = w.dkT + D * BK;
            w.pi = (uint32_t *)(w.dvT + D * BK), w.dsi = w.pi + BQ * BK / 2, w.dsh = (uint16_t *)(w.dsi + BQ * BK / 2);
        }
#if ATT_AMX
        if (path == 2) kiln_amx_config();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < B * Hkv * P; t++) {
            if (!S) continue;
            const int64_t bg = t / P, p = t % P, b = bg / Hkv, g = bg % Hkv;
            bwd_args ap = a;
            if (P > 1) ap.dq = dqp + p * nq;
            /* the task's rows of dq (P = 1) or of its copy */
            memset(ap.dq + (b * H + g * grp) * T * D, 0, (size_t)(grp * T * D) * sizeof(float));
            for (int64_t kb = bound[p]; kb < bound[p + 1]; kb++) {
                bwd_kblock(&ap, b, g, kb, true, &w);
                int64_t nk = Tk - kb * BK < BK ? Tk - kb * BK : BK;
                scale_rows(dk + (bg * Tk + kb * BK) * D, nk * D, scale);
            }
            if (P == 1) /* the task's rows of dq are complete */
                scale_rows(dq + (b * H + g * grp) * T * D, grp * T * D, scale);
        }
#if ATT_AMX
        if (path == 2) kiln_amx_release();
#endif
        kiln_dealloc(S);
    }
    /* P > 1: dq = (copy 0 + copy 1 + ...) in part order, times the scale */
    const int64_t nblk = P > 1 ? cdiv(nq, 4096) : 0;
#pragma omp parallel for schedule(static) if (!small && nq > (1 << 15))
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t lo = blk * 4096, hi = lo + 4096 < nq ? lo + 4096 : nq;
        memcpy(dq + lo, dqp + lo, (size_t)(hi - lo) * sizeof(float));
        for (int64_t p = 1; p < P; p++) {
            const float *src = dqp + p * nq;
#pragma omp simd
            for (int64_t i = lo; i < hi; i++) dq[i] += src[i];
        }
        scale_rows(dq + lo, hi - lo, scale);
    }
    if (failed) { /* a thread's scratch: out of memory (its tasks' rows were not written) */
        for (int64_t i = 0; i < B * H * T * D; i++) dq[i] = NAN;
        for (int64_t i = 0; i < B * Hkv * Tk * D; i++) dk[i] = dv[i] = NAN;
    }
    kiln_dealloc(dqp);
    kiln_dealloc(buf);
    free(si.kmin);
}
