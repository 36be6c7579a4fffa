/* kiln train: AdamW and the global gradient norm, the warm-up + cosine
 * schedule, gradient accumulation with exact loss normalisation, clipping,
 * evaluation, the trainer loop, checkpoints that resume exactly, and
 * generation with a key/value cache.
 *
 * Ownership: constructors return objects the caller frees with the matching
 * _free. Errors: kiln_status + kiln_last_error() naming the file, flag or step.
 * Nothing here prints: progress goes to a callback the CLI provides.
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include "kiln/backend.h"
#include "kiln/compile.h"
#include "kiln/data.h"
#include "kiln/gguf.h"
#include "kiln/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KILN_LOSS_NORM_TOKENS = 0, KILN_LOSS_NORM_STEPS = 1 } kiln_loss_norm;
typedef enum { KILN_ON_NAN_SKIP = 0, KILN_ON_NAN_STOP = 1 } kiln_on_nan;
/* --shard (ZeRO stages 1 and 2 over MPI): off, AdamW's moments split across
 * the ranks (optimizer), or the moments and the reduced gradients
 * (gradients). */
typedef enum { KILN_SHARD_OFF = 0, KILN_SHARD_OPTIMIZER = 1, KILN_SHARD_GRADIENTS = 2 } kiln_shard_mode;

/* How a run is compiled (the --compile setting): kiln_run_compile, one
 * KILN_RUN_* per line of KILN_COMPILE_MODES (kiln/compile.h). */
/* micro_batch: KILN_MICRO_BATCH_AUTO, a positive number, or 0 (not given). */
enum { KILN_MICRO_BATCH_AUTO = -1 };

/* ---- the run settings -------------------------------------------------------
 * Every setting of a run is one line here: X(key, KIND, LIMIT, DEFAULT, ARG,
 * HELP). The line makes the kiln_train_config field `key`, its default, its
 * train_config.json key (`key`), its `kiln train` flag (--key, '-' for '_'),
 * the parsing of both with the same checks, the range check of
 * kiln_train_config_validate and the --help line. TO ADD A SETTING, ADD ONE
 * LINE (an ENUM also needs its names: a kiln_choice list in
 * src/train/config.c, "choices_<LIMIT>").
 *   KIND  field     LIMIT                           flag value / JSON value
 *   STR   char[N]   N, the buffer size              text / string
 *   INT   int       the minimum (maximum INT_MAX)   integer / integer
 *   I64   int64_t   the minimum                     integer / integer
 *   U64   uint64_t  0                               integer / string of digits (or integer)
 *   F64   double    ANY, POS (> 0), NONNEG (>= 0),  number / number, always finite
 *                   UNIT ([0, 1))
 *   FLAG  bool      1: --key sets it, 0: --no-key   no value / true or false
 *                   clears it
 *   ENUM  int       the names: choices_<LIMIT>      a name / string
 *   SIZE  int64_t   0                               "512M", "1G", bytes / string ("": 0, unset)
 *   AUTO  int       0                               "auto" (KILN_MICRO_BATCH_AUTO) or N / string
 * ARG NULL: no flag of its own (beta1 and beta2 come from --betas B1,B2). */
#define KILN_TRAIN_SETTINGS(X)                                                                                             \
    X(data, STR, 512, "data/kjv", "DIR", "directory with train.bin (and val.bin)")                                         \
    X(run_dir, STR, 512, "runs/demo", "DIR", "where checkpoints, metrics.jsonl, TensorBoard events and loss.svg go")       \
    X(model, STR, 512, "demo", "NAME|FILE", "preset (tiny, small, demo, 124m) or a config.json")                              \
    X(tokenizer, STR, 512, "", "FILE", "tokenizer.json of the shards, copied into the run (required; --init: its run's)")  \
    X(init, STR, 512, "", "RUN_DIR", "start from the weights of another run (fine-tuning)")                                \
    X(freeze, STR, 256, "", "GLOB", "freeze parameters whose names match (fnmatch)")                                       \
    X(batch, INT, 1, 8, "N", "rows per micro-batch")                                                                       \
    X(accum, INT, 1, 4, "N", "micro-batches per optimiser step")                                                           \
    X(seq_len, INT, 2, 128, "N", "tokens per row")                                                                         \
    X(pack, ENUM, pack, KILN_PACK_PACKED, "packed|padded|documents|pairs", "contiguous windows, document-aligned padded rows, whole documents packed with attention within each, or preference pairs (rows 2i, 2i+1)") \
    X(shuffle, FLAG, 0, true, "", "keep the data in order (default: shuffled each epoch)")                                  \
    X(loss_norm, ENUM, loss_norm, KILN_LOSS_NORM_TOKENS, "tokens|steps", "normalise by target tokens in the window, or by k") \
    X(lr, F64, POS, 1e-3, "X", "peak learning rate")                                                                       \
    X(min_lr, F64, NONNEG, 1e-4, "X", "learning rate at the end of the cosine")                                            \
    X(beta1, F64, UNIT, 0.9, NULL, "AdamW beta1")                                                                          \
    X(beta2, F64, UNIT, 0.95, NULL, "AdamW beta2")                                                                         \
    X(eps, F64, POS, 1e-8, "X", "AdamW epsilon")                                                                           \
    X(weight_decay, F64, NONNEG, 0.1, "X", "decoupled weight decay")                                                       \
    X(clip, F64, NONNEG, 1.0, "X", "clip the global gradient norm (0: off)")                                               \
    X(decay_embeddings, FLAG, 1, false, "", "apply weight decay to embeddings too (default: no decay on them)")            \
    X(warmup, I64, 0, 20, "N", "linear warm-up steps")                                                                     \
    X(steps, I64, 0, 0, "N", "optimiser steps (0: from --epochs)")                                                         \
    X(epochs, I64, 1, 1, "N", "passes over train.bin when --steps is 0")                                                   \
    X(eval_every, I64, 0, 50, "N", "evaluate on val.bin every N steps (0: never)")                                         \
    X(eval_batches, I64, 0, 20, "N", "micro-batches per evaluation (0: all of val.bin)")                                   \
    X(save_every, I64, 0, 100, "N", "checkpoint every N steps (0: only at the end)")                                       \
    X(log_every, I64, 0, 10, "N", "log line every N steps when not on a terminal")                                         \
    X(keep, INT, 0, 3, "N", "checkpoints to keep (0: all)")                                                                \
    X(on_nan, ENUM, on_nan, KILN_ON_NAN_SKIP, "skip|stop", "on a non-finite loss: skip the step or stop")                  \
    X(seed, U64, 0, 1234, "N", "seed for initialisation and shuffling")                                                    \
    X(device, ENUM, device, KILN_DEVICE_CPU, "NAME", "where tensors live and kernels run: one of" KILN_DEVICE_NAMES) \
    X(compile, ENUM, compile, KILN_RUN_EAGER, "MODE", "one of" KILN_COMPILE_MODE_NAMES " (off: eager)") \
    X(precision, ENUM, precision, KILN_F32, "fp32|bf16", "bf16: matrix products take bf16 operands, fp32 accumulate (autocast)") \
    X(recompute, ENUM, recompute, KILN_RECOMPUTE_POINTWISE, "none|attention|layer|pointwise", "recompute activations in backward (with --compile; pointwise: element-wise values)") \
    X(compile_dynamic, FLAG, 1, false, "", "compiled sizes as runtime values: smaller batches reuse the code")              \
    X(global_batch, INT, 0, 0, "N", "sequences per optimiser step: sets --batch and --accum (0: off)")                     \
    X(micro_batch, AUTO, 0, 0, "auto|N", "with --global-batch: auto = the largest divisor of N that fits")                 \
    X(mem_budget, SIZE, 0, 0, "SIZE", "budget for --micro-batch auto, e.g. 1G (default: 70% of MemAvailable)")        \
    X(save_dtype, STR, 8, "fp32", "fp32|bf16|f16", "dtype of the weights in checkpoints (optimiser state stays fp32)")   \
    X(shard_size, STR, 32, "5GB", "SIZE", "most bytes per weight file, e.g. 5GB; larger models get shards + an index") \
    X(lora_rank, INT, 0, 0, "R", "train LoRA adapters of rank R on a frozen base (0: full fine-tuning)")                   \
    X(lora_alpha, F64, POS, 8.0, "A", "LoRA scaling alpha / R (PEFT's default 8)")                                         \
    X(lora_dropout, F64, UNIT, 0.0, "P", "dropout on the adapters' input in training (PEFT's lora_dropout)")             \
    X(use_rslora, FLAG, 1, false, "", "with --lora-rank: scale the adapters by alpha / sqrt(R) (PEFT's use_rslora), not alpha / R") \
    X(lora_targets, STR, 128, "q_proj,v_proj", "LIST", "linears to adapt: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all") \
    X(objective, ENUM, objective, KILN_OBJECTIVE_CE, "ce|dpo|simpo|orpo", "what a step minimises: token cross-entropy, or a preference objective on --pack pairs data") \
    X(beta, F64, POS, 0.1, "B", "dpo/simpo/orpo: beta (TRL: 0.1 for DPO, 2.0 for SimPO, 0.1 for ORPO's lambda)")      \
    X(dpo_ref, ENUM, dpo_ref, KILN_DPO_REF_AUTO, "auto|adapters|file", "dpo: the reference: the base with the adapters off, or the log-probs kiln dpo-ref stored beside the shards (auto: adapters with --lora-rank, else file)") \
    X(dpo_loss, ENUM, dpo_loss, KILN_DPO_SIGMOID, "sigmoid|ipo|hinge", "dpo: the loss of the margin (TRL's loss_type)") \
    X(simpo_gamma, F64, NONNEG, 0.5, "G", "simpo: the target reward margin gamma (TRL's simpo_gamma)")               \
    X(shard, ENUM, shard, KILN_SHARD_OFF, "off|optimizer|gradients", "with mpirun: split AdamW's moments (optimizer), or the moments and the reduced gradients (gradients), across the ranks") \
    X(base_dtype, ENUM, base_dtype, KILN_BASE_DTYPE_AUTO, "auto|fp32|bf16|f16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k", "with --lora-rank: hold the frozen base's linears in this type (auto: a GGUF's own types, else fp32)")

