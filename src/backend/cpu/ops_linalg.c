/* CPU kernels of the matrix products and the embedding lookup (their
 * definitions: src/ops/ops_linalg.c). */
#include "cpu_ops.h"

kiln_status kiln_cpu_op_embedding(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    int64_t n = kiln_tensor_numel(in[1]), V = in[0]->shape[0];
    const int32_t *ids = kiln_i32(in[1]);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return kiln_error(KILN_ERR_RANGE, "op embedding: token id %d at position %lld is outside [0, %lld)",
                              ids[i], (long long)i, (long long)V);
    kiln_qtype wt;
    if (in[0]->dtype != KILN_F32 && kiln_q_of_dtype(in[0]->dtype, &wt))
        kiln_k_embedding_dequant(wt, in[0]->data, ids, kiln_f32(out), n, in[0]->shape[1]);
    else
        kiln_k_embedding(kiln_f32(in[0]), ids, kiln_f32(out), n, in[0]->shape[1]);
    return KILN_OK;
}

kiln_status kiln_cpu_op_embedding_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    memset(out->data, 0, kiln_tensor_nbytes(out));
    kiln_k_embedding_backward(kiln_f32(in[0]), kiln_i32(in[1]), kiln_f32(out), kiln_tensor_numel(in[1]),
                              out->shape[1], a->i[0]);
    return KILN_OK;
}

/* C = A·B + beta·C per the descriptor; with i3 the operands are rounded to
 * bf16 in scratch (both tensors are contiguous, so the descriptor's strides
 * still hold) and the product accumulates in fp32. Where bf16 is emulated,
 * an operand i5 marks as rounded already (round_bf16) is used as it is. */
static kiln_status mm_run(const kiln_gemm_desc *d, const kiln_attrs *a, const kiln_tensor *A, const kiln_tensor *B,
                          float *C) {
    kiln_qtype wt;
    if (kiln_dtype_is_dequant(B->dtype) && kiln_q_of_dtype(B->dtype, &wt))
        return kiln_gemm_dequant(d, A->data, A->dtype == KILN_BF16, wt, B->data, a->i[3] != 0, C);
    if (!a->i[3])
        return a->i[4] == KILN_GEMM_SGEMM ? kiln_gemm_f32_sgemm(d, kiln_f32(A), kiln_f32(B), C)
                                          : kiln_gemm_f32(d, kiln_f32(A), kiln_f32(B), C);
    /* each operand in the form the GEMM takes: bf16 (native) or
     * bf16-rounded fp32 (emulated); bf16 inputs are used as they are */
    bool native = kiln_bf16_native();
    const kiln_tensor *op[2] = {A, B};
    const void *ptr[2];
    size_t esz = native ? 2 : 4, off[3] = {0};
    bool ready[2];
    for (int i = 0; i < 2; i++) {
        ready[i] = !native && op[i]->dtype == KILN_F32 && (a->i[5] >> i & 1);
        bool need = !ready[i] && (op[i]->dtype == KILN_F32 || !native);
        off[i + 1] = off[i] + (need ? (((size_t)kiln_tensor_numel(op[i]) * esz + 63) & ~(size_t)63) : 0);
    }
    char *buf = off[2] ? kiln_alloc(off[2]) : NULL;
    if (off[2] && !buf) return kiln_last_status();
    for (int i = 0; i < 2; i++) {
        int64_t n = kiln_tensor_numel(op[i]);
        char *dst = buf ? buf + off[i] : NULL; /* NULL: no operand needs scratch */
        if ((op[i]->dtype == KILN_BF16 && native) || ready[i]) {
            ptr[i] = op[i]->data;
        } else if (op[i]->dtype == KILN_BF16) { /* emulated: widen exactly */
            kiln_k_bf16_to_f32(op[i]->data, (float *)dst, n);
            ptr[i] = dst;
        } else if (native) {
            kiln_k_f32_to_bf16(kiln_f32(op[i]), (uint16_t *)dst, n);
            ptr[i] = dst;
        } else {
            kiln_k_round_bf16(kiln_f32(op[i]), (float *)dst, n);
            ptr[i] = dst;
        }
    }
    kiln_status st = native ? kiln_gemm_bf16(d, ptr[0], ptr[1], C) : kiln_gemm_f32(d, ptr[0], ptr[1], C);
    kiln_dealloc(buf);
    return st;
}

/* out = A·B + f0·out (f0 = beta: 0 for an op call, 1 accumulates for
 * kiln_matmul_into); the product's geometry comes from the op's own rule */
kiln_status kiln_cpu_op_matmul(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    kiln_meta m[2] = {kiln_meta_of(in[0]), kiln_meta_of(in[1])}, o;
    kiln_matmul_geom g;
    kiln_status st = kiln_matmul_geometry(m, a, &g, &o);
    if (st) return st;
    if (kiln_meta_numel(&o) != kiln_tensor_numel(out)) return kiln_error(KILN_ERR_SHAPE, "op matmul: output size differs");
    kiln_gemm_desc d = {.transA = g.ta, .transB = g.tb, .M = g.M, .N = g.N, .K = g.K, .lda = g.lda, .ldb = g.ldb,
                        .ldc = g.ldc, .batch = g.batch, .strideA = g.stride_a, .strideB = g.stride_b,
                        .strideC = g.stride_c, .alpha = 1, .beta = (float)a->f[0]};
    return mm_run(&d, a, in[0], in[1], kiln_f32(out));
}
