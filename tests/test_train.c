/* The trainer's exactness: accumulation equals a big batch (packed and
 * padded), --loss-norm steps does not on padded data, a non-finite loss
 * never updates the weights, the schedule, and resume is bit-identical. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"
#include "test_runs.h"

/* row r of a batch: random ids, `pads` padding positions at the end */
static void fill_row(kiln_batch *b, int r, int pads, uint64_t seed) {
    int T = b->T;
    for (int t = 0; t < T; t++) b->input_ids[r * T + t] = 3 + (int32_t)(kiln_rng_u64(seed, (uint64_t)t) % 58);
    for (int t = 0; t < T; t++) {
        bool real = t < T - pads;
        b->pad_mask[r * T + t] = real;
        if (!real) b->input_ids[r * T + t] = 2;
        bool next_real = t + 1 < T - pads;
        b->targets[r * T + t] = next_real ? b->input_ids[r * T + t + 1] : KILN_IGNORE_INDEX;
    }
}

/* k micro-batches of b rows vs one batch of k*b rows, 3 optimiser steps.
 * The first step's gradients (read back as AdamW's first moment, (1 -
 * beta1) g) and every step's gradient norm must agree to 1e-5 (they agree
 * to ~1e-6). The weights after 3 steps are a looser check: Adam divides by
 * sqrt(v), which turns float rounding in near-zero gradients into weight
 * differences of ~1e-5 (1e-3 of one step of lr 1e-2); max |dw| / max |w|
 * measured 3e-5..8e-5 packed and 7e-5..1.2e-4 padded, by kernel form and
 * CPU (1.2e-4: the avx512 form on a Xeon with AMX), so 1e-4 packed, 3e-4
 * padded. */
static double accum_vs_big(bool padded, kiln_loss_norm norm, double *norm_diff, double *grad_diff) {
    const int k = 4, b = 2, T = 24;
    kiln_llama_config mc = test_tiny_config();
    kiln_llama *A = kiln_llama_new(&mc, 5), *Bm = kiln_llama_new(&mc, 5);
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.loss_norm = norm;
    c.clip = 0.5; /* clipping on: the norm must match too */
    kiln_adamw *oa = kiln_adamw_new(A, &c), *ob = kiln_adamw_new(Bm, &c);
    kiln_batch *mb[4], *big = kiln_batch_alloc(k * b, T);
    *norm_diff = *grad_diff = 0;
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < k; i++) {
            mb[i] = kiln_batch_alloc(b, T);
            for (int r = 0; r < b; r++) {
                int pads = padded ? (i * 5 + r * 3 + step) % 13 : 0;
                uint64_t seed = 1000 * step + 10 * i + r;
                fill_row(mb[i], r, pads, seed);
                fill_row(big, i * b + r, pads, seed);
            }
            test_count_targets(mb[i]);
        }
        test_count_targets(big);
        kiln_step_result ra, rb;
        CHECK_OK(kiln_train_window(A, oa, &c, mb, k, 1e-2, &ra));
        CHECK_OK(kiln_train_window(Bm, ob, &c, &big, 1, 1e-2, &rb));
        CHECK(ra.tokens == rb.tokens, "same target count");
        *norm_diff = fmax(*norm_diff, t_rel(ra.grad_norm, rb.grad_norm));
        if (step == 0) /* the first moment is then (1 - beta1) x the clipped gradients */
            *grad_diff = test_tensors_diff(oa->m, ob->m, oa->n);
        if (norm == KILN_LOSS_NORM_TOKENS)
            CHECK(t_rel(ra.loss, rb.loss) < 1e-5, "window loss %.7f vs big batch %.7f", ra.loss, rb.loss);
        for (int i = 0; i < k; i++) kiln_batch_free(mb[i]);
    }
    double d = test_weights_diff(A, Bm);
    kiln_batch_free(big);
    kiln_adamw_free(oa);
    kiln_adamw_free(ob);
    kiln_llama_free(A);
    kiln_llama_free(Bm);
    return d;
}

