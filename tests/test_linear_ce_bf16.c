/* The bf16 head fused with cross-entropy (LINEAR_CE with i3): the fused
 * kernel against eager's unfused bf16 matmul + cross-entropy on random data
 * (ignored targets, a gradient scale that is not a power of two, chunks
 * gathered and in place), the seed's place (rounding after scaling, as
 * eager; rounding before it is measurably different), and a bf16 model's
 * compiled step against eager bf16: loss and every gradient, with ignored
 * targets and gradient accumulation's scale, and a plan holding LINEAR_CE
 * and no [N, V] value. */
#include <stdlib.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/graph.h"
#include "kiln/kernels.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"

#define FIX "tests/fixtures/"

/* max |a - b| over max |b| */
static double max_rel(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

static void drop_grad(kiln_tensor *t) {
    kiln_tensor_release(t->grad);
    t->grad = NULL;
}

static kiln_tensor *rand_tensor(int nd, const int64_t *shape, uint64_t seed) {
    kiln_tensor *t = kiln_tensor_new(KILN_F32, nd, shape);
    kiln_rng r = {seed, 0};
    kiln_rng_uniform(&r, kiln_f32(t), kiln_tensor_numel(t), -1, 1);
    return t;
}

/* eager bf16: loss = CE(bf16 h·Wᵀ), backward of s·loss */
static double eager_head(kiln_tensor *h, kiln_tensor *W, kiln_tensor *t, float s, float *dh, float *dW) {
    kiln_eager_enable();
    h->requires_grad = W->requires_grad = true;
    drop_grad(h);
    drop_grad(W);
    int64_t one = 1;
    kiln_tensor *st = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(st)[0] = s;
    kiln_tensor *logits = kiln_matmul_prec(h, W, KILN_MM_ROWS, false, true, true);
    kiln_tensor *loss = kiln_cross_entropy(logits, t, KILN_IGNORE_INDEX);
    kiln_tensor *scaled = kiln_scale_by(loss, st);
    CHECK(scaled != NULL, "eager bf16 head: %s", kiln_last_error());
    double l = loss ? kiln_f32(loss)[0] : NAN;
    if (scaled) CHECK_OK(kiln_backward(scaled));
    memcpy(dh, h->grad->data, kiln_tensor_nbytes(h));
    memcpy(dW, W->grad->data, kiln_tensor_nbytes(W));
    kiln_tensor *rel[] = {st, logits, loss, scaled};
    for (int i = 0; i < 4; i++) kiln_tensor_release(rel[i]);
    h->requires_grad = W->requires_grad = false;
    drop_grad(h);
    drop_grad(W);
    kiln_eager_disable();
    return l;
}

static void check_kernel(int64_t N, int64_t C, int64_t V, int64_t chunk, bool ignore) {
    int64_t sh[2] = {N, C}, sw[2] = {V, C};
    kiln_tensor *h = rand_tensor(2, sh, 11 + (uint64_t)N), *W = rand_tensor(2, sw, 13 + (uint64_t)V);
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 1, &N);
    for (int64_t n = 0; n < N; n++)
        kiln_i32(t)[n] = ignore && (n % 5 == 2 || n == N - 1) ? KILN_IGNORE_INDEX : (int32_t)((n * 37 + 3) % V);
    const float s = 1.0f / 37.0f; /* accumulation's 1/tokens: not a power of two */
    float *rdh = malloc((size_t)(N * C) * 4), *rdW = malloc((size_t)(V * C) * 4);
    double rl = eager_head(h, W, t, s, rdh, rdW);
    float *dh = malloc((size_t)(N * C) * 4), *dW = malloc((size_t)(V * C) * 4);
    float *uh = malloc((size_t)(N * C) * 4), *uW = malloc((size_t)(V * C) * 4);
    int64_t cnt = 0;
    kiln_lce_opts o = {.seed = s, .bf16 = true};
    double l = kiln_k_linear_cross_entropy_ex(kiln_f32(h), kiln_f32(W), kiln_i32(t), N, C, V, KILN_IGNORE_INDEX, chunk, &cnt,
                                              dh, dW, &o);
    /* the same rounded before the scaling (what a seed-1 op followed by a
     * scale_by computes): different numbers unless s were a power of two */
    kiln_lce_opts u = {.seed = 1.0f, .bf16 = true};
    kiln_k_linear_cross_entropy_ex(kiln_f32(h), kiln_f32(W), kiln_i32(t), N, C, V, KILN_IGNORE_INDEX, chunk, NULL, uh, uW, &u);
    for (int64_t i = 0; i < N * C; i++) uh[i] *= s;
    for (int64_t i = 0; i < V * C; i++) uW[i] *= s;
    double eh = max_rel(dh, rdh, N * C), ew = max_rel(dW, rdW, V * C);
    double uh_e = max_rel(uh, rdh, N * C), uw_e = max_rel(uW, rdW, V * C);
    printf("  N=%lld C=%lld V=%lld chunk=%lld%s: loss rel %.2e; dh %.2e dW %.2e (rounded before scaling: %.2e %.2e)\n",
           (long long)N, (long long)C, (long long)V, (long long)chunk, ignore ? " ignored rows" : "", t_rel(l, rl), eh, ew,
           uh_e, uw_e);
    CHECK(t_rel(l, rl) < 1e-6, "fused bf16 loss = eager bf16 (%.9g vs %.9g)", l, rl);
    CHECK(eh < 1e-5 && ew < 1e-5, "fused bf16 dh, dW = eager bf16 to float rounding (%.3g, %.3g)", eh, ew);
    CHECK(fmax(uh_e, uw_e) > 10 * fmax(fmax(eh, ew), 1e-7), "the seed's place is visible: rounding before scaling differs (%.3g)",
          fmax(uh_e, uw_e));
    /* fp32 (the existing op) unchanged: seed 1 through _ex is the plain call */
    float *fh = malloc((size_t)(N * C) * 4), *fh2 = malloc((size_t)(N * C) * 4);
    double f1 = kiln_k_linear_cross_entropy(kiln_f32(h), kiln_f32(W), kiln_i32(t), N, C, V, KILN_IGNORE_INDEX, chunk, NULL, fh,
                                            NULL);
    double f2 = kiln_k_linear_cross_entropy_ex(kiln_f32(h), kiln_f32(W), kiln_i32(t), N, C, V, KILN_IGNORE_INDEX, chunk, NULL,
                                               fh2, NULL, NULL);
    CHECK(f1 == f2 && !memcmp(fh, fh2, (size_t)(N * C) * 4), "opts NULL is the fp32 seed-1 kernel");
    CHECK(t_rel(f1, l) > 0, "bf16 changes the loss");
    free(rdh), free(rdW), free(dh), free(dW), free(uh), free(uW), free(fh), free(fh2);
    kiln_tensor_release(h);
    kiln_tensor_release(W);
    kiln_tensor_release(t);
}

