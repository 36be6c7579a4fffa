/* The backend list (KILN_BACKENDS) and the calls every layer makes through
 * it: which device a tensor is on, one device per op, running host code
 * and kernels where the memory is. */
#include <stdio.h>
#include <string.h>
#include "kiln/backend.h"

extern const kiln_backend kiln_backend_cpu, kiln_backend_cpu_isolated;

static const kiln_backend *const all[KILN_N_DEVICES] = {
    [KILN_DEVICE_CPU] = &kiln_backend_cpu,
    [KILN_DEVICE_CPU_ISOLATED] = &kiln_backend_cpu_isolated,
};

const kiln_backend *kiln_backend_at(int i) { return i >= 0 && i < KILN_N_DEVICES ? all[i] : NULL; }

const kiln_backend *kiln_backend_find(const char *name) {
    for (int i = 0; i < KILN_N_DEVICES; i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    kiln_error(KILN_ERR_INVALID, "unknown device '%s' (known:" KILN_DEVICE_NAMES ")", name);
    return NULL;
}

static const kiln_backend *of_buft(const kiln_buffer_type *b) {
    for (int i = 0; i < KILN_N_DEVICES; i++)
        if (all[i]->buft == b) return all[i];
    return &kiln_backend_cpu;
}

const kiln_backend *kiln_backend_of(const kiln_tensor *t) { return of_buft(kiln_tensor_buft(t)); }

const kiln_backend *kiln_backend_current(void) { return of_buft(kiln_buft_current()); }

bool kiln_backend_bf16_emulated(const kiln_backend *b) { return b && b->bf16_emulated && b->bf16_emulated(); }

const kiln_backend *kiln_backend_use(const kiln_backend *b) {
    return of_buft(kiln_buft_use(b ? b->buft : &kiln_buft_host));
}

const kiln_backend *kiln_backend_of_inputs(const char *op, kiln_tensor *const *in, int n_in) {
    const kiln_backend *b = NULL;
    int first = -1;
    for (int i = 0; i < n_in; i++) {
        if (!in[i] || (!in[i]->storage && !kiln_tensor_ptr(in[i]))) continue; /* no memory: a tracer's symbol */
        const kiln_backend *x = kiln_backend_of(in[i]);
        if (!b) {
            b = x, first = i;
        } else if (x != b) {
            kiln_error(KILN_ERR_INVALID, "op %s: input %d ('%s') is on %s but input %d ('%s') is on %s: move one with "
                       "kiln_tensor_copy",
                       op, first, in[first]->name, b->name, i, in[i]->name, x->name);
            return NULL;
        }
    }
    return b ? b : kiln_backend_current();
}

kiln_status kiln_backend_exec(const kiln_backend *b, kiln_status (*fn)(void *ctx), void *ctx) {
    return b->exec(fn, ctx);
}

typedef struct {
    kiln_op_kernel k;
    kiln_tensor *const *in;
    const kiln_attrs *a;
    kiln_tensor *out;
    kiln_tensor *const *aux;
} op_call;

static kiln_status run_kernel(void *ctx) {
    op_call *c = ctx;
    return c->k(c->in, c->a, c->out, c->aux);
}

kiln_status kiln_backend_run_op(const kiln_backend *b, int op, kiln_tensor *const *in, const kiln_attrs *a,
                                kiln_tensor *out, kiln_tensor *const *aux) {
    kiln_op_kernel k = op >= 0 && op < KILN_N_KERNELS ? b->kernels[op] : NULL;
    if (!k)
        return kiln_error(KILN_ERR_UNSUPPORTED, "op %s has no kernel on device %s",
                          op == KILN_KERNEL_ACCUMULATE ? "accumulate" : kiln_op_name(op), b->name);
    op_call c = {k, in, a, out, aux};
    return b->exec(run_kernel, &c);
}
