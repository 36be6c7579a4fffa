/* A model directory (config.json, model.safetensors, tokenizer.json) as one
 * GGUF file that llama.cpp runs: the metadata of the llama.cpp architecture
 * that represents the family (llama, qwen2, qwen3), the tokenizer as
 * tokenizer.ggml.* (export_gguf_tok.c), the tensors under llama.cpp's names
 * (for the llama architecture with q/k rows reordered for its RoPE), each
 * in the type llama.cpp's quantizer gives it for the file type, converted
 * (ggml's reference quantizers for the block types) as it is written. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "kiln/quant.h"
#include "export_gguf_impl.h"
#include "hostio.h"

#define PATH_CAP 4096

/* The file types: llama.cpp's llama_ftype (general.file_type) and the
 * block type of its matrices (llama_ftype_get_default_type). */
static const struct {
    const char *name;
    kiln_export_ftype ftype;
    kiln_ggml_type type;
} ftypes[] = {
    {"f32", KILN_FTYPE_F32, KILN_GGML_F32},          {"f16", KILN_FTYPE_F16, KILN_GGML_F16},
    {"bf16", KILN_FTYPE_BF16, KILN_GGML_BF16},       {"q8_0", KILN_FTYPE_Q8_0, KILN_GGML_Q8_0},
    {"q4_0", KILN_FTYPE_Q4_0, KILN_GGML_Q4_0},       {"q4_k_m", KILN_FTYPE_Q4_K_M, KILN_GGML_Q4_K},
    {"q4_k_s", KILN_FTYPE_Q4_K_S, KILN_GGML_Q4_K},   {"q5_k_m", KILN_FTYPE_Q5_K_M, KILN_GGML_Q5_K},
    {"q5_k_s", KILN_FTYPE_Q5_K_S, KILN_GGML_Q5_K},   {"q6_k", KILN_FTYPE_Q6_K, KILN_GGML_Q6_K},
};
#define N_FTYPES (int)(sizeof ftypes / sizeof ftypes[0])

static int ftype_index(kiln_export_ftype t) {
    for (int i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == t) return i;
    return -1;
}

const char *kiln_export_ftype_name(kiln_export_ftype t) {
    int i = ftype_index(t);
    return i < 0 ? NULL : ftypes[i].name;
}

kiln_status kiln_export_type_parse(const char *s, kiln_export_ftype *out) {
    for (int i = 0; i < N_FTYPES; i++)
        if (!strcasecmp(s, ftypes[i].name)) {
            *out = ftypes[i].ftype;
            return KILN_OK;
        }
    return kiln_error(KILN_ERR_INVALID,
                      "unknown GGUF type '%s' (f32, f16, bf16, q8_0, q4_0, q4_k_m, q4_k_s, q5_k_m, q5_k_s or q6_k)", s);
}

/* ---- the model's family ------------------------------------------------ */

/* How a kiln family is written as one of llama.cpp's architectures
 * (llama-arch.cpp, src/models/): Llama and Mistral as "llama" (Hugging
 * Face's converter does the same for Mistral: llama.cpp's llama graph is
 * the same network), Qwen2 as "qwen2", Qwen3 as "qwen3" (kiln_gguf_arch,
 * export_gguf_impl.h). */
typedef kiln_gguf_arch arch_plan;

/* What each architecture of llama.cpp can hold, checked on the parsed
 * config (kiln_llama_config_parse has already refused anything kiln itself
 * does not implement). Each refusal names the field and the reason. */
