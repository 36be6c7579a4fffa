/* The fused optimiser step (issue 15): the global gradient norm in one
 * parallel pass and clip + AdamW + zeroing in one pass must give the bits of
 * the per-parameter kernel loop the trainer ran before (norm of each
 * gradient added in order, kiln_k_scale, kiln_k_adamw, memset), on a real
 * model's gradients, for any thread count; the norm also matches a plain
 * double-precision sum within rounding. The AdamW arithmetic itself is
 * checked against a double reference in test_kernels and against PyTorch's
 * AdamW in test_train_torch. */
#include <omp.h>
#include <stdlib.h>
#include "kiln/eager.h"
#include "kiln/kernels.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"

static float frand1(uint64_t seed, uint64_t i) { return (float)((double)(kiln_rng_u64(seed, i) >> 11) / 9007199254740992.0 * 2 - 1); }

/* ---- the kernels on their own -------------------------------------------- */

static void sumsq_multi(void) {
    /* sizes around the chunking's edges: empty, one element, one chunk, a
     * partial chunk, the 64-chunk cap; then enough arrays (64 chunks each)
     * to overflow the fixed partials buffer, so runs of arrays are taken */
    const int64_t sizes[] = {0, 1, 4095, 4096, 4097, 100003, 64 * 4096, 300001};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    float *buf = malloc(300001 * sizeof(float));
    for (int64_t i = 0; i < 300001; i++) buf[i] = frand1(11, (uint64_t)i) * (i % 5 ? 1.0f : 30.0f);
    const float *x[200];
    int64_t n[200];
    for (int j = 0; j < ns; j++) x[j] = buf, n[j] = sizes[j];
    double loop = 0;
    for (int j = 0; j < ns; j++) loop += kiln_k_sumsq(x[j], n[j]);
    double fused = kiln_k_sumsq_multi(x, n, ns);
    CHECK(memcmp(&loop, &fused, sizeof loop) == 0, "sumsq_multi = loop of sumsq, bitwise (%.17g vs %.17g)", fused, loop);
    for (int j = 0; j < 200; j++) x[j] = buf + j, n[j] = 64 * 4096 + (j % 3) * 4099; /* 200 x 64 chunks > 8192 */
    loop = 0;
    for (int j = 0; j < 200; j++) loop += kiln_k_sumsq(x[j], n[j]);
    fused = kiln_k_sumsq_multi(x, n, 200);
    CHECK(memcmp(&loop, &fused, sizeof loop) == 0, "sumsq_multi over 200 arrays (several runs) bitwise (%.17g vs %.17g)",
          fused, loop);
    omp_set_num_threads(1);
    double one = kiln_k_sumsq_multi(x, n, 200);
    omp_set_num_threads(omp_get_num_procs());
    CHECK(memcmp(&one, &fused, sizeof one) == 0, "sumsq_multi on 1 thread = on all threads");
    CHECK(kiln_k_sumsq_multi(x, n, 0) == 0.0, "no arrays: 0");
    free(buf);
}

static void adamw_multi(void) {
    const int64_t sizes[] = {0, 1, 7, 9, 4096, 4103, 50001, 70000};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    float *a[NS][4], *b[NS][4];
    kiln_adamw_slot s[NS];
    const float lr = 2e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.3712f;
    const float bc1 = (float)(1 - pow(b1, 3)), bc2 = (float)(1 - pow(b2, 3));
    for (int j = 0; j < NS; j++) {
        for (int k = 0; k < 4; k++) {
            a[j][k] = malloc((size_t)(sizes[j] + 1) * sizeof(float));
            b[j][k] = malloc((size_t)(sizes[j] + 1) * sizeof(float));
            for (int64_t i = 0; i < sizes[j]; i++) {
                float r = frand1((uint64_t)(100 * j + k), (uint64_t)i);
                a[j][k][i] = b[j][k][i] = k == 3 ? r * r * 1e-3f : r; /* v >= 0 */
            }
        }
        s[j] = (kiln_adamw_slot){b[j][0], b[j][1], b[j][2], b[j][3], sizes[j], j % 2 ? 0.1f : 0.0f};
    }
    /* the loop: scale g, update, zero g, array by array */
    for (int j = 0; j < NS; j++) {
        kiln_k_scale(a[j][1], gs, a[j][1], sizes[j]);
        kiln_k_adamw(a[j][0], a[j][1], a[j][2], a[j][3], sizes[j], lr, b1, b2, eps, s[j].wd, bc1, bc2);
        memset(a[j][1], 0, (size_t)sizes[j] * sizeof(float));
    }
    kiln_k_adamw_multi(s, NS, gs, lr, b1, b2, eps, bc1, bc2);
    int same = 0;
    for (int j = 0; j < NS; j++)
        for (int k = 0; k < 4; k++) same += memcmp(a[j][k], b[j][k], (size_t)sizes[j] * sizeof(float)) == 0;
    CHECK(same == 4 * NS, "adamw_multi = scale + adamw + zero per array, bitwise (%d of %d arrays equal)", same, 4 * NS);
    for (int j = 0; j < NS; j++)
        for (int k = 0; k < 4; k++) free(a[j][k]), free(b[j][k]);
}

