/* Memory bandwidth of the non-GEMM kernels on training-sized inputs.
 * Prints, per kernel, the best time of several runs and the GB/s of the bytes
 * it must move (reads + writes, each array once), and the optimiser step
 * (per-tensor kernel loop against the fused passes).
 * Usage: bandwidth [threads] [optim|all] [FORMS]
 *   optim: only the optimiser step; FORMS: comma-separated forms of the
 *   kernels (portable,avx2,avx512; kiln/simd.h), each measured in turn, then
 *   one table of every kernel's time per form and the best form's speed-up
 *   over portable (default: the active form only). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"

static float *buf(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)((i * 2654435761u) % 1000) / 1000.0f;
    return p;
}

/* each kernel's best time per form pass, for the closing table */
#define MAX_ROWS 64
static char g_name[MAX_ROWS][64];
static double g_best[MAX_ROWS][KILN_FORM_COUNT];
static int g_row, g_rows, g_form;

static void record(const char *name, double best) {
    if (g_row >= MAX_ROWS) return;
    snprintf(g_name[g_row], sizeof g_name[g_row], "%s", name);
    g_best[g_row][g_form] = best;
    if (++g_row > g_rows) g_rows = g_row;
}

#define BENCH(name, bytes, stmt)                                                         \
    do {                                                                                 \
        stmt; /* warm */                                                                 \
        double best = 1e30;                                                              \
        for (int it_ = 0; it_ < 20; it_++) {                                             \
            double t0_ = omp_get_wtime();                                                \
            stmt;                                                                        \
            double t_ = omp_get_wtime() - t0_;                                           \
            if (t_ < best) best = t_;                                                    \
        }                                                                                \
        printf("%-34s %9.3f ms %8.1f GB/s\n", name, best * 1e3, (double)(bytes) / best / 1e9); \
        record(name, best);                                                              \
    } while (0)

