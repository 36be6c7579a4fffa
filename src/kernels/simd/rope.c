/* Rotary position embedding, Hugging Face rotate_half convention:
 * for j < D/2, with c = cos(pos f_j), s = sin(pos f_j), f_j = theta^(-2j/D):
 *   out[j]       = x[j] c - x[j + D/2] s
 *   out[j + D/2] = x[j + D/2] c + x[j] s
 * inverse = true rotates by -angle, which is the transpose: the backward.
 * Angles are formed in float (pos as float times f_j as float), as HF does.
 * The frequencies f_j may be rescaled (rope_scaling: linear, llama3). */
#include "kiln/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KILN_ROPE_PAR (1 << 15)
#define KILN_ROPE_BLK 256

/* inv_freq[j] = theta^(-2j/D), rounded to float as HF's float32 tensor, then
 * Hugging Face's rope_scaling rules (modeling_rope_utils): linear divides
 * every frequency by factor; llama3 keeps the high frequencies (wavelength
 * below original_max / high_freq_factor), divides the low ones (wavelength
 * above original_max / low_freq_factor) by factor, and interpolates between
 * the two in the band between. */
void kiln_k_rope_inv_freq(int64_t D, double theta, int type, double factor, double low, double high, int64_t orig_max,
                          float *inv) {
    const double two_pi = 6.283185307179586476925286766559;
    for (int64_t j = 0; j < D / 2; j++) {
        float f = (float)(1.0 / pow(theta, (double)(2 * j) / (double)D));
        if (type == KILN_K_ROPE_LINEAR) {
            f = (float)((double)f / factor);
        } else if (type == KILN_K_ROPE_LLAMA3) {
            double old = (double)orig_max, wl = two_pi / (double)f;
            double lo_wl = old / low, hi_wl = old / high;
            if (wl > lo_wl) f = (float)((double)f / factor);
            else if (!(wl < hi_wl)) {
                double sm = (old / wl - low) / (high - low);
                f = (float)((1.0 - sm) * (double)f / factor + sm * (double)f);
            }
        }
        inv[j] = f;
    }
}

/* cos/sin of pos * f_j for j in [j0, j1), stored from index 0; the angle is
 * formed in float (pos as float times f_j as float), as HF does */
static void rope_table(float *restrict cs, float *restrict sn, int64_t j0, int64_t j1, int64_t pos,
                       const float *restrict inv) {
    for (int64_t j = j0; j < j1; j++) {
        float a = (float)pos * inv[j];
        cs[j - j0] = cosf(a);
        sn[j - j0] = sinf(a);
    }
}

/* The cos/sin table of the last call, kept for the next: a training step
 * rotates q and k, forward and backward, in every layer at the same
 * positions and frequencies, and building the table (T x D/2 cosf and sinf)
 * cost more than the rotation at T = 4096 (kiln bench --profile: rope 38.9
 * ms of a 1 x 4096 step). Rows p0 .. p0 + n - 1 of cos then sin, half wide,
 * for the frequencies inv (copied); the same values as built anew, since a
 * row depends only on its position and inv. The lock is held while a call
 * reads the table; calls from several threads at once take turns. */
static struct {
    pthread_mutex_t mu;
    float *tab, *inv;
    int64_t half, p0, n;
} g_tab = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The table for positions [p0, p0 + n) under g_tab.mu (held on return,
 * also on NULL: out of memory), reused where the kept one covers them. */
static const float *table_locked(int64_t p0, int64_t n, int64_t half, const float *inv, bool par) {
    pthread_mutex_lock(&g_tab.mu);
    if (g_tab.tab && g_tab.half == half && g_tab.p0 <= p0 && p0 + n <= g_tab.p0 + g_tab.n &&
        !memcmp(g_tab.inv, inv, (size_t)half * sizeof(float)))
        return g_tab.tab + 2 * (p0 - g_tab.p0) * half;
    free(g_tab.tab), free(g_tab.inv);
    g_tab.tab = malloc((size_t)(2 * n * half) * sizeof(float));
    g_tab.inv = malloc((size_t)half * sizeof(float));
    if (!g_tab.tab || !g_tab.inv) {
        free(g_tab.tab), free(g_tab.inv);
        g_tab.tab = g_tab.inv = NULL;
        return NULL;
    }
    memcpy(g_tab.inv, inv, (size_t)half * sizeof(float));
    g_tab.half = half, g_tab.p0 = p0, g_tab.n = n;
    float *tab = g_tab.tab;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t t = 0; t < n; t++) rope_table(tab + 2 * t * half, tab + (2 * t + 1) * half, 0, half, p0 + t, inv);
    return tab;
}

/* pairs (j, j + half) for j in [0, n) of a row whose halves start at x0/x1 */
/* No restrict on x/o: out may be x (in place); each pair is read before it
 * is written, and omp simd needs no aliasing proof. */