static void accumulation(void) {
    double nd, gd, d = accum_vs_big(false, KILN_LOSS_NORM_TOKENS, &nd, &gd);
    printf("packed, token norm: first step's gradients max rel diff %.2e, weights %.2e, grad-norm %.2e\n", gd, d, nd);
    CHECK(gd < 1e-5 && d < 1e-4 && nd < 1e-5, "packed accumulation equals the big batch: %.3g %.3g %.3g", gd, d, nd);
    d = accum_vs_big(true, KILN_LOSS_NORM_TOKENS, &nd, &gd);
    printf("padded, token norm: first step's gradients max rel diff %.2e, weights %.2e, grad-norm %.2e\n", gd, d, nd);
    CHECK(gd < 1e-5 && d < 3e-4 && nd < 1e-5, "padded accumulation equals the big batch: %.3g %.3g %.3g", gd, d, nd);
    d = accum_vs_big(false, KILN_LOSS_NORM_STEPS, &nd, &gd);
    printf("packed, steps norm: weights max rel diff %.2e (equal counts: must match)\n", d);
    CHECK(d < 1e-4, "steps norm matches when every micro-batch has the same count: %.3g", d);
    d = accum_vs_big(true, KILN_LOSS_NORM_STEPS, &nd, &gd);
    printf("padded, steps norm: grad-norm rel diff %.2e, weights %.2e (must NOT match)\n", nd, d);
    CHECK(nd > 1e-3, "steps norm on padded data differs from the big batch: %.3g", nd);
}

static bool all_zero(const kiln_tensor *t) {
    for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
        if (kiln_f32(t)[i] != 0.0f) return false;
    return true;
}

static void nan_skip(void) {
    kiln_llama_config mc = test_tiny_config();
    kiln_llama *m = kiln_llama_new(&mc, 9);
    kiln_train_config c;
    kiln_train_config_default(&c);
    kiln_adamw *o = kiln_adamw_new(m, &c);
    kiln_batch *mb[2] = {kiln_batch_alloc(2, 16), kiln_batch_alloc(2, 16)};
    for (int i = 0; i < 2; i++) {
        fill_row(mb[i], 0, 0, 1 + i);
        fill_row(mb[i], 1, 2, 3 + i);
        test_count_targets(mb[i]);
    }
    kiln_f32(m->lm_head)[5 * 48 + 1] = INFINITY; /* logits of token 5 become inf */
    size_t nb = kiln_tensor_nbytes(m->layers[0].q_proj);
    float *before = malloc(nb);
    memcpy(before, m->layers[0].q_proj->data, nb);
    kiln_step_result r;
    CHECK_OK(kiln_train_window(m, o, &c, mb, 2, 1e-2, &r));
    CHECK(r.skipped && r.bad_micro == 0, "non-finite loss skips the step (skipped %d, micro %d)", r.skipped, r.bad_micro);
    CHECK(memcmp(before, m->layers[0].q_proj->data, nb) == 0, "weights are not updated");
    CHECK(o->t == 0, "optimiser did not step");
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad)
            CHECK(all_zero(o->params[i]->grad), "gradients of %s were zeroed", o->params[i]->name);
    free(before);
    kiln_batch_free(mb[0]);
    kiln_batch_free(mb[1]);
    kiln_adamw_free(o);
    kiln_llama_free(m);
}

static void schedule(void) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.lr = 1e-3, c.min_lr = 1e-4, c.warmup = 10;
    CHECK(t_rel(kiln_lr_at(&c, 0, 100), 1e-4) < 1e-12, "warm-up starts at lr/warmup");
    CHECK(t_rel(kiln_lr_at(&c, 9, 100), 1e-3) < 1e-12, "warm-up ends at lr");
    CHECK(t_rel(kiln_lr_at(&c, 10, 100), 1e-3) < 1e-12, "cosine starts at lr");
    CHECK(t_rel(kiln_lr_at(&c, 55, 100), 5.5e-4) < 1e-12, "cosine midpoint");
    CHECK(t_rel(kiln_lr_at(&c, 100, 100), 1e-4) < 1e-12, "ends at min_lr");
}

/* ---- the trainer on files: resume is bit-identical -------------------------- */
static char tmpdir[256];

static void write_shards(void) { test_write_shards(tmpdir, 6000, 1500, 11); }

