/* --pack documents: whole documents packed into rows with block-diagonal
 * attention and positions restarting at each document.
 *  - A row holding documents A and B gives, for each document, the logits,
 *    loss and parameter gradients of that document run alone in its own
 *    (padded) row, eager and compiled (to float rounding).
 *  - Eager = compiled on packed documents.
 *  - The loader on a crafted shard: segments, positions, targets that never
 *    leave their document, loss masks, a document longer than a row,
 *    seeded order, resume.
 *  - k accumulated micro-batches equal one batch of k·b. */
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>
#include "kiln/eager.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "test.h"
#include "test_models.h"

static char tmpdir[64];

/* ---- helpers --------------------------------------------------------------- */

static kiln_llama_config pack_config(void) {
    kiln_llama_config c = test_tiny_config();
    c.max_position_embeddings = 256;
    return c;
}

/* all gradients, flattened (missing ones as zeros) */
static float *grads_of(const kiln_llama *m, int64_t *n) {
    *n = kiln_llama_num_params(m);
    float *g = calloc((size_t)*n, sizeof *g);
    int64_t o = 0;
    for (int i = 0; i < m->n_params; i++) {
        int64_t k = kiln_tensor_numel(m->params[i]);
        if (m->params[i]->grad) memcpy(g + o, m->params[i]->grad->data, (size_t)k * sizeof(float));
        o += k;
    }
    return g;
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

static void wrap(const kiln_batch *b, kiln_tensor **t) {
    int64_t s[2] = {b->B, b->T}, one = 1;
    t[0] = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, s);
    t[1] = kiln_tensor_wrap(b->targets, KILN_I32, 2, s);
    t[2] = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, s);
    t[3] = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(t[3])[0] = 1.0f;
    t[4] = kiln_tensor_wrap(b->positions, KILN_I32, 2, s);
    t[5] = kiln_tensor_wrap(b->segments, KILN_I32, 2, s);
}
static void unwrap(kiln_tensor **t) {
    for (int i = 0; i < 6; i++) kiln_tensor_release(t[i]);
}

/* Loss sum and gradients of one batch, eager or through a compiled step
 * (cs must match b->segmented); the gradients start from zero. */
static double run_grads(kiln_llama *m, const kiln_batch *b, kiln_compiled *cs, float **g, int64_t *n) {
    kiln_llama_zero_grad(m);
    kiln_tensor *t[6];
    wrap(b, t);
    double sum = NAN;
    if (cs) {
        float rep[1] = {NAN};
        CHECK_OK(kiln_compiled_run(cs, t, rep));
        sum = rep[0];
    } else {
        kiln_llama_docs docs = {t[4], t[5]};
        kiln_tensor *loss = kiln_ce_loss(m, t[0], t[1], t[2], b->segmented ? &docs : NULL);
        CHECK(loss != NULL, "eager loss: %s", kiln_last_error());
        if (loss) {
            sum = kiln_f32(loss)[0];
            CHECK_OK(kiln_backward(loss));
        }
        kiln_tensor_release(loss);
    }
    unwrap(t);
    *g = grads_of(m, n);
    return sum;
}

/* ---- A and B in one row vs each alone ------------------------------------ */
#define TT 160 /* three 64-wide blocks: A's first key block is invisible to B's last query block */
#define LA 100 /* inputs of A */
#define LB 45  /* inputs of B */

static int32_t tok_a[LA + 1], tok_b[LB + 1];

static void set_pad(kiln_batch *b, int t) {
    b->input_ids[t] = 2, b->targets[t] = KILN_IGNORE_INDEX, b->pad_mask[t] = 0, b->positions[t] = t, b->segments[t] = 0;
}

/* doc (its tokens, n inputs) at row offset `at` as segment `seg`; targets
 * ignored when !trained */
static void put_doc(kiln_batch *b, const int32_t *tok, int n, int at, int seg, bool trained) {
    for (int t = 0; t < n; t++) {
        b->input_ids[at + t] = tok[t];
        b->targets[at + t] = trained ? tok[t + 1] : KILN_IGNORE_INDEX;
        b->pad_mask[at + t] = 1;
        b->positions[at + t] = t;
        b->segments[at + t] = seg;
    }
}

/* which: 0 both trained, 1 only A's targets, 2 only B's */
static void packed_row(kiln_batch *b, int which) {
    for (int t = 0; t < TT; t++) set_pad(b, t);
    put_doc(b, tok_a, LA, 0, 1, which != 2);
    put_doc(b, tok_b, LB, LA, 2, which != 1);
    b->rows = 1, b->segmented = true;
    test_count_targets(b);
}

/* one document alone in a padded row, as --pack padded makes it: no segments */
static void alone_row(kiln_batch *b, const int32_t *tok, int n) {
    for (int t = 0; t < TT; t++) set_pad(b, t);
    put_doc(b, tok, n, 0, 1, true);
    b->rows = 1, b->segmented = false;
    test_count_targets(b);
}

