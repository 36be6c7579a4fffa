/* The kernels' forms against each other (kiln/simd.h): every kernel of
 * src/kernels/simd/ runs in each form this CPU can run (portable, avx2,
 * avx512) on the same inputs — sizes with vector tails, sizes past the
 * OpenMP thresholds, NaN, infinities, signed zeros, denormals — and each
 * form's outputs are held to the portable form's: bit for bit where the
 * forms do the same IEEE operations in the same order (the build has
 * -ffp-contract=off, and the hand-written vector paths are written to match),
 * within a stated bound where a form fuses a multiply-add (the flash
 * kernels' FMA tiles) or sums in vector lanes (`omp simd` reductions).
 * Forms this CPU cannot run are reported as skipped, with its features.
 * Also: the dispatch (the active form is the best one, calls through the
 * table reach it, kiln_form_set) and KILN_ISA (a child process per value). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"
#include "test.h"

static uint64_t g_seed = 977;
static double urand(void) {
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_seed >> 11) / 9007199254740992.0;
}
static float *frand(int64_t n, double lo, double hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
    return p;
}
static float *fcopy(const float *x, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}
/* NaN, +-inf, +-0, denormals, huge and tiny values sprinkled into x */
static void specials(float *x, int64_t n) {
    static const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -3e-39f, 3e38f, -1e-30f, 88.7f, -104.0f};
    for (int64_t i = 0; i < n; i += 97) x[i] = sp[(i / 97) % (int64_t)(sizeof sp / sizeof sp[0])];
}

/* ---- outputs: every kernel writes what it produces as doubles (floats
 * widen exactly), so one comparison serves all ------------------------- */
#define OUT_CAP (1 << 22)
typedef struct {
    double *v;
    int64_t n;
} outs;
static void put_f(outs *o, const float *x, int64_t n) {
    for (int64_t i = 0; i < n && o->n < OUT_CAP; i++) o->v[o->n++] = x[i];
}
static void put_u16(outs *o, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n && o->n < OUT_CAP; i++) o->v[o->n++] = x[i];
}
static void put_d(outs *o, double x) {
    if (o->n < OUT_CAP) o->v[o->n++] = x;
}

typedef void (*runner)(const kiln_simd_table *t, outs *o);

/* ---- the kernels, each with its inputs -------------------------------- */
static const int64_t sizes[] = {1, 15, 37, 4099, 70001}; /* tails; 70001 > the 2^15 parallel threshold */
#define NSIZES (int64_t)(sizeof sizes / sizeof sizes[0])

static void run_convert(const kiln_simd_table *t, outs *o) {
    for (int emu = 0; emu < 2; emu++) {
        kiln_bf16_force_emulation(emu);
        for (int64_t s = 0; s < NSIZES; s++) {
            int64_t n = sizes[s] + (1 << 16); /* also past the conversion's chunking */
            g_seed = 11 + (uint64_t)s;
            float *x = frand(n, -1e3, 1e3), *y = malloc((size_t)n * sizeof(float));
            specials(x, n);
            uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
            t->f32_to_bf16(x, h, n);
            t->round_bf16(x, y, n);
            put_u16(o, h, n);
            put_f(o, y, n);
            /* and back: the exact widening (bits h << 16) */
            float *z = malloc((size_t)n * sizeof(float));
            t->bf16_to_f32(h, z, n);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &z[i], sizeof u);
                bad += u != (uint32_t)h[i] << 16;
            }
            CHECK(bad == 0, "bf16_to_f32 (n=%lld): %lld values are not the bf16 bits shifted", (long long)n, (long long)bad);
            put_f(o, z, n);
            free(x), free(y), free(h), free(z);
        }
    }
    kiln_bf16_force_emulation(false);
}

static void run_elementwise(const kiln_simd_table *t, outs *o) {
    for (int64_t s = 0; s < NSIZES; s++) {
        int64_t n = sizes[s];
        g_seed = 21 + (uint64_t)s;
        float *a = frand(n, -20, 20), *b = frand(n, -3, 3), *y = malloc((size_t)n * sizeof(float));
        specials(a, n);
        t->add(a, b, y, n), put_f(o, y, n);
        t->mul(a, b, y, n), put_f(o, y, n);
        t->scale(a, -0.37f, y, n), put_f(o, y, n);
        memcpy(y, b, (size_t)n * sizeof(float));
        t->axpy(1.7f, a, y, n), put_f(o, y, n);
        t->exp(a, y, n), put_f(o, y, n);
        t->silu(a, y, n), put_f(o, y, n);
        t->silu_backward(a, b, y, n), put_f(o, y, n);
        free(a), free(b), free(y);
    }
}

