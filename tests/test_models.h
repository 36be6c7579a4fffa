/* Helpers the model-level tests share: the tiny GQA configuration, target
 * counting, and the parameter-wise relative difference of two models. */
#ifndef KILN_TEST_MODELS_H
#define KILN_TEST_MODELS_H
#include <math.h>
#include "kiln/data.h"
#include "kiln/model.h"
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
static inline double test_weights_diff(const kiln_llama *a, const kiln_llama *b) {
    double worst = 0;
    for (int i = 0; i < a->n_params; i++) {
        double d = 0, s = 0;
        for (int64_t j = 0; j < kiln_tensor_numel(a->params[i]); j++) {
            d = fmax(d, fabs((double)kiln_f32(a->params[i])[j] - kiln_f32(b->params[i])[j]));
            s = fmax(s, fabs((double)kiln_f32(b->params[i])[j]));
        }
        worst = fmax(worst, d / s);
    }
    return worst;
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
#endif
