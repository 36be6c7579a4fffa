/* LoRA: adapters against a PyTorch reference of PEFT's LoRA forward
 * (tests/reference/make_lora_fixture.py), finite differences, eager =
 * compiled, the frozen base's gradient pruned from the compiled graph,
 * B = 0 leaving the base loss bit for bit, PEFT's initialisation bound,
 * the PEFT files, resume bit-identical, and the merged model. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/graph.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"
#include "test_runs.h"

#define FIX "tests/fixtures/"
#define TOL 1e-4

typedef struct {
    kiln_st_file *f;
    kiln_llama *m;
    kiln_tensor *ids, *labels, *mask, *scale;
    int64_t count;
} fixture;

static kiln_tensor *fix_tensor(kiln_st_file *f, const char *name, kiln_dtype want) {
    const kiln_st_tensor *s = kiln_st_find(f, name);
    CHECK(s && s->dtype == want, "fixture tensor %s", name);
    if (!s || s->dtype != want) return NULL;
    kiln_tensor *t = kiln_tensor_new(want, s->ndim, s->shape);
    memcpy(t->data, s->bytes, s->nbytes);
    return t;
}

static bool fill_param(kiln_st_file *f, kiln_tensor *p) {
    const kiln_st_tensor *s = kiln_st_find(f, p->name);
    bool ok = s && s->dtype == KILN_F32 && s->nbytes == kiln_tensor_nbytes(p);
    CHECK(ok, "fixture has %s", p->name);
    if (ok) memcpy(p->data, s->bytes, s->nbytes);
    return ok;
}

static kiln_lora_config all_r4(void) {
    return (kiln_lora_config){.rank = 4, .alpha = 8, .dropout = 0, .targets = (1u << KILN_LORA_N) - 1};
}

/* the fixture's base and adapters (with_adapters false: base only) */
static bool fixture_open(fixture *x, bool with_adapters) {
    memset(x, 0, sizeof *x);
    kiln_llama_config cfg;
    CHECK_OK(kiln_llama_config_load(FIX "tiny_gqa.config.json", &cfg));
    CHECK_OK(kiln_st_open(FIX "lora_ref.safetensors", &x->f));
    if (!x->f) return false;
    x->m = kiln_llama_new(&cfg, 1);
    if (!x->m) return false;
    kiln_lora_config lc = all_r4();
    if (with_adapters) CHECK_OK(kiln_llama_lora_add(x->m, &lc, 7));
    bool ok = true;
    for (int i = 0; i < x->m->n_params; i++) ok &= fill_param(x->f, x->m->params[i]);
    x->ids = fix_tensor(x->f, "input_ids", KILN_I32);
    x->labels = fix_tensor(x->f, "labels", KILN_I32);
    x->mask = fix_tensor(x->f, "attention_mask", KILN_I32);
    if (!ok || !x->ids || !x->labels || !x->mask) return false;
    for (int64_t i = 0; i < kiln_tensor_numel(x->labels); i++) x->count += kiln_i32(x->labels)[i] != KILN_IGNORE_INDEX;
    int64_t one = 1;
    x->scale = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(x->scale)[0] = 1.0f / (float)x->count;
    return true;
}

static void fixture_close(fixture *x) {
    kiln_tensor_release(x->ids);
    kiln_tensor_release(x->labels);
    kiln_tensor_release(x->mask);
    kiln_tensor_release(x->scale);
    kiln_llama_free(x->m);
    kiln_st_close(x->f);
}

static double eager_loss(kiln_llama *m, fixture *x, bool backward) {
    kiln_llama_zero_grad(m);
    kiln_tensor *sum = kiln_ce_loss(m, x->ids, x->labels, x->mask, NULL);
    kiln_tensor *loss = kiln_scale_by(sum, x->scale);
    CHECK(loss != NULL, "eager loss: %s", kiln_last_error());
    double l = loss ? kiln_f32(loss)[0] : NAN;
    if (loss && backward) CHECK_OK(kiln_backward(loss));
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    return l;
}

