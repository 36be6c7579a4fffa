/* kiln's own bf16 GEMM (kiln/kernels.h kiln_k_gemm_bf16):
 *   C (fp32) = alpha op(A) op(B) + beta C,  A and B bf16, row-major, beta 0
 *   (C not read) or 1.
 *
 * The sums are VDPBF16PS's (except on AMX tiles, below). Per element and
 * per K block, acc starts at +0
 * and takes K in pairs (k = 2i, 2i+1; an odd block's last pair has a zero
 * partner, 0 x 0 first):
 *     acc = ftz(acc + a[2i+1] b[2i+1]);  acc = ftz(acc + a[2i] b[2i])
 * where each step is one fused multiply-add (the product is not rounded on
 * its own: a product past FLT_MAX can still be cancelled by acc, one below
 * FLT_MIN adds all its bits), rounded to nearest even; inputs that are
 * denormal count as zero of their sign (DAZ, done here when packing); a
 * result that is tiny after rounding to 24 bits with an unbounded exponent
 * becomes a zero of its sign (FTZ); MXCSR is neither read nor written by the
 * instruction. Then C = alpha acc (first block, beta 0) or C + alpha acc,
 * two roundings, in the caller's MXCSR. (Intel SDM, VDPBF16PS: "FP32 FMA
 * with daz in, ftz out and RNE rounding. MXCSR neither consulted nor
 * updated"; the tininess rule was checked against the instruction: an exact
 * 2^-126 - 2^-150 flushes, 2^-126 - 2^-152 gives 2^-126.)
 *
 * Two paths compute those bits:
 *   native    (avx512 form, CPU with AVX512-BF16, kiln_bf16_native()):
 *             _mm512_dpbf16_ps, in functions with target("avx512bf16").
 *   emulation (every other case): the operands widened to fp32 when packing
 *             (pair-swapped: k order 1,0,3,2,...), then one fused
 *             multiply-add per k (AVX-512 / AVX2 FMA) with MXCSR set to
 *             round-to-nearest, FTZ on, exceptions masked around the k loop
 *             (x86's FTZ flushes exactly the results that are tiny after
 *             rounding, as VDPBF16PS does), the raw sums stored to a tile,
 *             MXCSR restored, then the alpha/C step as above. The portable
 *             form has no FMA: it adds in double (the product of two bf16 is
 *             exact there; a double-rounded sum is the correctly rounded fp32
 *             sum since 53 >= 2*24 + 2) and flushes |d| < 2^-126 - 2^-151.
 * A third path has sums of its own: where kiln_bf16_amx() holds, TDPBF16PS
 * on AMX tiles with all of K in one block (see "AMX path" below), held by
 * the tests to an error bound, not to these bits.
 * Blocking: K in blocks of at most KC = 1024 (balanced, each block an even
 * count, so no pair straddles two blocks), fixed by K alone in every form
 * and path; the thread count decides only who computes a tile.
 *
 * GotoBLAS/BLIS structure (gemm.c's, kiln_k_gemm_f32), with fewer barriers:
 *   jc: N in panels whose packed B for ALL K blocks is at most ~4 MB (L3);
 *       the threads pack it together (dynamic items), one barrier
 *     tasks (dynamic): row chunks (<= MC rows) x column chunks (<= 512
 *     columns, so the task's C block stays in L2), about 4 per thread at
 *     least; a task runs every K block itself:
 *       pc: K blocks; its rows of A packed into MR slivers (a thread keeps
 *           them over all of K when <= 2 MB, so its next task on the same
 *           rows packs nothing); on the native path with A stored M x K
 *           and an even block, full slivers are not packed: the micro-kernel
 *           reads each row's pair words in place (the same words), unless
 *           A's row stride is a multiple of KILN_L1_SET_PERIOD bytes
 *         jr: the task's NR slivers of B (the next one prefetched)
 *           ir: the MR slivers of A: the micro-kernel keeps its MR x NR
 *               tile in registers over the block.
 *     A task owns its C block for the whole K loop: no barrier between K
 *     blocks (a thread the shared machine slows down holds nobody up), and
 *     each element is the same sequence of operations whichever thread runs
 *     it.
 *   avx512  14 x 32: 28 zmm accumulators, 2 B vectors (native: one
 *           VDPBF16PS per 2 k per vector; emulation: FMA per k)
 *   avx2    6 x 16 (FMA emulation)
 *   portable 4 x 8 (double emulation)
 * Packing (native): B in kc/2 x NR slivers of 32-bit words, word (i, j) =
 * (op(B)[2i][j] low, op(B)[2i+1][j] high), the layout VDPBF16PS reads; A
 * likewise in kc/2 x MR slivers (one word broadcast per row); both
 * zero-padded past M, N and an odd K, denormals flushed. When the pairs lie
 * contiguous in memory (A stored M x K, B stored N x K) that is a 16 x 16
 * transpose of 32-bit words; otherwise two rows are interleaved (one
 * VPERMT2W per 16 words). Emulation packs the same words then widens each
 * word w to two fp32 rows: w & 0xffff0000 (the odd k), then w << 16.
 *
 * Threads: OpenMP on the caller's count (serial below 2^19 multiply-adds or
 * inside a parallel region); K is never split, and the K blocking depends
 * on K alone: the bits do not depend on the thread count (or the form). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "gemm_grid.h"
#include "kiln/kernels.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define BF_MR 14
#define BF_NR 32
#define BF_MC 168
#elif defined(__AVX2__)
#define BF_MR 6
#define BF_NR 16
#define BF_MC 144
#else
#define BF_MR 4
#define BF_NR 8
#define BF_MC 128
#endif
/* columns of a task at most (its C block stays in L2 over the K blocks) */
#define BF_NCC 512
/* bytes of a packed B panel (all of K) at most, about */
#define BF_PANEL (4 << 20)
/* bytes of a thread's packed A rows over all of K at most (else per K block) */
#define BF_ACACHE (2 << 20)
#define MR BF_MR
#define NR BF_NR
/* k per block, even; the same in every form: it fixes the sums. 1024
 * (was 256): fewer passes over C; on a Zen 5 (2 threads, VDPBF16PS, the
 * small model's nine step shapes, the kernel alone) 595 GFLOP/s at 256,
 * 655 at 512, 671-674 at 768 and 1024, 685 at 2048; the avx2 form's
 * emulation 170 -> 173 */
