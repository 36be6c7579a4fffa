/* Fused kernels for the compiler: flash attention (forward and backward) and
 * fused linear + cross-entropy, against double-precision references of the
 * decomposed computations, central finite differences, and 1-vs-N-thread
 * bitwise determinism. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kernels.h"
#include "kiln/simd.h"
#include "test.h"

static uint64_t g_seed = 12345;
static double urand(void) {
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_seed >> 11) / 9007199254740992.0;
}
static float *frand(int64_t n, double lo, double hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
    return p;
}
static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }
static float *falloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

/* max |a-b| / max |b| (absolute when the reference is all zero) */
static double rel_err_d(const float *a, const double *b, int64_t n) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return m > 0 ? e / m : e;
}

typedef struct {
    int64_t B, H, Hkv, T, Tk, D;
    float scale;
    const int32_t *pad;
    int64_t window; /* sliding window (0: none) */
} att_shape;

static bool visible(const att_shape *s, int64_t b, int64_t i, int64_t j) {
    int64_t p = s->Tk - s->T + i;
    return j <= p && (!s->window || p - j < s->window) && (!s->pad || s->pad[b * s->Tk + j]);
}

/* The decomposed computation in double: scores, mask, softmax, weighted
 * sum; and, when dout is given, its analytic backward through the softmax. */
static void ref_attn(const att_shape *s, const float *q, const float *k, const float *v,
                     const float *dout, double *out, double *lse, double *dq, double *dk,
                     double *dv) {
    const int64_t D = s->D, Tk = s->Tk, grp = s->H / s->Hkv;
    double *p = dalloc(Tk), *dp = dalloc(Tk);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < s->T; i++) {
                const int64_t qi = (b * s->H + h) * s->T + i, kv0 = (b * s->Hkv + h / grp) * Tk;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    p[j] = -INFINITY;
                    if (!visible(s, b, i, j)) continue;
                    double d = 0;
                    for (int64_t c = 0; c < D; c++) d += (double)q[qi * D + c] * k[(kv0 + j) * D + c];
                    p[j] = d * s->scale;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j < Tk; j++) {
                    p[j] = mx == -INFINITY || p[j] == -INFINITY ? 0 : exp(p[j] - mx);
                    sum += p[j];
                }
                lse[qi] = sum > 0 ? mx + log(sum) : -INFINITY;
                for (int64_t c = 0; c < D; c++) {
                    double o = 0;
                    for (int64_t j = 0; j < Tk; j++)
                        if (sum > 0) o += p[j] / sum * v[(kv0 + j) * D + c];
                    out[qi * D + c] = o;
                }
                if (!dout || sum == 0) continue;
                double dot = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    p[j] /= sum;
                    dp[j] = 0;
                    for (int64_t c = 0; c < D; c++) dp[j] += (double)dout[qi * D + c] * v[(kv0 + j) * D + c];
                    dot += p[j] * dp[j];
                }
                for (int64_t j = 0; j < Tk; j++) {
                    double ds = p[j] * (dp[j] - dot) * s->scale;
                    for (int64_t c = 0; c < D; c++) {
                        dv[(kv0 + j) * D + c] += p[j] * dout[qi * D + c];
                        dq[qi * D + c] += ds * k[(kv0 + j) * D + c];
                        dk[(kv0 + j) * D + c] += ds * q[qi * D + c];
                    }
                }
            }
    free(p), free(dp);
}

static void flash(const att_shape *s, const float *q, const float *k, const float *v, float *out,
                  float *lse) {
    if (s->window)
        kiln_k_flash_attn_win(q, k, v, s->pad, NULL, out, lse, s->B, s->H, s->Hkv, s->T, s->Tk, s->D, s->scale, s->window);
    else
        kiln_k_flash_attn(q, k, v, s->pad, out, lse, s->B, s->H, s->Hkv, s->T, s->Tk, s->D, s->scale);
}

