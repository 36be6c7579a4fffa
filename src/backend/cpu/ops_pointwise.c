/* CPU kernels of the element-wise, broadcast, reduction and layout ops
 * (their definitions: src/ops/ops_pointwise.c). */
#include "cpu_ops.h"

/* add: b broadcasts to a */
kiln_status kiln_cpu_op_add(kiln_tensor *const *in, const kiln_attrs *at, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)at, (void)aux;
    const float *a = kiln_f32(in[0]), *b = kiln_f32(in[1]);
    float *o = kiln_f32(out);
    int64_t n = kiln_tensor_numel(in[0]);
    if (kiln_tensor_numel(in[1]) == n) {
        kiln_k_add(a, b, o, n);
        return KILN_OK;
    }
    int64_t sa[4], sb[4], st[4];
    kiln_cpu_pad4(in[0], sa);
    kiln_cpu_pad4(in[1], sb);
    st[3] = sb[3] == 1 ? 0 : 1;
    st[2] = sb[2] == 1 ? 0 : sb[3];
    st[1] = sb[1] == 1 ? 0 : sb[3] * sb[2];
    st[0] = sb[0] == 1 ? 0 : sb[3] * sb[2] * sb[1];
    int64_t rows = sa[0] * sa[1] * sa[2], D = sa[3];
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i2 = r % sa[2], i1 = (r / sa[2]) % sa[1], i0 = r / (sa[2] * sa[1]);
        const float *br = b + i0 * st[0] + i1 * st[1] + i2 * st[2];
        const float *ar = a + r * D;
        float *orow = o + r * D;
        if (st[3])
            for (int64_t j = 0; j < D; j++) orow[j] = ar[j] + br[j];
        else
            for (int64_t j = 0; j < D; j++) orow[j] = ar[j] + br[0];
    }
    return KILN_OK;
}

kiln_status kiln_cpu_op_mul(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_mul(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_scale(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    kiln_k_scale(kiln_f32(in[0]), (float)a->f[0], kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_scale_by(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_scale(kiln_f32(in[0]), kiln_f32(in[1])[0], kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_silu(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_silu(kiln_f32(in[0]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_silu_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_silu_backward(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_sum(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_f32(out)[0] = (float)kiln_k_sum(kiln_f32(in[0]), kiln_tensor_numel(in[0]));
    return KILN_OK;
}

kiln_status kiln_cpu_op_mean(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    int64_t n = kiln_tensor_numel(in[0]);
    kiln_f32(out)[0] = (float)(kiln_k_sum(kiln_f32(in[0]), n) / (double)(n ? n : 1));
    return KILN_OK;
}

kiln_status kiln_cpu_op_expand(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    float v = kiln_f32(in[0])[0], *o = kiln_f32(out);
    int64_t n = kiln_tensor_numel(out);
    for (int64_t i = 0; i < n; i++) o[i] = v;
    return KILN_OK;
}

kiln_status kiln_cpu_op_sum_to(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    int64_t sg[4], so[4];
    kiln_cpu_pad4(in[0], sg);
    kiln_cpu_pad4(out, so);
    const float *g = kiln_f32(in[0]);
    float *o = kiln_f32(out);
    memset(o, 0, kiln_tensor_nbytes(out));
    for (int64_t i0 = 0; i0 < sg[0]; i0++)
        for (int64_t i1 = 0; i1 < sg[1]; i1++)
            for (int64_t i2 = 0; i2 < sg[2]; i2++)
                for (int64_t i3 = 0; i3 < sg[3]; i3++) {
                    int64_t j = (((so[0] > 1 ? i0 : 0) * so[1] + (so[1] > 1 ? i1 : 0)) * so[2] + (so[2] > 1 ? i2 : 0)) * so[3] +
                                (so[3] > 1 ? i3 : 0);
                    o[j] += g[((i0 * sg[1] + i1) * sg[2] + i2) * sg[3] + i3];
                }
    return KILN_OK;
}

kiln_status kiln_cpu_op_fill(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)in, (void)aux;
    float v = (float)a->f[0], *o = kiln_f32(out);
    for (int64_t i = 0; i < kiln_tensor_numel(out); i++) o[i] = v;
    return KILN_OK;
}

kiln_status kiln_cpu_op_cast_bf16(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_f32_to_bf16(kiln_f32(in[0]), out->data, kiln_tensor_numel(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_round_bf16(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_round_bf16(kiln_f32(in[0]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}

/* reshape is a view (the registry and the interpreter share the input's
 * memory and never call this); run into a separate output it is a copy */
kiln_status kiln_cpu_op_reshape(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    if (out->data != in[0]->data) memmove(out->data, in[0]->data, kiln_tensor_nbytes(out));
    return KILN_OK;
}

kiln_status kiln_cpu_op_transpose12(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    int64_t A = in[0]->shape[0], B = in[0]->shape[1], C = in[0]->shape[2], D = in[0]->shape[3];
    size_t es = kiln_dtype_size(in[0]->dtype), row = (size_t)D * es;
    const char *x = in[0]->data;
    char *y = out->data;
#pragma omp parallel for collapse(2) if (A * B * C * D > 65536) schedule(static)
    for (int64_t i = 0; i < A; i++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t b = 0; b < B; b++)
                memcpy(y + (size_t)(((i * C + c) * B + b)) * row, x + (size_t)(((i * B + b) * C + c)) * row, row);
    return KILN_OK;
}

/* gradient accumulation (kiln_op_accumulate, the interpreter's sinks) */
kiln_status kiln_cpu_accumulate(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    kiln_k_axpy(in[1] ? kiln_f32(in[1])[0] : 1.0f, kiln_f32(in[0]), kiln_f32(out), kiln_tensor_numel(out));
    return KILN_OK;
}
/* the same scalar functions the generated code uses (kiln/opmath.h) */
POINTWISE1(tanh, tanhf(x[i]))
POINTWISE2(tanh_bwd, kiln_tanh_bwd_f(x[i], g[i]))
POINTWISE1(gelu_tanh, kiln_gelu_tanh_f(x[i]))
POINTWISE2(gelu_tanh_bwd, kiln_gelu_tanh_bwd_f(x[i], g[i]))
