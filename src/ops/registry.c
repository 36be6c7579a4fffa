/* The op registry, the checked entry point and the dispatcher slot. Kernels
 * run through the backend of the inputs (include/kiln/backend.h). */
#include <stdarg.h>
#include <stdio.h>
#include "internal.h"
#include "kiln/backend.h"

static const kiln_op_def *const registry[KILN_OP_COUNT] = {
#define KILN_OP_ENTRY_(id, sym) [KILN_OP_##id] = &kiln_opdef_##sym,
    KILN_OP_LIST(KILN_OP_ENTRY_)
#undef KILN_OP_ENTRY_
};

const kiln_op_def *kiln_op_get(int op) { return op >= 0 && op < KILN_OP_COUNT ? registry[op] : NULL; }
const char *kiln_op_name(int op) {
    const kiln_op_def *d = kiln_op_get(op);
    return d ? d->name : "?";
}

kiln_meta kiln_meta_of(const kiln_tensor *t) { return kiln_meta_make(t->dtype, t->ndim, t->shape); }

int64_t kiln_meta_numel(const kiln_meta *m) {
    int64_t n = 1;
    for (int i = 0; i < m->ndim; i++) n *= m->shape[i];
    return n;
}
int64_t kiln_meta_rows(const kiln_meta *m) {
    return m->ndim ? kiln_meta_numel(m) / (m->shape[m->ndim - 1] ? m->shape[m->ndim - 1] : 1) : 1;
}

const char *kiln_meta_str(const kiln_meta *m, char *buf, size_t n) {
    kiln_tensor t = {.ndim = m->ndim, .dtype = m->dtype};
    memcpy(t.shape, m->shape, sizeof t.shape);
    return kiln_shape_str(&t, buf, n);
}

