/* LoRA dropout (--lora-dropout P): the dropout op's mask statistics
 * (fraction dropped near P, kept values scaled by exactly 1 / (1 - P),
 * independent across instances and keys, the same on slices as whole),
 * adapter gradients with a fixed mask against finite differences, eager =
 * compiled (generated C and the interpreter's chunks) with dropout on, and
 * a resumed run bit-identical to the uninterrupted one; evaluation runs
 * without dropout. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/kernels.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"
#include "test_runs.h"

static kiln_tensor *key_tensor(float v) {
    int64_t one = 1;
    kiln_tensor *k = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(k)[0] = v;
    return k;
}

static void mask_stats(void) {
    const int64_t N = 1 << 18;
    kiln_tensor *x = kiln_tensor_new(KILN_F32, 1, &N);
    for (int64_t i = 0; i < N; i++) kiln_f32(x)[i] = 1.0f;
    kiln_tensor *k1 = key_tensor(12345.0f), *k2 = key_tensor(12346.0f);
    const double ps[] = {0.1, 0.5, 0.9};
    for (int q = 0; q < 3; q++) {
        double p = ps[q];
        kiln_tensor *a = kiln_dropout(x, k1, p, 3), *b = kiln_dropout(x, k1, p, 3), *c = kiln_dropout(x, k1, p, 4),
                    *d = kiln_dropout(x, k2, p, 3);
        CHECK(a && b && c && d, "dropout p=%g: %s", p, kiln_last_error());
        if (!a || !b || !c || !d) return;
        float keep = 1.0f / (1.0f - (float)p);
        int64_t dropped = 0, odd = 0, both_c = 0, both_d = 0;
        for (int64_t i = 0; i < N; i++) {
            float v = kiln_f32(a)[i];
            dropped += v == 0.0f;
            odd += v != 0.0f && v != keep;
            both_c += v == 0.0f && kiln_f32(c)[i] == 0.0f;
            both_d += v == 0.0f && kiln_f32(d)[i] == 0.0f;
        }
        double frac = (double)dropped / N, sd = sqrt(p * (1 - p) / N);
        double fc = (double)both_c / N, fd = (double)both_d / N, sd2 = sqrt(p * p * (1 - p * p) / N);
        printf("  p=%.1f: dropped %.5f (expect %.1f +- %.5f), both with another instance %.5f, another key %.5f (expect %.4f)\n", p,
               frac, p, sd, fc, fd, p * p);
        CHECK(fabs(frac - p) < 5 * sd, "p=%g: fraction dropped %.5f within 5 sigma", p, frac);
        CHECK(odd == 0, "p=%g: every kept value is exactly 1/(1-p) = %.9g (%lld are not)", p, keep, (long long)odd);
        CHECK(!memcmp(a->data, b->data, (size_t)N * 4), "p=%g: same key and instance, same mask", p);
        CHECK(fabs(fc - p * p) < 5 * sd2 && fabs(fd - p * p) < 5 * sd2, "p=%g: masks of other instances/keys independent", p);
        /* a slice run with its first index (how the interpreter runs chunks) drops what the whole run drops */
        float *part = malloc((size_t)N * 4);
        kiln_k_dropout(kiln_f32(x), 12345.0f, (float)p, 3, 0, part, N / 3);
        kiln_k_dropout(kiln_f32(x) + N / 3, 12345.0f, (float)p, 3, N / 3, part + N / 3, N - N / 3);
        CHECK(!memcmp(part, a->data, (size_t)N * 4), "p=%g: slices with offsets = the whole", p);
        free(part);
        kiln_tensor_release(a);
        kiln_tensor_release(b);
        kiln_tensor_release(c);
        kiln_tensor_release(d);
    }
    kiln_tensor *same = kiln_dropout(x, k1, 0, 1);
    CHECK(same == x, "p = 0 is the identity");
    kiln_tensor_release(same);
    kiln_attrs bad = {.f = {1.0}};
    kiln_tensor *in[2] = {x, k1};
    CHECK(!kiln_op_call(KILN_OP_DROPOUT, in, 2, &bad) && strstr(kiln_last_error(), "dropout"), "p = 1 refused: %s",
          kiln_last_error());
    kiln_tensor_release(x);
    kiln_tensor_release(k1);
    kiln_tensor_release(k2);
}

