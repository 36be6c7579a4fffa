/* The run's settings: the KILN_TRAIN_SETTINGS table (kiln/train.h) as data,
 * the defaults, train_config.json both ways and validation, all from the
 * one table so a flag, a JSON key and a default cannot drift apart. Flags
 * and JSON string values go through the same kiln_setting_parse (the core
 * number parser underneath). */
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/train.h"

/* The names of each ENUM setting (choices_<LIMIT>); first name of a value
 * is the one written, later ones are older or alternative spellings that
 * saved files may hold. */
static const kiln_choice choices_pack[] = {
    {"packed", KILN_PACK_PACKED}, {"padded", KILN_PACK_PADDED}, {"documents", KILN_PACK_DOCUMENTS}, {"pairs", KILN_PACK_PAIRS}, {NULL, 0}};
static const kiln_choice choices_objective[] = {
    {"ce", KILN_OBJECTIVE_CE}, {"dpo", KILN_OBJECTIVE_DPO}, {"simpo", KILN_OBJECTIVE_SIMPO}, {"orpo", KILN_OBJECTIVE_ORPO}, {NULL, 0}};
static const kiln_choice choices_dpo_ref[] = {
    {"auto", KILN_DPO_REF_AUTO}, {"adapters", KILN_DPO_REF_ADAPTERS}, {"file", KILN_DPO_REF_FILE}, {NULL, 0}};
static const kiln_choice choices_dpo_loss[] = {
    {"sigmoid", KILN_DPO_SIGMOID}, {"ipo", KILN_DPO_IPO}, {"hinge", KILN_DPO_HINGE}, {NULL, 0}};
static const kiln_choice choices_loss_norm[] = {{"tokens", KILN_LOSS_NORM_TOKENS}, {"steps", KILN_LOSS_NORM_STEPS}, {NULL, 0}};
static const kiln_choice choices_on_nan[] = {{"skip", KILN_ON_NAN_SKIP}, {"stop", KILN_ON_NAN_STOP}, {NULL, 0}};
static const kiln_choice choices_shard[] = {
    {"off", KILN_SHARD_OFF}, {"optimizer", KILN_SHARD_OPTIMIZER}, {"gradients", KILN_SHARD_GRADIENTS}, {NULL, 0}};
#define CHOICE_MODE(id, name, ...) {name, KILN_RUN_##id},
#define CHOICE_ALIAS(id, name) {name, KILN_RUN_##id},
static const kiln_choice choices_compile[] = {
    KILN_COMPILE_MODES(CHOICE_MODE) KILN_COMPILE_MODE_ALIASES(CHOICE_ALIAS){NULL, 0}};
static const kiln_choice choices_precision[] = {{"fp32", KILN_F32},    {"bf16", KILN_BF16},     {"f32", KILN_F32},
                                                {"float32", KILN_F32}, {"bfloat16", KILN_BF16}, {NULL, 0}};
static const kiln_choice choices_base_dtype[] = {
    {"auto", KILN_BASE_DTYPE_AUTO}, {"fp32", KILN_F32}, {"bf16", KILN_BF16}, {"f16", KILN_F16},   {"q8_0", KILN_Q8_0},
    {"q4_0", KILN_Q4_0},            {"q4_k", KILN_Q4_K}, {"q5_k", KILN_Q5_K}, {"q6_k", KILN_Q6_K}, {"q4_1", KILN_Q4_1},
    {"q5_0", KILN_Q5_0},            {"q5_1", KILN_Q5_1}, {"f32", KILN_F32},
    {"float32", KILN_F32},          {"bfloat16", KILN_BF16}, {NULL, 0}};
#define CHOICE_DEVICE(id, name) {name, KILN_DEVICE_##id},
static const kiln_choice choices_device[] = {KILN_BACKENDS(CHOICE_DEVICE){NULL, 0}};
#define CHOICE_RECOMPUTE(id, name) {name, KILN_RECOMPUTE_##id},
static const kiln_choice choices_recompute[] = {KILN_RECOMPUTE_MODES(CHOICE_RECOMPUTE){NULL, 0}};
static const kiln_choice choices_bool[] = {{"true", 1}, {"false", 0}, {NULL, 0}};

