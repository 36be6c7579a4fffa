/* Every op's backward rule against central finite differences of
 * L = sum(op(inputs) * R), accumulated in double, on random non-zero inputs
 * with odd sizes (T = 37, head dim 24). Prints the relative error per op. */
#include <stdlib.h>
#include "kiln/backend.h"
#include "kiln/eager.h"
#include "test.h"

typedef kiln_tensor *(*op_fn)(kiln_tensor **in);
static uint64_t seed_ctr = 1;

/* Which ops each check covered: a dispatcher in front of eager's records
 * the ops run by the checked forward (their backward rules are what the
 * finite differences test) and by its backward (backward-only ops, whose
 * results are the gradients compared). */
enum { PHASE_NONE, PHASE_FWD, PHASE_BWD };
static int phase;
static bool fd_forward[KILN_OP_COUNT], fd_backward[KILN_OP_COUNT];
static kiln_dispatcher inner;
static kiln_tensor *recording(void *ctx, int op, kiln_tensor *const *in, int n_in, const kiln_attrs *a, const kiln_meta *out,
                              kiln_tensor **aux) {
    (void)ctx;
    if (phase == PHASE_FWD) fd_forward[op] = true;
    if (phase == PHASE_BWD) fd_backward[op] = true;
    return inner.fn(inner.ctx, op, in, n_in, a, out, aux);
}

static kiln_tensor *rnd(int ndim, const int64_t *shape, float lo, float hi) {
    kiln_tensor *t = kiln_tensor_new(KILN_F32, ndim, shape);
    kiln_rng r = {seed_ctr++, 0};
    kiln_rng_uniform(&r, kiln_f32(t), kiln_tensor_numel(t), lo, hi);
    return t;
}
#define RND(lo, hi, ...) rnd(sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}, lo, hi)

static double objective(op_fn f, kiln_tensor **in, const kiln_tensor *R) {
    kiln_tensor *out = f(in);
    double s = 0;
    for (int64_t i = 0; i < kiln_tensor_numel(out); i++) s += (double)kiln_f32(out)[i] * kiln_f32(R)[i];
    kiln_tensor_release(out);
    return s;
}

/* inputs flagged in `diff` are checked; returns the worst relative error */
static void gradcheck(const char *name, op_fn f, kiln_tensor **in, int n_in, unsigned diff) {
    for (int i = 0; i < n_in; i++) {
        in[i]->requires_grad = (diff >> i) & 1;
        kiln_tensor_release(in[i]->grad);
        in[i]->grad = NULL;
    }
    phase = PHASE_FWD;
    kiln_tensor *out = f(in);
    phase = PHASE_NONE;
    CHECK(out != NULL, "%s forward: %s", name, kiln_last_error());
    if (!out) return;
    kiln_tensor *R = rnd(out->ndim, out->shape, -1, 1);
    phase = PHASE_BWD;
    CHECK_OK(kiln_backward_with(out, R));
    phase = PHASE_NONE;
    kiln_tensor_release(out);
    bool was = kiln_grad_set_enabled(false);
    double worst = 0;
    for (int i = 0; i < n_in; i++) {
        if (!((diff >> i) & 1)) continue;
        kiln_tensor *x = in[i];
        CHECK(x->grad != NULL, "%s: input %d got no gradient", name, i);
        if (!x->grad) continue;
        int64_t n = kiln_tensor_numel(x), samples = n < 48 ? n : 48;
        double num = 0, den = 0;
        for (int64_t s = 0; s < samples; s++) {
            int64_t j = samples == n ? s : (int64_t)(kiln_rng_u64(77, (uint64_t)s) % (uint64_t)n);
            float *p = &kiln_f32(x)[j], keep = *p;
            /* five-point stencil: O(h^4) truncation lets h be large enough
             * that the f32 rounding of the op's output stays small */
            double h = 5e-2 * fmax(1.0, fabs(keep)), L[4];
            const double k[4] = {-2, -1, 1, 2};
            for (int q = 0; q < 4; q++) {
                *p = (float)(keep + k[q] * h);
                L[q] = objective(f, in, R);
            }
            *p = keep;
            double fd = (L[0] - 8 * L[1] + 8 * L[2] - L[3]) / (12 * h), an = kiln_f32(x->grad)[j];
            num += (fd - an) * (fd - an);
            den += an * an;
        }
        double err = sqrt(num) / fmax(sqrt(den), 1e-6);
        worst = fmax(worst, err);
        CHECK(err < 2e-3, "%s: input %d gradient rel error %.3g", name, i, err);
    }
    kiln_grad_set_enabled(was);
    printf("  %-28s rel error %.2e\n", name, worst);
    kiln_tensor_release(R);
    for (int i = 0; i < n_in; i++) {
        kiln_tensor_release(in[i]->grad);
        in[i]->grad = NULL;
    }
}

