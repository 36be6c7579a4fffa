/* CPU kernels of the preference objectives' ops (their definitions:
 * src/ops/ops_pref.c). */
#include "cpu_ops.h"

kiln_status kiln_cpu_op_row_nll(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t R = in[1]->shape[0], T = in[1]->shape[1], V = in[0]->shape[2];
    const int32_t *t = kiln_i32(in[1]);
    for (int64_t i = 0; i < R * T; i++)
        if (t[i] != (int32_t)a->i[0] && (t[i] < 0 || t[i] >= V))
            return kiln_error(KILN_ERR_RANGE, "op row_nll: target %d at %lld is outside [0, %lld)", t[i], (long long)i, (long long)V);
    for (int64_t r = 0; r < R; r++) {
        int64_t count = 0;
        kiln_f32(out)[r] = (float)kiln_k_cross_entropy(kiln_f32(in[0]) + r * T * V, t + r * T, T, V, (int32_t)a->i[0], &count);
    }
    return KILN_OK;
}

kiln_status kiln_cpu_op_row_nll_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t R = in[1]->shape[0], T = in[1]->shape[1], V = in[0]->shape[2];
    for (int64_t r = 0; r < R; r++)
        kiln_k_cross_entropy_backward(kiln_f32(in[0]) + r * T * V, kiln_i32(in[1]) + r * T, kiln_f32(in[2])[r],
                                      kiln_f32(out) + r * T * V, T, V, (int32_t)a->i[0]);
    return KILN_OK;
}

kiln_status kiln_cpu_op_row_inv_count(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t R = in[0]->shape[0], T = in[0]->shape[1];
    for (int64_t r = 0; r < R; r++) {
        int64_t n = 0;
        for (int64_t j = 0; j < T; j++) n += kiln_i32(in[0])[r * T + j] != (int32_t)a->i[0];
        kiln_f32(out)[r] = n ? 1.0f / (float)n : 0.0f;
    }
    return KILN_OK;
}

kiln_status kiln_cpu_op_pair_diff(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    float s = a->i[0] ? 1.0f : -1.0f; /* i0: the pair's sum instead */
    for (int64_t i = 0; i < out->shape[0]; i++) kiln_f32(out)[i] = kiln_f32(in[0])[2 * i] + s * kiln_f32(in[0])[2 * i + 1];
    return KILN_OK;
}

kiln_status kiln_cpu_op_pair_diff_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    float s = a->i[0] ? 1.0f : -1.0f;
    for (int64_t i = 0; i < in[0]->shape[0]; i++) {
        kiln_f32(out)[2 * i] = kiln_f32(in[0])[i];
        kiln_f32(out)[2 * i + 1] = s * kiln_f32(in[0])[i];
    }
    return KILN_OK;
}

/* the same scalar functions the generated code uses (kiln/opmath.h) */
POINTWISE1(logsigmoid, kiln_logsigmoid_f(x[i]))
POINTWISE2(logsigmoid_bwd, kiln_logsigmoid_bwd_f(x[i], g[i]))
POINTWISE1(relu, x[i] > 0.0f ? x[i] : 0.0f)
POINTWISE2(relu_bwd, x[i] > 0.0f ? g[i] : 0.0f)
POINTWISE1(gt0, x[i] > 0.0f ? 1.0f : 0.0f)
POINTWISE1(log1mexp, kiln_log1mexp_f(x[i]))
POINTWISE2(log1mexp_bwd, kiln_log1mexp_bwd_f(x[i], g[i]))
