/* safetensors reader (mmap + jansson) and streaming atomic writer.
 * See include/kiln/safetensors.h for the format and the guarantees. */
#include "kiln/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

struct kiln_st_file {
    char *path;
    void *map;
    size_t map_len;
    int n;
    kiln_st_tensor *tensors;   /* file order */
    char **names;              /* owned names, parallel to tensors */
    void **copies;             /* aligned copies of misaligned tensors, or NULL */
    const kiln_st_tensor **by_name;
    int n_meta;
    char **meta_keys, **meta_vals; /* sorted by key */
};

/* ---- dtypes ------------------------------------------------------------ */

/* Every dtype the safetensors format defines, so a valid but unsupported one
 * is told apart from garbage. `kiln` is -1 where kiln has no such type;
 * `rank` is the position in the Rust library's Dtype enum, which its writer
 * sorts by (descending). */
static const struct {
    const char *name;
    int kiln;
    int rank;
} st_dtypes[] = {
    {"BOOL", -1, 0},  {"F4", -1, 1},       {"F6_E2M3", -1, 2}, {"F6_E3M2", -1, 3},
    {"U8", -1, 4},    {"I8", -1, 5},       {"F8_E5M2", -1, 6}, {"F8_E4M3", -1, 7},
    {"F8_E8M0", -1, 8}, {"I16", -1, 9},    {"U16", -1, 10},    {"F16", KILN_F16, 11},
    {"BF16", KILN_BF16, 12}, {"I32", KILN_I32, 13}, {"U32", -1, 14},
    {"F32", KILN_F32, 15}, {"F64", -1, 16}, {"I64", -1, 17},  {"U64", -1, 18},
    {"C64", -1, 19},
};
#define N_ST_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static int st_dtype_index(kiln_dtype dt) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].kiln == (int)dt) return i;
    return -1;
}

/* 0 for the block types, which safetensors has no name for */
static size_t st_elem_size(kiln_dtype dt) { return kiln_dtype_size(dt); }

/* Bytes of a shape (elem x every dim), or -1 when a dim is negative or any
 * partial product passes INT64_MAX: callers (and kiln_tensor_numel) work in
 * int64_t, so no product of a file's dims may wrap there either. */
static int shape_nbytes(int ndim, const int64_t *shape, size_t elem, size_t *out) {
    uint64_t n = elem;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[d], &n) || n > (uint64_t)INT64_MAX) return -1;
    }
    if (n > SIZE_MAX) return -1;
    *out = (size_t)n;
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

