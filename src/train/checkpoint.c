/* Checkpoints: weights, optimiser state and trainer state in files Hugging
 * Face tools read (safetensors with HF names, config.json, JSON state), and
 * a directory protocol that survives a crash at any instant: everything is
 * written into checkpoint-<step>.tmp/, fsynced, and only then renamed to its
 * final name, so a directory without the .tmp suffix is always complete. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/safetensors.h"
#include "kiln/train.h"

#define PATH_CAP 4096
#define CKPT_PREFIX "checkpoint-"

/* ---- small helpers ---------------------------------------------------------- */

static kiln_status join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    return KILN_OK;
}

static const char *fmt_shape(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

static bool is_dir(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

static bool is_file(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

static kiln_status mkdir_p(const char *path) {
    char buf[PATH_CAP];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return kiln_error(KILN_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        if (!is_dir(buf)) return kiln_error(KILN_ERR_IO, "%s exists and is not a directory", buf);
        *p = c;
        if (!c) break;
    }
    return KILN_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

/* Removes a file or a directory tree; absent is fine. */
static kiln_status rm_rf(const char *path) {
    struct stat s;
    if (lstat(path, &s) != 0) return KILN_OK;
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return kiln_error(KILN_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return KILN_OK;
}

static kiln_status fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot open directory %s: %s", path, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) return kiln_error(KILN_ERR_IO, "cannot sync directory %s: %s", path, strerror(e));
    return KILN_OK;
}

static kiln_status copy_file(const char *src, const char *dst) {
    char *data = NULL;
    size_t n = 0;
    kiln_status st = kiln_read_file(src, &data, &n);
    if (!st) st = kiln_write_file_atomic(dst, data, n);
    free(data);
    return st;
}

/* Parses "checkpoint-<digits>" exactly; -1 for anything else (.tmp, .old). */
static int64_t ckpt_step(const char *name) {
    size_t lp = strlen(CKPT_PREFIX);
    if (strncmp(name, CKPT_PREFIX, lp) != 0) return -1;
    const char *d = name + lp;
    if (!*d || strlen(d) > 18) return -1;
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return -1;
        v = v * 10 + (*d - '0');
    }
    return v;
}

/* ---- tensors in, tensors out ------------------------------------------------ */

static kiln_st_tensor st_of(const kiln_tensor *t, const char *name) {
    kiln_st_tensor s = {.name = name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data,
                        .nbytes = kiln_tensor_nbytes(t)};
    memcpy(s.shape, t->shape, sizeof s.shape);
    return s;
}

/* Checks that file tensor `s` can fill `dst` (same shape; F32 or BF16). */
static kiln_status check_tensor(const char *path, const char *name, const kiln_st_tensor *s, const kiln_tensor *dst) {
    char a[128], b[128];
    bool same = s->ndim == dst->ndim;
    for (int i = 0; same && i < s->ndim; i++) same = s->shape[i] == dst->shape[i];
    if (!same)
        return kiln_error(KILN_ERR_SHAPE, "%s: tensor '%s' has shape %s but the model expects %s", path, name,
                          fmt_shape(s->ndim, s->shape, a, sizeof a), fmt_shape(dst->ndim, dst->shape, b, sizeof b));
    if (s->dtype != KILN_F32 && s->dtype != KILN_BF16)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' has dtype %s; expected F32 (or BF16)", path, name,
                          kiln_dtype_name(s->dtype));
    if (dst->dtype != KILN_F32)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': loading into a %s tensor is not supported", path,
                          name, kiln_dtype_name(dst->dtype));
    return KILN_OK;
}

static void fill_tensor(const kiln_st_tensor *s, kiln_tensor *dst) {
    int64_t n = kiln_tensor_numel(dst);
    if (s->dtype == KILN_F32) {
        if (n) memcpy(dst->data, s->data, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = s->data;
    float *d = kiln_f32(dst);
    for (int64_t i = 0; i < n; i++) d[i] = kiln_bf16_to_f32(h[i]);
}

/* ---- weights ---------------------------------------------------------------- */

kiln_status kiln_save_weights(const char *path, const kiln_llama *m) {
    if (!path || !m) return kiln_error(KILN_ERR_INVALID, "kiln_save_weights: NULL argument");
    kiln_st_tensor *ts = calloc((size_t)m->n_params, sizeof *ts);
    if (!ts) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    for (int i = 0; i < m->n_params; i++) ts[i] = st_of(m->params[i], m->params[i]->name);
    static const char *const meta[] = {"format", "pt", NULL};
    kiln_status st = kiln_st_save(path, ts, m->n_params, meta);
    free(ts);
    return st;
}

static bool is_param(const kiln_llama *m, const char *name) { return kiln_llama_param(m, name) != NULL; }

kiln_status kiln_load_weights(const char *path, kiln_llama *m) {
    if (!path || !m) return kiln_error(KILN_ERR_INVALID, "kiln_load_weights: NULL argument");
    kiln_st_file *f = NULL;
    kiln_status st = kiln_st_open(path, &f);
    if (st) return kiln_error_context(st, "loading weights");
    /* validate everything before touching the model: a refused file leaves it as it was */
    for (int i = 0; i < m->n_params && !st; i++) {
        const kiln_tensor *p = m->params[i];
        const kiln_st_tensor *s = kiln_st_find(f, p->name);
        char b[128];
        if (!s)
            st = kiln_error(KILN_ERR_FORMAT, "%s: missing tensor '%s' (the model expects shape %s)", path, p->name,
                            fmt_shape(p->ndim, p->shape, b, sizeof b));
        else
            st = check_tensor(path, p->name, s, p);
    }
    for (int i = 0; i < kiln_st_count(f) && !st; i++) {
        const char *name = kiln_st_at(f, i)->name;
        if (is_param(m, name)) continue;
        if (m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)
            kiln_log(KILN_LOG_WARN, "%s: ignoring 'lm_head.weight': the model ties it to model.embed_tokens.weight",
                     path);
        else
            st = kiln_error(KILN_ERR_FORMAT, "%s: unexpected tensor '%s' (not a parameter of this model)", path, name);
    }
    for (int i = 0; i < m->n_params && !st; i++) fill_tensor(kiln_st_find(f, m->params[i]->name), m->params[i]);
    kiln_st_close(f);
    return st;
}

kiln_status kiln_load_model_dir(const char *dir, kiln_llama **out) {
    if (!dir || !out) return kiln_error(KILN_ERR_INVALID, "kiln_load_model_dir: NULL argument");
    *out = NULL;
    char path[PATH_CAP];
    kiln_llama_config cfg;
    kiln_status st = join(path, dir, "config.json");
    if (!st) st = kiln_llama_config_load(path, &cfg);
    if (st) return st;
    kiln_llama *m = kiln_llama_new(&cfg, 0);
    if (!m) return kiln_error_context(kiln_last_status(), "model from %s", path);
    st = join(path, dir, "model.safetensors");
    if (!st) st = kiln_load_weights(path, m);
    if (st) {
        kiln_llama_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

/* ---- optimiser state -------------------------------------------------------- */

static char *state_name(const char *prefix, const char *param) {
    size_t n = strlen(prefix) + strlen(param) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s", prefix, param);
    return s;
}

kiln_status kiln_adamw_save(const char *path, const kiln_adamw *o) {
    if (!path || !o) return kiln_error(KILN_ERR_INVALID, "kiln_adamw_save: NULL argument");
    int n = 2 * o->n;
    kiln_st_tensor *ts = calloc((size_t)(n ? n : 1), sizeof *ts);
    char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    kiln_status st = ts && names ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    for (int i = 0; i < o->n && !st; i++) {
        if (!o->m[i] || !o->v[i]) {
            st = kiln_error(KILN_ERR_INVALID, "cannot save %s: no optimiser state for '%s'", path, o->params[i]->name);
            break;
        }
        names[2 * i] = state_name("exp_avg", o->params[i]->name);
        names[2 * i + 1] = state_name("exp_avg_sq", o->params[i]->name);
        if (!names[2 * i] || !names[2 * i + 1]) st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
        else {
            ts[2 * i] = st_of(o->m[i], names[2 * i]);
            ts[2 * i + 1] = st_of(o->v[i], names[2 * i + 1]);
        }
    }
    if (!st) {
        char step[32], b1[32], b2[32], eps[32], wd[32];
        snprintf(step, sizeof step, "%" PRId64, o->t);
        snprintf(b1, sizeof b1, "%.17g", o->beta1);
        snprintf(b2, sizeof b2, "%.17g", o->beta2);
        snprintf(eps, sizeof eps, "%.17g", o->eps);
        snprintf(wd, sizeof wd, "%.17g", o->weight_decay);
        const char *meta[] = {"step", step, "beta1", b1, "beta2", b2, "eps", eps, "weight_decay", wd,
                              "optimizer", "adamw", NULL};
        st = kiln_st_save(path, ts, n, meta);
    }
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(ts);
    return st;
}

static kiln_status meta_step(kiln_st_file *f, const char *path, int64_t *t) {
    const char *s = kiln_st_metadata(f, "step");
    if (!s) return kiln_error(KILN_ERR_FORMAT, "%s: metadata has no 'step'", path);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: metadata 'step' is not a step count: '%s'", path, s);
    *t = v;
    return KILN_OK;
}

static void warn_hyper(kiln_st_file *f, const char *path, const char *key, double now) {
    const char *s = kiln_st_metadata(f, key);
    if (s && strtod(s, NULL) != now)
        kiln_log(KILN_LOG_WARN, "%s: saved with %s=%s, continuing with %.17g", path, key, s, now);
}

/* Checks (fill=false) or copies (fill=true) the moments of every parameter. */
static kiln_status adamw_pass(kiln_st_file *f, const char *path, kiln_adamw *o, bool fill) {
    static const char *const prefix[2] = {"exp_avg", "exp_avg_sq"};
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k < 2; k++) {
            kiln_tensor *dst = k ? o->v[i] : o->m[i];
            char *name = state_name(prefix[k], o->params[i]->name);
            if (!name) return kiln_error(KILN_ERR_OOM, "out of memory loading %s", path);
            const kiln_st_tensor *s = kiln_st_find(f, name);
            kiln_status st = KILN_OK;
            if (!dst)
                st = kiln_error(KILN_ERR_INVALID, "loading %s: the optimiser has no state tensor for '%s'", path, name);
            else if (!s)
                st = kiln_error(KILN_ERR_FORMAT, "%s: missing tensor '%s'", path, name);
            else if (!fill)
                st = check_tensor(path, name, s, dst);
            else
                fill_tensor(s, dst);
            free(name);
            if (st) return st;
        }
    return KILN_OK;
}

kiln_status kiln_adamw_load(const char *path, kiln_adamw *o) {
    if (!path || !o) return kiln_error(KILN_ERR_INVALID, "kiln_adamw_load: NULL argument");
    kiln_st_file *f = NULL;
    kiln_status st = kiln_st_open(path, &f);
    if (st) return kiln_error_context(st, "loading optimiser state");
    int64_t t = 0;
    st = meta_step(f, path, &t);
    if (!st) st = adamw_pass(f, path, o, false);
    if (!st && kiln_st_count(f) != 2 * o->n) {
        /* every expected tensor is there, so the rest are extras; name one */
        for (int i = 0; i < kiln_st_count(f) && !st; i++) {
            const char *name = kiln_st_at(f, i)->name;
            const char *dot = strchr(name, '.');
            const char *pname = dot ? dot + 1 : "";
            bool known = false;
            for (int j = 0; j < o->n && !known; j++) known = strcmp(o->params[j]->name, pname) == 0;
            if (!known || !dot || (strncmp(name, "exp_avg.", 8) && strncmp(name, "exp_avg_sq.", 11)))
                st = kiln_error(KILN_ERR_FORMAT,
                                "%s: unexpected tensor '%s' (no trainable parameter of this model matches it)",
                                path, name);
        }
        if (!st) st = kiln_error(KILN_ERR_FORMAT, "%s: %d tensors, expected %d", path, kiln_st_count(f), 2 * o->n);
    }
    if (!st) {
        adamw_pass(f, path, o, true);
        o->t = t;
        warn_hyper(f, path, "beta1", o->beta1);
        warn_hyper(f, path, "beta2", o->beta2);
        warn_hyper(f, path, "eps", o->eps);
        warn_hyper(f, path, "weight_decay", o->weight_decay);
    }
    kiln_st_close(f);
    return st;
}

/* ---- trainer state ---------------------------------------------------------- */

#define INT_FIELDS(X)                                                                                            \
    X(step) X(total_steps) X(steps_per_epoch) X(micro_per_epoch) X(epoch) X(tokens_seen)
#define REAL_FIELDS(X) X(elapsed_s) X(last_loss) X(last_val_loss)

/* JSON has no NaN or infinity; they are stored as strings. */
static json_t *real_json(double v) {
    if (isnan(v)) return json_string("NaN");
    if (isinf(v)) return json_string(v > 0 ? "Infinity" : "-Infinity");
    return json_real(v);
}

kiln_status kiln_trainer_state_save(const char *path, const kiln_trainer_state *st) {
    if (!path || !st) return kiln_error(KILN_ERR_INVALID, "kiln_trainer_state_save: NULL argument");
    json_t *o = json_object();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    int bad = !o;
#define PUT_INT(f) bad |= o && json_object_set_new(o, #f, json_integer((json_int_t)st->f));
#define PUT_REAL(f) bad |= o && json_object_set_new(o, #f, real_json(st->f));
    INT_FIELDS(PUT_INT)
    REAL_FIELDS(PUT_REAL)
#undef PUT_INT
#undef PUT_REAL
    bad |= o && json_object_set_new(o, "seed", json_string(seed));
    char *text = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!text) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    kiln_status s = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

static kiln_status get_int(json_t *o, const char *path, const char *key, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!v) return kiln_error(KILN_ERR_FORMAT, "%s: missing key '%s'", path, key);
    if (!json_is_integer(v)) return kiln_error(KILN_ERR_FORMAT, "%s: '%s' must be an integer", path, key);
    *out = (int64_t)json_integer_value(v);
    return KILN_OK;
}

static kiln_status get_real(json_t *o, const char *path, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!v) return kiln_error(KILN_ERR_FORMAT, "%s: missing key '%s'", path, key);
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return KILN_OK;
    }
    const char *s = json_string_value(v);
    if (s && !strcmp(s, "NaN")) *out = NAN;
    else if (s && !strcmp(s, "Infinity")) *out = INFINITY;
    else if (s && !strcmp(s, "-Infinity")) *out = -INFINITY;
    else return kiln_error(KILN_ERR_FORMAT, "%s: '%s' must be a number", path, key);
    return KILN_OK;
}

static kiln_status get_seed(json_t *o, const char *path, uint64_t *out) {
    json_t *v = json_object_get(o, "seed");
    if (!v) return kiln_error(KILN_ERR_FORMAT, "%s: missing key 'seed'", path);
    if (json_is_integer(v) && json_integer_value(v) >= 0) { /* tolerated: hand-written files */
        *out = (uint64_t)json_integer_value(v);
        return KILN_OK;
    }
    const char *s = json_string_value(v);
    char *end = NULL;
    errno = 0;
    unsigned long long x = s && *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    if (!s || !end || *end || errno)
        return kiln_error(KILN_ERR_FORMAT, "%s: 'seed' must be a decimal string of an unsigned 64-bit integer", path);
    *out = x;
    return KILN_OK;
}

kiln_status kiln_trainer_state_load(const char *path, kiln_trainer_state *out) {
    if (!path || !out) return kiln_error(KILN_ERR_INVALID, "kiln_trainer_state_load: NULL argument");
    char *text = NULL;
    size_t n = 0;
    kiln_status st = kiln_read_file(path, &text, &n);
    if (st) return st;
    json_error_t je;
    json_t *o = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!o) return kiln_error(KILN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    kiln_trainer_state s;
    memset(&s, 0, sizeof s);
    if (!json_is_object(o)) st = kiln_error(KILN_ERR_FORMAT, "%s: expected a JSON object", path);
#define GET_INT(f) if (!st) st = get_int(o, path, #f, &s.f);
#define GET_REAL(f) if (!st) st = get_real(o, path, #f, &s.f);
    INT_FIELDS(GET_INT)
    REAL_FIELDS(GET_REAL)
#undef GET_INT
#undef GET_REAL
    if (!st) st = get_seed(o, path, &s.seed);
    json_decref(o);
    if (!st) *out = s;
    return st;
}

/* ---- checkpoint directories --------------------------------------------------- */

/* Writes every file of one checkpoint into `dir` (trainer_state.json last:
 * its presence marks a complete checkpoint) and syncs the directory. */
static kiln_status write_checkpoint_files(const char *dir, const kiln_llama *m, const kiln_adamw *opt,
                                          const kiln_trainer_state *ts, const kiln_train_config *c) {
    char path[PATH_CAP];
    kiln_status st = join(path, dir, "config.json");
    if (!st) st = kiln_llama_config_save(path, &m->cfg);
    if (!st) st = join(path, dir, "model.safetensors");
    if (!st) st = kiln_save_weights(path, m);
    if (!st && opt) {
        st = join(path, dir, "optimizer.safetensors");
        if (!st) st = kiln_adamw_save(path, opt);
    }
    if (!st && c) {
        char *json = kiln_train_config_to_json(c);
        st = join(path, dir, "train_config.json");
        if (!st && !json) st = kiln_error(KILN_ERR_OOM, "cannot serialise %s", path);
        if (!st) st = kiln_write_file_atomic(path, json, strlen(json));
        free(json);
    }
    if (!st && c && c->tokenizer[0]) {
        if (is_file(c->tokenizer)) {
            st = join(path, dir, "tokenizer.json");
            if (!st) st = copy_file(c->tokenizer, path);
        } else {
            kiln_log(KILN_LOG_WARN, "tokenizer %s not found; the checkpoint in %s has no tokenizer.json", c->tokenizer,
                     dir);
        }
    }
    if (!st) st = join(path, dir, "trainer_state.json");
    if (!st) st = kiln_trainer_state_save(path, ts);
    if (!st) st = fsync_dir(dir);
    return st;
}

/* Moves the complete `tmp` to `final`. An existing `final` (the same step
 * saved twice) is swapped out atomically where the kernel can, so a
 * complete checkpoint of this step exists at every instant. */
static kiln_status commit_dir(const char *tmp, const char *final) {
    struct stat s;
    if (lstat(final, &s) != 0) {
        if (rename(tmp, final) != 0)
            return kiln_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        return KILN_OK;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        rm_rf(tmp); /* now holds the old contents */
        return KILN_OK;
    }
    char old[PATH_CAP];
    if (snprintf(old, sizeof old, "%s.old.%ld", final, (long)getpid()) >= (int)sizeof old)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", final);
    rm_rf(old);
    if (rename(final, old) != 0)
        return kiln_error(KILN_ERR_IO, "cannot move %s aside: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        rename(old, final);
        return kiln_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(e));
    }
    rm_rf(old);
    return KILN_OK;
}

