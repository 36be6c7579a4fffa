/* kiln_gemm_f32's choice of implementation by measurement (src/kernels/gemm.c):
 * - a product met for the first time is measured and its choice written to
 *   KILN_CACHE_DIR/gemm-choices (one line, a known implementation, the three
 *   timings), and the result is right (against a double product);
 * - a choice already in the file is used, not measured again: a line
 *   written by hand naming each implementation in turn is followed (the
 *   count of that implementation grows, "0 measured now");
 * - two processes sharing the cache give bit-identical products (the
 *   second reads the first one's choice) and the file keeps one line;
 * - KILN_GEMM forces an implementation; a wrong value stops the program
 *   naming it;
 * - every implementation (forced in a child) gives the product within the
 *   fp32 bound, beta 1 accumulating; OpenBLAS's and BLIS's OpenMP builds
 *   are among them wherever scripts/deps.sh ran (a sanitizer build cannot
 *   open them, and BLIS with only its generic kernels for the CPU, as
 *   Debian's 0.9.0 on Zen 5, is left out: there forcing one stops the
 *   program naming why). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kiln/kernels.h"
#include "test.h"

static char g_cache[256], g_self[1024];

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILD 1
#endif
#endif
#ifndef ASAN_BUILD
#define ASAN_BUILD 0
#endif

static const char *const g_impl[5] = {"onednn", "sgemm", "kiln", "openblas", "blis"};

/* Whether BLIS's OpenMP build, opened here directly (not through kiln),
 * has only its generic kernels for this CPU, by what it says of itself
 * (false where it does not open: scripts/deps.sh installs it, so there
 * the check below fails naming kiln's reason) */
static bool blis_generic(void) {
    void *h = dlopen("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    const char *(*arch)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
    int (*arch_id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
    const bool generic = arch && arch_id && strcmp(arch(arch_id()), "generic") == 0;
    dlclose(h);
    return generic;
}
/* whether implementation i is a candidate in this build (the BLAS
 * libraries: where opened), and runs a 1 x 1 x 1 product right */
static bool impl_here(int i) {
    float a = 1, b = 2, c = 0;
    kiln_gemm_desc d = {.M = 1, .N = 1, .K = 1, .lda = 1, .ldb = 1, .ldc = 1, .batch = 1, .alpha = 1, .beta = 0};
    bool avail = kiln_gemm_f32_impl_available(g_impl[i]);
    bool ok = kiln_gemm_f32_impl(g_impl[i], &d, &a, &b, &c) == KILN_OK && c == 2;
    CHECK(ok == avail, "%s: available %d, but the product %s: %s", g_impl[i], (int)avail, ok ? "ran" : "did not run",
          kiln_last_error());
    kiln_clear_error();
    return ok;
}

static void fill(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5);
    }
}

/* C = A·B (+ C) for M x K, K x N row-major, checked against doubles */
static double product_err(int64_t M, int64_t N, int64_t K, float beta, float *C) {
    float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(K * N) * sizeof *B);
    fill(A, M * K, 1 + (uint64_t)M), fill(B, K * N, 7 + (uint64_t)N);
    float *C0 = malloc((size_t)(M * N) * sizeof *C0);
    fill(C, M * N, 99);
    memcpy(C0, C, (size_t)(M * N) * sizeof *C0);
    kiln_gemm_desc d = {.M = M, .N = N, .K = K, .lda = K, .ldb = N, .ldc = N, .batch = 1, .alpha = 1, .beta = beta};
    CHECK_OK(kiln_gemm_f32(&d, A, B, C));
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = beta != 0 ? C0[i * N + j] : 0, mag = fabs(s);
            for (int64_t k = 0; k < K; k++) s += (double)A[i * K + k] * B[k * N + j], mag += fabs((double)A[i * K + k] * B[k * N + j]);
            double e = fabs(C[i * N + j] - s) / (mag * (double)K * 1.2e-7 + 1e-30);
            if (e > worst) worst = e;
        }
    free(A), free(B), free(C0);
    return worst; /* in units of the bound K eps sum|a b| */
}

