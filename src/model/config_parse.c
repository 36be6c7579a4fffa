/* config.json -> kiln_llama_config for the families kiln builds, with
 * Hugging Face's defaults for each model_type. Every key is accounted for:
 * implemented for this family, fixed in it (its one value is accepted, any
 * other would change the network and is refused), or ignored on purpose (it
 * describes storage or the Python runtime, not what the model computes);
 * anything else is refused naming the file and the field, never silently
 * dropped. */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/model.h"

enum {
    LL = 1 << KILN_FAMILY_LLAMA, MI = 1 << KILN_FAMILY_MISTRAL, Q2 = 1 << KILN_FAMILY_QWEN2, Q3 = 1 << KILN_FAMILY_QWEN3,
    G2 = 1 << KILN_FAMILY_GEMMA2, G3 = 1 << KILN_FAMILY_GEMMA3
};
#define GE (G2 | G3)
#define ALL (LL | MI | Q2 | Q3 | GE)

/* Fields kiln implements, and the families whose HF config has them: any
 * valid value is read. */
static const struct {
    const char *key;
    unsigned families;
} implemented[] = {
    {"model_type", ALL}, {"architectures", ALL}, {"vocab_size", ALL}, {"hidden_size", ALL}, {"intermediate_size", ALL},
    {"num_hidden_layers", ALL}, {"num_attention_heads", ALL}, {"num_key_value_heads", ALL},
    {"max_position_embeddings", ALL}, {"head_dim", ALL}, {"hidden_act", ALL}, {"rms_norm_eps", ALL}, {"rope_theta", ALL},
    {"rope_scaling", ALL}, {"initializer_range", ALL}, {"tie_word_embeddings", ALL},
    {"bos_token_id", ALL}, {"eos_token_id", ALL}, {"pad_token_id", ALL}, {"attention_bias", LL | Q3 | GE},
    {"mlp_bias", LL}, {"pretraining_tp", LL}, {"sliding_window", MI | Q2 | Q3 | GE}, {"use_sliding_window", Q2 | Q3},
    {"max_window_layers", Q2 | Q3}, {"layer_types", Q2 | Q3 | GE}, {"hidden_activation", GE},
    {"query_pre_attn_scalar", GE}, {"attn_logit_softcapping", GE}, {"final_logit_softcapping", GE},
    {"sliding_window_pattern", G3}, {"_sliding_window_pattern", G3}, {"rope_local_base_freq", G3},
};

/* Fields whose value is fixed in these families (the network has that
 * behaviour built in, or kiln implements only it): the fixed value is
 * accepted, as it changes nothing; any other is refused by name, as it
 * would change the network. A field implemented for a family is not fixed
 * there. */
static const struct {
    const char *key;
    unsigned families;
    const char *value; /* JSON text: numbers compare by value (0 == 0.0) */
    const char *why;
} fixed[] = {
    {"attention_bias", MI, "false", "Mistral's attention projections have no biases"},
    {"attention_bias", Q2, "true", "Qwen2's q/k/v projections always have biases"},
    {"mlp_bias", MI | Q2 | Q3, "false", "the family's MLP has no biases"},
    {"attention_dropout", ALL, "0", "kiln implements no attention dropout"},
    {"rope_interleaved", ALL, "false", "kiln implements the rotate-half RoPE of Hugging Face's Llama"},
    {"pretraining_tp", MI | Q2 | Q3, "1", "the family does not split its matmuls"},
    {"sliding_window", LL, "null", "Llama attends to every earlier position"},
    {"use_sliding_window", LL, "false", "Llama attends to every earlier position"},
    {"use_bidirectional_attention", G3, "false", "kiln trains causal language models"},
};

/* What transformers' ACT2FN maps to SiLU: the activation of the Llama
 * families; Gemma's is the tanh-approximate GELU under this name. */
static const char *const silu_names[] = {"silu", "swish"};
static const char *const gemma_act = "gelu_pytorch_tanh";

static bool implemented_for(const char *key, kiln_family f) {
    for (size_t i = 0; i < sizeof implemented / sizeof implemented[0]; i++)
        if (!strcmp(key, implemented[i].key) && (implemented[i].families & (1u << f))) return true;
    return false;
}

/* Known and ignored on purpose: how the weights are stored (torch_dtype:
 * kiln converts on load) and settings of the transformers runtime or of
 * other tools that do not change what the model computes. */
