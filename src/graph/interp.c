/* The graph interpreter: runs a planned graph on the device of its
 * parameters, with that backend's kernel table, inside one kiln_backend_exec
 * per run; every planned buffer is a view of one arena tensor on that device,
 * parameters and inputs are their own tensors, and host code here reads
 * nothing but the reported scalars (kiln_tensor_get). Compiled modules run
 * in it too (their group kernels and whole step get device addresses);
 * without a C compiler it runs the plan alone. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "kiln/backend.h"

struct kiln_interp {
    const kiln_graph *g;
    const kiln_backend *be; /* the device of the parameters: the arena and every kernel */
    kiln_tensor *arena;   /* on be (shared: a reference to the owner's) */
    kiln_tensor **t;      /* value v: an arena view, a bound input / parameter, a view op's view, or &blank[v] */
    kiln_tensor *blank;   /* headers (meta, no memory) of values without a buffer */
    bool *own;            /* t[v] is a reference held here */
    void **ptrs;          /* t[v]'s device address, for generated code */
    kiln_group_fn *groups; /* generated group kernels (NULL: chunk-wise loop) */
    int **group_args;
    kiln_step_fn step;    /* a generated whole step */
    bool *ready_after;    /* GRAD_ACC sinks that complete their parameter's gradient */
    kiln_status step_status;
    bool dynamic;         /* group kernels take their element count as a last argument */
};

/* Makes t value v's tensor (own: a reference the interpreter now holds). */
static void set_tensor(kiln_interp *r, int v, kiln_tensor *t, bool own) {
    if (r->own[v]) kiln_tensor_release(r->t[v]);
    r->t[v] = t;
    r->own[v] = own;
    r->ptrs[v] = kiln_tensor_ptr(t);
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

const kiln_tensor *kiln_interp_tensor(const kiln_interp *r, int v) { return r->t[v]; }

static int64_t arena_bytes(const kiln_graph *g) { return g->arena_bytes ? g->arena_bytes : 64; }

void kiln_interp_zero_arena(kiln_interp *r) {
    int64_t n = arena_bytes(r->g) / 4;
    kiln_tensor *v = kiln_tensor_view_bytes(r->arena, 0, KILN_I32, 1, &n);
    if (v) kiln_tensor_zero(v);
    kiln_tensor_release(v);
    kiln_clear_error();
}

static kiln_status interp_init(const kiln_graph *g, kiln_interp *owner, kiln_interp **out);

kiln_status kiln_interp_new(const kiln_graph *g, kiln_interp **out) { return interp_init(g, NULL, out); }

kiln_status kiln_interp_new_shared(const kiln_graph *g, kiln_interp *owner, kiln_interp **out) {
    if (g->arena_bytes > owner->g->arena_bytes)
        return kiln_error(KILN_ERR_INVALID, "shared arena: %lld bytes needed, %lld available", (long long)g->arena_bytes,
                          (long long)owner->g->arena_bytes);
    return interp_init(g, owner, out);
}

void kiln_interp_set_dynamic(kiln_interp *r, bool on) { r->dynamic = on; }

/* The device the graph runs on: its parameters' (one for all), else the
 * thread's current one; every kernel it needs must be there. */
static kiln_status pick_backend(const kiln_graph *g, const kiln_backend **out) {
    const kiln_backend *be = kiln_backend_of_inputs("compiled graph (its parameters)", g->params, g->n_params);
    if (!be) return kiln_last_status();
    if (!be->kernels[KILN_KERNEL_ACCUMULATE])
        return kiln_error(KILN_ERR_UNSUPPORTED, "compiled graph: device %s has no accumulate kernel", be->name);
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (!x->dead && x->kind == KILN_V_OP && !kiln_op_get(x->op)->is_view && !be->kernels[x->op])
            return kiln_error(KILN_ERR_UNSUPPORTED, "compiled graph: op %s (value %d) has no kernel on device %s",
                              kiln_op_name(x->op), i, be->name);
    }
    *out = be;
    return KILN_OK;
}

