/* GGUF v3 writer: metadata and tensor infos are serialised into memory as
 * they are set, tensor data is streamed through an atomic file. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer stores values in host order and needs a little-endian host"
#endif

typedef struct {
    char *name;
    kiln_ggml_type type;
    int ndim;
    int64_t ne[KILN_MAX_DIMS]; /* innermost first, as in the file */
    uint64_t nbytes, offset;
} tinfo;

enum { PHASE_PLAN, PHASE_DATA, PHASE_DONE, PHASE_FAILED };

struct kiln_gguf_writer {
    unsigned char *kv; /* serialised key/value pairs */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;
    size_t n_keys, keys_cap;
    uint32_t alignment;
    tinfo *t;
    int n_t, t_cap;
    int phase;
    kiln_atomic_file *f;
    const char *path; /* valid between begin and finish */
    int cur;          /* tensor receiving data */
    uint64_t cur_done;
    uint64_t data_start;
};

/* ---- conversions ------------------------------------------------------- */

static const struct {
    kiln_ggml_type t;
    const char *name;
    int block, bytes;
} g_types[] = {
    {KILN_GGML_F32, "F32", 1, 4},      {KILN_GGML_F16, "F16", 1, 2},       {KILN_GGML_Q4_0, "Q4_0", 32, 18},
    {KILN_GGML_Q4_1, "Q4_1", 32, 20},  {KILN_GGML_Q5_0, "Q5_0", 32, 22},   {KILN_GGML_Q5_1, "Q5_1", 32, 24},
    {KILN_GGML_Q8_0, "Q8_0", 32, 34},  {KILN_GGML_Q4_K, "Q4_K", 256, 144}, {KILN_GGML_Q5_K, "Q5_K", 256, 176},
    {KILN_GGML_Q6_K, "Q6_K", 256, 210}, {KILN_GGML_BF16, "BF16", 1, 2},
};

static int type_index(kiln_ggml_type t) {
    for (int i = 0; i < (int)(sizeof g_types / sizeof g_types[0]); i++)
        if (g_types[i].t == t) return i;
    return -1;
}
const char *kiln_ggml_type_name(kiln_ggml_type t) {
    int i = type_index(t);
    return i < 0 ? NULL : g_types[i].name;
}
int kiln_ggml_block(kiln_ggml_type t) {
    int i = type_index(t);
    return i < 0 ? 0 : g_types[i].block;
}
int kiln_ggml_block_bytes(kiln_ggml_type t) {
    int i = type_index(t);
    return i < 0 ? 0 : g_types[i].bytes;
}

size_t kiln_ggml_nbytes(kiln_ggml_type t, int64_t n) {
    int i = type_index(t);
    if (i < 0 || n < 0 || n % g_types[i].block) return 0;
    return (size_t)(n / g_types[i].block) * (size_t)g_types[i].bytes;
}

