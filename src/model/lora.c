/* LoRA adapters on the Llama model: creation (PEFT's initialisation),
 * target names, merging into the base. The forward path is in llama.c
 * (proj), built from ordinary ops. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/model.h"

static const char *const target_names[KILN_LORA_N] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};
/* where each target sits in the Hugging Face names */
static const char *const target_parent[KILN_LORA_N] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                                       "mlp", "mlp", "mlp"};

const char *kiln_lora_target_name(int target) {
    return target >= 0 && target < KILN_LORA_N ? target_names[target] : NULL;
}

kiln_status kiln_lora_targets_parse(const char *list, unsigned *mask) {
    *mask = 0;
    if (!list || !*list) return kiln_error(KILN_ERR_INVALID, "--lora-targets: empty list");
    if (strcmp(list, "all") == 0) {
        *mask = (1u << KILN_LORA_N) - 1;
        return KILN_OK;
    }
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int hit = -1;
        for (int i = 0; i < KILN_LORA_N; i++)
            if (strlen(target_names[i]) == n && strncmp(p, target_names[i], n) == 0) hit = i;
        if (hit < 0)
            return kiln_error(KILN_ERR_INVALID,
                              "--lora-targets: unknown module '%.*s' (known: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                              "up_proj, down_proj, or all)",
                              (int)n, p);
        *mask |= 1u << hit;
        p += n;
        if (*p == ',') p++;
    }
    if (!*mask) return kiln_error(KILN_ERR_INVALID, "--lora-targets '%s' names no module", list);
    return KILN_OK;
}

double kiln_lora_scaling(const kiln_lora_config *lc) {
    return lc->rslora ? lc->alpha / sqrt((double)lc->rank) : lc->alpha / lc->rank;
}

kiln_status kiln_lora_config_validate(const kiln_lora_config *lc) {
    if (lc->rank < 1 || lc->rank > 65536) return kiln_error(KILN_ERR_INVALID, "lora rank r must be in [1, 65536], got %d", lc->rank);
    if (!isfinite(lc->alpha) || lc->alpha <= 0)
        return kiln_error(KILN_ERR_INVALID, "lora_alpha must be a finite number > 0, got %g", lc->alpha);
    double s = kiln_lora_scaling(lc);
    if (!(s >= KILN_LORA_MIN_SCALING && s <= KILN_LORA_MAX_SCALING))
        return kiln_error(KILN_ERR_INVALID,
                          "lora_alpha %g with r %d gives the scaling %s = %g, outside the sane range [%g, %g] (it would "
                          "overflow or do nothing)",
                          lc->alpha, lc->rank, lc->rslora ? "alpha/sqrt(r)" : "alpha/r", s, KILN_LORA_MIN_SCALING,
                          KILN_LORA_MAX_SCALING);
    if (!(lc->dropout >= 0 && lc->dropout < 1))
        return kiln_error(KILN_ERR_INVALID, "lora dropout must be in [0, 1), got %g", lc->dropout);
    if (!lc->targets || lc->targets >> KILN_LORA_N)
        return kiln_error(KILN_ERR_INVALID, "lora targets mask 0x%x names no module or an unknown one", lc->targets);
    return KILN_OK;
}

static kiln_tensor *base_weight(kiln_llama_layer *ly, int t) {
    kiln_tensor *w[KILN_LORA_N] = {ly->q_proj, ly->k_proj, ly->v_proj, ly->o_proj, ly->gate_proj, ly->up_proj, ly->down_proj};
    return w[t];
}

/* An adapter on the device of the base weight it adapts. */
static kiln_tensor *adapter(const kiln_tensor *W, const char *name, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    kiln_tensor *t = kiln_tensor_new_on(kiln_tensor_buft(W), KILN_F32, 2, s);
    if (!t) return NULL;
    kiln_tensor_set_name(t, name);
    t->requires_grad = true;
    return t;
}

