/* Data-parallel training over MPI: tokens/s for P = 1 and P = 2 on this
 * machine (the same cores either way: P=1 runs all threads in one process,
 * P=2 splits them), the fraction of step time each rank spends blocked in
 * communication with the gradient all-reduce overlapped with the last
 * backward and without, and the all-reduce calls per optimiser step.
 *
 * Run plainly, it launches itself with mpirun for each setting and prints a
 * table. Usage: mpi [--model NAME] [--batch B] [--seq T] [--accum K]
 *                   [--steps N] [--bucket-mb MB] [--ranks MAX]
 * (defaults: demo, 4, 128, 2, 4, 4, 2). Eager, synthetic data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/eager.h"
#include "kiln/train.h"

typedef struct {
    char model[64];
    int batch, seq, accum, steps, ranks;
    double bucket_mb;
} opts;

static int parse(int argc, char **argv, opts *o, int *used) {
    *o = (opts){"demo", 4, 128, 2, 4, 2, 4.0};
    int i = 1;
    for (; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) snprintf(o->model, sizeof o->model, "%s", v);
        else if (!strcmp(k, "--batch")) o->batch = atoi(v);
        else if (!strcmp(k, "--seq")) o->seq = atoi(v);
        else if (!strcmp(k, "--accum")) o->accum = atoi(v);
        else if (!strcmp(k, "--steps")) o->steps = atoi(v);
        else if (!strcmp(k, "--bucket-mb")) o->bucket_mb = atof(v);
        else if (!strcmp(k, "--ranks")) o->ranks = atoi(v);
        else break;
    }
    *used = i;
    if (o->batch < 1 || o->seq < 2 || o->accum < 1 || o->steps < 1 || o->ranks < 1 || o->bucket_mb <= 0) {
        fprintf(stderr, "usage: mpi [--model NAME] [--batch B] [--seq T] [--accum K] [--steps N] [--bucket-mb MB] [--ranks MAX]\n");
        return 2;
    }
    return 0;
}

static void fill(kiln_batch *b, uint64_t seed, int vocab) {
    int n = b->B * b->T;
    for (int i = 0; i < n; i++) b->input_ids[i] = 3 + (int32_t)(kiln_rng_u64(seed, (uint64_t)i) % (uint64_t)(vocab - 3));
    for (int i = 0; i < n; i++) b->targets[i] = (i + 1) % b->T ? b->input_ids[i + 1] : KILN_IGNORE_INDEX;
    for (int i = 0; i < n; i++) b->pad_mask[i] = 1;
    b->n_targets = n - b->B;
    b->rows = b->B;
}

/* One rank's part: warm-up step, then timed steps as the trainer runs them. */
static int child(const opts *o, bool overlap) {
    if (kiln_dist_init(NULL, NULL)) {
        fprintf(stderr, "mpi bench: %s\n", kiln_last_error());
        return 1;
    }
    kiln_eager_enable();
    kiln_dist_set_overlap(overlap);
    kiln_dist_set_bucket_bytes((size_t)(o->bucket_mb * 1048576.0));
    kiln_llama_config mc;
    if (kiln_llama_config_preset(o->model, &mc)) kiln_dist_abort(kiln_last_error());
    if (mc.max_position_embeddings < o->seq) mc.max_position_embeddings = o->seq;
    kiln_llama *m = kiln_llama_new(&mc, 1);
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.batch = o->batch, c.accum = o->accum, c.seq_len = o->seq;
    kiln_adamw *opt = m ? kiln_adamw_new(m, &c) : NULL;
    if (!opt) kiln_dist_abort(kiln_last_error());
    int P = kiln_dist_size(), r = kiln_dist_rank(), k = o->accum;
    kiln_batch **mb = calloc((size_t)k, sizeof *mb);
    double t_start = 0, wait0 = 0;
    for (int s = 0; s <= o->steps; s++) {
        if (s == 1) { /* the first step warms caches and the allocator */
            kiln_dist_barrier();
            kiln_dist_stats_reset();
            t_start = kiln_time_now();
        }
        int64_t v[2] = {0, k};
        for (int i = 0; i < k; i++) {
            if (!mb[i]) mb[i] = kiln_batch_alloc(o->batch, o->seq);
            fill(mb[i], (uint64_t)(s * P * k + r * k + i), (int)mc.vocab_size);
            v[0] += mb[i]->n_targets;
        }
        kiln_dist_sum_i64(v, 2);
        kiln_window_totals g = {.tokens = v[0], .micro_batches = (int)v[1], .first_micro = r * k};
        kiln_step_result res;
        if (kiln_train_window_global(m, opt, &c, mb, k, 1e-4, &res, NULL, &g)) kiln_dist_abort(kiln_last_error());
    }
    double dt = kiln_time_now() - t_start;
    kiln_dist_stats ds;
    kiln_dist_stats_get(&ds);
    (void)wait0;
    /* the mean over ranks of the blocked fraction, and the slowest rank's time */
    int64_t w[2] = {(int64_t)(ds.wait_s / dt * 1e6), (int64_t)(dt * 1e6)};
    kiln_dist_sum_i64(w, 1);
    kiln_dist_max_i64(w + 1, 1);
    double tokens = (double)o->steps * P * k * o->batch * o->seq;
    if (r == 0)
        printf("RESULT P=%d overlap=%d threads=%d tok_s=%.1f step_ms=%.1f wait=%.4f grad_calls=%.2f other_calls=%.2f "
               "buckets=%d mb=%.1f\n",
               P, overlap, kiln_num_threads(), tokens / (w[1] / 1e6), w[1] / 1e3 / o->steps, (double)w[0] / 1e6 / P,
               ds.steps ? (double)ds.grad_calls / (double)o->steps : 0.0, (double)ds.other_calls / o->steps,
               P > 1 ? ds.n_buckets : 0, ds.bytes / 1048576.0 / (ds.steps ? (double)ds.steps : 1.0));
    for (int i = 0; i < k; i++) kiln_batch_free(mb[i]);
    free(mb);
    kiln_adamw_free(opt);
    kiln_llama_free(m);
    kiln_dist_finalize();
    return 0;
}