#define KILN_BASE_DTYPE_AUTO (-1) /* base_dtype auto: a GGUF base as the file holds it, else fp32 */
#define KILN_SETTING_FIELD_STR(key, lim) char key[lim];
#define KILN_SETTING_FIELD_INT(key, lim) int key;
#define KILN_SETTING_FIELD_I64(key, lim) int64_t key;
#define KILN_SETTING_FIELD_U64(key, lim) uint64_t key;
#define KILN_SETTING_FIELD_F64(key, lim) double key;
#define KILN_SETTING_FIELD_FLAG(key, lim) bool key;
#define KILN_SETTING_FIELD_ENUM(key, lim) int key;
#define KILN_SETTING_FIELD_SIZE(key, lim) int64_t key;
#define KILN_SETTING_FIELD_AUTO(key, lim) int key;
#define KILN_SETTING_FIELD(key, kind, lim, def, arg, help) KILN_SETTING_FIELD_##kind(key, lim)

/* Every setting of a run, one field per line of KILN_TRAIN_SETTINGS;
 * serialised as train_config.json. The ENUM fields hold kiln_pack_mode,
 * kiln_loss_norm, kiln_on_nan, kiln_device_id (kiln/backend.h),
 * kiln_run_compile, kiln_dtype and KILN_RECOMPUTE_* values. */
typedef struct {
    KILN_TRAIN_SETTINGS(KILN_SETTING_FIELD)
} kiln_train_config;

/* The table as data, for the CLI's flags and --help. */
typedef enum {
    KILN_SETTING_STR, KILN_SETTING_INT, KILN_SETTING_I64, KILN_SETTING_U64, KILN_SETTING_F64,
    KILN_SETTING_FLAG, KILN_SETTING_ENUM, KILN_SETTING_SIZE, KILN_SETTING_AUTO,
} kiln_setting_kind;
enum { KILN_SETTING_ANY, KILN_SETTING_POS, KILN_SETTING_NONNEG, KILN_SETTING_UNIT }; /* F64 limits */
typedef struct {
    const char *key;             /* the JSON key and the field */
    kiln_setting_kind kind;
    size_t offset, size;         /* of the field in kiln_train_config */
    int64_t limit;               /* the LIMIT column (not for ENUM) */
    const kiln_choice *choices;  /* ENUM: the names */
    const char *arg, *help;      /* arg NULL: no flag */
} kiln_setting;
extern const kiln_setting kiln_train_settings[];
extern const int kiln_train_n_settings;
/* One setting from text (a flag's value; FLAG: "true" or "false"), with
 * the checks of its line; refusals read "bad value 'TEXT' (expected ...)". */
kiln_status kiln_setting_parse(const kiln_setting *s, const char *text, kiln_train_config *c);
/* The value as a flag would give it ("" for an unset string or size). */
const char *kiln_setting_format(const kiln_setting *s, const kiln_train_config *c, char *buf, size_t n);
/* The setting with this JSON key, or NULL. */
const kiln_setting *kiln_setting_find(const char *key);

void kiln_train_config_default(kiln_train_config *c);
/* The compiler options a run's settings ask for (compile mode, recompute). */
kiln_status kiln_train_compile_options(const kiln_train_config *c, kiln_compile_options *co);
/* Every line's range, then the rules between settings (min_lr <= lr,
 * recompute needs compile, micro_batch with global_batch, ...). */
kiln_status kiln_train_config_validate(const kiln_train_config *c);
/* The adapters a run's lora_* settings ask for (rank 0: none). */
kiln_status kiln_train_lora_config(const kiln_train_config *c, kiln_lora_config *lc);
/* Overlays keys from JSON text onto *c with the flags' checks; unknown keys
 * are an error; messages start with `source` (the file) and the key. */
kiln_status kiln_train_config_parse(const char *json, const char *source, kiln_train_config *c);
char *kiln_train_config_to_json(const kiln_train_config *c); /* malloc'd */

/* ---- optimiser ---------------------------------------------------------- */
/* AdamW over the model's trainable parameters (requires_grad). Frozen ones
 * get no state and no update. */
typedef struct {
    kiln_llama *model;
    int n;                 /* trainable parameters */
    kiln_tensor **params;  /* borrowed from the model */
    kiln_tensor **m, **v;  /* first and second moments, owned */
    bool *decay;           /* weight decay applies to params[i] */
    int64_t t;             /* steps taken (bias corrections use t) */
    double beta1, beta2, eps, weight_decay;
    /* scratch for the fused step, refilled each step (a gradient can be
     * missing or reallocated between steps) */
    struct kiln_adamw_slot *slots;
    const float **grad_ptr;
    int64_t *grad_len;
    /* With --shard on several ranks: this rank's slice of the moments (and
     * of the reduced gradients); m and v above are then all NULL. */
    struct kiln_zero *zero;
} kiln_adamw;

