/* --base-dtype bf16: a LoRA model whose frozen base linears are held in
 * bf16. Its loss and adapter gradients equal those of the fp32 model with
 * bf16-rounded weights (both with bf16 products) to float rounding; eager =
 * compiled; adapter gradients against finite differences; loading F32, BF16
 * and F16 files into the bf16 base, saving it, resume bit-identical, the
 * merge; the memory estimate (--micro-batch auto) shrinks with LoRA and
 * again with the bf16 base; bf16 without LoRA is refused. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/kernels.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"
#include "test_runs.h"

static const char *const linears[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

static bool is_linear(const char *name) {
    if (strstr(name, "lora_") || !strstr(name, "model.layers.")) return false;
    for (int i = 0; i < 7; i++) {
        char w[32];
        snprintf(w, sizeof w, ".%s.weight", linears[i]);
        size_t n = strlen(name), k = strlen(w);
        if (n > k && !strcmp(name + n - k, w)) return true;
    }
    return false;
}

/* tiny model, all-linear adapters of rank 4 with B away from zero */
static kiln_llama *lora_model(void) {
    kiln_llama_config mc = test_tiny_config();
    return test_lora_model(&mc, 0);
}

/* the fp32 reference: the same model with its base linears rounded to bf16 */
static void round_linears(kiln_llama *m) {
    for (int i = 0; i < m->n_base; i++)
        if (is_linear(m->params[i]->name))
            for (int64_t j = 0; j < kiln_tensor_numel(m->params[i]); j++)
                kiln_f32(m->params[i])[j] = kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(m->params[i])[j]));
}

static double max_diff(const float *a, const float *b, int64_t n, double *scale) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    *scale = s;
    return d;
}

static int64_t param_bytes(const kiln_llama *m) {
    int64_t b = 0;
    for (int i = 0; i < m->n_params; i++) b += (int64_t)kiln_tensor_nbytes(m->params[i]);
    return b;
}

