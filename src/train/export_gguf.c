/* A model directory (config.json, model.safetensors, tokenizer.json) as one
 * GGUF file that llama.cpp runs: the llama architecture's metadata, the
 * tokenizer as tokenizer.ggml.*, the tensors under llama.cpp's names with
 * q/k rows reordered for its RoPE, converted to the requested type as they
 * are written. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/gguf.h"
#include "kiln/train.h"

#define PATH_CAP 4096

/* llama.cpp's llama_ftype numbers for general.file_type */
static uint32_t file_type(kiln_ggml_type t) {
    switch (t) {
    case KILN_GGML_F16: return 1;
    case KILN_GGML_Q8_0: return 7;
    case KILN_GGML_BF16: return 32;
    default: return 0;
    }
}

kiln_status kiln_export_type_parse(const char *s, kiln_ggml_type *out) {
    static const struct { const char *name; kiln_ggml_type t; } types[] = {
        {"f32", KILN_GGML_F32}, {"f16", KILN_GGML_F16}, {"bf16", KILN_GGML_BF16}, {"q8_0", KILN_GGML_Q8_0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(s, types[i].name)) {
            *out = types[i].t;
            return KILN_OK;
        }
    return kiln_error(KILN_ERR_INVALID, "unknown GGUF type '%s' (f32, f16, bf16 or q8_0)", s);
}

/* ---- the model's family ------------------------------------------------ */

/* config.json fields that change the network in ways the llama architecture
 * of llama.cpp does not express are refused by name. */
static kiln_status check_family(const char *path) {
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, e.line, e.text);
    kiln_status st = KILN_OK;
    json_t *mt = json_object_get(root, "model_type");
    if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), "llama")))
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "%s: model_type %s: kiln export writes llama.cpp's llama architecture only", path,
                        json_is_string(mt) ? json_string_value(mt) : "(not a string)");
    static const char *const must_be_false[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2 && !st; i++) {
        json_t *v = json_object_get(root, must_be_false[i]);
        if (v && !json_is_false(v) && !json_is_null(v))
            st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s is set: bias tensors are not exported", path, must_be_false[i]);
    }
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!st && rs && !json_is_null(rs))
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: rope_scaling is not exported (llama.rope.scaling.* not implemented)", path);
    json_decref(root);
    return st;
}

/* ---- tokenizer --------------------------------------------------------- */

typedef struct {
    char **tokens;
    size_t *lens;
    int32_t *types;
    char **merges;
    size_t n_merges;
    int64_t n;
    const char *pre;
} vocab;

static void vocab_free(vocab *v) {
    for (int64_t i = 0; v->tokens && i < v->n; i++) free(v->tokens[i]);
    for (size_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens), free(v->lens), free(v->types), free(v->merges);
}

/* llama.cpp names each pre-tokenizer regex it implements; kiln's own
 * tokenizers declare the GPT-2 one: ByteLevel with its regex, no prefix
 * space, no normalizer. Anything else would tokenize differently there. */
