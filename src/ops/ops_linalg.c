/* Matrix products and the embedding lookup. */
#include "internal.h"
#include "kiln/backend.h"

/* ---- embedding ---------------------------------------------------------- */
static kiln_status emb_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    /* a frozen table may be held as its file holds it (f16, ggml blocks) */
    bool w_ok = in[0].dtype == KILN_F32 || kiln_dtype_is_dequant(in[0].dtype);
    if (in[0].ndim != 2 || !w_ok || in[1].dtype != KILN_I32 || in[1].ndim > 3)
        return kiln_op_shape_error("embedding", in, 2, "need W [V, C] f32 (or a frozen f16/block table) and ids i32 with at most 3 dims");
    *out = in[1];
    out->dtype = KILN_F32;
    out->shape[out->ndim++] = in[0].shape[1];
    return KILN_OK;
}
static kiln_status emb_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[0] && c->in_meta[0].dtype != KILN_F32)
        return kiln_error(KILN_ERR_UNSUPPORTED, "op embedding: a %s table is frozen: it has no gradient",
                          kiln_dtype_name(c->in_meta[0].dtype));
    if (c->needs[0]) gin[0] = kiln_embedding_backward(g, c->in[1], c->in_meta[0].shape[0]);
    return gin[0] || !c->needs[0] ? KILN_OK : kiln_last_status();
}
const kiln_op_def kiln_opdef_embedding = {
    .name = "embedding", .n_in = 2, .save_in = 2, .nondiff_in = 2,
    .shape = emb_shape, .backward = emb_bw,
};

static kiln_status embbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_I32 || in[0].ndim != in[1].ndim + 1 || a->i[0] <= 0)
        return kiln_op_shape_error("embedding_backward", in, 2, "need g [..., C] and ids [...], vocab > 0");
    int64_t s[2] = {a->i[0], in[0].shape[in[0].ndim - 1]};
    *out = kiln_meta_make(KILN_F32, 2, s);
    return KILN_OK;
}
const kiln_op_def kiln_opdef_embedding_bwd = {
    .name = "embedding_backward", .n_in = 2, .nondiff_in = 2, .shape = embbw_shape,
};

/* ---- matmul ------------------------------------------------------------- */
/* The product as a GEMM from the input metas: the shape rule checks through
 * it and the backends' kernels run it. */