static void numerics(void) {
    kiln_llama *ref = lora_model(), *m = lora_model();
    round_linears(ref);
    int64_t before = param_bytes(m), linear_bytes = 0;
    for (int i = 0; i < m->n_base; i++)
        if (is_linear(m->params[i]->name)) linear_bytes += (int64_t)kiln_tensor_nbytes(m->params[i]);
    CHECK_OK(kiln_llama_base_cast(m, KILN_BF16));
    int bf16 = 0;
    for (int i = 0; i < m->n_params; i++) bf16 += m->params[i]->dtype == KILN_BF16;
    CHECK(bf16 == 14, "the 14 base linears are bf16 (%d)", bf16);
    CHECK(m->layers[1].down_proj->dtype == KILN_BF16 && kiln_llama_param(m, "model.layers.1.mlp.down_proj.weight") ==
                                                              m->layers[1].down_proj,
          "layer struct and params[] hold the same bf16 tensor");
    CHECK(param_bytes(m) == before - linear_bytes / 2, "parameters: %lld -> %lld bytes (the linears halved)", (long long)before,
          (long long)param_bytes(m));
    /* the held values are the rounded ones, bit for bit */
    bool same = true;
    for (int i = 0; i < m->n_base; i++) {
        if (!is_linear(m->params[i]->name)) continue;
        const uint16_t *h = m->params[i]->data;
        const float *r = kiln_f32(ref->params[i]);
        for (int64_t j = 0; j < kiln_tensor_numel(m->params[i]); j++) same &= kiln_bf16_to_f32(h[j]) == r[j];
    }
    CHECK(same, "bf16 base = bf16-rounded fp32 weights");

    kiln_batch *b = kiln_batch_alloc(2, 24);
    test_fill_batch(b, 3, 61);
    kiln_tensor *in[4];
    test_step_inputs(b, 1.0f / (float)b->n_targets, in);
    int64_t n;
    /* both with bf16 products (the reference under autocast): the same numbers */
    kiln_dtype was = kiln_autocast_set(KILN_BF16);
    double lr = test_loss_of(ref, in, true);
    float *gr = test_adapter_grads(ref, &n);
    kiln_autocast_set(KILN_F32);
    double lm = test_loss_of(m, in, true); /* its base products are bf16 without autocast; the adapters' fp32 */
    float *gm = test_adapter_grads(m, &n);
    kiln_autocast_set(KILN_BF16);
    double lm_auto = test_loss_of(m, in, false);
    kiln_autocast_set(was);
    double lref32 = test_loss_of(ref, in, false);
    double scale, d = max_diff(gm, gr, n, &scale);
    printf("  loss: bf16 base %.7f; fp32 rounded weights with bf16 products %.7f (bf16 base under autocast %.7f); fp32 "
           "products %.7f\n", lm, lr, lm_auto, lref32);
    printf("  adapter gradients vs the reference: max difference %.2e of %.2e\n", d, scale);
    CHECK(lm_auto == lr, "under autocast the bf16 base gives the reference loss bit for bit (%.9g vs %.9g)", lm_auto, lr);
    /* without autocast only the adapters' products differ (fp32 here, bf16 in the reference): bf16 operand rounding */
    CHECK(t_rel(lm, lr) < 5e-3 && d < 5e-2 * scale, "bf16 base vs reference: loss %.7f vs %.7f", lm, lr);

    /* eager = compiled, with the bf16 base */
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    co.verify_graph = true;
    kiln_llama_zero_grad(m);
    kiln_compiled *cs = kiln_train_compile(m, &co, true);
    CHECK(cs != NULL, "compile with a bf16 base: %s", kiln_last_error());
    if (cs) {
        float rep[1];
        CHECK_OK(kiln_compiled_run(cs, in, rep));
        float *gc = test_adapter_grads(m, &n);
        double dc = max_diff(gc, gm, n, &scale), lc = rep[0] / (double)b->n_targets;
        printf("  compiled: loss %.7f (eager %.7f), adapter gradients max difference %.2e of %.2e\n", lc, lm, dc, scale);
        /* as test_bf16: a one-ulp difference in a fused reduction can move an
         * operand across a bf16 rounding boundary (a 2^-8 step), so gradients
         * agree to bf16 rounding rather than bit for bit */
        CHECK(t_rel(lc, lm) < 1e-5 && dc <= 2e-3 * scale, "compiled = eager with a bf16 base (loss rel %.2e, gradients %.2e)",
              t_rel(lc, lm), dc / scale);
        int base_acc = 0;
        const kiln_graph *g = kiln_compiled_graph(cs);
        for (int v = 0; g && v < g->n; v++) base_acc += g->v[v].kind == KILN_V_GRAD_ACC && !g->v[v].dead && g->v[v].index < m->n_base;
        CHECK(g && base_acc == 0, "no base-weight gradient in the compiled graph (%d)", base_acc);
        free(gc);
        kiln_compiled_free(cs);
    }

    /* finite differences (quotient in double) on adapters whose downstream
     * has no bf16 product (the last layer's down_proj: exact), and one
     * upstream of bf16 products (their operand rounding is a step function
     * of it: looser) */
    const char *probe[] = {"model.layers.1.mlp.down_proj.lora_A.weight", "model.layers.1.mlp.down_proj.lora_B.weight",
                           "model.layers.0.self_attn.v_proj.lora_B.weight"};
    const double tol[] = {5e-3, 5e-3, 5e-2};
    for (int k = 0; k < 3; k++) {
        test_loss_of(m, in, true);
        kiln_tensor *p = kiln_llama_param(m, probe[k]);
        if (!p || !p->grad) {
            CHECK(0, "gradient of %s", probe[k]);
            continue;
        }
        int64_t at = 0;
        for (int64_t i = 0; i < kiln_tensor_numel(p); i++)
            if (fabsf(kiln_f32(p->grad)[i]) > fabsf(kiln_f32(p->grad)[at])) at = i;
        double an = kiln_f32(p->grad)[at];
        float keep = kiln_f32(p)[at], h = 3e-2f;
        kiln_f32(p)[at] = keep + h;
        double up = test_loss_of(m, in, false);
        kiln_f32(p)[at] = keep - h;
        double dn = test_loss_of(m, in, false);
        kiln_f32(p)[at] = keep;
        double fd = (up - dn) / (2.0 * ((double)(keep + h) - (double)keep));
        printf("  finite difference %s[%lld]: analytic %.6e, fd %.6e\n", probe[k], (long long)at, an, fd);
        CHECK(t_rel(an, fd) < tol[k], "%s: gradient vs finite difference (rel %.2e)", probe[k], t_rel(an, fd));
    }

    /* the merge from a bf16 base: fp32 weights, W widened plus the update,
     * exactly the merge of the rounded fp32 reference */
    CHECK_OK(kiln_llama_lora_merge(m));
    CHECK_OK(kiln_llama_lora_merge(ref));
    bool merged_same = m->n_params == ref->n_params;
    for (int i = 0; merged_same && i < m->n_params; i++)
        merged_same = m->params[i]->dtype == KILN_F32 &&
                      !memcmp(m->params[i]->data, ref->params[i]->data, kiln_tensor_nbytes(ref->params[i]));
    CHECK(merged_same, "merging into a bf16 base = merging into its rounded fp32 copy (fp32 result, bit for bit)");
    test_release_inputs(in);
    kiln_batch_free(b);
    free(gr);
    free(gm);
    kiln_llama_free(m);
    kiln_llama_free(ref);

    kiln_llama_config mc = test_tiny_config();
    kiln_llama *plain = kiln_llama_new(&mc, 1);
    CHECK(kiln_llama_base_cast(plain, KILN_BF16) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--lora-rank"),
          "a bf16 base without adapters is refused: %s", kiln_last_error());
    kiln_llama_free(plain);
}

