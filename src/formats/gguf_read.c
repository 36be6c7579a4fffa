/* GGUF reader: the file mapped read-only, every count, size, string and
 * offset checked against the bytes that are there (with overflow checks)
 * before anything is handed out. Layout: kiln/gguf.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/gguf.h"

struct kiln_gguf_file {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version, alignment;
    uint64_t data_offset;
    int64_t n_kv, n_t;
    kiln_gguf_kv *kv;
    kiln_gguf_tensor *t;
    const char **strs; /* all string pointers of the kvs, one block */
    uint64_t *lens;
    char *names;       /* NUL-terminated copies of keys and tensor names */
    uint64_t *klen;    /* while parsing: each key's length */
};

typedef struct {
    const kiln_gguf_file *f;
    size_t pos;
} rd;

static size_t left(const rd *r) { return r->f->size - r->pos; }

static kiln_status need(rd *r, uint64_t n, const char *what) {
    if (n > left(r))
        return kiln_error(KILN_ERR_FORMAT, "%s: %s needs %llu bytes at offset %zu, the file has %zu left", r->f->path,
                          what, (unsigned long long)n, r->pos, left(r));
    return KILN_OK;
}
static uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t u64_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static kiln_status rd_u32(rd *r, uint32_t *v, const char *what) {
    kiln_status st = need(r, 4, what);
    if (st) return st;
    *v = u32_at(r->f->map + r->pos), r->pos += 4;
    return KILN_OK;
}
static kiln_status rd_u64(rd *r, uint64_t *v, const char *what) {
    kiln_status st = need(r, 8, what);
    if (st) return st;
    *v = u64_at(r->f->map + r->pos), r->pos += 8;
    return KILN_OK;
}
static kiln_status rd_str(rd *r, const char **s, uint64_t *len, const char *what) {
    kiln_status st = rd_u64(r, len, what);
    if (st) return st;
    if (*len > left(r))
        return kiln_error(KILN_ERR_FORMAT, "%s: %s: a string of %llu bytes at offset %zu runs past the end (%zu left)",
                          r->f->path, what, (unsigned long long)*len, r->pos - 8, left(r));
    *s = (const char *)r->f->map + r->pos, r->pos += (size_t)*len;
    return KILN_OK;
}

