/* Data parallel over MPI. Run plainly, this binary checks the single-rank
 * parts and the eager grad-ready hook, then launches itself under
 * `mpirun -np 2` (as the CI does) and checks, on padded data:
 *   - 2 ranks x k micro-batches give the weights of 1 rank x 2k (float rounding),
 *     with gradient buckets overlapped with backward and without (bit-identical),
 *     the same weights on both ranks, one all-reduce per bucket per step;
 *   - a checkpoint of a 2-rank run resumes bit-identically on 2 ranks, and on
 *     1 rank (with 2k micro-batches: the same weights; with k: it runs on);
 *   - a failure on rank 1 ends the whole job with the rank and the reason;
 *   - ZeRO sharding (--shard optimizer|gradients) on 2 and 4 ranks (4
 *     oversubscribed): 12 steps' losses and the final weights within 1e-6
 *     relative of one process with the same global batch, overlapped and
 *     blocking reduce-scatters bit-identical on 2 ranks, the optimiser's bytes per
 *     rank as the formula says; sharded checkpoints resumed 4 -> 2, 2 -> 4
 *     and 2 -> 1 ranks continue as the uninterrupted run; torn, missing
 *     and foreign shards refused by name; a rank killed mid-step ends the
 *     job in seconds, naming the rank, and the last checkpoint resumes.
 * Without mpirun (or a build without MPI) it says so and passes the rest. */
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include "kiln/eager.h"
#include "kiln/train.h"
#include "kiln/safetensors.h"
#include <math.h>

#include "test.h"
#include "test_runs.h"

enum { K = 2 }; /* micro-batches per rank */
static int64_t micro_per_epoch;

static char tmpdir[256];

static void write_shards(void) {
    kiln_shard_info info = {.vocab_size = 61, .eos_id = 1, .pad_id = 2, .bos_id = 0xffffffffu};
    for (int which = 0; which < 2; which++) {
        size_t n = which ? 800 : 4900;
        int32_t *tok = malloc(n * sizeof *tok);
        /* documents of varying length, so padded rows hold varying target counts */
        for (size_t i = 0, next_eos = 40; i < n; i++) {
            tok[i] = 3 + (int32_t)(kiln_rng_u64(which + 21, i) % 58);
            if (i == next_eos) tok[i] = 1, next_eos += 20 + kiln_rng_u64(which + 5, i) % 70;
        }
        char p[512];
        snprintf(p, sizeof p, "%s/%s.bin", tmpdir, which ? "val" : "train");
        info.n_docs = n / 20 + 1;
        CHECK_OK(kiln_shard_write(p, tok, n, &info));
        free(tok);
    }
}

/* the largest relative difference of the step losses (and rewards/margins)
 * two runs logged in metrics.jsonl: the window's loss is its terms over
 * the window's units, whatever the ranks */
static double logged_rel_diff(const char *a, const char *b, int *n_out) {
    char pa[600], pb[600], *x = NULL, *y = NULL;
    size_t nx, ny;
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", tmpdir, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", tmpdir, b);
    CHECK_OK(kiln_read_file(pa, &x, &nx));
    CHECK_OK(kiln_read_file(pb, &y, &ny));
    double worst = x && y ? 0 : INFINITY;
    int n = 0;
    static const char *const keys[] = {"\"loss\": ", "\"rewards/margins\": "};
    for (int k = 0; x && y && k < 2; k++)
        for (const char *p = x, *q = y; (p = strstr(p, keys[k])) && (q = strstr(q, keys[k]));) {
            p += strlen(keys[k]), q += strlen(keys[k]);
            double u = strtod(p, NULL), v = strtod(q, NULL);
            worst = fmax(worst, fabs(u - v) / fmax(fabs(v), 1e-12));
            n++;
        }
    free(x);
    free(y);
    *n_out = n;
    return worst;
}

static void base_config(kiln_train_config *c, const char *run, int accum) {
    kiln_train_config_default(c);
    snprintf(c->data, sizeof c->data, "%s", tmpdir);
    snprintf(c->run_dir, sizeof c->run_dir, "%s/%s", tmpdir, run);
    snprintf(c->model, sizeof c->model, "tiny");
    c->batch = 2, c->accum = accum, c->seq_len = 32, c->pack = KILN_PACK_PADDED;
    c->warmup = 2, c->epochs = 1, c->eval_every = 4, c->eval_batches = 2, c->save_every = 0, c->log_every = 0;
    c->lr = 3e-3, c->min_lr = 3e-4, c->clip = 0.5;
}

/* what train() runs with besides base_config: --shard, --steps, --save-every,
 * and where the step losses go (NULL: nowhere) */
static int g_shard, g_save_every;
static int64_t g_steps;
static double *g_losses;
static kiln_opt_memory *g_mem;

typedef struct { kiln_trainer *t; int64_t stop_at; int steps; } watch;
static void on_event(const kiln_event *e, void *user) {
    watch *w = user;
    if (e->kind != KILN_EVENT_STEP) return;
    w->steps++;
    if (g_losses && e->state->step >= 1 && e->state->step <= 64) g_losses[e->state->step - 1] = e->step->loss;
    if (e->state->step == w->stop_at) kiln_trainer_request_stop(w->t);
}

/* Preference pairs (tmpdir/pairs): a prompt, then a chosen answer of low
 * token ids and a rejected one of high ids, of varying lengths. */
