/* Autoregressive generation with a key/value cache: the prompt is run once
 * (prefill), then each step feeds only the newest token. Sampling works on
 * the last position's logits in double precision, with temperature, top-k
 * and nucleus (top-p) filtering; the only randomness is one kiln_rng draw
 * per step, so a seed reproduces a sample exactly. It runs on the model's
 * device: the ids are set and the last row of logits read through the
 * seam. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "hostio.h"

typedef struct {
    double logit;
    int32_t id;
} cand;

/* Descending by logit; equal logits keep the lower id first, so the order
 * (and thus the sample) never depends on qsort's instability. */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t argmax(const double *z, int64_t V) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (z[i] > z[best]) best = i;
    return (int32_t)best;
}

/* Picks the next id from one row of logits. `work` holds V candidates. */
static int32_t sample_row(const double *z, int64_t V, const kiln_sample_config *sc, kiln_rng *rng, cand *work) {
    if (sc->temperature <= 0 || sc->top_k == 1) return argmax(z, V);
    for (int64_t i = 0; i < V; i++) work[i] = (cand){z[i] / sc->temperature, (int32_t)i};
    qsort(work, (size_t)V, sizeof *work, cand_cmp);
    int64_t n = V;
    if (sc->top_k > 0 && sc->top_k < n) n = sc->top_k;
    /* softmax over the kept candidates, shifted by the max for range */
    double mx = work[0].logit, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        work[i].logit = exp(work[i].logit - mx);
        sum += work[i].logit;
    }
    if (sc->top_p < 1.0) {
        /* smallest prefix (by falling probability) whose mass reaches top_p */
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += work[i].logit / sum;
            if (cum >= sc->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int64_t i = 0; i < n; i++) sum += work[i].logit;
    }
    double u = kiln_rng_next_double(rng) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += work[i].logit;
        if (u < acc) return work[i].id;
    }
    return work[n - 1].id; /* u landed on the rounding gap at the top */
}

/* The last position of logits [1, T, V] as doubles. */
static kiln_status last_row(const kiln_tensor *logits, double *z, int64_t V) {
    if (logits->ndim != 3 || logits->shape[2] != V)
        return kiln_error(KILN_ERR_SHAPE, "generate: logits have an unexpected shape");
    if (logits->dtype != KILN_F32 && logits->dtype != KILN_BF16)
        return kiln_error(KILN_ERR_UNSUPPORTED, "generate: logits of dtype %s", kiln_dtype_name(logits->dtype));
    size_t es = kiln_dtype_size(logits->dtype);
    void *row = malloc((size_t)V * es);
    if (!row) return kiln_error(KILN_ERR_OOM, "generate: out of memory for a row of %lld logits", (long long)V);
    kiln_status st = kiln_tensor_get(logits, (size_t)((logits->shape[1] - 1) * V) * es, row, (size_t)V * es);
    for (int64_t i = 0; i < V && !st; i++) {
        double x = logits->dtype == KILN_F32 ? ((const float *)row)[i] : kiln_bf16_to_f32(((const uint16_t *)row)[i]);
        if (!isfinite(x)) st = kiln_error(KILN_ERR_NUMERIC, "generate: non-finite logit for id %lld", (long long)i);
        z[i] = x;
    }
    free(row);
    return st;
}

static kiln_status check_args(const kiln_llama *m, const int32_t *prompt, int n_prompt, const kiln_sample_config *sc,
                              const int32_t *out, const int *n_out) {
    if (!m || !prompt || !sc || !n_out || (!out && sc->max_tokens > 0))
        return kiln_error(KILN_ERR_INVALID, "generate: NULL argument");
    if (n_prompt < 1) return kiln_error(KILN_ERR_INVALID, "generate: the prompt needs at least one token");
    if (sc->max_tokens < 0) return kiln_error(KILN_ERR_INVALID, "generate: max_tokens %d is negative", sc->max_tokens);
    if (!(sc->temperature >= 0) || !isfinite(sc->temperature))
        return kiln_error(KILN_ERR_INVALID, "generate: temperature %g must be finite and >= 0", sc->temperature);
    if (sc->top_k < 0) return kiln_error(KILN_ERR_INVALID, "generate: top_k %d is negative", sc->top_k);
    if (!(sc->top_p > 0 && sc->top_p <= 1))
        return kiln_error(KILN_ERR_INVALID, "generate: top_p %g must be in (0, 1]", sc->top_p);
    int64_t V = m->cfg.vocab_size, max_pos = m->cfg.max_position_embeddings;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return kiln_error(KILN_ERR_RANGE, "generate: prompt token %d at position %d is outside the vocabulary (%lld)",
                              prompt[i], i, (long long)V);
    if ((int64_t)n_prompt + sc->max_tokens > max_pos)
        return kiln_error(KILN_ERR_RANGE,
                          "generate: prompt (%d tokens) + max_tokens (%d) = %lld exceeds the model's "
                          "max_position_embeddings %lld",
                          n_prompt, sc->max_tokens, (long long)n_prompt + sc->max_tokens, (long long)max_pos);
    return KILN_OK;
}

