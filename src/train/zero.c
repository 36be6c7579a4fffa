/* ZeRO sharding of the optimiser (stages 1 and 2, --shard): the bucket
 * layout every rank agrees on, a rank's slice of the flat parameter space
 * (its segments), the sharded moments, and their checkpoints: one shard
 * file per rank plus optimizer.shards.json, read back by any number of ranks
 * (each rank copies the pieces of its own new slice out of whichever old
 * shards hold them). The collectives live in dist.c; AdamW over the
 * segments in optim.c. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/build.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "hostio.h"

#define MANIFEST "optimizer.shards.json"
#define FORMAT "kiln-zero-1"

int kiln_grad_buckets(kiln_tensor *const *params, int n, size_t bucket_bytes, kiln_grad_bucket *out) {
    int64_t cap = (int64_t)(bucket_bytes / sizeof(float)), cur = -1; /* cur: the open bucket's floats (-1: none) */
    if (cap < 1) cap = 1;
    int nb = 0;
    for (int i = n - 1; i >= 0; i--) {
        int64_t len = kiln_tensor_numel(params[i]);
        if (len > cap) { /* pieces of its own */
            for (int64_t a = 0; a < len; a += cap, nb++)
                if (out) out[nb] = (kiln_grad_bucket){i, i, len - a < cap ? len - a : cap, a};
            cur = -1;
            continue;
        }
        if (cur < 0 || (cur > 0 && cur + len > cap)) {
            if (out) out[nb] = (kiln_grad_bucket){i, i, 0, 0};
            nb++, cur = 0;
        }
        if (out) out[nb - 1].lo = i, out[nb - 1].n += len;
        cur += len;
    }
    if (!nb) {
        if (out) out[0] = (kiln_grad_bucket){-1, 0, 0, 0}; /* nothing trainable: the sums still travel */
        nb = 1;
    }
    return nb;
}

/* Rank r's segments in bucket order (out may be NULL: count only). */
static int segments(const kiln_zero *z, kiln_tensor *const *params, int r, kiln_zero_seg *out) {
    int count = 0;
    int64_t pos = 0;
    for (int k = 0; k < z->nb; k++) {
        const int64_t *c = z->chunk + (size_t)k * (size_t)(z->size + 1);
        int64_t lo = c[r], hi = c[r + 1], start = 0;
        for (int i = z->b[k].hi; z->b[k].n && i >= z->b[k].lo && start < hi; i--) {
            int64_t base, len = kiln_bucket_part(&z->b[k], params, i, &base);
            int64_t a = lo > start ? lo : start, e = hi < start + len ? hi : start + len;
            if (a < e) {
                if (out) out[count] = (kiln_zero_seg){i, base + a - start, e - a, pos};
                count++;
                pos += e - a;
            }
            start += len;
        }
    }
    return count;
}

int kiln_zero_segments_of(const kiln_zero *z, kiln_tensor *const *params, int r, kiln_zero_seg **out) {
    int n = segments(z, params, r, NULL);
    *out = malloc(sizeof **out * (size_t)(n ? n : 1));
    if (!*out) return -1;
    segments(z, params, r, *out);
    return n;
}

void kiln_zero_free(kiln_zero *z) {
    if (!z) return;
    free(z->b);
    free(z->chunk);
    free(z->at);
    free(z->seg);
    kiln_tensor_release(z->m);
    kiln_tensor_release(z->v);
    kiln_tensor_release(z->g);
    free(z);
}