kiln_status kiln_op_shape_error(const char *op, const kiln_meta *in, int n_in, const char *fmt, ...) {
    char why[256], shapes[512] = "", b[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (n_in > 0) {
        size_t o = 0;
        for (int i = 0; i < n_in && o < sizeof shapes; i++)
            o += (size_t)snprintf(shapes + o, sizeof shapes - o, "%s%s", i ? ", " : "",
                                  kiln_meta_str(&in[i], b, sizeof b));
    }
    return kiln_error(KILN_ERR_SHAPE, "op %s: %s%s%s%s", op, why, n_in > 0 ? " (inputs " : "", shapes,
                      n_in > 0 ? ")" : "");
}

void kiln_attrs_set_shape(kiln_attrs *a, int ndim, const int64_t *shape) {
    a->i[0] = ndim;
    for (int i = 0; i < KILN_MAX_DIMS; i++) a->i[1 + i] = i < ndim ? shape[i] : 1;
}
kiln_meta kiln_attrs_shape(const kiln_attrs *a, kiln_dtype dt) {
    kiln_meta m = {.ndim = (int)a->i[0], .dtype = dt};
    for (int i = 0; i < m.ndim && i < KILN_MAX_DIMS; i++) m.shape[i] = a->i[1 + i];
    return m;
}

double kiln_op_flops(int op, const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out) {
    const kiln_op_def *d = kiln_op_get(op);
    if (d && d->flops) return d->flops(in, a, out);
    return d ? (double)kiln_meta_numel(out) : 0;
}

static _Thread_local kiln_dispatcher current;
static _Thread_local int scope;

int kiln_op_set_scope(int s) {
    int old = scope;
    scope = s;
    return old;
}
int kiln_op_get_scope(void) { return scope; }

static _Thread_local kiln_grad_ready_fn ready_fn;
static _Thread_local void *ready_user;

void kiln_set_grad_ready_hook(kiln_grad_ready_fn fn, void *user) {
    ready_fn = fn;
    ready_user = user;
}
void kiln_grad_ready(kiln_tensor *param) {
    if (ready_fn) ready_fn(param, ready_user);
}
bool kiln_grad_ready_hooked(void) { return ready_fn != NULL; }

kiln_dispatcher kiln_op_set_dispatcher(kiln_dispatcher d) {
    kiln_dispatcher old = current;
    current = d;
    return old;
}
kiln_dispatcher kiln_op_get_dispatcher(void) { return current; }

kiln_tensor *kiln_op_execute(int op, kiln_tensor *const *in, const kiln_attrs *attrs, const kiln_meta *out,
                             kiln_tensor **aux) {
    const kiln_op_def *d = registry[op];
    /* outputs on the device of the inputs (checked one device by kiln_op_call_aux) */
    const kiln_backend *be = kiln_backend_of_inputs(d->name, in, d->n_in);
    if (!be) return NULL;
    kiln_tensor *t = d->is_view ? kiln_tensor_view(in[0], out->ndim, out->shape)
                                : kiln_tensor_new_on(be->buft, out->dtype, out->ndim, out->shape);
    if (!t) return NULL;
    if (d->is_view) return t;
    kiln_status st = KILN_OK;
    if (d->n_aux) {
        kiln_meta am[KILN_OP_MAX_AUX];
        kiln_meta im[KILN_OP_MAX_IN];
        for (int i = 0; i < d->n_in; i++) im[i] = kiln_meta_of(in[i]);
        st = d->aux_shape(im, attrs, am);
        for (int i = 0; i < d->n_aux && !st; i++)
            if (!(aux[i] = kiln_tensor_new_on(be->buft, am[i].dtype, am[i].ndim, am[i].shape))) st = kiln_last_status();
    }
    if (!st) st = kiln_backend_run_op(be, op, in, attrs, t, d->n_aux ? aux : NULL);
    if (st != KILN_OK) {
        for (int i = 0; i < d->n_aux; i++) {
            kiln_tensor_release(aux[i]);
            aux[i] = NULL;
        }
        kiln_tensor_release(t);
        return NULL;
    }
    return t;
}

kiln_tensor *kiln_op_call_aux(int op, kiln_tensor *const *in, int n_in, const kiln_attrs *attrs, kiln_tensor **aux_out) {
    const kiln_op_def *d = kiln_op_get(op);
    if (!d) {
        kiln_error(KILN_ERR_INVALID, "unknown op %d", op);
        return NULL;
    }
    if (n_in < d->n_in || n_in > d->n_in + d->n_opt) {
        if (d->n_opt) kiln_error(KILN_ERR_INVALID, "op %s takes %d to %d inputs, got %d", d->name, d->n_in, d->n_in + d->n_opt, n_in);
        else kiln_error(KILN_ERR_INVALID, "op %s takes %d inputs, got %d", d->name, d->n_in, n_in);
        return NULL;
    }
    kiln_meta m[KILN_OP_MAX_IN] = {0}; /* an absent optional input reads as ndim 0 */
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) return NULL; /* propagate the earlier error */
        m[i] = kiln_meta_of(in[i]);
    }
    if (!kiln_backend_of_inputs(d->name, in, n_in)) return NULL;
    kiln_attrs a = attrs ? *attrs : (kiln_attrs){0};
    kiln_meta out;
    if (d->shape(m, &a, &out) != KILN_OK) return NULL;
    kiln_tensor *aux[KILN_OP_MAX_AUX] = {0};
    kiln_tensor *t = current.fn ? current.fn(current.ctx, op, in, n_in, &a, &out, aux) : kiln_op_execute(op, in, &a, &out, aux);
    for (int i = 0; i < d->n_aux; i++) {
        if (aux_out && t) aux_out[i] = aux[i];
        else kiln_tensor_release(aux[i]);
    }
    return t;
}

kiln_tensor *kiln_op_call(int op, kiln_tensor *const *in, int n_in, const kiln_attrs *attrs) {
    return kiln_op_call_aux(op, in, n_in, attrs, NULL);
}

kiln_status kiln_op_accumulate(kiln_tensor *dst, const kiln_tensor *src) {
    if (kiln_tensor_numel(dst) != kiln_tensor_numel(src) || dst->dtype != KILN_F32 || src->dtype != KILN_F32) {
        char a[96], b[96];
        return kiln_error(KILN_ERR_SHAPE, "accumulate: %s += %s does not fit", kiln_shape_str(dst, a, sizeof a),
                          kiln_shape_str(src, b, sizeof b));
    }
    kiln_tensor *in[3] = {(kiln_tensor *)src, NULL, dst}; /* in[1] NULL: scale 1 */
    const kiln_backend *be = kiln_backend_of_inputs("accumulate", in, 3);
    if (!be) return kiln_last_status();
    return kiln_backend_run_op(be, KILN_KERNEL_ACCUMULATE, in, NULL, dst, NULL);
}
