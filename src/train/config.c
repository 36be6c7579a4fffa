/* The run's settings <-> train_config.json, table-driven so the JSON keys,
 * the defaults and the validation stay in one place. */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/train.h"

typedef enum { F_STR, F_INT, F_I64, F_DBL, F_BOOL, F_U64, F_PACK, F_NORM, F_NAN } ftype;
typedef struct {
    const char *key;
    ftype type;
    size_t off, size;
} field;

#define FLD(k, t) {#k, t, offsetof(kiln_train_config, k), sizeof(((kiln_train_config *)0)->k)}
static const field fields[] = {
    FLD(data, F_STR),         FLD(run_dir, F_STR),      FLD(model, F_STR),       FLD(tokenizer, F_STR),
    FLD(init, F_STR),         FLD(freeze, F_STR),       FLD(batch, F_INT),       FLD(accum, F_INT),
    FLD(seq_len, F_INT),      FLD(pack, F_PACK),        FLD(shuffle, F_BOOL),    FLD(loss_norm, F_NORM),
    FLD(lr, F_DBL),           FLD(min_lr, F_DBL),       FLD(beta1, F_DBL),       FLD(beta2, F_DBL),
    FLD(eps, F_DBL),          FLD(weight_decay, F_DBL), FLD(clip, F_DBL),        FLD(decay_embeddings, F_BOOL),
    FLD(warmup, F_I64),       FLD(steps, F_I64),        FLD(epochs, F_I64),      FLD(eval_every, F_I64),
    FLD(eval_batches, F_I64), FLD(save_every, F_I64),   FLD(log_every, F_I64),   FLD(keep, F_INT),
    FLD(on_nan, F_NAN),       FLD(seed, F_U64),         FLD(compile, F_STR),     FLD(precision, F_STR),
    FLD(recompute, F_STR),    FLD(compile_dynamic, F_BOOL),
    FLD(global_batch, F_INT), FLD(micro_batch, F_STR),  FLD(mem_budget, F_STR),
    FLD(save_dtype, F_STR),   FLD(shard_size, F_STR),
};
#define NF (sizeof fields / sizeof fields[0])

static const char *const pack_names[] = {"packed", "padded"};
static const char *const norm_names[] = {"tokens", "steps"};
static const char *const nan_names[] = {"skip", "stop"};

void kiln_train_config_default(kiln_train_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->data, sizeof c->data, "data/kjv");
    snprintf(c->run_dir, sizeof c->run_dir, "runs/demo");
    snprintf(c->model, sizeof c->model, "demo");
    c->batch = 8;
    c->accum = 4;
    c->seq_len = 128;
    c->pack = KILN_PACK_PACKED;
    c->shuffle = true;
    c->loss_norm = KILN_LOSS_NORM_TOKENS;
    c->lr = 1e-3;
    c->min_lr = 1e-4;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0.1;
    c->clip = 1.0;
    c->warmup = 20;
    c->epochs = 1;
    c->eval_every = 50;
    c->eval_batches = 20;
    c->save_every = 100;
    c->log_every = 10;
    c->keep = 3;
    c->on_nan = KILN_ON_NAN_SKIP;
    c->seed = 1234;
    snprintf(c->compile, sizeof c->compile, "off");
    snprintf(c->precision, sizeof c->precision, "fp32");
    snprintf(c->recompute, sizeof c->recompute, "none");
    snprintf(c->save_dtype, sizeof c->save_dtype, "fp32");
    snprintf(c->shard_size, sizeof c->shard_size, "5GB");
}

kiln_status kiln_train_config_validate(const kiln_train_config *c) {
#define NEED(cond, ...) \
    if (!(cond)) return kiln_error(KILN_ERR_INVALID, __VA_ARGS__)
    NEED(c->batch >= 1, "batch must be >= 1, got %d", c->batch);
    NEED(c->accum >= 1, "accum must be >= 1, got %d", c->accum);
    NEED(c->seq_len >= 2, "seq_len must be >= 2, got %d", c->seq_len);
    NEED(isfinite(c->lr) && c->lr > 0, "lr must be > 0, got %g", c->lr);
    NEED(isfinite(c->min_lr) && c->min_lr >= 0 && c->min_lr <= c->lr, "min_lr must be in [0, lr], got %g", c->min_lr);
    NEED(c->beta1 >= 0 && c->beta1 < 1, "beta1 must be in [0, 1), got %g", c->beta1);
    NEED(c->beta2 >= 0 && c->beta2 < 1, "beta2 must be in [0, 1), got %g", c->beta2);
    NEED(c->eps > 0, "eps must be > 0, got %g", c->eps);
    NEED(c->weight_decay >= 0 && isfinite(c->weight_decay), "weight_decay must be >= 0, got %g", c->weight_decay);
    NEED(c->clip >= 0 && isfinite(c->clip), "clip must be >= 0 (0 = off), got %g", c->clip);
    NEED(c->warmup >= 0, "warmup must be >= 0");
    NEED(c->steps >= 0, "steps must be >= 0 (0 = from epochs)");
    NEED(c->epochs >= 1, "epochs must be >= 1, got %lld", (long long)c->epochs);
    NEED(c->eval_every >= 0 && c->save_every >= 0 && c->log_every >= 0 && c->eval_batches >= 0,
         "eval_every, eval_batches, save_every and log_every must be >= 0");
    NEED(c->keep >= 0, "keep must be >= 0 (0 = keep all)");
    NEED(c->pack == KILN_PACK_PACKED || c->pack == KILN_PACK_PADDED, "pack must be packed or padded");
    NEED(c->data[0], "data must name a directory with train.bin");
    NEED(c->run_dir[0], "run_dir must be set");
    kiln_compile_options co;
    if (kiln_train_compile_options(c, &co)) return KILN_ERR_INVALID;
    if (kiln_train_check_batch_settings(c)) return KILN_ERR_INVALID; /* precision, global/micro batch, budget */
    kiln_weights_options wo;
    if (kiln_weights_options_parse(c->save_dtype, c->shard_size, &wo)) return KILN_ERR_INVALID;
#undef NEED
    return KILN_OK;
}