static void base_config(kiln_train_config *c, const char *run) {
    test_tiny_run(c, tmpdir, run);
    c->accum = 3, c->epochs = 2, c->eval_every = 4;
    c->lr = 3e-3, c->min_lr = 3e-4;
}

static void shard(const char *dir, const char *name, uint32_t vocab, size_t n) {
    kiln_shard_info info = {.vocab_size = vocab, .eos_id = 1, .pad_id = 2, .bos_id = 0xffffffffu, .n_docs = 1};
    int32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = 3 + (int32_t)(kiln_rng_u64(5, i) % (vocab - 3));
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    CHECK_OK(kiln_shard_write(p, tok, n, &info));
    free(tok);
}

/* Every input file is checked when the run opens, naming the file (val.bin
 * was first read at the first evaluation, and a directory there turned
 * evaluation off). */
static void inputs(void) {
    char d[400];
    kiln_train_config c;
    kiln_trainer *t = NULL;
    snprintf(d, sizeof d, "%s/bigval", tmpdir);
    mkdir(d, 0755);
    shard(d, "train.bin", 61, 3000);
    shard(d, "val.bin", 90, 1000); /* ids the 61-token model cannot embed */
    base_config(&c, "bigval_run");
    snprintf(c.data, sizeof c.data, "%s", d);
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_INVALID && !t && strstr(kiln_last_error(), "bigval/val.bin") &&
              strstr(kiln_last_error(), "vocabulary 90"),
          "val.bin's vocabulary checked at open: %s", kiln_last_error());
    snprintf(d, sizeof d, "%s/valdir", tmpdir);
    mkdir(d, 0755);
    shard(d, "train.bin", 61, 3000);
    char v[500];
    snprintf(v, sizeof v, "%s/val.bin", d);
    mkdir(v, 0755);
    base_config(&c, "valdir_run");
    snprintf(c.data, sizeof c.data, "%s", d);
    CHECK(kiln_trainer_open(&c, false, &t) != KILN_OK && !t && strstr(kiln_last_error(), "valdir/val.bin") &&
              strstr(kiln_last_error(), "directory"),
          "a directory as val.bin is refused: %s", kiln_last_error());
    /* no val.bin but evaluation asked for: refused at open, naming the way out */
    snprintf(d, sizeof d, "%s/noval", tmpdir);
    mkdir(d, 0755);
    shard(d, "train.bin", 61, 3000);
    base_config(&c, "noval_run");
    snprintf(c.data, sizeof c.data, "%s", d);
    c.eval_every = 5;
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_INVALID && !t && strstr(kiln_last_error(), "noval/val.bin") &&
              strstr(kiln_last_error(), "--eval-every 0"),
          "a missing val.bin with eval_every > 0 is refused: %s", kiln_last_error());
    c.eval_every = 0;
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_OK && t, "without evaluation no val.bin is needed: %s",
          t ? "" : kiln_last_error());
    kiln_trainer_free(t);
    t = NULL;
    shard(d, "val.bin", 61, 5); /* fewer tokens than one evaluation row */
    base_config(&c, "shortval_run");
    snprintf(c.data, sizeof c.data, "%s", d);
    c.eval_every = 5;
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_INVALID && !t && strstr(kiln_last_error(), "noval/val.bin") &&
              strstr(kiln_last_error(), "5 tokens"),
          "a val.bin too short for one evaluation is refused: %s", kiln_last_error());
    base_config(&c, "notok_run");
    snprintf(c.tokenizer, sizeof c.tokenizer, "%s/no_such_tokenizer.json", tmpdir);
    CHECK(kiln_trainer_open(&c, false, &t) != KILN_OK && !t && strstr(kiln_last_error(), "no_such_tokenizer.json"),
          "a missing tokenizer is refused at open: %s", kiln_last_error());
    snprintf(v, sizeof v, "%s/notok_run/metrics.jsonl", tmpdir);
    CHECK(access(v, F_OK) != 0, "nothing written before the checks");
}

/* a run of base_config that stops after step 3 (eager), the word given
 * then written to its compile-choice, and resumed under --compile
 * max-autotune: the status of the resumed run */
