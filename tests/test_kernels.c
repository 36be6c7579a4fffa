/* Kernels against straightforward double-precision references on random
 * inputs of odd sizes, plus identities (rope inverse, softmax sums, masked
 * rows), finite differences for rmsnorm's backward, and bit-equality of the
 * kernels that promise results independent of the thread count. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kernels.h"
#include "test.h"

/* ---- helpers ----------------------------------------------------------- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* [0,1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static float *frand(int64_t n, double lo, double hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
    return p;
}
static float *fcopy(const float *x, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}
static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* max over i of |a - b| / (atol + rtol |b|); <= 1 means close */
static double close_ratio(const float *a, const double *b, int64_t n, double rtol, double atol) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (!(d <= worst)) worst = d; /* NaN wins */
    }
    return worst;
}
#define CHECK_CLOSE(a, b, n, rtol, atol, what)                                        \
    do {                                                                              \
        double r_ = close_ratio((a), (b), (n), (rtol), (atol));                       \
        CHECK(r_ <= 1.0, "%s: off by %.3g x tolerance", (what), r_);                  \
    } while (0)

static int nthreads_max;
static void threads(int n) { omp_set_num_threads(n); }

/* ---- fast exp ---------------------------------------------------------- */
static void test_exp(void) {
    double worst = 0.0;
    int64_t n = 2000000;
    for (int64_t i = 0; i <= n; i++) {
        float x = (float)(-87.33 + (88.37 + 87.33) * (double)i / (double)n);
        double ref = exp((double)x), got = kiln_expf_fast(x);
        double rel = fabs(got - ref) / ref;
        if (rel > worst) worst = rel;
    }
    CHECK(worst < 1e-6, "expf_fast max rel err %.3g", worst);
    float xs[] = {0.0f, -1e-30f, 1e-30f, -0.5f * 0.6931472f, 0.5f * 0.6931472f, 1.0f, -1.0f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        CHECK(fabs(kiln_expf_fast(xs[i]) - exp((double)xs[i])) <= 2e-7 * exp((double)xs[i]),
              "exp(%g)", (double)xs[i]);
    CHECK(kiln_expf_fast(-INFINITY) == 0.0f, "exp(-inf)");
    CHECK(kiln_expf_fast(-100.0f) == 0.0f, "exp(-100)");
    CHECK(isinf(kiln_expf_fast(100.0f)), "exp(100)");
    CHECK(isinf(kiln_expf_fast(INFINITY)), "exp(inf)");
    CHECK(isnan(kiln_expf_fast(NAN)), "exp(nan)");
    CHECK(kiln_expf_fast(-87.8f) == 0.0f && kiln_expf_fast(-88.5f) == 0.0f, "exp(-87.8)");
    CHECK(isinf(kiln_expf_fast(88.5f)) && isinf(kiln_expf_fast(89.5f)), "exp(88.5)");
    /* kiln_k_exp (the flash kernels' hand-vectorised form where the CPU has
     * AVX2) against the scalar, bit for bit: a sweep past both clamps, every
     * 2^-8 step near 0, and the special values, at odd lengths (the tail) */
    {
        int64_t m = 1000003;
        float *xv = malloc(sizeof(float) * (size_t)(m + 16)), *yv = malloc(sizeof(float) * (size_t)(m + 16));
        for (int64_t i = 0; i < m; i++) xv[i] = (float)(-100.0 + 200.0 * (double)i / (double)m);
        float sp[] = {NAN, INFINITY, -INFINITY, -88.0f, 89.0f, -87.99f, 88.99f, 0.0f, -0.0f, 1e-40f, -1e-40f,
                      0.34657359f, -0.34657359f, 88.3762626647949f, -87.3365478515625f, 3e38f};
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) xv[m + (int64_t)i] = sp[i];
        int64_t total = m + (int64_t)(sizeof sp / sizeof sp[0]);
        kiln_k_exp(xv, yv, total);
        int64_t diff = 0;
        for (int64_t i = 0; i < total; i++) {
            float ref = kiln_expf_fast(xv[i]);
            diff += memcmp(&ref, &yv[i], sizeof ref) != 0;
        }
        CHECK(diff == 0, "kiln_k_exp differs from kiln_expf_fast in %lld of %lld values", (long long)diff,
              (long long)total);
        free(xv);
        free(yv);
    }
    /* the same through a vectorised loop */
    {
        float xv[64], yv[64];
        for (int i = 0; i < 64; i++) xv[i] = (float)(i - 32) * 0.7f;
        xv[3] = NAN, xv[5] = -INFINITY, xv[7] = INFINITY, xv[9] = -88.5f, xv[11] = 88.5f;
#pragma omp simd
        for (int i = 0; i < 64; i++) yv[i] = kiln_expf_fast(xv[i]);
        int bad = 0;
        for (int i = 0; i < 64; i++) {
            if (i == 3) bad += !isnan(yv[i]);
            else if (i == 5 || i == 9) bad += yv[i] != 0.0f;
            else if (i == 7 || i == 11) bad += !isinf(yv[i]);
            else bad += fabs(yv[i] - exp((double)xv[i])) > 5e-7 * exp((double)xv[i]);
        }
        CHECK(bad == 0, "vectorised expf_fast: %d wrong", bad);
    }
    printf("  expf_fast: max rel err %.3g\n", worst);
}

