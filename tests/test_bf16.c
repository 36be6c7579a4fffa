/* Mixed precision (autocast bf16): the conversion kernel against the scalar
 * rounding, the bf16 MATMUL against an fp32 product of rounded operands
 * (native and emulated), and the PyTorch-fixture model's loss and every
 * parameter gradient in bf16 against fp32, eager and compiled, with
 * compiled bf16 equal to eager bf16 to float rounding. */
#include <stdlib.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/kernels.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"

#define FIX "tests/fixtures/"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int check_convert(int64_t n, bool emulate) {
    kiln_bf16_force_emulation(emulate);
    float *x = malloc((size_t)n * 4);
    uint16_t *y = malloc((size_t)n * 2);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1.0f, -1.0f, 3.4028235e38f, -3.4028235e38f,
                             1.17549435e-38f, from_bits(0x3f808000u), from_bits(0x3f818000u), from_bits(0x7f7fffffu),
                             from_bits(0x7f800001u), from_bits(0xffc00001u), from_bits(0x3f80ffffu)};
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)kiln_rng_u64(77, (uint64_t)i);
        if (i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        x[i] = i < ns ? special[i] : from_bits(u);
    }
    kiln_k_f32_to_bf16(x, y, n);
    int64_t bad = 0, denorm = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t ref = kiln_f32_to_bf16(x[i]);
        uint32_t u = bits_of(x[i]);
        bool is_denorm = (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
        if (is_denorm) {
            denorm++;
            /* the BF16 instruction flushes denormal inputs to a signed zero */
            if (y[i] != ref && y[i] != (uint16_t)((u >> 16) & 0x8000u)) bad++;
        } else if (y[i] != ref) {
            if (bad < 3) fprintf(stderr, "  x=%08x: %04x, scalar %04x\n", u, y[i], ref);
            bad++;
        }
    }
    CHECK(bad == 0, "conversion (%s, n=%lld): %lld of %lld differ from kiln_f32_to_bf16", emulate ? "emulated" : "native",
          (long long)n, (long long)bad, (long long)n);
    free(x);
    free(y);
    kiln_bf16_force_emulation(false);
    return (int)denorm;
}

/* The bf16 MATMUL of every mode (plus the accumulate-into path) against a
 * double product of the rounded operands. */
static void check_matmul(bool emulate) {
    kiln_bf16_force_emulation(emulate);
    int64_t sa[3] = {3, 37, 29}, sw[2] = {45, 29}, sg[3] = {3, 37, 45};
    kiln_tensor *a = kiln_tensor_new(KILN_F32, 3, sa), *w = kiln_tensor_new(KILN_F32, 2, sw);
    kiln_tensor *g = kiln_tensor_new(KILN_F32, 3, sg);
    kiln_tensor *ts[3] = {a, w, g};
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < kiln_tensor_numel(ts[t]); i++)
            kiln_f32(ts[t])[i] = (float)((double)(kiln_rng_u64(5 + (uint64_t)t, (uint64_t)i) % 20001) / 10000.0 - 1.0);
    kiln_tensor *y = kiln_matmul_prec(a, w, KILN_MM_ROWS, false, true, true); /* [3,37,45] */
    kiln_tensor *dw = kiln_matmul_prec(g, a, KILN_MM_GRAD, false, false, true); /* [45,29] */
    CHECK(y && dw, "bf16 matmul: %s", kiln_last_error());
    double worst = 0;
    for (int64_t r = 0; y && r < 3 * 37; r++)
        for (int64_t n = 0; n < 45; n++) {
            double s = 0;
            for (int64_t k = 0; k < 29; k++)
                s += (double)kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(a)[r * 29 + k])) *
                     kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(w)[n * 29 + k]));
            worst = fmax(worst, fabs(s - kiln_f32(y)[r * 45 + n]));
        }
    for (int64_t m = 0; dw && m < 45; m++)
        for (int64_t n = 0; n < 29; n++) {
            double s = 0;
            for (int64_t r = 0; r < 3 * 37; r++)
                s += (double)kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(g)[r * 45 + m])) *
                     kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(a)[r * 29 + n]));
            worst = fmax(worst, fabs(s - kiln_f32(dw)[m * 29 + n]));
        }
    /* the same gradient accumulated into an existing buffer (beta 1) */
    kiln_tensor *acc = kiln_tensor_zeros(KILN_F32, 2, sw);
    kiln_attrs at = {.i = {KILN_MM_GRAD, 0, 0, 1}};
    CHECK_OK(kiln_matmul_into(g, a, &at, acc, 1.0f));
    CHECK_OK(kiln_matmul_into(g, a, &at, acc, 1.0f));
    double wacc = 0;
    for (int64_t i = 0; dw && i < 45 * 29; i++) wacc = fmax(wacc, fabs(kiln_f32(acc)[i] - 2 * kiln_f32(dw)[i]));
    printf("  bf16 matmul (%s): max abs error vs rounded-operand product %.2e, accumulate-into %.2e\n",
           emulate ? "emulated" : "native", worst, wacc);
    CHECK(worst < 2e-4, "bf16 products equal the fp32-accumulated product of rounded operands (%.3g)", worst);
    CHECK(wacc < 1e-4, "bf16 matmul_into accumulates (%.3g)", wacc);
    kiln_tensor *yf = kiln_matmul(a, w, KILN_MM_ROWS, false, true);
    kiln_dtype old = kiln_autocast_set(KILN_BF16);
    kiln_tensor *ya = kiln_matmul(a, w, KILN_MM_ROWS, false, true);
    kiln_autocast_set(old);
    CHECK(yf && ya && memcmp(kiln_f32(ya), kiln_f32(y), kiln_tensor_nbytes(y)) == 0, "autocast makes kiln_matmul bf16");
    CHECK(yf && memcmp(kiln_f32(yf), kiln_f32(y), kiln_tensor_nbytes(y)) != 0, "without autocast it is fp32");
    kiln_tensor *arr[] = {a, w, g, y, dw, acc, yf, ya};
    for (int i = 0; i < 8; i++) kiln_tensor_release(arr[i]);
    kiln_bf16_force_emulation(false);
}

