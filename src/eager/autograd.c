/* The eager dispatcher and the autograd tape. */
#include <stdlib.h>
#include <string.h>
#include "kiln/eager.h"

typedef struct node {
    kiln_node_base base;
    kiln_bw_ctx ctx;
    struct node *next[KILN_OP_MAX_IN]; /* producer of input i (retained) */
    kiln_tensor *leaf[KILN_OP_MAX_IN]; /* parameter input i (retained) */
    kiln_tensor *gout;                 /* gradient gathered during backward */
    int mark;                          /* DFS state */
    bool freed;                        /* saved tensors already released */
} node;

static _Thread_local bool grad_off;
static _Thread_local kiln_op_profile *profile; /* per-op time when profiling */

static void free_saved(node *n) {
    for (int i = 0; i < KILN_OP_MAX_IN; i++) {
        kiln_tensor_release(n->ctx.in[i]);
        n->ctx.in[i] = NULL;
    }
    kiln_tensor_release(n->ctx.out);
    n->ctx.out = NULL;
    for (int i = 0; i < KILN_OP_MAX_AUX; i++) {
        kiln_tensor_release(n->ctx.aux[i]);
        n->ctx.aux[i] = NULL;
    }
    n->freed = true;
}

static void node_destroy(kiln_node_base *b) {
    node *n = (node *)b;
    free_saved(n);
    for (int i = 0; i < KILN_OP_MAX_IN; i++) {
        if (n->next[i]) kiln_node_release(&n->next[i]->base);
        kiln_tensor_release(n->leaf[i]);
    }
    kiln_tensor_release(n->gout);
    free(n);
}

/* A header-only alias that shares storage but not the producer link, so a
 * node saving its own output makes no reference cycle. */
static kiln_tensor *saved_alias(kiln_tensor *t) {
    return kiln_tensor_view(t, t->ndim, t->shape); /* a tensor wrapping memory gets a header on the same memory */
}

static kiln_tensor *eager_dispatch(void *ctx, int op, kiln_tensor *const *in, int n_in, const kiln_attrs *attrs,
                                   const kiln_meta *out_meta, kiln_tensor **aux) {
    (void)ctx;
    double t0 = profile ? kiln_time_now() : 0;
    kiln_tensor *t = kiln_op_execute(op, in, attrs, out_meta, aux);
    if (profile) {
        kiln_meta im[KILN_OP_MAX_IN];
        for (int i = 0; i < n_in; i++) im[i] = kiln_meta_of(in[i]);
        profile[op].seconds += kiln_time_now() - t0;
        profile[op].calls++;
        profile[op].flops += kiln_op_flops(op, im, attrs, out_meta);
    }
    if (!t || grad_off) return t;
    const kiln_op_def *d = kiln_op_get(op);
    bool any = false, needs[KILN_OP_MAX_IN] = {0};
    for (int i = 0; i < n_in; i++) {
        needs[i] = !(d->nondiff_in & (1u << i)) && (in[i]->requires_grad || in[i]->node);
        any |= needs[i];
    }
    if (!any) return t;
    node *n = calloc(1, sizeof *n);
    if (!n) {
        kiln_tensor_release(t);
        kiln_error(KILN_ERR_OOM, "out of memory recording op %s", d->name);
        return NULL;
    }
    n->base.refcount = 1;
    n->base.destroy = node_destroy;
    n->ctx.op = op;
    n->ctx.attrs = *attrs;
    n->ctx.n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        n->ctx.in_meta[i] = kiln_meta_of(in[i]);
        n->ctx.needs[i] = needs[i];
        if (d->save_in & (1u << i)) n->ctx.in[i] = saved_alias(in[i]);
        if (!needs[i]) continue;
        if (in[i]->node) {
            n->next[i] = (node *)in[i]->node;
            __atomic_add_fetch(&in[i]->node->refcount, 1, __ATOMIC_RELAXED);
        } else {
            n->leaf[i] = kiln_tensor_retain(in[i]);
        }
    }
    if (d->save_out) n->ctx.out = saved_alias(t);
    if (d->save_aux)
        for (int i = 0; i < d->n_aux; i++) n->ctx.aux[i] = saved_alias(aux[i]);
    t->node = &n->base;
    return t;
}

