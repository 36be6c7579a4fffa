/* A model from a GGUF file: the inverse of export_gguf.c for the
 * architectures kiln writes (llama, qwen2, qwen3). The metadata becomes a
 * kiln_llama_config, the tensors the Hugging Face parameters (llama's q/k
 * rows put back in rotate_half order), each kept in the file's type for a
 * frozen base or widened to fp32 for training. Every key kiln needs is
 * checked for type and range, every tensor for its name, shape and type,
 * and a tensor kiln would not use is an error naming it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/quant.h"
#include "kiln/train.h"
#include "export_gguf_impl.h"

typedef struct {
    const char *arch;
    kiln_family family;
    bool permute; /* llama: adjacent-pair RoPE in the file */
} arch_row;

static const arch_row archs[] = {
    {"llama", KILN_FAMILY_LLAMA, true},
    {"qwen2", KILN_FAMILY_QWEN2, false},
    {"qwen3", KILN_FAMILY_QWEN3, false},
};

/* an unsigned integer key of any width (llama.cpp's converters write u32,
 * some tools u64 or i32) */
static kiln_status get_uint(const kiln_gguf_file *f, const char *key, bool required, int64_t dflt, int64_t *out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(f, key);
    if (!kv) {
        if (required) return kiln_error(KILN_ERR_FORMAT, "%s: key %s missing", kiln_gguf_path(f), key);
        *out = dflt;
        return KILN_OK;
    }
    int64_t v = -1;
    switch (kv->type) {
    case KILN_GGUF_UINT32: {
        uint32_t x;
        kiln_gguf_get_u32(f, key, &x);
        v = x;
        break;
    }
    case KILN_GGUF_INT32: {
        int32_t x;
        kiln_gguf_get_i32(f, key, &x);
        v = x;
        break;
    }
    case KILN_GGUF_UINT64: {
        uint64_t x;
        kiln_gguf_get_u64(f, key, &x);
        v = x > (uint64_t)INT64_MAX ? -1 : (int64_t)x;
        break;
    }
    default:
        return kiln_error(KILN_ERR_FORMAT, "%s: key %s is %s, not an unsigned integer", kiln_gguf_path(f), key,
                          kiln_gguf_type_str(kv->type));
    }
    if (v < 0 || v > (int64_t)1 << 40)
        return kiln_error(KILN_ERR_FORMAT, "%s: key %s = %lld is out of range", kiln_gguf_path(f), key, (long long)v);
    *out = v;
    return KILN_OK;
}

static kiln_status get_float(const kiln_gguf_file *f, const char *key, double dflt, double *out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(f, key);
    if (!kv) {
        *out = dflt;
        return KILN_OK;
    }
    if (kv->type == KILN_GGUF_FLOAT64) return kiln_gguf_get_f64(f, key, out);
    float x;
    kiln_status st = kiln_gguf_get_f32(f, key, &x);
    if (st) return st;
    if (!isfinite(x) || x <= 0) return kiln_error(KILN_ERR_FORMAT, "%s: key %s = %g must be finite and > 0", kiln_gguf_path(f), key, x);
    /* the shortest decimal that is this float (1e-5, not 9.99999975e-6):
     * what the config held before it was stored as f32 */
    for (int d = 1; d <= 9; d++) {
        char b[32];
        snprintf(b, sizeof b, "%.*g", d, (double)x);
        if (strtof(b, NULL) == x) {
            *out = strtod(b, NULL);
            return KILN_OK;
        }
    }
    *out = x;
    return KILN_OK;
}

static const kiln_gguf_tensor *tensor(const kiln_gguf_file *f, const char *name) { return kiln_gguf_tensor_find(f, name); }

/* The keys kiln reads from a model's metadata; the tokenizer's
 * (tokenizer.ggml.*) are read with the tokenizer. Anything else under the
 * architecture's prefix changes the network and is refused. */
