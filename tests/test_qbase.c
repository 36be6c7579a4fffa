/* A frozen base held in ggml's block formats (and F16): --base-dtype
 * q8_0|q4_0|q4_k|q5_k|q6_k|f16. For each type, a LoRA model whose base
 * linears are quantized by kiln's quantizer (ggml's reference bytes,
 * test_quant) gives the loss and adapter gradients of the fp32 model whose
 * linears are those blocks dequantized (the same weights) to 1e-6, eager
 * and compiled; the base never gets a gradient; the dequantizing product
 * agrees with an fp32 GEMM on the dequantized matrix in both orientations
 * and across tile boundaries; the lookup of a quantized table equals
 * dequantized rows; bad uses are refused by name. */
#include <math.h>
#include <stdlib.h>
#include "kiln/eager.h"
#include "kiln/quant.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"
#include "test_runs.h"
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static kiln_llama_config qconfig(void) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    /* rows of 256 values: every block type fits */
    c.vocab_size = 97, c.hidden_size = 256, c.intermediate_size = 512, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64, c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    return c;
}

static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

/* the base linears of ref replaced by m's quantized ones, dequantized */
static void copy_dequantized(kiln_llama *ref, const kiln_llama *m) {
    for (int i = 0; i < m->n_base; i++) {
        if (m->params[i]->dtype == KILN_F32) continue;
        kiln_tensor *w = kiln_tensor_convert(m->params[i], KILN_F32);
        CHECK(w != NULL, "dequantize %s: %s", m->params[i]->name, kiln_last_error());
        if (w) memcpy(ref->params[i]->data, w->data, kiln_tensor_nbytes(w));
        kiln_tensor_release(w);
    }
}

static void numerics(kiln_dtype dt) {
    kiln_llama_config mc = qconfig();
    kiln_llama *ref = test_lora_model(&mc, 0), *m = test_lora_model(&mc, 0);
    int64_t before = 0, after = 0;
    for (int i = 0; i < m->n_params; i++) before += (int64_t)kiln_tensor_nbytes(m->params[i]);
    CHECK_OK(kiln_llama_base_cast(m, dt));
    int held = 0;
    for (int i = 0; i < m->n_params; i++) {
        held += m->params[i]->dtype == dt;
        after += (int64_t)kiln_tensor_nbytes(m->params[i]);
    }
    CHECK(held == 14, "%s: the 14 base linears are held as %s (%d)", kiln_dtype_name(dt), kiln_dtype_name(dt), held);
    copy_dequantized(ref, m);

    kiln_batch *b = kiln_batch_alloc(2, 24);
    test_fill_batch(b, 3, 97);
    kiln_tensor *in[4];
    test_step_inputs(b, 1.0f / (float)b->n_targets, in);
    int64_t n;
    double lr = test_loss_of(ref, in, true);
    float *gr = test_adapter_grads(ref, &n);
    double lm = test_loss_of(m, in, true);
    float *gm = test_adapter_grads(m, &n);
    double dg = rel_diff(gm, gr, n);
    int base_grads = 0;
    for (int i = 0; i < m->n_base; i++) base_grads += m->params[i]->grad != NULL;
    printf("  %-5s base: parameters %.2f -> %.2f MB; loss %.9f (dequantized fp32 %.9f, rel %.1e); adapter gradients rel %.1e\n",
           kiln_dtype_name(dt), before / 1e6, after / 1e6, lm, lr, t_rel(lm, lr), dg);
    CHECK(t_rel(lm, lr) < 1e-6 && dg < 1e-6, "%s base = its dequantized fp32 weights (loss rel %.2e, gradients %.2e)",
          kiln_dtype_name(dt), t_rel(lm, lr), dg);
    CHECK(base_grads == 0, "%s: no base weight has a gradient (%d)", kiln_dtype_name(dt), base_grads);

    /* under autocast: bf16 products on the dequantized rows, the reference's
     * bf16 products on the same weights (native and emulated) */
    for (int emu = 0; emu < 2; emu++) {
        kiln_bf16_force_emulation(emu);
        kiln_dtype was = kiln_autocast_set(KILN_BF16);
        double br = test_loss_of(ref, in, true);
        float *gbr = test_adapter_grads(ref, &n);
        double bm = test_loss_of(m, in, true);
        float *gbm = test_adapter_grads(m, &n);
        kiln_autocast_set(was);
        double db = rel_diff(gbm, gbr, n);
        printf("        bf16 products (%s): loss %.7f (reference %.7f, rel %.1e), adapter gradients rel %.1e\n",
               emu ? "emulated" : kiln_bf16_path(), bm, br, t_rel(bm, br), db);
        CHECK(t_rel(bm, br) < 1e-5 && db < 1e-3, "%s base under autocast (%s) = the reference's bf16 products (%.2e, %.2e)",
              kiln_dtype_name(dt), emu ? "emulated" : "native", t_rel(bm, br), db);
        free(gbr);
        free(gbm);
    }
    kiln_bf16_force_emulation(false);

    /* eager = compiled */
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    co.verify_graph = true;
    kiln_llama_zero_grad(m);
    kiln_compiled *cs = kiln_train_compile(m, &co, true);
    CHECK(cs != NULL, "compile with a %s base: %s", kiln_dtype_name(dt), kiln_last_error());
    if (cs) {
        float rep[1];
        CHECK_OK(kiln_compiled_run(cs, in, rep));
        float *gc = test_adapter_grads(m, &n);
        double lc = rep[0] / (double)b->n_targets, dc = rel_diff(gc, gm, n);
        printf("        compiled: loss %.9f (rel %.1e), adapter gradients rel %.1e\n", lc, t_rel(lc, lm), dc);
        /* fp32 sums in the fused kernels' order: 4e-7..1.06e-6 on a Zen 5 (AVX-512), as the families' 2.4e-6 */
        CHECK(t_rel(lc, lm) < 1e-6 && dc < 3e-6, "%s: compiled = eager (loss rel %.2e, gradients %.2e)", kiln_dtype_name(dt),
              t_rel(lc, lm), dc);
        free(gc);
        kiln_compiled_free(cs);
    }

    /* the merge: fp32 weights, the dequantized base plus the update, as the reference's merge */
    CHECK_OK(kiln_llama_lora_merge(m));
    CHECK_OK(kiln_llama_lora_merge(ref));
    bool same = m->n_params == ref->n_params;
    for (int i = 0; same && i < m->n_params; i++)
        same = m->params[i]->dtype == KILN_F32 && !memcmp(m->params[i]->data, ref->params[i]->data, kiln_tensor_nbytes(ref->params[i]));
    CHECK(same, "%s: merging into the quantized base = merging into its dequantized copy, bit for bit", kiln_dtype_name(dt));
    test_release_inputs(in);
    kiln_batch_free(b);
    free(gr);
    free(gm);
    kiln_llama_free(m);
    kiln_llama_free(ref);
}