static void check_grads(const char *what, fixture *x) {
    double worst = 0;
    int missing = 0, base_grads = 0;
    for (int i = 0; i < x->m->n_params; i++) {
        kiln_tensor *p = x->m->params[i];
        if (i < x->m->n_base) {
            base_grads += p->grad != NULL;
            continue;
        }
        char name[160];
        snprintf(name, sizeof name, "grad.%s", p->name);
        const kiln_st_tensor *g = kiln_st_find(x->f, name);
        if (!g || !p->grad) {
            missing++;
            continue;
        }
        worst = fmax(worst, rel_err(kiln_f32(p->grad), g->bytes, kiln_tensor_numel(p)));
    }
    printf("  %s: adapter gradients vs torch: max rel err %.2e\n", what, worst);
    CHECK(missing == 0, "%s: %d adapters without a gradient or a reference", what, missing);
    CHECK(worst < TOL, "%s: adapter gradients vs torch %.2e", what, worst);
    CHECK(base_grads == 0, "%s: %d frozen base parameters got a gradient buffer", what, base_grads);
}

static void test_torch_reference(void) {
    fixture x;
    if (!fixture_open(&x, true)) {
        fixture_close(&x);
        return;
    }
    float ref = ((const float *)kiln_st_find(x.f, "loss")->bytes)[0];
    double l = eager_loss(x.m, &x, true);
    printf("  eager loss %.7f, torch %.7f\n", l, ref);
    CHECK(t_rel(l, ref) < TOL, "eager loss %.7f vs torch %.7f", l, ref);
    check_grads("eager", &x);

    /* compiled: the same numbers, and no gradient accumulation (so no
     * weight-gradient matmul) for any frozen base weight */
    kiln_llama_zero_grad(x.m);
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    kiln_compiled *cs = kiln_train_compile(x.m, &co, true);
    CHECK(cs != NULL, "compile: %s", kiln_last_error());
    if (cs) {
        float rep[1] = {NAN};
        kiln_tensor *in[4] = {x.ids, x.labels, x.mask, x.scale};
        CHECK_OK(kiln_compiled_run(cs, in, rep));
        double lc = rep[0] / (double)x.count;
        CHECK(t_rel(lc, ref) < TOL, "compiled loss %.7f vs torch %.7f", lc, ref);
        check_grads("compiled", &x);
        const kiln_graph *g = kiln_compiled_graph(cs);
        int base_acc = 0, adapter_acc = 0;
        for (int v = 0; g && v < g->n; v++) {
            if (g->v[v].kind != KILN_V_GRAD_ACC || g->v[v].dead) continue;
            if (g->v[v].index < x.m->n_base) base_acc++;
            else adapter_acc++;
        }
        printf("  compiled graph: %d adapter gradient sinks, %d for base weights\n", adapter_acc, base_acc);
        CHECK(g && base_acc == 0, "the compiled graph accumulates %d base-weight gradients", base_acc);
        CHECK(adapter_acc >= x.m->n_params - x.m->n_base, "every adapter has a gradient sink (%d)", adapter_acc);
        kiln_compiled_free(cs);
    }

    /* central finite differences on the adapters (the quotient in double) */
    const char *probe[] = {"model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.1.mlp.down_proj.lora_B.weight",
                           "model.layers.0.self_attn.v_proj.lora_B.weight", "model.layers.1.mlp.gate_proj.lora_A.weight"};
    double worst = 0;
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        eager_loss(x.m, &x, true); /* the differences below zero the gradients */
        kiln_tensor *p = kiln_llama_param(x.m, probe[k]);
        CHECK(p != NULL, "param %s", probe[k]);
        if (!p || !p->grad) continue;
        /* the entry with the largest gradient: where the difference is above float noise */
        int64_t at = 0;
        for (int64_t i = 0; i < kiln_tensor_numel(p); i++)
            if (fabsf(kiln_f32(p->grad)[i]) > fabsf(kiln_f32(p->grad)[at])) at = i;
        double an = kiln_f32(p->grad)[at];
        float keep = kiln_f32(p)[at], h = 3e-2f;
        kiln_f32(p)[at] = keep + h;
        double up = eager_loss(x.m, &x, false);
        kiln_f32(p)[at] = keep - h;
        double dn = eager_loss(x.m, &x, false);
        kiln_f32(p)[at] = keep;
        double fd = (up - dn) / (2.0 * ((double)(keep + h) - (double)keep));
        worst = fmax(worst, t_rel(an, fd));
        printf("  finite difference %s[%lld]: analytic %.6e, fd %.6e\n", probe[k], (long long)at, an, fd);
    }
    /* float32 forward: the difference quotient carries ~1e-7/h noise */
    CHECK(worst < 5e-3, "adapter gradients vs finite differences: %.2e", worst);
    fixture_close(&x);
}

