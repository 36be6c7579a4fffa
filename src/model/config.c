/* LlamaConfig <-> config.json, with Hugging Face field names. */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/model.h"

void kiln_llama_config_default(kiln_llama_config *c) {
    *c = (kiln_llama_config){
        .vocab_size = 32000, .hidden_size = 4096, .intermediate_size = 11008, .num_hidden_layers = 32,
        .num_attention_heads = 32, .num_key_value_heads = 0, .max_position_embeddings = 2048, .head_dim = 0,
        .rms_norm_eps = 1e-6, .rope_theta = 10000.0, .tie_word_embeddings = false,
        .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1,
    };
}

kiln_status kiln_llama_config_preset(const char *name, kiln_llama_config *c) {
    kiln_llama_config_default(c);
    c->rms_norm_eps = 1e-5;
    c->max_position_embeddings = 1024;
    c->vocab_size = 8192;
    if (!strcmp(name, "tiny")) {
        c->hidden_size = 128, c->intermediate_size = 344, c->num_hidden_layers = 2, c->num_attention_heads = 4;
    } else if (!strcmp(name, "small")) {
        c->hidden_size = 512, c->intermediate_size = 1376, c->num_hidden_layers = 8, c->num_attention_heads = 8;
        c->tie_word_embeddings = true;
    } else if (!strcmp(name, "demo")) {
        c->hidden_size = 256, c->intermediate_size = 688, c->num_hidden_layers = 4, c->num_attention_heads = 4;
        c->num_key_value_heads = 2;
        c->vocab_size = 4096;
        c->tie_word_embeddings = true;
    } else {
        return kiln_error(KILN_ERR_INVALID, "unknown model preset '%s' (tiny, small, demo, or a config.json path)", name);
    }
    if (!c->num_key_value_heads) c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = c->hidden_size / c->num_attention_heads;
    return kiln_llama_config_validate(c);
}

bool kiln_llama_config_is_preset(const char *s) { return !strchr(s, '/') && !strstr(s, ".json"); }

kiln_status kiln_llama_config_resolve(const char *s, kiln_llama_config *c) {
    return kiln_llama_config_is_preset(s) ? kiln_llama_config_preset(s, c) : kiln_llama_config_load(s, c);
}

kiln_status kiln_llama_config_validate(const kiln_llama_config *c) {
    struct { const char *name; int64_t v; } pos[] = {
        {"vocab_size", c->vocab_size}, {"hidden_size", c->hidden_size}, {"intermediate_size", c->intermediate_size},
        {"num_hidden_layers", c->num_hidden_layers}, {"num_attention_heads", c->num_attention_heads},
        {"num_key_value_heads", c->num_key_value_heads}, {"max_position_embeddings", c->max_position_embeddings},
        {"head_dim", c->head_dim},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0 || pos[i].v > (1ll << 31))
            return kiln_error(KILN_ERR_INVALID, "config: %s must be a positive integer below 2^31, got %lld", pos[i].name,
                              (long long)pos[i].v);
    if (c->vocab_size > INT32_MAX) return kiln_error(KILN_ERR_INVALID, "config: vocab_size too large");
    if (c->num_hidden_layers > 65536) /* the parameter list is indexed by int */
        return kiln_error(KILN_ERR_INVALID, "config: num_hidden_layers %lld is above kiln's limit of 65536",
                          (long long)c->num_hidden_layers);
    if (c->head_dim * c->num_attention_heads != c->hidden_size)
        return kiln_error(KILN_ERR_INVALID,
                          "config: hidden_size %lld is not num_attention_heads %lld x head_dim %lld (kiln needs them equal)",
                          (long long)c->hidden_size, (long long)c->num_attention_heads, (long long)c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return kiln_error(KILN_ERR_INVALID, "config: num_key_value_heads %lld does not divide num_attention_heads %lld",
                          (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
    if (c->head_dim % 2) return kiln_error(KILN_ERR_INVALID, "config: head_dim %lld must be even for rotary embeddings", (long long)c->head_dim);
    struct { const char *name; double v; } fl[] = {{"rms_norm_eps", c->rms_norm_eps}, {"rope_theta", c->rope_theta}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) /* used as float32: positive and finite there too */
        if (!isfinite(fl[i].v) || !(fl[i].v > 0) || fl[i].v > FLT_MAX || !((float)fl[i].v > 0))
            return kiln_error(KILN_ERR_INVALID, "config: %s must be a positive number representable as a float32, got %.17g",
                              fl[i].name, fl[i].v);
    int64_t ids[3] = {c->bos_token_id, c->eos_token_id, c->pad_token_id};
    const char *idn[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= c->vocab_size)
            return kiln_error(KILN_ERR_INVALID, "config: %s %lld is outside the vocabulary (%lld)", idn[i], (long long)ids[i],
                              (long long)c->vocab_size);
    uint64_t bytes;
    kiln_status st = kiln_llama_param_bytes(c, &bytes);
    return st ? kiln_error_context(st, "config") : KILN_OK;
}

/* A JSON number as written, for messages: integers exactly, reals in the
 * shortest form that reads back ("5e+121", "1.5"). */
static const char *num_str(json_t *v, char *buf, size_t n) {
    if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) {
        double d = json_real_value(v);
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
    } else if (json_is_string(v)) snprintf(buf, n, "\"%.60s\"", json_string_value(v));
    else snprintf(buf, n, "%s", json_is_true(v) ? "true" : json_is_false(v) ? "false" : json_is_null(v) ? "null" : "an object or array");
    return buf;
}

/* Integer fields: a JSON integer, or a real with an integral value inside
 * +-2^53 (where doubles still count exactly: "64.0" is fine, "5e121" and
 * "1.5" are not). Checked before any conversion, so nothing out of range is
 * ever cast. */
static kiln_status json_int(json_t *v, const char *src, const char *key, int64_t *out) {
    char b[64];
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return KILN_OK;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d) && fabs(d) <= 9007199254740992.0) {
            *out = (int64_t)d;
            return KILN_OK;
        }
        return kiln_error(KILN_ERR_INVALID, "%s: field %s must be an integer, got %s", src, key, num_str(v, b, sizeof b));
    }
    return kiln_error(KILN_ERR_INVALID, "%s: field %s must be an integer, got %s", src, key, num_str(v, b, sizeof b));
}