void kiln_eager_enable(void) { kiln_op_set_dispatcher((kiln_dispatcher){eager_dispatch, NULL}); }
void kiln_eager_disable(void) { kiln_op_set_dispatcher((kiln_dispatcher){0}); }
bool kiln_grad_set_enabled(bool on) {
    bool was = !grad_off;
    grad_off = !on;
    return was;
}
bool kiln_grad_enabled(void) { return !grad_off; }
void kiln_eager_profile(kiln_op_profile *table) {
    profile = table;
    if (table) memset(table, 0, sizeof(kiln_op_profile) * KILN_OP_COUNT);
}

/* Post-order DFS from the root; `order` receives retained nodes. */
static kiln_status collect(node *root, node ***order, int *count) {
    int cap = 256, n = 0, sp = 0, scap = 256;
    node **out = malloc(sizeof(node *) * (size_t)cap);
    struct frame { node *n; int i; } *stack = malloc(sizeof *stack * (size_t)scap);
    if (!out || !stack) goto oom;
    stack[sp++] = (struct frame){root, 0};
    root->mark = 1;
    while (sp) {
        struct frame *f = &stack[sp - 1];
        if (f->i < KILN_OP_MAX_IN) {
            node *c = f->n->next[f->i++];
            if (c && !c->mark) {
                c->mark = 1;
                if (sp == scap) {
                    scap *= 2;
                    void *p = realloc(stack, sizeof *stack * (size_t)scap);
                    if (!p) goto oom;
                    stack = p;
                }
                stack[sp++] = (struct frame){c, 0};
            }
            continue;
        }
        if (n == cap) {
            cap *= 2;
            void *p = realloc(out, sizeof(node *) * (size_t)cap);
            if (!p) goto oom;
            out = p;
        }
        __atomic_add_fetch(&f->n->base.refcount, 1, __ATOMIC_RELAXED);
        out[n++] = f->n;
        sp--;
    }
    free(stack);
    *order = out;
    *count = n;
    return KILN_OK;
oom:
    for (int i = 0; i < n; i++) kiln_node_release(&out[i]->base);
    free(out);
    free(stack);
    return kiln_error(KILN_ERR_OOM, "out of memory walking the autograd tape");
}

static kiln_status add_into(kiln_tensor **slot, kiln_tensor *g) {
    if (!*slot) {
        *slot = kiln_tensor_retain(g);
        return KILN_OK;
    }
    kiln_tensor *sum = kiln_add(*slot, g);
    if (!sum) return kiln_last_status();
    kiln_tensor_release(*slot);
    *slot = sum;
    return KILN_OK;
}

static kiln_status accumulate_leaf(kiln_tensor *p, kiln_tensor *g) {
    if (!p->grad) {
        p->grad = kiln_tensor_zeros_on(kiln_tensor_buft(p), KILN_F32, p->ndim, p->shape); /* beside the parameter */
        if (!p->grad) return kiln_last_status();
    }
    kiln_status st = kiln_op_accumulate(p->grad, g);
    return st ? kiln_error_context(st, "gradient of %s", p->name[0] ? p->name : "a parameter") : KILN_OK;
}

static kiln_status run_node(node *n) {
    const kiln_op_def *d = kiln_op_get(n->ctx.op);
    if (n->freed) return kiln_error(KILN_ERR_INVALID, "backward through op %s a second time: its saved tensors are freed", d->name);
    if (!d->backward) return kiln_error(KILN_ERR_UNSUPPORTED, "op %s has no backward rule", d->name);
    kiln_tensor *gin[KILN_OP_MAX_IN] = {0};
    kiln_status st = d->backward(&n->ctx, n->gout, gin);
    if (st) {
        for (int i = 0; i < KILN_OP_MAX_IN; i++) kiln_tensor_release(gin[i]);
        return kiln_error_context(st, "backward of op %s", d->name);
    }
    for (int i = 0; i < n->ctx.n_in && !st; i++) {
        if (!n->ctx.needs[i] || !gin[i]) continue;
        if (n->next[i]) st = add_into(&n->next[i]->gout, gin[i]);
        else if (n->leaf[i]) st = accumulate_leaf(n->leaf[i], gin[i]);
    }
    for (int i = 0; i < KILN_OP_MAX_IN; i++) kiln_tensor_release(gin[i]);
    kiln_tensor_release(n->gout);
    n->gout = NULL;
    free_saved(n);
    return st;
}

/* With a grad-ready hook: how many tape nodes still have to deliver into
 * each parameter (sorted by address, so lookups are a binary search). */
