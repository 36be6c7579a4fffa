/* The objectives a training step can minimise, each traced from the
 * model's logits with the op API (eager or compiled alike), and the one
 * trace of a step that runs whichever objective it is given. */
#include <math.h>
#include <string.h>
#include "kiln/eager.h"
#include "kiln/train.h"

const char *kiln_input_name(kiln_input i) {
    static const char *const names[KILN_IN_N] = {"ids",       "targets",  "mask", "scale", "scale_2", "ref_logps",
                                                 "positions", "segments", "key"};
    return (unsigned)i < KILN_IN_N ? names[i] : "?";
}

const char *kiln_norm_name(kiln_norm n) {
    static const char *const names[KILN_NORM_N] = {"target tokens", "pairs", "chosen tokens"};
    return (unsigned)n < KILN_NORM_N ? names[n] : "?";
}

int kiln_objective_inputs(const kiln_objective *o, bool key, kiln_input *names) {
    int n = 0;
    names[n++] = KILN_IN_IDS, names[n++] = KILN_IN_TARGETS, names[n++] = KILN_IN_MASK, names[n++] = KILN_IN_SCALE;
    if (o->n_terms > 1) names[n++] = KILN_IN_SCALE_2;
    if (o->ref_logps) names[n++] = KILN_IN_REF_LOGPS;
    if (o->docs) names[n++] = KILN_IN_POSITIONS, names[n++] = KILN_IN_SEGMENTS;
    if (key) names[n++] = KILN_IN_KEY;
    return n;
}

void kiln_batch_units(const kiln_batch *b, int64_t units[KILN_NORM_N]) {
    units[KILN_NORM_TARGET_TOKENS] = b->n_targets;
    units[KILN_NORM_PAIRS] = b->rows / 2;
    int64_t chosen = 0;
    for (int r = 0; r + 1 < b->rows; r += 2)
        for (int t = 0; t < b->T; t++) chosen += b->targets[(size_t)r * b->T + t] != KILN_IGNORE_INDEX;
    units[KILN_NORM_CHOSEN_TOKENS] = chosen;
}

int64_t kiln_objective_units(const kiln_objective *o, const kiln_batch *b) {
    int64_t u[KILN_NORM_N];
    kiln_batch_units(b, u);
    return u[o->norm[0]];
}

/* ---- token cross-entropy ---------------------------------------------------- */
kiln_tensor *kiln_ce_loss(kiln_llama *m, kiln_tensor *ids, kiln_tensor *targets, kiln_tensor *pad_mask,
                          const kiln_llama_docs *docs) {
    if (!targets || kiln_tensor_numel(targets) != kiln_tensor_numel(ids)) {
        kiln_error(KILN_ERR_SHAPE, "cross-entropy: targets must match input_ids");
        return NULL;
    }
    /* the compiler fuses the head's linear with this (linear_ce) */
    kiln_tensor *logits = kiln_llama_forward_ex(m, ids, pad_mask, docs, NULL);
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, targets, KILN_IGNORE_INDEX) : NULL;
    kiln_tensor_release(logits);
    return loss;
}

static kiln_status ce_trace(const kiln_objective *o, kiln_llama *m, kiln_tensor *const *in, kiln_tensor **report) {
    kiln_llama_docs docs = {in[KILN_IN_POSITIONS], in[KILN_IN_SEGMENTS]};
    report[0] = kiln_ce_loss(m, in[KILN_IN_IDS], in[KILN_IN_TARGETS], in[KILN_IN_MASK], o->docs ? &docs : NULL);
    return report[0] ? KILN_OK : kiln_last_status();
}

static const kiln_objective ce = {.name = "ce", .n_terms = 1, .norm = {KILN_NORM_TARGET_TOKENS}, .trace = ce_trace};
static const kiln_objective ce_docs = {.name = "ce", .n_terms = 1, .norm = {KILN_NORM_TARGET_TOKENS}, .docs = true,
                                       .trace = ce_trace};

const kiln_objective *kiln_objective_ce(bool docs) { return docs ? &ce_docs : &ce; }

/* ---- preference pairs: DPO (sigmoid, IPO, hinge), SimPO and ORPO ------------- */
static const char *const pref_metrics[] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                                           "logps/chosen",   "logps/rejected",   "nll_loss",           "log_odds_ratio",
                                           "log_odds_chosen"};

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

