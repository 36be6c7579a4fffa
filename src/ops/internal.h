/* Shared between the op files: the registry entries and small helpers. */
#ifndef KILN_OPS_INTERNAL_H
#define KILN_OPS_INTERNAL_H
#include <math.h>
#include <string.h>
#include "kiln/kernels.h"
#include "kiln/ops.h"

/* the registry entries, one per line of KILN_OP_LIST */
#define KILN_OPDEF_DECL_(id, sym) extern const kiln_op_def kiln_opdef_##sym;
KILN_OP_LIST(KILN_OPDEF_DECL_)
#undef KILN_OPDEF_DECL_

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
/* An element-wise f(x) with its gradient g * f'(x) as a second op: both
 * defined by one C expression each (the eager kernels in the backends use
 * the same scalar functions, kiln/opmath.h). The including file defines
 * same_f32(name, in, n, out), the shape rule of f32 operands of one shape. */
#define UNARY_WITH_BACKWARD(sym, fexpr, bexpr)                                                                   \
    static kiln_status sym##_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {                  \
        (void)a;                                                                                                 \
        return same_f32(#sym, in, 1, out);                                                                       \
    }                                                                                                            \
    static kiln_status sym##_bw(const kiln_bw_ctx *c, kiln_tensor *g, kiln_tensor **gin) {                      \
        gin[0] = kiln_##sym##_backward(c->in[0], g);                                                             \
        return gin[0] ? KILN_OK : kiln_last_status();                                                            \
    }                                                                                                            \
    const kiln_op_def kiln_opdef_##sym = {.name = #sym, .n_in = 1, .save_in = 1, .shape = sym##_shape,          \
                                          .cexpr = fexpr, .backward = sym##_bw};                                 \
    static kiln_status sym##_bw_shape(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out) {               \
        (void)a;                                                                                                 \
        return same_f32(#sym "_backward", in, 2, out);                                                           \
    }                                                                                                            \
    const kiln_op_def kiln_opdef_##sym##_bwd = {.name = #sym "_backward", .n_in = 2, .nondiff_in = 1,          \
                                                .shape = sym##_bw_shape, .cexpr = bexpr};
#endif