/* ---- a tiny LoRA model with non-zero B and dropout 0.3 ------------------ */
static kiln_llama *lora_model(double p) {
    kiln_llama_config mc = test_tiny_config();
    return test_lora_model(&mc, p);
}

static double loss_of(kiln_llama *m, kiln_tensor *const *in, bool backward) {
    kiln_llama_zero_grad(m);
    m->lora_key = in[4];
    kiln_tensor *sum = kiln_ce_loss(m, in[0], in[1], in[2], NULL);
    m->lora_key = NULL;
    kiln_tensor *loss = kiln_scale_by(sum, in[3]);
    double l = loss ? kiln_f32(loss)[0] : NAN;
    if (loss && backward) CHECK_OK(kiln_backward(loss));
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    return l;
}

static void gradients(void) {
    kiln_llama *m = lora_model(0.3);
    kiln_batch *b = kiln_batch_alloc(2, 24);
    test_fill_batch(b, 3, 61);
    kiln_tensor *in[5];
    test_step_inputs(b, 1.0f / (float)b->n_targets, in);
    in[4] = key_tensor(777.0f);
    /* dropout changes the loss; without the key it is off */
    kiln_tensor *off[5] = {in[0], in[1], in[2], in[3], NULL};
    double l_drop = loss_of(m, in, false), l_off = loss_of(m, off, false);
    printf("  loss with dropout 0.3 %.7f, without %.7f\n", l_drop, l_off);
    CHECK(l_drop != l_off, "dropout is applied in training");
    /* adapter gradients with the fixed mask vs central differences (quotient in double) */
    const char *probe[] = {"model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.1.mlp.down_proj.lora_A.weight",
                           "model.layers.0.mlp.up_proj.lora_B.weight", "model.layers.1.self_attn.o_proj.lora_A.weight"};
    double worst = 0;
    for (size_t k = 0; k < 4; k++) {
        loss_of(m, in, true);
        kiln_tensor *p = kiln_llama_param(m, probe[k]);
        if (!p || !p->grad) {
            CHECK(0, "no gradient for %s", probe[k]);
            continue;
        }
        int64_t at = 0;
        for (int64_t i = 0; i < kiln_tensor_numel(p); i++)
            if (fabsf(kiln_f32(p->grad)[i]) > fabsf(kiln_f32(p->grad)[at])) at = i;
        double an = kiln_f32(p->grad)[at];
        float keep = kiln_f32(p)[at], h = 3e-2f;
        kiln_f32(p)[at] = keep + h;
        double up = loss_of(m, in, false);
        kiln_f32(p)[at] = keep - h;
        double dn = loss_of(m, in, false);
        kiln_f32(p)[at] = keep;
        double fd = (up - dn) / (2.0 * ((double)(keep + h) - (double)keep));
        worst = fmax(worst, t_rel(an, fd));
        printf("  finite difference %s[%lld]: analytic %.6e, fd %.6e\n", probe[k], (long long)at, an, fd);
    }
    CHECK(worst < 5e-3, "adapter gradients with dropout vs finite differences: %.2e", worst);

    /* eager = compiled (generated C, and the interpreter's chunked groups) */
    loss_of(m, in, true);
    int64_t n = kiln_llama_num_params(m);
    float *ge = calloc((size_t)n, 4), *gc = calloc((size_t)n, 4);
    int64_t o = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i]->grad) memcpy(ge + o, m->params[i]->grad->data, kiln_tensor_nbytes(m->params[i]));
        o += kiln_tensor_numel(m->params[i]);
    }
    const char *modes[] = {"default", "interpret"};
    for (int k = 0; k < 2; k++) {
        kiln_compile_options co;
        kiln_compile_options_default(&co);
        CHECK_OK(kiln_compile_mode_parse(modes[k], &co));
        co.verify_graph = true;
        kiln_llama_zero_grad(m);
        kiln_compiled *cs = kiln_train_compile(m, &co, true);
        CHECK(cs != NULL, "compile %s: %s", modes[k], kiln_last_error());
        if (!cs) continue;
        float rep[1];
        CHECK_OK(kiln_compiled_run(cs, in, rep));
        const kiln_graph *g = kiln_compiled_graph(cs); /* the variant that ran */
        int drops = 0;
        for (int v = 0; g && v < g->n; v++) drops += g->v[v].kind == KILN_V_OP && !g->v[v].dead && g->v[v].op == KILN_OP_DROPOUT;
        memset(gc, 0, (size_t)n * 4);
        o = 0;
        for (int i = 0; i < m->n_params; i++) {
            if (m->params[i]->grad) memcpy(gc + o, m->params[i]->grad->data, kiln_tensor_nbytes(m->params[i]));
            o += kiln_tensor_numel(m->params[i]);
        }
        double lc = rep[0] / (double)b->n_targets, worst_g = 0, scale = 0;
        for (int64_t i = 0; i < n; i++) {
            worst_g = fmax(worst_g, fabs((double)gc[i] - ge[i]));
            scale = fmax(scale, fabs((double)ge[i]));
        }
        printf("  %s: %d dropout nodes, loss %.7f (eager %.7f), max gradient difference %.2e of %.2e\n", modes[k], drops, lc,
               l_drop, worst_g, scale);
        CHECK(drops >= 14, "%s: the graph has the 14 adapters' dropouts (and their backward) (%d)", modes[k], drops);
        CHECK(t_rel(lc, l_drop) < 1e-5, "%s: loss %.7f = eager %.7f", modes[k], lc, l_drop);
        CHECK(worst_g <= 1e-5 * scale, "%s: gradients = eager's (max difference %.2e)", modes[k], worst_g);
        kiln_compiled_free(cs);
    }
    free(ge);
    free(gc);
    kiln_tensor_release(in[4]);
    test_release_inputs(in);
    kiln_batch_free(b);
    kiln_llama_free(m);
}