static int cmp_by_offset(const void *a, const void *b) {
    const kiln_st_tensor *x = a, *y = b;
    if (x->bytes != y->bytes) return (const char *)x->bytes < (const char *)y->bytes ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_tensor_ptr_name(const void *a, const void *b) {
    const kiln_st_tensor *x = *(const kiln_st_tensor *const *)a;
    const kiln_st_tensor *y = *(const kiln_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static kiln_status parse_dtype(const char *path, const char *name, json_t *v, kiln_dtype *out) {
    if (!v) return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' has no dtype", path, name);
    if (!json_is_string(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': dtype is not a string", path, name);
    const char *s = json_string_value(v);
    for (int i = 0; i < N_ST_DTYPES; i++) {
        if (strcmp(s, st_dtypes[i].name) != 0) continue;
        if (st_dtypes[i].kiln < 0)
            return kiln_error(KILN_ERR_UNSUPPORTED, "unsupported dtype %s for tensor '%s' in %s",
                              s, name, path);
        *out = (kiln_dtype)st_dtypes[i].kiln;
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': invalid dtype \"%.40s\"", path, name, s);
}

static kiln_status parse_shape(const char *path, const char *name, json_t *v, kiln_st_tensor *t) {
    if (!json_is_array(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': shape missing or not an array",
                          path, name);
    size_t nd = json_array_size(v);
    if (nd > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dims (kiln supports at most %d)",
                          path, name, nd, KILN_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *e = json_array_get(v, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                              path, name, d);
        t->shape[d] = (int64_t)json_integer_value(e);
    }
    for (size_t d = nd; d < KILN_MAX_DIMS; d++) t->shape[d] = 1;
    return KILN_OK;
}

static kiln_status parse_offsets(const char *path, const char *name, json_t *v, uint64_t data_len,
                                 uint64_t *begin, uint64_t *end) {
    if (!json_is_array(v) || json_array_size(v) != 2)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': data_offsets missing or not [begin, end]",
                          path, name);
    json_t *b = json_array_get(v, 0), *e = json_array_get(v, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': data_offsets are not non-negative integers",
                          path, name);
    *begin = (uint64_t)json_integer_value(b);
    *end = (uint64_t)json_integer_value(e);
    if (*begin > *end || *end > data_len)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data buffer is %llu bytes)",
                          path, name, (unsigned long long)*begin, (unsigned long long)*end,
                          (unsigned long long)data_len);
    return KILN_OK;
}

/* Fills t from one header entry; t->data is set to the offset-as-pointer
 * relative to `base`. */
static kiln_status parse_tensor(kiln_st_file *f, const char *name, json_t *v, const char *base,
                                uint64_t data_len, kiln_st_tensor *t) {
    const char *path = f->path;
    if (!json_is_object(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, name);
    kiln_status st = parse_dtype(path, name, json_object_get(v, "dtype"), &t->dtype);
    if (!st) st = parse_shape(path, name, json_object_get(v, "shape"), t);
    uint64_t begin = 0, end = 0;
    if (!st) st = parse_offsets(path, name, json_object_get(v, "data_offsets"), data_len, &begin, &end);
    if (st) return st;
    size_t want;
    if (shape_nbytes(t->ndim, t->shape, st_elem_size(t->dtype), &want) != 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s': shape is too large", path, name);
    if (want != end - begin)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype %s need %zu",
                          path, name, (unsigned long long)(end - begin),
                          st_dtypes[st_dtype_index(t->dtype)].name, want);
    t->bytes = base + begin;
    t->nbytes = want;
    return KILN_OK;
}

/* The buffer must be covered exactly: no overlaps, no holes (as the format
 * demands, so files cannot hide other content). `t` is sorted by offset. */
static kiln_status check_layout(const kiln_st_file *f, const char *base, uint64_t data_len) {
    uint64_t pos = 0;
    for (int i = 0; i < f->n; i++) {
        const kiln_st_tensor *t = &f->tensors[i];
        uint64_t b = (uint64_t)((const char *)t->bytes - base);
        if (b < pos)
            return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' at bytes [%llu, %llu) overlaps tensor '%s'",
                              f->path, t->name, (unsigned long long)b,
                              (unsigned long long)(b + t->nbytes), f->tensors[i - 1].name);
        if (b > pos)
            return kiln_error(KILN_ERR_FORMAT, "%s: %llu unindexed bytes before tensor '%s'",
                              f->path, (unsigned long long)(b - pos), t->name);
        pos = b + t->nbytes;
    }
    if (pos != data_len)
        return kiln_error(KILN_ERR_FORMAT, "%s: %llu bytes at the end of the data buffer belong to no tensor",
                          f->path, (unsigned long long)(data_len - pos));
    return KILN_OK;
}

typedef struct {
    char *key, *val;
} meta_pair;

static int cmp_meta_pair(const void *a, const void *b) {
    return strcmp(((const meta_pair *)a)->key, ((const meta_pair *)b)->key);
}

static kiln_status parse_metadata(kiln_st_file *f, json_t *m) {
    if (!json_is_object(m))
        return kiln_error(KILN_ERR_FORMAT, "%s: __metadata__ is not an object", f->path);
    size_t n = json_object_size(m);
    f->meta_keys = calloc(n + 1, sizeof(char *));
    f->meta_vals = calloc(n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_vals) return kiln_error(KILN_ERR_OOM, "%s: out of memory", f->path);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return kiln_error(KILN_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string",
                              f->path, k);
        int i = f->n_meta;
        f->meta_keys[i] = strdup(k);
        f->meta_vals[i] = strdup(json_string_value(v));
        if (!f->meta_keys[i] || !f->meta_vals[i]) {
            free(f->meta_keys[i]);
            free(f->meta_vals[i]);
            return kiln_error(KILN_ERR_OOM, "%s: out of memory", f->path);
        }
        f->n_meta++;
    }
    /* sort keys, carrying values along: one O(n log n) sort of index pairs
     * (an insertion sort here made a 200,000-key header take minutes) */
    if (f->n_meta > 1) {
        meta_pair *pairs = malloc((size_t)f->n_meta * sizeof *pairs);
        if (!pairs) return kiln_error(KILN_ERR_OOM, "%s: out of memory", f->path);
        for (int i = 0; i < f->n_meta; i++) pairs[i] = (meta_pair){f->meta_keys[i], f->meta_vals[i]};
        qsort(pairs, (size_t)f->n_meta, sizeof *pairs, cmp_meta_pair);
        for (int i = 0; i < f->n_meta; i++) f->meta_keys[i] = pairs[i].key, f->meta_vals[i] = pairs[i].val;
        free(pairs);
    }
    return KILN_OK;
}

static kiln_status parse_header(kiln_st_file *f, json_t *root, const char *base, uint64_t data_len) {
    if (!json_is_object(root))
        return kiln_error(KILN_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    size_t n = json_object_size(root);
    f->tensors = calloc(n + 1, sizeof *f->tensors);
    f->names = calloc(n + 1, sizeof *f->names);
    f->copies = calloc(n + 1, sizeof *f->copies);
    f->by_name = calloc(n + 1, sizeof *f->by_name);
    if (!f->tensors || !f->names || !f->copies || !f->by_name)
        return kiln_error(KILN_ERR_OOM, "%s: out of memory for %zu tensors", f->path, n);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        kiln_status st;
        if (strcmp(key, "__metadata__") == 0) {
            st = parse_metadata(f, v);
        } else {
            kiln_st_tensor *t = &f->tensors[f->n];
            if (!(f->names[f->n] = strdup(key))) return kiln_error(KILN_ERR_OOM, "out of memory");
            t->name = f->names[f->n];
            f->n++;
            st = parse_tensor(f, key, v, base, data_len, t);
        }
        if (st) return st;
    }
    /* names travel with their tensor through the sort (t->name), so the
     * owned-name array is rebuilt from it afterwards */
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_by_offset);
    for (int i = 0; i < f->n; i++) f->names[i] = (char *)(uintptr_t)f->tensors[i].name;
    return check_layout(f, base, data_len);
}

/* Tensors whose offset is not a multiple of their element size get an
 * aligned copy, so callers may always cast `data`. */
static kiln_status align_tensors(kiln_st_file *f) {
    for (int i = 0; i < f->n; i++) {
        kiln_st_tensor *t = &f->tensors[i];
        size_t es = st_elem_size(t->dtype);
        if (t->nbytes == 0 || (uintptr_t)t->bytes % es == 0) continue;
        void *p = malloc(t->nbytes);
        if (!p) return kiln_error(KILN_ERR_OOM, "%s: out of memory copying tensor '%s'", f->path, t->name);
        memcpy(p, t->bytes, t->nbytes);
        f->copies[i] = p;
        t->bytes = p;
    }
    return KILN_OK;
}

static kiln_status map_file(kiln_st_file *f) {
    const void *m;
    kiln_status st = kiln_map_file(f->path, 8, "a safetensors header", &m, &f->map_len);
    if (!st) f->map = (void *)m;
    return st;
}

static kiln_status st_open(kiln_st_file *f) {
    kiln_status st = map_file(f);
    if (st) return st;
    const unsigned char *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    uint64_t size = f->map_len;
    if (hlen > ST_MAX_HEADER)
        return kiln_error(KILN_ERR_FORMAT, "%s: header length %llu is absurd (limit %llu bytes)",
                          f->path, (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    if (hlen > size - 8)
        return kiln_error(KILN_ERR_FORMAT, "%s: header length %llu exceeds the file size %llu (truncated?)",
                          f->path, (unsigned long long)hlen, (unsigned long long)size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON header: %s (byte %d of %llu)", f->path,
                          jerr.text, jerr.position, (unsigned long long)hlen);
    st = parse_header(f, root, (const char *)p + 8 + hlen, size - 8 - hlen);
    json_decref(root);
    if (!st) st = align_tensors(f);
    if (st) return st;
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_tensor_ptr_name);
    return KILN_OK;
}

kiln_status kiln_st_open(const char *path, kiln_st_file **out) {
    if (!out) return kiln_error(KILN_ERR_INVALID, "kiln_st_open: out is NULL");
    *out = NULL;
    if (!path) return kiln_error(KILN_ERR_INVALID, "kiln_st_open: path is NULL");
    kiln_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return kiln_error(KILN_ERR_OOM, "out of memory opening %s", path);
    }
    kiln_status st = st_open(f);
    if (st) {
        kiln_st_close(f);
        return st;
    }
    *out = f;
    return KILN_OK;
}

void kiln_st_close(kiln_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->names ? f->names[i] : NULL);
        free(f->copies ? f->copies[i] : NULL);
    }
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->tensors);
    free(f->names);
    free(f->copies);
    free(f->by_name);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