/* a - b */
static kiln_tensor *minus(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *nb = kiln_scale(b, -1.0), *d = nb ? kiln_add(a, nb) : NULL;
    kiln_tensor_release(nb);
    return d;
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
    if (*nk < 64) keep[(*nk)++] = v;
    return v;
}

/* The reference's per-row log-probabilities: the stored ones (ref_logps),
 * or the base with the adapters switched off, in the same pass structure. */
static kiln_tensor *ref_logp_of(const kiln_objective *o, kiln_llama *m, kiln_tensor *const *in) {
    if (o->ref_logps) {
        if (!in[KILN_IN_REF_LOGPS]) {
            kiln_error(KILN_ERR_INVALID, "objective dpo: the batch holds no reference log-probabilities (kiln dpo-ref)");
            return NULL;
        }
        kiln_tensor_retain(in[KILN_IN_REF_LOGPS]);
        return in[KILN_IN_REF_LOGPS];
    }
    if (!m->lora_a) {
        kiln_error(KILN_ERR_INVALID, "objective dpo: the model has no LoRA adapters to switch off for the reference "
                                     "(full fine-tuning reads the log-probs of kiln dpo-ref: dpo_ref file)");
        return NULL;
    }
    bool was = m->lora_off;
    m->lora_off = true;
    kiln_tensor *nll = row_nll_of(m, in);
    m->lora_off = was;
    kiln_tensor *lp = nll ? kiln_scale(nll, -1.0) : NULL;
    kiln_tensor_release(nll);
    return lp;
}

