/* The graph compiler's core against eager: a traced joint forward+backward
 * graph, with and without the rewrites (flash attention, fused linear +
 * cross-entropy), run by the interpreter with the memory plan on and off. */
#include <stdlib.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "kiln/graph.h"
#include "kiln/model.h"
#include "kiln/safetensors.h"
#include "test.h"

#define FIX "tests/fixtures/"

/* inputs: ids, targets, pad mask, scale[1]; reports the loss sum and
 * differentiates scale * sum */
static kiln_status step_fn(void *user, kiln_tensor *const *in, kiln_tensor **report, int *n_report, kiln_tensor **diff) {
    kiln_llama *m = user;
    kiln_tensor *sum = kiln_ce_loss(m, in[0], in[1], in[2], NULL);
    if (!sum) return kiln_last_status();
    report[0] = sum;
    *n_report = 1;
    if (diff && !(*diff = kiln_scale_by(sum, in[3]))) return kiln_last_status();
    return KILN_OK;
}

typedef struct {
    kiln_llama *m;
    kiln_tensor *ids, *labels, *mask, *scale;
    kiln_st_file *f;
} setup;

static bool load(setup *s, const char *name, bool freeze_embed) {
    char path[256];
    kiln_llama_config cfg;
    snprintf(path, sizeof path, FIX "%s.config.json", name);
    if (kiln_llama_config_load(path, &cfg)) return false;
    snprintf(path, sizeof path, FIX "%s.safetensors", name);
    if (kiln_st_open(path, &s->f)) return false;
    s->m = kiln_llama_new(&cfg, 1);
    for (int i = 0; i < s->m->n_params; i++) {
        const kiln_st_tensor *t = kiln_st_find(s->f, s->m->params[i]->name);
        memcpy(s->m->params[i]->data, t->bytes, t->nbytes);
    }
    if (freeze_embed) kiln_llama_set_trainable(s->m, "model.embed_tokens.*", false);
    const kiln_st_tensor *ids = kiln_st_find(s->f, "input_ids"), *lab = kiln_st_find(s->f, "labels"),
                         *mask = kiln_st_find(s->f, "attention_mask");
    s->ids = kiln_tensor_wrap((void *)ids->bytes, KILN_I32, 2, ids->shape);
    s->labels = kiln_tensor_wrap((void *)lab->bytes, KILN_I32, 2, lab->shape);
    s->mask = kiln_tensor_wrap((void *)mask->bytes, KILN_I32, 2, mask->shape);
    int64_t one = 1;
    s->scale = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(s->scale)[0] = 1.0f / 77.0f;
    return true;
}

static void unload(setup *s) {
    kiln_tensor_release(s->ids);
    kiln_tensor_release(s->labels);
    kiln_tensor_release(s->mask);
    kiln_tensor_release(s->scale);
    kiln_llama_free(s->m);
    kiln_st_close(s->f);
}

/* grads of every parameter, concatenated (missing grads as zeros) */
static float *grab_grads(kiln_llama *m, int64_t *n) {
    int64_t total = kiln_llama_num_params(m), o = 0;
    float *g = calloc((size_t)total, sizeof *g);
    for (int i = 0; i < m->n_params; i++) {
        int64_t k = kiln_tensor_numel(m->params[i]);
        if (m->params[i]->grad) memcpy(g + o, m->params[i]->grad->data, (size_t)k * sizeof(float));
        o += k;
    }
    *n = total;
    return g;
}