/* ---- element-wise ------------------------------------------------------ */
static void test_elementwise(void) {
    const int64_t sizes[] = {1, 5, 37, 1000, 100003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        float *a = frand(n, -3, 3), *b = frand(n, -3, 3), *o = frand(n, 0, 1);
        double *r = dalloc(n);
        char what[64];
        kiln_k_add(a, b, o, n);
        for (int64_t i = 0; i < n; i++) r[i] = (double)a[i] + b[i];
        snprintf(what, sizeof what, "add n=%lld", (long long)n);
        CHECK_CLOSE(o, r, n, 1e-7, 1e-7, what);
        kiln_k_mul(a, b, o, n);
        for (int64_t i = 0; i < n; i++) r[i] = (double)a[i] * b[i];
        snprintf(what, sizeof what, "mul n=%lld", (long long)n);
        CHECK_CLOSE(o, r, n, 1e-7, 1e-7, what);
        kiln_k_scale(a, 0.37f, o, n);
        for (int64_t i = 0; i < n; i++) r[i] = (double)a[i] * 0.37f;
        snprintf(what, sizeof what, "scale n=%lld", (long long)n);
        CHECK_CLOSE(o, r, n, 1e-7, 1e-7, what);
        memcpy(o, b, (size_t)n * sizeof(float));
        kiln_k_axpy(-1.25f, a, o, n);
        for (int64_t i = 0; i < n; i++) r[i] = (double)b[i] - 1.25 * a[i];
        snprintf(what, sizeof what, "axpy n=%lld", (long long)n);
        CHECK_CLOSE(o, r, n, 1e-6, 1e-6, what);

        float *x = frand(n, -20, 20);
        if (n > 3) x[0] = -95.0f, x[1] = 95.0f, x[2] = 0.0f;
        kiln_k_silu(x, o, n);
        for (int64_t i = 0; i < n; i++) r[i] = x[i] / (1.0 + exp(-(double)x[i]));
        snprintf(what, sizeof what, "silu n=%lld", (long long)n);
        CHECK_CLOSE(o, r, n, 2e-6, 1e-30, what);
        kiln_k_silu_backward(x, b, o, n);
        for (int64_t i = 0; i < n; i++) {
            double s = 1.0 / (1.0 + exp(-(double)x[i]));
            r[i] = b[i] * (s + x[i] * s * (1.0 - s));
        }
        snprintf(what, sizeof what, "silu_backward n=%lld", (long long)n);
        CHECK_CLOSE(o, r, n, 1e-5, 1e-6, what);
        /* in place */
        float *xi = fcopy(x, n);
        kiln_k_silu(xi, xi, n);
        kiln_k_silu(x, o, n);
        CHECK(memcmp(xi, o, (size_t)n * sizeof(float)) == 0, "silu in place n=%lld",
              (long long)n);
        free(xi);
        free(a), free(b), free(o), free(x), free(r);
    }
}

static void test_reductions(void) {
    const int64_t sizes[] = {0, 1, 5, 37, 4097, 1000003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        float *x = frand(n, -1, 2);
        long double s = 0, q = 0;
        for (int64_t i = 0; i < n; i++) s += x[i], q += (long double)x[i] * x[i];
        double gs = kiln_k_sum(x, n), gq = kiln_k_sumsq(x, n);
        CHECK(fabs(gs - (double)s) <= 1e-12 * (1 + fabs((double)s)), "sum n=%lld: %.17g vs %.17g",
              (long long)n, gs, (double)s);
        CHECK(fabs(gq - (double)q) <= 1e-12 * (1 + (double)q), "sumsq n=%lld", (long long)n);
        threads(1);
        double s1 = kiln_k_sum(x, n), q1 = kiln_k_sumsq(x, n);
        threads(2);
        double s2 = kiln_k_sum(x, n), q2 = kiln_k_sumsq(x, n);
        threads(nthreads_max);
        CHECK(s1 == s2 && q1 == q2, "sum/sumsq differ between 1 and 2 threads n=%lld",
              (long long)n);
        free(x);
    }
}

