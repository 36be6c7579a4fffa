/* kiln_graph_verify: the IR's invariants, checked after every pass in the
 * tests and the sanitizer build (kiln_graph_options.verify). A pass that
 * breaks one is caught where it happened, not as wrong gradients later. */
#include <stdio.h>
#include <string.h>
#include "internal.h"

static bool same_meta(const kiln_meta *a, const kiln_meta *b) {
    return a->ndim == b->ndim && a->dtype == b->dtype && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static kiln_status bad(const kiln_graph *g, int v, const char *fmt, const char *detail) {
    const kiln_value *x = &g->v[v];
    static const char *kinds[] = {"input", "param", "op", "aux", "grad+="};
    return kiln_error(KILN_ERR_INVALID, "graph IR: value %d (%s): %s%s%s", v,
                      x->kind == KILN_V_OP ? kiln_op_name(x->op) : kinds[x->kind], fmt, detail ? ": " : "",
                      detail ? detail : "");
}

/* inputs exist, come before their reader and are live */
static kiln_status check_inputs(const kiln_graph *g, int v) {
    const kiln_value *x = &g->v[v];
    if (x->n_in < 0 || x->n_in > KILN_OP_MAX_IN) return bad(g, v, "bad input count", NULL);
    for (int j = 0; j < x->n_in; j++) {
        int p = x->in[j];
        if (p < 0 || p >= v) return bad(g, v, "an input is not an earlier value", NULL);
        if (g->v[p].dead) return bad(g, v, "reads a dead value", NULL);
        if (g->v[p].kind == KILN_V_GRAD_ACC) return bad(g, v, "reads a gradient sink", NULL);
    }
    return KILN_OK;
}

/* arity, shapes and extra outputs against the op's definition */
static kiln_status check_op(const kiln_graph *g, int v) {
    const kiln_value *x = &g->v[v];
    const kiln_op_def *d = kiln_op_get(x->op);
    if (!d) return bad(g, v, "unknown op", NULL);
    if (x->n_in < d->n_in || x->n_in > d->n_in + d->n_opt) return bad(g, v, "input count differs from the op's", NULL);
    kiln_meta im[KILN_OP_MAX_IN] = {0}, out, am[KILN_OP_MAX_AUX]; /* absent optional inputs: ndim 0 */
    for (int j = 0; j < x->n_in; j++) im[j] = g->v[x->in[j]].meta;
    if (d->shape(im, &x->attrs, &out)) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_last_error()); /* copied: the message is rebuilt from it */
        return bad(g, v, "the op's shape rule rejects its inputs", why);
    }
    if (!same_meta(&out, &x->meta)) return bad(g, v, "shape or dtype differs from the op's shape rule", NULL);
    if (d->n_aux && d->aux_shape(im, &x->attrs, am)) return bad(g, v, "the op's extra-output shape rule fails", NULL);
    for (int a = 0; a < d->n_aux; a++) {
        int id = x->aux_of[a];
        if (id <= v || id >= g->n) return bad(g, v, "an extra output is not a later value", NULL);
        const kiln_value *y = &g->v[id];
        if (y->kind != KILN_V_AUX || y->in[0] != v || y->aux != a) return bad(g, v, "an extra output does not link back", NULL);
        if (y->dead != x->dead) return bad(g, v, "the op and an extra output differ in liveness", NULL);
        if (!same_meta(&am[a], &y->meta)) return bad(g, v, "an extra output's shape differs from the op's rule", NULL);
    }
    return KILN_OK;
}

static kiln_status check_value(const kiln_graph *g, int v) {
    const kiln_value *x = &g->v[v];
    kiln_status st = check_inputs(g, v);
    if (st) return st;
    switch (x->kind) {
    case KILN_V_INPUT:
        if (x->index < 0 || x->index >= g->n_inputs || x->n_in) return bad(g, v, "bad input slot", NULL);
        return KILN_OK;
    case KILN_V_PARAM: {
        if (x->index < 0 || x->index >= g->n_params || x->n_in) return bad(g, v, "bad parameter index", NULL);
        kiln_meta pm = kiln_meta_of(g->params[x->index]);
        return same_meta(&pm, &x->meta) ? KILN_OK : bad(g, v, "shape differs from its parameter", g->params[x->index]->name);
    }
    case KILN_V_OP: return check_op(g, v);
    case KILN_V_AUX: {
        if (x->n_in != 1) return bad(g, v, "an extra output needs its op as its one input", NULL);
        const kiln_value *p = &g->v[x->in[0]];
        if (p->kind != KILN_V_OP || x->aux < 0 || x->aux >= kiln_op_get(p->op)->n_aux || p->aux_of[x->aux] != v)
            return bad(g, v, "not linked from its op", NULL);
        return KILN_OK;
    }
    case KILN_V_GRAD_ACC: {
        if (x->index < 0 || x->index >= g->n_params || x->n_in < 1 || x->n_in > 2)
            return bad(g, v, "bad parameter index or input count", NULL);
        const kiln_value *s = &g->v[x->in[0]];
        if (kiln_meta_numel(&s->meta) != kiln_tensor_numel(g->params[x->index]) || s->meta.dtype != KILN_F32)
            return bad(g, v, "the gradient does not fit its parameter", g->params[x->index]->name);
        if (x->n_in == 2 && kiln_meta_numel(&g->v[x->in[1]].meta) != 1) return bad(g, v, "the scale is not a scalar", NULL);
        return KILN_OK;
    }
    }
    return bad(g, v, "unknown kind", NULL);
}