/* ---- the optimiser step on a real model's gradients ---------------------- */

/* The trainer's optimiser tail before the fused step, from the kernels it
 * called (this test is the only place that still runs it). */
static double loop_step(kiln_adamw *o, const kiln_train_config *c, double lr) {
    double s = 0;
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad) s += kiln_k_sumsq(kiln_f32(o->params[i]->grad), kiln_tensor_numel(o->params[i]));
    double norm = sqrt(s);
    double coef = c->clip > 0 ? c->clip / (norm + 1e-6) : 1.0;
    if (coef < 1.0)
        for (int i = 0; i < o->n; i++) {
            kiln_tensor *g = o->params[i]->grad;
            if (g) kiln_k_scale(kiln_f32(g), (float)coef, kiln_f32(g), kiln_tensor_numel(g));
        }
    o->t++;
    double bc1 = 1.0 - pow(o->beta1, (double)o->t), bc2 = 1.0 - pow(o->beta2, (double)o->t);
    for (int i = 0; i < o->n; i++) {
        kiln_tensor *p = o->params[i];
        if (!p->grad) continue;
        kiln_k_adamw(kiln_f32(p), kiln_f32(p->grad), kiln_f32(o->m[i]), kiln_f32(o->v[i]), kiln_tensor_numel(p), (float)lr,
                     (float)o->beta1, (float)o->beta2, (float)o->eps, o->decay[i] ? (float)o->weight_decay : 0.0f,
                     (float)bc1, (float)bc2);
    }
    for (int i = 0; i < o->n; i++)
        if (o->params[i]->grad) memset(o->params[i]->grad->data, 0, kiln_tensor_nbytes(o->params[i]->grad));
    return norm;
}

static void backward(kiln_llama *m, const kiln_batch *b, float scale) {
    kiln_tensor *in[4];
    test_step_inputs(b, scale, in);
    kiln_tensor *loss = kiln_ce_loss(m, in[0], in[1], in[2], NULL);
    kiln_tensor *scaled = loss ? kiln_scale_by(loss, in[3]) : NULL;
    CHECK(scaled && kiln_backward(scaled) == KILN_OK, "forward + backward: %s", kiln_last_error());
    kiln_tensor_release(scaled);
    kiln_tensor_release(loss);
    test_release_inputs(in);
}

static bool same_tensor(const kiln_tensor *a, const kiln_tensor *b) {
    return memcmp(a->data, b->data, kiln_tensor_nbytes(a)) == 0;
}