#define BF_KC 1024
/* serial below this many multiply-adds */
#define BF_PAR_MIN (1 << 19)

#if defined(__AVX512F__) && defined(__x86_64__) && defined(__GNUC__)
#define BF_NATIVE 1
#define NATIVE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define BF_NATIVE 0
#endif

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
/* AMX: the pairs of a K block of kc, padded to whole tiles (16 pairs) */
static inline int64_t amx_pairs(int64_t kc) { return cdiv(cdiv(kc, 2), 16) * 16; }

/* ---- MXCSR around the emulated k loops ----------------------------------- */
#if defined(__SSE2__)
#define CSR_RNE_MASKED_FTZ 0x9f80u /* FTZ, all exceptions masked, round to nearest, no DAZ, flags clear */
static inline unsigned csr_get(void) {
    unsigned v;
    __asm__ volatile("stmxcsr %0" : "=m"(v) : : "memory");
    return v;
}
/* "memory": the packed loads of the k loop stay after it, the stores of
 * the raw sums before the restore */
static inline void csr_set(unsigned v) { __asm__ volatile("ldmxcsr %0" : : "m"(v) : "memory"); }
#else
static inline unsigned csr_get(void) { return 0; }
static inline void csr_set(unsigned v) { (void)v; }
#define CSR_RNE_MASKED_FTZ 0u
#endif

/* ---- packing: 32-bit pair words ------------------------------------------- */
/* The operand as "outer x k": for A the outer index is the row (i), for B
 * the column (j). contig: the k of one outer index are contiguous
 * (X[o*ld + k]: A not transposed, B transposed); else X[k*ld + o]. */

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512i daz_v(__m512i v) {
    const __mmask32 m = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7f80));
    return _mm512_mask_mov_epi16(_mm512_and_si512(v, _mm512_set1_epi16((short)0x8000)), m, v);
}
/* VPERMT2W indices making word w of two rows v0, v1 as (v0[w], v1[w]): w,
 * then 32 + w (v1's element w); adding n starts at element n */
static const uint16_t pair_lo_idx[32] __attribute__((aligned(64))) = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                                      37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                                      11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
/* the vector packer: 16 outer indices x 16 pairs at a time */
static void pack_words(bool contig, const uint16_t *X, int64_t ld, int64_t o0, int64_t no, int64_t W, int64_t pc,
                       int64_t kc, int64_t p0, int64_t np, uint32_t *restrict dst) {
    if (contig) {
        for (int64_t og = 0; og < W; og += 16) {
            const int64_t ng = imin(16, no - og), wg = imin(16, W - og);
            const __mmask16 sm = (__mmask16)((1u << wg) - 1);
            for (int64_t pp = 0; pp < np; pp += 16) {
                const int64_t nel = imin(32, kc - 2 * (p0 + pp)); /* bf16 elements of this chunk */
                const __mmask32 lm = nel >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << nel) - 1);
                __m512i r[16];
                const uint16_t *s = X + (o0 + og) * ld + pc + 2 * (p0 + pp);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    r[i] = i < ng ? daz_v(_mm512_maskz_loadu_epi16(lm, s + i * ld)) : _mm512_setzero_si512();
                kiln_tr16_epi32(r);
                const int64_t npp = imin(16, np - pp);
                for (int64_t p = 0; p < npp; p++) _mm512_mask_storeu_epi32(dst + (pp + p) * W + og, sm, r[p]);
            }
        }
        return;
    }
    /* word o = (row k0 [o], row k0+1 [o]): VPERMT2W of the two rows */
    const __m512i ilo = _mm512_load_si512((const void *)pair_lo_idx);
    const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    for (int64_t og = 0; og < W; og += 32) {
        const int64_t ng = imax(0, imin(32, no - og)), wg = imin(32, W - og);
        const __mmask32 lm = ng >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << ng) - 1);
        const __mmask16 sm0 = (__mmask16)(wg >= 16 ? 0xFFFF : (1u << wg) - 1);
        const __mmask16 sm1 = (__mmask16)(wg >= 32 ? 0xFFFF : wg > 16 ? (1u << (wg - 16)) - 1 : 0);
        for (int64_t p = 0; p < np; p++) {
            const int64_t k = 2 * (p0 + p);
            const uint16_t *s0 = X + (pc + k) * ld + o0 + og;
            __m512i v0 = daz_v(_mm512_maskz_loadu_epi16(lm, s0));
            __m512i v1 = k + 1 < kc ? daz_v(_mm512_maskz_loadu_epi16(lm, s0 + ld)) : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(dst + p * W + og, sm0, _mm512_permutex2var_epi16(v0, ilo, v1));
            if (sm1) _mm512_mask_storeu_epi32(dst + p * W + og + 16, sm1, _mm512_permutex2var_epi16(v0, ihi, v1));
        }
    }
}
/* pack_words' non-contiguous case (X[k*ld + o]) for two slivers of W <= 16
 * outer indices from o0 (no of them in both; the second at dst + sstride)
 * from one load of each pair's two rows: 2W <= 32 elements, one 64-byte
 * line or two, where a sliver at a time loads each line twice. The same
 * words as two calls of pack_words. For op(A) = Aᵀ on the native path:
 * Zen 5, 2 threads, a driver calling both alternately (GFLOP/s, two runs):
 * 8192 x 512 x 2048 TN 585.2 -> 620.6 and 582.6 -> 618.5, 512 x 512 x 2048
 * 644.5 -> 656.1 and 649.1 -> 669.7, 1376 x 512 x 2048 684.9 -> 693.2 and
 * 643.5 -> 652.4. (All of a task's slivers pair by pair, every row read
 * along once, measured slower: 629.3 -> 574.5 on 1376 x 512 x 2048.) */
