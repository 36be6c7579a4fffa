/* A tensor converted to another storage dtype, through the seam: rows read
 * to the host, converted with the kernels' conversions (kiln/quant.h: the
 * block formats as ggml computes them, bf16/f16 round to nearest even) and
 * written to a new tensor on the same device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/ops.h"
#include "kiln/quant.h"

enum { CONV_VALUES = 1 << 20 }; /* values per host chunk (whole rows) */

kiln_tensor *kiln_tensor_convert(const kiln_tensor *W, kiln_dtype dt) {
    kiln_qtype from, to;
    if (!kiln_q_of_dtype(W->dtype, &from) || !kiln_q_of_dtype(dt, &to)) {
        kiln_error(KILN_ERR_UNSUPPORTED, "converting %s from %s to %s: only float and block types convert", W->name,
                   kiln_dtype_name(W->dtype), kiln_dtype_name(dt));
        return NULL;
    }
    kiln_tensor *t = kiln_tensor_new_on(kiln_tensor_buft(W), dt, W->ndim, W->shape);
    if (!t) {
        kiln_error_context(kiln_last_status(), "converting %s to %s", W->name, kiln_dtype_name(dt));
        return NULL;
    }
    kiln_tensor_set_name(t, W->name);
    t->requires_grad = W->requires_grad && dt == KILN_F32;
    int64_t cols = W->ndim ? W->shape[W->ndim - 1] : 1, rows = cols ? kiln_tensor_numel(W) / cols : 0;
    int64_t per = cols && cols < CONV_VALUES ? CONV_VALUES / cols : 1;
    if (per > rows) per = rows ? rows : 1;
    size_t frb = kiln_q_row_bytes(from, cols), trb = kiln_q_row_bytes(to, cols);
    char *src = malloc((size_t)per * frb + 1), *dst = malloc((size_t)per * trb + 1);
    float *f = malloc((size_t)per * (size_t)cols * sizeof *f + 1);
    kiln_status st = src && dst && f ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory converting %s", W->name);
    for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
        int64_t nr = rows - r0 < per ? rows - r0 : per, n = nr * cols;
        st = kiln_tensor_get(W, (size_t)r0 * frb, src, (size_t)nr * frb);
        if (!st) st = kiln_q_dequantize(from, src, f, n);
        for (int64_t i = 0; i < n && !st; i++)
            if (!isfinite(f[i]))
                st = kiln_error(KILN_ERR_NUMERIC, "converting %s to %s: element [%lld, %lld] is %g", W->name, kiln_dtype_name(dt),
                                (long long)(r0 + i / cols), (long long)(i % cols), f[i]);
        if (!st) st = kiln_q_quantize(to, f, dst, n);
        if (!st) st = kiln_tensor_set(t, (size_t)r0 * trb, dst, (size_t)nr * trb);
    }
    free(src);
    free(dst);
    free(f);
    if (st) {
        kiln_tensor_release(t);
        return NULL;
    }
    return t;
}
