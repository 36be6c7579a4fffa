/* The IR's primitives: adding and inserting values, rewiring uses, aliases,
 * use counts, the schedule position of fused members and a group's kernel
 * arguments. Every pass and the tracer build on these; they use nothing
 * else of the graph layer. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

int kiln_graph_add(kiln_graph *g, kiln_value v) {
    if (!kiln_array_grow((void **)&g->v, &g->cap, g->n + 1, sizeof *g->v, 256)) {
        kiln_error(KILN_ERR_OOM, "out of memory growing the graph");
        return -1;
    }
    v.offset = -1;
    v.alias = -1;
    v.group = KILN_GROUP_NONE;
    g->v[g->n] = v;
    return g->n++;
}

int kiln_graph_insert(kiln_graph *g, int pos, kiln_value v) {
    if (kiln_graph_add(g, v) < 0) return -1; /* grows the array; fixed up below */
    kiln_value nv = g->v[g->n - 1];
    memmove(&g->v[pos + 1], &g->v[pos], sizeof(kiln_value) * (size_t)(g->n - 1 - pos));
    g->v[pos] = nv;
#define SHIFT(x) ((x) >= pos ? (x) + 1 : (x))
    for (int i = 0; i < g->n; i++) {
        if (i == pos) continue;
        kiln_value *x = &g->v[i];
        for (int j = 0; j < x->n_in; j++) x->in[j] = SHIFT(x->in[j]);
        if (x->kind == KILN_V_OP)
            for (int a = 0; a < kiln_op_get(x->op)->n_aux; a++) x->aux_of[a] = SHIFT(x->aux_of[a]);
    }
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = SHIFT(g->outputs[i]);
    if (g->diff >= 0) g->diff = SHIFT(g->diff);
    if (pos < g->n_forward) g->n_forward++;
#undef SHIFT
    return pos;
}

void kiln_graph_free(kiln_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_misses; i++) free(g->misses[i]);
    free(g->v);
    free(g->group_start);
    free(g->group_members);
    free(g);
}

void kiln_graph_replace_uses(kiln_graph *g, int from, int to) {
    for (int i = from + 1; i < g->n; i++)
        for (int j = 0; j < g->v[i].n_in; j++)
            if (g->v[i].in[j] == from) g->v[i].in[j] = to;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == from) g->outputs[i] = to;
    if (g->diff == from) g->diff = to;
}

int kiln_graph_root(const kiln_graph *g, int v) {
    while (g->v[v].alias >= 0) v = g->v[v].alias;
    return v;
}

void kiln_graph_count_uses(kiln_graph *g) {
    for (int i = 0; i < g->n; i++) g->v[i].n_uses = 0;
    for (int i = 0; i < g->n; i++) {
        if (g->v[i].dead || g->v[i].kind == KILN_V_AUX) continue;
        for (int j = 0; j < g->v[i].n_in; j++) g->v[g->v[i].in[j]].n_uses++;
    }
    for (int i = 0; i < g->n_outputs; i++) g->v[g->outputs[i]].n_uses++;
    if (g->diff >= 0) g->v[g->diff].n_uses++;
}

int kiln_graph_only_user(const kiln_graph *g, int v) {
    int user = -1;
    for (int i = v + 1; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind == KILN_V_AUX) continue;
        for (int j = 0; j < x->n_in; j++)
            if (x->in[j] == v) {
                if (user >= 0 && user != i) return -1;
                user = i;
            }
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return -1;
    if (g->diff == v) return -1;
    return user;
}

int kiln_graph_exec_pos(const kiln_graph *g, int v) {
    int k = g->v[v].group;
    if (k == KILN_GROUP_NONE || !g->group_start) return v;
    return g->group_members[g->group_start[k + 1] - 1];
}

int kiln_graph_group_args(const kiln_graph *g, int k, int *ids, int cap) {
    int n = 0;
    const int *mem = &g->group_members[g->group_start[k]];
    int nm = g->group_start[k + 1] - g->group_start[k];
    for (int s = 0; s < nm; s++) {
        const kiln_value *x = &g->v[mem[s]];
        for (int j = 0; j < x->n_in; j++) {
            int src = x->in[j];
            if (g->v[src].group == k) continue;
            bool seen = false;
            for (int q = 0; q < n; q++) seen |= ids[q] == src;
            if (!seen && n < cap) ids[n++] = src;
        }
    }
    for (int s = 0; s < nm; s++)
        if (!g->v[mem[s]].internal && n < cap) ids[n++] = mem[s];
    return n;
}
