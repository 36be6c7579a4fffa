/* The trainer against PyTorch (tests/reference/make_train_fixture.py): six
 * optimiser steps of a tiny GQA Llama over padded micro-batches, with
 * token-normalised accumulation over windows of 3, 3 and 1 micro-batches,
 * clipping at 1.0, AdamW with decay on the 2-D weights but the embedding,
 * and the warm-up + cosine schedule. Per-step loss, learning rate and
 * pre-clip gradient norm, and every final weight, must match torch to 1e-4
 * relative. Then --loss-norm=steps on the same data must NOT match. */
#include <stdlib.h>
#include "kiln/eager.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"

#define FIX "tests/fixtures/"
#define N_MB 7
#define B 2
#define T 16
#define ACCUM 3
#define EPOCHS 2
#define STEPS 6
#define TOL 1e-4

/* max |a-b| / max |b| over the tensor: fair to elements near zero */
static const kiln_st_tensor *find(const kiln_st_file *f, const char *name, kiln_dtype dt, int64_t numel) {
    const kiln_st_tensor *t = kiln_st_find(f, name);
    int64_t n = 1;
    for (int d = 0; t && d < t->ndim; d++) n *= t->shape[d];
    CHECK(t && t->dtype == dt && n == numel, "fixture tensor %s missing or wrong dtype/size", name);
    return t && t->dtype == dt && n == numel ? t : NULL;
}

/* A model holding the fixture's initial weights (HF names). */
static kiln_llama *load_model(const kiln_st_file *f, const kiln_llama_config *cfg) {
    kiln_llama *m = kiln_llama_new(cfg, 1);
    CHECK(m != NULL, "model: %s", kiln_last_error());
    if (!m) return NULL;
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        const kiln_st_tensor *t = find(f, p->name, KILN_F32, kiln_tensor_numel(p));
        if (!t) {
            kiln_llama_free(m);
            return NULL;
        }
        memcpy(p->data, t->bytes, t->nbytes);
    }
    return m;
}

static bool load_batches(const kiln_st_file *f, kiln_batch **mb) {
    static const char *const keys[3] = {"input_ids", "attention_mask", "labels"};
    for (int i = 0; i < N_MB; i++) {
        mb[i] = kiln_batch_alloc(B, T);
        CHECK(mb[i] != NULL, "batch: %s", kiln_last_error());
        if (!mb[i]) return false;
        int32_t *dst[3] = {mb[i]->input_ids, mb[i]->pad_mask, mb[i]->targets};
        for (int k = 0; k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "mb.%d.%s", i, keys[k]);
            const kiln_st_tensor *t = find(f, name, KILN_I32, B * T);
            if (!t) return false;
            memcpy(dst[k], t->bytes, t->nbytes);
        }
        mb[i]->rows = B;
        mb[i]->index = i;
        mb[i]->n_targets = 0;
        for (int j = 0; j < B * T; j++) mb[i]->n_targets += mb[i]->targets[j] != KILN_IGNORE_INDEX;
    }
    return true;
}

static void train_config(kiln_train_config *c, kiln_loss_norm norm) {
    kiln_train_config_default(c);
    c->lr = 3e-3;
    c->min_lr = 3e-4;
    c->warmup = 2;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0.1;
    c->clip = 1.0;
    c->accum = ACCUM;
    c->batch = B;
    c->seq_len = T;
    c->loss_norm = norm;
    c->decay_embeddings = false;
}

/* Six steps over 2 epochs of the 7 micro-batches in order: windows of
 * 3, 3, 1 per epoch. res may be NULL. */
static bool train(kiln_llama *m, kiln_loss_norm norm, kiln_batch **mb, kiln_step_result *res) {
    kiln_train_config c;
    train_config(&c, norm);
    kiln_adamw *opt = kiln_adamw_new(m, &c);
    CHECK(opt != NULL, "adamw: %s", kiln_last_error());
    if (!opt) return false;
    bool ok = true;
    int s = 0;
    for (int e = 0; e < EPOCHS && ok; e++) {
        for (int start = 0; start < N_MB && ok; start += ACCUM, s++) {
            int k = N_MB - start < ACCUM ? N_MB - start : ACCUM;
            kiln_step_result r;
            kiln_status st = kiln_train_window(m, opt, &c, mb + start, k, kiln_lr_at(&c, s, STEPS), &r);
            CHECK(st == KILN_OK && !r.skipped, "step %d: status %d, skipped %d: %s", s, st, r.skipped, kiln_last_error());
            ok = st == KILN_OK && !r.skipped;
            if (res) res[s] = r;
        }
    }
    CHECK(!ok || (s == STEPS && opt->t == STEPS), "%d steps taken, optimiser t %lld", s, (long long)opt->t);
    kiln_adamw_free(opt);
    return ok;
}