kiln_status kiln_llama_lora_add(kiln_llama *m, const kiln_lora_config *lc, uint64_t seed) {
    kiln_status st = kiln_lora_config_validate(lc);
    if (st) return st;
    if (m->lora_a) return kiln_error(KILN_ERR_INVALID, "the model already has LoRA adapters");
    int64_t L = m->cfg.num_hidden_layers;
    int per = __builtin_popcount(lc->targets);
    kiln_tensor **p = realloc(m->params, (size_t)(m->n_params + 2 * per * L) * sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "out of memory adding LoRA adapters");
    m->params = p;
    m->lora_a = calloc((size_t)(L * KILN_LORA_N), sizeof *m->lora_a);
    m->lora_b = calloc((size_t)(L * KILN_LORA_N), sizeof *m->lora_b);
    if (!m->lora_a || !m->lora_b) goto oom;
    for (int i = 0; i < m->n_base; i++) {
        m->params[i]->requires_grad = false;
        kiln_tensor_release(m->params[i]->grad);
        m->params[i]->grad = NULL;
    }
    for (int64_t l = 0; l < L; l++)
        for (int t = 0; t < KILN_LORA_N; t++) {
            if (!(lc->targets & (1u << t))) continue;
            kiln_tensor *W = base_weight(&m->layers[l], t);
            int64_t out = W->shape[0], in = W->shape[1];
            char name[128];
            snprintf(name, sizeof name, "model.layers.%lld.%s.%s.lora_A.weight", (long long)l, target_parent[t], target_names[t]);
            kiln_tensor *A = adapter(W, name, lc->rank, in);
            name[strlen(name) - strlen("A.weight")] = 'B';
            kiln_tensor *B = adapter(W, name, out, lc->rank);
            if (!A || !B) {
                kiln_tensor_release(A);
                kiln_tensor_release(B);
                goto oom;
            }
            /* PEFT: kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2 / (1 + 5)),
             * bound = gain * sqrt(3 / fan_in) = 1 / sqrt(in); B stays zero.
             * Its own counter range per adapter, after the base's. */
            float bound = (float)(1.0 / sqrt((double)in));
            kiln_rng rng = {seed ^ 0x4c6f5241ull, (uint64_t)m->n_params << 40};
            int64_t na = kiln_tensor_numel(A);
            float *h = malloc((size_t)na * sizeof *h); /* A is small: rank x in */
            bool ok = h != NULL;
            if (ok) {
                kiln_rng_uniform(&rng, h, na, -bound, bound);
                ok = !kiln_tensor_set(A, 0, h, (size_t)na * sizeof *h) && !kiln_tensor_zero(B);
            }
            free(h);
            if (!ok) {
                kiln_tensor_release(A);
                kiln_tensor_release(B);
                goto oom;
            }
            m->lora_a[l * KILN_LORA_N + t] = A;
            m->lora_b[l * KILN_LORA_N + t] = B;
            m->params[m->n_params++] = A;
            m->params[m->n_params++] = B;
        }
    m->lora = *lc;
    return KILN_OK;
oom:
    for (int i = m->n_base; i < m->n_params; i++) kiln_tensor_release(m->params[i]);
    m->n_params = m->n_base;
    free(m->lora_a);
    free(m->lora_b);
    m->lora_a = m->lora_b = NULL;
    return kiln_error(KILN_ERR_OOM, "out of memory adding LoRA adapters");
}

/* Replaces base weight t of layer l by `nt` (same name and shape) in the
 * layer and in params[]. */
static void replace_base(kiln_llama *m, int64_t l, int t, kiln_tensor *nt) {
    kiln_llama_layer *ly = &m->layers[l];
    kiln_tensor **slot[KILN_LORA_N] = {&ly->q_proj, &ly->k_proj, &ly->v_proj, &ly->o_proj, &ly->gate_proj, &ly->up_proj,
                                       &ly->down_proj};
    kiln_tensor *old = *slot[t];
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i] == old) m->params[i] = nt;
    *slot[t] = nt;
    kiln_tensor_release(old);
}

enum { CONV_CHUNK = 1 << 20 }; /* values per host buffer when merging */

/* W += scale * B A for one adapter, in double per element as before, read
 * and written through host buffers (A and B whole: they are small; W a
 * block of rows at a time). A non-finite result is refused with the
 * elements before it already merged, as the in-place loop left them. */