static double max_rel(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

static void compare(const char *name, bool rewrites, bool freeze) {
    setup s = {0};
    CHECK(load(&s, name, freeze), "load %s: %s", name, kiln_last_error());
    if (!s.m) return;
    kiln_tensor *in[4] = {s.ids, s.labels, s.mask, s.scale};
    /* eager reference */
    kiln_eager_enable();
    kiln_llama_zero_grad(s.m);
    kiln_tensor *sum = kiln_ce_loss(s.m, s.ids, s.labels, s.mask, NULL);
    kiln_tensor *scaled = kiln_scale_by(sum, s.scale);
    CHECK_OK(kiln_backward(scaled));
    float eager_loss = kiln_f32(sum)[0];
    kiln_tensor_release(sum);
    kiln_tensor_release(scaled);
    int64_t n;
    float *ge = grab_grads(s.m, &n);
    kiln_eager_disable();

    float reports[2][2];
    float *gg[2];
    for (int reuse = 0; reuse < 2; reuse++) {
        kiln_graph_options o;
        kiln_graph_options_default(&o);
        o.rewrite_attention = o.rewrite_linear_ce = rewrites;
        o.reuse_memory = reuse;
        o.verify = true;
        kiln_graph *g = NULL;
        CHECK_OK(kiln_graph_build(step_fn, s.m, s.m->params, s.m->n_params, in, 4, &o, &g));
        if (!g) return;
        kiln_interp *r = NULL;
        CHECK_OK(kiln_interp_new(g, &r));
        kiln_llama_zero_grad(s.m);
        CHECK_OK(kiln_interp_run(r, in, reports[reuse]));
        gg[reuse] = grab_grads(s.m, &n);
        if (reuse) {
            printf("%s%s%s: %d nodes, arena %.2f MB vs %.2f MB unplanned\n", name, rewrites ? " +rewrites" : "",
                   freeze ? " (frozen embedding)" : "", kiln_graph_live_nodes(g), g->arena_bytes / 1e6, g->unplanned_bytes / 1e6);
            CHECK(g->arena_bytes < g->unplanned_bytes, "the plan reuses memory");
            int multi = 0, internal = 0;
            for (int k = 0; k < g->n_groups; k++) multi += g->group_start[k + 1] - g->group_start[k] > 1;
            for (int i = 0; i < g->n; i++) internal += !g->v[i].dead && g->v[i].internal;
            printf("  %d element-wise groups, %d fused (2+ ops), %d values never stored\n", g->n_groups, multi, internal);
            CHECK(multi > 0 && internal > 0, "fusion formed groups and kept values out of memory");
        }
        if (rewrites) {
            int flash = 0, lce = 0;
            for (int i = 0; i < g->n; i++)
                if (!g->v[i].dead && g->v[i].kind == KILN_V_OP) {
                    flash += g->v[i].op == KILN_OP_FLASH_ATTN;
                    lce += g->v[i].op == KILN_OP_LINEAR_CE;
                    CHECK(g->v[i].op != KILN_OP_SOFTMAX, "no softmax left after the attention rewrite");
                }
            CHECK(flash == (int)s.m->cfg.num_hidden_layers && lce == 1, "rewrites: %d flash, %d linear-CE", flash, lce);
        }
        kiln_interp_free(r);
        kiln_graph_free(g);
    }
    double dl = t_rel(reports[1][0], eager_loss), dg = max_rel(gg[1], ge, n);
    printf("  loss %.7f vs eager %.7f (rel %.2e), gradients max rel diff %.2e\n", reports[1][0], eager_loss, dl, dg);
    CHECK(dl < 1e-5, "%s: compiled loss matches eager (%.3g)", name, dl);
    CHECK(dg < (rewrites ? 1e-4 : 1e-6), "%s: compiled gradients match eager (%.3g)", name, dg);
    CHECK(reports[0][0] == reports[1][0] && memcmp(gg[0], gg[1], (size_t)n * sizeof(float)) == 0,
          "%s: memory reuse on and off give identical bits", name);
    if (freeze) CHECK(s.m->embed_tokens->grad == NULL, "frozen parameter gets no gradient");
    free(ge);
    free(gg[0]);
    free(gg[1]);
    unload(&s);
}

/* With bf16 autocast, operands are cast once and the casts fuse into their
 * producers: the fp32 RMSNorm output and SwiGLU product never reach memory.
 * The cast is cast_bf16 where the CPU multiplies bf16, round_bf16 (rounded,
 * held fp32) where the products are emulated; the graph says which. */
static void bf16_casts(void) {
    setup s = {0};
    CHECK(load(&s, "tiny_gqa", false), "load: %s", kiln_last_error());
    if (!s.m) return;
    kiln_tensor *in[4] = {s.ids, s.labels, s.mask, s.scale};
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    kiln_graph_options o;
    kiln_graph_options_default(&o);
    o.verify = true;
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_build(step_fn, s.m, s.m->params, s.m->n_params, in, 4, &o, &g));
    kiln_autocast_set(old);
    if (!g) return;
    int norm_cast = 0, mul_cast = 0, casts = 0, shared = 0;
    for (int k = 0; k < g->n_groups; k++) {
        bool has_cast = false, norm_internal = false, mul_internal = false;
        for (int m = g->group_start[k]; m < g->group_start[k + 1]; m++) {
            const kiln_value *x = &g->v[g->group_members[m]];
            has_cast |= x->op == KILN_OP_CAST_BF16 || x->op == KILN_OP_ROUND_BF16;
            norm_internal |= x->op == KILN_OP_RMSNORM && x->internal;
            mul_internal |= x->op == KILN_OP_MUL && x->internal;
        }
        norm_cast += has_cast && norm_internal;
        mul_cast += has_cast && mul_internal;
    }
    for (int i = 0; i < g->n; i++) {
        if (g->v[i].dead || g->v[i].kind != KILN_V_OP ||
            (g->v[i].op != KILN_OP_CAST_BF16 && g->v[i].op != KILN_OP_ROUND_BF16))
            continue;
        casts++;
        int readers = 0;
        for (int j = i + 1; j < g->n; j++)
            for (int q = 0; q < g->v[j].n_in; q++) readers += !g->v[j].dead && g->v[j].in[q] == i;
        shared += readers > 1;
    }
    printf("bf16: %d casts (%d read by several products), %d add+rmsnorm+cast and %d silu*gate+cast kernels\n", casts, shared,
           norm_cast, mul_cast);
    int L = (int)s.m->cfg.num_hidden_layers;
    /* 2L norms feed bf16 products; the final one (2L + 1) feeds the fused
     * bf16 head, which rounds h itself chunk by chunk: no cast there */
    CHECK(norm_cast >= 2 * L - 1 && mul_cast >= L, "casts fuse into RMSNorm and SwiGLU kernels (%d, %d)", norm_cast, mul_cast);
    CHECK(shared > 0, "one cast serves several products (forward and backward)");
    kiln_graph_free(g);
    unload(&s);
}

