/* The Llama model, written once against the op API. */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/model.h"

/* Full-attention layers keep every position ([B, Hkv, max_len, D]); a
 * sliding layer keeps the last window - 1 only ([B, Hkv, window - 1, D]:
 * the keys a future query can still see), held in position order. */
struct kiln_llama_cache {
    int64_t B, max_len, len, n_layers;
    kiln_tensor **k, **v;
    int64_t *cap; /* positions each layer's store holds (max_len, or window - 1 for a sliding layer) */
};

/* One parameter: its Hugging Face name, shape, initialisation and where the
 * model keeps it. The same list sizes the model (kiln_llama_param_bytes)
 * and builds it, so the check before allocation covers what is allocated. */
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init; /* HF: weights normal, norms one, biases zero */
    kiln_tensor **slot;
} pspec;

#define PSPEC_MAX 20

/* The parameters of layer l (ly may be NULL when only sizes are wanted):
 * the Llama layer, plus the family's switches: q/k/v(/o) biases, MLP
 * biases, per-head q/k RMSNorm weights. */
static int layer_specs(const kiln_llama_config *c, kiln_llama_layer *ly, int64_t l, pspec *o) {
    int64_t C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    int64_t qd = c->num_attention_heads * D, kd = c->num_key_value_heads * D;
    bool qkv_b = c->attention_bias || c->family == KILN_FAMILY_QWEN2, o_b = c->attention_bias;
    bool mlp_b = c->mlp_bias, qk_norm = c->family == KILN_FAMILY_QWEN3 || c->family == KILN_FAMILY_GEMMA3;
    bool gemma = KILN_FAMILY_IS_GEMMA(c->family);
    int norm_init = gemma ? INIT_ZEROS : INIT_ONES; /* HF's Gemma norms scale by 1 + w, w starting at 0 */
    int n = 0;
#define S(field, part, ini, nd, d0, d1)                                                                  \
    do {                                                                                              \
        snprintf(o[n].name, sizeof o[n].name, "model.layers.%lld.%s", (long long)l, part);              \
        o[n].ndim = nd, o[n].shape[0] = d0, o[n].shape[1] = d1, o[n].init = ini;                      \
        o[n].slot = ly ? &ly->field : NULL;                                                           \
        n++;                                                                                          \
    } while (0)
    S(input_layernorm, "input_layernorm.weight", norm_init, 1, C, 0);
    S(q_proj, "self_attn.q_proj.weight", INIT_NORMAL, 2, qd, C);
    if (qkv_b) S(q_bias, "self_attn.q_proj.bias", INIT_ZEROS, 1, qd, 0);
    S(k_proj, "self_attn.k_proj.weight", INIT_NORMAL, 2, kd, C);
    if (qkv_b) S(k_bias, "self_attn.k_proj.bias", INIT_ZEROS, 1, kd, 0);
    S(v_proj, "self_attn.v_proj.weight", INIT_NORMAL, 2, kd, C);
    if (qkv_b) S(v_bias, "self_attn.v_proj.bias", INIT_ZEROS, 1, kd, 0);
    S(o_proj, "self_attn.o_proj.weight", INIT_NORMAL, 2, C, qd);
    if (o_b) S(o_bias, "self_attn.o_proj.bias", INIT_ZEROS, 1, C, 0);
    if (qk_norm) {
        S(q_norm, "self_attn.q_norm.weight", norm_init, 1, D, 0);
        S(k_norm, "self_attn.k_norm.weight", norm_init, 1, D, 0);
    }
    S(post_attention_layernorm, "post_attention_layernorm.weight", norm_init, 1, C, 0);
    if (gemma) {
        S(pre_feedforward_layernorm, "pre_feedforward_layernorm.weight", norm_init, 1, C, 0);
        S(post_feedforward_layernorm, "post_feedforward_layernorm.weight", norm_init, 1, C, 0);
    }
    S(gate_proj, "mlp.gate_proj.weight", INIT_NORMAL, 2, I, C);
    if (mlp_b) S(gate_bias, "mlp.gate_proj.bias", INIT_ZEROS, 1, I, 0);
    S(up_proj, "mlp.up_proj.weight", INIT_NORMAL, 2, I, C);
    if (mlp_b) S(up_bias, "mlp.up_proj.bias", INIT_ZEROS, 1, I, 0);
    S(down_proj, "mlp.down_proj.weight", INIT_NORMAL, 2, C, I);
    if (mlp_b) S(down_bias, "mlp.down_proj.bias", INIT_ZEROS, 1, C, 0);
#undef S
    return n;
}

