/* Element-wise, broadcast, reduction and layout ops. */
#include "internal.h"

static kiln_tensor *call1(int op, kiln_tensor *x, const kiln_attrs *a) { return kiln_op_call(op, &x, 1, a); }
static kiln_tensor *call2(int op, kiln_tensor *x, kiln_tensor *y, const kiln_attrs *a) {
    kiln_tensor *in[2] = {x, y};
    return kiln_op_call(op, in, 2, a);
}
static kiln_status need_ok(const kiln_bw_ctx *c, kiln_tensor **gin) {
    for (int i = 0; i < c->n_in; i++)
        if (c->needs[i] && !gin[i]) return kiln_last_status() ? kiln_last_status() : KILN_ERR_INVALID;
    return KILN_OK;
}
static kiln_status same_f32(const char *name, const kiln_meta *in, int n, kiln_meta *out) {
    for (int i = 0; i < n; i++) {
        if (in[i].dtype != KILN_F32) return kiln_op_shape_error(name, in, n, "inputs must be f32");
        if (i && (in[i].ndim != in[0].ndim || memcmp(in[i].shape, in[0].shape, sizeof(int64_t) * (size_t)in[0].ndim)))
            return kiln_op_shape_error(name, in, n, "shapes differ");
    }
    *out = in[0];
    return KILN_OK;
}

/* ---- tanh and GELU (tanh approximation): Gemma's soft-capping and GeGLU -- */
UNARY_WITH_BACKWARD(tanh, "tanhf($0)", "kiln_tanh_bwd_f($0, $1)")
UNARY_WITH_BACKWARD(gelu_tanh, "kiln_gelu_tanh_f($0)", "kiln_gelu_tanh_bwd_f($0, $1)")

/* ---- add (b broadcasts to a) -------------------------------------------- */
static kiln_status add_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_F32 || in[1].ndim > in[0].ndim)
        return kiln_op_shape_error("add", in, 2, "need f32 inputs, b with no more dims than a");
    int off = in[0].ndim - in[1].ndim;
    for (int i = 0; i < in[1].ndim; i++)
        if (in[1].shape[i] != 1 && in[1].shape[i] != in[0].shape[i + off])
            return kiln_op_shape_error("add", in, 2, "b does not broadcast to a in dim %d", i + off);
    *out = in[0];
    return KILN_OK;
}
static kiln_status add_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[0]) gin[0] = kiln_tensor_retain(g);
    if (c->needs[1]) {
        const kiln_meta *mb = &c->in_meta[1];
        gin[1] = kiln_meta_numel(mb) == kiln_tensor_numel(g) ? kiln_reshape(g, mb->ndim, mb->shape)
                                                            : kiln_sum_to(g, mb->ndim, mb->shape);
    }
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_add = {.name = "add", .n_in = 2, .shape = add_shape, .backward = add_bw,
                                    .cexpr = "($0 + $1)"};

/* ---- mul ---------------------------------------------------------------- */
static kiln_status mul_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("mul", in, 2, out);
}
static kiln_status mul_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[0]) gin[0] = kiln_mul(g, c->in[1]);
    if (c->needs[1]) gin[1] = kiln_mul(g, c->in[0]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_mul = {.name = "mul", .n_in = 2, .save_in = 3, .shape = mul_shape, .backward = mul_bw,
                                    .cexpr = "($0 * $1)"};

/* ---- scale, scale_by ----------------------------------------------------- */
static kiln_status scale_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("scale", in, 1, out);
}
static kiln_status scale_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_scale(g, c->attrs.f[0]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_scale = {.name = "scale", .n_in = 1, .shape = scale_shape, .backward = scale_bw,
                                      .cexpr = "($0 * $f0)"};

static kiln_status scaleby_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_F32 || kiln_meta_numel(&in[1]) != 1)
        return kiln_op_shape_error("scale_by", in, 2, "need f32 x and a one-element f32 scalar");
    *out = in[0];
    return KILN_OK;
}
static kiln_status scaleby_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[1]) return kiln_error(KILN_ERR_UNSUPPORTED, "op scale_by: no gradient for the scalar");
    gin[0] = kiln_scale_by(g, c->in[1]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_scale_by = {.name = "scale_by", .n_in = 2, .save_in = 2, .nondiff_in = 2, .cexpr = "($0 * $1)",
                                         .shape = scaleby_shape, .backward = scaleby_bw};

/* ---- silu ---------------------------------------------------------------- */
static kiln_status silu_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("silu", in, 1, out);
}
static kiln_status silu_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_silu_backward(c->in[0], g);
    return need_ok(c, gin);
}
static double silu_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)in, (void)a;
    return 4.0 * (double)kiln_meta_numel(out);
}
const kiln_op_def kiln_opdef_silu = {.name = "silu", .n_in = 1, .save_in = 1, .shape = silu_shape, .cexpr = "kiln_silu_f($0)",
                                     .backward = silu_bw, .flops = silu_flops};
