/* Generation with a key/value cache: incremental decoding matches a full
 * forward pass, greedy decoding is the argmax, sampling is reproducible from
 * its seed and respects top-k, and too long a request is refused. */
#include <stdlib.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "test.h"

#define V 61
#define MAXPOS 64

static kiln_llama *tiny_model(void) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    c.vocab_size = V, c.hidden_size = 48, c.intermediate_size = 96, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 12, c.max_position_embeddings = MAXPOS;
    c.rms_norm_eps = 1e-5;
    CHECK_OK(kiln_llama_config_validate(&c));
    kiln_llama *m = kiln_llama_new(&c, 7);
    CHECK(m != NULL, "model: %s", kiln_last_error());
    if (!m) return NULL;
    /* larger weights than HF's 0.02 so the logits are far from uniform and
     * argmax decisions are not coin flips decided by rounding */
    kiln_rng rng = {99, 0};
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        if (p->ndim == 2) kiln_rng_normal(&rng, kiln_f32(p), kiln_tensor_numel(p), 0.0f, 0.25f);
    }
    return m;
}

/* Full forward of ids[0..n) without a cache: logits [1, n, V] (caller releases). */
static kiln_tensor *full_forward(kiln_llama *m, const int32_t *ids, int n) {
    int64_t s[2] = {1, n};
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, s);
    memcpy(t->data, ids, (size_t)n * sizeof *ids);
    kiln_tensor *logits = kiln_llama_forward(m, t, NULL, NULL);
    kiln_tensor_release(t);
    return logits;
}

static int row_argmax(const float *row) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

static double row_rel(const float *a, const float *b) {
    double d = 0, s = 0;
    for (int i = 0; i < V; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

static void test_cache_matches_full(kiln_llama *m) {
    enum { N = 24, P = 5 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 17 + 3) % V);
    kiln_tensor *full = full_forward(m, ids, N);
    CHECK(full != NULL, "full forward: %s", kiln_last_error());
    kiln_llama_cache *kc = kiln_llama_cache_new(m, 1, N);
    CHECK(kc != NULL, "cache");
    if (!full || !kc) return;
    /* prefill P tokens, then one at a time */
    double worst = 0;
    int pos = 0;
    while (pos < N) {
        int n = pos == 0 ? P : 1;
        int64_t s[2] = {1, n};
        kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, s);
        memcpy(t->data, ids + pos, (size_t)n * sizeof *ids);
        kiln_tensor *lg = kiln_llama_forward(m, t, NULL, kc);
        kiln_tensor_release(t);
        CHECK(lg != NULL, "cached forward at %d: %s", pos, kiln_last_error());
        if (!lg) break;
        for (int j = 0; j < n; j++)
            worst = fmax(worst, row_rel(kiln_f32(lg) + (int64_t)j * V, kiln_f32(full) + (int64_t)(pos + j) * V));
        kiln_tensor_release(lg);
        pos += n;
    }
    CHECK(kiln_llama_cache_len(kc) == N, "cache length %lld", (long long)kiln_llama_cache_len(kc));
    printf("cached vs full logits: max rel error %.3g\n", worst);
    CHECK(worst < 1e-5, "incremental logits differ from the full forward by %.3g", worst);
    kiln_llama_cache_free(kc);
    kiln_tensor_release(full);
}

static void test_greedy(kiln_llama *m) {
    enum { P = 4, N = 20 };
    int32_t seq[P + N] = {5, 9, 2, 40};
    kiln_sample_config sc = {.max_tokens = N, .temperature = 0, .top_k = 0, .top_p = 1, .seed = 1, .stop_id = -1};
    int n = 0;
    CHECK_OK(kiln_generate(m, seq, P, &sc, seq + P, &n, NULL, NULL));
    CHECK(n == N, "generated %d of %d", n, N);
    for (int i = 0; i < n; i++) {
        kiln_tensor *lg = full_forward(m, seq, P + i);
        if (!lg) break;
        int want = row_argmax(kiln_f32(lg) + (int64_t)(P + i - 1) * V);
        CHECK(seq[P + i] == want, "step %d: greedy %d, full-forward argmax %d", i, seq[P + i], want);
        kiln_tensor_release(lg);
    }
    /* stop_id ends generation right after it */
    sc.stop_id = seq[P + 2];
    int32_t out[N];
    int n2 = 0;
    CHECK_OK(kiln_generate(m, seq, P, &sc, out, &n2, NULL, NULL));
    int first = 0;
    while (seq[P + first] != sc.stop_id) first++;
    CHECK(n2 == first + 1 && out[n2 - 1] == sc.stop_id, "stopped after %d ids, expected %d", n2, first + 1);
}

static void count_token(int32_t id, void *user) {
    (void)id;
    (*(int *)user)++;
}

