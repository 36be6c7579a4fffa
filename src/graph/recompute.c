/* Activation recomputation (rematerialisation). Pointwise (the compiler's
 * default): see pointwise_units below; the same copying does the rest. The
 * model labels its blocks
 * with scopes (attention of layer l: 2l+1, MLP: 2l+2). A recompute unit is a
 * layer (both scopes) or only the attention block. Forward values of a unit
 * that backward reads are not kept: just before the first backward node that
 * needs any of them, the unit's forward nodes are copied (reading the unit's
 * inputs, which are kept), and backward reads the copies. A unit's values read
 * by another unit in forward (the residual stream between layers) are its
 * checkpoints and stay. The rebuilt graph keeps the invariant that values
 * are numbered in execution order. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static int unit_of_scope(int scope, int mode) {
    if (scope <= 0) return -1;
    if (mode == KILN_RECOMPUTE_LAYER) return (scope + 1) / 2;
    if (mode == KILN_RECOMPUTE_ATTENTION) return scope % 2 ? (scope + 1) / 2 : -1;
    return -1;
}

typedef struct {
    kiln_value *v;
    int n, cap;
} varr;

static int push(varr *a, kiln_value x) {
    if (!kiln_array_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 1024)) return -1;
    a->v[a->n] = x;
    return a->n++;
}

typedef struct {
    const kiln_graph *g;
    const int *unit;
    int nf;
    varr out;
    int *newid, *clone;
    bool *done;
    int copies;
} rebuild;

/* Copies every live forward node of unit u, in order, with its extra outputs. */
static bool clone_unit(rebuild *r, int u) {
    const kiln_graph *g = r->g;
    r->done[u] = true;
    for (int v = 0; v < r->nf; v++) {
        const kiln_value *x = &g->v[v];
        if (x->dead || x->kind != KILN_V_OP || r->unit[v] != u) continue;
        kiln_value c = *x;
        c.recomputed = true;
        for (int j = 0; j < c.n_in; j++) {
            int in = x->in[j];
            c.in[j] = in < r->nf && r->unit[in] == u && r->clone[in] >= 0 ? r->clone[in] : r->newid[in];
        }
        int id = push(&r->out, c);
        if (id < 0) return false;
        r->clone[v] = id;
        r->copies++;
        for (int a = 0; a < kiln_op_get(x->op)->n_aux; a++) {
            kiln_value av = g->v[x->aux_of[a]];
            av.in[0] = id;
            av.recomputed = true;
            int aid = push(&r->out, av);
            if (aid < 0) return false;
            r->out.v[id].aux_of[a] = aid;
            r->clone[x->aux_of[a]] = aid;
        }
    }
    return true;
}

static int uf_root(int *p, int v) {
    while (p[v] != v) v = p[v] = p[p[v]];
    return v;
}

/* Pointwise units: a forward element-wise value whose inputs are all kept
 * anyway (parameters, graph inputs, values backward reads) or are such
 * values themselves is recomputed where backward first needs it, instead
 * of kept; a chain of them (the MLP's silu(gate) · up) is one unit, copied
 * together. The values' readers in forward read the originals, which die
 * there. Returns false when out of memory. */
static bool pointwise_units(const kiln_graph *g, int nf, int *unit) {
    bool *kept = calloc((size_t)g->n, sizeof *kept);
    int *parent = malloc(sizeof(int) * (size_t)g->n);
    if (!kept || !parent) {
        free(kept);
        free(parent);
        return false;
    }
    for (int b = nf; b < g->n; b++) {
        const kiln_value *x = &g->v[b];
        if (x->dead || x->kind == KILN_V_AUX) continue;
        for (int j = 0; j < x->n_in; j++)
            if (x->in[j] < nf) kept[x->in[j]] = true;
    }
    for (int v = 0; v < g->n; v++) parent[v] = v, unit[v] = -1;
    for (int v = 0; v < nf; v++) {
        const kiln_value *x = &g->v[v];
        if (x->dead || x->kind != KILN_V_OP) continue;
        const kiln_op_def *d = kiln_op_get(x->op);
        if (!d->cexpr || d->indexed || d->n_aux || d->is_view) continue;
        /* a value of parameters alone (a weight's bf16 cast) is kept, as
         * autocast's weight cache keeps it in PyTorch: its size does not
         * grow with the batch, and remaking it reads the fp32 weight again */
        bool params_only = x->n_in > 0;
        for (int j = 0; j < x->n_in; j++) params_only &= g->v[x->in[j]].kind == KILN_V_PARAM;
        if (params_only) continue;
        bool ok = true;
        for (int j = 0; j < x->n_in && ok; j++) {
            const int in = x->in[j];
            const int k = g->v[in].kind;
            ok = k == KILN_V_PARAM || k == KILN_V_INPUT || (in < nf && (unit[in] >= 0 || kept[in]));
        }
        if (!ok) continue;
        unit[v] = v;
        for (int j = 0; j < x->n_in; j++)
            if (x->in[j] < nf && unit[x->in[j]] >= 0) parent[uf_root(parent, x->in[j])] = uf_root(parent, v);
    }
    for (int v = 0; v < nf; v++)
        if (unit[v] >= 0) unit[v] = uf_root(parent, v);
    free(kept);
    free(parent);
    return true;
}

