/* Preference objectives against a PyTorch reference written from the
 * papers and TRL's formulas (tests/reference/make_pref_fixture.py): on 3
 * pairs of a tiny LoRA model, kiln's DPO (sigmoid, IPO, hinge) and SimPO
 * give the reference's mean loss and adapter gradients within 1e-5
 * (relative) and TRL's metrics (rewards/chosen, rewards/rejected,
 * rewards/margins, rewards/accuracies, logps/chosen, logps/rejected)
 * within 1e-5 absolute; eager = compiled; two micro-batches of a window
 * (2 pairs + 1 pair) give the big batch's loss and gradients (the window
 * is divided by its pairs); the reference pass switches the adapters off
 * and no base weight gets a gradient; bad settings are refused by name. */
#include <math.h>
#include <stdlib.h>
#include "kiln/eager.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"
#include "test_runs.h"
#include "cli_run.h"
#include <sys/stat.h>
#include <unistd.h>

#define NP 3
#define NR 6
#define NT 20
static kiln_st_file *F;

static const float *fx(const char *name, int64_t n) {
    const kiln_st_tensor *t = kiln_st_find(F, name);
    CHECK(t && t->dtype == KILN_F32 && t->nbytes == (size_t)n * 4, "fixture tensor %s [%lld]", name, (long long)n);
    return t ? (const float *)t->bytes : NULL;
}

static double mean3(const float *v) { return v ? ((double)v[0] + v[1] + v[2]) / 3.0 : NAN; }

static kiln_llama *model(void) {
    kiln_llama_config cfg;
    kiln_llama *m = NULL;
    CHECK(test_fixture_model("tests/fixtures/pref_ref.config.json", "tests/fixtures/pref_ref.safetensors", &cfg, &m, &F),
          "fixture model");
    kiln_lora_config lc = {.rank = 4, .alpha = 8, .targets = 1u << KILN_LORA_Q | 1u << KILN_LORA_V};
    CHECK_OK(kiln_llama_lora_add(m, &lc, 1));
    for (int i = m->n_base; i < m->n_params; i++) {
        const float *v = fx(m->params[i]->name, kiln_tensor_numel(m->params[i]));
        if (v) memcpy(m->params[i]->data, v, kiln_tensor_nbytes(m->params[i]));
    }
    return m;
}

/* rows [r0, r0 + n) of the fixture's pairs as a batch */
static kiln_batch *batch(int r0, int n) {
    kiln_batch *b = kiln_batch_alloc(n, NT);
    const kiln_st_tensor *ids = kiln_st_find(F, "input_ids"), *mask = kiln_st_find(F, "attention_mask"),
                         *lab = kiln_st_find(F, "labels");
    memcpy(b->input_ids, (const int32_t *)ids->bytes + r0 * NT, (size_t)(n * NT) * 4);
    memcpy(b->pad_mask, (const int32_t *)mask->bytes + r0 * NT, (size_t)(n * NT) * 4);
    memcpy(b->targets, (const int32_t *)lab->bytes + r0 * NT, (size_t)(n * NT) * 4);
    b->rows = n;
    b->n_targets = 0;
    for (int i = 0; i < n * NT; i++) b->n_targets += b->targets[i] != KILN_IGNORE_INDEX;
    return b;
}

static void settings(kiln_train_config *c, int objective, int loss, double beta, double gamma) {
    kiln_train_config_default(c);
    c->objective = objective, c->dpo_loss = loss, c->beta = beta, c->simpo_gamma = gamma;
    c->pack = KILN_PACK_PAIRS, c->lora_rank = 4, c->batch = NR;
}

/* the step's inputs by name for batch b, scale s */
static void inputs(const kiln_batch *b, float s, kiln_tensor **by) {
    int64_t sh[2] = {b->B, b->T}, one = 1;
    memset(by, 0, sizeof(kiln_tensor *) * KILN_IN_N);
    by[KILN_IN_IDS] = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, sh);
    by[KILN_IN_TARGETS] = kiln_tensor_wrap(b->targets, KILN_I32, 2, sh);
    by[KILN_IN_MASK] = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, sh);
    by[KILN_IN_SCALE] = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(by[KILN_IN_SCALE])[0] = s;
}

static void release(kiln_tensor **by) {
    for (int i = 0; i < KILN_IN_N; i++) kiln_tensor_release(by[i]);
}