static void pack_words_nc2(const uint16_t *X, int64_t ld, int64_t o0, int64_t no, int64_t W, int64_t sstride,
                           int64_t pc, int64_t kc, uint32_t *restrict dst) {
    const __m512i ilo = _mm512_load_si512((const void *)pair_lo_idx);
    /* the second sliver's words start at element W of the rows */
    const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16((short)W));
    const int64_t np = cdiv(kc, 2), ng = imax(0, imin(2 * W, no));
    const __mmask32 lm = ng >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << ng) - 1);
    const __mmask16 sm = (__mmask16)((1u << W) - 1);
    for (int64_t p = 0; p < np; p++) {
        const uint16_t *s0 = X + (pc + 2 * p) * ld + o0;
        const __m512i v0 = daz_v(_mm512_maskz_loadu_epi16(lm, s0));
        const __m512i v1 = 2 * p + 1 < kc ? daz_v(_mm512_maskz_loadu_epi16(lm, s0 + ld)) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + p * W, sm, _mm512_permutex2var_epi16(v0, ilo, v1));
        _mm512_mask_storeu_epi32(dst + sstride + p * W, sm, _mm512_permutex2var_epi16(v0, ihi, v1));
    }
}
#define BF_PACK_NC2 1
#else
#define BF_PACK_NC2 0
static inline uint32_t daz16(uint32_t h) { return (h & 0x7f80u) ? h : h & 0x8000u; }
/* dst[p*W + o] = word(pair p0 + p, outer o0 + o) for p < np, o < W (zero
 * past no and past kc), k measured from pc */
static void pack_words(bool contig, const uint16_t *X, int64_t ld, int64_t o0, int64_t no, int64_t W,
                              int64_t pc, int64_t kc, int64_t p0, int64_t np, uint32_t *restrict dst) {
    for (int64_t p = 0; p < np; p++) {
        const int64_t k0 = pc + 2 * (p0 + p);
        const bool has1 = 2 * (p0 + p) + 1 < kc;
        uint32_t *d = dst + p * W;
        if (contig) {
            for (int64_t o = 0; o < no; o++) {
                const uint16_t *s = X + (o0 + o) * ld + k0;
                d[o] = daz16(s[0]) | (has1 ? daz16(s[1]) << 16 : 0u);
            }
        } else {
            const uint16_t *s0 = X + k0 * ld + o0, *s1 = s0 + ld;
            for (int64_t o = 0; o < no; o++) d[o] = daz16(s0[o]) | (has1 ? daz16(s1[o]) << 16 : 0u);
        }
        for (int64_t o = no; o < W; o++) d[o] = 0;
    }
}

#endif

/* The emulation's layout: dst[(2p)*W + o] = hi half of word (the odd k),
 * dst[(2p+1)*W + o] = lo half (the even k), as fp32 bit patterns; np pairs
 * from pair 0, kc2 = ceil(kc / 2) of them */
static void pack_wide(bool contig, const uint16_t *X, int64_t ld, int64_t o0, int64_t no, int64_t W, int64_t pc,
                      int64_t kc, float *restrict dst) {
    enum { CH = 16 };
    uint32_t tmp[CH * (MR > NR ? MR : NR)] __attribute__((aligned(64)));
    const int64_t kc2 = cdiv(kc, 2);
    for (int64_t p0 = 0; p0 < kc2; p0 += CH) {
        const int64_t np = imin(CH, kc2 - p0);
        pack_words(contig, X, ld, o0, no, W, pc, kc, p0, np, tmp);
        for (int64_t p = 0; p < np; p++) {
            uint32_t *d = (uint32_t *)(void *)(dst + (2 * (p0 + p)) * W);
            const uint32_t *s = tmp + p * W;
            for (int64_t o = 0; o < W; o++) {
                d[o] = s[o] & 0xffff0000u;
                d[W + o] = s[o] << 16;
            }
        }
    }
}