/* ---- ZeRO sharding (zero.c) --------------------------------------------------
 * The trainable parameters, last first (backward finishes the last layers
 * first), are cut into gradient buckets of at most bucket_bytes (a larger
 * parameter is cut into bucket-sized pieces of its own); rank r of P owns the r-th P-th of every
 * bucket: [n*r/P, n*(r+1)/P) of its floats. A rank's shard is its pieces of
 * all buckets in bucket order; each piece is one or more segments (a
 * parameter, an offset into it, a count, the position in the shard). The
 * layout depends on the parameters, bucket_bytes and P only, so any rank can
 * tell any other's segments (the checkpoint manifest lists them). */
/* A bucket: params[hi] down to params[lo] whole (off 0), or one piece of a
 * parameter larger than a bucket (hi == lo: its floats [off, off + n)). */
typedef struct { int hi, lo; int64_t n, off; } kiln_grad_bucket;
/* The floats of params[i] in bucket b (into *off: where they start in it). */
static inline int64_t kiln_bucket_part(const kiln_grad_bucket *b, kiln_tensor *const *params, int i, int64_t *off) {
    *off = b->hi == b->lo ? b->off : 0;
    return b->hi == b->lo ? b->n : kiln_tensor_numel(params[i]);
}
typedef struct { int param; int64_t off, n, pos; } kiln_zero_seg;
typedef struct kiln_zero {
    kiln_shard_mode mode;
    int rank, size;
    size_t bucket_bytes;
    int nb;
    kiln_grad_bucket *b;
    int64_t *chunk;    /* [nb * (size + 1)]: rank r's piece of bucket k is [chunk[k*(size+1)+r], ..+r+1) */
    int64_t *at;       /* [nb]: where this rank's piece of bucket k starts in its shard */
    int nseg;
    kiln_zero_seg *seg;
    int64_t len;       /* floats in this rank's shard */
    kiln_tensor *m, *v; /* [len] moments */
    kiln_tensor *g;     /* [len] this window's reduced gradients (mode gradients; NULL otherwise) */
    int g_micro;        /* micro-batches summed into g this window (0: g is stale) */
} kiln_zero;
/* Buckets of params[0..n) (into out; NULL: count only), last parameter
 * first, a parameter larger than bucket_bytes cut into pieces of its own;
 * returns how many (at least 1: with no parameter, one empty bucket). */
int kiln_grad_buckets(kiln_tensor *const *params, int n, size_t bucket_bytes, kiln_grad_bucket *out);
/* The layout of rank `rank` of `size` (moments allocated on the parameters'
 * device, zeroed). */
kiln_zero *kiln_zero_new(kiln_tensor *const *params, int n, size_t bucket_bytes, int rank, int size, kiln_shard_mode mode);
void kiln_zero_free(kiln_zero *z);
/* The segments rank r holds (into *out, malloc'd; count returned, -1 on OOM). */
int kiln_zero_segments_of(const kiln_zero *z, kiln_tensor *const *params, int r, kiln_zero_seg **out);
/* Bytes of optimiser state and gradients this rank holds between steps and
 * at the update: moments, the gradient shard (or the full gradients), and
 * the communication buffers (kiln_dist_buffer_bytes). */
typedef struct { double moments, grads, buffers; } kiln_opt_memory;
void kiln_adamw_memory(const kiln_adamw *o, kiln_opt_memory *mem);

kiln_adamw *kiln_adamw_new(kiln_llama *m, const kiln_train_config *c);
void kiln_adamw_free(kiln_adamw *o);
/* One fused pass over every trainable parameter with a gradient: g is
 * multiplied by grad_scale (the clipping factor; 1 = none), the AdamW update
 * with learning rate `lr` (a runtime value) is applied, and g is zeroed;
 * t += 1. Bit-identical to scaling all gradients, then updating parameter
 * by parameter, then zeroing (tests/test_optim.c). */
kiln_status kiln_adamw_update(kiln_adamw *o, double lr, double grad_scale);
/* sqrt(sum of squares) over the trainable gradients (missing grads count 0),
 * one parallel pass over all of them; the same sum, to the bit, as adding
 * kiln_k_sumsq of each gradient in parameter order. */
double kiln_grad_norm(const kiln_adamw *o);
void kiln_grad_zero(const kiln_adamw *o);

/* Linear warm-up over `warmup` steps, then cosine from lr to min_lr at
 * `total`; step counts optimiser steps from 0. */
double kiln_lr_at(const kiln_train_config *c, int64_t step, int64_t total);

/* ---- objectives: what a training step minimises (objective.c) -------------
 * An objective traces its loss from the model's outputs (the model returns
 * logits; the loss is not the model's), names the batch fields it reads,
 * says what one window's loss is divided by, and names its metrics. The
 * step passes inputs by name (KILN_IN_*): in[] of a trace holds every
 * name, NULL where the batch has none. A compiled step takes the names of
 * kiln_objective_inputs in that order. Token cross-entropy ("ce") is the
 * first objective; every training and evaluation path runs through it. */
typedef enum {
    KILN_IN_IDS, KILN_IN_TARGETS, KILN_IN_MASK, KILN_IN_SCALE, KILN_IN_SCALE_2, KILN_IN_REF_LOGPS, KILN_IN_POSITIONS,
    KILN_IN_SEGMENTS, KILN_IN_KEY, KILN_IN_N
} kiln_input;
const char *kiln_input_name(kiln_input i); /* "ids", "targets", ... */
/* What a sum is divided by: a window's target tokens, its pairs, or the
 * target tokens of its chosen answers (rows 2i of pairs). */