static double grad_diff(const kiln_llama *m, const char *prefix, double *scale_out) {
    double d = 0, s = 0;
    for (int i = m->n_base; i < m->n_params; i++) {
        char nm[200];
        snprintf(nm, sizeof nm, "%s.grad.%s", prefix, m->params[i]->name);
        const float *want = fx(nm, kiln_tensor_numel(m->params[i]));
        const kiln_tensor *g = m->params[i]->grad;
        CHECK(g != NULL, "%s has a gradient", m->params[i]->name);
        for (int64_t j = 0; want && g && j < kiln_tensor_numel(g); j++) {
            d = fmax(d, fabs((double)kiln_f32(g)[j] - want[j]));
            s = fmax(s, fabs((double)want[j]));
        }
    }
    for (int i = 0; i < m->n_base; i++) CHECK(m->params[i]->grad == NULL, "base weight %s got a gradient", m->params[i]->name);
    *scale_out = s;
    return s > 0 ? d / s : d;
}

typedef struct {
    const char *tag;
    int objective, loss;
    double beta, gamma;
} variant;

static void check_variant(kiln_llama *m, const variant *v) {
    kiln_train_config c;
    settings(&c, v->objective, v->loss, v->beta, v->gamma);
    CHECK_OK(kiln_train_config_validate(&c));
    kiln_objective o;
    CHECK_OK(kiln_objective_from_config(&c, &o));
    kiln_batch *b = batch(0, NR);
    kiln_tensor *by[KILN_IN_N], *report[1 + KILN_OBJ_MAX_METRICS] = {0};
    inputs(b, 1.0f / NP, by);
    kiln_llama_zero_grad(m);
    CHECK_OK(o.trace(&o, m, by, report));
    double rep[1 + KILN_OBJ_MAX_METRICS] = {0};
    for (int i = 0; i <= o.n_metrics && report[i]; i++) rep[i] = kiln_f32(report[i])[0];
    kiln_tensor *scaled = report[0] ? kiln_scale_by(report[0], by[KILN_IN_SCALE]) : NULL;
    CHECK_OK(scaled ? kiln_backward(scaled) : kiln_last_status());
    kiln_tensor_release(scaled);
    for (int i = 0; i <= o.n_metrics; i++) kiln_tensor_release(report[i]);
    char nm[160];
    snprintf(nm, sizeof nm, "%s.loss", v->tag);
    const float *want_loss = fx(nm, 1);
    double loss = rep[0] / NP, gs, gd = grad_diff(m, v->tag, &gs);
    printf("  %-12s loss %.8f (PyTorch %.8f, rel %.1e); adapter gradients rel %.1e of %.2e\n", v->tag, loss,
           want_loss ? want_loss[0] : NAN, want_loss ? t_rel(loss, want_loss[0]) : NAN, gd, gs);
    CHECK(want_loss && t_rel(loss, want_loss[0]) < 1e-5, "%s: loss %.8f vs PyTorch %.8f", v->tag, loss, want_loss ? want_loss[0] : 0);
    CHECK(gd < 1e-5, "%s: adapter gradients rel %.2e", v->tag, gd);
    /* TRL's metrics: means over the pairs */
    for (int j = 0; j < o.n_metrics; j++) {
        snprintf(nm, sizeof nm, "%s.%s", v->tag, o.metric[j]);
        bool scalar = strstr(o.metric[j], "accuracies") != NULL;
        double want, got = rep[1 + j] / NP;
        const float *w = NULL;
        if (!kiln_st_find(F, nm) && strstr(nm, "margins")) { /* simpo's: chosen - rejected */
            char a[160], r[160];
            snprintf(a, sizeof a, "%s.rewards/chosen", v->tag);
            snprintf(r, sizeof r, "%s.rewards/rejected", v->tag);
            const float *wc = fx(a, NP), *wr = fx(r, NP);
            w = wc && wr ? wc : NULL;
            want = w ? mean3(wc) - mean3(wr) : NAN;
        } else {
            w = fx(nm, scalar ? 1 : NP);
            want = w ? (scalar ? w[0] : mean3(w)) : NAN;
        }
        CHECK(w && fabs(got - want) < 1e-5 * fmax(1.0, fabs(want)), "%s: %s %.7f vs PyTorch %.7f", v->tag, o.metric[j], got, want);
    }
    printf("               %s %.5f, %s %.5f, %s %.3f\n", o.metric[0], rep[1] / NP, o.metric[1], rep[2] / NP, o.metric[2], rep[3] / NP);

    /* compiled: the same numbers */
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    co.verify_graph = true;
    kiln_step_trace st = {.m = m, .o = &o};
    kiln_llama_zero_grad(m);
    kiln_compiled *cs = kiln_train_compile_objective(&st, &co, true);
    CHECK(cs != NULL, "%s: compile: %s", v->tag, kiln_last_error());
    if (cs) {
        kiln_tensor *in[KILN_IN_N];
        for (int i = 0; i < st.n_in; i++) in[i] = by[st.names[i]];
        float r[1 + KILN_OBJ_MAX_METRICS];
        CHECK_OK(kiln_compiled_run(cs, in, r));
        double gcs, gcd = grad_diff(m, v->tag, &gcs);
        printf("               compiled: loss rel %.1e, gradients rel %.1e\n", t_rel(r[0] / NP, loss), gcd);
        CHECK(t_rel(r[0] / NP, loss) < 1e-6 && gcd < 1e-5, "%s: compiled = eager (loss %.8f vs %.8f, gradients %.2e)", v->tag,
              r[0] / NP, loss, gcd);
        for (int j = 0; j < o.n_metrics; j++)
            CHECK(fabs(r[1 + j] - rep[1 + j]) < 1e-5 * fmax(1.0, fabs(rep[1 + j])), "%s: compiled %s", v->tag, o.metric[j]);
        kiln_compiled_free(cs);
    }
    release(by);
    kiln_batch_free(b);
}