static const char *const ignored[] = {
    "torch_dtype", "dtype", "transformers_version", "_name_or_path", "use_cache", "output_attentions",
    "output_hidden_states", "return_dict", "is_llama_config", "transformers.js_config", "_attn_implementation_autoset",
    "cache_implementation", /* the runtime's cache class (Gemma's "hybrid") */
};

static bool family_of(const char *name, kiln_family *f) {
    for (int i = 0; i <= KILN_FAMILY_LAST; i++)
        if (!strcmp(name, kiln_family_model_type((kiln_family)i))) {
            *f = (kiln_family)i;
            return true;
        }
    return false;
}

/* Hugging Face's defaults for fields a config.json leaves out (the
 * constructors of LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config). */
static void family_defaults(kiln_llama_config *c) {
    switch (c->family) {
    case KILN_FAMILY_LLAMA: c->max_position_embeddings = 2048; break;
    case KILN_FAMILY_MISTRAL:
        c->max_position_embeddings = 4096 * 32, c->num_key_value_heads = 8, c->sliding_window = 4096;
        break;
    case KILN_FAMILY_QWEN2:
    case KILN_FAMILY_QWEN3:
        c->max_position_embeddings = 32768, c->num_key_value_heads = 32, c->sliding_window = 4096, c->max_window_layers = 28;
        if (c->family == KILN_FAMILY_QWEN3) c->head_dim = 128;
        break;
    case KILN_FAMILY_GEMMA2: /* Gemma2Config: the 2B model */
    case KILN_FAMILY_GEMMA3: /* Gemma3TextConfig */
        c->vocab_size = c->family == KILN_FAMILY_GEMMA2 ? 256000 : 262208;
        c->hidden_size = 2304, c->intermediate_size = 9216, c->num_hidden_layers = 26;
        c->num_attention_heads = 8, c->num_key_value_heads = 4, c->head_dim = 256;
        c->max_position_embeddings = c->family == KILN_FAMILY_GEMMA2 ? 8192 : 131072;
        c->rope_theta = c->family == KILN_FAMILY_GEMMA2 ? 10000.0 : 1000000.0;
        c->tie_word_embeddings = true, c->pad_token_id = 0, c->eos_token_id = 1, c->bos_token_id = 2;
        c->query_pre_attn_scalar = 256, c->sliding_window = 4096;
        if (c->family == KILN_FAMILY_GEMMA2) {
            c->sliding_window_pattern = 2, c->final_logit_softcapping = 30.0, c->attn_logit_softcapping = 50.0;
        } else {
            c->sliding_window_pattern = 6, c->rope_local_base_freq = 10000.0;
        }
        break;
    }
}

/* A JSON number as written, for messages: integers exactly, reals in the
 * shortest form that reads back ("5e+121", "1.5"). */
static const char *num_str(json_t *v, char *buf, size_t n) {
    if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) {
        double d = json_real_value(v);
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, d);
            double back = 0;
            if (!kiln_parse_f64(buf, -DBL_MAX, DBL_MAX, &back) && back == d) break;
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

static kiln_status get_bool(json_t *root, const char *src, const char *key, bool *out) {
    json_t *v = json_object_get(root, key);
    char b[64];
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_boolean(v))
        return kiln_error(KILN_ERR_INVALID, "%s: field %s must be true or false, got %s", src, key, num_str(v, b, sizeof b));
    *out = json_is_true(v);
    return KILN_OK;
}

/* A token id: an integer, or null (not set). */
static kiln_status get_id(json_t *root, const char *src, const char *key, int64_t *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return KILN_OK;
    return json_int(v, src, key, out);
}

/* eos_token_id: an integer or a list of them (Llama 3 instruct stops at
 * any of several). */
