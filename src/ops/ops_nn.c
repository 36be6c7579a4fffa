/* Neural-network ops: normalisation, rotary embedding, attention pieces,
 * softmax and the loss. */
#include <stdlib.h>
#include "internal.h"

static kiln_status need_ok(const kiln_bw_ctx *c, kiln_tensor **gin) {
    for (int i = 0; i < c->n_in; i++)
        if (c->needs[i] && !gin[i]) return kiln_last_status() ? kiln_last_status() : KILN_ERR_INVALID;
    return KILN_OK;
}

/* ---- rmsnorm ------------------------------------------------------------- */
static kiln_status rms_check(const char *name, const kiln_meta *in, int n) {
    int64_t C = in[0].ndim ? in[0].shape[in[0].ndim - 1] : 0;
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_F32 || in[1].ndim != 1 || in[1].shape[0] != C || C == 0)
        return kiln_op_shape_error(name, in, n, "need x [..., C] and w [C], f32");
    if (n == 3 && (in[2].ndim != in[0].ndim || memcmp(in[2].shape, in[0].shape, sizeof(int64_t) * (size_t)in[0].ndim)))
        return kiln_op_shape_error(name, in, n, "gradient shape differs from x");
    return KILN_OK;
}
static kiln_status rms_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    *out = in[0];
    return rms_check("rmsnorm", in, 2);
}
static kiln_status rms_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[0]) gin[0] = kiln_rmsnorm_backward_x(c->in[0], c->in[1], g, c->attrs.f[0]);
    if (c->needs[1]) gin[1] = kiln_rmsnorm_backward_w(c->in[0], c->in[1], g, c->attrs.f[0]);
    return need_ok(c, gin);
}
static double rms_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)a, (void)out;
    return 4.0 * (double)kiln_meta_numel(&in[0]);
}
/* (x * r) * w with r = 1 / sqrt(mean(x^2) + eps), as kiln_k_rmsnorm */
static const kiln_row_epilogue rms_row = {.acc = "$x * $x", .fin = "kiln_rms_rstd($s, $n, $f0)",
                                          .out = "$1 * ($x * $r)"};
const kiln_op_def kiln_opdef_rmsnorm = {.name = "rmsnorm", .n_in = 2, .save_in = 3, .shape = rms_shape,
                                        .backward = rms_bw, .flops = rms_flops, .row = &rms_row};

static kiln_status rmsbx_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    *out = in[0];
    return rms_check("rmsnorm_backward_x", in, 3);
}
const kiln_op_def kiln_opdef_rmsnorm_bwd_x = {.name = "rmsnorm_backward_x", .n_in = 3, .shape = rmsbx_shape, .flops = rms_flops};
static kiln_status rmsbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    *out = in[1];
    return rms_check("rmsnorm_backward_w", in, 3);
}
const kiln_op_def kiln_opdef_rmsnorm_bwd_w = {.name = "rmsnorm_backward_w", .n_in = 3, .shape = rmsbw_shape, .flops = rms_flops};

/* ---- rope ------------------------------------------------------------------ */
static double attr_f64(int64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}
static int64_t f64_attr(double d) {
    int64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}