kiln_zero *kiln_zero_new(kiln_tensor *const *params, int n, size_t bucket_bytes, int rank, int size, kiln_shard_mode mode) {
    kiln_zero *z = calloc(1, sizeof *z);
    if (!z) goto oom;
    *z = (kiln_zero){.mode = mode, .rank = rank, .size = size, .bucket_bytes = bucket_bytes};
    z->nb = kiln_grad_buckets(params, n, bucket_bytes, NULL);
    z->b = malloc(sizeof *z->b * (size_t)z->nb);
    if (!z->b) goto oom;
    kiln_grad_buckets(params, n, bucket_bytes, z->b);
    z->chunk = malloc(sizeof *z->chunk * (size_t)z->nb * (size_t)(size + 1));
    z->at = malloc(sizeof *z->at * (size_t)z->nb);
    if (!z->chunk || !z->at) goto oom;
    for (int k = 0; k < z->nb; k++) {
        for (int r = 0; r <= size; r++) z->chunk[(size_t)k * (size_t)(size + 1) + (size_t)r] = z->b[k].n * r / size;
        const int64_t *c = z->chunk + (size_t)k * (size_t)(size + 1);
        z->at[k] = z->len;
        z->len += c[rank + 1] - c[rank];
    }
    if ((z->nseg = kiln_zero_segments_of(z, params, rank, &z->seg)) < 0) goto oom;
    int64_t len = z->len ? z->len : 1; /* a rank may own nothing of a tiny model */
    const kiln_buffer_type *bt = n ? kiln_tensor_buft(params[0]) : kiln_buft_current();
    z->m = kiln_tensor_zeros_on(bt, KILN_F32, 1, &len);
    z->v = kiln_tensor_zeros_on(bt, KILN_F32, 1, &len);
    if (mode == KILN_SHARD_GRADIENTS) z->g = kiln_tensor_zeros_on(bt, KILN_F32, 1, &len);
    if (!z->m || !z->v || (mode == KILN_SHARD_GRADIENTS && !z->g)) goto oom;
    return z;
oom:
    kiln_zero_free(z);
    kiln_error(KILN_ERR_OOM, "out of memory for this rank's optimiser shard");
    return NULL;
}

void kiln_adamw_memory(const kiln_adamw *o, kiln_opt_memory *mem) {
    *mem = (kiln_opt_memory){.buffers = kiln_dist_buffer_bytes()};
    const kiln_zero *z = o->zero;
    if (z) {
        mem->moments = 2.0 * (double)z->len * sizeof(float);
        if (z->g) mem->grads += (double)z->len * sizeof(float);
    }
    for (int i = 0; i < o->n; i++) {
        if (!z) mem->moments += (double)(kiln_tensor_nbytes(o->m[i]) + kiln_tensor_nbytes(o->v[i]));
        if (o->params[i]->grad) mem->grads += (double)kiln_tensor_nbytes(o->params[i]->grad);
    }
}

/* ---- saving ------------------------------------------------------------------ */

static void shard_name(char *out, size_t n, int r, int size) {
    snprintf(out, n, "optimizer-%05d-of-%05d.safetensors", r, size);
}

static kiln_status join(char *out, size_t n, const char *dir, const char *name) {
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n) return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    return KILN_OK;
}

/* path's bytes and SHA-256 (hex). */
static kiln_status hash_file(const char *path, int64_t *bytes, char hex[65]) {
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return kiln_error(KILN_ERR_IO, "cannot read %s: %s", path, strerror(e));
    }
    bool ok = kiln_sha256_fd(fd, hex);
    close(fd);
    if (!ok) return kiln_error(KILN_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    *bytes = (int64_t)sb.st_size;
    return KILN_OK;
}

