/* Model weights as people ship them: one model.safetensors, or shards named
 * by model.safetensors.index.json ({"metadata": {"total_size": N},
 * "weight_map": {tensor: file}}), in F32, BF16 or F16. Loading maps every
 * file, checks the whole set against the model before touching it (every
 * missing, extra, mis-shaped or mis-typed tensor gathered into one error) and
 * converts each tensor once into the model's F32 parameter. Saving writes
 * the Hugging Face layout: one file up to the shard size, else
 * model-0000i-of-0000n.safetensors plus the index. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/safetensors.h"
#include "kiln/model_meta.h"
#include "kiln/gguf.h"
#include "kiln/train.h"
#include "hostio.h"

#define PATH_CAP 4096
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static kiln_status join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    return KILN_OK;
}

static bool is_file(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

/* ---- options ---------------------------------------------------------------- */

kiln_status kiln_weights_options_parse(const char *dtype, const char *shard_size, kiln_weights_options *o) {
    kiln_weights_options r = {KILN_F32, KILN_DEFAULT_SHARD_BYTES};
    if (dtype && *dtype) {
        if (!strcmp(dtype, "fp32") || !strcmp(dtype, "f32")) r.dtype = KILN_F32;
        else if (!strcmp(dtype, "bf16")) r.dtype = KILN_BF16;
        else if (!strcmp(dtype, "f16") || !strcmp(dtype, "fp16")) r.dtype = KILN_F16;
        else return kiln_error(KILN_ERR_INVALID, "save_dtype '%s': expected fp32, bf16 or f16", dtype);
    }
    if (shard_size && *shard_size) {
        int64_t bytes = 0;
        if (kiln_parse_bytes_hf(shard_size, &bytes)) return kiln_error_context(KILN_ERR_INVALID, "shard_size");
        r.shard_bytes = (uint64_t)bytes;
    }
    *o = r;
    return KILN_OK;
}

/* ---- loading ---------------------------------------------------------------- */

/* Problems found while checking a weight set, reported as one error. */
typedef struct {
    char msg[900];
    size_t len;
    int n, shown;
} problems;