#define LIMIT_STR(l) .limit = (l)
#define LIMIT_INT(l) .limit = (l)
#define LIMIT_I64(l) .limit = (l)
#define LIMIT_U64(l) .limit = (l)
#define LIMIT_F64(l) .limit = KILN_SETTING_##l
#define LIMIT_FLAG(l) .limit = (l)
#define LIMIT_ENUM(l) .choices = choices_##l
#define LIMIT_SIZE(l) .limit = (l)
#define LIMIT_AUTO(l) .limit = (l)
#define ROW(key_, kd, lim, def, arg_, help_)                                                                             \
    {.key = #key_, .kind = KILN_SETTING_##kd, .offset = offsetof(kiln_train_config, key_),                                \
     .size = sizeof(((kiln_train_config *)0)->key_), LIMIT_##kd(lim), .arg = arg_, .help = help_},
const kiln_setting kiln_train_settings[] = {KILN_TRAIN_SETTINGS(ROW)};
const int kiln_train_n_settings = (int)(sizeof kiln_train_settings / sizeof kiln_train_settings[0]);

#define DEFAULT_STR(key, def) snprintf(c->key, sizeof c->key, "%s", def);
#define DEFAULT_INT(key, def) c->key = (def);
#define DEFAULT_I64(key, def) c->key = (def);
#define DEFAULT_U64(key, def) c->key = (def);
#define DEFAULT_F64(key, def) c->key = (def);
#define DEFAULT_FLAG(key, def) c->key = (def);
#define DEFAULT_ENUM(key, def) c->key = (def);
#define DEFAULT_SIZE(key, def) c->key = (def);
#define DEFAULT_AUTO(key, def) c->key = (def);
#define DEFAULT(key, kd, lim, def, arg, help) DEFAULT_##kd(key, def)

void kiln_train_config_default(kiln_train_config *c) {
    memset(c, 0, sizeof *c);
    KILN_TRAIN_SETTINGS(DEFAULT)
}

const kiln_setting *kiln_setting_find(const char *key) {
    for (int i = 0; i < kiln_train_n_settings; i++)
        if (!strcmp(kiln_train_settings[i].key, key)) return &kiln_train_settings[i];
    return NULL;
}

#define AT(c, s, T) ((T *)((char *)(c) + (s)->offset))
#define CAT(c, s, T) ((const T *)((const char *)(c) + (s)->offset))

static const char *f64_expect(const kiln_setting *s) {
    switch (s->limit) {
    case KILN_SETTING_POS: return "a number > 0";
    case KILN_SETTING_NONNEG: return "a number >= 0";
    case KILN_SETTING_UNIT: return "a number in [0, 1)";
    default: return "a number";
    }
}

static bool f64_ok(const kiln_setting *s, double x) {
    if (!isfinite(x)) return false;
    switch (s->limit) {
    case KILN_SETTING_POS: return x > 0;
    case KILN_SETTING_NONNEG: return x >= 0;
    case KILN_SETTING_UNIT: return x >= 0 && x < 1;
    default: return true;
    }
}

static int64_t int_max(const kiln_setting *s) { return s->kind == KILN_SETTING_INT ? INT_MAX : INT64_MAX; }

kiln_status kiln_setting_parse(const kiln_setting *s, const char *text, kiln_train_config *c) {
    int64_t i = 0;
    int e = 0;
    double x = 0;
    kiln_status st = KILN_OK;
    switch (s->kind) {
    case KILN_SETTING_STR:
        if (strlen(text) >= s->size) {
            char want[64];
            snprintf(want, sizeof want, "at most %zu bytes", s->size - 1);
            return kiln_bad_value(text, want);
        }
        memcpy(AT(c, s, char), text, strlen(text) + 1);
        return KILN_OK;
    case KILN_SETTING_INT:
    case KILN_SETTING_I64:
        if ((st = kiln_parse_i64(text, s->limit, int_max(s), &i))) return st;
        if (s->kind == KILN_SETTING_INT) *AT(c, s, int) = (int)i;
        else *AT(c, s, int64_t) = i;
        return KILN_OK;
    case KILN_SETTING_U64: return kiln_parse_u64(text, AT(c, s, uint64_t));
    case KILN_SETTING_F64:
        if (kiln_parse_f64(text, -DBL_MAX, DBL_MAX, &x) || !f64_ok(s, x)) return kiln_bad_value(text, f64_expect(s));
        *AT(c, s, double) = x;
        return KILN_OK;
    case KILN_SETTING_FLAG:
        if ((st = kiln_parse_choice(text, choices_bool, &e))) return st;
        *AT(c, s, bool) = e != 0;
        return KILN_OK;
    case KILN_SETTING_ENUM:
        if ((st = kiln_parse_choice(text, s->choices, &e))) return st;
        *AT(c, s, int) = e;
        return KILN_OK;
    case KILN_SETTING_SIZE:
        if (!text[0]) i = 0; /* unset: the default budget */
        else if (kiln_parse_bytes(text, &i)) return kiln_last_status();
        *AT(c, s, int64_t) = i;
        return KILN_OK;
    case KILN_SETTING_AUTO:
        if (!text[0]) e = 0;
        else if (!strcmp(text, "auto")) e = KILN_MICRO_BATCH_AUTO;
        else if (kiln_parse_int(text, 1, 1000000, &e)) return kiln_bad_value(text, "auto or an integer in [1, 1000000]");
        *AT(c, s, int) = e;
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_INVALID, "setting %s: unknown kind", s->key);
}

const char *kiln_setting_format(const kiln_setting *s, const kiln_train_config *c, char *buf, size_t n) {
    buf[0] = 0;
    switch (s->kind) {
    case KILN_SETTING_STR: snprintf(buf, n, "%s", CAT(c, s, char)); break;
    case KILN_SETTING_INT: snprintf(buf, n, "%d", *CAT(c, s, int)); break;
    case KILN_SETTING_I64: snprintf(buf, n, "%lld", (long long)*CAT(c, s, int64_t)); break;
    case KILN_SETTING_U64: snprintf(buf, n, "%llu", (unsigned long long)*CAT(c, s, uint64_t)); break;
    case KILN_SETTING_F64: snprintf(buf, n, "%g", *CAT(c, s, double)); break;
    case KILN_SETTING_FLAG: snprintf(buf, n, "%s", *CAT(c, s, bool) ? "true" : "false"); break;
    case KILN_SETTING_ENUM: snprintf(buf, n, "%s", kiln_choice_name(s->choices, *CAT(c, s, int))); break;
    case KILN_SETTING_SIZE:
        if (*CAT(c, s, int64_t) > 0) kiln_bytes_text(*CAT(c, s, int64_t), buf, n);
        break;
    case KILN_SETTING_AUTO: {
        int v = *CAT(c, s, int);
        if (v == KILN_MICRO_BATCH_AUTO) snprintf(buf, n, "auto");
        else if (v > 0) snprintf(buf, n, "%d", v);
        break;
    }
    }
    return buf;
}

/* The range of one setting's line, for values set without the parser
 * (library callers fill the struct directly). */
static kiln_status check_value(const kiln_setting *s, const kiln_train_config *c) {
    char text[64];
    switch (s->kind) {
    case KILN_SETTING_STR:
        if (!memchr(CAT(c, s, char), 0, s->size)) return kiln_error(KILN_ERR_INVALID, "not terminated");
        return KILN_OK;
    case KILN_SETTING_INT: return kiln_check_i64(*CAT(c, s, int), s->limit, INT_MAX, NULL);
    case KILN_SETTING_I64: return kiln_check_i64(*CAT(c, s, int64_t), s->limit, INT64_MAX, NULL);
    case KILN_SETTING_F64:
        if (f64_ok(s, *CAT(c, s, double))) return KILN_OK;
        snprintf(text, sizeof text, "%g", *CAT(c, s, double));
        return kiln_bad_value(text, f64_expect(s));
    case KILN_SETTING_ENUM:
        if (strcmp(kiln_choice_name(s->choices, *CAT(c, s, int)), "?")) return KILN_OK;
        snprintf(text, sizeof text, "%d", *CAT(c, s, int));
        return kiln_parse_choice(text, s->choices, &(int){0});
    case KILN_SETTING_SIZE: return kiln_check_i64(*CAT(c, s, int64_t), 0, INT64_MAX, NULL);
    case KILN_SETTING_AUTO: return kiln_check_i64(*CAT(c, s, int), KILN_MICRO_BATCH_AUTO, 1000000, NULL);
    case KILN_SETTING_U64:
    case KILN_SETTING_FLAG: return KILN_OK;
    }
    return KILN_OK;
}

kiln_status kiln_train_config_validate(const kiln_train_config *c) {
    for (int i = 0; i < kiln_train_n_settings; i++) {
        const kiln_setting *s = &kiln_train_settings[i];
        kiln_status st = check_value(s, c);
        if (st) return kiln_error_context(st, "%s", s->key);
    }
#define NEED(cond, ...) \
    if (!(cond)) return kiln_error(KILN_ERR_INVALID, __VA_ARGS__)
    NEED(c->min_lr <= c->lr, "min_lr must be in [0, lr], got %g with lr %g", c->min_lr, c->lr);
    NEED(c->data[0], "data must name a directory with train.bin");
    NEED(c->run_dir[0], "run_dir must be set");
#undef NEED
    kiln_compile_options co;
    if (kiln_train_compile_options(c, &co)) return KILN_ERR_INVALID;
    kiln_weights_options wo; /* save_dtype and shard_size (Hugging Face's decimal sizes) */
    if (kiln_weights_options_parse(c->save_dtype, c->shard_size, &wo)) return KILN_ERR_INVALID;
    kiln_lora_config lc;
    kiln_status lst = kiln_train_lora_config(c, &lc);
    if (lst) return lst;
    bool pref = c->objective != KILN_OBJECTIVE_CE;
    const char *oname = kiln_choice_name(choices_objective, c->objective);
    if (pref != (c->pack == KILN_PACK_PAIRS))
        return kiln_error(KILN_ERR_INVALID, pref ? "objective %s reads preference pairs: give --pack pairs (shards kiln tokenize "
                                                   "makes of prompt/chosen/rejected lines)"
                                                 : "pack pairs holds preference pairs: train them with --objective dpo, simpo or orpo%s",
                          pref ? oname : "");
    if (c->objective == KILN_OBJECTIVE_DPO && c->dpo_ref == KILN_DPO_REF_ADAPTERS && !c->lora_rank)
        return kiln_error(KILN_ERR_INVALID, "dpo_ref adapters needs --lora-rank R (the reference is the base with the adapters "
                          "off); for full fine-tuning use the log-probs kiln dpo-ref stores beside the shards (dpo_ref file)");
    if (c->objective != KILN_OBJECTIVE_DPO && c->dpo_ref != KILN_DPO_REF_AUTO)
        return kiln_error(KILN_ERR_INVALID, "dpo_ref is a setting of objective dpo, not %s", oname);
    if (pref && c->batch % 2)
        return kiln_error(KILN_ERR_INVALID, "objective %s: --batch %d must be even (rows 2i and 2i+1 are a pair)", oname, c->batch);
    if (pref && c->global_batch > 0)
        return kiln_error(KILN_ERR_INVALID, "--global-batch with a preference objective is not implemented (give --batch and --accum)");
    if (c->base_dtype != KILN_BASE_DTYPE_AUTO && c->base_dtype != KILN_F32 && !c->lora_rank)
        return kiln_error(KILN_ERR_INVALID, "base_dtype %s needs lora_rank > 0: a %s base is frozen, so it only makes sense "
                          "with LoRA adapters (for bf16 products in full fine-tuning use precision bf16)",
                          kiln_dtype_name(c->base_dtype), kiln_dtype_name(c->base_dtype));
    return kiln_train_check_batch_settings(c);
}

kiln_status kiln_train_lora_config(const kiln_train_config *c, kiln_lora_config *lc) {
    memset(lc, 0, sizeof *lc);
    if (c->lora_rank == 0) return KILN_OK;
    lc->rank = c->lora_rank;
    lc->alpha = c->lora_alpha;
    lc->dropout = c->lora_dropout;
    lc->rslora = c->use_rslora;
    kiln_status st = kiln_lora_targets_parse(c->lora_targets, &lc->targets);
    if (!st && (st = kiln_lora_config_validate(lc)))
        kiln_error_context(st, "--lora-alpha %g --lora-rank %d%s", c->lora_alpha, c->lora_rank, c->use_rslora ? " --use-rslora" : "");
    return st;
}

kiln_status kiln_train_check_batch_settings(const kiln_train_config *c) {
    int mb = c->micro_batch;
    char t[32];
    if (!c->global_batch && mb)
        return kiln_error(KILN_ERR_INVALID, "micro_batch %s needs global_batch (sequences per optimiser step)",
                          kiln_setting_format(kiln_setting_find("micro_batch"), c, t, sizeof t));
    if (c->global_batch && mb > 0 && c->global_batch % mb)
        return kiln_error(KILN_ERR_INVALID, "global_batch %d is not a multiple of micro_batch %d", c->global_batch, mb);
    return KILN_OK;
}

/* A JSON value as text for the parser and the messages: strings as they
 * are, anything else as JSON. */
static kiln_status set_from_json(const kiln_setting *s, json_t *v, kiln_train_config *c) {
    switch (s->kind) {
    case KILN_SETTING_INT:
    case KILN_SETTING_I64:
        if (!json_is_integer(v)) break;
        if (kiln_check_i64(json_integer_value(v), s->limit, int_max(s), NULL)) return kiln_last_status();
        if (s->kind == KILN_SETTING_INT) *AT(c, s, int) = (int)json_integer_value(v);
        else *AT(c, s, int64_t) = json_integer_value(v);
        return KILN_OK;
    case KILN_SETTING_U64: /* written as a string of digits: JSON integers stop at 2^63 */
        if (!json_is_integer(v)) break;
        if (kiln_check_i64(json_integer_value(v), 0, INT64_MAX, NULL)) return kiln_last_status();
        *AT(c, s, uint64_t) = (uint64_t)json_integer_value(v);
        return KILN_OK;
    case KILN_SETTING_F64: {
        if (!json_is_number(v)) break;
        double x = json_number_value(v);
        char text[64];
        snprintf(text, sizeof text, "%.17g", x);
        if (!f64_ok(s, x)) return kiln_bad_value(text, f64_expect(s));
        *AT(c, s, double) = x;
        return KILN_OK;
    }
    case KILN_SETTING_FLAG:
        if (!json_is_boolean(v)) break;
        *AT(c, s, bool) = json_is_true(v);
        return KILN_OK;
    case KILN_SETTING_STR:
        if (!json_is_string(v)) {
            char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            kiln_bad_value(d ? d : "?", "a string");
            free(d);
            return KILN_ERR_INVALID;
        }
        break;
    case KILN_SETTING_AUTO:
        if (!json_is_integer(v)) break;
        if (kiln_check_i64(json_integer_value(v), 1, 1000000, NULL)) return kiln_last_status();
        *AT(c, s, int) = (int)json_integer_value(v);
        return KILN_OK;
    case KILN_SETTING_ENUM:
    case KILN_SETTING_SIZE: break;
    }
    if (json_is_string(v)) return kiln_setting_parse(s, json_string_value(v), c);
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    kiln_status st = d ? kiln_setting_parse(s, d, c) : kiln_error(KILN_ERR_OOM, "out of memory");
    free(d);
    return st;
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
        const kiln_setting *s = kiln_setting_find(key);
        if (!s) {
            st = kiln_error(KILN_ERR_INVALID, "%s: unknown setting \"%s\"", src, key);
            break;
        }
        if ((st = set_from_json(s, v, c))) kiln_error_context(st, "%s: %s", src, key);
    }
    json_decref(root);
    return st;
}

