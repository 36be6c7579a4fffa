/* Fused ops the compiler's rewrites produce: flash attention (never builds
 * the T×T score matrix) and linear + cross-entropy (never builds the N×V
 * logits: the gradients of the loss sum are made chunk by chunk in the
 * forward pass and scaled by the incoming gradient in backward). */
#include <math.h>
#include "internal.h"

/* ---- flash attention ------------------------------------------------------- */
/* Attribute i0 = 1: segment ids [B, Tk] i32 follow (input 4 of flash_attn,
 * input 7 of its backward), and attention is block-diagonal; i1 = W > 0: a
 * sliding window of W keys (0: none); i2 = 1: bf16 products (the rewritten
 * products were bf16 ones under autocast; kiln_k_flash_attn_ex). */
static kiln_status fa_check(const char *name, const kiln_meta *in, const kiln_attrs *a, int seg_at) {
    const kiln_meta *q = &in[0], *k = &in[1], *v = &in[2], *p = &in[3];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || p->ndim != 2 || q->dtype != KILN_F32 || k->dtype != KILN_F32 ||
        v->dtype != KILN_F32 || p->dtype != KILN_I32)
        return kiln_op_shape_error(name, in, 4, "need q [B,H,T,D], k and v [B,Hkv,Tk,D] f32, pad [B,Tk] i32");
    if (k->shape[0] != q->shape[0] || memcmp(k->shape, v->shape, sizeof k->shape) || k->shape[3] != q->shape[3] ||
        q->shape[1] % k->shape[1] || p->shape[0] != q->shape[0] || p->shape[1] != k->shape[2] || q->shape[2] > k->shape[2])
        return kiln_op_shape_error(name, in, 4, "shapes do not fit (H a multiple of Hkv, T <= Tk)");
    const kiln_meta *s = &in[seg_at];
    if (a->i[0] != 0 && a->i[0] != 1) return kiln_op_shape_error(name, in, 4, "bad flag %lld", (long long)a->i[0]);
    if (a->i[0] && (s->ndim != 2 || s->dtype != KILN_I32 || memcmp(s->shape, p->shape, 2 * sizeof(int64_t))))
        return kiln_op_shape_error(name, in, seg_at + 1, "need segment ids [B,Tk] i32 like pad");
    if (!a->i[0] && s->ndim) return kiln_op_shape_error(name, in, seg_at + 1, "segment ids given but not announced (attribute i0)");
    if (a->i[1] < 0) return kiln_op_shape_error(name, in, 4, "sliding window %lld < 0", (long long)a->i[1]);
    if (a->i[2] != 0 && a->i[2] != 1) return kiln_op_shape_error(name, in, 4, "bad bf16 flag i2=%lld (0 or 1)", (long long)a->i[2]);
    return KILN_OK;
}
static kiln_status fa_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    *out = in[0];
    return fa_check("flash_attn", in, a, 4);
}
static kiln_status fa_aux_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *aux) {
    (void)a;
    aux[0] = kiln_meta_make(KILN_F32, 3, in[0].shape);
    return KILN_OK;
}
static kiln_status fa_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    kiln_tensor *in[8] = {c->in[0], c->in[1], c->in[2], c->in[3], c->out, c->aux[0], g, c->attrs.i[0] ? c->in[4] : NULL};
    kiln_tensor *aux[2] = {0};
    kiln_tensor *dq = kiln_op_call_aux(KILN_OP_FLASH_ATTN_BWD, in, c->attrs.i[0] ? 8 : 7, &c->attrs, aux);
    if (!dq) return kiln_last_status();
    if (c->needs[0]) gin[0] = kiln_tensor_retain(dq);
    if (c->needs[1]) gin[1] = kiln_tensor_retain(aux[0]);
    if (c->needs[2]) gin[2] = kiln_tensor_retain(aux[1]);
    kiln_tensor_release(dq);
    kiln_tensor_release(aux[0]);
    kiln_tensor_release(aux[1]);
    return KILN_OK;
}
static double fa_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)a, (void)out;
    /* two products of B·H·T·Tk·D, half of them masked by causality (with
     * segments fewer still: the count is an upper bound) */
    return 2.0 * (double)in[0].shape[0] * (double)in[0].shape[1] * (double)in[0].shape[2] * (double)in[1].shape[2] *
           (double)in[0].shape[3];
}
const kiln_op_def kiln_opdef_flash_attn = {
    .name = "flash_attn", .n_in = 4, .n_opt = 1, .save_in = 31, .save_out = true, .nondiff_in = 24, .shape = fa_shape,
    .backward = fa_bw, .flops = fa_flops, .n_aux = 1, .save_aux = true, .aux_shape = fa_aux_shape,
};

static kiln_status fab_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    *out = in[0];
    return fa_check("flash_attn_backward", in, a, 7);
}
static kiln_status fab_aux_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *aux) {
    (void)a;
    aux[0] = in[1];
    aux[1] = in[2];
    return KILN_OK;
}
static double fab_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    return 2.5 * fa_flops(in, a, out); /* recompute scores + four products */
}
const kiln_op_def kiln_opdef_flash_attn_bwd = {
    .name = "flash_attn_backward", .n_in = 7, .n_opt = 1, .nondiff_in = 0xff, .shape = fab_shape, .flops = fab_flops,
    .n_aux = 2, .aux_shape = fab_aux_shape,
};