static const char *const arch_keys[] = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
    "vocab_size", "rope.freq_base", "attention.layer_norm_rms_epsilon", "rope.scaling.type", "rope.scaling.factor",
};
/* keys that describe the file, not the network */
static const char *const info_prefixes[] = {"general.", "tokenizer.", "quantize.", NULL};

static kiln_status check_keys(const kiln_gguf_file *f, const char *arch) {
    size_t al = strlen(arch);
    for (int64_t i = 0; i < kiln_gguf_kv_count(f); i++) {
        const char *k = kiln_gguf_kv_at(f, i)->key;
        bool ok = false;
        for (int p = 0; info_prefixes[p] && !ok; p++) ok = !strncmp(k, info_prefixes[p], strlen(info_prefixes[p]));
        if (!ok && !strncmp(k, arch, al) && k[al] == '.')
            for (size_t j = 0; j < sizeof arch_keys / sizeof *arch_keys && !ok; j++) ok = !strcmp(k + al + 1, arch_keys[j]);
        if (!ok)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: key %s is not one kiln implements for architecture %s (it would change "
                              "the network or is another architecture's)", kiln_gguf_path(f), k, arch);
    }
    return KILN_OK;
}

/* rope_freqs.weight: Llama 3.1's rope scaling as one divisor per
 * frequency. kiln computes with its four parameters, so they are found
 * back: the factor is the largest divisor, and the first of the usual
 * (original context, low, high) triples whose divisors come out the same
 * (1e-6) is taken; a table no triple reproduces is refused. */
static kiln_status read_llama3(const kiln_gguf_file *f, const kiln_gguf_tensor *t, kiln_llama_config *c) {
    const char *path = kiln_gguf_path(f);
    int64_t half = c->head_dim / 2;
    if (c->family != KILN_FAMILY_LLAMA)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor rope_freqs.weight outside the llama architecture", path);
    if (t->type != KILN_GGML_F32 || t->ndim != 1 || t->shape[0] != half)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor rope_freqs.weight must be F32 [%lld] (head_dim / 2)", path, (long long)half);
    const float *v = kiln_gguf_bytes(t);
    float mx = 0;
    for (int64_t j = 0; j < half; j++) {
        float x;
        memcpy(&x, v + j, 4);
        if (!isfinite(x) || x < 1) return kiln_error(KILN_ERR_FORMAT, "%s: rope_freqs.weight[%lld] = %g is not >= 1", path, (long long)j, x);
        if (x > mx) mx = x;
    }
    static const int64_t origs[] = {8192, 4096, 2048, 16384, 32768, 65536, 131072};
    static const double lows[] = {1, 2, 0.5, 4}, highs[] = {4, 8, 2, 16, 1};
    for (size_t o = 0; o < sizeof origs / sizeof *origs; o++)
        for (size_t l = 0; l < sizeof lows / sizeof *lows; l++)
            for (size_t h = 0; h < sizeof highs / sizeof *highs; h++) {
                if (highs[h] <= lows[l]) continue;
                kiln_llama_config k = *c;
                k.rope_scaling = (kiln_rope_scaling){.type = KILN_ROPE_LLAMA3, .factor = mx, .low_freq_factor = lows[l],
                                                     .high_freq_factor = highs[h], .original_max_position_embeddings = origs[o]};
                float *g = kiln_llama3_freq_factors(&k);
                if (!g) return kiln_error(KILN_ERR_OOM, "out of memory");
                bool same = true;
                for (int64_t j = 0; j < half && same; j++) {
                    float x;
                    memcpy(&x, v + j, 4);
                    same = fabs((double)g[j] - x) <= 1e-6 * x;
                }
                free(g);
                if (same) {
                    c->rope_scaling = k.rope_scaling;
                    return KILN_OK;
                }
            }
    return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor rope_freqs.weight: no llama3 rope scaling (factor %g; original context, "
                      "low and high frequency factors of the usual values) gives these divisors", path, mx);
}