kiln_status kiln_gguf_plan_arch(const char *path, const kiln_llama_config *c, arch_plan *a) {
    memset(a, 0, sizeof *a);
    bool decoupled = c->head_dim * c->num_attention_heads != c->hidden_size;
    kiln_rope_type rope = c->rope_scaling.type;
    switch (c->family) {
    case KILN_FAMILY_LLAMA:
    case KILN_FAMILY_MISTRAL:
        a->arch = "llama", a->permute = true, a->rope_freqs = rope == KILN_ROPE_LLAMA3;
        break;
    case KILN_FAMILY_QWEN2:
        a->arch = "qwen2";
        if (decoupled)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: head_dim %lld x %lld heads != hidden_size %lld: llama.cpp's qwen2 architecture sizes "
                              "attn_q by the embedding length (its loader refuses the file: wrong shape)",
                              path, (long long)c->head_dim, (long long)c->num_attention_heads, (long long)c->hidden_size);
        break;
    case KILN_FAMILY_QWEN3:
        a->arch = "qwen3";
        if (c->attention_bias)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: attention_bias is true: Qwen3 models have no attention biases and kiln export does not write "
                              "them for llama.cpp's qwen3 architecture (not checked to be read there)",
                              path);
        break;
    case KILN_FAMILY_GEMMA2:
    case KILN_FAMILY_GEMMA3: {
        /* llama.cpp's gemma2/gemma3 fix what config.json may vary: the
         * layer pattern (every 2nd / 6th layer full), the score scale
         * (1 / sqrt(head_dim) below 27B), Gemma 3's local RoPE base
         * (10000); Gemma 2 always soft-caps its scores (50 unless the file
         * says), Gemma 3 never; neither has attention biases */
        bool g2 = c->family == KILN_FAMILY_GEMMA2;
        a->arch = g2 ? "gemma2" : "gemma3", a->gemma = true;
        int64_t pattern = g2 ? 2 : 6;
        int64_t big = g2 ? 46 : 62; /* the 27B models: n_embd / n_head */
        double scalar = c->num_hidden_layers == big ? (double)(c->hidden_size / c->num_attention_heads) : (double)c->head_dim;
        const char *why = NULL;
        char b[200];
        if (c->sliding_window_pattern != pattern) {
            snprintf(b, sizeof b, "sliding_window_pattern %lld: llama.cpp's %s attends fully on every %lld-th layer only",
                     (long long)c->sliding_window_pattern, a->arch, (long long)pattern);
            why = b;
        } else if (c->query_pre_attn_scalar != scalar) {
            snprintf(b, sizeof b, "query_pre_attn_scalar %g: llama.cpp's %s scales the scores by 1 / sqrt(%g) for %lld layers", c->query_pre_attn_scalar,
                     a->arch, scalar, (long long)c->num_hidden_layers);
            why = b;
        } else if (c->attention_bias) {
            why = "attention_bias is true: llama.cpp's Gemma architectures have no attention biases";
        } else if (g2 && !(c->attn_logit_softcapping > 0)) {
            why = "attn_logit_softcapping is null: llama.cpp's gemma2 always soft-caps the attention scores";
        } else if (g2 && !(c->final_logit_softcapping > 0)) {
            why = "final_logit_softcapping is null: llama.cpp's gemma2 soft-caps the logits at 30 unless the file says otherwise";
        } else if (!g2 && c->attn_logit_softcapping > 0) {
            why = "attn_logit_softcapping is set: llama.cpp's gemma3 does not soft-cap the attention scores";
        } else if (!g2 && c->final_logit_softcapping > 0) {
            why = "final_logit_softcapping is set: kiln export does not write it for llama.cpp's gemma3 (not checked to be read there)";
        } else if (!g2 && c->rope_local_base_freq != 10000.0) {
            snprintf(b, sizeof b, "rope_local_base_freq %g: llama.cpp's gemma3 rotates its sliding layers with base 10000",
                     c->rope_local_base_freq);
            why = b;
        }
        if (why) return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s", path, why);
        break;
    }
    default: return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model family %d has no llama.cpp architecture", path, (int)c->family);
    }
    if (rope == KILN_ROPE_LLAMA3 && !a->rope_freqs)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: rope_scaling llama3 with model_type %s: llama.cpp's %s architecture reads no rope_freqs "
                          "tensor (only its llama architecture does)",
                          path, kiln_family_name(c->family), a->arch);
    /* llama.cpp's llama and qwen2 architectures attend to every position;
     * within the window they equal kiln's sliding-window attention, so the
     * file's context_length is the window */
    int64_t win = kiln_llama_config_window(c);
    a->context = win > 0 && win < c->max_position_embeddings && !a->gemma ? win : c->max_position_embeddings;
    return KILN_OK;
}