typedef enum { KILN_NORM_TARGET_TOKENS, KILN_NORM_PAIRS, KILN_NORM_CHOSEN_TOKENS, KILN_NORM_N } kiln_norm;
const char *kiln_norm_name(kiln_norm n); /* "target tokens", "pairs", "chosen tokens" */
#define KILN_OBJ_MAX_METRICS 10
#define KILN_OBJ_MAX_TERMS 2
typedef struct kiln_objective kiln_objective;
struct kiln_objective {
    const char *name;
    /* The loss is a sum of terms, each a sum over the micro-batch divided
     * by the window's units of its kind: loss = sum_j term_j / units[norm_j]
     * (exact under accumulation and across ranks). The step's scale inputs
     * are 1 / units of term 0 (scale) and term 1 (scale_2). */
    int n_terms;
    kiln_norm norm[KILN_OBJ_MAX_TERMS];
    bool docs;           /* reads packed documents (positions, segments) */
    bool ref_logps;      /* reads the reference's per-row log-probabilities (ref_logps [B]) */
    int n_metrics;
    const char *metric[KILN_OBJ_MAX_METRICS];
    kiln_norm metric_norm[KILN_OBJ_MAX_METRICS]; /* what metric j's window sum is divided by */
    /* report[j < n_terms]: term j summed over the micro-batch ([1] f32);
     * report[n_terms + j]: metric j summed the same way */
    kiln_status (*trace)(const kiln_objective *o, kiln_llama *m, kiln_tensor *const *in, kiln_tensor **report);
    /* the preference objectives' parameters (the run's settings) */
    int kind;            /* KILN_OBJECTIVE_* */
    int loss;            /* dpo: KILN_DPO_* */
    double beta, gamma;  /* dpo, simpo, orpo: beta (orpo: lambda); simpo: gamma, the target margin */
};
typedef enum { KILN_OBJECTIVE_CE, KILN_OBJECTIVE_DPO, KILN_OBJECTIVE_SIMPO, KILN_OBJECTIVE_ORPO } kiln_objective_kind;
typedef enum { KILN_DPO_SIGMOID, KILN_DPO_IPO, KILN_DPO_HINGE } kiln_dpo_loss;
typedef enum { KILN_DPO_REF_AUTO, KILN_DPO_REF_ADAPTERS, KILN_DPO_REF_FILE } kiln_dpo_ref;
/* The run's objective (the objective, beta, dpo_loss, dpo_ref and
 * simpo_gamma settings; ce on packed documents when pack is documents).
 * The preference objectives read pairs (pack pairs: rows 2i chosen, 2i+1
 * rejected) and divide a window by its pairs:
 *   dpo sigmoid  -logsigmoid(beta d),  d = (pc - rc) - (pr - rr)
 *   dpo ipo      (d' - 1 / (2 beta))^2, d' = the same of per-token means
 *   dpo hinge    relu(1 - beta d)
 *   simpo        -logsigmoid(beta (pc/nc - pr/nr) - gamma)
 *   orpo         sum(nll of chosen answers) / chosen target tokens
 *                + beta mean(-logsigmoid(log odds(pc/nc) - log odds(pr/nr))),
 *                log odds(a) = a - log(1 - e^a)
 * with p the policy's summed log-probabilities of an answer's targets, r
 * the reference's, n the answer's target count; TRL's formulas
 * (DPOTrainer, CPOTrainer loss_type simpo, ORPOTrainer). The reference
 * (dpo_ref): the base with its LoRA adapters off (same weights, no copy;
 * adapters, the default with --lora-rank), or the per-row log-probs kiln
 * dpo-ref stored beside the shards (file, the default without). Metrics
 * as TRL names them: rewards/chosen, rewards/rejected (beta (p - r);
 * simpo, orpo: beta p/n), rewards/accuracies, rewards/margins,
 * logps/chosen, logps/rejected (simpo, orpo: per-token means); orpo also
 * nll_loss, log_odds_ratio and log_odds_chosen. */
kiln_status kiln_objective_from_config(const kiln_train_config *c, kiln_objective *out);
/* The ce objective's loss: the sum of token cross-entropies of the
 * model's logits over targets != KILN_IGNORE_INDEX, shape [1] (docs:
 * packed documents, else NULL). Dividing by the window's target count is
 * the step's business. */
kiln_tensor *kiln_ce_loss(kiln_llama *m, kiln_tensor *ids, kiln_tensor *targets, kiln_tensor *pad_mask,
                          const kiln_llama_docs *docs);
/* Cross-entropy over target tokens (docs: on packed documents). */
const kiln_objective *kiln_objective_ce(bool docs);
/* The names a step of o reads, in order: ids, targets, mask, scale, then
 * scale_2 (two terms), ref_logps, positions and segments (docs), then the
 * dropout key (key); returns the count. */
int kiln_objective_inputs(const kiln_objective *o, bool key, kiln_input *names);
/* What backward differentiates: sum_j report[j] x scale_j (the scale and
 * scale_2 inputs of in[], by name). */
kiln_tensor *kiln_objective_diff(const kiln_objective *o, kiln_tensor **report, kiln_tensor *const *in);
/* One micro-batch's units of every kind (KILN_NORM_*). */
void kiln_batch_units(const kiln_batch *b, int64_t units[KILN_NORM_N]);
/* One micro-batch's units of o's first term: target tokens, or pairs. */
int64_t kiln_objective_units(const kiln_objective *o, const kiln_batch *b);
/* The trace of a step (kiln_compile's trace function): ctx is a
 * kiln_step_trace that outlives the compiled step. */
typedef struct {
    kiln_llama *m;
    const kiln_objective *o;
    int n_in;
    kiln_input names[KILN_IN_N];
} kiln_step_trace;
kiln_status kiln_train_trace_objective(void *ctx, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                       kiln_tensor **diff);
/* The reference's summed target log-probabilities of each row of pairs
 * batch b (out: b->B values): m with its adapters off, no gradient. */
kiln_status kiln_ref_logps_batch(kiln_llama *m, const kiln_batch *b, float *out);
/* The compiled step of t (its n_in and names are filled); t must outlive it. */
kiln_compiled *kiln_train_compile_objective(kiln_step_trace *t, const kiln_compile_options *o, bool backward);

/* ---- one optimiser step over a window of micro-batches ------------------- */
typedef struct {
    double loss;        /* window loss: summed token losses / target tokens */
    double grad_norm;   /* before clipping */
    double lr;
    int64_t tokens;     /* target tokens in the window */
    int micro_batches;
    bool skipped;       /* non-finite loss or norm: no update was made */
    int bad_micro;      /* with skipped: first micro-batch with a non-finite loss, or -1 (norm) */
    int64_t units;      /* what the window's first term was divided by: target tokens, or pairs */
    int n_metrics;      /* the objective's metrics, window means, and their names (static) */
    double metric[KILN_OBJ_MAX_METRICS];
    const char *metric_name[KILN_OBJ_MAX_METRICS];
} kiln_step_result;

/* The end of an optimiser step, after the window's gradients are summed
 * (and all-reduced): unless res->skipped, res->grad_norm = the global norm;
 * a non-finite norm sets res->skipped; then, unless skipped, clip to c->clip
 * and one AdamW update with `lr`; gradients are zeroed either way. */
kiln_status kiln_adamw_apply(kiln_adamw *o, const kiln_train_config *c, double lr, kiln_step_result *res);

/* Runs forward+backward on each micro-batch (gradients accumulate), then
 * clips and steps. Loss normalisation per c->loss_norm. On a non-finite loss
 * or norm, gradients are dropped and nothing is updated (res->skipped); the
 * caller decides whether to stop. */
kiln_status kiln_train_window(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb, int k,
                              double lr, kiln_step_result *res);
/* The same with each micro-batch run by a compiled step (NULL: eager); a
 * shape past the compiled variant limit runs eager. */
kiln_status kiln_train_window_ex(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb, int k,
                                 double lr, kiln_step_result *res, kiln_compiled *cs);
/* The training micro-step as a traceable function (user = the model):
 * inputs ids, targets, pad mask [B,T] and the loss scale [1]; reports the
 * summed token loss and differentiates scale x sum. */
kiln_status kiln_train_trace_step(void *model, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                  kiln_tensor **diff);
/* The same for rows of packed documents: inputs 4 and 5 are the batch's
 * positions and segment ids [B,T] (kiln_batch.segmented). */
kiln_status kiln_train_trace_step_docs(void *model, kiln_tensor *const *in, kiln_tensor **report, int *n_report,
                                       kiln_tensor **diff);
/* With LoRA dropout (adapters with dropout > 0), a training trace takes one
 * more input after the others (5th, or 7th with packed documents): the
 * dropout key [1] (kiln_train_dropout_key of the global
 * micro-batch), set by the window for each micro-batch; evaluation and
 * generation run without dropout. */