kiln_status kiln_pass_recompute(kiln_graph *g, int mode, int *copies_out) {
    int nf = g->n_forward;
    if (copies_out) *copies_out = 0;
    if (mode == KILN_RECOMPUTE_NONE || nf <= 0) return KILN_OK;
    int *unit = malloc(sizeof(int) * (size_t)g->n);
    rebuild r = {.g = g, .unit = unit, .nf = nf};
    r.newid = malloc(sizeof(int) * (size_t)g->n);
    r.clone = malloc(sizeof(int) * (size_t)g->n);
    r.done = calloc((size_t)g->n + 1, sizeof(bool));
    if (!unit || !r.newid || !r.clone || !r.done) goto oom;
    for (int v = 0; v < g->n; v++) {
        const kiln_value *x = &g->v[v];
        unit[v] = v < nf && !x->dead && (x->kind == KILN_V_OP || x->kind == KILN_V_AUX) ? unit_of_scope(x->scope, mode) : -1;
        r.clone[v] = -1;
    }
    if (mode == KILN_RECOMPUTE_POINTWISE && !pointwise_units(g, nf, unit)) goto oom;
    /* checkpoints: read across units in forward, or results of the graph
     * (a pointwise unit's inputs are kept anyway, and its readers outside
     * it are never copied) */
    if (mode != KILN_RECOMPUTE_POINTWISE)
        for (int v = 0; v < nf; v++) {
            const kiln_value *x = &g->v[v];
            if (x->dead || x->kind == KILN_V_AUX) continue;
            for (int j = 0; j < x->n_in; j++) {
                int in = x->in[j];
                if (unit[in] >= 0 && unit[in] != unit[v]) unit[in] = -1;
            }
        }
    for (int i = 0; i < g->n_outputs; i++) unit[g->outputs[i]] = -1;
    if (g->diff >= 0) unit[g->diff] = -1;
    for (int v = 0; v < nf; v++) /* an op and its extra outputs go together */
        if (!g->v[v].dead && g->v[v].kind == KILN_V_OP)
            for (int a = 0; a < kiln_op_get(g->v[v].op)->n_aux; a++)
                if (unit[v] < 0 || unit[g->v[v].aux_of[a]] < 0) {
                    unit[v] = -1;
                    unit[g->v[v].aux_of[a]] = -1;
                }
    for (int v = 0; v < nf; v++) {
        if (push(&r.out, g->v[v]) < 0) goto oom;
        r.newid[v] = v;
    }
    for (int b = nf; b < g->n; b++) {
        kiln_value x = g->v[b];
        if (!x.dead && x.kind != KILN_V_AUX)
            for (int j = 0; j < x.n_in; j++) {
                int in = x.in[j];
                if (in < nf && unit[in] >= 0) {
                    if (!r.done[unit[in]] && !clone_unit(&r, unit[in])) goto oom;
                    x.in[j] = r.clone[in] >= 0 ? r.clone[in] : in;
                } else {
                    x.in[j] = r.newid[in];
                }
            }
        else if (x.kind == KILN_V_AUX)
            x.in[0] = r.newid[x.in[0]];
        int id = push(&r.out, x);
        if (id < 0) goto oom;
        r.newid[b] = id;
    }
    /* extra outputs of the ops copied as they were (clones set their own) */
    for (int i = 0; i < r.out.n; i++) {
        kiln_value *x = &r.out.v[i];
        if (x->dead || x->kind != KILN_V_OP || x->recomputed) continue;
        for (int a = 0; a < kiln_op_get(x->op)->n_aux; a++) x->aux_of[a] = r.newid[x->aux_of[a]];
    }
    free(g->v);
    g->v = r.out.v;
    g->n = r.out.n;
    g->cap = r.out.cap;
    free(unit);
    free(r.newid);
    free(r.clone);
    free(r.done);
    if (copies_out) *copies_out = r.copies;
    return KILN_OK;
oom:
    free(r.out.v);
    free(unit);
    free(r.newid);
    free(r.clone);
    free(r.done);
    return kiln_error(KILN_ERR_OOM, "out of memory recomputing activations");
}