/* The parameters outside the layers, in the order they are created. */
static int outer_specs(const kiln_llama_config *c, kiln_llama *m, pspec *o) {
    int64_t C = c->hidden_size, V = c->vocab_size;
    int n = 0;
    o[n] = (pspec){"model.embed_tokens.weight", 2, {V, C}, INIT_NORMAL, m ? &m->embed_tokens : NULL};
    n++;
    o[n] = (pspec){"model.norm.weight", 1, {C, 0}, KILN_FAMILY_IS_GEMMA(c->family) ? INIT_ZEROS : INIT_ONES, m ? &m->norm : NULL};
    n++;
    if (!c->tie_word_embeddings) {
        o[n] = (pspec){"lm_head.weight", 2, {V, C}, INIT_NORMAL, m ? &m->lm_head : NULL};
        n++;
    }
    return n;
}

/* Sum of bytes of a spec list, checked: a shape from a hostile config.json
 * must not wrap to a small size. */
static kiln_status specs_bytes(const pspec *o, int n, uint64_t *out) {
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) {
        size_t nb;
        kiln_status st = kiln_shape_bytes(KILN_F32, o[i].ndim, o[i].shape, NULL, &nb);
        if (st) return kiln_error_context(st, "parameter %s", o[i].name);
        if (__builtin_add_overflow(sum, (uint64_t)nb, &sum))
            return kiln_error(KILN_ERR_RANGE, "the model's parameters need more than 2^64 bytes (at %s)", o[i].name);
    }
    *out = sum;
    return KILN_OK;
}

kiln_status kiln_llama_param_bytes(const kiln_llama_config *c, uint64_t *bytes) {
    pspec sp[PSPEC_MAX];
    uint64_t layer = 0, outer = 0, total = 0;
    kiln_status st = specs_bytes(sp, layer_specs(c, NULL, 0, sp), &layer);
    if (!st) st = specs_bytes(sp, outer_specs(c, NULL, sp), &outer);
    if (st) return st;
    if (__builtin_mul_overflow(layer, (uint64_t)c->num_hidden_layers, &total) || __builtin_add_overflow(total, outer, &total))
        return kiln_error(KILN_ERR_RANGE, "the model's parameters need more than 2^64 bytes (%lld layers of %llu bytes)",
                          (long long)c->num_hidden_layers, (unsigned long long)layer);
    *bytes = total;
    return KILN_OK;
}

/* Fills f32 tensor t through the seam, a host buffer of FILL_CHUNK values
 * at a time: normal(0, std) draws from rng, or the constant v when rng is
 * NULL. The draws are a function of each element's counter, so chunks give
 * the values one call gives. */
enum { FILL_CHUNK = 1 << 20 };
static kiln_status fill_f32(kiln_tensor *t, kiln_rng *rng, float std, float v) {
    int64_t n = kiln_tensor_numel(t);
    int64_t cap = n < FILL_CHUNK ? (n ? n : 1) : FILL_CHUNK;
    float *h = malloc((size_t)cap * sizeof *h);
    if (!h) return kiln_error(KILN_ERR_OOM, "out of memory initialising %s", t->name);
    if (!rng)
        for (int64_t i = 0; i < cap; i++) h[i] = v;
    kiln_status st = KILN_OK;
    for (int64_t o = 0; o < n && !st; o += cap) {
        int64_t k = n - o < cap ? n - o : cap;
        if (rng) kiln_rng_normal(rng, h, k, 0.0f, std);
        st = kiln_tensor_set(t, (size_t)o * sizeof *h, h, (size_t)k * sizeof *h);
    }
    free(h);
    return st;
}

/* dtype_of: the empty model's (kiln_llama_new_empty); NULL: f32, initialised */
typedef kiln_dtype (*dtype_fn)(const char *name, void *user);