/* the product in both orientations against an fp32 GEMM on the dequantized
 * matrix, with more rows than one tile so that tiles meet */
static void products(void) {
    const kiln_dtype types[] = {KILN_Q8_0, KILN_Q4_K, KILN_Q6_K};
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        kiln_dtype dt = types[k];
        int64_t N = 4200 + 16 * (int64_t)k, K = 512, M = 7; /* 4 MB tiles: 2048 rows of 512 */
        int64_t ws[2] = {N, K}, xs[2] = {M, K}, gs[2] = {M, N};
        kiln_tensor *W = kiln_tensor_new(KILN_F32, 2, ws), *x = kiln_tensor_new(KILN_F32, 2, xs), *g = kiln_tensor_new(KILN_F32, 2, gs);
        kiln_rng r = {11, 0};
        kiln_rng_normal(&r, kiln_f32(W), N * K, 0, 0.05f);
        kiln_rng_normal(&r, kiln_f32(x), M * K, 0, 1);
        kiln_rng_normal(&r, kiln_f32(g), M * N, 0, 1);
        kiln_tensor_set_name(W, "W");
        kiln_tensor *Wq = kiln_tensor_convert(W, dt), *Wd = Wq ? kiln_tensor_convert(Wq, KILN_F32) : NULL;
        CHECK(Wq && Wd, "convert: %s", kiln_last_error());
        if (!Wq || !Wd) continue;
        kiln_tensor *y = kiln_linear(x, Wq), *yr = kiln_linear(x, Wd);
        kiln_tensor *dx = kiln_matmul(g, Wq, KILN_MM_ROWS, false, false), *dxr = kiln_matmul(g, Wd, KILN_MM_ROWS, false, false);
        CHECK(y && yr && dx && dxr, "products: %s", kiln_last_error());
        if (y && yr && dx && dxr) {
            double e1 = rel_diff(kiln_f32(y), kiln_f32(yr), M * N), e2 = rel_diff(kiln_f32(dx), kiln_f32(dxr), M * K);
            printf("  %s product [%lld x %lld]: x W^T rel %.1e, g W rel %.1e (vs fp32 on the dequantized matrix)\n",
                   kiln_dtype_name(dt), (long long)N, (long long)K, e1, e2);
            CHECK(e1 < 1e-6 && e2 < 1e-6, "%s: dequantizing products = fp32 products (%.2e, %.2e)", kiln_dtype_name(dt), e1, e2);
        }
        /* the lookup of a quantized table */
        int64_t is[1] = {5};
        kiln_tensor *ids = kiln_tensor_new(KILN_I32, 1, is);
        int32_t pick[5] = {0, 4199, 17, 2048, 2047};
        memcpy(ids->data, pick, sizeof pick);
        kiln_tensor *e = kiln_embedding(Wq, ids), *er = kiln_embedding(Wd, ids);
        CHECK(e && er && !memcmp(e->data, er->data, kiln_tensor_nbytes(er)), "%s: lookup = dequantized rows, bit for bit",
              kiln_dtype_name(dt));
        /* a block weight as a's operand, or as a trainable weight, is refused */
        kiln_tensor *bad = kiln_matmul(Wq, x, KILN_MM_ROWS, false, true);
        CHECK(!bad && strstr(kiln_last_error(), "block weight"), "a block tensor as a's operand refused: %s", kiln_last_error());
        kiln_tensor_release(bad);
        Wq->requires_grad = true;
        kiln_tensor *yg = kiln_linear(x, Wq);
        kiln_tensor *s = yg ? kiln_sum(yg) : NULL;
        kiln_status bs = s ? kiln_backward(s) : kiln_last_status();
        CHECK(bs != KILN_OK && strstr(kiln_last_error(), "frozen"), "a gradient for a %s weight refused: %s", kiln_dtype_name(dt),
              kiln_last_error());
        Wq->requires_grad = false;
        kiln_tensor_release(s);
        kiln_tensor_release(yg);
        kiln_tensor_release(e);
        kiln_tensor_release(er);
        kiln_tensor_release(ids);
        kiln_tensor_release(y);
        kiln_tensor_release(yr);
        kiln_tensor_release(dx);
        kiln_tensor_release(dxr);
        kiln_tensor_release(Wq);
        kiln_tensor_release(Wd);
        kiln_tensor_release(W);
        kiln_tensor_release(x);
        kiln_tensor_release(g);
    }
}

