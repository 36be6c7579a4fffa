/* `kiln bench --ranks N`: data parallel over MPI on this machine. For each
 * --shard mode it starts `mpirun -np N` of this kiln once; the ranks time
 * eager training steps (as kiln train runs them: the window, the gradient
 * exchange, clipping, AdamW, and with --shard the parameter all-gather)
 * with the gradient buckets overlapped with backward and without, and
 * report per rank: the step time (the slowest rank's, median over the
 * timed steps), the time blocked waiting for gradient buckets, the
 * optimiser's bytes (moments, gradients held at the update, communication
 * buffers) against the formula, and the peak RSS. The hidden fraction of
 * communication is 1 - (wait with overlap) / (wait without), the blocking
 * run's wait being the whole exchange. Synthetic tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/eager.h"
#include "kiln/train.h"

typedef struct {
    const char *model, *shards;
    int ranks, layers, steps, warmup, accum, shard;
    int64_t B, T;
    double bucket_mb;
    bool child;
} ropts;

static const char *mode_name(int s) { return s == KILN_SHARD_GRADIENTS ? "gradients" : s == KILN_SHARD_OPTIMIZER ? "optimizer" : "off"; }

static void fill(kiln_batch *b, uint64_t seed, int64_t vocab) {
    int64_t n = (int64_t)b->B * b->T;
    for (int64_t i = 0; i < n; i++) b->input_ids[i] = 3 + (int32_t)(kiln_rng_u64(seed, (uint64_t)i) % (uint64_t)(vocab - 3));
    for (int64_t i = 0; i < n; i++) b->targets[i] = (i + 1) % b->T ? b->input_ids[i + 1] : KILN_IGNORE_INDEX;
    for (int64_t i = 0; i < n; i++) b->pad_mask[i] = 1;
    b->n_targets = n - b->B;
    b->rows = b->B;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* One rank: warm-up, then timed steps, with overlap then without. */
static int rank_main(const ropts *o) {
    if (kiln_dist_init(NULL, NULL)) {
        fprintf(stderr, "kiln bench --ranks: %s\n", kiln_last_error());
        return 1;
    }
    kiln_eager_enable();
    kiln_dist_set_bucket_bytes((size_t)(o->bucket_mb * 1048576.0));
    kiln_llama_config mc;
    if (kiln_bench_model_config(o->model, &mc)) kiln_dist_abort(kiln_last_error());
    if (o->layers > 0) mc.num_hidden_layers = o->layers;
    if (mc.max_position_embeddings < o->T) mc.max_position_embeddings = (int)o->T;
    kiln_llama *m = kiln_llama_new(&mc, 1);
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.batch = (int)o->B, c.accum = o->accum, c.seq_len = (int)o->T, c.shard = o->shard;
    kiln_adamw *opt = m ? kiln_adamw_new(m, &c) : NULL;
    if (!opt) kiln_dist_abort(kiln_last_error());
    int P = kiln_dist_size(), r = kiln_dist_rank(), k = o->accum;
    kiln_batch **mb = calloc((size_t)k, sizeof *mb);
    int64_t *times = calloc((size_t)o->steps, sizeof *times);
    if (!mb || !times) kiln_dist_abort("out of memory");
    int64_t n_params = kiln_llama_num_params(m);
    for (int ov = 1; ov >= 0; ov--) {
        kiln_dist_set_overlap(ov);
        double wait = 0;
        for (int s = 0; s < o->warmup + o->steps; s++) {
            int64_t v[2] = {0, k};
            for (int i = 0; i < k; i++) {
                if (!mb[i] && !(mb[i] = kiln_batch_alloc((int)o->B, (int)o->T))) kiln_dist_abort("out of memory");
                fill(mb[i], (uint64_t)(s * P * k + r * k + i), mc.vocab_size);
                v[0] += mb[i]->n_targets;
            }
            kiln_dist_sum_i64(v, 2);
            kiln_window_totals g = {.tokens = v[0], .micro_batches = (int)v[1], .first_micro = r * k, .step = s};
            kiln_step_result res;
            kiln_dist_barrier();
            kiln_dist_stats_reset();
            double t0 = kiln_time_now();
            if (kiln_train_window_global(m, opt, &c, mb, k, 1e-4, &res, NULL, &g)) kiln_dist_abort(kiln_last_error());
            double dt = kiln_time_now() - t0;
            kiln_dist_stats ds;
            kiln_dist_stats_get(&ds);
            int64_t us = (int64_t)(dt * 1e6);
            kiln_dist_max_i64(&us, 1); /* the step ends when the slowest rank's does */
            if (s >= o->warmup) times[s - o->warmup] = us, wait += ds.grad_wait_s;
        }
        qsort(times, (size_t)o->steps, sizeof *times, cmp_i64);
        kiln_opt_memory mem;
        kiln_adamw_memory(opt, &mem);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        /* per rank means of the wait; maxima of the bytes and of the RSS */
        int64_t w = (int64_t)(wait / o->steps * 1e6), x[4] = {(int64_t)mem.moments, (int64_t)mem.grads, (int64_t)mem.buffers,
                                                              (int64_t)ru.ru_maxrss};
        kiln_dist_sum_i64(&w, 1);
        kiln_dist_max_i64(x, 4);
        if (r == 0)
            printf("RESULT P=%d shard=%s overlap=%d threads=%d params=%lld ms=%.3f wait_ms=%.3f moments=%lld grads=%lld "
                   "buffers=%lld rss_kb=%lld\n",
                   P, mode_name(o->shard), ov, kiln_num_threads(), (long long)n_params, times[o->steps / 2] / 1e3,
                   (double)w / P / 1e3, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3]);
        fflush(stdout);
    }
    for (int i = 0; i < k; i++) kiln_batch_free(mb[i]);
    free(mb);
    free(times);
    kiln_adamw_free(opt);
    kiln_llama_free(m);
    kiln_dist_finalize();
    return 0;
}