static void add_problem(problems *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_problem(problems *p, const char *fmt, ...) {
    char one[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(one, sizeof one, fmt, ap);
    va_end(ap);
    p->n++;
    kiln_log(KILN_LOG_DEBUG, "%s", one);
    size_t need = strlen(one) + 2;
    if (p->len + need + 40 >= sizeof p->msg) return; /* the rest is counted in "and N more" */
    p->len += (size_t)snprintf(p->msg + p->len, sizeof p->msg - p->len, "%s%s", p->shown ? "; " : "", one);
    p->shown++;
}

static kiln_status report(problems *p, const char *what) {
    if (!p->n) return KILN_OK;
    if (p->shown < p->n)
        return kiln_error(KILN_ERR_FORMAT, "%s: %d problems: %s; and %d more", what, p->n, p->msg, p->n - p->shown);
    return kiln_error(KILN_ERR_FORMAT, "%s: %d problem%s: %s", what, p->n, p->n == 1 ? "" : "s", p->msg);
}

/* A weight set: every tensor name with the file tensor that supplies it. */
typedef struct {
    int n;
    const char **names;
    const kiln_st_tensor **src;
    const char **file;            /* short name of the file holding it */
    kiln_st_file **files;
    int n_files;
    json_t *index;                /* keeps names alive */
} weight_set;

static void set_free(weight_set *w) {
    for (int i = 0; i < w->n_files; i++) kiln_st_close(w->files[i]);
    free(w->files);
    free(w->names);
    free(w->src);
    free(w->file);
    json_decref(w->index);
    memset(w, 0, sizeof *w);
}

/* A Gemma3ForConditionalGeneration checkpoint keeps its language model
 * under language_model.* (transformers < 4.52: language_model.model.layers...,
 * language_model.lm_head.weight) or model.language_model.* (newer:
 * model.language_model.layers...): the parameter name each stands for. */
static const char *canon_name(const char *n, char *buf, size_t cap) {
    if (!strncmp(n, "language_model.", 15)) return n + 15;
    if (!strncmp(n, "model.language_model.", 21)) {
        snprintf(buf, cap, "model.%s", n + 21);
        return buf;
    }
    return n;
}

/* the vision tower and projector of such a checkpoint */
static bool vision_tensor(const char *n) {
    static const char *const pre[] = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        if (!strncmp(n, pre[i], strlen(pre[i]))) return true;
    return false;
}

static int find_name(const weight_set *w, const char *name) {
    char buf[512];
    for (int i = 0; i < w->n; i++)
        if (!strcmp(canon_name(w->names[i], buf, sizeof buf), name)) return i;
    return -1;
}

static kiln_status set_single(const char *path, weight_set *w) {
    kiln_st_file *f = NULL;
    kiln_status st = kiln_st_open(path, &f);
    if (st) return kiln_error_context(st, "loading weights");
    int n = kiln_st_count(f);
    w->files = calloc(1, sizeof *w->files);
    w->names = calloc((size_t)n + 1, sizeof *w->names);
    w->src = calloc((size_t)n + 1, sizeof *w->src);
    w->file = calloc((size_t)n + 1, sizeof *w->file);
    if (!w->files || !w->names || !w->src || !w->file) {
        kiln_st_close(f);
        return kiln_error(KILN_ERR_OOM, "out of memory loading %s", path);
    }
    w->files[w->n_files++] = f;
    const char *slash = strrchr(path, '/');
    for (int i = 0; i < n; i++) {
        w->src[i] = kiln_st_at(f, i);
        w->names[i] = w->src[i]->name;
        w->file[i] = slash ? slash + 1 : path;
    }
    w->n = n;
    return KILN_OK;
}

/* A shard name from an index must be a plain file beside it. */
static bool plain_name(const char *s) {
    return *s && *s != '.' && !strchr(s, '/') && !strchr(s, '\\') && strlen(s) < 256;
}

/* Opens every shard an index names; checks that each tensor is in the
 * shard the index says and that no shard holds a tensor the index does not
 * send there. Problems go to *p (the set is still built when it can be). */
static kiln_status set_index(const char *dir, const char *index_path, weight_set *w, problems *p) {
    json_error_t je;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", index_path, je.line, je.column, je.text);
    w->index = root;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(map))
        return kiln_error(KILN_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
    size_t n = json_object_size(map);
    if (!n) return kiln_error(KILN_ERR_FORMAT, "%s: \"weight_map\" is empty", index_path);
    w->names = calloc(n, sizeof *w->names);
    w->src = calloc(n, sizeof *w->src);
    w->file = calloc(n, sizeof *w->file);
    w->files = calloc(n, sizeof *w->files);
    const char **shard_names = calloc(n, sizeof *shard_names);
    kiln_status st = w->names && w->src && w->file && w->files && shard_names
                         ? KILN_OK
                         : kiln_error(KILN_ERR_OOM, "out of memory loading %s", index_path);
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (st) break;
        const char *shard = json_string_value(v);
        if (!shard || !plain_name(shard)) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: weight_map[\"%s\"] must name a file beside the index, got %s%.100s%s",
                            index_path, key, shard ? "\"" : "", shard ? shard : "a non-string", shard ? "\"" : "");
            break;
        }
        int k = 0;
        while (k < w->n_files && strcmp(shard_names[k], shard)) k++;
        if (k == w->n_files) { /* first tensor of this shard: open it */
            char path[PATH_CAP];
            if ((st = join(path, dir, shard))) break;
            if (!is_file(path)) {
                st = kiln_error(KILN_ERR_IO, "%s: shard %s (holding '%s') does not exist", index_path, shard, key);
                break;
            }
            if ((st = kiln_st_open(path, &w->files[k]))) {
                st = kiln_error_context(st, "%s: shard %s", index_path, shard);
                break;
            }
            shard_names[w->n_files++] = shard;
        }
        const kiln_st_tensor *t = kiln_st_find(w->files[k], key);
        if (!t) {
            add_problem(p, "'%s' is mapped to %s, which does not hold it", key, shard);
            continue;
        }
        w->names[w->n] = key;
        w->src[w->n] = t;
        w->file[w->n] = shard;
        w->n++;
    }
    for (int k = 0; !st && k < w->n_files; k++) /* tensors a shard holds that the index does not send there */
        for (int i = 0; i < kiln_st_count(w->files[k]); i++) {
            const char *name = kiln_st_at(w->files[k], i)->name;
            const char *to = json_string_value(json_object_get(map, name));
            if (!to) add_problem(p, "%s holds '%s', which the index does not list", shard_names[k], name);
            else if (strcmp(to, shard_names[k]))
                add_problem(p, "%s also holds '%s', which the index maps to %s", shard_names[k], name, to);
        }
    free(shard_names);
    return st;
}

