/* kiln bench: times training steps (forward + backward) of a model
 * configuration and prints ms/step, tokens/s, GFLOP/s, MFU and peak memory. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "kiln/eager.h"
#include "kiln/kernels.h"
#include "kiln/model.h"

static const char *bench_help =
    "usage: kiln bench [options]\n"
    "Times training steps (forward + backward, gradients accumulated) on random tokens.\n"
    "  --model NAME|FILE   tiny, small (default) or demo, or a config.json\n"
    "  --batch N           sequences per micro-batch (default 8)\n"
    "  --seq N             sequence length (default 256)\n"
    "  --steps N           timed steps (default 5; the median is reported)\n"
    "  --warmup N          untimed steps first (default 1)\n"
    "  --threads N         OpenMP threads (default: all cores)\n"
    "  --profile           print time per op (eager)\n"
    "  --peak GFLOPS       fp32 FMA peak for MFU (default: measured at start)\n";

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int kiln_cmd_bench(int argc, char **argv) {
    const char *model = "small";
    int64_t B = 8, T = 256;
    int steps = 5, warmup = 1;
    double peak = 0;
    bool prof = false;
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"batch", 1, 0, 'b'}, {"seq", 1, 0, 's'},
                                         {"steps", 1, 0, 'n'}, {"warmup", 1, 0, 'w'}, {"threads", 1, 0, 't'},
                                         {"peak", 1, 0, 'p'},  {"help", 0, 0, 'h'}, {"profile", 0, 0, 'P'},   {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'b': B = atoll(optarg); break;
        case 's': T = atoll(optarg); break;
        case 'n': steps = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 't': kiln_set_num_threads(atoi(optarg)); break;
        case 'p': peak = atof(optarg); break;
        case 'P': prof = true; break;
        case 'h': fputs(bench_help, stdout); return 0;
        default: fputs(bench_help, stderr); return 2;
        }
    }
    if (B < 1 || T < 2 || steps < 1 || warmup < 0 || peak < 0) {
        fprintf(stderr, "kiln bench: --batch, --seq, --steps and --peak must be positive\n");
        return 2;
    }
    kiln_llama_config cfg;
    kiln_status st = strchr(model, '/') || strstr(model, ".json") ? kiln_llama_config_load(model, &cfg)
                                                                  : kiln_llama_config_preset(model, &cfg);
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        return 1;
    }
    if (T > cfg.max_position_embeddings) cfg.max_position_embeddings = T;
    kiln_llama *m = kiln_llama_new(&cfg, 1234);
    if (!m) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        return 1;
    }
    int64_t shape[2] = {B, T};
    kiln_tensor *ids = kiln_tensor_new(KILN_I32, 2, shape), *tg = kiln_tensor_new(KILN_I32, 2, shape);
    kiln_rng rng = {99, 0};
    for (int64_t i = 0; i < B * T; i++) {
        kiln_i32(ids)[i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)cfg.vocab_size);
        kiln_i32(tg)[i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)cfg.vocab_size);
    }
    kiln_eager_enable();
    if (peak == 0) peak = kiln_fma_peak_gflops(0.3);
    if (!(peak > 0)) peak = 445; /* no vector FMA to measure: ../shared/README.md's figure */
    double flops = kiln_llama_flops_per_token(&cfg, T) * (double)(B * T);
    printf("model %s: %.2fM parameters, batch %lld x %lld, %d threads, GEMM: %s\n", model,
           (double)kiln_llama_num_params(m) / 1e6, (long long)B, (long long)T, kiln_num_threads(), kiln_gemm_backend());
    printf("model FLOPs per step: %.1f GFLOP (%.1f MFLOP/token)\n", flops / 1e9, flops / 1e6 / (double)(B * T));
    double *ms = calloc((size_t)steps, sizeof *ms);
    kiln_op_profile table[KILN_OP_COUNT];
    for (int i = 0; i < warmup + steps; i++) {
        if (prof && i == warmup) kiln_eager_profile(table);
        double t0 = kiln_time_now();
        kiln_tensor *loss = kiln_llama_loss(m, ids, tg, NULL);
        st = kiln_backward(loss);
        kiln_tensor_release(loss);
        double dt = kiln_time_now() - t0;
        if (st || !loss) {
            fprintf(stderr, "kiln bench: step failed: %s\n", kiln_last_error());
            return 1;
        }
        if (i >= warmup) ms[i - warmup] = dt * 1e3;
    }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
    double med = ms[steps / 2];
    double gfs = flops / (med / 1e3) / 1e9;
    kiln_alloc_stats as = kiln_alloc_get_stats();
    printf("%-10s %10s %10s %9s %7s %14s %14s\n", "mode", "ms/step", "tokens/s", "GFLOP/s", "MFU", "peak RSS MB", "alloc peak MB");
    printf("%-10s %10.1f %10.0f %9.1f %6.1f%% %14.0f %14.0f\n", "eager", med, (double)(B * T) / (med / 1e3), gfs,
           100 * gfs / peak, (double)kiln_peak_rss() / 1e6, (double)as.peak_bytes / 1e6);
    printf("(median of %d steps, min %.1f ms, max %.1f ms; MFU against the fp32 FMA peak, %.0f GFLOP/s)\n", steps, ms[0], ms[steps - 1], peak);
    if (prof) {
        kiln_eager_profile(NULL);
        double total = 0;
        for (int o = 0; o < KILN_OP_COUNT; o++) total += table[o].seconds;
        printf("\nper-op time over %d steps (%.0f ms/step inside ops):\n%-24s %8s %8s %7s %9s\n", steps, total * 1e3 / steps,
               "op", "calls", "ms/step", "share", "GFLOP/s");
        for (int o = 0; o < KILN_OP_COUNT; o++)
            if (table[o].calls)
                printf("%-24s %8llu %8.1f %6.1f%% %9.1f\n", kiln_op_name(o), (unsigned long long)table[o].calls / steps,
                       table[o].seconds * 1e3 / steps, 100 * table[o].seconds / total,
                       table[o].seconds > 0 ? table[o].flops / table[o].seconds / 1e9 : 0);
    }
    free(ms);
    kiln_tensor_release(ids);
    kiln_tensor_release(tg);
    kiln_llama_free(m);
    return 0;
}