/* run_dir/<file> -> <ckpt>/<file>, replaced atomically (a link made at a
 * temp name and renamed over). A regular file of that name is left alone. */
static kiln_status update_link(const char *run_dir, const char *ckpt, const char *file) {
    char link[PATH_CAP], tmp[PATH_CAP], target[PATH_CAP], in_ckpt[PATH_CAP];
    kiln_status st = join(link, run_dir, file);
    if (!st) st = join(target, ckpt, file);
    if (!st) st = join(in_ckpt, run_dir, target);
    if (st) return st;
    struct stat s;
    bool present = lstat(link, &s) == 0;
    if (present && !S_ISLNK(s.st_mode)) {
        kiln_log(KILN_LOG_WARN, "%s is not a symlink; not pointing it at %s", link, target);
        return KILN_OK;
    }
    if (!is_file(in_ckpt)) { /* this checkpoint has none: drop a link to an older one */
        if (present && unlink(link) != 0)
            return kiln_error(KILN_ERR_IO, "cannot remove stale link %s: %s", link, strerror(errno));
        return KILN_OK;
    }
    if (snprintf(tmp, sizeof tmp, "%s/.%s.link.%ld", run_dir, file, (long)getpid()) >= (int)sizeof tmp)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", run_dir);
    unlink(tmp);
    if (symlink(target, tmp) != 0)
        return kiln_error(KILN_ERR_IO, "cannot create symlink %s: %s", tmp, strerror(errno));
    if (rename(tmp, link) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_error(KILN_ERR_IO, "cannot replace symlink %s: %s", link, strerror(e));
    }
    return KILN_OK;
}