static kiln_status get_int(json_t *root, const char *src, const char *key, bool required, int64_t *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        return required ? kiln_error(KILN_ERR_INVALID, "%s: missing field %s", src, key) : KILN_OK;
    }
    return json_int(v, src, key, out);
}

/* Float fields are used as float32 (the kernels' and the generated code's
 * type): the value must be finite and positive both as written and once
 * rounded to float, so 1e300 (inf as a float) and 1e-50 (0 as a float) are
 * refused here with the file and field named, not turned into inf/0 later. */
static kiln_status json_pos_float(json_t *v, const char *src, const char *key, double *out) {
    char b[64];
    if (!json_is_number(v)) return kiln_error(KILN_ERR_INVALID, "%s: field %s must be a number, got %s", src, key, num_str(v, b, sizeof b));
    double d = json_number_value(v);
    if (!isfinite(d) || !(d > 0) || d > FLT_MAX || !((float)d > 0))
        return kiln_error(KILN_ERR_INVALID, "%s: field %s must be a positive number representable as a float32, got %s", src, key,
                          num_str(v, b, sizeof b));
    *out = d;
    return KILN_OK;
}

static kiln_status get_num(json_t *root, const char *src, const char *key, double *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return KILN_OK;
    return json_pos_float(v, src, key, out);
}

kiln_status kiln_llama_config_parse(const char *text, const char *src, kiln_llama_config *c) {
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", src, err.line, err.column, err.text);
    kiln_status st = KILN_OK;
    if (!json_is_object(root)) {
        st = kiln_error(KILN_ERR_FORMAT, "%s: top level must be a JSON object", src);
        goto done;
    }
    kiln_llama_config_default(c);
    struct { const char *k; int64_t *v; bool req; } ints[] = {
        {"vocab_size", &c->vocab_size, true}, {"hidden_size", &c->hidden_size, true},
        {"intermediate_size", &c->intermediate_size, true}, {"num_hidden_layers", &c->num_hidden_layers, true},
        {"num_attention_heads", &c->num_attention_heads, true}, {"num_key_value_heads", &c->num_key_value_heads, false},
        {"max_position_embeddings", &c->max_position_embeddings, false}, {"head_dim", &c->head_dim, false},
        {"bos_token_id", &c->bos_token_id, false}, {"eos_token_id", &c->eos_token_id, false},
        {"pad_token_id", &c->pad_token_id, false},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) st = get_int(root, src, ints[i].k, ints[i].req, ints[i].v);
    if (!st) st = get_num(root, src, "rms_norm_eps", &c->rms_norm_eps);
    if (!st) st = get_num(root, src, "rope_theta", &c->rope_theta);
    if (st) goto done;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie)) {
        st = kiln_error(KILN_ERR_INVALID, "%s: field tie_word_embeddings must be true or false", src);
        goto done;
    }
    c->tie_word_embeddings = tie && json_is_true(tie);
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\" (Llama)", src);
        goto done;
    }
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: rope_scaling is not supported", src);
        goto done;
    }
    if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->head_dim == 0 && c->num_attention_heads > 0) c->head_dim = c->hidden_size / c->num_attention_heads;
    st = kiln_llama_config_validate(c);
    if (st) kiln_error_context(st, "%s", src);
done:
    json_decref(root);
    return st;
}

kiln_status kiln_llama_config_load(const char *path, kiln_llama_config *c) {
    char *text;
    size_t n;
    kiln_status st = kiln_read_file(path, &text, &n);
    if (st) return st;
    st = kiln_llama_config_parse(text, path, c);
    free(text);
    return st;
}

char *kiln_llama_config_to_json(const kiln_llama_config *c) {
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(o, "model_type", json_string("llama"));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "torch_dtype", json_string("float32"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "mlp_bias", json_false());
    if (c->bos_token_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    if (c->eos_token_id >= 0) json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    if (c->pad_token_id >= 0) json_object_set_new(o, "pad_token_id", json_integer(c->pad_token_id));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

kiln_status kiln_llama_config_save(const char *path, const kiln_llama_config *c) {
    char *s = kiln_llama_config_to_json(c);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory writing %s", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return kiln_error(KILN_ERR_OOM, "out of memory writing %s", path);
    }
    t[n] = '\n';
    kiln_status st = kiln_write_file_atomic(path, t, n + 1);
    free(t);
    return st;
}