/* i1 bit 1: the positions come as input 1 ([B, T] i32) and pos0 is 0 */
static kiln_status rope_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].ndim != 4 || in[0].dtype != KILN_F32 || in[0].shape[3] % 2)
        return kiln_op_shape_error("rope", in, 1, "need x [B, T, H, D] f32 with even D");
    if (!(a->f[0] > 0) || a->i[0] < 0) return kiln_op_shape_error("rope", in, 1, "theta must be > 0 and pos0 >= 0");
    if (a->i[2] < KILN_ROPE_DEFAULT || a->i[2] > KILN_ROPE_LLAMA3 || (a->i[2] && !(a->f[1] > 0)) ||
        (a->i[2] == KILN_ROPE_LLAMA3 && (a->i[3] <= 0 || !(attr_f64(a->i[4]) > 0) || !(attr_f64(a->i[5]) > attr_f64(a->i[4])))))
        return kiln_op_shape_error("rope", in, 1, "bad rope scaling (type %lld, factor %g)", (long long)a->i[2], a->f[1]);
    if (a->i[1] < 0 || a->i[1] > 3) return kiln_op_shape_error("rope", in, 1, "bad flags %lld", (long long)a->i[1]);
    if (a->i[1] & 2) {
        if (in[1].ndim != 2 || in[1].dtype != KILN_I32 || in[1].shape[0] != in[0].shape[0] ||
            in[1].shape[1] != in[0].shape[1] || a->i[0])
            return kiln_op_shape_error("rope", in, 2, "need positions [B, T] i32 matching x (and pos0 0)");
    } else if (in[1].ndim) {
        return kiln_op_shape_error("rope", in, 2, "positions given but not announced (attribute i1)");
    }
    *out = in[0];
    return KILN_OK;
}
static kiln_status rope_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    kiln_attrs a = c->attrs; /* the same rotation backwards: the transpose */
    a.i[1] ^= 1;
    kiln_tensor *in[2] = {g, c->n_in > 1 ? c->in[1] : NULL};
    gin[0] = kiln_op_call(KILN_OP_ROPE, in, c->n_in, &a);
    return need_ok(c, gin);
}
static double rope_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)a, (void)out;
    return 3.0 * (double)kiln_meta_numel(&in[0]);
}
const kiln_op_def kiln_opdef_rope = {.name = "rope", .n_in = 1, .n_opt = 1, .save_in = 2, .nondiff_in = 2,
                                     .shape = rope_shape, .backward = rope_bw, .flops = rope_flops};

/* ---- repeat_kv ([B, Hkv, T, D] -> [B, Hkv*n_rep, T, D], head h reads h/n_rep) -- */
static kiln_status rep_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].ndim != 4 || in[0].dtype != KILN_F32 || a->i[0] < 1)
        return kiln_op_shape_error("repeat_kv", in, 1, "need x [B, Hkv, T, D] f32 and n_rep >= 1");
    *out = in[0];
    out->shape[1] *= a->i[0];
    return KILN_OK;
}
static kiln_status rep_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = c->attrs.i[0] == 1 ? kiln_tensor_retain(g) : kiln_repeat_kv_backward(g, c->attrs.i[0]);
    return need_ok(c, gin);
}
const kiln_op_def kiln_opdef_repeat_kv = {.name = "repeat_kv", .n_in = 1, .shape = rep_shape, .backward = rep_bw};

static kiln_status repbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].ndim != 4 || in[0].dtype != KILN_F32 || a->i[0] < 1 || in[0].shape[1] % a->i[0])
        return kiln_op_shape_error("repeat_kv_backward", in, 1, "need g [B, H, T, D] with H a multiple of n_rep");
    *out = in[0];
    out->shape[1] /= a->i[0];
    return KILN_OK;
}
const kiln_op_def kiln_opdef_repeat_kv_bwd = {.name = "repeat_kv_backward", .n_in = 1, .shape = repbw_shape};

/* ---- attention mask ---------------------------------------------------------- */
/* i1 = 1: segment ids [B, Tk] i32 as input 1 (block-diagonal); i2 = W > 0:
 * a sliding window, query at position p sees keys j > p - W (0: none) */
static kiln_status mask_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].ndim != 2 || in[0].dtype != KILN_I32 || a->i[0] < 1 || a->i[0] > in[0].shape[1])
        return kiln_op_shape_error("attn_mask", in, 1, "need pad_mask [B, T] i32 and 1 <= q_len <= T");
    if (a->i[1] != 0 && a->i[1] != 1) return kiln_op_shape_error("attn_mask", in, 1, "bad flag %lld", (long long)a->i[1]);
    if (a->i[1] && (in[1].ndim != 2 || in[1].dtype != KILN_I32 || memcmp(in[1].shape, in[0].shape, 2 * sizeof(int64_t))))
        return kiln_op_shape_error("attn_mask", in, 2, "need segment ids [B, T] i32 like pad_mask");
    if (!a->i[1] && in[1].ndim) return kiln_op_shape_error("attn_mask", in, 2, "segment ids given but not announced (attribute i1)");
    if (a->i[2] < 0) return kiln_op_shape_error("attn_mask", in, 1, "sliding window %lld < 0", (long long)a->i[2]);
    int64_t s[4] = {in[0].shape[0], 1, a->i[0], in[0].shape[1]};
    *out = kiln_meta_make(KILN_F32, 4, s);
    return KILN_OK;
}
const kiln_op_def kiln_opdef_attn_mask = {.name = "attn_mask", .n_in = 1, .n_opt = 1, .nondiff_in = 3, .shape = mask_shape};