bool kiln_train_uses_dropout(const kiln_llama *m);
float kiln_train_dropout_key(uint64_t seed, int64_t step, int64_t micro);
/* A compiled training step (backward) or evaluation step (forward only). */
kiln_compiled *kiln_train_compile(kiln_llama *m, const kiln_compile_options *o, bool backward);
/* documents: for segmented batches (--pack documents), whose positions and
 * segment ids it takes as inputs; running it on the other kind of batch
 * (or kiln_train_compile's on segmented ones) is an error. */
kiln_compiled *kiln_train_compile_ex(kiln_llama *m, const kiln_compile_options *o, bool backward, bool documents);
kiln_status kiln_evaluate_ex(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens, kiln_compiled *cs);
/* Mean token loss over batches, no gradient work. */
kiln_status kiln_evaluate(kiln_llama *m, kiln_batch *const *mb, int n, double *loss, int64_t *tokens);
/* The same for objective o (NULL: cross-entropy): the loss and metrics
 * (o->n_metrics of them) as means over the batches' units (*units). */
kiln_status kiln_evaluate_objective(kiln_llama *m, const kiln_objective *o, kiln_batch *const *mb, int n, double *loss,
                                    double *metrics, int64_t *units, kiln_compiled *cs);

/* ---- memory-aware micro-batch choice (membudget.c) ----------------------- */
/* What a compiled run with micro-batches of b x T needs, in bytes. The
 * arenas come from building the training and evaluation graphs (symbolic:
 * nothing runs) under the thread's current autocast setting; bf16 changes
 * the graph. overhead is a fixed, measured runtime cost. */
typedef struct {
    int64_t arena_train, arena_eval; /* the compiled plans' arenas */
    int64_t params, grads, optim;    /* parameters as held (a bf16 base: 2 bytes a weight); fp32
                                        gradients and AdamW moments of what trains (LoRA: adapters) */
    int64_t batches;                 /* token buffers */
    int64_t scratch;                 /* kernel scratch outside the arena (bf16 operand copies) */
    int64_t overhead;                /* code, libraries, oneDNN, OpenMP, data (measured) */
    int64_t total;                   /* the predicted peak */
} kiln_mem_estimate;
kiln_status kiln_train_plan_bytes(kiln_llama *m, int b, int T, const kiln_compile_options *o, kiln_mem_estimate *out);
typedef struct {
    int micro_batch, accum, global_batch; /* micro_batch x accum == global_batch, always */
    int largest_fit;                      /* the largest b the budget allows (b <= global_batch) */
    int64_t budget;
    bool budget_default;                  /* 70% of MemAvailable (no --mem-budget) */
    kiln_mem_estimate est;                /* of the chosen micro-batch (zero when eager) */
    char note[256];                       /* non-empty: why micro_batch < largest_fit */
} kiln_mem_choice;
/* With c->global_batch = N: micro_batch "auto" picks the largest divisor b
 * of N whose plan fits the budget (N is never changed; a note says when a
 * larger b would fit but does not divide N), a number b must divide N.
 * accum = N / b. A budget below one sequence's needs is an error naming the
 * smallest budget that works. auto needs a compile mode (the plan is the
 * compiler's). Does not modify c. */
kiln_status kiln_train_choose_batch(const kiln_train_config *c, kiln_llama *m, kiln_mem_choice *out);
/* global_batch and micro_batch together (part of validation). */
kiln_status kiln_train_check_batch_settings(const kiln_train_config *c);
int64_t kiln_mem_available(void); /* MemAvailable of /proc/meminfo in bytes, 0 if unknown */
const char *kiln_bytes_str(int64_t bytes, char *buf, size_t n); /* "1.23 GiB" */

/* ---- the trainer --------------------------------------------------------- */
typedef struct {
    int64_t step, total_steps, steps_per_epoch, micro_per_epoch;
    int64_t epoch;
    int64_t tokens_seen;
    double elapsed_s;     /* training time over all sessions */
    double last_loss, last_val_loss;
    uint64_t seed;
} kiln_trainer_state;

typedef enum { KILN_EVENT_STEP, KILN_EVENT_EVAL, KILN_EVENT_SAVE, KILN_EVENT_NAN, KILN_EVENT_INFO } kiln_event_kind;
typedef struct {
    kiln_event_kind kind;
    const kiln_trainer_state *state;
    const kiln_step_result *step;  /* KILN_EVENT_STEP / NAN */
    double val_loss;               /* KILN_EVENT_EVAL */
    int n_val_metrics;             /* KILN_EVENT_EVAL of a preference objective: its metrics */
    const double *val_metrics;
    const char *const *val_metric_names;
    double tokens_per_s;
    const char *message;           /* KILN_EVENT_SAVE (path) / INFO */
} kiln_event;
typedef void (*kiln_event_fn)(const kiln_event *e, void *user);

typedef struct kiln_trainer kiln_trainer;
/* Sets up a run: model (fresh, --init, or the latest checkpoint of run_dir
 * when resume), optimiser, loaders, metrics.jsonl. */
kiln_status kiln_trainer_open(const kiln_train_config *c, bool resume, kiln_trainer **out);
void kiln_trainer_free(kiln_trainer *t);
/* Trains until total steps, a stop request, or an error; saves at the end. */
kiln_status kiln_trainer_run(kiln_trainer *t, kiln_event_fn fn, void *user);
/* Async-signal-safe: finish the current step, save, return. */
void kiln_trainer_request_stop(kiln_trainer *t);
const kiln_trainer_state *kiln_trainer_get_state(const kiln_trainer *t);
kiln_llama *kiln_trainer_model(kiln_trainer *t);
kiln_adamw *kiln_trainer_optimizer(kiln_trainer *t);
const kiln_train_config *kiln_trainer_config(const kiln_trainer *t);
/* The micro-batch choice of a run with global_batch (NULL otherwise). */
const kiln_mem_choice *kiln_trainer_mem_choice(const kiln_trainer *t);

/* ---- checkpoints ---------------------------------------------------------- */
/* run_dir/checkpoint-<step>/ holds config.json, model.safetensors,
 * optimizer.safetensors, trainer_state.json (+ train_config.json,
 * tokenizer.json). It is written as checkpoint-<step>.tmp and renamed when
 * complete, so a crash mid-save leaves the earlier checkpoints intact. The
 * run_dir's model.safetensors, config.json and tokenizer.json are symlinks to
 * the newest. keep > 0 deletes the oldest beyond `keep`, never the newest;
 * each is renamed out of the listing before its files go, so a kill during
 * rotation never leaves a partial checkpoint that looks complete. */
kiln_status kiln_checkpoint_save(const char *run_dir, const kiln_llama *m, const kiln_adamw *opt,
                                 const kiln_trainer_state *st, const kiln_train_config *c, int keep);
/* kiln_checkpoint_save in two halves, for a save other ranks add files to (a
 * sharded optimiser's shards, kiln_zero_save): begin cleans run_dir and makes
 * the empty checkpoint-<step>.tmp; finish writes the rest there (the moments
 * only when opt is not sharded), the marker, and commits as the whole save
 * does. kiln_checkpoint_tmp names that directory (on any rank). */