/* Every parameter present, shaped and typed as the model needs; nothing
 * else but a tied model's lm_head.weight (ignored, with a warning). */
static bool base_param(const kiln_llama *m, const char *name) {
    for (int i = 0; i < m->n_base; i++)
        if (!strcmp(m->params[i]->name, name)) return true;
    return false;
}

/* The weight files hold the base model only (params[0..n_base)): a LoRA
 * run's adapters go to adapter_model.safetensors (lora_io.c). */
static void check_set(const weight_set *w, const kiln_llama *m, const char *what, problems *p) {
    char a[128], b[128];
    for (int i = 0; i < m->n_base; i++) {
        const kiln_tensor *q = m->params[i];
        int k = find_name(w, q->name);
        if (k < 0) {
            add_problem(p, "missing tensor '%s' (the model expects %s)", q->name, kiln_dims_str(q->ndim, q->shape, a, sizeof a));
            continue;
        }
        const kiln_st_tensor *s = w->src[k];
        bool same = s->ndim == q->ndim;
        for (int d = 0; same && d < s->ndim; d++) same = s->shape[d] == q->shape[d];
        if (!same)
            add_problem(p, "tensor '%s' has shape %s but the model expects %s", q->name,
                        kiln_dims_str(s->ndim, s->shape, a, sizeof a), kiln_dims_str(q->ndim, q->shape, b, sizeof b));
        else if (s->dtype != KILN_F32 && s->dtype != KILN_BF16 && s->dtype != KILN_F16)
            add_problem(p, "tensor '%s' has dtype %s; weights must be F32, BF16 or F16", q->name, kiln_dtype_name(s->dtype));
        else if (q->dtype != KILN_F32 && q->dtype != KILN_BF16)
            add_problem(p, "tensor '%s': loading into a %s parameter is not supported", q->name, kiln_dtype_name(q->dtype));
    }
    int vision = 0;
    char buf[512];
    for (int i = 0; i < w->n; i++) {
        const char *name = canon_name(w->names[i], buf, sizeof buf);
        if (base_param(m, name) && find_name(w, name) == i) continue;
        if (m->cfg.family == KILN_FAMILY_GEMMA3 && vision_tensor(w->names[i])) vision++;
        else if (base_param(m, name))
            add_problem(p, "tensor '%s' is in %s twice (as '%s' too)", name, what, w->names[find_name(w, name)]);
        else if (m->cfg.tie_word_embeddings && !strcmp(name, "lm_head.weight"))
            kiln_log(KILN_LOG_WARN, "%s: ignoring '%s': the model ties it to model.embed_tokens.weight", what, w->names[i]);
        else
            add_problem(p, "unexpected tensor '%s' in %s (not a parameter of this model)", w->names[i], w->file[i]);
    }
    if (vision)
        kiln_log(KILN_LOG_INFO, "%s: %d tensors of the vision tower and the multimodal projector are not loaded: kiln builds "
                 "the language model of this Gemma 3 checkpoint", what, vision);
}

/* Conversions of file elements [first, first + n) into a parameter's
 * host chunk: into a bf16 parameter (a LoRA run's bf16 base) F32 and F16
 * are rounded once to nearest even (F16 widens exactly first); into an F32
 * one BF16 and F16 widen exactly. */
static void f32_to_bf16_chunk(void *dst, int64_t first, int64_t n, const void *src) {
    const float *x = (const float *)src + first;
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = kiln_f32_to_bf16(x[i]);
}

static void f16_to_bf16_chunk(void *dst, int64_t first, int64_t n, const void *src) {
    const uint16_t *h = (const uint16_t *)src + first;
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = kiln_f32_to_bf16(kiln_f16_to_f32(h[i]));
}

