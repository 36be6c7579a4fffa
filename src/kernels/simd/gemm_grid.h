/* The task grid of kiln's packed GEMMs (gemm.c, gemm_bf16.c): a panel's
 * ms row slivers and nsp column slivers are cut into nm row chunks times nn
 * column chunks, starting from *nm and *nn (the chunks' size limits), and
 * cut finer, columns first while there are fewer column chunks than row
 * chunks, until there are at least about 4 tasks per thread (nt > 1) or
 * nothing is left to cut. */
#ifndef KILN_SIMD_GEMM_GRID_H
#define KILN_SIMD_GEMM_GRID_H
#include <stdint.h>

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