/* a window of two micro-batches (pairs {0, 1} and {2}) through the trainer's
 * step: divided by the window's 3 pairs, the big batch's loss; the summed
 * micro-batch gradients are the big batch's */
static void accumulation(kiln_llama *m) {
    kiln_train_config c;
    settings(&c, KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5);
    c.lr = 1e-30, c.weight_decay = 0, c.clip = 0; /* the step changes nothing that matters */
    kiln_objective o;
    CHECK_OK(kiln_objective_from_config(&c, &o));
    kiln_batch *mb[2] = {batch(0, 4), batch(4, 2)};
    kiln_adamw *opt = kiln_adamw_new(m, &c);
    kiln_step_result res;
    CHECK_OK(kiln_train_window(m, opt, &c, mb, 2, 0.0, &res));
    const float *want = fx("dpo_sigmoid_accum.loss", 1);
    printf("  window of 2 + 1 pairs: loss %.8f (PyTorch %.8f), %lld pairs, rewards/accuracies %.3f\n", res.loss,
           want ? want[0] : NAN, (long long)res.units, res.metric[2]);
    CHECK(want && t_rel(res.loss, want[0]) < 1e-5 && res.units == 3, "accumulated window = big batch: %.8f vs %.8f (%lld pairs)",
          res.loss, want ? want[0] : 0, (long long)res.units);
    CHECK(res.n_metrics == 6 && !strcmp(res.metric_name[2], "rewards/accuracies") && fabs(res.metric[2] - 1.0 / 3) < 1e-6,
          "the window's metrics: rewards/accuracies %.4f", res.metric[2]);
    /* the gradients, micro-batch by micro-batch, each scaled by 1/3 */
    kiln_llama_zero_grad(m);
    for (int k = 0; k < 2; k++) {
        kiln_tensor *by[KILN_IN_N], *report[1 + KILN_OBJ_MAX_METRICS] = {0};
        inputs(mb[k], 1.0f / NP, by);
        CHECK_OK(o.trace(&o, m, by, report));
        kiln_tensor *s = report[0] ? kiln_scale_by(report[0], by[KILN_IN_SCALE]) : NULL;
        CHECK_OK(s ? kiln_backward(s) : kiln_last_status());
        kiln_tensor_release(s);
        for (int i = 0; i <= o.n_metrics; i++) kiln_tensor_release(report[i]);
        release(by);
    }
    double gs, gd = grad_diff(m, "dpo_sigmoid_accum", &gs);
    CHECK(gd < 1e-5, "accumulated gradients = PyTorch's (rel %.2e)", gd);
    kiln_adamw_free(opt);
    kiln_batch_free(mb[0]);
    kiln_batch_free(mb[1]);
}