static kiln_status pre_type(const char *path, json_t *root, const char **pre) {
    json_t *norm = json_object_get(root, "normalizer"), *pt = json_object_get(root, "pre_tokenizer");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model) || !json_is_string(json_object_get(model, "type")) ||
        strcmp(json_string_value(json_object_get(model, "type")), "BPE"))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.type must be \"BPE\" (byte-level BPE, tokenizer.ggml.model gpt2)", path);
    json_t *bf = json_object_get(model, "byte_fallback");
    if (bf && json_is_true(bf))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: model.byte_fallback is true (SentencePiece-style BPE, llama.cpp's \"llama\" tokenizer): not exported", path);
    if (norm && !json_is_null(norm))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: a normalizer is set; llama.cpp's gpt2 tokenizer applies none", path);
    const char *pt_type = json_is_object(pt) ? json_string_value(json_object_get(pt, "type")) : NULL;
    if (!pt_type || strcmp(pt_type, "ByteLevel"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer %s: kiln export maps only the GPT-2 ByteLevel pre-tokenizer to llama.cpp's (\"gpt-2\")",
                          path, pt_type ? pt_type : "(none)");
    json_t *aps = json_object_get(pt, "add_prefix_space"), *ur = json_object_get(pt, "use_regex");
    if ((aps && json_is_true(aps)) || (ur && json_is_false(ur)))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer ByteLevel with add_prefix_space true or use_regex false has no llama.cpp pre-tokenizer", path);
    *pre = "gpt-2";
    return KILN_OK;
}

static kiln_status set_token(vocab *v, const char *path, int64_t id, const char *s, size_t n, int32_t type) {
    if (id < 0 || id >= v->n)
        return kiln_error(KILN_ERR_RANGE, "%s: token '%.*s' has id %lld, outside the model's vocabulary of %lld", path,
                          (int)(n > 40 ? 40 : n), s, (long long)id, (long long)v->n);
    if (v->tokens[id] && (v->lens[id] != n || memcmp(v->tokens[id], s, n)))
        return kiln_error(KILN_ERR_FORMAT, "%s: id %lld is both '%s' and '%.*s'", path, (long long)id, v->tokens[id],
                          (int)(n > 40 ? 40 : n), s);
    if (!v->tokens[id] && !(v->tokens[id] = strndup(s, n))) return kiln_error(KILN_ERR_OOM, "out of memory");
    v->lens[id] = n;
    v->types[id] = type;
    return KILN_OK;
}

/* GGUF token types (llama.cpp's llama_token_type) */
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

static kiln_status read_vocab(const char *path, int64_t n_vocab, vocab *v) {
    memset(v, 0, sizeof *v);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, e.line, e.text);
    kiln_status st = pre_type(path, root, &v->pre);
    json_t *model = json_object_get(root, "model");
    json_t *jv = st ? NULL : json_object_get(model, "vocab"), *jm = st ? NULL : json_object_get(model, "merges");
    if (!st && (!json_is_object(jv) || !json_is_array(jm)))
        st = kiln_error(KILN_ERR_FORMAT, "%s: model.vocab must be an object and model.merges an array", path);
    v->n = n_vocab;
    if (!st && (!(v->tokens = calloc((size_t)n_vocab, sizeof *v->tokens)) || !(v->lens = calloc((size_t)n_vocab, sizeof *v->lens)) ||
                !(v->types = calloc((size_t)n_vocab, sizeof *v->types))))
        st = kiln_error(KILN_ERR_OOM, "out of memory");
    const char *k;
    json_t *val;
    if (!st) json_object_foreach(jv, k, val) {
        if (!json_is_integer(val)) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.vocab['%s'] is not an integer id", path, k);
            break;
        }
        if ((st = set_token(v, path, json_integer_value(val), k, strlen(k), TT_NORMAL))) break;
    }
    json_t *added = st ? NULL : json_object_get(root, "added_tokens");
    size_t i;
    if (added && json_is_array(added)) json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id"), *content = json_object_get(val, "content");
        if (!json_is_integer(id) || !json_is_string(content)) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: added_tokens[%zu] lacks an integer id or a string content", path, i);
            break;
        }
        int32_t type = json_is_true(json_object_get(val, "special")) ? TT_CONTROL : TT_USER_DEFINED;
        if ((st = set_token(v, path, json_integer_value(id), json_string_value(content), json_string_length(content), type)))
            break;
    }
    /* ids the model has beyond the tokenizer's (a rounded-up embedding) */
    for (int64_t id = 0; !st && id < v->n; id++)
        if (!v->tokens[id]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
            st = set_token(v, path, id, pad, strlen(pad), TT_UNUSED);
        }
    v->n_merges = st ? 0 : json_array_size(jm);
    if (!st && !(v->merges = calloc(v->n_merges + 1, sizeof *v->merges))) st = kiln_error(KILN_ERR_OOM, "out of memory");
    for (i = 0; !st && i < v->n_merges; i++) {
        json_t *m = json_array_get(jm, i);
        if (json_is_string(m)) v->merges[i] = strdup(json_string_value(m));
        else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                 json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
            if ((v->merges[i] = malloc(strlen(a) + strlen(b) + 2))) sprintf(v->merges[i], "%s %s", a, b);
        } else {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
            break;
        }
        if (!v->merges[i]) st = kiln_error(KILN_ERR_OOM, "out of memory");
    }
    json_decref(root);
    return st;
}

