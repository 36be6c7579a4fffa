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
#endif
