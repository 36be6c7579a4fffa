/* One optimiser step over a window of micro-batches, and evaluation. */
#include <math.h>
#include "kiln/eager.h"
#include "kiln/train.h"

typedef struct {
    kiln_tensor *ids, *targets, *mask;
} batch_tensors;

static kiln_status wrap_batch(const kiln_batch *b, batch_tensors *t) {
    int64_t s[2] = {b->B, b->T};
    t->ids = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, s);
    t->targets = kiln_tensor_wrap(b->targets, KILN_I32, 2, s);
    t->mask = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, s);
    return t->ids && t->targets && t->mask ? KILN_OK : kiln_last_status();
}

static void release_batch(batch_tensors *t) {
    kiln_tensor_release(t->ids);
    kiln_tensor_release(t->targets);
    kiln_tensor_release(t->mask);
}

/* Forward + backward of one micro-batch whose summed loss is multiplied by
 * `scale` (a runtime scalar input) before backward. *sum gets the summed
 * token loss. */
static kiln_status micro_step(kiln_llama *m, const kiln_batch *b, double scale, double *sum) {
    batch_tensors bt;
    kiln_status st = wrap_batch(b, &bt);
    kiln_tensor *loss = st ? NULL : kiln_llama_loss(m, bt.ids, bt.targets, bt.mask);
    if (!loss) {
        release_batch(&bt);
        return kiln_last_status();
    }
    *sum = kiln_f32(loss)[0];
    if (isfinite(*sum)) {
        int64_t one = 1;
        kiln_tensor *s = kiln_tensor_new(KILN_F32, 1, &one);
        if (s) kiln_f32(s)[0] = (float)scale;
        kiln_tensor *scaled = kiln_scale_by(loss, s);
        st = scaled ? kiln_backward(scaled) : kiln_last_status();
        kiln_tensor_release(scaled);
        kiln_tensor_release(s);
    }
    kiln_tensor_release(loss);
    release_batch(&bt);
    return st;
}

kiln_status kiln_train_window(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb, int k,
                              double lr, kiln_step_result *res) {
    *res = (kiln_step_result){.lr = lr, .micro_batches = k, .bad_micro = -1};
    for (int i = 0; i < k; i++) res->tokens += mb[i]->n_targets;
    double total = 0;
    kiln_status st = KILN_OK;
    for (int i = 0; i < k && !st; i++) {
        double scale;
        if (c->loss_norm == KILN_LOSS_NORM_TOKENS)
            scale = res->tokens ? 1.0 / (double)res->tokens : 0.0;
        else
            scale = mb[i]->n_targets ? 1.0 / ((double)mb[i]->n_targets * k) : 0.0;
        double sum = 0;
        st = micro_step(m, mb[i], scale, &sum);
        if (st) return kiln_error_context(st, "micro-batch %d of the window", i);
        if (!isfinite(sum)) {
            res->skipped = true;
            res->bad_micro = i;
            total = sum;
            break;
        }
        total += sum;
    }
    res->loss = res->tokens ? total / (double)res->tokens : 0.0;
    if (!res->skipped) {
        res->grad_norm = kiln_grad_norm(opt);
        if (!isfinite(res->grad_norm)) res->skipped = true;
    }
    if (res->skipped) {
        kiln_grad_zero(opt); /* never update with NaN */
        return KILN_OK;
    }
    /* as torch.nn.utils.clip_grad_norm_: scale by clip/(norm+1e-6) when below 1 */
    double coef = c->clip > 0 ? c->clip / (res->grad_norm + 1e-6) : 1.0;
    if (coef < 1.0) kiln_grad_scale(opt, coef);
    st = kiln_adamw_step(opt, lr);
    kiln_grad_zero(opt);
    return st;
}

kiln_status kiln_evaluate(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens) {
    bool was = kiln_grad_set_enabled(false);
    double total = 0;
    int64_t count = 0;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && !st; i++) {
        batch_tensors bt;
        st = wrap_batch(mb[i], &bt);
        kiln_tensor *l = st ? NULL : kiln_llama_loss(m, bt.ids, bt.targets, bt.mask);
        if (l) {
            total += kiln_f32(l)[0];
            count += mb[i]->n_targets;
        } else {
            st = kiln_last_status();
        }
        kiln_tensor_release(l);
        release_batch(&bt);
    }
    kiln_grad_set_enabled(was);
    *loss = count ? total / (double)count : NAN;
    if (tokens) *tokens = count;
    return st;
}
