/* One optimiser step over a window of micro-batches, and evaluation. The
 * loader's batches are host memory: on the CPU the step wraps them as they
 * are; on another device they are copied to the model's device first. The
 * runtime scalars (loss scale, dropout key) are set, and the loss read,
 * through the seam; the window runs with the model's device as the
 * thread's (tensors the model makes without inputs go there too). */
#include <math.h>
#include <string.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "hostio.h"

typedef struct {
    kiln_tensor *ids, *targets, *mask;
    kiln_llama_docs docs; /* packed documents (segmented batches) only */
    kiln_tensor *ref;     /* the reference's per-row log-probs [B] (batches with has_ref) */
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
    if (b->has_ref) {
        int64_t n = b->B;
        if (buft == &kiln_buft_host) {
            t->ref = kiln_tensor_wrap(b->ref_logps, KILN_F32, 1, &n);
        } else if ((t->ref = kiln_tensor_new_on(buft, KILN_F32, 1, &n)) && kiln_host_set_all(t->ref, b->ref_logps)) {
            kiln_tensor_release(t->ref);
            t->ref = NULL;
        }
        if (!t->ref) return kiln_last_status();
    }
    return t->ids && t->targets && t->mask ? KILN_OK : kiln_last_status();
}

/* A [1] f32 runtime scalar on the model's device. */
static kiln_tensor *scalar_new(const kiln_llama *m) {
    int64_t one = 1;
    return kiln_tensor_new_on(kiln_model_backend(m)->buft, KILN_F32, 1, &one);
}

static kiln_status scalar_set(kiln_tensor *s, float v) { return kiln_tensor_set(s, 0, &v, sizeof v); }


static void release_batch(batch_tensors *t) {
    kiln_tensor_release(t->ids);
    kiln_tensor_release(t->targets);
    kiln_tensor_release(t->mask);
    kiln_tensor_release(t->docs.positions);
    kiln_tensor_release(t->docs.segments);
    kiln_tensor_release(t->ref);
}

bool kiln_train_uses_dropout(const kiln_llama *m) { return m->lora_a && m->lora.dropout > 0; }

/* The trace of objective o's step on model m (a context on the stack: the
 * public CE traces take the model as kiln_compile's context). */
static kiln_status trace_with(kiln_llama *m, const kiln_objective *o, kiln_tensor *const *in, kiln_tensor **report,
                              int *n_report, kiln_tensor **diff) {
    kiln_step_trace t = {.m = m, .o = o};
    t.n_in = kiln_objective_inputs(o, diff && kiln_train_uses_dropout(m), t.names);
    return kiln_train_trace_objective(&t, in, report, n_report, diff);
}

kiln_status kiln_train_trace_step(void *model, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                  kiln_tensor **diff) {
    return trace_with(model, kiln_objective_ce(false), in, report, n_report, diff);
}

kiln_status kiln_train_trace_step_docs(void *model, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                       kiln_tensor **diff) {
    return trace_with(model, kiln_objective_ce(true), in, report, n_report, diff);
}

kiln_compiled *kiln_train_compile(kiln_llama *m, const kiln_compile_options *o, bool backward) {
    return kiln_train_compile_ex(m, o, backward, false);
}

kiln_compiled *kiln_train_compile_ex(kiln_llama *m, const kiln_compile_options *o, bool backward, bool documents) {
    kiln_compile_options co = *o;
    co.backward = backward;
    /* LoRA dropout's key follows the other inputs of a training step */
    kiln_input names[KILN_IN_N];
    int n_in = kiln_objective_inputs(kiln_objective_ce(documents), backward && kiln_train_uses_dropout(m), names);
    return kiln_compile(documents ? kiln_train_trace_step_docs : kiln_train_trace_step, m, m->params, m->n_params, n_in, &co);
}

