/* One optimiser step over a window of micro-batches, and evaluation. The
 * loader's batches are host memory: on the CPU the step wraps them as they
 * are; on another device they are copied to the model's device first. The
 * runtime scalars (loss scale, dropout key) are set, and the loss read,
 * through the seam; the window runs with the model's device as the
 * thread's (tensors the model makes without inputs go there too). */
#include <math.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "hostio.h"

typedef struct {
    kiln_tensor *ids, *targets, *mask;
    kiln_llama_docs docs; /* packed documents (segmented batches) only */
} batch_tensors;

/* One [B,T] i32 array of the batch as a tensor on buft: wrapped where it
 * is (the host), else a device copy. */
static kiln_tensor *batch_tensor(const kiln_buffer_type *buft, int32_t *v, const int64_t *s) {
    if (buft == &kiln_buft_host) return kiln_tensor_wrap(v, KILN_I32, 2, s);
    kiln_tensor *t = kiln_tensor_new_on(buft, KILN_I32, 2, s);
    if (t && kiln_host_set_all(t, v)) {
        kiln_tensor_release(t);
        return NULL;
    }
    return t;
}

static kiln_status wrap_batch(const kiln_llama *m, const kiln_batch *b, batch_tensors *t) {
    const kiln_buffer_type *buft = kiln_model_backend(m)->buft;
    int64_t s[2] = {b->B, b->T};
    *t = (batch_tensors){0};
    t->ids = batch_tensor(buft, b->input_ids, s);
    t->targets = batch_tensor(buft, b->targets, s);
    t->mask = batch_tensor(buft, b->pad_mask, s);
    if (b->segmented) {
        t->docs.positions = batch_tensor(buft, b->positions, s);
        t->docs.segments = batch_tensor(buft, b->segments, s);
        if (!t->docs.positions || !t->docs.segments) return kiln_last_status();
    }
    return t->ids && t->targets && t->mask ? KILN_OK : kiln_last_status();
}

/* A [1] f32 runtime scalar on the model's device. */
static kiln_tensor *scalar_new(const kiln_llama *m) {
    int64_t one = 1;
    return kiln_tensor_new_on(kiln_model_backend(m)->buft, KILN_F32, 1, &one);
}

static kiln_status scalar_set(kiln_tensor *s, float v) { return kiln_tensor_set(s, 0, &v, sizeof v); }

static const kiln_llama_docs *batch_docs(const batch_tensors *t) { return t->docs.segments ? &t->docs : NULL; }

static void release_batch(batch_tensors *t) {
    kiln_tensor_release(t->ids);
    kiln_tensor_release(t->targets);
    kiln_tensor_release(t->mask);
    kiln_tensor_release(t->docs.positions);
    kiln_tensor_release(t->docs.segments);
}

bool kiln_train_uses_dropout(const kiln_llama *m) { return m->lora_a && m->lora.dropout > 0; }

kiln_status kiln_train_trace_step(void *model, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                  kiln_tensor **diff) {
    kiln_llama *m = model;
    /* a training trace of a model with dropout takes the mask key as input 4 */
    kiln_tensor *keep = m->lora_key;
    m->lora_key = diff && kiln_train_uses_dropout(m) ? in[4] : NULL;
    kiln_tensor *sum = kiln_llama_loss(model, in[0], in[1], in[2]);
    m->lora_key = keep;
    if (!sum) return kiln_last_status();
    report[0] = sum;
    *n_report = 1;
    if (diff && !(*diff = kiln_scale_by(sum, in[3]))) return kiln_last_status();
    return KILN_OK;
}

kiln_status kiln_train_trace_step_docs(void *model, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                       kiln_tensor **diff) {
    kiln_llama_docs docs = {in[4], in[5]};
    kiln_llama *m = model;
    kiln_tensor *keep = m->lora_key;
    m->lora_key = diff && kiln_train_uses_dropout(m) ? in[6] : NULL; /* LoRA dropout's key, after the documents */
    kiln_tensor *sum = kiln_llama_loss_ex(model, in[0], in[1], in[2], &docs);
    m->lora_key = keep;
    if (!sum) return kiln_last_status();
    report[0] = sum;
    *n_report = 1;
    if (diff && !(*diff = kiln_scale_by(sum, in[3]))) return kiln_last_status();
    return KILN_OK;
}

kiln_compiled *kiln_train_compile(kiln_llama *m, const kiln_compile_options *o, bool backward) {
    return kiln_train_compile_ex(m, o, backward, false);
}

kiln_compiled *kiln_train_compile_ex(kiln_llama *m, const kiln_compile_options *o, bool backward, bool documents) {
    kiln_compile_options co = *o;
    co.backward = backward;
    /* LoRA dropout's key follows the other inputs of a training step */
    int drop = backward && kiln_train_uses_dropout(m);
    if (documents) return kiln_compile(kiln_train_trace_step_docs, m, m->params, m->n_params, 6 + drop, &co);
    return kiln_compile(kiln_train_trace_step, m, m->params, m->n_params, 4 + drop, &co);
}