static kiln_status write_shard(const char *dir, const kiln_adamw *o, int64_t *bytes, char hex[65]) {
    const kiln_zero *z = o->zero;
    char name[64], path[1200], rank[16], ranks[16];
    shard_name(name, sizeof name, z->rank, z->size);
    kiln_status st = join(path, sizeof path, dir, name);
    if (st) return st;
    void *om = NULL, *ov = NULL;
    kiln_st_tensor ts[2] = {{.name = "exp_avg", .dtype = KILN_F32, .ndim = 1, .shape = {z->len}},
                            {.name = "exp_avg_sq", .dtype = KILN_F32, .ndim = 1, .shape = {z->len}}};
    ts[0].bytes = kiln_host_bytes(z->m, &om), ts[1].bytes = kiln_host_bytes(z->v, &ov);
    ts[0].nbytes = ts[1].nbytes = (size_t)z->len * sizeof(float);
    if (!ts[0].bytes || !ts[1].bytes) st = kiln_last_status();
    char meta_buf[5][32];
    const char *meta[24];
    if (!st) {
        kiln_adamw_meta(o, meta_buf, meta);
        snprintf(rank, sizeof rank, "%d", z->rank);
        snprintf(ranks, sizeof ranks, "%d", z->size);
        int n = 0;
        while (meta[n]) n++;
        meta[n++] = "rank", meta[n++] = rank, meta[n++] = "ranks", meta[n++] = ranks, meta[n] = NULL;
        st = kiln_st_save(path, ts, 2, meta); /* atomic: a temp file renamed */
    }
    free(om);
    free(ov);
    if (!st) st = hash_file(path, bytes, hex);
    return st ? kiln_error_context(st, "rank %d writing its optimizer shard", z->rank) : KILN_OK;
}

static json_t *manifest_json(const kiln_adamw *o, const int64_t *info) {
    const kiln_zero *z = o->zero;
    json_t *root = json_object(), *shards = json_array();
    if (!root || !shards) goto oom;
    json_object_set_new(root, "format", json_string(FORMAT));
    json_object_set_new(root, "optimizer", json_string("adamw"));
    json_object_set_new(root, "step", json_integer((json_int_t)o->t));
    json_object_set_new(root, "ranks", json_integer(z->size));
    json_object_set_new(root, "shard", json_string(z->mode == KILN_SHARD_GRADIENTS ? "gradients" : "optimizer"));
    json_object_set_new(root, "bucket_bytes", json_integer((json_int_t)z->bucket_bytes));
    json_object_set(root, "shards", shards);
    for (int r = 0; r < z->size; r++) {
        const int64_t *x = info + 6 * r;
        uint8_t dg[32];
        memcpy(dg, x + 2, 32);
        char hex[65], name[64];
        kiln_sha256_hex_digest(dg, hex);
        shard_name(name, sizeof name, r, z->size);
        kiln_zero_seg *seg = NULL;
        int ns = kiln_zero_segments_of(z, o->params, r, &seg);
        json_t *s = json_object(), *list = json_array();
        if (ns < 0 || !s || !list) {
            free(seg);
            json_decref(s);
            json_decref(list);
            goto oom;
        }
        int64_t floats = 0;
        for (int j = 0; j < ns; j++) {
            json_array_append_new(list, json_pack("[sIII]", o->params[seg[j].param]->name, (json_int_t)seg[j].off,
                                                  (json_int_t)seg[j].n, (json_int_t)seg[j].pos));
            floats += seg[j].n;
        }
        free(seg);
        json_object_set_new(s, "file", json_string(name));
        json_object_set_new(s, "rank", json_integer(r));
        json_object_set_new(s, "bytes", json_integer((json_int_t)x[1]));
        json_object_set_new(s, "sha256", json_string(hex));
        json_object_set_new(s, "floats", json_integer((json_int_t)floats));
        json_object_set_new(s, "segments", list);
        json_array_append_new(shards, s);
    }
    json_decref(shards);
    return root;
oom:
    json_decref(shards);
    json_decref(root);
    return NULL;
}