kiln_compiled *kiln_train_compile_objective(kiln_step_trace *t, const kiln_compile_options *o, bool backward) {
    kiln_compile_options co = *o;
    co.backward = backward;
    t->n_in = kiln_objective_inputs(t->o, backward && kiln_train_uses_dropout(t->m), t->names);
    return kiln_compile(kiln_train_trace_objective, t, t->m->params, t->m->n_params, t->n_in, &co);
}

/* The dropout key of global micro-batch `micro` of optimiser step `step`:
 * 24 bits (held exactly in the f32 the op reads) of a counter-based hash of
 * the run seed, the step and the micro-batch, so a resumed run draws the
 * masks the uninterrupted one drew, and every rank its own. */
float kiln_train_dropout_key(uint64_t seed, int64_t step, int64_t micro) {
    uint64_t h = kiln_rng_u64(seed ^ 0x4c6f5241447270ull, ((uint64_t)step << 20) ^ (uint64_t)micro);
    return (float)(h >> 40);
}

/* A micro-batch's named inputs (KILN_IN_*): the batch's tensors, the
 * terms' scales, the dropout key (NULL where absent). */
static void named_inputs(const batch_tensors *bt, kiln_tensor *const *scale, kiln_tensor *key, kiln_tensor **by) {
    memset(by, 0, sizeof(kiln_tensor *) * KILN_IN_N);
    by[KILN_IN_IDS] = bt->ids, by[KILN_IN_TARGETS] = bt->targets, by[KILN_IN_MASK] = bt->mask;
    by[KILN_IN_SCALE] = scale[0], by[KILN_IN_SCALE_2] = scale[1], by[KILN_IN_REF_LOGPS] = bt->ref;
    by[KILN_IN_POSITIONS] = bt->docs.positions, by[KILN_IN_SEGMENTS] = bt->docs.segments, by[KILN_IN_KEY] = key;
}

/* The terms' scales as runtime scalars on the model's device. */
static kiln_status scales_new(const kiln_llama *m, const kiln_objective *o, const double *scale, kiln_tensor **s) {
    s[0] = s[1] = NULL;
    for (int j = 0; j < o->n_terms; j++) {
        kiln_status st = (s[j] = scalar_new(m)) ? scalar_set(s[j], (float)scale[j]) : kiln_last_status();
        if (st) return st;
    }
    return KILN_OK;
}

/* A batch must hold what the objective reads. */
static kiln_status batch_fits(const kiln_objective *o, const kiln_batch *b) {
    if (o->ref_logps && !b->has_ref)
        return kiln_error(KILN_ERR_INVALID, "objective %s reads the reference's log-probabilities, and the batch holds none "
                          "(kiln dpo-ref stores them beside the shards)", o->name);
    return KILN_OK;
}

/* One micro-batch through a compiled step of objective o: the scales are
 * runtime inputs, so a new window's unit counts never rebuild anything.
 * rep gets the terms' sums and the metric sums. Returns KILN_ERR_LIMIT
 * past the variant limit (the caller runs eager). */