/* The dropout key of global micro-batch `micro` of optimiser step `step`:
 * 24 bits (held exactly in the f32 the op reads) of a counter-based hash of
 * the run seed, the step and the micro-batch, so a resumed run draws the
 * masks the uninterrupted one drew, and every rank its own. */
float kiln_train_dropout_key(uint64_t seed, int64_t step, int64_t micro) {
    uint64_t h = kiln_rng_u64(seed ^ 0x4c6f5241447270ull, ((uint64_t)step << 20) ^ (uint64_t)micro);
    return (float)(h >> 40);
}

/* One micro-batch through a compiled step: the scale is a runtime input, so
 * a new window's token count never rebuilds anything. Returns
 * KILN_ERR_LIMIT past the variant limit (the caller runs eager). */
static kiln_status compiled_micro(const kiln_llama *m, kiln_compiled *cs, const kiln_batch *b, double scale,
                                  kiln_tensor *key, double *sum) {
    /* a step compiled for one kind of row must not silently run the other;
     * a training step with LoRA dropout takes the key as one more input */
    int want = b->segmented ? 6 : 4, n_in = kiln_compiled_n_inputs(cs);
    if (n_in != want && !(key && n_in == want + 1))
        return kiln_error(KILN_ERR_INVALID, "the compiled step takes %s rows, the batch holds %s (--pack documents needs "
                          "kiln_train_compile_ex(..., documents = true))",
                          n_in >= 6 ? "packed-document" : "plain",
                          b->segmented ? "packed documents" : "plain rows");
    batch_tensors bt;
    kiln_status st = wrap_batch(m, b, &bt);
    kiln_tensor *s = st ? NULL : scalar_new(m);
    if (s && !(st = scalar_set(s, (float)scale))) {
        kiln_tensor *in[7] = {bt.ids, bt.targets, bt.mask, s, bt.docs.positions, bt.docs.segments, NULL};
        in[want] = key; /* read only by a step with dropout */
        float rep[1] = {0};
        st = kiln_compiled_run(cs, in, rep);
        *sum = rep[0];
    } else if (!st && !s) {
        st = kiln_last_status();
    }
    kiln_tensor_release(s);
    release_batch(&bt);
    return st;
}

/* The summed token loss of a [1] f32 loss tensor, read through the seam. */
static kiln_status read_loss(const kiln_tensor *l, double *out) {
    if (l->dtype != KILN_F32)
        return kiln_error(KILN_ERR_INVALID, "the loss '%s' is %s, not f32", l->name, kiln_dtype_name(l->dtype));
    float v = 0;
    kiln_status st = kiln_tensor_get(l, 0, &v, sizeof v);
    if (!st) *out = v;
    return st;
}

/* Forward + backward of one micro-batch whose summed loss is multiplied by
 * `scale` (a runtime scalar input) before backward. *sum gets the summed
 * token loss. */