static void bf16_to_f32_chunk(void *dst, int64_t first, int64_t n, const void *src) {
    const uint16_t *h = (const uint16_t *)src + first;
    float *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = kiln_bf16_to_f32(h[i]);
}

static void f16_to_f32_chunk(void *dst, int64_t first, int64_t n, const void *src) {
    const uint16_t *h = (const uint16_t *)src + first;
    float *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = kiln_f16_to_f32(h[i]);
}

/* One file tensor into its parameter, on whatever device that lives. */
static kiln_status fill(const kiln_st_tensor *s, kiln_tensor *dst) {
    if (s->dtype == dst->dtype) return kiln_host_set_all(dst, s->bytes); /* F32 or BF16 as it is */
    if (dst->dtype == KILN_BF16)
        return kiln_host_fill(dst, s->dtype == KILN_F32 ? f32_to_bf16_chunk : f16_to_bf16_chunk, s->bytes);
    return kiln_host_fill(dst, s->dtype == KILN_BF16 ? bf16_to_f32_chunk : f16_to_f32_chunk, s->bytes);
}

static kiln_status load_set(weight_set *w, kiln_llama *m, const char *what, problems *p) {
    check_set(w, m, what, p);
    kiln_status st = report(p, what);
    if (st) return st; /* a refused set leaves the model as it was */
    for (int i = 0; i < m->n_base && !st; i++) st = fill(w->src[find_name(w, m->params[i]->name)], m->params[i]);
    return st;
}

kiln_status kiln_load_weights(const char *path, kiln_llama *m) {
    if (!path || !m) return kiln_error(KILN_ERR_INVALID, "kiln_load_weights: NULL argument");
    weight_set w = {0};
    problems p = {0};
    kiln_status st = set_single(path, &w);
    if (!st) st = load_set(&w, m, path, &p);
    set_free(&w);
    return st;
}

kiln_status kiln_load_model_weights(const char *dir, kiln_llama *m) {
    if (!dir || !m) return kiln_error(KILN_ERR_INVALID, "kiln_load_model_weights: NULL argument");
    char single[PATH_CAP], index[PATH_CAP];
    kiln_status st = join(single, dir, SINGLE_NAME);
    if (!st) st = join(index, dir, INDEX_NAME);
    if (st) return st;
    /* as the Hugging Face library: the single file first, else the index */
    if (is_file(single) || !is_file(index)) return kiln_load_weights(single, m);
    weight_set w = {0};
    problems p = {0};
    st = set_index(dir, index, &w, &p);
    if (!st) st = load_set(&w, m, index, &p);
    set_free(&w);
    return st;
}

kiln_status kiln_load_model_dir_on(const char *dir, int device, kiln_llama **out) {
    const kiln_backend *b = kiln_backend_at(device);
    if (!b) {
        if (out) *out = NULL;
        return kiln_error(KILN_ERR_INVALID, "kiln_load_model_dir_on: no device %d (known:" KILN_DEVICE_NAMES ")", device);
    }
    const kiln_backend *was = kiln_backend_use(b);
    kiln_status st = kiln_load_model_dir(dir, out);
    kiln_backend_use(was);
    return st;
}