/* Forward and backward of one case against the double reference. */
static void check_attn(const char *name, const att_shape *s) {
    const int64_t nq = s->B * s->H * s->T * s->D, nk = s->B * s->Hkv * s->Tk * s->D;
    const int64_t nl = s->B * s->H * s->T;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1), *g = frand(nq, -1, 1);
    float *out = falloc(nq), *lse = falloc(nl), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
    double *ro = dalloc(nq), *rl = dalloc(nl), *rdq = dalloc(nq), *rdk = dalloc(nk), *rdv = dalloc(nk);
    ref_attn(s, q, k, v, g, ro, rl, rdq, rdk, rdv);
    flash(s, q, k, v, out, lse);
    double eo = rel_err_d(out, ro, nq);
    CHECK(eo < 1e-5, "%s: out rel err %.3g", name, eo);
    double el = 0;
    int inf_ok = 1;
    for (int64_t i = 0; i < nl; i++) {
        if (rl[i] == -INFINITY) {
            inf_ok &= lse[i] == -INFINITY;
            for (int64_t c = 0; c < s->D; c++) inf_ok &= out[i * s->D + c] == 0.0f;
        } else {
            el = fmax(el, fabs(lse[i] - rl[i]) / fmax(1.0, fabs(rl[i])));
        }
    }
    CHECK(el < 1e-5, "%s: lse err %.3g", name, el);
    CHECK(inf_ok, "%s: rows without visible keys must give lse -inf and zeros", name);
    kiln_k_flash_attn_backward_win(q, k, v, s->pad, NULL, out, lse, g, dq, dk, dv, s->B, s->H, s->Hkv, s->T, s->Tk, s->D,
                                   s->scale, s->window);
    double e1 = rel_err_d(dq, rdq, nq), e2 = rel_err_d(dk, rdk, nk), e3 = rel_err_d(dv, rdv, nk);
    CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5, "%s: grad rel err dq %.3g dk %.3g dv %.3g", name, e1,
          e2, e3);
    free(q), free(k), free(v), free(g), free(out), free(lse), free(dq), free(dk), free(dv);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
}

static void test_attn_reference(void) {
    const int64_t Tk = 37;
    int32_t pad[2 * 37];
    for (int64_t i = 0; i < 2 * Tk; i++) pad[i] = 1;
    pad[Tk + 3] = 0; /* batch 1: a padding key inside and a padded tail */
    for (int64_t j = 32; j < Tk; j++) pad[Tk + j] = 0;
    att_shape s = {2, 4, 2, 37, 37, 24, 0.2f, NULL, 0};
    check_attn("T=Tk=37", &s);
    s.pad = pad;
    check_attn("T=Tk=37 padded", &s);
    s.T = 5; /* decoding against a cache */
    check_attn("T=5 Tk=37 padded", &s);
    s.T = 1;
    check_attn("T=1 Tk=37 padded", &s);
    /* left padding: the first queries see only padding; batch 1 all padding */
    int32_t lpad[2 * 37];
    for (int64_t j = 0; j < Tk; j++) lpad[j] = j >= 6, lpad[Tk + j] = 0;
    att_shape l = {2, 4, 2, 37, 37, 24, 0.2f, lpad, 0};
    check_attn("left padding, all-padding batch", &l);
    /* several blocks: causal skipping, diagonal tiles, tails, D > 64 */
    att_shape m = {1, 2, 1, 150, 150, 72, 0.125f, NULL, 0};
    check_attn("T=Tk=150 D=72", &m);
    int32_t *pm = malloc(2 * 200 * sizeof(int32_t));
    for (int64_t j = 0; j < 400; j++) pm[j] = !(j % 200 >= 64 && j % 200 < 128) || j < 200;
    att_shape n = {2, 2, 2, 70, 200, 64, 0.125f, pm, 0}; /* batch 1: a whole padded key block */
    check_attn("T=70 Tk=200 padded block", &n);
    att_shape o = {1, 3, 3, 130, 130, 16, 0.25f, NULL, 0};
    check_attn("T=130 D=16 MHA", &o);
    /* head sizes that end in a partial vector of the AVX2 micro-kernels
     * (16-, 8- and masked column chunks) */
    att_shape p = {1, 2, 2, 70, 70, 12, 0.3f, NULL, 0};
    check_attn("T=70 D=12", &p);
    p.D = 44;
    check_attn("T=70 D=44", &p);
    /* sliding windows: shorter than a key block, across block edges, with
     * padding, a cache (T < Tk) and a window longer than the sequence */
    static const int64_t wins[] = {1, 5, 33, 64, 100, 400};
    for (size_t i = 0; i < sizeof wins / sizeof *wins; i++) {
        char nm[80];
        att_shape w = {1, 2, 1, 150, 150, 72, 0.125f, NULL, wins[i]};
        snprintf(nm, sizeof nm, "window %lld, T=Tk=150", (long long)wins[i]);
        check_attn(nm, &w);
        att_shape wp = {2, 2, 2, 70, 200, 64, 0.125f, pm, wins[i]};
        snprintf(nm, sizeof nm, "window %lld, T=70 Tk=200 padded block", (long long)wins[i]);
        check_attn(nm, &wp);
    }
    free(pm);
}