static kiln_status resume_with_choice(const char *run, const char *text) {
    kiln_train_config c;
    kiln_trainer *t = NULL;
    base_config(&c, run);
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return KILN_ERR_INVALID;
    test_watch w = {.t = t, .stop_at = 3};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    char p[600];
    snprintf(p, sizeof p, "%s/%s/compile-choice", tmpdir, run);
    CHECK_OK(kiln_write_file_atomic(p, text, strlen(text)));
    c.compile = KILN_RUN_MAX_AUTOTUNE;
    if (kiln_trainer_open(&c, true, &t)) return kiln_last_status();
    w = (test_watch){.t = t, .stop_at = -1};
    kiln_status st = kiln_trainer_run(t, test_watch_event, &w);
    kiln_trainer_free(t);
    return st;
}

/* --compile max-autotune times the step compiled and eager before the first
 * step, trains the faster, keeps the choice in RUN/compile-choice, and a
 * resumed run takes it from there. */
static void step_choice(void) {
    kiln_train_config c;
    kiln_trainer *t = NULL;
    base_config(&c, "autotuned");
    c.compile = KILN_RUN_MAX_AUTOTUNE;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    test_watch w = {.t = t, .stop_at = -1};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    int64_t total = kiln_trainer_get_state(t)->total_steps;
    kiln_trainer_free(t);
    CHECK(w.steps == total, "the autotuned run took its %lld steps (%d)", (long long)total, w.steps);
    char p[600], q[600], word[16] = "";
    snprintf(p, sizeof p, "%s/autotuned/compile-choice", tmpdir);
    char *text = NULL;
    size_t n = 0;
    double cms = 0, ems = 0;
    CHECK_OK(kiln_read_file(p, &text, &n));
    CHECK(text && sscanf(text, "%15s compiled_ms %lf eager_ms %lf", word, &cms, &ems) == 3 && cms > 0 && ems > 0 &&
              (!strcmp(word, "eager") ? ems < cms : !strcmp(word, "compiled") && cms <= ems),
          "compile-choice names the faster step and both times: %s", text ? text : "(none)");
    free(text);
    /* the timing runs leave nothing behind: chosen eager, the run is the
     * eager run's bits; chosen compiled, its loss is the eager run's to
     * the compiled step's rounding */
    snprintf(p, sizeof p, "%s/straight/model.safetensors", tmpdir);
    snprintf(q, sizeof q, "%s/autotuned/model.safetensors", tmpdir);
    if (!strcmp(word, "eager")) {
        CHECK(test_same_file(p, q), "chosen eager: the model is byte-identical to the eager run's");
    } else {
        kiln_trainer *a = NULL;
        base_config(&c, "autotuned");
        CHECK_OK(kiln_trainer_open(&c, true, &a)); /* the finished run: its state */
        base_config(&c, "straight");
        kiln_trainer *b = NULL;
        CHECK_OK(kiln_trainer_open(&c, true, &b));
        if (a && b) {
            double la = kiln_trainer_get_state(a)->last_loss, lb = kiln_trainer_get_state(b)->last_loss;
            CHECK(isfinite(la) && fabs(la - lb) <= 1e-3 * fabs(lb), "chosen compiled: last loss %.7f, eager's %.7f", la, lb);
        }
        kiln_trainer_free(a);
        kiln_trainer_free(b);
    }
    /* resumed, the file decides, unchanged: eager gives the eager run's bits */
    const char *eager_word = "eager\tcompiled_ms 1.0\teager_ms 2.0\n";
    CHECK_OK(resume_with_choice("chosen_eager", eager_word));
    snprintf(q, sizeof q, "%s/chosen_eager/model.safetensors", tmpdir);
    CHECK(test_same_file(p, q), "resumed with 'eager' in compile-choice: byte-identical to the uninterrupted eager run");
    snprintf(q, sizeof q, "%s/chosen_eager/compile-choice", tmpdir);
    CHECK(!kiln_read_file(q, &text, &n) && n == strlen(eager_word) && !memcmp(text, eager_word, n),
          "a resumed run does not measure again (compile-choice unchanged)");
    free(text);
    const char *compiled_word = "compiled\tcompiled_ms 1.0\teager_ms 2.0\n";
    CHECK_OK(resume_with_choice("chosen_compiled", compiled_word));
    snprintf(q, sizeof q, "%s/chosen_compiled/compile-choice", tmpdir);
    CHECK(!kiln_read_file(q, &text, &n) && n == strlen(compiled_word) && !memcmp(text, compiled_word, n),
          "resumed with 'compiled': compile-choice unchanged");
    free(text);
    CHECK(resume_with_choice("chosen_bad", "fastest\n") == KILN_ERR_FORMAT && strstr(kiln_last_error(), "chosen_bad/compile-choice") &&
              strstr(kiln_last_error(), "'compiled' or 'eager'"),
          "a compile-choice with another word is refused, naming it: %s", kiln_last_error());
    CHECK(resume_with_choice("chosen_longer", "eagerly\n") == KILN_ERR_FORMAT && strstr(kiln_last_error(), "chosen_longer/compile-choice"),
          "the word must be whole ('eagerly' is not 'eager'): %s", kiln_last_error());
}