static void run_reductions(const kiln_simd_table *t, outs *o) {
    float *x[NSIZES];
    int64_t n[NSIZES];
    for (int64_t s = 0; s < NSIZES; s++) {
        n[s] = sizes[s] * 3 + 1;
        g_seed = 31 + (uint64_t)s;
        x[s] = frand(n[s], -2, 2);
        put_d(o, t->sum(x[s], n[s]));
        put_d(o, t->sumsq(x[s], n[s]));
    }
    put_d(o, t->sumsq_multi((const float *const *)x, n, (int)NSIZES));
    for (int64_t s = 0; s < NSIZES; s++) free(x[s]);
}

static void run_norm(const kiln_simd_table *t, outs *o) {
    static const int64_t shapes[][2] = {{3, 7}, {5, 64}, {33, 1000}, {130, 512}};
    for (int s = 0; s < 4; s++) {
        int64_t rows = shapes[s][0], dim = shapes[s][1], n = rows * dim;
        g_seed = 41 + (uint64_t)s;
        float *x = frand(n, -2, 2), *w = frand(dim, 0.5, 1.5), *dy = frand(n, -1, 1);
        float *y = malloc((size_t)n * sizeof(float)), *dx = malloc((size_t)n * sizeof(float)), *dw = frand(dim, -1, 1);
        t->rmsnorm(x, w, y, rows, dim, 1e-6f), put_f(o, y, n);
        t->rmsnorm_backward(x, w, dy, dx, dw, rows, dim, 1e-6f), put_f(o, dx, n), put_f(o, dw, dim);
        free(x), free(w), free(dy), free(y), free(dx), free(dw);
    }
}

static void run_rope(const kiln_simd_table *t, outs *o) {
    const int64_t B = 2, T = 37, H = 3, D = 64, n = B * T * H * D;
    g_seed = 51;
    float *x = frand(n, -2, 2), *y = malloc((size_t)n * sizeof(float)), inv[32];
    int32_t pos[2 * 37];
    for (int64_t i = 0; i < B * T; i++) pos[i] = (int32_t)((i * 7) % 29);
    for (int type = 0; type < 3; type++) {
        t->rope_inv_freq(D, 500000.0, type, 8.0, 1.0, 4.0, 8192, inv);
        put_f(o, inv, D / 2);
    }
    for (int inverse = 0; inverse < 2; inverse++) {
        t->rope(x, y, B, T, H, D, 5, 10000.0f, inverse), put_f(o, y, n);
        t->rope_freq(x, y, B, T, H, D, 3, inv, inverse), put_f(o, y, n);
        t->rope_freq_pos(x, y, B, T, H, D, pos, inv, inverse), put_f(o, y, n);
    }
    free(x), free(y);
}

static void run_softmax_ce(const kiln_simd_table *t, outs *o) {
    static const int64_t shapes[][2] = {{3, 5}, {17, 129}, {64, 8192}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], V = shapes[s][1], n = rows * V;
        g_seed = 61 + (uint64_t)s;
        float *x = frand(n, -8, 8), *dy = frand(n, -1, 1), *y = malloc((size_t)n * sizeof(float));
        float *dx = malloc((size_t)n * sizeof(float));
        for (int64_t j = 0; j < V; j++) x[j] = -INFINITY; /* a fully masked row */
        x[V + 1] = INFINITY;                              /* a row with +inf */
        t->softmax(x, y, rows, V), put_f(o, y, n);
        t->softmax_backward(y, dy, dx, rows, V), put_f(o, dx, n);
        for (int64_t j = 0; j < 2 * V; j++) x[j] = (float)(urand() * 4 - 2); /* finite rows for the loss */
        int32_t *tg = malloc((size_t)rows * sizeof(int32_t));
        for (int64_t r = 0; r < rows; r++) tg[r] = r % 4 == 3 ? -100 : (int32_t)((r * 31) % V);
        int64_t count = 0;
        put_d(o, t->cross_entropy(x, tg, rows, V, -100, &count));
        put_d(o, (double)count);
        t->cross_entropy_backward(x, tg, 0.25f, dx, rows, V, -100), put_f(o, dx, n);
        free(x), free(dy), free(y), free(dx), free(tg);
    }
}