static int scalar_size(kiln_gguf_type t) {
    switch (t) {
    case KILN_GGUF_UINT8:
    case KILN_GGUF_INT8:
    case KILN_GGUF_BOOL: return 1;
    case KILN_GGUF_UINT16:
    case KILN_GGUF_INT16: return 2;
    case KILN_GGUF_UINT32:
    case KILN_GGUF_INT32:
    case KILN_GGUF_FLOAT32: return 4;
    case KILN_GGUF_UINT64:
    case KILN_GGUF_INT64:
    case KILN_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *kiln_gguf_type_str(kiln_gguf_type t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* ggml's names of the tensor types kiln does not read, for the error. */
static const char *ggml_name(uint32_t id) {
    static const char *names[] = {"f32", "f16", "q4_0", "q4_1", "q4_2", "q4_3", "q5_0", "q5_1", "q8_0", "q8_1",
                                  "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs",
                                  "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64",
                                  "iq1_m", "bf16", "q4_0_4_4", "q4_0_4_8", "q4_0_8_8", "tq1_0", "tq2_0",
                                  "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4"};
    return id < sizeof names / sizeof names[0] ? names[id] : NULL;
}

/* ---- a hash set of names, to refuse duplicates in O(n) ---------------- */
static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}
/* Returns the index already holding name, or -1 after inserting idx. */
static int64_t set_insert(int64_t *slots, uint64_t cap, const char *const *names, const char *name, int64_t idx) {
    for (uint64_t h = hash_name(name) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (slots[h] < 0) {
            slots[h] = idx;
            return -1;
        }
        if (!strcmp(names[slots[h]], name)) return slots[h];
    }
}
static uint64_t set_cap(int64_t n) {
    uint64_t c = 16;
    while (c < (uint64_t)n * 2) c <<= 1;
    return c;
}

/* ---- parsing ------------------------------------------------------------ */

static kiln_status map_file(kiln_gguf_file *f) {
    const void *m;
    kiln_status st = kiln_map_file(f->path, 24, "a GGUF header", &m, &f->size);
    if (!st) f->map = m;
    return st;
}

/* The key/value pairs: a first pass records where each is and counts the
 * strings; names and string tables are allocated once. */
static kiln_status parse_kvs(kiln_gguf_file *f, rd *r, size_t *name_bytes) {
    const char *path = f->path;
    uint64_t n_strs = 0;
    size_t start = r->pos;
    kiln_status st;
    char what[160];
    /* pass 1: validate and count */
    for (int64_t i = 0; i < f->n_kv; i++) {
        const char *k = NULL;
        uint64_t klen = 0;
        snprintf(what, sizeof what, "key %lld", (long long)i);
        if ((st = rd_str(r, &k, &klen, what))) return st;
        if (klen == 0) return kiln_error(KILN_ERR_FORMAT, "%s: key %lld is empty", path, (long long)i);
        if (memchr(k, 0, (size_t)klen))
            return kiln_error(KILN_ERR_FORMAT, "%s: key %lld holds a NUL byte", path, (long long)i);
        *name_bytes += (size_t)klen + 1;
        snprintf(what, sizeof what, "key %.*s", klen > 100 ? 100 : (int)klen, k);
        uint32_t type;
        if ((st = rd_u32(r, &type, what))) return st;
        if (type == KILN_GGUF_STRING) {
            const char *s;
            uint64_t len;
            if ((st = rd_str(r, &s, &len, what))) return st;
            n_strs++;
        } else if (type == KILN_GGUF_ARRAY) {
            uint32_t et;
            uint64_t n;
            if ((st = rd_u32(r, &et, what)) || (st = rd_u64(r, &n, what))) return st;
            if (et == KILN_GGUF_ARRAY) return kiln_error(KILN_ERR_FORMAT, "%s: %s is an array of arrays", path, what);
            if (et == KILN_GGUF_STRING) {
                if (n > left(r) / 8)
                    return kiln_error(KILN_ERR_FORMAT, "%s: %s: %llu strings cannot fit in the %zu bytes left", path,
                                      what, (unsigned long long)n, left(r));
                for (uint64_t j = 0; j < n; j++) {
                    const char *s;
                    uint64_t len;
                    if ((st = rd_str(r, &s, &len, what))) return st;
                }
                n_strs += n;
            } else {
                int es = scalar_size((kiln_gguf_type)et);
                if (!es) return kiln_error(KILN_ERR_FORMAT, "%s: %s: unknown array element type %u", path, what, et);
                if (n > left(r) / (uint64_t)es)
                    return kiln_error(KILN_ERR_FORMAT, "%s: %s: %llu values of %s run past the end (%zu bytes left)",
                                      path, what, (unsigned long long)n, kiln_gguf_type_str((kiln_gguf_type)et),
                                      left(r));
                r->pos += (size_t)(n * (uint64_t)es);
            }
        } else {
            int es = scalar_size((kiln_gguf_type)type);
            if (!es) return kiln_error(KILN_ERR_FORMAT, "%s: %s: unknown value type %u", path, what, type);
            if ((st = need(r, (uint64_t)es, what))) return st;
            r->pos += (size_t)es;
        }
    }
    f->kv = calloc((size_t)f->n_kv + 1, sizeof *f->kv);
    f->strs = malloc((size_t)(n_strs + 1) * sizeof *f->strs);
    f->lens = malloc((size_t)(n_strs + 1) * sizeof *f->lens);
    f->klen = malloc(((size_t)f->n_kv + 1) * sizeof *f->klen);
    if (!f->kv || !f->strs || !f->lens || !f->klen) return kiln_error(KILN_ERR_OOM, "%s: out of memory for %lld keys", path, (long long)f->n_kv);
    /* pass 2: record (everything is known to be in bounds) */
    r->pos = start;
    uint64_t si = 0;
    const uint8_t *m = f->map;
    for (int64_t i = 0; i < f->n_kv; i++) {
        kiln_gguf_kv *kv = &f->kv[i];
        uint64_t klen = u64_at(m + r->pos);
        kv->key = (const char *)m + r->pos + 8; /* replaced by a NUL-terminated copy later */
        r->pos += 8 + (size_t)klen;
        f->klen[i] = klen;
        kv->type = (kiln_gguf_type)u32_at(m + r->pos), r->pos += 4;
        kv->elem_type = kv->type, kv->n = 1;
        if (kv->type == KILN_GGUF_ARRAY) {
            kv->elem_type = (kiln_gguf_type)u32_at(m + r->pos), kv->n = u64_at(m + r->pos + 4), r->pos += 12;
        }
        if (kv->elem_type == KILN_GGUF_STRING) {
            kv->strs = &f->strs[si];
            uint64_t *lens = &f->lens[si];
            for (uint64_t j = 0; j < kv->n; j++, si++) {
                f->lens[si] = u64_at(m + r->pos);
                f->strs[si] = (const char *)m + r->pos + 8;
                r->pos += 8 + (size_t)f->lens[si];
            }
            kv->data = lens; /* moved to lens below */
        } else {
            kv->data = m + r->pos;
            r->pos += (size_t)(kv->n * (uint64_t)scalar_size(kv->elem_type));
        }
    }
    return KILN_OK;
}

static kiln_status parse(kiln_gguf_file *f) {
    const char *path = f->path;
    rd r = {f, 0};
    kiln_status st;
    if (memcmp(f->map, "GGUF", 4))
        return kiln_error(KILN_ERR_FORMAT, "%s: not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")", path,
                          f->map[0], f->map[1], f->map[2], f->map[3]);
    r.pos = 4;
    (void)rd_u32(&r, &f->version, "version");
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: a big-endian GGUF file (version bytes %08x)", path, f->version);
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: GGUF version %u (kiln reads versions 2 and 3)", path, f->version);
    }
    uint64_t n_t = 0, n_kv = 0;
    (void)rd_u64(&r, &n_t, "tensor count");
    (void)rd_u64(&r, &n_kv, "key count");
    /* a pair is at least 13 bytes (key length, type, one byte), a tensor
     * info at least 32 (name length, dims, one dim, type, offset) */
    if (n_kv > left(&r) / 13)
        return kiln_error(KILN_ERR_FORMAT, "%s: %llu keys cannot fit in the file's %zu bytes", path,
                          (unsigned long long)n_kv, f->size);
    if (n_t > left(&r) / 32)
        return kiln_error(KILN_ERR_FORMAT, "%s: %llu tensors cannot fit in the file's %zu bytes", path,
                          (unsigned long long)n_t, f->size);
    f->n_kv = (int64_t)n_kv, f->n_t = (int64_t)n_t;
    size_t name_bytes = 0;
    if ((st = parse_kvs(f, &r, &name_bytes))) return st;

    /* tensor infos */
    f->t = calloc((size_t)f->n_t + 1, sizeof *f->t);
    if (!f->t) return kiln_error(KILN_ERR_OOM, "%s: out of memory for %lld tensors", path, (long long)f->n_t);
    uint64_t *tname_len = calloc((size_t)f->n_t + 1, sizeof *tname_len);
    if (!tname_len) return kiln_error(KILN_ERR_OOM, "out of memory");
    char what[160];
    for (int64_t i = 0; i < f->n_t; i++) {
        kiln_gguf_tensor *t = &f->t[i];
        const char *nm;
        uint64_t len;
        snprintf(what, sizeof what, "tensor %lld's name", (long long)i);
        if ((st = rd_str(&r, &nm, &len, what))) goto fail;
        if (len == 0 || len > KILN_GGUF_MAX_NAME || memchr(nm, 0, (size_t)len)) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: tensor %lld: a name of %llu bytes (1 to %d, no NUL)", path,
                            (long long)i, (unsigned long long)len, KILN_GGUF_MAX_NAME);
            goto fail;
        }
        t->name = nm, tname_len[i] = len;
        name_bytes += (size_t)len + 1;
        snprintf(what, sizeof what, "tensor %.*s", (int)len, nm);
        uint32_t nd, type;
        if ((st = rd_u32(&r, &nd, what))) goto fail;
        if (nd < 1 || nd > 4) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s has %u dimensions (1 to 4)", path, what, nd);
            goto fail;
        }
        t->ndim = (int)nd;
        int64_t numel = 1;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            if ((st = rd_u64(&r, &ne, what))) goto fail;
            if (ne > (uint64_t)INT64_MAX || (ne && (uint64_t)numel > (uint64_t)INT64_MAX / ne)) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: %s: size %llu in dimension %u overflows", path, what,
                                (unsigned long long)ne, d);
                goto fail;
            }
            t->ne[d] = (int64_t)ne, numel *= (int64_t)ne;
        }
        for (int d = 0; d < t->ndim; d++) t->shape[d] = t->ne[t->ndim - 1 - d];
        for (int d = t->ndim; d < 4; d++) t->shape[d] = 1;
        t->numel = numel;
        if ((st = rd_u32(&r, &type, what))) goto fail;
        if (!kiln_ggml_type_name((kiln_ggml_type)type)) {
            const char *g = ggml_name(type);
            st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s has tensor type %u%s%s%s, which kiln does not read", path,
                            what, type, g ? " (" : " (unknown to ggml too", g ? g : "", ")");
            goto fail;
        }
        t->type = (kiln_ggml_type)type;
        int blk = kiln_ggml_block(t->type);
        if (t->ne[0] % blk) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s: rows of %lld values are not whole %s blocks of %d", path, what,
                            (long long)t->ne[0], kiln_ggml_type_name(t->type), blk);
            goto fail;
        }
        uint64_t blocks = (uint64_t)numel / (uint64_t)blk, bb = (uint64_t)kiln_ggml_block_bytes(t->type);
        if (blocks > SIZE_MAX / bb) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s: %lld values overflow a byte size", path, what, (long long)numel);
            goto fail;
        }
        t->nbytes = (size_t)(blocks * bb);
        if ((st = rd_u64(&r, &t->offset, what))) goto fail;
    }

    /* alignment, then the data section */
    f->alignment = KILN_GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < f->n_kv; i++) {
        kiln_gguf_kv *kv = &f->kv[i];
        uint64_t klen = f->klen[i];
        if (klen == 17 && !memcmp(kv->key, "general.alignment", 17)) {
            if (kv->type != KILN_GGUF_UINT32) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: key general.alignment is %s, not u32", path,
                                kiln_gguf_type_str(kv->type));
                goto fail;
            }
            uint32_t a = u32_at(kv->data);
            if (a == 0 || (a & (a - 1))) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: key general.alignment is %u, not a power of two", path, a);
                goto fail;
            }
            f->alignment = a;
        }
    }
    uint64_t hdr = r.pos, pad = (f->alignment - hdr % f->alignment) % f->alignment;
    f->data_offset = hdr + pad;
    uint64_t data_size = f->data_offset <= f->size ? f->size - f->data_offset : 0;
    if (f->n_t && f->data_offset > f->size) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: the data section would start at %llu, past the end of the file (%zu bytes)",
                        path, (unsigned long long)f->data_offset, f->size);
        goto fail;
    }
    for (int64_t i = 0; i < f->n_t; i++) {
        kiln_gguf_tensor *t = &f->t[i];
        int nl = (int)tname_len[i];
        if (t->offset % f->alignment) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: tensor %.*s: offset %llu is not a multiple of the alignment %u", path, nl,
                            t->name, (unsigned long long)t->offset, f->alignment);
            goto fail;
        }
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            st = kiln_error(KILN_ERR_FORMAT,
                            "%s: tensor %.*s: %zu bytes (%s, %lld values) at data offset %llu run past the end of the file "
                            "(%llu data bytes)",
                            path, nl, t->name, t->nbytes, kiln_ggml_type_name(t->type), (long long)t->numel,
                            (unsigned long long)t->offset, (unsigned long long)data_size);
            goto fail;
        }
        t->data = f->map + f->data_offset + t->offset;
    }

    /* names: NUL-terminated copies, then duplicates */
    f->names = malloc(name_bytes + 1);
    if (!f->names) {
        st = kiln_error(KILN_ERR_OOM, "out of memory");
        goto fail;
    }
    char *np = f->names;
    for (int64_t i = 0; i < f->n_kv; i++) {
        kiln_gguf_kv *kv = &f->kv[i];
        size_t klen = (size_t)f->klen[i];
        memcpy(np, kv->key, klen), np[klen] = 0;
        kv->key = np, np += klen + 1;
        if (kv->elem_type == KILN_GGUF_STRING) kv->lens = kv->data, kv->data = NULL;
    }
    for (int64_t i = 0; i < f->n_t; i++) {
        memcpy(np, f->t[i].name, (size_t)tname_len[i]), np[tname_len[i]] = 0;
        f->t[i].name = np, np += tname_len[i] + 1;
    }
    free(tname_len), tname_len = NULL;
    {
        int64_t n = f->n_kv > f->n_t ? f->n_kv : f->n_t;
        uint64_t cap = set_cap(n);
        int64_t *slots = malloc(cap * sizeof *slots);
        const char **names = malloc(((size_t)n + 1) * sizeof *names);
        if (!slots || !names) {
            free(slots), free(names);
            return kiln_error(KILN_ERR_OOM, "out of memory");
        }
        memset(slots, 0xff, cap * sizeof *slots);
        for (int64_t i = 0; i < f->n_kv; i++) {
            names[i] = f->kv[i].key;
            int64_t j = set_insert(slots, cap, names, names[i], i);
            if (j >= 0) {
                free(slots), free(names);
                return kiln_error(KILN_ERR_FORMAT, "%s: key %s appears twice (pairs %lld and %lld)", path, f->kv[i].key,
                                  (long long)j, (long long)i);
            }
        }
        memset(slots, 0xff, cap * sizeof *slots);
        for (int64_t i = 0; i < f->n_t; i++) {
            names[i] = f->t[i].name;
            int64_t j = set_insert(slots, cap, names, names[i], i);
            if (j >= 0) {
                free(slots), free(names);
                return kiln_error(KILN_ERR_FORMAT, "%s: tensor %s appears twice (tensors %lld and %lld)", path,
                                  f->t[i].name, (long long)j, (long long)i);
            }
        }
        free(slots), free(names);
    }
    /* no two tensors share bytes */
    if (f->n_t > 1) {
        int64_t *ord = malloc((size_t)f->n_t * sizeof *ord);
        if (!ord) return kiln_error(KILN_ERR_OOM, "out of memory");
        for (int64_t i = 0; i < f->n_t; i++) ord[i] = i;
        /* insertion sort is quadratic; a heap sort keeps hostile counts cheap */
        const kiln_gguf_tensor *T = f->t;
#define OFF(k) T[ord[k]].offset
        for (int64_t s = f->n_t / 2 - 1; s >= 0; s--)
            for (int64_t p = s, c; (c = 2 * p + 1) < f->n_t; p = c) {
                if (c + 1 < f->n_t && OFF(c + 1) > OFF(c)) c++;
                if (OFF(p) >= OFF(c)) break;
                int64_t x = ord[p]; ord[p] = ord[c]; ord[c] = x;
            }
        for (int64_t e = f->n_t - 1; e > 0; e--) {
            int64_t x = ord[0]; ord[0] = ord[e]; ord[e] = x;
            for (int64_t p = 0, c; (c = 2 * p + 1) < e; p = c) {
                if (c + 1 < e && OFF(c + 1) > OFF(c)) c++;
                if (OFF(p) >= OFF(c)) break;
                int64_t y = ord[p]; ord[p] = ord[c]; ord[c] = y;
            }
        }
#undef OFF
        for (int64_t k = 1; k < f->n_t; k++) {
            const kiln_gguf_tensor *a = &T[ord[k - 1]], *b = &T[ord[k]];
            if (a->nbytes && b->nbytes && a->offset + a->nbytes > b->offset) {
                free(ord);
                return kiln_error(KILN_ERR_FORMAT, "%s: tensors %s and %s overlap (data offsets %llu and %llu, %zu bytes)",
                                  path, a->name, b->name, (unsigned long long)a->offset, (unsigned long long)b->offset,
                                  a->nbytes);
            }
        }
        free(ord);
    }
    return KILN_OK;