static void logits_alone(kiln_llama *m) {
    kiln_batch *p = kiln_batch_alloc(1, TT), *a = kiln_batch_alloc(1, TT), *bb = kiln_batch_alloc(1, TT);
    packed_row(p, 0);
    alone_row(a, tok_a, LA);
    alone_row(bb, tok_b, LB);
    kiln_tensor *tp[6], *ta[6], *tb[6];
    wrap(p, tp), wrap(a, ta), wrap(bb, tb);
    bool was = kiln_grad_set_enabled(false);
    kiln_llama_docs docs = {tp[4], tp[5]};
    kiln_tensor *lp = kiln_llama_forward_ex(m, tp[0], tp[2], &docs, NULL);
    kiln_tensor *la = kiln_llama_forward(m, ta[0], ta[2], NULL), *lb = kiln_llama_forward(m, tb[0], tb[2], NULL);
    kiln_grad_set_enabled(was);
    CHECK(lp && la && lb, "forwards: %s", kiln_last_error());
    if (lp && la && lb) {
        int64_t V = lp->shape[2];
        double da = rel_diff(kiln_f32(lp), kiln_f32(la), LA * V);
        double db = rel_diff(kiln_f32(lp) + LA * V, kiln_f32(lb), LB * V);
        printf("  eager logits: A in the packed row vs A alone max rel diff %.2e, B %.2e (tolerance 1e-5)\n", da, db);
        CHECK(da < 1e-5 && db < 1e-5, "packed logits equal each document's alone (%.3g, %.3g)", da, db);
        /* and without segments the packed row is not the same: the test can fail */
        kiln_tensor *lx = kiln_llama_forward(m, tp[0], tp[2], NULL);
        double dx = lx ? rel_diff(kiln_f32(lx) + LA * V, kiln_f32(lb), LB * V) : 0;
        printf("  (B's logits when it may attend to A: rel diff %.2e)\n", dx);
        CHECK(dx > 1e-3, "cross-talk without segments is visible (%.3g)", dx);
        kiln_tensor_release(lx);
    }
    kiln_tensor_release(lp);
    kiln_tensor_release(la);
    kiln_tensor_release(lb);
    unwrap(tp), unwrap(ta), unwrap(tb);
    kiln_batch_free(p), kiln_batch_free(a), kiln_batch_free(bb);
}

/* For each document: its loss and gradients from the packed row (the other
 * document's targets ignored) against those of it alone. */
static void grads_alone(kiln_llama *m, kiln_compiled *cs_docs, kiln_compiled *cs_plain, const char *how) {
    kiln_batch *p = kiln_batch_alloc(1, TT), *x = kiln_batch_alloc(1, TT);
    for (int d = 1; d <= 2; d++) {
        packed_row(p, d);
        alone_row(x, d == 1 ? tok_a : tok_b, d == 1 ? LA : LB);
        int64_t n;
        float *gp, *gx;
        double sp = run_grads(m, p, cs_docs, &gp, &n), sx = run_grads(m, x, cs_plain, &gx, &n);
        double dg = rel_diff(gp, gx, n), dl = t_rel(sp, sx);
        printf("  %s: document %c in the packed row vs alone: loss %.7f vs %.7f (rel %.1e), gradients max rel diff %.2e "
               "(tolerance 1e-5)\n", how, d == 1 ? 'A' : 'B', sp, sx, dl, dg);
        CHECK(dl < 1e-6 && dg < 1e-5, "%s: document %d's loss and gradients equal its own (%.3g, %.3g)", how, d, dl, dg);
        free(gp);
        free(gx);
    }
    kiln_batch_free(p);
    kiln_batch_free(x);
}

static void eager_vs_compiled(kiln_llama *m, kiln_compiled *cs_docs) {
    kiln_batch *p = kiln_batch_alloc(1, TT);
    packed_row(p, 0);
    int64_t n;
    float *ge, *gc;
    double se = run_grads(m, p, NULL, &ge, &n), sc = run_grads(m, p, cs_docs, &gc, &n);
    double dg = rel_diff(gc, ge, n), dl = t_rel(sc, se);
    printf("  packed documents, compiled vs eager: loss %.7f vs %.7f (rel %.1e), gradients max rel diff %.2e\n", sc, se, dl,
           dg);
    CHECK(dl < 1e-6 && dg < 1e-5, "compiled = eager with --pack documents (%.3g, %.3g)", dl, dg);
    free(ge);
    free(gc);
    /* a step compiled for plain rows refuses a segmented batch (it would
     * silently attend across documents) */
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_compiled *plain = kiln_train_compile(m, &co, true);
    kiln_train_config c;
    kiln_train_config_default(&c);
    kiln_adamw *o = kiln_adamw_new(m, &c);
    kiln_step_result r;
    kiln_batch *mb[1] = {p};
    kiln_status st = kiln_train_window_ex(m, o, &c, mb, 1, 1e-3, &r, plain);
    CHECK(st != KILN_OK && strstr(kiln_last_error(), "packed documents"), "plain compiled step on packed documents: %s",
          kiln_last_error());
    kiln_adamw_free(o);
    kiln_compiled_free(plain);
    kiln_batch_free(p);
}

