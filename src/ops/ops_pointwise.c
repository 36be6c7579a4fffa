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
/* pads a meta to 4 dims on the left */
static void pad4(const kiln_meta *m, int64_t *s) {
    int off = 4 - m->ndim;
    for (int i = 0; i < 4; i++) s[i] = i < off ? 1 : m->shape[i - off];
}

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
static kiln_status add_fwd(kiln_tensor *const *in, const kiln_attrs *at, kiln_tensor *out) {
    (void)at;
    const float *a = kiln_f32(in[0]), *b = kiln_f32(in[1]);
    float *o = kiln_f32(out);
    int64_t n = kiln_tensor_numel(in[0]);
    if (kiln_tensor_numel(in[1]) == n) {
        kiln_k_add(a, b, o, n);
        return KILN_OK;
    }
    kiln_meta ma = kiln_meta_of(in[0]), mb = kiln_meta_of(in[1]);
    int64_t sa[4], sb[4], st[4];
    pad4(&ma, sa);
    pad4(&mb, sb);
    st[3] = sb[3] == 1 ? 0 : 1;
    st[2] = sb[2] == 1 ? 0 : sb[3];
    st[1] = sb[1] == 1 ? 0 : sb[3] * sb[2];
    st[0] = sb[0] == 1 ? 0 : sb[3] * sb[2] * sb[1];
    int64_t rows = sa[0] * sa[1] * sa[2], D = sa[3];
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i2 = r % sa[2], i1 = (r / sa[2]) % sa[1], i0 = r / (sa[2] * sa[1]);
        const float *br = b + i0 * st[0] + i1 * st[1] + i2 * st[2];
        const float *ar = a + r * D;
        float *orow = o + r * D;
        if (st[3])
            for (int64_t j = 0; j < D; j++) orow[j] = ar[j] + br[j];
        else
            for (int64_t j = 0; j < D; j++) orow[j] = ar[j] + br[0];
    }
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
const kiln_op_def kiln_opdef_add = {.name = "add", .n_in = 2, .shape = add_shape, .forward = add_fwd, .backward = add_bw,
                                    .cexpr = "($0 + $1)"};

/* ---- mul ---------------------------------------------------------------- */
static kiln_status mul_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("mul", in, 2, out);
}
static kiln_status mul_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_k_mul(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
static kiln_status mul_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[0]) gin[0] = kiln_mul(g, c->in[1]);
    if (c->needs[1]) gin[1] = kiln_mul(g, c->in[0]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_mul = {.name = "mul", .n_in = 2, .save_in = 3, .shape = mul_shape, .forward = mul_fwd, .backward = mul_bw,
                                    .cexpr = "($0 * $1)"};

/* ---- scale, scale_by ----------------------------------------------------- */
static kiln_status scale_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("scale", in, 1, out);
}
static kiln_status scale_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    kiln_k_scale(kiln_f32(in[0]), (float)a->f[0], kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
static kiln_status scale_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_scale(g, c->attrs.f[0]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_scale = {.name = "scale", .n_in = 1, .shape = scale_shape, .forward = scale_fwd, .backward = scale_bw,
                                      .cexpr = "($0 * $f0)"};

static kiln_status scaleby_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_F32 || kiln_meta_numel(&in[1]) != 1)
        return kiln_op_shape_error("scale_by", in, 2, "need f32 x and a one-element f32 scalar");
    *out = in[0];
    return KILN_OK;
}
static kiln_status scaleby_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_k_scale(kiln_f32(in[0]), kiln_f32(in[1])[0], kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
static kiln_status scaleby_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[1]) return kiln_error(KILN_ERR_UNSUPPORTED, "op scale_by: no gradient for the scalar");
    gin[0] = kiln_scale_by(g, c->in[1]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_scale_by = {.name = "scale_by", .n_in = 2, .save_in = 2, .nondiff_in = 2, .cexpr = "($0 * $1)",
                                         .shape = scaleby_shape, .forward = scaleby_fwd, .backward = scaleby_bw};

/* ---- silu ---------------------------------------------------------------- */
static kiln_status silu_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("silu", in, 1, out);
}
static kiln_status silu_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_k_silu(kiln_f32(in[0]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
static kiln_status silu_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_silu_backward(c->in[0], g);
    return need_ok(c, gin);
}
static double silu_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)in, (void)a;
    return 4.0 * (double)kiln_meta_numel(out);
}
const kiln_op_def kiln_opdef_silu = {.name = "silu", .n_in = 1, .save_in = 1, .shape = silu_shape, .forward = silu_fwd, .cexpr = "kiln_silu_f($0)",
                                     .backward = silu_bw, .flops = silu_flops};