kiln_status kiln_zero_save(const char *dir, const kiln_adamw *o) {
    const kiln_zero *z = o->zero;
    if (!z) return kiln_error(KILN_ERR_INVALID, "kiln_zero_save: the optimiser is not sharded");
    int P = z->size;
    int64_t *info = calloc((size_t)P * 6, sizeof *info); /* per rank: written, bytes, SHA-256 as 4 words */
    if (!info) return kiln_error(KILN_ERR_OOM, "out of memory saving the optimizer shards");
    char hex[65] = "";
    int64_t bytes = 0;
    kiln_status st = write_shard(dir, o, &bytes, hex), mine = st;
    char why[512] = "";
    if (st) snprintf(why, sizeof why, "%s", kiln_last_error());
    int64_t *x = info + 6 * z->rank;
    x[0] = st ? 0 : 1, x[1] = bytes;
    if (!st) {
        uint8_t dg[32];
        for (int i = 0; i < 32; i++) {
            unsigned v = 0;
            sscanf(hex + 2 * i, "%2x", &v);
            dg[i] = (uint8_t)v;
        }
        memcpy(x + 2, dg, 32);
    }
    st = kiln_dist_sum_i64(info, 6 * P); /* every rank's outcome to every rank */
    int failed = -1;
    for (int r = 0; !st && r < P && failed < 0; r++)
        if (info[6 * r] != 1) failed = r;
    if (!st && failed >= 0)
        st = mine ? kiln_error(mine, "%s", why)
                  : kiln_error(KILN_ERR_IO, "rank %d could not write its optimizer shard (its own message says why)", failed);
    int64_t bad = 0;
    if (!st && z->rank == 0) { /* the manifest, after every shard is whole */
        json_t *j = manifest_json(o, info);
        char path[1200];
        char *text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
        st = text ? join(path, sizeof path, dir, MANIFEST) : kiln_error(KILN_ERR_OOM, "out of memory writing " MANIFEST);
        if (!st) st = kiln_write_file_atomic(path, text, strlen(text));
        free(text);
        json_decref(j);
        bad = st ? 1 : 0;
    }
    if (failed < 0) {
        kiln_status s2 = kiln_dist_max_i64(&bad, 1);
        if (!st && s2) st = s2;
        if (!st && bad) st = kiln_error(KILN_ERR_IO, "rank 0 could not write %s/" MANIFEST, dir);
    }
    free(info);
    return st;
}

/* ---- loading ------------------------------------------------------------------ */

/* A piece of saved state: params[param][off, off + n) is at element pos of
 * file tensors m and v. */
typedef struct {
    int param;
    int64_t off, n, pos;
    const kiln_st_tensor *m, *v;
    int file;
} src_seg;

/* A piece of o's state to fill: params[param][off, off + n) at element pos
 * of tensors m and v. */
typedef struct {
    int param;
    int64_t off, n, pos;
    kiln_tensor *m, *v;
} dst_seg;

typedef struct {
    char dir[1024];
    int nfiles;
    kiln_st_file **files;
    char (*fname)[64];
    json_t **fjson; /* the manifest's entry of each file */
    bool *needed;
    int nsrc;
    src_seg *src;
    int64_t step;
} sources;

static void sources_free(sources *s) {
    for (int i = 0; i < s->nfiles; i++) kiln_st_close(s->files[i]);
    free(s->files);
    free(s->fname);
    free(s->fjson);
    free(s->needed);
    free(s->src);
}

static int param_index(const kiln_adamw *o, const char *name) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->params[i]->name, name)) return i;
    return -1;
}

static int cmp_src(const void *a, const void *b) {
    const src_seg *x = a, *y = b;
    if (x->param != y->param) return x->param - y->param;
    return (x->off > y->off) - (x->off < y->off);
}

/* Every trainable parameter's elements covered once by the sources. */
static kiln_status check_coverage(const char *what, const kiln_adamw *o, src_seg *s, int n) {
    src_seg *c = malloc(sizeof *c * (size_t)(n ? n : 1));
    if (!c) return kiln_error(KILN_ERR_OOM, "out of memory reading %s", what);
    memcpy(c, s, sizeof *c * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_src);
    kiln_status st = KILN_OK;
    for (int i = 0, j = 0; i < o->n && !st; i++) {
        int64_t next = 0, numel = kiln_tensor_numel(o->params[i]);
        for (; j < n && c[j].param == i; j++) {
            if (c[j].off != next) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: parameter '%s' has elements %s at %lld", what, o->params[i]->name,
                                c[j].off > next ? "missing" : "twice", (long long)(c[j].off > next ? next : c[j].off));
                break;
            }
            next += c[j].n;
        }
        if (!st && next != numel)
            st = kiln_error(KILN_ERR_FORMAT, "%s: parameter '%s' is covered for %lld of its %lld elements", what,
                            o->params[i]->name, (long long)next, (long long)numel);
    }
    free(c);
    return st;
}