/* window > 0: a Mistral whose sliding window (shorter than both documents)
 * applies inside each document of the packed row as in it alone; with
 * gemma3, Gemma 3's layers (layer 0 slides with the local RoPE base, layer
 * 1 attends fully), norms and GeGLU */
static void test_equivalence(int64_t window, kiln_family family) {
    for (int i = 0; i <= LA; i++) tok_a[i] = 3 + (int32_t)(kiln_rng_u64(21, (uint64_t)i) % 58);
    for (int i = 0; i <= LB; i++) tok_b[i] = 3 + (int32_t)(kiln_rng_u64(22, (uint64_t)i) % 58);
    kiln_llama_config mc = pack_config();
    if (window) {
        mc.family = family, mc.sliding_window = window;
        if (family == KILN_FAMILY_GEMMA3) {
            mc.sliding_window_pattern = 2, mc.query_pre_attn_scalar = (double)mc.head_dim, mc.rope_local_base_freq = 10000.0;
            mc.rope_theta = 1e6;
        }
        CHECK_OK(kiln_llama_config_validate(&mc));
        printf(" with sliding_window %lld (%s):\n", (long long)window, kiln_family_name(family));
    }
    kiln_llama *m = kiln_llama_new(&mc, 5);
    logits_alone(m);
    grads_alone(m, NULL, NULL, "eager");
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    co.verify_graph = true;
    kiln_compiled *cs_docs = kiln_train_compile_ex(m, &co, true, true), *cs_plain = kiln_train_compile(m, &co, true);
    grads_alone(m, cs_docs, cs_plain, "compiled");
    const kiln_graph *g = kiln_compiled_graph(cs_docs);
    int flash_seg = 0;
    for (int i = 0; g && i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind == KILN_V_OP && g->v[i].op == KILN_OP_FLASH_ATTN && g->v[i].n_in == 5) flash_seg++;
    CHECK(flash_seg == mc.num_hidden_layers, "the compiled step runs flash attention with segment ids (%d ops)", flash_seg);
    eager_vs_compiled(m, cs_docs);
    kiln_compiled_free(cs_docs);
    kiln_compiled_free(cs_plain);
    kiln_llama_free(m);
}

/* ---- the flash kernels against the decomposition ------------------------ */
/* The op the compiler rewrites to (flash_attn with segment ids) against the
 * model's decomposition with the segment mask, forward and gradients, on
 * rows whose segments are contiguous documents (short and longer than a
 * block: tiles skipped and mixed) and on a row of interleaved segments
 * (nothing skippable: the per-element mask alone), with padding. */
