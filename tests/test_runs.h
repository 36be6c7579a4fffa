/* The tiny trainer runs on files that test_train and the LoRA tests share:
 * two shards of random ids, the run configuration around the `tiny` model,
 * an event callback that stops a run at a step and counts what happened,
 * and byte-equal files (resumed runs must match uninterrupted ones). */
#ifndef KILN_TEST_RUNS_H
#define KILN_TEST_RUNS_H
#include <stdlib.h>
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"

/* DIR/train.bin (n_train ids, from seed) and DIR/val.bin (n_val, from
 * seed + 1): ids 3..60 with an eos (1) as every 97th token; vocabulary 61,
 * pad 2, no bos */
static inline void test_write_shards(const char *dir, size_t n_train, size_t n_val, uint64_t seed) {
    kiln_shard_info info = {.vocab_size = 61, .eos_id = 1, .pad_id = 2, .bos_id = 0xffffffffu};
    for (int which = 0; which < 2; which++) {
        size_t n = which ? n_val : n_train;
        int32_t *tok = malloc(n * sizeof *tok);
        for (size_t i = 0; i < n; i++) tok[i] = (i % 97 == 96) ? 1 : 3 + (int32_t)(kiln_rng_u64(seed + which, i) % 58);
        char p[512];
        snprintf(p, sizeof p, "%s/%s.bin", dir, which ? "val" : "train");
        info.n_docs = n / 97 + 1;
        CHECK_OK(kiln_shard_write(p, tok, n, &info));
        free(tok);
    }
}

/* what every tiny run has: DIR's shards, DIR/RUN, the tiny model, padded
 * rows of 2 x 32, 2 warm-up steps, evaluations of 2 batches, no saves or
 * log lines on the way (the run saves at its end) */
static inline void test_tiny_run(kiln_train_config *c, const char *dir, const char *run) {
    kiln_train_config_default(c);
    snprintf(c->data, sizeof c->data, "%s", dir);
    snprintf(c->run_dir, sizeof c->run_dir, "%s/%s", dir, run);
    snprintf(c->model, sizeof c->model, "tiny");
    c->batch = 2, c->seq_len = 32, c->pack = KILN_PACK_PADDED;
    c->warmup = 2, c->eval_batches = 2, c->save_every = 0, c->log_every = 0;
}

/* the LoRA tests' runs: 6 steps of 2 micro-batches at lr 1e-2 down to
 * 1e-3, no evaluation, rank 4 and alpha 16 adapters on `targets` */
static inline void test_tiny_lora_run(kiln_train_config *c, const char *dir, const char *run, const char *targets) {
    test_tiny_run(c, dir, run);
    c->accum = 2, c->steps = 6, c->eval_every = 0;
    c->lr = 1e-2, c->min_lr = 1e-3;
    c->lora_rank = 4, c->lora_alpha = 16;
    snprintf(c->lora_targets, sizeof c->lora_targets, "%s", targets);
}

/* kiln_trainer_run's callback: stops the run after step stop_at (-1: never)
 * and counts steps, evaluations and saves */
typedef struct {
    kiln_trainer *t;
    int64_t stop_at;
    int steps, evals, saves;
} test_watch;

static inline void test_watch_event(const kiln_event *e, void *user) {
    test_watch *w = user;
    if (e->kind == KILN_EVENT_STEP) {
        w->steps++;
        if (e->state->step == w->stop_at) kiln_trainer_request_stop(w->t);
    }
    w->evals += e->kind == KILN_EVENT_EVAL;
    w->saves += e->kind == KILN_EVENT_SAVE;
}

/* A run of c (resumed or new) until step stop_at (-1: its end), its
 * frozen base checked to be held as `base` */
static inline bool test_run_held(const kiln_train_config *c, int64_t stop_at, bool resume, kiln_dtype base) {
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(c, resume, &t));
    if (!t) return false;
    kiln_llama *m = kiln_trainer_model(t);
    CHECK(m->layers[0].q_proj->dtype == base, "the trainer holds the base in %s (%s)", kiln_dtype_name(base),
          resume ? "resumed" : "new");
    test_watch w = {t, stop_at, 0, 0, 0};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    return true;
}

/* both files read and byte for byte the same */
static inline bool test_same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool same = !kiln_read_file(a, &x, &nx) && !kiln_read_file(b, &y, &ny) && nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* The largest relative difference (rel_err: max |a-b| / max |b| per tensor)
 * of two safetensors files of f32 tensors with the same names and sizes;
 * INFINITY when they do not match up. */
static inline double test_st_rel_diff(const char *pa, const char *pb) {
    kiln_st_file *x = NULL, *y = NULL;
    CHECK_OK(kiln_st_open(pa, &x));
    CHECK_OK(kiln_st_open(pb, &y));
    double worst = x && y && kiln_st_count(x) == kiln_st_count(y) && kiln_st_count(x) > 0 ? 0 : INFINITY;
    for (int i = 0; worst < INFINITY && i < kiln_st_count(x); i++) {
        const kiln_st_tensor *tx = kiln_st_at(x, i), *ty = kiln_st_find(y, tx->name);
        if (!ty || ty->nbytes != tx->nbytes || tx->dtype != KILN_F32) {
            worst = INFINITY;
            break;
        }
        worst = fmax(worst, rel_err((const float *)tx->bytes, (const float *)ty->bytes, (int64_t)(tx->nbytes / 4)));
    }
    kiln_st_close(x);
    kiln_st_close(y);
    return worst;
}

#endif
