/* The trainer loop: windows of micro-batches, the schedule, evaluation,
 * NaN handling, metrics.jsonl and checkpoints. Every window is a pure
 * function of (seed, step), so a resumed run continues exactly.
 *
 * With P ranks (MPI) the window of step s is P x accum micro-batches of the
 * epoch, [w*P*accum, (w+1)*P*accum) for w = s mod steps_per_epoch, and rank
 * r reads the contiguous share [w*P*accum + r*accum, +accum): the same
 * micro-batches, in the same order, as one process with P*accum. Rank 0
 * alone evaluates, writes metrics.jsonl and checkpoints; the trainer state
 * is global (the step), so a run resumes with any P. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "kiln/eager.h"
#include "kiln/model_meta.h"
#include "kiln/gguf.h"
#include "kiln/train.h"
#include "tfevents.h"

struct kiln_trainer {
    kiln_train_config cfg;
    kiln_llama *model;
    kiln_adamw *opt;
    kiln_loader *train, *val;
    kiln_batch **mb, **vb;
    int n_val;
    kiln_trainer_state st;
    kiln_compiled *cs_train, *cs_eval; /* NULL: eager */
    kiln_objective obj;                /* what the steps minimise (the settings') */
    kiln_step_trace tr_train, tr_eval; /* the compiled steps' traces of a preference objective */
    kiln_mem_choice mem;               /* --global-batch: the micro-batch choice (membudget.c) */
    bool has_mem;
    FILE *metrics;
    kiln_tfevents *events; /* TensorBoard's copy of metrics.jsonl's numbers (rank 0) */
    volatile sig_atomic_t stop;
    char model_src[1200]; /* where the model's vocab_size comes from, for messages */
    char init_dir[1100];  /* --init's model directory ("" without --init) */
    /* dpo with stored reference log-probs: the train and val tables, the
     * ones the first phase of run computes (bits 1: train, 2: val), and
     * the hash of the base that computes them */
    float *ref[2];
    int ref_pending;
    uint64_t ref_model_hash;
    bool told_misses; /* the compiled step's unfused rewrites were reported */
    bool step_chosen; /* --compile max-autotune's compiled-or-eager choice is made (choose_step) */
};

