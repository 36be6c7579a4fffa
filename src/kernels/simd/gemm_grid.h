/* What kiln's packed GEMMs (gemm.c, gemm_bf16.c) share.
 *
 * KILN_L1_SET_PERIOD: bytes after which an address maps to the same set of
 * the L1 data cache (its size over its ways: 32 KB / 8 on Zen 4, 48 KB /
 * 12 on Zen 5; 64-byte lines). Rows of A that far apart (or a multiple of
 * it) share one set.
 *
 * The task grid: a panel's ms row slivers and nsp column slivers are cut
 * into nm row chunks times nn
 * column chunks, starting from *nm and *nn (the chunks' size limits), and
 * cut finer, columns first while there are fewer column chunks than row
 * chunks, until there are at least about 4 tasks per thread (nt > 1) or
 * nothing is left to cut. */
#ifndef KILN_SIMD_GEMM_GRID_H
#define KILN_SIMD_GEMM_GRID_H
#include <stdint.h>

#define KILN_L1_SET_PERIOD 4096

static inline void kiln_gemm_task_grid(int nt, int64_t ms, int64_t nsp, int64_t *nm, int64_t *nn) {
    while (nt > 1 && *nm * *nn < 4 * nt) {
        if (*nn < nsp && (*nn <= *nm || *nm >= ms))
            (*nn)++;
        else if (*nm < ms)
            (*nm)++;
        else
            break;
    }
}
#endif