/* Loss L = sum(out * w); gradients by 5-point central differences of the
 * float kernel, against the kernel's backward. */
static void test_attn_finite_diff(void) {
    int32_t pad[2 * 6] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0};
    att_shape s = {2, 2, 1, 4, 6, 5, 0.7f, pad, 0};
    const int64_t nq = s.B * s.H * s.T * s.D, nk = s.B * s.Hkv * s.Tk * s.D, nl = s.B * s.H * s.T;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1), *w = frand(nq, -1, 1);
    float *out = falloc(nq), *lse = falloc(nl), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
    flash(&s, q, k, v, out, lse);
    kiln_k_flash_attn_backward(q, k, v, pad, out, lse, w, dq, dk, dv, s.B, s.H, s.Hkv, s.T, s.Tk,
                               s.D, s.scale);
    float *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    int64_t ns[3] = {nq, nk, nk};
    const double eps = 1e-2, c[4] = {1.0 / 12, -8.0 / 12, 8.0 / 12, -1.0 / 12},
                 off[4] = {-2, -1, 1, 2};
    for (int a = 0; a < 3; a++) {
        double *num = dalloc(ns[a]);
        for (int64_t i = 0; i < ns[a]; i++) {
            float x0 = xs[a][i];
            double d = 0;
            for (int t = 0; t < 4; t++) {
                xs[a][i] = (float)(x0 + off[t] * eps);
                flash(&s, q, k, v, out, lse);
                double L = 0;
                for (int64_t j = 0; j < nq; j++) L += (double)out[j] * w[j];
                d += c[t] * L;
            }
            xs[a][i] = x0;
            num[i] = d / eps;
        }
        double e = rel_err_d(gs[a], num, ns[a]);
        CHECK(e < 2e-3, "finite differences, input %d: rel err %.3g", a, e);
        free(num);
    }
    free(q), free(k), free(v), free(w), free(out), free(lse), free(dq), free(dk), free(dv);
}

/* Bitwise identical results for 1, 2 and 3 threads (the backward switches
 * between its two schedules across these counts). */
static void test_attn_determinism(void) {
    int32_t *pad = malloc(2 * 150 * sizeof(int32_t));
    for (int64_t j = 0; j < 300; j++) pad[j] = j < 150 || j % 150 < 140;
    att_shape s = {2, 4, 2, 150, 150, 32, 0.17f, pad, 0};
    const int64_t nq = s.B * s.H * s.T * s.D, nk = s.B * s.Hkv * s.Tk * s.D, nl = s.B * s.H * s.T;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1), *g = frand(nq, -1, 1);
    float *res[3][5];
    int saved = omp_get_max_threads();
    for (int r = 0; r < 3; r++) {
        omp_set_num_threads(r + 1);
        float *out = falloc(nq), *lse = falloc(nl), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
        flash(&s, q, k, v, out, lse);
        kiln_k_flash_attn_backward(q, k, v, pad, out, lse, g, dq, dk, dv, s.B, s.H, s.Hkv, s.T, s.Tk,
                                   s.D, s.scale);
        res[r][0] = out, res[r][1] = lse, res[r][2] = dq, res[r][3] = dk, res[r][4] = dv;
    }
    omp_set_num_threads(saved);
    int64_t sz[5] = {nq, nl, nq, nk, nk};
    for (int r = 1; r < 3; r++)
        for (int i = 0; i < 5; i++)
            CHECK(memcmp(res[0][i], res[r][i], (size_t)sz[i] * sizeof(float)) == 0,
                  "attention output %d differs between 1 and %d threads", i, r + 1);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 5; i++) free(res[r][i]);
    free(q), free(k), free(v), free(g), free(pad);
}


