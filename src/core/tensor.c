/* Reference-counted tensors over shared, refcounted storage. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/core.h"

struct kiln_storage {
    void *data;
    size_t nbytes;
    int refcount;
    const kiln_buffer_type *buft;
};

/* ---- the host buffer type: the caching allocator and memcpy ---- */
static void *host_alloc(size_t n) { return kiln_alloc(n); }
static void host_free(void *p, size_t n) {
    (void)n;
    kiln_dealloc(p);
}
static void host_move(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
}
static void host_zero(void *dst, size_t n) {
    if (n) memset(dst, 0, n);
}
const kiln_buffer_type kiln_buft_host = {
    .name = "cpu", .alignment = 64, .host_mappable = true, .alloc = host_alloc, .free = host_free,
    .write = host_move, .read = host_move, .copy = host_move, .zero = host_zero,
};

static _Thread_local const kiln_buffer_type *current_buft;
const kiln_buffer_type *kiln_buft_current(void) { return current_buft ? current_buft : &kiln_buft_host; }
const kiln_buffer_type *kiln_buft_use(const kiln_buffer_type *b) {
    const kiln_buffer_type *was = kiln_buft_current();
    current_buft = b;
    return was;
}

/* One row per dtype: name, values per block, bytes per block (the block
 * types' sizes are ggml's, kiln/quant.h). */
static const struct {
    const char *name;
    int block, bytes;
} dtypes[KILN_N_DTYPES] = {
    [KILN_F32] = {"f32", 1, 4},    [KILN_BF16] = {"bf16", 1, 2},   [KILN_I32] = {"i32", 1, 4},
    [KILN_F16] = {"f16", 1, 2},    [KILN_Q8_0] = {"q8_0", 32, 34}, [KILN_Q4_0] = {"q4_0", 32, 18},
    [KILN_Q4_K] = {"q4_k", 256, 144}, [KILN_Q5_K] = {"q5_k", 256, 176}, [KILN_Q6_K] = {"q6_k", 256, 210},
    [KILN_Q4_1] = {"q4_1", 32, 20},   [KILN_Q5_0] = {"q5_0", 32, 22},   [KILN_Q5_1] = {"q5_1", 32, 24},
};
static bool dtype_known(kiln_dtype dt) { return (unsigned)dt < KILN_N_DTYPES; }

size_t kiln_dtype_size(kiln_dtype dt) {
    return dtype_known(dt) && dtypes[dt].block == 1 ? (size_t)dtypes[dt].bytes : 0;
}
const char *kiln_dtype_name(kiln_dtype dt) { return dtype_known(dt) ? dtypes[dt].name : "?"; }
int kiln_dtype_block(kiln_dtype dt) { return dtype_known(dt) ? dtypes[dt].block : 0; }
int kiln_dtype_block_bytes(kiln_dtype dt) { return dtype_known(dt) ? dtypes[dt].bytes : 0; }

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
    if (!dtype_known(dt)) return kiln_error(KILN_ERR_INVALID, "tensor of unknown dtype %d", (int)dt);
    int blk = dtypes[dt].block;
    if (blk > 1 && (ndim < 1 || shape[ndim - 1] % blk)) {
        char buf[160];
        return kiln_error(KILN_ERR_SHAPE, "tensor %s %s: rows must be whole blocks of %d values", kiln_dims_str(ndim, shape, buf, sizeof buf),
                          dtypes[dt].name, blk);
    }
    int64_t b = 0;
    wrapped |= __builtin_mul_overflow(n / blk, (int64_t)dtypes[dt].bytes, &b);
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

kiln_tensor *kiln_tensor_new_on(const kiln_buffer_type *b, kiln_dtype dt, int ndim, const int64_t *shape) {
    if (!b) b = &kiln_buft_host;
    kiln_tensor *t = tensor_header(dt, ndim, shape);
    if (!t) return NULL;
    size_t nb = kiln_tensor_nbytes(t);
    kiln_storage *s = malloc(sizeof *s);
    void *d = s ? b->alloc(nb ? nb : 1) : NULL;
    if (!s || !d) {
        free(s);
        free(t);
        kiln_error(KILN_ERR_OOM, "out of memory allocating a %zu-byte tensor on %s", nb, b->name);
        return NULL;
    }
    s->data = d;
    s->nbytes = nb;
    s->refcount = 1;
    s->buft = b;
    t->storage = s;
    t->data = d;
    return t;
}

kiln_tensor *kiln_tensor_zeros_on(const kiln_buffer_type *b, kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_tensor *t = kiln_tensor_new_on(b, dt, ndim, shape);
    if (t) kiln_tensor_buft(t)->zero(t->data, kiln_tensor_nbytes(t));
    return t;
}

kiln_tensor *kiln_tensor_new(kiln_dtype dt, int ndim, const int64_t *shape) {
    return kiln_tensor_new_on(kiln_buft_current(), dt, ndim, shape);
}