static void check_steps(const kiln_st_file *f, const kiln_step_result *res, kiln_batch **mb) {
    const kiln_st_tensor *tl = find(f, "step_loss", KILN_F32, STEPS);
    const kiln_st_tensor *tr = find(f, "step_lr", KILN_F32, STEPS);
    const kiln_st_tensor *tn = find(f, "step_grad_norm", KILN_F32, STEPS);
    if (!tl || !tr || !tn) return;
    const float *loss = tl->bytes, *lr = tr->bytes, *norm = tn->bytes;
    double worst[3] = {0, 0, 0};
    int clipped = 0;
    printf("step  loss kiln / torch              lr kiln / torch          grad norm kiln / torch\n");
    for (int s = 0; s < STEPS; s++) {
        int start = (s % 3) * ACCUM, k = N_MB - start < ACCUM ? N_MB - start : ACCUM;
        int64_t tokens = 0;
        for (int i = 0; i < k; i++) tokens += mb[start + i]->n_targets;
        double e[3] = {t_rel(res[s].loss, loss[s]), t_rel(res[s].lr, lr[s]), t_rel(res[s].grad_norm, norm[s])};
        printf("%d     %.7f / %.7f   %.7f / %.7f   %.7f / %.7f%s\n", s, res[s].loss, loss[s], res[s].lr, lr[s],
               res[s].grad_norm, norm[s], norm[s] > 1.0 ? "  clipped" : "");
        CHECK(res[s].tokens == tokens && res[s].micro_batches == k, "step %d: %lld tokens in %d micro-batches, want %lld in %d", s,
              (long long)res[s].tokens, res[s].micro_batches, (long long)tokens, k);
        CHECK(e[0] < TOL, "step %d: loss %.8f vs torch %.8f (rel %.3g)", s, res[s].loss, loss[s], e[0]);
        CHECK(e[1] < TOL, "step %d: lr %.8g vs torch %.8g (rel %.3g)", s, res[s].lr, lr[s], e[1]);
        CHECK(e[2] < TOL, "step %d: grad norm %.8f vs torch %.8f (rel %.3g)", s, res[s].grad_norm, norm[s], e[2]);
        for (int j = 0; j < 3; j++) worst[j] = fmax(worst[j], e[j]);
        clipped += norm[s] > 1.0;
    }
    printf("worst per-step rel error: loss %.3g, lr %.3g, grad norm %.3g\n", worst[0], worst[1], worst[2]);
    /* the fixture exercises both sides of the clip */
    CHECK(clipped > 0 && clipped < STEPS, "%d of %d steps clipped: want some, not all", clipped, STEPS);
}

/* Worst max|a-b|/max|b| over the final weights; *name gets its tensor. */
static double final_err(const kiln_st_file *f, const kiln_llama *m, const char **name) {
    double worst = 0;
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        char key[160];
        snprintf(key, sizeof key, "final.%s", p->name);
        const kiln_st_tensor *t = find(f, key, KILN_F32, kiln_tensor_numel(p));
        if (!t) return INFINITY;
        double e = rel_err(kiln_f32(p), t->bytes, kiln_tensor_numel(p));
        if (e >= worst) {
            worst = e;
            *name = p->name;
        }
    }
    return worst;
}

int main(void) {
    kiln_eager_enable();
    kiln_llama_config cfg;
    CHECK_OK(kiln_llama_config_load(FIX "train_ref.config.json", &cfg));
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(FIX "train_ref.safetensors", &f));
    kiln_batch *mb[N_MB] = {0};
    if (!f || !load_batches(f, mb)) goto done;

    /* token-normalised accumulation: the textbook PyTorch loop */
    kiln_step_result res[STEPS];
    kiln_llama *m = load_model(f, &cfg);
    if (m && train(m, KILN_LOSS_NORM_TOKENS, mb, res)) {
        check_steps(f, res, mb);
        const char *name = "";
        double e = final_err(f, m, &name);
        printf("final weights: worst rel error %.3g (%s) over %d tensors\n", e, name, m->n_params);
        for (int i = 0; i < m->n_params; i++) {
            kiln_tensor *p = m->params[i];
            char key[160];
            snprintf(key, sizeof key, "final.%s", p->name);
            const kiln_st_tensor *t = kiln_st_find(f, key);
            double ei = t ? rel_err(kiln_f32(p), t->bytes, kiln_tensor_numel(p)) : INFINITY;
            CHECK(ei < TOL, "final %s differs from torch by %.3g", p->name, ei);
        }
    }
    kiln_llama_free(m);

    /* --loss-norm=steps weighs micro-batches by 1/(k n_i), not 1/N: on
     * padded data it must land elsewhere */
    m = load_model(f, &cfg);
    if (m && train(m, KILN_LOSS_NORM_STEPS, mb, NULL)) {
        const char *name = "";
        double e = final_err(f, m, &name);
        printf("loss_norm=steps: final weights differ from torch's token-normalised ones by %.3g (%s)\n", e, name);
        CHECK(e > 1e-3, "loss_norm=steps should not reproduce token normalisation: worst rel diff %.3g", e);
    }
    kiln_llama_free(m);

done:
    for (int i = 0; i < N_MB; i++) kiln_batch_free(mb[i]);
    kiln_st_close(f);
    TEST_END();
}