/* The sources of a whole optimizer.safetensors: one segment per parameter. */
static kiln_status whole_sources(const char *path, const kiln_adamw *o, sources *s) {
    s->nfiles = 1;
    s->files = calloc(1, sizeof *s->files);
    s->fname = calloc(1, sizeof *s->fname);
    s->fjson = calloc(1, sizeof *s->fjson);
    s->needed = calloc(1, sizeof *s->needed);
    s->src = calloc((size_t)(o->n ? o->n : 1), sizeof *s->src);
    if (!s->files || !s->fname || !s->fjson || !s->needed || !s->src) return kiln_error(KILN_ERR_OOM, "out of memory loading %s", path);
    kiln_status st = kiln_st_open(path, &s->files[0]);
    if (st) return kiln_error_context(st, "loading optimiser state");
    const char *t = kiln_st_metadata(s->files[0], "step");
    if (!t || kiln_parse_i64(t, 0, INT64_MAX, &s->step)) return kiln_error(KILN_ERR_FORMAT, "%s: metadata 'step' is missing or not a count", path);
    int expect = 0;
    for (int i = 0; i < o->n; i++) {
        char nm[2][600];
        snprintf(nm[0], sizeof nm[0], "exp_avg.%s", o->params[i]->name);
        snprintf(nm[1], sizeof nm[1], "exp_avg_sq.%s", o->params[i]->name);
        const kiln_st_tensor *m = kiln_st_find(s->files[0], nm[0]), *v = kiln_st_find(s->files[0], nm[1]);
        int64_t numel = kiln_tensor_numel(o->params[i]);
        for (int k = 0; k < 2; k++) {
            const kiln_st_tensor *x = k ? v : m;
            if (!x) return kiln_error(KILN_ERR_FORMAT, "%s: missing tensor '%s'", path, nm[k]);
            if (x->dtype != KILN_F32 || x->nbytes != (size_t)numel * sizeof(float))
                return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' is not %lld f32 values", path, nm[k], (long long)numel);
        }
        s->src[s->nsrc++] = (src_seg){i, 0, numel, 0, m, v, 0};
        expect += 2;
    }
    if (kiln_st_count(s->files[0]) != expect)
        return kiln_error(KILN_ERR_FORMAT, "%s: %d tensors, expected %d (2 per trainable parameter)", path,
                          kiln_st_count(s->files[0]), expect);
    s->needed[0] = true;
    kiln_adamw_meta_check(s->files[0], path, o);
    return KILN_OK;
}

static kiln_status bad_manifest(const char *path, const char *what) {
    return kiln_error(KILN_ERR_FORMAT, "%s: %s", path, what);
}

/* The sources a manifest lists (files not yet opened). */
/* A key of obj that is not in known (NULL-ended), or NULL. */
static const char *unknown_key(json_t *obj, const char *const *known) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) return k;
    }
    return NULL;
}