/* ---- the alpha / C step from a raw tile t (MR x NR): c = alpha t or
 * c + alpha t, mi x nj of it ------------------------------------------------ */
static inline void store_tile(const float *restrict t, float *c, int64_t ldc, float alpha, bool first, int64_t mi,
                              int64_t nj) {
    if (first) {
        for (int64_t i = 0; i < mi; i++)
            for (int64_t j = 0; j < nj; j++) c[i * ldc + j] = alpha * t[i * NR + j];
    } else {
        for (int64_t i = 0; i < mi; i++)
            for (int64_t j = 0; j < nj; j++) c[i * ldc + j] = c[i * ldc + j] + alpha * t[i * NR + j];
    }
}
static inline void store_tile_full(const float *restrict t, float *c, int64_t ldc, float alpha, bool first) {
    if (first) {
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) c[i * ldc + j] = alpha * t[i * NR + j];
    } else {
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) c[i * ldc + j] = c[i * ldc + j] + alpha * t[i * NR + j];
    }
}

/* ---- emulation micro-kernels: t[MR x NR] = the raw sums over kk = 2 kc2
 * widened steps (a: kk x MR, b: kk x NR), in the emulation's MXCSR -------- */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void ukernel_emu(int64_t kk, const float *restrict a,
                                                              const float *restrict b, float *restrict t) {
    __m512 acc[MR][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t k = 0; k < kk; k++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        __asm__("" : "+v"(b0), "+v"(b1));
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        _mm512_store_ps(t + i * NR, acc[i][0]);
        _mm512_store_ps(t + i * NR + 16, acc[i][1]);
    }
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) void ukernel_emu(int64_t kk, const float *restrict a,
                                                              const float *restrict b, float *restrict t) {
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int64_t k = 0; k < kk; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        __asm__("" : "+x"(b0), "+x"(b1));
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        _mm256_store_ps(t + i * NR, acc[i][0]);
        _mm256_store_ps(t + i * NR + 8, acc[i][1]);
    }
}
#else
/* No FMA: acc + a b in double (exact product, one rounding to 53 bits,
 * which rounds to fp32 as the fused operation would), then the flush of
 * what is tiny after rounding to 24 bits: |d| < 2^-126 - 2^-151 (the
 * midpoint 2^-126 - 2^-151 itself rounds to even, up to 2^-126). */
static inline __attribute__((always_inline)) void ukernel_emu(int64_t kk, const float *restrict a,
                                                              const float *restrict b, float *restrict t) {
    float acc[MR][NR];
    const double tiny = 0x1p-126 - 0x1p-151;
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;
    for (int64_t k = 0; k < kk; k++) {
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            const double ai = a[i];
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) {
                double d = (double)acc[i][j] + ai * (double)b[j];
                d = fabs(d) < tiny ? d * 0.0 : d;
                acc[i][j] = (float)d;
            }
        }
        a += MR;
        b += NR;
    }
    memcpy(t, acc, sizeof acc);
}
#endif

/* One task's tiles, emulated: rows [ic, ic + mc) (msl slivers at ap),
 * columns slivers [ns0, ns1) of the panel at bp (column jc, nc wide) */
static void task_emu(int64_t kc, const float *ap, int64_t msl, int64_t ic, int64_t mc, const float *bp, int64_t bstride,
                     int64_t ns0, int64_t ns1, int64_t jc, int64_t nc, float *C, int64_t ldc, float alpha, bool first) {
    const int64_t kk = 2 * cdiv(kc, 2);
    float t[MR * NR] __attribute__((aligned(64)));
    for (int64_t s = ns0; s < ns1; s++) {
        const float *b = bp + s * NR * bstride;
        const int64_t j = jc + s * NR, nj = imin(NR, nc - s * NR);
        for (int64_t r = 0; r < msl; r++) {
            const int64_t i = ic + r * MR, mi = imin(MR, mc - r * MR);
            const unsigned csr = csr_get();
            csr_set(CSR_RNE_MASKED_FTZ);
            ukernel_emu(kk, ap + r * MR * kk, b, t);
            csr_set(csr);
            if (mi == MR && nj == NR)
                store_tile_full(t, C + i * ldc + j, ldc, alpha, first);
            else
                store_tile(t, C + i * ldc + j, ldc, alpha, first, mi, nj);
        }
    }
}

/* ---- native micro-kernel (VDPBF16PS): kc2 pairs, a: kc2 x MR words,
 * b: kc2 x NR words ------------------------------------------------------- */
#if BF_NATIVE
static inline __attribute__((always_inline)) NATIVE_TARGET void ukernel_native(int64_t kc2, const uint16_t *restrict a,
                                                                                int64_t as, int64_t ais,
                                                                                const uint32_t *restrict b, float *c,
                                                                                int64_t ldc, float alpha, bool first,
                                                                                bool full, const uint32_t *bnext) {
    __m512 acc[MR][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    if (full) {
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);
        }
    }