/* PEFT's init: A ~ U(-1/sqrt(in), 1/sqrt(in)) as kaiming_uniform_(a=sqrt(5))
 * draws it (torch's own draw is in the fixture), B = 0; and with B = 0 the
 * loss is the base model's, bit for bit. */
static void test_init_and_zero_b(void) {
    fixture base, x;
    bool ok = fixture_open(&base, false);
    if (ok) ok = fixture_open(&x, false);
    if (!ok) {
        fixture_close(&base);
        return;
    }
    kiln_lora_config lc = all_r4();
    CHECK_OK(kiln_llama_lora_add(x.m, &lc, 11));
    const kiln_st_tensor *ta = kiln_st_find(x.f, "init.A");
    double torch_max = 0;
    for (int64_t i = 0; ta && i < 4 * 48; i++) torch_max = fmax(torch_max, fabs(((const float *)ta->bytes)[i]));
    kiln_tensor *A = kiln_llama_param(x.m, "model.layers.0.self_attn.q_proj.lora_A.weight");
    kiln_tensor *B = kiln_llama_param(x.m, "model.layers.0.self_attn.q_proj.lora_B.weight");
    CHECK(A && B && A->shape[0] == 4 && A->shape[1] == 48 && B->shape[0] == 48 && B->shape[1] == 4, "adapter shapes");
    double bound = 1.0 / sqrt(48.0), kmax = 0, bmax = 0;
    for (int64_t i = 0; A && i < 4 * 48; i++) kmax = fmax(kmax, fabs(kiln_f32(A)[i]));
    for (int64_t i = 0; B && i < 48 * 4; i++) bmax = fmax(bmax, fabs(kiln_f32(B)[i]));
    printf("  init: bound 1/sqrt(48) = %.5f, torch max |A| %.5f, kiln max |A| %.5f\n", bound, torch_max, kmax);
    CHECK(torch_max <= bound && torch_max > 0.9 * bound, "torch's kaiming_uniform_(a=sqrt(5)) bound is 1/sqrt(in)");
    CHECK(kmax <= bound && kmax > 0.9 * bound, "kiln draws A within the same bound (max %.5f)", kmax);
    CHECK(bmax == 0, "B starts at zero");
    for (int i = 0; i < x.m->n_base; i++) CHECK(!x.m->params[i]->requires_grad, "base %s frozen", x.m->params[i]->name);
    double l0 = eager_loss(base.m, &base, false), l1 = eager_loss(x.m, &x, false);
    CHECK(memcmp(&l0, &l1, sizeof l0) == 0, "B = 0 leaves the loss bit for bit: %.9g vs %.9g", l0, l1);
    /* and the merge of a trained adapter gives the loss of base + adapter */
    fixture y;
    if (fixture_open(&y, true)) {
        double with = eager_loss(y.m, &y, false);
        CHECK_OK(kiln_llama_lora_merge(y.m));
        CHECK(y.m->n_params == y.m->n_base && !y.m->lora_a, "merge removes the adapters");
        double merged = eager_loss(y.m, &y, false);
        printf("  base + adapters %.9f, merged %.9f\n", with, merged);
        CHECK(t_rel(with, merged) < 1e-5, "merged loss %.9f vs %.9f", merged, with);
    }
    fixture_close(&y);
    unsigned mask;
    CHECK(kiln_lora_targets_parse("q_proj,lm_head", &mask) == KILN_ERR_INVALID && strstr(kiln_last_error(), "lm_head"),
          "unknown target named: %s", kiln_last_error());
    lc.dropout = 0.1;
    CHECK_OK(kiln_lora_config_validate(&lc));
    lc.dropout = 1.0;
    CHECK(kiln_lora_config_validate(&lc) == KILN_ERR_INVALID && strstr(kiln_last_error(), "dropout"),
          "dropout 1 refused by name: %s", kiln_last_error());
    fixture_close(&x);
    fixture_close(&base);
}