/* ---- rmsnorm ----------------------------------------------------------- */
static void rms_ref(const double *x, const double *w, double *y, int64_t rows, int64_t dim,
                    double eps) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t j = 0; j < dim; j++) ss += x[r * dim + j] * x[r * dim + j];
        double rs = 1.0 / sqrt(ss / dim + eps);
        for (int64_t j = 0; j < dim; j++) y[r * dim + j] = x[r * dim + j] * rs * w[j];
    }
}
static void rms_bwd_ref(const double *x, const double *w, const double *dy, double *dx,
                        double *dw, int64_t rows, int64_t dim, double eps) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * dim, *dyr = dy + r * dim;
        double ss = 0, dot = 0;
        for (int64_t j = 0; j < dim; j++) ss += xr[j] * xr[j];
        double rs = 1.0 / sqrt(ss / dim + eps);
        for (int64_t j = 0; j < dim; j++) dot += dyr[j] * w[j] * xr[j] * rs;
        for (int64_t j = 0; j < dim; j++) {
            dx[r * dim + j] = rs * (dyr[j] * w[j] - xr[j] * rs * dot / dim);
            dw[j] += dyr[j] * xr[j] * rs;
        }
    }
}
static double rms_obj(const double *x, const double *w, const double *dy, int64_t rows,
                      int64_t dim, double eps) {
    double *y = dalloc(rows * dim), s = 0;
    rms_ref(x, w, y, rows, dim, eps);
    for (int64_t i = 0; i < rows * dim; i++) s += y[i] * dy[i];
    free(y);
    return s;
}
static double *todouble(const float *x, int64_t n) {
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void test_rmsnorm(void) {
    const int64_t shapes[][2] = {{37, 24}, {37, 5}, {37, 1}, {1, 24}, {300, 200}, {5, 2048}};
    const float eps = 1e-5f;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], dim = shapes[si][1], n = rows * dim;
        float *x = frand(n, -2, 2), *w = frand(dim, 0.5, 1.5), *dy = frand(n, -1, 1);
        float *y = frand(n, 0, 1), *dx = frand(n, 0, 1), *dw = frand(dim, -1, 1);
        double *xd = todouble(x, n), *wd = todouble(w, dim), *dyd = todouble(dy, n);
        double *yr = dalloc(n), *dxr = dalloc(n), *dwr = todouble(dw, dim);
        char what[96];
        rms_ref(xd, wd, yr, rows, dim, eps);
        kiln_k_rmsnorm(x, w, y, rows, dim, eps);
        snprintf(what, sizeof what, "rmsnorm %lldx%lld", (long long)rows, (long long)dim);
        CHECK_CLOSE(y, yr, n, 1e-5, 1e-6, what);
        rms_bwd_ref(xd, wd, dyd, dxr, dwr, rows, dim, eps);
        kiln_k_rmsnorm_backward(x, w, dy, dx, dw, rows, dim, eps);
        snprintf(what, sizeof what, "rmsnorm_backward dx %lldx%lld", (long long)rows,
                 (long long)dim);
        CHECK_CLOSE(dx, dxr, n, 1e-4, 1e-5, what);
        snprintf(what, sizeof what, "rmsnorm_backward dw %lldx%lld", (long long)rows,
                 (long long)dim);
        CHECK_CLOSE(dw, dwr, dim, 1e-4, 1e-4, what);
        /* NULL dw gives the same dx */
        float *dx2 = frand(n, 0, 1);
        kiln_k_rmsnorm_backward(x, w, dy, dx2, NULL, rows, dim, eps);
        CHECK(memcmp(dx, dx2, (size_t)n * sizeof(float)) == 0, "dx with dw=NULL differs");
        /* NULL dx gives the same dw */
        float *dw3 = frand(dim, -1, 1), *dw4 = fcopy(dw3, dim);
        kiln_k_rmsnorm_backward(x, w, dy, dx2, dw3, rows, dim, eps);
        kiln_k_rmsnorm_backward(x, w, dy, NULL, dw4, rows, dim, eps);
        CHECK(memcmp(dw3, dw4, (size_t)dim * sizeof(float)) == 0, "dw with dx=NULL differs");
        free(dw3), free(dw4);
        /* in place: y = x, dx = dy */
        float *xi = fcopy(x, n), *dyi = fcopy(dy, n);
        kiln_k_rmsnorm(xi, w, xi, rows, dim, eps);
        CHECK(memcmp(xi, y, (size_t)n * sizeof(float)) == 0, "rmsnorm in place differs");
        kiln_k_rmsnorm_backward(x, w, dyi, dyi, NULL, rows, dim, eps);
        CHECK(memcmp(dyi, dx, (size_t)n * sizeof(float)) == 0, "rmsnorm bwd in place differs");
        free(xi), free(dyi), free(dx2);
        free(x), free(w), free(dy), free(y), free(dx), free(dw);
        free(xd), free(wd), free(dyd), free(yr), free(dxr), free(dwr);
    }

    /* the analytic double reference against central differences */
    {
        int64_t rows = 3, dim = 7, n = rows * dim;
        double eps = 1e-5, h = 1e-6, worst = 0;
        double *x = dalloc(n), *w = dalloc(dim), *dy = dalloc(n), *dx = dalloc(n),
               *dw = dalloc(dim);
        for (int64_t i = 0; i < n; i++) x[i] = 4 * urand() - 2, dy[i] = 2 * urand() - 1;
        for (int64_t j = 0; j < dim; j++) w[j] = 0.5 + urand();
        rms_bwd_ref(x, w, dy, dx, dw, rows, dim, eps);
        for (int64_t i = 0; i < n; i++) {
            double s = x[i];
            x[i] = s + h;
            double fp = rms_obj(x, w, dy, rows, dim, eps);
            x[i] = s - h;
            double fm = rms_obj(x, w, dy, rows, dim, eps);
            x[i] = s;
            worst = fmax(worst, fabs((fp - fm) / (2 * h) - dx[i]) / (1e-6 + fabs(dx[i])));
        }
        for (int64_t j = 0; j < dim; j++) {
            double s = w[j];
            w[j] = s + h;
            double fp = rms_obj(x, w, dy, rows, dim, eps);
            w[j] = s - h;
            double fm = rms_obj(x, w, dy, rows, dim, eps);
            w[j] = s;
            worst = fmax(worst, fabs((fp - fm) / (2 * h) - dw[j]) / (1e-6 + fabs(dw[j])));
        }
        CHECK(worst < 1e-6, "rmsnorm backward vs finite differences: rel %.3g", worst);
        /* and the float kernel on the same numbers */
        float xf[21], wf[7], dyf[21], dxf[21], dwf[7] = {0};
        double xd[21], wdd[7], dyd[21], dxd[21], dwd[7] = {0};
        for (int64_t i = 0; i < n; i++) xf[i] = (float)x[i], dyf[i] = (float)dy[i];
        for (int64_t j = 0; j < dim; j++) wf[j] = (float)w[j];
        for (int64_t i = 0; i < n; i++) xd[i] = xf[i], dyd[i] = dyf[i];
        for (int64_t j = 0; j < dim; j++) wdd[j] = wf[j];
        rms_bwd_ref(xd, wdd, dyd, dxd, dwd, rows, dim, eps);
        kiln_k_rmsnorm_backward(xf, wf, dyf, dxf, dwf, rows, dim, (float)eps);
        CHECK_CLOSE(dxf, dxd, n, 1e-5, 1e-6, "rmsnorm_backward small dx");
        CHECK_CLOSE(dwf, dwd, dim, 1e-5, 1e-6, "rmsnorm_backward small dw");
        free(x), free(w), free(dy), free(dx), free(dw);
    }

    /* dw identical for 1 and 2 threads */
    {
        int64_t rows = 1000, dim = 64, n = rows * dim;
        float *x = frand(n, -2, 2), *w = frand(dim, 0.5, 1.5), *dy = frand(n, -1, 1);
        float *dx1 = frand(n, 0, 1), *dx2 = frand(n, 0, 1);
        float *dw1 = calloc((size_t)dim, sizeof(float)), *dw2 = calloc((size_t)dim, sizeof(float));
        threads(1);
        kiln_k_rmsnorm_backward(x, w, dy, dx1, dw1, rows, dim, 1e-6f);
        threads(2);
        kiln_k_rmsnorm_backward(x, w, dy, dx2, dw2, rows, dim, 1e-6f);
        threads(nthreads_max);
        CHECK(memcmp(dw1, dw2, (size_t)dim * sizeof(float)) == 0, "rmsnorm dw 1 vs 2 threads");
        CHECK(memcmp(dx1, dx2, (size_t)n * sizeof(float)) == 0, "rmsnorm dx 1 vs 2 threads");
        free(x), free(w), free(dy), free(dx1), free(dx2), free(dw1), free(dw2);
    }
}