/* ---- bf16 products (kiln_k_flash_attn_ex with bf16) ------------------------
 * On AMX tiles (kiln_bf16_amx) or VDPBF16PS (AVX512-BF16 in the avx512
 * form), with D a multiple of 32: against the double reference on q, k, v
 * and dout rounded to bf16 (the operands' rounding), within what rounding P
 * and dS to bf16 costs (2^-9 relative per element); bits independent of the
 * thread count. Elsewhere (bf16 emulated, or another D): the fp32 kernel's
 * bits exactly. */
static float *round_bf(const float *x, int64_t n) {
    float *y = falloc(n);
    for (int64_t i = 0; i < n; i++) y[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(x[i]));
    return y;
}
/* the product the kernels take for bf16 at head size D: "AMX",
 * "VDPBF16PS", or NULL (the fp32 kernel) */
static const char *attn_bf16_path(int64_t D) {
    if (D % 32 || !kiln_bf16_native() || kiln_form_active() != KILN_FORM_AVX512) return NULL;
    return kiln_bf16_amx() ? "AMX" : "VDPBF16PS";
}

static void check_attn_bf16(const char *name, const att_shape *s, int *amx_cases) {
    const int64_t nq = s->B * s->H * s->T * s->D, nk = s->B * s->Hkv * s->Tk * s->D, nl = s->B * s->H * s->T;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1), *g = frand(nq, -1, 1);
    float *out = falloc(nq), *lse = falloc(nl), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
    /* the kernels write every element of the gradients: NaN where one is not */
    for (int64_t i = 0; i < nq; i++) dq[i] = NAN;
    for (int64_t i = 0; i < nk; i++) dk[i] = dv[i] = NAN;
    kiln_k_flash_attn_ex(q, k, v, s->pad, NULL, out, lse, s->B, s->H, s->Hkv, s->T, s->Tk, s->D, s->scale, s->window, true);
    kiln_k_flash_attn_backward_ex(q, k, v, s->pad, NULL, out, lse, g, dq, dk, dv, s->B, s->H, s->Hkv, s->T, s->Tk, s->D,
                                  s->scale, s->window, true);
    int64_t unwritten = 0;
    for (int64_t i = 0; i < nq; i++) unwritten += isnan(dq[i]);
    for (int64_t i = 0; i < nk; i++) unwritten += isnan(dk[i]) + isnan(dv[i]);
    CHECK(unwritten == 0, "%s (bf16): %lld gradient elements left unwritten (NaN)", name, (long long)unwritten);
    const char *path = attn_bf16_path(s->D);
    if (path) {
        float *qr = round_bf(q, nq), *kr = round_bf(k, nk), *vr = round_bf(v, nk), *gr = round_bf(g, nq);
        double *ro = dalloc(nq), *rl = dalloc(nl), *rdq = dalloc(nq), *rdk = dalloc(nk), *rdv = dalloc(nk);
        ref_attn(s, qr, kr, vr, gr, ro, rl, rdq, rdk, rdv);
        double eo = rel_err_d(out, ro, nq), e1 = rel_err_d(dq, rdq, nq), e2 = rel_err_d(dk, rdk, nk),
               e3 = rel_err_d(dv, rdv, nk), el = 0;
        for (int64_t i = 0; i < nl; i++)
            if (rl[i] != -INFINITY) el = fmax(el, fabs(lse[i] - rl[i]) / fmax(1.0, fabs(rl[i])));
            else CHECK(lse[i] == -INFINITY, "%s (bf16): a row without visible keys has lse %g", name, lse[i]);
        printf("  %-44s bf16 on %s vs the reference on bf16 operands: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
               name, path, eo, el, e1, e2, e3);
        CHECK(eo < 5e-3 && el < 1e-5 && e1 < 1e-2 && e2 < 1e-2 && e3 < 1e-2,
              "%s (bf16 on %s): out %.3g lse %.3g dq %.3g dk %.3g dv %.3g", name, path, eo, el, e1, e2, e3);
        free(qr), free(kr), free(vr), free(gr), free(ro), free(rl), free(rdq), free(rdk), free(rdv);
        /* the same bits on 1 and 3 threads */
        float *o2 = falloc(nq), *l2 = falloc(nl), *q2 = falloc(nq), *k2 = falloc(nk), *v2 = falloc(nk);
        int saved = omp_get_max_threads();
        for (int th = 1; th <= 3; th += 2) {
            omp_set_num_threads(th);
            kiln_k_flash_attn_ex(q, k, v, s->pad, NULL, o2, l2, s->B, s->H, s->Hkv, s->T, s->Tk, s->D, s->scale, s->window, true);
            kiln_k_flash_attn_backward_ex(q, k, v, s->pad, NULL, o2, l2, g, q2, k2, v2, s->B, s->H, s->Hkv, s->T, s->Tk,
                                          s->D, s->scale, s->window, true);
            CHECK(!memcmp(o2, out, (size_t)nq * 4) && !memcmp(l2, lse, (size_t)nl * 4) && !memcmp(q2, dq, (size_t)nq * 4) &&
                      !memcmp(k2, dk, (size_t)nk * 4) && !memcmp(v2, dv, (size_t)nk * 4),
                  "%s (bf16 on %s): %d threads differ in bits", name, path, th);
        }
        omp_set_num_threads(saved);
        free(o2), free(l2), free(q2), free(k2), free(v2);
        (*amx_cases)++;
    } else { /* the fp32 kernel, bit for bit */
        float *o2 = falloc(nq), *l2 = falloc(nl), *q2 = falloc(nq), *k2 = falloc(nk), *v2 = falloc(nk);
        kiln_k_flash_attn_win(q, k, v, s->pad, NULL, o2, l2, s->B, s->H, s->Hkv, s->T, s->Tk, s->D, s->scale, s->window);
        kiln_k_flash_attn_backward_win(q, k, v, s->pad, NULL, o2, l2, g, q2, k2, v2, s->B, s->H, s->Hkv, s->T, s->Tk, s->D,
                                       s->scale, s->window);
        CHECK(!memcmp(o2, out, (size_t)nq * 4) && !memcmp(l2, lse, (size_t)nl * 4) && !memcmp(q2, dq, (size_t)nq * 4) &&
                  !memcmp(k2, dk, (size_t)nk * 4) && !memcmp(v2, dv, (size_t)nk * 4),
              "%s (bf16 emulated or D %% 32 != 0): differs from the fp32 kernel", name);
        free(o2), free(l2), free(q2), free(k2), free(v2);
    }
    free(q), free(k), free(v), free(g), free(out), free(lse), free(dq), free(dk), free(dv);
}