static kiln_status set_enum(const char *src, const field *f, json_t *v, const char *const *names, int n, int *out) {
    if (json_is_string(v))
        for (int i = 0; i < n; i++)
            if (!strcmp(json_string_value(v), names[i])) {
                *out = i;
                return KILN_OK;
            }
    return kiln_error(KILN_ERR_INVALID, "%s: %s must be \"%s\" or \"%s\"", src, f->key, names[0], names[1]);
}

static kiln_status set_field(const char *src, const field *f, json_t *v, kiln_train_config *c) {
    char *p = (char *)c + f->off;
    switch (f->type) {
    case F_STR:
        if (!json_is_string(v) || strlen(json_string_value(v)) >= f->size)
            return kiln_error(KILN_ERR_INVALID, "%s: %s must be a string shorter than %zu", src, f->key, f->size);
        memcpy(p, json_string_value(v), strlen(json_string_value(v)) + 1);
        return KILN_OK;
    case F_INT:
    case F_I64:
        if (!json_is_integer(v)) return kiln_error(KILN_ERR_INVALID, "%s: %s must be an integer", src, f->key);
        if (f->type == F_INT) {
            json_int_t x = json_integer_value(v);
            if (x < -2147483647 || x > 2147483647) return kiln_error(KILN_ERR_INVALID, "%s: %s is out of range", src, f->key);
            *(int *)p = (int)x;
        } else {
            *(int64_t *)p = json_integer_value(v);
        }
        return KILN_OK;
    case F_U64: /* written as a string of digits: JSON integers stop at 2^63 */
        if (json_is_integer(v) && json_integer_value(v) >= 0) *(uint64_t *)p = (uint64_t)json_integer_value(v);
        else if (json_is_string(v) && kiln_parse_u64(json_string_value(v), (uint64_t *)p))
            return kiln_error_context(KILN_ERR_INVALID, "%s: %s", src, f->key);
        else if (!json_is_string(v)) return kiln_error(KILN_ERR_INVALID, "%s: %s must be a non-negative integer", src, f->key);
        return KILN_OK;
    case F_DBL:
        if (!json_is_number(v)) return kiln_error(KILN_ERR_INVALID, "%s: %s must be a number", src, f->key);
        *(double *)p = json_number_value(v);
        return KILN_OK;
    case F_BOOL:
        if (!json_is_boolean(v)) return kiln_error(KILN_ERR_INVALID, "%s: %s must be true or false", src, f->key);
        *(bool *)p = json_is_true(v);
        return KILN_OK;
    case F_PACK: return set_enum(src, f, v, pack_names, 2, (int *)p);
    case F_NORM: return set_enum(src, f, v, norm_names, 2, (int *)p);
    case F_NAN: return set_enum(src, f, v, nan_names, 2, (int *)p);
    }
    return KILN_ERR_INVALID;
}

kiln_status kiln_train_config_parse(const char *text, const char *src, kiln_train_config *c) {
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", src, err.line, err.column, err.text);
    kiln_status st = KILN_OK;
    if (!json_is_object(root)) st = kiln_error(KILN_ERR_FORMAT, "%s: top level must be a JSON object", src);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (st) break;
        size_t i = 0;
        while (i < NF && strcmp(fields[i].key, key)) i++;
        if (i == NF) {
            st = kiln_error(KILN_ERR_INVALID, "%s: unknown setting \"%s\"", src, key);
            break;
        }
        st = set_field(src, &fields[i], v, c);
    }
    json_decref(root);
    return st;
}

char *kiln_train_config_to_json(const kiln_train_config *c) {
    json_t *o = json_object();
    for (size_t i = 0; i < NF; i++) {
        const field *f = &fields[i];
        const char *p = (const char *)c + f->off;
        json_t *v = NULL;
        switch (f->type) {
        case F_STR: v = json_string(p); break;
        case F_INT: v = json_integer(*(const int *)p); break;
        case F_I64: v = json_integer(*(const int64_t *)p); break;
        case F_U64: {
            char b[32];
            snprintf(b, sizeof b, "%llu", (unsigned long long)*(const uint64_t *)p);
            v = json_string(b);
            break;
        }
        case F_DBL: v = json_real(*(const double *)p); break;
        case F_BOOL: v = json_boolean(*(const bool *)p); break;
        case F_PACK: v = json_string(pack_names[*(const int *)p & 1]); break;
        case F_NORM: v = json_string(norm_names[*(const int *)p & 1]); break;
        case F_NAN: v = json_string(nan_names[*(const int *)p & 1]); break;
        }
        json_object_set_new(o, f->key, v);
    }
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

kiln_status kiln_train_compile_options(const kiln_train_config *c, kiln_compile_options *co) {
    kiln_compile_options_default(co);
    if (kiln_compile_mode_parse(c->compile, co)) return kiln_error_context(KILN_ERR_INVALID, "compile");
    if (kiln_recompute_parse(c->recompute[0] ? c->recompute : "none", co))
        return kiln_error_context(KILN_ERR_INVALID, "recompute");
    co->dynamic = c->compile_dynamic;
    if (co->recompute && co->mode == KILN_COMPILE_OFF)
        return kiln_error(KILN_ERR_INVALID, "recompute: --recompute %s needs --compile (it is a compiler pass)", c->recompute);
    return KILN_OK;
}