static kiln_status set_arch(kiln_gguf_writer *w, const kiln_llama_config *c, const arch_plan *a, const char *name,
                            kiln_export_ftype ftype) {
    struct { const char *k; int64_t v; } u[] = {
        {"context_length", a->context},          {"embedding_length", c->hidden_size},
        {"block_count", c->num_hidden_layers},   {"feed_forward_length", c->intermediate_size},
        {"attention.head_count", c->num_attention_heads}, {"attention.head_count_kv", c->num_key_value_heads},
        {"attention.key_length", c->head_dim},   {"attention.value_length", c->head_dim},
        {"rope.dimension_count", c->head_dim},   {"vocab_size", c->vocab_size},
    };
    char key[96];
    kiln_status st = kiln_gguf_set_str(w, "general.architecture", a->arch);
    if (!st) st = kiln_gguf_set_str(w, "general.name", name);
    if (!st) st = kiln_gguf_set_u32(w, "general.file_type", (uint32_t)ftype);
    if (!st) st = kiln_gguf_set_u32(w, "general.quantization_version", 2);
    for (size_t i = 0; i < sizeof u / sizeof u[0] && !st; i++) {
        snprintf(key, sizeof key, "%s.%s", a->arch, u[i].k);
        st = kiln_gguf_set_u32(w, key, (uint32_t)u[i].v);
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", a->arch);
    if (!st) st = kiln_gguf_set_f32(w, key, (float)c->rope_theta);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a->arch);
    if (!st) st = kiln_gguf_set_f32(w, key, (float)c->rms_norm_eps);
    /* linear: llama.cpp scales positions by 1 / factor, which is Hugging
     * Face's dividing every frequency by it */
    if (!st && a->gemma) { /* llama.cpp's Gemma attends within the window on its sliding layers */
        snprintf(key, sizeof key, "%s.attention.sliding_window", a->arch);
        st = kiln_gguf_set_u32(w, key, (uint32_t)c->sliding_window);
    }
    struct { const char *k; double v; } caps[] = {{"attn_logit_softcapping", c->attn_logit_softcapping},
                                                  {"final_logit_softcapping", c->final_logit_softcapping}};
    for (int i = 0; i < 2 && !st && a->gemma; i++)
        if (caps[i].v > 0) {
            snprintf(key, sizeof key, "%s.%s", a->arch, caps[i].k);
            st = kiln_gguf_set_f32(w, key, (float)caps[i].v);
        }
    if (!st && c->rope_scaling.type == KILN_ROPE_LINEAR) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", a->arch);
        st = kiln_gguf_set_str(w, key, "linear");
        snprintf(key, sizeof key, "%s.rope.scaling.factor", a->arch);
        if (!st) st = kiln_gguf_set_f32(w, key, (float)c->rope_scaling.factor);
    }
    return st;
}

/* rope_scaling llama3 as llama.cpp holds it: one divisor per frequency
 * (rope_freqs.weight, head_dim / 2 values), by Hugging Face's rules: 1 for
 * wavelengths below original_max / high_freq_factor, factor above
 * original_max / low_freq_factor, and between them the inverse of the
 * interpolation weight (1 - s) / factor + s. */
float *kiln_llama3_freq_factors(const kiln_llama_config *c) {
    const kiln_rope_scaling *r = &c->rope_scaling;
    int64_t half = c->head_dim / 2;
    float *f = malloc((size_t)half * sizeof *f);
    const double two_pi = 6.283185307179586476925286766559;
    for (int64_t j = 0; f && j < half; j++) {
        double freq = 1.0 / pow(c->rope_theta, (double)(2 * j) / (double)c->head_dim), wl = two_pi / freq;
        double old = (double)r->original_max_position_embeddings;
        double lo_wl = old / r->low_freq_factor, hi_wl = old / r->high_freq_factor;
        if (wl < hi_wl) f[j] = 1.0f;
        else if (wl > lo_wl) f[j] = (float)r->factor;
        else {
            double s = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            f[j] = (float)(1.0 / ((1.0 - s) / r->factor + s));
        }
    }
    return f;
}

/* ---- tensors ----------------------------------------------------------- */