static char *choices_text(void) {
    char path[512], *text = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/gemm-choices", g_cache);
    if (kiln_read_file(path, &text, &n)) {
        kiln_clear_error();
        return NULL;
    }
    return text;
}

static int count_lines_with(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, needle)); p++) n++;
    return n;
}

/* runs this binary with --child ARGS in env, output into out */
static int child(const char *env, const char *args, char *out, size_t n) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env KILN_CACHE_DIR=%s %s %s --child %s 2>&1", g_cache, env, g_self, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_measured_and_recorded(void) {
    float *C = malloc(96 * 80 * sizeof *C);
    double e = product_err(96, 80, 72, 0, C);
    CHECK(e <= 1, "first product: error %.3g of the bound", e);
    char *t = choices_text();
    CHECK(t != NULL, "no %s/gemm-choices after a product", g_cache);
    CHECK(t && count_lines_with(t, "M96 N80 K72") == 1, "one line for the product: %s", t ? t : "");
    const char *line = t ? strstr(t, "M96 N80 K72") : NULL;
    bool known = false;
    for (int i = 0; i < 5 && line; i++) {
        char want[32];
        snprintf(want, sizeof want, "\t%s\tus ", g_impl[i]);
        known |= strstr(line, want) != NULL && impl_here(i);
    }
    CHECK(known, "the line names an implementation and its timings: %s", line ? line : "");
    /* the rule, read back from the line: "us" the mean of each candidate's
     * timed calls, "loaded" the same beside busy threads (-1: not a
     * candidate); where two or more ran, every one that ran idle ran
     * loaded, and the named one is the fastest idle of those within 1.5x
     * the best loaded time (the line's times have one decimal: 0.1% is
     * left undecided) */
    const char *us = line ? strstr(line, "\tus ") : NULL, *ld = us ? strstr(us, "\tloaded ") : NULL;
    double v[5], w[5];
    int chosen = -1, lowest = -1, lowest_l = -1, n_idle = 0;
    for (int i = 0; i < 5 && line && us; i++) {
        char want[32];
        snprintf(want, sizeof want, "\t%s\tus ", g_impl[i]);
        if (strstr(line, want) && strstr(line, want) < us + 1) chosen = i;
    }
    bool parsed = us && ld && sscanf(us + 4, "%lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4]) == 5 &&
                  sscanf(ld + 8, "%lf %lf %lf %lf %lf", &w[0], &w[1], &w[2], &w[3], &w[4]) == 5;
    for (int i = 0; parsed && i < 5; i++) {
        if (v[i] > 0 && (lowest < 0 || v[i] < v[lowest])) lowest = i;
        if (w[i] > 0 && (lowest_l < 0 || w[i] < w[lowest_l])) lowest_l = i;
        n_idle += v[i] > 0;
    }
    CHECK(parsed && chosen >= 0 && lowest >= 0, "the line gives the chosen implementation and both timings: %s", line ? line : "");
    if (parsed && chosen >= 0 && lowest >= 0) {
        for (int i = 0; i < 5; i++)
            CHECK((w[i] > 0) == (n_idle > 1 && v[i] > 0), "%s timed loaded where it ran idle beside others: %s", g_impl[i], line);
        if (n_idle > 1 && lowest_l >= 0 && w[chosen] > 0) {
            CHECK(w[chosen] <= w[lowest_l] * 1.5 * 1.001, "the chosen %s is within 1.5x the best loaded time: %s",
                  g_impl[chosen], line);
            for (int i = 0; i < 5; i++)
                CHECK(!(w[i] > 0 && w[i] <= w[lowest_l] * 1.5 * 0.999 && v[i] < v[chosen] * 0.999),
                      "%s is within 1.5x loaded and faster idle than the chosen %s: %s", g_impl[i], g_impl[chosen], line);
        } else {
            CHECK(chosen == lowest && n_idle <= 1, "one candidate: the fastest mean is chosen: %s", line);
        }
    }
    CHECK(strstr(kiln_gemm_choices(), "1 measured now") != NULL, "choices: %s", kiln_gemm_choices());
    /* the same product again: no new measurement, no new line */
    product_err(96, 80, 72, 0, C);
    free(t);
    t = choices_text();
    CHECK(t && count_lines_with(t, "M96 N80 K72") == 1, "still one line: %s", t ? t : "");
    CHECK(strstr(kiln_gemm_choices(), "1 measured now") != NULL, "choices: %s", kiln_gemm_choices());
    free(t);
    free(C);
}