static kiln_status manifest_sources(const char *path, json_t *root, const kiln_adamw *o, sources *s) {
    static const char *const top[] = {"format", "optimizer", "step", "ranks", "shard", "bucket_bytes", "shards", NULL};
    static const char *const entry[] = {"file", "rank", "bytes", "sha256", "floats", "segments", NULL};
    const char *odd = unknown_key(root, top);
    if (odd) return kiln_error(KILN_ERR_FORMAT, "%s: unknown key '%s' (kiln writes %s)", path, odd, FORMAT);
    json_t *opt = json_object_get(root, "optimizer");
    if (opt && (!json_is_string(opt) || strcmp(json_string_value(opt), "adamw")))
        return bad_manifest(path, "\"optimizer\" is not \"adamw\" (the only optimiser kiln has)");
    json_t *shards = json_object_get(root, "shards"), *fmt = json_object_get(root, "format");
    json_t *ranks = json_object_get(root, "ranks"), *step = json_object_get(root, "step");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FORMAT))
        return bad_manifest(path, "\"format\" is not \"" FORMAT "\"");
    if (!json_is_integer(step) || json_integer_value(step) < 0) return bad_manifest(path, "\"step\" is not a step count");
    if (!json_is_integer(ranks) || json_integer_value(ranks) < 1 || json_integer_value(ranks) > (1 << 20))
        return bad_manifest(path, "\"ranks\" is not a count of ranks");
    int P = (int)json_integer_value(ranks);
    if (!json_is_array(shards) || (int)json_array_size(shards) != P) return bad_manifest(path, "\"shards\" does not list one shard per rank");
    s->step = (int64_t)json_integer_value(step);
    s->nfiles = P;
    s->files = calloc((size_t)P, sizeof *s->files);
    s->fname = calloc((size_t)P, sizeof *s->fname);
    s->fjson = calloc((size_t)P, sizeof *s->fjson);
    s->needed = calloc((size_t)P, sizeof *s->needed);
    size_t total = 0;
    for (int r = 0; r < P; r++) total += json_array_size(json_object_get(json_array_get(shards, (size_t)r), "segments"));
    s->src = calloc(total ? total : 1, sizeof *s->src);
    if (!s->files || !s->fname || !s->fjson || !s->needed || !s->src) return kiln_error(KILN_ERR_OOM, "out of memory reading %s", path);
    for (int f = 0; f < P; f++) {
        json_t *e = json_array_get(shards, (size_t)f);
        json_t *file = json_object_get(e, "file"), *rank = json_object_get(e, "rank"), *segs = json_object_get(e, "segments");
        json_t *floats = json_object_get(e, "floats");
        const char *fn = json_string_value(file);
        if (!json_is_object(e)) return kiln_error(KILN_ERR_FORMAT, "%s: shard %d is not an object", path, f);
        if ((odd = unknown_key(e, entry))) return kiln_error(KILN_ERR_FORMAT, "%s: shard %d: unknown key '%s'", path, f, odd);
        if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, "..") || strlen(fn) >= sizeof s->fname[0])
            return kiln_error(KILN_ERR_FORMAT, "%s: shard %d has no plain file name", path, f);
        if (!json_is_integer(rank) || json_integer_value(rank) != f)
            return kiln_error(KILN_ERR_FORMAT, "%s: shard %d (%s) says rank %s", path, f, fn, json_is_integer(rank) ? "another" : "nothing");
        if (!json_is_integer(json_object_get(e, "bytes")) || !json_is_string(json_object_get(e, "sha256")) ||
            strlen(json_string_value(json_object_get(e, "sha256"))) != 64 || !json_is_integer(floats) || !json_is_array(segs))
            return kiln_error(KILN_ERR_FORMAT, "%s: shard %s lacks bytes, sha256, floats or segments", path, fn);
        snprintf(s->fname[f], sizeof s->fname[f], "%s", fn);
        s->fjson[f] = e;
        int64_t sum = 0, nf = (int64_t)json_integer_value(floats);
        for (size_t j = 0; j < json_array_size(segs); j++) {
            json_t *g = json_array_get(segs, j);
            const char *pn = json_string_value(json_array_get(g, 0));
            json_t *a = json_array_get(g, 1), *b = json_array_get(g, 2), *c = json_array_get(g, 3);
            if (!json_is_array(g) || json_array_size(g) != 4 || !pn || !json_is_integer(a) || !json_is_integer(b) || !json_is_integer(c))
                return kiln_error(KILN_ERR_FORMAT, "%s: shard %s, segment %zu is not [name, offset, count, position]", path, fn, j);
            int i = param_index(o, pn);
            if (i < 0)
                return kiln_error(KILN_ERR_FORMAT, "%s: shard %s holds state of '%s', which is not a trainable parameter of this model",
                                  path, fn, pn);
            int64_t off = (int64_t)json_integer_value(a), n = (int64_t)json_integer_value(b), pos = (int64_t)json_integer_value(c);
            if (off < 0 || n < 1 || off > kiln_tensor_numel(o->params[i]) - n || pos < 0 || pos > nf - n)
                return kiln_error(KILN_ERR_FORMAT, "%s: shard %s, segment %zu ('%s' [%lld, +%lld) at %lld) is out of range", path,
                                  fn, j, pn, (long long)off, (long long)n, (long long)pos);
            s->src[s->nsrc++] = (src_seg){i, off, n, pos, NULL, NULL, f};
            sum += n;
        }
        if (sum != nf) return kiln_error(KILN_ERR_FORMAT, "%s: shard %s lists %lld floats in its segments, %lld in all", path, fn, (long long)sum, (long long)nf);
    }
    return check_coverage(path, o, s->src, s->nsrc);
}