static void flash_segments(void) {
    const int64_t B = 3, H = 4, Hkv = 2, T = 200, D = 16;
    int64_t sq[4] = {B, H, T, D}, skv[4] = {B, Hkv, T, D}, s2[2] = {B, T};
    kiln_tensor *q = kiln_tensor_new(KILN_F32, 4, sq), *k = kiln_tensor_new(KILN_F32, 4, skv),
                *v = kiln_tensor_new(KILN_F32, 4, skv), *pad = kiln_tensor_new(KILN_I32, 2, s2),
                *seg = kiln_tensor_new(KILN_I32, 2, s2), *R = kiln_tensor_new(KILN_F32, 4, sq);
    kiln_rng r = {31, 0};
    kiln_rng_uniform(&r, kiln_f32(q), kiln_tensor_numel(q), -1, 1);
    kiln_rng_uniform(&r, kiln_f32(k), kiln_tensor_numel(k), -1, 1);
    kiln_rng_uniform(&r, kiln_f32(v), kiln_tensor_numel(v), -1, 1);
    kiln_rng_uniform(&r, kiln_f32(R), kiln_tensor_numel(R), -1, 1);
    const int docs0[] = {7, 70, 3, 30, 64, 10}; /* row 0: 184 real, 16 pad */
    for (int64_t t = 0, d = 0, left = docs0[0]; t < T; t++) {
        bool real = d < 6;
        kiln_i32(pad)[t] = real;
        kiln_i32(seg)[t] = real ? (int32_t)d + 1 : 0;
        if (real && --left == 0 && ++d < 6) left = docs0[d];
    }
    for (int64_t t = 0; t < T; t++) { /* row 1: two documents of 100; row 2: interleaved, no padding */
        kiln_i32(pad)[T + t] = 1, kiln_i32(seg)[T + t] = t < 100 ? 1 : 2;
        kiln_i32(pad)[2 * T + t] = 1, kiln_i32(seg)[2 * T + t] = 1 + (int32_t)(kiln_rng_u64(32, (uint64_t)t) % 3);
    }
    kiln_tensor *in[3] = {q, k, v};
    float *g[2][3];
    kiln_tensor *out[2];
    for (int way = 0; way < 2; way++) {
        for (int i = 0; i < 3; i++) in[i]->requires_grad = true;
        if (way == 0) {
            out[0] = kiln_flash_attn_seg(q, k, v, pad, seg, 0.25);
        } else {
            kiln_tensor *kr = kiln_repeat_kv(k, H / Hkv), *vr = kiln_repeat_kv(v, H / Hkv);
            kiln_tensor *sc = kiln_matmul(q, kr, KILN_MM_BATCHED, false, true), *s1 = kiln_scale(sc, 0.25);
            kiln_tensor *mask = kiln_attn_mask_seg(pad, seg, T), *s3 = kiln_add(s1, mask), *p = kiln_softmax(s3);
            out[1] = kiln_matmul(p, vr, KILN_MM_BATCHED, false, false);
            kiln_tensor *tmp[] = {kr, vr, sc, s1, mask, s3, p};
            for (int i = 0; i < 7; i++) kiln_tensor_release(tmp[i]);
        }
        CHECK(out[way] != NULL, "attention %d: %s", way, kiln_last_error());
        if (!out[way]) return;
        CHECK_OK(kiln_backward_with(out[way], R));
        for (int i = 0; i < 3; i++) {
            int64_t n = kiln_tensor_numel(in[i]);
            g[way][i] = malloc((size_t)n * sizeof(float));
            memcpy(g[way][i], in[i]->grad->data, (size_t)n * sizeof(float));
            kiln_tensor_release(in[i]->grad);
            in[i]->grad = NULL;
            in[i]->requires_grad = false;
        }
    }
    double dout = rel_diff(kiln_f32(out[0]), kiln_f32(out[1]), kiln_tensor_numel(out[0])), dg = 0;
    for (int i = 0; i < 3; i++) dg = fmax(dg, rel_diff(g[0][i], g[1][i], kiln_tensor_numel(in[i])));
    printf("  flash attention with segments vs the masked decomposition: output max rel diff %.2e, dq/dk/dv %.2e "
           "(tolerance 1e-5)\n", dout, dg);
    CHECK(dout < 1e-5 && dg < 1e-5, "flash with segments = decomposition (%.3g, %.3g)", dout, dg);
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 3; i++) free(g[w][i]);
    kiln_tensor *rel[] = {q, k, v, pad, seg, R, out[0], out[1]};
    for (int i = 0; i < 8; i++) kiln_tensor_release(rel[i]);
}

/* 1 thread and all of them: the backward's tasks (batch, kv head, part of
 * the key blocks) are the same either way, the threads only share them */
static void test_flash_segments(void) {
    int nth = omp_get_max_threads();
    omp_set_num_threads(1);
    flash_segments();
    omp_set_num_threads(nth);
    if (nth > 1) flash_segments();
}

/* ---- the loader ------------------------------------------------------------ */
#define LV 1000
#define LEOS 1
#define LPAD 2
#define LT 8

/* Documents of these lengths (tokens with the closing eos); token at shard
 * index i is 3 + i, so an input names its shard index. */
static const int doc_len[] = {4, 5, 3, 20, 2, 1, 9, 6, 11, 3, 7, 8, 2, 17, 4};
#define N_DOCS ((int)(sizeof doc_len / sizeof doc_len[0]))
static int32_t ltok[256];
static int ldoc[256]; /* document of each shard index */
static uint8_t lmask[256];
static size_t ln;

static void make_shard(const char *path, bool masked) {
    ln = 0;
    for (int d = 0; d < N_DOCS; d++) {
        for (int i = 0; i < doc_len[d]; i++, ln++) {
            ltok[ln] = i + 1 == doc_len[d] ? LEOS : 3 + (int32_t)ln;
            ldoc[ln] = d;
            lmask[ln] = (ln % 3) != 1;
        }
    }
    kiln_shard_info info = {.vocab_size = LV, .eos_id = LEOS, .pad_id = LPAD, .bos_id = 0xffffffffu, .n_docs = N_DOCS};
    CHECK_OK(kiln_shard_write_masked(path, ltok, masked ? lmask : NULL, ln, &info));
}

static kiln_loader *open_docs(const char *path, int B, bool shuffle, uint64_t seed) {
    kiln_loader_config c = {.path = path, .batch_size = B, .seq_len = LT, .mode = KILN_PACK_DOCUMENTS, .shuffle = shuffle,
                            .seed = seed};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&c, &l));
    return l;
}