kiln_status kiln_load_model_dir(const char *dir, kiln_llama **out) {
    if (!dir || !out) return kiln_error(KILN_ERR_INVALID, "kiln_load_model_dir: NULL argument");
    *out = NULL;
    if (kiln_is_gguf_path(dir)) return kiln_gguf_model_load(dir, true, out); /* frozen: kept in the file's types */
    if (kiln_base_ref_exists(dir)) return kiln_base_ref_load(dir, out); /* a held base, re-derived */
    char path[PATH_CAP];
    kiln_llama_config cfg;
    kiln_status st = join(path, dir, "config.json");
    if (!st) st = kiln_llama_config_load(path, &cfg);
    if (st) return st;
    kiln_llama *m = kiln_llama_new(&cfg, 0);
    if (!m) return kiln_error_context(kiln_last_status(), "model from %s", path);
    st = kiln_load_model_weights(dir, m);
    /* a LoRA run's checkpoint: the base plus its adapters */
    if (!st) st = join(path, dir, "adapter_config.json");
    if (!st && is_file(path)) st = kiln_lora_load(dir, m);
    if (st) {
        kiln_llama_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

/* ---- saving ----------------------------------------------------------------- */

/* Conversions of a parameter's host chunk [first, first + n) into the
 * file's buffer (ctx): a bf16 base widens exactly (F32) or goes through
 * f32 (F16); an F32 parameter rounds to nearest even (BF16, F16). */
static kiln_status bf16_to_f32_out(const void *src, int64_t first, int64_t n, void *out) {
    const uint16_t *x = src;
    float *h = (float *)out + first;
    for (int64_t j = 0; j < n; j++) h[j] = kiln_bf16_to_f32(x[j]);
    return KILN_OK;
}

static kiln_status bf16_to_f16_out(const void *src, int64_t first, int64_t n, void *out) {
    const uint16_t *x = src;
    uint16_t *h = (uint16_t *)out + first;
    for (int64_t j = 0; j < n; j++) h[j] = kiln_f32_to_f16(kiln_bf16_to_f32(x[j]));
    return KILN_OK;
}

static kiln_status f32_to_bf16_out(const void *src, int64_t first, int64_t n, void *out) {
    const float *x = src;
    uint16_t *h = (uint16_t *)out + first;
    for (int64_t j = 0; j < n; j++) h[j] = kiln_f32_to_bf16(x[j]);
    return KILN_OK;
}

static kiln_status f32_to_f16_out(const void *src, int64_t first, int64_t n, void *out) {
    const float *x = src;
    uint16_t *h = (uint16_t *)out + first;
    for (int64_t j = 0; j < n; j++) h[j] = kiln_f32_to_f16(x[j]);
    return KILN_OK;
}

/* The parameters as file tensors of `dtype` in host memory: a parameter
 * already in `dtype` as its own memory (host-mappable) or a copy, the
 * others converted; what is allocated goes to *bufs. */
static kiln_status file_tensors(const kiln_llama *m, kiln_dtype dtype, kiln_st_tensor *ts, void **bufs, int from,
                                int to, const char *path) {
    for (int i = from; i < to; i++) {
        const kiln_tensor *q = m->params[i];
        int64_t n = kiln_tensor_numel(q);
        kiln_st_tensor *t = &ts[i - from];
        *t = (kiln_st_tensor){.name = q->name, .dtype = dtype, .ndim = q->ndim, .bytes = NULL,
                              .nbytes = (size_t)n * kiln_dtype_size(dtype)};
        memcpy(t->shape, q->shape, sizeof t->shape);
        if (q->dtype == dtype) {
            if (!(t->bytes = kiln_host_bytes(q, &bufs[i - from])))
                return kiln_error_context(kiln_last_status(), "saving %s", path);
            continue;
        }
        if (q->dtype != KILN_F32 && q->dtype != KILN_BF16)
            return kiln_error(KILN_ERR_UNSUPPORTED, "cannot save %s: parameter '%s' is %s", path, q->name,
                              kiln_dtype_name(q->dtype));
        void *h = malloc(t->nbytes ? t->nbytes : 1);
        if (!h) return kiln_error(KILN_ERR_OOM, "out of memory converting '%s' to save %s", q->name, path);
        bufs[i - from] = h;
        t->bytes = h;
        kiln_host_read_fn conv = q->dtype == KILN_BF16 ? (dtype == KILN_F32 ? bf16_to_f32_out : bf16_to_f16_out)
                                                      : (dtype == KILN_BF16 ? f32_to_bf16_out : f32_to_f16_out);
        kiln_status st = kiln_host_read(q, conv, h);
        if (st) return kiln_error_context(st, "saving %s", path);
    }
    return KILN_OK;
}

static kiln_status save_file(const char *path, const kiln_llama *m, kiln_dtype dtype, int from, int to) {
    int n = to - from;
    kiln_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    void **bufs = calloc((size_t)n + 1, sizeof *bufs);
    kiln_status st = ts && bufs ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    if (!st) st = file_tensors(m, dtype, ts, bufs, from, to, path);
    static const char *const meta[] = {"format", "pt", NULL};
    if (!st) st = kiln_st_save(path, ts, n, meta);
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    return st;
}

kiln_status kiln_save_weights(const char *path, const kiln_llama *m) {
    if (!path || !m) return kiln_error(KILN_ERR_INVALID, "kiln_save_weights: NULL argument");
    return save_file(path, m, KILN_F32, 0, m->n_base);
}

/* Removes dir's weight files that are not part of the set just written
 * (a single file replaced by shards, or shards by fewer or by one). */
static void remove_stale(const char *dir, int n_shards, bool sharded) {
    DIR *d = opendir(dir);
    if (!d) return;
    char keep_suffix[64], path[PATH_CAP];
    snprintf(keep_suffix, sizeof keep_suffix, "-of-%05d.safetensors", n_shards);
    for (struct dirent *e; (e = readdir(d));) {
        const char *nm = e->d_name;
        size_t len = strlen(nm), ls = strlen(keep_suffix);
        bool shard = !strncmp(nm, "model-", 6) && len > 16 && !strcmp(nm + len - 12, ".safetensors") && strstr(nm, "-of-");
        bool stale = shard ? !(sharded && len > ls && !strcmp(nm + len - ls, keep_suffix))
                           : sharded ? !strcmp(nm, SINGLE_NAME) : !strcmp(nm, INDEX_NAME);
        if (stale && !join(path, dir, nm)) unlink(path);
    }
    closedir(d);
}

kiln_status kiln_save_model_weights(const char *dir, const kiln_llama *m, const kiln_weights_options *o) {
    if (!dir || !m) return kiln_error(KILN_ERR_INVALID, "kiln_save_model_weights: NULL argument");
    kiln_weights_options opt = o ? *o : (kiln_weights_options){KILN_F32, KILN_DEFAULT_SHARD_BYTES};
    if (opt.dtype != KILN_F32 && opt.dtype != KILN_BF16 && opt.dtype != KILN_F16)
        return kiln_error(KILN_ERR_INVALID, "cannot save weights in %s", kiln_dtype_name(opt.dtype));
    if (!opt.shard_bytes) opt.shard_bytes = KILN_DEFAULT_SHARD_BYTES;
    for (int i = 0; i < m->n_params; i++)
        if (kiln_dtype_is_dequant(m->params[i]->dtype) && m->params[i]->dtype != KILN_F16)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s is held as %s, which safetensors cannot store: merge the adapters "
                              "(kiln export --merge-lora) or export GGUF", m->params[i]->name, kiln_dtype_name(m->params[i]->dtype));
    /* shards as the HF library cuts them: parameters in order, a new file
     * when the next one would pass the limit (one larger than the limit
     * gets a file of its own) */
    int *start = calloc((size_t)m->n_base + 2, sizeof *start), n_shards = 0;
    if (!start) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", dir);
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < m->n_base; i++) {
        uint64_t b = (uint64_t)kiln_tensor_numel(m->params[i]) * kiln_dtype_size(opt.dtype);
        if (i == 0 || (cur > 0 && cur + b > opt.shard_bytes)) {
            start[n_shards++] = i;
            cur = 0;
        }
        cur += b;
        total += b;
    }
    start[n_shards] = m->n_base;
    char path[PATH_CAP];
    kiln_status st = KILN_OK;
    if (n_shards <= 1) {
        if (!(st = join(path, dir, SINGLE_NAME))) st = save_file(path, m, opt.dtype, 0, m->n_base);
        if (!st) remove_stale(dir, 1, false);
        free(start);
        return st;
    }
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    if (!root || !meta || !map) st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", dir);
    for (int s = 0; s < n_shards && !st; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        if ((st = join(path, dir, name)) || (st = save_file(path, m, opt.dtype, start[s], start[s + 1]))) break;
        for (int i = start[s]; i < start[s + 1] && !st; i++)
            if (json_object_set_new(map, m->params[i]->name, json_string(name)))
                st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", dir);
    }
    if (!st && (json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) ||
                json_object_set(root, "metadata", meta) || json_object_set(root, "weight_map", map)))
        st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", dir);
    char *text = st ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!st && !text) st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", dir);
    if (!st) st = join(path, dir, INDEX_NAME);
    if (!st) st = kiln_write_file_atomic(path, text, strlen(text)); /* the index last: it names only written shards */
    if (!st) remove_stale(dir, n_shards, true);
    free(text);
    json_decref(meta);
    json_decref(map);
    json_decref(root);
    free(start);
    return st;
}