static kiln_tensor *ids_tensor(int64_t B, int64_t T, int64_t V, bool with_ignore) {
    int64_t s[2] = {B, T};
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, s);
    for (int64_t i = 0; i < B * T; i++) {
        kiln_i32(t)[i] = (int32_t)(kiln_rng_u64(seed_ctr, (uint64_t)i) % (uint64_t)V);
        if (with_ignore && i % 7 == 3) kiln_i32(t)[i] = KILN_IGNORE_INDEX;
    }
    seed_ctr++;
    return t;
}

static kiln_tensor *f_embedding(kiln_tensor **in) { return kiln_embedding(in[0], in[1]); }
static kiln_tensor *f_linear(kiln_tensor **in) { return kiln_linear(in[0], in[1]); }
static kiln_tensor *f_rows_nt(kiln_tensor **in) { return kiln_matmul(in[0], in[1], KILN_MM_ROWS, false, false); }
static kiln_tensor *f_bmm00(kiln_tensor **in) { return kiln_matmul(in[0], in[1], KILN_MM_BATCHED, false, false); }
static kiln_tensor *f_bmm01(kiln_tensor **in) { return kiln_matmul(in[0], in[1], KILN_MM_BATCHED, false, true); }
static kiln_tensor *f_bmm10(kiln_tensor **in) { return kiln_matmul(in[0], in[1], KILN_MM_BATCHED, true, false); }
static kiln_tensor *f_bmm11(kiln_tensor **in) { return kiln_matmul(in[0], in[1], KILN_MM_BATCHED, true, true); }
static kiln_tensor *f_add(kiln_tensor **in) { return kiln_add(in[0], in[1]); }
static kiln_tensor *f_mul(kiln_tensor **in) { return kiln_mul(in[0], in[1]); }
static kiln_tensor *f_scale(kiln_tensor **in) { return kiln_scale(in[0], -0.37); }
static kiln_tensor *f_scale_by(kiln_tensor **in) { return kiln_scale_by(in[0], in[1]); }
static kiln_tensor *f_silu(kiln_tensor **in) { return kiln_silu(in[0]); }
static kiln_tensor *f_logsigmoid(kiln_tensor **in) { return kiln_logsigmoid(in[0]); }
static kiln_tensor *f_relu(kiln_tensor **in) { return kiln_relu(in[0]); }
static kiln_tensor *f_log1mexp(kiln_tensor **in) { return kiln_log1mexp(in[0]); }
static kiln_tensor *f_tanh(kiln_tensor **in) { return kiln_tanh(in[0]); }
static kiln_tensor *f_gelu_tanh(kiln_tensor **in) { return kiln_gelu_tanh(in[0]); }
static kiln_tensor *f_softcap(kiln_tensor **in) { return kiln_softcap(in[0], 2.5); }
static kiln_tensor *f_pair_diff(kiln_tensor **in) { return kiln_pair_diff(in[0]); }
static kiln_tensor *f_pair_sum(kiln_tensor **in) { return kiln_pair_sum(in[0]); }
static kiln_tensor *f_row_nll(kiln_tensor **in) { return kiln_row_nll(in[0], in[1], KILN_IGNORE_INDEX); }
static kiln_tensor *f_rmsnorm(kiln_tensor **in) { return kiln_rmsnorm(in[0], in[1], 1e-5); }
static kiln_tensor *f_rope(kiln_tensor **in) { return kiln_rope(in[0], 10000.0, 5, false); }
static kiln_tensor *f_rope_at(kiln_tensor **in) { return kiln_rope_at(in[0], in[1], 10000.0, false, NULL); }
static kiln_tensor *f_repeat(kiln_tensor **in) { return kiln_repeat_kv(in[0], 3); }
static kiln_tensor *f_transpose(kiln_tensor **in) { return kiln_transpose12(in[0]); }
static kiln_tensor *f_reshape(kiln_tensor **in) {
    int64_t s[3] = {37, 2, 24};
    return kiln_reshape(in[0], 3, s);
}
/* the model's masked softmax: softmax(x + causal/padding mask) */
static kiln_tensor *f_masked_softmax(kiln_tensor **in) {
    kiln_tensor *m = kiln_attn_mask(in[1], in[0]->shape[2]);
    kiln_tensor *s = kiln_add(in[0], m);
    kiln_tensor *y = kiln_softmax(s);
    kiln_tensor_release(m);
    kiln_tensor_release(s);
    return y;
}
static kiln_tensor *f_flash(kiln_tensor **in) { return kiln_flash_attn(in[0], in[1], in[2], in[3], 0.2); }
static kiln_tensor *f_flash_seg(kiln_tensor **in) { return kiln_flash_attn_seg(in[0], in[1], in[2], in[3], in[4], 0.2); }
/* the same with a block-diagonal (segment) mask */
static kiln_tensor *f_seg_softmax(kiln_tensor **in) {
    kiln_tensor *m = kiln_attn_mask_seg(in[1], in[2], in[0]->shape[2]);
    kiln_tensor *s = kiln_add(in[0], m);
    kiln_tensor *y = kiln_softmax(s);
    kiln_tensor_release(m);
    kiln_tensor_release(s);
    return y;
}
/* segment ids: documents of 5, 9, ... tokens per row (positions restart) */
static kiln_tensor *seg_tensor(int64_t B, int64_t T, bool positions) {
    int64_t s[2] = {B, T};
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, s);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0, seg = 1, p = 0; i < T; i++, p++) {
            if (p == 5 + 4 * seg) seg++, p = 0;
            kiln_i32(t)[b * T + i] = (int32_t)(positions ? p : seg);
        }
    return t;
}
static kiln_tensor *f_linear_ce(kiln_tensor **in) { return kiln_linear_cross_entropy(in[0], in[1], in[2], KILN_IGNORE_INDEX); }
static kiln_tensor *f_ce(kiln_tensor **in) { return kiln_cross_entropy(in[0], in[1], KILN_IGNORE_INDEX); }
static kiln_tensor *f_sum(kiln_tensor **in) { return kiln_sum(in[0]); }
static kiln_tensor *f_mean(kiln_tensor **in) { return kiln_mean(in[0]); }
/* dropout with a fixed mask (the key is input 1, not differentiated) */
static kiln_tensor *f_dropout(kiln_tensor **in) { return kiln_dropout(in[0], in[1], 0.3, 7); }
static kiln_tensor *f_expand(kiln_tensor **in) {
    int64_t s[2] = {5, 7};
    return kiln_expand(in[0], 2, s);
}

