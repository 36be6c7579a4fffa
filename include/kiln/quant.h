/* kiln quant: ggml's tensor block formats (kernels layer; uses core only).
 *
 * Each type is numbered as ggml numbers it (the id in a GGUF tensor info).
 * A row of n values (n a multiple of the type's block size) is n / block
 * blocks of `bytes` bytes each, laid out exactly as ggml's ggml-common.h:
 *
 *   f32, f16, bf16  block 1 (plain values, little endian)
 *   q8_0  32 values in 34 bytes: f16 d, int8 q[32];            x = d*q
 *   q4_0  32 values in 18 bytes: f16 d, u8 qs[16] (value j in the low
 *         nibble of qs[j], value j+16 in its high nibble);     x = d*(q-8)
 *   q4_1  32 values in 20 bytes: f16 d, f16 m, u8 qs[16] (nibbles as
 *         q4_0's);                                         x = d*q + m
 *   q5_0  32 values in 22 bytes: f16 d, u8 qh[4], u8 qs[16]: q's low four
 *         bits in nibbles as q4_0's, its fifth bit value j's bit j of qh
 *         (read as a little-endian u32);                   x = d*(q-16)
 *   q5_1  32 values in 24 bytes: f16 d, f16 m, u8 qh[4], u8 qs[16] (bits
 *         as q5_0's);                                      x = d*q + m
 *   q4_k  256 values in 144 bytes: f16 d, f16 dmin, u8 scales[12] (8 six-bit
 *         scales and 8 six-bit mins), u8 qs[128];  x = d*sc*q - dmin*m
 *   q5_k  256 values in 176 bytes: f16 d, f16 dmin, u8 scales[12],
 *         u8 qh[32] (the fifth bits), u8 qs[128]
 *   q6_k  256 values in 210 bytes: u8 ql[128], u8 qh[64], int8 scales[16],
 *         f16 d;                                           x = d*sc*(q-32)
 *
 * kiln_q_dequantize computes what ggml's to_float computes, bit for bit
 * (the same float operations in the same order). kiln_q_quantize produces
 * ggml's reference quantizer's bytes (quantize_row_*_ref, which is what
 * ggml_quantize_chunk runs without an importance matrix) for the same
 * input: the same scale search (make_qkx2_quants for q4_k/q5_k,
 * make_qx_quants for q6_k; the block's max |x| for q8_0/q4_0/q5_0, its min
 * and max for q4_1/q5_1) in float, in ggml's order. tests/test_quant.c
 * checks both against libggml-base.so. Inputs must be finite. An f16 NaN
 * dequantizes quiet, as ggml's conversion gives it.
 *
 * Errors: KILN_ERR_SHAPE when n is not a multiple of the block size,
 * KILN_ERR_UNSUPPORTED for an unknown type, naming it.
 */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include "kiln/core.h"
#include "kiln/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_QT_F32 = 0,
    KILN_QT_F16 = 1,
    KILN_QT_Q4_0 = 2,
    KILN_QT_Q4_1 = 3,
    KILN_QT_Q5_0 = 6,
    KILN_QT_Q5_1 = 7,
    KILN_QT_Q8_0 = 8,
    KILN_QT_Q4_K = 12,
    KILN_QT_Q5_K = 13,
    KILN_QT_Q6_K = 14,
    KILN_QT_BF16 = 30,
} kiln_qtype;

typedef struct {
    kiln_qtype type; /* ggml's type id */
    const char *name; /* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", ... */
    int block;        /* values per block */
    int bytes;        /* bytes per block */
    bool quantized;   /* a block format with scales (not a plain float) */
} kiln_qtype_info;

int kiln_qtype_count(void);
const kiln_qtype_info *kiln_qtype_at(int i);
const kiln_qtype_info *kiln_qtype_find(int ggml_id);       /* NULL if kiln does not know it */
const kiln_qtype_info *kiln_qtype_by_name(const char *name); /* case-insensitive; NULL if unknown */
/* Bytes of n values; 0 for an unknown type or n not a multiple of the block. */
size_t kiln_q_row_bytes(kiln_qtype t, int64_t n);

kiln_status kiln_q_dequantize(kiln_qtype t, const void *src, float *dst, int64_t n);
/* The ggml type of a kiln dtype (KILN_F32 -> f32, KILN_Q4_K -> q4_k, ...) and
 * back; false when it has none (i32). */
bool kiln_q_of_dtype(kiln_dtype dt, kiln_qtype *out);
bool kiln_dtype_of_q(kiln_qtype t, kiln_dtype *out);

/* ---- products with a dequantized weight ---------------------------------
 * C = A · op(W) + beta C (desc as kiln_gemm_f32's, batch 1, A not
 * transposed) where W is stored in type wt with rows of ldb values: with
 * transB, W is [N, K] (y = x Wᵀ, the forward of a linear layer), else
 * [K, N] (g W, its input gradient). W is dequantized a tile of rows at a
 * time into fp32 scratch (about 4 MB; never the whole matrix) exactly as
 * kiln_q_dequantize does, and each tile is one GEMM: fp32, so the result is
 * the product with the dequantized matrix up to the GEMM's summation order;
 * or with bf16 a bf16 product as kiln_gemm_bf16 computes it (A and each
 * tile rounded to bf16; A may arrive as bf16, a_bf16, the compiler's cast),
 * emulated in fp32 on rounded values where the CPU lacks AVX512-BF16.
 * Errors: a transposed A, a batch, an unknown type (KILN_ERR_INVALID); OOM. */
kiln_status kiln_gemm_dequant(const kiln_gemm_desc *d, const void *A, bool a_bf16, kiln_qtype wt, const void *W, bool bf16,
                              float *C);
/* out[i, :] = dequantized row ids[i] of W [V, dim] (type wt): the embedding
 * lookup of a frozen quantized table. ids are checked by the caller. */
void kiln_k_embedding_dequant(kiln_qtype wt, const void *W, const int32_t *ids, float *out, int64_t n, int64_t dim);
kiln_status kiln_q_quantize(kiln_qtype t, const float *src, void *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
