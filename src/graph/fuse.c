/* Fusion of element-wise chains: ops with a C expression in the registry
 * (add, mul, scale, scale_by, silu, silu_backward, cast_bf16) over the same number of
 * elements join their producers' group when the group can still run at its
 * last member without any outside reader seeing a value too early. Members
 * read only inside the group become `internal`: they never reach memory. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static bool fusable(const kiln_graph *g, int v) {
    const kiln_value *x = &g->v[v];
    if (x->dead || x->kind != KILN_V_OP || !kiln_op_get(x->op)->cexpr) return false;
    if (x->meta.dtype != KILN_F32 && x->op != KILN_OP_CAST_BF16) return false;
    int64_t n = kiln_meta_numel(&x->meta);
    for (int j = 0; j < x->n_in; j++) {
        const kiln_value *in = &g->v[x->in[j]];
        int64_t m = kiln_meta_numel(&in->meta);
        if (in->meta.dtype != KILN_F32 || (m != n && m != 1)) return false;
    }
    return true;
}

/* A row reduction that can end a group (an op with a row epilogue, such as
 * RMSNorm after the residual add) over the group's result; its other inputs
 * are read whole. */
static bool row_op(const kiln_graph *g, int v) {
    const kiln_value *x = &g->v[v];
    return !x->dead && x->kind == KILN_V_OP && kiln_op_get(x->op)->row && x->meta.dtype == KILN_F32;
}

typedef struct {
    int *start, *list; /* consumers of value v: list[start[v] .. start[v+1]) */
} users;

static bool build_users(const kiln_graph *g, users *u) {
    u->start = calloc((size_t)g->n + 1, sizeof(int));
    int total = 0;
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind != KILN_V_AUX) total += g->v[i].n_in;
    u->list = malloc(sizeof(int) * (size_t)(total + 1));
    if (!u->start || !u->list) return false;
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind != KILN_V_AUX)
            for (int j = 0; j < g->v[i].n_in; j++) u->start[g->v[i].in[j] + 1]++;
    for (int i = 0; i < g->n; i++) u->start[i + 1] += u->start[i];
    int *fill = calloc((size_t)g->n, sizeof(int));
    if (!fill) return false;
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind != KILN_V_AUX)
            for (int j = 0; j < g->v[i].n_in; j++) {
                int p = g->v[i].in[j];
                u->list[u->start[p] + fill[p]++] = i;
            }
    free(fill);
    return true;
}

/* Can the members of groups a and b (ids, -1 = none) plus v run together at
 * v? Every outside reader of a member must come after v. */
static bool legal(const kiln_graph *g, const users *u, const int *grp, int a, int b, int v) {
    for (int m = 0; m < v; m++) {
        if (grp[m] < 0 || (grp[m] != a && grp[m] != b)) continue;
        for (int k = u->start[m]; k < u->start[m + 1]; k++) {
            int c = u->list[k];
            bool inside = c == v || (grp[c] >= 0 && (grp[c] == a || grp[c] == b));
            if (!inside && c < v) return false;
        }
    }
    (void)g;
    return true;
}

int kiln_graph_exec_pos(const kiln_graph *g, int v) {
    int k = g->v[v].group;
    if (k == KILN_GROUP_NONE || !g->group_start) return v;
    return g->group_members[g->group_start[k + 1] - 1];
}

int kiln_pass_fuse(kiln_graph *g) {
    users u = {0};
    int *grp = malloc(sizeof(int) * (size_t)g->n);
    if (!grp || !build_users(g, &u)) {
        free(grp);
        free(u.start);
        free(u.list);
        return 0;
    }
    int next = 0;
    bool *has_row = calloc((size_t)g->n + 1, sizeof *has_row);
    for (int v = 0; v < g->n && has_row; v++) {
        grp[v] = -1;
        if (row_op(g, v)) {
            int p = g->v[v].in[0];
            if (grp[p] >= 0 && !has_row[grp[p]] && kiln_meta_numel(&g->v[p].meta) == kiln_meta_numel(&g->v[v].meta) &&
                legal(g, &u, grp, grp[p], -1, v)) {
                grp[v] = grp[p];
                has_row[grp[v]] = true;
            }
            continue;
        }
        if (!fusable(g, v)) continue;
        /* a bf16 cast of a row kernel's result joins it as its epilogue */
        if (g->v[v].op == KILN_OP_CAST_BF16) {
            int p = g->v[v].in[0];
            if (grp[p] >= 0 && has_row[grp[p]] && row_op(g, p) && legal(g, &u, grp, grp[p], -1, v)) {
                grp[v] = grp[p];
                continue;
            }
        }
        int64_t n = kiln_meta_numel(&g->v[v].meta);
        int cand[KILN_OP_MAX_IN], nc = 0;
        for (int j = 0; j < g->v[v].n_in; j++) {
            int p = g->v[v].in[j];
            if (grp[p] >= 0 && !has_row[grp[p]] && kiln_meta_numel(&g->v[p].meta) == n) cand[nc++] = grp[p];
        }
        int chosen = -1;
        for (int c = 0; c < nc && chosen < 0; c++)
            if (legal(g, &u, grp, cand[c], -1, v)) chosen = cand[c];
        if (chosen >= 0) {
            /* pull in a second producer group too when that stays legal */
            for (int c = 0; c < nc; c++)
                if (cand[c] != chosen && cand[c] != -1 && legal(g, &u, grp, chosen, cand[c], v)) {
                    for (int m = 0; m < v; m++)
                        if (grp[m] == cand[c]) grp[m] = chosen;
                }
            grp[v] = chosen;
        } else {
            grp[v] = next++;
        }
    }
    free(has_row);
    /* renumber densely and lay out member lists */
    int *map = malloc(sizeof(int) * (size_t)(next + 1)), *count = calloc((size_t)next + 1, sizeof(int));
    int n_groups = 0, fused = 0;
    for (int i = 0; i < next; i++) map[i] = -1;
    for (int v = 0; v < g->n; v++)
        if (grp[v] >= 0) {
            if (map[grp[v]] < 0) map[grp[v]] = n_groups++;
            g->v[v].group = map[grp[v]];
            count[g->v[v].group]++;
        } else {
            g->v[v].group = KILN_GROUP_NONE;
        }
    free(g->group_start);
    free(g->group_members);
    g->group_start = calloc((size_t)n_groups + 1, sizeof(int));
    g->group_members = malloc(sizeof(int) * (size_t)(g->n + 1));
    for (int k = 0; k < n_groups; k++) {
        g->group_start[k + 1] = g->group_start[k] + count[k];
        fused += count[k] > 1;
    }
    memset(count, 0, sizeof(int) * (size_t)(next + 1));
    for (int v = 0; v < g->n; v++)
        if (g->v[v].group != KILN_GROUP_NONE) g->group_members[g->group_start[g->v[v].group] + count[g->v[v].group]++] = v;
    g->n_groups = n_groups;
    /* internal: every reader inside the group, and not a graph result */
    for (int v = 0; v < g->n; v++) {
        kiln_value *x = &g->v[v];
        x->internal = false;
        if (x->group == KILN_GROUP_NONE || u.start[v] == u.start[v + 1]) continue;
        bool inside = true;
        for (int k = u.start[v]; k < u.start[v + 1] && inside; k++) inside = g->v[u.list[k]].group == x->group;
        for (int i = 0; i < g->n_outputs; i++) inside &= g->outputs[i] != v;
        x->internal = inside && g->diff != v;
    }
    free(map);
    free(count);
    free(grp);
    free(u.start);
    free(u.list);
    return fused;
}
