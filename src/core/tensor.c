/* Reference-counted tensors over shared, refcounted storage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/core.h"

struct kiln_storage {
    void *data;
    size_t nbytes;
    int refcount;
};

size_t kiln_dtype_size(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32: return 4;
    case KILN_BF16: return 2;
    case KILN_I32: return 4;
    case KILN_F16: return 2;
    }
    return 0;
}

const char *kiln_dtype_name(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32: return "f32";
    case KILN_BF16: return "bf16";
    case KILN_I32: return "i32";
    case KILN_F16: return "f16";
    }
    return "?";
}

/* Element count and byte size of a shape, refusing anything whose bytes do
 * not fit in ptrdiff_t: shapes come from files (config.json, safetensors,
 * shards), and a product that wraps would allocate a tiny block that the
 * caller then writes past. */
kiln_status kiln_shape_bytes(kiln_dtype dt, int ndim, const int64_t *shape, int64_t *numel, size_t *nbytes) {
    if (ndim < 0 || ndim > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_SHAPE, "tensor with %d dims (at most %d)", ndim, KILN_MAX_DIMS);
    int64_t n = 1;
    bool wrapped = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return kiln_error(KILN_ERR_SHAPE, "negative size %lld in dim %d", (long long)shape[i], i);
        wrapped |= __builtin_mul_overflow(n, shape[i], &n);
    }
    int64_t b = 0;
    wrapped |= __builtin_mul_overflow(n, (int64_t)kiln_dtype_size(dt), &b);
    if (wrapped || (uint64_t)b > (uint64_t)PTRDIFF_MAX) {
        char buf[160];
        size_t o = 0;
        for (int i = 0; i < ndim && o < sizeof buf; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, i ? ", %lld" : "%lld", (long long)shape[i]);
        if (!ndim) buf[0] = 0;
        return kiln_error(KILN_ERR_RANGE, "tensor [%s] %s is too large: its size in bytes overflows 64 bits", buf,
                          kiln_dtype_name(dt));
    }
    if (numel) *numel = n;
    if (nbytes) *nbytes = (size_t)b;
    return KILN_OK;
}

static kiln_status check_shape(kiln_dtype dt, int ndim, const int64_t *shape) {
    return kiln_shape_bytes(dt, ndim, shape, NULL, NULL);
}

static kiln_tensor *tensor_header(kiln_dtype dt, int ndim, const int64_t *shape) {
    if (check_shape(dt, ndim, shape)) return NULL;
    kiln_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        kiln_error(KILN_ERR_OOM, "out of memory (tensor header)");
        return NULL;
    }
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->dtype = dt;
    t->refcount = 1;
    return t;
}

kiln_tensor *kiln_tensor_new(kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_tensor *t = tensor_header(dt, ndim, shape);
    if (!t) return NULL;
    size_t nb = kiln_tensor_nbytes(t);
    kiln_storage *s = malloc(sizeof *s);
    void *d = s ? kiln_alloc(nb ? nb : 1) : NULL;
    if (!s || !d) {
        free(s);
        free(t);
        kiln_error(KILN_ERR_OOM, "out of memory allocating a %zu-byte tensor", nb);
        return NULL;
    }
    s->data = d;
    s->nbytes = nb;
    s->refcount = 1;
    t->storage = s;
    t->data = d;
    return t;
}

kiln_tensor *kiln_tensor_zeros(kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_tensor *t = kiln_tensor_new(dt, ndim, shape);
    if (t) memset(t->data, 0, kiln_tensor_nbytes(t));
    return t;
}

kiln_tensor *kiln_tensor_wrap(void *data, kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_tensor *t = tensor_header(dt, ndim, shape);
    if (t) t->data = data;
    return t;
}

kiln_tensor *kiln_tensor_view(kiln_tensor *src, int ndim, const int64_t *shape) {
    kiln_tensor *t = tensor_header(src->dtype, ndim, shape);
    if (!t) return NULL;
    if (kiln_tensor_numel(t) != kiln_tensor_numel(src)) {
        char b[96];
        kiln_error(KILN_ERR_SHAPE, "view: cannot view %s as %d dims of %lld elements",
                   kiln_shape_str(src, b, sizeof b), ndim, (long long)kiln_tensor_numel(t));
        free(t);
        return NULL;
    }
    t->data = src->data;
    t->storage = src->storage;
    if (t->storage) __atomic_add_fetch(&t->storage->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

kiln_tensor *kiln_tensor_retain(kiln_tensor *t) {
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

void kiln_tensor_release(kiln_tensor *t) {
    if (!t) return;
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    kiln_storage *s = t->storage;
    if (s && __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
        kiln_dealloc(s->data);
        free(s);
    }
    kiln_tensor_release(t->grad);
    kiln_node_release(t->node);
    free(t);
}

int64_t kiln_tensor_numel(const kiln_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t kiln_tensor_nbytes(const kiln_tensor *t) {
    return (size_t)kiln_tensor_numel(t) * kiln_dtype_size(t->dtype);
}

bool kiln_tensor_same_shape(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *kiln_shape_str(const kiln_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "] %s", kiln_dtype_name(t->dtype));
    return buf;
}

void kiln_tensor_set_name(kiln_tensor *t, const char *name) {
    snprintf(t->name, sizeof t->name, "%s", name);
}

void kiln_node_release(kiln_node_base *n) {
    if (n && __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) == 0) n->destroy(n);
}