#define TAKE(v, expr) kiln_tensor *v = (expr); if (!v) goto fail
static kiln_status pref_trace(const kiln_objective *o, kiln_llama *m, kiln_tensor *const *in, kiln_tensor **report) {
    kiln_tensor *keep[64] = {0};
    int nk = 0, nr = o->n_terms + o->n_metrics;
#define K(v) kept(keep, &nk, (v))
    kiln_status st = KILN_OK;
    bool dpo = o->kind == KILN_OBJECTIVE_DPO, orpo = o->kind == KILN_OBJECTIVE_ORPO;
    TAKE(nll, K(row_nll_of(m, in)));
    TAKE(logp, K(kiln_scale(nll, -1.0)));
    TAKE(inv, K(kiln_row_inv_count(in[KILN_IN_TARGETS], KILN_IGNORE_INDEX)));
    /* pairs past the batch's last real row have no targets: no loss */
    TAKE(rvalid, K(kiln_gt0(inv)));
    TAKE(pvalid, K(kiln_gt0(K(kiln_pair_sum(rvalid)))));
    kiln_tensor *x; /* each row's reward before beta */
    kiln_tensor *margin; /* chosen - rejected, what the loss reads */
    kiln_tensor *log_odds = NULL; /* orpo */
    if (dpo) {
        TAKE(ref, K(ref_logp_of(o, m, in)));
        TAKE(xr, K(minus(logp, ref))); /* p - r */
        x = xr;
        margin = K(kiln_pair_diff(o->loss == KILN_DPO_IPO ? K(kiln_mul(xr, inv)) : xr)); /* ipo: per-token means */
    } else {
        TAKE(avg, K(kiln_mul(logp, inv)));
        x = avg;
        margin = K(kiln_pair_diff(avg));
        if (orpo) { /* log odds(a) = a - log(1 - e^a); a row without targets reads a = -1, not 0 (log 0) */
            TAKE(safe, K(kiln_add(avg, K(plus(rvalid, -1.0)))));
            log_odds = K(kiln_pair_diff(K(minus(safe, K(kiln_log1mexp(safe))))));
            if (!log_odds) goto fail;
        }
    }
    if (!margin) goto fail;
    kiln_tensor *li = NULL; /* the loss of each pair */
    if (orpo) {
        li = K(kiln_scale(K(kiln_logsigmoid(log_odds)), -o->beta));
    } else if (!dpo) { /* simpo: -logsigmoid(beta margin - gamma) */
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
    int r = 0;
    kiln_tensor *unused = NULL;
    if (orpo) { /* term 0: the chosen answers' NLL, over their target tokens */
        pair_sums(nll, &report[r], &unused);
        kiln_tensor_release(unused);
        if (!report[r++]) goto fail;
    }
    if (!(report[r++] = kiln_sum(K(kiln_mul(li, pvalid))))) goto fail;
    /* the metrics, summed over the micro-batch's pairs */
    TAKE(rw, K(kiln_scale(x, o->beta)));
    pair_sums(rw, &report[r], &report[r + 1]);
    report[r + 2] = kiln_sum(K(kiln_gt0(K(kiln_pair_diff(rw)))));
    report[r + 3] = kiln_sum(K(kiln_pair_diff(rw)));
    pair_sums(dpo ? logp : x, &report[r + 4], &report[r + 5]); /* simpo, orpo: TRL reports the mean log-probs */
    if (orpo) {
        report[r + 6] = kiln_scale(report[0], 1.0); /* nll_loss, over chosen tokens */
        report[r + 7] = kiln_sum(K(kiln_mul(K(kiln_logsigmoid(log_odds)), pvalid)));
        report[r + 8] = kiln_sum(K(kiln_mul(log_odds, pvalid)));
    }
    for (int i = 0; i < nr; i++)
        if (!report[i]) goto fail;
    for (int i = 0; i < nk; i++) kiln_tensor_release(keep[i]);
    return KILN_OK;
fail:
    if (!st) st = kiln_last_status() ? kiln_last_status() : KILN_ERR_INVALID;
    for (int i = 0; i < nk; i++) kiln_tensor_release(keep[i]);
    for (int i = 0; i < nr; i++) kiln_tensor_release(report[i]), report[i] = NULL;
    return st;
#undef K
}
#undef TAKE

kiln_status kiln_objective_from_config(const kiln_train_config *c, kiln_objective *out) {
    if (c->objective == KILN_OBJECTIVE_CE) {
        *out = *kiln_objective_ce(c->pack == KILN_PACK_DOCUMENTS);
        return KILN_OK;
    }
    static const char *const names[] = {"ce", "dpo", "simpo", "orpo"};
    if (c->objective < KILN_OBJECTIVE_DPO || c->objective > KILN_OBJECTIVE_ORPO)
        return kiln_error(KILN_ERR_INVALID, "objective %d is not one kiln implements", c->objective);
    if (!(c->beta > 0) || !isfinite(c->beta)) return kiln_error(KILN_ERR_INVALID, "beta %g must be finite and > 0", c->beta);
    if (!(c->simpo_gamma >= 0) || !isfinite(c->simpo_gamma))
        return kiln_error(KILN_ERR_INVALID, "simpo_gamma %g must be finite and >= 0", c->simpo_gamma);
    bool orpo = c->objective == KILN_OBJECTIVE_ORPO;
    *out = (kiln_objective){.name = names[c->objective], .n_terms = orpo ? 2 : 1, .n_metrics = orpo ? 9 : 6,
                            .trace = pref_trace, .kind = c->objective, .loss = c->dpo_loss, .beta = c->beta,
                            .gamma = c->simpo_gamma};
    out->norm[0] = orpo ? KILN_NORM_CHOSEN_TOKENS : KILN_NORM_PAIRS;
    out->norm[1] = KILN_NORM_PAIRS;
    out->ref_logps = c->objective == KILN_OBJECTIVE_DPO &&
                     (c->dpo_ref == KILN_DPO_REF_FILE || (c->dpo_ref == KILN_DPO_REF_AUTO && !c->lora_rank));
    for (int i = 0; i < out->n_metrics; i++) out->metric[i] = pref_metrics[i], out->metric_norm[i] = KILN_NORM_PAIRS;
    if (orpo) out->metric_norm[6] = KILN_NORM_CHOSEN_TOKENS;
    return KILN_OK;
}

kiln_tensor *kiln_objective_diff(const kiln_objective *o, kiln_tensor **report, kiln_tensor *const *by) {
    kiln_tensor *d = kiln_scale_by(report[0], by[KILN_IN_SCALE]);
    if (d && o->n_terms > 1) {
        kiln_tensor *d2 = kiln_scale_by(report[1], by[KILN_IN_SCALE_2]), *sum = d2 ? kiln_add(d, d2) : NULL;
        kiln_tensor_release(d);
        kiln_tensor_release(d2);
        d = sum;
    }
    return d;
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
    *n_report = t->o->n_terms + t->o->n_metrics;
    if (diff && !(*diff = kiln_objective_diff(t->o, report, by))) return kiln_last_status();
    return KILN_OK;
}
