/* The CPU backend's op kernels (src/backend/cpu/ops_*.c, grouped as the op
 * definitions in src/ops/ are): kiln_cpu_op_<sym> for every line of
 * KILN_OP_LIST, each a kiln_op_kernel on host memory, calling src/kernels/.
 * They run inside the backend's exec (cpu-isolated runs them too). */
#ifndef KILN_BACKEND_CPU_OPS_H
#define KILN_BACKEND_CPU_OPS_H
#include <math.h>
#include <string.h>
#include "kiln/backend.h"
#include "kiln/kernels.h"
#include "kiln/quant.h"

#define KILN_CPU_KERNEL_DECL_(id, sym)                                                                            \
    kiln_status kiln_cpu_op_##sym(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out,                  \
                                  kiln_tensor *const *aux);
KILN_OP_LIST(KILN_CPU_KERNEL_DECL_)
#undef KILN_CPU_KERNEL_DECL_
/* KILN_KERNEL_ACCUMULATE: out += s·in[0] (s = in[1][0], or 1 without in[1]) */
kiln_status kiln_cpu_accumulate(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux);

/* a meta's shape padded to 4 dims on the left */
static inline void kiln_cpu_pad4(const kiln_tensor *t, int64_t *s) {
    int off = 4 - t->ndim;
    for (int i = 0; i < 4; i++) s[i] = i < off ? 1 : t->shape[i - off];
}
/* The eager kernel of an element-wise op from its scalar expression of x[i] (and g[i]). */
#define POINTWISE1(sym, expr)                                                                                        \
    kiln_status kiln_cpu_op_##sym(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) { \
        (void)a, (void)aux;                                                                                          \
        const float *x = kiln_f32(in[0]);                                                                            \
        float *y = kiln_f32(out);                                                                                    \
        for (int64_t i = 0; i < kiln_tensor_numel(out); i++) y[i] = (expr);                                          \
        return KILN_OK;                                                                                              \
    }
#define POINTWISE2(sym, expr)                                                                                        \
    kiln_status kiln_cpu_op_##sym(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) { \
        (void)a, (void)aux;                                                                                          \
        const float *x = kiln_f32(in[0]), *g = kiln_f32(in[1]);                                                      \
        float *y = kiln_f32(out);                                                                                    \
        for (int64_t i = 0; i < kiln_tensor_numel(out); i++) y[i] = (expr);                                          \
        return KILN_OK;                                                                                              \
    }
#endif