static kiln_status get_eos(json_t *root, const char *src, kiln_llama_config *c) {
    json_t *v = json_object_get(root, "eos_token_id");
    if (!v || !json_is_array(v)) return get_id(root, src, "eos_token_id", &c->eos_token_id);
    size_t n = json_array_size(v);
    if (n == 0) /* transformers would stop at no token: say so rather than generate forever */
        return kiln_error(KILN_ERR_INVALID, "%s: field eos_token_id is an empty list (give an id, a list of ids, or null)", src);
    if (n > KILN_CONFIG_MAX_EOS)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field eos_token_id lists %zu ids (kiln keeps at most %d)", src, n, KILN_CONFIG_MAX_EOS);
    c->eos_is_list = true;
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        kiln_status st = json_int(json_array_get(v, i), src, "eos_token_id", &id);
        if (st) return st;
        if (id < 0)
            return kiln_error(KILN_ERR_INVALID, "%s: field eos_token_id lists %lld (ids are >= 0)", src, (long long)id);
        if (i == 0) c->eos_token_id = id;
        else c->eos_more[c->n_eos_more++] = id;
    }
    return KILN_OK;
}

static kiln_status get_architectures(json_t *root, const char *src, kiln_family f) {
    json_t *v = json_object_get(root, "architectures");
    char b[80];
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_array(v)) return kiln_error(KILN_ERR_INVALID, "%s: field architectures must be a list, got %s", src, num_str(v, b, sizeof b));
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *a = json_array_get(v, i);
        if (!json_is_string(a) || strcmp(json_string_value(a), kiln_family_architecture(f)))
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field architectures has %s: kiln builds %s for model_type %s", src,
                              num_str(a, b, sizeof b), kiln_family_architecture(f), kiln_family_model_type(f));
    }
    return KILN_OK;
}

/* rope_scaling: null, or {rope_type|type: default|linear|llama3, ...}
 * with exactly the keys that type reads (_compute_*_parameters). */
static kiln_status get_rope_scaling(json_t *root, const char *src, kiln_rope_scaling *r) {
    json_t *v = json_object_get(root, "rope_scaling");
    char b[80];
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_object(v))
        return kiln_error(KILN_ERR_INVALID, "%s: field rope_scaling must be null or an object, got %s", src, num_str(v, b, sizeof b));
    json_t *t1 = json_object_get(v, "rope_type"), *t2 = json_object_get(v, "type"), *t = t1 ? t1 : t2;
    if (!t || !json_is_string(t))
        return kiln_error(KILN_ERR_INVALID, "%s: field rope_scaling needs a rope_type string, got %s", src,
                          t ? num_str(t, b, sizeof b) : "none");
    const char *type = json_string_value(t);
    if (t1 && t2 && (!json_is_string(t2) || strcmp(json_string_value(t2), type)))
        return kiln_error(KILN_ERR_INVALID, "%s: rope_scaling has rope_type \"%s\" and a different type %s", src, type,
                          num_str(t2, b, sizeof b));
    if (!strcmp(type, "default")) r->type = KILN_ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) r->type = KILN_ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) r->type = KILN_ROPE_LLAMA3;
    else
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field rope_scaling has type \"%.60s\", which kiln does not implement (linear, llama3)",
                          src, type);
    static const char *const keys[] = {"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    int allowed = r->type == KILN_ROPE_DEFAULT ? 2 : r->type == KILN_ROPE_LINEAR ? 3 : 6;
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        int k = 0;
        while (k < allowed && strcmp(key, keys[k])) k++;
        if (k == allowed)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field rope_scaling.%s (= %s) is not implemented for rope_type %s", src, key,
                              num_str(val, b, sizeof b), type);
    }
    kiln_status st = KILN_OK;
    if (r->type == KILN_ROPE_DEFAULT) return st;
    struct { const char *k; double *v; } need[] = {{"factor", &r->factor}, {"low_freq_factor", &r->low_freq_factor},
                                                   {"high_freq_factor", &r->high_freq_factor}};
    char full[64];
    for (int i = 0; i < (r->type == KILN_ROPE_LINEAR ? 1 : 3) && !st; i++) {
        json_t *x = json_object_get(v, need[i].k);
        snprintf(full, sizeof full, "rope_scaling.%s", need[i].k);
        st = x ? json_pos_float(x, src, full, need[i].v) : kiln_error(KILN_ERR_INVALID, "%s: missing field %s", src, full);
    }
    if (!st && r->type == KILN_ROPE_LLAMA3) {
        json_t *x = json_object_get(v, "original_max_position_embeddings");
        st = x ? json_int(x, src, "rope_scaling.original_max_position_embeddings", &r->original_max_position_embeddings)
               : kiln_error(KILN_ERR_INVALID, "%s: missing field rope_scaling.original_max_position_embeddings", src);
    }
    return st;
}