#pragma GCC unroll 2
    for (int64_t p = 0; p < kc2; p++) {
        __m512i b0 = _mm512_load_si512((const void *)b), b1 = _mm512_load_si512((const void *)(b + 16));
        __asm__("" : "+v"(b0), "+v"(b1));
        if (bnext) { /* the next B sliver, one pair row (128 bytes) per pair */
            _mm_prefetch((const char *)bnext, _MM_HINT_T0);
            _mm_prefetch((const char *)(bnext + 16), _MM_HINT_T0);
            bnext += NR;
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            uint32_t w;
            memcpy(&w, a + i * ais, sizeof w);
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)w);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, (__m512bh)b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, (__m512bh)b1);
        }
        a += as;
        b += NR;
    }
    if (full) {
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
    } else { /* the raw sums to the tile at c (row stride NR) */
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm512_store_ps(c + i * NR, acc[i][0]);
            _mm512_store_ps(c + i * NR + 16, acc[i][1]);
        }
    }
}

/* ain: A's rows at the block's first k (A stored M x K, the block's k
 * count even), whose full slivers are read in place: the pair words of row
 * i are contiguous there (VDPBF16PS takes denormal inputs as zeros itself,
 * as the packing does); NULL: every sliver packed at ap */
NATIVE_TARGET __attribute__((noinline)) static void task_native(int64_t kc, const uint32_t *ap, const uint16_t *ain,
                                                                int64_t lda, int64_t msl, int64_t ic, int64_t mc,
                                                                const uint32_t *bp, int64_t bstride, int64_t ns0,
                                                                int64_t ns1, int64_t jc, int64_t nc, float *C,
                                                                int64_t ldc, float alpha, bool first) {
    const int64_t kc2 = cdiv(kc, 2);
    float t[MR * NR] __attribute__((aligned(64)));
    for (int64_t s = ns0; s < ns1; s++) {
        const uint32_t *b = bp + s * NR * bstride;
        const int64_t j = jc + s * NR, nj = imin(NR, nc - s * NR);
        for (int64_t r = 0; r < msl; r++) {
            const int64_t i = ic + r * MR, mi = imin(MR, mc - r * MR);
            const uint32_t *bn = r == msl - 1 && s + 1 < ns1 ? b + NR * bstride : NULL;
            const bool in_place = ain && mi == MR;
            const uint16_t *a = in_place ? ain + i * lda : (const uint16_t *)(const void *)(ap + r * MR * kc2);
            if (mi == MR && nj == NR) {
                if (in_place)
                    ukernel_native(kc2, a, 2, lda, b, C + i * ldc + j, ldc, alpha, first, true, bn);
                else
                    ukernel_native(kc2, a, 2 * MR, 2, b, C + i * ldc + j, ldc, alpha, first, true, bn);
            } else {
                if (in_place)
                    ukernel_native(kc2, a, 2, lda, b, t, NR, alpha, first, false, bn);
                else
                    ukernel_native(kc2, a, 2 * MR, 2, b, t, NR, alpha, first, false, bn);
                store_tile(t, C + i * ldc + j, ldc, alpha, first, mi, nj);
            }
        }
    }
}
#endif


/* ---- AMX path (TDPBF16PS) ------------------------------------------------ *
 * One K block (all of K): each 16x16 accumulator tile starts at +0 (or at C)
 * and takes the pairs in order, 16 per instruction; the instruction's sums
 * are its own (they part from VDPBF16PS's in the last bits), fixed by K and
 * the operands alone, not by the thread count. Rows in slivers of AMX_MR = 32 (two A tiles), columns in the
 * B panel's NR = 32 slivers (two B tiles), so 4 accumulator tiles + 2 A + 2
 * B = the 8 tile registers, each 16 rows x 64 bytes. A K block's pairs are
 * padded to a multiple of 16: A with -0 words, B with +0 words, whose
 * product -0 leaves every sum unchanged (x + -0 = x, a -0 sum included).
 * Layouts: B as the VDPBF16PS path packs it (kc2p pairs x 32 words a
 * sliver), then each chunk of 16 pairs rearranged into its two tiles of
 * 16 pair rows x 16 words, 1 KB each in a row (tiles_of_b: loads with a
 * 64-byte stride read 16 lines one after the other; with the 128-byte
 * stride of the plain layout the kernel measured about 6% slower on a
 * Xeon's 12 small-model shapes, bench/gemm); A per
 * sliver in chunks of 16 pairs, [chunk][32 rows][16 words] (a tile: 16
 * rows, stride 64 bytes). A whole 32 x 32 block with alpha 1 accumulates
 * from C itself (beta 1) or zero and is stored into C; others go through a
 * tile of raw sums and the alpha/C step. The tiles: amx.h. */
#if BF_NATIVE && KILN_AMX
#define BF_AMX 1
#define AMX_MR 32
#define BF_AMX_MR AMX_MR
#define AMX_PAD_A 0x80008000u /* a pair of -0 */
#define AMX_TILE_WORDS 256     /* a 16 x 16 tile of 32-bit words, 1 KB */

/* rows [i0, i0 + mi) of op(A), K from pc (kc of them), as the AMX sliver at
 * dst: kc2p / 16 chunks of [32 rows][16 words] */