/* ---- a bf16 model: compiled step vs eager ------------------------------------ */
typedef struct {
    kiln_llama *m;
    kiln_st_file *f;
    kiln_tensor *ids, *mask, *labels, *scale;
    int64_t count, N, V;
} fixture;

static bool fixture_open(fixture *x) {
    memset(x, 0, sizeof *x);
    kiln_llama_config cfg;
    if (!test_fixture_model(FIX "tiny_gqa.config.json", FIX "tiny_gqa.safetensors", &cfg, &x->m, &x->f)) return false;
    const kiln_st_tensor *ids = kiln_st_find(x->f, "input_ids"), *lab = kiln_st_find(x->f, "labels"),
                         *mask = kiln_st_find(x->f, "attention_mask");
    if (!ids || !lab || !mask) return false;
    x->ids = kiln_tensor_wrap((void *)ids->bytes, KILN_I32, 2, ids->shape);
    x->mask = kiln_tensor_wrap((void *)mask->bytes, KILN_I32, 2, mask->shape);
    /* the fixture's labels with more ignored targets (every 4th) */
    x->labels = kiln_tensor_new(KILN_I32, 2, lab->shape);
    memcpy(x->labels->data, lab->bytes, lab->nbytes);
    x->N = kiln_tensor_numel(x->labels);
    x->V = cfg.vocab_size;
    for (int64_t i = 0; i < x->N; i++) {
        if (i % 4 == 1) kiln_i32(x->labels)[i] = KILN_IGNORE_INDEX;
        x->count += kiln_i32(x->labels)[i] != KILN_IGNORE_INDEX;
    }
    int64_t one = 1;
    x->scale = kiln_tensor_new(KILN_F32, 1, &one);
    /* gradient accumulation over 3 micro-batches, normalised by tokens */
    kiln_f32(x->scale)[0] = 1.0f / (3.0f * (float)x->count);
    return true;
}