kiln_tensor *kiln_tensor_zeros(kiln_dtype dt, int ndim, const int64_t *shape) {
    return kiln_tensor_zeros_on(kiln_buft_current(), dt, ndim, shape);
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

kiln_tensor *kiln_tensor_view_bytes(kiln_tensor *base, size_t off, kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_tensor *t = tensor_header(dt, ndim, shape);
    if (!t) return NULL;
    size_t nb = kiln_tensor_nbytes(base);
    if (off > nb || kiln_tensor_nbytes(t) > nb - off) {
        char b[96];
        kiln_error(KILN_ERR_RANGE, "view: %zu bytes at offset %zu do not fit in %s", kiln_tensor_nbytes(t), off,
                   kiln_shape_str(base, b, sizeof b));
        free(t);
        return NULL;
    }
    t->data = (char *)base->data + off;
    t->storage = base->storage;
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
        s->buft->free(s->data, s->nbytes);
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
    /* checked when the tensor was made: whole blocks, no overflow */
    int blk = kiln_dtype_block(t->dtype);
    return (size_t)(kiln_tensor_numel(t) / (blk ? blk : 1)) * (size_t)kiln_dtype_block_bytes(t->dtype);
}

bool kiln_tensor_same_shape(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *kiln_dims_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

const char *kiln_shape_str(const kiln_tensor *t, char *buf, size_t n) {
    kiln_dims_str(t->ndim, t->shape, buf, n);
    size_t o = strlen(buf);
    if (o + 1 < n) snprintf(buf + o, n - o, " %s", kiln_dtype_name(t->dtype));
    return buf;
}

void kiln_tensor_set_name(kiln_tensor *t, const char *name) {
    snprintf(t->name, sizeof t->name, "%s", name);
}

void kiln_node_release(kiln_node_base *n) {
    if (n && __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) == 0) n->destroy(n);
}

/* ---- host access through the seam ---- */
const kiln_buffer_type *kiln_tensor_buft(const kiln_tensor *t) {
    return t->storage ? t->storage->buft : &kiln_buft_host;
}

static kiln_status check_range(const kiln_tensor *t, size_t off, size_t n, const char *what) {
    size_t nb = kiln_tensor_nbytes(t);
    if (off > nb || n > nb - off)
        return kiln_error(KILN_ERR_RANGE, "%s: bytes [%zu, %zu + %zu) outside tensor '%s' of %zu bytes", what, off, off, n,
                          t->name, nb);
    return KILN_OK;
}

kiln_status kiln_tensor_set(kiln_tensor *t, size_t off, const void *src, size_t n) {
    kiln_status st = check_range(t, off, n, "tensor set");
    if (!st) kiln_tensor_buft(t)->write((char *)t->data + off, src, n);
    return st;
}

kiln_status kiln_tensor_get(const kiln_tensor *t, size_t off, void *dst, size_t n) {
    kiln_status st = check_range(t, off, n, "tensor get");
    if (!st) kiln_tensor_buft(t)->read(dst, (const char *)t->data + off, n);
    return st;
}

kiln_status kiln_tensor_copy(kiln_tensor *dst, size_t doff, const kiln_tensor *src, size_t soff, size_t n) {
    kiln_status st = check_range(dst, doff, n, "tensor copy (destination)");
    if (!st) st = check_range(src, soff, n, "tensor copy (source)");
    if (st || !n) return st;
    const kiln_buffer_type *a = kiln_tensor_buft(dst), *b = kiln_tensor_buft(src);
    char *d = (char *)dst->data + doff;
    const char *s = (const char *)src->data + soff;
    if (a == b) {
        a->copy(d, s, n);
        return KILN_OK;
    }
    enum { CHUNK = 1 << 20 }; /* between two types: through a host buffer */
    char *tmp = malloc(n < CHUNK ? n : CHUNK);
    if (!tmp) return kiln_error(KILN_ERR_OOM, "out of memory copying %s -> %s", b->name, a->name);
    for (size_t o = 0; o < n; o += CHUNK) {
        size_t k = n - o < CHUNK ? n - o : CHUNK;
        b->read(tmp, s + o, k);
        a->write(d + o, tmp, k);
    }
    free(tmp);
    return KILN_OK;
}

kiln_status kiln_tensor_zero(kiln_tensor *t) {
    kiln_tensor_buft(t)->zero(t->data, kiln_tensor_nbytes(t));
    return KILN_OK;
}

float kiln_tensor_item_f32(const kiln_tensor *t, int64_t i) {
    float v = NAN;
    if (t->dtype != KILN_F32) {
        kiln_error(KILN_ERR_INVALID, "item: tensor '%s' is %s, not f32", t->name, kiln_dtype_name(t->dtype));
        return v;
    }
    if (i < 0 || kiln_tensor_get(t, (size_t)i * sizeof v, &v, sizeof v)) return NAN;
    return v;
}

void *kiln_tensor_map(const kiln_tensor *t) {
    const kiln_buffer_type *b = kiln_tensor_buft(t);
    if (b->host_mappable) return t->data;
    kiln_error(KILN_ERR_INVALID, "tensor '%s' lives on %s, whose memory the host cannot map (use kiln_tensor_get/set)",
               t->name, b->name);
    return NULL;
}