/* ---- softmax ------------------------------------------------------------------- */
static kiln_status sm_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[0].ndim < 1) return kiln_op_shape_error("softmax", in, 1, "need f32 input");
    *out = in[0];
    return KILN_OK;
}
static kiln_status sm_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_softmax_backward(c->out, g);
    return need_ok(c, gin);
}
static double sm_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)a, (void)out;
    return 5.0 * (double)kiln_meta_numel(&in[0]);
}
const kiln_op_def kiln_opdef_softmax = {.name = "softmax", .n_in = 1, .save_out = true, .shape = sm_shape,
                                        .backward = sm_bw, .flops = sm_flops};
static kiln_status smbw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_F32 || in[0].ndim != in[1].ndim ||
        memcmp(in[0].shape, in[1].shape, sizeof(int64_t) * (size_t)in[0].ndim))
        return kiln_op_shape_error("softmax_backward", in, 2, "y and g must have one f32 shape");
    *out = in[0];
    return KILN_OK;
}
const kiln_op_def kiln_opdef_softmax_bwd = {.name = "softmax_backward", .n_in = 2, .shape = smbw_shape,
                                            .flops = sm_flops};

/* ---- cross-entropy (sum over counted rows) ---------------------------------- */
static kiln_status ce_check(const char *name, const kiln_meta *in, int n) {
    const kiln_meta *L = &in[0], *T = &in[1];
    if (L->dtype != KILN_F32 || T->dtype != KILN_I32 || L->ndim < 1 || kiln_meta_rows(L) != kiln_meta_numel(T))
        return kiln_op_shape_error(name, in, n, "need logits [..., V] f32 and one i32 target per row");
    if (n == 3 && (in[2].dtype != KILN_F32 || kiln_meta_numel(&in[2]) != 1))
        return kiln_op_shape_error(name, in, n, "the incoming gradient must be one f32");
    return KILN_OK;
}
static kiln_status ce_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    int64_t one = 1;
    *out = kiln_meta_make(KILN_F32, 1, &one);
    return ce_check("cross_entropy", in, 2);
}
static kiln_status ce_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    gin[0] = kiln_cross_entropy_backward(c->in[0], c->in[1], g, (int32_t)c->attrs.i[0]);
    return need_ok(c, gin);
}
static double ce_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)a, (void)out;
    return 4.0 * (double)kiln_meta_numel(&in[0]);
}
const kiln_op_def kiln_opdef_cross_entropy = {.name = "cross_entropy", .n_in = 2, .save_in = 3, .nondiff_in = 2,
                                              .shape = ce_shape, .backward = ce_bw, .flops = ce_flops};
static kiln_status cebw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    (void)a;
    *out = in[0];
    return ce_check("cross_entropy_backward", in, 3);
}
const kiln_op_def kiln_opdef_cross_entropy_bwd = {.name = "cross_entropy_backward", .n_in = 3, .nondiff_in = 6,
                                                  .shape = cebw_shape, .flops = ce_flops};