/* ---- generation_config.json, tokenizer_config.json ------------------------ */

/* Where a run's model came from: the data directory (its
 * chat_template.jinja: the template the shards were rendered with), the
 * --init model, the tokenizer's directory, the run's newest checkpoint (a
 * resumed run). */
static int meta_sources(const kiln_train_config *c, char src[4][PATH_CAP]) {
    int n = 0;
    if (c && c->data[0]) snprintf(src[n++], PATH_CAP, "%s", c->data);
    if (c && c->init[0] && !kiln_model_dir_resolve(c->init, src[n], PATH_CAP)) n++;
    if (c && c->tokenizer[0]) {
        snprintf(src[n], PATH_CAP, "%s", c->tokenizer);
        char *slash = strrchr(src[n], '/');
        if (slash) *slash = 0;
        else snprintf(src[n], PATH_CAP, ".");
        n++;
    }
    if (c && c->run_dir[0] && !kiln_checkpoint_latest(c->run_dir, src[n], PATH_CAP)) n++;
    return n;
}

static kiln_status write_known(const char *dir, const kiln_llama *m, const kiln_train_config *c) {
    kiln_model_meta meta = {.bos_id = (int32_t)m->cfg.bos_token_id, .pad_id = (int32_t)m->cfg.pad_token_id};
    if (m->cfg.eos_token_id >= 0) meta.eos_ids[meta.n_eos++] = (int32_t)m->cfg.eos_token_id;
    for (int i = 0; i < m->cfg.n_eos_more && meta.n_eos < KILN_MAX_EOS; i++) /* the rest of an eos_token_id list */
        meta.eos_ids[meta.n_eos++] = (int32_t)m->cfg.eos_more[i];
    kiln_tokenizer *tok = NULL;
    if (c && c->tokenizer[0] && is_file(c->tokenizer) && !kiln_tokenizer_open_any(c->tokenizer, &tok)) {
        int ids[3] = {kiln_tokenizer_bos(tok), kiln_tokenizer_eos(tok), kiln_tokenizer_pad(tok)};
        char **strs[3] = {&meta.bos_token, &meta.eos_token, &meta.pad_token};
        for (int k = 0; k < 3; k++) {
            size_t len = 0;
            const char *s = ids[k] >= 0 ? kiln_tokenizer_token(tok, ids[k], &len) : NULL;
            if (s) *strs[k] = strndup(s, len);
        }
        if (meta.bos_id < 0) meta.bos_id = ids[0];
        if (meta.n_eos == 0 && ids[1] >= 0) meta.eos_ids[meta.n_eos++] = ids[1];
        if (meta.pad_id < 0) meta.pad_id = ids[2];
        kiln_tokenizer_free(tok);
    }
    kiln_status st = kiln_model_meta_save(dir, &meta);
    kiln_model_meta_free(&meta);
    return st;
}

