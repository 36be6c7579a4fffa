/* The CPU kernel of dropout (its definition: src/ops/ops_dropout.c): the
 * counter-based mask of kiln/opmath.h; attribute i5 is the first element
 * index of the slice (the interpreter's chunks). */
#include "cpu_ops.h"

kiln_status kiln_cpu_op_dropout(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    kiln_k_dropout(kiln_f32(in[0]), kiln_f32(in[1])[0], (float)a->f[0], a->i[0], a->i[5], kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