/* Checks every row of an epoch; counts how often each shard index is an
 * input (must be once for every token that is not an eos). */
static bool check_epoch(kiln_loader *l, int64_t epoch, bool masked, int *seen, int64_t *pieces_cut) {
    kiln_batch *b = kiln_batch_alloc(3, LT);
    bool ok = true;
    for (int64_t k = 0; k < kiln_loader_len(l) && ok; k++) {
        ok = kiln_loader_get(l, epoch, k, b) == KILN_OK && b->segmented;
        int64_t targets = 0;
        for (int r = 0; r < 3 && ok; r++) {
            int seg = 0, pos = 0, prev = -1;
            bool in_pad = false;
            for (int t = 0; t < LT && ok; t++) {
                int i = r * LT + t;
                if (!b->pad_mask[i]) { /* padding: to the end of the row */
                    in_pad = true;
                    ok = b->input_ids[i] == LPAD && b->targets[i] == KILN_IGNORE_INDEX && b->segments[i] == 0;
                    continue;
                }
                int idx = b->input_ids[i] - 3;
                ok = !in_pad && r < b->rows && idx >= 0 && (size_t)idx + 1 < ln && ltok[idx] != LEOS;
                if (!ok) break;
                bool starts = b->segments[i] != seg;
                if (starts) { /* a new segment: the next id, position 0, a document start or a piece cut at T */
                    int first = idx;
                    while (first > 0 && ldoc[first - 1] == ldoc[idx]) first--;
                    ok = b->segments[i] == seg + 1 && b->positions[i] == 0 && (idx - first) % LT == 0;
                    if (idx != first) ++*pieces_cut;
                    seg = b->segments[i], pos = 0;
                } else {
                    ok = b->positions[i] == pos + 1 && idx == prev + 1; /* the next token of the same piece */
                    pos++;
                }
                /* the target is the next token of the same document, unless masked */
                int32_t want = masked && !lmask[idx + 1] ? KILN_IGNORE_INDEX : ltok[idx + 1];
                ok = ok && ldoc[idx + 1] == ldoc[idx] && b->targets[i] == want;
                targets += b->targets[i] != KILN_IGNORE_INDEX;
                seen[idx]++;
                prev = idx;
            }
        }
        ok = ok && targets == b->n_targets;
        if (!ok) CHECK(0, "documents batch (epoch %lld, index %lld) is wrong", (long long)epoch, (long long)k);
    }
    kiln_batch_free(b);
    return ok;
}

static void test_loader(bool masked) {
    char path[128];
    snprintf(path, sizeof path, "%s/docs%d.bin", tmpdir, masked);
    make_shard(path, masked);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        kiln_loader *l = open_docs(path, 3, shuffle, 7);
        if (!l) return;
        int64_t inputs = 0;
        for (size_t i = 0; i < ln; i++) inputs += ltok[i] != LEOS;
        int64_t rows = kiln_loader_items(l);
        CHECK(rows >= (inputs + LT - 1) / LT && rows <= inputs, "rows %lld for %lld inputs", (long long)rows, (long long)inputs);
        for (int64_t e = 0; e < 2; e++) {
            int seen[256] = {0};
            int64_t cut = 0;
            if (!check_epoch(l, e, masked, seen, &cut)) break;
            bool once = true;
            for (size_t i = 0; i < ln; i++) once &= seen[i] == (ltok[i] != LEOS);
            CHECK(once, "epoch %lld covers every input once (shuffle %d)", (long long)e, shuffle);
            CHECK(cut == 4, "the documents longer than a row are cut into row-sized pieces (%lld cuts)", (long long)cut);
        }
        if (!shuffle) printf("  documents: %lld inputs in %lld rows of %d (%.0f%% filled)\n", (long long)inputs,
                             (long long)rows, LT, 100.0 * (double)inputs / (double)(rows * LT));
        kiln_loader_close(l);
    }
}

static bool same_batch(const kiln_batch *a, const kiln_batch *b) {
    size_t n = (size_t)a->B * a->T * sizeof(int32_t);
    return a->rows == b->rows && a->n_targets == b->n_targets && !memcmp(a->input_ids, b->input_ids, n) &&
           !memcmp(a->targets, b->targets, n) && !memcmp(a->pad_mask, b->pad_mask, n) &&
           !memcmp(a->positions, b->positions, n) && !memcmp(a->segments, b->segments, n);
}

/* A pure function of (seed, epoch, index); resuming from a state gives the
 * batches an uninterrupted loader gives; the seed changes the order. */
