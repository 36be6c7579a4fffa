/* The graph interpreter: runs a planned graph with the registry's kernels,
 * every buffer in one arena. Compiled modules fall back to it when no C
 * compiler is at hand. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "kiln/kernels.h"

struct kiln_interp {
    const kiln_graph *g;
    void *arena;
    kiln_tensor *t;       /* one header per value, by value: not reference counted */
    void **ptrs;          /* t[v].data, for generated code */
    kiln_group_fn *groups; /* generated group kernels (NULL: chunk-wise loop) */
    int **group_args;
    kiln_step_fn step;    /* a generated whole step */
    bool *ready_after;    /* GRAD_ACC sinks that complete their parameter's gradient */
    kiln_status step_status;
    bool dynamic;         /* group kernels take their element count as a last argument */
    bool shared_arena;    /* the arena belongs to another interpreter */
};

static void set_data(kiln_interp *r, int v, void *p) {
    r->t[v].data = p;
    r->ptrs[v] = p;
}

void kiln_interp_bind_group(kiln_interp *r, int k, kiln_group_fn fn) {
    if (k >= 0 && k < r->g->n_groups) r->groups[k] = fn;
}
void kiln_interp_bind_step(kiln_interp *r, kiln_step_fn fn) { r->step = fn; }

int kiln_interp_group_args(const kiln_interp *r, int k, void **args, int cap) {
    const int *ids = r->group_args[k];
    int n = ids[0] < cap ? ids[0] : cap;
    for (int q = 0; q < n; q++) args[q] = r->ptrs[ids[q + 1]];
    if (r->dynamic && n < cap)
        args[n++] = (void *)(intptr_t)kiln_meta_numel(&r->g->v[r->g->group_members[r->g->group_start[k]]].meta);
    return n;
}

const kiln_tensor *kiln_interp_tensor(const kiln_interp *r, int v) { return &r->t[v]; }

void kiln_interp_zero_arena(kiln_interp *r) { memset(r->arena, 0, (size_t)(r->g->arena_bytes ? r->g->arena_bytes : 64)); }

static kiln_status interp_init(const kiln_graph *g, kiln_interp *owner, kiln_interp **out);

kiln_status kiln_interp_new(const kiln_graph *g, kiln_interp **out) { return interp_init(g, NULL, out); }

kiln_status kiln_interp_new_shared(const kiln_graph *g, kiln_interp *owner, kiln_interp **out) {
    if (g->arena_bytes > owner->g->arena_bytes)
        return kiln_error(KILN_ERR_INVALID, "shared arena: %lld bytes needed, %lld available", (long long)g->arena_bytes,
                          (long long)owner->g->arena_bytes);
    return interp_init(g, owner, out);
}

void kiln_interp_set_dynamic(kiln_interp *r, bool on) { r->dynamic = on; }

static kiln_status interp_init(const kiln_graph *g, kiln_interp *owner, kiln_interp **out) {
    kiln_interp *r = calloc(1, sizeof *r);
    if (!r) return kiln_error(KILN_ERR_OOM, "out of memory");
    r->g = g;
    r->shared_arena = owner != NULL;
    r->t = calloc((size_t)g->n, sizeof *r->t);
    r->ptrs = calloc((size_t)g->n, sizeof *r->ptrs);
    r->groups = calloc((size_t)g->n_groups + 1, sizeof *r->groups);
    r->group_args = calloc((size_t)g->n_groups + 1, sizeof *r->group_args);
    r->ready_after = calloc((size_t)g->n + 1, sizeof *r->ready_after);
    r->arena = owner ? owner->arena : kiln_alloc((size_t)(g->arena_bytes ? g->arena_bytes : 64));
    if (!r->t || !r->ptrs || !r->groups || !r->group_args || !r->ready_after || !r->arena) {
        kiln_interp_free(r);
        return kiln_error(KILN_ERR_OOM, "out of memory for a %lld-byte arena", (long long)g->arena_bytes);
    }
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        kiln_tensor *t = &r->t[i];
        t->ndim = x->meta.ndim;
        memcpy(t->shape, x->meta.shape, sizeof t->shape);
        t->dtype = x->meta.dtype;
        t->refcount = 1;
        if (x->offset >= 0) set_data(r, i, (char *)r->arena + x->offset);
    }
    /* the last gradient sink of each parameter completes its gradient */
    for (int i = g->n - 1; i >= 0; i--) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind != KILN_V_GRAD_ACC) continue;
        bool later = false;
        for (int j = i + 1; j < g->n && !later; j++)
            later = !g->v[j].dead && g->v[j].kind == KILN_V_GRAD_ACC && g->v[j].index == x->index;
        r->ready_after[i] = !later;
    }
    for (int k = 0; k < g->n_groups; k++) {
        int ids[KILN_OP_MAX_IN * 64];
        int n = kiln_graph_group_args(g, k, ids, (int)(sizeof ids / sizeof ids[0]));
        r->group_args[k] = malloc(sizeof(int) * (size_t)(n + 1));
        if (!r->group_args[k]) {
            kiln_interp_free(r);
            return kiln_error(KILN_ERR_OOM, "out of memory");
        }
        r->group_args[k][0] = n;
        memcpy(r->group_args[k] + 1, ids, sizeof(int) * (size_t)n);
    }
    *out = r;
    return KILN_OK;
}

