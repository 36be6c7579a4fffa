/* Products and lookups with a weight held in one of ggml's block formats
 * (or F16): tiles of rows dequantized into fp32 scratch, one fp32 GEMM per
 * tile (quant.h). The frozen base of a LoRA run on a GGUF model runs here,
 * forward and input gradient, in eager and compiled steps alike. */
#include <string.h>
#include "kiln/quant.h"

bool kiln_q_of_dtype(kiln_dtype dt, kiln_qtype *out) {
    static const struct {
        kiln_dtype d;
        kiln_qtype q;
    } map[] = {{KILN_F32, KILN_QT_F32},   {KILN_F16, KILN_QT_F16},   {KILN_BF16, KILN_QT_BF16}, {KILN_Q8_0, KILN_QT_Q8_0},
               {KILN_Q4_0, KILN_QT_Q4_0}, {KILN_Q4_K, KILN_QT_Q4_K}, {KILN_Q5_K, KILN_QT_Q5_K}, {KILN_Q6_K, KILN_QT_Q6_K},
               {KILN_Q4_1, KILN_QT_Q4_1}, {KILN_Q5_0, KILN_QT_Q5_0}, {KILN_Q5_1, KILN_QT_Q5_1}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (map[i].d == dt) {
            *out = map[i].q;
            return true;
        }
    return false;
}

bool kiln_dtype_of_q(kiln_qtype t, kiln_dtype *out) {
    for (int d = 0; d < KILN_N_DTYPES; d++) {
        kiln_qtype q;
        if (kiln_q_of_dtype((kiln_dtype)d, &q) && q == t) {
            *out = (kiln_dtype)d;
            return true;
        }
    }
    return false;
}

enum { TILE_FLOATS = 1 << 20 }; /* 4 MB of dequantized rows per tile */

/* rows [r0, r0 + nr) of W (rows of `cols` values, `rb` bytes each) as fp32 */
static void dequant_rows(kiln_qtype wt, const char *W, size_t rb, int64_t r0, int64_t nr, int64_t cols, float *tile) {
#pragma omp parallel for schedule(static) if (nr * cols >= 65536)
    for (int64_t r = 0; r < nr; r++) kiln_q_dequantize(wt, W + (size_t)(r0 + r) * rb, tile + r * cols, cols);
}

kiln_status kiln_gemm_dequant(const kiln_gemm_desc *d, const void *A, bool a_bf16, kiln_qtype wt, const void *W, bool bf16,
                              float *C) {
    const kiln_qtype_info *q = kiln_qtype_find(wt);
    if (!q) return kiln_error(KILN_ERR_INVALID, "kiln_gemm_dequant: unknown weight type %d", (int)wt);
    if (d->transA || d->batch != 1)
        return kiln_error(KILN_ERR_INVALID, "kiln_gemm_dequant: A must be plain rows (no transpose, batch 1)");
    if (a_bf16 && !bf16) return kiln_error(KILN_ERR_INVALID, "kiln_gemm_dequant: a bf16 A makes a bf16 product");
    int64_t cols = d->transB ? d->K : d->N; /* values per stored row of W */
    if (d->ldb != cols || cols % q->block)
        return kiln_error(KILN_ERR_INVALID, "kiln_gemm_dequant: W rows of %lld values (%s blocks of %d)", (long long)d->ldb,
                          q->name, q->block);
    int64_t rows = d->transB ? d->N : d->K;
    size_t rb = kiln_q_row_bytes(wt, cols);
    int64_t per = TILE_FLOATS / (cols ? cols : 1);
    per = per < 16 ? 16 : per & ~(int64_t)15;
    if (per > rows) per = rows;
    if (!rows || !d->M) return KILN_OK;
    /* a bf16 product: A and each tile in the form the bf16 GEMM takes
     * (bf16 where the CPU multiplies bf16, else fp32 rounded to bf16) */
    bool native = bf16 && kiln_bf16_native();
    size_t na = (size_t)d->M * (size_t)d->lda, tile_n = (size_t)per * (size_t)cols;
    size_t a_bytes = bf16 && !(a_bf16 && native) ? na * (native ? 2 : 4) : 0;
    char *buf = kiln_alloc(tile_n * sizeof(float) + (native ? tile_n * 2 : 0) + a_bytes + 64);
    if (!buf) return kiln_last_status();
    float *tile = (float *)buf;
    uint16_t *tile16 = native ? (uint16_t *)(buf + tile_n * sizeof(float)) : NULL;
    void *a_conv = a_bytes ? buf + tile_n * sizeof(float) + (native ? tile_n * 2 : 0) : NULL;
    const void *a_use = A;
    if (a_conv) {
        if (a_bf16) { /* emulated: widen exactly */
            const uint16_t *h = A;
            kiln_k_bf16_to_f32(h, (float *)a_conv, (int64_t)na);
        } else if (native) {
            kiln_k_f32_to_bf16(A, a_conv, (int64_t)na);
        } else {
            kiln_k_round_bf16(A, a_conv, (int64_t)na);
        }
        a_use = a_conv;
    }
    size_t a_es = native ? 2 : 4;
    kiln_status st = KILN_OK;
    for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
        int64_t nr = rows - r0 < per ? rows - r0 : per;
        dequant_rows(wt, W, rb, r0, nr, cols, tile);
        if (native) kiln_k_f32_to_bf16(tile, tile16, nr * cols);
        else if (bf16) kiln_k_round_bf16(tile, tile, nr * cols);
        kiln_gemm_desc t = *d;
        const char *a_at = a_use;
        float *c_at = C;
        t.ldb = cols;
        if (d->transB) { /* columns [r0, r0 + nr) of C from rows [r0, +nr) of W */
            t.N = nr;
            c_at = C + r0;
        } else { /* C += A[:, r0 : r0 + nr] · W[r0 : r0 + nr, :] */
            t.K = nr;
            a_at += (size_t)r0 * a_es;
            if (r0) t.beta = 1;
        }
        st = native ? kiln_gemm_bf16(&t, (const uint16_t *)a_at, tile16, c_at)
                    : kiln_gemm_f32(&t, (const float *)a_at, tile, c_at);
    }
    kiln_dealloc(buf);
    return st;
}

void kiln_k_embedding_dequant(kiln_qtype wt, const void *W, const int32_t *ids, float *out, int64_t n, int64_t dim) {
    size_t rb = kiln_q_row_bytes(wt, dim);
#pragma omp parallel for schedule(static) if (n * dim >= 65536)
    for (int64_t i = 0; i < n; i++) kiln_q_dequantize(wt, (const char *)W + (size_t)ids[i] * rb, out + i * dim, dim);
}