static kiln_status silubw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("silu_backward", in, 2, out);
}
const kiln_op_def kiln_opdef_silu_bwd = {.name = "silu_backward", .n_in = 2, .shape = silubw_shape,
                                         .cexpr = "kiln_silu_bwd_f($0, $1)",
                                         .flops = silu_flops};

/* ---- sum, mean, expand, sum_to ------------------------------------------- */
static kiln_status red_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32) return kiln_op_shape_error("sum", in, 1, "input must be f32");
    int64_t one = 1;
    *out = kiln_meta_make(KILN_F32, 1, &one);
    return KILN_OK;
}
static kiln_status sum_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_expand(g, c->in_meta[0].ndim, c->in_meta[0].shape);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_sum = {.name = "sum", .n_in = 1, .shape = red_shape, .backward = sum_bw};
static kiln_status mean_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    int64_t n = kiln_meta_numel(&c->in_meta[0]);
    kiln_tensor *e = kiln_expand(g, c->in_meta[0].ndim, c->in_meta[0].shape);
    gin[0] = kiln_scale(e, 1.0 / (double)(n ? n : 1));
    kiln_tensor_release(e);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_mean = {.name = "mean", .n_in = 1, .shape = red_shape, .backward = mean_bw};

static kiln_status expand_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].dtype != KILN_F32 || kiln_meta_numel(&in[0]) != 1 || a->i[0] < 0 || a->i[0] > KILN_MAX_DIMS)
        return kiln_op_shape_error("expand", in, 1, "need a one-element f32 and a shape of at most 4 dims");
    *out = kiln_attrs_shape(a, KILN_F32);
    return KILN_OK;
}
static kiln_status expand_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_sum(g);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_expand = {.name = "expand", .n_in = 1, .shape = expand_shape, .backward = expand_bw};

static kiln_status sumto_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    kiln_meta t = kiln_attrs_shape(a, KILN_F32);
    kiln_meta pair[2] = {in[0], t};
    kiln_meta dummy;
    if (add_shape(pair, a, &dummy)) return kiln_op_shape_error("sum_to", pair, 2, "target shape does not broadcast to the input");
    *out = t;
    return KILN_OK;
}
const kiln_op_def kiln_opdef_sum_to = {.name = "sum_to", .n_in = 1, .shape = sumto_shape};

static kiln_status fill_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (a->i[0] < 0 || a->i[0] > KILN_MAX_DIMS) return kiln_op_shape_error("fill", in, 0, "bad rank %lld", (long long)a->i[0]);
    *out = kiln_attrs_shape(a, KILN_F32);
    return KILN_OK;
}
const kiln_op_def kiln_opdef_fill = {.name = "fill", .n_in = 0, .shape = fill_shape};

/* ---- bf16 cast (the compiler inserts it before bf16 products, so the
 * operand is converted once, inside its producer's fused loop, and kept for
 * backward at half the size) ----------------------------------------------- */
static kiln_status cast_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32) return kiln_op_shape_error("cast_bf16", in, 1, "input must be f32");
    *out = in[0];
    out->dtype = KILN_BF16;
    return KILN_OK;
}
static kiln_status cast_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_tensor_retain(g); /* d cast(x) / dx = 1: the gradient stays fp32 */
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_cast_bf16 = {.name = "cast_bf16", .n_in = 1, .shape = cast_shape,
                                          .backward = cast_bw, .cexpr = "$0"};

/* The same rounding held in fp32: where bf16 products are emulated (fp32
 * GEMMs of rounded operands) the compiler inserts this instead of the cast,
 * and marks the product's operand as rounded (MATMUL i5), so the product
 * uses it as it is instead of widening a bf16 copy on every call. */
static kiln_status round_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32) return kiln_op_shape_error("round_bf16", in, 1, "input must be f32");
    *out = in[0];
    return KILN_OK;
}
const kiln_op_def kiln_opdef_round_bf16 = {.name = "round_bf16", .n_in = 1, .shape = round_shape,
                                           .backward = cast_bw, .cexpr = "kiln_round_bf16f($0)"};

/* ---- reshape (a view) and transpose12 ------------------------------------ */
static kiln_status reshape_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (a->i[0] < 0 || a->i[0] > KILN_MAX_DIMS) return kiln_op_shape_error("reshape", in, 1, "bad rank %lld", (long long)a->i[0]);
    *out = kiln_attrs_shape(a, in[0].dtype);
    if (kiln_meta_numel(out) != kiln_meta_numel(&in[0])) {
        char b[96];
        return kiln_op_shape_error("reshape", in, 1, "cannot reshape to %s", kiln_meta_str(out, b, sizeof b));
    }
    return KILN_OK;
}
static kiln_status reshape_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_reshape(g, c->in_meta[0].ndim, c->in_meta[0].shape);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_reshape = {.name = "reshape", .n_in = 1, .is_view = true, .shape = reshape_shape, .backward = reshape_bw};