kiln_status kiln_ggml_convert(kiln_ggml_type t, const float *x, int64_t n, void *out) {
    switch (t) {
    case KILN_GGML_F32: memcpy(out, x, (size_t)n * 4); return KILN_OK;
    case KILN_GGML_F16: {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = kiln_f32_to_f16(x[i]);
        return KILN_OK;
    }
    case KILN_GGML_BF16: {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = kiln_f32_to_bf16(x[i]);
        return KILN_OK;
    }
    case KILN_GGML_Q8_0: {
        if (n % KILN_Q8_0_BLOCK) return kiln_error(KILN_ERR_SHAPE, "Q8_0 needs a multiple of 32 values, got %lld", (long long)n);
        unsigned char *o = out;
        for (int64_t b = 0; b < n / KILN_Q8_0_BLOCK; b++, o += KILN_Q8_0_BYTES) {
            const float *v = x + b * KILN_Q8_0_BLOCK;
            float amax = 0;
            for (int j = 0; j < KILN_Q8_0_BLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
            float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
            uint16_t dh = kiln_f32_to_f16(d);
            memcpy(o, &dh, 2);
            for (int j = 0; j < KILN_Q8_0_BLOCK; j++) o[2 + j] = (unsigned char)(int8_t)roundf(v[j] * id);
        }
        return KILN_OK;
    }
    case KILN_GGML_Q4_0:
    case KILN_GGML_Q4_1:
    case KILN_GGML_Q5_0:
    case KILN_GGML_Q5_1:
    case KILN_GGML_Q4_K:
    case KILN_GGML_Q5_K:
    case KILN_GGML_Q6_K:
        return kiln_error(KILN_ERR_UNSUPPORTED, "converting to %s is the kernels' (kiln_q_quantize), not the writer's",
                          kiln_ggml_type_name(t));
    }
    return kiln_error(KILN_ERR_INVALID, "unknown ggml type %d", (int)t);
}

/* ---- metadata ---------------------------------------------------------- */

kiln_status kiln_gguf_writer_new(kiln_gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kiln_error(KILN_ERR_OOM, "out of memory");
    (*out)->alignment = KILN_GGUF_DEFAULT_ALIGNMENT;
    return KILN_OK;
}

void kiln_gguf_writer_free(kiln_gguf_writer *w) {
    if (!w) return;
    kiln_atomic_abort(w->f);
    for (size_t i = 0; i < w->n_keys; i++) free(w->keys[i]);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kv);
    free(w);
}