typedef struct {
    int P, ov, threads;
    long long params, moments, grads, buffers, rss;
    double ms, wait;
} row;

/* The formula's optimiser + gradient bytes per rank: moments 8 B per
 * parameter (/ P when sharded), gradients 4 B (/ P with --shard gradients). */
static double formula(int shard, int P, double n) {
    return (shard ? 8.0 / P : 8.0) * n + (shard == KILN_SHARD_GRADIENTS ? 4.0 / P : 4.0) * n;
}

static int launch(const ropts *o, int shard, int argc, char **argv, row out[2]) {
    char self[1024], cmd[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    int len = snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe --bind-to none -np %d '%s' bench", o->ranks, self);
    for (int i = 1; i < argc && len < (int)sizeof cmd - 64; i++) {
        if (!strcmp(argv[i], "--shard")) { /* one mode per launch */
            i++;
            continue;
        }
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " '%s'", argv[i]);
    }
    snprintf(cmd + len, sizeof cmd - (size_t)len, " --shard %s --ranks-child 2>&1", mode_name(shard));
    FILE *f = popen(cmd, "r");
    char line[1024];
    int got = 0;
    while (f && fgets(line, sizeof line, f)) {
        row x;
        char sm[32];
        if (sscanf(line, "RESULT P=%d shard=%31s overlap=%d threads=%d params=%lld ms=%lf wait_ms=%lf moments=%lld grads=%lld "
                         "buffers=%lld rss_kb=%lld",
                   &x.P, sm, &x.ov, &x.threads, &x.params, &x.ms, &x.wait, &x.moments, &x.grads, &x.buffers, &x.rss) == 11 &&
            got < 2)
            out[got++] = x;
        else
            fputs(line, stderr);
    }
    int rc = f ? pclose(f) : -1;
    return rc == 0 && got == 2 ? 0 : -1;
}

