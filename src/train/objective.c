/* The objectives a training step can minimise, each traced from the
 * model's logits with the op API (eager or compiled alike), and the one
 * trace of a step that runs whichever objective it is given. */
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