static kiln_status read_config(const kiln_gguf_file *f, kiln_llama_config *c, const arch_row **row) {
    const char *path = kiln_gguf_path(f);
    const char *a;
    uint64_t alen;
    kiln_status st = kiln_gguf_get_str(f, "general.architecture", &a, &alen);
    if (st) return st;
    *row = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        if (strlen(archs[i].arch) == alen && !memcmp(a, archs[i].arch, alen)) *row = &archs[i];
    if (!*row)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: general.architecture '%.*s' is not one kiln reads (llama, qwen2, qwen3)",
                          path, (int)(alen > 64 ? 64 : alen), a);
    const char *arch = (*row)->arch;
    const kiln_gguf_kv *gt = kiln_gguf_find(f, "general.type");
    if (gt) {
        const char *ts;
        uint64_t tl;
        if ((st = kiln_gguf_get_str(f, "general.type", &ts, &tl))) return st;
        if (!(tl == 5 && !memcmp(ts, "model", 5)))
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: general.type is '%.*s', not 'model' (a LoRA adapter goes with its base: "
                              "kiln reads adapters from a run or PEFT directory)", path, (int)(tl > 32 ? 32 : tl), ts);
    }
    if ((st = check_keys(f, arch))) return st;
    kiln_llama_config_default(c);
    c->family = (*row)->family;
    char k[96];
#define U(name, field, req, dflt)                                            \
    do {                                                                     \
        snprintf(k, sizeof k, "%s.%s", arch, name);                          \
        if (!st) st = get_uint(f, k, req, dflt, &c->field);                  \
    } while (0)
    U("embedding_length", hidden_size, true, 0);
    U("block_count", num_hidden_layers, true, 0);
    U("feed_forward_length", intermediate_size, true, 0);
    U("attention.head_count", num_attention_heads, true, 0);
    U("context_length", max_position_embeddings, true, 0);
    if (st) return st;
    U("attention.head_count_kv", num_key_value_heads, false, c->num_attention_heads);
    int64_t hd = c->num_attention_heads ? c->hidden_size / c->num_attention_heads : 0, vl, rd;
    U("attention.key_length", head_dim, false, hd);
    snprintf(k, sizeof k, "%s.attention.value_length", arch);
    if (!st) st = get_uint(f, k, false, c->head_dim, &vl);
    if (!st && vl != c->head_dim)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s = %lld differs from the key length %lld (kiln's attention has one head size)",
                          path, k, (long long)vl, (long long)c->head_dim);
    snprintf(k, sizeof k, "%s.rope.dimension_count", arch);
    if (!st) st = get_uint(f, k, false, c->head_dim, &rd);
    if (!st && rd != c->head_dim)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s = %lld: kiln rotates the whole head (%lld), not part of it", path, k,
                          (long long)rd, (long long)c->head_dim);