static kiln_status compiled_micro(const kiln_llama *m, const kiln_objective *o, kiln_compiled *cs, const kiln_batch *b,
                                  const double *scale, kiln_tensor *key, double *rep) {
    /* a step compiled for one kind of row must not silently run the other;
     * a training step with LoRA dropout takes the key as one more input */
    kiln_input names[KILN_IN_N];
    int want = kiln_objective_inputs(o, false, names), n_in = kiln_compiled_n_inputs(cs);
    if (b->segmented != o->docs || (n_in != want && !(key && n_in == want + 1)))
        return kiln_error(KILN_ERR_INVALID, "the compiled step takes %s rows, the batch holds %s (--pack documents needs "
                          "kiln_train_compile_ex(..., documents = true))",
                          o->docs ? "packed-document" : "plain", b->segmented ? "packed documents" : "plain rows");
    kiln_status st = batch_fits(o, b);
    if (st) return st;
    n_in = kiln_objective_inputs(o, n_in == want + 1, names);
    batch_tensors bt;
    kiln_tensor *s[2] = {NULL, NULL};
    if (!(st = wrap_batch(m, b, &bt)) && !(st = scales_new(m, o, scale, s))) {
        kiln_tensor *by[KILN_IN_N], *in[KILN_IN_N];
        named_inputs(&bt, s, key, by);
        for (int i = 0; i < n_in; i++) in[i] = by[names[i]]; /* the key is read only by a step with dropout */
        float r[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
        st = kiln_compiled_run(cs, in, r);
        for (int i = 0; i < o->n_terms + o->n_metrics; i++) rep[i] = r[i];
    }
    kiln_tensor_release(s[0]);
    kiln_tensor_release(s[1]);
    release_batch(&bt);
    return st;
}

/* The value of a [1] f32 reported tensor, read through the seam. */
static kiln_status read_loss(const kiln_tensor *l, double *out) {
    if (l->dtype != KILN_F32)
        return kiln_error(KILN_ERR_INVALID, "the loss '%s' is %s, not f32", l->name, kiln_dtype_name(l->dtype));
    float v = 0;
    kiln_status st = kiln_tensor_get(l, 0, &v, sizeof v);
    if (!st) *out = v;
    return st;
}

/* Forward (and, with backward, backward of sum_j term_j x scale[j], the
 * scales runtime scalars) of one micro-batch, eager; rep gets the terms'
 * sums and the metric sums. */
static kiln_status eager_micro(kiln_llama *m, const kiln_objective *o, const kiln_batch *b, const double *scale,
                               kiln_tensor *key, bool backward, double *rep) {
    batch_tensors bt = {0};
    kiln_tensor *s[2] = {NULL, NULL};
    kiln_status st = batch_fits(o, b);
    if (!st && !(st = wrap_batch(m, b, &bt))) st = scales_new(m, o, scale, s);
    kiln_tensor *by[KILN_IN_N], *report[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
    int nr = o->n_terms + o->n_metrics;
    if (!st) {
        named_inputs(&bt, s, key, by);
        m->lora_key = key; /* dropout on (NULL: off) for this forward only */
        st = o->trace(o, m, by, report);
        m->lora_key = NULL;
    }
    for (int i = 0; !st && i < nr; i++) st = read_loss(report[i], &rep[i]);
    double sum = 0;
    for (int j = 0; j < o->n_terms; j++) sum += rep[j];
    if (!st && backward && isfinite(sum)) {
        kiln_tensor *scaled = kiln_objective_diff(o, report, by);
        st = scaled ? kiln_backward(scaled) : kiln_last_status();
        kiln_tensor_release(scaled);
    }
    for (int i = 0; i < nr; i++) kiln_tensor_release(report[i]);
    kiln_tensor_release(s[0]);
    kiln_tensor_release(s[1]);
    release_batch(&bt);
    return st;
}

/* Forward + backward of one micro-batch whose terms are multiplied by
 * scale[j] before backward. rep[j] gets term j's sum, rep[n_terms..] the
 * metric sums. */
static kiln_status micro_step(kiln_llama *m, const kiln_objective *o, const kiln_batch *b, const double *scale,
                              kiln_tensor *key, double *rep, kiln_compiled *cs) {
    if (cs) {
        kiln_status cst = compiled_micro(m, o, cs, b, scale, key, rep);
        if (cst != KILN_ERR_LIMIT) return cst;
        kiln_clear_error(); /* past the variant limit: eager */
    }
    return eager_micro(m, o, b, scale, key, true, rep);
}

/* The objective of a run's micro-batch (into *buf: its parameters are the
 * run's settings). */
static const kiln_objective *objective_of(const kiln_train_config *c, const kiln_batch *b, kiln_objective *buf) {
    if (c->objective == KILN_OBJECTIVE_CE) return kiln_objective_ce(b && b->segmented);
    return kiln_objective_from_config(c, buf) ? NULL : buf; /* NULL: the settings' error */
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
 * non-finite loss (it then carries NaN, so all ranks skip together). The
 * terms' and metrics' sums are summed with the gradients. */
static kiln_status sum_across_ranks(kiln_adamw *opt, const kiln_window_totals *g, double *sums, int n, int *bad) {
    double v[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS + 1];
    memcpy(v, sums, sizeof(double) * (size_t)n);
    v[n] = *bad >= 0 ? 1.0 : 0.0;
    kiln_status st = kiln_dist_allreduce_grads(opt, v, n + 1);
    if (st) return st;
    memcpy(sums, v, sizeof(double) * (size_t)n);
    bool finite = true;
    for (int i = 0; i < n; i++) finite = finite && isfinite(v[i]);
    if (v[n] > 0 || !finite) { /* the first bad micro-batch of the global window */
        int64_t b = *bad >= 0 ? -(int64_t)(g->first_micro + *bad) : INT64_MIN;
        if ((st = kiln_dist_max_i64(&b, 1))) return st;
        *bad = b == INT64_MIN ? 0 : (int)-b;
    }
    return KILN_OK;
}

static double per(double sum, int64_t units) { return units ? sum / (double)units : 0.0; }

static kiln_status window_global(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb,
                                 int k, double lr, kiln_step_result *res, kiln_compiled *cs, const kiln_window_totals *g) {
    bool dist = g && kiln_dist_size() > 1;
    *res = (kiln_step_result){.lr = lr, .micro_batches = g ? g->micro_batches : k, .bad_micro = -1};
    kiln_objective ob;
    const kiln_objective *o = objective_of(c, k ? mb[0] : NULL, &ob);
    if (!o) return kiln_last_status();
    /* what the window's terms are divided by: its units, over all ranks */
    int64_t units[KILN_NORM_N] = {0}, u[KILN_NORM_N];
    for (int i = 0; i < k; i++) {
        kiln_batch_units(mb[i], u);
        for (int j = 0; j < KILN_NORM_N; j++) units[j] += u[j];
    }
    res->tokens = units[KILN_NORM_TARGET_TOKENS];
    if (g) {
        bool given = false;
        for (int j = 0; j < KILN_NORM_N; j++) given = given || g->units[j];
        if (given) memcpy(units, g->units, sizeof units);
        units[KILN_NORM_TARGET_TOKENS] = res->tokens = g->tokens;
    }
    int nt = o->n_terms, nr = nt + o->n_metrics;
    double sums[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
    int bad = -1;
    kiln_status st = KILN_OK;
    kiln_tensor *key = kiln_train_uses_dropout(m) ? scalar_new(m) : NULL;
    if (kiln_train_uses_dropout(m) && !key) return kiln_last_status();
    /* --shard gradients reduce-scatters after every micro-batch: as many
     * rounds on every rank as rank 0 (which holds the window's first
     * micro-batches, so the most) has micro-batches */
    bool scatter = dist && opt->zero && opt->zero->mode == KILN_SHARD_GRADIENTS;
    int rounds = scatter ? (g->micro_batches < c->accum ? g->micro_batches : c->accum) : 0, scattered = 0;
    for (int i = 0; i < k && !st; i++) {
        double scale[KILN_OBJ_MAX_TERMS];
        kiln_batch_units(mb[i], u);
        for (int j = 0; j < nt; j++) {
            int64_t w = units[o->norm[j]], mine = u[o->norm[j]];
            scale[j] = c->loss_norm == KILN_LOSS_NORM_TOKENS ? (w ? 1.0 / (double)w : 0.0)
                                                             : (mine ? 1.0 / ((double)mine * res->micro_batches) : 0.0);
        }
        double rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0}, sum = 0;
        if (dist && (i == k - 1 || scatter) && kiln_dist_overlap()) kiln_dist_grads_arm(opt);
        if (key) st = scalar_set(key, kiln_train_dropout_key(c->seed, g ? g->step : 0, (g ? g->first_micro : 0) + i));
        if (!st) st = micro_step(m, o, mb[i], scale, key, rep, cs);
        if (st) {
            kiln_set_grad_ready_hook(NULL, NULL);
            kiln_tensor_release(key);
            return kiln_error_context(st, "micro-batch %d of the window", i);
        }
        for (int j = 0; j < nt; j++) sum += rep[j];
        if (!isfinite(sum)) {
            bad = i;
            for (int j = 0; j < nt; j++) sums[j] = rep[j];
            break;
        }
        for (int j = 0; j < nr; j++) sums[j] += rep[j];
        if (scatter && scattered < rounds - 1 && (st = kiln_dist_reduce_micro(opt))) break;
        scattered += scatter && scattered < rounds - 1;
    }
    kiln_tensor_release(key);
    for (; !st && scattered < rounds - 1; scattered++) st = kiln_dist_reduce_micro(opt); /* the rounds this rank had no micro-batch for */
    if (st) return kiln_error_context(st, "gradient reduce-scatter");
    if (dist && (st = sum_across_ranks(opt, g, sums, nr, &bad))) return kiln_error_context(st, "gradient all-reduce");
    double loss = 0;
    for (int j = 0; j < nt; j++) loss += per(sums[j], units[o->norm[j]]);
    if (bad >= 0 || !isfinite(loss)) {
        res->skipped = true;
        res->bad_micro = bad >= 0 ? bad : 0;
    }
    res->loss = loss;
    res->units = units[o->norm[0]];
    res->n_metrics = o->n_metrics;
    for (int j = 0; j < o->n_metrics; j++)
        res->metric[j] = per(sums[nt + j], units[o->metric_norm[j]]), res->metric_name[j] = o->metric[j];
    return kiln_adamw_apply(opt, c, lr, res);
}

/* One micro-batch's forward + backward timed both ways: compiled (a first
 * run builds and tunes, then the best of `reps`) and eager (a first run
 * warms the allocator and measures its GEMM problems, then the best of
 * `reps`). Whatever the runs accumulated is then zeroed: they take no part
 * in training. ms[0] compiled, ms[1] eager, in ms. */
static kiln_status time_modes(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, const kiln_batch *b,
                              kiln_compiled *cs, int reps, double ms[2]) {
    kiln_objective ob;
    const kiln_objective *o = objective_of(c, b, &ob);
    if (!o) return kiln_last_status();
    int64_t u[KILN_NORM_N];
    kiln_batch_units(b, u);
    double scale[KILN_OBJ_MAX_TERMS];
    for (int j = 0; j < o->n_terms; j++) scale[j] = u[o->norm[j]] ? 1.0 / (double)u[o->norm[j]] : 0.0;
    kiln_tensor *key = kiln_train_uses_dropout(m) ? scalar_new(m) : NULL;
    kiln_status st = kiln_train_uses_dropout(m) && !key ? kiln_last_status() : KILN_OK;
    if (key && !st) st = scalar_set(key, kiln_train_dropout_key(c->seed, 0, 0));
    for (int mode = 0; mode < 2 && !st; mode++) {
        ms[mode] = INFINITY;
        for (int r = 0; r <= reps && !st; r++) {
            double rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS], t0 = kiln_time_now();
            st = mode == 0 ? compiled_micro(m, o, cs, b, scale, key, rep) : eager_micro(m, o, b, scale, key, true, rep);
            double dt = (kiln_time_now() - t0) * 1e3;
            if (r > 0 && dt < ms[mode]) ms[mode] = dt;
        }
    }
    kiln_tensor_release(key);
    kiln_grad_zero(opt);
    return st;
}

kiln_status kiln_train_time_modes(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, const kiln_batch *b,
                                  kiln_compiled *cs, int reps, double ms[2]) {
    const kiln_backend *was = kiln_backend_use(kiln_model_backend(m));
    kiln_status st = time_modes(m, opt, c, b, cs, reps, ms);
    kiln_backend_use(was);
    return st;
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

static kiln_status evaluate(kiln_llama *m, const kiln_objective *obj, kiln_batch *const *mb, int n, double *loss,
                            double *metrics, int64_t *units_out, kiln_compiled *cs) {
    bool was = kiln_grad_set_enabled(false);
    double sums[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
    int64_t units[KILN_NORM_N] = {0}, u[KILN_NORM_N];
    const kiln_objective *o = obj;
    kiln_status st = KILN_OK;
    static const double one[KILN_OBJ_MAX_TERMS] = {1.0, 1.0};
    for (int i = 0; i < n && !st; i++) {
        o = obj ? obj : kiln_objective_ce(mb[i]->segmented);
        double rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
        kiln_status cst = cs ? compiled_micro(m, o, cs, mb[i], one, NULL, rep) : KILN_ERR_LIMIT;
        if (cst == KILN_ERR_LIMIT) {
            if (cs) kiln_clear_error();
            cst = eager_micro(m, o, mb[i], one, NULL, false, rep);
        }
        st = cst;
        if (st) break;
        for (int j = 0; j < o->n_terms + o->n_metrics; j++) sums[j] += rep[j];
        kiln_batch_units(mb[i], u);
        for (int j = 0; j < KILN_NORM_N; j++) units[j] += u[j];
    }
    kiln_grad_set_enabled(was);
    if (!o) o = kiln_objective_ce(false);
    double l = 0;
    for (int j = 0; j < o->n_terms; j++) l += units[o->norm[j]] ? sums[j] / (double)units[o->norm[j]] : NAN;
    *loss = l;
    for (int j = 0; metrics && obj && j < obj->n_metrics; j++)
        metrics[j] = units[obj->metric_norm[j]] ? sums[obj->n_terms + j] / (double)units[obj->metric_norm[j]] : NAN;
    if (units_out) *units_out = units[o->norm[0]];
    return st;
}

kiln_status kiln_evaluate_objective(kiln_llama *m, const kiln_objective *o, kiln_batch *const *mb, int n, double *loss,
                                    double *metrics, int64_t *units, kiln_compiled *cs) {
    const kiln_backend *was = kiln_backend_use(kiln_model_backend(m));
    kiln_status st = evaluate(m, o, mb, n, loss, metrics, units, cs);
    kiln_backend_use(was);
    return st;
}

kiln_status kiln_evaluate_ex(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens, kiln_compiled *cs) {
    const kiln_backend *was = kiln_backend_use(kiln_model_backend(m));
    kiln_status st = evaluate(m, NULL, mb, n, loss, NULL, tokens, cs);
    kiln_backend_use(was);
    return st;
}

/* The reference's per-row log-probabilities of one pairs batch: the model
 * with its adapters off, no gradient (the first phase of a DPO run that
 * reads them from a file). */
static kiln_status ref_rows(kiln_llama *m, const kiln_batch *b, float *out) {
    batch_tensors bt;
    kiln_status st = wrap_batch(m, b, &bt);
    bool was = kiln_grad_set_enabled(false), off = m->lora_off;
    m->lora_off = true;
    kiln_tensor *logits = st ? NULL : kiln_llama_forward(m, bt.ids, bt.mask, NULL);
    kiln_tensor *nll = logits ? kiln_row_nll(logits, bt.targets, KILN_IGNORE_INDEX) : NULL;
    m->lora_off = off;
    kiln_grad_set_enabled(was);
    if (!st && !nll) st = kiln_last_status();
    if (!st) st = kiln_tensor_get(nll, 0, out, sizeof(float) * (size_t)b->B);
    for (int r = 0; !st && r < b->B; r++) out[r] = -out[r];
    kiln_tensor_release(logits);
    kiln_tensor_release(nll);
    release_batch(&bt);
    return st;
}

kiln_status kiln_ref_logps_batch(kiln_llama *m, const kiln_batch *b, float *out) {
    const kiln_backend *was = kiln_backend_use(kiln_model_backend(m));
    kiln_status st = ref_rows(m, b, out);
    kiln_backend_use(was);
    return st;
}