static void test_order_resume(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/docs0.bin", tmpdir);
    kiln_loader *a = open_docs(path, 3, true, 11), *r = open_docs(path, 3, true, 11), *c = open_docs(path, 3, true, 12),
                *u = open_docs(path, 3, false, 11);
    if (!a || !r || !c || !u) return;
    kiln_batch *x = kiln_batch_alloc(3, LT), *y = kiln_batch_alloc(3, LT);
    int64_t len = kiln_loader_len(a), total = 3 * len + 2, differ_seed = 0, differ_epoch = 0;
    CHECK(kiln_loader_len(c) >= 1 && kiln_loader_len(u) >= 1, "sizes");
    bool same = true;
    for (int64_t s = 0; s < total; s++) {
        CHECK_OK(kiln_loader_next(a, x));
        if (s == len + 1) { /* resume mid-epoch from the state alone */
            kiln_loader_state st = {.epoch = 1, .next_index = 1};
            CHECK_OK(kiln_loader_set_state(r, st));
        }
        if (s > len) {
            CHECK_OK(kiln_loader_next(r, y));
            same &= same_batch(x, y);
        }
        if (s < len) {
            CHECK_OK(kiln_loader_get(a, 1, s, y)); /* the next epoch, same index */
            differ_epoch += !same_batch(x, y);
            CHECK_OK(kiln_loader_get(c, 0, s < kiln_loader_len(c) ? s : 0, y));
            differ_seed += !same_batch(x, y);
        }
    }
    CHECK(same, "resumed loader gives the uninterrupted batches");
    CHECK(differ_epoch > 0 && differ_seed > 0, "epochs and seeds reorder the documents (%lld, %lld differ)",
          (long long)differ_epoch, (long long)differ_seed);
    /* without shuffle: documents in file order, the first row starts with the first document */
    CHECK_OK(kiln_loader_get(u, 0, 0, x));
    CHECK(x->input_ids[0] == 3 && x->positions[0] == 0 && x->segments[0] == 1, "file order without shuffle");
    kiln_batch_free(x);
    kiln_batch_free(y);
    kiln_loader_close(a);
    kiln_loader_close(r);
    kiln_loader_close(c);
    kiln_loader_close(u);
}

/* ---- accumulation ------------------------------------------------------------ */
/* k = 2 micro-batches of 2 rows, each scaled by 1 / (targets of the window),
 * give the gradients of one batch of 4 rows scaled by 1 / its targets, with
 * a loss mask (masked targets count nowhere), eager and compiled. */
static void test_accumulation(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/docs1.bin", tmpdir);
    kiln_loader *big = open_docs(path, 4, false, 0), *small = open_docs(path, 2, false, 0);
    if (!big || !small) return;
    kiln_llama_config mc = pack_config();
    mc.vocab_size = LV;
    kiln_llama *m = kiln_llama_new(&mc, 9);
    kiln_batch *bb = kiln_batch_alloc(4, LT), *mb[2] = {kiln_batch_alloc(2, LT), kiln_batch_alloc(2, LT)};
    CHECK_OK(kiln_loader_get(big, 0, 0, bb));
    CHECK_OK(kiln_loader_get(small, 0, 0, mb[0]));
    CHECK_OK(kiln_loader_get(small, 0, 1, mb[1]));
    int64_t n_all = 0;
    for (int i = 0; i < 4 * LT; i++) n_all += bb->pad_mask[i] && bb->targets[i] == KILN_IGNORE_INDEX;
    CHECK(n_all > 0 && mb[0]->n_targets + mb[1]->n_targets == bb->n_targets, "the window counts only unmasked targets");
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_compiled *cs = kiln_train_compile_ex(m, &co, true, true);
    for (int compiled = 0; compiled < 2; compiled++) {
        int64_t n;
        float *g1, *g2;
        kiln_compiled *c = compiled ? cs : NULL;
        /* one batch of 4, normalised by its targets */
        kiln_llama_zero_grad(m);
        kiln_tensor *t[6];
        wrap(bb, t);
        kiln_f32(t[3])[0] = 1.0f / (float)bb->n_targets;
        float rep[1];
        if (c) {
            CHECK_OK(kiln_compiled_run(c, t, rep));
        } else {
            kiln_llama_docs d = {t[4], t[5]};
            kiln_tensor *loss = kiln_ce_loss(m, t[0], t[1], t[2], &d), *sc = kiln_scale_by(loss, t[3]);
            CHECK_OK(kiln_backward(sc));
            kiln_tensor_release(loss);
            kiln_tensor_release(sc);
        }
        unwrap(t);
        g1 = grads_of(m, &n);
        /* two micro-batches of 2 into the same gradients */
        kiln_llama_zero_grad(m);
        for (int k = 0; k < 2; k++) {
            wrap(mb[k], t);
            kiln_f32(t[3])[0] = 1.0f / (float)bb->n_targets;
            if (c) {
                CHECK_OK(kiln_compiled_run(c, t, rep));
            } else {
                kiln_llama_docs d = {t[4], t[5]};
                kiln_tensor *loss = kiln_ce_loss(m, t[0], t[1], t[2], &d), *sc = kiln_scale_by(loss, t[3]);
                CHECK_OK(kiln_backward(sc));
                kiln_tensor_release(loss);
                kiln_tensor_release(sc);
            }
            unwrap(t);
        }
        g2 = grads_of(m, &n);
        double d = rel_diff(g2, g1, n);
        printf("  %s: 2 accumulated micro-batches of 2 vs one of 4 (packed documents, masked): gradients max rel diff %.2e\n",
               c ? "compiled" : "eager", d);
        CHECK(d < 1e-5, "accumulated = big batch with --pack documents (%.3g)", d);
        free(g1);
        free(g2);
    }
    kiln_compiled_free(cs);
    kiln_batch_free(bb);
    kiln_batch_free(mb[0]);
    kiln_batch_free(mb[1]);
    kiln_llama_free(m);
    kiln_loader_close(big);
    kiln_loader_close(small);
}