/* ---- files: F32 / BF16 / F16 into a bf16 base; trainer save and resume -- */
static char tmpdir[256];

static void load_dtypes(void) {
    kiln_llama_config mc = test_tiny_config();
    kiln_llama *src = kiln_llama_new(&mc, 21);
    const kiln_dtype dts[] = {KILN_F32, KILN_BF16, KILN_F16};
    for (int k = 0; k < 3; k++) {
        char p[400];
        snprintf(p, sizeof p, "%s/w%d", tmpdir, k);
        mkdir(p, 0755);
        kiln_weights_options wo = {dts[k], KILN_DEFAULT_SHARD_BYTES};
        CHECK_OK(kiln_save_model_weights(p, src, &wo));
        kiln_llama *m = lora_model();
        CHECK_OK(kiln_llama_base_cast(m, KILN_BF16));
        CHECK_OK(kiln_load_model_weights(p, m));
        /* what the file holds, rounded once to bf16 */
        bool ok = true;
        for (int i = 0; i < m->n_base; i++) {
            const float *x = kiln_f32(src->params[i]);
            for (int64_t j = 0; j < kiln_tensor_numel(m->params[i]); j++) {
                float file = dts[k] == KILN_F32 ? x[j]
                             : dts[k] == KILN_BF16 ? kiln_bf16_to_f32(kiln_f32_to_bf16(x[j]))
                                                   : kiln_f16_to_f32(kiln_f32_to_f16(x[j]));
                float want = m->params[i]->dtype == KILN_BF16 ? kiln_bf16_to_f32(kiln_f32_to_bf16(file)) : file;
                float got = m->params[i]->dtype == KILN_BF16 ? kiln_bf16_to_f32(((const uint16_t *)m->params[i]->data)[j])
                                                              : kiln_f32(m->params[i])[j];
                ok &= got == want;
            }
        }
        CHECK(ok, "a %s file loads into the bf16 base rounded once to bf16", kiln_dtype_name(dts[k]));
        /* and a bf16 base saves as every dtype: F32 exactly its values */
        if (k == 0) {
            snprintf(p, sizeof p, "%s/back", tmpdir);
            mkdir(p, 0755);
            CHECK_OK(kiln_save_model_weights(p, m, NULL));
            kiln_llama *back = kiln_llama_new(&mc, 0);
            CHECK_OK(kiln_load_model_weights(p, back));
            bool same = true;
            for (int i = 0; i < m->n_base; i++)
                for (int64_t j = 0; j < kiln_tensor_numel(back->params[i]); j++)
                    same &= kiln_f32(back->params[i])[j] ==
                            (m->params[i]->dtype == KILN_BF16 ? kiln_bf16_to_f32(((const uint16_t *)m->params[i]->data)[j])
                                                             : kiln_f32(m->params[i])[j]);
            CHECK(same, "a bf16 base saved as F32 holds its values exactly");
            kiln_llama_free(back);
            wo.dtype = KILN_BF16;
            CHECK_OK(kiln_save_model_weights(p, m, &wo));
            wo.dtype = KILN_F16;
            CHECK_OK(kiln_save_model_weights(p, m, &wo));
        }
        kiln_llama_free(m);
    }
    kiln_llama_free(src);
}

static void run_config(kiln_train_config *c, const char *run, bool bf16, int rank) {
    test_tiny_lora_run(c, tmpdir, run, "all");
    c->lora_rank = rank;
    c->base_dtype = bf16 ? KILN_BF16 : KILN_F32;
}

static bool train(const char *run, int64_t stop_at, bool resume) {
    kiln_train_config c;
    run_config(&c, run, true, 4);
    return test_run_held(&c, stop_at, resume, KILN_BF16);
}