/* ---- rope -------------------------------------------------------------- */
static void rope_ref(const float *x, double *out, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t pos0, float theta, bool inverse) {
    int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + ((b * T + t) * H + h) * D;
                double *o = out + ((b * T + t) * H + h) * D;
                for (int64_t j = 0; j < half; j++) {
                    /* the angle as HF forms it in fp32, then exact cos/sin */
                    float inv = (float)(1.0 / pow((double)theta, (double)(2 * j) / (double)D));
                    double a = (double)((float)(pos0 + t) * inv);
                    double c = cos(a), s = inverse ? -sin(a) : sin(a);
                    o[j] = xr[j] * c - xr[j + half] * s;
                    o[j + half] = xr[j + half] * c + xr[j] * s;
                }
            }
}

static void test_rope(void) {
    const int64_t shapes[][5] = {{2, 37, 3, 24, 0}, {1, 5, 1, 2, 7}, {2, 128, 4, 64, 3},
                                 {1, 3, 2, 8, 4000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t B = shapes[si][0], T = shapes[si][1], H = shapes[si][2], D = shapes[si][3],
                pos0 = shapes[si][4], n = B * T * H * D;
        float theta = si == 2 ? 500000.0f : 10000.0f;
        float *x = frand(n, -2, 2), *y = frand(n, 0, 1), *z = frand(n, 0, 1);
        double *r = dalloc(n);
        char what[96];
        for (int inv = 0; inv < 2; inv++) {
            rope_ref(x, r, B, T, H, D, pos0, theta, inv);
            kiln_k_rope(x, y, B, T, H, D, pos0, theta, inv);
            snprintf(what, sizeof what, "rope%s B%lld T%lld H%lld D%lld pos0 %lld",
                     inv ? " inverse" : "", (long long)B, (long long)T, (long long)H,
                     (long long)D, (long long)pos0);
            /* cosf/sinf of large angles: ~1 ulp of the angle */
            CHECK_CLOSE(y, r, n, 1e-5, 1e-5, what);
        }
        kiln_k_rope(x, y, B, T, H, D, pos0, theta, false);
        kiln_k_rope(y, z, B, T, H, D, pos0, theta, true);
        double *xd = todouble(x, n);
        snprintf(what, sizeof what, "rope inverse undoes rope D%lld", (long long)D);
        CHECK_CLOSE(z, xd, n, 1e-5, 1e-5, what);
        /* in place */
        float *xi = fcopy(x, n);
        kiln_k_rope(xi, xi, B, T, H, D, pos0, theta, false);
        CHECK(memcmp(xi, y, (size_t)n * sizeof(float)) == 0, "rope in place differs");
        free(xi), free(xd), free(x), free(y), free(z), free(r);
    }
}

/* The cos/sin table kept from one call to the next (rope.c): calls whose
 * positions lie inside the kept rows reuse them, others (positions past
 * them, other frequencies, another head size) rebuild it; each against the
 * reference, and a repeated call gives the first one's bits. */
static void test_rope_kept_table(void) {
    const struct { int64_t T, D, pos0; float theta; } calls[] = {
        {40, 16, 0, 10000.0f}, {10, 16, 5, 10000.0f},  {20, 16, 30, 10000.0f}, {40, 16, 0, 500000.0f},
        {40, 32, 0, 10000.0f}, {40, 16, 0, 10000.0f}};
    const int64_t B = 2, H = 3;
    float *first = NULL, *x0 = NULL;
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        const int64_t T = calls[c].T, D = calls[c].D, n = B * T * H * D;
        float *x = frand(n, -2, 2), *y = frand(n, 0, 1);
        double *r = dalloc(n);
        rope_ref(x, r, B, T, H, D, calls[c].pos0, calls[c].theta, false);
        kiln_k_rope(x, y, B, T, H, D, calls[c].pos0, calls[c].theta, false);
        char what[96];
        snprintf(what, sizeof what, "rope call %zu after others: T%lld D%lld pos0 %lld theta %g", c, (long long)T,
                 (long long)D, (long long)calls[c].pos0, (double)calls[c].theta);
        CHECK_CLOSE(y, r, n, 1e-5, 1e-5, what);
        if (c == 0) first = fcopy(y, n), x0 = fcopy(x, n);
        if (c == sizeof calls / sizeof calls[0] - 1) { /* call 0's shape again: its input again */
            float *again = frand(n, 0, 1);
            kiln_k_rope(x0, again, B, T, H, D, calls[c].pos0, calls[c].theta, false);
            CHECK(memcmp(first, again, (size_t)n * sizeof(float)) == 0, "rope: the first call repeated gives other bits");
            free(again);
        }
        /* positions given one by one (rope_freq_pos) against the same from pos0 */
        float *inv = malloc((size_t)(D / 2) * sizeof(float)), *z = frand(n, 0, 1);
        int32_t *pos = malloc((size_t)(B * T) * sizeof(int32_t));
        for (int64_t i = 0; i < B * T; i++) pos[i] = (int32_t)(calls[c].pos0 + i % T);
        kiln_k_rope_inv_freq(D, calls[c].theta, KILN_K_ROPE_DEFAULT, 1, 1, 1, 1, inv);
        kiln_k_rope_freq_pos(x, z, B, T, H, D, pos, inv, false);
        CHECK(memcmp(z, y, (size_t)n * sizeof(float)) == 0, "rope_freq_pos differs from rope at positions %lld.. (call %zu)",
              (long long)calls[c].pos0, c);
        free(inv), free(z), free(pos), free(x), free(y), free(r);
    }
    free(first), free(x0);
}

