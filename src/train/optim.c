/* AdamW, the global gradient norm and the learning-rate schedule. The step
 * after backward is two passes over the trainable parameters: the norm (all
 * gradients, one parallel region), then clip + AdamW + zeroing fused in one
 * pass (kiln_k_adamw_multi); eager and compiled training both end their
 * window in kiln_adamw_apply. The kernels get device addresses
 * (kiln_tensor_ptr) and run inside kiln_backend_exec of the parameters'
 * device; the moments live on that device too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/kernels.h"
#include "kiln/train.h"
#include "hostio.h"

/* Decay applies to matrices (linear weights); never to norm weights; to the
 * embedding (and a head tied to it) only with decay_embeddings, since decay
 * pulls rarely seen tokens' rows to zero for no benefit. */
static bool wants_decay(const kiln_llama *m, const kiln_tensor *p, bool decay_embeddings) {
    if (p->ndim < 2) return false;                           /* norm weights */
    if (p == m->embed_tokens) return decay_embeddings;       /* also a tied head */
    return true;                                             /* linear weights, an untied head */
}

kiln_adamw *kiln_adamw_new(kiln_llama *m, const kiln_train_config *c) {
    kiln_adamw *o = calloc(1, sizeof *o);
    if (!o) goto oom;
    o->model = m;
    o->beta1 = c->beta1;
    o->beta2 = c->beta2;
    o->eps = c->eps;
    o->weight_decay = c->weight_decay;
    o->params = calloc((size_t)m->n_params, sizeof *o->params);
    o->m = calloc((size_t)m->n_params, sizeof *o->m);
    o->v = calloc((size_t)m->n_params, sizeof *o->v);
    o->decay = calloc((size_t)m->n_params, sizeof *o->decay);
    o->slots = calloc((size_t)m->n_params, sizeof *o->slots);
    o->grad_ptr = calloc((size_t)m->n_params, sizeof *o->grad_ptr);
    o->grad_len = calloc((size_t)m->n_params, sizeof *o->grad_len);
    if (!o->params || !o->m || !o->v || !o->decay || !o->slots || !o->grad_ptr || !o->grad_len) goto oom;
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        if (!p->requires_grad) continue;
        int j = o->n++;
        o->params[j] = p;
        o->decay[j] = wants_decay(m, p, c->decay_embeddings);
    }
    if (c->shard != KILN_SHARD_OFF && kiln_dist_size() > 1) { /* this rank's slice only */
        o->zero = kiln_zero_new(o->params, o->n, kiln_dist_bucket_bytes(), kiln_dist_rank(), kiln_dist_size(),
                                (kiln_shard_mode)c->shard);
        if (!o->zero) goto fail;
        int ns = o->zero->nseg > m->n_params ? o->zero->nseg : m->n_params;
        free(o->slots), free(o->grad_ptr), free(o->grad_len);
        o->slots = calloc((size_t)ns, sizeof *o->slots);
        o->grad_ptr = calloc((size_t)ns, sizeof *o->grad_ptr);
        o->grad_len = calloc((size_t)ns, sizeof *o->grad_len);
        if (!o->slots || !o->grad_ptr || !o->grad_len) goto oom;
        return o;
    }
    for (int j = 0; j < o->n; j++) {
        kiln_tensor *p = o->params[j];
        o->m[j] = kiln_tensor_zeros_on(kiln_tensor_buft(p), KILN_F32, p->ndim, p->shape);
        o->v[j] = kiln_tensor_zeros_on(kiln_tensor_buft(p), KILN_F32, p->ndim, p->shape);
        if (!o->m[j] || !o->v[j]) goto oom;
    }
    return o;
fail:
    kiln_adamw_free(o);
    return NULL;
oom:
    kiln_adamw_free(o);
    kiln_error(KILN_ERR_OOM, "out of memory for the optimiser state");
    return NULL;
}

void kiln_adamw_free(kiln_adamw *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        kiln_tensor_release(o->m[i]);
        kiln_tensor_release(o->v[i]);
    }
    free(o->params);
    free(o->m);
    free(o->v);
    free(o->decay);
    free(o->slots);
    free(o->grad_ptr);
    free(o->grad_len);
    kiln_zero_free(o->zero);
    free(o);
}

/* The device the optimiser's parameters live on. */
static const kiln_backend *opt_backend(const kiln_adamw *o) {
    return o->n ? kiln_backend_of(o->params[0]) : kiln_model_backend(o->model);
}

typedef struct {
    const kiln_adamw *o;
    int n;
    float gscale, lr, beta1, beta2, eps, bc1, bc2;
    double sumsq;
} fused_call;

static kiln_status run_adamw(void *ctx) {
    fused_call *f = ctx;
    kiln_k_adamw_multi(f->o->slots, f->n, f->gscale, f->lr, f->beta1, f->beta2, f->eps, f->bc1, f->bc2);
    return KILN_OK;
}

static kiln_status run_sumsq(void *ctx) {
    fused_call *f = ctx;
    f->sumsq = kiln_k_sumsq_multi(f->o->grad_ptr, f->o->grad_len, f->n);
    return KILN_OK;
}