static kiln_status interp_init(const kiln_graph *g, kiln_interp *owner, kiln_interp **out) {
    const kiln_backend *be = owner ? owner->be : NULL;
    kiln_status st = owner ? KILN_OK : pick_backend(g, &be);
    if (st) return st;
    kiln_interp *r = calloc(1, sizeof *r);
    if (!r) return kiln_error(KILN_ERR_OOM, "out of memory");
    r->g = g;
    r->be = be;
    r->t = calloc((size_t)g->n + 1, sizeof *r->t);
    r->blank = calloc((size_t)g->n + 1, sizeof *r->blank);
    r->own = calloc((size_t)g->n + 1, sizeof *r->own);
    r->ptrs = calloc((size_t)g->n + 1, sizeof *r->ptrs);
    r->groups = calloc((size_t)g->n_groups + 1, sizeof *r->groups);
    r->group_args = calloc((size_t)g->n_groups + 1, sizeof *r->group_args);
    r->ready_after = calloc((size_t)g->n + 1, sizeof *r->ready_after);
    if (!r->t || !r->blank || !r->own || !r->ptrs || !r->groups || !r->group_args || !r->ready_after) {
        kiln_interp_free(r);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    /* the arena on the device (the owner's, when shared) */
    int64_t words = arena_bytes(g) / 4;
    r->arena = owner ? kiln_tensor_retain(owner->arena) : kiln_tensor_new_on(be->buft, KILN_I32, 1, &words);
    if (!r->arena) {
        kiln_interp_free(r);
        return kiln_error_context(kiln_last_status(), "a %lld-byte arena on %s", (long long)arena_bytes(g), be->name);
    }
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        kiln_tensor *t = &r->blank[i];
        t->ndim = x->meta.ndim;
        memcpy(t->shape, x->meta.shape, sizeof t->shape);
        t->dtype = x->meta.dtype;
        t->refcount = 1;
        r->t[i] = t;
        if (x->offset < 0) continue;
        kiln_tensor *v = kiln_tensor_view_bytes(r->arena, (size_t)x->offset, x->meta.dtype, x->meta.ndim, x->meta.shape);
        if (!v) {
            st = kiln_last_status();
            kiln_interp_free(r);
            return kiln_error_context(st, "graph value %d's planned buffer", i);
        }
        set_tensor(r, i, v, true);
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
    for (int i = 0; r->own && i < r->g->n; i++)
        if (r->own[i]) kiln_tensor_release(r->t[i]);
    kiln_tensor_release(r->arena);
    for (int k = 0; r->group_args && k < r->g->n_groups; k++) free(r->group_args[k]);
    free(r->group_args);
    free(r->groups);
    free(r->ready_after);
    free(r->ptrs);
    free(r->own);
    free(r->blank);
    free(r->t);
    free(r);
}

/* a parameter's gradient, made (zeros) on the parameter's device */
static kiln_status grad_buffer(kiln_tensor *p) {
    if (p->grad) return KILN_OK;
    p->grad = kiln_tensor_zeros_on(kiln_tensor_buft(p), KILN_F32, p->ndim, p->shape);
    return p->grad ? KILN_OK : kiln_last_status();
}

/* Everything below runs inside the backend's exec (kiln_interp_run): the
 * kernels come from its table and are handed device addresses only. */
static kiln_status run_op(kiln_interp *r, int i) {
    const kiln_value *x = &r->g->v[i];
    const kiln_op_def *d = kiln_op_get(x->op);
    if (d->is_view) { /* the input's memory under this value's shape */
        kiln_tensor *src = r->t[x->in[0]], *cur = r->t[i];
        if (r->own[i] && cur->storage == src->storage && kiln_tensor_ptr(cur) == kiln_tensor_ptr(src)) return KILN_OK;
        kiln_tensor *v = kiln_tensor_view(src, x->meta.ndim, x->meta.shape);
        if (!v) return kiln_last_status();
        set_tensor(r, i, v, true);
        return KILN_OK;
    }
    kiln_tensor *in[KILN_OP_MAX_IN];
    for (int j = 0; j < x->n_in; j++) in[j] = r->t[x->in[j]];
    if (x->acc_into_grad) {
        kiln_tensor *p = r->g->params[x->index];
        kiln_status st = grad_buffer(p);
        return st ? st : kiln_matmul_into(in[0], in[1], &x->attrs, p->grad, 1.0f);
    }
    if (d->n_aux) {
        kiln_tensor *aux[KILN_OP_MAX_AUX];
        for (int a = 0; a < d->n_aux; a++) aux[a] = r->t[x->aux_of[a]];
        return r->be->kernels[x->op](in, &x->attrs, r->t[i], aux);
    }
    return r->be->kernels[x->op](in, &x->attrs, r->t[i], NULL);
}

/* A header for len elements of dtype dt in t's memory from byte offset off:
 * an address for a kernel (nothing is read here), on the stack, sharing t's
 * storage without a reference. */
static kiln_tensor slice(const kiln_tensor *t, size_t off, kiln_dtype dt, int64_t len) {
    kiln_tensor h = {.ndim = 1, .shape = {len}, .dtype = dt, .storage = t->storage, .refcount = 1};
    char *base = kiln_tensor_ptr(t);
    h.data = base ? base + off : NULL;
    return h;
}

/* A fused group, chunk by chunk: each member's kernel runs on a slice small
 * enough to stay in cache, internal members in per-thread scratch (on the
 * device), so the chain makes one pass over memory. (Generated code
 * replaces this loop with one fused expression per element.) */
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
    kiln_status st = KILN_OK, failed = KILN_OK;
    const kiln_op_kernel *kern = r->be->kernels;
#pragma omp parallel if (nchunks > 1)
    {
        int64_t scratch_n = ch * nm;
        kiln_tensor *scratch = kiln_tensor_new_on(r->be->buft, KILN_F32, 1, &scratch_n);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            if (!scratch) continue;
            int64_t off = c * ch, len = N - off < ch ? N - off : ch;
            for (int s = 0; s < nm; s++) {
                const kiln_value *x = &g->v[mem[s]];
                kiln_tensor hin[KILN_OP_MAX_IN], hout;
                kiln_tensor *in[KILN_OP_MAX_IN];
                for (int j = 0; j < x->n_in; j++) {
                    int src = x->in[j];
                    const kiln_value *xs = &g->v[src];
                    if (xs->group == k && xs->internal) {
                        int idx = 0;
                        while (mem[idx] != src) idx++;
                        hin[j] = slice(scratch, (size_t)idx * (size_t)ch * sizeof(float), KILN_F32, len);
                    } else if (kiln_meta_numel(&xs->meta) != N) { /* a scalar or a norm weight: whole */
                        hin[j] = *r->t[src];
                    } else {
                        hin[j] = slice(r->t[src], (size_t)off * sizeof(float), KILN_F32, len);
                    }
                    in[j] = &hin[j];
                }
                hout = x->internal ? slice(scratch, (size_t)s * (size_t)ch * sizeof(float), x->meta.dtype, len)
                                   : slice(r->t[mem[s]], (size_t)off * kiln_dtype_size(x->meta.dtype), x->meta.dtype, len);
                kiln_attrs at = x->attrs;
                if (kiln_op_get(x->op)->indexed) at.i[5] += off; /* the slice's first element index */
                kiln_status ks = kern[x->op](in, &at, &hout, NULL);
                if (ks) {
#pragma omp atomic write
                    failed = ks;
                }
            }
        }
        if (!scratch) {
#pragma omp atomic write
            st = KILN_ERR_OOM;
        }
        kiln_tensor_release(scratch);
    }
    if (st) return kiln_error(st, "out of memory for fused-group scratch on %s", r->be->name);
    if (failed) return kiln_error(failed, "fused group %d: a member's kernel failed on %s", k, r->be->name);
    return KILN_OK;
}

