/* Fusion of element-wise chains: ops with a C expression in the registry
 * (add, mul, scale, scale_by, silu, silu_backward, cast_bf16, round_bf16) over the same
 * number of elements join their producers' group (or else the group of an
 * earlier op that reads one of the same inputs: one loop then reads it
 * once) when the group can still run at its last member without any
 * outside reader seeing a value too early; a row reduction with an epilogue (RMSNorm) may end a group, with a
 * bf16 cast or rounding of its result after it. Members read only inside the group
 * become `internal`: they never reach memory.
 *
 * Phases: the readers of every value; the choice of groups (greedy, in value
 * order); their layout (dense ids, member lists); which members are
 * internal. The graph is changed only once every allocation has succeeded. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

bool kiln_fusable(const kiln_graph *g, int v) {
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

/* ---- phase 1: readers ------------------------------------------------------ */
typedef struct {
    int *start, *list; /* consumers of value v: list[start[v] .. start[v+1]) */
} users;

static void users_free(users *u) {
    free(u->start);
    free(u->list);
}

static kiln_status build_users(const kiln_graph *g, users *u) {
    int total = 0;
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind != KILN_V_AUX) total += g->v[i].n_in;
    u->start = calloc((size_t)g->n + 1, sizeof(int));
    u->list = malloc(sizeof(int) * (size_t)(total + 1));
    int *fill = calloc((size_t)g->n + 1, sizeof(int));
    if (!u->start || !u->list || !fill) {
        free(fill);
        return kiln_error(KILN_ERR_OOM, "out of memory fusing");
    }
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind != KILN_V_AUX)
            for (int j = 0; j < g->v[i].n_in; j++) u->start[g->v[i].in[j] + 1]++;
    for (int i = 0; i < g->n; i++) u->start[i + 1] += u->start[i];
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind != KILN_V_AUX)
            for (int j = 0; j < g->v[i].n_in; j++) {
                int p = g->v[i].in[j];
                u->list[u->start[p] + fill[p]++] = i;
            }
    free(fill);
    return KILN_OK;
}

/* ---- phase 2: choosing groups ------------------------------------------------ */
/* Can the members of groups a and b (ids, -1 = none) plus v run together at
 * v? Every outside reader of a member must come after v. */
static bool legal(const users *u, const int *grp, int a, int b, int v) {
    for (int m = 0; m < v; m++) {
        if (grp[m] < 0 || (grp[m] != a && grp[m] != b)) continue;
        for (int k = u->start[m]; k < u->start[m + 1]; k++) {
            int c = u->list[k];
            bool inside = c == v || (grp[c] >= 0 && (grp[c] == a || grp[c] == b));
            if (!inside && c < v) return false;
        }
    }
    return true;
}

/* A row op joins its input's group as that group's end (one per group). */
static void place_row_op(const kiln_graph *g, const users *u, int *grp, bool *has_row, int v) {
    int p = g->v[v].in[0];
    if (grp[p] >= 0 && !has_row[grp[p]] && kiln_meta_numel(&g->v[p].meta) == kiln_meta_numel(&g->v[v].meta) &&
        legal(u, grp, grp[p], -1, v)) {
        grp[v] = grp[p];
        has_row[grp[v]] = true;
    }
}

/* An element-wise op joins a producer's group, or else the group of an
 * earlier reader of one of its inputs (pulling in further such groups where
 * that stays legal), or starts a group of its own. */
#define MAX_SIBLINGS 8
static void place_elementwise(const kiln_graph *g, const users *u, int *grp, const bool *has_row, int v, int *next) {
    /* a bf16 cast (or rounding) of a row kernel's result joins it as its
     * epilogue */
    if (g->v[v].op == KILN_OP_CAST_BF16 || g->v[v].op == KILN_OP_ROUND_BF16) {
        int p = g->v[v].in[0];
        if (grp[p] >= 0 && has_row[grp[p]] && row_op(g, p) && legal(u, grp, grp[p], -1, v)) {
            grp[v] = grp[p];
            return;
        }
    }
    int64_t n = kiln_meta_numel(&g->v[v].meta);
    int cand[KILN_OP_MAX_IN + MAX_SIBLINGS], nc = 0;
    for (int j = 0; j < g->v[v].n_in; j++) {
        int p = g->v[v].in[j];
        if (grp[p] >= 0 && !has_row[grp[p]] && kiln_meta_numel(&g->v[p].meta) == n) cand[nc++] = grp[p];
    }
    /* then the groups of earlier readers of the same inputs (siblings): one
     * loop then reads the shared inputs once */
    const int np = nc;
    for (int j = 0; j < g->v[v].n_in; j++) {
        int p = g->v[v].in[j];
        if (kiln_meta_numel(&g->v[p].meta) != n) continue;
        for (int k = u->start[p]; k < u->start[p + 1] && nc < np + MAX_SIBLINGS; k++) {
            int c = u->list[k], gc = c < v ? grp[c] : -1;
            bool seen = gc < 0 || has_row[gc];
            for (int i = 0; i < nc && !seen; i++) seen = cand[i] == gc;
            if (!seen) cand[nc++] = gc;
        }
    }
    int chosen = -1;
    for (int c = 0; c < nc && chosen < 0; c++)
        if (legal(u, grp, cand[c], -1, v)) chosen = cand[c];
    if (chosen < 0) {
        grp[v] = (*next)++;
        return;
    }
    for (int c = 0; c < nc; c++)
        if (cand[c] != chosen && legal(u, grp, chosen, cand[c], v))
            for (int m = 0; m < v; m++)
                if (grp[m] == cand[c]) grp[m] = chosen;
    grp[v] = chosen;
}