static void run_adamw(const kiln_simd_table *t, outs *o) {
    for (int64_t s = 0; s < NSIZES; s++) {
        int64_t n = sizes[s] + 33000;
        g_seed = 71 + (uint64_t)s;
        float *p = frand(n, -1, 1), *g = frand(n, -1e-2, 1e-2), *m = frand(n, -1e-3, 1e-3), *v = frand(n, 0, 1e-5);
        for (int64_t i = 0; i < n; i += 53) g[i] = 0.0f;
        for (int step = 1; step <= 3; step++)
            t->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f - powf(0.9f, (float)step),
                            1.0f - powf(0.95f, (float)step));
        put_f(o, p, n), put_f(o, m, n), put_f(o, v, n);
        /* the fused step over three slots, with clipping; beta1 = 0.3 takes the lerp's other branch */
        float *q = fcopy(p, n), *g2 = frand(n, -1, 1);
        kiln_adamw_slot sl[3] = {{q, g2, m, v, n / 3, 0.1f},
                                 {q + n / 3, g2 + n / 3, m + n / 3, v + n / 3, n / 3, 0.0f},
                                 {q + 2 * (n / 3), g2 + 2 * (n / 3), m + 2 * (n / 3), v + 2 * (n / 3), n - 2 * (n / 3), 0.01f}};
        t->adamw_multi(sl, 3, 0.7f, 2e-3f, 0.3f, 0.999f, 1e-6f, 0.5f, 0.25f);
        put_f(o, q, n), put_f(o, m, n), put_f(o, v, n), put_f(o, g2, n);
        free(p), free(g), free(m), free(v), free(q), free(g2);
    }
}

/* flash attention: grouped heads, padding, segments, a window; T < Tk */
static void run_flash(const kiln_simd_table *t, outs *o) {
    const int64_t B = 2, H = 4, Hkv = 2, T = 77, Tk = 93, D = 64;
    const int64_t nq = B * H * T * D, nk = B * Hkv * Tk * D, nl = B * H * T;
    g_seed = 81;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1), *dout = frand(nq, -1, 1);
    float *out = malloc((size_t)nq * sizeof(float)), *lse = malloc((size_t)nl * sizeof(float));
    float *dq = malloc((size_t)nq * sizeof(float)), *dk = malloc((size_t)nk * sizeof(float));
    float *dv = malloc((size_t)nk * sizeof(float));
    int32_t pad[2 * 93], seg[2 * 93];
    for (int64_t i = 0; i < B * Tk; i++) pad[i] = !(i % Tk > 85 && i / Tk == 1), seg[i] = (int32_t)((i % Tk) / 40);
    const float sc = 0.125f;
    for (int variant = 0; variant < 3; variant++) {
        if (variant == 0) {
            t->flash_attn(q, k, v, pad, out, lse, B, H, Hkv, T, Tk, D, sc);
            t->flash_attn_backward(q, k, v, pad, out, lse, dout, dq, dk, dv, B, H, Hkv, T, Tk, D, sc);
        } else if (variant == 1) {
            t->flash_attn_seg(q, k, v, pad, seg, out, lse, B, H, Hkv, T, Tk, D, sc);
            t->flash_attn_backward_seg(q, k, v, pad, seg, out, lse, dout, dq, dk, dv, B, H, Hkv, T, Tk, D, sc);
        } else {
            t->flash_attn_win(q, k, v, pad, NULL, out, lse, B, H, Hkv, T, Tk, D, sc, 20);
            t->flash_attn_backward_win(q, k, v, pad, NULL, out, lse, dout, dq, dk, dv, B, H, Hkv, T, Tk, D, sc,
                                              20);
        }
        put_f(o, out, nq), put_f(o, lse, nl), put_f(o, dq, nq), put_f(o, dk, nk), put_f(o, dv, nk);
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
}