static kiln_status silubw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    return same_f32("silu_backward", in, 2, out);
}
static kiln_status silubw_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_k_silu_backward(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
const kiln_op_def kiln_opdef_silu_bwd = {.name = "silu_backward", .n_in = 2, .shape = silubw_shape, .forward = silubw_fwd,
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
static kiln_status sum_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_f32(out)[0] = (float)kiln_k_sum(kiln_f32(in[0]), kiln_tensor_numel(in[0]));
    return KILN_OK;
}
static kiln_status sum_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_expand(g, c->in_meta[0].ndim, c->in_meta[0].shape);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_sum = {.name = "sum", .n_in = 1, .shape = red_shape, .forward = sum_fwd, .backward = sum_bw};
static kiln_status mean_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    int64_t n = kiln_tensor_numel(in[0]);
    kiln_f32(out)[0] = (float)(kiln_k_sum(kiln_f32(in[0]), n) / (double)(n ? n : 1));
    return KILN_OK;
}
static kiln_status mean_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    int64_t n = kiln_meta_numel(&c->in_meta[0]);
    kiln_tensor *e = kiln_expand(g, c->in_meta[0].ndim, c->in_meta[0].shape);
    gin[0] = kiln_scale(e, 1.0 / (double)(n ? n : 1));
    kiln_tensor_release(e);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_mean = {.name = "mean", .n_in = 1, .shape = red_shape, .forward = mean_fwd, .backward = mean_bw};

static kiln_status expand_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].dtype != KILN_F32 || kiln_meta_numel(&in[0]) != 1 || a->i[0] < 0 || a->i[0] > KILN_MAX_DIMS)
        return kiln_op_shape_error("expand", in, 1, "need a one-element f32 and a shape of at most 4 dims");
    *out = kiln_attrs_shape(a, KILN_F32);
    return KILN_OK;
}
static kiln_status expand_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    float v = kiln_f32(in[0])[0], *o = kiln_f32(out);
    int64_t n = kiln_tensor_numel(out);
    for (int64_t i = 0; i < n; i++) o[i] = v;
    return KILN_OK;
}
static kiln_status expand_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_sum(g);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_expand = {.name = "expand", .n_in = 1, .shape = expand_shape, .forward = expand_fwd, .backward = expand_bw};

static kiln_status sumto_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    kiln_meta t = kiln_attrs_shape(a, KILN_F32);
    kiln_meta pair[2] = {in[0], t};
    kiln_meta dummy;
    if (add_shape(pair, a, &dummy)) return kiln_op_shape_error("sum_to", pair, 2, "target shape does not broadcast to the input");
    *out = t;
    return KILN_OK;
}
static kiln_status sumto_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_meta mg = kiln_meta_of(in[0]), mo = kiln_meta_of(out);
    int64_t sg[4], so[4];
    pad4(&mg, sg);
    pad4(&mo, so);
    const float *g = kiln_f32(in[0]);
    float *o = kiln_f32(out);
    memset(o, 0, kiln_tensor_nbytes(out));
    for (int64_t i0 = 0; i0 < sg[0]; i0++)
        for (int64_t i1 = 0; i1 < sg[1]; i1++)
            for (int64_t i2 = 0; i2 < sg[2]; i2++)
                for (int64_t i3 = 0; i3 < sg[3]; i3++) {
                    int64_t j = (((so[0] > 1 ? i0 : 0) * so[1] + (so[1] > 1 ? i1 : 0)) * so[2] + (so[2] > 1 ? i2 : 0)) * so[3] +
                                (so[3] > 1 ? i3 : 0);
                    o[j] += g[((i0 * sg[1] + i1) * sg[2] + i2) * sg[3] + i3];
                }
    return KILN_OK;
}
const kiln_op_def kiln_opdef_sum_to = {.name = "sum_to", .n_in = 1, .shape = sumto_shape, .forward = sumto_fwd};

static kiln_status fill_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (a->i[0] < 0 || a->i[0] > KILN_MAX_DIMS) return kiln_op_shape_error("fill", in, 0, "bad rank %lld", (long long)a->i[0]);
    *out = kiln_attrs_shape(a, KILN_F32);
    return KILN_OK;
}
static kiln_status fill_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)in;
    float v = (float)a->f[0], *o = kiln_f32(out);
    for (int64_t i = 0; i < kiln_tensor_numel(out); i++) o[i] = v;
    return KILN_OK;
}
const kiln_op_def kiln_opdef_fill = {.name = "fill", .n_in = 0, .shape = fill_shape, .forward = fill_fwd};

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
static kiln_status cast_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    kiln_k_f32_to_bf16(kiln_f32(in[0]), out->data, kiln_tensor_numel(out));
    return KILN_OK;
}
static kiln_status cast_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_tensor_retain(g); /* d cast(x) / dx = 1: the gradient stays fp32 */
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_cast_bf16 = {.name = "cast_bf16", .n_in = 1, .shape = cast_shape, .forward = cast_fwd,
                                          .backward = cast_bw, .cexpr = "$0"};

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
static kiln_status tr_fwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out) {
    (void)a;
    int64_t A = in[0]->shape[0], B = in[0]->shape[1], C = in[0]->shape[2], D = in[0]->shape[3];
    size_t es = kiln_dtype_size(in[0]->dtype), row = (size_t)D * es;
    const char *x = in[0]->data;
    char *y = out->data;
#pragma omp parallel for collapse(2) if (A * B * C * D > 65536) schedule(static)
    for (int64_t i = 0; i < A; i++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t b = 0; b < B; b++)
                memcpy(y + (size_t)(((i * C + c) * B + b)) * row, x + (size_t)(((i * B + b) * C + c)) * row, row);
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
const kiln_op_def kiln_opdef_transpose12 = {.name = "transpose12", .n_in = 1, .shape = tr_shape, .forward = tr_fwd,
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