static kiln_tensor *new_param(kiln_llama *m, const pspec *p, float std, uint64_t seed, dtype_fn dtype_of, void *user) {
    kiln_dtype dt = dtype_of ? dtype_of(p->name, user) : KILN_F32;
    kiln_tensor *t = kiln_tensor_new(dt, p->ndim, p->shape);
    if (!t) {
        kiln_error_context(kiln_last_status(), "parameter %s", p->name);
        return NULL;
    }
    kiln_tensor_set_name(t, p->name);
    t->requires_grad = dt == KILN_F32; /* a weight held as its file holds it is frozen */
    kiln_status st = KILN_OK;
    if (dtype_of) {
        /* filled by the loader */
    } else if (p->init == INIT_NORMAL) {
        /* each parameter draws from its own counter range: adding a layer
         * does not shift the values of the others */
        kiln_rng rng = {seed, (uint64_t)m->n_params << 40};
        st = fill_f32(t, &rng, std, 0.0f);
    } else {
        st = p->init == INIT_ONES ? fill_f32(t, NULL, 0.0f, 1.0f) : kiln_tensor_zero(t);
    }
    if (st) {
        kiln_tensor_release(t);
        return NULL;
    }
    m->params[m->n_params++] = t;
    *p->slot = t;
    return t;
}

static const char *gib(uint64_t b, char *buf, size_t n) {
    snprintf(buf, n, "%.2f GiB", (double)b / (1024.0 * 1024 * 1024));
    return buf;
}

/* Bytes of every parameter at the dtypes dtype_of gives, checked. */
static kiln_status typed_bytes(const kiln_llama_config *c, dtype_fn dtype_of, void *user, uint64_t *out) {
    pspec sp[PSPEC_MAX];
    uint64_t sum = 0;
    for (int64_t l = -1; l < c->num_hidden_layers; l++) {
        int n = l < 0 ? outer_specs(c, NULL, sp) : layer_specs(c, NULL, l, sp);
        for (int i = 0; i < n; i++) {
            size_t nb;
            kiln_status st = kiln_shape_bytes(dtype_of(sp[i].name, user), sp[i].ndim, sp[i].shape, NULL, &nb);
            if (st) return kiln_error_context(st, "parameter %s", sp[i].name);
            if (__builtin_add_overflow(sum, (uint64_t)nb, &sum))
                return kiln_error(KILN_ERR_RANGE, "the model's parameters need more than 2^64 bytes (at %s)", sp[i].name);
        }
    }
    *out = sum;
    return KILN_OK;
}

static kiln_llama *llama_make(const kiln_llama_config *c, uint64_t seed, dtype_fn dtype_of, void *user);

kiln_llama *kiln_llama_new(const kiln_llama_config *c, uint64_t seed) { return llama_make(c, seed, NULL, NULL); }

kiln_llama *kiln_llama_new_empty(const kiln_llama_config *c, kiln_dtype (*dtype_of)(const char *name, void *user), void *user) {
    if (!dtype_of) {
        kiln_error(KILN_ERR_INVALID, "kiln_llama_new_empty: no dtype function");
        return NULL;
    }
    return llama_make(c, 0, dtype_of, user);
}

static kiln_llama *llama_make(const kiln_llama_config *c, uint64_t seed, dtype_fn dtype_of, void *user) {
    if (kiln_llama_config_validate(c)) return NULL;
    /* sized and checked against the machine before anything is allocated */
    uint64_t need;
    if (dtype_of ? typed_bytes(c, dtype_of, user, &need) : kiln_llama_param_bytes(c, &need)) return NULL;
    const char *how;
    uint64_t avail = kiln_mem_available_bytes(&how);
    if (avail && need > avail) {
        char b1[32], b2[32];
        kiln_error(KILN_ERR_OOM, "model too large: its parameters need %llu bytes (%s) but %llu bytes (%s) are available (%s)",
                   (unsigned long long)need, gib(need, b1, sizeof b1), (unsigned long long)avail, gib(avail, b2, sizeof b2), how);
        return NULL;
    }
    kiln_llama *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->cfg = *c;
    int64_t L = c->num_hidden_layers;
    pspec sp[PSPEC_MAX];
    m->layers = calloc((size_t)L, sizeof *m->layers);
    m->params = calloc((size_t)L * PSPEC_MAX + PSPEC_MAX, sizeof *m->params);
    if (!m->layers || !m->params) goto oom;
    const float s = (float)c->initializer_range; /* HF: normal(0, initializer_range) */
    /* creation order = the params order: embedding, layers, norm, lm_head */
    int no = outer_specs(c, m, sp);
    if (!new_param(m, &sp[0], s, seed, dtype_of, user)) goto oom;
    for (int64_t l = 0; l < L; l++) {
        int nl = layer_specs(c, &m->layers[l], l, sp);
        for (int i = 0; i < nl; i++)
            if (!new_param(m, &sp[i], s, seed, dtype_of, user)) goto oom;
    }
    no = outer_specs(c, m, sp);
    for (int i = 1; i < no; i++)
        if (!new_param(m, &sp[i], s, seed, dtype_of, user)) goto oom;
    if (c->tie_word_embeddings) m->lm_head = m->embed_tokens;
    m->n_base = m->n_params;
    return m;
oom:
    kiln_llama_free(m);
    if (kiln_last_status() == KILN_OK) kiln_error(KILN_ERR_OOM, "out of memory creating the model");
    return NULL;
}

