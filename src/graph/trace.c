/* Tracing (a dispatcher that records nodes instead of computing) and
 * autograd on the graph with the registry's backward rules. The passes that
 * run around them are the pipeline in pipeline.c. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* ---- the tracer ---------------------------------------------------------- */
struct kiln_tracer {
    kiln_graph *g;
    kiln_tensor **sym; /* value id -> tensor standing for it (retained) */
    int sym_cap;
    /* pointer -> value id, open addressing */
    const kiln_tensor **keys;
    int *vals;
    int hcap, hcount;
};
typedef struct kiln_tracer tracer;

static size_t hash_ptr(const void *p, int cap) {
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 17;
    x *= 0xed5ad4bbu;
    x ^= x >> 11;
    return (size_t)x & (size_t)(cap - 1);
}

static kiln_status map_put(tracer *t, const kiln_tensor *k, int v) {
    if ((t->hcount + 1) * 2 > t->hcap) {
        int cap = t->hcap ? t->hcap * 2 : 1024;
        const kiln_tensor **nk = calloc((size_t)cap, sizeof *nk);
        int *nv = calloc((size_t)cap, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return kiln_error(KILN_ERR_OOM, "out of memory tracing");
        }
        for (int i = 0; i < t->hcap; i++)
            if (t->keys[i]) {
                size_t h = hash_ptr(t->keys[i], cap);
                while (nk[h]) h = (h + 1) & (size_t)(cap - 1);
                nk[h] = t->keys[i];
                nv[h] = t->vals[i];
            }
        free(t->keys);
        free(t->vals);
        t->keys = nk;
        t->vals = nv;
        t->hcap = cap;
    }
    size_t h = hash_ptr(k, t->hcap);
    while (t->keys[h] && t->keys[h] != k) h = (h + 1) & (size_t)(t->hcap - 1);
    if (!t->keys[h]) t->hcount++;
    t->keys[h] = k;
    t->vals[h] = v;
    return KILN_OK;
}

static int map_get(const tracer *t, const kiln_tensor *k) {
    if (!t->hcap) return -1;
    size_t h = hash_ptr(k, t->hcap);
    while (t->keys[h]) {
        if (t->keys[h] == k) return t->vals[h];
        h = (h + 1) & (size_t)(t->hcap - 1);
    }
    return -1;
}

/* Records tensor `x` as standing for value `id` (the tracer keeps a ref). */
static kiln_status bind(tracer *t, int id, kiln_tensor *x) {
    if (!kiln_array_grow((void **)&t->sym, &t->sym_cap, id + 1, sizeof *t->sym, 512))
        return kiln_error(KILN_ERR_OOM, "out of memory tracing");
    t->sym[id] = kiln_tensor_retain(x);
    return map_put(t, x, id);
}

static kiln_tensor *symbolic(const kiln_meta *m) { return kiln_tensor_wrap(NULL, m->dtype, m->ndim, m->shape); }

static kiln_tensor *trace_dispatch(void *ctx, int op, kiln_tensor *const *in, int n_in, const kiln_attrs *attrs,
                                   const kiln_meta *out, kiln_tensor **aux) {
    tracer *t = ctx;
    const kiln_op_def *d = kiln_op_get(op);
    kiln_value v = {.kind = KILN_V_OP, .op = op, .n_in = n_in, .attrs = *attrs, .meta = *out, .scope = kiln_op_get_scope()};
    for (int i = 0; i < n_in; i++) {
        int id = map_get(t, in[i]);
        if (id < 0) {
            kiln_error(KILN_ERR_INVALID,
                       "tracing op %s: input %d is a tensor made outside the traced function; pass it as an input", d->name, i);
            return NULL;
        }
        v.in[i] = id;
        if (!(d->nondiff_in & (1u << i))) v.requires_grad |= t->g->v[id].requires_grad;
    }
    int id = kiln_graph_add(t->g, v);
    kiln_tensor *s = id < 0 ? NULL : symbolic(out);
    if (!s || bind(t, id, s)) {
        kiln_tensor_release(s);
        return NULL;
    }
    if (d->n_aux) {
        kiln_meta im[KILN_OP_MAX_IN], am[KILN_OP_MAX_AUX];
        for (int i = 0; i < n_in; i++) im[i] = kiln_meta_of(in[i]);
        if (d->aux_shape(im, attrs, am)) {
            kiln_tensor_release(s);
            return NULL;
        }
        for (int a = 0; a < d->n_aux; a++) {
            kiln_value av = {.kind = KILN_V_AUX, .n_in = 1, .in = {id}, .aux = a, .meta = am[a], .scope = v.scope};
            int aid = kiln_graph_add(t->g, av);
            if (aid >= 0) t->g->v[id].aux_of[a] = aid;
            aux[a] = aid < 0 ? NULL : symbolic(&am[a]);
            if (!aux[a] || bind(t, aid, aux[a])) {
                kiln_tensor_release(s);
                return NULL;
            }
        }
    }
    return s;
}

