/* Dropout (inverted, counter-based mask): the op LoRA puts on its adapters'
 * input. The mask is a pure function of (key, instance, element index), so
 * the backward rule is the same op on the gradient (nothing saved but the
 * key), the interpreter can run it chunk by chunk (attribute i[5] = the
 * chunk's first index) and generated code computes it inline ($e). */
#include "internal.h"

static kiln_status dropout_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {
    if (in[0].dtype != KILN_F32 || in[1].dtype != KILN_F32 || kiln_meta_numel(&in[1]) != 1)
        return kiln_op_shape_error("dropout", in, 2, "need f32 x and a one-element f32 key");
    if (!(a->f[0] >= 0 && a->f[0] < 1)) return kiln_op_shape_error("dropout", in, 2, "p must be in [0, 1), got %g", a->f[0]);
    *out = in[0];
    return KILN_OK;
}
/* d/dx of mask(i) * x / (1 - p) is the same mask and scale: the op itself */
static kiln_status dropout_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {
    if (c->needs[1]) return kiln_error(KILN_ERR_UNSUPPORTED, "op dropout: no gradient for the key");
    gin[0] = kiln_dropout(g, c->in[1], c->attrs.f[0], c->attrs.i[0]);
    return gin[0] ? KILN_OK : (kiln_last_status() ? kiln_last_status() : KILN_ERR_INVALID);
}
const kiln_op_def kiln_opdef_dropout = {.name = "dropout", .n_in = 2, .save_in = 2, .nondiff_in = 2, .shape = dropout_shape, .backward = dropout_bw, .indexed = true,
                                        .cexpr = "kiln_dropout_f($0, $1, $e, $f0, $i0)"};

kiln_tensor *kiln_dropout(kiln_tensor *x, kiln_tensor *key, double p, int64_t instance) {
    if (p == 0) return kiln_tensor_retain(x);
    kiln_attrs a = {.i = {instance}, .f = {p}};
    kiln_tensor *in[2] = {x, key};
    return kiln_op_call(KILN_OP_DROPOUT, in, 2, &a);
}