/* Runs `n` ids through the model, appending to the cache; leaves the last
 * position's logits in z. */
static kiln_status step(kiln_llama *m, kiln_llama_cache *kc, const int32_t *ids, int n, double *z) {
    int64_t shape[2] = {1, n};
    kiln_tensor *t = kiln_tensor_new_on(kiln_model_backend(m)->buft, KILN_I32, 2, shape);
    if (!t) return kiln_error_context(KILN_ERR_OOM, "generate");
    kiln_status sst = kiln_tensor_set(t, 0, ids, (size_t)n * sizeof *ids);
    if (sst) {
        kiln_tensor_release(t);
        return kiln_error_context(sst, "generate");
    }
    kiln_tensor *logits = kiln_llama_forward(m, t, NULL, kc);
    kiln_tensor_release(t);
    if (!logits) return kiln_error_context(kiln_last_status() ? kiln_last_status() : KILN_ERR_INVALID, "generate");
    kiln_status st = last_row(logits, z, m->cfg.vocab_size);
    kiln_tensor_release(logits);
    return st;
}

bool kiln_sample_is_stop(const kiln_sample_config *sc, int32_t id) {
    if (id == sc->stop_id) return true;
    for (int i = 0; sc->stop_ids && i < sc->n_stop_ids; i++)
        if (sc->stop_ids[i] == id) return true;
    return false;
}

static kiln_status run(kiln_llama *m, kiln_llama_cache *kc, const int32_t *prompt, int n_prompt,
                       const kiln_sample_config *sc, int32_t *out, int *n_out, double *z, cand *work,
                       void (*on_token)(int32_t id, void *user), void *user) {
    int64_t V = m->cfg.vocab_size;
    kiln_rng rng = {sc->seed, 0};
    kiln_status st = step(m, kc, prompt, n_prompt, z);
    for (int i = 0; st == KILN_OK && i < sc->max_tokens; i++) {
        int32_t id = sample_row(z, V, sc, &rng, work);
        out[(*n_out)++] = id;
        if (on_token) on_token(id, user);
        if (kiln_sample_is_stop(sc, id) || i + 1 == sc->max_tokens) break;
        st = step(m, kc, &id, 1, z);
    }
    return st;
}

kiln_status kiln_generate(kiln_llama *m, const int32_t *prompt, int n_prompt, const kiln_sample_config *sc,
                          int32_t *out, int *n_out, void (*on_token)(int32_t id, void *user), void *user) {
    if (n_out) *n_out = 0;
    kiln_status st = check_args(m, prompt, n_prompt, sc, out, n_out);
    if (st) return st;
    if (sc->max_tokens == 0) return KILN_OK;
    int64_t V = m->cfg.vocab_size;
    /* the cache and every tensor the model makes go to the model's device */
    const kiln_backend *dev = kiln_backend_use(kiln_model_backend(m));
    double *z = malloc((size_t)V * sizeof *z);
    cand *work = malloc((size_t)V * sizeof *work);
    kiln_llama_cache *kc = kiln_llama_cache_new(m, 1, (int64_t)n_prompt + sc->max_tokens);
    if (!z || !work || !kc) {
        st = kiln_error(KILN_ERR_OOM, "generate: out of memory for a cache of %lld positions",
                        (long long)n_prompt + sc->max_tokens);
    } else {
        /* no tape: generation never needs gradients (a no-op without the
         * eager dispatcher, where nothing records anyway) */
        bool was = kiln_grad_set_enabled(false);
        st = run(m, kc, prompt, n_prompt, sc, out, n_out, z, work, on_token, user);
        kiln_grad_set_enabled(was);
    }
    kiln_llama_cache_free(kc);
    kiln_backend_use(dev);
    free(work);
    free(z);
    return st;
}