kiln_status kiln_matmul_geometry(const kiln_meta *in, const kiln_attrs *a, kiln_matmul_geom *d, kiln_meta *out) {
    const kiln_meta *A = &in[0], *B = &in[1];
    int mode = (int)a->i[0];
    bool ta = a->i[1], tb = a->i[2];
    *d = (kiln_matmul_geom){.ta = ta, .tb = tb, .batch = 1};
    /* bf16 operands (from the compiler's casts) only for a bf16 product */
    bool ok_a = A->dtype == KILN_F32 || (a->i[3] && A->dtype == KILN_BF16);
    bool ok_b = B->dtype == KILN_F32 || (a->i[3] && B->dtype == KILN_BF16);
    /* a weight held as f16 or ggml blocks: an fp32 product on its
     * dequantized rows (the row product, a 2-D weight of whole blocks) */
    if (kiln_dtype_is_dequant(B->dtype) && ok_a && mode == KILN_MM_ROWS && B->ndim == 2) {
        int blk = kiln_dtype_block(B->dtype);
        if (B->shape[1] % blk)
            return kiln_op_shape_error("matmul", in, 2, "a %s weight needs rows of whole blocks of %d", kiln_dtype_name(B->dtype), blk);
        ok_b = true;
    }
    if (!ok_a || !ok_b)
        return kiln_op_shape_error("matmul", in, 2,
                                   "inputs must be f32 (bf16 only with autocast; an f16 or block weight only as b of a row product)");
    if (mode == KILN_MM_BATCHED) {
        if (A->ndim < 2 || A->ndim != B->ndim)
            return kiln_op_shape_error("matmul", in, 2, "batched product needs equal ranks >= 2");
        int n = A->ndim;
        for (int i = 0; i < n - 2; i++) {
            if (A->shape[i] != B->shape[i])
                return kiln_op_shape_error("matmul", in, 2, "leading dim %d differs", i);
            d->batch *= A->shape[i];
        }
        int64_t ar = A->shape[n - 2], ac = A->shape[n - 1], br = B->shape[n - 2], bc = B->shape[n - 1];
        d->M = ta ? ac : ar;
        d->K = ta ? ar : ac;
        int64_t kb = tb ? bc : br;
        d->N = tb ? br : bc;
        if (kb != d->K) return kiln_op_shape_error("matmul", in, 2, "inner sizes %lld and %lld differ", (long long)d->K, (long long)kb);
        d->lda = ac;
        d->ldb = bc;
        d->ldc = d->N;
        d->stride_a = ar * ac;
        d->stride_b = br * bc;
        d->stride_c = d->M * d->N;
        *out = *A;
        out->dtype = KILN_F32; /* fp32 accumulation and output, bf16 operands or not */
        out->shape[n - 2] = d->M;
        out->shape[n - 1] = d->N;
    } else if (mode == KILN_MM_ROWS) {
        if (ta || A->ndim < 1 || B->ndim != 2)
            return kiln_op_shape_error("matmul", in, 2, "row product needs a [..., K] and b 2-D");
        d->K = A->shape[A->ndim - 1];
        d->M = kiln_meta_rows(A);
        int64_t kb = tb ? B->shape[1] : B->shape[0];
        d->N = tb ? B->shape[0] : B->shape[1];
        if (kb != d->K) return kiln_op_shape_error("matmul", in, 2, "inner sizes %lld and %lld differ", (long long)d->K, (long long)kb);
        d->lda = d->K;
        d->ldb = B->shape[1];
        d->ldc = d->N;
        *out = *A;
        out->dtype = KILN_F32;
        out->shape[out->ndim - 1] = d->N;
    } else if (mode == KILN_MM_GRAD) {
        if (A->ndim < 1 || B->ndim < 1 || kiln_meta_rows(A) != kiln_meta_rows(B))
            return kiln_op_shape_error("matmul", in, 2, "gradient product needs equal row counts");
        d->ta = true;
        d->tb = false;
        d->M = A->shape[A->ndim - 1];
        d->N = B->shape[B->ndim - 1];
        d->K = kiln_meta_rows(A);
        d->lda = d->M;
        d->ldb = d->N;
        d->ldc = d->N;
        int64_t s[2] = {d->M, d->N};
        *out = kiln_meta_make(KILN_F32, 2, s);
    } else {
        return kiln_op_shape_error("matmul", in, 2, "unknown mode %d", mode);
    }
    return KILN_OK;
}
static kiln_status mm_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    kiln_matmul_geom d;
    /* f0 is the kernel's beta: an op call makes a new output */
    if (a->f[0] != 0) return kiln_op_shape_error("matmul", in, 2, "beta (f0) is for kiln_matmul_into, not an op call");
    return kiln_matmul_geometry(in, a, &d, out);
}

/* Runs the backend's MATMUL kernel on these tensors (one device) with
 * beta = attrs f0, outside any dispatcher: nothing is recorded. */
static kiln_status mm_kernel(const char *what, const kiln_tensor *a, const kiln_tensor *b, const kiln_attrs *attrs,
                             kiln_tensor *c) {
    kiln_tensor *in[3] = {(kiln_tensor *)a, (kiln_tensor *)b, c};
    const kiln_backend *be = kiln_backend_of_inputs(what, in, 3);
    if (!be) return kiln_last_status();
    return kiln_backend_run_op(be, KILN_OP_MATMUL, in, attrs, c, NULL);
}

kiln_status kiln_matmul_into(const kiln_tensor *a, const kiln_tensor *b, const kiln_attrs *attrs, kiln_tensor *c, float beta) {
    kiln_meta m[2] = {kiln_meta_of(a), kiln_meta_of(b)}, o;
    kiln_matmul_geom d;
    kiln_status st = kiln_matmul_geometry(m, attrs, &d, &o);
    if (st) return st;
    if (kiln_meta_numel(&o) != kiln_tensor_numel(c)) return kiln_error(KILN_ERR_SHAPE, "matmul_into: output size differs");
    if (beta != 0 && beta != 1) return kiln_error(KILN_ERR_INVALID, "matmul_into: beta must be 0 or 1, got %g", (double)beta);
    kiln_attrs at = *attrs;
    at.f[0] = beta;
    return mm_kernel("matmul_into", a, b, &at, c);
}