static kiln_graph_profile *g_profile;
void kiln_graph_profile_set(kiln_graph_profile *p) {
    if (p) memset(p, 0, sizeof *p);
    __atomic_store_n(&g_profile, p, __ATOMIC_RELEASE);
}

static kiln_status run_position_(kiln_interp *r, int i);
/* Runs schedule position i, timed into the profile when one is set. */
static kiln_status run_position(kiln_interp *r, int i) {
    kiln_graph_profile *p = __atomic_load_n(&g_profile, __ATOMIC_ACQUIRE);
    if (!p) return run_position_(r, i);
    const kiln_value *x = &r->g->v[i];
    double t0 = kiln_time_now();
    kiln_status st = run_position_(r, i);
    double dt = kiln_time_now() - t0;
    if (x->dead) return st;
    if (x->kind == KILN_V_OP && x->group != KILN_GROUP_NONE) {
        if (kiln_graph_exec_pos(r->g, i) == i) {
            p->group_seconds += dt, p->group_calls++;
            if (x->group < KILN_PROFILE_GROUPS) p->each_group_seconds[x->group] += dt, p->each_group_calls[x->group]++;
        }
    } else if (x->kind == KILN_V_OP) {
        p->op_seconds[x->op] += dt, p->op_calls[x->op]++;
        if (i < KILN_PROFILE_POSITIONS) p->each_pos_seconds[i] += dt, p->each_pos_calls[i]++;
    } else if (x->kind == KILN_V_GRAD_ACC) {
        p->acc_seconds += dt, p->acc_calls++;
    }
    return st;
}