typedef struct {
    char name[64];
    const kiln_tensor *t; /* NULL: values below */
    const float *values;  /* a tensor computed here (rope_freqs), host memory */
    int64_t n;            /* its length */
    int heads;            /* > 0: q or k projection (or bias), rows reordered per head */
    bool plus_one;        /* Gemma's norms: llama.cpp multiplies by the weight, Gemma by 1 + w */
    kiln_ggml_type type;
} out_tensor;

/* Each tensor's type as llama.cpp's llama_model_quantize gives it for the
 * file type without an importance matrix (llama-quant.cpp: what
 * tensor_allows_quantization, llama_tensor_get_type_impl and
 * tensor_type_fallback do for the llama, qwen2 and qwen3 architectures,
 * which have no experts and no fused qkv): norms, biases and rope_freqs
 * (1-D) stay F32, as its converter leaves them; the plain types (f32, f16,
 * bf16) put every matrix in that type. The layer counters llama.cpp keeps
 * (it visits the tensors sorted by layer, one attn_v and one ffn_down per
 * layer) are the layer index here. */
typedef struct {
    kiln_export_ftype ftype;
    kiln_ggml_type base; /* the file type's block type */
    int n_layers;
    bool tied;           /* no output.weight: token_embd is the output too */
} type_mix;

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third one between */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static kiln_status tensor_type(const type_mix *mx, const char *name, const kiln_tensor *t, kiln_ggml_type *out) {
    *out = KILN_GGML_F32;
    if (!t || t->ndim < 2) return KILN_OK;
    kiln_ggml_type ty = mx->base;
    if (!kiln_qtype_find((int)ty)->quantized) { /* f32/f16/bf16: as asked */
        *out = ty;
        return KILN_OK;
    }
    int64_t nx = t->shape[t->ndim - 1];
    int layer = -1;
    sscanf(name, "blk.%d.", &layer);
    kiln_export_ftype f = mx->ftype;
    if (!strcmp(name, "output.weight") || (mx->tied && !strcmp(name, "token_embd.weight"))) {
        if (nx % kiln_ggml_block(ty)) ty = KILN_GGML_Q8_0;
        else if (ty != KILN_GGML_Q8_0) ty = KILN_GGML_Q6_K;
    } else if (strstr(name, "attn_v.weight")) {
        if ((f == KILN_FTYPE_Q4_K_M || f == KILN_FTYPE_Q5_K_M) && more_bits(layer, mx->n_layers)) ty = KILN_GGML_Q6_K;
        else if (f == KILN_FTYPE_Q4_K_S && layer < 4) ty = KILN_GGML_Q5_K;
    } else if (strstr(name, "ffn_down")) {
        if ((f == KILN_FTYPE_Q4_K_M || f == KILN_FTYPE_Q5_K_M) && more_bits(layer, mx->n_layers)) ty = KILN_GGML_Q6_K;
        else if (f == KILN_FTYPE_Q4_K_S && layer < mx->n_layers / 8) ty = KILN_GGML_Q5_K;
    }
    /* rows that are not whole blocks of the chosen type */
    if (nx % kiln_ggml_block(ty)) {
        /* llama.cpp's fallbacks: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0 */
        if (ty == KILN_GGML_Q4_K) ty = KILN_GGML_Q5_0;
        else if (ty == KILN_GGML_Q5_K) ty = KILN_GGML_Q5_1;
        if (ty == KILN_GGML_Q6_K) ty = KILN_GGML_Q8_0;
        if (nx % kiln_ggml_block(ty)) ty = KILN_GGML_F16;
    }
    *out = ty;
    return KILN_OK;
}