static kiln_status tr_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].ndim != 4) return kiln_op_shape_error("transpose12", in, 1, "needs 4 dims");
    *out = in[0];
    out->shape[1] = in[0].shape[2];
    out->shape[2] = in[0].shape[1];
    return KILN_OK;
}
static kiln_status tr_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_transpose12(g);
    return need_ok(c, gin);
}
static double zero_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)in, (void)a, (void)out;
    return 0;
}
const kiln_op_def kiln_opdef_transpose12 = {.name = "transpose12", .n_in = 1, .shape = tr_shape,
                                            .backward = tr_bw, .flops = zero_flops};

/* ---- API ------------------------------------------------------------------ */
kiln_tensor *kiln_add(kiln_tensor *a, kiln_tensor *b) { return call2(KILN_OP_ADD, a, b, NULL); }
kiln_tensor *kiln_mul(kiln_tensor *a, kiln_tensor *b) { return call2(KILN_OP_MUL, a, b, NULL); }
kiln_tensor *kiln_scale(kiln_tensor *x, double c) {
    kiln_attrs a = {.f = {c}};
    return call1(KILN_OP_SCALE, x, &a);
}
kiln_tensor *kiln_scale_by(kiln_tensor *x, kiln_tensor *s) { return call2(KILN_OP_SCALE_BY, x, s, NULL); }
kiln_tensor *kiln_silu(kiln_tensor *x) { return call1(KILN_OP_SILU, x, NULL); }
kiln_tensor *kiln_silu_backward(kiln_tensor *x, kiln_tensor *g) { return call2(KILN_OP_SILU_BWD, x, g, NULL); }
kiln_tensor *kiln_sum(kiln_tensor *x) { return call1(KILN_OP_SUM, x, NULL); }
kiln_tensor *kiln_mean(kiln_tensor *x) { return call1(KILN_OP_MEAN, x, NULL); }
kiln_tensor *kiln_expand(kiln_tensor *g, int ndim, const int64_t *shape) {
    kiln_attrs a = {0};
    kiln_attrs_set_shape(&a, ndim, shape);
    return call1(KILN_OP_EXPAND, g, &a);
}
kiln_tensor *kiln_sum_to(kiln_tensor *g, int ndim, const int64_t *shape) {
    kiln_attrs a = {0};
    kiln_attrs_set_shape(&a, ndim, shape);
    return call1(KILN_OP_SUM_TO, g, &a);
}
kiln_tensor *kiln_cast_bf16(kiln_tensor *x) { return call1(KILN_OP_CAST_BF16, x, NULL); }
kiln_tensor *kiln_round_bf16(kiln_tensor *x) { return call1(KILN_OP_ROUND_BF16, x, NULL); }
kiln_tensor *kiln_fill(int ndim, const int64_t *shape, double value) {
    kiln_attrs a = {.f = {value}};
    if (ndim < 0 || ndim > KILN_MAX_DIMS) {
        kiln_error(KILN_ERR_SHAPE, "op fill: rank %d (at most %d)", ndim, KILN_MAX_DIMS);
        return NULL;
    }
    kiln_attrs_set_shape(&a, ndim, shape);
    return kiln_op_call(KILN_OP_FILL, NULL, 0, &a);
}
kiln_tensor *kiln_reshape(kiln_tensor *x, int ndim, const int64_t *shape) {
    kiln_attrs a = {0};
    if (ndim < 0 || ndim > KILN_MAX_DIMS) {
        kiln_error(KILN_ERR_SHAPE, "op reshape: rank %d (at most %d)", ndim, KILN_MAX_DIMS);
        return NULL;
    }
    kiln_attrs_set_shape(&a, ndim, shape);
    return call1(KILN_OP_RESHAPE, x, &a);
}
kiln_tensor *kiln_transpose12(kiln_tensor *x) { return call1(KILN_OP_TRANSPOSE12, x, NULL); }
kiln_tensor *kiln_tanh(kiln_tensor *x) { return kiln_op_call(KILN_OP_TANH, &x, 1, NULL); }
kiln_tensor *kiln_tanh_backward(kiln_tensor *x, kiln_tensor *g) {
    kiln_tensor *in[2] = {x, g};
    return kiln_op_call(KILN_OP_TANH_BWD, in, 2, NULL);
}
kiln_tensor *kiln_gelu_tanh(kiln_tensor *x) { return kiln_op_call(KILN_OP_GELU_TANH, &x, 1, NULL); }
kiln_tensor *kiln_gelu_tanh_backward(kiln_tensor *x, kiln_tensor *g) {
    kiln_tensor *in[2] = {x, g};
    return kiln_op_call(KILN_OP_GELU_TANH_BWD, in, 2, NULL);
}
kiln_tensor *kiln_softcap(kiln_tensor *x, double cap) {
    kiln_tensor *a = kiln_scale(x, 1.0 / cap), *t = a ? kiln_tanh(a) : NULL, *y = t ? kiln_scale(t, cap) : NULL;
    kiln_tensor_release(a);
    kiln_tensor_release(t);
    return y;
}
