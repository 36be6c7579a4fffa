/* CPU kernels of the fused ops the compiler's rewrites produce: flash
 * attention and linear + cross-entropy (their definitions:
 * src/ops/ops_fused.c). */
#include "cpu_ops.h"

kiln_status kiln_cpu_op_flash_attn(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    const int64_t *q = in[0]->shape, *k = in[1]->shape;
    kiln_k_flash_attn_ex(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(in[2]), kiln_i32(in[3]), a->i[0] ? kiln_i32(in[4]) : NULL,
                         kiln_f32(out), kiln_f32(aux[0]), q[0], q[1], k[1], q[2], k[2], q[3], (float)a->f[0], a->i[1],
                         a->i[2] != 0);
    return KILN_OK;
}

kiln_status kiln_cpu_op_flash_attn_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    const int64_t *q = in[0]->shape, *k = in[1]->shape;
    kiln_k_flash_attn_backward_ex(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(in[2]), kiln_i32(in[3]),
                                  a->i[0] ? kiln_i32(in[7]) : NULL, kiln_f32(in[4]), kiln_f32(in[5]), kiln_f32(in[6]),
                                  kiln_f32(out), kiln_f32(aux[0]), kiln_f32(aux[1]), q[0], q[1], k[1], q[2], k[2], q[3],
                                  (float)a->f[0], a->i[1], a->i[2] != 0);
    return KILN_OK;
}

kiln_status kiln_cpu_op_linear_ce(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    const kiln_tensor *h = in[0], *W = in[1], *t = in[2];
    int64_t V = W->shape[0], C = W->shape[1], N = kiln_tensor_numel(t), count = 0;
    const int32_t *tg = kiln_i32(t);
    for (int64_t i = 0; i < N; i++)
        if (tg[i] != (int32_t)a->i[0] && (tg[i] < 0 || tg[i] >= V))
            return kiln_error(KILN_ERR_RANGE, "op linear_cross_entropy: target %d at position %lld is outside [0, %lld)", tg[i],
                              (long long)i, (long long)V);
    kiln_lce_opts o = {.seed = a->i[4] ? kiln_f32(in[3])[0] : 1.0f, .bf16 = a->i[3] != 0, .softcap = (float)a->f[0]};
    double s = kiln_k_linear_cross_entropy_ex(kiln_f32(h), kiln_f32(W), tg, N, C, V, (int32_t)a->i[0], 0, &count,
                                              a->i[1] ? kiln_f32(aux[0]) : NULL, a->i[2] ? kiln_f32(aux[1]) : NULL, &o);
    kiln_f32(out)[0] = (float)s;
    return KILN_OK;
}