/* ---- API ---------------------------------------------------------------------- */
kiln_tensor *kiln_rmsnorm(kiln_tensor *x, kiln_tensor *w, double eps) {
    kiln_attrs a = {.f = {eps}};
    kiln_tensor *in[2] = {x, w};
    return kiln_op_call(KILN_OP_RMSNORM, in, 2, &a);
}
kiln_tensor *kiln_rmsnorm_backward_x(kiln_tensor *x, kiln_tensor *w, kiln_tensor *g, double eps) {
    kiln_attrs a = {.f = {eps}};
    kiln_tensor *in[3] = {x, w, g};
    return kiln_op_call(KILN_OP_RMSNORM_BWD_X, in, 3, &a);
}
kiln_tensor *kiln_rmsnorm_backward_w(kiln_tensor *x, kiln_tensor *w, kiln_tensor *g, double eps) {
    kiln_attrs a = {.f = {eps}};
    kiln_tensor *in[3] = {x, w, g};
    return kiln_op_call(KILN_OP_RMSNORM_BWD_W, in, 3, &a);
}
kiln_tensor *kiln_rope(kiln_tensor *x, double theta, int64_t pos0, bool inverse) {
    kiln_attrs a = {.i = {pos0, inverse}, .f = {theta}};
    return kiln_op_call(KILN_OP_ROPE, &x, 1, &a);
}
kiln_tensor *kiln_rope_scaled(kiln_tensor *x, double theta, int64_t pos0, bool inverse, const kiln_rope_scaling *s) {
    if (!s || s->type == KILN_ROPE_DEFAULT) return kiln_rope(x, theta, pos0, inverse);
    kiln_attrs a = {.i = {pos0, inverse, s->type, s->original_max_position_embeddings, f64_attr(s->low_freq_factor),
                          f64_attr(s->high_freq_factor)},
                    .f = {theta, s->factor}};
    return kiln_op_call(KILN_OP_ROPE, &x, 1, &a);
}
kiln_tensor *kiln_rope_at(kiln_tensor *x, kiln_tensor *pos, double theta, bool inverse, const kiln_rope_scaling *s) {
    if (!pos) return kiln_rope_scaled(x, theta, 0, inverse, s);
    kiln_attrs a = {.i = {0, 2 | (int64_t)inverse}, .f = {theta}};
    if (s && s->type != KILN_ROPE_DEFAULT)
        a = (kiln_attrs){.i = {0, 2 | (int64_t)inverse, s->type, s->original_max_position_embeddings, f64_attr(s->low_freq_factor),
                               f64_attr(s->high_freq_factor)},
                         .f = {theta, s->factor}};
    kiln_tensor *in[2] = {x, pos};
    return kiln_op_call(KILN_OP_ROPE, in, 2, &a);
}
kiln_tensor *kiln_repeat_kv(kiln_tensor *x, int64_t n_rep) {
    kiln_attrs a = {.i = {n_rep}};
    return kiln_op_call(KILN_OP_REPEAT_KV, &x, 1, &a);
}
kiln_tensor *kiln_repeat_kv_backward(kiln_tensor *g, int64_t n_rep) {
    kiln_attrs a = {.i = {n_rep}};
    return kiln_op_call(KILN_OP_REPEAT_KV_BWD, &g, 1, &a);
}
kiln_tensor *kiln_attn_mask(kiln_tensor *pad_mask, int64_t q_len) {
    kiln_attrs a = {.i = {q_len}};
    return kiln_op_call(KILN_OP_ATTN_MASK, &pad_mask, 1, &a);
}
kiln_tensor *kiln_attn_mask_seg(kiln_tensor *pad_mask, kiln_tensor *seg, int64_t q_len) {
    return kiln_attn_mask_win(pad_mask, seg, q_len, 0);
}
kiln_tensor *kiln_attn_mask_win(kiln_tensor *pad_mask, kiln_tensor *seg, int64_t q_len, int64_t window) {
    kiln_attrs a = {.i = {q_len, seg != NULL, window}};
    kiln_tensor *in[2] = {pad_mask, seg};
    return kiln_op_call(KILN_OP_ATTN_MASK, in, seg ? 2 : 1, &a);
}
kiln_tensor *kiln_softmax(kiln_tensor *x) { return kiln_op_call(KILN_OP_SOFTMAX, &x, 1, NULL); }
kiln_tensor *kiln_softmax_backward(kiln_tensor *y, kiln_tensor *g) {
    kiln_tensor *in[2] = {y, g};
    return kiln_op_call(KILN_OP_SOFTMAX_BWD, in, 2, NULL);
}
kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *targets, int32_t ignore_index) {
    kiln_attrs a = {.i = {ignore_index}};
    kiln_tensor *in[2] = {logits, targets};
    return kiln_op_call(KILN_OP_CROSS_ENTROPY, in, 2, &a);
}
kiln_tensor *kiln_cross_entropy_backward(kiln_tensor *logits, kiln_tensor *targets, kiln_tensor *g, int32_t ignore_index) {
    kiln_attrs a = {.i = {ignore_index}};
    kiln_tensor *in[3] = {logits, targets, g};
    return kiln_op_call(KILN_OP_CROSS_ENTROPY_BWD, in, 3, &a);
}