/* A shard this rank reads: present, its size and hash the manifest's, its
 * tensors [floats] f32, its rank and step the manifest's. */
static kiln_status open_shard(sources *s, int f, const kiln_adamw *o) {
    char path[1200], hex[65];
    kiln_status st = join(path, sizeof path, s->dir, s->fname[f]);
    if (st) return st;
    json_t *e = s->fjson[f];
    struct stat sb;
    if (stat(path, &sb) != 0) return kiln_error(KILN_ERR_IO, "%s: optimizer shard %s is missing (%s)", s->dir, s->fname[f], strerror(errno));
    int64_t bytes = 0, want = (int64_t)json_integer_value(json_object_get(e, "bytes"));
    if ((st = hash_file(path, &bytes, hex))) return st;
    if (bytes != want)
        return kiln_error(KILN_ERR_FORMAT, "%s: optimizer shard %s has %lld bytes, the manifest says %lld (torn or replaced)", s->dir,
                          s->fname[f], (long long)bytes, (long long)want);
    if (strcmp(hex, json_string_value(json_object_get(e, "sha256"))))
        return kiln_error(KILN_ERR_FORMAT, "%s: optimizer shard %s does not have the SHA-256 the manifest lists (torn or replaced)",
                          s->dir, s->fname[f]);
    if ((st = kiln_st_open(path, &s->files[f]))) return st;
    int64_t floats = (int64_t)json_integer_value(json_object_get(e, "floats")), r = -1, t = -1;
    const kiln_st_tensor *m = kiln_st_find(s->files[f], "exp_avg"), *v = kiln_st_find(s->files[f], "exp_avg_sq");
    for (int k = 0; k < 2; k++) {
        const kiln_st_tensor *x = k ? v : m;
        /* a rank that owns nothing still writes one (zero) float */
        if (!x || x->dtype != KILN_F32 || x->nbytes < (size_t)floats * sizeof(float))
            return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' is missing or not %lld f32 values", path, k ? "exp_avg_sq" : "exp_avg",
                              (long long)floats);
    }
    const char *rs = kiln_st_metadata(s->files[f], "rank"), *ts = kiln_st_metadata(s->files[f], "step");
    if (!rs || kiln_parse_i64(rs, 0, INT64_MAX, &r) || r != f || !ts || kiln_parse_i64(ts, 0, INT64_MAX, &t) || t != s->step)
        return kiln_error(KILN_ERR_FORMAT, "%s: its rank and step are not the manifest's (%d, %lld): a shard of another save", path, f,
                          (long long)s->step);
    for (int j = 0; j < s->nsrc; j++)
        if (s->src[j].file == f) s->src[j].m = m, s->src[j].v = v;
    kiln_adamw_meta_check(s->files[f], path, o);
    return KILN_OK;
}

