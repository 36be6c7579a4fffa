/* The objectives a training step can minimise, each traced from the
 * model's logits with the op API (eager or compiled alike), and the one
 * trace of a step that runs whichever objective it is given. */
#include <math.h>
#include <string.h>
#include "kiln/eager.h"
#include "kiln/train.h"

const char *kiln_input_name(kiln_input i) {
    static const char *const names[KILN_IN_N] = {"ids", "targets", "mask", "scale", "positions", "segments", "key"};
    return (unsigned)i < KILN_IN_N ? names[i] : "?";
}

int kiln_objective_inputs(const kiln_objective *o, bool key, kiln_input *names) {
    int n = 0;
    names[n++] = KILN_IN_IDS, names[n++] = KILN_IN_TARGETS, names[n++] = KILN_IN_MASK, names[n++] = KILN_IN_SCALE;
    if (o->docs) names[n++] = KILN_IN_POSITIONS, names[n++] = KILN_IN_SEGMENTS;
    if (key) names[n++] = KILN_IN_KEY;
    return n;
}

int64_t kiln_objective_units(const kiln_objective *o, const kiln_batch *b) {
    return o->norm == KILN_NORM_PAIRS ? b->rows / 2 : b->n_targets;
}

/* ---- token cross-entropy ---------------------------------------------------- */
static kiln_status ce_trace(const kiln_objective *o, kiln_llama *m, kiln_tensor *const *in, kiln_tensor **report) {
    kiln_llama_docs docs = {in[KILN_IN_POSITIONS], in[KILN_IN_SEGMENTS]};
    report[0] = kiln_llama_loss_ex(m, in[KILN_IN_IDS], in[KILN_IN_TARGETS], in[KILN_IN_MASK], o->docs ? &docs : NULL);
    return report[0] ? KILN_OK : kiln_last_status();
}

static const kiln_objective ce = {.name = "ce", .norm = KILN_NORM_TARGET_TOKENS, .trace = ce_trace};
static const kiln_objective ce_docs = {.name = "ce", .norm = KILN_NORM_TARGET_TOKENS, .docs = true, .trace = ce_trace};

const kiln_objective *kiln_objective_ce(bool docs) { return docs ? &ce_docs : &ce; }

/* ---- preference pairs: DPO (sigmoid, IPO, hinge) and SimPO -------------------- */
static const char *const pref_metrics[] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                           "rewards/margins", "logps/chosen", "logps/rejected"};

/* -log p of each row's targets, from the model as it is now */
static kiln_tensor *row_nll_of(kiln_llama *m, kiln_tensor *const *in) {
    kiln_tensor *logits = kiln_llama_forward(m, in[KILN_IN_IDS], in[KILN_IN_MASK], NULL);
    kiln_tensor *nll = logits ? kiln_row_nll(logits, in[KILN_IN_TARGETS], KILN_IGNORE_INDEX) : NULL;
    kiln_tensor_release(logits);
    return nll;
}

/* x + c for a constant c */
static kiln_tensor *plus(kiln_tensor *x, double c) {
    int64_t one = 1;
    kiln_tensor *k = kiln_fill(1, &one, c);
    kiln_tensor *y = k ? kiln_add(x, k) : NULL;
    kiln_tensor_release(k);
    return y;
}

/* chosen and rejected sums of a per-row x: (sum(x) +- sum(x_2i - x_2i+1)) / 2 */
static void pair_sums(kiln_tensor *x, kiln_tensor **chosen, kiln_tensor **rejected) {
    kiln_tensor *d = kiln_pair_diff(x), *s = kiln_sum(x), *sd = d ? kiln_sum(d) : NULL;
    kiln_tensor *nsd = sd ? kiln_scale(sd, -1.0) : NULL, *c = s && sd ? kiln_add(s, sd) : NULL,
                *r = s && nsd ? kiln_add(s, nsd) : NULL;
    *chosen = c ? kiln_scale(c, 0.5) : NULL;
    *rejected = r ? kiln_scale(r, 0.5) : NULL;
    kiln_tensor *tmp[] = {d, s, sd, nsd, c, r};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) kiln_tensor_release(tmp[i]);
}

/* keeps v for release at the end (a function: nested uses are sequenced) */
static kiln_tensor *kept(kiln_tensor **keep, int *nk, kiln_tensor *v) {
    if (*nk < 48) keep[(*nk)++] = v;
    return v;
}