/* ---- softmax ----------------------------------------------------------- */
static void test_softmax(void) {
    const int64_t shapes[][2] = {{37, 24}, {37, 5}, {37, 1}, {300, 300}, {4, 8192}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], n = shapes[si][1], N = rows * n;
        float *x = frand(N, -30, 30), *y = frand(N, 0, 1), *dy = frand(N, -1, 1),
              *dx = frand(N, 0, 1);
        /* masked entries: a causal-like pattern, and row 1 fully masked */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++)
                if (j > r + 1 && (r + j) % 3 == 0) x[r * n + j] = -INFINITY;
        for (int64_t j = 0; j < n; j++) x[1 * n + j] = -INFINITY;
        double *ry = dalloc(N), *rdx = dalloc(N);
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < n; j++) m = fmax(m, xr[j]);
            if (m == -INFINITY) continue; /* zeros */
            for (int64_t j = 0; j < n; j++) s += exp(xr[j] - m);
            for (int64_t j = 0; j < n; j++) ry[r * n + j] = exp(xr[j] - m) / s;
        }
        kiln_k_softmax(x, y, rows, n);
        char what[64];
        snprintf(what, sizeof what, "softmax %lldx%lld", (long long)rows, (long long)n);
        /* x - max rounds to half an ulp of |x|, which exp turns into relative
         * error: float softmax of logits up to 60 apart is good to ~4e-6 */
        CHECK_CLOSE(y, ry, N, 1e-5, 1e-37, what);
        int bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t j = 0; j < n; j++) s += y[r * n + j];
            if (r == 1 ? s != 0.0 : fabs(s - 1.0) > 1e-5) bad++;
        }
        CHECK(bad == 0, "softmax %lldx%lld: %d rows do not sum to 1 (row 1 to 0)",
              (long long)rows, (long long)n, bad);
        for (int64_t r = 0; r < rows; r++) {
            double dot = 0;
            for (int64_t j = 0; j < n; j++) dot += (double)dy[r * n + j] * y[r * n + j];
            for (int64_t j = 0; j < n; j++)
                rdx[r * n + j] = (double)y[r * n + j] * (dy[r * n + j] - dot);
        }
        kiln_k_softmax_backward(y, dy, dx, rows, n);
        snprintf(what, sizeof what, "softmax_backward %lldx%lld", (long long)rows,
                 (long long)n);
        CHECK_CLOSE(dx, rdx, N, 1e-5, 1e-6, what);
        float *xi = fcopy(x, N);
        kiln_k_softmax(xi, xi, rows, n);
        CHECK(memcmp(xi, y, (size_t)N * sizeof(float)) == 0, "softmax in place differs");
        free(xi), free(x), free(y), free(dy), free(dx), free(ry), free(rdx);
    }
    float nanrow[4] = {1.0f, NAN, 2.0f, 0.0f}, out[4];
    kiln_k_softmax(nanrow, out, 1, 4);
    CHECK(isnan(out[0]) && isnan(out[2]), "softmax: NaN in a row must give NaN");
}