typedef struct {
    int64_t step;
    char name[64];
} ckpt_entry;

static int cmp_entry(const void *a, const void *b) {
    int64_t x = ((const ckpt_entry *)a)->step, y = ((const ckpt_entry *)b)->step;
    return (x > y) - (x < y);
}

/* Complete checkpoints of run_dir sorted by step (malloc'd into *out). */
static kiln_status list_checkpoints(const char *run_dir, ckpt_entry **out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(run_dir);
    if (!d) return kiln_error(KILN_ERR_IO, "cannot read run directory %s: %s", run_dir, strerror(errno));
    ckpt_entry *list = NULL;
    int n = 0, cap = 0;
    kiln_status st = KILN_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        int64_t step = ckpt_step(e->d_name);
        char dir[PATH_CAP], state[PATH_CAP];
        if (step < 0 || strlen(e->d_name) >= sizeof list->name) continue;
        if (join(dir, run_dir, e->d_name) || join(state, dir, "trainer_state.json")) continue;
        if (!is_dir(dir) || !is_file(state)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_entry *grown = realloc(list, (size_t)cap * sizeof *list);
            if (!grown) {
                st = kiln_error(KILN_ERR_OOM, "out of memory listing %s", run_dir);
                break;
            }
            list = grown;
        }
        list[n].step = step;
        memcpy(list[n].name, e->d_name, strlen(e->d_name) + 1); /* length checked above */
        n++;
    }
    closedir(d);
    if (st) {
        free(list);
        return st;
    }
    if (n) qsort(list, (size_t)n, sizeof *list, cmp_entry);
    *out = list;
    *count = n;
    return KILN_OK;
}

