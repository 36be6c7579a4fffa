/* Checkpoints: weights, optimiser state and trainer state in files Hugging
 * Face tools read (safetensors with HF names, config.json, JSON state), and
 * a directory protocol that survives a crash at any instant: everything is
 * written into checkpoint-<step>.tmp/, fsynced, and only then renamed to its
 * final name, so a directory without the .tmp suffix is always complete. */
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/safetensors.h"
#include "kiln/gguf.h"
#include "kiln/train.h"
#include "hostio.h"

#define PATH_CAP 4096
#define CKPT_PREFIX "checkpoint-"

/* ---- small helpers ---------------------------------------------------------- */

static kiln_status join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    return KILN_OK;
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

/* A file tensor of t's bytes in host memory (t's own where host-mappable,
 * else a copy into *owned, which the caller frees); bytes NULL on OOM. */
static kiln_st_tensor st_of(const kiln_tensor *t, const char *name, void **owned) {
    kiln_st_tensor s = {.name = name, .dtype = t->dtype, .ndim = t->ndim, .bytes = kiln_host_bytes(t, owned),
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
                          kiln_dims_str(s->ndim, s->shape, a, sizeof a), kiln_dims_str(dst->ndim, dst->shape, b, sizeof b));
    if (s->dtype != KILN_F32 && s->dtype != KILN_BF16)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor '%s' has dtype %s; expected F32 (or BF16)", path, name,
                          kiln_dtype_name(s->dtype));
    if (dst->dtype != KILN_F32)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': loading into a %s tensor is not supported", path,
                          name, kiln_dtype_name(dst->dtype));
    return KILN_OK;
}

static void bf16_to_f32_chunk(void *dst, int64_t first, int64_t n, const void *src) {
    const uint16_t *h = (const uint16_t *)src + first;
    float *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = kiln_bf16_to_f32(h[i]);
}

/* An F32 tensor (checked by check_tensor) from an F32 or BF16 file tensor. */
static kiln_status fill_tensor(const kiln_st_tensor *s, kiln_tensor *dst) {
    if (s->dtype == KILN_F32) return kiln_host_set_all(dst, s->bytes);
    return kiln_host_fill(dst, bf16_to_f32_chunk, s->bytes);
}

/* ---- optimiser state -------------------------------------------------------- */

static char *state_name(const char *prefix, const char *param) {
    size_t n = strlen(prefix) + strlen(param) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s", prefix, param);
    return s;
}

void kiln_adamw_meta(const kiln_adamw *o, char buf[5][32], const char **meta) {
    snprintf(buf[0], 32, "%" PRId64, o->t);
    snprintf(buf[1], 32, "%.17g", o->beta1);
    snprintf(buf[2], 32, "%.17g", o->beta2);
    snprintf(buf[3], 32, "%.17g", o->eps);
    snprintf(buf[4], 32, "%.17g", o->weight_decay);
    const char *kv[] = {"step", buf[0], "beta1", buf[1], "beta2", buf[2], "eps", buf[3], "weight_decay", buf[4],
                        "optimizer", "adamw", NULL};
    memcpy(meta, kv, sizeof kv);
}

