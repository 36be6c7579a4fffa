/* Graph dumps and totals, for --explain. */
#include <stdio.h>
#include <string.h>
#include "internal.h"

double kiln_graph_flops(const kiln_graph *g) {
    double f = 0;
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind != KILN_V_OP) continue;
        kiln_meta im[KILN_OP_MAX_IN];
        for (int j = 0; j < x->n_in; j++) im[j] = g->v[x->in[j]].meta;
        f += kiln_op_flops(x->op, im, &x->attrs, &x->meta);
    }
    return f;
}

int kiln_graph_live_nodes(const kiln_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += !g->v[i].dead && (g->v[i].kind == KILN_V_OP || g->v[i].kind == KILN_V_GRAD_ACC);
    return n;
}

void kiln_graph_print(const kiln_graph *g, void (*line)(const char *text, void *user), void *user) {
    static const char *kinds[] = {"input", "param", "op", "aux", "grad+="};
    char buf[512], sh[96];
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead) continue;
        int o = snprintf(buf, sizeof buf, "%%%-4d = %-22s", i,
                         x->kind == KILN_V_OP ? kiln_op_name(x->op) : kinds[x->kind]);
        for (int j = 0; j < x->n_in && o < (int)sizeof buf; j++) o += snprintf(buf + o, sizeof buf - (size_t)o, " %%%d", x->in[j]);
        if (x->kind == KILN_V_PARAM && o < (int)sizeof buf)
            o += snprintf(buf + o, sizeof buf - (size_t)o, " %s", g->params[x->index]->name);
        if (x->kind == KILN_V_GRAD_ACC && o < (int)sizeof buf)
            o += snprintf(buf + o, sizeof buf - (size_t)o, " into %s.grad", g->params[x->index]->name);
        if (o < (int)sizeof buf) o += snprintf(buf + o, sizeof buf - (size_t)o, "  %s", kiln_meta_str(&x->meta, sh, sizeof sh));
        if (x->offset >= 0 && o < (int)sizeof buf)
            o += snprintf(buf + o, sizeof buf - (size_t)o, "  @%lld", (long long)x->offset);
        if (x->acc_into_grad && o < (int)sizeof buf) o += snprintf(buf + o, sizeof buf - (size_t)o, "  (accumulates into .grad)");
        if (x->group != KILN_GROUP_NONE && o < (int)sizeof buf) snprintf(buf + o, sizeof buf - (size_t)o, "  [group %d]", x->group);
        line(buf, user);
    }
}