/* packed documents (segment ids, block-diagonal): the bf16 products
 * against the fp32 kernel on the same inputs, within bf16's rounding */
static void check_attn_bf16_segments(const char *path) {
    const int64_t B = 2, H = 4, Hk = 2, T = 150, D = 64, nq = B * H * T * D, nk = B * Hk * T * D, nl = B * H * T;
    int32_t seg[2 * 150], pd[2 * 150];
    for (int64_t j = 0; j < 2 * T; j++) seg[j] = (int32_t)((j % T) / (j < T ? 40 : 23)), pd[j] = j < T || j % T < 140;
    float *q = frand(nq, -1, 1), *k = frand(nk, -1, 1), *v = frand(nk, -1, 1), *g = frand(nq, -1, 1);
    float *o[2], *l[2], *dq[2], *dk[2], *dv[2];
    for (int r = 0; r < 2; r++) {
        o[r] = falloc(nq), l[r] = falloc(nl), dq[r] = falloc(nq), dk[r] = falloc(nk), dv[r] = falloc(nk);
        kiln_k_flash_attn_ex(q, k, v, pd, seg, o[r], l[r], B, H, Hk, T, T, D, 0.125f, 0, r == 1);
        kiln_k_flash_attn_backward_ex(q, k, v, pd, seg, o[r], l[r], g, dq[r], dk[r], dv[r], B, H, Hk, T, T, D, 0.125f, 0,
                                      r == 1);
    }
    double e[5] = {0}, m[5] = {0};
    const float *x[5][2] = {{o[0], o[1]}, {l[0], l[1]}, {dq[0], dq[1]}, {dk[0], dk[1]}, {dv[0], dv[1]}};
    const int64_t len[5] = {nq, nl, nq, nk, nk};
    for (int i = 0; i < 5; i++)
        for (int64_t j = 0; j < len[i]; j++)
            if (isfinite(x[i][0][j])) e[i] = fmax(e[i], fabs(x[i][1][j] - x[i][0][j])), m[i] = fmax(m[i], fabs(x[i][0][j]));
            else CHECK(x[i][1][j] == x[i][0][j], "segments (bf16 on %s): output %d element %lld: %g where fp32 has %g", path, i,
                       (long long)j, x[i][1][j], x[i][0][j]);
    printf("  %-44s bf16 on %s vs fp32: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", "segments (packed documents), padded", path,
           e[0] / m[0], e[1] / m[1], e[2] / m[2], e[3] / m[3], e[4] / m[4]);
    CHECK(e[0] / m[0] < 1e-2 && e[1] / m[1] < 1e-3 && e[2] / m[2] < 2e-2 && e[3] / m[3] < 2e-2 && e[4] / m[4] < 2e-2,
          "segments (bf16 on %s) vs fp32: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g", path, e[0] / m[0], e[1] / m[1], e[2] / m[2],
          e[3] / m[3], e[4] / m[4]);
    for (int r = 0; r < 2; r++) free(o[r]), free(l[r]), free(dq[r]), free(dk[r]), free(dv[r]);
    free(q), free(k), free(v), free(g);
}