/* kiln_graph_verify accepts every built graph (above, after every pass) and
 * rejects each kind of broken IR, naming the rule. */
static int find_op(const kiln_graph *g, int op, int from) {
    for (int i = from; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind == KILN_V_OP && g->v[i].op == op) return i;
    return -1;
}
static void expect_broken(kiln_graph *g, const char *what, const char *needle) {
    kiln_status st = kiln_graph_verify(g);
    CHECK(st == KILN_ERR_INVALID && strstr(kiln_last_error(), needle), "verify catches %s (got %d: %s)", what, (int)st,
          kiln_last_error());
}
static void verify_rejects(void) {
    setup s = {0};
    CHECK(load(&s, "tiny_gqa", false), "load: %s", kiln_last_error());
    if (!s.m) return;
    kiln_tensor *in[4] = {s.ids, s.labels, s.mask, s.scale};
    kiln_graph_options o;
    kiln_graph_options_default(&o);
    o.verify = true;
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_build(step_fn, s.m, s.m->params, s.m->n_params, in, 4, &o, &g));
    if (!g) return;
    CHECK_OK(kiln_graph_verify(g));
    int mul = find_op(g, KILN_OP_MUL, 0), fa = find_op(g, KILN_OP_FLASH_ATTN, 0), rms = find_op(g, KILN_OP_RMSNORM, 0);
    while (rms >= 0 && g->v[rms].group == KILN_GROUP_NONE) rms = find_op(g, KILN_OP_RMSNORM, rms + 1); /* a fused one */
    CHECK(mul >= 0 && fa >= 0 && rms >= 0, "the graph has mul, flash attention and rmsnorm nodes");
    if (mul < 0 || fa < 0 || rms < 0) return;
    kiln_value keep = g->v[mul];
    g->v[mul].in[0] = mul + 1;
    expect_broken(g, "an input after its reader", "not an earlier value");
    g->v[mul] = keep;
    g->v[mul].meta.shape[0]++;
    expect_broken(g, "a shape that is not the op's", "shape rule");
    g->v[mul] = keep;
    g->v[mul].n_in = 1;
    expect_broken(g, "a wrong arity", "input count");
    g->v[mul] = keep;
    int p = g->v[mul].in[1];
    bool was = g->v[p].dead;
    g->v[p].dead = true;
    expect_broken(g, "a read of a dead value", "dead value");
    g->v[p].dead = was;
    int aux = g->v[fa].aux_of[0];
    g->v[aux].aux = 1;
    expect_broken(g, "a broken aux link", "link");
    g->v[aux].aux = 0;
    int k = g->v[rms].group;
    CHECK(k != KILN_GROUP_NONE, "rmsnorm is fused");
    if (k != KILN_GROUP_NONE) {
        g->v[rms].group = KILN_GROUP_NONE;
        expect_broken(g, "a group member outside its group", "group");
        g->v[rms].group = k;
        int outside = find_op(g, KILN_OP_MATMUL, 0);
        bool internal = g->v[outside].internal;
        g->v[outside].internal = true;
        expect_broken(g, "an internal value outside any group", "internal");
        g->v[outside].internal = internal;
    }
    CHECK_OK(kiln_graph_verify(g));
    kiln_graph_free(g);
    unload(&s);
}