static void write_pair_shards(void) {
    kiln_shard_info info = {.vocab_size = 61, .eos_id = 1, .pad_id = 2, .bos_id = 0xffffffffu};
    char dir[400];
    snprintf(dir, sizeof dir, "%s/pairs", tmpdir);
    mkdir(dir, 0755);
    for (int which = 0; which < 2; which++) {
        int np = which ? 6 : 38;
        int32_t tok[38 * 2 * 32];
        uint8_t mask[38 * 2 * 32];
        uint64_t end[38 * 2];
        size_t n = 0;
        for (int p = 0; p < np; p++) {
            int plen = 3 + (int)(kiln_rng_u64(which + 7, (uint64_t)p) % 6);
            for (int k = 0; k < 2; k++) {
                int alen = 2 + (int)(kiln_rng_u64(which + 9, (uint64_t)(2 * p + k)) % 10);
                for (int i = 0; i < plen; i++, n++) tok[n] = 3 + (int32_t)(kiln_rng_u64(p, (uint64_t)i) % 58), mask[n] = 0;
                for (int i = 0; i < alen; i++, n++)
                    tok[n] = (k ? 31 : 3) + (int32_t)(kiln_rng_u64(which + 11, n) % 28), mask[n] = 1;
                tok[n] = 1, mask[n] = 1, n++;
                end[2 * p + k] = n;
            }
        }
        char path[512];
        snprintf(path, sizeof path, "%s/%s.bin", dir, which ? "val" : "train");
        info.n_docs = (uint64_t)(2 * np);
        CHECK_OK(kiln_shard_write_pairs(path, tok, mask, n, end, &info));
    }
}

/* A preference run on the pairs: orpo with LoRA (its two terms divided by
 * the window's chosen tokens and pairs), or dpo with full fine-tuning
 * (the reference's log-probs computed by the first phase, stored beside
 * the shards by rank 0). */
static int train_pref(const char *name, int objective, int accum) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    snprintf(c.data, sizeof c.data, "%s/pairs", tmpdir);
    snprintf(c.run_dir, sizeof c.run_dir, "%s/%s", tmpdir, name);
    snprintf(c.model, sizeof c.model, "tiny");
    c.objective = objective, c.pack = KILN_PACK_PAIRS, c.lora_rank = objective == KILN_OBJECTIVE_ORPO ? 4 : 0;
    c.batch = 4, c.accum = accum, c.seq_len = 32, c.steps = 4, c.warmup = 1, c.lr = 3e-3, c.min_lr = 3e-4;
    c.eval_every = 0, c.save_every = 0, c.log_every = 0;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return -1;
    watch w = {.t = t, .stop_at = -1};
    kiln_status st = kiln_trainer_run(t, on_event, &w);
    CHECK(st == KILN_OK, "run %s: %s", name, kiln_last_error());
    kiln_trainer_free(t);
    return st ? -1 : w.steps;
}

/* the largest relative difference of two runs' saved tensors (file: model
 * or adapter_model.safetensors) */
static double st_rel_diff(const char *a, const char *b, const char *file) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s/%s", tmpdir, a, file);
    snprintf(pb, sizeof pb, "%s/%s/%s", tmpdir, b, file);
    return test_st_rel_diff(pa, pb);
}

/* Trains run `name` (fresh, or resumed) to its end or stop_at; returns the
 * steps it ran and the total, -1 on error. */

static int train(const char *name, int accum, bool resume, int64_t stop_at, int64_t *total, uint64_t *hash) {
    kiln_train_config c;
    base_config(&c, name, accum);
    c.shard = g_shard;
    if (g_steps) c.steps = g_steps, c.eval_every = 0;
    if (g_save_every) c.save_every = g_save_every;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, resume, &t));
    if (!t) return -1;
    if (total) *total = kiln_trainer_get_state(t)->total_steps;
    micro_per_epoch = kiln_trainer_get_state(t)->micro_per_epoch;
    watch w = {.t = t, .stop_at = stop_at};
    kiln_status st = kiln_trainer_run(t, on_event, &w);
    CHECK(st == KILN_OK, "run %s: %s", name, kiln_last_error());
    if (g_mem) kiln_adamw_memory(kiln_trainer_optimizer(t), g_mem);
    if (hash) { /* FNV-1a over the weights */
        const kiln_llama *m = kiln_trainer_model(t);
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < m->n_params; i++) {
            const unsigned char *p = m->params[i]->data;
            for (size_t j = 0; j < kiln_tensor_nbytes(m->params[i]); j++) h = (h ^ p[j]) * 1099511628211ull;
        }
        *hash = h >> 2; /* fits int64 and negates */
    }
    kiln_trainer_free(t);
    return st ? -1 : w.steps;
}

static bool same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    if (kiln_read_file(a, &x, &nx)) return false;
    if (kiln_read_file(b, &y, &ny)) {
        free(x);
        return false;
    }
    bool same = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static bool same_run(const char *a, const char *b) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", tmpdir, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", tmpdir, b);
    return same_file(pa, pb);
}


/* ---- ZeRO sharding ------------------------------------------------------------ */
enum { ZSTEPS = 12, ZSTOP = 8, GLOBAL_K = 4 }; /* micro-batches per step over all ranks */
static const char *const shard_names[] = {"off", "optimizer", "gradients"};