static void test_attn_bf16(void) {
    int amx = 0, n = 0;
    int32_t *pm = malloc(2 * 200 * sizeof(int32_t));
    for (int64_t j = 0; j < 400; j++) pm[j] = !(j % 200 >= 64 && j % 200 < 128) || j < 200;
    int32_t lpad[2 * 37];
    for (int64_t j = 0; j < 37; j++) lpad[j] = j >= 6, lpad[37 + j] = 0;
    const struct {
        const char *name;
        att_shape s;
    } cases[] = {
        {"T=Tk=256 D=64 GQA", {2, 4, 2, 256, 256, 64, 0.125f, NULL, 0}},
        {"T=Tk=150 D=32", {1, 2, 1, 150, 150, 32, 0.17f, NULL, 0}},
        {"T=70 Tk=200 D=64 padded block", {2, 2, 2, 70, 200, 64, 0.125f, pm, 0}},
        {"T=Tk=37 D=64 left padding", {2, 4, 2, 37, 37, 64, 0.2f, lpad, 0}},
        {"T=1 Tk=200 D=128", {2, 2, 1, 1, 200, 128, 0.09f, pm, 0}},
        {"T=Tk=150 D=96 window 33", {1, 2, 1, 150, 150, 96, 0.1f, NULL, 33}},
        {"T=32 Tk=200 D=64 window 40 (keys unseen)", {2, 2, 1, 32, 200, 64, 0.125f, NULL, 40}},
        {"T=Tk=150 D=72 (not a multiple of 32)", {1, 2, 1, 150, 150, 72, 0.125f, NULL, 0}},
    };
    /* the default path (AMX where present), then with AMX off (VDPBF16PS
     * where the CPU has AVX512-BF16), then with bf16 emulated (the fp32
     * kernel's bits); a setting that gives a path already run is skipped */
    const char *seen[3];
    int nseen = 0;
    for (int cfg = 0; cfg < 3; cfg++) {
        kiln_bf16_amx_off(cfg == 1);
        kiln_bf16_force_emulation(cfg == 2);
        const char *path = attn_bf16_path(64), *label = path ? path : "fp32";
        bool dup = false;
        for (int i = 0; i < nseen; i++) dup |= !strcmp(seen[i], label);
        if (!dup) {
            seen[nseen++] = label;
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++, n++) check_attn_bf16(cases[i].name, &cases[i].s, &amx);
            if (path) check_attn_bf16_segments(path), n++, amx++;
        }
    }
    kiln_bf16_amx_off(false);
    kiln_bf16_force_emulation(false);
    printf("  flash attention with bf16 products: %d cases, %d on bf16 products (paths run:", n, amx);
    for (int i = 0; i < nseen; i++) printf(" %s", seen[i]);
    printf("; AMX %s, AVX512-BF16 %s)\n", kiln_bf16_amx() ? "in use" : "not in use (the CPU, the OS or the active form)",
           kiln_bf16_native() ? "present" : "absent");
    free(pm);
}