/* The special ids and the chat template as kiln generate uses them: the
 * prompt starts with the tokenizer's bos; generation stops at any of the
 * model's eos ids (generation_config.json, config.json, tokenizer_config.json
 * through kiln_model_meta). llama.cpp holds one eos and one end-of-turn id. */
static kiln_status set_tokenizer(kiln_gguf_writer *w, const kiln_llama_config *c, const char *tok_path,
                                 const char *dir, vocab *v) {
    kiln_tokenizer *tok = NULL;
    kiln_model_meta meta = {.bos_id = -1, .pad_id = -1};
    kiln_status st = kiln_tokenizer_load(tok_path, &tok); /* kiln must be able to use it as well */
    if (!st) st = kiln_model_meta_load(dir, tok, &meta);
    if (st) {
        kiln_tokenizer_free(tok);
        return st;
    }
    bool add_bos = kiln_tokenizer_bos(tok) >= 0;
    int64_t bos = add_bos ? kiln_tokenizer_bos(tok) : meta.bos_id;
    int64_t pad = meta.pad_id >= 0 ? meta.pad_id : kiln_tokenizer_pad(tok);
    int64_t eos = meta.n_eos > 0 ? meta.eos_ids[0] : kiln_tokenizer_eos(tok), eot = meta.n_eos > 1 ? meta.eos_ids[1] : -1;
    if (kiln_tokenizer_vocab_size(tok) > c->vocab_size)
        st = kiln_error(KILN_ERR_INVALID, "%s has %d tokens but the model only %lld", tok_path, kiln_tokenizer_vocab_size(tok),
                        (long long)c->vocab_size);
    if (!st && meta.n_eos > 2)
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: %d eos ids; GGUF holds two (tokenizer.ggml.eos_token_id, eot_token_id)", dir,
                        meta.n_eos);
    kiln_tokenizer_free(tok);
    if (!st) st = read_vocab(tok_path, c->vocab_size, v);
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (!st) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->lens, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, v->types, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, v->n_merges);
    struct { const char *k; int64_t id; } ids[] = {{"tokenizer.ggml.bos_token_id", bos}, {"tokenizer.ggml.eos_token_id", eos},
                                                   {"tokenizer.ggml.eot_token_id", eot}, {"tokenizer.ggml.padding_token_id", pad}};
    for (int i = 0; i < 4 && !st; i++) {
        if (ids[i].id >= c->vocab_size)
            st = kiln_error(KILN_ERR_RANGE, "%s: %s %lld is outside the vocabulary (%lld)", dir, ids[i].k, (long long)ids[i].id,
                            (long long)c->vocab_size);
        else if (ids[i].id >= 0) st = kiln_gguf_set_u32(w, ids[i].k, (uint32_t)ids[i].id);
    }
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (!st && meta.chat_template) st = kiln_gguf_set_str(w, "tokenizer.chat_template", meta.chat_template);
    kiln_model_meta_free(&meta);
    return st;
}

/* ---- architecture ------------------------------------------------------ */