#undef U
    snprintf(k, sizeof k, "%s.rope.freq_base", arch);
    if (!st) st = get_float(f, k, 10000.0, &c->rope_theta);
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (!st) st = get_float(f, k, 1e-5, &c->rms_norm_eps);
    if (st) return st;
    /* rms_norm_eps is stored as f32: the double kiln computes with is its value */
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    const kiln_gguf_kv *sk = kiln_gguf_find(f, k);
    if (sk) {
        const char *s;
        uint64_t sl;
        if ((st = kiln_gguf_get_str(f, k, &s, &sl))) return st;
        if (sl == 4 && !memcmp(s, "none", 4)) {
        } else if (sl == 6 && !memcmp(s, "linear", 6)) {
            c->rope_scaling.type = KILN_ROPE_LINEAR;
            snprintf(k, sizeof k, "%s.rope.scaling.factor", arch);
            if (!kiln_gguf_find(f, k)) return kiln_error(KILN_ERR_FORMAT, "%s: rope scaling linear without %s", path, k);
            if ((st = get_float(f, k, 1.0, &c->rope_scaling.factor))) return st;
        } else {
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s '%.*s' is not one kiln implements (none, linear)", path, k,
                              (int)(sl > 32 ? 32 : sl), s);
        }
    } else {
        snprintf(k, sizeof k, "%s.rope.scaling.factor", arch);
        if (kiln_gguf_find(f, k)) return kiln_error(KILN_ERR_FORMAT, "%s: %s without a rope.scaling.type", path, k);
    }
    const kiln_gguf_tensor *rf = tensor(f, "rope_freqs.weight");
    if (rf && (st = read_llama3(f, rf, c))) return st;
    /* the vocabulary is the embedding's row count */
    const kiln_gguf_tensor *e = tensor(f, "token_embd.weight");
    if (!e) return kiln_error(KILN_ERR_FORMAT, "%s: tensor token_embd.weight missing", path);
    if (e->ndim != 2 || e->shape[1] != c->hidden_size)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor token_embd.weight is [%lld, %lld], not [vocab, %lld]", path,
                          (long long)e->shape[0], (long long)(e->ndim > 1 ? e->shape[1] : 0), (long long)c->hidden_size);
    c->vocab_size = e->shape[0];
    snprintf(k, sizeof k, "%s.vocab_size", arch);
    int64_t vs;
    if ((st = get_uint(f, k, false, c->vocab_size, &vs))) return st;
    if (vs != c->vocab_size)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s = %lld but token_embd.weight has %lld rows", path, k, (long long)vs,
                          (long long)c->vocab_size);
    c->tie_word_embeddings = !tensor(f, "output.weight");
    /* biases by presence, all layers alike (checked when the tensors are read) */
    c->attention_bias = c->family != KILN_FAMILY_QWEN2 && tensor(f, "blk.0.attn_q.bias");
    c->mlp_bias = c->family == KILN_FAMILY_LLAMA && tensor(f, "blk.0.ffn_gate.bias");
    /* ids: the tokenizer's keys (kiln_gguf_model_meta gives the full set) */
    int64_t id;
    if (!(st = get_uint(f, "tokenizer.ggml.bos_token_id", false, -1, &id))) c->bos_token_id = id;
    if (!st && !(st = get_uint(f, "tokenizer.ggml.eos_token_id", false, -1, &id))) c->eos_token_id = id;
    if (!st && !(st = get_uint(f, "tokenizer.ggml.padding_token_id", false, -1, &id))) c->pad_token_id = id;
    if (st) return st;
    st = kiln_llama_config_validate(c);
    return st ? kiln_error_context(st, "%s", path) : KILN_OK;
}

/* ---- tensors -------------------------------------------------------------- */