/* ---- fused linear + cross-entropy ---------------------------------------- */

static double ref_lce(const float *h, const float *W, const int32_t *t, int64_t N, int64_t C,
                      int64_t V, int32_t ign, int64_t *count, double *dh, double *dW) {
    double loss = 0, *z = dalloc(V);
    *count = 0;
    for (int64_t n = 0; n < N; n++) {
        if (t[n] == ign) continue;
        ++*count;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) {
            z[j] = 0;
            for (int64_t c = 0; c < C; c++) z[j] += (double)h[n * C + c] * W[j * C + c];
            m = fmax(m, z[j]);
        }
        for (int64_t j = 0; j < V; j++) s += exp(z[j] - m);
        loss += m + log(s) - z[t[n]];
        for (int64_t j = 0; j < V; j++) {
            double dl = exp(z[j] - m) / s - (j == t[n]);
            for (int64_t c = 0; c < C; c++) {
                dh[n * C + c] += dl * W[j * C + c];
                dW[j * C + c] += dl * h[n * C + c];
            }
        }
    }
    free(z);
    return loss;
}

static void check_lce(const char *name, int64_t N, int64_t C, int64_t V, int64_t chunk,
                      const int32_t *t) {
    float *h = frand(N * C, -1, 1), *W = frand(V * C, -1, 1);
    double *rdh = dalloc(N * C), *rdW = dalloc(V * C);
    int64_t rc, cnt = -1;
    double rl = ref_lce(h, W, t, N, C, V, -100, &rc, rdh, rdW);
    float *dh = frand(N * C, 5, 6), *dW = frand(V * C, 5, 6); /* garbage: must be overwritten */
    double l = kiln_k_linear_cross_entropy(h, W, t, N, C, V, -100, chunk, &cnt, dh, dW);
    CHECK(cnt == rc, "%s: count %lld vs %lld", name, (long long)cnt, (long long)rc);
    CHECK(fabs(l - rl) <= 1e-5 * fmax(1.0, fabs(rl)), "%s: loss %.9g vs %.9g", name, l, rl);
    double e1 = rel_err_d(dh, rdh, N * C), e2 = rel_err_d(dW, rdW, V * C);
    CHECK(e1 < 1e-5 && e2 < 1e-5, "%s: dh err %.3g dW err %.3g", name, e1, e2);
    /* loss only, and each gradient alone */
    double l2 = kiln_k_linear_cross_entropy(h, W, t, N, C, V, -100, chunk, &cnt, NULL, NULL);
    CHECK(fabs(l2 - rl) <= 1e-5 * fmax(1.0, fabs(rl)), "%s: loss-only %.9g vs %.9g", name, l2, rl);
    float *dh2 = falloc(N * C), *dW2 = falloc(V * C);
    kiln_k_linear_cross_entropy(h, W, t, N, C, V, -100, chunk, &cnt, dh2, NULL);
    kiln_k_linear_cross_entropy(h, W, t, N, C, V, -100, chunk, &cnt, NULL, dW2);
    CHECK(memcmp(dh, dh2, (size_t)(N * C) * sizeof(float)) == 0 &&
              memcmp(dW, dW2, (size_t)(V * C) * sizeof(float)) == 0,
          "%s: gradients alone differ from gradients together", name);
    free(h), free(W), free(rdh), free(rdW), free(dh), free(dW), free(dh2), free(dW2);
}