void kiln_llama_free(kiln_llama *m) {
    if (!m) return;
    for (int i = 0; i < m->n_params; i++) kiln_tensor_release(m->params[i]);
    free(m->params);
    free(m->lora_a);
    free(m->lora_b);
    free(m->layers);
    free(m);
}

kiln_tensor *kiln_llama_param(const kiln_llama *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i]->name, name) == 0) return m->params[i];
    return NULL;
}

int64_t kiln_llama_num_params(const kiln_llama *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += kiln_tensor_numel(m->params[i]);
    return n;
}

int kiln_llama_set_trainable(kiln_llama *m, const char *glob, bool trainable) {
    int hits = 0;
    for (int i = 0; i < m->n_params; i++)
        if (fnmatch(glob, m->params[i]->name, 0) == 0) {
            m->params[i]->requires_grad = trainable;
            if (!trainable) {
                kiln_tensor_release(m->params[i]->grad);
                m->params[i]->grad = NULL;
            }
            hits++;
        }
    return hits;
}

void kiln_llama_zero_grad(kiln_llama *m) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->grad) kiln_tensor_zero(m->params[i]->grad);
}

double kiln_llama_flops_per_token(const kiln_llama_config *c, int64_t T) {
    double C = (double)c->hidden_size, qd = (double)(c->num_attention_heads * c->head_dim);
    double kd = (double)(c->num_key_value_heads * c->head_dim), I = (double)c->intermediate_size;
    double per_layer = C * qd * 2 + C * kd * 2 + 3 * C * I;
    double n_mm = (double)c->num_hidden_layers * per_layer + (double)c->vocab_size * C;
    /* causal attention as executed: query t meets t + 1 keys, T/2 on
     * average; QKᵀ and P·V are 4 FLOPs per key and query width forward,
     * 3x that with the backward */
    double attn = 6.0 * (double)c->num_hidden_layers * (double)T * qd;
    return 6.0 * n_mm + attn;
}

/* ---- key/value cache ------------------------------------------------------- */
kiln_llama_cache *kiln_llama_cache_new(const kiln_llama *m, int64_t B, int64_t max_len) {
    const kiln_llama_config *c = &m->cfg;
    kiln_llama_cache *kc = calloc(1, sizeof *kc);
    if (!kc) return NULL;
    kc->B = B;
    kc->max_len = max_len;
    kc->n_layers = c->num_hidden_layers;
    kc->k = calloc((size_t)kc->n_layers, sizeof *kc->k);
    kc->v = calloc((size_t)kc->n_layers, sizeof *kc->v);
    kc->cap = calloc((size_t)kc->n_layers, sizeof *kc->cap);
    if (!kc->k || !kc->v || !kc->cap) goto fail;
    const kiln_buffer_type *bt = kiln_tensor_buft(m->embed_tokens); /* on the model's device */
    for (int64_t l = 0; l < kc->n_layers; l++) {
        int64_t w = kiln_llama_layer_window(c, l);
        kc->cap[l] = w && w - 1 < max_len ? w - 1 : max_len;
        int64_t s[4] = {B, c->num_key_value_heads, kc->cap[l] ? kc->cap[l] : 1, c->head_dim};
        kc->k[l] = kiln_tensor_new_on(bt, KILN_F32, 4, s);
        kc->v[l] = kiln_tensor_new_on(bt, KILN_F32, 4, s);
        if (!kc->k[l] || !kc->v[l]) goto fail;
    }
    return kc;
fail:
    kiln_llama_cache_free(kc);
    return NULL;
}