static void pack_a_amx(bool contig, const uint16_t *A, int64_t lda, int64_t i0, int64_t mi, int64_t pc, int64_t kc,
                       int64_t kc2p, uint32_t *restrict dst) {
    const int64_t kc2 = cdiv(kc, 2);
    if (contig) { /* A's rows are the tile rows already: a masked copy per row and chunk */
        const __m512i pad = _mm512_set1_epi32((int)AMX_PAD_A);
        for (int64_t c = 0; c < kc2p / 16; c++) {
            const int64_t nel = imin(32, kc - 32 * c), np = imax(0, imin(16, kc2 - 16 * c));
            const __mmask32 lm = nel >= 32 ? ~(__mmask32)0 : nel > 0 ? (__mmask32)((1u << nel) - 1) : 0;
            const __mmask16 pm = (__mmask16)(np >= 16 ? 0xFFFF : (1u << np) - 1); /* real pairs, else -0 */
            uint32_t *d = dst + c * AMX_MR * 16;
            for (int64_t i = 0; i < AMX_MR; i++) {
                __m512i v = pad;
                if (i < mi) v = _mm512_mask_mov_epi32(pad, pm, daz_v(_mm512_maskz_loadu_epi16(lm, A + (i0 + i) * lda + pc + 32 * c)));
                _mm512_store_si512((void *)(d + i * 16), v);
            }
        }
        return;
    }
    uint32_t tmp[16 * 16] __attribute__((aligned(64)));
    for (int64_t c = 0; c < kc2p / 16; c++)
        for (int g = 0; g < 2; g++) {
            uint32_t *d = dst + (c * AMX_MR + 16 * g) * 16;
            const int64_t np = imax(0, imin(16, kc2 - 16 * c)), no = imax(0, imin(16, mi - 16 * g));
            if (np) pack_words(contig, A, lda, i0 + 16 * g, no, 16, pc, kc, 16 * c, np, tmp);
            __m512i r[16];
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++)
                r[p] = p < np ? _mm512_load_si512((const void *)(tmp + p * 16)) : _mm512_set1_epi32((int)AMX_PAD_A);
            kiln_tr16_epi32(r); /* [pair][row] -> [row][pair] */
#pragma GCC unroll 16
            for (int o = 0; o < 16; o++) _mm512_store_si512((void *)(d + o * 16), r[o]);
        }
}

/* B's sliver for the tiles: each chunk of 16 pairs x NR = 32 words (as
 * pack_words lays it) rearranged into its two 16 x 16 tiles, columns 0-15
 * then 16-31, each 1 KB in a row, so that a tile load reads 16 whole lines
 * one after the other (stride 64) */
static void tiles_of_b(uint32_t *b, int64_t nch) {
    for (int64_t c = 0; c < nch; c++) {
        uint32_t *p = b + c * 16 * NR;
        __m512i r[32];
        for (int i = 0; i < 16; i++) r[2 * i] = _mm512_loadu_si512(p + i * NR), r[2 * i + 1] = _mm512_loadu_si512(p + i * NR + 16);
        for (int i = 0; i < 16; i++)
            _mm512_storeu_si512(p + i * 16, r[2 * i]), _mm512_storeu_si512(p + AMX_TILE_WORDS + i * 16, r[2 * i + 1]);
    }
}

/* c (mi x nj of it, ldc) = alpha t or c + alpha t, t 32 x 32 */
static inline void store_amx(const float *restrict t, float *c, int64_t ldc, float alpha, bool first, int64_t mi,
                             int64_t nj) {
    const __m512 al = _mm512_set1_ps(alpha);
    const __mmask16 m0 = (__mmask16)(nj >= 16 ? 0xFFFF : (1u << nj) - 1),
                    m1 = (__mmask16)(nj >= 32 ? 0xFFFF : nj > 16 ? (1u << (nj - 16)) - 1 : 0);
    for (int64_t i = 0; i < mi; i++) {
        __m512 r0 = _mm512_mul_ps(al, _mm512_load_ps(t + i * 32)), r1 = _mm512_mul_ps(al, _mm512_load_ps(t + i * 32 + 16));
        if (!first) {
            r0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, c + i * ldc), r0);
            r1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, c + i * ldc + 16), r1);
        }
        _mm512_mask_storeu_ps(c + i * ldc, m0, r0);
        _mm512_mask_storeu_ps(c + i * ldc + 16, m1, r1);
    }
}

/* one task's tiles: A slivers at ap (msl of them, kc2p pairs each), the
 * panel's column slivers [ns0, ns1) at bp (bstride = kc2p words per column) */