fail:
    free(tname_len);
    return st;
}

kiln_status kiln_gguf_open(const char *path, kiln_gguf_file **out) {
    *out = NULL;
    kiln_gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    kiln_status st = map_file(f);
    if (!st) st = parse(f);
    if (st) {
        kiln_gguf_close(f);
        return st;
    }
    *out = f;
    return KILN_OK;
}

void kiln_gguf_close(kiln_gguf_file *f) {
    if (!f) return;
    if (f->map) munmap((void *)f->map, f->size);
    free(f->kv), free(f->t), free(f->klen), free(f->strs), free(f->lens), free(f->names), free(f->path);
    free(f);
}

const char *kiln_gguf_path(const kiln_gguf_file *f) { return f->path; }
uint32_t kiln_gguf_version(const kiln_gguf_file *f) { return f->version; }
uint32_t kiln_gguf_file_alignment(const kiln_gguf_file *f) { return f->alignment; }
uint64_t kiln_gguf_data_offset(const kiln_gguf_file *f) { return f->data_offset; }
int64_t kiln_gguf_kv_count(const kiln_gguf_file *f) { return f->n_kv; }
const kiln_gguf_kv *kiln_gguf_kv_at(const kiln_gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? &f->kv[i] : NULL;
}
const kiln_gguf_kv *kiln_gguf_find(const kiln_gguf_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_kv; i++)
        if (!strcmp(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}
int64_t kiln_gguf_tensor_count(const kiln_gguf_file *f) { return f->n_t; }
const kiln_gguf_tensor *kiln_gguf_tensor_at(const kiln_gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_t ? &f->t[i] : NULL;
}
const kiln_gguf_tensor *kiln_gguf_tensor_find(const kiln_gguf_file *f, const char *name) {
    for (int64_t i = 0; i < f->n_t; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

static kiln_status typed(const kiln_gguf_file *f, const char *key, kiln_gguf_type want, const kiln_gguf_kv **out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(f, key);
    if (!kv) return kiln_error(KILN_ERR_FORMAT, "%s: key %s missing", f->path, key);
    if (kv->type != want)
        return kiln_error(KILN_ERR_FORMAT, "%s: key %s is %s%s%s, not %s", f->path, key, kiln_gguf_type_str(kv->type),
                          kv->type == KILN_GGUF_ARRAY ? " of " : "",
                          kv->type == KILN_GGUF_ARRAY ? kiln_gguf_type_str(kv->elem_type) : "", kiln_gguf_type_str(want));
    *out = kv;
    return KILN_OK;
}
#define GETTER(fn, T, type)                                                    \
    kiln_status fn(const kiln_gguf_file *f, const char *key, T *out) {         \
        const kiln_gguf_kv *kv;                                                \
        kiln_status st = typed(f, key, type, &kv);                             \
        if (!st) memcpy(out, kv->data, sizeof *out);                           \
        return st;                                                             \
    }
GETTER(kiln_gguf_get_u8, uint8_t, KILN_GGUF_UINT8)
GETTER(kiln_gguf_get_i8, int8_t, KILN_GGUF_INT8)
GETTER(kiln_gguf_get_u16, uint16_t, KILN_GGUF_UINT16)
GETTER(kiln_gguf_get_i16, int16_t, KILN_GGUF_INT16)
GETTER(kiln_gguf_get_u32, uint32_t, KILN_GGUF_UINT32)
GETTER(kiln_gguf_get_i32, int32_t, KILN_GGUF_INT32)
GETTER(kiln_gguf_get_u64, uint64_t, KILN_GGUF_UINT64)
GETTER(kiln_gguf_get_i64, int64_t, KILN_GGUF_INT64)
GETTER(kiln_gguf_get_f32, float, KILN_GGUF_FLOAT32)
GETTER(kiln_gguf_get_f64, double, KILN_GGUF_FLOAT64)
#undef GETTER

kiln_status kiln_gguf_get_bool(const kiln_gguf_file *f, const char *key, bool *out) {
    const kiln_gguf_kv *kv;
    kiln_status st = typed(f, key, KILN_GGUF_BOOL, &kv);
    if (!st) *out = *(const uint8_t *)kv->data != 0;
    return st;
}
kiln_status kiln_gguf_get_str(const kiln_gguf_file *f, const char *key, const char **s, uint64_t *len) {
    const kiln_gguf_kv *kv;
    kiln_status st = typed(f, key, KILN_GGUF_STRING, &kv);
    if (!st) *s = kv->strs[0], *len = kv->lens[0];
    return st;
}
kiln_status kiln_gguf_get_array(const kiln_gguf_file *f, const char *key, kiln_gguf_type elem_type,
                                const kiln_gguf_kv **out) {
    const kiln_gguf_kv *kv;
    kiln_status st = typed(f, key, KILN_GGUF_ARRAY, &kv);
    if (st) return st;
    if (kv->elem_type != elem_type)
        return kiln_error(KILN_ERR_FORMAT, "%s: key %s is an array of %s, not of %s", f->path, key,
                          kiln_gguf_type_str(kv->elem_type), kiln_gguf_type_str(elem_type));
    *out = kv;
    return KILN_OK;
}

void kiln_gguf_release_pages(const kiln_gguf_file *f, const kiln_gguf_tensor *t) {
    if (!f || !t || !t->nbytes) return;
    /* whole pages inside the tensor's bytes: its neighbours keep theirs */
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)t->data + pg - 1) & ~(pg - 1),
              hi = ((uintptr_t)t->data + t->nbytes) & ~(pg - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