static void save_losses(const char *name, const double *l) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s/losses.bin", tmpdir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(l, sizeof *l, ZSTEPS, f) == ZSTEPS, "write %s", p);
    if (f) fclose(f);
}

static void copy_run(const char *from, const char *to) {
    if (kiln_dist_rank() == 0) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "rm -rf %s/%s && cp -r %s/%s %s/%s", tmpdir, to, tmpdir, from, tmpdir, to);
        CHECK(system(cmd) == 0, "copy %s to %s", from, to);
    }
    CHECK_OK(kiln_dist_barrier());
}

static int64_t n_trainable(void) {
    kiln_llama_config mc;
    CHECK_OK(kiln_llama_config_preset("tiny", &mc));
    mc.vocab_size = 61; /* the shards' */
    kiln_llama *m = kiln_llama_new(&mc, 1);
    int64_t n = m ? kiln_llama_num_params(m) : 0;
    kiln_llama_free(m);
    return n;
}

/* P ranks x GLOBAL_K / P micro-batches: every shard mode for ZSTEPS steps
 * (losses and weights compared by the parent), and the resumes. */
static void zero_child(const char *what) {
    int P = kiln_dist_size(), rank = kiln_dist_rank(), accum = GLOBAL_K / P;
    kiln_dist_set_bucket_bytes(40 << 10); /* many buckets: pieces across parameters, the MLP matrices cut in two */
    static double losses[64];
    g_steps = ZSTEPS;
    g_shard = KILN_SHARD_GRADIENTS;
    if (!strcmp(what, "zero_resume")) { /* the 4-rank run's step-8 checkpoint, on these ranks */
        char name[64];
        snprintf(name, sizeof name, "z%d_from%d", P, 6 - P);
        g_losses = losses;
        memset(losses, 0, sizeof losses);
        CHECK(train(name, accum, true, -1, NULL, NULL) == ZSTEPS - ZSTOP, "%s resumed the remaining steps", name);
        if (rank == 0) save_losses(name, losses);
        return;
    }
    int64_t N = n_trainable();
    for (int sm = 0; sm < 3; sm++) {
        char name[64];
        snprintf(name, sizeof name, "z%d_%s", P, shard_names[sm]);
        g_shard = sm, g_losses = losses;
        memset(losses, 0, sizeof losses);
        kiln_opt_memory mem;
        g_mem = &mem;
        kiln_dist_stats_reset();
        CHECK(train(name, accum, false, -1, NULL, NULL) == ZSTEPS, "%s: %d steps", name, ZSTEPS);
        g_mem = NULL;
        kiln_dist_stats ds;
        kiln_dist_stats_get(&ds);
        if (rank == 0) save_losses(name, losses);
        /* the formula: moments 8 bytes per parameter, / P when sharded; gradients 4, / P with --shard gradients */
        double pm = sm ? 8.0 * (double)N / P : 8.0 * (double)N, pg = sm == KILN_SHARD_GRADIENTS ? 4.0 * (double)N / P : 4.0 * (double)N;
        double slack = 8.0 * ds.n_buckets; /* pieces are whole floats */
        int64_t sum[2] = {(int64_t)mem.moments, (int64_t)mem.grads};
        CHECK_OK(kiln_dist_sum_i64(sum, 2));
        if (rank == 0)
            printf("%d ranks, --shard %-9s: rank 0 holds moments %.0f B (formula %.0f), gradients %.0f B (formula %.0f), "
                   "buffers %.0f B; %lld reduce calls, %lld gathers, %d buckets\n",
                   P, shard_names[sm], mem.moments, pm, mem.grads, pg, mem.buffers, (long long)ds.grad_calls,
                   (long long)ds.gather_calls, ds.n_buckets);
        CHECK(fabs(mem.moments - pm) <= slack && fabs(mem.grads - pg) <= slack, "%s: the bytes the formula says (%.0f, %.0f)", name,
              mem.moments, mem.grads);
        CHECK(!sm || (sum[0] == 8 * N && (sm == KILN_SHARD_OPTIMIZER || sum[1] == 4 * N)),
              "%s: the ranks' shards add up to the whole state (%lld, %lld of %lld parameters)", name, (long long)sum[0],
              (long long)sum[1], (long long)N);
        int64_t per_micro = sm == KILN_SHARD_GRADIENTS ? accum : 1;
        CHECK(ds.grad_calls == ZSTEPS * per_micro * ds.n_buckets && ds.gather_calls == (sm ? ZSTEPS * ds.n_buckets : 0),
              "%s: %lld bucket collectives (%lld expected), %lld gathers", name, (long long)ds.grad_calls,
              (long long)(ZSTEPS * per_micro * ds.n_buckets), (long long)ds.gather_calls);
    }
    g_losses = NULL;
    char name[64];
    snprintf(name, sizeof name, "z%d_gradients_blocking", P);
    kiln_dist_set_overlap(false);
    CHECK(train(name, accum, false, -1, NULL, NULL) == ZSTEPS, "%s", name);
    kiln_dist_set_overlap(true);
    snprintf(name, sizeof name, "z%d_stop", P);
    CHECK(train(name, accum, false, ZSTOP, NULL, NULL) == ZSTOP, "%s stopped at step %d", name, ZSTOP);
    /* a copy for the other number of ranks (and, from 2 ranks, for 1) */
    char to[64];
    snprintf(to, sizeof to, "z%d_from%d", 6 - P, P);
    copy_run(name, to);
    if (P == 2) copy_run(name, "z1_from2");
    if (P == 4) { /* 2 -> 4: the 2-rank child ran first */
        g_losses = losses;
        memset(losses, 0, sizeof losses);
        CHECK(train("z4_from2", accum, true, -1, NULL, NULL) == ZSTEPS - ZSTOP, "z4_from2 resumed the remaining steps");
        if (rank == 0) save_losses("z4_from2", losses);
        g_losses = NULL;
    }
}