static kiln_status put(kiln_gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        unsigned char *k = realloc(w->kv, cap);
        if (!k) return kiln_error(KILN_ERR_OOM, "out of memory building GGUF metadata (%zu bytes)", cap);
        w->kv = k, w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return KILN_OK;
}
static kiln_status put_u32(kiln_gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static kiln_status put_u64(kiln_gguf_writer *w, uint64_t v) { return put(w, &v, 8); }
static kiln_status put_str(kiln_gguf_writer *w, const char *s, size_t n) {
    kiln_status st = put_u64(w, n);
    return st ? st : put(w, s, n);
}

static size_t scalar_size(kiln_gguf_type t) {
    switch (t) {
    case KILN_GGUF_UINT8: case KILN_GGUF_INT8: case KILN_GGUF_BOOL: return 1;
    case KILN_GGUF_UINT16: case KILN_GGUF_INT16: return 2;
    case KILN_GGUF_UINT32: case KILN_GGUF_INT32: case KILN_GGUF_FLOAT32: return 4;
    case KILN_GGUF_UINT64: case KILN_GGUF_INT64: case KILN_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Checks phase and key, records the key and writes it with its type; the
 * caller then writes the value. On a later failure the half-written pair
 * is cut off again (kv_len restored by the caller through *mark). */
static kiln_status begin_kv(kiln_gguf_writer *w, const char *key, kiln_gguf_type type, size_t *mark) {
    if (w->phase != PHASE_PLAN)
        return kiln_error(KILN_ERR_INVALID, "GGUF metadata %s: set after writing began", key ? key : "(null)");
    if (!key || !*key || strlen(key) > 65535) return kiln_error(KILN_ERR_INVALID, "GGUF metadata key empty or too long");
    for (size_t i = 0; i < w->n_keys; i++)
        if (!strcmp(w->keys[i], key)) return kiln_error(KILN_ERR_INVALID, "GGUF metadata key %s set twice", key);
    if (w->n_keys == w->keys_cap) {
        size_t cap = w->keys_cap ? 2 * w->keys_cap : 32;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return kiln_error(KILN_ERR_OOM, "out of memory");
        w->keys = k, w->keys_cap = cap;
    }
    if (!(w->keys[w->n_keys] = strdup(key))) return kiln_error(KILN_ERR_OOM, "out of memory");
    w->n_keys++;
    *mark = w->kv_len;
    kiln_status st = put_str(w, key, strlen(key));
    return st ? st : put_u32(w, (uint32_t)type);
}

static kiln_status end_kv(kiln_gguf_writer *w, kiln_status st, size_t mark) {
    if (st) {
        w->kv_len = mark;
        free(w->keys[--w->n_keys]);
        return st;
    }
    w->n_kv++;
    return KILN_OK;
}

static kiln_status put_scalars(kiln_gguf_writer *w, kiln_gguf_type type, const void *v, uint64_t n) {
    if (type != KILN_GGUF_BOOL) return put(w, v, (size_t)n * scalar_size(type));
    const bool *b = v;
    kiln_status st = KILN_OK;
    for (uint64_t i = 0; i < n && !st; i++) {
        unsigned char c = b[i] ? 1 : 0;
        st = put(w, &c, 1);
    }
    return st;
}

kiln_status kiln_gguf_set(kiln_gguf_writer *w, const char *key, kiln_gguf_type type, const void *value) {
    if (!scalar_size(type))
        return kiln_error(KILN_ERR_INVALID, "GGUF metadata %s: type %d is not a scalar type", key ? key : "(null)", (int)type);
    if (key && !strcmp(key, "general.alignment")) {
        uint32_t a;
        if (type != KILN_GGUF_UINT32) return kiln_error(KILN_ERR_INVALID, "GGUF general.alignment must be a uint32");
        memcpy(&a, value, 4);
        if (a < 8 || (a & (a - 1)) || a % 8)
            return kiln_error(KILN_ERR_INVALID, "GGUF general.alignment %u must be a power of two and a multiple of 8", a);
        if (w->n_t) return kiln_error(KILN_ERR_INVALID, "GGUF general.alignment must be set before any tensor is declared");
    }
    size_t mark = 0;
    kiln_status st = begin_kv(w, key, type, &mark);
    if (st) return st;
    st = end_kv(w, put_scalars(w, type, value, 1), mark);
    if (!st && !strcmp(key, "general.alignment")) memcpy(&w->alignment, value, 4);
    return st;
}

kiln_status kiln_gguf_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v) { return kiln_gguf_set(w, key, KILN_GGUF_UINT32, &v); }
kiln_status kiln_gguf_set_i32(kiln_gguf_writer *w, const char *key, int32_t v) { return kiln_gguf_set(w, key, KILN_GGUF_INT32, &v); }
kiln_status kiln_gguf_set_f32(kiln_gguf_writer *w, const char *key, float v) { return kiln_gguf_set(w, key, KILN_GGUF_FLOAT32, &v); }
kiln_status kiln_gguf_set_bool(kiln_gguf_writer *w, const char *key, bool v) { return kiln_gguf_set(w, key, KILN_GGUF_BOOL, &v); }

kiln_status kiln_gguf_set_strn(kiln_gguf_writer *w, const char *key, const char *s, size_t len) {
    size_t mark = 0;
    kiln_status st = begin_kv(w, key, KILN_GGUF_STRING, &mark);
    return st ? st : end_kv(w, put_str(w, s, len), mark);
}
kiln_status kiln_gguf_set_str(kiln_gguf_writer *w, const char *key, const char *s) {
    return kiln_gguf_set_strn(w, key, s, strlen(s));
}

kiln_status kiln_gguf_set_array(kiln_gguf_writer *w, const char *key, kiln_gguf_type elem, const void *values, uint64_t n) {
    if (!scalar_size(elem))
        return kiln_error(KILN_ERR_INVALID, "GGUF metadata %s: arrays of type %d are not written (scalars and strings only)",
                          key ? key : "(null)", (int)elem);
    size_t mark = 0;
    kiln_status st = begin_kv(w, key, KILN_GGUF_ARRAY, &mark);
    if (st) return st;
    st = put_u32(w, (uint32_t)elem);
    if (!st) st = put_u64(w, n);
    if (!st && n) st = put_scalars(w, elem, values, n);
    return end_kv(w, st, mark);
}

kiln_status kiln_gguf_set_str_array(kiln_gguf_writer *w, const char *key, const char *const *strs, const size_t *lens,
                                    uint64_t n) {
    size_t mark = 0;
    kiln_status st = begin_kv(w, key, KILN_GGUF_ARRAY, &mark);
    if (st) return st;
    st = put_u32(w, KILN_GGUF_STRING);
    if (!st) st = put_u64(w, n);
    for (uint64_t i = 0; i < n && !st; i++) st = put_str(w, strs[i], lens ? lens[i] : strlen(strs[i]));
    return end_kv(w, st, mark);
}

/* ---- tensors ----------------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

kiln_status kiln_gguf_add_tensor(kiln_gguf_writer *w, const char *name, kiln_ggml_type type, int ndim, const int64_t *shape) {
    if (w->phase != PHASE_PLAN) return kiln_error(KILN_ERR_INVALID, "GGUF tensor %s: declared after writing began", name);
    size_t nl = strlen(name);
    if (!nl || nl > KILN_GGUF_MAX_NAME)
        return kiln_error(KILN_ERR_INVALID, "GGUF tensor name '%s' must have 1 to %d bytes (llama.cpp's limit)", name,
                          KILN_GGUF_MAX_NAME);
    if (!kiln_ggml_type_name(type)) return kiln_error(KILN_ERR_INVALID, "GGUF tensor %s: unknown type %d", name, (int)type);
    if (ndim < 1 || ndim > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_INVALID, "GGUF tensor %s: %d dimensions (1 to %d)", name, ndim, KILN_MAX_DIMS);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return kiln_error(KILN_ERR_INVALID, "GGUF tensor %s declared twice", name);
    tinfo t = {.type = type, .ndim = ndim};
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0 || numel > INT64_MAX / 64 / shape[d])
            return kiln_error(KILN_ERR_INVALID, "GGUF tensor %s: bad size %lld in dimension %d", name, (long long)shape[d], d);
        t.ne[ndim - 1 - d] = shape[d];
        numel *= shape[d];
    }
    if (t.ne[0] % kiln_ggml_block(type))
        return kiln_error(KILN_ERR_SHAPE, "GGUF tensor %s: %s rows must hold a multiple of %d values, not %lld", name,
                          kiln_ggml_type_name(type), kiln_ggml_block(type), (long long)t.ne[0]);
    t.nbytes = kiln_ggml_nbytes(type, numel);
    t.offset = w->n_t ? align_up(w->t[w->n_t - 1].offset + w->t[w->n_t - 1].nbytes, w->alignment) : 0;
    if (w->n_t == w->t_cap) {
        int cap = w->t_cap ? 2 * w->t_cap : 64;
        tinfo *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return kiln_error(KILN_ERR_OOM, "out of memory");
        w->t = nt, w->t_cap = cap;
    }
    if (!(t.name = strdup(name))) return kiln_error(KILN_ERR_OOM, "out of memory");
    w->t[w->n_t++] = t;
    return KILN_OK;
}

int kiln_gguf_n_tensors(const kiln_gguf_writer *w) { return w->n_t; }
uint32_t kiln_gguf_alignment(const kiln_gguf_writer *w) { return w->alignment; }
uint64_t kiln_gguf_tensor_offset(const kiln_gguf_writer *w, int i) { return i >= 0 && i < w->n_t ? w->t[i].offset : 0; }
uint64_t kiln_gguf_tensor_nbytes(const kiln_gguf_writer *w, int i) { return i >= 0 && i < w->n_t ? w->t[i].nbytes : 0; }

/* ---- writing ----------------------------------------------------------- */

static kiln_status fwrite_u32(kiln_atomic_file *f, uint32_t v) { return kiln_atomic_write(f, &v, 4); }
static kiln_status fwrite_u64(kiln_atomic_file *f, uint64_t v) { return kiln_atomic_write(f, &v, 8); }

static kiln_status pad_to(kiln_gguf_writer *w, uint64_t pos) {
    static const unsigned char zeros[256];
    kiln_status st = KILN_OK;
    while (!st && kiln_atomic_tell(w->f) < pos) {
        uint64_t left = pos - kiln_atomic_tell(w->f);
        st = kiln_atomic_write(w->f, zeros, left < sizeof zeros ? (size_t)left : sizeof zeros);
    }
    return st;
}

static kiln_status fail(kiln_gguf_writer *w, kiln_status st) {
    kiln_atomic_abort(w->f);
    w->f = NULL;
    w->phase = PHASE_FAILED;
    return st;
}

/* Moves past tensors whose data is complete, padding after each. */
static kiln_status advance(kiln_gguf_writer *w) {
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].nbytes) {
        kiln_status st = pad_to(w, w->data_start + align_up(w->t[w->cur].offset + w->t[w->cur].nbytes, w->alignment));
        if (st) return st;
        w->cur++;
        w->cur_done = 0;
    }
    return KILN_OK;
}