__attribute__((noinline)) static void task_amx(int64_t kc2p, const uint32_t *ap, int64_t msl, int64_t ic, int64_t mc,
                                               const uint32_t *bp, int64_t bstride, int64_t ns0, int64_t ns1,
                                               int64_t jc, int64_t nc, float *C, int64_t ldc, float alpha,
                                               bool first) {
    float t[AMX_MR * 32] __attribute__((aligned(64)));
    const int64_t nch = kc2p / 16;
    kiln_amx_config();
    for (int64_t s = ns0; s < ns1; s++) {
        const uint32_t *b = bp + s * NR * bstride;
        const int64_t j = jc + s * NR, nj = imin(NR, nc - s * NR);
        for (int64_t r = 0; r < msl; r++) {
            const int64_t i = ic + r * AMX_MR, mi = imin(AMX_MR, mc - r * AMX_MR);
            const uint32_t *a = ap + r * AMX_MR * kc2p;
            /* a whole block with alpha 1: the tiles start from C (or zero)
             * and are stored into C, no pass through t */
            const bool direct = alpha == 1.0f && mi == AMX_MR && nj == NR;
            float *c = C + i * ldc + j;
            if (direct && !first) {
                AMX_LOAD(0, c, ldc * 4);
                AMX_LOAD(1, c + 16, ldc * 4);
                AMX_LOAD(2, c + 16 * ldc, ldc * 4);
                AMX_LOAD(3, c + 16 * ldc + 16, ldc * 4);
            } else {
                AMX_ZERO(0);
                AMX_ZERO(1);
                AMX_ZERO(2);
                AMX_ZERO(3);
            }
            for (int64_t ch = 0; ch < nch; ch++) {
                const uint32_t *ac = a + ch * AMX_MR * 16, *bc = b + ch * 16 * NR;
                AMX_LOAD(4, ac, 64);
                AMX_LOAD(6, bc, 64);
                AMX_LOAD(7, bc + AMX_TILE_WORDS, 64);
                AMX_DP(0, 4, 6);
                AMX_LOAD(5, ac + 16 * 16, 64);
                AMX_DP(1, 4, 7);
                AMX_DP(2, 5, 6);
                AMX_DP(3, 5, 7);
            }
            if (direct) {
                AMX_STORE(0, c, ldc * 4);
                AMX_STORE(1, c + 16, ldc * 4);
                AMX_STORE(2, c + 16 * ldc, ldc * 4);
                AMX_STORE(3, c + 16 * ldc + 16, ldc * 4);
                continue;
            }
            AMX_STORE(0, t, 128);
            AMX_STORE(1, t + 16, 128);
            AMX_STORE(2, t + 16 * 32, 128);
            AMX_STORE(3, t + 16 * 32 + 16, 128);
            store_amx(t, c, ldc, alpha, first, mi, nj);
        }
    }
    kiln_amx_release();
}
#else
#define BF_AMX 0
#define BF_AMX_MR MR
#endif

/* ---- driver --------------------------------------------------------------- */
bool kiln_k_gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                      int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if ((double)M * (double)N * (double)K < (double)BF_PAR_MIN) nt = 1;
    if (nt < 1) nt = 1;
#if BF_NATIVE
    const bool native = kiln_bf16_native();
#else
    const bool native = false;