/* ---- the fixture model ---------------------------------------------------- */
typedef struct {
    kiln_llama *m;
    kiln_st_file *f;
    kiln_tensor *ids, *mask, *labels, *scale;
    int64_t count;
} fixture;

static kiln_tensor *wrap_st(const kiln_st_tensor *t) { return kiln_tensor_wrap((void *)t->bytes, t->dtype, t->ndim, t->shape); }

static bool fixture_open(fixture *x) {
    memset(x, 0, sizeof *x);
    kiln_llama_config cfg;
    if (!test_fixture_model(FIX "tiny_gqa.config.json", FIX "tiny_gqa.safetensors", &cfg, &x->m, &x->f)) return false;
    x->ids = wrap_st(kiln_st_find(x->f, "input_ids"));
    x->mask = wrap_st(kiln_st_find(x->f, "attention_mask"));
    x->labels = wrap_st(kiln_st_find(x->f, "labels"));
    for (int64_t i = 0; i < kiln_tensor_numel(x->labels); i++) x->count += kiln_i32(x->labels)[i] != KILN_IGNORE_INDEX;
    int64_t one = 1;
    x->scale = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(x->scale)[0] = 1.0f / (float)x->count;
    return true;
}

static void fixture_close(fixture *x) {
    kiln_tensor_release(x->ids);
    kiln_tensor_release(x->mask);
    kiln_tensor_release(x->labels);
    kiln_tensor_release(x->scale);
    kiln_llama_free(x->m);
    kiln_st_close(x->f);
}

/* Loss (mean over targets) and gradients into grads[i] (malloc'd copies). */
static double run_eager(fixture *x, kiln_dtype prec, float **grads) {
    kiln_llama_zero_grad(x->m);
    kiln_dtype old = kiln_autocast_set(prec);
    kiln_tensor *sum = kiln_ce_loss(x->m, x->ids, x->labels, x->mask, NULL);
    kiln_tensor *loss = kiln_scale_by(sum, x->scale);
    CHECK(loss != NULL, "eager loss: %s", kiln_last_error());
    double l = loss ? kiln_f32(loss)[0] : NAN;
    if (loss) CHECK_OK(kiln_backward(loss));
    kiln_autocast_set(old);
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    for (int i = 0; i < x->m->n_params; i++) {
        kiln_tensor *p = x->m->params[i];
        grads[i] = malloc(kiln_tensor_nbytes(p));
        if (p->grad) memcpy(grads[i], p->grad->data, kiln_tensor_nbytes(p));
        else memset(grads[i], 0, kiln_tensor_nbytes(p));
    }
    return l;
}