static kiln_status micro_step(kiln_llama *m, const kiln_batch *b, double scale, kiln_tensor *key, double *sum,
                              kiln_compiled *cs) {
    if (cs) {
        kiln_status cst = compiled_micro(m, cs, b, scale, key, sum);
        if (cst != KILN_ERR_LIMIT) return cst;
        kiln_clear_error(); /* past the variant limit: eager */
    }
    batch_tensors bt;
    kiln_status st = wrap_batch(m, b, &bt);
    m->lora_key = key; /* dropout on (NULL: off) for this forward only */
    kiln_tensor *loss = st ? NULL : kiln_llama_loss_ex(m, bt.ids, bt.targets, bt.mask, batch_docs(&bt));
    m->lora_key = NULL;
    if (!loss) {
        release_batch(&bt);
        return kiln_last_status();
    }
    st = read_loss(loss, sum);
    if (!st && isfinite(*sum)) {
        kiln_tensor *s = scalar_new(m);
        if (s && (st = scalar_set(s, (float)scale))) kiln_tensor_release(s), s = NULL;
        kiln_tensor *scaled = s ? kiln_scale_by(loss, s) : NULL;
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
    return kiln_train_window_ex(m, opt, c, mb, k, lr, res, NULL);
}

kiln_status kiln_train_window_ex(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb, int k,
                                 double lr, kiln_step_result *res, kiln_compiled *cs) {
    return kiln_train_window_global(m, opt, c, mb, k, lr, res, cs, NULL);
}

/* With several ranks: every rank must reach the all-reduce, also after a
 * non-finite loss (it then carries NaN, so all ranks skip together). */
static kiln_status sum_across_ranks(kiln_adamw *opt, const kiln_window_totals *g, double *total, int *bad) {
    double sums[2] = {*total, *bad >= 0 ? 1.0 : 0.0};
    kiln_status st = kiln_dist_allreduce_grads(opt, sums, 2);
    if (st) return st;
    *total = sums[0];
    if (sums[1] > 0 || !isfinite(sums[0])) { /* the first bad micro-batch of the global window */
        int64_t v = *bad >= 0 ? -(int64_t)(g->first_micro + *bad) : INT64_MIN;
        if ((st = kiln_dist_max_i64(&v, 1))) return st;
        *bad = v == INT64_MIN ? 0 : (int)-v;
    }
    return KILN_OK;
}

static kiln_status window_global(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb,
                                 int k, double lr, kiln_step_result *res, kiln_compiled *cs, const kiln_window_totals *g) {
    bool dist = g && kiln_dist_size() > 1;
    *res = (kiln_step_result){.lr = lr, .micro_batches = g ? g->micro_batches : k, .bad_micro = -1};
    for (int i = 0; i < k; i++) res->tokens += mb[i]->n_targets;
    if (g) res->tokens = g->tokens; /* normalise by the whole window across ranks */
    double total = 0;
    int bad = -1;
    kiln_status st = KILN_OK;
    kiln_tensor *key = kiln_train_uses_dropout(m) ? scalar_new(m) : NULL;
    if (kiln_train_uses_dropout(m) && !key) return kiln_last_status();
    for (int i = 0; i < k && !st; i++) {
        double scale;
        if (c->loss_norm == KILN_LOSS_NORM_TOKENS)
            scale = res->tokens ? 1.0 / (double)res->tokens : 0.0;
        else
            scale = mb[i]->n_targets ? 1.0 / ((double)mb[i]->n_targets * res->micro_batches) : 0.0;
        double sum = 0;
        if (dist && i == k - 1 && kiln_dist_overlap()) kiln_dist_grads_arm(opt);
        if (key) st = scalar_set(key, kiln_train_dropout_key(c->seed, g ? g->step : 0, (g ? g->first_micro : 0) + i));
        if (!st) st = micro_step(m, mb[i], scale, key, &sum, cs);
        if (st) {
            kiln_set_grad_ready_hook(NULL, NULL);
            kiln_tensor_release(key);
            return kiln_error_context(st, "micro-batch %d of the window", i);
        }
        if (!isfinite(sum)) {
            bad = i;
            total = sum;
            break;
        }
        total += sum;
    }
    kiln_tensor_release(key);
    if (dist && (st = sum_across_ranks(opt, g, &total, &bad))) return kiln_error_context(st, "gradient all-reduce");
    if (bad >= 0 || !isfinite(total)) {
        res->skipped = true;
        res->bad_micro = bad >= 0 ? bad : 0;
    }
    res->loss = res->tokens ? total / (double)res->tokens : 0.0;
    return kiln_adamw_apply(opt, c, lr, res);
}

kiln_status kiln_train_window_global(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb,
                                     int k, double lr, kiln_step_result *res, kiln_compiled *cs,
                                     const kiln_window_totals *g) {
    const kiln_backend *was = kiln_backend_use(kiln_model_backend(m));
    kiln_status st = window_global(m, opt, c, mb, k, lr, res, cs, g);
    kiln_backend_use(was);
    return st;
}

kiln_status kiln_evaluate(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens) {
    return kiln_evaluate_ex(m, mb, n, loss, tokens, NULL);
}

static kiln_status evaluate(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens, kiln_compiled *cs) {
    bool was = kiln_grad_set_enabled(false);
    double total = 0;
    int64_t count = 0;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && !st; i++) {
        if (cs) {
            double sum = 0;
            kiln_status cst = compiled_micro(m, cs, mb[i], 1.0, NULL, &sum);
            if (cst == KILN_OK) {
                total += sum;
                count += mb[i]->n_targets;
                continue;
            }
            if (cst != KILN_ERR_LIMIT) {
                st = cst;
                break;
            }
            kiln_clear_error();
        }
        batch_tensors bt;
        st = wrap_batch(m, mb[i], &bt);
        kiln_tensor *l = st ? NULL : kiln_llama_loss_ex(m, bt.ids, bt.targets, bt.mask, batch_docs(&bt));
        double sum = 0;
        if (l && !(st = read_loss(l, &sum))) {
            total += sum;
            count += mb[i]->n_targets;
        } else if (!l) {
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

kiln_status kiln_evaluate_ex(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens, kiln_compiled *cs) {
    const kiln_backend *was = kiln_backend_use(kiln_model_backend(m));
    kiln_status st = evaluate(m, mb, n, loss, tokens, cs);
    kiln_backend_use(was);
    return st;
}