/* layer_types (newer transformers): accepted when it says what
 * use_sliding_window and max_window_layers say, the only per-layer rule
 * kiln keeps. */
static kiln_status check_layer_types(json_t *root, const char *src, const kiln_llama_config *c) {
    json_t *v = json_object_get(root, "layer_types");
    char b[80];
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_array(v) || (int64_t)json_array_size(v) != c->num_hidden_layers)
        return kiln_error(KILN_ERR_INVALID, "%s: field layer_types must list one type for each of the %lld layers", src,
                          (long long)c->num_hidden_layers);
    for (size_t l = 0; l < json_array_size(v); l++) {
        json_t *e = json_array_get(v, l);
        bool slides = c->use_sliding_window && c->sliding_window && (int64_t)l >= c->max_window_layers;
        const char *want = slides ? "sliding_attention" : "full_attention";
        if (!json_is_string(e) || strcmp(json_string_value(e), want))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: field layer_types[%zu] is %s where use_sliding_window/max_window_layers give \"%s\" (kiln "
                              "implements no other per-layer attention)",
                              src, l, num_str(e, b, sizeof b), want);
    }
    return KILN_OK;
}

/* Gemma's layer_types: read as the period it follows (every P-th layer
 * attends fully, the others slide: transformers' default for a
 * sliding_window_pattern P), which becomes sliding_window_pattern; a list
 * that follows no period, or disagrees with a sliding_window_pattern the
 * file also gives, is refused naming the layer. */
static kiln_status gemma_layer_types(json_t *root, const char *src, kiln_llama_config *c, bool pattern_given) {
    json_t *v = json_object_get(root, "layer_types");
    char b[80];
    if (!v || json_is_null(v)) return KILN_OK;
    int64_t L = c->num_hidden_layers, P = 0;
    if (!json_is_array(v) || (int64_t)json_array_size(v) != L)
        return kiln_error(KILN_ERR_INVALID, "%s: field layer_types must list one type for each of the %lld layers, got %s%s", src,
                          (long long)L, json_is_array(v) ? "a list of " : "", json_is_array(v) ? "" : num_str(v, b, sizeof b));
    for (int64_t l = 0; l < L; l++) {
        json_t *e = json_array_get(v, (size_t)l);
        const char *t = json_string_value(e);
        if (!t || (strcmp(t, "sliding_attention") && strcmp(t, "full_attention")))
            return kiln_error(KILN_ERR_INVALID, "%s: field layer_types[%lld] is %s (\"sliding_attention\" or \"full_attention\")", src,
                              (long long)l, num_str(e, b, sizeof b));
        if (!P && !strcmp(t, "full_attention")) P = l + 1;
    }
    if (!P) P = L + 1; /* every layer slides */
    for (int64_t l = 0; l < L; l++) {
        const char *t = json_string_value(json_array_get(v, (size_t)l));
        const char *want = (l + 1) % P ? "sliding_attention" : "full_attention";
        if (strcmp(t, want))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: field layer_types[%lld] is \"%s\" where one full-attention layer in every %lld gives \"%s\" "
                              "(kiln implements Gemma's periodic layer patterns)",
                              src, (long long)l, t, (long long)P, want);
    }
    if (pattern_given && P != c->sliding_window_pattern && !(P > L && c->sliding_window_pattern > L))
        return kiln_error(KILN_ERR_INVALID, "%s: field layer_types follows a pattern of %lld but sliding_window_pattern is %lld", src,
                          (long long)P, (long long)c->sliding_window_pattern);
    c->sliding_window_pattern = P;
    return KILN_OK;
}

/* A soft-cap: null (none) or a positive number. */
static kiln_status get_cap(json_t *root, const char *src, const char *key, double *out) {
    json_t *v = json_object_get(root, key);
    if (v && json_is_null(v)) *out = 0;
    return v && !json_is_null(v) ? json_pos_float(v, src, key, out) : KILN_OK;
}