/* ---- embedding --------------------------------------------------------- */
static void test_embedding(void) {
    const int64_t cases[][3] = {{37, 24, 11}, {5, 1, 3}, {200, 512, 50}, {1000, 100, 7}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t n = cases[ci][0], dim = cases[ci][1], vocab = cases[ci][2];
        float *W = frand(vocab * dim, -1, 1), *out = frand(n * dim, 0, 1);
        int32_t *ids = malloc((size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(urand() * (double)vocab);
        ids[0] = ids[n - 1]; /* repeated for sure */
        kiln_k_embedding(W, ids, out, n, dim);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += memcmp(out + i * dim, W + ids[i] * dim, (size_t)dim * sizeof(float)) != 0;
        CHECK(bad == 0, "embedding n=%lld dim=%lld: %d rows wrong", (long long)n,
              (long long)dim, bad);
        float *dout = frand(n * dim, -1, 1), *dW0 = frand(vocab * dim, -1, 1);
        float *dW1 = fcopy(dW0, vocab * dim), *dW2 = fcopy(dW0, vocab * dim);
        float *ser = fcopy(dW0, vocab * dim);
        double *ref = todouble(dW0, vocab * dim);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < dim; j++) {
                ref[ids[i] * dim + j] += dout[i * dim + j];
                ser[ids[i] * dim + j] += dout[i * dim + j];
            }
        threads(1);
        kiln_k_embedding_backward(dout, ids, dW1, n, dim, vocab);
        threads(2);
        kiln_k_embedding_backward(dout, ids, dW2, n, dim, vocab);
        threads(nthreads_max);
        char what[64];
        snprintf(what, sizeof what, "embedding_backward n=%lld dim=%lld", (long long)n,
                 (long long)dim);
        CHECK_CLOSE(dW2, ref, vocab * dim, 1e-5, 1e-5, what);
        CHECK(memcmp(dW1, dW2, (size_t)(vocab * dim) * sizeof(float)) == 0,
              "embedding_backward 1 vs 2 threads");
        CHECK(memcmp(ser, dW2, (size_t)(vocab * dim) * sizeof(float)) == 0,
              "embedding_backward differs from serial order");
        free(W), free(out), free(ids), free(dout), free(dW0), free(dW1), free(dW2), free(ser),
            free(ref);
    }
}

/* ---- cross-entropy ----------------------------------------------------- */
static void test_cross_entropy(void) {
    const int64_t shapes[][2] = {{37, 24}, {37, 5}, {37, 1}, {64, 1000}, {3, 8192}};
    const int32_t ign = KILN_IGNORE_INDEX;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t n = shapes[si][0], V = shapes[si][1], N = n * V;
        float *x = frand(N, -8, 8), *d = frand(N, 0, 1), *dexp = frand(N, 0, 1);
        int32_t *t = malloc((size_t)n * sizeof(int32_t));
        int64_t want = 0;
        for (int64_t i = 0; i < n; i++) {
            t[i] = i % 4 == 2 ? ign : (int32_t)(urand() * (double)V);
            want += t[i] != ign;
        }
        double *rd = dalloc(N), ref = 0;
        const float g = 0.0375f;
        for (int64_t i = 0; i < n; i++) {
            if (t[i] == ign) continue;
            const float *xr = x + i * V;
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < V; j++) m = fmax(m, xr[j]);
            for (int64_t j = 0; j < V; j++) s += exp(xr[j] - m);
            ref += m + log(s) - xr[t[i]];
            for (int64_t j = 0; j < V; j++)
                rd[i * V + j] = g * (exp(xr[j] - m) / s - (j == t[i]));
        }
        int64_t cnt = -1;
        double loss = kiln_k_cross_entropy(x, t, n, V, ign, &cnt);
        CHECK(cnt == want, "cross_entropy count %lld, want %lld", (long long)cnt,
              (long long)want);
        CHECK(fabs(loss - ref) <= 1e-6 * fabs(ref) + 1e-6, "cross_entropy %lldx%lld: %.9g vs %.9g",
              (long long)n, (long long)V, loss, ref);
        kiln_k_cross_entropy_backward(x, t, g, d, n, V, ign);
        char what[64];
        snprintf(what, sizeof what, "cross_entropy_backward %lldx%lld", (long long)n,
                 (long long)V);
        /* p - 1 at the target cancels: absolute error ~ g ulp(1) */
        CHECK_CLOSE(d, rd, N, 1e-5, 1e-6 * g, what);
        int nz = 0;
        for (int64_t i = 0; i < n; i++)
            if (t[i] == ign)
                for (int64_t j = 0; j < V; j++) nz += d[i * V + j] != 0.0f;
        CHECK(nz == 0, "cross_entropy_backward: %d nonzeros in ignored rows", nz);
        /* in place */
        float *xi = fcopy(x, N);
        kiln_k_cross_entropy_backward(xi, t, g, xi, n, V, ign);
        CHECK(memcmp(xi, d, (size_t)N * sizeof(float)) == 0, "ce backward in place differs");
        /* thread count does not change the loss */
        threads(1);
        double l1 = kiln_k_cross_entropy(x, t, n, V, ign, NULL);
        threads(2);
        double l2 = kiln_k_cross_entropy(x, t, n, V, ign, NULL);
        threads(nthreads_max);
        CHECK(l1 == l2, "cross_entropy 1 vs 2 threads: %.17g vs %.17g", l1, l2);
        free(xi), free(x), free(d), free(dexp), free(t), free(rd);
    }
    /* all rows ignored */
    float x[6] = {1, 2, 3, 4, 5, 6};
    int32_t t[2] = {ign, ign};
    int64_t cnt = -1;
    double l = kiln_k_cross_entropy(x, t, 2, 3, ign, &cnt);
    CHECK(cnt == 0 && l == 0.0, "all-ignored: count %lld loss %g", (long long)cnt, l);
    /* a NaN logit in a counted row shows in the loss */
    x[1] = NAN;
    t[0] = 0;
    l = kiln_k_cross_entropy(x, t, 2, 3, ign, &cnt);
    CHECK(isnan(l) && cnt == 1, "NaN logit must give a NaN loss");
}