/* ---- linear + cross-entropy ------------------------------------------------- */
/* Attributes: i0 ignore index, i1/i2 whether dh/dW are made, i3 = 1 bf16
 * products (as the bf16 MATMUL it replaces: i3 is that op's bf16 flag too),
 * i4 = 1 seeded: input 3 is a runtime scalar s [1] and the aux gradients are
 * those of s·loss, formed before any rounding to bf16. The compiler seeds
 * the op after autograd with the loss's incoming gradient (the trainer's
 * scale), whose product the backward rule would otherwise apply after the
 * fact; a seeded op is therefore past differentiation and has no backward. */
static kiln_status lce_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    const kiln_meta *h = &in[0], *W = &in[1], *t = &in[2], *s = &in[3];
    if (h->dtype != KILN_F32 || W->dtype != KILN_F32 || t->dtype != KILN_I32 || W->ndim != 2 || h->ndim < 1 ||
        h->shape[h->ndim - 1] != W->shape[1] || kiln_meta_rows(h) != kiln_meta_numel(t))
        return kiln_op_shape_error("linear_cross_entropy", in, 3, "need h [..., C], W [V, C] f32 and one i32 target per row");
    if ((a->i[3] != 0 && a->i[3] != 1) || (a->i[4] != 0 && a->i[4] != 1))
        return kiln_op_shape_error("linear_cross_entropy", in, 3, "bad flags i3=%lld i4=%lld (bf16, seeded: 0 or 1)",
                                   (long long)a->i[3], (long long)a->i[4]);
    if (a->i[4] && (s->dtype != KILN_F32 || kiln_meta_numel(s) != 1 || s->ndim < 1))
        return kiln_op_shape_error("linear_cross_entropy", in, 4, "a seeded call needs the seed as a one-element f32 input 3");
    if (!a->i[4] && s->ndim) return kiln_op_shape_error("linear_cross_entropy", in, 4, "a seed given but not announced (i4)");
    if (!(a->f[0] >= 0) || !isfinite(a->f[0]))
        return kiln_op_shape_error("linear_cross_entropy", in, 3, "soft-cap f0=%g must be finite and >= 0 (0: none)", a->f[0]);
    int64_t one = 1;
    *out = kiln_meta_make(KILN_F32, 1, &one);
    return KILN_OK;
}
static kiln_status lce_aux_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *aux) {
    int64_t one = 1;
    aux[0] = a->i[1] ? in[0] : kiln_meta_make(KILN_F32, 1, &one);
    aux[1] = a->i[2] ? in[1] : kiln_meta_make(KILN_F32, 1, &one);
    return KILN_OK;
}
static kiln_status lce_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->attrs.i[4])
        return kiln_error(KILN_ERR_UNSUPPORTED, "op linear_cross_entropy: a seeded call (made by the compiler after "
                                                "autograd) is not differentiated again");
    if (c->needs[0]) {
        if (!c->attrs.i[1]) return kiln_error(KILN_ERR_INVALID, "op linear_cross_entropy: dh was not computed");
        if (!(gin[0] = kiln_scale_by(c->aux[0], g))) return kiln_last_status();
    }
    if (c->needs[1]) {
        if (!c->attrs.i[2]) return kiln_error(KILN_ERR_INVALID, "op linear_cross_entropy: dW was not computed");
        if (!(gin[1] = kiln_scale_by(c->aux[1], g))) return kiln_last_status();
    }
    return KILN_OK;
}
static double lce_flops(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    (void)out;
    double nvc = 2.0 * (double)kiln_meta_rows(&in[0]) * (double)in[1].shape[0] * (double)in[1].shape[1];
    return nvc * (1 + (a->i[1] != 0) + (a->i[2] != 0));
}
const kiln_op_def kiln_opdef_linear_ce = {
    .name = "linear_cross_entropy", .n_in = 3, .n_opt = 1, .nondiff_in = 12, .shape = lce_shape, .backward = lce_bw,
    .flops = lce_flops, .n_aux = 2, .save_aux = true, .aux_shape = lce_aux_shape,
};

kiln_tensor *kiln_flash_attn(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v, kiln_tensor *pad_mask, double scale) {
    kiln_attrs a = {.f = {scale}};
    kiln_tensor *in[4] = {q, k, v, pad_mask};
    return kiln_op_call(KILN_OP_FLASH_ATTN, in, 4, &a);
}
kiln_tensor *kiln_flash_attn_seg(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v, kiln_tensor *pad_mask, kiln_tensor *seg,
                                 double scale) {
    if (!seg) return kiln_flash_attn(q, k, v, pad_mask, scale);
    kiln_attrs a = {.i = {1}, .f = {scale}};
    kiln_tensor *in[5] = {q, k, v, pad_mask, seg};
    return kiln_op_call(KILN_OP_FLASH_ATTN, in, 5, &a);
}
kiln_tensor *kiln_linear_cross_entropy(kiln_tensor *h, kiln_tensor *W, kiln_tensor *targets, int32_t ignore_index) {
    /* bf16 products under autocast, as kiln_linear's would be */
    kiln_attrs a = {.i = {ignore_index, h && h->requires_grad, W && (W->requires_grad || W->node),
                          kiln_autocast_get() == KILN_BF16}};
    if (h) a.i[1] = h->requires_grad || h->node;
    kiln_tensor *in[3] = {h, W, targets};
    return kiln_op_call(KILN_OP_LINEAR_CE, in, 3, &a);
}