/* The tensors in file order, their types still to be chosen (F32). */
static int plan_tensors(const kiln_llama *m, const arch_plan *a, const float *rope_freqs, out_tensor *o) {
    int n = 0;
    const kiln_llama_config *c = &m->cfg;
    int hq = a->permute ? (int)c->num_attention_heads : 0, hk = a->permute ? (int)c->num_key_value_heads : 0;
#define ADD(nm, tensor, h)                                                                  \
    do {                                                                                    \
        if (tensor) {                                                                       \
            memset(&o[n], 0, sizeof o[n]);                                                  \
            snprintf(o[n].name, sizeof o[n].name, "%s", nm);                                \
            o[n].t = (tensor), o[n].heads = (h), o[n].type = KILN_GGML_F32;                 \
            n++;                                                                            \
        }                                                                                   \
    } while (0)
    ADD("token_embd.weight", m->embed_tokens, 0);
    if (rope_freqs) {
        memset(&o[n], 0, sizeof o[n]);
        snprintf(o[n].name, sizeof o[n].name, "rope_freqs.weight");
        o[n].values = rope_freqs, o[n].n = c->head_dim / 2, o[n].type = KILN_GGML_F32;
        n++;
    }
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        char nm[64];
#define LAYER(suffix, tensor, h)                                         \
    do {                                                                 \
        snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)l, suffix);    \
        ADD(nm, tensor, h);                                              \
    } while (0)
        LAYER("attn_norm.weight", L->input_layernorm, 0);
        LAYER("attn_q.weight", L->q_proj, hq);
        LAYER("attn_q.bias", L->q_bias, hq);
        LAYER("attn_k.weight", L->k_proj, hk);
        LAYER("attn_k.bias", L->k_bias, hk);
        LAYER("attn_v.weight", L->v_proj, 0);
        LAYER("attn_v.bias", L->v_bias, 0);
        /* qwen3 normalises each head before RoPE: one head's weights, in
         * Hugging Face's order, as qwen3 does not permute */
        LAYER("attn_q_norm.weight", L->q_norm, 0);
        LAYER("attn_k_norm.weight", L->k_norm, 0);
        LAYER("attn_output.weight", L->o_proj, 0);
        LAYER("attn_output.bias", L->o_bias, 0);
        if (a->gemma) { /* Gemma's block norms: after attention, before and after the MLP */
            LAYER("post_attention_norm.weight", L->post_attention_layernorm, 0);
            LAYER("ffn_norm.weight", L->pre_feedforward_layernorm, 0);
            LAYER("post_ffw_norm.weight", L->post_feedforward_layernorm, 0);
        } else {
            LAYER("ffn_norm.weight", L->post_attention_layernorm, 0);
        }
        LAYER("ffn_gate.weight", L->gate_proj, 0);
        LAYER("ffn_gate.bias", L->gate_bias, 0);
        LAYER("ffn_up.weight", L->up_proj, 0);
        LAYER("ffn_up.bias", L->up_bias, 0);
        LAYER("ffn_down.weight", L->down_proj, 0);
        LAYER("ffn_down.bias", L->down_bias, 0);
#undef LAYER
    }
    ADD("output_norm.weight", m->norm, 0);
    if (!c->tie_word_embeddings) ADD("output.weight", m->lm_head, 0);
#undef ADD
    for (int i = 0; i < n && a->gemma; i++) o[i].plus_one = strstr(o[i].name, "norm.weight") != NULL;
    return n;
}

/* Hugging Face orders each head's q/k rows as two halves (rotate_half);
 * llama.cpp's llama architecture rotates adjacent pairs. Row 2j + s of a
 * head in the file is row s * (d / 2) + j of the Hugging Face head (a
 * bias's elements move with their rows). qwen2/qwen3 rotate halves (NEOX)
 * as Hugging Face does: nothing moves. */
int64_t kiln_gguf_qk_source_row(int64_t rows, int heads, int64_t r) {
    if (heads <= 0) return r;
    int64_t d = rows / heads, h = r / d, i = r % d;
    return h * d + (i % 2) * (d / 2) + i / 2;
}

static int64_t source_row(const out_tensor *o, int64_t r) { return kiln_gguf_qk_source_row(o->t->shape[0], o->heads, r); }

static kiln_status write_values(kiln_gguf_writer *w, const out_tensor *o, const float *x, void *buf);

