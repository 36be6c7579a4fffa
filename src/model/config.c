/* The model configuration: defaults, presets, validation and config.json
 * output with Hugging Face field names (parsing: config_parse.c). */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/model.h"

static const char *const family_names[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"};
static const char *const family_types[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text"};
static const char *const family_archs[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                           "Qwen3ForCausalLM", "Gemma2ForCausalLM",  "Gemma3ForCausalLM"};

const char *kiln_family_name(kiln_family f) { return (unsigned)f <= KILN_FAMILY_LAST ? family_names[f] : "?"; }
const char *kiln_family_model_type(kiln_family f) { return (unsigned)f <= KILN_FAMILY_LAST ? family_types[f] : "?"; }
const char *kiln_family_architecture(kiln_family f) { return (unsigned)f <= KILN_FAMILY_LAST ? family_archs[f] : "?"; }

void kiln_llama_config_default(kiln_llama_config *c) {
    memset(c, 0, sizeof *c); /* padding too: configs are compared and hashed */
    c->family = KILN_FAMILY_LLAMA;
    c->vocab_size = 32000, c->hidden_size = 4096, c->intermediate_size = 11008, c->num_hidden_layers = 32;
    c->num_attention_heads = 32, c->num_key_value_heads = 0, c->max_position_embeddings = 2048, c->head_dim = 0;
    c->rms_norm_eps = 1e-6, c->rope_theta = 10000.0, c->initializer_range = 0.02;
    c->rope_scaling = (kiln_rope_scaling){.type = KILN_ROPE_DEFAULT, .factor = 1, .low_freq_factor = 1, .high_freq_factor = 4,
                                          .original_max_position_embeddings = 8192};
    c->bos_token_id = -1, c->eos_token_id = -1, c->pad_token_id = -1;
}

int64_t kiln_llama_config_window(const kiln_llama_config *c) {
    switch (c->family) {
    case KILN_FAMILY_MISTRAL: return c->sliding_window;
    case KILN_FAMILY_QWEN2:
    case KILN_FAMILY_QWEN3: /* HF: layers >= max_window_layers slide when use_sliding_window */
        return c->use_sliding_window && c->max_window_layers < c->num_hidden_layers ? c->sliding_window : 0;
    case KILN_FAMILY_GEMMA2:
    case KILN_FAMILY_GEMMA3: /* some layer slides unless every one is full (pattern 1) */
        return c->sliding_window_pattern > 1 ? c->sliding_window : 0;
    default: return 0;
    }
}

int64_t kiln_llama_layer_window(const kiln_llama_config *c, int64_t layer) {
    int64_t w = kiln_llama_config_window(c);
    if (c->family == KILN_FAMILY_QWEN2 || c->family == KILN_FAMILY_QWEN3) return layer >= c->max_window_layers ? w : 0;
    if (KILN_FAMILY_IS_GEMMA(c->family)) return (layer + 1) % c->sliding_window_pattern ? w : 0;
    return w;
}

double kiln_llama_layer_rope(const kiln_llama_config *c, int64_t layer, const kiln_rope_scaling **s) {
    static const kiln_rope_scaling none = {.type = KILN_ROPE_DEFAULT, .factor = 1};
    if (c->family == KILN_FAMILY_GEMMA3 && kiln_llama_layer_window(c, layer)) {
        *s = &none;
        return c->rope_local_base_freq;
    }
    *s = &c->rope_scaling;
    return c->rope_theta;
}

bool kiln_llama_config_is_eos(const kiln_llama_config *c, int64_t id) {
    if (id < 0) return false;
    if (id == c->eos_token_id) return true;
    for (int i = 0; i < c->n_eos_more; i++)
        if (c->eos_more[i] == id) return true;
    return false;
}

bool kiln_llama_config_equal(const kiln_llama_config *a, const kiln_llama_config *b) {
    const kiln_rope_scaling *r = &a->rope_scaling, *q = &b->rope_scaling;
    bool rope = r->type == q->type &&
                (r->type == KILN_ROPE_DEFAULT ||
                 (r->factor == q->factor && (r->type == KILN_ROPE_LINEAR ||
                                             (r->low_freq_factor == q->low_freq_factor && r->high_freq_factor == q->high_freq_factor &&
                                              r->original_max_position_embeddings == q->original_max_position_embeddings))));
    bool eos = a->eos_token_id == b->eos_token_id && a->eos_is_list == b->eos_is_list && a->n_eos_more == b->n_eos_more;
    for (int i = 0; eos && i < a->n_eos_more; i++) eos = a->eos_more[i] == b->eos_more[i];
    return rope && eos && a->family == b->family && a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size && a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads && a->num_key_value_heads == b->num_key_value_heads &&
           a->max_position_embeddings == b->max_position_embeddings && a->head_dim == b->head_dim &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
           a->initializer_range == b->initializer_range && a->tie_word_embeddings == b->tie_word_embeddings &&
           a->attention_bias == b->attention_bias && a->mlp_bias == b->mlp_bias && a->sliding_window == b->sliding_window &&
           a->max_window_layers == b->max_window_layers && a->use_sliding_window == b->use_sliding_window &&
           a->bos_token_id == b->bos_token_id && a->pad_token_id == b->pad_token_id &&
           a->sliding_window_pattern == b->sliding_window_pattern && a->query_pre_attn_scalar == b->query_pre_attn_scalar &&
           a->attn_logit_softcapping == b->attn_logit_softcapping && a->final_logit_softcapping == b->final_logit_softcapping &&
           a->rope_local_base_freq == b->rope_local_base_freq;
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
    } else if (!strcmp(name, "124m")) { /* the GPT-2-small class, Llama-shaped: the realistic benchmark */
        c->hidden_size = 768, c->intermediate_size = 2048, c->num_hidden_layers = 12, c->num_attention_heads = 12;
        c->vocab_size = 32000;
        c->tie_word_embeddings = true;
    } else {
        return kiln_error(KILN_ERR_INVALID, "unknown model preset '%s' (tiny, small, demo, 124m, or a config.json path)", name);
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
    if ((unsigned)c->family > KILN_FAMILY_LAST) return kiln_error(KILN_ERR_INVALID, "config: unknown model family %d", (int)c->family);
    if (KILN_FAMILY_IS_GEMMA(c->family)) {
        if (c->sliding_window <= 0 || c->sliding_window > (1ll << 31))
            return kiln_error(KILN_ERR_INVALID, "config: sliding_window must be a positive integer below 2^31 for %s, got %lld",
                              kiln_family_name(c->family), (long long)c->sliding_window);
        if (c->sliding_window_pattern < 1 || c->sliding_window_pattern > (1ll << 31))
            return kiln_error(KILN_ERR_INVALID, "config: sliding_window_pattern must be a positive integer, got %lld",
                              (long long)c->sliding_window_pattern);
        struct { const char *name; double v; bool zero_ok; } g[] = {
            {"query_pre_attn_scalar", c->query_pre_attn_scalar, false},
            {"attn_logit_softcapping", c->attn_logit_softcapping, true},
            {"final_logit_softcapping", c->final_logit_softcapping, true},
            {"rope_local_base_freq", c->rope_local_base_freq, c->family != KILN_FAMILY_GEMMA3},
        };
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
            if (!isfinite(g[i].v) || g[i].v < 0 || (g[i].v == 0 && !g[i].zero_ok) || g[i].v > FLT_MAX ||
                (g[i].v > 0 && !((float)g[i].v > 0)))
                return kiln_error(KILN_ERR_INVALID, "config: %s must be a positive number representable as a float32%s, got %.17g",
                                  g[i].name, g[i].zero_ok ? " (or none)" : "", g[i].v);
    } else if (c->sliding_window_pattern || c->query_pre_attn_scalar || c->attn_logit_softcapping || c->final_logit_softcapping ||
               c->rope_local_base_freq) {
        return kiln_error(KILN_ERR_INVALID, "config: Gemma's fields (sliding_window_pattern, query_pre_attn_scalar, soft-caps, "
                                            "rope_local_base_freq) set for model_type %s", kiln_family_name(c->family));
    }
    if (c->sliding_window < 0 || c->sliding_window > (1ll << 31) || c->max_window_layers < 0 || c->max_window_layers > (1ll << 31))
        return kiln_error(KILN_ERR_INVALID, "config: sliding_window %lld / max_window_layers %lld must be integers in [0, 2^31]",
                          (long long)c->sliding_window, (long long)c->max_window_layers);
    if (c->num_attention_heads % c->num_key_value_heads)
        return kiln_error(KILN_ERR_INVALID, "config: num_key_value_heads %lld does not divide num_attention_heads %lld",
                          (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
    if (c->head_dim % 2) return kiln_error(KILN_ERR_INVALID, "config: head_dim %lld must be even for rotary embeddings", (long long)c->head_dim);
    const kiln_rope_scaling *rs = &c->rope_scaling;
    struct { const char *name; double v; } fl[] = {{"rms_norm_eps", c->rms_norm_eps}, {"rope_theta", c->rope_theta},
                                                   {"initializer_range", c->initializer_range},
                                                   {"rope_scaling.factor", rs->factor},
                                                   {"rope_scaling.low_freq_factor", rs->low_freq_factor},
                                                   {"rope_scaling.high_freq_factor", rs->high_freq_factor}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) /* used as float32: positive and finite there too */
        if (!isfinite(fl[i].v) || !(fl[i].v > 0) || fl[i].v > FLT_MAX || !((float)fl[i].v > 0))
            return kiln_error(KILN_ERR_INVALID, "config: %s must be a positive number representable as a float32, got %.17g",
                              fl[i].name, fl[i].v);
    if (rs->type < KILN_ROPE_DEFAULT || rs->type > KILN_ROPE_LLAMA3)
        return kiln_error(KILN_ERR_INVALID, "config: unknown rope_scaling type %d", (int)rs->type);
    if (rs->type == KILN_ROPE_LLAMA3 && !(rs->high_freq_factor > rs->low_freq_factor))
        return kiln_error(KILN_ERR_INVALID, "config: rope_scaling.high_freq_factor %.17g must be above low_freq_factor %.17g",
                          rs->high_freq_factor, rs->low_freq_factor);
    if (rs->type == KILN_ROPE_LLAMA3 &&
        (rs->original_max_position_embeddings <= 0 || rs->original_max_position_embeddings > (1ll << 31)))
        return kiln_error(KILN_ERR_INVALID, "config: rope_scaling.original_max_position_embeddings must be a positive integer below 2^31, got %lld",
                          (long long)rs->original_max_position_embeddings);
    if (c->n_eos_more < 0 || c->n_eos_more > KILN_CONFIG_MAX_EOS - 1 || (c->n_eos_more && !c->eos_is_list))
        return kiln_error(KILN_ERR_INVALID, "config: eos_token_id list of %d entries (at most %d)", c->n_eos_more + 1, KILN_CONFIG_MAX_EOS);
    for (int i = 0; i < c->n_eos_more; i++)
        if (c->eos_more[i] < 0 || c->eos_more[i] >= c->vocab_size)
            return kiln_error(KILN_ERR_INVALID, "config: eos_token_id entry %lld is outside the vocabulary (%lld)",
                              (long long)c->eos_more[i], (long long)c->vocab_size);
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

static json_t *rope_scaling_json(const kiln_rope_scaling *r) {
    if (r->type == KILN_ROPE_DEFAULT) return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "rope_type", json_string(r->type == KILN_ROPE_LINEAR ? "linear" : "llama3"));
    json_object_set_new(o, "factor", json_real(r->factor));
    if (r->type == KILN_ROPE_LLAMA3) {
        json_object_set_new(o, "low_freq_factor", json_real(r->low_freq_factor));
        json_object_set_new(o, "high_freq_factor", json_real(r->high_freq_factor));
        json_object_set_new(o, "original_max_position_embeddings", json_integer(r->original_max_position_embeddings));
    }
    return o;
}

/* Every field the family's Hugging Face config class reads, so that
 * library builds the model kiln trained (same model_type, architecture,
 * biases, norms, rope scaling and window). */
char *kiln_llama_config_to_json(const kiln_llama_config *c) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "architectures", json_pack("[s]", kiln_family_architecture(c->family)));
    json_object_set_new(o, "model_type", json_string(kiln_family_model_type(c->family)));
    bool gemma = KILN_FAMILY_IS_GEMMA(c->family);
    json_object_set_new(o, "hidden_act", json_string(gemma ? "gelu_pytorch_tanh" : "silu"));
    if (gemma) json_object_set_new(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
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
    json_object_set_new(o, "rope_scaling", rope_scaling_json(&c->rope_scaling));
    json_object_set_new(o, "initializer_range", json_real(c->initializer_range));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    json_object_set_new(o, "use_cache", json_true());
    if (c->family == KILN_FAMILY_LLAMA || c->family == KILN_FAMILY_QWEN3 || gemma)
        json_object_set_new(o, "attention_bias", json_boolean(c->attention_bias));
    if (gemma) {
        json_object_set_new(o, "query_pre_attn_scalar", json_real(c->query_pre_attn_scalar));
        json_object_set_new(o, "attn_logit_softcapping", c->attn_logit_softcapping ? json_real(c->attn_logit_softcapping) : json_null());
        json_object_set_new(o, "final_logit_softcapping", c->final_logit_softcapping ? json_real(c->final_logit_softcapping) : json_null());
        json_t *lt = json_array(); /* each layer's attention, as newer transformers write it */
        for (int64_t l = 0; l < c->num_hidden_layers; l++)
            json_array_append_new(lt, json_string(kiln_llama_layer_window(c, l) ? "sliding_attention" : "full_attention"));
        json_object_set_new(o, "layer_types", lt);
    }
    if (c->family == KILN_FAMILY_GEMMA3) { /* what transformers 4.50-4.52 read instead of layer_types */
        json_object_set_new(o, "sliding_window_pattern", json_integer(c->sliding_window_pattern));
        json_object_set_new(o, "rope_local_base_freq", json_real(c->rope_local_base_freq));
    }
    if (c->family == KILN_FAMILY_LLAMA) {
        json_object_set_new(o, "mlp_bias", json_boolean(c->mlp_bias));
        json_object_set_new(o, "pretraining_tp", json_integer(1)); /* read and ignored: it only splits HF's matmuls */
    }
    if (c->family != KILN_FAMILY_LLAMA)
        json_object_set_new(o, "sliding_window", c->sliding_window ? json_integer(c->sliding_window) : json_null());
    if (c->family == KILN_FAMILY_QWEN2 || c->family == KILN_FAMILY_QWEN3) {
        json_object_set_new(o, "use_sliding_window", json_boolean(c->use_sliding_window));
        json_object_set_new(o, "max_window_layers", json_integer(c->max_window_layers));
        if (c->use_sliding_window && c->sliding_window) { /* what newer transformers write: each layer's attention */
            json_t *lt = json_array();
            for (int64_t l = 0; l < c->num_hidden_layers; l++)
                json_array_append_new(lt, json_string(kiln_llama_layer_window(c, l) ? "sliding_attention" : "full_attention"));
            json_object_set_new(o, "layer_types", lt);
        }
    }
    if (c->bos_token_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    if (c->eos_is_list) {
        json_t *l = json_array();
        if (c->eos_token_id >= 0) json_array_append_new(l, json_integer(c->eos_token_id));
        for (int i = 0; i < c->n_eos_more; i++) json_array_append_new(l, json_integer(c->eos_more[i]));
        json_object_set_new(o, "eos_token_id", l);
    } else if (c->eos_token_id >= 0) {
        json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    }
    if (c->pad_token_id >= 0) json_object_set_new(o, "pad_token_id", json_integer(c->pad_token_id));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
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