static bool is_file(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

static kiln_status mkdir_p(const char *dir) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return kiln_error(KILN_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
            *p = '/';
        }
    if (mkdir(buf, 0755) && errno != EEXIST) return kiln_error(KILN_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
    return KILN_OK;
}

/* The model of a fresh run: a preset sized to the shard's vocabulary, or a
 * config.json, or the weights of --init. */
static kiln_status build_model(kiln_trainer *t, const kiln_shard_info *info) {
    kiln_train_config *c = &t->cfg;
    if (c->init[0] && kiln_is_gguf_path(c->init)) {
        /* a LoRA base stays as the file holds it (base_dtype auto); full
         * fine-tuning and an explicit base_dtype start from fp32 */
        bool keep = c->lora_rank > 0 && c->base_dtype == KILN_BASE_DTYPE_AUTO;
        kiln_status st = kiln_gguf_model_load(c->init, keep, &t->model);
        snprintf(t->model_src, sizeof t->model_src, "%s", c->init);
        return st ? kiln_error_context(st, "--init %s", c->init) : KILN_OK;
    }
    if (c->init[0]) { /* a run dir: the checkpoint --resume would continue from */
        char dir[1100];
        kiln_status st = kiln_model_dir_resolve(c->init, dir, sizeof dir);
        if (!st) st = kiln_load_model_dir(dir, &t->model);
        snprintf(t->init_dir, sizeof t->init_dir, "%s", dir);
        snprintf(t->model_src, sizeof t->model_src, "%s/config.json", dir);
        return st ? kiln_error_context(st, "--init %s", c->init) : KILN_OK;
    }
    kiln_llama_config mc;
    bool preset = !strchr(c->model, '/') && !strstr(c->model, ".json");
    kiln_status st = preset ? kiln_llama_config_preset(c->model, &mc) : kiln_llama_config_load(c->model, &mc);
    if (st) return kiln_error_context(st, "--model %s", c->model);
    snprintf(t->model_src, sizeof t->model_src, preset ? "--model %s" : "%s", c->model);
    if (preset) {
        mc.vocab_size = (int64_t)info->vocab_size;
        mc.eos_token_id = info->eos_id < info->vocab_size ? (int64_t)info->eos_id : -1;
        mc.bos_token_id = info->bos_id < info->vocab_size ? (int64_t)info->bos_id : -1;
        mc.pad_token_id = info->pad_id < info->vocab_size ? (int64_t)info->pad_id : -1;
        if (mc.max_position_embeddings < c->seq_len) mc.max_position_embeddings = c->seq_len;
    }
    t->model = kiln_llama_new(&mc, c->seed);
    return t->model ? KILN_OK : kiln_error_context(kiln_last_status(), "--model %s", c->model);
}

static kiln_status open_loaders(kiln_trainer *t) {
    kiln_train_config *c = &t->cfg;
    char path[1100];
    snprintf(path, sizeof path, "%s/train.bin", c->data);
    kiln_loader_config lc = {.path = path, .batch_size = c->batch, .seq_len = c->seq_len, .mode = c->pack,
                             .shuffle = c->shuffle, .seed = c->seed};
    kiln_status st = kiln_loader_open(&lc, &t->train);
    if (st) return st;
    if (kiln_loader_len(t->train) < 1)
        return kiln_error(KILN_ERR_INVALID, "%s holds too few tokens for one micro-batch of %d x %d", path, c->batch, c->seq_len);
    snprintf(path, sizeof path, "%s/val.bin", c->data);
    struct stat vs;
    bool have_val = stat(path, &vs) == 0;
    if (!have_val && errno != ENOENT) return kiln_error(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    /* asked to evaluate with nothing to evaluate on: say so now, not by a
     * metrics file that never gets a val_loss */
    if (!have_val && c->eval_every > 0)
        return kiln_error(KILN_ERR_INVALID,
                          "%s does not exist, but eval_every is %lld: give a data directory with val.bin "
                          "or pass --eval-every 0 to train without evaluation",
                          path, (long long)c->eval_every);
    /* a directory (or device) there would otherwise turn evaluation off unnoticed */
    if (have_val && !S_ISREG(vs.st_mode))
        return kiln_error(KILN_ERR_INVALID, "%s is not a file (%s): evaluation reads a token shard there", path,
                          S_ISDIR(vs.st_mode) ? "a directory" : "not a regular file");
    if (have_val && kiln_dist_rank() == 0) { /* only rank 0 evaluates */
        lc.shuffle = false;
        lc.mode = c->pack == KILN_PACK_PAIRS ? KILN_PACK_PAIRS : KILN_PACK_PACKED;
        st = kiln_loader_open(&lc, &t->val);
        if (st) return st;
        int64_t n = kiln_loader_len(t->val);
        t->n_val = (int)(c->eval_batches && c->eval_batches < n ? c->eval_batches : n);
    }
    t->mb = calloc((size_t)c->accum, sizeof *t->mb);
    t->vb = calloc((size_t)(t->n_val ? t->n_val : 1), sizeof *t->vb);
    if (!t->mb || !t->vb) return kiln_error(KILN_ERR_OOM, "out of memory");
    for (int i = 0; i < c->accum; i++)
        if (!(t->mb[i] = kiln_batch_alloc(c->batch, c->seq_len))) return kiln_last_status();
    for (int i = 0; i < t->n_val; i++) {
        if (!(t->vb[i] = kiln_batch_alloc(c->batch, c->seq_len))) return kiln_last_status();
        if ((st = kiln_loader_get(t->val, 0, i, t->vb[i]))) return st;
    }
    return KILN_OK;
}

/* The loaders and their batches (opened by open_loaders), freed and cleared. */
static void close_loaders(kiln_trainer *t) {
    for (int i = 0; t->mb && i < t->cfg.accum; i++) kiln_batch_free(t->mb[i]);
    for (int i = 0; t->vb && i < t->n_val; i++) kiln_batch_free(t->vb[i]);
    free(t->mb);
    free(t->vb);
    kiln_loader_close(t->train);
    kiln_loader_close(t->val);
    t->mb = t->vb = NULL, t->train = t->val = NULL, t->n_val = 0;
}

/* --global-batch: the micro-batch the memory budget allows; the loaders
 * reopen with it. A resumed run keeps the batch and accum it saved. */
static kiln_status choose_micro_batch(kiln_trainer *t) {
    kiln_train_config per_rank = t->cfg; /* --global-batch counts all ranks' rows */
    int P = kiln_dist_size();
    if (per_rank.global_batch % P)
        return kiln_error(KILN_ERR_INVALID, "--global-batch %d is not a multiple of the %d MPI ranks", per_rank.global_batch, P);
    per_rank.global_batch /= P;
    kiln_status st = kiln_train_choose_batch(&per_rank, t->model, &t->mem);
    if (st) return st;
    t->has_mem = true;
    if (t->mem.micro_batch == t->cfg.batch && t->mem.accum == t->cfg.accum) return KILN_OK;
    close_loaders(t);
    t->cfg.batch = t->mem.micro_batch, t->cfg.accum = t->mem.accum;
    return open_loaders(t);
}

/* Every input file against the model before the first step: a mismatch
 * found at the first evaluation or save could be hours in. */
static kiln_status check_fit(kiln_trainer *t, const kiln_shard_info *info) {
    const kiln_llama_config *mc = &t->model->cfg;
    const char *src = t->model_src[0] ? t->model_src : t->cfg.model;
    if ((int64_t)info->vocab_size > mc->vocab_size)
        return kiln_error(KILN_ERR_INVALID, "%s/train.bin has vocabulary %llu but the model (%s) only vocab_size %lld", t->cfg.data,
                          (unsigned long long)info->vocab_size, src, (long long)mc->vocab_size);
    const kiln_shard_info *vi = t->val ? kiln_loader_info(t->val) : NULL;
    if (vi && (int64_t)vi->vocab_size > mc->vocab_size)
        return kiln_error(KILN_ERR_INVALID, "%s/val.bin has vocabulary %llu but the model (%s) only vocab_size %lld", t->cfg.data,
                          (unsigned long long)vi->vocab_size, src, (long long)mc->vocab_size);
    if (t->cfg.seq_len > mc->max_position_embeddings)
        return kiln_error(KILN_ERR_INVALID, "--seq-len %d exceeds the model's max_position_embeddings %lld", t->cfg.seq_len,
                          (long long)mc->max_position_embeddings);
    return KILN_OK;
}

/* Keeps metrics.jsonl lines up to `step` (a resumed run rewrites the rest). */
static kiln_status open_metrics(kiln_trainer *t, bool resume) {
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->cfg.run_dir);
    if (resume && is_file(path)) {
        char *text;
        size_t n;
        kiln_status st = kiln_read_file(path, &text, &n);
        if (st) return st;
        size_t o = 0, w = 0;
        while (o < n) {
            char *nl = memchr(text + o, '\n', n - o);
            size_t len = nl ? (size_t)(nl - (text + o)) + 1 : n - o;
            const char *s = strstr(text + o, "\"step\":");
            int64_t step = 0; /* a line without a readable step is kept */
            if (s && s < text + o + len) {
                if (kiln_parse_leading_i64(s + 7 + strspn(s + 7, " "), 0, INT64_MAX, &step)) step = 0;
            }
            if (nl && step <= t->st.step) {
                memmove(text + w, text + o, len);
                w += len;
            }
            o += len;
        }
        st = kiln_write_file_atomic(path, text, w);
        free(text);
        if (st) return st;
    }
    t->metrics = fopen(path, resume ? "a" : "w");
    if (!t->metrics) return kiln_error(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    /* a new events file per process; TensorBoard drops the older files'
     * steps after t->st.step, as metrics.jsonl dropped them above */
    return kiln_tfevents_open(t->cfg.run_dir, t->st.step + 1, &t->events);
}

/* A failed write of the events file warns once and ends it; metrics.jsonl goes on. */
static void log_events(kiln_trainer *t, const char *const *tags, const double *v, int n) {
    if (!t->events || !kiln_tfevents_scalars(t->events, t->st.step, tags, v, n)) return;
    kiln_log(KILN_LOG_WARN, "%s: TensorBoard events stop at step %lld", kiln_last_error(), (long long)t->st.step);
    kiln_tfevents_close(t->events);
    t->events = NULL;
}

/* The shards against the tokenizer: `kiln tokenize` records its tokenizer's
 * id count and eos id in each shard's header, so a different count or eos
 * means the shards were made with another tokenizer. */
static kiln_status check_shard_tokenizer(const kiln_tokenizer *tok, const char *tok_path, const char *shard,
                                         const kiln_shard_info *info) {
    int64_t n = kiln_tokenizer_vocab_size(tok), eos = kiln_tokenizer_eos(tok);
    if (n != (int64_t)info->vocab_size)
        return kiln_error(KILN_ERR_INVALID, "--tokenizer %s has %lld token ids but %s was made with a tokenizer of %u: not the "
                          "tokenizer the shards were made with", tok_path, (long long)n, shard, info->vocab_size);
    if (eos >= 0 && info->eos_id < info->vocab_size && (int64_t)info->eos_id != eos)
        return kiln_error(KILN_ERR_INVALID, "--tokenizer %s has eos id %lld but %s ends its documents with id %u: not the "
                          "tokenizer the shards were made with", tok_path, (long long)eos, shard, info->eos_id);
    return KILN_OK;
}

/* The tokenizer copied into every checkpoint: it must load, fit the
 * model's vocabulary (`kiln generate` refuses a tokenizer with ids past
 * vocab_size; a smaller tokenizer is fine, as HF pads embeddings), be the
 * shards' tokenizer, and agree with --init's generation_config.json /
 * tokenizer_config.json as `kiln generate` will read them. All before step
 * 1, so a run never trains to a model nothing can use. A resumed run whose
 * tokenizer file has gone keeps the run's own copy. */
static kiln_status check_tokenizer(kiln_trainer *t, bool resume, const kiln_shard_info *info) {
    kiln_train_config *c = &t->cfg;
    char own[1100];
    snprintf(own, sizeof own, "%s/tokenizer.json", c->run_dir);
    if (resume && c->tokenizer[0] && !is_file(c->tokenizer) && is_file(own) && strlen(own) < sizeof c->tokenizer)
        memcpy(c->tokenizer, own, strlen(own) + 1);
    if (!c->tokenizer[0]) return KILN_OK;
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_open_any(c->tokenizer, &tok);
    if (st) return kiln_error_context(st, "--tokenizer %s", c->tokenizer);
    int64_t n = kiln_tokenizer_vocab_size(tok), V = t->model->cfg.vocab_size;
    char shard[1100];
    if (n > V)
        st = kiln_error(KILN_ERR_INVALID, "--tokenizer %s has %lld token ids but the model (%s) has vocab_size %lld: ids %lld "
                        "and above have no embedding (a tokenizer may be smaller than the model, never larger)",
                        c->tokenizer, (long long)n, t->model_src[0] ? t->model_src : c->model, (long long)V, (long long)V);
    snprintf(shard, sizeof shard, "%s/train.bin", c->data);
    if (!st) st = check_shard_tokenizer(tok, c->tokenizer, shard, info);
    snprintf(shard, sizeof shard, "%s/val.bin", c->data);
    if (!st && t->val) st = check_shard_tokenizer(tok, c->tokenizer, shard, kiln_loader_info(t->val));
    kiln_model_meta meta;
    if (!st && t->init_dir[0]) { /* what generate reads from the run's copies of these files */
        if ((st = kiln_model_meta_load(t->init_dir, tok, &meta))) kiln_error_context(st, "--init %s with --tokenizer %s", c->init, c->tokenizer);
        else kiln_model_meta_free(&meta);
    }
    kiln_tokenizer_free(tok);
    return st;
}

static kiln_status trainer_open(const kiln_train_config *c, bool resume, kiln_trainer **out);

/* The run's device (c->device) is the thread's while the model, its
 * adapters, the optimiser state and the compiled steps are made, so all of
 * them live there; the previous device is restored after. A resumed run
 * may name another device than the one it was saved from: the files hold
 * values, not places. */
kiln_status kiln_trainer_open(const kiln_train_config *c, bool resume, kiln_trainer **out) {
    *out = NULL;
    kiln_status st = kiln_train_config_validate(c);
    if (st) return st;
    const kiln_backend *was = kiln_backend_use(kiln_backend_at(c->device)); /* validated: one of KILN_BACKENDS */
    st = trainer_open(c, resume, out);
    kiln_backend_use(was);
    return st;
}

/* The reference log-probs of the run's shards for dpo without adapters:
 * read where kiln stored them (checked against the shard and, but on a
 * resume of full fine-tuning, the base's weights), or left for the first
 * phase of run to compute. */
static kiln_loader *ref_loader(kiln_trainer *t, int i) { return i ? t->val : t->train; }

static kiln_status ref_open(kiln_trainer *t, bool resume) {
    kiln_status st = kiln_base_hash(t->model, &t->ref_model_hash);
    if (st) return st;
    bool full = t->model->n_base == t->model->n_params; /* its weights train: the base of a resume is not the reference */
    for (int i = 0; i < 2; i++) {
        kiln_loader *l = ref_loader(t, i);
        if (!l) continue;
        char shard[1100], path[1200];
        snprintf(shard, sizeof shard, "%s/%s", t->cfg.data, i ? "val.bin" : "train.bin");
        kiln_ref_logps_path(shard, path, sizeof path);
        if (!is_file(path)) {
            if (resume)
                return kiln_error(KILN_ERR_IO, "%s is missing: the run's reference log-probabilities (computed by its first "
                                  "phase) are gone, and a resumed run cannot recompute them from the trained weights", path);
            t->ref_pending |= 1 << i;
            continue;
        }
        kiln_ref_logps_meta rm;
        if ((st = kiln_ref_logps_read(path, &rm, &t->ref[i]))) return st;
        if (rm.shard_hash != kiln_loader_shard_hash(l) || rm.n_docs != 2 * (uint64_t)kiln_loader_pairs(l))
            return kiln_error(KILN_ERR_INVALID, "%s was computed for another %s (%llu documents, shard hash %016llx; the shard "
                              "holds %llu documents, hash %016llx): remove it to recompute", path, shard,
                              (unsigned long long)rm.n_docs, (unsigned long long)rm.shard_hash,
                              (unsigned long long)(2 * kiln_loader_pairs(l)), (unsigned long long)kiln_loader_shard_hash(l));
        if ((!resume || !full) && rm.model_hash != t->ref_model_hash)
            return kiln_error(KILN_ERR_INVALID, "%s was computed from another reference model (weights hash %016llx, this run's "
                              "base %016llx): remove it to recompute it from this one", path,
                              (unsigned long long)rm.model_hash, (unsigned long long)t->ref_model_hash);
        if ((st = kiln_loader_set_ref(l, t->ref[i], rm.n_docs))) return st;
        kiln_log(KILN_LOG_INFO, "reference log-probabilities: %s (%llu pairs, computed in %s at --seq-len %d, --batch %d)", path,
                 (unsigned long long)(rm.n_docs / 2), rm.precision, rm.seq_len, rm.batch);
    }
    for (int i = 0; i < t->n_val; i++) /* the batches kept for evaluation, now with the reference's */
        if ((st = kiln_loader_get(t->val, 0, i, t->vb[i]))) return st;
    return KILN_OK;
}

/* The first phase of a dpo run without adapters: the reference's
 * log-probs of every document of the shards, by the base as the run holds
 * it (its precision, device, --batch and --seq-len), stored beside the
 * shards (rank 0) so later runs and resumes read them. */
static kiln_status ref_compute(kiln_trainer *t) {
    kiln_status st = KILN_OK;
    for (int i = 0; i < 2 && !st; i++) {
        kiln_loader *l = ref_loader(t, i);
        if (!(t->ref_pending & 1 << i) || !l) continue;
        uint64_t n_docs = 2 * (uint64_t)kiln_loader_pairs(l);
        char shard[1100], path[1200];
        snprintf(shard, sizeof shard, "%s/%s", t->cfg.data, i ? "val.bin" : "train.bin");
        kiln_ref_logps_path(shard, path, sizeof path);
        kiln_log(KILN_LOG_INFO, "reference log-probabilities: computing %llu pairs of %s with the base (first phase)",
                 (unsigned long long)(n_docs / 2), shard);
        float *v = calloc(n_docs + 1, sizeof *v), *row = malloc(sizeof *row * (size_t)t->cfg.batch);
        kiln_batch *b = kiln_batch_alloc(t->cfg.batch, t->cfg.seq_len);
        if (!v || !row || !b) st = b ? kiln_error(KILN_ERR_OOM, "out of memory for %s", path) : kiln_last_status();
        double t0 = kiln_time_now();
        for (int64_t k = 0; !st && k < kiln_loader_len(l); k++) {
            if ((st = kiln_loader_get(l, 0, k, b)) || (st = kiln_ref_logps_batch(t->model, b, row))) break;
            for (int r = 0; r < b->rows; r++) v[b->doc[r]] = row[r];
        }
        kiln_ref_logps_meta rm = {.n_docs = n_docs, .shard_hash = kiln_loader_shard_hash(l),
                                  .model_hash = t->ref_model_hash, .seq_len = t->cfg.seq_len, .batch = t->cfg.batch};
        snprintf(rm.precision, sizeof rm.precision, "%s", t->cfg.precision == KILN_BF16 ? "bf16" : "fp32");
        if (!st && kiln_dist_rank() == 0) st = kiln_ref_logps_write(path, &rm, v);
        if (!st) st = kiln_loader_set_ref(l, v, n_docs);
        if (!st) {
            t->ref[i] = v, v = NULL;
            kiln_log(KILN_LOG_INFO, "reference log-probabilities: %s (%.1fs)", kiln_dist_rank() == 0 ? path : shard,
                     kiln_time_now() - t0);
        }
        free(v);
        free(row);
        kiln_batch_free(b);
        if (st) st = kiln_error_context(st, "the reference log-probabilities of %s", shard);
    }
    for (int i = 0; !st && i < t->n_val; i++) st = kiln_loader_get(t->val, 0, i, t->vb[i]);
    if (!st) t->ref_pending = 0;
    return st;
}

static kiln_status trainer_open(const kiln_train_config *c, bool resume, kiln_trainer **out) {
    kiln_status st = KILN_OK;
    kiln_trainer *t = calloc(1, sizeof *t);
    if (!t) return kiln_error(KILN_ERR_OOM, "out of memory");
    t->cfg = *c;
    char ck[1100] = "";
    if ((st = open_loaders(t))) goto fail;
    const kiln_shard_info *info = kiln_loader_info(t->train);
    if (resume) {
        if ((st = kiln_checkpoint_latest(c->run_dir, ck, sizeof ck))) goto fail;
        if ((st = kiln_load_model_dir(ck, &t->model))) goto fail;
        snprintf(t->model_src, sizeof t->model_src, "%s/config.json", ck);
    } else if ((st = build_model(t, info))) {
        goto fail;
    } else {
        /* before the fit check and the micro-batch choice: they count the
         * frozen base's missing gradients and optimiser state */
        kiln_lora_config lc;
        if ((st = kiln_train_lora_config(c, &lc))) goto fail;
        if (lc.rank && (st = kiln_llama_lora_add(t->model, &lc, c->seed))) goto fail;
    }
    /* the frozen base in bf16 (a resumed run reloads it from the saved fp32
     * file, which holds the bf16 values exactly) */
    if (c->base_dtype != KILN_BASE_DTYPE_AUTO && c->base_dtype != KILN_F32 &&
        (st = kiln_llama_base_cast(t->model, (kiln_dtype)c->base_dtype)))
        goto fail;
    if ((st = check_fit(t, info)) || (st = check_tokenizer(t, resume, info))) goto fail;
    if (c->freeze[0] && kiln_llama_set_trainable(t->model, c->freeze, false) == 0) {
        st = kiln_error(KILN_ERR_INVALID, "--freeze '%s' matches no parameter (names look like model.layers.0.mlp.up_proj.weight)",
                        c->freeze);
        goto fail;
    }
    if (c->global_batch > 0 && !resume && (st = choose_micro_batch(t))) goto fail;
    c = &t->cfg; /* batch and accum as chosen */
    if (c->shard != KILN_SHARD_OFF && kiln_dist_size() == 1)
        kiln_log(KILN_LOG_WARN, "--shard %s: one process, nothing to split; the optimiser state stays whole (run under mpirun -np N)",
                 c->shard == KILN_SHARD_GRADIENTS ? "gradients" : "optimizer");
    if (!(t->opt = kiln_adamw_new(t->model, c))) {
        st = kiln_last_status();
        goto fail;
    }
    t->st.micro_per_epoch = kiln_loader_len(t->train);
    int64_t global_k = (int64_t)c->accum * kiln_dist_size(); /* micro-batches per step, all ranks */
    t->st.steps_per_epoch = (t->st.micro_per_epoch + global_k - 1) / global_k;
    t->st.total_steps = c->steps ? c->steps : t->st.steps_per_epoch * c->epochs;
    t->st.seed = c->seed;
    t->st.last_val_loss = NAN;
    if (resume) {
        char p[1200];
        kiln_trainer_state saved;
        snprintf(p, sizeof p, "%s/trainer_state.json", ck);
        if ((st = kiln_trainer_state_load(p, &saved))) goto fail;
        if ((st = kiln_adamw_load_checkpoint(ck, t->opt))) goto fail; /* whole or sharded, any number of ranks */
        if (saved.micro_per_epoch != t->st.micro_per_epoch) {
            st = kiln_error(KILN_ERR_INVALID, "%s: the data has %lld micro-batches per epoch, the checkpoint was made with %lld",
                            ck, (long long)t->st.micro_per_epoch, (long long)saved.micro_per_epoch);
            goto fail;
        }
        int64_t total = t->st.total_steps, per_epoch = t->st.steps_per_epoch;
        t->st = saved;
        t->st.total_steps = c->steps ? c->steps : total;
        t->st.steps_per_epoch = per_epoch; /* from this run's ranks x accum, which may differ */
    }
    if (kiln_dist_rank() == 0 && ((st = mkdir_p(c->run_dir)) || (st = open_metrics(t, resume)))) goto fail;
    if (kiln_dist_rank() == 0 && kiln_checkpoint_clean(c->run_dir)) /* what a killed save left */
        kiln_log(KILN_LOG_WARN, "cleaning %s: %s", c->run_dir, kiln_last_error());
    kiln_compile_options co;
    kiln_train_compile_options(c, &co); /* validated above */
    if ((st = kiln_objective_from_config(c, &t->obj))) goto fail;
    if (t->obj.ref_logps && (st = ref_open(t, resume))) goto fail;
    if (co.mode != KILN_COMPILE_OFF && t->obj.kind != KILN_OBJECTIVE_CE) {
        t->tr_train = (kiln_step_trace){.m = t->model, .o = &t->obj};
        t->tr_eval = t->tr_train;
        t->cs_train = kiln_train_compile_objective(&t->tr_train, &co, true);
        t->cs_eval = kiln_train_compile_objective(&t->tr_eval, &co, false);
        if (!t->cs_train || !t->cs_eval) {
            st = kiln_last_status();
            goto fail;
        }
    } else if (co.mode != KILN_COMPILE_OFF) {
        t->cs_train = kiln_train_compile_ex(t->model, &co, true, c->pack == KILN_PACK_DOCUMENTS);
        t->cs_eval = kiln_train_compile(t->model, &co, false);
        if (!t->cs_train || !t->cs_eval) {
            st = kiln_last_status();
            goto fail;
        }
    }
    kiln_eager_enable();
    *out = t;
    return KILN_OK;
fail:
    kiln_trainer_free(t);
    return st;
}

void kiln_trainer_free(kiln_trainer *t) {
    if (!t) return;
    close_loaders(t);
    kiln_compiled_free(t->cs_train);
    kiln_compiled_free(t->cs_eval);
    kiln_adamw_free(t->opt);
    kiln_llama_free(t->model);
    free(t->ref[0]);
    free(t->ref[1]);
    if (t->metrics) fclose(t->metrics);
    kiln_tfevents_close(t->events);
    free(t);
}

void kiln_trainer_request_stop(kiln_trainer *t) { t->stop = 1; }
const kiln_trainer_state *kiln_trainer_get_state(const kiln_trainer *t) { return &t->st; }
kiln_llama *kiln_trainer_model(kiln_trainer *t) { return t->model; }
kiln_adamw *kiln_trainer_optimizer(kiln_trainer *t) { return t->opt; }
const kiln_train_config *kiln_trainer_config(const kiln_trainer *t) { return &t->cfg; }
const kiln_mem_choice *kiln_trainer_mem_choice(const kiln_trainer *t) { return t->has_mem ? &t->mem : NULL; }

static void emit(kiln_event_fn fn, void *user, kiln_event e) {
    if (fn) fn(&e, user);
}

static kiln_status evaluate(kiln_trainer *t, kiln_event_fn fn, void *user) {
    if (!t->n_val || !t->metrics) return KILN_OK; /* rank 0 only */
    double loss, mv[KILN_OBJ_MAX_METRICS];
    bool pref = t->obj.kind != KILN_OBJECTIVE_CE;
    kiln_status st = kiln_evaluate_objective(t->model, pref ? &t->obj : NULL, t->vb, t->n_val, &loss, mv, NULL, t->cs_eval);
    if (st) return kiln_error_context(st, "evaluation at step %lld", (long long)t->st.step);
    t->st.last_val_loss = loss;
    if (pref) { /* TRL's names, eval_ prefixed as TRL logs them */
        fprintf(t->metrics, "{\"step\": %lld, \"val_loss\": %.6f", (long long)t->st.step, loss);
        for (int j = 0; j < t->obj.n_metrics; j++) fprintf(t->metrics, ", \"val_%s\": %.6g", t->obj.metric[j], mv[j]);
        fprintf(t->metrics, "}\n");
        log_events(t, t->obj.metric, mv, t->obj.n_metrics);
    } else {
        fprintf(t->metrics, "{\"step\": %lld, \"val_loss\": %.6f, \"val_ppl\": %.4f}\n", (long long)t->st.step, loss, exp(loss));
    }
    fflush(t->metrics);
    log_events(t, (const char *const[]){"val_loss", "val_ppl"}, (const double[]){loss, exp(loss)}, 2);
    emit(fn, user, (kiln_event){.kind = KILN_EVENT_EVAL, .state = &t->st, .val_loss = loss, .n_val_metrics = pref ? t->obj.n_metrics : 0,
                                .val_metrics = mv, .val_metric_names = t->obj.metric});
    return KILN_OK;
}

/* A sharded optimiser's checkpoint: rank 0 makes the checkpoint's
 * directory, every rank writes its shard there, rank 0 writes the rest and
 * commits; every step's outcome is agreed on, so all ranks fail together. */
static kiln_status save_sharded(kiln_trainer *t) {
    bool r0 = kiln_dist_rank() == 0;
    kiln_status st = r0 ? kiln_checkpoint_begin(t->cfg.run_dir, t->st.step) : KILN_OK;
    int64_t bad = st != KILN_OK;
    kiln_status cs = kiln_dist_max_i64(&bad, 1);
    if (st || cs) return st ? st : cs;
    if (bad) return kiln_error(KILN_ERR_IO, "rank 0 could not make the checkpoint directory in %s", t->cfg.run_dir);
    char tmp[1200];
    if (!(st = kiln_checkpoint_tmp(t->cfg.run_dir, t->st.step, tmp, sizeof tmp))) st = kiln_zero_save(tmp, t->opt);
    if (st) return st; /* every rank got an error from kiln_zero_save */
    st = r0 ? kiln_checkpoint_finish(t->cfg.run_dir, t->model, t->opt, &t->st, &t->cfg, t->cfg.keep) : KILN_OK;
    bad = st != KILN_OK;
    if ((cs = kiln_dist_max_i64(&bad, 1)) && !st) st = cs;
    if (!st && bad) st = kiln_error(KILN_ERR_IO, "rank 0 could not complete the checkpoint in %s", t->cfg.run_dir);
    return st;
}

static kiln_status save(kiln_trainer *t, kiln_event_fn fn, void *user) {
    if (!t->opt->zero && kiln_dist_rank() != 0) return KILN_OK;
    kiln_status st = t->opt->zero ? save_sharded(t)
                                  : kiln_checkpoint_save(t->cfg.run_dir, t->model, t->opt, &t->st, &t->cfg, t->cfg.keep);
    if (st) return kiln_error_context(st, "saving the checkpoint of step %lld", (long long)t->st.step);
    if (kiln_dist_rank() != 0) return KILN_OK;
    emit(fn, user, (kiln_event){.kind = KILN_EVENT_SAVE, .state = &t->st, .message = t->cfg.run_dir});
    return KILN_OK;
}

/* This rank's share of the step's window: *k micro-batches (0 to accum; the
 * epoch's last window may be short) starting at *first within the window. */
static kiln_status load_window(kiln_trainer *t, int *k, int *first_in_window) {
    int64_t epoch = t->st.step / t->st.steps_per_epoch, w = t->st.step % t->st.steps_per_epoch;
    int64_t a = t->cfg.accum, mine = (int64_t)kiln_dist_rank() * a;
    int64_t first = w * a * kiln_dist_size() + mine, left = t->st.micro_per_epoch - first;
    *k = (int)(left < 0 ? 0 : left < a ? left : a);
    *first_in_window = (int)mine;
    t->st.epoch = epoch;
    for (int i = 0; i < *k; i++) {
        kiln_status st = kiln_loader_get(t->train, epoch, first + i, t->mb[i]);
        if (st) return st;
    }
    return KILN_OK;
}

static kiln_status run_loop(kiln_trainer *t, kiln_event_fn fn, void *user);
/* --compile max-autotune does not choose a compiled step slower than eager
 * silently: before the first step it times the window's first micro-batch
 * both ways (kiln_train_time_modes; the slowest rank's times count) and
 * trains the faster, saying which and why. The choice is kept in
 * RUN/compile-choice and read back on resume, so a resumed run computes
 * with the same step as the uninterrupted one. */
#define CHOICE_FILE "compile-choice"
static kiln_status choose_step(kiln_trainer *t, int k) {
    char path[1200];
    snprintf(path, sizeof path, "%s/" CHOICE_FILE, t->cfg.run_dir);
    int64_t given = -1; /* eager (1) or compiled (0) from the file, -1: measure */
    if (kiln_dist_rank() == 0 && t->st.step > 0 && is_file(path)) { /* resumed: the choice made at its start */
        char *text = NULL;
        size_t n = 0;
        kiln_status st = kiln_read_file(path, &text, &n);
        if (st) return kiln_error_context(st, "reading %s", path);
        size_t w = text ? strcspn(text, " \t\n") : 0; /* the first word, whole */
        if (w == 5 && !strncmp(text, "eager", 5)) given = 1;
        else if (w == 8 && !strncmp(text, "compiled", 8)) given = 0;
        free(text);
        if (given < 0)
            return kiln_error(KILN_ERR_FORMAT, "%s: not a step choice (its first word must be 'compiled' or 'eager'; delete the "
                              "file to measure again)", path);
    }
    kiln_status st = kiln_dist_max_i64(&given, 1); /* rank 0's word, or -1 */
    if (st) return st;
    double ms[2] = {0, 0};
    if (given < 0) {
        if (k > 0 && (st = kiln_train_time_modes(t->model, t->opt, &t->cfg, t->mb[0], t->cs_train, 2, ms)))
            return kiln_error_context(st, "--compile max-autotune: timing the step compiled and eager");
        int64_t us[2] = {(int64_t)(ms[0] * 1e3), (int64_t)(ms[1] * 1e3)};
        if ((st = kiln_dist_max_i64(us, 2))) return st;
        ms[0] = (double)us[0] / 1e3, ms[1] = (double)us[1] / 1e3;
        given = ms[1] < ms[0];
        if (kiln_dist_rank() == 0) {
            char line[200];
            /* to the microsecond the choice was made on: at 0.1 ms an eager
             * step 0.04 ms faster read as a tie (a 4.4 ms tiny step in CI) */
            int len = snprintf(line, sizeof line, "%s\tcompiled_ms %.3f\teager_ms %.3f\n", given ? "eager" : "compiled",
                               ms[0], ms[1]);
            if ((st = kiln_write_file_atomic(path, line, (size_t)len))) return kiln_error_context(st, "writing %s", path);
            kiln_log(given ? KILN_LOG_WARN : KILN_LOG_INFO,
                     "--compile max-autotune: a micro-batch's forward + backward takes %.1f ms compiled, %.1f ms eager: "
                     "%s (kept in %s)", ms[0], ms[1],
                     given ? "the compiled step is slower here, training eager" : "training compiled", path);
        }
    } else if (kiln_dist_rank() == 0) {
        kiln_log(KILN_LOG_INFO, "--compile max-autotune: training %s, as %s says", given ? "eager" : "compiled", path);
    }
    if (given) { /* eager: the compiled steps go */
        kiln_compiled_free(t->cs_train);
        kiln_compiled_free(t->cs_eval);
        t->cs_train = t->cs_eval = NULL;
    }
    kiln_alloc_trim(); /* what the losing mode's runs left cached */
    return KILN_OK;
}

/* --precision: autocast on this thread for the run (the compiled steps
 * trace on first use, so they see it too), and --device as the thread's
 * device (what the steps make goes there), restored afterwards. */
kiln_status kiln_trainer_run(kiln_trainer *t, kiln_event_fn fn, void *user) {
    kiln_dtype old = kiln_autocast_set((kiln_dtype)t->cfg.precision); /* validated at open */
    const kiln_backend *was = kiln_backend_use(kiln_backend_at(t->cfg.device));
    kiln_status st = run_loop(t, fn, user);
    kiln_backend_use(was);
    kiln_autocast_set(old);
    return st;
}

static kiln_status run_loop(kiln_trainer *t, kiln_event_fn fn, void *user) {
    kiln_status st = KILN_OK;
    if (t->ref_pending && (st = ref_compute(t))) return st;
    int64_t saved_at = -1;
    bool one = kiln_dist_size() == 1;
    while (t->st.step < t->st.total_steps && !(one && t->stop)) {
        int k, first;
        if ((st = load_window(t, &k, &first))) break;
        if (!t->step_chosen && t->cs_train && t->cfg.compile == KILN_RUN_MAX_AUTOTUNE && (st = choose_step(t, k))) break;
        t->step_chosen = true;
        double t0 = kiln_time_now(), lr = kiln_lr_at(&t->cfg, t->st.step, t->st.total_steps);
        /* the window's totals over all ranks, and a stop requested on any rank */
        int64_t v[4 + KILN_NORM_N] = {0, k, 0, t->stop ? 1 : 0}, u[KILN_NORM_N];
        for (int i = 0; i < k; i++) {
            v[0] += t->mb[i]->n_targets, v[2] += t->mb[i]->rows;
            kiln_batch_units(t->mb[i], u);
            for (int j = 0; j < KILN_NORM_N; j++) v[4 + j] += u[j];
        }
        if ((st = kiln_dist_sum_i64(v, 4 + KILN_NORM_N))) break;
        if (v[3]) {
            t->stop = 1;
            break;
        }
        kiln_window_totals g = {.tokens = v[0], .micro_batches = (int)v[1], .first_micro = first, .step = t->st.step};
        memcpy(g.units, v + 4, sizeof g.units);
        kiln_step_result res;
        if ((st = kiln_train_window_global(t->model, t->opt, &t->cfg, t->mb, k, lr, &res, t->cs_train, &g))) {
            kiln_error_context(st, "step %lld", (long long)t->st.step + 1);
            break;
        }
        double dt = kiln_time_now() - t0;
        /* what the compiler's rewrites left unfused costs memory and time: say so once */
        const kiln_graph *cg = t->cs_train && !t->told_misses ? kiln_compiled_graph(t->cs_train) : NULL;
        for (int i = 0; cg && kiln_dist_rank() == 0 && i < cg->n_misses; i++) kiln_log(KILN_LOG_WARN, "compile: %s", cg->misses[i]);
        if (cg) t->told_misses = true;
        t->st.step++;
        t->st.elapsed_s += dt;
        double positions = (double)v[2] * t->cfg.seq_len;
        if (res.skipped) {
            char msg[160];
            snprintf(msg, sizeof msg, "non-finite %s at step %lld, micro-batch %d (epoch %lld): %s",
                     res.bad_micro >= 0 ? "loss" : "gradient norm", (long long)t->st.step, res.bad_micro,
                     (long long)t->st.epoch, t->cfg.on_nan == KILN_ON_NAN_STOP ? "stopping" : "step skipped, weights unchanged");
            emit(fn, user, (kiln_event){.kind = KILN_EVENT_NAN, .state = &t->st, .step = &res, .message = msg});
            if (t->cfg.on_nan == KILN_ON_NAN_STOP) {
                st = kiln_error(KILN_ERR_NUMERIC, "%s", msg);
                break;
            }
            continue;
        }
        t->st.tokens_seen += res.tokens;
        t->st.last_loss = res.loss;
        if (t->metrics) fprintf(t->metrics,
                "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens\": %lld, "
                "\"tokens_per_s\": %.1f, \"elapsed_s\": %.3f",
                (long long)t->st.step, (long long)t->st.epoch, res.loss, res.lr, res.grad_norm, (long long)res.tokens,
                positions / dt, t->st.elapsed_s);
        for (int j = 0; t->metrics && j < res.n_metrics; j++) fprintf(t->metrics, ", \"%s\": %.6g", res.metric_name[j], res.metric[j]);
        if (t->metrics) fprintf(t->metrics, "}\n");
        if (t->metrics) fflush(t->metrics);
        log_events(t, (const char *const[]){"loss", "lr", "grad_norm", "tokens_per_s"},
                   (const double[]){res.loss, res.lr, res.grad_norm, positions / dt}, 4);
        emit(fn, user, (kiln_event){.kind = KILN_EVENT_STEP, .state = &t->st, .step = &res, .tokens_per_s = positions / dt});
        if (t->cfg.eval_every && t->st.step % t->cfg.eval_every == 0 && (st = evaluate(t, fn, user))) break;
        if (t->cfg.save_every && t->st.step % t->cfg.save_every == 0) {
            if ((st = save(t, fn, user))) break;
            saved_at = t->st.step;
        }
    }
    if (st) return st;
    if (!t->stop && (!t->cfg.eval_every || t->st.step % t->cfg.eval_every) && (st = evaluate(t, fn, user))) return st;
    if (saved_at != t->st.step) st = save(t, fn, user);
    if (!st) st = kiln_dist_barrier(); /* the checkpoint is complete before any rank returns */
    return st;
}