/* A softmax attention without a mask, and a cross-entropy whose logits are
 * read twice: neither rewrite fires, and each says why. */
static kiln_status odd_fn(void *user, kiln_tensor *const *in, kiln_tensor **report, int *n_report, kiln_tensor **diff) {
    (void)user, (void)diff;
    kiln_tensor *s = kiln_matmul(in[0], in[0], KILN_MM_BATCHED, false, true);
    kiln_tensor *p = s ? kiln_softmax(s) : NULL, *o = p ? kiln_matmul(p, in[0], KILN_MM_BATCHED, false, false) : NULL;
    kiln_tensor *logits = kiln_linear(in[1], in[2]), *ce = logits ? kiln_cross_entropy(logits, in[3], KILN_IGNORE_INDEX) : NULL;
    kiln_tensor *ls = logits ? kiln_sum(logits) : NULL, *os = o ? kiln_sum(o) : NULL;
    kiln_tensor *t1 = ce && ls ? kiln_add(ce, ls) : NULL;
    report[0] = t1 && os ? kiln_add(t1, os) : NULL;
    *n_report = 1;
    kiln_tensor *tmp[] = {s, p, o, logits, ce, ls, os, t1};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) kiln_tensor_release(tmp[i]);
    return report[0] ? KILN_OK : kiln_last_status();
}

static void misses(void) {
    int64_t sq[4] = {1, 2, 5, 4}, sh[2] = {5, 4}, sw[2] = {7, 4}, st[1] = {5};
    kiln_tensor *in[4] = {kiln_tensor_zeros(KILN_F32, 4, sq), kiln_tensor_zeros(KILN_F32, 2, sh), kiln_tensor_zeros(KILN_F32, 2, sw),
                          kiln_tensor_zeros(KILN_I32, 1, st)};
    kiln_graph_options o;
    kiln_graph_options_default(&o);
    o.backward = false;
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_build(odd_fn, NULL, NULL, 0, in, 4, &o, &g));
    bool att = false, ce = false;
    for (int i = 0; g && i < g->n_misses; i++) {
        printf("  miss: %s\n", g->misses[i]);
        att |= strstr(g->misses[i], "attention") && strstr(g->misses[i], "not scores + mask");
        ce |= strstr(g->misses[i], "cross-entropy") && strstr(g->misses[i], "other readers");
    }
    CHECK(g && g->n_misses == 2 && att && ce, "the unfused attention and head + cross-entropy are named with why (%d)",
          g ? g->n_misses : -1);
    kiln_graph_free(g);
    for (int i = 0; i < 4; i++) kiln_tensor_release(in[i]);
    /* the model's step: nothing missed */
    setup s = {0};
    CHECK(load(&s, "tiny_gqa", false), "load: %s", kiln_last_error());
    if (!s.m) return;
    kiln_tensor *mi[4] = {s.ids, s.labels, s.mask, s.scale};
    kiln_graph_options_default(&o);
    CHECK_OK(kiln_graph_build(step_fn, s.m, s.m->params, s.m->n_params, mi, 4, &o, &g));
    CHECK(g && g->n_misses == 0, "the model's step: every attention and the head fused (%d misses)", g ? g->n_misses : -1);
    kiln_graph_free(g);
    unload(&s);
}

