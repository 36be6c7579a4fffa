/* kiln_graph_build: tracing, autograd and the passes, in the order below.
 * Every pass returns a status; with options.verify the IR is checked after
 * tracing and after every pass, so a broken invariant names the pass that
 * broke it. */
#include "internal.h"
#include "kiln/backend.h"

#ifdef KILN_GRAPH_VERIFY
#define VERIFY_DEFAULT true
#else
#define VERIFY_DEFAULT false
#endif

void kiln_graph_options_default(kiln_graph_options *o) {
    *o = (kiln_graph_options){.backward = true, .rewrite_attention = true, .rewrite_linear_ce = true, .reuse_memory = true,
                              .fuse = true, .verify = VERIFY_DEFAULT,
                              .bf16_as_f32 = kiln_backend_bf16_emulated(kiln_backend_current())};
}

typedef kiln_status (*pass_fn)(kiln_graph *g, const kiln_graph_options *o);

static kiln_status attention(kiln_graph *g, const kiln_graph_options *o) {
    return o->rewrite_attention ? kiln_pass_rewrite_attention(g, NULL) : KILN_OK;
}
static kiln_status linear_ce(kiln_graph *g, const kiln_graph_options *o) {
    return o->rewrite_linear_ce ? kiln_pass_rewrite_linear_ce(g, NULL) : KILN_OK;
}
/* before autograd: what the rewrites replaced is not differentiated */
static kiln_status dce_before_backward(kiln_graph *g, const kiln_graph_options *o) {
    return o->backward ? kiln_pass_dce(g, NULL) : KILN_OK;
}
static kiln_status dce(kiln_graph *g, const kiln_graph_options *o) {
    (void)o;
    return kiln_pass_dce(g, NULL);
}
static kiln_status seed_linear_ce(kiln_graph *g, const kiln_graph_options *o) {
    return o->rewrite_linear_ce ? kiln_pass_seed_linear_ce(g, NULL) : KILN_OK;
}
static kiln_status cast_bf16(kiln_graph *g, const kiln_graph_options *o) {
    return kiln_pass_cast_bf16(g, o->bf16_as_f32, NULL);
}
static kiln_status cse(kiln_graph *g, const kiln_graph_options *o) {
    (void)o;
    return kiln_pass_cse(g, NULL);
}
static kiln_status acc_into_grad(kiln_graph *g, const kiln_graph_options *o) {
    (void)o;
    return kiln_pass_acc_into_grad(g, NULL);
}
static bool recomputing(const kiln_graph_options *o) { return o->backward && o->recompute; }
static kiln_status recompute(kiln_graph *g, const kiln_graph_options *o) {
    return recomputing(o) ? kiln_pass_recompute(g, o->recompute, NULL) : KILN_OK;
}
static kiln_status dce_after_recompute(kiln_graph *g, const kiln_graph_options *o) {
    return recomputing(o) ? kiln_pass_dce(g, NULL) : KILN_OK;
}
static kiln_status sink_grad_gemms(kiln_graph *g, const kiln_graph_options *o) {
    return o->fuse ? kiln_pass_sink_grad_gemms(g, NULL) : KILN_OK;
}
static kiln_status fuse(kiln_graph *g, const kiln_graph_options *o) { return o->fuse ? kiln_pass_fuse(g, NULL) : KILN_OK; }
static kiln_status plan(kiln_graph *g, const kiln_graph_options *o) { return kiln_pass_plan(g, o->reuse_memory); }

typedef struct {
    const char *name;
    pass_fn run;
} pass;

/* on the traced forward pass */
static const pass before_backward[] = {
    {"attention rewrite", attention},
    {"linear + cross-entropy rewrite", linear_ce},
    {"dead code", dce_before_backward},
};

/* on the joint graph, after autograd */
static const pass after_backward[] = {
    {"dead code", dce},
    {"linear + cross-entropy seed", seed_linear_ce},
    {"bf16 casts", cast_bf16},
    {"common subexpressions", cse},
    {"dead code", dce},
    {"GEMMs into gradients", acc_into_grad},
    {"recomputation", recompute},
    {"dead code after recomputation", dce_after_recompute},
    {"gradient GEMMs after element-wise runs", sink_grad_gemms},
    {"fusion", fuse},
    {"memory plan", plan},
};

static kiln_status check(const kiln_graph *g, const kiln_graph_options *o, const char *after) {
    kiln_status st = o->verify ? kiln_graph_verify(g) : KILN_OK;
    return st ? kiln_error_context(st, "after %s", after) : KILN_OK;
}

static kiln_status run(kiln_graph *g, const kiln_graph_options *o, const pass *p, int n) {
    for (int i = 0; i < n; i++) {
        kiln_status st = p[i].run(g, o);
        if (st) return kiln_error_context(st, "graph pass '%s'", p[i].name);
        if ((st = check(g, o, p[i].name))) return st;
    }
    return KILN_OK;
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

kiln_status kiln_graph_build(kiln_trace_fn fn, void *user, kiln_tensor **params, int n_params,
                             kiln_tensor *const *example, int n_inputs, const kiln_graph_options *o, kiln_graph **out) {
    kiln_graph *g = NULL;
    kiln_tracer *t = NULL;
    *out = NULL;
    kiln_status st = kiln_trace(fn, user, params, n_params, example, n_inputs, o->backward, &g, &t);
    if (!st) st = check(g, o, "tracing");
    if (!st) st = run(g, o, before_backward, COUNT(before_backward));
    if (!st && o->backward && !(st = kiln_trace_backward(t))) st = check(g, o, "autograd");
    kiln_tracer_free(t);
    if (!st) st = run(g, o, after_backward, COUNT(after_backward));
    if (st) {
        kiln_graph_free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}