/* ---- against PyTorch ------------------------------------------------------------ */
/* tests/reference/make_pack_fixture.py: the loader's rows of its document
 * stream (ids, labels, padding, positions, segments) equal the fixture's,
 * and the mean loss, logits and gradients of those rows, eager and
 * compiled, equal PyTorch's (RoPE at position_ids, block-diagonal mask). */
#define FIX "tests/fixtures/"
static const int32_t *st_i32(const kiln_st_file *f, const char *name, int64_t n) {
    const kiln_st_tensor *t = kiln_st_find(f, name);
    bool ok = t && t->dtype == KILN_I32 && (int64_t)(t->nbytes / 4) == n;
    CHECK(ok, "fixture tensor %s", name);
    return ok ? t->bytes : NULL;
}

static void test_torch(void) {
    kiln_llama_config cfg;
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_llama_config_load(FIX "pack_ref.config.json", &cfg));
    CHECK_OK(kiln_st_open(FIX "pack_ref.safetensors", &f));
    if (!f) return;
    const kiln_st_tensor *stream = kiln_st_find(f, "stream"), *labels = kiln_st_find(f, "labels");
    const kiln_st_tensor *ref_loss = kiln_st_find(f, "loss"), *ref_logits = kiln_st_find(f, "logits");
    CHECK(stream && labels && ref_loss && ref_logits, "fixture tensors");
    if (!stream || !labels || !ref_loss || !ref_logits) return kiln_st_close(f);
    int B = (int)labels->shape[0], T = (int)labels->shape[1];
    int64_t n = B * T;
    const int32_t *ids = st_i32(f, "input_ids", n), *lab = st_i32(f, "labels", n), *am = st_i32(f, "attention_mask", n);
    const int32_t *pos = st_i32(f, "position_ids", n), *seg = st_i32(f, "segment_ids", n);
    char path[128];
    snprintf(path, sizeof path, "%s/torch.bin", tmpdir);
    kiln_shard_info info = {.vocab_size = (uint32_t)cfg.vocab_size, .eos_id = (uint32_t)cfg.eos_token_id, .pad_id = 2,
                            .bos_id = 0xffffffffu, .n_docs = 9};
    CHECK_OK(kiln_shard_write(path, stream->bytes, (size_t)stream->shape[0], &info));
    kiln_loader_config lc = {.path = path, .batch_size = B, .seq_len = T, .mode = KILN_PACK_DOCUMENTS};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    kiln_batch *b = kiln_batch_alloc(B, T);
    if (!l || !b || !ids || !lab || !am || !pos || !seg) goto out;
    CHECK(kiln_loader_len(l) == 1, "the fixture's rows are one batch (%lld)", (long long)kiln_loader_len(l));
    CHECK_OK(kiln_loader_get(l, 0, 0, b));
    bool same = true;
    for (int64_t i = 0; i < n; i++)
        same &= b->input_ids[i] == ids[i] && b->targets[i] == lab[i] && b->pad_mask[i] == am[i] &&
                (!am[i] || (b->positions[i] == pos[i] && b->segments[i] == seg[i]));
    CHECK(same, "the loader's packed rows equal the reference's");
    kiln_llama *m = kiln_llama_new(&cfg, 1);
    for (int i = 0; m && i < m->n_params; i++) {
        const kiln_st_tensor *t = kiln_st_find(f, m->params[i]->name);
        if (t && t->nbytes == kiln_tensor_nbytes(m->params[i])) memcpy(m->params[i]->data, t->bytes, t->nbytes);
        else CHECK(0, "fixture parameter %s", m->params[i]->name);
    }
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    kiln_compiled *cs = m ? kiln_train_compile_ex(m, &co, true, true) : NULL;
    for (int compiled = 0; m && compiled < 2; compiled++) {
        int64_t np;
        float *g;
        double sum = run_grads(m, b, compiled ? cs : NULL, &g, &np) / (double)b->n_targets;
        double le = t_rel(sum, ((const float *)ref_loss->bytes)[0]), worst = 0;
        /* run_grads differentiates the sum: PyTorch's gradients are of the mean */
        for (int64_t i = 0, o = 0; i < m->n_params; o += kiln_tensor_numel(m->params[i]), i++) {
            char gn[160];
            snprintf(gn, sizeof gn, "grad.%s", m->params[i]->name);
            const kiln_st_tensor *rg = kiln_st_find(f, gn);
            int64_t k = kiln_tensor_numel(m->params[i]);
            if (!rg || rg->nbytes != (size_t)k * 4) {
                CHECK(0, "fixture gradient %s", gn);
                continue;
            }
            for (int64_t j = 0; j < k; j++) g[o + j] /= (float)b->n_targets;
            worst = fmax(worst, rel_diff(g + o, rg->bytes, k));
        }
        printf("  vs PyTorch (%s): %d rows of %d, loss %.7f (PyTorch %.7f, rel %.1e), worst parameter-gradient rel diff "
               "%.2e (tolerance 1e-4)\n", compiled ? "compiled" : "eager", B, T, sum, ((const float *)ref_loss->bytes)[0], le,
               worst);
        CHECK(le < 1e-5 && worst < 1e-4, "%s packed documents = PyTorch (%.3g, %.3g)", compiled ? "compiled" : "eager", le,
              worst);
        free(g);
    }
    if (m) { /* the logits of the real tokens */
        kiln_tensor *t[6];
        wrap(b, t);
        kiln_llama_docs d = {t[4], t[5]};
        bool was = kiln_grad_set_enabled(false);
        kiln_tensor *lg = kiln_llama_forward_ex(m, t[0], t[2], &d, NULL);
        kiln_grad_set_enabled(was);
        double worst = 0, scale = 0;
        int64_t V = cfg.vocab_size;
        for (int64_t i = 0; lg && i < n; i++)
            for (int64_t v = 0; am[i] && v < V; v++) {
                worst = fmax(worst, fabs((double)kiln_f32(lg)[i * V + v] - ((const float *)ref_logits->bytes)[i * V + v]));
                scale = fmax(scale, fabs((double)((const float *)ref_logits->bytes)[i * V + v]));
            }
        printf("  vs PyTorch: logits of the real tokens max rel diff %.2e\n", worst / scale);
        CHECK(lg && worst / scale < 1e-4, "packed logits = PyTorch (%.3g)", worst / scale);
        kiln_tensor_release(lg);
        unwrap(t);
    }
    kiln_compiled_free(cs);
    kiln_llama_free(m);
