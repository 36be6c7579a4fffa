/* Host chunks in and out of tensors through the seam (hostio.h). */
#include <stdlib.h>
#include <string.h>
#include "hostio.h"

enum { CHUNK_BYTES = 1 << 20 };

static int64_t chunk_elems(const kiln_tensor *t) {
    int64_t e = (int64_t)kiln_dtype_size(t->dtype);
    return CHUNK_BYTES / (e ? e : 1);
}

kiln_status kiln_host_fill(kiln_tensor *t, kiln_host_fill_fn fn, const void *ctx) {
    int64_t n = kiln_tensor_numel(t);
    size_t es = kiln_dtype_size(t->dtype);
    if (!es) return kiln_error(KILN_ERR_UNSUPPORTED, "%s '%s': a %s tensor is blocks, not elements", "filling", t->name, kiln_dtype_name(t->dtype));
    if (!n) return KILN_OK;
    if (kiln_tensor_buft(t)->host_mappable) {
        fn(kiln_tensor_map(t), 0, n, ctx);
        return KILN_OK;
    }
    int64_t step = chunk_elems(t);
    size_t cap = (size_t)(n < step ? n : step) * es;
    void *buf = malloc(cap);
    if (!buf) return kiln_error(KILN_ERR_OOM, "out of memory filling '%s'", t->name);
    kiln_status st = KILN_OK;
    for (int64_t i = 0; i < n && !st; i += step) {
        int64_t k = n - i < step ? n - i : step;
        fn(buf, i, k, ctx);
        st = kiln_tensor_set(t, (size_t)i * es, buf, (size_t)k * es);
    }
    free(buf);
    return st;
}

kiln_status kiln_host_set_all(kiln_tensor *t, const void *src) {
    size_t nb = kiln_tensor_nbytes(t);
    return nb ? kiln_tensor_set(t, 0, src, nb) : KILN_OK;
}

kiln_status kiln_host_read(const kiln_tensor *t, kiln_host_read_fn fn, void *ctx) {
    int64_t n = kiln_tensor_numel(t);
    size_t es = kiln_dtype_size(t->dtype);
    if (!es) return kiln_error(KILN_ERR_UNSUPPORTED, "%s '%s': a %s tensor is blocks, not elements", "reading", t->name, kiln_dtype_name(t->dtype));
    if (!n) return KILN_OK;
    if (kiln_tensor_buft(t)->host_mappable) return fn(kiln_tensor_map(t), 0, n, ctx);
    int64_t step = chunk_elems(t);
    size_t cap = (size_t)(n < step ? n : step) * es;
    void *buf = malloc(cap);
    if (!buf) return kiln_error(KILN_ERR_OOM, "out of memory reading '%s'", t->name);
    kiln_status st = KILN_OK;
    for (int64_t i = 0; i < n && !st; i += step) {
        int64_t k = n - i < step ? n - i : step;
        st = kiln_tensor_get(t, (size_t)i * es, buf, (size_t)k * es);
        if (!st) st = fn(buf, i, k, ctx);
    }
    free(buf);
    return st;
}

const void *kiln_host_bytes(const kiln_tensor *t, void **owned) {
    static const char empty[1];
    *owned = NULL;
    size_t nb = kiln_tensor_nbytes(t);
    if (!nb) return empty;
    if (kiln_tensor_buft(t)->host_mappable) return kiln_tensor_map(t);
    void *h = malloc(nb);
    if (!h) {
        kiln_error(KILN_ERR_OOM, "out of memory copying '%s' (%zu bytes) to the host", t->name, nb);
        return NULL;
    }
    if (kiln_tensor_get(t, 0, h, nb)) {
        free(h);
        return NULL;
    }
    *owned = h;
    return h;
}

const kiln_backend *kiln_model_backend(const kiln_llama *m) {
    return m && m->embed_tokens ? kiln_backend_of(m->embed_tokens) : kiln_backend_current();
}