static void trainer(void) {
    test_write_shards(tmpdir, 4000, 1200, 41);
    if (!train("straight", -1, false) || !train("interrupted", 3, false) || !train("interrupted", -1, true)) return;
    const char *files[] = {"adapter_model.safetensors", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/straight/%s", tmpdir, files[i]);
        snprintf(b, sizeof b, "%s/interrupted/%s", tmpdir, files[i]);
        CHECK(test_same_file(a, b), "bf16 base, resumed: %s byte-identical to the uninterrupted run", files[i]);
    }
    /* the saved base: F32 (the default save dtype), every value bf16-exact */
    char p[700];
    snprintf(p, sizeof p, "%s/straight/model.safetensors", tmpdir);
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_st_open(p, &f));
    const kiln_st_tensor *q = f ? kiln_st_find(f, "model.layers.0.self_attn.q_proj.weight") : NULL;
    bool exact = q && q->dtype == KILN_F32;
    for (size_t j = 0; exact && j < q->nbytes / 4; j++) {
        float v = ((const float *)q->bytes)[j];
        exact = kiln_bf16_to_f32(kiln_f32_to_bf16(v)) == v;
    }
    CHECK(exact, "the saved base is F32 holding bf16 values");
    kiln_st_close(f);
    /* bf16 without LoRA is refused by the settings */
    kiln_train_config c;
    run_config(&c, "full", true, 0);
    kiln_trainer *t = NULL;
    CHECK(kiln_trainer_open(&c, false, &t) == KILN_ERR_INVALID && strstr(kiln_last_error(), "base_dtype bf16") &&
              strstr(kiln_last_error(), "lora_rank"),
          "base_dtype bf16 without LoRA refused: %s", kiln_last_error());
    kiln_trainer_free(t);
}

/* ---- the memory estimate behind --micro-batch auto ------------------------ */
static void estimate(void) {
    kiln_llama_config mc = test_tiny_config();
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    kiln_mem_estimate e[3];
    kiln_llama *m[3] = {kiln_llama_new(&mc, 1), lora_model(), lora_model()};
    CHECK_OK(kiln_llama_base_cast(m[2], KILN_BF16));
    const char *what[] = {"full fine-tuning", "LoRA r=4, fp32 base", "LoRA r=4, bf16 base"};
    int64_t adapters = 0, linears_bytes = 0, all = 0;
    for (int i = 0; i < m[0]->n_params; i++) {
        all += (int64_t)kiln_tensor_nbytes(m[0]->params[i]);
        if (is_linear(m[0]->params[i]->name)) linears_bytes += (int64_t)kiln_tensor_nbytes(m[0]->params[i]);
    }
    for (int i = m[1]->n_base; i < m[1]->n_params; i++) adapters += (int64_t)kiln_tensor_nbytes(m[1]->params[i]);
    for (int k = 0; k < 3; k++) {
        CHECK_OK(kiln_train_plan_bytes(m[k], 2, 32, &co, &e[k]));
        printf("  %-20s params %7lld  grads %7lld  AdamW %7lld  arena %8lld  total %lld bytes\n", what[k], (long long)e[k].params,
               (long long)e[k].grads, (long long)e[k].optim, (long long)e[k].arena_train, (long long)e[k].total);
    }
    CHECK(e[0].grads == all && e[0].optim == 2 * all, "full fine-tuning: gradients and two moments for every weight");
    CHECK(e[1].grads == adapters && e[1].optim == 2 * adapters && e[1].params == all + adapters,
          "LoRA: gradients and moments for the adapters only");
    CHECK(e[2].params == all + adapters - linears_bytes / 2 && e[2].grads == adapters,
          "bf16 base: the base linears count 2 bytes a weight");
    /* the held state shrinks everywhere; the whole estimate too where the
     * CPU multiplies bf16: where bf16 is emulated the plan holds rounded
     * activations in fp32 (twice bf16), which at this tiny model's size
     * outweighs the base's saving */
    int64_t held[3];
    for (int k = 0; k < 3; k++) held[k] = e[k].params + e[k].grads + e[k].optim;
    CHECK(held[1] < held[0] && held[2] < held[1], "the held state shrinks: %lld > %lld > %lld", (long long)held[0],
          (long long)held[1], (long long)held[2]);
    if (kiln_bf16_native())
        CHECK(e[1].total < e[0].total && e[2].total < e[1].total, "the estimate shrinks: %lld > %lld > %lld",
              (long long)e[0].total, (long long)e[1].total, (long long)e[2].total);
    else
        CHECK(e[1].total < e[0].total && e[2].arena_train > e[1].arena_train,
              "emulated bf16: the estimate shrinks to LoRA, and the bf16 base's plan holds its rounded operands in fp32: "
              "%lld > %lld, arena %lld > %lld", (long long)e[0].total, (long long)e[1].total, (long long)e[2].arena_train,
              (long long)e[1].arena_train);
    for (int k = 0; k < 3; k++) kiln_llama_free(m[k]);
}

int main(void) {
    kiln_eager_enable();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_lora_bf16_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    numerics();
    load_dtypes();
    trainer();
    estimate();
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
    TEST_END();
}