int kiln_st_count(const kiln_st_file *f) { return f ? f->n : 0; }

const kiln_st_tensor *kiln_st_at(const kiln_st_file *f, int i) {
    return (f && i >= 0 && i < f->n) ? &f->tensors[i] : NULL;
}

const kiln_st_tensor *kiln_st_find(const kiln_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}


const char *kiln_st_metadata(const kiln_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    int lo = 0, hi = f->n_meta - 1; /* keys are sorted */
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(key, f->meta_keys[mid]);
        if (c == 0) return f->meta_vals[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

int kiln_st_metadata_count(const kiln_st_file *f) { return f ? f->n_meta : 0; }

const char *kiln_st_metadata_at(const kiln_st_file *f, int i, const char **value) {
    if (!f || i < 0 || i >= f->n_meta) return NULL;
    if (value) *value = f->meta_vals[i];
    return f->meta_keys[i];
}

/* ---- streaming atomic writer ------------------------------------------- */

typedef struct {
    const char *path;
    char *tmp;
    int fd;
} st_writer;

static kiln_status aw_open(st_writer *w, const char *path) {
    w->path = path;
    w->fd = -1;
    size_t len = strlen(path) + 64;
    if (!(w->tmp = malloc(len))) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    /* O_EXCL on a name unique to this process, thread and moment; retried on
     * the rare collision, so no shared counter is needed. */
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(w->tmp, len, "%s.tmp.%ld.%ld.%ld%d", path, (long)getpid(), (long)gettid(),
                 (long)ts.tv_nsec, attempt);
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0) return KILN_OK;
        if (errno != EEXIST) break;
    }
    kiln_status st = kiln_error(KILN_ERR_IO, "cannot save %s: creating %s: %s", path, w->tmp,
                                strerror(errno));
    free(w->tmp);
    w->tmp = NULL;
    return st;
}