static void refusals(void) {
    kiln_llama_config mc = test_tiny_config(); /* hidden 48: not whole blocks of 32 or 256 */
    kiln_llama *m = test_lora_model(&mc, 0);
    CHECK(kiln_llama_base_cast(m, KILN_Q4_K) != KILN_OK && strstr(kiln_last_error(), "whole blocks of 256"),
          "q4_k on rows of 48 refused: %s", kiln_last_error());
    kiln_llama_free(m);
    kiln_llama_config qc = qconfig();
    kiln_llama *plain = kiln_llama_new(&qc, 1);
    CHECK(kiln_llama_base_cast(plain, KILN_Q8_0) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--lora-rank"),
          "a quantized base without adapters refused: %s", kiln_last_error());
    kiln_llama_free(plain);
    kiln_llama *q = test_lora_model(&qc, 0);
    CHECK_OK(kiln_llama_base_cast(q, KILN_Q8_0));
    CHECK(kiln_llama_base_cast(q, KILN_Q4_K) == KILN_ERR_INVALID && strstr(kiln_last_error(), "already q8_0"),
          "requantizing a q8_0 base refused: %s", kiln_last_error());
    kiln_llama_free(q);
    int64_t s[2] = {4, 256};
    kiln_tensor *w = kiln_tensor_new(KILN_F32, 2, s);
    for (int64_t i = 0; i < 1024; i++) kiln_f32(w)[i] = i == 700 ? NAN : 0.5f;
    kiln_tensor_set_name(w, "w");
    kiln_tensor *c = kiln_tensor_convert(w, KILN_Q4_0);
    CHECK(!c && strstr(kiln_last_error(), "[2, 188]"), "a NaN is refused naming the element: %s", kiln_last_error());
    kiln_tensor_release(w);
}

/* a run on a q8_0 base (a config of rows of 64): checkpoints reference the
 * base (base.json, no model.safetensors), a resumed run is byte-identical
 * to the uninterrupted one, and a changed base is refused by its hash */
static void run_config(kiln_train_config *c, const char *run) {
    test_tiny_lora_run(c, tmpdir, run, "all");
    snprintf(c->model, sizeof c->model, "%s/q.config.json", tmpdir);
    c->base_dtype = KILN_Q8_0;
}