static kiln_status write_tensor(kiln_gguf_writer *w, const out_tensor *o, void *buf) {
    if (!o->t) {
        kiln_status st = kiln_gguf_write_data(w, o->values, (size_t)o->n * sizeof(float));
        return st ? kiln_error_context(st, "tensor %s", o->name) : KILN_OK;
    }
    const kiln_tensor *t = o->t;
    if (t->dtype != KILN_F32)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tensor %s (%s) is %s, not f32", t->name, o->name, kiln_dtype_name(t->dtype));
    /* the tensor's values in host memory (its own where host-mappable) */
    void *owned = NULL;
    const float *x = kiln_host_bytes(t, &owned);
    if (!x) return kiln_error_context(kiln_last_status(), "tensor %s", o->name);
    float *shifted = NULL;
    if (o->plus_one) { /* 1 + w, as llama.cpp's converter writes Gemma's norms */
        int64_t k = kiln_tensor_numel(t);
        shifted = malloc((size_t)(k ? k : 1) * sizeof *shifted);
        if (!shifted) {
            free(owned);
            return kiln_error(KILN_ERR_OOM, "out of memory writing %s", o->name);
        }
        for (int64_t j = 0; j < k; j++) shifted[j] = 1.0f + x[j];
        x = shifted;
    }
    kiln_status st = write_values(w, o, x, buf);
    free(shifted);
    free(owned);
    return st;
}

static kiln_status write_values(kiln_gguf_writer *w, const out_tensor *o, const float *x, void *buf) {
    const kiln_tensor *t = o->t;
    /* a permuted bias: one element a row */
    int64_t cols = t->ndim == 1 && o->heads > 0 ? 1 : t->shape[t->ndim - 1], rows = kiln_tensor_numel(t) / cols;
    if (o->type != KILN_GGML_F32 || t->ndim > 1 || o->heads <= 0) {
        size_t row_bytes = kiln_ggml_nbytes(o->type, cols);
        for (int64_t r = 0; r < rows; r++) {
            const float *src = x + source_row(o, r) * cols;
            for (int64_t j = 0; j < cols; j++)
                if (!isfinite(src[j]))
                    return kiln_error(KILN_ERR_NUMERIC, "tensor %s (%s): element [%lld, %lld] is %g", t->name, o->name,
                                      (long long)source_row(o, r), (long long)j, src[j]);
            /* block types as ggml's reference quantizers write them */
            kiln_status st = kiln_qtype_find((int)o->type)->quantized ? kiln_q_quantize((kiln_qtype)o->type, src, buf, cols)
                                                                      : kiln_ggml_convert(o->type, src, cols, buf);
            if (!st) st = kiln_gguf_write_data(w, buf, row_bytes);
            if (st) return kiln_error_context(st, "tensor %s", o->name);
        }
        return KILN_OK;
    }
    float *p = buf; /* a permuted f32 bias, gathered and written at once */
    for (int64_t r = 0; r < rows; r++) {
        p[r] = x[source_row(o, r)];
        if (!isfinite(p[r]))
            return kiln_error(KILN_ERR_NUMERIC, "tensor %s (%s): element [%lld] is %g", t->name, o->name,
                              (long long)source_row(o, r), p[r]);
    }
    kiln_status st = kiln_gguf_write_data(w, p, (size_t)rows * sizeof *p);
    return st ? kiln_error_context(st, "tensor %s", o->name) : KILN_OK;
}