typedef struct {
    kiln_tensor *p;
    int left;
} leaf_uses;

static int cmp_leaf(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const leaf_uses *)a)->p, y = (uintptr_t)((const leaf_uses *)b)->p;
    return (x > y) - (x < y);
}

static leaf_uses *count_leaf_uses(node **order, int count, int *n_out) {
    int n = 0;
    for (int i = 0; i < count; i++)
        for (int j = 0; j < KILN_OP_MAX_IN; j++) n += order[i]->leaf[j] != NULL;
    leaf_uses *u = malloc(sizeof *u * (size_t)(n ? n : 1));
    if (!u) return NULL;
    n = 0;
    for (int i = 0; i < count; i++)
        for (int j = 0; j < KILN_OP_MAX_IN; j++)
            if (order[i]->leaf[j]) u[n++] = (leaf_uses){order[i]->leaf[j], 1};
    qsort(u, (size_t)n, sizeof *u, cmp_leaf);
    int w = 0;
    for (int i = 0; i < n; i++) {
        if (w && u[w - 1].p == u[i].p) u[w - 1].left++;
        else u[w++] = u[i];
    }
    *n_out = w;
    return u;
}

/* After node n ran (or was skipped): parameters it was the last user of are done. */
static void leaves_done(node *n, leaf_uses *u, int nu) {
    for (int j = 0; j < KILN_OP_MAX_IN; j++) {
        if (!n->leaf[j]) continue;
        leaf_uses key = {n->leaf[j], 0}, *hit = bsearch(&key, u, (size_t)nu, sizeof *u, cmp_leaf);
        if (hit && --hit->left == 0) kiln_grad_ready(hit->p);
    }
}

kiln_status kiln_backward_with(kiln_tensor *out, kiln_tensor *grad) {
    if (!out || !grad) return kiln_error_context(KILN_ERR_INVALID, "backward: NULL tensor (an earlier op failed)");
    if (kiln_tensor_numel(out) != kiln_tensor_numel(grad))
        return kiln_error(KILN_ERR_SHAPE, "backward: seed gradient has %lld elements, output %lld",
                          (long long)kiln_tensor_numel(grad), (long long)kiln_tensor_numel(out));
    if (!out->node) {
        if (out->requires_grad) {
            kiln_status st = accumulate_leaf(out, grad);
            if (!st) kiln_grad_ready(out);
            return st;
        }
        return kiln_error(KILN_ERR_INVALID, "backward: the tensor does not depend on any parameter that requires a gradient");
    }
    node **order = NULL;
    int count = 0;
    kiln_status st = collect((node *)out->node, &order, &count);
    if (st) return st;
    int n_uses = 0;
    leaf_uses *uses = kiln_grad_ready_hooked() ? count_leaf_uses(order, count, &n_uses) : NULL; /* NULL: no calls */
    bool was = kiln_grad_set_enabled(false);
    node *root = (node *)out->node;
    root->gout = kiln_tensor_retain(grad);
    for (int i = count - 1; i >= 0 && !st; i--) {
        node *n = order[i];
        if (n->gout) st = run_node(n);
        if (uses && !st) leaves_done(n, uses, n_uses);
    }
    free(uses);
    for (int i = 0; i < count; i++) {
        order[i]->mark = 0;
        kiln_tensor_release(order[i]->gout);
        order[i]->gout = NULL;
        free_saved(order[i]);
        kiln_node_release(&order[i]->base);
    }
    free(order);
    kiln_grad_set_enabled(was);
    return st;
}

kiln_status kiln_backward(kiln_tensor *loss) {
    if (!loss) return kiln_error_context(KILN_ERR_INVALID, "backward: NULL loss (an earlier op failed)");
    if (kiln_tensor_numel(loss) != 1 || loss->dtype != KILN_F32)
        return kiln_error(KILN_ERR_SHAPE, "backward: the loss must be one f32 value");
    int64_t one = 1;
    kiln_tensor *seed = kiln_tensor_new_on(kiln_tensor_buft(loss), KILN_F32, 1, &one); /* on the loss's device */
    if (!seed) return kiln_last_status();
    const float one_f = 1.0f;
    kiln_status st = kiln_tensor_set(seed, 0, &one_f, sizeof one_f);
    if (!st) st = kiln_backward_with(loss, seed);
    kiln_tensor_release(seed);
    return st;
}