static kiln_status mm_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    int mode = (int)c->attrs.i[0];
    bool ta = c->attrs.i[1], tb = c->attrs.i[2], h = c->attrs.i[3]; /* bf16 products stay bf16 */
    kiln_tensor *A = c->in[0], *B = c->in[1];
    if (mode == KILN_MM_BATCHED) {
        if (c->needs[0]) gin[0] = ta ? kiln_matmul_prec(B, g, mode, tb, true, h) : kiln_matmul_prec(g, B, mode, false, !tb, h);
        if (c->needs[1]) gin[1] = tb ? kiln_matmul_prec(g, A, mode, true, ta, h) : kiln_matmul_prec(A, g, mode, !ta, false, h);
    } else if (mode == KILN_MM_ROWS) {
        if (c->needs[1] && kiln_dtype_is_dequant(B->dtype))
            return kiln_error(KILN_ERR_UNSUPPORTED, "op matmul: a %s weight is frozen: it has no gradient", kiln_dtype_name(B->dtype));
        if (c->needs[0]) gin[0] = kiln_matmul_prec(g, B, mode, false, !tb, h);
        if (c->needs[1])
            gin[1] = tb ? kiln_matmul_prec(g, A, KILN_MM_GRAD, false, false, h) : kiln_matmul_prec(A, g, KILN_MM_GRAD, false, false, h);
    } else {
        return kiln_error(KILN_ERR_UNSUPPORTED, "op matmul: the gradient-product mode has no backward");
    }
    for (int i = 0; i < 2; i++)
        if (c->needs[i] && !gin[i]) return kiln_last_status();
    return KILN_OK;
}
static double mm_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)out;
    kiln_matmul_geom d;
    kiln_meta o;
    if (kiln_matmul_geometry(in, a, &d, &o)) return 0;
    return 2.0 * (double)d.batch * (double)d.M * (double)d.N * (double)d.K;
}
const kiln_op_def kiln_opdef_matmul = {
    .name = "matmul", .n_in = 2, .save_in = 3, .shape = mm_shape, .backward = mm_bw,
    .flops = mm_flops,
};

kiln_tensor *kiln_matmul_prec(kiln_tensor *a, kiln_tensor *b, int mode, bool ta, bool tb, bool bf16) {
    kiln_attrs at = {.i = {mode, ta, tb, bf16}};
    kiln_tensor *in[2] = {a, b};
    return kiln_op_call(KILN_OP_MATMUL, in, 2, &at);
}
kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b, int mode, bool ta, bool tb) {
    /* a bf16 operand (a LoRA run's frozen bf16 base, --base-dtype bf16)
     * makes a bf16 product whatever the autocast setting */
    bool held_bf16 = a && b && (a->dtype == KILN_BF16 || b->dtype == KILN_BF16);
    /* an f16 or block weight (a frozen GGUF base) is a product on its
     * dequantized rows: fp32, or bf16 under autocast; batched products
     * (attention's q·kᵀ and P·v) are bf16 under autocast too, as in
     * PyTorch's autocast (bmm, softmax in fp32) */
    bool bf16 = kiln_autocast_get() == KILN_BF16 || held_bf16;
    return kiln_matmul_prec(a, b, mode, ta, tb, bf16);
}
kiln_tensor *kiln_linear(kiln_tensor *x, kiln_tensor *W) { return kiln_matmul(x, W, KILN_MM_ROWS, false, true); }
kiln_tensor *kiln_embedding(kiln_tensor *W, kiln_tensor *ids) {
    kiln_tensor *in[2] = {W, ids};
    return kiln_op_call(KILN_OP_EMBEDDING, in, 2, NULL);
}
kiln_tensor *kiln_embedding_backward(kiln_tensor *g, kiln_tensor *ids, int64_t vocab) {
    kiln_attrs at = {.i = {vocab}};
    kiln_tensor *in[2] = {g, ids};
    return kiln_op_call(KILN_OP_EMBEDDING_BWD, in, 2, &at);
}