/* Fused groups: members live ops listed once in value order under their own
 * group; internal members read only inside it and not results. */
static kiln_status check_groups(const kiln_graph *g) {
    if (!g->n_groups) {
        for (int v = 0; v < g->n; v++)
            if (g->v[v].group != KILN_GROUP_NONE || g->v[v].internal) return bad(g, v, "in a group, but there are none", NULL);
        return KILN_OK;
    }
    if (!g->group_start || !g->group_members || g->group_start[0] != 0)
        return kiln_error(KILN_ERR_INVALID, "graph IR: group tables missing");
    int listed = 0;
    for (int k = 0; k < g->n_groups; k++) {
        int a = g->group_start[k], b = g->group_start[k + 1];
        if (b <= a || b > g->n) return kiln_error(KILN_ERR_INVALID, "graph IR: group %d has a bad member range", k);
        for (int m = a; m < b; m++) {
            int v = g->group_members[m];
            if (v < 0 || v >= g->n || g->v[v].group != k || (m > a && g->group_members[m - 1] >= v))
                return kiln_error(KILN_ERR_INVALID, "graph IR: group %d lists member %d out of order or of another group", k, v);
            if (g->v[v].dead || g->v[v].kind != KILN_V_OP) return bad(g, v, "a group member that is not a live op", NULL);
        }
        listed += b - a;
    }
    int grouped = 0;
    for (int v = 0; v < g->n; v++) {
        const kiln_value *x = &g->v[v];
        if (x->group == KILN_GROUP_NONE) {
            if (x->internal) return bad(g, v, "internal outside any group", NULL);
            continue;
        }
        if (x->group < 0 || x->group >= g->n_groups) return bad(g, v, "bad group id", NULL);
        grouped++;
    }
    if (grouped != listed) return kiln_error(KILN_ERR_INVALID, "graph IR: %d values in groups, %d listed", grouped, listed);
    for (int v = 0; v < g->n; v++) {
        const kiln_value *x = &g->v[v];
        if (x->dead || x->kind == KILN_V_AUX) continue;
        for (int j = 0; j < x->n_in; j++) {
            const kiln_value *p = &g->v[x->in[j]];
            if (p->internal && p->group != x->group) return bad(g, v, "reads another group's internal value", NULL);
        }
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->v[g->outputs[i]].internal) return bad(g, g->outputs[i], "a result kept out of memory", NULL);
    if (g->diff >= 0 && g->v[g->diff].internal) return bad(g, g->diff, "the differentiated value kept out of memory", NULL);
    return KILN_OK;
}

kiln_status kiln_graph_verify(const kiln_graph *g) {
    if (!g || g->n < 0 || g->n > g->cap || (g->n && !g->v)) return kiln_error(KILN_ERR_INVALID, "graph IR: bad value array");
    if (g->n_forward < 0 || g->n_forward > g->n) return kiln_error(KILN_ERR_INVALID, "graph IR: bad forward count");
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] < 0 || g->outputs[i] >= g->n || g->v[g->outputs[i]].dead)
            return kiln_error(KILN_ERR_INVALID, "graph IR: result %d is not a live value", i);
    if (g->diff >= g->n || (g->diff >= 0 && g->v[g->diff].dead))
        return kiln_error(KILN_ERR_INVALID, "graph IR: the differentiated value is not live");
    for (int v = 0; v < g->n; v++) {
        if (g->v[v].dead) continue;
        kiln_status st = check_value(g, v);
        if (st) return st;
    }
    return check_groups(g);
}