/* ---- adamw ------------------------------------------------------------- */
static void test_adamw(void) {
    const int64_t sizes[] = {1, 37, 100003};
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        float *p = frand(n, -1, 1), *m = calloc((size_t)n, sizeof(float)),
              *v = calloc((size_t)n, sizeof(float));
        double *pd = todouble(p, n), *md = dalloc(n), *vd = dalloc(n);
        float *g = malloc((size_t)n * sizeof(float));
        for (int step = 1; step <= 3; step++) {
            for (int64_t i = 0; i < n; i++) g[i] = (float)(urand() * 2 - 1) * (i % 7 ? 1 : 1e-3f);
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            kiln_k_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, (float)bc1, (float)bc2);
            for (int64_t i = 0; i < n; i++) {
                pd[i] *= 1 - (double)lr * wd;
                md[i] = b1 * md[i] + (1 - (double)b1) * g[i];
                vd[i] = b2 * vd[i] + (1 - (double)b2) * g[i] * g[i];
                pd[i] -= lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + eps);
            }
        }
        char what[64];
        snprintf(what, sizeof what, "adamw p n=%lld", (long long)n);
        CHECK_CLOSE(p, pd, n, 1e-5, 1e-6, what);
        snprintf(what, sizeof what, "adamw m n=%lld", (long long)n);
        CHECK_CLOSE(m, md, n, 1e-5, 1e-7, what);
        snprintf(what, sizeof what, "adamw v n=%lld", (long long)n);
        CHECK_CLOSE(v, vd, n, 1e-5, 1e-12, what);
        free(p), free(m), free(v), free(pd), free(md), free(vd), free(g);
    }
}