/* Runs schedule position i (a value, or a fused group at its last member). */
static kiln_status run_position_(kiln_interp *r, int i) {
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
            if (kiln_tensor_numel(gr) != kiln_tensor_numel(r->t[x->in[0]])) {
                st = kiln_error(KILN_ERR_SHAPE, "scaled gradient accumulation: sizes differ");
                break;
            }
            kiln_tensor *in[2] = {r->t[x->in[0]], r->t[x->in[1]]};
            st = r->be->kernels[KILN_KERNEL_ACCUMULATE](in, NULL, gr, NULL);
        } else {
            st = kiln_op_accumulate(g->params[x->index]->grad, r->t[x->in[0]]);
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

static kiln_status run_all(void *ctx) {
    kiln_interp *r = ctx;
    if (r->step) {
        r->step_status = KILN_OK;
        r->step(r->ptrs, step_callback, r);
        return r->step_status;
    }
    for (int i = 0; i < r->g->n; i++) {
        kiln_status st = run_position(r, i);
        if (st) return st;
    }
    return KILN_OK;
}

kiln_status kiln_interp_run(kiln_interp *r, kiln_tensor *const *inputs, float *report) {
    const kiln_graph *g = r->g;
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead) continue;
        if (x->kind == KILN_V_INPUT) {
            kiln_tensor *in = inputs[x->index];
            kiln_meta m = kiln_meta_of(in);
            if (m.ndim != x->meta.ndim || m.dtype != x->meta.dtype || memcmp(m.shape, x->meta.shape, sizeof(int64_t) * (size_t)m.ndim)) {
                char a[96], b[96];
                return kiln_error(KILN_ERR_SHAPE, "compiled graph: input %d is %s, compiled for %s", x->index,
                                  kiln_shape_str(in, a, sizeof a), kiln_shape_str(&r->blank[i], b, sizeof b));
            }
            const kiln_backend *d = kiln_backend_of(in);
            if (d != r->be)
                return kiln_error(KILN_ERR_INVALID, "compiled graph: input %d ('%s') is on %s but the graph runs on %s "
                                  "(its parameters' device): move it with kiln_tensor_copy", x->index, in->name, d->name,
                                  r->be->name);
            set_tensor(r, i, kiln_tensor_retain(in), true); /* held until the next run */
        } else if (x->kind == KILN_V_PARAM) {
            kiln_tensor *p = g->params[x->index];
            if (kiln_backend_of(p) != r->be)
                return kiln_error(KILN_ERR_INVALID, "compiled graph: parameter '%s' is on %s but the graph runs on %s",
                                  p->name, kiln_backend_of(p)->name, r->be->name);
            set_tensor(r, i, p, false);
        } else if (x->kind == KILN_V_GRAD_ACC) {
            kiln_status st = grad_buffer(g->params[x->index]);
            if (st) return st;
        }
    }
    kiln_status st = kiln_backend_exec(r->be, run_all, r);
    if (st) return st;
    for (int k = 0; k < g->n_outputs && report; k++) {
        st = kiln_tensor_get(r->t[g->outputs[k]], 0, &report[k], sizeof report[k]);
        if (st) return kiln_error_context(st, "compiled graph: output %d", k);
    }
    return KILN_OK;
}