static kiln_status aw_write(st_writer *w, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t k = write(w->fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return kiln_error(KILN_ERR_IO, "cannot save %s: writing %s: %s", w->path, w->tmp,
                              k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
    }
    return KILN_OK;
}

static void aw_abort(st_writer *w) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp) unlink(w->tmp);
    free(w->tmp);
    w->tmp = NULL;
}

static kiln_status fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    kiln_status st = KILN_OK;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        st = kiln_error(KILN_ERR_IO, "saved %s but cannot sync directory %s: %s", path, dir,
                        strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return st;
}

static kiln_status aw_commit(st_writer *w) {
    if (fsync(w->fd) != 0) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot save %s: fsync: %s", w->path, strerror(errno));
        aw_abort(w);
        return st;
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0 || rename(w->tmp, w->path) != 0) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot save %s: %s: %s", w->path,
                                    rc != 0 ? "close" : "rename", strerror(errno));
        aw_abort(w);
        return st;
    }
    free(w->tmp);
    w->tmp = NULL;
    return fsync_parent_dir(w->path);
}

/* ---- writing ----------------------------------------------------------- */

typedef struct {
    const kiln_st_tensor *t;
    int rank;
} st_item;

static int cmp_item_layout(const void *a, const void *b) {
    const st_item *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

static int cmp_item_name(const void *a, const void *b) {
    return strcmp(((const st_item *)a)->t->name, ((const st_item *)b)->t->name);
}

static kiln_status check_save_tensor(const char *path, const kiln_st_tensor *t, int i) {
    if (!t->name || !t->name[0])
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor %d has no name", path, i);
    if (strcmp(t->name, "__metadata__") == 0)
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: '__metadata__' is reserved", path);
    if (st_dtype_index(t->dtype) < 0)
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor '%s' has invalid dtype %d", path,
                          t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor '%s' has %d dims", path, t->name,
                          t->ndim);
    size_t want;
    if (shape_nbytes(t->ndim, t->shape, st_elem_size(t->dtype), &want) != 0)
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor '%s' has a negative or huge shape",
                          path, t->name);
    if (want != t->nbytes)
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor '%s' has %zu bytes, its shape needs %zu",
                          path, t->name, t->nbytes, want);
    if (want > 0 && !t->bytes)
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor '%s' has no data", path, t->name);
    return KILN_OK;
}