static void refusals(void) {
    kiln_train_config c;
    settings(&c, KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5);
    c.pack = KILN_PACK_PACKED;
    CHECK(kiln_train_config_validate(&c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--pack pairs"),
          "dpo without pairs refused: %s", kiln_last_error());
    settings(&c, KILN_OBJECTIVE_CE, 0, 0.1, 0.5);
    CHECK(kiln_train_config_validate(&c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--objective dpo"),
          "pairs without a preference objective refused: %s", kiln_last_error());
    settings(&c, KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5);
    c.lora_rank = 0;
    CHECK(kiln_train_config_validate(&c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--lora-rank"),
          "dpo without adapters refused (its reference): %s", kiln_last_error());
    settings(&c, KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5);
    c.batch = 5;
    CHECK(kiln_train_config_validate(&c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "even"),
          "an odd batch refused: %s", kiln_last_error());
    const char *bad[] = {"0", "-1", "nan"};
    for (int i = 0; i < 3; i++) {
        kiln_train_config_default(&c);
        CHECK(kiln_setting_parse(kiln_setting_find("beta"), bad[i], &c) != KILN_OK && strstr(kiln_last_error(), "> 0"),
              "--beta %s refused: %s", bad[i], kiln_last_error());
    }
}

/* a DPO run resumed mid-way is byte-identical to the uninterrupted one,
 * eager and compiled (pairs tokenized by kiln tokenize from made-up lines) */
static char tmp[256];
static bool dpo_run(const char *name, int compile, int64_t stop_at, bool resume) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    snprintf(c.data, sizeof c.data, "%s/data", tmp);
    snprintf(c.run_dir, sizeof c.run_dir, "%s/%s", tmp, name);
    snprintf(c.model, sizeof c.model, "%s/m.json", tmp);
    c.objective = KILN_OBJECTIVE_DPO, c.pack = KILN_PACK_PAIRS, c.lora_rank = 4, c.lora_alpha = 8;
    snprintf(c.lora_targets, sizeof c.lora_targets, "all");
    c.batch = 4, c.accum = 2, c.seq_len = 24, c.steps = 6, c.warmup = 1, c.lr = 1e-2, c.min_lr = 1e-3;
    c.eval_every = 3, c.eval_batches = 1, c.save_every = 3, c.log_every = 0, c.compile = compile;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, resume, &t));
    if (!t) return false;
    test_watch w = {t, stop_at, 0, 0, 0};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    return true;
}

static void resume(void) {
    snprintf(tmp, sizeof tmp, "/tmp/kiln_test_dpo_XXXXXX");
    if (!cli_init(tmp) || !mkdtemp(tmp)) return;
    char jl[400], tok[400], data[400], cfg[400];
    snprintf(jl, sizeof jl, "%s/prefs.jsonl", tmp);
    snprintf(tok, sizeof tok, "%s/tok.json", tmp);
    snprintf(data, sizeof data, "%s/data", tmp);
    snprintf(cfg, sizeof cfg, "%s/m.json", tmp);
    FILE *f = fopen(jl, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"prompt\": \"Q%d: which?\", \"chosen\": \" yes, the answer %d\", \"rejected\": \" no no no\"}\n", i, i * 7);
    fclose(f);
    CHECK(cli_exec((const char *[]){cli_kiln, "tokenizer", "train", jl, "--vocab-size", "300", "-o", tok, NULL}) == 0, "tokenizer");
    CHECK(cli_exec((const char *[]){cli_kiln, "tokenize", jl, "--tokenizer", tok, "-o", data, "--val-frac", "0.1", NULL}) == 0,
          "tokenize pairs");
    kiln_llama_config mc = test_tiny_config();
    mc.vocab_size = 300;
    CHECK_OK(kiln_llama_config_save(cfg, &mc));
    for (int compile = 0; compile < 2; compile++) {
        int mode = compile ? KILN_RUN_COMPILE_DEFAULT : KILN_RUN_EAGER;
        const char *a = compile ? "straight_c" : "straight", *b = compile ? "resumed_c" : "resumed";
        if (!dpo_run(a, mode, -1, false) || !dpo_run(b, mode, 3, false) || !dpo_run(b, mode, -1, true)) return;
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/%s/adapter_model.safetensors", tmp, a);
        snprintf(pb, sizeof pb, "%s/%s/adapter_model.safetensors", tmp, b);
        CHECK(test_same_file(pa, pb), "DPO %s: resumed at step 3 = uninterrupted, byte for byte", compile ? "compiled" : "eager");
        snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", tmp, a);
        char *text = NULL;
        size_t n = 0;
        CHECK_OK(kiln_read_file(pa, &text, &n));
        CHECK(text && strstr(text, "\"rewards/accuracies\"") && strstr(text, "\"val_rewards/margins\""),
              "metrics.jsonl holds TRL's metrics");
        free(text);
    }
    printf("  DPO runs resumed at step 3 are byte-identical to uninterrupted ones (eager and compiled)\n");
    CHECK(t_rmtree(tmp) == 0, "cleanup");
}

int main(void) {
    kiln_eager_enable();
    kiln_llama *m = model();
    static const variant vs[] = {
        {"dpo_sigmoid", KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5},
        {"dpo_ipo", KILN_OBJECTIVE_DPO, KILN_DPO_IPO, 0.1, 0.5},
        {"dpo_hinge", KILN_OBJECTIVE_DPO, KILN_DPO_HINGE, 0.1, 0.5},
        {"simpo", KILN_OBJECTIVE_SIMPO, 0, 2.0, 1.0},
    };
    for (size_t i = 0; m && i < sizeof vs / sizeof *vs; i++) check_variant(m, &vs[i]);
    if (m) accumulation(m);
    refusals();
    resume();
    kiln_llama_free(m);
    kiln_st_close(F);
    TEST_END();
}