#endif
    /* AMX: kiln_bf16_amx() implies native */
    const bool amx = BF_AMX && native && kiln_bf16_amx();
    const int64_t mr = amx ? BF_AMX_MR : MR;
    /* K blocks: balanced, each of an even count (the last may be odd) */
    /* AMX: one block, all of K in the tiles (its sums are its own, not
     * VDPBF16PS's bits, so nothing asks for the 256 blocks; C is then
     * written once) */
    const int64_t nkb0 = amx ? 1 : cdiv(K, BF_KC), kcb = (cdiv(K, nkb0) + 1) / 2 * 2, nkb = cdiv(K, kcb);
    /* 32-bit units per k pair and column (row) of a sliver: a word, or two floats */
    const int64_t upp = native ? 1 : 2, kcu = amx ? amx_pairs(kcb) : kcb / 2 * upp;
    /* B panels of nsp slivers (at least 4), at most about BF_PANEL bytes:
     * over every K block where one such panel covers N (the all-K
     * schedule), else over one K block (the K-outer schedule, as gemm.c's) */
    int64_t nkp, nsp; /* K blocks and slivers in a panel */
    const bool kouter = kiln_gemm_panels(cdiv(N, NR), nkb, kcu * NR * 4, BF_PANEL, &nkp, &nsp);
    /* tasks of a panel: nm row chunks (whole MR slivers, at most MC rows)
     * times nn column chunks (whole NR slivers, at most NCC columns), each
     * over the panel's K blocks (all of K, or the one K-outer); at least
     * about 4 per thread when there is more than one */
    const int64_t ms = cdiv(M, mr);
    int64_t nm = cdiv(ms, imax(1, BF_MC / mr)), nn = cdiv(nsp, BF_NCC / NR);
    kiln_gemm_task_grid(nt, ms, nsp, &nm, &nn);
    const int64_t mcp = cdiv(ms, nm) * mr; /* rows of the largest chunk */
    /* a thread keeps its row chunk of A packed for all of K when that is
     * at most BF_ACACHE bytes: its next task on the same rows (other
     * columns, the next panel) packs nothing; else one K block at a time
     * (K-outer: kept for its next task on the same rows in that K block) */
    const bool acache = !kouter && (size_t)(nkb * kcu * mcp) * 4 <= BF_ACACHE;
    const int64_t ablk = acache ? kcu * mcp : 0; /* words between the K blocks of the packed A */
    const size_t bsz = ((size_t)(nkp * kcu * nsp * NR) + 16) / 16 * 16,
                 asz = ((size_t)(kcu * mcp * (acache ? nkb : 1)) + 16) / 16 * 16;
    const size_t bytes = (bsz + asz * (size_t)nt) * 4;
    uint32_t *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!buf) return false;
    uint32_t *const bpack = buf, *const apack0 = buf + bsz;
    const bool acc0 = beta != 0.0f;
    /* contiguous pairs: A stored M x K, B stored N x K */
    const bool a_contig = !transA, b_contig = transB;

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        uint32_t *const apack = apack0 + asz * (size_t)omp_get_thread_num();
        int64_t a_key = -1; /* what apack holds: a row chunk (all of K, acache) or a (K block, row chunk) */
        for (int64_t b0 = 0; b0 < nkb; b0 += nkp) /* K-outer: each K block; all-K: once */
        for (int64_t jc = 0; jc < N; jc += nsp * NR) {
            const int64_t nc = imin(nsp * NR, N - jc), ns = cdiv(nc, NR);
            /* the panel: its K block b (of nkp), sliver s at bpack + (b nsp + s) kcu NR */
#pragma omp for schedule(dynamic, 4)
            for (int64_t item = 0; item < nkp * ns; item++) {
                const int64_t b = item / ns, s = item % ns, pc = (b0 + b) * kcb, kc = imin(kcb, K - pc);
                const int64_t j0 = jc + s * NR, nj = imin(NR, nc - s * NR);
                uint32_t *dst = bpack + (b * nsp + s) * kcu * NR;
                if (amx) { /* the pairs past the block's, to a multiple of 16: +0 */
                    pack_words(b_contig, B, ldb, j0, nj, NR, pc, kc, 0, cdiv(kc, 2), dst);
                    const int64_t kc2 = cdiv(kc, 2);
                    memset(dst + kc2 * NR, 0, (size_t)((amx_pairs(kc) - kc2) * NR) * 4);
#if BF_AMX
                    tiles_of_b(dst, amx_pairs(kc) / 16);
#endif
                } else if (native)
                    pack_words(b_contig, B, ldb, j0, nj, NR, pc, kc, 0, cdiv(kc, 2), dst);
                else
                    pack_wide(b_contig, B, ldb, j0, nj, NR, pc, kc, (float *)(void *)dst);
            }
            /* (implicit barrier: the panel is packed) */
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < nm * nn; task++) {
                int64_t ms0, ic, mc, msl, ns0, ns1;
                if (!kiln_gemm_task(task, nm, nn, ms, ns, mr, M, &ms0, &ic, &mc, &msl, &ns0, &ns1)) continue;
                const int64_t key = kiln_gemm_a_key(kouter, acache, b0, ms, ms0);
                const bool a_ready = key >= 0 && a_key == key;
                a_key = key;
                for (int64_t b = 0; b < nkp; b++) {
                    const int64_t pc = (b0 + b) * kcb, kc = imin(kcb, K - pc);
                    const int64_t ku = amx ? amx_pairs(kc) : cdiv(kc, 2) * upp;
                    const bool first = pc == 0 && !acc0;
                    uint32_t *const ab = apack + b * ablk;
                    /* native, A stored M x K, an even block: full slivers read in place,
                     * unless the 14 rows fall in one L1 set (see gemm.c's GEMM_AROW_ALIAS;
                     * Zen 4, 2048 x 512 x 8192 NN: 312 GFLOP/s in place, 378 packed) */
                    const bool a_in = native && !amx && a_contig && kc % 2 == 0 && (lda * 2) % KILN_L1_SET_PERIOD != 0;
                    for (int64_t r = 0; r < msl && !a_ready; r++) {
                        const int64_t i0 = ic + r * mr, mi = imin(mr, mc - r * mr);
                        if (a_in && mi == MR) continue;
#if BF_AMX
                        if (amx) {
                            pack_a_amx(a_contig, A, lda, i0, mi, pc, kc, ku, ab + r * mr * ku);
                            continue;
                        }
#endif
#if BF_PACK_NC2
                        if (native && !a_contig && r + 1 < msl) { /* this sliver and the next from one load */
                            pack_words_nc2(A, lda, i0, mc - r * MR, MR, MR * ku, pc, kc, ab + r * MR * ku);
                            r++;
                            continue;
                        }
#endif
                        if (native)
                            pack_words(a_contig, A, lda, i0, mi, MR, pc, kc, 0, cdiv(kc, 2), ab + r * MR * ku);
                        else
                            pack_wide(a_contig, A, lda, i0, mi, MR, pc, kc, (float *)(void *)(ab + r * MR * ku));
                    }
                    const uint32_t *bp = bpack + b * nsp * kcu * NR; /* sliver s at bp + s kcu NR */
#if BF_AMX
                    if (amx) {
                        task_amx(ku, ab, msl, ic, mc, bp, kcu, ns0, ns1, jc, nc, C, ldc, alpha, first);
                        continue;
                    }
#endif
#if BF_NATIVE
                    if (native) {
                        task_native(kc, ab, a_in ? A + pc : NULL, lda, msl, ic, mc, bp, kcu, ns0, ns1, jc, nc, C, ldc,
                                    alpha, first);
                        continue;
                    }
#endif
                    task_emu(kc, (const float *)(void *)ab, msl, ic, mc, (const float *)(void *)bp, kcu, ns0,
                             ns1, jc, nc, C, ldc, alpha, first);
                }
            }
            /* (implicit barrier: the panel is free for the next one) */
        }
    }
    free(buf);
    return true;
}