int main(int argc, char **argv) {
    opts o;
    int used;
    bool is_child = argc >= 2 && !strcmp(argv[argc - 1], "--child-overlap") ? true : false;
    bool is_child_off = argc >= 2 && !strcmp(argv[argc - 1], "--child-blocking");
    if (parse(argc - (is_child || is_child_off), argv, &o, &used)) return 2;
    if (is_child || is_child_off) return child(&o, is_child);
    if (used != argc) {
        fprintf(stderr, "mpi bench: unexpected argument %s\n", argv[used]);
        return 2;
    }
    if (!kiln_dist_built() || system("command -v mpirun >/dev/null 2>&1")) {
        printf("mpi bench: %s; nothing to measure\n", kiln_dist_built() ? "no mpirun" : "built without MPI");
        return 0;
    }
    char args[512] = "";
    for (int i = 1; i < argc; i++) {
        size_t n = strlen(args);
        snprintf(args + n, sizeof args - n, " %s", argv[i]);
    }
    printf("model %s, micro-batch %d x %d, accum %d per rank, %d timed steps, %.1f MB buckets, eager\n", o.model, o.batch,
           o.seq, o.accum, o.steps, o.bucket_mb);
    printf("%-3s %-8s %-8s %10s %9s %11s %22s\n", "P", "overlap", "threads", "tokens/s", "ms/step", "comm wait", "all-reduces per step");
    for (int P = 1; P <= o.ranks; P++)
        for (int ov = 1; ov >= (P > 1 ? 0 : 1); ov--) {
            char cmd[1200];
            snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe --bind-to none -np %d %s%s %s 2>&1", P, argv[0],
                     args, ov ? "--child-overlap" : "--child-blocking");
            FILE *f = popen(cmd, "r");
            char line[512];
            bool got = false;
            while (f && fgets(line, sizeof line, f)) {
                int p, ovl, th, nb;
                double tok, ms, wait, gc, oc, mbytes;
                if (sscanf(line, "RESULT P=%d overlap=%d threads=%d tok_s=%lf step_ms=%lf wait=%lf grad_calls=%lf other_calls=%lf "
                                 "buckets=%d mb=%lf",
                           &p, &ovl, &th, &tok, &ms, &wait, &gc, &oc, &nb, &mbytes) == 10) {
                    char calls[64];
                    snprintf(calls, sizeof calls, "%.0f bucket%s + %.0f count", gc, gc == 1 ? "" : "s", oc);
                    printf("%-3d %-8s %-8d %10.0f %9.1f %10.1f%% %22s\n", p, p == 1 ? "-" : ovl ? "on" : "off", th, tok, ms,
                           100 * wait, p == 1 ? "none" : calls);
                    got = true;
                } else if (!got) {
                    fputs(line, stderr);
                }
            }
            if (f) pclose(f);
            if (!got) printf("%-3d %-8s (failed)\n", P, ov ? "on" : "off");
        }
    return 0;
}
