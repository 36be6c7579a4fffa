/* Shared between the op files: the registry entries and small helpers. */
#ifndef KILN_OPS_INTERNAL_H
#define KILN_OPS_INTERNAL_H
#include <math.h>
#include <string.h>
#include "kiln/kernels.h"
#include "kiln/ops.h"

extern const kiln_op_def kiln_opdef_embedding, kiln_opdef_embedding_bwd, kiln_opdef_matmul,
    kiln_opdef_add, kiln_opdef_mul, kiln_opdef_scale, kiln_opdef_scale_by, kiln_opdef_silu,
    kiln_opdef_silu_bwd, kiln_opdef_rmsnorm, kiln_opdef_rmsnorm_bwd_x, kiln_opdef_rmsnorm_bwd_w,
    kiln_opdef_rope, kiln_opdef_repeat_kv, kiln_opdef_repeat_kv_bwd, kiln_opdef_transpose12,
    kiln_opdef_reshape, kiln_opdef_attn_mask, kiln_opdef_softmax, kiln_opdef_softmax_bwd,
    kiln_opdef_cross_entropy, kiln_opdef_cross_entropy_bwd, kiln_opdef_sum, kiln_opdef_mean,
    kiln_opdef_expand, kiln_opdef_sum_to, kiln_opdef_fill,
    kiln_opdef_flash_attn, kiln_opdef_flash_attn_bwd, kiln_opdef_linear_ce, kiln_opdef_cast_bf16;

/* error naming the op and all input shapes */
kiln_status kiln_op_shape_error(const char *op, const kiln_meta *in, int n_in, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int64_t kiln_meta_rows(const kiln_meta *m); /* numel / last dim */
static inline kiln_meta kiln_meta_make(kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_meta m = {.ndim = ndim, .dtype = dt};
    for (int i = 0; i < ndim; i++) m.shape[i] = shape[i];
    return m;
}
/* shapes stored in attrs as i0 = ndim, i1..i4 = dims */
void kiln_attrs_set_shape(kiln_attrs *a, int ndim, const int64_t *shape);
kiln_meta kiln_attrs_shape(const kiln_attrs *a, kiln_dtype dt);
#define OP_REQUIRE_DTYPE(name, in, idx, dt)                                                     \
    do {                                                                                       \
        if ((in)[idx].dtype != (dt))                                                           \
            return kiln_op_shape_error(name, in, -1, "input %d must be %s", idx, kiln_dtype_name(dt)); \
    } while (0)
#endif