int kiln_bench_ranks(int argc, char **argv) {
    ropts o = {.model = "small", .shards = "off,gradients", .steps = 5, .warmup = 1, .accum = 1, .B = 4, .T = 128, .bucket_mb = 25};
    const char *shard_one = NULL;
    const kiln_cli_opt opts[] = {
        KILN_OPT_RANGE("--ranks", KILN_OPT_INT, &o.ranks, 1, 4096),
        KILN_OPT("--model", KILN_OPT_STR, &o.model),
        KILN_OPT_RANGE("--layers", KILN_OPT_INT, &o.layers, 1, 1 << 16),
        KILN_OPT_RANGE("--batch", KILN_OPT_I64, &o.B, 1, 1 << 20),
        KILN_OPT_RANGE("--seq", KILN_OPT_I64, &o.T, 2, 1 << 24),
        KILN_OPT_RANGE("--accum", KILN_OPT_INT, &o.accum, 1, 1 << 16),
        KILN_OPT_RANGE("--steps", KILN_OPT_INT, &o.steps, 1, 1 << 20),
        KILN_OPT_RANGE("--warmup", KILN_OPT_INT, &o.warmup, 0, 1 << 20),
        KILN_OPT_RANGE("--bucket-mb", KILN_OPT_NUM, &o.bucket_mb, 0.001, 1 << 20),
        KILN_OPT("--shard", KILN_OPT_STR, &shard_one),
        KILN_OPT("--threads", KILN_OPT_THREADS, NULL),
        KILN_OPT("--ranks-child", KILN_OPT_TRUE, &o.child),
    };
    int pr = kiln_cli_parse("bench", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), NULL, NULL, 0, NULL);
    if (pr) return pr == 1 ? 0 : 2;
    if (shard_one) o.shards = shard_one;
    /* the modes, by the setting's own names */
    int modes[3], nm = 0;
    char list[64];
    snprintf(list, sizeof list, "%s", o.shards);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int s = !strcmp(t, "off") ? KILN_SHARD_OFF : !strcmp(t, "optimizer") ? KILN_SHARD_OPTIMIZER : !strcmp(t, "gradients") ? KILN_SHARD_GRADIENTS : -1;
        if (s < 0 || nm == 3) {
            fprintf(stderr, "kiln bench: --shard wants a list of off, optimizer and gradients, got '%s'\n", o.shards);
            return 2;
        }
        modes[nm++] = s;
    }
    if (o.child) {
        o.shard = modes[0];
        return rank_main(&o);
    }
    if (!kiln_dist_built() || system("command -v mpirun >/dev/null 2>&1")) {
        fprintf(stderr, "kiln bench --ranks: %s\n", kiln_dist_built() ? "no mpirun on PATH (scripts/deps.sh installs openmpi-bin)"
                                                                   : "this kiln was built without MPI");
        return 1;
    }
    kiln_llama_config mc;
    if (kiln_bench_model_config(o.model, &mc)) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        return 1;
    }
    printf("kiln bench --ranks %d: model %s%s, micro-batch %lld x %lld, accum %d per rank, %.0f MB buckets, eager; "
           "median of %d steps (the slowest rank's), after %d untimed\n",
           o.ranks, o.model, o.layers ? " (layers cut)" : "", (long long)o.B, (long long)o.T, o.accum, o.bucket_mb, o.steps, o.warmup);
    printf("%-10s %-8s %8s %10s %9s %7s %11s %11s %10s %11s %7s %9s\n", "shard", "overlap", "threads", "ms/step", "wait ms",
           "hidden", "moments MB", "grads MB", "bufs MB", "formula MB", "vs off", "RSS MB");
    double off_bytes = 0;
    int failed = 0;
    for (int i = 0; i < nm; i++) {
        row x[2];
        if (launch(&o, modes[i], argc, argv, x)) {
            printf("%-10s (failed)\n", mode_name(modes[i]));
            failed++;
            continue;
        }
        double hidden = x[1].wait > 0 ? 1.0 - x[0].wait / x[1].wait : 0;
        double held = (double)(x[0].moments + x[0].grads), f = formula(modes[i], o.ranks, (double)x[0].params);
        if (modes[i] == KILN_SHARD_OFF) off_bytes = held;
        char vs[16] = "-";
        if (off_bytes > 0) snprintf(vs, sizeof vs, "%.3f", held / off_bytes);
        for (int j = 0; j < 2; j++) {
            char hid[16] = "-";
            if (!j) snprintf(hid, sizeof hid, "%.1f%%", 100 * hidden);
            printf("%-10s %-8s %8d %10.1f %9.1f %7s %11.1f %11.1f %10.1f %11.1f %7s %9.0f\n", mode_name(modes[i]), x[j].ov ? "on" : "off",
                   x[j].threads, x[j].ms, x[j].wait, hid, x[j].moments / 1048576.0, x[j].grads / 1048576.0, x[j].buffers / 1048576.0,
                   f / 1048576.0, vs, x[j].rss / 1024.0);
        }
        printf("%-10s overlap on / off: %.3f of the step; %lld parameters; moments + gradients %.1f MB per rank, formula %.1f MB\n",
               mode_name(modes[i]), x[1].ms > 0 ? x[0].ms / x[1].ms : 0, x[0].params, held / 1048576.0, f / 1048576.0);
    }
    return failed ? 1 : 0;
}