void kiln_llama_cache_free(kiln_llama_cache *kc) {
    if (!kc) return;
    for (int64_t l = 0; l < kc->n_layers; l++) {
        if (kc->k) kiln_tensor_release(kc->k[l]);
        if (kc->v) kiln_tensor_release(kc->v[l]);
    }
    free(kc->k);
    free(kc->v);
    free(kc->cap);
    free(kc);
}

int64_t kiln_llama_cache_len(const kiln_llama_cache *kc) { return kc->len; }

uint64_t kiln_llama_cache_bytes(const kiln_llama_cache *kc) {
    uint64_t b = 0;
    for (int64_t l = 0; l < kc->n_layers; l++) b += kiln_tensor_nbytes(kc->k[l]) + kiln_tensor_nbytes(kc->v[l]);
    return b;
}

/* The positions layer l's store holds before a forward at len: all of
 * them, or a sliding layer's last window - 1. */
static int64_t cache_held(const kiln_llama_cache *kc, int64_t l) { return kc->len < kc->cap[l] ? kc->len : kc->cap[l]; }

/* The keys (or values) layer l attends to: the `held` positions its store
 * keeps followed by x [B, Hkv, T, D], as a new contiguous [B, Hkv, held + T,
 * D] tensor on the store's device; then the store keeps what the next
 * forward needs (all of it, or a sliding layer's last window - 1).
 * Inference only: the cache is plain storage, outside the op graph; its
 * rows move with kiln_tensor_copy (device to device). */