/* grp[v]: a provisional group id or -1; *n_ids: ids handed out. */
static kiln_status choose_groups(const kiln_graph *g, const users *u, int *grp, int *n_ids) {
    bool *has_row = calloc((size_t)g->n + 1, sizeof *has_row);
    if (!has_row) return kiln_error(KILN_ERR_OOM, "out of memory fusing");
    int next = 0;
    for (int v = 0; v < g->n; v++) {
        grp[v] = -1;
        if (row_op(g, v)) place_row_op(g, u, grp, has_row, v);
        else if (kiln_fusable(g, v)) place_elementwise(g, u, grp, has_row, v, &next);
    }
    free(has_row);
    *n_ids = next;
    return KILN_OK;
}

/* ---- phase 3: layout ------------------------------------------------------------- */
/* Dense group ids in order of first member, member lists in value order. */
static kiln_status lay_out_groups(kiln_graph *g, const int *grp, int n_ids, int *fused) {
    int *map = malloc(sizeof(int) * (size_t)(n_ids + 1)), *count = calloc((size_t)n_ids + 1, sizeof(int));
    int *start = NULL, *members = NULL, n_groups = 0;
    if (map && count) {
        for (int i = 0; i < n_ids; i++) map[i] = -1;
        for (int v = 0; v < g->n; v++)
            if (grp[v] >= 0 && map[grp[v]] < 0) map[grp[v]] = n_groups++;
        start = calloc((size_t)n_groups + 1, sizeof(int));
        members = malloc(sizeof(int) * (size_t)(g->n + 1));
    }
    if (!map || !count || !start || !members) {
        free(map), free(count), free(start), free(members);
        return kiln_error(KILN_ERR_OOM, "out of memory fusing");
    }
    for (int v = 0; v < g->n; v++) {
        g->v[v].group = grp[v] >= 0 ? map[grp[v]] : KILN_GROUP_NONE;
        if (grp[v] >= 0) count[g->v[v].group]++;
    }
    *fused = 0;
    for (int k = 0; k < n_groups; k++) {
        start[k + 1] = start[k] + count[k];
        *fused += count[k] > 1;
    }
    memset(count, 0, sizeof(int) * (size_t)(n_ids + 1));
    for (int v = 0; v < g->n; v++)
        if (g->v[v].group != KILN_GROUP_NONE) members[start[g->v[v].group] + count[g->v[v].group]++] = v;
    free(g->group_start);
    free(g->group_members);
    g->group_start = start;
    g->group_members = members;
    g->n_groups = n_groups;
    free(map);
    free(count);
    return KILN_OK;
}

/* ---- phase 4: internal values -------------------------------------------------------- */
/* Internal: every reader inside the group, and not a graph result. */
static void mark_internal(kiln_graph *g, const users *u) {
    for (int v = 0; v < g->n; v++) {
        kiln_value *x = &g->v[v];
        x->internal = false;
        if (x->group == KILN_GROUP_NONE || u->start[v] == u->start[v + 1]) continue;
        bool inside = true;
        for (int k = u->start[v]; k < u->start[v + 1] && inside; k++) inside = g->v[u->list[k]].group == x->group;
        for (int i = 0; i < g->n_outputs; i++) inside &= g->outputs[i] != v;
        x->internal = inside && g->diff != v;
    }
}

kiln_status kiln_pass_fuse(kiln_graph *g, int *fused_out) {
    users u = {0};
    int *grp = malloc(sizeof(int) * (size_t)(g->n + 1)), n_ids = 0, fused = 0;
    kiln_status st = grp ? build_users(g, &u) : kiln_error(KILN_ERR_OOM, "out of memory fusing");
    if (!st) st = choose_groups(g, &u, grp, &n_ids);
    if (!st) st = lay_out_groups(g, grp, n_ids, &fused);
    if (!st) mark_internal(g, &u);
    free(grp);
    users_free(&u);
    if (fused_out) *fused_out = st ? 0 : fused;
    return st;
}