kiln_status kiln_adamw_save(const char *path, const kiln_adamw *o) {
    if (!path || !o) return kiln_error(KILN_ERR_INVALID, "kiln_adamw_save: NULL argument");
    int n = 2 * o->n;
    kiln_st_tensor *ts = calloc((size_t)(n ? n : 1), sizeof *ts);
    char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    void **owned = calloc((size_t)(n ? n : 1), sizeof *owned); /* host copies of device moments */
    kiln_status st = ts && names && owned ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    for (int i = 0; i < o->n && !st; i++) {
        if (!o->m[i] || !o->v[i]) {
            st = kiln_error(KILN_ERR_INVALID, "cannot save %s: no optimiser state for '%s'", path, o->params[i]->name);
            break;
        }
        names[2 * i] = state_name("exp_avg", o->params[i]->name);
        names[2 * i + 1] = state_name("exp_avg_sq", o->params[i]->name);
        if (!names[2 * i] || !names[2 * i + 1]) st = kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
        else {
            ts[2 * i] = st_of(o->m[i], names[2 * i], &owned[2 * i]);
            ts[2 * i + 1] = st_of(o->v[i], names[2 * i + 1], &owned[2 * i + 1]);
            if (!ts[2 * i].bytes || !ts[2 * i + 1].bytes) st = kiln_error_context(kiln_last_status(), "saving %s", path);
        }
    }
    if (!st) {
        char buf[5][32];
        const char *meta[24];
        kiln_adamw_meta(o, buf, meta);
        st = kiln_st_save(path, ts, n, meta);
    }
    for (int i = 0; names && i < n; i++) free(names[i]);
    for (int i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(names);
    free(ts);
    return st;
}

static kiln_status meta_step(kiln_st_file *f, const char *path, int64_t *t) {
    const char *s = kiln_st_metadata(f, "step");
    if (!s) return kiln_error(KILN_ERR_FORMAT, "%s: metadata has no 'step'", path);
    if (kiln_parse_i64(s, 0, INT64_MAX, t))
        return kiln_error(KILN_ERR_FORMAT, "%s: metadata 'step' is not a step count: '%s'", path, s);
    return KILN_OK;
}

static void warn_hyper(kiln_st_file *f, const char *path, const char *key, double now) {
    const char *s = kiln_st_metadata(f, key);
    double was = 0;
    if (s && (kiln_parse_f64(s, -DBL_MAX, DBL_MAX, &was) || was != now))
        kiln_log(KILN_LOG_WARN, "%s: saved with %s=%s, continuing with %.17g", path, key, s, now);
}

void kiln_adamw_meta_check(kiln_st_file *f, const char *path, const kiln_adamw *o) {
    warn_hyper(f, path, "beta1", o->beta1);
    warn_hyper(f, path, "beta2", o->beta2);
    warn_hyper(f, path, "eps", o->eps);
    warn_hyper(f, path, "weight_decay", o->weight_decay);
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
                st = fill_tensor(s, dst);
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
    if (!st) st = adamw_pass(f, path, o, true);
    if (!st) {
        o->t = t;
        kiln_adamw_meta_check(f, path, o);
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

static json_t *state_json(const kiln_trainer_state *st) {
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
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static kiln_status save_json(const char *path, json_t *o) {
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    if (!text) return kiln_error(KILN_ERR_OOM, "out of memory saving %s", path);
    kiln_status s = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

kiln_status kiln_trainer_state_save(const char *path, const kiln_trainer_state *st) {
    if (!path || !st) return kiln_error(KILN_ERR_INVALID, "kiln_trainer_state_save: NULL argument");
    json_t *o = state_json(st);
    kiln_status s = save_json(path, o);
    json_decref(o);
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
    if (!s || kiln_parse_u64(s, out))
        return kiln_error(KILN_ERR_FORMAT, "%s: 'seed' must be a decimal string of an unsigned 64-bit integer", path);
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

/* trainer_state.json, written last, is the completeness marker. It lists
 * every other file of the checkpoint with its size ("checkpoint_files"), so
 * loading can tell a whole checkpoint from one that lost files (a deletion
 * cut short, a copy that stopped, a disk that filled). */
static kiln_status write_marker(const char *dir, const kiln_trainer_state *ts) {
    char path[PATH_CAP];
    kiln_status st = KILN_OK;
    json_t *o = state_json(ts), *files = json_object();
    DIR *d = opendir(dir);
    if (!o || !files) st = kiln_error(KILN_ERR_OOM, "out of memory saving %s/trainer_state.json", dir);
    else if (!d) st = kiln_error(KILN_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    for (struct dirent *e; !st && (e = readdir(d));) {
        struct stat sb;
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "trainer_state.json")) continue;
        if ((st = join(path, dir, e->d_name))) break;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (json_object_set_new(files, e->d_name, json_integer((json_int_t)sb.st_size)))
            st = kiln_error(KILN_ERR_OOM, "out of memory saving %s/trainer_state.json", dir);
    }
    if (d) closedir(d);
    if (!st && json_object_set(o, "checkpoint_files", files)) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = join(path, dir, "trainer_state.json");
    if (!st) st = save_json(path, o);
    json_decref(files);
    json_decref(o);
    return st;
}

/* Why `dir` is not a complete checkpoint (into why), or "" when it is: its
 * marker parses and every file the marker lists is there with its size.
 * A marker from before the manifest needs config.json and the weights. */
static bool ckpt_complete(const char *dir, char *why, size_t n) {
    char path[PATH_CAP];
    why[0] = 0;
    if (join(path, dir, "trainer_state.json") || !is_file(path)) {
        snprintf(why, n, "no trainer_state.json");
        return false;
    }
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        snprintf(why, n, "trainer_state.json is unreadable (%s)", o ? "not an object" : je.text);
        json_decref(o);
        return false;
    }
    json_t *files = json_object_get(o, "checkpoint_files");
    if (files) {
        const char *name;
        json_t *size;
        json_object_foreach(files, name, size) {
            struct stat sb;
            if (!json_is_integer(size) || strchr(name, '/') || !strcmp(name, "..") || join(path, dir, name)) {
                snprintf(why, n, "trainer_state.json lists '%.200s' oddly", name);
                break;
            }
            if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                snprintf(why, n, "%.200s is missing", name);
                break;
            }
            if ((json_int_t)sb.st_size != json_integer_value(size)) {
                snprintf(why, n, "%.200s has %lld bytes, %lld were written", name, (long long)sb.st_size,
                         (long long)json_integer_value(size));
                break;
            }
        }
    } else {
        char w[PATH_CAP];
        if (join(path, dir, "config.json") || !is_file(path)) snprintf(why, n, "config.json is missing");
        else if (join(path, dir, "model.safetensors") || join(w, dir, "model.safetensors.index.json") ||
                 (!is_file(path) && !is_file(w) && !kiln_base_ref_exists(dir)))
            snprintf(why, n, "model.safetensors is missing");
    }
    json_decref(o);
    return why[0] == 0;
}

/* Writes every file of one checkpoint into `dir` (the marker last) and syncs
 * the directory. */
static kiln_status write_checkpoint_files(const char *dir, const kiln_llama *m, const kiln_adamw *opt,
                                          const kiln_trainer_state *ts, const kiln_train_config *c) {
    char path[PATH_CAP];
    kiln_status st = join(path, dir, "config.json");
    if (!st) st = kiln_llama_config_save(path, &m->cfg);
    kiln_weights_options wo = {KILN_F32, KILN_DEFAULT_SHARD_BYTES};
    if (!st && c) st = kiln_weights_options_parse(c->save_dtype, c->shard_size, &wo);
    /* a base held as f16 or blocks is referenced, not copied (base_ref.c) */
    if (!st) st = kiln_base_is_held(m) ? kiln_base_ref_save(dir, m, c) : kiln_save_model_weights(dir, m, &wo);
    if (!st && m->lora_a) st = kiln_lora_save(dir, m, c ? (c->init[0] ? c->init : c->model) : "");
    if (!st && opt && !opt->zero) { /* a sharded optimiser's files are there already (kiln_zero_save) */
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
            if (!st && kiln_is_gguf_path(c->tokenizer)) { /* a GGUF's tokenizer, as the tokenizer.json it is */
                kiln_tokenizer *tk = NULL;
                st = kiln_tokenizer_open_any(c->tokenizer, &tk);
                if (!st) st = kiln_tokenizer_save(tk, path);
                kiln_tokenizer_free(tk);
            } else if (!st) {
                st = kiln_copy_file_atomic(c->tokenizer, path);
            }
        } else {
            kiln_log(KILN_LOG_WARN, "tokenizer %s not found; the checkpoint in %s has no tokenizer.json", c->tokenizer,
                     dir);
        }
    }
    if (!st) st = kiln_model_files_save(dir, m, c);
    if (!st) st = write_marker(dir, ts);
    if (!st) st = kiln_fsync_dir(dir);
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
        kiln_remove_tree(tmp); /* now holds the old contents */
        return KILN_OK;
    }
    char old[PATH_CAP];
    if (snprintf(old, sizeof old, "%s.old.%ld", final, (long)getpid()) >= (int)sizeof old)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", final);
    kiln_remove_tree(old);
    if (rename(final, old) != 0)
        return kiln_error(KILN_ERR_IO, "cannot move %s aside: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        rename(old, final);
        return kiln_error(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(e));
    }
    kiln_remove_tree(old);
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

static bool is_shard_name(const char *nm) {
    size_t len = strlen(nm);
    return !strncmp(nm, "model-", 6) && strstr(nm, "-of-") && len > 12 && !strcmp(nm + len - 12, ".safetensors");
}

/* run_dir/model-0000i-of-0000n.safetensors -> the new checkpoint's shards;
 * links to shards it does not have are dropped (update_link does both). */
static kiln_status link_shards(const char *run_dir, const char *ckpt) {
    char dirs[2][PATH_CAP]; /* the checkpoint's shards, then stale links in run_dir */
    kiln_status st = join(dirs[0], run_dir, ckpt);
    if (st) return st;
    snprintf(dirs[1], sizeof dirs[1], "%s", run_dir);
    for (int pass = 0; pass < 2 && !st; pass++) {
        DIR *d = opendir(dirs[pass]);
        if (!d) return kiln_error(KILN_ERR_IO, "cannot read %s: %s", dirs[pass], strerror(errno));
        for (struct dirent *e; !st && (e = readdir(d));)
            if (is_shard_name(e->d_name)) st = update_link(run_dir, ckpt, e->d_name);
        closedir(d);
    }
    return st;
}

typedef struct {
    int64_t step;
    bool complete;
    char name[64];
} ckpt_entry;

static int cmp_entry(const void *a, const void *b) {
    int64_t x = ((const ckpt_entry *)a)->step, y = ((const ckpt_entry *)b)->step;
    return (x > y) - (x < y);
}

/* Every checkpoint-<step> directory of run_dir sorted by step, each with
 * whether it is complete (malloc'd into *out). */
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
        char dir[PATH_CAP], why[256];
        if (step < 0 || strlen(e->d_name) >= sizeof list->name) continue;
        if (join(dir, run_dir, e->d_name) || !is_dir(dir)) continue;
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
        list[n].complete = ckpt_complete(dir, why, sizeof why);
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
    int i = count - 1;
    for (; i >= 0 && !list[i].complete; i--) { /* newer but incomplete: say why it is passed over */
        char dir[PATH_CAP], why[256];
        if (!join(dir, run_dir, list[i].name) && !ckpt_complete(dir, why, sizeof why))
            kiln_log(KILN_LOG_WARN, "%s is not a complete checkpoint (%s); using an older one", dir, why);
    }
    if (i < 0) st = kiln_error(KILN_ERR_IO, "no complete checkpoint (checkpoint-*/ with all its files) in %s", run_dir);
    else if (snprintf(out, n, "%s/%s", run_dir, list[i].name) >= (int)n)
        st = kiln_error(KILN_ERR_INVALID, "checkpoint path %s/%s does not fit the buffer", run_dir, list[i].name);
    free(list);
    return st;
}

kiln_status kiln_model_dir_resolve(const char *dir, char *out, size_t n) {
    if (!dir || !out || !n) return kiln_error(KILN_ERR_INVALID, "kiln_model_dir_resolve: NULL argument");
    if (kiln_is_gguf_path(dir)) { /* one file holds the model */
        struct stat gs;
        if (stat(dir, &gs)) return kiln_error(KILN_ERR_IO, "%s: %s", dir, strerror(errno));
        if (!S_ISREG(gs.st_mode)) return kiln_error(KILN_ERR_INVALID, "%s is not a regular file", dir);
        if (snprintf(out, n, "%s", dir) >= (int)n) return kiln_error(KILN_ERR_INVALID, "path too long: %s", dir);
        return KILN_OK;
    }
    ckpt_entry *list = NULL;
    int count = 0;
    kiln_status st = list_checkpoints(dir, &list, &count);
    free(list);
    if (st) return st;
    char marker[PATH_CAP], why[256];
    struct stat sb;
    bool has_marker = !join(marker, dir, "trainer_state.json") && lstat(marker, &sb) == 0;
    /* a run dir: checkpoints, or the link to the newest one */
    if (count > 0 || (has_marker && S_ISLNK(sb.st_mode))) return kiln_checkpoint_latest(dir, out, n);
    /* one checkpoint directory itself: only when it is whole */
    if (has_marker && !ckpt_complete(dir, why, sizeof why))
        return kiln_error(KILN_ERR_FORMAT, "%s is not a complete checkpoint: %s", dir, why);
    if (snprintf(out, n, "%s", dir) >= (int)n) return kiln_error(KILN_ERR_INVALID, "path too long: %s", dir);
    return KILN_OK;
}

/* pid named in a temporary's name is running (so its file is in use) */
static bool pid_alive(const char *digits) {
    int64_t pid = 0;
    if (kiln_parse_leading_i64(digits, 1, INT32_MAX, &pid)) return false;
    if (pid == (long)getpid()) return false; /* ours: nothing of ours is in flight between saves */
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* "<prefix><pid>[.<rest>]" with a run-time pid: where the pid starts, or NULL */
static const char *after(const char *name, const char *prefix) {
    const char *p = strstr(name, prefix);
    if (!p) return NULL;
    p += strlen(prefix);
    return *p >= '0' && *p <= '9' ? p : NULL;
}

/* Removes what an interrupted save can leave in run_dir: half-written
 * checkpoint-<step>.tmp/ directories, directories a rotation or a re-save
 * moved aside (.checkpoint-<step>.del.<pid>, checkpoint-<step>.old.<pid>),
 * link temporaries (.config.json.link.<pid>, ...) and file temporaries
 * (<name>.tmp.<pid>...). Ones whose process is still running are left. */
kiln_status kiln_checkpoint_clean(const char *run_dir) {
    if (!run_dir) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_clean: NULL argument");
    DIR *d = opendir(run_dir);
    if (!d) return errno == ENOENT ? KILN_OK : kiln_error(KILN_ERR_IO, "cannot read run directory %s: %s", run_dir, strerror(errno));
    kiln_status st = KILN_OK;
    size_t lp = strlen(CKPT_PREFIX);
    for (struct dirent *e; (e = readdir(d));) {
        const char *nm = e->d_name, *pid;
        char path[PATH_CAP];
        struct stat sb;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || join(path, run_dir, nm) || lstat(path, &sb) != 0) continue;
        bool ckpt = !strncmp(nm, CKPT_PREFIX, lp), hidden_ckpt = nm[0] == '.' && !strncmp(nm + 1, CKPT_PREFIX, lp);
        size_t len = strlen(nm);
        bool stray = false;
        if (ckpt && len > 4 && !strcmp(nm + len - 4, ".tmp") && S_ISDIR(sb.st_mode)) stray = true;
        else if (ckpt && (pid = after(nm, ".old.")) && S_ISDIR(sb.st_mode)) stray = !pid_alive(pid);
        else if (hidden_ckpt && (pid = after(nm, ".del.")) && S_ISDIR(sb.st_mode)) stray = !pid_alive(pid);
        else if (nm[0] == '.' && (pid = after(nm, ".link.")) && S_ISLNK(sb.st_mode)) stray = !pid_alive(pid);
        else if ((pid = after(nm, ".tmp.")) && S_ISREG(sb.st_mode)) stray = !pid_alive(pid);
        if (!stray) continue;
        kiln_log(KILN_LOG_INFO, "removing %s, left by an interrupted save", path);
        kiln_status r = kiln_remove_tree(path);
        if (r && !st) st = r;
    }
    closedir(d);
    return st;
}

/* Deletes a checkpoint so that no instant shows it as complete but partial:
 * the directory is first renamed to a name no listing matches, the rename
 * made durable, then the tree removed (a kill in between leaves only a
 * .checkpoint-<step>.del.<pid> that the next save cleans). */
static kiln_status remove_checkpoint(const char *run_dir, const char *name) {
    char dir[PATH_CAP], gone[PATH_CAP], hidden[128];
    snprintf(hidden, sizeof hidden, ".%s.del.%ld", name, (long)getpid());
    kiln_status st = join(dir, run_dir, name);
    if (!st) st = join(gone, run_dir, hidden);
    if (st) return st;
    kiln_remove_tree(gone);
    if (rename(dir, gone) != 0) return kiln_error(KILN_ERR_IO, "cannot move %s aside: %s", dir, strerror(errno));
    if ((st = kiln_fsync_dir(run_dir))) return st;
    return kiln_remove_tree(gone);
}

/* Deletes the oldest complete checkpoints beyond `keep`, and incomplete
 * ones older than the newest; never `newest`. Failures only warn: the new
 * checkpoint is already safe. */
static void rotate(const char *run_dir, const char *newest, int keep) {
    ckpt_entry *list = NULL;
    int count = 0;
    if (list_checkpoints(run_dir, &list, &count)) {
        kiln_log(KILN_LOG_WARN, "not rotating checkpoints: %s", kiln_last_error());
        return;
    }
    int complete = 0;
    for (int i = 0; i < count; i++) complete += list[i].complete;
    int64_t newest_step = ckpt_step(newest);
    for (int i = 0; i < count; i++) {
        if (!strcmp(list[i].name, newest)) continue;
        bool drop = list[i].complete ? complete > keep : list[i].step < newest_step;
        if (!drop) continue;
        if (list[i].complete) complete--;
        if (remove_checkpoint(run_dir, list[i].name))
            kiln_log(KILN_LOG_WARN, "rotating checkpoints: %s", kiln_last_error());
    }
    free(list);
}

kiln_status kiln_checkpoint_tmp(const char *run_dir, int64_t step, char *out, size_t n) {
    char name[80];
    snprintf(name, sizeof name, CKPT_PREFIX "%08lld.tmp", (long long)step);
    if (!run_dir || !*run_dir || step < 0) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_tmp: no run directory or step");
    if ((size_t)snprintf(out, n, "%s/%s", run_dir, name) >= n) return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", run_dir, name);
    return KILN_OK;
}

kiln_status kiln_checkpoint_begin(const char *run_dir, int64_t step) {
    if (!run_dir || !*run_dir) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_begin: NULL argument");
    if (step < 0) return kiln_error(KILN_ERR_INVALID, "cannot save a checkpoint at step %lld", (long long)step);
    char tmp[PATH_CAP];
    kiln_status st = mkdir_p(run_dir);
    if (!st && kiln_checkpoint_clean(run_dir))
        kiln_log(KILN_LOG_WARN, "cleaning %s: %s", run_dir, kiln_last_error()); /* not fatal: the save goes on */
    if (!st) st = kiln_checkpoint_tmp(run_dir, step, tmp, sizeof tmp);
    if (!st) st = kiln_remove_tree(tmp); /* left by a crash (if cleaning it above failed) */
    if (!st && mkdir(tmp, 0777) != 0) st = kiln_error(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    return st ? kiln_error_context(st, "saving the checkpoint of step %lld in %s", (long long)step, run_dir) : KILN_OK;
}

kiln_status kiln_checkpoint_finish(const char *run_dir, const kiln_llama *m, const kiln_adamw *opt,
                                   const kiln_trainer_state *ts, const kiln_train_config *c, int keep) {
    if (!run_dir || !*run_dir || !m || !ts) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_finish: NULL argument");
    char name[64], final[PATH_CAP], tmp[PATH_CAP];
    snprintf(name, sizeof name, CKPT_PREFIX "%08lld", (long long)ts->step);
    kiln_status st = join(final, run_dir, name);
    if (!st) st = kiln_checkpoint_tmp(run_dir, ts->step, tmp, sizeof tmp);
    if (st) return kiln_error_context(st, "saving checkpoint %s", final);
    st = write_checkpoint_files(tmp, m, opt, ts, c);
    if (!st) st = commit_dir(tmp, final);
    if (st) {
        kiln_status keep_st = kiln_last_status();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        kiln_remove_tree(tmp);
        return kiln_error(keep_st ? keep_st : st, "saving checkpoint %s: %s", final, msg);
    }
    st = kiln_fsync_dir(run_dir);
    static const char *const links[] = {"model.safetensors", "model.safetensors.index.json", "config.json",
                                        "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                        "trainer_state.json", "adapter_config.json",
                                        "adapter_model.safetensors", "chat_template.jinja", "base.json"};
    for (size_t i = 0; i < sizeof links / sizeof links[0] && !st; i++) st = update_link(run_dir, name, links[i]);
    if (!st) st = link_shards(run_dir, name);
    if (!st) st = kiln_fsync_dir(run_dir);
    if (st) return kiln_error_context(st, "checkpoint %s was saved, but updating the links in %s failed", final, run_dir);
    if (keep > 0) rotate(run_dir, name, keep);
    return KILN_OK;
}

kiln_status kiln_checkpoint_save(const char *run_dir, const kiln_llama *m, const kiln_adamw *opt,
                                 const kiln_trainer_state *ts, const kiln_train_config *c, int keep) {
    if (!run_dir || !*run_dir || !m || !ts) return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_save: NULL argument");
    if (opt && opt->zero)
        return kiln_error(KILN_ERR_INVALID, "kiln_checkpoint_save: a sharded optimiser is saved by every rank (the trainer's save)");
    kiln_status st = kiln_checkpoint_begin(run_dir, ts->step);
    return st ? st : kiln_checkpoint_finish(run_dir, m, opt, ts, c, keep);
}