out:
    kiln_batch_free(b);
    kiln_loader_close(l);
    kiln_st_close(f);
}

/* Bad inputs: a mode past the list, a shard without any document input. */
static void test_refusals(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/eos.bin", tmpdir);
    int32_t only_eos[3] = {LEOS, LEOS, LEOS};
    kiln_shard_info info = {.vocab_size = LV, .eos_id = LEOS, .pad_id = LPAD, .bos_id = 0xffffffffu, .n_docs = 3};
    CHECK_OK(kiln_shard_write(path, only_eos, 3, &info));
    kiln_loader_config c = {.path = path, .batch_size = 1, .seq_len = LT, .mode = KILN_PACK_DOCUMENTS};
    kiln_loader *l = NULL;
    CHECK(kiln_loader_open(&c, &l) == KILN_ERR_INVALID && strstr(kiln_last_error(), "documents"),
          "empty documents refused: %s", kiln_last_error());
    c.mode = (kiln_pack_mode)(KILN_PACK_PAIRS + 1);
    CHECK(kiln_loader_open(&c, &l) == KILN_ERR_INVALID && strstr(kiln_last_error(), "mode 4"), "unknown mode: %s",
          kiln_last_error());
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    const kiln_setting *s = kiln_setting_find("pack");
    CHECK(s && kiln_setting_parse(s, "documents", &tc) == KILN_OK && tc.pack == KILN_PACK_DOCUMENTS, "--pack documents");
}

int main(void) {
    if (!t_tmpdir(tmpdir, sizeof tmpdir, "pack")) return 1;
    kiln_eager_enable();
    printf("loader (documents mode):\n");
    test_loader(false);
    test_loader(true);
    test_order_resume();
    test_refusals();
    printf("flash attention kernels:\n");
    test_flash_segments();
    printf("documents A and B in one row against each alone:\n");
    test_equivalence(0, KILN_FAMILY_LLAMA);
    test_equivalence(16, KILN_FAMILY_MISTRAL);
    test_equivalence(16, KILN_FAMILY_GEMMA3);
    printf("against PyTorch:\n");
    test_torch();
    printf("accumulation:\n");
    test_accumulation();
    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