static void run_linear_ce(const kiln_simd_table *t, outs *o) {
    const int64_t N = 40, C = 48, V = 300;
    g_seed = 91;
    float *h = frand(N * C, -1, 1), *W = frand(V * C, -0.5, 0.5);
    float *dh = malloc((size_t)(N * C) * sizeof(float)), *dW = malloc((size_t)(V * C) * sizeof(float));
    int32_t tg[40];
    for (int64_t i = 0; i < N; i++) tg[i] = i % 5 == 4 ? -100 : (int32_t)((i * 37) % V);
    int64_t count = 0;
    put_d(o, t->linear_cross_entropy(h, W, tg, N, C, V, -100, 7, &count, dh, dW));
    put_d(o, (double)count), put_f(o, dh, N * C), put_f(o, dW, V * C);
    kiln_lce_opts opts[2] = {{0.5f, false, 30.0f}, {1.0f, true, 0.0f}};
    for (int i = 0; i < 2; i++) {
        put_d(o, t->linear_cross_entropy_ex(h, W, tg, N, C, V, -100, 0, &count, dh, dW, &opts[i]));
        put_f(o, dh, N * C), put_f(o, dW, V * C);
    }
    put_d(o, (double)t->linear_cross_entropy_scratch(N, C, V, 7, false));
    put_d(o, (double)t->linear_cross_entropy_scratch(N, C, V, 0, true));
    free(h), free(W), free(dh), free(dW);
}

/* kiln's own GEMM: the four transposes, edge tiles, K past one block,
 * padded strides, alpha, beta 0 over NaN and beta 1, NaN/Inf in A */
static void run_gemm(const kiln_simd_table *t, outs *o) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {15, 33, 17}, {37, 70, 300}, {130, 96, 64}};
    for (int s = 0; s < 5; s++)
        for (int tr = 0; tr < 4; tr++) {
            bool tA = tr & 1, tB = tr & 2;
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            int64_t lda = (tA ? M : K) + 1, ldb = (tB ? K : N) + 2, ldc = N + 3;
            int64_t nA = (tA ? K : M) * lda, nB = (tB ? N : K) * ldb;
            g_seed = 101 + (uint64_t)(s * 4 + tr);
            float *A = frand(nA, -1, 1), *B = frand(nB, -1, 1), *C = frand(M * ldc, -1, 1);
            if (nA > 200) A[nA / 2] = NAN, A[nA / 3] = INFINITY;
            float *C1 = fcopy(C, M * ldc);
            for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;
            t->gemm_f32(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc), put_f(o, C, M * ldc);
            t->gemm_f32(tA, tB, M, N, K, -0.75f, A, lda, B, ldb, 1.0f, C1, ldc), put_f(o, C1, M * ldc);
            free(A), free(B), free(C), free(C1);
        }
}

/* kiln's own bf16 GEMM: the same shapes; bf16 operands with NaN, Inf,
 * denormals and products that underflow; the avx512 form through VDPBF16PS
 * where the CPU has it, the other forms emulate its sums bit for bit */
/* VDPBF16PS's sums in every form; the AMX path (its own sums) is
 * test_gemm's, so it is off here */
static void run_gemm_bf16(const kiln_simd_table *t, outs *o) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {15, 33, 17}, {37, 70, 301}, {130, 96, 64}};
    kiln_bf16_amx_off(true);
    for (int s = 0; s < 5; s++)
        for (int tr = 0; tr < 4; tr++) {
            bool tA = tr & 1, tB = tr & 2;
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            int64_t lda = (tA ? M : K) + 1, ldb = (tB ? K : N) + 2, ldc = N + 3;
            int64_t nA = (tA ? K : M) * lda, nB = (tB ? N : K) * ldb;
            g_seed = 301 + (uint64_t)(s * 4 + tr);
            float *a = frand(nA, -1, 1), *b = frand(nB, -1, 1), *C = frand(M * ldc, -1, 1);
            if (nA > 200) a[nA / 2] = NAN, a[nA / 3] = INFINITY;
            for (int64_t i = 0; i < nA; i += 7) a[i] *= 1e-19f; /* products near and below 2^-126 */
            for (int64_t i = 0; i < nB; i += 5) b[i] *= 1e-19f;
            if (nB > 100) b[nB / 4] = 3e-39f, b[nB / 5] = -1e-39f; /* denormals */
            uint16_t *A = malloc((size_t)nA * sizeof(uint16_t)), *B = malloc((size_t)nB * sizeof(uint16_t));
            for (int64_t i = 0; i < nA; i++) A[i] = kiln_f32_to_bf16(a[i]);
            for (int64_t i = 0; i < nB; i++) B[i] = kiln_f32_to_bf16(b[i]);
            float *C1 = fcopy(C, M * ldc);
            for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;
            t->gemm_bf16(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc), put_f(o, C, M * ldc);
            t->gemm_bf16(tA, tB, M, N, K, -0.75f, A, lda, B, ldb, 1.0f, C1, ldc), put_f(o, C1, M * ldc);
            free(a), free(b), free(A), free(B), free(C), free(C1);
        }
    kiln_bf16_amx_off(false);
}

