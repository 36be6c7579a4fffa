/* The ops preference objectives are built of (objective.c): per-row
 * log-likelihoods of the targets, row target counts, chosen - rejected of
 * row pairs, log-sigmoid, relu and the indicator x > 0. */
#include "internal.h"

static kiln_tensor *call(int op, kiln_tensor *const *in, int n, int32_t ignore) {
    kiln_attrs a = {.i = {ignore}};
    return kiln_op_call(op, in, n, &a);
}

/* ---- per-row negative log-likelihood ----------------------------------------- */
static kiln_status rownll_check(const char *name, const kiln_meta *in, int n) {
    const kiln_meta *L = &in[0], *T = &in[1];
    if (L->dtype != KILN_F32 || T->dtype != KILN_I32 || T->ndim != 2 || L->ndim != 3 || L->shape[0] != T->shape[0] ||
        L->shape[1] != T->shape[1])
        return kiln_op_shape_error(name, in, n, "need logits [R, T, V] f32 and targets [R, T] i32");
    if (n == 3 && (in[2].dtype != KILN_F32 || kiln_meta_numel(&in[2]) != T->shape[0]))
        return kiln_op_shape_error(name, in, n, "the incoming gradient must be one f32 a row");
    return KILN_OK;
}
static kiln_status rownll_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    *out = kiln_meta_make(KILN_F32, 1, &in[1].shape[0]);
    return rownll_check("row_nll", in, 2);
}
static kiln_status rownll_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_row_nll_backward(c->in[0], c->in[1], g, (int32_t)c->attrs.i[0]);
    return gin[0] ? KILN_OK : kiln_last_status();
}
static double rownll_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)a, (void)out;
    return 4.0 * (double)kiln_meta_numel(&in[0]);
}
const kiln_op_def kiln_opdef_row_nll = {.name = "row_nll", .n_in = 2, .save_in = 3, .nondiff_in = 2, .shape = rownll_shape,
                                        .backward = rownll_bw, .flops = rownll_flops};
static kiln_status rownllbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    *out = in[0];
    return rownll_check("row_nll_backward", in, 3);
}
const kiln_op_def kiln_opdef_row_nll_bwd = {.name = "row_nll_backward", .n_in = 3, .nondiff_in = 6, .shape = rownllbw_shape,
                                            .flops = rownll_flops};

static kiln_status invcount_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_I32 || in[0].ndim != 2) return kiln_op_shape_error("row_inv_count", in, 1, "need targets [R, T] i32");
    *out = kiln_meta_make(KILN_F32, 1, &in[0].shape[0]);
    return KILN_OK;
}
const kiln_op_def kiln_opdef_row_inv_count = {.name = "row_inv_count", .n_in = 1, .nondiff_in = 1, .shape = invcount_shape};

/* ---- chosen - rejected -------------------------------------------------------- */
static kiln_status pd_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[0].ndim != 1 || in[0].shape[0] % 2)
        return kiln_op_shape_error("pair_diff", in, 1, "need x [2P] f32 (rows 2i, 2i+1 a pair)");
    int64_t p = in[0].shape[0] / 2;
    *out = kiln_meta_make(KILN_F32, 1, &p);
    return KILN_OK;
}
static kiln_status pd_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    kiln_attrs a = {.i = {c->attrs.i[0]}};
    gin[0] = kiln_op_call(KILN_OP_PAIR_DIFF_BWD, &g, 1, &a);
    return gin[0] ? KILN_OK : kiln_last_status();
}
const kiln_op_def kiln_opdef_pair_diff = {.name = "pair_diff", .n_in = 1, .shape = pd_shape, .backward = pd_bw};
static kiln_status pdbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[0].ndim != 1) return kiln_op_shape_error("pair_diff_backward", in, 1, "need g [P] f32");
    int64_t n = 2 * in[0].shape[0];
    *out = kiln_meta_make(KILN_F32, 1, &n);
    return KILN_OK;
}
const kiln_op_def kiln_opdef_pair_diff_bwd = {.name = "pair_diff_backward", .n_in = 1, .shape = pdbw_shape};