kiln_status kiln_adamw_update(kiln_adamw *o, double lr, double grad_scale) {
    if (!isfinite(lr) || lr < 0) return kiln_error(KILN_ERR_NUMERIC, "AdamW: learning rate %g is not a finite value >= 0", lr);
    if (!(grad_scale > 0) || !isfinite(grad_scale))
        return kiln_error(KILN_ERR_NUMERIC, "AdamW: gradient scale %g is not a finite value > 0", grad_scale);
    o->t++;
    double bc1 = 1.0 - pow(o->beta1, (double)o->t), bc2 = 1.0 - pow(o->beta2, (double)o->t);
    int n = 0;
    const kiln_zero *z = o->zero;
    for (int j = 0; z && j < z->nseg; j++) { /* this rank's segments: the same arithmetic, element by element */
        const kiln_zero_seg *s = &z->seg[j];
        kiln_tensor *p = o->params[s->param];
        float *g = z->g ? kiln_tensor_ptr_f32(z->g, s->pos) : p->grad ? kiln_tensor_ptr_f32(p->grad, s->off) : NULL;
        if (!g) continue;
        o->slots[n++] = (kiln_adamw_slot){kiln_tensor_ptr_f32(p, s->off), g, kiln_tensor_ptr_f32(z->m, s->pos),
                                          kiln_tensor_ptr_f32(z->v, s->pos), s->n,
                                          o->decay[s->param] ? (float)o->weight_decay : 0.0f};
    }
    for (int i = 0; !z && i < o->n; i++) {
        kiln_tensor *p = o->params[i];
        if (!p->grad) continue; /* no gradient reached it: torch skips such params too */
        /* device addresses, for the kernel that runs on the device */
        o->slots[n++] = (kiln_adamw_slot){kiln_tensor_ptr(p), kiln_tensor_ptr(p->grad), kiln_tensor_ptr(o->m[i]),
                                          kiln_tensor_ptr(o->v[i]), kiln_tensor_numel(p),
                                          o->decay[i] ? (float)o->weight_decay : 0.0f};
    }
    /* every scalar is rounded to float exactly as the per-parameter kernel
     * loop rounded it, so the fused pass gives that loop's bits */
    fused_call f = {o, n, (float)grad_scale, (float)lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                    (float)bc1, (float)bc2, 0};
    kiln_status st = kiln_backend_exec(opt_backend(o), run_adamw, &f);
    if (!z) return st;
    kiln_grad_zero(o); /* the pieces other ranks updated hold this window's sums still */
    kiln_status gs = kiln_dist_gather_params(o); /* every rank must reach it */
    return st ? st : gs;
}

double kiln_grad_norm(const kiln_adamw *o) {
    int n = 0;
    const kiln_zero *z = o->zero;
    if (z) { /* this rank's slice, then the sum over the ranks: one all-reduce of a scalar */
        for (int j = 0; j < z->nseg; j++) {
            const kiln_zero_seg *s = &z->seg[j];
            const kiln_tensor *g = z->g ? z->g : o->params[s->param]->grad;
            if (!g) continue;
            o->grad_ptr[n] = kiln_tensor_ptr_f32(g, z->g ? s->pos : s->off);
            o->grad_len[n++] = s->n;
        }
        fused_call f = {.o = o, .n = n};
        if (kiln_backend_exec(opt_backend(o), run_sumsq, &f)) f.sumsq = NAN;
        if (kiln_dist_sum_f64(&f.sumsq, 1)) return NAN;
        return sqrt(f.sumsq);
    }
    for (int i = 0; i < o->n; i++) {
        const kiln_tensor *g = o->params[i]->grad;
        if (!g) continue;
        o->grad_ptr[n] = kiln_tensor_ptr(g); /* a device address (see run_sumsq) */
        o->grad_len[n++] = kiln_tensor_numel(o->params[i]);
    }
    fused_call f = {.o = o, .n = n};
    if (kiln_backend_exec(opt_backend(o), run_sumsq, &f)) return NAN;
    return sqrt(f.sumsq);
}

void kiln_grad_zero(const kiln_adamw *o) {
    for (int i = 0; i < o->n; i++) {
        kiln_tensor *g = o->params[i]->grad;
        if (g) kiln_tensor_zero(g);
    }
    if (o->zero) o->zero->g_micro = 0; /* the next window's first micro-batch overwrites the shard */
}

kiln_status kiln_adamw_apply(kiln_adamw *o, const kiln_train_config *c, double lr, kiln_step_result *res) {
    if (!res->skipped) {
        res->grad_norm = kiln_grad_norm(o);
        if (!isfinite(res->grad_norm)) res->skipped = true;
    }
    if (res->skipped) {
        kiln_grad_zero(o); /* never update with NaN */
        return KILN_OK;
    }
    /* as torch.nn.utils.clip_grad_norm_: scale by clip/(norm+1e-6) when below 1 */
    double coef = c->clip > 0 ? c->clip / (res->grad_norm + 1e-6) : 1.0;
    kiln_status st = kiln_adamw_update(o, lr, coef < 1.0 ? coef : 1.0);
    if (st) kiln_grad_zero(o); /* a refused step must not leave this window's gradients behind */
    return st;
}

double kiln_lr_at(const kiln_train_config *c, int64_t step, int64_t total) {
    if (step < c->warmup) return c->lr * (double)(step + 1) / (double)c->warmup;
    int64_t span = total - c->warmup;
    if (span <= 0) return c->lr;
    double p = (double)(step - c->warmup) / (double)span;
    if (p > 1) p = 1;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * p));
}