static void test_sampling(kiln_llama *m) {
    enum { P = 3, N = 30 };
    const int32_t prompt[P] = {1, 2, 3};
    int32_t a[N], b[N], c[N], g[N];
    int na = 0, nb = 0, nc = 0, ng = 0, calls = 0;
    kiln_sample_config sc = {.max_tokens = N, .temperature = 1.0, .top_k = 0, .top_p = 0.95, .seed = 42, .stop_id = -1};
    CHECK_OK(kiln_generate(m, prompt, P, &sc, a, &na, count_token, &calls));
    CHECK(calls == na && na == N, "on_token called %d times for %d ids", calls, na);
    CHECK_OK(kiln_generate(m, prompt, P, &sc, b, &nb, NULL, NULL));
    CHECK(na == nb && !memcmp(a, b, sizeof a), "same seed gave different samples");
    sc.seed = 43;
    CHECK_OK(kiln_generate(m, prompt, P, &sc, c, &nc, NULL, NULL));
    CHECK(memcmp(a, c, sizeof a) != 0, "different seeds gave identical samples");

    kiln_sample_config greedy = {.max_tokens = N, .temperature = 0, .top_p = 1, .stop_id = -1};
    CHECK_OK(kiln_generate(m, prompt, P, &greedy, g, &ng, NULL, NULL));
    sc = (kiln_sample_config){.max_tokens = N, .temperature = 1.5, .top_k = 1, .top_p = 1, .seed = 5, .stop_id = -1};
    CHECK_OK(kiln_generate(m, prompt, P, &sc, c, &nc, NULL, NULL));
    CHECK(nc == ng && !memcmp(c, g, sizeof g), "top_k=1 differs from greedy");
    /* a tiny nucleus keeps only the most likely token: greedy again */
    sc = (kiln_sample_config){.max_tokens = N, .temperature = 1.0, .top_k = 0, .top_p = 1e-9, .seed = 6, .stop_id = -1};
    CHECK_OK(kiln_generate(m, prompt, P, &sc, c, &nc, NULL, NULL));
    CHECK(nc == ng && !memcmp(c, g, sizeof g), "top_p=1e-9 differs from greedy");

    /* top_k=3: every sampled id is among the 3 largest logits at its step */
    sc = (kiln_sample_config){.max_tokens = N, .temperature = 2.0, .top_k = 3, .top_p = 1, .seed = 8, .stop_id = -1};
    int32_t seq[P + N];
    memcpy(seq, prompt, sizeof prompt);
    CHECK_OK(kiln_generate(m, prompt, P, &sc, seq + P, &nc, NULL, NULL));
    int bad = 0, non_greedy = 0;
    for (int i = 0; i < nc; i++) {
        kiln_tensor *lg = full_forward(m, seq, P + i);
        if (!lg) break;
        const float *row = kiln_f32(lg) + (int64_t)(P + i - 1) * V;
        int above = 0;
        for (int j = 0; j < V; j++) above += row[j] > row[seq[P + i]];
        bad += above >= 3;
        non_greedy += above > 0;
        kiln_tensor_release(lg);
    }
    CHECK(bad == 0, "%d sampled ids were outside the top 3", bad);
    CHECK(non_greedy > 0, "temperature 2 with top_k 3 never left the argmax in %d steps", nc);
}

static void test_errors(kiln_llama *m) {
    int32_t prompt[60];
    for (int i = 0; i < 60; i++) prompt[i] = i % V;
    int32_t out[10];
    int n = -1;
    kiln_sample_config sc = {.max_tokens = 10, .temperature = 0, .top_p = 1, .stop_id = -1};
    kiln_status st = kiln_generate(m, prompt, 60, &sc, out, &n, NULL, NULL);
    CHECK(st == KILN_ERR_RANGE, "too long: status %d", (int)st);
    CHECK(strstr(kiln_last_error(), "max_position_embeddings") != NULL, "message: %s", kiln_last_error());
    CHECK(n == 0, "n_out %d after an error", n);
    sc.max_tokens = 4; /* 60 + 4 = 64 fits exactly */
    CHECK_OK(kiln_generate(m, prompt, 60, &sc, out, &n, NULL, NULL));
    CHECK(n == 4, "generated %d", n);
    prompt[3] = V;
    CHECK(kiln_generate(m, prompt, 5, &sc, out, &n, NULL, NULL) == KILN_ERR_RANGE, "out-of-vocabulary prompt accepted");
    prompt[3] = 3;
    CHECK(kiln_generate(m, prompt, 0, &sc, out, &n, NULL, NULL) == KILN_ERR_INVALID, "empty prompt accepted");
    sc.top_p = 0;
    CHECK(kiln_generate(m, prompt, 5, &sc, out, &n, NULL, NULL) == KILN_ERR_INVALID, "top_p 0 accepted");
}

int main(void) {
    kiln_llama *m = tiny_model();
    if (!m) TEST_END();
    test_cache_matches_full(m);
    test_greedy(m);
    test_sampling(m);
    test_errors(m);
    /* with the eager dispatcher on, generation records no tape and restores
     * the grad setting */
    kiln_eager_enable();
    int32_t p[2] = {4, 5}, out[8];
    int n = 0;
    kiln_sample_config sc = {.max_tokens = 8, .temperature = 0, .top_p = 1, .stop_id = -1};
    CHECK_OK(kiln_generate(m, p, 2, &sc, out, &n, NULL, NULL));
    CHECK(kiln_grad_enabled(), "grad recording left off");
    kiln_eager_disable();
    kiln_llama_free(m);
    TEST_END();
}
