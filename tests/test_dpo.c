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

/* full fine-tuning: the fixture's base with every weight replaced by the
 * perturbed policy's (the reference stays the base: its stored log-probs) */
static kiln_llama *model_full(void) {
    kiln_llama_config cfg;
    kiln_llama *m = NULL;
    kiln_st_file *f2 = NULL;
    CHECK(test_fixture_model("tests/fixtures/pref_ref.config.json", "tests/fixtures/pref_ref.safetensors", &cfg, &m, &f2),
          "fixture model");
    kiln_st_close(f2);
    for (int i = 0; m && i < m->n_params; i++) {
        char nm[200];
        snprintf(nm, sizeof nm, "full.policy.%s", m->params[i]->name);
        const float *v = fx(nm, kiln_tensor_numel(m->params[i]));
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

/* the step's inputs by name for batch b, each term j scaled by 1 / the
 * units (of its kind) of `of` (the window); the fixture's reference
 * log-probs as ref_logps */
static void inputs(const kiln_objective *o, const kiln_batch *b, const kiln_batch *of, int r0, kiln_tensor **by) {
    int64_t sh[2] = {b->B, b->T}, one = 1, rows = b->B, u[KILN_NORM_N];
    kiln_batch_units(of, u);
    memset(by, 0, sizeof(kiln_tensor *) * KILN_IN_N);
    by[KILN_IN_IDS] = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, sh);
    by[KILN_IN_TARGETS] = kiln_tensor_wrap(b->targets, KILN_I32, 2, sh);
    by[KILN_IN_MASK] = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, sh);
    for (int j = 0; j < o->n_terms; j++) {
        kiln_input k = j ? KILN_IN_SCALE_2 : KILN_IN_SCALE;
        by[k] = kiln_tensor_new(KILN_F32, 1, &one);
        kiln_f32(by[k])[0] = 1.0f / (float)u[o->norm[j]];
    }
    by[KILN_IN_REF_LOGPS] = kiln_tensor_new(KILN_F32, 1, &rows);
    memcpy(kiln_f32(by[KILN_IN_REF_LOGPS]), fx("ref.logps", NR) + r0, sizeof(float) * (size_t)rows);
}

/* one eager forward + backward of o (gradients accumulate): rep gets the
 * terms' and metrics' sums */