/* The fields only Gemma has. */
static kiln_status gemma_fields(json_t *root, const char *src, kiln_llama_config *c) {
    kiln_status st = get_num(root, src, "query_pre_attn_scalar", &c->query_pre_attn_scalar);
    if (!st) st = get_cap(root, src, "attn_logit_softcapping", &c->attn_logit_softcapping);
    if (!st) st = get_cap(root, src, "final_logit_softcapping", &c->final_logit_softcapping);
    if (!st && c->family == KILN_FAMILY_GEMMA3) st = get_num(root, src, "rope_local_base_freq", &c->rope_local_base_freq);
    bool given = false;
    const char *pk[2] = {"sliding_window_pattern", "_sliding_window_pattern"};
    for (int i = 0; i < 2 && !st && c->family == KILN_FAMILY_GEMMA3; i++) {
        json_t *v = json_object_get(root, pk[i]);
        if (!v || json_is_null(v)) continue;
        int64_t p = 0;
        st = json_int(v, src, pk[i], &p);
        if (!st && (p < 1 || p > (1ll << 31)))
            st = kiln_error(KILN_ERR_INVALID, "%s: field %s must be a positive integer, got %lld", src, pk[i], (long long)p);
        if (!st && given && p != c->sliding_window_pattern)
            st = kiln_error(KILN_ERR_INVALID, "%s: fields sliding_window_pattern %lld and _sliding_window_pattern %lld differ", src,
                            (long long)c->sliding_window_pattern, (long long)p);
        if (!st) c->sliding_window_pattern = p, given = true;
    }
    json_t *sw = json_object_get(root, "sliding_window");
    if (!st && sw && json_is_null(sw))
        st = kiln_error(KILN_ERR_INVALID, "%s: field sliding_window is null: %s's sliding layers need a window", src,
                        kiln_family_model_type(c->family));
    return st ? st : gemma_layer_types(root, src, c, given);
}

/* v holds the fixed value `want` (JSON text): numbers by value, the rest
 * by JSON equality. */
static bool same_value(json_t *v, const char *want) {
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    bool same = w && (json_is_number(v) && json_is_number(w) ? json_number_value(v) == json_number_value(w) : json_equal(v, w));
    json_decref(w);
    return same;
}

/* Keys that are neither implemented for this family, nor fixed at the value
 * given, nor ignored on purpose; and values of accepted keys that would
 * change the model. */
static kiln_status check_keys(json_t *root, const char *src, kiln_family f) {
    const char *key;
    json_t *v;
    char b[80];
    json_object_foreach(root, key, v) {
        bool known = implemented_for(key, f);
        for (size_t i = 0; i < sizeof ignored / sizeof ignored[0] && !known; i++) known = !strcmp(key, ignored[i]);
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && !known; i++) {
            if (strcmp(key, fixed[i].key) || !(fixed[i].families & (1u << f))) continue;
            if (!json_is_null(v) && !same_value(v, fixed[i].value)) /* null: not set, the family's value */
                return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field %s is %s, which would change the network: for model_type %s it is %s (%s)",
                                  src, key, num_str(v, b, sizeof b), kiln_family_model_type(f), fixed[i].value, fixed[i].why);
            known = true;
        }
        if (!known)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field %s (= %s) is not implemented by kiln for model_type %s", src, key,
                              num_str(v, b, sizeof b), kiln_family_model_type(f));
    }
    json_t *x = json_object_get(root, "hidden_act");
    if (KILN_FAMILY_IS_GEMMA(f)) {
        const char *keys[2] = {"hidden_act", "hidden_activation"};
        for (int i = 0; i < 2; i++) {
            x = json_object_get(root, keys[i]);
            if (x && !json_is_null(x) && !(json_is_string(x) && !strcmp(json_string_value(x), gemma_act)))
                return kiln_error(KILN_ERR_UNSUPPORTED,
                                  "%s: field %s is %s: kiln implements Gemma's tanh-approximate GELU (\"%s\") for model_type %s", src,
                                  keys[i], num_str(x, b, sizeof b), gemma_act, kiln_family_model_type(f));
        }
        return KILN_OK;
    }
    bool silu = false;
    for (size_t i = 0; x && json_is_string(x) && i < sizeof silu_names / sizeof silu_names[0]; i++)
        silu = silu || !strcmp(json_string_value(x), silu_names[i]);
    if (x && !silu)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field hidden_act is %s: kiln implements SiLU (\"silu\" or its alias \"swish\")",
                          src, num_str(x, b, sizeof b));
    x = json_object_get(root, "pretraining_tp"); /* only splits HF's matmuls: same numbers */
    int64_t tp = 1;
    if (x && !json_is_null(x) && implemented_for("pretraining_tp", f)) {
        kiln_status st = json_int(x, src, "pretraining_tp", &tp);
        if (st) return st;
        if (tp < 1) return kiln_error(KILN_ERR_INVALID, "%s: field pretraining_tp must be >= 1, got %lld", src, (long long)tp);
    }
    return KILN_OK;
}

