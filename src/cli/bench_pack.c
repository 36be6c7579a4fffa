/* kiln bench --pack documents: the compiled training step on rows of
 * packed documents (block-diagonal attention, positions restarting at each
 * document) next to plain packing (causal over the whole row) at the same
 * tokens, timed in alternation so that a shared machine's noise hits both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "kiln/train.h"

static int cmp_ms(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int kiln_bench_pack(void *model, int64_t B, int64_t T, int64_t doc_len, int steps, int warmup, const char *modes) {
    kiln_llama *m = model;
    /* the first compiled mode of the list (default: "default") */
    char mode[64] = "default";
    for (const char *p = modes; p && *p;) {
        size_t n = strcspn(p, ",");
        if (n && n < sizeof mode && strncmp(p, "eager", n)) {
            memcpy(mode, p, n);
            mode[n] = 0;
            break;
        }
        p += n + (p[n] == ',');
    }
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    if (kiln_compile_mode_parse(mode, &co) || co.mode == KILN_COMPILE_OFF) {
        fprintf(stderr, "kiln bench: --pack documents times a compiled step; --modes %s is not one (%s)\n", mode,
                kiln_last_error());
        return 2;
    }
    if (doc_len < 2 || doc_len > T) {
        fprintf(stderr, "kiln bench: --doc-len %lld: must be in [2, --seq %lld]\n", (long long)doc_len, (long long)T);
        return 2;
    }
    int64_t shape[2] = {B, T}, one = 1, n = B * T;
    kiln_tensor *in[6];
    for (int i = 0; i < 6; i++) in[i] = i == 3 ? kiln_tensor_new(KILN_F32, 1, &one) : kiln_tensor_new(KILN_I32, 2, shape);
    /* the same tokens both ways; documents of doc_len tokens (the last one
     * of a row may be shorter), each its own segment from position 0; made
     * on the host (rows of n values: ids, targets, mask, -, positions,
     * segments) and set on the model's device */
    int32_t *host = malloc((size_t)(6 * n) * sizeof *host);
    kiln_rng rng = {99, 0};
    for (int64_t i = 0; host && i < n; i++) {
        int64_t t = i % T;
        host[i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)m->cfg.vocab_size);
        host[n + i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)m->cfg.vocab_size);
        host[2 * n + i] = 1;
        host[4 * n + i] = (int32_t)(t % doc_len);
        host[5 * n + i] = (int32_t)(t / doc_len + 1);
    }
    float norm = 1.0f / (float)(B * T);
    kiln_status st = host ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory making the inputs");
    for (int i = 0; i < 6 && !st; i++)
        st = !in[i] ? kiln_last_status()
             : i == 3 ? kiln_tensor_set(in[i], 0, &norm, sizeof norm)
                      : kiln_tensor_set(in[i], 0, host + i * n, (size_t)n * sizeof *host);
    free(host);
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        for (int i = 0; i < 6; i++) kiln_tensor_release(in[i]);
        return 1;
    }
    kiln_compiled *cs[2] = {kiln_train_compile(m, &co, true), kiln_train_compile_ex(m, &co, true, true)};
    double *ms[2] = {calloc((size_t)steps, sizeof(double)), calloc((size_t)steps, sizeof(double))};
    int rc = 0;
    for (int i = 0; i < warmup + steps && !rc; i++)
        for (int w = 0; w < 2 && !rc; w++) {
            float rep[1];
            double t0 = kiln_time_now();
            if (!cs[w] || kiln_compiled_run(cs[w], in, rep)) {
                fprintf(stderr, "kiln bench: %s step failed: %s\n", w ? "documents" : "packed", kiln_last_error());
                rc = 1;
            }
            if (i >= warmup) ms[w][i - warmup] = (kiln_time_now() - t0) * 1e3;
        }
    if (!rc) {
        double med[2];
        for (int w = 0; w < 2; w++) {
            qsort(ms[w], (size_t)steps, sizeof(double), cmp_ms);
            med[w] = ms[w][steps / 2];
        }
        int64_t docs = (T + doc_len - 1) / doc_len;
        printf("\n--pack documents, compiled %s, %.2fM parameters, %d threads, %lld x %lld tokens per step (%lld documents "
               "of %lld per row):\n", mode, (double)kiln_llama_num_params(m) / 1e6, kiln_num_threads(), (long long)B,
               (long long)T, (long long)docs, (long long)doc_len);
        printf("%-44s %9s %9s\n", "rows", "ms/step", "tokens/s");
        printf("%-44s %9.1f %9.0f\n", "packed (causal over the whole row)", med[0], (double)(B * T) / (med[0] / 1e3));
        char name[64];
        snprintf(name, sizeof name, "documents of %lld (block-diagonal)", (long long)doc_len);
        printf("%-44s %9.1f %9.0f\n", name, med[1], (double)(B * T) / (med[1] / 1e3));
        printf("documents / packed tokens/s: %.2fx (median of %d steps each, timed in alternation)\n", med[0] / med[1],
               steps);
    }
    for (int w = 0; w < 2; w++) {
        free(ms[w]);
        kiln_compiled_free(cs[w]);
    }
    for (int i = 0; i < 6; i++) kiln_tensor_release(in[i]);
    return rc;
}