/* ---- the trainer: resume bit-identical with dropout, eval without -------- */
static char tmpdir[256];

static int pack_mode = KILN_PACK_PADDED;
static void run_config(kiln_train_config *c, const char *run, double p, int compile) {
    test_tiny_lora_run(c, tmpdir, run, "all");
    c->compile = compile;
    c->pack = pack_mode;
    c->lora_dropout = p;
}

static bool train(const char *run, double p, int compile, int64_t stop_at, bool resume) {
    kiln_train_config c;
    run_config(&c, run, p, compile);
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, resume, &t));
    if (!t) return false;
    test_watch w = {t, stop_at, 0, 0, 0};
    CHECK_OK(kiln_trainer_run(t, test_watch_event, &w));
    kiln_trainer_free(t);
    return true;
}

static void trainer(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_lora_dropout_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    test_write_shards(tmpdir, 4000, 1200, 31);
    if (!train("straight", 0.2, KILN_RUN_EAGER, -1, false) || !train("nodrop", 0, KILN_RUN_EAGER, -1, false)) return;
    if (!train("interrupted", 0.2, KILN_RUN_EAGER, 3, false) || !train("interrupted", 0.2, KILN_RUN_EAGER, -1, true)) return;
    if (!train("compiled", 0.2, KILN_RUN_COMPILE_DEFAULT, -1, false)) return;
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/straight/adapter_model.safetensors", tmpdir);
    snprintf(b, sizeof b, "%s/interrupted/adapter_model.safetensors", tmpdir);
    CHECK(test_same_file(a, b), "resumed with dropout: adapters byte-identical to the uninterrupted run");
    snprintf(b, sizeof b, "%s/nodrop/adapter_model.safetensors", tmpdir);
    CHECK(!test_same_file(a, b), "dropout 0.2 trains other adapters than dropout 0");
    /* the compiled run: same masks, so the same adapters to float rounding */
    kiln_llama *ms = NULL, *mc = NULL;
    snprintf(a, sizeof a, "%s/straight", tmpdir);
    snprintf(b, sizeof b, "%s/compiled", tmpdir);
    char ra[1100], rb[1100];
    CHECK_OK(kiln_model_dir_resolve(a, ra, sizeof ra));
    CHECK_OK(kiln_model_dir_resolve(b, rb, sizeof rb));
    CHECK_OK(kiln_load_model_dir(ra, &ms));
    CHECK_OK(kiln_load_model_dir(rb, &mc));
    if (ms && mc) {
        kiln_llama *mn = NULL;
        snprintf(b, sizeof b, "%s/nodrop", tmpdir);
        CHECK_OK(kiln_model_dir_resolve(b, rb, sizeof rb));
        CHECK_OK(kiln_load_model_dir(rb, &mn));
        double d = test_weights_diff(mc, ms), dn = mn ? test_weights_diff(mn, ms) : 0;
        printf("  compiled vs eager run with dropout: max relative parameter difference %.2e (vs the run without dropout "
               "%.2e)\n", d, dn);
        CHECK(d < 1e-3 && dn > 30 * d, "compiled run with dropout = eager run (%.2e; without dropout %.2e)", d, dn);
        kiln_llama_free(mn);
        CHECK(ms->lora.dropout == 0.2, "lora_dropout 0.2 read back from adapter_config.json");
        /* evaluation runs without dropout: the same loss as with p = 0 */
        kiln_batch *vb = kiln_batch_alloc(2, 32);
        test_fill_batch(vb, 8, 61);
        double l1 = NAN, l2 = NAN;
        CHECK_OK(kiln_evaluate(ms, &vb, 1, &l1, NULL));
        ms->lora.dropout = 0;
        CHECK_OK(kiln_evaluate(ms, &vb, 1, &l2, NULL));
        CHECK(l1 == l2 && isfinite(l1), "eval ignores dropout (%.9g vs %.9g)", l1, l2);
        kiln_batch_free(vb);
    }
    kiln_llama_free(ms);
    kiln_llama_free(mc);
    /* packed documents: the key follows the positions and segment ids (a
     * seventh input); compiled = eager there too */
    pack_mode = KILN_PACK_DOCUMENTS;
    if (train("docs_eager", 0.2, KILN_RUN_EAGER, -1, false) && train("docs_compiled", 0.2, KILN_RUN_COMPILE_DEFAULT, -1, false)) {
        snprintf(a, sizeof a, "%s/docs_eager", tmpdir);
        snprintf(b, sizeof b, "%s/docs_compiled", tmpdir);
        CHECK_OK(kiln_model_dir_resolve(a, ra, sizeof ra));
        CHECK_OK(kiln_model_dir_resolve(b, rb, sizeof rb));
        ms = mc = NULL;
        CHECK_OK(kiln_load_model_dir(ra, &ms));
        CHECK_OK(kiln_load_model_dir(rb, &mc));
        double d = ms && mc ? test_weights_diff(mc, ms) : 1;
        printf("  packed documents with dropout: compiled vs eager max relative parameter difference %.2e\n", d);
        CHECK(d < 2e-3, "packed documents with dropout: compiled = eager (%.2e; compiled flash attention with segments vs eager's decomposition, through AdamW's first steps)", d);
        kiln_llama_free(ms);
        kiln_llama_free(mc);
    }
    pack_mode = KILN_PACK_PADDED;
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
}

int main(void) {
    kiln_eager_enable();
    mask_stats();
    gradients();
    trainer();
    TEST_END();
}