kiln_status kiln_checkpoint_tmp(const char *run_dir, int64_t step, char *out, size_t n);
kiln_status kiln_checkpoint_begin(const char *run_dir, int64_t step);
kiln_status kiln_checkpoint_finish(const char *run_dir, const kiln_llama *m, const kiln_adamw *opt,
                                   const kiln_trainer_state *st, const kiln_train_config *c, int keep);
/* The newest complete checkpoint directory of run_dir (into out): its
 * trainer_state.json (written last) lists every file of the checkpoint with
 * its size and each is there, whole. What --resume loads. */
kiln_status kiln_checkpoint_latest(const char *run_dir, char *out, size_t n);
/* The model directory `dir` stands for: the newest complete checkpoint
 * (as kiln_checkpoint_latest) when dir is a run directory (it has
 * checkpoint-* directories or a trainer_state.json), else dir itself (a
 * model directory: config.json and weights). */
kiln_status kiln_model_dir_resolve(const char *dir, char *out, size_t n);
/* Removes what interrupted saves leave in run_dir (checkpoint-*.tmp/,
 * directories moved aside, .<file>.link.<pid> and <file>.tmp.<pid>
 * temporaries of processes no longer running). Every save does it first. */
kiln_status kiln_checkpoint_clean(const char *run_dir);
/* Loads weights by Hugging Face name into an existing model from one
 * safetensors file. The whole file is checked against the model first:
 * every missing, unexpected, mis-shaped or mis-typed tensor is listed in one
 * error and the model is left as it was. F32, BF16 and F16 tensors are
 * converted once into the F32 parameters. */
kiln_status kiln_load_weights(const char *safetensors_path, kiln_llama *m);
kiln_status kiln_save_weights(const char *safetensors_path, const kiln_llama *m); /* F32, one file */
/* dir/model.safetensors, else the shards dir/model.safetensors.index.json
 * maps ({"weight_map": {tensor: file}}; files beside it), checked as one set
 * as above (a tensor in the wrong shard, or in a shard but not the index,
 * is a problem too). */
kiln_status kiln_load_model_weights(const char *dir, kiln_llama *m);
/* A model from a directory holding config.json and its weights, made on
 * the thread's current device (kiln_backend_use). */
kiln_status kiln_load_model_dir(const char *dir, kiln_llama **out);
/* The same on device KILN_DEVICE_* (what `kiln eval/generate --device`
 * load with): the model, its LoRA adapters and everything made while
 * loading live there; the thread's device is restored after. */
kiln_status kiln_load_model_dir_on(const char *dir, int device, kiln_llama **out);
/* A model from a GGUF file (gguf_model.c), the inverse of kiln_export_gguf
 * for llama.cpp's llama, qwen2 and qwen3 architectures: the config from
 * {arch}.* metadata (context_length, embedding_length, block_count,
 * feed_forward_length, head counts, key/value length, rope base and linear
 * scaling, rms epsilon; tied when there is no output.weight; biases by
 * their tensors), the tensors under the Hugging Face names, llama's q/k
 * rows put back in rotate_half order. keep_types (a frozen base: eval,
 * generate, LoRA) keeps each 2-D weight in the file's type where kiln
 * computes with it (F16 and ggml's blocks through the dequantizing product
 * and lookup, BF16 projections through the bf16 product), else every
 * tensor is widened to fp32 exactly as ggml's to_float does. Refused,
 * naming the file and the key or tensor: another architecture or
 * general.type, a key under the architecture kiln does not implement
 * (sliding windows, experts, partial rotary...), rope_freqs.weight, a
 * missing, mis-shaped or unused tensor, a non-finite widened value. Pages
 * of the mapping are given back as each tensor is copied. */
kiln_status kiln_gguf_model_load(const char *path, bool keep_types, kiln_llama **out);
/* path ends in .gguf (any case) */
bool kiln_is_gguf_path(const char *path);
/* A LoRA run's base held as f16 or ggml blocks (base_ref.c): checkpoints
 * write DIR/base.json (the --init source's real path or none, --model, the
 * base_dtype setting, the run's seed, a hash of the base's bytes) instead
 * of its weights, and kiln_load_model_dir re-derives the base from it (the
 * GGUF, the --init model or the seed's weights, cast as the run cast them),
 * adds DIR's adapters, and refuses a base whose bytes hash otherwise. */
bool kiln_base_is_held(const kiln_llama *m);
/* The base parameters' bytes (as held: fp32, bf16, f16 or block types),
 * hashed tensor by tensor, in order, with their types. */
kiln_status kiln_base_hash(const kiln_llama *m, uint64_t *out);
kiln_status kiln_base_ref_save(const char *dir, const kiln_llama *m, const kiln_train_config *c);
bool kiln_base_ref_exists(const char *dir);
kiln_status kiln_base_ref_load(const char *dir, kiln_llama **out);

#define KILN_DEFAULT_SHARD_BYTES ((uint64_t)5000000000) /* "5GB", as Hugging Face */
typedef struct {
    kiln_dtype dtype;     /* KILN_F32, KILN_BF16 or KILN_F16 */
    uint64_t shard_bytes; /* most tensor bytes per file (0: the default) */
} kiln_weights_options;
/* --save-dtype fp32|bf16|f16 and --shard-size SIZE ("5GB", "500MB", "2GiB",
 * bytes) as options; NULL or "" gives the defaults. */
kiln_status kiln_weights_options_parse(const char *dtype, const char *shard_size, kiln_weights_options *o);
/* Writes dir/model.safetensors when the weights fit one shard, else
 * model-0000i-of-0000n.safetensors (parameters in order, a new file when the
 * next would pass shard_bytes) and model.safetensors.index.json, the
 * Hugging Face layout; weight files of an earlier save there that are not
 * part of this one are removed. */
kiln_status kiln_save_model_weights(const char *dir, const kiln_llama *m, const kiln_weights_options *o);
/* dir/generation_config.json and dir/tokenizer_config.json, copied (after
 * checking they parse) from where the run's model came from (the --init
 * model, the tokenizer's directory, the run's newest checkpoint), else
 * written from the model's config ids and the tokenizer's special tokens.
 * c may be NULL. Every checkpoint save does this. */
kiln_status kiln_model_files_save(const char *dir, const kiln_llama *m, const kiln_train_config *c);
kiln_status kiln_adamw_load(const char *path, kiln_adamw *o);
kiln_status kiln_adamw_save(const char *path, const kiln_adamw *o);
/* The optimiser state of checkpoint `dir` into o, whichever way it was
 * written and whatever o's layout: optimizer.safetensors (whole moments) or
 * optimizer.shards.json + optimizer-RRRRR-of-PPPPP.safetensors (a sharded
 * run's, any number of ranks): each rank reads the pieces of its own slice
 * (re-sharding P -> Q), after checking each shard it reads against the
 * manifest (size, SHA-256, segments covering every parameter once). A
 * missing, torn or foreign shard is an error naming it; nothing is copied
 * before every check passed. */
kiln_status kiln_adamw_load_checkpoint(const char *dir, kiln_adamw *o);
/* Collective over the ranks of a sharded optimiser: every rank writes its
 * shard into checkpoint directory `dir` atomically, rank 0 then writes
 * optimizer.shards.json (each shard's file, rank, bytes, SHA-256, floats and
 * segments). On failure on any rank every rank returns an error naming it. */