static void tracer_free(tracer *t) {
    for (int i = 0; i < t->sym_cap; i++) kiln_tensor_release(t->sym[i]);
    free(t->sym);
    free(t->keys);
    free(t->vals);
}

/* ---- autograd on the graph ------------------------------------------------- */
static kiln_status add_grad(tracer *t, int *gout, int target, kiln_tensor *gin) {
    kiln_graph *g = t->g;
    int gid = map_get(t, gin);
    if (gid < 0) return kiln_error(KILN_ERR_INVALID, "autograd: a backward rule returned a tensor outside the graph");
    if (g->v[target].kind == KILN_V_PARAM) {
        kiln_value s = {.kind = KILN_V_GRAD_ACC, .n_in = 1, .in = {gid}, .index = g->v[target].index, .meta = g->v[gid].meta};
        return kiln_graph_add(g, s) < 0 ? kiln_last_status() : KILN_OK;
    }
    if (gout[target] < 0) {
        gout[target] = gid;
        return KILN_OK;
    }
    kiln_tensor *sum = kiln_add(t->sym[gout[target]], gin);
    if (!sum) return kiln_last_status();
    gout[target] = map_get(t, sum);
    kiln_tensor_release(sum);
    return KILN_OK;
}

static kiln_status autograd(tracer *t, int diff) {
    kiln_graph *g = t->g;
    int n_fwd = g->n;
    g->n_forward = n_fwd;
    int outer = kiln_op_set_scope(0); /* backward nodes belong to no block */
    int *gout = malloc(sizeof(int) * (size_t)n_fwd);
    if (!gout) return kiln_error(KILN_ERR_OOM, "out of memory");
    for (int i = 0; i < n_fwd; i++) gout[i] = -1;
    kiln_tensor *seed = kiln_fill(g->v[diff].meta.ndim, g->v[diff].meta.shape, 1.0);
    kiln_status st = seed ? KILN_OK : kiln_last_status();
    if (!st) gout[diff] = map_get(t, seed);
    kiln_tensor_release(seed);
    for (int v = n_fwd - 1; v >= 0 && !st; v--) {
        /* a copy: backward rules append values, which may move g->v */
        const kiln_value xv = g->v[v], *x = &xv;
        if (gout[v] < 0 || x->kind != KILN_V_OP || x->dead) continue;
        const kiln_op_def *d = kiln_op_get(x->op);
        if (!d->backward) {
            st = kiln_error(KILN_ERR_UNSUPPORTED, "autograd: op %s has no backward rule", d->name);
            break;
        }
        kiln_bw_ctx c = {.op = x->op, .attrs = x->attrs, .n_in = x->n_in, .out = t->sym[v]};
        for (int i = 0; i < x->n_in; i++) {
            const kiln_value *in = &g->v[x->in[i]];
            c.in[i] = t->sym[x->in[i]];
            c.in_meta[i] = in->meta;
            c.needs[i] = !(d->nondiff_in & (1u << i)) && in->requires_grad;
        }
        for (int a = 0; a < d->n_aux; a++) {
            int av = x->aux_of[a];
            c.aux[a] = t->sym[av];
        }
        kiln_tensor *gin[KILN_OP_MAX_IN] = {0};
        st = d->backward(&c, t->sym[gout[v]], gin);
        if (st) kiln_error_context(st, "autograd of op %s", d->name);
        for (int i = 0; i < x->n_in && !st; i++)
            if (c.needs[i] && gin[i]) st = add_grad(t, gout, x->in[i], gin[i]);
        for (int i = 0; i < KILN_OP_MAX_IN; i++) kiln_tensor_release(gin[i]);
    }
    free(gout);
    kiln_op_set_scope(outer);
    return st;
}