static void resume(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_train_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    write_shards();
    kiln_train_config c;
    base_config(&c, "straight");
    kiln_trainer *t;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    int64_t total = kiln_trainer_get_state(t)->total_steps;
    CHECK(total >= 6, "enough steps to interrupt (%lld)", (long long)total);
    test_watch w = {.t = t, .stop_at = -1};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    CHECK(w.steps == total && w.evals >= 1 && w.saves == 1, "steps %d evals %d saves %d", w.steps, w.evals, w.saves);
    kiln_trainer_free(t);

    base_config(&c, "interrupted");
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    w = (test_watch){.t = t, .stop_at = 3};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    CHECK(w.steps == 3 && kiln_trainer_get_state(t)->step == 3, "stopped after step 3 (%d)", w.steps);
    kiln_trainer_free(t);
    CHECK_OK(kiln_trainer_open(&c, true, &t));
    if (!t) return;
    CHECK(kiln_trainer_get_state(t)->step == 3, "resumed at step 3");
    w = (test_watch){.t = t, .stop_at = -1};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    CHECK(w.steps == total - 3, "resumed run finished the remaining %lld steps (%d)", (long long)total - 3, w.steps);
    kiln_trainer_free(t);

    char a[600], b[600];
    snprintf(a, sizeof a, "%s/straight/model.safetensors", tmpdir);
    snprintf(b, sizeof b, "%s/interrupted/model.safetensors", tmpdir);
    CHECK(test_same_file(a, b), "resumed model.safetensors is byte-identical to the uninterrupted run");
    snprintf(a, sizeof a, "%s/straight/metrics.jsonl", tmpdir);
    snprintf(b, sizeof b, "%s/interrupted/metrics.jsonl", tmpdir);
    char *x, *y;
    size_t nx, ny;
    if (!kiln_read_file(a, &x, &nx) && !kiln_read_file(b, &y, &ny)) {
        /* losses are identical line by line (timings differ) */
        int lines_x = 0, lines_y = 0;
        for (size_t i = 0; i < nx; i++) lines_x += x[i] == '\n';
        for (size_t i = 0; i < ny; i++) lines_y += y[i] == '\n';
        CHECK(lines_x == lines_y, "metrics.jsonl has the same number of lines (%d vs %d)", lines_x, lines_y);
        free(x);
        free(y);
    }
    /* a bad setting is refused with its name */
    base_config(&c, "bad");
    c.accum = 0;
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_INVALID && strstr(kiln_last_error(), "accum"), "bad accum: %s",
          kiln_last_error());
    base_config(&c, "bad");
    snprintf(c.data, sizeof c.data, "%s/nope", tmpdir);
    CHECK(kiln_trainer_open(&c, false, &t) != KILN_OK && strstr(kiln_last_error(), "nope"), "missing data dir: %s",
          kiln_last_error());
    base_config(&c, "bad");
    snprintf(c.freeze, sizeof c.freeze, "no.such.*");
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_INVALID && strstr(kiln_last_error(), "freeze"), "bad freeze: %s",
          kiln_last_error());
    inputs();
    step_choice();
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
}

int main(void) {
    kiln_eager_enable();
    schedule();
    accumulation();
    nan_skip();
    resume();
    TEST_END();
}