/* Copies (fill) or measures (!fill) what of d the sources hold. */
static kiln_status copy_into(const sources *s, const dst_seg *d, bool fill, int64_t *covered) {
    *covered = 0;
    for (int j = 0; j < s->nsrc; j++) {
        const src_seg *x = &s->src[j];
        if (x->param != d->param) continue;
        int64_t lo = d->off > x->off ? d->off : x->off, hi = d->off + d->n < x->off + x->n ? d->off + d->n : x->off + x->n;
        if (lo >= hi) continue;
        *covered += hi - lo;
        if (!fill) continue;
        size_t at = sizeof(float) * (size_t)(d->pos + lo - d->off), from = sizeof(float) * (size_t)(x->pos + lo - x->off);
        size_t n = sizeof(float) * (size_t)(hi - lo);
        kiln_status st = kiln_tensor_set(d->m, at, (const char *)x->m->bytes + from, n);
        if (!st) st = kiln_tensor_set(d->v, at, (const char *)x->v->bytes + from, n);
        if (st) return st;
    }
    return KILN_OK;
}

static kiln_status load_sources(sources *s, kiln_adamw *o) {
    kiln_zero *z = o->zero;
    int nd = z ? z->nseg : o->n;
    dst_seg *d = calloc((size_t)(nd ? nd : 1), sizeof *d);
    if (!d) return kiln_error(KILN_ERR_OOM, "out of memory loading the optimiser state");
    for (int i = 0; i < nd; i++) {
        if (z) d[i] = (dst_seg){z->seg[i].param, z->seg[i].off, z->seg[i].n, z->seg[i].pos, z->m, z->v};
        else d[i] = (dst_seg){i, 0, kiln_tensor_numel(o->params[i]), 0, o->m[i], o->v[i]};
    }
    /* the files this rank reads, checked whole before anything is copied */
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < s->nsrc; j++) {
            const src_seg *x = &s->src[j];
            if (x->param == d[i].param && x->off < d[i].off + d[i].n && d[i].off < x->off + x->n) s->needed[x->file] = true;
        }
    kiln_status st = KILN_OK;
    for (int f = 0; f < s->nfiles && !st; f++)
        if (s->needed[f] && !s->files[f]) st = open_shard(s, f, o);
    for (int i = 0; i < nd && !st; i++) {
        int64_t got = 0;
        st = copy_into(s, &d[i], false, &got);
        if (!st && got != d[i].n)
            st = kiln_error(KILN_ERR_FORMAT, "%s: the saved optimiser state holds %lld of the %lld elements of '%s' this rank needs",
                            s->dir, (long long)got, (long long)d[i].n, o->params[d[i].param]->name);
    }
    for (int i = 0; i < nd && !st; i++) {
        int64_t got;
        st = copy_into(s, &d[i], true, &got);
    }
    if (!st) o->t = s->step;
    free(d);
    return st;
}

kiln_status kiln_adamw_load_checkpoint(const char *dir, kiln_adamw *o) {
    char path[1200];
    kiln_status st = join(path, sizeof path, dir, MANIFEST);
    if (st) return st;
    struct stat sb;
    sources s = {0};
    snprintf(s.dir, sizeof s.dir, "%s", dir);
    if (stat(path, &sb) != 0) { /* the whole moments of an unsharded run */
        if ((st = join(path, sizeof path, dir, "optimizer.safetensors"))) return st;
        if (!o->zero) return kiln_adamw_load(path, o);
        st = whole_sources(path, o, &s);
    } else {
        json_error_t je;
        json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(root)) st = kiln_error(KILN_ERR_FORMAT, "%s: %s", path, root ? "not a JSON object" : je.text);
        else st = manifest_sources(path, root, o, &s);
        if (!st) st = load_sources(&s, o);
        json_decref(root);
        sources_free(&s);
        return st ? kiln_error_context(st, "loading the sharded optimiser state") : KILN_OK;
    }
    if (!st) st = load_sources(&s, o);
    sources_free(&s);
    return st ? kiln_error_context(st, "loading optimiser state") : KILN_OK;
}