static void real_gradients(void) {
    /* big enough that the embedding and MLP matrices span several chunks and
     * blocks and the passes run threaded (> 32768 elements) */
    kiln_llama_config mc = test_tiny_config();
    mc.vocab_size = 600, mc.hidden_size = 96, mc.intermediate_size = 256, mc.head_dim = 24;
    kiln_llama *A = kiln_llama_new(&mc, 21), *B = kiln_llama_new(&mc, 21), *C = kiln_llama_new(&mc, 21);
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.weight_decay = 0.1;
    kiln_adamw *oa = kiln_adamw_new(A, &c), *ob = kiln_adamw_new(B, &c), *oc = kiln_adamw_new(C, &c);
    kiln_batch *bt = kiln_batch_alloc(3, 24);
    /* clipping on (norm well above 0.05), off (clip 0), and above the norm */
    const double clips[4] = {0.05, 0.05, 0.0, 1e6}, lrs[4] = {3e-3, 1e-2, 5e-3, 2e-3};
    int norm_same = 0, state_same = 0, threads_same = 0, zeroed = 0, count = 0;
    double worst_ref = 0;
    for (int step = 0; step < 4; step++) {
        for (int r = 0; r < bt->B * bt->T; r++) {
            bt->input_ids[r] = (int32_t)(kiln_rng_u64(500 + (uint64_t)step, (uint64_t)r) % 600);
            bt->targets[r] = r % 11 == 3 ? KILN_IGNORE_INDEX : (int32_t)(kiln_rng_u64(900 + (uint64_t)step, (uint64_t)r) % 600);
            bt->pad_mask[r] = 1;
        }
        test_count_targets(bt);
        backward(A, bt, 1.0f / (float)bt->n_targets);
        backward(B, bt, 1.0f / (float)bt->n_targets);
        backward(C, bt, 1.0f / (float)bt->n_targets);
        if (step == 1) { /* a parameter no gradient reached is skipped by both */
            kiln_tensor **gs[3] = {&A->norm->grad, &B->norm->grad, &C->norm->grad};
            for (int k = 0; k < 3; k++) kiln_tensor_release(*gs[k]), *gs[k] = NULL;
        }
        bool grads_same = true;
        double ref = 0;
        for (int i = 0; i < oa->n; i++) {
            const kiln_tensor *g = oa->params[i]->grad;
            if (!g) continue;
            grads_same &= same_tensor(g, ob->params[i]->grad) && same_tensor(g, oc->params[i]->grad);
            for (int64_t j = 0; j < kiln_tensor_numel(g); j++) ref += (double)kiln_f32(g)[j] * kiln_f32(g)[j];
        }
        CHECK(grads_same, "step %d: the three models' gradients are identical before the optimiser", step);
        c.clip = clips[step];
        double norm = loop_step(oa, &c, lrs[step]);
        kiln_step_result rb = {.lr = lrs[step]}, rc = rb;
        CHECK_OK(kiln_adamw_apply(ob, &c, lrs[step], &rb));
        omp_set_num_threads(1);
        CHECK_OK(kiln_adamw_apply(oc, &c, lrs[step], &rc));
        omp_set_num_threads(omp_get_num_procs());
        norm_same += memcmp(&norm, &rb.grad_norm, sizeof norm) == 0 && memcmp(&norm, &rc.grad_norm, sizeof norm) == 0;
        worst_ref = fmax(worst_ref, t_rel(rb.grad_norm, sqrt(ref)));
        for (int i = 0; i < oa->n; i++) {
            count++;
            state_same += same_tensor(oa->params[i], ob->params[i]) && same_tensor(oa->m[i], ob->m[i]) &&
                          same_tensor(oa->v[i], ob->v[i]);
            threads_same += same_tensor(ob->params[i], oc->params[i]) && same_tensor(ob->m[i], oc->m[i]) &&
                            same_tensor(ob->v[i], oc->v[i]);
            const kiln_tensor *g = ob->params[i]->grad;
            bool z = true;
            for (int64_t j = 0; g && j < kiln_tensor_numel(g); j++) z &= kiln_f32(g)[j] == 0.0f;
            zeroed += z;
        }
        if (step == 0) printf("  norm %.9g, clip %.2g: scaled by %.4g\n", norm, c.clip, c.clip / (norm + 1e-6));
    }
    CHECK(norm_same == 4, "fused global norm = the loop's, bitwise, on all and on 1 thread (%d of 4 steps)", norm_same);
    CHECK(state_same == count, "fused step = kernel loop, bitwise: parameters, m, v (%d of %d)", state_same, count);
    CHECK(threads_same == count, "fused step on 1 thread = on all threads, bitwise (%d of %d)", threads_same, count);
    CHECK(zeroed == count, "gradients zeroed by the fused pass (%d of %d)", zeroed, count);
    /* the chunked double sum against one serial double sum: both add the
     * float squares exactly (a float's square is exact in double); only the
     * order of ~1e5 double additions differs, bounded by n x 1.1e-16 */
    CHECK(worst_ref < 1e-12, "global norm vs a serial double sum: rel %.3g", worst_ref);
    printf("  global norm vs a serial double-precision sum: worst rel %.2g\n", worst_ref);
    CHECK(oa->t == 4 && ob->t == 4, "four steps taken");
    kiln_batch_free(bt);
    kiln_adamw_free(oa), kiln_adamw_free(ob), kiln_adamw_free(oc);
    kiln_llama_free(A), kiln_llama_free(B), kiln_llama_free(C);
}

static void refusals(void) {
    kiln_llama_config mc = test_tiny_config();
    kiln_llama *m = kiln_llama_new(&mc, 3);
    kiln_train_config c;
    kiln_train_config_default(&c);
    kiln_adamw *o = kiln_adamw_new(m, &c);
    CHECK(kiln_adamw_update(o, NAN, 1.0) == KILN_ERR_NUMERIC && strstr(kiln_last_error(), "learning rate"),
          "NaN learning rate refused: %s", kiln_last_error());
    CHECK(kiln_adamw_update(o, 1e-3, 0.0) == KILN_ERR_NUMERIC && strstr(kiln_last_error(), "gradient scale"),
          "gradient scale 0 refused: %s", kiln_last_error());
    CHECK(o->t == 0, "a refused update takes no step");
    kiln_adamw_free(o);
    kiln_llama_free(m);
}

int main(void) {
    kiln_eager_enable();
    sumsq_multi();
    adamw_multi();
    real_gradients();
    refusals();
    TEST_END();
}
