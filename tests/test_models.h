/* Helpers the model-level tests share: the tiny GQA configuration, target
 * counting, and the parameter-wise relative difference of two models. */
#ifndef KILN_TEST_MODELS_H
#define KILN_TEST_MODELS_H
#include <math.h>
#include "kiln/data.h"
#include "kiln/model.h"
#include "kiln/train.h"
#include "kiln/safetensors.h"
#include "test.h"

/* vocab 61, hidden 48, 4 heads over 2 kv heads (head dim 12), 2 layers */
static inline kiln_llama_config test_tiny_config(void) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    c.vocab_size = 61, c.hidden_size = 48, c.intermediate_size = 40, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 12, c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    return c;
}

static inline void test_count_targets(kiln_batch *b) {
    b->n_targets = 0;
    for (int i = 0; i < b->B * b->T; i++) b->n_targets += b->targets[i] != KILN_IGNORE_INDEX;
}

/* The model of a fixture's config.json with its parameters copied from the
 * fixture's safetensors file (tensors of the same names and sizes); the
 * file stays open in *f for the caller's other tensors. False when the
 * model cannot be built or a parameter is missing or of another size. */
static inline bool test_fixture_model(const char *config_path, const char *st_path, kiln_llama_config *cfg,
                                      kiln_llama **m, kiln_st_file **f) {
    CHECK_OK(kiln_llama_config_load(config_path, cfg));
    CHECK_OK(kiln_st_open(st_path, f));
    if (!*f || !(*m = kiln_llama_new(cfg, 1))) return false;
    for (int i = 0; i < (*m)->n_params; i++) {
        const kiln_st_tensor *t = kiln_st_find(*f, (*m)->params[i]->name);
        if (!t || t->nbytes != kiln_tensor_nbytes((*m)->params[i])) return false;
        memcpy((*m)->params[i]->data, t->bytes, t->nbytes);
    }
    return true;
}

/* the worst over parameters of max |a - b| / max |b| */
static inline double test_tensors_diff(kiln_tensor *const *a, kiln_tensor *const *b, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = 0, s = 0;
        for (int64_t j = 0; j < kiln_tensor_numel(a[i]); j++) {
            d = fmax(d, fabs((double)kiln_f32(a[i])[j] - kiln_f32(b[i])[j]));
            s = fmax(s, fabs((double)kiln_f32(b[i])[j]));
        }
        worst = fmax(worst, d / s);
    }
    return worst;
}
static inline double test_weights_diff(const kiln_llama *a, const kiln_llama *b) {
    return test_tensors_diff(a->params, b->params, a->n_params);
}
/* The training step's inputs for a batch (kiln_train_trace_step order):
 * ids, targets, pad mask wrapped, and the loss scale; release with
 * test_release_inputs. */
static inline void test_step_inputs(const kiln_batch *b, float scale, kiln_tensor **in) {
    int64_t s[2] = {b->B, b->T}, one = 1;
    in[0] = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, s);
    in[1] = kiln_tensor_wrap(b->targets, KILN_I32, 2, s);
    in[2] = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, s);
    in[3] = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(in[3])[0] = scale;
}
static inline void test_release_inputs(kiln_tensor **in) {
    for (int i = 0; i < 4; i++) kiln_tensor_release(in[i]);
}
/* ---- the LoRA tests' model, batch, loss and gradients --------------------- */
/* mc's model (seed 5) with rank-4 adapters (alpha 8, dropout p) on all seven
 * linears, B drawn away from zero so that A has a gradient */
static inline kiln_llama *test_lora_model(const kiln_llama_config *mc, double p) {
    kiln_llama *m = kiln_llama_new(mc, 5);
    kiln_lora_config lc = {.rank = 4, .alpha = 8, .dropout = p, .targets = (1u << KILN_LORA_N) - 1};
    CHECK_OK(kiln_llama_lora_add(m, &lc, 9));
    for (int i = m->n_base; i < m->n_params; i++)
        if (strstr(m->params[i]->name, "lora_B")) {
            kiln_rng r = {77, (uint64_t)i << 32};
            kiln_rng_uniform(&r, kiln_f32(m->params[i]), kiln_tensor_numel(m->params[i]), -0.2f, 0.2f);
        }
    return m;
}

/* full rows of random ids below vocab, each predicting the next */
static inline void test_fill_batch(kiln_batch *b, uint64_t seed, int vocab) {
    for (int i = 0; i < b->B * b->T; i++) {
        b->input_ids[i] = (int32_t)(kiln_rng_u64(seed, (uint64_t)i) % (uint64_t)vocab);
        b->pad_mask[i] = 1;
    }
    for (int i = 0; i < b->B * b->T; i++) b->targets[i] = (i + 1) % b->T ? b->input_ids[i + 1] : KILN_IGNORE_INDEX;
    b->rows = b->B;
    test_count_targets(b);
}

/* the step's loss (the sum scaled by in[3]) from zeroed gradients; with
 * backward, its gradients */
static inline double test_loss_of(kiln_llama *m, kiln_tensor *const *in, bool backward) {
    kiln_llama_zero_grad(m);
    kiln_tensor *sum = kiln_ce_loss(m, in[0], in[1], in[2], NULL);
    kiln_tensor *loss = sum ? kiln_scale_by(sum, in[3]) : NULL;
    CHECK(loss != NULL, "loss: %s", kiln_last_error());
    double l = loss ? kiln_f32(loss)[0] : NAN;
    if (loss && backward) CHECK_OK(kiln_backward(loss));
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    return l;
}

/* the adapters' gradients, concatenated (malloc'd; *n values) */
static inline float *test_adapter_grads(const kiln_llama *m, int64_t *n) {
    *n = 0;
    for (int i = m->n_base; i < m->n_params; i++) *n += kiln_tensor_numel(m->params[i]);
    float *g = calloc((size_t)*n, 4);
    int64_t o = 0;
    for (int i = m->n_base; i < m->n_params; i++) {
        if (m->params[i]->grad) memcpy(g + o, m->params[i]->grad->data, kiln_tensor_nbytes(m->params[i]));
        o += kiln_tensor_numel(m->params[i]);
    }
    return g;
}

#endif