/* a line written by hand for a product not yet met is followed */
static void check_recorded_choice_followed(void) {
    char *t = choices_text();
    if (!t) return;
    size_t tag_len = strcspn(t, "\t"); /* this machine's tag, from the line above */
    const char *const *impl = g_impl;
    for (int i = 0; i < 5; i++) {
        if (!impl_here(i)) continue; /* check_forced covers its absence */
        int64_t M = 50 + i, N = 40, K = 30;
        char path[512], line[1024];
        snprintf(path, sizeof path, "%s/gemm-choices", g_cache);
        snprintf(line, sizeof line, "%.*s\tf32 t%d NN M%lld N%lld K%lld ld%lld,%lld,%lld b1 s0,0,0 a%a c%a\t%s\tus 0 0 0\n",
                 (int)tag_len, t, kiln_num_threads(), (long long)M, (long long)N, (long long)K, (long long)K,
                 (long long)N, (long long)N, 1.0, 0.0, impl[i]);
        FILE *f = fopen(path, "a");
        CHECK(f != NULL, "cannot append to %s", path);
        if (!f) continue;
        fputs(line, f);
        fclose(f);
        char before[192];
        snprintf(before, sizeof before, "%s", kiln_gemm_choices());
        float *C = malloc((size_t)(M * N) * sizeof *C);
        double e = product_err(M, N, K, 0, C);
        free(C);
        CHECK(e <= 1, "%s (recorded): error %.3g of the bound", impl[i], e);
        char want[32];
        snprintf(want, sizeof want, "%s ", impl[i]);
        const char *a = strstr(before, want), *b = strstr(kiln_gemm_choices(), want);
        CHECK(a && b && atoi(b + strlen(want)) == atoi(a + strlen(want)) + 1, "%s: before '%s', after '%s'", impl[i], before,
              kiln_gemm_choices());
        CHECK(strstr(kiln_gemm_choices(), "1 measured now") != NULL, "a recorded choice was measured again: %s",
              kiln_gemm_choices());
    }
    free(t);
}

/* two processes, one cache: the same bits */
static void check_processes_agree(void) {
    char a[4096], b[4096];
    int ra = child("", "product 130 70 90", a, sizeof a), rb = child("", "product 130 70 90", b, sizeof b);
    CHECK(ra == 0 && rb == 0, "children: %d %d\n%s\n%s", ra, rb, a, b);
    const char *ha = strstr(a, "hash "), *hb = strstr(b, "hash ");
    CHECK(ha && hb && strtoull(ha + 5, NULL, 16) == strtoull(hb + 5, NULL, 16), "the two processes' products differ:\n%s\n%s", a, b);
    CHECK(strstr(b, "0 measured now") != NULL, "the second process measured again: %s", b);
    char *t = choices_text();
    CHECK(t && count_lines_with(t, "M130 N70 K90 ld90,70,70 b1 s0,0,0 a0x1p+0 c0x0p+0\t") == 1, "one line for the shared product: %s", t ? t : "");
    free(t);
}