/* Gemma3ForConditionalGeneration (model_type gemma3): the language model
 * is text_config, a gemma3_text config; the top level's token ids (the
 * 4B-27B files keep eos_token_id there) apply to it where it has none.
 * Every other top-level key belongs to the vision tower and the
 * projector, which kiln does not build: known ones are dropped with a
 * note, anything else is refused by name. */
static kiln_status conditional_text(json_t *root, const char *src, json_t **out) {
    static const char *const vision[] = {"vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                                         "image_token_index", "initializer_range"};
    static const char *const ids[] = {"eos_token_id", "bos_token_id", "pad_token_id"};
    char b[80];
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool known = !strcmp(key, "model_type") || !strcmp(key, "text_config") || !strcmp(key, "architectures");
        for (size_t i = 0; i < sizeof vision / sizeof vision[0] && !known; i++) known = !strcmp(key, vision[i]);
        for (size_t i = 0; i < sizeof ids / sizeof ids[0] && !known; i++) known = !strcmp(key, ids[i]);
        for (size_t i = 0; i < sizeof ignored / sizeof ignored[0] && !known; i++) known = !strcmp(key, ignored[i]);
        if (!known)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field %s (= %s) is not implemented by kiln for model_type gemma3", src, key,
                              num_str(v, b, sizeof b));
    }
    json_t *a = json_object_get(root, "architectures");
    for (size_t i = 0; a && json_is_array(a) && i < json_array_size(a); i++)
        if (!json_is_string(json_array_get(a, i)) || strcmp(json_string_value(json_array_get(a, i)), "Gemma3ForConditionalGeneration"))
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field architectures has %s: kiln reads Gemma3ForConditionalGeneration for model_type gemma3",
                              src, num_str(json_array_get(a, i), b, sizeof b));
    json_t *t = json_object_get(root, "text_config");
    if (!json_is_object(t))
        return kiln_error(KILN_ERR_INVALID, "%s: model_type gemma3 needs a text_config object, got %s", src, t ? num_str(t, b, sizeof b) : "none");
    json_t *mt = json_object_get(t, "model_type");
    if (mt && !(json_is_string(mt) && !strcmp(json_string_value(mt), "gemma3_text")))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field text_config.model_type is %s (kiln reads gemma3_text)", src, num_str(mt, b, sizeof b));
    *out = json_deep_copy(t);
    if (!*out) return kiln_error(KILN_ERR_OOM, "%s: out of memory", src);
    json_object_set_new(*out, "model_type", json_string("gemma3_text"));
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        json_t *x = json_object_get(root, ids[i]);
        if (x && !json_object_get(*out, ids[i])) json_object_set(*out, ids[i], x);
    }
    if (json_object_get(root, "vision_config"))
        kiln_log(KILN_LOG_INFO, "%s: Gemma3ForConditionalGeneration: kiln builds its language model (text_config); the vision "
                 "tower and the multimodal projector are not part of it", src);
    return KILN_OK;
}

static kiln_status parse_root(json_t *root, const char *src, kiln_llama_config *c);

kiln_status kiln_llama_config_parse(const char *text, const char *src, kiln_llama_config *c) {
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", src, err.line, err.column, err.text);
    kiln_status st = KILN_OK;
    json_t *mt = json_is_object(root) ? json_object_get(root, "model_type") : NULL;
    if (mt && json_is_string(mt) && !strcmp(json_string_value(mt), "gemma3")) {
        json_t *text_cfg = NULL;
        st = conditional_text(root, src, &text_cfg);
        json_decref(root);
        if (st) return st;
        char where[512];
        snprintf(where, sizeof where, "%s (text_config)", src);
        st = parse_root(text_cfg, where, c);
        json_decref(text_cfg);
        return st;
    }
    st = parse_root(root, src, c);
    json_decref(root);
    return st;
}