/* Ops no finite-difference check here covers, and why. Every other op with
 * a backward rule must be the forward of a check; every other op without
 * one must run inside a checked backward. */
static const struct {
    int op;
    const char *why;
} exempt[] = {
    {KILN_OP_ATTN_MASK, "made from an integer mask only: nothing to differentiate (it runs in the masked-softmax "
                        "check; eager-vs-compiled tests compare it with flash attention's own masking)"},
    {KILN_OP_FILL, "no inputs: it only seeds a traced graph's backward (checked by every eager-vs-compiled test)"},
    {KILN_OP_ROW_INV_COUNT, "made from integer targets only: nothing to differentiate (the DPO/SimPO tests check it against "
                            "PyTorch's token counts)"},
    {KILN_OP_GT0, "a step function: its gradient is 0 almost everywhere and kiln gives it none (a metric, never a loss)"},
    {KILN_OP_CAST_BF16, "a rounding step: finite differences of it are 0 or spikes; its pass-through gradient is checked "
                        "in test_bf16"},
    {KILN_OP_ROUND_BF16, "a rounding step: finite differences of it are 0 or spikes; its pass-through gradient is checked "
                         "in test_bf16"},
};

static const char *exemption(int op) {
    for (size_t i = 0; i < sizeof exempt / sizeof exempt[0]; i++)
        if (exempt[i].op == op) return exempt[i].why;
    return NULL;
}

/* Every op in the list has a complete registry entry and a check. */
static void check_registry(void) {
    int covered = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        const kiln_op_def *d = kiln_op_get(op);
        CHECK(d != NULL, "op %d has no registry entry", op);
        if (!d) continue;
        CHECK(d->name && d->shape, "op %d: entry without a name or shape rule", op);
        CHECK(d->is_view || (kiln_cpu_kernels[op] && (!d->n_aux || d->aux_shape)), "op %s: no CPU kernel", d->name);
        const char *why = exemption(op);
        bool seen = d->backward ? fd_forward[op] : fd_backward[op];
        CHECK(seen || why, "op %s: no finite-difference check %s and no stated exemption", d->name,
              d->backward ? "of its backward rule" : "of the gradient it computes");
        CHECK(!(seen && why), "op %s: exempt, yet checked: drop the exemption", d->name);
        covered += seen;
        if (why) printf("  %-28s exempt: %s\n", d->name, why);
    }
    printf("%d of %d ops covered by finite differences, %d exempt\n", covered, KILN_OP_COUNT,
           (int)(sizeof exempt / sizeof exempt[0]));
}