/* cross_entropy(softcap(h·Wᵀ, 5)): the rewrite folds the soft-cap into
 * the fused linear + cross-entropy (Gemma 2's final_logit_softcapping: the
 * logits never exist), and its loss and gradients are eager's. */
typedef struct { kiln_tensor *h, *W; } cap_setup;
static kiln_status cap_fn(void *user, kiln_tensor *const *in, kiln_tensor **report, int *n_report, kiln_tensor **diff) {
    cap_setup *c = user;
    kiln_tensor *z = kiln_linear(c->h, c->W), *y = z ? kiln_softcap(z, 5.0) : NULL;
    kiln_tensor *l = y ? kiln_cross_entropy(y, in[0], KILN_IGNORE_INDEX) : NULL;
    kiln_tensor_release(z), kiln_tensor_release(y);
    if (!l) return kiln_last_status();
    report[0] = l;
    *n_report = 1;
    if (diff) *diff = kiln_tensor_retain(l);
    return KILN_OK;
}

static void softcap_head(void) {
    int64_t sh[2] = {37, 24}, sw[2] = {301, 24}, st[1] = {37};
    kiln_rng r = {11, 0};
    cap_setup c = {kiln_tensor_new(KILN_F32, 2, sh), kiln_tensor_new(KILN_F32, 2, sw)};
    kiln_rng_uniform(&r, kiln_f32(c.h), 37 * 24, -3, 3);
    kiln_rng_uniform(&r, kiln_f32(c.W), 301 * 24, -1, 1);
    c.h->requires_grad = c.W->requires_grad = true;
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 1, st);
    for (int i = 0; i < 37; i++) kiln_i32(t)[i] = i % 5 == 3 ? KILN_IGNORE_INDEX : (i * 17) % 301;
    kiln_eager_enable();
    kiln_tensor *rep[1] = {0}, *d = NULL;
    int nr = 0;
    CHECK_OK(cap_fn(&c, &t, rep, &nr, &d));
    CHECK_OK(kiln_backward(d));
    float want = kiln_f32(rep[0])[0];
    float *gh = malloc(sizeof(float) * 37 * 24), *gw = malloc(sizeof(float) * 301 * 24);
    memcpy(gh, c.h->grad->data, sizeof(float) * 37 * 24);
    memcpy(gw, c.W->grad->data, sizeof(float) * 301 * 24);
    kiln_tensor_release(rep[0]), kiln_tensor_release(d);
    kiln_eager_disable();
    kiln_graph_options o;
    kiln_graph_options_default(&o);
    o.verify = true;
    kiln_tensor *params[2] = {c.h, c.W};
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_build(cap_fn, &c, params, 2, &t, 1, &o, &g));
    int fused = 0;
    for (int i = 0; g && i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind == KILN_V_OP && g->v[i].op == KILN_OP_LINEAR_CE && g->v[i].attrs.f[0] == 5.0) fused++;
    CHECK(g && fused == 1 && g->n_misses == 0, "the soft-capped head is one linear_cross_entropy with cap 5 (%d, %d misses)", fused,
          g ? g->n_misses : -1);
    kiln_interp *ip = NULL;
    if (g) CHECK_OK(kiln_interp_new(g, &ip));
    if (ip) {
        memset(c.h->grad->data, 0, sizeof(float) * 37 * 24);
        memset(c.W->grad->data, 0, sizeof(float) * 301 * 24);
        float got = 0;
        CHECK_OK(kiln_interp_run(ip, &t, &got));
        double eh = max_rel(c.h->grad->data, gh, 37 * 24), ew = max_rel(c.W->grad->data, gw, 301 * 24);
        printf("  soft-capped head fused: loss %.7f vs eager %.7f, gradients rel %.2e (h) %.2e (W)\n", got, want, eh, ew);
        CHECK(t_rel(got, want) < 1e-6 && eh < 1e-5 && ew < 1e-5, "fused soft-capped head = eager (%.3g, %.3g, %.3g)",
              t_rel(got, want), eh, ew);
        kiln_interp_free(ip);
    }
    kiln_graph_free(g);
    free(gh), free(gw);
    kiln_tensor_release(c.h), kiln_tensor_release(c.W), kiln_tensor_release(t);
}