static kiln_status merge_one(kiln_tensor *W, const kiln_tensor *A, const kiln_tensor *B, int64_t R, double scale) {
    int64_t out = W->shape[0], in = W->shape[1];
    int64_t rows = in > 0 && in < CONV_CHUNK ? CONV_CHUNK / in : 1;
    if (rows > out) rows = out;
    size_t fa = (size_t)(R * in), fb = (size_t)(out * R), fw = (size_t)(rows * in);
    float *a = malloc((fa ? fa : 1) * sizeof *a), *b = malloc((fb ? fb : 1) * sizeof *b), *w = malloc((fw ? fw : 1) * sizeof *w);
    kiln_status st = a && b && w ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory merging into %s", W->name);
    if (!st) st = kiln_tensor_get(A, 0, a, fa * sizeof *a);
    if (!st) st = kiln_tensor_get(B, 0, b, fb * sizeof *b);
    for (int64_t o0 = 0; o0 < out && !st; o0 += rows) {
        int64_t nr = out - o0 < rows ? out - o0 : rows;
        size_t off = (size_t)(o0 * in) * sizeof *w;
        if ((st = kiln_tensor_get(W, off, w, (size_t)(nr * in) * sizeof *w))) break;
        for (int64_t q = 0; q < nr && !st; q++) {
            int64_t o = o0 + q;
            for (int64_t i = 0; i < in; i++) {
                double s = 0;
                for (int64_t r = 0; r < R; r++) s += (double)b[o * R + r] * a[r * in + i];
                double v = (double)w[q * in + i] + scale * s;
                /* a weight file of inf/NaN would load everywhere and compute nothing */
                if (!isfinite(v) || fabs(v) > FLT_MAX) {
                    kiln_tensor_set(W, off, w, (size_t)(q * in + i) * sizeof *w);
                    st = kiln_error(KILN_ERR_NUMERIC,
                                    "merging the LoRA adapters into %s gives a non-finite weight at [%lld, %lld] "
                                    "(%g; scaling %g): refusing to merge",
                                    W->name, (long long)o, (long long)i, v, scale);
                    break;
                }
                w[q * in + i] = (float)v;
            }
        }
        if (!st) st = kiln_tensor_set(W, off, w, (size_t)(nr * in) * sizeof *w);
    }
    free(a);
    free(b);
    free(w);
    return st;
}

kiln_status kiln_llama_base_cast(kiln_llama *m, kiln_dtype dt) {
    if (dt != KILN_F32 && dt != KILN_BF16 && !kiln_dtype_is_dequant(dt))
        return kiln_error(KILN_ERR_UNSUPPORTED, "base dtype %s: fp32, bf16, f16 and ggml's block types are implemented",
                          kiln_dtype_name(dt));
    if (dt != KILN_F32 && !m->lora_a)
        return kiln_error(KILN_ERR_INVALID, "a %s base is frozen: it needs LoRA adapters (--lora-rank R); full fine-tuning "
                          "trains the fp32 weights (--precision bf16 gives bf16 products)", kiln_dtype_name(dt));
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int t = 0; t < KILN_LORA_N; t++) {
            kiln_tensor *W = base_weight(&m->layers[l], t);
            if (W->dtype == dt) continue;
            if (W->requires_grad)
                return kiln_error(KILN_ERR_INVALID, "%s is trainable: only a frozen base is held in %s", W->name, kiln_dtype_name(dt));
            if (W->dtype != KILN_F32 && dt != KILN_F32)
                return kiln_error(KILN_ERR_INVALID, "%s is already %s: a base is cast once, from fp32 (requantizing loses more)",
                                  W->name, kiln_dtype_name(W->dtype));
            kiln_tensor *nt = kiln_tensor_convert(W, dt); /* one weight at a time: the peak is one extra weight */
            if (!nt) return kiln_error_context(kiln_last_status(), "converting %s to %s", W->name, kiln_dtype_name(dt));
            replace_base(m, l, t, nt);
        }
    return KILN_OK;
}

kiln_status kiln_llama_lora_merge(kiln_llama *m) {
    if (!m->lora_a) return kiln_error(KILN_ERR_INVALID, "the model has no LoRA adapters to merge");
    double scale = kiln_lora_scaling(&m->lora);
    int64_t R = m->lora.rank;
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int t = 0; t < KILN_LORA_N; t++) {
            kiln_tensor *A = m->lora_a[l * KILN_LORA_N + t], *B = m->lora_b[l * KILN_LORA_N + t];
            if (!A) continue;
            kiln_tensor *W = base_weight(&m->layers[l], t);
            if (W->dtype != KILN_F32) { /* a bf16/f16/block base: the merged weight is fp32 (W widened exactly, plus the update) */
                kiln_tensor *nt = kiln_tensor_convert(W, KILN_F32);
                if (!nt) return kiln_error_context(kiln_last_status(), "merging into %s", W->name);
                replace_base(m, l, t, nt);
                W = nt;
            }
            if (W->dtype != KILN_F32)
                return kiln_error(KILN_ERR_UNSUPPORTED, "merging into a %s base weight (%s)", kiln_dtype_name(W->dtype), W->name);
            kiln_status st = merge_one(W, A, B, R, scale);
            if (st) return st;
        }
    for (int i = m->n_base; i < m->n_params; i++) kiln_tensor_release(m->params[i]);
    m->n_params = m->n_base;
    free(m->lora_a);
    free(m->lora_b);
    m->lora_a = m->lora_b = NULL;
    memset(&m->lora, 0, sizeof m->lora);
    for (int i = 0; i < m->n_params; i++) m->params[i]->requires_grad = true;
    return KILN_OK;
}