/* what the last compiled graph held: cast_bf16 and round_bf16 ops, and
 * bf16 products with an operand marked as rounded (MATMUL i5) */
static struct {
    int casts, rounds, marked;
} g_last;

static int count_bf16_matmuls(const kiln_graph *g, int *fp32) {
    int n = 0;
    *fp32 = 0;
    g_last.casts = g_last.rounds = g_last.marked = 0;
    for (int v = 0; g && v < g->n; v++) {
        if (g->v[v].kind != KILN_V_OP || g->v[v].dead) continue;
        g_last.casts += g->v[v].op == KILN_OP_CAST_BF16;
        g_last.rounds += g->v[v].op == KILN_OP_ROUND_BF16;
        if (g->v[v].op == KILN_OP_MATMUL) {
            if (g->v[v].attrs.i[3]) n++, g_last.marked += g->v[v].attrs.i[5] != 0;
            else (*fp32)++;
        }
    }
    return n;
}

static double run_compiled_rw(fixture *x, kiln_dtype prec, const char *mode, bool rewrites, float **grads,
                              int *n_bf16) {
    kiln_llama_zero_grad(x->m);
    kiln_dtype old = kiln_autocast_set(prec);
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    CHECK_OK(kiln_compile_mode_parse(mode, &co));
    co.rewrites = rewrites;
    kiln_compiled *cs = kiln_train_compile(x->m, &co, true);
    CHECK(cs != NULL, "compile: %s", kiln_last_error());
    float rep[1] = {NAN};
    kiln_tensor *in[4] = {x->ids, x->labels, x->mask, x->scale};
    if (cs) CHECK_OK(kiln_compiled_run(cs, in, rep));
    kiln_autocast_set(old);
    int fp32 = 0;
    *n_bf16 = cs ? count_bf16_matmuls(kiln_compiled_graph(cs), &fp32) : 0;
    if (prec == KILN_BF16) printf("  compiled %s graph: %d bf16 matmuls, %d fp32\n", mode, *n_bf16, fp32);
    kiln_compiled_free(cs);
    for (int i = 0; i < x->m->n_params; i++) {
        kiln_tensor *p = x->m->params[i];
        grads[i] = malloc(kiln_tensor_nbytes(p));
        if (p->grad) memcpy(grads[i], p->grad->data, kiln_tensor_nbytes(p));
        else memset(grads[i], 0, kiln_tensor_nbytes(p));
    }
    return rep[0] / (double)x->count;
}
static double run_compiled(fixture *x, kiln_dtype prec, const char *mode, float **grads, int *n_bf16) {
    return run_compiled_rw(x, prec, mode, true, grads, n_bf16);
}

