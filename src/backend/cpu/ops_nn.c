/* CPU kernels of the neural-network ops: normalisation, rotary embedding,
 * attention pieces, softmax and the loss (their definitions:
 * src/ops/ops_nn.c). */
#include <stdlib.h>
#include "cpu_ops.h"

kiln_status kiln_cpu_op_rmsnorm(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t C = in[1]->shape[0];
    kiln_k_rmsnorm(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(out), kiln_tensor_numel(in[0]) / C, C, (float)a->f[0]);
    return KILN_OK;
}

kiln_status kiln_cpu_op_rmsnorm_bwd_x(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t C = in[1]->shape[0];
    kiln_k_rmsnorm_backward(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(in[2]), kiln_f32(out), NULL,
                            kiln_tensor_numel(in[0]) / C, C, (float)a->f[0]);
    return KILN_OK;
}

kiln_status kiln_cpu_op_rmsnorm_bwd_w(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t C = in[1]->shape[0], n = kiln_tensor_numel(in[0]);
    memset(out->data, 0, kiln_tensor_nbytes(out));
    kiln_k_rmsnorm_backward(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(in[2]), NULL, kiln_f32(out), n / C, C,
                            (float)a->f[0]);
    return KILN_OK;
}

static double attr_f64(int64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

kiln_status kiln_cpu_op_rope(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    const int64_t *s = in[0]->shape;
    const int32_t *pos = a->i[1] & 2 ? kiln_i32(in[1]) : NULL;
    bool inverse = a->i[1] & 1;
    for (int64_t i = 0; pos && i < s[0] * s[1]; i++)
        if (pos[i] < 0) return kiln_error(KILN_ERR_RANGE, "op rope: position %d at index %lld is negative", pos[i], (long long)i);
    if (!a->i[2] && !pos) {
        kiln_k_rope(kiln_f32(in[0]), kiln_f32(out), s[0], s[1], s[2], s[3], a->i[0], (float)a->f[0], inverse);
        return KILN_OK;
    }
    float *inv = malloc((size_t)(s[3] / 2 ? s[3] / 2 : 1) * sizeof(float));
    if (!inv) return kiln_error(KILN_ERR_OOM, "rope: out of memory for %lld frequencies", (long long)(s[3] / 2));
    /* as kiln_k_rope forms them (theta rounded to float first) */
    kiln_k_rope_inv_freq(s[3], (float)a->f[0], (int)a->i[2], a->f[1], attr_f64(a->i[4]), attr_f64(a->i[5]), a->i[3], inv);
    if (pos) kiln_k_rope_freq_pos(kiln_f32(in[0]), kiln_f32(out), s[0], s[1], s[2], s[3], pos, inv, inverse);
    else kiln_k_rope_freq(kiln_f32(in[0]), kiln_f32(out), s[0], s[1], s[2], s[3], a->i[0], inv, inverse);
    free(inv);
    return KILN_OK;
}

kiln_status kiln_cpu_op_repeat_kv(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    const int64_t *s = in[0]->shape;
    int64_t B = s[0], Hk = s[1], blk = s[2] * s[3], R = a->i[0];
    const float *x = kiln_f32(in[0]);
    float *y = kiln_f32(out);
#pragma omp parallel for collapse(2) if (B * Hk * R * blk > 65536) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hk * R; h++)
            memcpy(y + (b * Hk * R + h) * blk, x + (b * Hk + h / R) * blk, (size_t)blk * sizeof(float));
    return KILN_OK;
}

kiln_status kiln_cpu_op_repeat_kv_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    const int64_t *s = out->shape;
    int64_t B = s[0], Hk = s[1], blk = s[2] * s[3], R = a->i[0];
    const float *g = kiln_f32(in[0]);
    float *y = kiln_f32(out);
#pragma omp parallel for collapse(2) if (B * Hk * R * blk > 65536) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hk; h++) {
            float *dst = y + (b * Hk + h) * blk;
            const float *src = g + (b * Hk + h) * R * blk;
            memcpy(dst, src, (size_t)blk * sizeof(float));
            for (int64_t r = 1; r < R; r++) kiln_k_axpy(1.0f, src + r * blk, dst, blk);
        }
    return KILN_OK;
}

kiln_status kiln_cpu_op_attn_mask(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int64_t B = in[0]->shape[0], Tk = in[0]->shape[1], Tq = a->i[0], W = a->i[2];
    const int32_t *pm = kiln_i32(in[0]), *sg = a->i[1] ? kiln_i32(in[1]) : NULL;
    float *m = kiln_f32(out);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t p = Tk - Tq + i;
            float *row = m + (b * Tq + i) * Tk;
            const int32_t *sr = sg ? sg + b * Tk : NULL;
            for (int64_t j = 0; j < Tk; j++)
                row[j] = (j <= p && (!W || p - j < W) && pm[b * Tk + j] && (!sr || sr[j] == sr[p])) ? 0.0f : -INFINITY;
        }
    return KILN_OK;
}

kiln_status kiln_cpu_op_softmax(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    int64_t n = in[0]->shape[in[0]->ndim - 1];
    kiln_k_softmax(kiln_f32(in[0]), kiln_f32(out), kiln_tensor_numel(out) / (n ? n : 1), n);
    return KILN_OK;
}

kiln_status kiln_cpu_op_softmax_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)a, (void)aux;
    int64_t n = in[0]->shape[in[0]->ndim - 1];
    kiln_k_softmax_backward(kiln_f32(in[0]), kiln_f32(in[1]), kiln_f32(out), kiln_tensor_numel(out) / (n ? n : 1), n);
    return KILN_OK;
}

static kiln_status ce_targets_ok(const kiln_tensor *logits, const kiln_tensor *targets, int32_t ignore) {
    int64_t V = logits->shape[logits->ndim - 1], n = kiln_tensor_numel(targets);
    const int32_t *t = kiln_i32(targets);
    for (int64_t i = 0; i < n; i++)
        if (t[i] != ignore && (t[i] < 0 || t[i] >= V))
            return kiln_error(KILN_ERR_RANGE, "op cross_entropy: target %d at position %lld is outside [0, %lld)",
                              t[i], (long long)i, (long long)V);
    return KILN_OK;
}

kiln_status kiln_cpu_op_cross_entropy(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out, kiln_tensor *const *aux) {
    (void)aux;
    int32_t ignore = (int32_t)a->i[0];
    kiln_status st = ce_targets_ok(in[0], in[1], ignore);
    if (st) return st;
    int64_t V = in[0]->shape[in[0]->ndim - 1], count = 0;
    double s = kiln_k_cross_entropy(kiln_f32(in[0]), kiln_i32(in[1]), kiln_tensor_numel(in[1]), V, ignore, &count);
    kiln_f32(out)[0] = (float)s;
    return KILN_OK;
}

kiln_status kiln_cpu_op_cross_entropy_bwd(kiln_tensor *const *in, const kiln_attrs *a, kiln_tensor *out,
                                          kiln_tensor *const *aux) {
    (void)aux;
    int64_t V = in[0]->shape[in[0]->ndim - 1];
    kiln_k_cross_entropy_backward(kiln_f32(in[0]), kiln_i32(in[1]), kiln_f32(in[2])[0], kiln_f32(out),
                                  kiln_tensor_numel(in[1]), V, (int32_t)a->i[0]);
    return KILN_OK;
}