void kiln_interp_free(kiln_interp *r) {
    if (!r) return;
    if (!r->shared_arena) kiln_dealloc(r->arena);
    for (int k = 0; r->group_args && k < r->g->n_groups; k++) free(r->group_args[k]);
    free(r->group_args);
    free(r->groups);
    free(r->ready_after);
    free(r->ptrs);
    free(r->t);
    free(r);
}

static kiln_status grad_buffer(kiln_tensor *p) {
    if (p->grad) return KILN_OK;
    p->grad = kiln_tensor_zeros(KILN_F32, p->ndim, p->shape);
    return p->grad ? KILN_OK : kiln_last_status();
}

static kiln_status run_op(kiln_interp *r, int i) {
    const kiln_value *x = &r->g->v[i];
    const kiln_op_def *d = kiln_op_get(x->op);
    if (d->is_view) {
        set_data(r, i, r->t[x->in[0]].data);
        return KILN_OK;
    }
    kiln_tensor *in[KILN_OP_MAX_IN];
    for (int j = 0; j < x->n_in; j++) in[j] = &r->t[x->in[j]];
    if (x->acc_into_grad) {
        kiln_tensor *p = r->g->params[x->index];
        kiln_status st = grad_buffer(p);
        return st ? st : kiln_matmul_into(in[0], in[1], &x->attrs, p->grad, 1.0f);
    }
    if (d->n_aux) {
        kiln_tensor *aux[KILN_OP_MAX_AUX];
        for (int a = 0; a < d->n_aux; a++) aux[a] = &r->t[x->aux_of[a]];
        return d->forward_aux(in, &x->attrs, &r->t[i], aux);
    }
    return d->forward(in, &x->attrs, &r->t[i]);
}

/* A fused group, chunk by chunk: each member's kernel runs on a slice small
 * enough to stay in cache, internal members in per-thread scratch, so the
 * chain makes one pass over memory. (Generated code replaces this loop with
 * one fused expression per element.) */
#define CHUNK 2048
static kiln_status run_group(kiln_interp *r, int k) {
    const kiln_graph *g = r->g;
    if (r->groups[k]) {
        void *args[KILN_OP_MAX_IN * 64];
        const int *ids = r->group_args[k];
        for (int q = 0; q < ids[0]; q++) args[q] = r->ptrs[ids[q + 1]];
        if (r->dynamic) args[ids[0]] = (void *)(intptr_t)kiln_meta_numel(&g->v[g->group_members[g->group_start[k]]].meta);
        r->groups[k](args);
        return KILN_OK;
    }
    const int *mem = &g->group_members[g->group_start[k]];
    int nm = g->group_start[k + 1] - g->group_start[k];
    int64_t N = kiln_meta_numel(&g->v[mem[0]].meta);
    /* a group with a row reduction works on whole rows */
    int64_t row = 1;
    for (int s = 0; s < nm; s++) {
        const kiln_value *x = &g->v[mem[s]];
        if (kiln_op_get(x->op)->row) row = x->meta.shape[x->meta.ndim - 1];
    }
    int64_t ch = row >= CHUNK ? row : (CHUNK / row) * row, nchunks = (N + ch - 1) / ch;
    kiln_status st = KILN_OK;
#pragma omp parallel if (nchunks > 1)
    {
        float *scratch = kiln_alloc(sizeof(float) * (size_t)ch * (size_t)nm);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            if (!scratch) continue;
            int64_t off = c * ch, len = N - off < ch ? N - off : ch;
            for (int s = 0; s < nm; s++) {
                const kiln_value *x = &g->v[mem[s]];
                kiln_tensor hin[KILN_OP_MAX_IN], hout = {.ndim = 1, .shape = {len}, .dtype = x->meta.dtype, .refcount = 1};
                kiln_tensor *in[KILN_OP_MAX_IN];
                for (int j = 0; j < x->n_in; j++) {
                    int src = x->in[j];
                    const kiln_value *xs = &g->v[src];
                    hin[j] = (kiln_tensor){.ndim = 1, .shape = {len}, .dtype = KILN_F32, .refcount = 1};
                    if (xs->group == k && xs->internal) {
                        int idx = 0;
                        while (mem[idx] != src) idx++;
                        hin[j].data = scratch + (size_t)idx * (size_t)ch;
                    } else if (kiln_meta_numel(&xs->meta) != N) { /* a scalar or a norm weight: whole */
                        hin[j] = r->t[src];
                    } else {
                        hin[j].data = (float *)r->t[src].data + off;
                    }
                    in[j] = &hin[j];
                }
                hout.data = x->internal ? (void *)(scratch + (size_t)s * (size_t)ch)
                                        : (void *)((char *)r->t[mem[s]].data + (size_t)off * kiln_dtype_size(x->meta.dtype));
                const kiln_op_def *d = kiln_op_get(x->op);
                kiln_attrs at = x->attrs;
                if (d->indexed) at.i[5] += off; /* the slice's first element index */
                d->forward(in, &at, &hout);
            }
        }
        if (!scratch) st = KILN_ERR_OOM;
        kiln_dealloc(scratch);
    }
    return st ? kiln_error(st, "out of memory for fused-group scratch") : KILN_OK;
}

