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
 * nothing is left to cut, then into more row chunks until the count is a
 * multiple of the thread count. The panels, the tasks and the packed A's key
 * below are the two kernels' shared schedule. */
#ifndef KILN_SIMD_GEMM_GRID_H
#define KILN_SIMD_GEMM_GRID_H
#include <stdbool.h>
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
    /* then whole rounds: a task count that is a multiple of nt, more row
     * chunks first. Equal tasks handed out dynamically finish together only
     * then: 9 tasks on 2 threads take 5 tasks' time, 10 of nine tenths the
     * size take 4.5 (the small model's 1376 x 512 x 2048 TN product, Zen 5,
     * 2 threads: fp32 81 -> 89% of the peak). Row chunks, not column
     * chunks: tasks on one row chunk that two threads take both pack its A
     * (the 8192 x 512 x 2048 TN bf16 product lost 15% when cut in columns) */
    while (nt > 1 && (*nm * *nn) % nt) {
        if (*nm < ms)
            (*nm)++;
        else if (*nn < nsp)
            (*nn)++;
        else
            break;
    }
}

/* The panels of B: nsp slivers (at least 4, at most all ns_all) of about
 * `panel` bytes, over all nkb K blocks where one such panel covers N (the
 * all-K schedule), else over one K block (the K-outer schedule, *nkp 1);
 * `sliver`: the bytes of one sliver over one K block. Returns K-outer. */
static inline bool kiln_gemm_panels(int64_t ns_all, int64_t nkb, int64_t sliver, int64_t panel, int64_t *nkp,
                                    int64_t *nsp) {
    int64_t fit = panel / (nkb * sliver);
    const bool kouter = (fit > 4 ? fit : 4) < ns_all;
    *nkp = kouter ? 1 : nkb;
    fit = panel / (*nkp * sliver);
    fit = fit > 4 ? fit : 4;
    *nsp = fit < ns_all ? fit : ns_all;
    return kouter;
}

/* Task t of the nm x nn grid over ms row slivers of mr rows (M rows in all)
 * and ns column slivers: rows ic .. ic + mc - 1, in msl slivers from sliver
 * ms0, and column slivers ns0 .. ns1 - 1; false when it is empty. Row and
 * column chunks differ by at most one sliver. */
static inline bool kiln_gemm_task(int64_t t, int64_t nm, int64_t nn, int64_t ms, int64_t ns, int64_t mr, int64_t M,
                                  int64_t *ms0, int64_t *ic, int64_t *mc, int64_t *msl, int64_t *ns0, int64_t *ns1) {
    const int64_t r = t / nn, c = t % nn, qm = ms / nm, rm = ms % nm, qn = ns / nn, rn = ns % nn;
    *ms0 = r * qm + (r < rm ? r : rm);
    *msl = qm + (r < rm);
    *ns0 = c * qn + (c < rn ? c : rn);
    *ns1 = *ns0 + qn + (c < rn);
    *ic = *ms0 * mr;
    const int64_t end = (*ms0 + *msl) * mr;
    *mc = (end < M ? end : M) - *ic;
    return *mc > 0 && *ns1 > *ns0;
}

/* What a thread's packed A must hold for a task on the row chunk from
 * sliver ms0 (of ms): that chunk over all of K (acache: kept for the
 * thread's next task on the same rows), the K block b0's (K-outer: kept
 * for its next task on the same rows in that block), or nothing to keep
 * (-1). A thread whose last key equals it packs nothing. */
static inline int64_t kiln_gemm_a_key(bool kouter, bool acache, int64_t b0, int64_t ms, int64_t ms0) {
    return kouter ? b0 * (ms + 1) + ms0 : acache ? ms0 : -1;
}
#endif