/* Rank 1 is killed (SIGKILL, from a thread, a few ms into step 7) in a
 * --shard gradients run that saves every 2 steps. */
static void *killer(void *arg) {
    (void)arg;
    usleep(3000);
    char p[600];
    snprintf(p, sizeof p, "%s/killed_at", tmpdir);
    FILE *f = fopen(p, "w");
    if (f) fprintf(f, "%.6f\n", kiln_time_now()), fclose(f);
    kill(getpid(), SIGKILL);
    return NULL;
}
static void on_kill_event(const kiln_event *e, void *user) {
    (void)user;
    pthread_t th;
    if (e->kind == KILN_EVENT_STEP && e->state->step == 6 && kiln_dist_rank() == 1) pthread_create(&th, NULL, killer, NULL);
}
static void kill_child(bool resume) {
    kiln_train_config c;
    base_config(&c, "zkill", GLOBAL_K / 2);
    c.shard = KILN_SHARD_GRADIENTS, c.steps = ZSTEPS, c.eval_every = 0, c.save_every = 2;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, resume, &t));
    if (!t) kiln_dist_abort(kiln_last_error());
    kiln_status st = kiln_trainer_run(t, resume ? NULL : on_kill_event, NULL);
    CHECK(st == KILN_OK, "zkill: %s", kiln_last_error());
    kiln_trainer_free(t);
}

/* ---- the ranks (under mpirun) ------------------------------------------------- */
static int child(const char *what) {
    CHECK_OK(kiln_dist_init(NULL, NULL));
    kiln_eager_enable();
    int rank = kiln_dist_rank();
    if (!strncmp(what, "zero", 4) || !strncmp(what, "kill", 4)) {
        if (!strncmp(what, "zero", 4)) zero_child(what);
        else kill_child(!strcmp(what, "kill_resume"));
        kiln_dist_finalize();
        return t_fail ? 1 : 0;
    }
    CHECK(kiln_dist_size() == 2, "2 ranks (%d)", kiln_dist_size());
    if (!strcmp(what, "fail")) { /* rank 1 cannot read its data: the job must end, not hang */
        kiln_train_config c;
        base_config(&c, "fail", K);
        if (rank == 1) snprintf(c.data, sizeof c.data, "%s/nope", tmpdir);
        kiln_trainer *t = NULL;
        if (kiln_trainer_open(&c, false, &t)) kiln_dist_abort(kiln_last_error());
        kiln_trainer_run(t, NULL, NULL); /* rank 0 waits for rank 1 in the first all-reduce */
        kiln_trainer_free(t);
        kiln_dist_finalize();
        return 0;
    }
    kiln_dist_set_bucket_bytes(256 << 10); /* several buckets on the tiny model */
    int64_t total = 0;
    uint64_t h = 0;
    kiln_dist_stats_reset();
    int steps = train("p2", K, false, -1, &total, &h);
    kiln_dist_stats ds;
    kiln_dist_stats_get(&ds);
    CHECK(steps == total && total > 3, "2 ranks ran %d of %lld steps", steps, (long long)total);
    CHECK(ds.n_buckets > 1 && ds.steps == total && ds.grad_calls == ds.steps * ds.n_buckets,
          "one all-reduce per bucket per step: %lld calls, %d buckets, %lld steps", (long long)ds.grad_calls, ds.n_buckets,
          (long long)ds.steps);
    CHECK(ds.other_calls == total, "one small all-reduce (window counts) per step: %lld", (long long)ds.other_calls);
    CHECK(ds.hook_s > 0, "buckets started from the backward hook");
    int64_t v[2] = {(int64_t)h, -(int64_t)h};
    CHECK_OK(kiln_dist_max_i64(v, 2));
    CHECK(v[0] == -v[1], "both ranks hold the same weights");
    /* the epoch's last window must be short, leaving rank 1 with nothing to do */
    CHECK(micro_per_epoch % (2 * K) > 0 && micro_per_epoch % (2 * K) <= K, "%lld micro-batches per epoch",
          (long long)micro_per_epoch);
    if (rank == 0)
        printf("2 ranks: %lld micro-batches, %lld steps, %d buckets, %.0f KB reduced per step\n", (long long)micro_per_epoch,
               (long long)total, ds.n_buckets, ds.bytes / (double)ds.steps / 1024);

    kiln_dist_set_overlap(false);
    CHECK(train("p2_blocking", K, false, -1, NULL, NULL) == total, "2 ranks without overlap");
    kiln_dist_set_overlap(true);

    CHECK(train("p2_int", K, false, 3, NULL, NULL) == 3, "stopped after step 3 on both ranks");
    char cmd[1200];
    if (rank == 0) {
        snprintf(cmd, sizeof cmd, "cp -r %s/p2_int %s/p1_from_p2 && cp -r %s/p2_int %s/p1k_from_p2", tmpdir, tmpdir, tmpdir, tmpdir);
        CHECK(system(cmd) == 0, "copy the step-3 checkpoint");
    }
    CHECK_OK(kiln_dist_barrier());
    CHECK(train("p2_int", K, true, -1, NULL, NULL) == total - 3, "2-rank resume ran the remaining steps");
    CHECK(train_pref("orpo2", KILN_OBJECTIVE_ORPO, K) == 4, "orpo with LoRA on 2 ranks");
    CHECK(train_pref("dpo2", KILN_OBJECTIVE_DPO, K) == 4, "dpo with full fine-tuning on 2 ranks");
    kiln_dist_finalize();
    if (rank != 0) return t_fail ? 1 : 0;
    TEST_END();
}