/* Sorted, validated tensor order (caller frees *items). */
static kiln_status plan_tensors(const char *path, const kiln_st_tensor *ts, int n, st_item **items) {
    st_item *it = calloc((size_t)n + 1, sizeof *it);
    if (!it) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    for (int i = 0; i < n; i++) {
        kiln_status st = check_save_tensor(path, &ts[i], i);
        if (st) {
            free(it);
            return st;
        }
        it[i].t = &ts[i];
        it[i].rank = st_dtypes[st_dtype_index(ts[i].dtype)].rank;
    }
    qsort(it, (size_t)n, sizeof *it, cmp_item_name);
    for (int i = 1; i < n; i++)
        if (strcmp(it[i - 1].t->name, it[i].t->name) == 0) {
            kiln_status st = kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor name '%s' appears twice",
                                        path, it[i].t->name);
            free(it);
            return st;
        }
    qsort(it, (size_t)n, sizeof *it, cmp_item_layout);
    *items = it;
    return KILN_OK;
}

static kiln_status build_metadata(const char *path, const char *const *kv, json_t **out) {
    *out = NULL;
    if (!kv || !kv[0]) return KILN_OK;
    int n = 0;
    while (kv[2 * n]) {
        if (!kv[2 * n + 1])
            return kiln_error(KILN_ERR_INVALID, "cannot save %s: metadata key '%s' has no value", path,
                              kv[2 * n]);
        n++;
    }
    const char **keys = calloc((size_t)n, sizeof *keys);
    if (!keys) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    for (int i = 0; i < n; i++) keys[i] = kv[2 * i];
    qsort(keys, (size_t)n, sizeof *keys, cmp_str_ptr);
    json_t *m = json_object();
    kiln_status st = m ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    for (int i = 0; i < n && !st; i++) {
        if (i > 0 && strcmp(keys[i - 1], keys[i]) == 0) {
            st = kiln_error(KILN_ERR_INVALID, "cannot save %s: metadata key '%s' appears twice", path, keys[i]);
            break;
        }
        const char *val = NULL;
        for (int j = 0; j < n; j++)
            if (kv[2 * j] == keys[i]) val = kv[2 * j + 1];
        if (json_object_set_new(m, keys[i], json_string(val)) != 0)
            st = kiln_error(KILN_ERR_INVALID, "cannot save %s: metadata '%s' is not valid UTF-8", path, keys[i]);
    }
    free(keys);
    if (st) json_decref(m);
    else *out = m;
    return st;
}