static void fixture_close(fixture *x) {
    kiln_tensor *t[] = {x->ids, x->mask, x->labels, x->scale};
    for (int i = 0; i < 4; i++) kiln_tensor_release(t[i]);
    kiln_llama_free(x->m);
    kiln_st_close(x->f);
}

static float **grab(kiln_llama *m) {
    float **g = calloc((size_t)m->n_params, sizeof *g);
    for (int i = 0; i < m->n_params; i++) {
        g[i] = calloc(1, kiln_tensor_nbytes(m->params[i]));
        if (m->params[i]->grad) memcpy(g[i], m->params[i]->grad->data, kiln_tensor_nbytes(m->params[i]));
    }
    return g;
}
static void free_grads(float **g, int n) {
    for (int i = 0; g && i < n; i++) free(g[i]);
    free(g);
}

static double eager_model(fixture *x, float ***grads) {
    kiln_eager_enable();
    kiln_llama_zero_grad(x->m);
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    kiln_tensor *sum = kiln_ce_loss(x->m, x->ids, x->labels, x->mask, NULL);
    kiln_tensor *loss = kiln_scale_by(sum, x->scale);
    CHECK(loss != NULL, "eager bf16 loss: %s", kiln_last_error());
    if (loss) CHECK_OK(kiln_backward(loss));
    kiln_autocast_set(old);
    double l = sum ? kiln_f32(sum)[0] : NAN;
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    *grads = grab(x->m);
    kiln_eager_disable();
    return l;
}

/* The plan holds one bf16 LINEAR_CE, seeded, whose gradients nothing
 * scales afterwards, and no [N, V] value. */
static void check_plan(const kiln_graph *g, const fixture *x, const char *what) {
    int lce = 0, nv = 0, scaled = 0;
    for (int i = 0; i < g->n; i++) {
        const kiln_value *v = &g->v[i];
        if (v->dead) continue;
        if (v->kind == KILN_V_OP && v->op == KILN_OP_LINEAR_CE) {
            lce++;
            CHECK(v->attrs.i[3] == 1 && v->attrs.i[4] == 1 && v->n_in == 4, "%s: the head is bf16 and seeded (i3 %lld, i4 %lld)",
                  what, (long long)v->attrs.i[3], (long long)v->attrs.i[4]);
            for (int j = i + 1; j < g->n; j++)
                for (int q = 0; q < g->v[j].n_in && g->v[j].kind == KILN_V_OP && !g->v[j].dead; q++)
                    scaled += g->v[j].op == KILN_OP_SCALE_BY && (g->v[j].in[q] == v->aux_of[0] || g->v[j].in[q] == v->aux_of[1]);
        }
        if (v->meta.ndim >= 1 && v->meta.shape[v->meta.ndim - 1] == x->V && kiln_meta_numel(&v->meta) == x->N * x->V) nv++;
    }
    printf("  %s plan: %d linear_cross_entropy, %d [N, V] values, arena %.3f MB\n", what, lce, nv, g->arena_bytes / 1e6);
    CHECK(lce == 1, "%s: one fused bf16 head (%d)", what, lce);
    CHECK(nv == 0, "%s: no [N, V] logits or their gradient (%d)", what, nv);
    CHECK(scaled == 0, "%s: the head's gradients are not scaled after the fact", what);
}

static kiln_status step_fn(void *user, kiln_tensor *const *in, kiln_tensor **report, int *n_report, kiln_tensor **diff) {
    return kiln_train_trace_step(user, in, report, n_report, diff);
}

/* The joint graph with the head rewrite alone (attention as eager runs it),
 * interpreted: differences from eager are the fused head's alone. */
static double interp_model(fixture *x, bool rewrite_lce, float ***grads, int64_t *arena) {
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    kiln_graph_options o;
    kiln_graph_options_default(&o);
    o.rewrite_attention = false;
    o.rewrite_linear_ce = rewrite_lce;
    o.verify = true;
    kiln_graph *g = NULL;
    kiln_tensor *in[4] = {x->ids, x->labels, x->mask, x->scale};
    CHECK_OK(kiln_graph_build(step_fn, x->m, x->m->params, x->m->n_params, in, 4, &o, &g));
    kiln_autocast_set(old);
    if (!g) return NAN;
    if (rewrite_lce) check_plan(g, x, "interpreted (head rewrite only)");
    *arena = g->arena_bytes;
    kiln_interp *r = NULL;
    float rep[1] = {NAN};
    CHECK_OK(kiln_interp_new(g, &r));
    kiln_llama_zero_grad(x->m);
    if (r) CHECK_OK(kiln_interp_run(r, in, rep));
    *grads = grab(x->m);
    kiln_interp_free(r);
    kiln_graph_free(g);
    return rep[0];
}