/* ---- single process ------------------------------------------------------------- */
/* Two runs' weights: the worst tensor's max |a-b| / max |b| (returned) and,
 * into *l2 (may be NULL), ||a - b|| / ||b|| over all the weights as one vector. */
static double weights_diff(const char *a, const char *b, double *l2) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", tmpdir, a);
    snprintf(pb, sizeof pb, "%s/%s", tmpdir, b);
    kiln_llama *x = NULL, *y = NULL;
    CHECK_OK(kiln_load_model_dir(pa, &x));
    CHECK_OK(kiln_load_model_dir(pb, &y));
    bool ok = x && y;
    double worst = ok ? 0 : INFINITY, d2 = 0, s2 = 0;
    for (int i = 0; ok && i < x->n_params; i++) {
        double d = 0, s = 0;
        for (int64_t j = 0; j < kiln_tensor_numel(x->params[i]); j++) {
            double u = kiln_f32(x->params[i])[j], v = kiln_f32(y->params[i])[j];
            d = fmax(d, fabs(u - v)), s = fmax(s, fabs(v));
            d2 += (u - v) * (u - v), s2 += v * v;
        }
        worst = fmax(worst, d / s);
    }
    kiln_llama_free(x);
    kiln_llama_free(y);
    if (l2) *l2 = ok && s2 > 0 ? sqrt(d2 / s2) : INFINITY;
    return worst;
}
static double max_rel_diff(const char *a, const char *b) { return weights_diff(a, b, NULL); }
static double l2_rel_diff(const char *a, const char *b) {
    double l2;
    weights_diff(a, b, &l2);
    return l2;
}

/* The hook fires once per parameter, when its gradient is already final. */
typedef struct { int calls, early; kiln_llama *m; float *snap[64]; } hook_log;
static void on_ready(kiln_tensor *p, void *user) {
    hook_log *h = user;
    h->calls++;
    for (int i = 0; i < h->m->n_params && i < 64; i++)
        if (h->m->params[i] == p) {
            if (h->snap[i]) h->early++; /* twice */
            h->snap[i] = malloc(kiln_tensor_nbytes(p->grad));
            memcpy(h->snap[i], p->grad->data, kiln_tensor_nbytes(p->grad));
        }
}

static void grad_ready_hook(void) {
    kiln_llama_config mc;
    CHECK_OK(kiln_llama_config_preset("tiny", &mc));
    mc.vocab_size = 61, mc.tie_word_embeddings = true; /* a parameter used twice: embedding and head */
    kiln_llama *m = kiln_llama_new(&mc, 3);
    kiln_batch *b = kiln_batch_alloc(2, 16);
    for (int i = 0; i < 32; i++) b->input_ids[i] = 3 + i % 50, b->targets[i] = 3 + (i + 7) % 50, b->pad_mask[i] = 1;
    int64_t s[2] = {2, 16};
    kiln_tensor *ids = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, s), *tg = kiln_tensor_wrap(b->targets, KILN_I32, 2, s);
    kiln_tensor *mask = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, s);
    hook_log h = {.m = m};
    kiln_set_grad_ready_hook(on_ready, &h);
    kiln_tensor *loss = kiln_ce_loss(m, ids, tg, mask, NULL);
    CHECK_OK(kiln_backward(loss));
    kiln_set_grad_ready_hook(NULL, NULL);
    int with_grad = 0, stale = 0;
    for (int i = 0; i < m->n_params && i < 64; i++) {
        kiln_tensor *p = m->params[i];
        if (!p->grad) continue;
        with_grad++;
        if (!h.snap[i] || memcmp(h.snap[i], p->grad->data, kiln_tensor_nbytes(p->grad))) stale++;
        free(h.snap[i]);
    }
    CHECK(h.calls == with_grad && h.early == 0 && with_grad == m->n_params,
          "one call per parameter (%d calls, %d parameters with gradients, %d twice)", h.calls, with_grad, h.early);
    CHECK(stale == 0, "every gradient was final when its hook ran (%d were not)", stale);
    kiln_tensor_release(loss);
    kiln_tensor_release(ids);
    kiln_tensor_release(tg);
    kiln_tensor_release(mask);
    kiln_batch_free(b);
    kiln_llama_free(m);
}