static bool test_weights_same(const kiln_llama *a, const kiln_llama *b) {
    if (a->n_base != b->n_base) return false;
    for (int i = 0; i < a->n_base; i++)
        if (kiln_tensor_nbytes(a->params[i]) != kiln_tensor_nbytes(b->params[i]) ||
            memcmp(a->params[i]->data, b->params[i]->data, kiln_tensor_nbytes(a->params[i])))
            return false;
    return true;
}

/* ---- use_rslora and the scaling's range (issue 22 item 7) ------------------- */
/* PEFT's use_rslora scales by alpha / sqrt(r): r 16, alpha 6 gives 1.5 (not
 * 0.375); the forward and the merge use it, and adapter_config.json keeps it. */
static void test_rslora(void) {
    kiln_lora_config lc = {.rank = 16, .alpha = 6, .targets = 1u << KILN_LORA_Q, .rslora = true};
    CHECK(kiln_lora_scaling(&lc) == 1.5, "rslora scaling 6 / sqrt(16) = 1.5 (got %.17g)", kiln_lora_scaling(&lc));
    lc.rslora = false;
    CHECK(kiln_lora_scaling(&lc) == 0.375, "plain scaling 6 / 16 = 0.375 (got %.17g)", kiln_lora_scaling(&lc));
    lc = (kiln_lora_config){.rank = 4, .alpha = 1e300, .targets = 1u << KILN_LORA_Q};
    CHECK(kiln_lora_config_validate(&lc) != KILN_OK && strstr(kiln_last_error(), "lora_alpha") &&
              strstr(kiln_last_error(), "1e+300"),
          "alpha 1e300 refused naming lora_alpha: %s", kiln_last_error());
    lc = (kiln_lora_config){.rank = 1, .alpha = 2e4, .targets = 1u << KILN_LORA_Q, .rslora = true};
    CHECK(kiln_lora_config_validate(&lc) != KILN_OK && strstr(kiln_last_error(), "alpha/sqrt(r)"),
          "scaling 2e4 refused: %s", kiln_last_error());
    lc.alpha = 1e4;
    CHECK_OK(kiln_lora_config_validate(&lc));

    /* forward: rslora r 4 alpha 8 (scaling 4) = plain r 4 alpha 16 (scaling 4), bit for bit */
    kiln_llama_config cfg;
    CHECK_OK(kiln_llama_config_load(FIX "tiny_gqa.config.json", &cfg));
    kiln_llama *a = kiln_llama_new(&cfg, 3), *b = kiln_llama_new(&cfg, 3);
    if (!a || !b) return;
    kiln_lora_config ra = {.rank = 4, .alpha = 8, .targets = (1u << KILN_LORA_Q) | (1u << KILN_LORA_DOWN), .rslora = true};
    kiln_lora_config rb = ra;
    rb.rslora = false, rb.alpha = 16;
    CHECK_OK(kiln_llama_lora_add(a, &ra, 5));
    CHECK_OK(kiln_llama_lora_add(b, &rb, 5));
    for (int i = a->n_base; i < a->n_params; i++) /* B away from zero, the same in both */
        for (int64_t j = 0; j < kiln_tensor_numel(a->params[i]); j++)
            kiln_f32(a->params[i])[j] = kiln_f32(b->params[i])[j] = (float)(0.01 * (double)((j * 7 + i) % 13 - 6));
    int64_t s[2] = {1, 6};
    kiln_tensor *ids = kiln_tensor_zeros(KILN_I32, 2, s);
    for (int j = 0; j < 6; j++) kiln_i32(ids)[j] = (j * 5 + 1) % (int)cfg.vocab_size;
    kiln_tensor *la = kiln_llama_forward(a, ids, NULL, NULL), *lb = kiln_llama_forward(b, ids, NULL, NULL);
    CHECK(la && lb && !memcmp(la->data, lb->data, kiln_tensor_nbytes(la)), "rslora alpha 8 r 4 = alpha 16 r 4 in the forward");
    kiln_tensor_release(lb);

    /* merge by hand: W' = W + alpha / sqrt(r) * B A (in double) for one element */
    kiln_tensor *W = a->layers[0].q_proj, *A = a->lora_a[0 * KILN_LORA_N + KILN_LORA_Q], *B = a->lora_b[0 * KILN_LORA_N + KILN_LORA_Q];
    int64_t in = W->shape[1], o = 3, k = 5;
    double dot = 0;
    for (int r = 0; r < 4; r++) dot += (double)kiln_f32(B)[o * 4 + r] * kiln_f32(A)[r * in + k];
    float want = (float)((double)kiln_f32(W)[o * in + k] + 8.0 / sqrt(4.0) * dot);

    /* PEFT files: use_rslora written and read back */
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/kiln_test_rslora_%d", (int)getpid());
    mkdir(dir, 0755);
    CHECK_OK(kiln_lora_save(dir, a, "tiny"));
    char p[400];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    json_t *o_json = json_load_file(p, 0, NULL);
    CHECK(o_json && json_is_true(json_object_get(o_json, "use_rslora")) && json_integer_value(json_object_get(o_json, "r")) == 4,
          "adapter_config.json says use_rslora: true");
    json_decref(o_json);
    kiln_llama *c = kiln_llama_new(&cfg, 3);
    CHECK_OK(kiln_lora_load(dir, c));
    CHECK(c && c->lora.rslora && kiln_lora_scaling(&c->lora) == 4.0, "use_rslora read back: scaling 4");
    kiln_tensor *lc2 = c ? kiln_llama_forward(c, ids, NULL, NULL) : NULL;
    CHECK(la && lc2 && !memcmp(la->data, lc2->data, kiln_tensor_nbytes(la)), "the loaded rslora adapters give the same logits");
    kiln_tensor_release(lc2);
    kiln_llama_free(c);
    CHECK_OK(kiln_llama_lora_merge(a));
    float got = kiln_f32(a->layers[0].q_proj)[o * in + k];
    CHECK(got == want, "merged q_proj[3, 5] = W + alpha/sqrt(r) B A: %.9g vs %.9g", got, want);
    kiln_tensor_release(la);
    kiln_tensor_release(ids);
    kiln_llama_free(a);
    kiln_llama_free(b);
    CHECK(t_rmtree(dir) == 0, "cleanup");
}