/* The MLP's backward with pointwise recomputation: silu(gate) · up is
 * recomputed, and the weight gradient of down_proj (a GEMM into .grad) moves
 * past the element-wise run after it, so that one loop recomputes the
 * product and forms the gradients of gate and up (siblings: both read gate
 * and up), reading gate and up once; silu(gate) never reaches memory. The
 * gradients are still eager's (interpreted here, bits checked in compare). */
static void mlp_backward_one_loop(bool bf16) {
    setup s = {0};
    CHECK(load(&s, "tiny_gqa", false), "load: %s", kiln_last_error());
    if (!s.m) return;
    kiln_tensor *in[4] = {s.ids, s.labels, s.mask, s.scale};
    kiln_dtype old = kiln_autocast_set(bf16 ? KILN_BF16 : KILN_F32);
    kiln_graph_options o;
    kiln_graph_options_default(&o);
    o.recompute = KILN_RECOMPUTE_POINTWISE;
    o.verify = true;
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_build(step_fn, s.m, s.m->params, s.m->n_params, in, 4, &o, &g));
    kiln_autocast_set(old);
    if (!g) return;
    int one_loop = 0, silu_bwd = 0, sunk = 0;
    for (int i = g->n_forward; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind != KILN_V_OP || x->op != KILN_OP_SILU_BWD) continue;
        silu_bwd++;
        if (x->group == KILN_GROUP_NONE) continue;
        bool silu_inside = false;
        for (int m = g->group_start[x->group]; m < g->group_start[x->group + 1]; m++) {
            const kiln_value *y = &g->v[g->group_members[m]];
            silu_inside |= y->op == KILN_OP_SILU && y->recomputed && y->internal;
        }
        one_loop += silu_inside;
    }
    /* every gradient GEMM runs after the element-wise values that followed
     * it: the next value (past other gradient GEMMs and the sinks) is not
     * an element-wise one */
    for (int i = g->n_forward; i < g->n; i++) {
        if (g->v[i].dead || g->v[i].kind != KILN_V_OP || !g->v[i].acc_into_grad) continue;
        int p = i + 1;
        while (p < g->n && (g->v[p].dead || g->v[p].acc_into_grad || g->v[p].kind == KILN_V_GRAD_ACC)) p++;
        sunk += p == g->n || g->v[p].kind != KILN_V_OP || !kiln_op_get(g->v[p].op)->cexpr;
    }
    /* a weight's bf16 cast is kept from forward to backward, not remade */
    int weight_casts = 0, remade = 0;
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind != KILN_V_OP || x->op != KILN_OP_CAST_BF16 || g->v[x->in[0]].kind != KILN_V_PARAM) continue;
        weight_casts++;
        remade += x->recomputed;
    }
    printf("  %d casts of weights, %d of them remade in backward\n", weight_casts, remade);
    CHECK(remade == 0 && (!bf16 || weight_casts > 0), "%s: weights' casts kept, not recomputed (%d of %d)",
          bf16 ? "bf16" : "fp32", remade, weight_casts);
    int L = (int)s.m->cfg.num_hidden_layers, gemms = 0;
    for (int i = g->n_forward; i < g->n; i++) gemms += !g->v[i].dead && g->v[i].kind == KILN_V_OP && g->v[i].acc_into_grad;
    printf("mlp backward%s: %d of %d silu_backward in one loop with the recomputed silu(gate); %d of %d gradient GEMMs "
           "followed by no element-wise value\n",
           bf16 ? " (bf16)" : "", one_loop, silu_bwd, sunk, gemms);
    CHECK(silu_bwd == L && one_loop == L, "%s: the MLP's recompute and its gradients in one loop per layer (%d of %d)",
          bf16 ? "bf16" : "fp32", one_loop, L);
    CHECK(gemms > 0 && sunk == gemms, "%s: gradient GEMMs after the element-wise runs (%d of %d)", bf16 ? "bf16" : "fp32",
          sunk, gemms);
    kiln_graph_free(g);
    unload(&s);
}

int main(void) {
    misses();
    softcap_head();
    verify_rejects();
    compare("tiny_gqa", false, false);
    compare("tiny_gqa", true, false);
    compare("tiny_tied", true, false);
    compare("tiny_gqa", true, true);
    bf16_casts();
    mlp_backward_one_loop(false);
    mlp_backward_one_loop(true);
    TEST_END();
}