/* ---- comparison ----------------------------------------------------------- */
static bool same(double a, double b) {
    if (isnan(a) && isnan(b)) return true;
    return !memcmp(&a, &b, sizeof a);
}

typedef struct {
    const char *name;
    runner run;
    double bound; /* 0: bit for bit; else max |a-b| / max |ref| per run */
    const char *why;
} kernel_case;

static const kernel_case cases[] = {
    {"f32_to_bf16, round_bf16, bf16_to_f32", run_convert, 0, "the same rounding in every form"},
    {"add mul scale axpy exp silu silu_backward", run_elementwise, 0,
     "the same operations in the same order; exp's vector form is the scalar's, FMA for FMA"},
    {"sum sumsq sumsq_multi", run_reductions, 1e-12, "double sums in vector lanes: the lanes' count is the form's"},
    {"rmsnorm (+backward)", run_norm, 1e-6, "sums of squares in vector lanes"},
    {"rope rope_freq rope_freq_pos rope_inv_freq", run_rope, 0, "angles in double, one rotation per element"},
    {"softmax (+backward), cross_entropy (+backward)", run_softmax_ce, 1e-6, "row sums in vector lanes"},
    {"adamw adamw_multi", run_adamw, 0, "the intrinsics do the scalar loop's IEEE operations in its order"},
    {"flash_attn (+seg, +win, +backward)", run_flash, 1e-5, "FMA tiles (AVX2, AVX-512) vs separate multiply and add"},
    {"linear_cross_entropy (+ex, +scratch)", run_linear_ce, 1e-6, "row sums in vector lanes"},
    {"gemm_f32", run_gemm, 1e-5, "FMA (AVX2, AVX-512) vs separate multiply and add, the same order of sums"},
    {"gemm_bf16", run_gemm_bf16, 0, "VDPBF16PS's sums: the instruction or its emulation, the same K blocks"},
};

static void compare_forms(void) {
    const kiln_simd_table *ref = kiln_simd_table_of(KILN_FORM_PORTABLE);
    CHECK(ref != NULL, "the portable form always runs");
    if (!ref) return;
    outs a = {malloc(OUT_CAP * sizeof(double)), 0}, b = {malloc(OUT_CAP * sizeof(double)), 0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        a.n = 0;
        cases[c].run(ref, &a);
        CHECK(a.n > 0 && a.n < OUT_CAP, "%s: %lld outputs", cases[c].name, (long long)a.n);
        for (int f = KILN_FORM_AVX2; f < KILN_FORM_COUNT; f++) {
            const kiln_simd_table *t = kiln_simd_table_of((kiln_form)f);
            if (!t) {
                printf("  %-48s %-7s skipped: %s\n", cases[c].name, kiln_form_name((kiln_form)f),
                       kiln_form_built((kiln_form)f) ? "this CPU cannot run it" : "not built here");
                continue;
            }
            b.n = 0;
            cases[c].run(t, &b);
            CHECK(b.n == a.n, "%s: %lld outputs vs %lld", cases[c].name, (long long)b.n, (long long)a.n);
            int64_t differ = 0, nan_mismatch = 0;
            double dmax = 0, smax = 0;
            for (int64_t i = 0; i < a.n && i < b.n; i++) {
                if (same(a.v[i], b.v[i])) continue;
                differ++;
                if (isnan(a.v[i]) != isnan(b.v[i]) || (isinf(a.v[i]) || isinf(b.v[i]))) {
                    nan_mismatch++;
                    continue;
                }
                dmax = fmax(dmax, fabs(a.v[i] - b.v[i]));
            }
            for (int64_t i = 0; i < a.n; i++)
                if (isfinite(a.v[i])) smax = fmax(smax, fabs(a.v[i]));
            double rel = smax > 0 ? dmax / smax : dmax;
            printf("  %-48s %-7s vs portable: %s (%lld of %lld values differ, max rel %.2e; %s)\n", cases[c].name,
                   kiln_form_name((kiln_form)f), differ ? "within bound" : "bit-identical", (long long)differ,
                   (long long)a.n, rel, cases[c].why);
            CHECK(nan_mismatch == 0, "%s (%s): %lld values NaN/inf in one form and not the other", cases[c].name,
                  kiln_form_name((kiln_form)f), (long long)nan_mismatch);
            if (cases[c].bound == 0)
                CHECK(differ == 0, "%s (%s): %lld values differ from the portable form's bits (max rel %.3g)",
                      cases[c].name, kiln_form_name((kiln_form)f), (long long)differ, rel);
            else
                CHECK(rel <= cases[c].bound, "%s (%s): max rel %.3g > %.1g", cases[c].name,
                      kiln_form_name((kiln_form)f), rel, cases[c].bound);
        }
    }
    free(a.v), free(b.v);
}