kiln_status kiln_zero_save(const char *dir, const kiln_adamw *o);
kiln_status kiln_trainer_state_save(const char *path, const kiln_trainer_state *st);
/* LoRA adapters in PEFT's files (lora_io.c): dir/adapter_config.json (r,
 * lora_alpha, lora_dropout, use_rslora, target_modules, peft_type "LORA", task_type
 * "CAUSAL_LM", base_model_name_or_path = base) and dir/adapter_model.safetensors
 * (base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight, ...).
 * _load adds the adapters to a model without any (kiln_llama_lora_add) and
 * fills them; a config PEFT would read differently (use_dora, bias,
 * lora_bias, exclude_modules, fan_in_fan_out, per-layer patterns) or a
 * scaling outside kiln_lora_config_validate's range is an error naming the
 * field and the file. */
kiln_status kiln_lora_save(const char *dir, const kiln_llama *m, const char *base);
kiln_status kiln_lora_load(const char *dir, kiln_llama *m);
/* `kiln export RUN --merge-lora -o OUT`: the model of a LoRA run (its newest
 * checkpoint) with the adapters merged into the base, written as a plain
 * model directory: config.json, model.safetensors (F32, or shards + index),
 * and tokenizer.json, tokenizer_config.json, generation_config.json,
 * chat_template.jinja copied when the checkpoint has them; nothing else (no
 * adapter files). Written whole beside OUT and swapped in with one rename,
 * so OUT is the old complete directory or the new one at every instant;
 * leftovers of killed exports are removed. Refused: a directory without
 * adapters; OUT inside a run directory or checkpoint, inside the directory
 * exported, or its base model; an existing OUT that is not a model
 * directory kiln could have written. */
kiln_status kiln_lora_export_merged(const char *run_or_model_dir, const char *out_dir);
kiln_status kiln_trainer_state_load(const char *path, kiln_trainer_state *st);

/* ---- data parallel over MPI ------------------------------------------------
 * `mpirun -np P kiln train ...`: every rank holds the whole model and reads
 * its own share of each optimiser step's micro-batches (P x accum in all);
 * gradients are summed across ranks once per step, in buckets, then every
 * rank clips and steps identically. Built without MPI (no mpicc found) these
 * are single-rank no-ops, and kiln_dist_init refuses a start by mpirun with
 * more than one process. Errors here are fatal to the job (MPI's default). */
kiln_status kiln_dist_init(int *argc, char ***argv); /* MPI_Init when started by mpirun */
void kiln_dist_finalize(void);
int kiln_dist_rank(void);
int kiln_dist_size(void);
bool kiln_dist_built(void); /* compiled with MPI */
/* Ends the whole job (MPI_Abort) after printing "kiln: rank R of P: why". */
_Noreturn void kiln_dist_abort(const char *why);
/* Start each gradient bucket's all-reduce during the last backward (default
 * on; off: blocking all-reduces after backward, for comparison). */
void kiln_dist_set_overlap(bool on);
bool kiln_dist_overlap(void);
void kiln_dist_set_bucket_bytes(size_t bytes); /* default 25 MB */
size_t kiln_dist_bucket_bytes(void);
/* In-place sums of doubles across ranks (blocking, collective). */
kiln_status kiln_dist_sum_f64(double *v, int n);
/* --shard gradients: at the end of a micro-batch that is not the window's
 * last, reduce-scatters the buckets not yet started, adds this rank's piece
 * of every bucket into o->zero->g and drops the full gradients. */
kiln_status kiln_dist_reduce_micro(kiln_adamw *o);
/* After a sharded update: every rank's updated pieces to every rank (one
 * all-gather per bucket), so all hold the whole new parameters. */
kiln_status kiln_dist_gather_params(kiln_adamw *o);
/* Host bytes of the communication buffers held now. */
double kiln_dist_buffer_bytes(void);
/* In-place sums / maxima across ranks (blocking, collective). */
kiln_status kiln_dist_sum_i64(int64_t *v, int n);
kiln_status kiln_dist_max_i64(int64_t *v, int n);
kiln_status kiln_dist_barrier(void);
/* Arms the eager grad-ready hook so buckets start while the coming
 * backward runs (the window's last); kiln_dist_allreduce_grads disarms. */
void kiln_dist_grads_arm(kiln_adamw *o);
/* Sums every trainable gradient across ranks (buckets in reverse parameter
 * order, each one all-reduce), and sums[0..n) (n <= 16) with the last
 * bucket. Collective: every rank calls it once per optimiser step. */
kiln_status kiln_dist_allreduce_grads(kiln_adamw *o, double *sums, int n);
typedef struct {
    int64_t steps;          /* kiln_dist_allreduce_grads calls */
    int64_t grad_calls;     /* gradient-bucket all-reduces (reduce-scatters with --shard gradients) started */
    int64_t gather_calls;   /* parameter-bucket all-gathers (with --shard) */
    int64_t other_calls;    /* small all-reduces (the window's counts) */
    int n_buckets;
    double bytes;           /* gradient bytes reduced (per rank) */
    double wait_s;          /* blocked in MPI (waits, blocking collectives) */
    double grad_wait_s;     /* the part of wait_s spent waiting for gradient buckets */
    double hook_s;          /* packing and polling from the grad-ready hook */
} kiln_dist_stats;
void kiln_dist_stats_get(kiln_dist_stats *s);
void kiln_dist_stats_reset(void);

/* The window's totals across all ranks: target tokens, micro-batches, and
 * where this rank's micro-batches start in the global window. */
typedef struct {
    int64_t tokens;
    int64_t units[KILN_NORM_N]; /* the window's units of every kind over all ranks (0s: the local ones) */
    int micro_batches, first_micro;
    int64_t step; /* the optimiser step being taken (0-based): it seeds LoRA dropout's masks */
} kiln_window_totals;
/* kiln_train_window_ex normalised by the global totals (NULL: local), with
 * the gradients and loss summed across ranks when there are several. */
kiln_status kiln_train_window_global(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, kiln_batch *const *mb,
                                     int k, double lr, kiln_step_result *res, kiln_compiled *cs,
                                     const kiln_window_totals *g);

/* One micro-batch's forward + backward timed compiled (cs, after a run that
 * builds it) and eager (after a warm-up run), each the best of reps runs:
 * ms[0] compiled, ms[1] eager. The gradients are zeroed afterwards. What
 * --compile max-autotune measures before the first step (trainer.c). */
kiln_status kiln_train_time_modes(kiln_llama *m, kiln_adamw *opt, const kiln_train_config *c, const kiln_batch *b,
                                  kiln_compiled *cs, int reps, double ms[2]);

/* ---- generation ------------------------------------------------------------- */
typedef struct {
    int max_tokens;
    double temperature; /* 0: greedy */
    int top_k;          /* 0: off */
    double top_p;       /* 1: off */
    uint64_t seed;
    int stop_id;        /* stop after this id (e.g. eos), -1: none */
    const int32_t *stop_ids; /* and after any of these (a model's eos ids); may be NULL */
    int n_stop_ids;
} kiln_sample_config;
/* id ends generation under sc (stop_id or one of stop_ids) */
bool kiln_sample_is_stop(const kiln_sample_config *sc, int32_t id);
/* Appends up to max_tokens ids to prompt (n_prompt >= 1) using a key/value
 * cache; out receives the new ids (capacity max_tokens), *n_out their count.
 * on_token (may be NULL) is called for each new id. */
kiln_status kiln_generate(kiln_llama *m, const int32_t *prompt, int n_prompt, const kiln_sample_config *sc,
                          int32_t *out, int *n_out, void (*on_token)(int32_t id, void *user), void *user);