#if defined(__AVX512F__)
#include "../src/kernels/simd/simd_exp.h"
/* kiln_exp16_le0 (the flash forward's softmax on AVX-512) against
 * kiln_expf_fast: the same bits from -86.5 to 0; below, down to -inf, the
 * normal number e^-86.5 (never a denormal: those take a microcode assist);
 * NaN kept. */
static void test_exp_le0(void) {
    const int64_t m = (int64_t)1 << 21;
    int64_t differ = 0, n_same = 0, floor_bad = 0;
    const float floor_v = kiln_expf_fast(-86.5f);
    for (int64_t i = 0; i < m; i += 16) {
        float x[16], y[16];
        for (int l = 0; l < 16; l++) x[l] = (float)(-112.0 + 112.0 * (double)(i + l) / (double)(m - 1));
        _mm512_storeu_ps(y, kiln_exp16_le0(_mm512_loadu_ps(x)));
        for (int l = 0; l < 16; l++) {
            const float want = x[l] >= -86.5f ? kiln_expf_fast(x[l]) : floor_v;
            differ += memcmp(&y[l], &want, sizeof want) != 0;
            n_same += x[l] >= -86.5f;
            floor_bad += !(y[l] >= FLT_MIN);
        }
    }
    float sp[16] = {-INFINITY, NAN, 0.0f, -0.0f, -1e-40f, -1e30f, -3e38f, -86.5f, -0.34657359f, -1.0f, -10.0f, -50.0f, -86.4f, -86.6f, -200.0f, -87.0f};
    float ys[16];
    _mm512_storeu_ps(ys, kiln_exp16_le0(_mm512_loadu_ps(sp)));
    printf("exp16_le0: %lld of %lld arguments (%lld in [-86.5, 0]) differ from kiln_expf_fast or the floor e^-86.5 = %.3g; "
           "%lld results below FLT_MIN\n", (long long)differ, (long long)m, (long long)n_same, (double)floor_v, (long long)floor_bad);
    CHECK(differ == 0 && n_same > 1000000, "kiln_exp16_le0: kiln_expf_fast's bits on [-86.5, 0], e^-86.5 below (%lld differ)",
          (long long)differ);
    CHECK(floor_bad == 0 && floor_v >= FLT_MIN && ys[0] == floor_v && ys[6] == floor_v && ys[14] == floor_v,
          "kiln_exp16_le0: never a denormal, -inf gives the floor");
    CHECK(isnan(ys[1]) && ys[2] == 1.0f && ys[3] == 1.0f && ys[4] == 1.0f && ys[7] == floor_v, "kiln_exp16_le0: NaN, 0, -0, -1e-40");
}
#else
static void test_exp_le0(void) { printf("exp16_le0: skipped (this build has no AVX-512 form)\n"); }
#endif

int main(void) {
    nthreads_max = omp_get_max_threads();
    test_exp();
    test_exp_le0();
    test_elementwise();
    test_reductions();
    test_rmsnorm();
    test_rope();
    test_rope_kept_table();
    test_softmax();
    test_embedding();
    test_cross_entropy();
    test_adamw();
    TEST_END();
}