char *kiln_train_config_to_json(const kiln_train_config *c) {
    json_t *o = json_object();
    for (int i = 0; o && i < kiln_train_n_settings; i++) {
        const kiln_setting *s = &kiln_train_settings[i];
        char buf[64];
        json_t *v = NULL;
        switch (s->kind) {
        case KILN_SETTING_INT: v = json_integer(*CAT(c, s, int)); break;
        case KILN_SETTING_I64: v = json_integer(*CAT(c, s, int64_t)); break;
        case KILN_SETTING_F64: v = json_real(*CAT(c, s, double)); break;
        case KILN_SETTING_FLAG: v = json_boolean(*CAT(c, s, bool)); break;
        case KILN_SETTING_STR: v = json_string(CAT(c, s, char)); break;
        case KILN_SETTING_U64:
        case KILN_SETTING_ENUM:
        case KILN_SETTING_SIZE:
        case KILN_SETTING_AUTO: v = json_string(kiln_setting_format(s, c, buf, sizeof buf)); break;
        }
        json_object_set_new(o, s->key, v);
    }
    char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!s) kiln_error(KILN_ERR_OOM, "out of memory writing the run settings");
    return s;
}

kiln_status kiln_train_compile_options(const kiln_train_config *c, kiln_compile_options *co) {
    kiln_compile_options_default(co);
    if (c->compile < 0 || c->compile >= KILN_RUN_N_MODES)
        return kiln_error(KILN_ERR_INVALID, "compile: unknown mode %d", c->compile);
    kiln_compile_mode_apply(c->compile, co);
    co->recompute = c->recompute;
    co->dynamic = c->compile_dynamic;
    /* pointwise, the default, is what the compiler does unless told
     * otherwise; the block modes are asked for, and eager has no graph */
    if ((co->recompute == KILN_RECOMPUTE_ATTENTION || co->recompute == KILN_RECOMPUTE_LAYER) && co->mode == KILN_COMPILE_OFF)
        return kiln_error(KILN_ERR_INVALID, "recompute: --recompute %s needs --compile (it is a compiler pass)",
                          kiln_choice_name(choices_recompute, c->recompute));
    return KILN_OK;
}