static void eager_step(const kiln_objective *o, kiln_llama *m, kiln_tensor **by, double *rep) {
    kiln_tensor *report[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
    int nr = o->n_terms + o->n_metrics;
    CHECK_OK(o->trace(o, m, by, report));
    for (int i = 0; i < nr && report[i]; i++) rep[i] = kiln_f32(report[i])[0];
    kiln_tensor *scaled = report[0] ? kiln_objective_diff(o, report, by) : NULL;
    CHECK_OK(scaled ? kiln_backward(scaled) : kiln_last_status());
    kiln_tensor_release(scaled);
    for (int i = 0; i < nr; i++) kiln_tensor_release(report[i]);
}

/* the loss of a window = sum_j term_j / units_j */
static double window_loss(const kiln_objective *o, const double *rep, const kiln_batch *of) {
    int64_t u[KILN_NORM_N];
    kiln_batch_units(of, u);
    double l = 0;
    for (int j = 0; j < o->n_terms; j++) l += rep[j] / (double)u[o->norm[j]];
    return l;
}

static void release(kiln_tensor **by) {
    for (int i = 0; i < KILN_IN_N; i++) kiln_tensor_release(by[i]);
}

/* the largest gradient difference to the fixture's <prefix>.grad.*, over
 * the adapters (LoRA: the base gets none) or every parameter (full) */
static double grad_diff(const kiln_llama *m, const char *prefix, double *scale_out) {
    double d = 0, s = 0;
    bool lora = m->n_base < m->n_params;
    for (int i = lora ? m->n_base : 0; i < m->n_params; i++) {
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
    for (int i = 0; lora && i < m->n_base; i++) CHECK(m->params[i]->grad == NULL, "base weight %s got a gradient", m->params[i]->name);
    *scale_out = s;
    return s > 0 ? d / s : d;
}

typedef struct {
    const char *tag;
    int objective, loss;
    double beta, gamma;
    int dpo_ref; /* KILN_DPO_REF_*: file reads the fixture's reference log-probs */
} variant;

/* the fixture's value of metric `name` of variant `tag`: a mean over the
 * pairs, the scalar itself, or chosen - rejected (margins not stored) */
static bool fixture_metric(const char *tag, const char *name, double *want) {
    char nm[160];
    snprintf(nm, sizeof nm, "%s.%s", tag, name);
    bool scalar = strstr(name, "accuracies") || !strcmp(name, "nll_loss");
    if (!strcmp(name, "nll_loss")) snprintf(nm, sizeof nm, "%s.nll", tag);
    if (!kiln_st_find(F, nm) && !strcmp(name, "rewards/margins")) {
        char a[160], r[160];
        snprintf(a, sizeof a, "%s.rewards/chosen", tag);
        snprintf(r, sizeof r, "%s.rewards/rejected", tag);
        const float *wc = fx(a, NP), *wr = fx(r, NP);
        *want = wc && wr ? mean3(wc) - mean3(wr) : NAN;
        return wc && wr;
    }
    if (!kiln_st_find(F, nm) && (!strcmp(name, "log_odds_ratio") || !strcmp(name, "log_odds_chosen"))) {
        snprintf(nm, sizeof nm, "%s.log_odds", tag); /* mean log odds, and the mean of logsigmoid(log odds) */
        const float *lo = fx(nm, NP);
        if (!lo) return false;
        double m = 0;
        for (int i = 0; i < NP; i++) m += strstr(name, "ratio") ? -log1p(exp(-(double)lo[i])) : lo[i];
        *want = m / NP;
        return true;
    }
    const float *w = fx(nm, scalar ? 1 : NP);
    *want = w ? (scalar ? w[0] : mean3(w)) : NAN;
    return w != NULL;
}

static void check_variant(kiln_llama *m, const variant *v) {
    kiln_train_config c;
    settings(&c, v->objective, v->loss, v->beta, v->gamma);
    c.dpo_ref = v->dpo_ref;
    if (m->n_base == m->n_params) c.lora_rank = 0;
    CHECK_OK(kiln_train_config_validate(&c));
    kiln_objective o;
    CHECK_OK(kiln_objective_from_config(&c, &o));
    CHECK(o.ref_logps == (v->dpo_ref == KILN_DPO_REF_FILE || (v->objective == KILN_OBJECTIVE_DPO && !c.lora_rank)),
          "%s: reads ref_logps", v->tag);
    kiln_batch *b = batch(0, NR);
    kiln_tensor *by[KILN_IN_N];
    inputs(&o, b, b, 0, by);
    kiln_llama_zero_grad(m);
    int nr = o.n_terms + o.n_metrics;
    double rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
    eager_step(&o, m, by, rep);
    char nm[160];
    snprintf(nm, sizeof nm, "%s.loss", v->tag);
    const float *want_loss = fx(nm, 1);
    double loss = window_loss(&o, rep, b), gs, gd = grad_diff(m, v->tag, &gs);
    printf("  %-12s loss %.8f (PyTorch %.8f, rel %.1e); %s gradients rel %.1e of %.2e\n", v->tag, loss,
           want_loss ? want_loss[0] : NAN, want_loss ? t_rel(loss, want_loss[0]) : NAN, c.lora_rank ? "adapter" : "all",
           gd, gs);
    CHECK(want_loss && t_rel(loss, want_loss[0]) < 1e-5, "%s: loss %.8f vs PyTorch %.8f", v->tag, loss, want_loss ? want_loss[0] : 0);
    CHECK(gd < 1e-5, "%s: gradients rel %.2e", v->tag, gd);
    /* TRL's metrics: means over the pairs (nll_loss: over the chosen tokens) */
    int64_t u[KILN_NORM_N];
    kiln_batch_units(b, u);
    double got_m[KILN_OBJ_MAX_METRICS];
    for (int j = 0; j < o.n_metrics; j++) {
        double want, got = got_m[j] = rep[o.n_terms + j] / (double)u[o.metric_norm[j]];
        bool have = fixture_metric(v->tag, o.metric[j], &want);
        CHECK(have && fabs(got - want) < 1e-5 * fmax(1.0, fabs(want)), "%s: %s %.7f vs PyTorch %.7f", v->tag, o.metric[j], got, want);
    }
    printf("               %s %.5f, %s %.5f, %s %.3f\n", o.metric[0], got_m[0], o.metric[1], got_m[1], o.metric[2], got_m[2]);

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
        float r[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
        CHECK_OK(kiln_compiled_run(cs, in, r));
        double rd[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
        for (int i = 0; i < nr; i++) rd[i] = r[i];
        double cl = window_loss(&o, rd, b), gcs, gcd = grad_diff(m, v->tag, &gcs);
        printf("               compiled: loss rel %.1e, gradients rel %.1e\n", t_rel(cl, loss), gcd);
        CHECK(t_rel(cl, loss) < 1e-6 && gcd < 1e-5, "%s: compiled = eager (loss %.8f vs %.8f, gradients %.2e)", v->tag, cl,
              loss, gcd);
        for (int j = 0; j < nr; j++)
            CHECK(fabs(r[j] - rep[j]) < 1e-5 * fmax(1.0, fabs(rep[j])), "%s: compiled report %d", v->tag, j);
        kiln_compiled_free(cs);
    }
    release(by);
    kiln_batch_free(b);
}

/* a window of two micro-batches (pairs {0, 1} and {2}) through the trainer's
 * step: each term divided by the window's units of its kind (pairs; orpo's
 * NLL: the window's chosen tokens), the big batch's loss; the summed
 * micro-batch gradients are the big batch's */
static void accumulation(kiln_llama *m, const variant *v, const char *want_tag) {
    kiln_train_config c;
    settings(&c, v->objective, v->loss, v->beta, v->gamma);
    c.lr = 1e-30, c.weight_decay = 0, c.clip = 0; /* the step changes nothing that matters */
    kiln_objective o;
    CHECK_OK(kiln_objective_from_config(&c, &o));
    kiln_batch *mb[2] = {batch(0, 4), batch(4, 2)}, *all = batch(0, NR);
    kiln_adamw *opt = kiln_adamw_new(m, &c);
    kiln_step_result res;
    CHECK_OK(kiln_train_window(m, opt, &c, mb, 2, 0.0, &res));
    char nm[160];
    snprintf(nm, sizeof nm, "%s.loss", want_tag);
    const float *want = fx(nm, 1);
    printf("  %s, window of 2 + 1 pairs: loss %.8f (PyTorch %.8f), %lld %s, rewards/accuracies %.3f\n", v->tag, res.loss,
           want ? want[0] : NAN, (long long)res.units, kiln_norm_name(o.norm[0]), res.metric[2]);
    CHECK(want && t_rel(res.loss, want[0]) < 1e-5, "%s: accumulated window = big batch: %.8f vs %.8f", v->tag, res.loss,
          want ? want[0] : 0);
    CHECK(res.n_metrics == o.n_metrics && !strcmp(res.metric_name[2], "rewards/accuracies"), "the window's metrics");
    for (int j = 0; j < o.n_metrics; j++) {
        double w;
        bool have = fixture_metric(v->tag, o.metric[j], &w);
        CHECK(have && fabs(res.metric[j] - w) < 1e-5 * fmax(1.0, fabs(w)), "%s: window %s %.7f vs PyTorch %.7f", v->tag,
              o.metric[j], res.metric[j], w);
    }
    /* the gradients, micro-batch by micro-batch, each term scaled by 1 / the window's units */
    kiln_llama_zero_grad(m);
    for (int k = 0; k < 2; k++) {
        kiln_tensor *by[KILN_IN_N];
        double rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
        inputs(&o, mb[k], all, k ? 4 : 0, by);
        eager_step(&o, m, by, rep);
        release(by);
    }
    double gs, gd = grad_diff(m, want_tag, &gs);
    CHECK(gd < 1e-5, "%s: accumulated gradients = PyTorch's (rel %.2e)", v->tag, gd);
    kiln_adamw_free(opt);
    kiln_batch_free(mb[0]);
    kiln_batch_free(mb[1]);
    kiln_batch_free(all);
}

/* bf16 autocast (precision bf16: products in bf16, fp32 accumulation and
 * loss): the same objectives near the fp32 reference, and compiled near
 * eager */
static void bf16(kiln_llama *m, const variant *v) {
    kiln_train_config c;
    settings(&c, v->objective, v->loss, v->beta, v->gamma);
    kiln_objective o;
    CHECK_OK(kiln_objective_from_config(&c, &o));
    kiln_batch *b = batch(0, NR);
    kiln_tensor *by[KILN_IN_N];
    inputs(&o, b, b, 0, by);
    kiln_dtype was = kiln_autocast_set(KILN_BF16);
    kiln_llama_zero_grad(m);
    int nr = o.n_terms + o.n_metrics;
    double rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
    eager_step(&o, m, by, rep);
    char nm[160];
    snprintf(nm, sizeof nm, "%s.loss", v->tag);
    const float *want = fx(nm, 1);
    double loss = window_loss(&o, rep, b), gs, gd = grad_diff(m, v->tag, &gs);
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    kiln_step_trace st = {.m = m, .o = &o};
    kiln_compiled *cs = kiln_train_compile_objective(&st, &co, false);
    double cl = NAN;
    if (cs) {
        kiln_tensor *in[KILN_IN_N];
        for (int i = 0; i < st.n_in; i++) in[i] = by[st.names[i]];
        float r[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
        double rd[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
        CHECK_OK(kiln_compiled_run(cs, in, r));
        for (int i = 0; i < nr; i++) rd[i] = r[i];
        cl = window_loss(&o, rd, b);
        kiln_compiled_free(cs);
    }
    kiln_autocast_set(was);
    printf("  bf16 %-8s loss %.6f (PyTorch fp32 %.6f, rel %.1e), gradients rel %.1e; compiled bf16 rel %.1e to eager\n", v->tag,
           loss, want ? want[0] : NAN, want ? t_rel(loss, want[0]) : NAN, gd, t_rel(cl, loss));
    CHECK(want && t_rel(loss, want[0]) < 2e-3 && gd < 3e-2, "bf16 %s: loss %.6f vs %.6f, gradients %.2e", v->tag, loss,
          want ? want[0] : 0, gd);
    CHECK(t_rel(cl, loss) < 1e-3, "bf16 %s: compiled %.6f vs eager %.6f", v->tag, cl, loss);
    release(by);
    kiln_batch_free(b);
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
    c.lora_rank = 0, c.dpo_ref = KILN_DPO_REF_ADAPTERS;
    CHECK(kiln_train_config_validate(&c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--lora-rank"),
          "dpo_ref adapters without adapters refused: %s", kiln_last_error());
    settings(&c, KILN_OBJECTIVE_SIMPO, 0, 2.0, 0.5);
    c.dpo_ref = KILN_DPO_REF_FILE;
    CHECK(kiln_train_config_validate(&c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "dpo_ref"),
          "dpo_ref with simpo refused: %s", kiln_last_error());
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
/* what dpo_run trains: the objective, LoRA or full fine-tuning, dpo's reference, the seed */
static struct { int objective, lora_rank, dpo_ref; uint64_t seed; } run_kind = {KILN_OBJECTIVE_DPO, 4, KILN_DPO_REF_AUTO, 0};
static kiln_status dpo_open(const char *name, int compile, bool resume, kiln_trainer **t) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    snprintf(c.data, sizeof c.data, "%s/data", tmp);
    snprintf(c.run_dir, sizeof c.run_dir, "%s/%s", tmp, name);
    snprintf(c.model, sizeof c.model, "%s/m.json", tmp);
    c.objective = run_kind.objective, c.pack = KILN_PACK_PAIRS, c.lora_rank = run_kind.lora_rank, c.lora_alpha = 8;
    c.dpo_ref = run_kind.dpo_ref;
    if (run_kind.seed) c.seed = run_kind.seed;
    snprintf(c.lora_targets, sizeof c.lora_targets, "all");
    c.batch = 4, c.accum = 2, c.seq_len = 24, c.steps = 6, c.warmup = 1, c.lr = 1e-2, c.min_lr = 1e-3;
    c.eval_every = 3, c.eval_batches = 1, c.save_every = 3, c.log_every = 0, c.compile = compile;
    return kiln_trainer_open(&c, resume, t);
}

static bool dpo_run(const char *name, int compile, int64_t stop_at, bool resume) {
    kiln_trainer *t = NULL;
    CHECK_OK(dpo_open(name, compile, resume, &t));
    if (!t) return false;
    test_watch w = {t, stop_at, 0, 0, 0};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    return true;
}

static bool same_run_file(const char *a, const char *b, const char *file) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s/%s", tmp, a, file);
    snprintf(pb, sizeof pb, "%s/%s/%s", tmp, b, file);
    return test_same_file(pa, pb);
}

/* DPO with the reference's log-probs stored beside the shards (computed by
 * the run's first phase): with LoRA the run is the adapters-off run, byte
 * for byte; full fine-tuning resumes byte-identically; ORPO too; a damaged
 * file, one of another model, and a missing one on resume are refused. */
static void stored_reference(void) {
    char ref[600], val_ref[600];
    snprintf(ref, sizeof ref, "%s/data/train.dpo-ref.bin", tmp);
    snprintf(val_ref, sizeof val_ref, "%s/data/val.dpo-ref.bin", tmp);
    run_kind.dpo_ref = KILN_DPO_REF_FILE;
    if (!dpo_run("ref_file", KILN_RUN_EAGER, -1, false)) return;
    CHECK(access(ref, R_OK) == 0 && access(val_ref, R_OK) == 0, "the first phase stored %s and val's", ref);
    CHECK(same_run_file("straight", "ref_file", "adapter_model.safetensors"),
          "LoRA DPO on the stored reference = with the adapters switched off, byte for byte");
    /* full fine-tuning: the reference is the starting model, stored */
    run_kind.lora_rank = 0, run_kind.dpo_ref = KILN_DPO_REF_AUTO;
    remove(ref);
    remove(val_ref);
    for (int compile = 0; compile < 2; compile++) {
        int mode = compile ? KILN_RUN_COMPILE_DEFAULT : KILN_RUN_EAGER;
        const char *a = compile ? "full_c" : "full", *b = compile ? "full_resumed_c" : "full_resumed";
        if (!dpo_run(a, mode, -1, false) || !dpo_run(b, mode, 3, false) || !dpo_run(b, mode, -1, true)) return;
        CHECK(same_run_file(a, b, "model.safetensors"), "full fine-tuning DPO %s: resumed at step 3 = uninterrupted, byte for byte",
              compile ? "compiled" : "eager");
    }
    /* another model's reference */
    run_kind.seed = 99;
    kiln_trainer *t = NULL;
    CHECK(dpo_open("other", KILN_RUN_EAGER, false, &t) == KILN_ERR_INVALID && strstr(kiln_last_error(), "another reference model") &&
              strstr(kiln_last_error(), ref),
          "a stored reference of another model refused: %s", kiln_last_error());
    kiln_trainer_free(t), t = NULL;
    run_kind.seed = 0;
    /* damaged: one value's byte flipped */
    char *bytes = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(ref, &bytes, &n));
    if (bytes && n > 80) {
        bytes[70] ^= 0x40;
        CHECK_OK(kiln_write_file_atomic(ref, bytes, n));
        CHECK(dpo_open("damaged", KILN_RUN_EAGER, false, &t) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "checksum") &&
                  strstr(kiln_last_error(), ref),
              "a damaged stored reference refused: %s", kiln_last_error());
        kiln_trainer_free(t), t = NULL;
        CHECK_OK(kiln_write_file_atomic(ref, bytes, n - 5)); /* truncated */
        CHECK(dpo_open("damaged", KILN_RUN_EAGER, false, &t) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "bytes"),
              "a truncated stored reference refused: %s", kiln_last_error());
        kiln_trainer_free(t), t = NULL;
    }
    free(bytes);
    remove(ref);
    CHECK(dpo_open("full_resumed", KILN_RUN_EAGER, true, &t) == KILN_ERR_IO && strstr(kiln_last_error(), "missing"),
          "a resume without its stored reference refused: %s", kiln_last_error());
    kiln_trainer_free(t), t = NULL;
    /* orpo: no reference; resumes byte-identically */
    run_kind.objective = KILN_OBJECTIVE_ORPO, run_kind.lora_rank = 4;
    if (!dpo_run("orpo", KILN_RUN_EAGER, -1, false) || !dpo_run("orpo_r", KILN_RUN_EAGER, 3, false) ||
        !dpo_run("orpo_r", KILN_RUN_EAGER, -1, true))
        return;
    CHECK(same_run_file("orpo", "orpo_r", "adapter_model.safetensors"), "ORPO: resumed at step 3 = uninterrupted, byte for byte");
    char mp[600], *text = NULL;
    snprintf(mp, sizeof mp, "%s/orpo/metrics.jsonl", tmp);
    CHECK_OK(kiln_read_file(mp, &text, &n));
    CHECK(text && strstr(text, "\"nll_loss\"") && strstr(text, "\"log_odds_ratio\"") && strstr(text, "\"val_log_odds_chosen\""),
          "ORPO's metrics.jsonl holds TRL's ORPO metrics");
    free(text);
    printf("  stored reference: LoRA run = adapters-off run byte for byte; full fine-tuning and ORPO resume byte-identically\n");
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
    stored_reference();
    CHECK(t_rmtree(tmp) == 0, "cleanup");
}

int main(void) {
    kiln_eager_enable();
    kiln_llama *m = model();
    static const variant vs[] = {
        {"dpo_sigmoid", KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5, KILN_DPO_REF_AUTO},
        {"dpo_ipo", KILN_OBJECTIVE_DPO, KILN_DPO_IPO, 0.1, 0.5, KILN_DPO_REF_AUTO},
        {"dpo_hinge", KILN_OBJECTIVE_DPO, KILN_DPO_HINGE, 0.1, 0.5, KILN_DPO_REF_AUTO},
        {"dpo_sigmoid", KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5, KILN_DPO_REF_FILE}, /* the stored reference */
        {"simpo", KILN_OBJECTIVE_SIMPO, 0, 2.0, 1.0, KILN_DPO_REF_AUTO},
        {"orpo", KILN_OBJECTIVE_ORPO, 0, 0.1, 0.5, KILN_DPO_REF_AUTO},
    };
    for (size_t i = 0; m && i < sizeof vs / sizeof *vs; i++) check_variant(m, &vs[i]);
    if (m) accumulation(m, &vs[0], "dpo_sigmoid_accum");
    if (m) accumulation(m, &vs[5], "orpo");
    if (m) bf16(m, &vs[0]);
    if (m) bf16(m, &vs[5]);
    /* full fine-tuning: every weight trains; dpo reads the stored reference */
    kiln_llama *mf = model_full();
    static const variant fs[] = {
        {"dpo_full", KILN_OBJECTIVE_DPO, KILN_DPO_SIGMOID, 0.1, 0.5, KILN_DPO_REF_AUTO},
        {"dpo_ipo_full", KILN_OBJECTIVE_DPO, KILN_DPO_IPO, 0.1, 0.5, KILN_DPO_REF_AUTO},
        {"dpo_hinge_full", KILN_OBJECTIVE_DPO, KILN_DPO_HINGE, 0.1, 0.5, KILN_DPO_REF_AUTO},
        {"simpo_full", KILN_OBJECTIVE_SIMPO, 0, 2.0, 1.0, KILN_DPO_REF_AUTO},
        {"orpo_full", KILN_OBJECTIVE_ORPO, 0, 0.1, 0.5, KILN_DPO_REF_AUTO},
    };
    for (size_t i = 0; mf && i < sizeof fs / sizeof *fs; i++) check_variant(mf, &fs[i]);
    kiln_llama_free(mf);
    refusals();
    resume();
    kiln_llama_free(m);
    kiln_st_close(F);
    TEST_END();
}