/* the dispatch itself: the best form is active, kiln_k_* reach it, set works */
static void check_dispatch(void) {
    const char *env = getenv("KILN_ISA");
    printf("  kernels: %s\n", kiln_form_describe());
    if (!env || !*env)
        CHECK(kiln_form_active() == kiln_form_best(), "active %s, best %s", kiln_form_name(kiln_form_active()),
              kiln_form_name(kiln_form_best()));
    CHECK(kiln_simd == kiln_simd_table_of(kiln_form_active()), "kiln_simd is the active form's table");
    kiln_form was = kiln_form_active();
    char why[200];
    for (int f = 0; f < KILN_FORM_COUNT; f++) {
        bool ok = kiln_form_set((kiln_form)f, why, sizeof why);
        CHECK(ok == kiln_form_runs((kiln_form)f), "kiln_form_set(%s) -> %d: %s", kiln_form_name((kiln_form)f), ok,
              ok ? "" : why);
        if (!ok) {
            CHECK(strstr(why, kiln_form_name((kiln_form)f)) != NULL, "the refusal names the form: %s", why);
            continue;
        }
        /* a call through the macro goes to this form's symbol */
        CHECK(kiln_simd->add == kiln_simd_table_of((kiln_form)f)->add, "%s: table",
              kiln_form_name((kiln_form)f));
        float x[3] = {1, 2, 3}, y[3] = {4, 5, 6}, z[3];
        kiln_k_add(x, y, z, 3);
        CHECK(z[0] == 5 && z[1] == 7 && z[2] == 9, "kiln_k_add through the %s form", kiln_form_name((kiln_form)f));
    }
    CHECK(kiln_form_set(was, why, sizeof why), "back to %s", kiln_form_name(was));
    kiln_form f;
    CHECK(!kiln_form_parse("avx512f", &f) && !kiln_form_parse("", &f) && kiln_form_parse("avx2", &f) &&
              f == KILN_FORM_AVX2,
          "kiln_form_parse takes the three names only");
    CHECK(strlen(kiln_cpu_features_text()) > 0, "features text");
    unsigned c = kiln_cpu_features();
    CHECK(!(c & KILN_CPU_AVX512) || (c & KILN_CPU_AVX2), "AVX-512 (x86-64-v4) implies AVX2 (x86-64-v3)");
    CHECK(!(c & KILN_CPU_AVX512BF16) || (c & KILN_CPU_AVX512), "AVX512-BF16 implies AVX-512");
}

/* KILN_ISA in a child: each runnable form becomes the active one; an unknown
 * value, or a form this CPU cannot run, stops the program at start naming it */
static void check_env(const char *self) {
    char cmd[1200], line[512];
    for (int f = -1; f < KILN_FORM_COUNT; f++) {
        const char *val = f < 0 ? "sse9" : kiln_form_name((kiln_form)f);
        snprintf(cmd, sizeof cmd, "KILN_ISA=%s '%s' --child 2>&1", val, self);
        FILE *p = popen(cmd, "r");
        char all[2048] = "";
        while (p && fgets(line, sizeof line, p)) strncat(all, line, sizeof all - strlen(all) - 1);
        int rc = p ? pclose(p) : -1;
        int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        bool runs = f >= 0 && kiln_form_runs((kiln_form)f);
        if (runs) {
            char want[64];
            snprintf(want, sizeof want, "active %s\n", val);
            CHECK(code == 0 && strstr(all, want), "KILN_ISA=%s: rc %d, output: %s", val, code, all);
        } else {
            CHECK(code == 2 && strstr(all, "KILN_ISA=") && strstr(all, val), "KILN_ISA=%s: rc %d, output: %s", val,
                  code, all);
            printf("  KILN_ISA=%s refused: %s", val, all);
        }
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) {
        printf("active %s\n", kiln_form_name(kiln_form_active()));
        return 0;
    }
    check_dispatch();
    check_env(argv[0]);
    compare_forms();
    TEST_END();
}
