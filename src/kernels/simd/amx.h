/* AMX tiles for kiln's bf16 kernels (and the 16 x 16 transpose of 32-bit
 * words their packing uses) (gemm_bf16.c, attention.c): one tile
 * configuration, every tile 16 rows x 64 bytes (a 16 x 16 fp32 accumulator,
 * 16 rows x 32 bf16 of A, or 16 pair rows x 16 words of B in the VNNI
 * layout), and the instructions as inline asm with the tile registers named
 * in the text (compilers' intrinsics differ in what they need enabled; the
 * assembler knows AMX since binutils 2.36). Only the avx512 form on x86-64
 * includes the code; callers run it when kiln_bf16_amx() says the CPU and
 * the OS allow it. */
#ifndef KILN_SIMD_AMX_H
#define KILN_SIMD_AMX_H
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
/* r[i] (row i, 16 words) -> r[c] (column c, 16 rows) */
static inline __attribute__((always_inline)) void kiln_tr16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        t[2 * g] = _mm512_unpacklo_epi32(r[2 * g], r[2 * g + 1]);
        t[2 * g + 1] = _mm512_unpackhi_epi32(r[2 * g], r[2 * g + 1]);
    }
    /* u[4h + q]: in 128-bit lane L, rows 4h..4h+3 of column 4L + q */
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512i x0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), x1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xDD);
        __m512i y0 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88),
                y1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xDD);
        r[q] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        r[8 + q] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        r[4 + q] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        r[12 + q] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}
#endif

#if defined(__AVX512F__) && defined(__x86_64__) && defined(__GNUC__)
#define KILN_AMX 1

/* palette 1, tiles 0..7 of 16 rows x 64 bytes (per thread: load it before
 * the first tile instruction of a run of them) */
static inline void kiln_amx_config(void) {
    struct __attribute__((aligned(64))) {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg) : "memory");
}
/* back to the initial state (the OS then saves no tile data for the thread) */
static inline void kiln_amx_release(void) { __asm__ volatile("tilerelease" : : : "memory"); }
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t : :)
#define AMX_LOAD(t, p, stride) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(p), "r"((int64_t)(stride)) : "memory")
#define AMX_STORE(t, p, stride) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"(p), "r"((int64_t)(stride)) : "memory")
/* tmm d += tmm a (16 rows x 16 bf16 pairs) . tmm b (16 pair rows x 16 columns) */
#define AMX_DP(d, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #d : :)
#else
#define KILN_AMX 0
#endif
#endif