static kiln_status parse_root(json_t *root, const char *src, kiln_llama_config *c) {
    kiln_status st = KILN_OK;
    char b[80];
    if (!json_is_object(root)) return kiln_error(KILN_ERR_FORMAT, "%s: top level must be a JSON object", src);
    kiln_llama_config_default(c);
    json_t *mt = json_object_get(root, "model_type"); /* absent: a bare LlamaConfig */
    if (mt && (!json_is_string(mt) || !family_of(json_string_value(mt), &c->family)))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: field model_type is %s, which kiln does not build (llama, mistral, qwen2, qwen3, gemma2, "
                          "gemma3_text, gemma3)",
                          src, num_str(mt, b, sizeof b));
    family_defaults(c);
    if ((st = check_keys(root, src, c->family)) || (st = get_architectures(root, src, c->family))) goto done;
    struct { const char *k; int64_t *v; bool req; } ints[] = {
        {"vocab_size", &c->vocab_size, true}, {"hidden_size", &c->hidden_size, true},
        {"intermediate_size", &c->intermediate_size, true}, {"num_hidden_layers", &c->num_hidden_layers, true},
        {"num_attention_heads", &c->num_attention_heads, true}, {"num_key_value_heads", &c->num_key_value_heads, false},
        {"max_position_embeddings", &c->max_position_embeddings, false}, {"head_dim", &c->head_dim, false},
        {"max_window_layers", &c->max_window_layers, false},
    };
    bool gemma = KILN_FAMILY_IS_GEMMA(c->family); /* its configs leave out what its config classes default */
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++)
        if (implemented_for(ints[i].k, c->family)) st = get_int(root, src, ints[i].k, ints[i].req && !gemma, ints[i].v);
    /* a fixed field keeps the family's value: never read into the config */
    json_t *sw = implemented_for("sliding_window", c->family) ? json_object_get(root, "sliding_window") : NULL;
    if (!st && sw && json_is_null(sw)) c->sliding_window = 0; /* null: no window */
    else if (!st && sw) st = get_int(root, src, "sliding_window", false, &c->sliding_window);
    if (!st && sw && !json_is_null(sw) && c->sliding_window <= 0)
        st = kiln_error(KILN_ERR_INVALID, "%s: field sliding_window must be a positive integer or null, got %lld", src,
                        (long long)c->sliding_window);
    if (!st) st = get_id(root, src, "bos_token_id", &c->bos_token_id);
    if (!st) st = get_id(root, src, "pad_token_id", &c->pad_token_id);
    if (!st) st = get_eos(root, src, c);
    if (!st) st = get_num(root, src, "rms_norm_eps", &c->rms_norm_eps);
    if (!st) st = get_num(root, src, "rope_theta", &c->rope_theta);
    if (!st) st = get_num(root, src, "initializer_range", &c->initializer_range);
    if (!st) st = get_bool(root, src, "tie_word_embeddings", &c->tie_word_embeddings);
    struct { const char *k; bool *v; } bools[] = {{"attention_bias", &c->attention_bias}, {"mlp_bias", &c->mlp_bias},
                                                  {"use_sliding_window", &c->use_sliding_window}};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0] && !st; i++)
        if (implemented_for(bools[i].k, c->family)) st = get_bool(root, src, bools[i].k, bools[i].v);
    if (!st) st = get_rope_scaling(root, src, &c->rope_scaling);
    if (!st && gemma) st = gemma_fields(root, src, c);
    if (st) goto done;
    json_t *kv = json_object_get(root, "num_key_value_heads"); /* null: one per query head (every family) */
    if (!kv || json_is_null(kv)) {
        if (c->family == KILN_FAMILY_LLAMA || (kv && json_is_null(kv))) c->num_key_value_heads = c->num_attention_heads;
    }
    json_t *hd = json_object_get(root, "head_dim");
    if ((!hd || json_is_null(hd)) && c->family != KILN_FAMILY_QWEN3 && !gemma && c->num_attention_heads > 0) {
        /* older transformers refuse this, newer ones truncate: refuse */
        if (c->hidden_size % c->num_attention_heads) {
            st = kiln_error(KILN_ERR_INVALID,
                            "%s: hidden_size %lld is not a multiple of num_attention_heads %lld and no head_dim is given", src,
                            (long long)c->hidden_size, (long long)c->num_attention_heads);
            goto done;
        }
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    st = kiln_llama_config_validate(c);
    if (st) kiln_error_context(st, "%s", src);
    else if (!gemma) st = check_layer_types(root, src, c);
done:
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