static void check_forced(void) {
    for (int i = 0; i < 5; i++) {
        const bool here = impl_here(i);
        /* the BLAS libraries: installed by scripts/deps.sh, so candidates
         * in every build but a sanitizer one */
        const bool generic = i == 4 && !ASAN_BUILD && blis_generic();
        CHECK(here == (i < 3 || (!ASAN_BUILD && !generic)), "%s is %sa candidate in this build: %s", g_impl[i],
              here ? "" : "not ", kiln_gemm_backend());
        char env[64], out[4096], want[160];
        snprintf(env, sizeof env, "KILN_GEMM=%s", g_impl[i]);
        int rc = child(env, "product 67 45 301", out, sizeof out);
        if (here) {
            snprintf(want, sizeof want, "KILN_GEMM=%s: 2 fp32 products", g_impl[i]);
            CHECK(rc == 0 && strstr(out, want) && strstr(out, "error ok"), "forced %s: rc %d: %s", g_impl[i], rc, out);
        } else {
            snprintf(want, sizeof want, "KILN_GEMM=%s: %s is no candidate here: %s", g_impl[i], i == 3 ? "OpenBLAS" : "BLIS",
                     ASAN_BUILD ? "not opened in a sanitizer build" : generic ? "BLIS " : "not");
            CHECK(rc == 2 && strstr(out, want) && (!generic || strstr(out, " has only its generic kernels for this CPU")),
                  "forced %s where absent: rc %d: %s", g_impl[i], rc, out);
        }
    }
    { /* the named implementation, and a name that is none */
        float a = 1, b = 2, c = 0;
        kiln_gemm_desc d = {.M = 1, .N = 1, .K = 1, .lda = 1, .ldb = 1, .ldc = 1, .batch = 1, .alpha = 1, .beta = 0};
        CHECK(kiln_gemm_f32_impl("mkl", &d, &a, &b, &c) == KILN_ERR_INVALID && strstr(kiln_last_error(), "'mkl'"),
              "an unknown implementation named: %s", kiln_last_error());
        kiln_clear_error();
    }
    char out[4096];
    int rc = child("KILN_GEMM=blas", "product 2 2 2", out, sizeof out);
    CHECK(rc == 2 && strstr(out, "KILN_GEMM=blas: not a GEMM implementation"), "KILN_GEMM=blas: rc %d: %s", rc, out);
    /* KILN_BF16: emulated takes the emulation, auto what the CPU has, any
     * other value stops the program naming it */
    rc = child("KILN_BF16=emulated", "product 3 3 3", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "bf16 native 0"), "KILN_BF16=emulated: rc %d: %s", rc, out);
    char want[32];
    snprintf(want, sizeof want, "bf16 native %d", (int)kiln_cpu_has_avx512bf16());
    rc = child("KILN_BF16=auto", "product 3 3 3", out, sizeof out);
    CHECK(rc == 0 && strstr(out, want), "KILN_BF16=auto: rc %d, want '%s': %s", rc, want, out);
    rc = child("KILN_BF16=fast", "product 3 3 3", out, sizeof out);
    CHECK(rc == 2 && strstr(out, "KILN_BF16=fast: not a bf16 path"), "KILN_BF16=fast: rc %d: %s", rc, out);
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--child") && !strcmp(argv[2], "product")) {
        int64_t M = atoll(argv[3]), N = atoll(argv[4]), K = atoll(argv[5]);
        float *C = malloc((size_t)(M * N) * sizeof *C);
        double e0 = product_err(M, N, K, 0, C), e1 = product_err(M, N, K, 1, C);
        uint64_t h = 1469598103934665603ull;
        const unsigned char *p = (const unsigned char *)C;
        for (size_t i = 0; i < (size_t)(M * N) * sizeof *C; i++) h = (h ^ p[i]) * 1099511628211ull;
        printf("hash %llx\nerror %s (%.3g, %.3g of the bound)\n%s\nbf16 native %d\n", (unsigned long long)h,
               e0 <= 1 && e1 <= 1 && t_fail == 0 ? "ok" : "BAD", e0, e1, kiln_gemm_choices(), (int)kiln_bf16_native());
        free(C);
        return 0;
    }
    snprintf(g_self, sizeof g_self, "%s", argv[0]);
    snprintf(g_cache, sizeof g_cache, "/tmp/kiln_gemm_choice_%d", (int)getpid());
    setenv("KILN_CACHE_DIR", g_cache, 1);
    unsetenv("KILN_GEMM");
    check_measured_and_recorded();
    check_recorded_choice_followed();
    check_processes_agree();
    check_forced();
    kiln_remove_tree(g_cache);
    TEST_END();
}