static void single_rank(void) {
    CHECK_OK(kiln_dist_init(NULL, NULL));
    CHECK(kiln_dist_rank() == 0 && kiln_dist_size() == 1, "a plain start is rank 0 of 1");
    int64_t v[2] = {5, -3};
    CHECK_OK(kiln_dist_sum_i64(v, 2));
    CHECK(v[0] == 5 && v[1] == -3, "one rank: sums are the identity");
    CHECK_OK(kiln_dist_barrier());
    grad_ready_hook();
}

static int run_np(int np, const char *self, const char *what, char *log, size_t cap) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 timeout -k 5 200 mpirun --allow-run-as-root --oversubscribe -np %d %s --child %s %s 2>&1",
             np, self, tmpdir, what);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(log, 1, cap - 1, f);
    log[n] = 0;
    int rc = pclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}
static int run_ranks(const char *self, const char *what, char *log, size_t cap) { return run_np(2, self, what, log, cap); }


/* ---- ZeRO sharding: the parent's comparisons ---------------------------------- */
static bool read_losses(const char *name, double *l) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s/losses.bin", tmpdir, name);
    FILE *f = fopen(p, "rb");
    bool ok = f && fread(l, sizeof *l, ZSTEPS, f) == ZSTEPS;
    if (f) fclose(f);
    return ok;
}

/* The largest relative difference of steps [from, ZSTEPS) of two runs' losses. */
static double losses_rel_diff(const char *a, const char *b, int from) {
    double x[ZSTEPS], y[ZSTEPS], worst = 0;
    if (!read_losses(a, x) || !read_losses(b, y)) return INFINITY;
    for (int i = from; i < ZSTEPS; i++) worst = fmax(worst, fabs(x[i] - y[i]) / fmax(fabs(y[i]), 1e-12));
    return worst;
}

/* One shard of a saved checkpoint spoiled three ways, its manifest two: each refused naming it,
 * the optimiser left as it was. */
static void tamper_checks(void) {
    kiln_train_config c;
    base_config(&c, "ztamper_run", GLOBAL_K);
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_open(&c, false, &t));
    if (!t) return;
    kiln_adamw *o = kiln_trainer_optimizer(t);
    char ck[600], dir[600], cmd[2000], path[800];
    snprintf(ck, sizeof ck, "%s/z2_stop/checkpoint-%08d", tmpdir, ZSTOP);
    snprintf(dir, sizeof dir, "%s/ztamper", tmpdir);
    CHECK_OK(kiln_adamw_load_checkpoint(ck, o));
    CHECK(o->t == ZSTOP, "a 2-rank sharded checkpoint loads into one whole optimiser (t = %lld)", (long long)o->t);
    float before = kiln_f32(o->v[0])[0];
    static const char *const how[] = {"flip a byte", "truncate", "remove", "rename a parameter in the manifest",
                                      "an unknown key in the manifest"};
    static const char *const want[] = {"SHA-256", "bytes", "missing", "not a trainable parameter", "unknown key 'layout'"};
    const char *shard = "optimizer-00001-of-00002.safetensors";
    for (int k = 0; k < 5; k++) {
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dir, ck, dir);
        CHECK(system(cmd) == 0, "copy the checkpoint");
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        if (k == 0) {
            FILE *f = fopen(path, "r+b");
            CHECK(f && fseek(f, -5, SEEK_END) == 0, "open %s", path);
            int ch = f ? fgetc(f) : 0;
            if (f) fseek(f, -5, SEEK_END), fputc(ch ^ 0x20, f), fclose(f);
        } else if (k == 1) {
            struct stat sb;
            CHECK(stat(path, &sb) == 0 && truncate(path, sb.st_size - 100) == 0, "truncate %s", path);
        } else if (k == 2) {
            CHECK(unlink(path) == 0, "remove %s", path);
        } else if (k == 4) {
            snprintf(path, sizeof path, "%s/optimizer.shards.json", dir);
            char *text = NULL;
            size_t n = 0;
            CHECK_OK(kiln_read_file(path, &text, &n));
            char *brace = text ? strchr(text, '{') : NULL;
            CHECK(brace != NULL, "the manifest is an object");
            if (brace) {
                char *out = malloc(n + 32);
                int at = (int)(brace - text) + 1;
                snprintf(out, n + 32, "%.*s\"layout\": 1, %s", at, text, brace + 1);
                CHECK_OK(kiln_write_file_atomic(path, out, strlen(out)));
                free(out);
            }
            free(text);
        } else {
            snprintf(path, sizeof path, "%s/optimizer.shards.json", dir);
            char *text = NULL;
            size_t n = 0;
            CHECK_OK(kiln_read_file(path, &text, &n));
            char *hit = text ? strstr(text, "\"model.norm.weight\"") : NULL;
            CHECK(hit != NULL, "the manifest lists model.norm.weight");
            if (hit) hit[strlen("\"model.norm.weigh")] = '7';
            if (text) CHECK_OK(kiln_write_file_atomic(path, text, n));
            free(text);
        }
        o->t = 0;
        kiln_status st = kiln_adamw_load_checkpoint(dir, o);
        const char *e = kiln_last_error();
        printf("  %s: %s\n", how[k], st ? e : "(loaded)");
        CHECK(st != KILN_OK && strstr(e, want[k]) && (k >= 3 || strstr(e, shard)), "%s: refused, naming %s (%s)", how[k],
              k >= 3 ? "what is wrong" : "the shard", e);
        CHECK(o->t == 0 && kiln_f32(o->v[0])[0] == before, "%s: nothing was loaded", how[k]);
    }
    kiln_trainer_free(t);
}