static kiln_status set_arch(kiln_gguf_writer *w, const kiln_llama_config *c, const char *name, kiln_ggml_type type) {
    struct { const char *k; int64_t v; } u[] = {
        {"llama.context_length", c->max_position_embeddings}, {"llama.embedding_length", c->hidden_size},
        {"llama.block_count", c->num_hidden_layers},          {"llama.feed_forward_length", c->intermediate_size},
        {"llama.attention.head_count", c->num_attention_heads}, {"llama.attention.head_count_kv", c->num_key_value_heads},
        {"llama.rope.dimension_count", c->head_dim},          {"llama.vocab_size", c->vocab_size},
    };
    kiln_status st = kiln_gguf_set_str(w, "general.architecture", "llama");
    if (!st) st = kiln_gguf_set_str(w, "general.name", name);
    if (!st) st = kiln_gguf_set_u32(w, "general.file_type", file_type(type));
    if (!st) st = kiln_gguf_set_u32(w, "general.quantization_version", 2);
    for (size_t i = 0; i < sizeof u / sizeof u[0] && !st; i++) st = kiln_gguf_set_u32(w, u[i].k, (uint32_t)u[i].v);
    if (!st) st = kiln_gguf_set_f32(w, "llama.rope.freq_base", (float)c->rope_theta);
    if (!st) st = kiln_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
    return st;
}

/* ---- tensors ----------------------------------------------------------- */

typedef struct {
    char name[64];
    const kiln_tensor *t;
    int heads; /* > 0: q or k projection, rows reordered per head */
    kiln_ggml_type type;
} out_tensor;

/* 2-D weights get the requested type; norms stay F32 as llama.cpp's own
 * converter leaves them; a Q8_0 matrix whose rows are not whole blocks
 * falls back to F16, as it does there. */
static kiln_ggml_type tensor_type(const kiln_tensor *t, kiln_ggml_type want) {
    if (t->ndim < 2) return KILN_GGML_F32;
    if (want == KILN_GGML_Q8_0 && t->shape[t->ndim - 1] % KILN_Q8_0_BLOCK) return KILN_GGML_F16;
    return want;
}

static int plan_tensors(const kiln_llama *m, kiln_ggml_type type, out_tensor *o) {
    int n = 0;
#define ADD(nm, tensor, h)                                                              \
    do {                                                                                \
        snprintf(o[n].name, sizeof o[n].name, "%s", nm);                                \
        o[n].t = (tensor), o[n].heads = (h), o[n].type = tensor_type(o[n].t, type);     \
        n++;                                                                            \
    } while (0)
    const kiln_llama_config *c = &m->cfg;
    ADD("token_embd.weight", m->embed_tokens, 0);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        char nm[64];
#define LAYER(suffix, tensor, h)                                         \
    do {                                                                 \
        snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)l, suffix);    \
        ADD(nm, tensor, h);                                              \
    } while (0)
        LAYER("attn_norm.weight", L->input_layernorm, 0);
        LAYER("attn_q.weight", L->q_proj, (int)c->num_attention_heads);
        LAYER("attn_k.weight", L->k_proj, (int)c->num_key_value_heads);
        LAYER("attn_v.weight", L->v_proj, 0);
        LAYER("attn_output.weight", L->o_proj, 0);
        LAYER("ffn_norm.weight", L->post_attention_layernorm, 0);
        LAYER("ffn_gate.weight", L->gate_proj, 0);
        LAYER("ffn_up.weight", L->up_proj, 0);
        LAYER("ffn_down.weight", L->down_proj, 0);
#undef LAYER
    }
    ADD("output_norm.weight", m->norm, 0);
    if (!c->tie_word_embeddings) ADD("output.weight", m->lm_head, 0);
#undef ADD
    return n;
}

/* Hugging Face orders each head's q/k rows as two halves (rotate_half);
 * llama.cpp's llama architecture rotates adjacent pairs. Row 2j + s of a
 * head in the file is row s * (d / 2) + j of the Hugging Face head. */
static int64_t source_row(const out_tensor *o, int64_t r) {
    if (o->heads <= 0) return r;
    int64_t d = o->t->shape[0] / o->heads, h = r / d, i = r % d;
    return h * d + (i % 2) * (d / 2) + i / 2;
}