/* relative L2 error of a against b */
static double rel_l2(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

static double worst_grad(const fixture *x, float **a, float **b, const char **name) {
    double w = 0;
    for (int i = 0; i < x->m->n_params; i++) {
        double e = rel_l2(a[i], b[i], kiln_tensor_numel(x->m->params[i]));
        if (e > w) w = e, *name = x->m->params[i]->name;
    }
    return w;
}

/* Prints the loss and worst-gradient differences of run (l, g) against
 * (lref, gref) and checks them against the two bounds. */
static void check_same(const fixture *x, const char *what, double l, double lref, float **g, float **gref, double ltol,
                       double gtol) {
    const char *wn = "";
    double we = worst_grad(x, g, gref, &wn);
    printf("  %s: loss rel %.2e, worst gradient rel L2 %.2e (%s)\n", what, t_rel(l, lref), we, wn);
    CHECK(t_rel(l, lref) < ltol && we < gtol, "%s (loss %.3g, grads %.3g)", what, t_rel(l, lref), we);
}

static void free_grads(float **g, int n) {
    for (int i = 0; i < n; i++) free(g[i]);
}

static void check_model(void) {
    fixture x;
    if (!fixture_open(&x)) {
        CHECK(0, "fixture tiny_gqa loads");
        fixture_close(&x);
        return;
    }
    int np = x.m->n_params, nb = 0;
    float **g32 = calloc((size_t)np, sizeof *g32), **g16 = calloc((size_t)np, sizeof *g16);
    float **c32 = calloc((size_t)np, sizeof *c32), **c16 = calloc((size_t)np, sizeof *c16);
    double l32 = run_eager(&x, KILN_F32, g32), l16 = run_eager(&x, KILN_BF16, g16);
    const char *wn = "";
    double wg = worst_grad(&x, g16, g32, &wn);
    printf("  eager: loss fp32 %.7f bf16 %.7f (rel %.2e); worst gradient rel L2 %.2e (%s)\n", l32, l16, t_rel(l16, l32), wg, wn);
    CHECK(t_rel(l16, l32) < 1e-2, "bf16 loss within 1e-2 of fp32 (%.3g)", t_rel(l16, l32));
    CHECK(t_rel(l16, l32) > 0, "bf16 actually changes the numbers");
    CHECK(wg < 5e-2, "every bf16 gradient within 5e-2 relative L2 of fp32 (%s: %.3g)", wn, wg);

    double cl32 = run_compiled(&x, KILN_F32, "default", c32, &nb);
    CHECK(nb == 0, "fp32 compiled graph has no bf16 matmul");
    double cl16 = run_compiled(&x, KILN_BF16, "default", c16, &nb);
    CHECK(nb > 0, "bf16 compiled graph records bf16 matmuls");
    if (kiln_bf16_native())
        CHECK(g_last.casts > 0 && g_last.rounds == 0 && g_last.marked == 0,
              "native bf16: the products' operands are cast to bf16 (%d casts, %d roundings, %d marked products)",
              g_last.casts, g_last.rounds, g_last.marked);
    double wc = worst_grad(&x, c16, c32, &wn);
    printf("  compiled: loss fp32 %.7f bf16 %.7f (rel %.2e); worst gradient rel L2 %.2e (%s)\n", cl32, cl16,
           t_rel(cl16, cl32), wc, wn);
    CHECK(t_rel(cl16, cl32) < 1e-2, "compiled bf16 loss within 1e-2 of fp32 (%.3g)", t_rel(cl16, cl32));
    CHECK(wc < 5e-2, "compiled bf16 gradients within 5e-2 of fp32 (%s: %.3g)", wn, wc);
    /* flash attention rounds its unnormalised probabilities to bf16 (on
     * AMX or VDPBF16PS) or none of its operands (where bf16 is emulated)
     * where eager rounds q, k, v
     * and the normalised probabilities: the two agree to bf16's rounding,
     * not bit for bit */
    double we = worst_grad(&x, c16, g16, &wn);
    printf("  compiled bf16 vs eager bf16: loss rel %.2e, worst gradient rel L2 %.2e (%s; flash attention %s)\n",
           t_rel(cl16, l16), we, wn, kiln_bf16_amx()      ? "on AMX where head_dim % 32 == 0"
                             : kiln_bf16_native() ? "on VDPBF16PS where head_dim % 32 == 0 in the avx512 form"
                                                  : "in fp32");
    CHECK(t_rel(cl16, l16) < 1e-4, "compiled bf16 loss equals eager bf16 to bf16 rounding (%.3g)", t_rel(cl16, l16));
    CHECK(we < 2e-2, "compiled bf16 gradients equal eager bf16 to bf16 rounding (%s: %.3g)", wn, we);
    free_grads(c16, np);
    cl16 = run_compiled(&x, KILN_BF16, "interpret", c16, &nb);
    we = worst_grad(&x, c16, g16, &wn);
    CHECK(t_rel(cl16, l16) < 1e-4 && we < 2e-2, "interpreted bf16 equals eager bf16 to bf16 rounding (loss %.3g, grads %.3g)",
          t_rel(cl16, l16), we);
    /* without the rewrites the compiled graph computes what eager does:
     * equal to float rounding */
    free_grads(c16, np);
    cl16 = run_compiled_rw(&x, KILN_BF16, "default", false, c16, &nb);
    check_same(&x, "compiled bf16 without rewrites equals eager bf16", cl16, l16, c16, g16, 1e-5, 2e-3);

    /* the emulated path gives the same numbers up to summation order */
    kiln_bf16_force_emulation(true);
    float **e16 = calloc((size_t)np, sizeof *e16);
    double le = run_eager(&x, KILN_BF16, e16);
    kiln_bf16_force_emulation(false);
    double wem = worst_grad(&x, e16, g16, &wn);
    printf("  emulated vs native bf16: loss rel %.2e, worst gradient rel L2 %.2e\n", t_rel(le, l16), wem);
    CHECK(t_rel(le, l16) < 1e-5 && wem < 2e-3, "emulated bf16 matches native (loss %.3g, grads %.3g)", t_rel(le, l16), wem);

    /* emulated and compiled: the products' operands are rounded once into
     * fp32 (round_bf16) and used as they are; without the rewrites that is
     * eager's computation, so the numbers are eager's to float rounding */
    kiln_bf16_force_emulation(true);
    free_grads(c16, np);
    cl16 = run_compiled_rw(&x, KILN_BF16, "default", false, c16, &nb);
    kiln_bf16_force_emulation(false);
    CHECK(g_last.rounds > 0 && g_last.casts == 0 && g_last.marked == nb,
          "emulated bf16: operands rounded in fp32 (%d roundings, %d casts; %d of %d bf16 products marked)",
          g_last.rounds, g_last.casts, g_last.marked, nb);
    check_same(&x, "compiled emulated bf16 without rewrites equals eager emulated", cl16, le, c16, e16, 1e-5, 2e-3);
    kiln_bf16_force_emulation(true);
    free_grads(c16, np);
    cl16 = run_compiled(&x, KILN_BF16, "default", c16, &nb);
    kiln_bf16_force_emulation(false);
    check_same(&x, "compiled emulated bf16 equals eager emulated to bf16 rounding", cl16, le, c16, e16, 1e-4, 2e-2);

    float **all[] = {g32, g16, c32, c16, e16};
    for (int i = 0; i < 5; i++) {
        free_grads(all[i], np);
        free(all[i]);
    }
    fixture_close(&x);
}

/* The cast op (the compiler inserts it before bf16 products): each element
 * rounds as the scalar conversion does, and the gradient passes through
 * unchanged (straight-through), fp32. */
static void check_cast_op(void) {
    int64_t shape[2] = {7, 33};
    kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, shape), *R = kiln_tensor_new(KILN_F32, 2, shape);
    kiln_rng r = {41, 0};
    kiln_rng_uniform(&r, kiln_f32(x), 7 * 33, -3, 3);
    kiln_rng_uniform(&r, kiln_f32(R), 7 * 33, -1, 1);
    x->requires_grad = true;
    kiln_tensor *y = kiln_cast_bf16(x);
    CHECK(y && y->dtype == KILN_BF16, "cast_bf16 gives a bf16 tensor: %s", kiln_last_error());
    int bad = 0;
    for (int64_t i = 0; y && i < 7 * 33; i++) bad += ((uint16_t *)y->data)[i] != kiln_f32_to_bf16(kiln_f32(x)[i]);
    CHECK(y && bad == 0, "cast_bf16: %d elements differ from the scalar rounding", bad);
    CHECK_OK(kiln_backward_with(y, R));
    CHECK(x->grad && x->grad->dtype == KILN_F32 && !memcmp(x->grad->data, R->data, kiln_tensor_nbytes(R)),
          "cast_bf16 passes its gradient through unchanged");
    kiln_tensor_release(y);
    /* round_bf16: the same rounding held in fp32 */
    kiln_tensor_release(x->grad);
    x->grad = NULL;
    y = kiln_round_bf16(x);
    CHECK(y && y->dtype == KILN_F32, "round_bf16 gives an f32 tensor: %s", kiln_last_error());
    bad = 0;
    for (int64_t i = 0; y && i < 7 * 33; i++)
        bad += kiln_f32(y)[i] != kiln_bf16_to_f32(kiln_f32_to_bf16(kiln_f32(x)[i]));
    CHECK(y && bad == 0, "round_bf16: %d elements differ from the scalar rounding", bad);
    CHECK_OK(kiln_backward_with(y, R));
    CHECK(x->grad && x->grad->dtype == KILN_F32 && !memcmp(x->grad->data, R->data, kiln_tensor_nbytes(R)),
          "round_bf16 passes its gradient through unchanged");
    kiln_tensor_release(y);
    kiln_tensor_release(x);
    kiln_tensor_release(R);
}

int main(void) {
    char dir[64];
    if (!t_tmpdir(dir, sizeof dir, "test_bf16")) return 1;
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("KILN_CACHE_DIR", cache, 1);
    printf("  bf16 path: %s\n", kiln_bf16_path());
    int64_t sizes[] = {1, 31, 32, 33, 1000, 200003};
    int denorm = 0;
    for (int i = 0; i < 6; i++) {
        denorm += check_convert(sizes[i], false);
        check_convert(sizes[i], true);
    }
    CHECK(denorm > 0, "the conversion test met denormals");
    kiln_eager_enable();
    check_cast_op();
    check_matmul(false);
    check_matmul(true);
    check_model();
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