/* The GGUF name of a Hugging Face parameter ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight") */
static bool gguf_name(const char *hf, char *out, size_t n) {
    static const struct {
        const char *hf, *gg;
    } outer[] = {{"model.embed_tokens.weight", "token_embd.weight"},
                 {"model.norm.weight", "output_norm.weight"},
                 {"lm_head.weight", "output.weight"}},
      layer[] = {{"input_layernorm.weight", "attn_norm.weight"},
                 {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.q_proj.bias", "attn_q.bias"},
                 {"self_attn.k_proj.weight", "attn_k.weight"},   {"self_attn.k_proj.bias", "attn_k.bias"},
                 {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.v_proj.bias", "attn_v.bias"},
                 {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.o_proj.bias", "attn_output.bias"},
                 {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
                 {"post_attention_layernorm.weight", "ffn_norm.weight"},
                 {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.gate_proj.bias", "ffn_gate.bias"},
                 {"mlp.up_proj.weight", "ffn_up.weight"},        {"mlp.up_proj.bias", "ffn_up.bias"},
                 {"mlp.down_proj.weight", "ffn_down.weight"},    {"mlp.down_proj.bias", "ffn_down.bias"}};
    for (size_t i = 0; i < sizeof outer / sizeof *outer; i++)
        if (!strcmp(hf, outer[i].hf)) return snprintf(out, n, "%s", outer[i].gg) < (int)n;
    long long l;
    int used = 0;
    if (sscanf(hf, "model.layers.%lld.%n", &l, &used) != 1 || !used) return false;
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++)
        if (!strcmp(hf + used, layer[i].hf)) return snprintf(out, n, "blk.%lld.%s", l, layer[i].gg) < (int)n;
    return false;
}

typedef struct {
    const kiln_gguf_file *f;
    bool keep; /* a frozen base: 2-D weights in the file's type */
} load_ctx;

/* The parameter's dtype: the file's where kiln computes with it as it is
 * (f16 and block weights: the dequantizing product and lookup; bf16: the
 * projections' bf16 product), else fp32. */
static kiln_dtype dtype_of(const char *name, void *user) {
    const load_ctx *c = user;
    char gg[96];
    const kiln_gguf_tensor *t = gguf_name(name, gg, sizeof gg) ? tensor(c->f, gg) : NULL;
    if (!c->keep || !t || t->ndim != 2) return KILN_F32;
    kiln_dtype dt;
    if (!kiln_dtype_of_q((kiln_qtype)t->type, &dt)) return KILN_F32;
    bool projection = strstr(name, "_proj.weight") != NULL;
    if (dt == KILN_BF16 && !projection) return KILN_F32; /* a bf16 table or head: fp32 (exact) */
    return dt;
}

/* file row of Hugging Face row r for a permuted q/k tensor of `heads` heads */
static int64_t file_row(int64_t r, int64_t rows, int heads) {
    if (heads <= 0) return r;
    int64_t d = rows / heads, h = r / d, i = r % d;
    /* HF row s*(d/2)+j sits at file row 2j+s of its head */
    int64_t s = i / (d / 2), j = i % (d / 2);
    return h * d + 2 * j + s;
}

static kiln_status fill_param(const load_ctx *c, kiln_tensor *p, const kiln_gguf_tensor *t, int heads) {
    const char *path = kiln_gguf_path(c->f);
    int64_t cols = p->ndim == 2 ? p->shape[1] : 1, rows = p->ndim == 2 ? p->shape[0] : p->shape[0];
    if (p->ndim == 1 && heads <= 0) cols = p->shape[0], rows = 1;
    kiln_qtype ft = (kiln_qtype)t->type, pt;
    if (!kiln_q_of_dtype(p->dtype, &pt)) return kiln_error(KILN_ERR_INVALID, "%s: parameter %s is %s", path, p->name, kiln_dtype_name(p->dtype));
    size_t frb = kiln_q_row_bytes(ft, cols), prb = kiln_q_row_bytes(pt, cols);
    if (!frb || !prb)
        return kiln_error(KILN_ERR_FORMAT, "%s: tensor %s: rows of %lld values are not whole %s blocks", path, t->name,
                          (long long)cols, kiln_ggml_type_name(t->type));
    enum { CHUNK = 1 << 22 };
    int64_t per = (int64_t)(CHUNK / (prb > frb ? prb : frb));
    if (per < 1) per = 1;
    char *buf = malloc((size_t)(per < rows ? per : rows) * (pt == ft ? frb : prb) + (pt == ft ? 0 : (size_t)cols * 4));
    if (!buf) return kiln_error(KILN_ERR_OOM, "out of memory reading %s", t->name);
    float *row = pt == ft ? NULL : (float *)(buf + (size_t)(per < rows ? per : rows) * prb);
    kiln_status st = KILN_OK;
    for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
        int64_t nr = rows - r0 < per ? rows - r0 : per;
        for (int64_t r = 0; r < nr && !st; r++) {
            const char *src = (const char *)kiln_gguf_bytes(t) + (size_t)file_row(r0 + r, rows, heads) * frb;
            if (pt == ft) {
                memcpy(buf + (size_t)r * frb, src, frb);
            } else { /* widened to fp32 exactly as ggml's to_float does */
                st = kiln_q_dequantize(ft, src, row, cols);
                for (int64_t j = 0; j < cols && !st; j++)
                    if (!isfinite(row[j]))
                        st = kiln_error(KILN_ERR_NUMERIC, "%s: tensor %s: element [%lld, %lld] is %g", path, t->name,
                                        (long long)file_row(r0 + r, rows, heads), (long long)j, row[j]);
                if (!st) memcpy(buf + (size_t)r * prb, row, prb); /* pt is f32 here */
            }
        }
        if (!st) st = kiln_tensor_set(p, (size_t)r0 * prb, buf, (size_t)nr * prb);
    }
    free(buf);
    kiln_gguf_release_pages(c->f, t);
    return st;
}

static kiln_status load_tensors(const load_ctx *c, kiln_llama *m, int qk_heads_q, int qk_heads_k) {
    const char *path = kiln_gguf_path(c->f);
    int64_t n_file = kiln_gguf_tensor_count(c->f), used = 0;
    for (int i = 0; i < m->n_base; i++) {
        kiln_tensor *p = m->params[i];
        char gg[96];
        if (!gguf_name(p->name, gg, sizeof gg)) return kiln_error(KILN_ERR_INVALID, "%s: no GGUF name for %s", path, p->name);
        const kiln_gguf_tensor *t = tensor(c->f, gg);
        if (!t) return kiln_error(KILN_ERR_FORMAT, "%s: tensor %s (%s) missing", path, gg, p->name);
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            char a[64], b[64];
            return kiln_error(KILN_ERR_FORMAT, "%s: tensor %s is %s, the config makes %s %s", path, gg,
                              kiln_dims_str(t->ndim, t->shape, a, sizeof a), p->name, kiln_dims_str(p->ndim, p->shape, b, sizeof b));
        }
        int heads = 0;
        if (strstr(gg, "attn_q.")) heads = qk_heads_q;
        if (strstr(gg, "attn_k.")) heads = qk_heads_k;
        kiln_status st = fill_param(c, p, t, heads);
        if (st) return kiln_error_context(st, "reading %s", gg);
        used++;
    }
    bool llama3 = m->cfg.rope_scaling.type == KILN_ROPE_LLAMA3; /* rope_freqs.weight went into the config */
    if (used + llama3 != n_file)
        for (int64_t i = 0; i < n_file; i++) {
            const char *nm = kiln_gguf_tensor_at(c->f, i)->name;
            bool found = llama3 && !strcmp(nm, "rope_freqs.weight");
            for (int j = 0; j < m->n_base && !found; j++) {
                char gg[96];
                found = gguf_name(m->params[j]->name, gg, sizeof gg) && !strcmp(gg, nm);
            }
            if (!found)
                return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tensor %s is not part of the %s network kiln builds from this file's "
                                  "metadata", path, nm, kiln_family_name(m->cfg.family));
        }
    return KILN_OK;
}

kiln_status kiln_gguf_model_load(const char *path, bool keep_types, kiln_llama **out) {
    *out = NULL;
    kiln_gguf_file *f = NULL;
    kiln_status st = kiln_gguf_open(path, &f);
    if (st) return st;
    kiln_llama_config c;
    const arch_row *row = NULL;
    st = read_config(f, &c, &row);
    load_ctx lc = {f, keep_types};
    kiln_llama *m = NULL;
    if (!st && !(m = kiln_llama_new_empty(&c, dtype_of, &lc))) st = kiln_error_context(kiln_last_status(), "model from %s", path);
    int hq = row && row->permute ? (int)c.num_attention_heads : 0, hk = row && row->permute ? (int)c.num_key_value_heads : 0;
    if (!st && row->permute && c.head_dim % 2)
        st = kiln_error(KILN_ERR_FORMAT, "%s: head size %lld is odd: RoPE pairs need an even one", path, (long long)c.head_dim);
    if (!st) st = load_tensors(&lc, m, hq, hk);
    kiln_gguf_close(f);
    if (st) {
        kiln_llama_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

bool kiln_is_gguf_path(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n > 5 && !strcasecmp(path + n - 5, ".gguf");
}