static kiln_status write_tensor(kiln_gguf_writer *w, const out_tensor *o, void *buf) {
    const kiln_tensor *t = o->t;
    int64_t cols = t->shape[t->ndim - 1], rows = kiln_tensor_numel(t) / cols;
    size_t row_bytes = kiln_ggml_nbytes(o->type, cols);
    const float *x = kiln_f32(t);
    for (int64_t r = 0; r < rows; r++) {
        const float *src = x + source_row(o, r) * cols;
        for (int64_t j = 0; j < cols; j++)
            if (!isfinite(src[j]))
                return kiln_error(KILN_ERR_NUMERIC, "tensor %s (%s): element [%lld, %lld] is %g", t->name, o->name,
                                  (long long)source_row(o, r), (long long)j, src[j]);
        kiln_status st = kiln_ggml_convert(o->type, src, cols, buf);
        if (!st) st = kiln_gguf_write_data(w, buf, row_bytes);
        if (st) return kiln_error_context(st, "tensor %s", o->name);
    }
    return KILN_OK;
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
    if (!kiln_ggml_type_name(opts->type)) return kiln_error(KILN_ERR_INVALID, "unknown GGUF type %d", (int)opts->type);
    kiln_status st = check_family(path);
    if (st) return st;
    kiln_llama *m = NULL;
    if ((st = kiln_load_model_dir(dir, &m))) return st;
    /* a LoRA run: GGUF holds one set of weights, so the adapters are merged
     * (W + alpha/r B A), never dropped */
    if (m->lora_a && (st = kiln_llama_lora_merge(m))) {
        kiln_llama_free(m);
        return st;
    }
    const kiln_llama_config *c = &m->cfg;
    if (c->head_dim * c->num_attention_heads != c->hidden_size) {
        kiln_llama_free(m);
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: head_dim %lld x %lld heads differs from hidden_size %lld: not exported", path,
                          (long long)c->head_dim, (long long)c->num_attention_heads, (long long)c->hidden_size);
    }
    kiln_gguf_writer *w = NULL;
    vocab v = {0};
    out_tensor *ot = calloc((size_t)(3 + 9 * c->num_hidden_layers), sizeof *ot);
    const char *slash = strrchr(run_or_model_dir, '/');
    const char *name = opts->name ? opts->name : (slash && slash[1] ? slash + 1 : run_or_model_dir);
    if (!ot) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = kiln_gguf_writer_new(&w);
    if (!st) st = set_arch(w, c, name, opts->type);
    if (!st) st = set_tokenizer(w, c, tok_path, dir, &v);
    int n = st ? 0 : plan_tensors(m, opts->type, ot);
    int64_t max_cols = 0;
    for (int i = 0; i < n && !st; i++) {
        st = kiln_gguf_add_tensor(w, ot[i].name, ot[i].type, ot[i].t->ndim, ot[i].t->shape);
        int64_t cols = ot[i].t->shape[ot[i].t->ndim - 1];
        max_cols = cols > max_cols ? cols : max_cols;
    }
    void *row = st ? NULL : malloc((size_t)max_cols * 4);
    if (!st && !row) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = kiln_gguf_begin(w, out_path);
    for (int i = 0; i < n && !st; i++) st = write_tensor(w, &ot[i], row);
    if (!st) st = kiln_gguf_finish(w);
    if (!st && stats) {
        stats->n_tensors = n;
        stats->n_tokens = v.n;
        stats->n_merges = (int64_t)v.n_merges;
        stats->n_params = kiln_llama_num_params(m);
        stats->data_bytes = 0;
        for (int i = 0; i < n; i++) stats->data_bytes += kiln_gguf_tensor_nbytes(w, i);
    }
    free(row);
    free(ot);
    vocab_free(&v);
    kiln_gguf_writer_free(w);
    kiln_llama_free(m);
    return st ? kiln_error_context(st, "exporting %s to %s", run_or_model_dir, out_path) : KILN_OK;
}