#define TAKE(v, expr) kiln_tensor *v = (expr); if (!v) goto fail
static kiln_status pref_trace(const kiln_objective *o, kiln_llama *m, kiln_tensor *const *in, kiln_tensor **report) {
    kiln_tensor *keep[48] = {0};
    int nk = 0;
#define K(v) kept(keep, &nk, (v))
    kiln_status st = KILN_OK;
    bool dpo = o->kind == KILN_OBJECTIVE_DPO;
    TAKE(nll, K(row_nll_of(m, in)));
    TAKE(logp, K(kiln_scale(nll, -1.0)));
    TAKE(inv, K(kiln_row_inv_count(in[KILN_IN_TARGETS], KILN_IGNORE_INDEX)));
    /* pairs past the batch's last real row have no targets: no loss */
    TAKE(valid, K(kiln_pair_sum(K(kiln_gt0(inv)))));
    TAKE(pvalid, K(kiln_gt0(valid)));
    kiln_tensor *x; /* each row's reward before beta */
    kiln_tensor *margin; /* chosen - rejected, what the loss reads */
    if (dpo) {
        if (!m->lora_a) {
            st = kiln_error(KILN_ERR_INVALID, "objective dpo: the model has no LoRA adapters to switch off for the reference");
            goto fail;
        }
        bool was = m->lora_off;
        m->lora_off = true; /* the reference: the base alone, in the same pass structure */
        kiln_tensor *ref_nll = K(row_nll_of(m, in));
        m->lora_off = was;
        if (!ref_nll) goto fail;
        TAKE(xr, K(kiln_add(logp, ref_nll))); /* p - r */
        x = xr;
        if (o->loss == KILN_DPO_IPO) {
            TAKE(xm, K(kiln_mul(xr, inv))); /* per-token means */
            margin = K(kiln_pair_diff(xm));
        } else {
            margin = K(kiln_pair_diff(xr));
        }
    } else {
        TAKE(avg, K(kiln_mul(logp, inv)));
        x = avg;
        margin = K(kiln_pair_diff(avg));
    }
    if (!margin) goto fail;
    kiln_tensor *li = NULL; /* the loss of each pair */
    if (!dpo) { /* simpo: -logsigmoid(beta margin - gamma) */
        TAKE(z, K(plus(K(kiln_scale(margin, o->beta)), -o->gamma)));
        li = K(kiln_scale(K(kiln_logsigmoid(z)), -1.0));
    } else if (o->loss == KILN_DPO_SIGMOID) {
        li = K(kiln_scale(K(kiln_logsigmoid(K(kiln_scale(margin, o->beta)))), -1.0));
    } else if (o->loss == KILN_DPO_IPO) {
        TAKE(y, K(plus(margin, -1.0 / (2.0 * o->beta))));
        li = K(kiln_mul(y, y));
    } else {
        li = K(kiln_relu(K(plus(K(kiln_scale(margin, -o->beta)), 1.0))));
    }
    if (!li) goto fail;
    report[0] = kiln_sum(K(kiln_mul(li, pvalid)));
    if (!report[0]) goto fail;
    /* the metrics, summed over the micro-batch's pairs */
    TAKE(rw, K(kiln_scale(x, o->beta)));
    pair_sums(rw, &report[1], &report[2]);
    report[3] = kiln_sum(K(kiln_gt0(K(kiln_pair_diff(rw)))));
    report[4] = kiln_sum(K(kiln_pair_diff(rw)));
    pair_sums(dpo ? logp : x, &report[5], &report[6]); /* simpo: TRL reports the mean log-probs */
    for (int i = 1; i <= 6; i++)
        if (!report[i]) goto fail;
    for (int i = 0; i < nk; i++) kiln_tensor_release(keep[i]);
    return KILN_OK;
fail:
    if (!st) st = kiln_last_status() ? kiln_last_status() : KILN_ERR_INVALID;
    for (int i = 0; i < nk; i++) kiln_tensor_release(keep[i]);
    for (int i = 0; i <= 6; i++) kiln_tensor_release(report[i]), report[i] = NULL;
    return st;
#undef K
}
#undef TAKE

kiln_status kiln_objective_from_config(const kiln_train_config *c, kiln_objective *out) {
    if (c->objective == KILN_OBJECTIVE_CE) {
        *out = *kiln_objective_ce(c->pack == KILN_PACK_DOCUMENTS);
        return KILN_OK;
    }
    if (c->objective != KILN_OBJECTIVE_DPO && c->objective != KILN_OBJECTIVE_SIMPO)
        return kiln_error(KILN_ERR_INVALID, "objective %d is not one kiln implements", c->objective);
    if (!(c->beta > 0) || !isfinite(c->beta)) return kiln_error(KILN_ERR_INVALID, "beta %g must be finite and > 0", c->beta);
    if (!(c->simpo_gamma >= 0) || !isfinite(c->simpo_gamma))
        return kiln_error(KILN_ERR_INVALID, "simpo_gamma %g must be finite and >= 0", c->simpo_gamma);
    *out = (kiln_objective){.name = c->objective == KILN_OBJECTIVE_DPO ? "dpo" : "simpo", .norm = KILN_NORM_PAIRS,
                            .n_metrics = 6, .trace = pref_trace, .kind = c->objective, .loss = c->dpo_loss,
                            .beta = c->beta, .gamma = c->simpo_gamma};
    for (int i = 0; i < 6; i++) out->metric[i] = pref_metrics[i];
    return KILN_OK;
}

/* ---- the step's trace --------------------------------------------------------- */
kiln_status kiln_train_trace_objective(void *ctx, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                       kiln_tensor **diff) {
    const kiln_step_trace *t = ctx;
    kiln_llama *m = t->m;
    kiln_tensor *by[KILN_IN_N] = {0};
    for (int i = 0; i < t->n_in; i++) by[t->names[i]] = in[i];
    /* LoRA dropout's key only in a training trace that takes one */
    kiln_tensor *keep = m->lora_key;
    m->lora_key = diff && kiln_train_uses_dropout(m) ? by[KILN_IN_KEY] : NULL;
    kiln_status st = t->o->trace(t->o, m, by, report);
    m->lora_key = keep;
    if (st) return st;
    *n_report = 1 + t->o->n_metrics;
    if (diff && !(*diff = kiln_scale_by(report[0], by[KILN_IN_SCALE]))) return kiln_last_status();
    return KILN_OK;
}