static void rope_pairs(const float *x0, const float *x1, float *o0, float *o1,
                       const float *restrict cs, const float *restrict sn,
                       int64_t n, float sign) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float a = x0[j], b = x1[j], s = sign * sn[j];
        o0[j] = a * cs[j] - b * s;
        o1[j] = b * cs[j] + a * s;
    }
}

/* Frequencies [j0, j1) of every row; inv indexed from j0 (out of memory
 * path: one block of one position's table at a time, same values). */
static void rope_block(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0,
                       const float *inv, int64_t j0, int64_t j1, float sign) {
    float cs[KILN_ROPE_BLK], sn[KILN_ROPE_BLK];
    int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        rope_table(cs, sn, 0, j1 - j0, pos0 + t, inv);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                int64_t i = (b * T + t) * H + h;
                const float *xi = x + i * D;
                float *oi = out + i * D;
                rope_pairs(xi + j0, xi + half + j0, oi + j0, oi + half + j0, cs, sn, j1 - j0, sign);
            }
    }
}

void kiln_k_rope_freq(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0,
                      const float *inv, bool inverse) {
    int64_t half = D / 2, rows = B * T * H;
    float sign = inverse ? -1.0f : 1.0f;
    bool par = rows * D > KILN_ROPE_PAR;
    if (rows == 0 || half == 0) return;
    const float *tab = table_locked(pos0, T, half, inv, par);
    if (tab) {
#pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < rows; i++) {
            int64_t t = (i / H) % T;
            const float *xi = x + i * D;
            float *oi = out + i * D;
            rope_pairs(xi, xi + half, oi, oi + half, tab + 2 * t * half, tab + (2 * t + 1) * half, half, sign);
        }
        pthread_mutex_unlock(&g_tab.mu);
        return;
    }
    pthread_mutex_unlock(&g_tab.mu);
    for (int64_t j0 = 0; j0 < half; j0 += KILN_ROPE_BLK) {
        int64_t j1 = j0 + KILN_ROPE_BLK < half ? j0 + KILN_ROPE_BLK : half;
        rope_block(x, out, B, T, H, D, pos0, inv + j0, j0, j1, sign);
    }
}

/* One table row per distinct position up to the largest (rows are
 * positions within a document, so at most T of them); without memory for
 * it, each token's angles a block at a time (the same values). */
void kiln_k_rope_freq_pos(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D, const int32_t *pos,
                          const float *inv, bool inverse) {
    int64_t half = D / 2, rows = B * T * H, np = 0;
    float sign = inverse ? -1.0f : 1.0f;
    if (rows == 0 || half == 0) return;
    for (int64_t i = 0; i < B * T; i++) np = pos[i] + 1 > np ? pos[i] + 1 : np;
    bool par = rows * D > KILN_ROPE_PAR;
    const float *tab = np <= 2 * T + 1024 ? table_locked(0, np, half, inv, par) : NULL;
    if (tab) {
#pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < rows; i++) {
            int64_t p = pos[i / H];
            const float *xi = x + i * D;
            float *oi = out + i * D;
            rope_pairs(xi, xi + half, oi, oi + half, tab + 2 * p * half, tab + (2 * p + 1) * half, half, sign);
        }
    }
    if (np <= 2 * T + 1024) pthread_mutex_unlock(&g_tab.mu);
    if (tab) return;
    float cs[KILN_ROPE_BLK], sn[KILN_ROPE_BLK];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j0 = 0; j0 < half; j0 += KILN_ROPE_BLK) {
            int64_t j1 = j0 + KILN_ROPE_BLK < half ? j0 + KILN_ROPE_BLK : half;
            rope_table(cs, sn, 0, j1 - j0, pos[i / H], inv + j0);
            const float *xi = x + i * D;
            float *oi = out + i * D;
            rope_pairs(xi + j0, xi + half + j0, oi + j0, oi + half + j0, cs, sn, j1 - j0, sign);
        }
}

void kiln_k_rope(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D,
                 int64_t pos0, float theta, bool inverse) {
    int64_t half = D / 2;
    if (half <= 0) return;
    float *inv = malloc((size_t)half * sizeof(float));
    if (inv) {
        kiln_k_rope_inv_freq(D, theta, KILN_K_ROPE_DEFAULT, 1, 1, 1, 1, inv);
        kiln_k_rope_freq(x, out, B, T, H, D, pos0, inv, inverse);
        free(inv);
        return;
    }
    /* out of memory: the frequencies a block at a time */
    float blk[KILN_ROPE_BLK];
    for (int64_t j0 = 0; j0 < half; j0 += KILN_ROPE_BLK) {
        int64_t j1 = j0 + KILN_ROPE_BLK < half ? j0 + KILN_ROPE_BLK : half;
        for (int64_t j = j0; j < j1; j++) blk[j - j0] = (float)(1.0 / pow((double)theta, (double)(2 * j) / (double)D));
        rope_block(x, out, B, T, H, D, pos0, blk, j0, j1, inverse ? -1.0f : 1.0f);
    }
}