static void test_lce(void) {
    const int64_t N = 37, V = 61;
    int32_t t[37];
    for (int64_t n = 0; n < N; n++) t[n] = (int32_t)((n * 17 + 5) % V);
    t[3] = t[10] = t[11] = t[12] = t[36] = -100; /* ignored rows, gathered chunks */
    t[7] = 0, t[8] = (int32_t)V - 1;
    check_lce("N=37 chunk=16", N, 24, V, 16, t);
    check_lce("N=37 chunk=0", N, 24, V, 0, t);
    check_lce("N=37 chunk=1", N, 24, V, 1, t);
    int32_t all[37];
    for (int64_t n = 0; n < N; n++) all[n] = (int32_t)(n % V);
    check_lce("N=37 no ignored, chunk=16", N, 24, V, 16, all);
    for (int64_t n = 0; n < N; n++) all[n] = -100;
    check_lce("all ignored", N, 24, V, 16, all);
}

static void test_lce_determinism(void) {
    const int64_t N = 300, C = 64, V = 500;
    int32_t *t = malloc(N * sizeof(int32_t));
    for (int64_t n = 0; n < N; n++) t[n] = n % 7 == 3 ? -100 : (int32_t)((n * 31) % V);
    float *h = frand(N * C, -1, 1), *W = frand(V * C, -1, 1);
    float *dh[2] = {falloc(N * C), falloc(N * C)}, *dW[2] = {falloc(V * C), falloc(V * C)};
    double l[2];
    int64_t cnt;
    int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r + 1);
        l[r] = kiln_k_linear_cross_entropy(h, W, t, N, C, V, -100, 128, &cnt, dh[r], dW[r]);
    }
    omp_set_num_threads(saved);
    /* The kernel's own reductions (the loss, in double, in row order) do
     * not depend on the thread count; the logits they start from may (next
     * paragraph), so the loss agrees to the logits' fp32 rounding: bit for
     * bit when one implementation served both thread counts. */
    CHECK(fabs(l[0] - l[1]) <= 1e-9 * fabs(l[0]), "linear-CE loss between 1 and 2 threads: %.17g %.17g", l[0], l[1]);
    /* The GEMMs' may: the implementation
     * is chosen per problem by measurement and the thread count is part of
     * the problem (1 and 2 threads may run oneDNN, dnnl_sgemm or kiln's
     * kernel, each summing in its own order; oneDNN's AVX2 kernels also
     * split K across threads for some shapes), so the gradients agree to a
     * few rounding errors of their largest element, not bit for bit. */
    double worst = 0, mw = 0, mh = 0;
    for (int64_t i = 0; i < V * C; i++) mw = fmax(mw, fabs((double)dW[0][i]));
    for (int64_t i = 0; i < N * C; i++) mh = fmax(mh, fabs((double)dh[0][i]));
    for (int64_t i = 0; i < V * C; i++) worst = fmax(worst, fabs((double)dW[0][i] - dW[1][i]) / (mw + 1e-30));
    for (int64_t i = 0; i < N * C; i++) worst = fmax(worst, fabs((double)dh[0][i] - dh[1][i]) / (mh + 1e-30));
    CHECK(worst < 1e-5, "linear-CE dh, dW between 1 and 2 threads: max diff %.3g of the largest element", worst);
    free(t), free(h), free(W), free(dh[0]), free(dh[1]), free(dW[0]), free(dW[1]);
}

int main(void) {
    test_attn_reference();
    test_attn_finite_diff();
    test_attn_determinism();
    test_attn_bf16();
    test_lce();
    test_lce_determinism();
    TEST_END();
}
