/* Matrix products and the embedding lookup. */
#include "internal.h"

/* ---- embedding ---------------------------------------------------------- */
static kiln_status emb_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].ndim != 2 || in[0].dtype != KILN_F32 || in[1].dtype != KILN_I32 || in[1].ndim > 3)
        return kiln_op_shape_error("embedding", in, 2, "need W [V, C] f32 and ids i32 with at most 3 dims");
    *out = in[1];
    out->dtype = KILN_F32;
    out->shape[out->ndim++] = in[0].shape[1];
    return KILN_OK;
}
static kiln_status emb_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    int64_t n = kiln_tensor_numel(in[1]), V = in[0]->shape[0];
    const int32_t *ids = kiln_i32(in[1]);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return kiln_error(KILN_ERR_RANGE, "op embedding: token id %d at position %lld is outside [0, %lld)",
                              ids[i], (long long)i, (long long)V);
    kiln_k_embedding(kiln_f32(in[0]), ids, kiln_f32(out), n, in[0]->shape[1]);
    return KILN_OK;
}
static kiln_status emb_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[0]) gin[0] = kiln_embedding_backward(g, c->in[1], c->in_meta[0].shape[0]);
    return gin[0] || !c->needs[0] ? KILN_OK : kiln_last_status();
}
const kiln_op_def kiln_opdef_embedding = {
    .name = "embedding", .n_in = 2, .save_in = 2, .nondiff_in = 2,
    .shape = emb_shape, .forward = emb_fwd, .backward = emb_bw,
};

static kiln_status embbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_I32 || in[0].ndim != in[1].ndim + 1 || a->i[0] <= 0)
        return kiln_op_shape_error("embedding_backward", in, 2, "need g [..., C] and ids [...], vocab > 0");
    int64_t s[2] = {a->i[0], in[0].shape[in[0].ndim - 1]};
    *out = kiln_meta_make(KILN_F32, 2, s);
    return KILN_OK;
}
static kiln_status embbw_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    memset(out->data, 0, kiln_tensor_nbytes(out));
    kiln_k_embedding_backward(kiln_f32(in[0]), kiln_i32(in[1]), kiln_f32(out), kiln_tensor_numel(in[1]),
                              out->shape[1], a->i[0]);
    return KILN_OK;
}
const kiln_op_def kiln_opdef_embedding_bwd = {
    .name = "embedding_backward", .n_in = 2, .nondiff_in = 2, .shape = embbw_shape, .forward = embbw_fwd,
};

/* ---- matmul ------------------------------------------------------------- */
/* Fills a gemm descriptor from input metas; also used by the shape rule. */
static kiln_status mm_desc(const kiln_meta *in, const kiln_attrs *a, kiln_gemm_desc *d, kiln_meta *out) {
    const kiln_meta *A = &in[0], *B = &in[1];
    int mode = (int)a->i[0];
    bool ta = a->i[1], tb = a->i[2];
    *d = (kiln_gemm_desc){.transA = ta, .transB = tb, .alpha = 1, .beta = 0, .batch = 1};
    /* bf16 operands (from the compiler's casts) only for a bf16 product */
    bool ok_a = A->dtype == KILN_F32 || (a->i[3] && A->dtype == KILN_BF16);
    bool ok_b = B->dtype == KILN_F32 || (a->i[3] && B->dtype == KILN_BF16);
    if (!ok_a || !ok_b) return kiln_op_shape_error("matmul", in, 2, "inputs must be f32 (bf16 only with autocast)");
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
        d->strideA = ar * ac;
        d->strideB = br * bc;
        d->strideC = d->M * d->N;
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
        d->transA = true;
        d->transB = false;
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
    kiln_gemm_desc d;
    return mm_desc(in, a, &d, out);
}
/* C = A·B per the descriptor; with i3 the operands are rounded to bf16 in
 * scratch (both tensors are contiguous, so the descriptor's strides still
 * hold) and the product accumulates in fp32. */