/* A merge that would write inf/NaN weights is refused naming the tensor. */
static void test_merge_non_finite(void) {
    kiln_llama_config cfg;
    CHECK_OK(kiln_llama_config_load(FIX "tiny_gqa.config.json", &cfg));
    kiln_llama *m = kiln_llama_new(&cfg, 3);
    kiln_lora_config lc = {.rank = 2, .alpha = 2, .targets = 1u << KILN_LORA_V};
    CHECK_OK(kiln_llama_lora_add(m, &lc, 5));
    kiln_tensor *A = m->lora_a[1 * KILN_LORA_N + KILN_LORA_V], *B = m->lora_b[1 * KILN_LORA_N + KILN_LORA_V];
    for (int64_t j = 0; j < kiln_tensor_numel(A); j++) kiln_f32(A)[j] = 10.0f;
    for (int64_t j = 0; j < kiln_tensor_numel(B); j++) kiln_f32(B)[j] = 3e38f; /* B A = 6e39: past a float's range */
    kiln_status st = kiln_llama_lora_merge(m);
    CHECK(st == KILN_ERR_NUMERIC && strstr(kiln_last_error(), "model.layers.1.self_attn.v_proj.weight") &&
              strstr(kiln_last_error(), "non-finite"),
          "merging into an infinite weight refused naming the tensor: %s", kiln_last_error());
    kiln_llama_free(m);
}

/* ---- the trainer: PEFT files, resume bit-identical, eval of the run ------- */
static char tmpdir[256];

static void write_shards(void) { test_write_shards(tmpdir, 4000, 1200, 21); }

static void lora_config(kiln_train_config *c, const char *run) {
    test_tiny_lora_run(c, tmpdir, run, "q_proj,v_proj,down_proj");
}