int main(void) {
    kiln_eager_enable();
    inner = kiln_op_get_dispatcher();
    kiln_op_set_dispatcher((kiln_dispatcher){recording, NULL});
    printf("finite-difference check of every backward rule:\n");
    kiln_tensor *in[5];
#define RUN(name, fn, n, diff, ...)                                          \
    do {                                                                     \
        kiln_tensor *tmp_[] = {__VA_ARGS__};                                 \
        for (int i_ = 0; i_ < (n); i_++) in[i_] = tmp_[i_];                  \
        gradcheck(name, fn, in, n, diff);                                    \
        for (int i_ = 0; i_ < (n); i_++) kiln_tensor_release(in[i_]);        \
    } while (0)
    RUN("embedding", f_embedding, 2, 1, RND(-1, 1, 11, 24), ids_tensor(2, 37, 11, false));
    RUN("linear (matmul rows, W^T)", f_linear, 2, 3, RND(-1, 1, 2, 37, 24), RND(-1, 1, 13, 24));
    RUN("matmul rows", f_rows_nt, 2, 3, RND(-1, 1, 37, 24), RND(-1, 1, 24, 13));
    RUN("matmul batched a.b", f_bmm00, 2, 3, RND(-1, 1, 2, 3, 37, 24), RND(-1, 1, 2, 3, 24, 13));
    RUN("matmul batched a.b^T", f_bmm01, 2, 3, RND(-1, 1, 2, 3, 37, 24), RND(-1, 1, 2, 3, 13, 24));
    RUN("matmul batched a^T.b", f_bmm10, 2, 3, RND(-1, 1, 2, 3, 24, 37), RND(-1, 1, 2, 3, 24, 13));
    RUN("matmul batched a^T.b^T", f_bmm11, 2, 3, RND(-1, 1, 2, 3, 24, 37), RND(-1, 1, 2, 3, 13, 24));
    RUN("add", f_add, 2, 3, RND(-1, 1, 2, 37, 24), RND(-1, 1, 2, 37, 24));
    RUN("add (broadcast)", f_add, 2, 3, RND(-1, 1, 2, 3, 37, 24), RND(-1, 1, 2, 1, 37, 1));
    RUN("mul", f_mul, 2, 3, RND(-1, 1, 2, 37, 24), RND(-1, 1, 2, 37, 24));
    RUN("scale", f_scale, 1, 1, RND(-1, 1, 37, 24));
    RUN("scale_by", f_scale_by, 2, 1, RND(-1, 1, 37, 24), RND(0.5f, 2, 1));
    RUN("silu", f_silu, 1, 1, RND(-4, 4, 37, 24));
    RUN("logsigmoid", f_logsigmoid, 1, 1, RND(-6, 6, 37, 24));
    RUN("log1mexp", f_log1mexp, 1, 1, RND(-6, -0.2f, 37, 24)); /* both branches (-ln 2 between) */
    RUN("tanh", f_tanh, 1, 1, RND(-3, 3, 37, 24));
    RUN("gelu_tanh", f_gelu_tanh, 1, 1, RND(-4, 4, 37, 24));
    RUN("softcap 2.5 (scale, tanh, scale)", f_softcap, 1, 1, RND(-8, 8, 37, 24));
    { /* the values: PyTorch's gelu(approximate="tanh") and cap * tanh(x / cap), in double */
        kiln_tensor *x = RND(-6, 6, 1000), *g = kiln_gelu_tanh(x), *c = kiln_softcap(x, 2.5);
        double eg = 0, ec = 0;
        for (int64_t i = 0; g && c && i < 1000; i++) {
            double v = kiln_f32(x)[i], wg = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
            eg = fmax(eg, fabs(kiln_f32(g)[i] - wg) / fmax(1, fabs(wg)));
            ec = fmax(ec, fabs(kiln_f32(c)[i] - 2.5 * tanh(v / 2.5)));
        }
        printf("gelu_tanh vs the formula in double: %.2e; softcap %.2e\n", eg, ec);
        CHECK(g && c && eg < 1e-6 && ec < 1e-6, "gelu_tanh %.3g, softcap %.3g", eg, ec);
        kiln_tensor_release(x), kiln_tensor_release(g), kiln_tensor_release(c);
    }
    {
        kiln_tensor *x = RND(-1, 1, 37, 24); /* away from the kink, both signs */
        for (int64_t i = 0; i < kiln_tensor_numel(x); i++) kiln_f32(x)[i] += kiln_f32(x)[i] < 0 ? -0.1f : 0.1f;
        RUN("relu", f_relu, 1, 1, x);
    }
    RUN("pair_diff", f_pair_diff, 1, 1, RND(-1, 1, 38));
    RUN("pair_diff (sum)", f_pair_sum, 1, 1, RND(-1, 1, 38));
    RUN("row_nll", f_row_nll, 2, 1, RND(-2, 2, 4, 9, 11), ids_tensor(4, 9, 11, true));
    {
        int64_t one = 1;
        kiln_tensor *key = kiln_tensor_new(KILN_F32, 1, &one);
        kiln_f32(key)[0] = 4242.0f; /* a fixed mask */
        RUN("dropout (fixed mask)", f_dropout, 2, 1, RND(-1, 1, 2, 37, 24), key);
    }
    RUN("rmsnorm", f_rmsnorm, 2, 3, RND(-2, 2, 2, 37, 24), RND(0.5f, 1.5f, 24));
    RUN("rope", f_rope, 1, 1, RND(-1, 1, 2, 37, 3, 24));
    RUN("rope (positions per token)", f_rope_at, 2, 1, RND(-1, 1, 2, 37, 3, 24), seg_tensor(2, 37, true));
    RUN("repeat_kv", f_repeat, 1, 1, RND(-1, 1, 2, 2, 37, 24));
    RUN("transpose12", f_transpose, 1, 1, RND(-1, 1, 2, 37, 3, 24));
    RUN("reshape", f_reshape, 1, 1, RND(-1, 1, 2, 37, 24));
    {
        kiln_tensor *pm = ids_tensor(2, 37, 1, false); /* all zeros... then set */
        for (int64_t i = 0; i < 74; i++) kiln_i32(pm)[i] = (i % 37) < (i < 37 ? 37 : 30); /* row 1: 7 pads */
        RUN("softmax (causal+padding mask)", f_masked_softmax, 2, 1, RND(-3, 3, 2, 3, 37, 37), pm);
    }
    {
        kiln_tensor *pm = ids_tensor(2, 37, 1, false);
        for (int64_t i = 0; i < 74; i++) kiln_i32(pm)[i] = (i % 37) < (i < 37 ? 37 : 30);
        RUN("softmax (segment mask)", f_seg_softmax, 3, 1, RND(-3, 3, 2, 3, 37, 37), pm, seg_tensor(2, 37, false));
    }
    RUN("cross_entropy (ignore index)", f_ce, 2, 1, RND(-3, 3, 2, 9, 29), ids_tensor(2, 9, 29, true));
    RUN("sum", f_sum, 1, 1, RND(-1, 1, 5, 37));
    RUN("mean", f_mean, 1, 1, RND(-1, 1, 5, 37));
    RUN("expand", f_expand, 1, 1, RND(-1, 1, 1));
    {
        kiln_tensor *pm = ids_tensor(2, 13, 1, false);
        for (int64_t i = 0; i < 26; i++) kiln_i32(pm)[i] = i < 13 || (i % 13) >= 3; /* row 1: 3 left pads */
        RUN("flash_attn (GQA, padding)", f_flash, 4, 7, RND(-1, 1, 2, 4, 9, 8), RND(-1, 1, 2, 2, 13, 8),
            RND(-1, 1, 2, 2, 13, 8), pm);
    }
    {
        kiln_tensor *pm = ids_tensor(2, 13, 1, false);
        for (int64_t i = 0; i < 26; i++) kiln_i32(pm)[i] = i < 13 || (i % 13) < 11; /* row 1: 2 right pads */
        RUN("flash_attn (segments)", f_flash_seg, 5, 7, RND(-1, 1, 2, 4, 13, 8), RND(-1, 1, 2, 2, 13, 8),
            RND(-1, 1, 2, 2, 13, 8), pm, seg_tensor(2, 13, false));
    }
    RUN("linear_cross_entropy", f_linear_ce, 3, 3, RND(-1, 1, 2, 9, 24), RND(-1, 1, 29, 24), ids_tensor(2, 9, 29, true));
    check_registry();
    TEST_END();
}