kiln_status kiln_gguf_begin(kiln_gguf_writer *w, const char *path) {
    if (w->phase != PHASE_PLAN) return kiln_error(KILN_ERR_INVALID, "GGUF %s: writing began twice", path);
    kiln_status st = kiln_atomic_open(path, &w->f);
    if (st) return fail(w, st);
    w->path = path;
    w->phase = PHASE_DATA;
    st = kiln_atomic_write(w->f, "GGUF", 4);
    if (!st) st = fwrite_u32(w->f, KILN_GGUF_VERSION);
    if (!st) st = fwrite_u64(w->f, (uint64_t)w->n_t);
    if (!st) st = fwrite_u64(w->f, w->n_kv);
    if (!st && w->kv_len) st = kiln_atomic_write(w->f, w->kv, w->kv_len);
    for (int i = 0; i < w->n_t && !st; i++) {
        const tinfo *t = &w->t[i];
        st = fwrite_u64(w->f, strlen(t->name));
        if (!st) st = kiln_atomic_write(w->f, t->name, strlen(t->name));
        if (!st) st = fwrite_u32(w->f, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim && !st; d++) st = fwrite_u64(w->f, (uint64_t)t->ne[d]);
        if (!st) st = fwrite_u32(w->f, (uint32_t)t->type);
        if (!st) st = fwrite_u64(w->f, t->offset);
    }
    w->data_start = align_up(kiln_atomic_tell(w->f), w->alignment);
    if (!st) st = pad_to(w, w->data_start);
    if (!st) st = advance(w); /* tensors of zero bytes cannot exist, but keep the invariant */
    return st ? fail(w, st) : KILN_OK;
}