static void check_peft_files(const char *run) {
    char p[1400];
    snprintf(p, sizeof p, "%s/adapter_config.json", run);
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    CHECK(o != NULL, "%s parses: %s", p, je.text);
    if (o) {
        CHECK(json_integer_value(json_object_get(o, "r")) == 4, "r = 4");
        CHECK(json_number_value(json_object_get(o, "lora_alpha")) == 16, "lora_alpha = 16");
        CHECK(json_is_number(json_object_get(o, "lora_dropout")) && json_number_value(json_object_get(o, "lora_dropout")) == 0,
              "lora_dropout = 0");
        CHECK(!strcmp(json_string_value(json_object_get(o, "peft_type")), "LORA"), "peft_type LORA");
        CHECK(!strcmp(json_string_value(json_object_get(o, "task_type")), "CAUSAL_LM"), "task_type CAUSAL_LM");
        CHECK(!strcmp(json_string_value(json_object_get(o, "bias")), "none"), "bias none");
        CHECK(json_is_false(json_object_get(o, "fan_in_fan_out")), "fan_in_fan_out false");
        CHECK(!strcmp(json_string_value(json_object_get(o, "base_model_name_or_path")), "tiny"), "base model named");
        json_t *t = json_object_get(o, "target_modules");
        CHECK(json_array_size(t) == 3 && !strcmp(json_string_value(json_array_get(t, 0)), "q_proj") &&
                  !strcmp(json_string_value(json_array_get(t, 1)), "v_proj") &&
                  !strcmp(json_string_value(json_array_get(t, 2)), "down_proj"),
              "target_modules [q_proj, v_proj, down_proj]");
        json_decref(o);
    }
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", run);
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(p, &f));
    if (!f) return;
    CHECK(kiln_st_count(f) == 2 * 3 * 2, "12 adapter tensors (%d)", kiln_st_count(f));
    const kiln_st_tensor *a = kiln_st_find(f, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    const kiln_st_tensor *b = kiln_st_find(f, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    CHECK(a && a->dtype == KILN_F32 && a->shape[0] == 4 && a->shape[1] == 128, "q_proj.lora_A [4, 128] under PEFT's name");
    CHECK(b && b->shape[0] == 128 && b->shape[1] == 4, "down_proj.lora_B [128, 4] under PEFT's name");
    double bmax = 0;
    for (int64_t i = 0; b && i < 128 * 4; i++) bmax = fmax(bmax, fabs(((const float *)b->bytes)[i]));
    CHECK(bmax > 0, "B trained away from zero");
    kiln_st_close(f);
}

static double eval_dir(const char *dir, kiln_batch *const *vb, int n, bool merge) {
    char real[1100];
    kiln_llama *m = NULL;
    CHECK_OK(kiln_model_dir_resolve(dir, real, sizeof real));
    CHECK_OK(kiln_load_model_dir(real, &m));
    if (!m) return NAN;
    CHECK(m->lora_a != NULL, "the run loads with its adapters");
    if (merge) CHECK_OK(kiln_llama_lora_merge(m));
    double loss = NAN;
    CHECK_OK(kiln_evaluate(m, vb, n, &loss, NULL));
    kiln_llama_free(m);
    return loss;
}

static void test_trainer(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_lora_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    write_shards();
    kiln_train_config c;
    lora_config(&c, "straight");
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    kiln_llama *m = kiln_trainer_model(t);
    int trainable = 0;
    for (int i = 0; i < m->n_params; i++) trainable += m->params[i]->requires_grad;
    CHECK(trainable == 12 && m->n_params - m->n_base == 12, "only the 12 adapters train (%d)", trainable);
    test_watch w = {.t = t, .stop_at = -1};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    CHECK(w.steps == 6, "6 steps (%d)", w.steps);
    kiln_trainer_free(t);

    lora_config(&c, "interrupted");
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    w = (test_watch){.t = t, .stop_at = 3};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    CHECK_OK(kiln_trainer_open(&c, true, &t));
    if (!t) return;
    CHECK(kiln_trainer_get_state(t)->step == 3, "resumed at step 3");
    w = (test_watch){.t = t, .stop_at = -1};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);

    char a[700], b[700];
    const char *files[] = {"adapter_model.safetensors", "model.safetensors", "adapter_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/straight/%s", tmpdir, files[i]);
        snprintf(b, sizeof b, "%s/interrupted/%s", tmpdir, files[i]);
        CHECK(test_same_file(a, b), "resumed %s is byte-identical to the uninterrupted run", files[i]);
    }
    snprintf(a, sizeof a, "%s/straight", tmpdir);
    check_peft_files(a);

    /* the frozen base is the untouched initial model */
    kiln_llama_config mc;
    CHECK_OK(kiln_llama_config_preset("tiny", &mc));
    snprintf(b, sizeof b, "%s/straight/config.json", tmpdir);
    CHECK_OK(kiln_llama_config_load(b, &mc));
    kiln_llama *init = kiln_llama_new(&mc, c.seed), *saved = kiln_llama_new(&mc, 0);
    snprintf(b, sizeof b, "%s/straight/model.safetensors", tmpdir);
    if (init && saved) {
        CHECK_OK(kiln_load_weights(b, saved));
        CHECK(test_weights_same(init, saved), "the base weights did not move");
    }
    kiln_llama_free(init);
    kiln_llama_free(saved);

    /* eval of the run (base + adapters) = eval of the merged model */
    kiln_batch *vb[2];
    for (int i = 0; i < 2; i++) {
        vb[i] = kiln_batch_alloc(2, 32);
        for (int j = 0; j < 64; j++) {
            vb[i]->input_ids[j] = 3 + (int32_t)(kiln_rng_u64(5 + (uint64_t)i, (uint64_t)j) % 58);
            vb[i]->pad_mask[j] = 1;
        }
        for (int j = 0; j < 64; j++) vb[i]->targets[j] = j % 32 == 31 ? KILN_IGNORE_INDEX : vb[i]->input_ids[j + 1];
        vb[i]->rows = 2;
        vb[i]->n_targets = 62;
    }
    double direct = eval_dir(a, vb, 2, false), merged = eval_dir(a, vb, 2, true);
    printf("  eval of the LoRA run %.9f, merged %.9f\n", direct, merged);
    CHECK(t_rel(direct, merged) < 1e-5, "merged eval %.9f vs base + adapters %.9f", merged, direct);
    for (int i = 0; i < 2; i++) kiln_batch_free(vb[i]);

    /* a hostile adapter_config.json is refused by field */
    snprintf(b, sizeof b, "%s/hostile", tmpdir);
    mkdir(b, 0755);
    const char *bad[] = {"{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"use_rslora\":\"yes\"}",
                         "{\"peft_type\":\"LORA\",\"r\":0,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}",
                         "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"lm_head\"]}",
                         "{\"peft_type\":\"IA3\",\"r\":4}",
                         /* issue 22 item 7: a scaling that overflows, and PEFT fields kiln does not implement */
                         "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":1e300,\"target_modules\":[\"q_proj\"]}",
                         "{\"peft_type\":\"LORA\",\"r\":1,\"lora_alpha\":1e5,\"target_modules\":[\"q_proj\"]}",
                         "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"lora_bias\":true}",
                         "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"exclude_modules\":[\"q_proj\"]}",
                         "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"exclude_modules\":\"k_proj\"}"};
    const char *field[] = {"use_rslora", "'r'", "target_modules", "peft_type", "lora_alpha", "lora_alpha", "lora_bias",
                           "exclude_modules", "exclude_modules"};
    for (int i = 0; i < 9; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/adapter_config.json", b);
        CHECK_OK(kiln_write_file_atomic(p, bad[i], strlen(bad[i])));
        kiln_llama *hm = kiln_llama_new(&mc, 0);
        kiln_status st = kiln_lora_load(b, hm);
        CHECK(st != KILN_OK && strstr(kiln_last_error(), field[i]) && strstr(kiln_last_error(), "adapter_config.json"),
              "hostile config %d refused naming %s: %s", i, field[i], kiln_last_error());
        kiln_llama_free(hm);
    }
    /* their inert values are accepted (null, false, empty) */
    const char *fine[] = {"{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"lora_bias\":false,"
                          "\"exclude_modules\":null,\"use_rslora\":false}",
                          "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"lora_bias\":null,"
                          "\"exclude_modules\":[]}"};
    for (int i = 0; i < 2; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/adapter_config.json", b);
        CHECK_OK(kiln_write_file_atomic(p, fine[i], strlen(fine[i])));
        kiln_llama *hm = kiln_llama_new(&mc, 0);
        kiln_status st = kiln_lora_load(b, hm); /* passes the config, then misses the tensors file */
        CHECK(st != KILN_OK && strstr(kiln_last_error(), "adapter_model.safetensors") && hm->lora_a && !hm->lora.rslora,
              "inert config %d accepted (fails only at the missing tensors): %s", i, kiln_last_error());
        kiln_llama_free(hm);
    }
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
}

int main(void) {
    kiln_eager_enable();
    test_torch_reference();
    test_init_and_zero_b();
    test_rslora();
    test_merge_non_finite();
    test_trainer();
    TEST_END();
}