static double compiled_model(fixture *x, const char *mode, float ***grads) {
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse(mode, &co));
    kiln_compiled *cs = kiln_train_compile(x->m, &co, true);
    CHECK(cs != NULL, "compile bf16: %s", kiln_last_error());
    float rep[1] = {NAN};
    kiln_tensor *in[4] = {x->ids, x->labels, x->mask, x->scale};
    kiln_llama_zero_grad(x->m);
    if (cs) {
        CHECK_OK(kiln_compiled_run(cs, in, rep)); /* builds the plan */
        if (kiln_compiled_graph(cs)) check_plan(kiln_compiled_graph(cs), x, mode);
        else CHECK(0, "the compiled step keeps its graph");
    }
    kiln_autocast_set(old); /* the step is traced at its first run, under autocast */
    kiln_compiled_free(cs);
    *grads = grab(x->m);
    return rep[0];
}

/* worst max-relative difference over all parameters; the head's apart */
static double worst(const fixture *x, float **a, float **b, const char **name, double *head) {
    double w = 0;
    *head = 0;
    for (int i = 0; i < x->m->n_params; i++) {
        double e = max_rel(a[i], b[i], kiln_tensor_numel(x->m->params[i]));
        if (x->m->params[i] == x->m->lm_head) *head = e;
        if (e > w) w = e, *name = x->m->params[i]->name;
    }
    return w;
}

static void check_model(void) {
    fixture x;
    if (!fixture_open(&x)) {
        CHECK(0, "fixture tiny_gqa loads");
        fixture_close(&x);
        return;
    }
    int np = x.m->n_params;
    float **ge = NULL, **gi = NULL, **gu = NULL, **gc = NULL;
    double le = eager_model(&x, &ge);
    int64_t arena_fused = 0, arena_unfused = 0;
    double li = interp_model(&x, true, &gi, &arena_fused);
    double lu = interp_model(&x, false, &gu, &arena_unfused);
    double lc = compiled_model(&x, "default", &gc);
    float **gr = NULL; /* the whole step as one generated function */
    double lr = compiled_model(&x, "reduce-overhead", &gr);
    const char *n1 = "", *n2 = "", *n3 = "";
    double hi, hu, hc;
    double wi = worst(&x, gi, ge, &n1, &hi), wu = worst(&x, gu, ge, &n2, &hu), wc = worst(&x, gc, ge, &n3, &hc);
    printf("  eager bf16 loss sum %.7f (%lld targets of %lld, scale 1/%.0f)\n", le, (long long)x.count, (long long)x.N,
           1.0 / kiln_f32(x.scale)[0]);
    printf("  fused head, attention unfused: loss rel %.2e, worst gradient max-rel %.2e (%s), lm_head %.2e\n", t_rel(li, le), wi,
           n1, hi);
    printf("  unfused bf16 plan:             loss rel %.2e, worst gradient max-rel %.2e (%s), lm_head %.2e\n", t_rel(lu, le), wu,
           n2, hu);
    printf("  compiled default (flash attention too): loss rel %.2e, worst gradient max-rel %.2e (%s), lm_head %.2e\n",
           t_rel(lc, le), wc, n3, hc);
    printf("  arena: fused head %.3f MB, unfused %.3f MB\n", arena_fused / 1e6, arena_unfused / 1e6);
    CHECK(t_rel(li, le) < 1e-6, "fused bf16 head: loss = eager bf16 (%.3g)", t_rel(li, le));
    CHECK(wi < 1e-4, "fused bf16 head: every gradient = eager bf16 to float rounding (%s: %.3g)", n1, wi);
    CHECK(hi < 1e-5, "fused bf16 head: lm_head gradient = eager bf16 (%.3g)", hi);
    CHECK(arena_fused < arena_unfused, "the fused head's plan is smaller (%lld vs %lld)", (long long)arena_fused,
          (long long)arena_unfused);
    /* flash attention rounds elsewhere than eager's bf16 attention products
     * (unnormalised probabilities on AMX, nothing where it runs its fp32
     * products): equal to bf16 rounding (test_bf16 bounds it the same way) */
    CHECK(t_rel(lc, le) < 1e-4, "compiled bf16 loss = eager bf16 to bf16 rounding (%.3g)", t_rel(lc, le));
    CHECK(wc < 2e-2, "compiled bf16 gradients = eager bf16 to bf16 rounding (%s: %.3g)", n3, wc);
    const char *n4 = "";
    double hr, wr = worst(&x, gr, ge, &n4, &hr);
    printf("  compiled reduce-overhead: loss rel %.2e, worst gradient max-rel %.2e (%s)\n", t_rel(lr, le), wr, n4);
    CHECK(t_rel(lr, le) < 1e-4 && wr < 2e-2, "reduce-overhead bf16 = eager bf16 (loss %.3g, %s %.3g)", t_rel(lr, le), n4, wr);
    free_grads(gr, np);
    /* the memory estimate counts the fused head's scratch (its rounded W
     * and one chunk of logits), not an N×V operand */
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_mem_estimate e;
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    CHECK_OK(kiln_train_plan_bytes(x.m, (int)x.ids->shape[0], (int)x.ids->shape[1], &co, &e));
    kiln_autocast_set(old);
    int64_t C = x.m->cfg.hidden_size;
    size_t lce = kiln_k_linear_cross_entropy_scratch(x.N, C, x.V, 0, true);
    printf("  estimate: scratch %lld bytes, the fused head's %zu\n", (long long)e.scratch, lce);
    CHECK(e.scratch >= (int64_t)lce, "the estimate holds the fused bf16 head's scratch (%lld < %zu)", (long long)e.scratch, lce);
    free_grads(ge, np), free_grads(gi, np), free_grads(gu, np), free_grads(gc, np);
    fixture_close(&x);
}