/* Runs schedule position i (a value, or a fused group at its last member). */
static kiln_status run_position(kiln_interp *r, int i) {
    const kiln_graph *g = r->g;
    const kiln_value *x = &g->v[i];
    if (x->dead) return KILN_OK;
    kiln_status st = KILN_OK;
    switch (x->kind) {
    case KILN_V_INPUT:
    case KILN_V_PARAM:
    case KILN_V_AUX: break; /* bound at the start / written by the producer */
    case KILN_V_OP:
        if (x->group == KILN_GROUP_NONE) st = run_op(r, i);
        else if (kiln_graph_exec_pos(g, i) == i) st = run_group(r, x->group);
        break;
    case KILN_V_GRAD_ACC:
        if (g->v[x->in[0]].acc_into_grad) { /* the GEMM already added into .grad */
            if (r->ready_after[i]) kiln_grad_ready(g->params[x->index]);
            break;
        }
        st = grad_buffer(g->params[x->index]);
        if (st) break;
        if (x->n_in == 2) { /* grad += scalar * value */
            kiln_tensor *gr = g->params[x->index]->grad;
            if (kiln_tensor_numel(gr) != kiln_tensor_numel(&r->t[x->in[0]])) {
                st = kiln_error(KILN_ERR_SHAPE, "scaled gradient accumulation: sizes differ");
                break;
            }
            kiln_k_axpy(kiln_f32(&r->t[x->in[1]])[0], kiln_f32(&r->t[x->in[0]]), kiln_f32(gr), kiln_tensor_numel(gr));
        } else {
            st = kiln_op_accumulate(g->params[x->index]->grad, &r->t[x->in[0]]);
        }
        if (!st && r->ready_after[i]) kiln_grad_ready(g->params[x->index]);
        break;
    }
    if (st) return kiln_error_context(st, "graph value %d (%s)", i, x->kind == KILN_V_OP ? kiln_op_name(x->op) : "sink");
    return KILN_OK;
}

static int step_callback(void *ctx, int v) {
    kiln_interp *r = ctx;
    if (r->step_status) return 1;
    r->step_status = run_position(r, v);
    return r->step_status != KILN_OK;
}

kiln_status kiln_interp_run(kiln_interp *r, kiln_tensor *const *inputs, float *report) {
    const kiln_graph *g = r->g;
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead) continue;
        if (x->kind == KILN_V_INPUT) {
            const kiln_tensor *in = inputs[x->index];
            kiln_meta m = kiln_meta_of(in);
            if (m.ndim != x->meta.ndim || m.dtype != x->meta.dtype || memcmp(m.shape, x->meta.shape, sizeof(int64_t) * (size_t)m.ndim)) {
                char a[96], b[96];
                return kiln_error(KILN_ERR_SHAPE, "compiled graph: input %d is %s, compiled for %s", x->index,
                                  kiln_shape_str(in, a, sizeof a), kiln_shape_str(&r->t[i], b, sizeof b));
            }
            set_data(r, i, in->data);
        } else if (x->kind == KILN_V_PARAM) {
            set_data(r, i, g->params[x->index]->data);
        } else if (x->kind == KILN_V_GRAD_ACC) {
            kiln_status st = grad_buffer(g->params[x->index]);
            if (st) return st;
        }
    }
    if (r->step) {
        r->step_status = KILN_OK;
        r->step(r->ptrs, step_callback, r);
        if (r->step_status) return r->step_status;
    } else {
        for (int i = 0; i < g->n; i++) {
            kiln_status st = run_position(r, i);
            if (st) return st;
        }
    }
    for (int k = 0; k < g->n_outputs && report; k++) report[k] = kiln_f32(&r->t[g->outputs[k]])[0];
    return KILN_OK;
}