static kiln_status mm_run(const kiln_gemm_desc *d, const kiln_attrs *a, const kiln_tensor *A, const kiln_tensor *B,
                          float *C) {
    if (!a->i[3])
        return a->i[4] == KILN_GEMM_SGEMM ? kiln_gemm_f32_sgemm(d, kiln_f32(A), kiln_f32(B), C)
                                          : kiln_gemm_f32(d, kiln_f32(A), kiln_f32(B), C);
    /* each operand in the form the GEMM takes: bf16 (native) or
     * bf16-rounded fp32 (emulated); bf16 inputs are used as they are */
    bool native = kiln_bf16_native();
    const kiln_tensor *op[2] = {A, B};
    const void *ptr[2];
    size_t esz = native ? 2 : 4, off[3] = {0};
    for (int i = 0; i < 2; i++) {
        bool need = op[i]->dtype == KILN_F32 || !native;
        off[i + 1] = off[i] + (need ? (((size_t)kiln_tensor_numel(op[i]) * esz + 63) & ~(size_t)63) : 0);
    }
    char *buf = off[2] ? kiln_alloc(off[2]) : NULL;
    if (off[2] && !buf) return kiln_last_status();
    for (int i = 0; i < 2; i++) {
        int64_t n = kiln_tensor_numel(op[i]);
        char *dst = buf + off[i];
        if (op[i]->dtype == KILN_BF16 && native) {
            ptr[i] = op[i]->data;
        } else if (op[i]->dtype == KILN_BF16) { /* emulated: widen exactly */
            const uint16_t *s = op[i]->data;
            for (int64_t j = 0; j < n; j++) ((float *)dst)[j] = kiln_bf16_to_f32(s[j]);
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
static kiln_status mm_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    kiln_meta m[2] = {kiln_meta_of(in[0]), kiln_meta_of(in[1])}, o;
    kiln_gemm_desc d;
    kiln_status st = mm_desc(m, a, &d, &o);
    if (st) return st;
    return mm_run(&d, a, in[0], in[1], kiln_f32(out));
}
static double best_of(kiln_status (*run)(const kiln_gemm_desc *, const float *, const float *, float *),
                      const kiln_gemm_desc *d, const float *A, const float *B, float *C) {
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = kiln_time_now();
        if (run(d, A, B, C)) return 1e30;
        double dt = kiln_time_now() - t0;
        if (rep && dt < best) best = dt; /* the first call creates primitives */
    }
    return best;
}

int kiln_matmul_fastest(const kiln_tensor *a, const kiln_tensor *b, const kiln_attrs *attrs) {
    kiln_meta m[2] = {kiln_meta_of(a), kiln_meta_of(b)}, o;
    kiln_gemm_desc d;
    if (attrs->i[3] || mm_desc(m, attrs, &d, &o)) return KILN_GEMM_PRIMITIVE;
    float *C = kiln_alloc(sizeof(float) * (size_t)(kiln_meta_numel(&o) + 16));
    if (!C) return KILN_GEMM_PRIMITIVE;
    d.beta = 0;
    double tp = best_of(kiln_gemm_f32, &d, kiln_f32(a), kiln_f32(b), C);
    double ts = best_of(kiln_gemm_f32_sgemm, &d, kiln_f32(a), kiln_f32(b), C);
    kiln_dealloc(C);
    kiln_clear_error();
    return ts < 0.97 * tp ? KILN_GEMM_SGEMM : KILN_GEMM_PRIMITIVE; /* a clear win only */
}

kiln_status kiln_matmul_into(const kiln_tensor *a, const kiln_tensor *b, const kiln_attrs *attrs, kiln_tensor *c, float beta) {
    kiln_meta m[2] = {kiln_meta_of(a), kiln_meta_of(b)}, o;
    kiln_gemm_desc d;
    kiln_status st = mm_desc(m, attrs, &d, &o);
    if (st) return st;
    if (kiln_meta_numel(&o) != kiln_tensor_numel(c)) return kiln_error(KILN_ERR_SHAPE, "matmul_into: output size differs");
    d.beta = beta;
    return mm_run(&d, attrs, a, b, kiln_f32(c));
}

static kiln_status mm_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    int mode = (int)c->attrs.i[0];
    bool ta = c->attrs.i[1], tb = c->attrs.i[2], h = c->attrs.i[3]; /* bf16 products stay bf16 */
    kiln_tensor *A = c->in[0], *B = c->in[1];
    if (mode == KILN_MM_BATCHED) {
        if (c->needs[0]) gin[0] = ta ? kiln_matmul_prec(B, g, mode, tb, true, h) : kiln_matmul_prec(g, B, mode, false, !tb, h);
        if (c->needs[1]) gin[1] = tb ? kiln_matmul_prec(g, A, mode, true, ta, h) : kiln_matmul_prec(A, g, mode, !ta, false, h);
    } else if (mode == KILN_MM_ROWS) {
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
    kiln_gemm_desc d;
    kiln_meta o;
    if (mm_desc(in, a, &d, &o)) return 0;
    return 2.0 * (double)d.batch * (double)d.M * (double)d.N * (double)d.K;
}
const kiln_op_def kiln_opdef_matmul = {
    .name = "matmul", .n_in = 2, .save_in = 3, .shape = mm_shape, .forward = mm_fwd, .backward = mm_bw,
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
    bool bf16 = mode != KILN_MM_BATCHED && (kiln_autocast_get() == KILN_BF16 || held_bf16);
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