kiln_status kiln_checkpoint_latest(const char *run_dir, char *out, size_t n) {
    if (!run_dir || !out || !n) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_latest: NULL argument");
    ckpt_entry *list = NULL;
    int count = 0;
    kiln_status st = list_checkpoints(run_dir, &list, &count);
    if (st) return st;
    if (!count) st = kiln_error(KILN_ERR_IO, "no complete checkpoint (checkpoint-*/trainer_state.json) in %s", run_dir);
    else if (snprintf(out, n, "%s/%s", run_dir, list[count - 1].name) >= (int)n)
        st = kiln_error(KILN_ERR_INVALID, "checkpoint path %s/%s does not fit the buffer", run_dir, list[count - 1].name);
    free(list);
    return st;
}

/* Deletes the oldest complete checkpoints beyond `keep`; never `newest`.
 * Failures only warn: the new checkpoint is already safe. */
static void rotate(const char *run_dir, const char *newest, int keep) {
    ckpt_entry *list = NULL;
    int count = 0;
    if (list_checkpoints(run_dir, &list, &count)) {
        kiln_log(KILN_LOG_WARN, "not rotating checkpoints: %s", kiln_last_error());
        return;
    }
    for (int i = 0; i < count - keep; i++) {
        char dir[PATH_CAP];
        if (!strcmp(list[i].name, newest) || join(dir, run_dir, list[i].name)) continue;
        if (rm_rf(dir)) kiln_log(KILN_LOG_WARN, "rotating checkpoints: %s", kiln_last_error());
    }
    free(list);
}