/* ---- the tracer's entry points ------------------------------------------------ */
void kiln_tracer_free(kiln_tracer *t) {
    if (!t) return;
    tracer_free(t);
    free(t);
}

kiln_status kiln_trace(kiln_trace_fn fn, void *user, kiln_tensor **params, int n_params, kiln_tensor *const *example,
                       int n_inputs, bool backward, kiln_graph **out_g, kiln_tracer **out_t) {
    *out_g = NULL;
    *out_t = NULL;
    kiln_graph *g = calloc(1, sizeof *g);
    tracer *t = calloc(1, sizeof *t);
    kiln_tensor *in_sym[KILN_OP_MAX_IN * 2] = {0};
    kiln_status st = g && t ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st && n_inputs > (int)(sizeof in_sym / sizeof in_sym[0])) st = kiln_error(KILN_ERR_INVALID, "too many graph inputs");
    if (st) {
        free(g);
        free(t);
        return st;
    }
    t->g = g;
    g->params = params;
    g->diff = -1;
    g->n_params = n_params;
    g->n_inputs = n_inputs;
    for (int i = 0; i < n_params && !st; i++) {
        kiln_value v = {.kind = KILN_V_PARAM, .index = i, .meta = kiln_meta_of(params[i]), .requires_grad = params[i]->requires_grad};
        int id = kiln_graph_add(g, v);
        st = id < 0 ? kiln_last_status() : bind(t, id, params[i]);
    }
    for (int i = 0; i < n_inputs && !st; i++) {
        kiln_value v = {.kind = KILN_V_INPUT, .index = i, .meta = kiln_meta_of(example[i])};
        int id = kiln_graph_add(g, v);
        in_sym[i] = symbolic(&v.meta);
        st = id < 0 || !in_sym[i] ? kiln_last_status() : bind(t, id, in_sym[i]);
    }
    kiln_tensor *report[KILN_GRAPH_MAX_OUTPUTS] = {0}, *diff = NULL;
    int n_report = 0;
    if (!st) {
        kiln_dispatcher prev = kiln_op_set_dispatcher((kiln_dispatcher){trace_dispatch, t});
        st = fn(user, in_sym, report, &n_report, backward ? &diff : NULL);
        kiln_op_set_dispatcher(prev);
    }
    if (!st && n_report > KILN_GRAPH_MAX_OUTPUTS)
        st = kiln_error(KILN_ERR_INVALID, "traced function returned %d values (at most %d)", n_report, KILN_GRAPH_MAX_OUTPUTS);
    for (int i = 0; i < n_report && !st; i++) {
        int id = report[i] ? map_get(t, report[i]) : -1;
        if (id < 0) st = kiln_error(KILN_ERR_INVALID, "traced function returned output %d that is not a graph value", i);
        g->outputs[g->n_outputs++] = id;
    }
    g->diff = diff ? map_get(t, diff) : -1;
    if (!st && backward && g->diff < 0) st = kiln_error(KILN_ERR_INVALID, "traced function returned no value to differentiate");
    for (int i = 0; i < n_report; i++) kiln_tensor_release(report[i]);
    kiln_tensor_release(diff);
    for (int i = 0; i < n_inputs; i++) kiln_tensor_release(in_sym[i]);
    if (st) {
        kiln_tracer_free(t);
        kiln_graph_free(g);
        return st;
    }
    *out_g = g;
    *out_t = t;
    return KILN_OK;
}

kiln_status kiln_trace_backward(kiln_tracer *t) {
    kiln_graph *g = t->g;
    kiln_status st = KILN_OK;
    for (int id = 0; id < g->n && !st; id++) /* values the rewrites added */
        if (id >= t->sym_cap || !t->sym[id]) {
            kiln_tensor *s = symbolic(&g->v[id].meta);
            st = s ? bind(t, id, s) : kiln_last_status();
            kiln_tensor_release(s);
        }
    if (st) return st;
    kiln_dispatcher prev = kiln_op_set_dispatcher((kiln_dispatcher){trace_dispatch, t});
    st = autograd(t, g->diff);
    kiln_op_set_dispatcher(prev);
    return st;
}