kiln_status kiln_export_gguf(const char *run_or_model_dir, const char *out_path, const kiln_export_gguf_opts *opts,
                             kiln_export_gguf_stats *stats) {
    char dir[PATH_CAP], path[PATH_CAP + 32], tok_path[PATH_CAP + 32];
    /* a run directory stands for its newest complete checkpoint */
    kiln_status rs = kiln_model_dir_resolve(run_or_model_dir, dir, sizeof dir);
    if (rs) return rs;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (opts->tokenizer) snprintf(tok_path, sizeof tok_path, "%s", opts->tokenizer);
    else snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    int fi = ftype_index(opts->ftype);
    if (fi < 0) return kiln_error(KILN_ERR_INVALID, "unknown GGUF file type %d", (int)opts->ftype);
    /* what llama.cpp cannot hold is refused from config.json and
     * tokenizer.json before any weight is read */
    kiln_llama_config cfg;
    arch_plan a;
    kiln_gguf_vocab v = {0};
    kiln_status st = kiln_llama_config_load(path, &cfg);
    if (!st) st = kiln_gguf_plan_arch(path, &cfg, &a);
    if (!st) st = kiln_gguf_vocab_read(tok_path, cfg.vocab_size, &v);
    if (st) return kiln_error_context(st, "exporting %s to %s", run_or_model_dir, out_path);
    kiln_llama *m = NULL;
    if ((st = kiln_load_model_dir(dir, &m))) {
        kiln_gguf_vocab_free(&v);
        return st;
    }
    /* a LoRA run: GGUF holds one set of weights, so the adapters are merged
     * (W + alpha/r B A), never dropped */
    if (m->lora_a) st = kiln_llama_lora_merge(m);
    const kiln_llama_config *c = &m->cfg;
    kiln_gguf_writer *w = NULL;
    out_tensor *ot = calloc((size_t)(4 + 20 * c->num_hidden_layers), sizeof *ot);
    float *freqs = a.rope_freqs ? kiln_llama3_freq_factors(c) : NULL;
    const char *slash = strrchr(run_or_model_dir, '/');
    const char *name = opts->name ? opts->name : (slash && slash[1] ? slash + 1 : run_or_model_dir);
    if (!st && (!ot || (a.rope_freqs && !freqs))) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = kiln_gguf_writer_new(&w);
    if (!st) st = set_arch(w, c, &a, name, opts->ftype);
    if (!st) st = kiln_gguf_vocab_set(w, c, tok_path, dir, &v);
    int n = st ? 0 : plan_tensors(m, &a, freqs, ot);
    type_mix mx = {opts->ftype, ftypes[fi].type, (int)c->num_hidden_layers, c->tie_word_embeddings};
    for (int i = 0; i < n && !st; i++)
        if ((st = tensor_type(&mx, ot[i].name, ot[i].t, &ot[i].type))) st = kiln_error_context(st, "file type %s", ftypes[fi].name);
    int64_t max_cols = 0;
    for (int i = 0; i < n && !st; i++) {
        if (ot[i].t) st = kiln_gguf_add_tensor(w, ot[i].name, ot[i].type, ot[i].t->ndim, ot[i].t->shape);
        else st = kiln_gguf_add_tensor(w, ot[i].name, ot[i].type, 1, &ot[i].n);
        int64_t cols = ot[i].t ? ot[i].t->shape[ot[i].t->ndim - 1] : ot[i].n;
        max_cols = cols > max_cols ? cols : max_cols;
    }
    void *row = st ? NULL : malloc((size_t)max_cols * 4);
    if (!st && !row) st = kiln_error(KILN_ERR_OOM, "out of memory");
    /* what killed exports to this file left (full-size temporaries) */
    if (!st && kiln_export_clean(out_path)) kiln_log(KILN_LOG_WARN, "kiln export: %s", kiln_last_error());
    if (!st) st = kiln_gguf_begin(w, out_path);
    for (int i = 0; i < n && !st; i++) st = write_tensor(w, &ot[i], row);
    if (!st) st = kiln_gguf_finish(w);
    if (!st && stats) {
        stats->n_tensors = n;
        stats->n_tokens = v.n;
        stats->n_merges = (int64_t)v.n_merges;
        stats->n_params = kiln_llama_num_params(m);
        stats->data_bytes = 0;
        memset(stats->n_of_type, 0, sizeof stats->n_of_type);
        for (int i = 0; i < n; i++) {
            stats->data_bytes += kiln_gguf_tensor_nbytes(w, i);
            if ((int)ot[i].type <= KILN_GGML_BF16) stats->n_of_type[ot[i].type]++;
        }
        stats->arch = a.arch;
        stats->pre = v.pre;
        stats->tok_model = v.model;
        stats->add_space_prefix = v.add_space_prefix;
    }
    free(row);
    free(ot);
    free(freqs);
    kiln_gguf_vocab_free(&v);
    kiln_gguf_writer_free(w);
    kiln_llama_free(m);
    return st ? kiln_error_context(st, "exporting %s to %s", run_or_model_dir, out_path) : KILN_OK;
}