kiln_status kiln_checkpoint_save(const char *run_dir, const kiln_llama *m, const kiln_adamw *opt,
                                 const kiln_trainer_state *ts, const kiln_train_config *c, int keep) {
    if (!run_dir || !*run_dir || !m || !ts) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_save: NULL argument");
    if (ts->step < 0) return kiln_error(KILN_ERR_INVALID, "cannot save a checkpoint at step %lld", (long long)ts->step);
    char name[64], tmp_name[80], final[PATH_CAP], tmp[PATH_CAP];
    snprintf(name, sizeof name, CKPT_PREFIX "%08lld", (long long)ts->step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp", name);
    kiln_status st = mkdir_p(run_dir);
    if (!st) st = join(final, run_dir, name);
    if (!st) st = join(tmp, run_dir, tmp_name);
    if (!st) st = rm_rf(tmp); /* left by a crash */
    if (!st && mkdir(tmp, 0777) != 0) st = kiln_error(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    if (st) return kiln_error_context(st, "saving checkpoint %s", final);
    st = write_checkpoint_files(tmp, m, opt, ts, c);
    if (!st) st = commit_dir(tmp, final);
    if (st) {
        kiln_status keep_st = kiln_last_status();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        rm_rf(tmp);
        return kiln_error(keep_st ? keep_st : st, "saving checkpoint %s: %s", final, msg);
    }
    st = fsync_dir(run_dir);
    static const char *const links[] = {"model.safetensors", "config.json", "tokenizer.json", "trainer_state.json"};
    for (size_t i = 0; i < sizeof links / sizeof links[0] && !st; i++) st = update_link(run_dir, name, links[i]);
    if (!st) st = fsync_dir(run_dir);
    if (st) return kiln_error_context(st, "checkpoint %s was saved, but updating the links in %s failed", final, run_dir);
    if (keep > 0) rotate(run_dir, name, keep);
    return KILN_OK;
}