static void zero_parent(const char *self, char *log, size_t cap) {
    double t0 = kiln_time_now();
    static const int nps[3] = {2, 4, 2};
    static const char *const whats[3] = {"zero", "zero", "zero_resume"};
    for (int i = 0; i < 3; i++) {
        int rc = run_np(nps[i], self, whats[i], log, cap);
        printf("%s", log);
        CHECK(rc == 0, "%d ranks, %s (exit %d)", nps[i], whats[i], rc);
    }
    printf("sharded runs: %.1fs\n", kiln_time_now() - t0);
    /* one process, the same global batch, one thread as each rank has */
    static double losses[64];
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    g_steps = ZSTEPS, g_shard = KILN_SHARD_OFF, g_losses = losses;
    CHECK(train("z1", GLOBAL_K, false, -1, NULL, NULL) == ZSTEPS, "1 process x %d", GLOBAL_K);
    save_losses("z1", losses);
    memset(losses, 0, sizeof losses);
    CHECK(train("z1_from2", GLOBAL_K, true, -1, NULL, NULL) == ZSTEPS - ZSTOP, "the 2-rank sharded checkpoint resumed on 1 process");
    save_losses("z1_from2", losses);
    g_losses = NULL;
    omp_set_num_threads(saved);
    for (int P = 2; P <= 4; P += 2)
        for (int sm = 0; sm < 3; sm++) {
            char name[64];
            snprintf(name, sizeof name, "z%d_%s", P, shard_names[sm]);
            double dw = l2_rel_diff(name, "z1"), de = max_rel_diff(name, "z1"), dl = losses_rel_diff(name, "z1", 0);
            printf("%d ranks x %d, --shard %-9s vs 1 process x %d: %d losses max rel diff %.2e; final weights %.2e "
                   "(||a-b||/||b||), worst tensor's max |a-b| / max |b| %.2e\n",
                   P, GLOBAL_K / P, shard_names[sm], GLOBAL_K, ZSTEPS, dl, dw, de);
            CHECK(dl <= 1e-6 && dw <= 1e-6, "%s equals one process within 1e-6 (losses %.3g, weights %.3g)", name, dl, dw);
            CHECK(de <= 1e-4, "%s: no weight strays (%.3g; fp32 sums in another order)", name, de);
        }
    /* blocking: Open MPI's tuned MPI_Reduce_scatter, overlapped: its non-blocking schedule; a sum of two is
     * the same in any order, of four it need not be */
    CHECK(same_run("z2_gradients", "z2_gradients_blocking"), "2 ranks: overlapped and blocking reduce-scatters give bit-identical weights");
    double db = l2_rel_diff("z4_gradients", "z4_gradients_blocking");
    printf("4 ranks: overlapped vs blocking reduce-scatters: weights %.2e%s\n", db,
           same_run("z4_gradients", "z4_gradients_blocking") ? " (bit-identical)" : "");
    CHECK(db <= 1e-6, "4 ranks: overlapped and blocking reduce-scatters agree (%.3g)", db);
    static const char *const resumed[3][2] = {{"z2_from4", "z2_gradients"}, {"z4_from2", "z4_gradients"}, {"z1_from2", "z1"}};
    for (int i = 0; i < 3; i++) {
        double dw = l2_rel_diff(resumed[i][0], resumed[i][1]), dl = losses_rel_diff(resumed[i][0], resumed[i][1], ZSTOP);
        double dz = l2_rel_diff(resumed[i][0], "z1");
        printf("resumed %s at step %d vs uninterrupted %s: losses %.2e, weights %.2e (vs 1 process %.2e)\n", resumed[i][0], ZSTOP,
               resumed[i][1], dl, dw, dz);
        CHECK(dl <= 1e-6 && dw <= 1e-6 && dz <= 1e-6, "%s continues as the uninterrupted run (%.3g, %.3g)", resumed[i][0], dl, dw);
    }
    g_steps = 0;
    tamper_checks();

    /* a rank killed mid-step */
    t0 = kiln_time_now();
    int rc = run_np(2, self, "kill", log, cap);
    double end = kiln_time_now(), killed = 0;
    char p[600];
    snprintf(p, sizeof p, "%s/killed_at", tmpdir);
    FILE *f = fopen(p, "r");
    CHECK(f && fscanf(f, "%lf", &killed) == 1, "rank 1 noted when it was killed");
    if (f) fclose(f);
    const char *why = strstr(log, "rank 1");
    printf("rank 1 killed (SIGKILL) in step 7: the job ended %.2fs later, exit %d: %.*s\n", end - killed, rc,
           why ? (int)strcspn(why, "\n") : 0, why ? why : "");
    CHECK(rc != 0 && rc != 124, "the killed rank ends the job (exit %d; 124 is a hang)", rc);
    CHECK(killed > 0 && end - killed < 10, "within seconds (%.2fs)", end - killed);
    CHECK(why != NULL, "the message names rank 1");
    rc = run_np(2, self, "kill_resume", log, cap);
    CHECK(rc == 0, "the killed run resumes (exit %d): %s", rc, rc ? log : "");
    double dk = l2_rel_diff("zkill", "z2_gradients");
    printf("killed at step 7, resumed from checkpoint 6: final weights vs the uninterrupted run %.2e%s\n", dk,
           same_run("zkill", "z2_gradients") ? " (bit-identical)" : "");
    CHECK(dk <= 1e-6, "the resumed run ends as the uninterrupted one (%.3g)", dk);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child")) {
        snprintf(tmpdir, sizeof tmpdir, "%s", argv[2]);
        return child(argv[3]);
    }
    kiln_eager_enable();
    single_rank();
    if (!kiln_dist_built() || system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("SKIP: %s; the 2-rank checks did not run\n", kiln_dist_built() ? "no mpirun" : "built without MPI");
        TEST_END();
    }
    char self[1024];
    if (!realpath(argv[0], self)) snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_mpi_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    write_shards();
    write_pair_shards();
    static char log[1 << 16];
    double t0 = kiln_time_now();
    int rc = run_ranks(self, "train", log, sizeof log);
    printf("%s", log);
    CHECK(rc == 0, "2-rank runs (exit %d, %.1fs)", rc, kiln_time_now() - t0);
    CHECK(same_run("p2", "p2_blocking"), "overlapped and blocking all-reduce give bit-identical weights");
    CHECK(same_run("p2", "p2_int"), "a 2-rank checkpoint resumes bit-identically on 2 ranks");
    /* the preference objectives: a window over 2 ranks is divided by its
     * units over both (orpo: chosen tokens and pairs) */
    {
        char ref[600];
        snprintf(ref, sizeof ref, "%s/pairs/train.dpo-ref.bin", tmpdir);
        CHECK(access(ref, R_OK) == 0, "rank 0 stored the reference log-probs beside the shards");
        int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        CHECK(train_pref("orpo1", KILN_OBJECTIVE_ORPO, 2 * K) == 4, "orpo on 1 rank");
        CHECK(train_pref("dpo1", KILN_OBJECTIVE_DPO, 2 * K) == 4, "dpo on 1 rank (reading the stored reference)");
        omp_set_num_threads(saved);
        double da = st_rel_diff("orpo1", "orpo2", "adapter_model.safetensors");
        double db = st_rel_diff("dpo1", "dpo2", "model.safetensors");
        printf("1 rank x %d vs 2 ranks x %d: orpo (LoRA) adapters max rel diff %.2e, dpo (full, stored reference) weights %.2e\n",
               2 * K, K, da, db);
        CHECK(da < 1e-4 && db < 1e-4, "preference objectives: 2 ranks x k equal 1 rank x 2k (%.3g, %.3g)", da, db);
        int na = 0, nb = 0;
        double la = logged_rel_diff("orpo1", "orpo2", &na), lb = logged_rel_diff("dpo1", "dpo2", &nb);
        printf("  logged step losses and rewards/margins: orpo %d values, max rel diff %.2e; dpo %d, %.2e\n", na, la, nb, lb);
        CHECK(na == 8 && nb == 8 && la < 1e-4 && lb < 1e-4, "the logged window losses and metrics agree (%.3g, %.3g)", la, lb);
    }

    int64_t total = 0;
    /* The ranks run one thread each; so does the 1-rank run, so that only
     * the all-reduce's summation order differs (oneDNN's AVX2 GEMMs round
     * differently with the thread count for some shapes). */
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK(train("p1", 2 * K, false, -1, &total, NULL) > 0, "1 rank x 2k");
    omp_set_num_threads(saved_threads);
    double d = max_rel_diff("p1", "p2");
    printf("1 rank x %d vs 2 ranks x %d: weights max rel diff %.2e over %lld steps\n", 2 * K, K, d, (long long)total);
    CHECK(d < 1e-4, "2 ranks x k equal 1 rank x 2k: %.3g", d);
    CHECK(train("p1_from_p2", 2 * K, true, -1, NULL, NULL) == total - 3, "the 2-rank checkpoint resumes on 1 rank");
    d = max_rel_diff("p1_from_p2", "p2");
    printf("2-rank checkpoint resumed on 1 rank x %d: max rel diff %.2e to the 2-rank run\n", 2 * K, d);
    CHECK(d < 1e-4, "resumed on 1 rank x 2k it reaches the 2-rank weights: %.3g", d);
    int64_t total_k = 0;
    int ran = train("p1k_from_p2", K, true, -1, &total_k, NULL);
    CHECK(ran > 0 && ran == total_k - 3 && total_k > total, "on 1 rank x k it runs on (%d steps, %lld in all)", ran,
          (long long)total_k);

    zero_parent(self, log, sizeof log);

    t0 = kiln_time_now();
    rc = run_ranks(self, "fail", log, sizeof log);
    double dt = kiln_time_now() - t0;
    printf("rank failure: exit %d after %.1fs: %s", rc, dt, strstr(log, "kiln: rank") ? strstr(log, "kiln: rank") : log);
    CHECK(rc != 0 && rc != 124 && rc != 137, "a failing rank ends the job (exit %d; 124 is a hang)", rc);
    CHECK(strstr(log, "rank 1 of 2") && strstr(log, "nope"), "the message names the rank and the reason");
    CHECK(t_rmtree(tmpdir) == 0, "cleanup");
    TEST_END();
}