static bool train(const char *run, int64_t stop_at, bool resume) {
    kiln_train_config c;
    run_config(&c, run);
    return test_run_held(&c, stop_at, resume, KILN_Q8_0);
}

static void trainer(void) {
    kiln_llama_config mc = test_tiny_config();
    mc.hidden_size = 64, mc.intermediate_size = 96, mc.head_dim = 16;
    char p[700], q[700];
    snprintf(p, sizeof p, "%s/q.config.json", tmpdir);
    CHECK_OK(kiln_llama_config_save(p, &mc));
    test_write_shards(tmpdir, 4000, 1200, 41);
    if (!train("straight", -1, false) || !train("interrupted", 3, false) || !train("interrupted", -1, true)) return;
    snprintf(p, sizeof p, "%s/straight/adapter_model.safetensors", tmpdir);
    snprintf(q, sizeof q, "%s/interrupted/adapter_model.safetensors", tmpdir);
    CHECK(test_same_file(p, q), "q8_0 base, resumed: the adapters byte-identical to the uninterrupted run");
    char ck[600];
    snprintf(p, sizeof p, "%s/straight", tmpdir);
    CHECK_OK(kiln_checkpoint_latest(p, ck, sizeof ck));
    snprintf(p, sizeof p, "%s/model.safetensors", ck);
    snprintf(q, sizeof q, "%s/base.json", ck);
    struct stat sb;
    CHECK(stat(p, &sb) != 0 && stat(q, &sb) == 0, "the checkpoint references the q8_0 base (base.json) and copies no weights");
    kiln_llama *back = NULL;
    CHECK_OK(kiln_load_model_dir(ck, &back));
    CHECK(back && back->layers[1].down_proj->dtype == KILN_Q8_0 && back->lora_a, "the checkpoint loads as a q8_0 base plus adapters");
    kiln_llama_free(back);
    /* the hash catches a base that is not the run's */
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(q, &text, &n));
    char *h = text ? strstr(text, "\"hash\": \"") : NULL;
    if (h) {
        h[10] = h[10] == '0' ? '1' : '0';
        CHECK_OK(kiln_write_file_atomic(q, text, n));
        CHECK(kiln_load_model_dir(ck, &back) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "hashes"),
              "a base that hashes otherwise is refused: %s", kiln_last_error());
    }
    free(text);
}

/* the memory estimate behind --micro-batch auto counts a held base at its
 * block bytes */
static void estimate(void) {
    kiln_llama_config mc = qconfig();
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse("default", &co));
    const kiln_dtype dts[] = {KILN_F32, KILN_Q8_0, KILN_Q4_K};
    kiln_mem_estimate e[3];
    int64_t held[3] = {0};
    for (int k = 0; k < 3; k++) {
        kiln_llama *m = test_lora_model(&mc, 0);
        if (dts[k] != KILN_F32) CHECK_OK(kiln_llama_base_cast(m, dts[k]));
        int64_t bytes = 0;
        for (int i = 0; i < m->n_params; i++) bytes += (int64_t)kiln_tensor_nbytes(m->params[i]);
        for (int i = 0; i < m->n_base; i++) held[k] += kiln_dtype_is_dequant(m->params[i]->dtype) ? (int64_t)kiln_tensor_nbytes(m->params[i]) : 0;
        CHECK_OK(kiln_train_plan_bytes(m, 2, 32, &co, &e[k]));
        printf("  estimate, %-4s base: params %lld bytes (held %lld), total %lld\n", kiln_dtype_name(dts[k]), (long long)e[k].params,
               (long long)held[k], (long long)e[k].total);
        CHECK(e[k].params == bytes, "%s: the estimate counts the parameters' bytes (%lld vs %lld)", kiln_dtype_name(dts[k]),
              (long long)e[k].params, (long long)bytes);
        kiln_llama_free(m);
    }
    CHECK(e[1].params < e[0].params && e[2].params < e[1].params, "the estimate shrinks with the base: %lld > %lld > %lld",
          (long long)e[0].params, (long long)e[1].params, (long long)e[2].params);
}

int main(void) {
    kiln_eager_enable();
    const kiln_dtype types[] = {KILN_F16, KILN_Q8_0, KILN_Q4_0, KILN_Q4_1, KILN_Q5_0, KILN_Q5_1, KILN_Q4_K, KILN_Q5_K, KILN_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) numerics(types[i]);
    products();
    refusals();
    estimate();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_qbase_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    trainer();
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
    TEST_END();
}