kiln_status kiln_model_files_save(const char *dir, const kiln_llama *m, const kiln_train_config *c) {
    if (!dir || !m) return kiln_error(KILN_ERR_INVALID, "kiln_model_files_save: NULL argument");
    /* the data directory may only give the chat template (it has no model) */
    static const char *const names[3] = {"generation_config.json", "tokenizer_config.json", "chat_template.jinja"};
    char src[4][PATH_CAP], path[PATH_CAP], dst[PATH_CAP];
    int n_src = meta_sources(c, src);
    /* what the model's config and the tokenizer say first; then any file a
     * source has replaces it verbatim (keeping fields kiln does not use) */
    kiln_status st = write_known(dir, m, c);
    bool data_first = c && c->data[0];
    for (int f = 0; f < 3 && !st; f++) {
        bool done = false;
        for (int i = data_first && f < 2 ? 1 : 0; i < n_src && !done && !st; i++) {
            if (join(path, src[i], names[f]) || !is_file(path)) continue;
            char *text = NULL;
            size_t len = 0;
            json_error_t je;
            json_t *o = NULL;
            if (!(st = kiln_read_file(path, &text, &len)) && f < 2 && !(o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je)))
                st = kiln_error(KILN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
            json_decref(o);
            if (!st && !(st = join(dst, dir, names[f]))) st = kiln_write_file_atomic(dst, text, len);
            free(text);
            done = true;
        }
    }
    return st;
}