/* ---- element-wise --------------------------------------------------------------- */
static kiln_status same_f32(const char *name, const kiln_meta *in, int n, kiln_meta *out) {
    for (int i = 0; i < n; i++)
        if (in[i].dtype != KILN_F32 || kiln_meta_numel(&in[i]) != kiln_meta_numel(&in[0]))
            return kiln_op_shape_error(name, in, n, "inputs must be f32 of one shape");
    *out = in[0];
    return KILN_OK;
}
UNARY_WITH_BACKWARD(logsigmoid, "kiln_logsigmoid_f($0)", "kiln_logsigmoid_bwd_f($0, $1)")
UNARY_WITH_BACKWARD(relu, "($0 > 0.0f ? $0 : 0.0f)", "($0 > 0.0f ? $1 : 0.0f)")
UNARY_WITH_BACKWARD(log1mexp, "kiln_log1mexp_f($0)", "kiln_log1mexp_bwd_f($0, $1)")
static kiln_status gt0_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("gt0", in, 1, out);
}
const kiln_op_def kiln_opdef_gt0 = {.name = "gt0", .n_in = 1, .nondiff_in = 1, .shape = gt0_shape,
                                    .cexpr = "($0 > 0.0f ? 1.0f : 0.0f)"};

/* ---- API ------------------------------------------------------------------------- */
kiln_tensor *kiln_row_nll(kiln_tensor *logits, kiln_tensor *targets, int32_t ignore_index) {
    kiln_tensor *in[2] = {logits, targets};
    return call(KILN_OP_ROW_NLL, in, 2, ignore_index);
}
kiln_tensor *kiln_row_nll_backward(kiln_tensor *logits, kiln_tensor *targets, kiln_tensor *g, int32_t ignore_index) {
    kiln_tensor *in[3] = {logits, targets, g};
    return call(KILN_OP_ROW_NLL_BWD, in, 3, ignore_index);
}
kiln_tensor *kiln_row_inv_count(kiln_tensor *targets, int32_t ignore_index) { return call(KILN_OP_ROW_INV_COUNT, &targets, 1, ignore_index); }
kiln_tensor *kiln_pair_diff(kiln_tensor *x) { return kiln_op_call(KILN_OP_PAIR_DIFF, &x, 1, NULL); }
kiln_tensor *kiln_pair_sum(kiln_tensor *x) {
    kiln_attrs a = {.i = {1}};
    return kiln_op_call(KILN_OP_PAIR_DIFF, &x, 1, &a);
}
kiln_tensor *kiln_pair_diff_backward(kiln_tensor *g) { return kiln_op_call(KILN_OP_PAIR_DIFF_BWD, &g, 1, NULL); }
kiln_tensor *kiln_logsigmoid(kiln_tensor *x) { return kiln_op_call(KILN_OP_LOGSIGMOID, &x, 1, NULL); }
kiln_tensor *kiln_logsigmoid_backward(kiln_tensor *x, kiln_tensor *g) {
    kiln_tensor *in[2] = {x, g};
    return kiln_op_call(KILN_OP_LOGSIGMOID_BWD, in, 2, NULL);
}
kiln_tensor *kiln_relu(kiln_tensor *x) { return kiln_op_call(KILN_OP_RELU, &x, 1, NULL); }
kiln_tensor *kiln_relu_backward(kiln_tensor *x, kiln_tensor *g) {
    kiln_tensor *in[2] = {x, g};
    return kiln_op_call(KILN_OP_RELU_BWD, in, 2, NULL);
}
kiln_tensor *kiln_gt0(kiln_tensor *x) { return kiln_op_call(KILN_OP_GT0, &x, 1, NULL); }
kiln_tensor *kiln_log1mexp(kiln_tensor *x) { return kiln_op_call(KILN_OP_LOG1MEXP, &x, 1, NULL); }
kiln_tensor *kiln_log1mexp_backward(kiln_tensor *x, kiln_tensor *g) {
    kiln_tensor *in[2] = {x, g};
    return kiln_op_call(KILN_OP_LOG1MEXP_BWD, in, 2, NULL);
}