kiln_status kiln_gguf_write_data(kiln_gguf_writer *w, const void *data, size_t n) {
    if (w->phase != PHASE_DATA) return kiln_error(KILN_ERR_INVALID, "GGUF: tensor data written outside begin..finish");
    const unsigned char *p = data;
    while (n > 0) {
        if (w->cur >= w->n_t)
            return fail(w, kiln_error(KILN_ERR_INVALID, "GGUF %s: %zu bytes of tensor data beyond the last tensor", w->path, n));
        uint64_t room = w->t[w->cur].nbytes - w->cur_done;
        size_t take = room < n ? (size_t)room : n;
        kiln_status st = kiln_atomic_write(w->f, p, take);
        if (st) return fail(w, st);
        w->cur_done += take, p += take, n -= take;
        if ((st = advance(w))) return fail(w, st);
    }
    return KILN_OK;
}

kiln_status kiln_gguf_finish(kiln_gguf_writer *w) {
    if (w->phase != PHASE_DATA) return kiln_error(KILN_ERR_INVALID, "GGUF: finish without a successful begin");
    if (w->cur < w->n_t)
        return fail(w, kiln_error(KILN_ERR_INVALID, "GGUF %s: tensor %s got %llu of its %llu bytes", w->path,
                                  w->t[w->cur].name, (unsigned long long)w->cur_done,
                                  (unsigned long long)w->t[w->cur].nbytes));
    kiln_status st = kiln_atomic_commit(w->f);
    w->f = NULL;
    w->phase = st ? PHASE_FAILED : PHASE_DONE;
    return st;
}
