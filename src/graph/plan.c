/* Memory planning: buffer lifetimes over the schedule (the value order),
 * offsets in one arena with best-fit reuse of freed blocks. With reuse off
 * every buffer gets its own range, so a plan can be checked against it. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

typedef struct {
    int64_t off, size;
} block;

typedef struct {
    block *b;
    int n, cap;
    int64_t end;
} freelist;

static int64_t align64(int64_t x) { return (x + 63) & ~(int64_t)63; }

static int64_t fl_alloc(freelist *f, int64_t size) {
    int best = -1;
    for (int i = 0; i < f->n; i++)
        if (f->b[i].size >= size && (best < 0 || f->b[i].size < f->b[best].size)) best = i;
    if (best >= 0) {
        int64_t off = f->b[best].off;
        f->b[best].off += size;
        f->b[best].size -= size;
        if (!f->b[best].size) {
            memmove(&f->b[best], &f->b[best + 1], sizeof(block) * (size_t)(f->n - best - 1));
            f->n--;
        }
        return off;
    }
    /* grow the arena, reusing a free tail */
    if (f->n && f->b[f->n - 1].off + f->b[f->n - 1].size == f->end) {
        int64_t off = f->b[f->n - 1].off;
        f->n--;
        f->end = off + size;
        return off;
    }
    int64_t off = f->end;
    f->end += size;
    return off;
}

static kiln_status fl_free(freelist *f, int64_t off, int64_t size) {
    if (!kiln_array_grow((void **)&f->b, &f->cap, f->n + 1, sizeof *f->b, 64))
        return kiln_error(KILN_ERR_OOM, "out of memory planning");
    int i = 0;
    while (i < f->n && f->b[i].off < off) i++;
    memmove(&f->b[i + 1], &f->b[i], sizeof(block) * (size_t)(f->n - i));
    f->b[i] = (block){off, size};
    f->n++;
    if (i + 1 < f->n && f->b[i].off + f->b[i].size == f->b[i + 1].off) { /* merge right */
        f->b[i].size += f->b[i + 1].size;
        memmove(&f->b[i + 1], &f->b[i + 2], sizeof(block) * (size_t)(f->n - i - 2));
        f->n--;
    }
    if (i > 0 && f->b[i - 1].off + f->b[i - 1].size == f->b[i].off) { /* merge left */
        f->b[i - 1].size += f->b[i].size;
        memmove(&f->b[i], &f->b[i + 1], sizeof(block) * (size_t)(f->n - i - 1));
        f->n--;
    }
    return KILN_OK;
}

static bool needs_buffer(const kiln_value *x) {
    if (x->dead) return false;
    if (x->kind == KILN_V_AUX) return true;
    return x->kind == KILN_V_OP && !kiln_op_get(x->op)->is_view && !x->acc_into_grad && !x->internal;
}

static int64_t value_bytes(const kiln_value *x) {
    return align64(kiln_meta_numel(&x->meta) * (int64_t)kiln_dtype_size(x->meta.dtype));
}

/* The values that run at schedule position i: i itself, or all of a fused
 * group at its last member; none for the group's other members. */
static int at_position(const kiln_graph *g, int i, const int **list) {
    const kiln_value *x = &g->v[i];
    if (x->group == KILN_GROUP_NONE) {
        *list = NULL;
        return 1;
    }
    if (kiln_graph_exec_pos(g, i) != i) return 0;
    *list = &g->group_members[g->group_start[x->group]];
    return g->group_start[x->group + 1] - g->group_start[x->group];
}

kiln_status kiln_pass_plan(kiln_graph *g, bool reuse) {
    kiln_graph_count_uses(g);
    for (int i = 0; i < g->n; i++) {
        kiln_value *x = &g->v[i];
        x->alias = -1;
        x->offset = -1;
        x->last_use = kiln_graph_exec_pos(g, i);
        if (!x->dead && x->kind == KILN_V_OP && kiln_op_get(x->op)->is_view) x->alias = x->in[0];
    }
    for (int i = 0; i < g->n; i++) {
        kiln_value *x = &g->v[i];
        if (x->dead || x->kind == KILN_V_AUX) continue;
        int pos = kiln_graph_exec_pos(g, i);
        for (int j = 0; j < x->n_in; j++) {
            int r = kiln_graph_root(g, x->in[j]);
            if (g->v[r].last_use < pos) g->v[r].last_use = pos;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) g->v[kiln_graph_root(g, g->outputs[i])].last_use = g->n;
    freelist f = {0};
    kiln_status st = KILN_OK;
    g->unplanned_bytes = 0;
    bool *freed = calloc((size_t)g->n, sizeof *freed);
    if (!freed) return kiln_error(KILN_ERR_OOM, "out of memory planning");
    for (int i = 0; i < g->n && !st; i++) {
        if (g->v[i].dead || g->v[i].kind == KILN_V_AUX) continue;
        const int *list;
        int cnt = at_position(g, i, &list);
        /* allocate the outputs of step i (an op's extra outputs with it) */
        for (int s = 0; s < cnt; s++) {
            int vi = list ? list[s] : i;
            kiln_value *x = &g->v[vi];
            int outs[1 + KILN_OP_MAX_AUX], n_out = 0;
            if (needs_buffer(x)) outs[n_out++] = vi;
            if (x->kind == KILN_V_OP)
                for (int a = 0; a < kiln_op_get(x->op)->n_aux; a++) outs[n_out++] = x->aux_of[a];
            for (int k = 0; k < n_out; k++) {
                kiln_value *o = &g->v[outs[k]];
                int64_t sz = value_bytes(o);
                g->unplanned_bytes += sz;
                o->offset = reuse ? fl_alloc(&f, sz) : (f.end += sz) - sz;
            }
        }
        if (!reuse) continue;
        /* release buffers whose last reader runs at step i */
        for (int s = 0; s < cnt && !st; s++) {
            int vi = list ? list[s] : i;
            const kiln_value *x = &g->v[vi];
            int self[1 + KILN_OP_MAX_AUX], n_self = 0;
            self[n_self++] = vi;
            if (x->kind == KILN_V_OP)
                for (int a = 0; a < kiln_op_get(x->op)->n_aux; a++) self[n_self++] = x->aux_of[a];
            for (int j = 0; j < x->n_in + n_self && !st; j++) {
                int r = j < x->n_in ? kiln_graph_root(g, x->in[j]) : self[j - x->n_in];
                if (g->v[r].offset >= 0 && g->v[r].last_use <= i && !freed[r]) {
                    freed[r] = true;
                    st = fl_free(&f, g->v[r].offset, value_bytes(&g->v[r]));
                }
            }
        }
    }
    g->arena_bytes = f.end;
    free(f.b);
    free(freed);
    return st;
}