/* ---- export ---------------------------------------------------------------
 * A model directory (a run directory: its newest complete checkpoint, as
 * kiln_model_dir_resolve; or any directory with config.json,
 * model.safetensors and tokenizer.json) as one GGUF file for llama.cpp, in
 * the llama.cpp architecture that represents the family: llama and mistral
 * as "llama" (q/k rows of each head reordered from Hugging Face's
 * rotate_half halves to the adjacent pairs llama.cpp rotates; attention and
 * MLP biases; rope_scaling linear as rope.scaling.type/factor, llama3 as the
 * rope_freqs.weight tensor), qwen2 as "qwen2" (q/k/v biases), qwen3 as
 * "qwen3" (attn_q_norm/attn_k_norm), both rotating halves as Hugging Face
 * does; head_dim as attention.key_length/value_length; a sliding window
 * shorter than max_position_embeddings as context_length. A byte-level
 * BPE tokenizer goes in as tokenizer.ggml.* (model "gpt2"; pre "gpt-2",
 * "llama-bpe" or "qwen2" by the exact regex and options of its
 * pre-tokenizer; tokens, token types, merges), a SentencePiece-style one
 * (byte_fallback: Llama 2, Mistral, Gemma) as model "llama" (tokens, a
 * score per token that makes llama.cpp's highest-score-first merging run
 * the merges in their order, types with <0xXX> as bytes and the unknown
 * token, add_space_prefix from a Prepend normalizer); both with
 * bos/eos/pad (kiln_model_meta:
 * the first of an eos list as eos, the ids whose text is <|eot_id|> /
 * <|eom_id|> as eot / eom, another second one as eot), add_bos_token as
 * kiln generate does it, the chat template when the directory has one,
 * after rendering it once: one that fails is refused). The tensors' types
 * follow the file type as llama.cpp's llama_model_quantize chooses them
 * without an importance matrix (llama-quant.cpp), from the same f32 values:
 * norms, biases and rope_freqs F32; f32/f16/bf16 every matrix in that type;
 * q8_0/q4_0 every matrix in it, q4_k_*, q5_k_*, q6_k in Q4_K/Q5_K/Q6_K,
 * except output.weight (and token_embd.weight when the embeddings are tied)
 * as Q6_K (Q8_0 with q8_0, or when its rows are not whole blocks of the
 * file type's block type), with q4_k_m/q5_k_m attn_v and ffn_down of the
 * layers llama.cpp's use_more_bits picks (the first and last eighth, and
 * every third between) as Q6_K, q4_k_s attn_v of layers 0-3 and ffn_down of
 * the first eighth as Q5_K; a matrix whose rows are not whole blocks falls
 * back as llama.cpp does: Q6_K to Q8_0, then to F16 when rows are not a
 * multiple of 32 (Q8_0, Q4_0 to F16). Blocks are ggml's reference bytes
 * (kiln_q_quantize). general.file_type is llama.cpp's llama_ftype. Refused
 * with the file, field and reason, before any weight is read: what the
 * target architecture cannot hold (qwen3 attention
 * biases, llama3 rope scaling outside llama, head_dim x heads != hidden
 * with qwen2), a tokenizer that llama.cpp would
 * tokenize differently (another pre-tokenizer regex, a normalizer other
 * than Qwen's NFC, ignore_merges not as that pre-tokenizer does it; for
 * SentencePiece, a normalizer, pre-tokenizer or decoder llama.cpp does not
 * have, missing byte tokens, two tokens that make a token without a merge
 * joining them), non-finite weights. A Q4_K/Q5_K
 * matrix whose rows are not a multiple of 256 falls back to Q5_0/Q5_1 as
 * in llama.cpp. The file is written atomically. */
/* GGUF file types, numbered as llama.cpp's llama_ftype (general.file_type). */
typedef enum {
    KILN_FTYPE_F32 = 0,
    KILN_FTYPE_F16 = 1,
    KILN_FTYPE_Q4_0 = 2,
    KILN_FTYPE_Q8_0 = 7,
    KILN_FTYPE_Q4_K_S = 14,
    KILN_FTYPE_Q4_K_M = 15,
    KILN_FTYPE_Q5_K_S = 16,
    KILN_FTYPE_Q5_K_M = 17,
    KILN_FTYPE_Q6_K = 18,
    KILN_FTYPE_BF16 = 32,
} kiln_export_ftype;
typedef struct {
    kiln_export_ftype ftype; /* the file type: the matrices' types */
    const char *tokenizer;   /* NULL: DIR/tokenizer.json */
    const char *name;        /* general.name; NULL: the directory's name */
} kiln_export_gguf_opts;
typedef struct {
    int n_tensors;
    int64_t n_tokens, n_merges, n_params;
    uint64_t data_bytes;
    const char *arch, *pre; /* general.architecture, tokenizer.ggml.pre (static strings; pre NULL for llama) */
    const char *tok_model;  /* tokenizer.ggml.model: "gpt2" or "llama" (SentencePiece) */
    bool add_space_prefix;  /* llama: tokenizer.ggml.add_space_prefix */
    int n_of_type[KILN_GGML_BF16 + 1]; /* tensors of each ggml type id */
} kiln_export_gguf_stats;
kiln_status kiln_export_gguf(const char *run_or_model_dir, const char *out_path, const kiln_export_gguf_opts *opts,
                             kiln_export_gguf_stats *stats);
/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q4_k_s", "q5_k_m",
 * "q5_k_s", "q6_k" (case-insensitive) */
kiln_status kiln_export_type_parse(const char *s, kiln_export_ftype *out);
const char *kiln_export_ftype_name(kiln_export_ftype t); /* "q4_k_m", ...; NULL if unknown */

/* `kiln export RUN --gguf-lora OUT.gguf`: the LoRA adapters of a run (its
 * newest checkpoint) or model directory as a GGUF adapter that llama.cpp
 * loads over the base's GGUF (llama_adapter_lora_init; the base exported
 * from the same directory without adapters, or any export of that base):
 * general.type "adapter", adapter.type "lora", general.architecture of the
 * base (as kiln_export_gguf plans it, with its refusals), and per adapted
 * linear blk.L.attn_q.weight.lora_a / .lora_b (attn_k, attn_v,
 * attn_output, ffn_gate, ffn_up, ffn_down) in F32, PEFT's A [r, in] and
 * B [out, r] as they are (llama.cpp multiplies B (A x)), q/k B rows
 * reordered as the base's q/k rows for the llama architecture.
 * llama.cpp scales each pair by adapter.lora.alpha / r, so alpha is
 * written as alpha (alpha * sqrt(r) with rslora, giving PEFT's
 * alpha / sqrt(r)). Refused: a directory without adapters
 * (adapter_config.json), non-finite adapters. Written atomically. */
typedef struct {
    int n_tensors, rank;
    int64_t n_params;      /* adapter values */
    uint64_t data_bytes;
    float alpha;           /* adapter.lora.alpha as written */
    double scaling;        /* kiln's (and PEFT's) factor */
    bool rslora;
    const char *arch;      /* general.architecture (a static string) */
} kiln_export_gguf_lora_stats;
kiln_status kiln_export_gguf_lora(const char *run_or_model_dir, const char *out_path, const char *name,
                                  kiln_export_gguf_lora_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