/* The op: a seeded call gives the seeded gradients; it is past autograd. */
static void check_op(void) {
    int64_t N = 19, C = 16, V = 33, sh[2] = {N, C}, sw[2] = {V, C}, one = 1;
    kiln_tensor *h = rand_tensor(2, sh, 3), *W = rand_tensor(2, sw, 4), *t = kiln_tensor_new(KILN_I32, 1, &N);
    kiln_tensor *s = kiln_tensor_new(KILN_F32, 1, &one);
    for (int64_t n = 0; n < N; n++) kiln_i32(t)[n] = n == 4 ? KILN_IGNORE_INDEX : (int32_t)((n * 7) % V);
    kiln_f32(s)[0] = 0.3f;
    kiln_attrs a = {.i = {KILN_IGNORE_INDEX, 1, 1, 1, 1}};
    kiln_tensor *in[4] = {h, W, t, s}, *aux[2] = {0};
    kiln_tensor *l = kiln_op_call_aux(KILN_OP_LINEAR_CE, in, 4, &a, aux);
    CHECK(l && aux[0] && aux[1], "seeded bf16 linear_cross_entropy runs: %s", kiln_last_error());
    float *rdh = malloc((size_t)(N * C) * 4), *rdW = malloc((size_t)(V * C) * 4);
    double rl = eager_head(h, W, t, 0.3f, rdh, rdW);
    if (l) {
        CHECK(t_rel(kiln_f32(l)[0], rl) < 1e-6, "op loss = eager bf16 (%.9g vs %.9g)", kiln_f32(l)[0], rl);
        CHECK(max_rel(kiln_f32(aux[0]), rdh, N * C) < 1e-5 && max_rel(kiln_f32(aux[1]), rdW, V * C) < 1e-5,
              "op gradients = eager bf16 of 0.3·loss");
    }
    kiln_attrs bad = a;
    bad.i[4] = 0;
    CHECK(kiln_op_call(KILN_OP_LINEAR_CE, in, 4, &bad) == NULL && strstr(kiln_last_error(), "not announced"),
          "a seed without i4 is refused: %s", kiln_last_error());
    kiln_tensor_release(l), kiln_tensor_release(aux[0]), kiln_tensor_release(aux[1]);
    free(rdh), free(rdW);
    kiln_tensor *rel[] = {h, W, t, s};
    for (int i = 0; i < 4; i++) kiln_tensor_release(rel[i]);
}

int main(void) {
    char dir[64];
    if (!t_tmpdir(dir, sizeof dir, "test_lce_bf16")) return 1;
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("KILN_CACHE_DIR", cache, 1);
    printf("  bf16 path: %s\n", kiln_bf16_path());
    check_kernel(37, 24, 61, 16, true);  /* gathered chunks */
    check_kernel(37, 24, 61, 0, false);  /* one chunk in place */
    check_kernel(64, 32, 300, 7, true);  /* many small chunks */
    check_op();
    check_model();
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