static json_t *tensor_json(const kiln_st_tensor *t, uint64_t begin) {
    json_t *o = json_object(), *shape = json_array(), *offs = json_array();
    int bad = !o || !shape || !offs;
    for (int d = 0; d < t->ndim && !bad; d++)
        bad = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0;
    if (!bad)
        bad = json_array_append_new(offs, json_integer((json_int_t)begin)) != 0 ||
              json_array_append_new(offs, json_integer((json_int_t)(begin + t->nbytes))) != 0 ||
              json_object_set_new(o, "dtype", json_string(st_dtypes[st_dtype_index(t->dtype)].name)) ||
              json_object_set(o, "shape", shape) != 0 || json_object_set(o, "data_offsets", offs) != 0;
    json_decref(shape);
    json_decref(offs);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The header text, unpadded (caller frees). */
static kiln_status build_header(const char *path, const st_item *it, int n, const char *const *kv,
                                char **out) {
    json_t *meta, *root = NULL;
    kiln_status st = build_metadata(path, kv, &meta);
    if (st) return st;
    if (!(root = json_object())) {
        json_decref(meta);
        return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    }
    if (meta) json_object_set_new(root, "__metadata__", meta); /* first, as the Rust writer does */
    uint64_t pos = 0;
    for (int i = 0; i < n && !st; i++) {
        uint64_t end;
        if (__builtin_add_overflow(pos, (uint64_t)it[i].t->nbytes, &end) || end > (uint64_t)INT64_MAX) {
            st = kiln_error(KILN_ERR_INVALID, "cannot save %s: tensors total more than 2^63 bytes (at '%s')", path,
                            it[i].t->name);
            break;
        }
        json_t *o = tensor_json(it[i].t, pos);
        if (!o || json_object_set_new(root, it[i].t->name, o) != 0)
            st = kiln_error(KILN_ERR_INVALID, "cannot save %s: tensor '%s' (name not valid UTF-8?)", path,
                            it[i].t->name);
        pos += it[i].t->nbytes;
    }
    if (!st && !(*out = json_dumps(root, JSON_COMPACT)))
        st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    json_decref(root);
    return st;
}

static kiln_status write_all(st_writer *w, const char *header, const st_item *it, int n) {
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    kiln_status st = aw_write(w, len8, 8);
    if (!st) st = aw_write(w, header, hl);
    if (!st) st = aw_write(w, spaces, padded - hl);
    for (int i = 0; i < n && !st; i++)
        if (it[i].t->nbytes) st = aw_write(w, it[i].t->bytes, it[i].t->nbytes);
    return st;
}

kiln_status kiln_st_save(const char *path, const kiln_st_tensor *tensors, int n,
                         const char *const *meta_kv) {
    if (!path || !path[0]) return kiln_error(KILN_ERR_INVALID, "kiln_st_save: no path");
    if (n < 0 || (n > 0 && !tensors))
        return kiln_error(KILN_ERR_INVALID, "cannot save %s: bad tensor list (n=%d)", path, n);
    st_item *items = NULL;
    char *header = NULL;
    kiln_status st = plan_tensors(path, tensors, n, &items);
    if (!st) st = build_header(path, items, n, meta_kv, &header);
    st_writer w = {0};
    if (!st) st = aw_open(&w, path);
    if (!st) {
        st = write_all(&w, header, items, n);
        if (st) aw_abort(&w);
        else st = aw_commit(&w);
    }
    free(header);
    free(items);
    return st;
}