static void run(bool only_optim) {
    const int64_t rows = 2048, V = 8192;
    const int64_t dims[] = {512, 1376};
    volatile double sink = 0;
    for (int di = 0; di < 2 && !only_optim; di++) {
        int64_t dim = dims[di], n = rows * dim;
        float *x = buf(n, -2, 2), *y = buf(n, 0, 1), *dy = buf(n, -1, 1), *w = buf(dim, 0.5f, 1.5f),
              *dw = buf(dim, 0, 0);
        char name[64];
        double mb = (double)n * 4;
        snprintf(name, sizeof name, "rmsnorm %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 2 * mb, kiln_k_rmsnorm(x, w, y, rows, dim, 1e-5f));
        snprintf(name, sizeof name, "rmsnorm_backward %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 3 * mb, kiln_k_rmsnorm_backward(x, w, dy, y, dw, rows, dim, 1e-5f));
        snprintf(name, sizeof name, "softmax %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 2 * mb, kiln_k_softmax(x, y, rows, dim));
        snprintf(name, sizeof name, "softmax_backward %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 3 * mb, kiln_k_softmax_backward(x, dy, y, rows, dim));
        snprintf(name, sizeof name, "silu %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 2 * mb, kiln_k_silu(x, y, n));
        snprintf(name, sizeof name, "silu_backward %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 3 * mb, kiln_k_silu_backward(x, dy, y, n));
        snprintf(name, sizeof name, "add %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, 3 * mb, kiln_k_add(x, dy, y, n));
        snprintf(name, sizeof name, "sumsq %lldx%lld", (long long)rows, (long long)dim);
        BENCH(name, mb, sink += kiln_k_sumsq(x, n));
        free(x), free(y), free(dy), free(w), free(dw);
    }
    if (!only_optim) {
        int64_t n = rows * V;
        float *lg = buf(n, -8, 8), *d = buf(n, 0, 1);
        int32_t *t = malloc((size_t)rows * sizeof(int32_t));
        for (int64_t i = 0; i < rows; i++) t[i] = (int32_t)((i * 7919) % V);
        int64_t cnt;
        BENCH("cross_entropy 2048x8192", (double)n * 4,
              sink += kiln_k_cross_entropy(lg, t, rows, V, KILN_IGNORE_INDEX, &cnt));
        BENCH("cross_entropy_backward 2048x8192", (double)n * 8,
              kiln_k_cross_entropy_backward(lg, t, 1.0f / 2048, d, rows, V, KILN_IGNORE_INDEX));
        free(lg), free(d), free(t);
    }
    if (!only_optim) {
        int64_t dim = 512, n = rows * dim;
        float *dout = buf(n, -1, 1), *dW = buf(V * dim, 0, 0), *out = buf(n, 0, 0);
        int32_t *ids = malloc((size_t)rows * sizeof(int32_t));
        for (int64_t i = 0; i < rows; i++) ids[i] = (int32_t)((i * 104729) % V);
        BENCH("embedding 2048x512", (double)n * 8, kiln_k_embedding(dW, ids, out, rows, dim));
        BENCH("embedding_backward 2048x512", (double)n * 12,
              kiln_k_embedding_backward(dout, ids, dW, rows, dim, V));
        free(dout), free(dW), free(out), free(ids);
    }
    if (!only_optim) {
        int64_t B = 8, T = 256, H = 8, D = 64, n = B * T * H * D;
        float *x = buf(n, -1, 1), *y = buf(n, 0, 0);
        BENCH("rope 8x256x8x64", (double)n * 8,
              kiln_k_rope(x, y, B, T, H, D, 0, 10000.0f, false));
        free(x), free(y);
    }
    if (!only_optim) {
        int64_t n = 20 * 1000 * 1000;
        float *p = buf(n, -1, 1), *g = buf(n, -1, 1), *m = buf(n, 0, 0), *v = buf(n, 0, 0);
        BENCH("adamw 20M", (double)n * 28,
              kiln_k_adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f));
        free(p), free(g), free(m), free(v);
    }
    {
        /* the optimiser step over the 'small' model's 74 tensors (29.5M
         * parameters): the per-tensor kernel loop the trainer ran before
         * (norm, scale, AdamW, memset per tensor) against the fused passes */
        enum { NT = 2 + 8 * 9 };
        int64_t len[NT];
        int k = 0;
        len[k++] = 8192 * 512, len[k++] = 512;
        for (int l = 0; l < 8; l++) {
            len[k++] = 512, len[k++] = 512;
            for (int j = 0; j < 4; j++) len[k++] = 512 * 512;
            for (int j = 0; j < 3; j++) len[k++] = 512 * 1376;
        }
        float *P[NT], *G[NT], *M[NT], *Vv[NT];
        const float *Gc[NT];
        kiln_adamw_slot slot[NT];
        double total = 0;
        for (int j = 0; j < NT; j++) {
            P[j] = buf(len[j], -1, 1), G[j] = buf(len[j], -1e-3f, 1e-3f), M[j] = buf(len[j], 0, 0), Vv[j] = buf(len[j], 0, 0);
            Gc[j] = G[j];
            slot[j] = (kiln_adamw_slot){P[j], G[j], M[j], Vv[j], len[j], len[j] > 512 ? 0.1f : 0.0f};
            total += (double)len[j];
        }
        /* bytes each way must move: norm reads g; scale reads + writes g;
         * AdamW reads p, g, m, v and writes p, m, v; zeroing writes g */
        BENCH("optimiser step small: kernel loop", total * 44, {
            double ss = 0;
            for (int j = 0; j < NT; j++) ss += kiln_k_sumsq(G[j], len[j]);
            sink += ss;
            for (int j = 0; j < NT; j++) kiln_k_scale(G[j], 0.5f, G[j], len[j]);
            for (int j = 0; j < NT; j++)
                kiln_k_adamw(P[j], G[j], M[j], Vv[j], len[j], 1e-3f, 0.9f, 0.95f, 1e-8f, slot[j].wd, 0.1f, 0.05f);
            for (int j = 0; j < NT; j++) memset(G[j], 0, (size_t)len[j] * sizeof(float));
        });
        BENCH("optimiser step small: fused", total * 36, {
            sink += kiln_k_sumsq_multi(Gc, len, NT);
            kiln_k_adamw_multi(slot, NT, 0.5f, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f);
        });
        for (int j = 0; j < NT; j++) free(P[j]), free(G[j]), free(M[j]), free(Vv[j]);
    }
    (void)sink;
}

int main(int argc, char **argv) {
    if (argc > 1) omp_set_num_threads(atoi(argv[1]));
    bool only_optim = argc > 2 && !strcmp(argv[2], "optim");
    if (argc > 2 && strcmp(argv[2], "optim") && strcmp(argv[2], "all")) {
        fprintf(stderr, "bandwidth: the second argument is optim or all, not '%s'\n", argv[2]);
        return 2;
    }
    kiln_form forms[KILN_FORM_COUNT];
    int nf = 0;
    if (argc > 3) {
        char list[128], *save = NULL;
        snprintf(list, sizeof list, "%s", argv[3]);
        for (char *tok = strtok_r(list, ",", &save); tok && nf < KILN_FORM_COUNT; tok = strtok_r(NULL, ",", &save)) {
            if (!kiln_form_parse(tok, &forms[nf])) {
                fprintf(stderr, "bandwidth: '%s' is not a form (portable, avx2, avx512)\n", tok);
                return 2;
            }
            bool dup = false;
            for (int j = 0; j < nf; j++) dup |= forms[j] == forms[nf];
            if (dup) {
                fprintf(stderr, "bandwidth: form %s listed twice\n", tok);
                return 2;
            }
            if (!kiln_form_runs(forms[nf])) {
                printf("form %s: skipped, this CPU cannot run it (CPU: %s)\n", tok, kiln_cpu_features_text());
                continue;
            }
            nf++;
        }
    } else
        forms[nf++] = kiln_form_active();
    printf("threads %d; CPU: %s\n", omp_get_max_threads(), kiln_cpu_features_text());
    for (int f = 0; f < nf; f++) {
        char why[200];
        if (!kiln_form_set(forms[f], why, sizeof why)) {
            fprintf(stderr, "bandwidth: %s\n", why);
            return 1;
        }
        printf("\nform %s\n", kiln_form_name(forms[f]));
        g_form = forms[f], g_row = 0;
        run(only_optim);
    }
    if (nf > 1) {
        printf("\n%-34s", "ms (best of 20)");
        for (int f = 0; f < nf; f++) printf(" %10s", kiln_form_name(forms[f]));
        printf("   best vs %s\n", kiln_form_name(forms[0]));
        for (int r = 0; r < g_rows; r++) {
            double best = 1e30;
            printf("%-34s", g_name[r]);
            for (int f = 0; f < nf; f++) {
                printf(" %10.3f", g_best[r][forms[f]] * 1e3);
                if (g_best[r][forms[f]] < best) best = g_best[r][forms[f]];
            }
            printf("   %5.2fx\n", g_best[r][forms[0]] / best);
        }
    }
    return 0;
}