static kiln_tensor *cache_append(kiln_tensor *store, kiln_tensor *x, int64_t held) {
    if (!x) return NULL;
    int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], D = x->shape[3], M = store->shape[2], L = held + T;
    const size_t f = sizeof(float);
    int64_t shape[4] = {B, H, L, D};
    kiln_tensor *out = kiln_tensor_new_on(kiln_tensor_buft(store), KILN_F32, 4, shape);
    if (!out) return NULL;
    int64_t keep = L < M ? L : M; /* the last `keep` positions stay */
    for (int64_t bh = 0; bh < B * H; bh++) {
        size_t o = (size_t)(bh * L * D) * f;
        if ((held && kiln_tensor_copy(out, o, store, (size_t)(bh * M * D) * f, (size_t)(held * D) * f)) ||
            kiln_tensor_copy(out, o + (size_t)(held * D) * f, x, (size_t)(bh * T * D) * f, (size_t)(T * D) * f) ||
            (keep && kiln_tensor_copy(store, (size_t)(bh * M * D) * f, out, o + (size_t)((L - keep) * D) * f, (size_t)(keep * D) * f))) {
            kiln_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

/* ---- forward -------------------------------------------------------------------- */
/* Replaces `var` by `expr`, releasing the old value (NULL propagates). */
#define NEXT(var, expr)                 \
    do {                                \
        kiln_tensor *next_ = (expr);    \
        kiln_tensor_release(var);       \
        var = next_;                    \
    } while (0)

/* x·Wᵀ (+ b where the family has a bias) */
static kiln_tensor *proj(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b) {
    kiln_tensor *y = kiln_linear(x, w);
    if (b) NEXT(y, kiln_add(y, b));
    return y;
}

/* proj plus the LoRA path when layer l's `which` linear has an adapter,
 * written with ordinary ops (PEFT's order: B (A x), then the scaling) so
 * eager and compiled both see it and the frozen W's gradient is never formed. */
static kiln_tensor *lproj(kiln_llama *m, int64_t l, int which, kiln_tensor *x, kiln_tensor *w, kiln_tensor *b) {
    kiln_tensor *y = proj(x, w, b);
    kiln_tensor *A = m->lora_a && !m->lora_off ? m->lora_a[l * KILN_LORA_N + which] : NULL;
    if (!A || !y) return y;
    /* PEFT: lora_B(lora_A(dropout(x))), the base product on x itself */
    bool drop = m->lora_key && m->lora.dropout > 0;
    kiln_tensor *xd = drop ? kiln_dropout(x, m->lora_key, m->lora.dropout, l * KILN_LORA_N + which) : x;
    kiln_tensor *t = kiln_linear(xd, A);
    if (drop) kiln_tensor_release(xd);
    NEXT(t, kiln_linear(t, m->lora_b[l * KILN_LORA_N + which]));
    NEXT(t, kiln_scale(t, kiln_lora_scaling(&m->lora)));
    NEXT(y, kiln_add(y, t));
    kiln_tensor_release(t);
    return y;
}

/* RMSNorm as the family defines it: x / rms(x) times w, Gemma's times
 * (1 + w) (HF's Gemma RMSNorm; the 1 + w is an add, so its gradient is w's) */
static kiln_tensor *norm(const kiln_llama_config *c, kiln_tensor *x, kiln_tensor *w) {
    if (!x) return NULL;
    if (!KILN_FAMILY_IS_GEMMA(c->family)) return kiln_rmsnorm(x, w, c->rms_norm_eps);
    kiln_tensor *one = kiln_fill(w->ndim, w->shape, 1.0);
    kiln_tensor *w1 = one ? kiln_add(w, one) : NULL;
    kiln_tensor_release(one);
    kiln_tensor *y = w1 ? kiln_rmsnorm(x, w1, c->rms_norm_eps) : NULL;
    kiln_tensor_release(w1);
    return y;
}

/* x [B, T, C] -> [B, heads, T, D]: per-head RMSNorm (qwen3's and gemma3's
 * q_norm/k_norm, over each head's D features, before RoPE) and rotation
 * (RoPE base theta, scaling rs) where asked */
static kiln_tensor *heads(kiln_tensor *x, const kiln_llama_config *c, int64_t nh, kiln_tensor *nw, bool rotate, double theta,
                          const kiln_rope_scaling *rs, int64_t pos0, kiln_tensor *positions) {
    if (!x) return NULL;
    int64_t s[4] = {x->shape[0], x->shape[1], nh, c->head_dim};
    kiln_tensor *t = kiln_reshape(x, 4, s);
    if (nw) NEXT(t, norm(c, t, nw));
    if (rotate && positions) NEXT(t, kiln_rope_at(t, positions, theta, false, rs));
    else if (rotate) NEXT(t, kiln_rope_scaled(t, theta, pos0, false, rs));
    NEXT(t, kiln_transpose12(t));
    return t;
}

static kiln_tensor *attention(kiln_llama *m, kiln_llama_layer *ly, int64_t l, kiln_tensor *x, kiln_tensor *mask,
                              kiln_tensor *positions, kiln_llama_cache *kc) {
    const kiln_llama_config *c = &m->cfg;
    int64_t B = x->shape[0], T = x->shape[1], pos0 = kc ? kc->len : 0;
    int64_t rep = c->num_attention_heads / c->num_key_value_heads;
    const kiln_rope_scaling *rs;
    double theta = kiln_llama_layer_rope(c, l, &rs);
    kiln_tensor *t = lproj(m, l, KILN_LORA_Q, x, ly->q_proj, ly->q_bias);
    kiln_tensor *q = heads(t, c, c->num_attention_heads, ly->q_norm, true, theta, rs, pos0, positions);
    NEXT(t, lproj(m, l, KILN_LORA_K, x, ly->k_proj, ly->k_bias));
    kiln_tensor *k = heads(t, c, c->num_key_value_heads, ly->k_norm, true, theta, rs, pos0, positions);
    NEXT(t, lproj(m, l, KILN_LORA_V, x, ly->v_proj, ly->v_bias));
    kiln_tensor *v = heads(t, c, c->num_key_value_heads, NULL, false, theta, rs, pos0, NULL);
    kiln_tensor_release(t);
    if (kc) {
        int64_t held = cache_held(kc, l);
        NEXT(k, cache_append(kc->k[l], k, held));
        NEXT(v, cache_append(kc->v[l], v, held));
    }
    if (rep > 1) {
        NEXT(k, kiln_repeat_kv(k, rep));
        NEXT(v, kiln_repeat_kv(v, rep));
    }
    kiln_tensor *s = kiln_matmul(q, k, KILN_MM_BATCHED, false, true);
    kiln_tensor_release(q);
    kiln_tensor_release(k);
    bool gemma = KILN_FAMILY_IS_GEMMA(c->family); /* HF: query_pre_attn_scalar ** -0.5 */
    NEXT(s, kiln_scale(s, 1.0 / sqrt(gemma ? c->query_pre_attn_scalar : (double)c->head_dim)));
    if (c->attn_logit_softcapping > 0) NEXT(s, kiln_softcap(s, c->attn_logit_softcapping));
    NEXT(s, kiln_add(s, mask));
    NEXT(s, kiln_softmax(s));
    kiln_tensor *o = kiln_matmul(s, v, KILN_MM_BATCHED, false, false);
    kiln_tensor_release(s);
    kiln_tensor_release(v);
    NEXT(o, kiln_transpose12(o));
    int64_t flat[3] = {B, T, c->num_attention_heads * c->head_dim};
    NEXT(o, kiln_reshape(o, 3, flat));
    NEXT(o, lproj(m, l, KILN_LORA_O, o, ly->o_proj, ly->o_bias));
    return o;
}

static kiln_tensor *mlp(kiln_llama *m, int64_t l, kiln_llama_layer *ly, kiln_tensor *x) {
    kiln_tensor *g = lproj(m, l, KILN_LORA_GATE, x, ly->gate_proj, ly->gate_bias);
    kiln_tensor *u = lproj(m, l, KILN_LORA_UP, x, ly->up_proj, ly->up_bias);
    NEXT(g, KILN_FAMILY_IS_GEMMA(m->cfg.family) ? kiln_gelu_tanh(g) : kiln_silu(g)); /* GeGLU or SwiGLU */
    NEXT(g, kiln_mul(g, u));
    kiln_tensor_release(u);
    NEXT(g, lproj(m, l, KILN_LORA_DOWN, g, ly->down_proj, ly->down_bias));
    return g;
}

/* An all-ones padding mask [B, T] on the model's device, filled through
 * the seam from a host buffer. */
static kiln_tensor *ones_mask(const kiln_llama *m, int64_t B, int64_t T) {
    int64_t s[2] = {B, T};
    int32_t *h = malloc((size_t)(B * T > 0 ? B * T : 1) * sizeof *h);
    kiln_tensor *t = h ? kiln_tensor_new_on(kiln_tensor_buft(m->embed_tokens), KILN_I32, 2, s) : NULL;
    if (!h) kiln_error(KILN_ERR_OOM, "out of memory making a padding mask");
    if (t) {
        for (int64_t i = 0; i < B * T; i++) h[i] = 1;
        if (kiln_tensor_set(t, 0, h, (size_t)(B * T) * sizeof *h)) {
            kiln_tensor_release(t);
            t = NULL;
        }
    }
    free(h);
    return t;
}

kiln_tensor *kiln_llama_forward(kiln_llama *m, kiln_tensor *ids, kiln_tensor *pad_mask, kiln_llama_cache *kc) {
    return kiln_llama_forward_ex(m, ids, pad_mask, NULL, kc);
}

/* positions and segments: [B, T] i32 like ids, or NULL */
static bool seg_ok(const kiln_tensor *ids, const kiln_tensor *t, const char *what, const kiln_llama_cache *kc) {
    char b1[96], b2[96];
    if (t && kc) {
        kiln_error(KILN_ERR_UNSUPPORTED, "llama forward: %s with a key/value cache (generation runs one document)", what);
        return false;
    }
    if (t && (t->dtype != KILN_I32 || !kiln_tensor_same_shape(t, ids))) {
        kiln_error(KILN_ERR_SHAPE, "llama forward: %s %s must be i32 like input_ids %s", what, kiln_shape_str(t, b1, sizeof b1),
                   kiln_shape_str(ids, b2, sizeof b2));
        return false;
    }
    return true;
}

kiln_tensor *kiln_llama_forward_ex(kiln_llama *m, kiln_tensor *ids, kiln_tensor *pad_mask, const kiln_llama_docs *docs,
                                   kiln_llama_cache *kc) {
    const kiln_llama_config *c = &m->cfg;
    char b1[96], b2[96];
    if (!ids || ids->ndim != 2 || ids->dtype != KILN_I32) {
        kiln_error(KILN_ERR_SHAPE, "llama forward: input_ids must be [B, T] i32, got %s", ids ? kiln_shape_str(ids, b1, sizeof b1) : "NULL");
        return NULL;
    }
    int64_t B = ids->shape[0], T = ids->shape[1], pos0 = kc ? kc->len : 0;
    if (pad_mask && !kc && !kiln_tensor_same_shape(pad_mask, ids) ) {
        kiln_error(KILN_ERR_SHAPE, "llama forward: pad_mask %s does not match input_ids %s", kiln_shape_str(pad_mask, b1, sizeof b1),
                   kiln_shape_str(ids, b2, sizeof b2));
        return NULL;
    }
    if (pos0 + T > c->max_position_embeddings || (kc && (pos0 + T > kc->max_len || B != kc->B))) {
        kiln_error(KILN_ERR_RANGE, "llama forward: positions up to %lld exceed max_position_embeddings %lld or the cache",
                   (long long)(pos0 + T), (long long)c->max_position_embeddings);
        return NULL;
    }
    kiln_tensor *positions = docs ? docs->positions : NULL, *segments = docs ? docs->segments : NULL;
    if (docs && (!positions || !segments)) {
        kiln_error(KILN_ERR_INVALID, "llama forward: packed documents need both positions and segment ids");
        return NULL;
    }
    if (!seg_ok(ids, positions, "positions", kc) || !seg_ok(ids, segments, "segment ids", kc)) return NULL;
    kiln_tensor *pm = pad_mask && !kc ? kiln_tensor_retain(pad_mask) : ones_mask(m, B, pos0 + T);
    /* packed documents: block-diagonal causal (each token sees its own
     * document only), RoPE positions restarting at each document */
    kiln_tensor *mask = kiln_attn_mask_seg(pm, segments, T);
    /* sliding-window layers: the same mask, keys within the window only;
     * with a cache, over the keys a sliding layer's store kept (the last
     * window - 1) and the new ones: positions pos0 - kept .. pos0 + T - 1,
     * so the same window rule on the shorter row */
    int64_t window = kiln_llama_config_window(c), kept = pos0;
    for (int64_t l = 0; kc && l < c->num_hidden_layers; l++)
        if (kiln_llama_layer_window(c, l)) kept = cache_held(kc, l);
    kiln_tensor *pw = kc && window && kept < pos0 ? ones_mask(m, B, kept + T) : kiln_tensor_retain(pm);
    kiln_tensor *mask_w = window && kept + T > window ? kiln_attn_mask_win(pw, segments, T, window)
                          : window && pw != pm  ? kiln_attn_mask_seg(pw, NULL, T)
                                                : NULL;
    kiln_tensor_release(pw);
    kiln_tensor_release(pm);
    kiln_tensor *h = kiln_embedding(m->embed_tokens, ids);
    bool gemma = KILN_FAMILY_IS_GEMMA(c->family);
    if (gemma) NEXT(h, kiln_scale(h, (float)sqrt((double)c->hidden_size))); /* HF: sqrt(hidden) in the activations' dtype */
    int outer = kiln_op_get_scope();
    for (int64_t l = 0; l < c->num_hidden_layers && h && mask; l++) {
        kiln_llama_layer *ly = &m->layers[l];
        kiln_op_set_scope((int)(2 * l + 1)); /* the attention block */
        kiln_tensor *x = norm(c, h, ly->input_layernorm);
        kiln_tensor *lm = mask_w && kiln_llama_layer_window(c, l) ? mask_w : mask;
        if (!lm) break;
        kiln_tensor *a = x ? attention(m, ly, l, x, lm, positions, kc) : NULL;
        kiln_tensor_release(x);
        if (gemma) NEXT(a, norm(c, a, ly->post_attention_layernorm)); /* Gemma normalises the block's output too */
        NEXT(h, kiln_add(h, a));
        kiln_tensor_release(a);
        kiln_op_set_scope((int)(2 * l + 2)); /* the MLP block */
        x = norm(c, h, gemma ? ly->pre_feedforward_layernorm : ly->post_attention_layernorm);
        a = x ? mlp(m, l, ly, x) : NULL;
        kiln_tensor_release(x);
        if (gemma) NEXT(a, norm(c, a, ly->post_feedforward_layernorm));
        NEXT(h, kiln_add(h, a));
        kiln_tensor_release(a);
    }
    kiln_op_set_scope(outer);
    kiln_tensor_release(mask);
    kiln_tensor_release(mask_w);
    if (kc && h) kc->len += T;
    NEXT(h, norm(c, h, m->norm));
    NEXT(h, kiln_linear(h, m->lm_head));
    if (c->final_logit_softcapping > 0) NEXT(h, kiln_softcap(h, c->final_logit_softcapping)); /* Gemma 2 */
    return h;
}
