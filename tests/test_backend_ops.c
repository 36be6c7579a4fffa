/* Every op on every backend (as ggml's test-backend-ops): each op of
 * KILN_OP_LIST runs through the registry (kiln_op_call_aux) on inputs of
 * several shapes, odd sizes among them, on the CPU and on every other
 * backend of KILN_BACKENDS; its outputs, read back with kiln_tensor_get,
 * must equal the CPU's bit for bit (the backends share the kernels). Each
 * differentiable op's backward rule runs the same way on a random incoming
 * gradient, its gradients compared bit for bit. An op no case covers must
 * be a stated exemption (none today): a new op without a case fails here.
 * Also: the seam's own kernels (gradient accumulation, a product into an
 * existing buffer), the planned-graph interpreter on each device, an op
 * given inputs on two devices, and a cpu-isolated tensor refusing
 * kiln_tensor_map. In the strict sanitizer build (-DKILN_STRICT_DEVICE)
 * cpu-isolated memory faults on any host access outside its backend's
 * calls, so this test also proves that nothing on these paths reads device
 * memory behind the seam. */
#include "kiln/backend.h"
#include "kiln/graph.h"
#include "kiln/kernels.h"
#include "test.h"

static uint64_t seed_ctr = 1;
static bool fwd_cov[KILN_OP_COUNT], bwd_cov[KILN_OP_COUNT];
static int n_cases, n_compared;

/* ---- host inputs ----------------------------------------------------------- */
static kiln_tensor *host_new(kiln_dtype dt, int ndim, const int64_t *shape) {
    return kiln_tensor_new_on(&kiln_buft_host, dt, ndim, shape);
}
static kiln_tensor *rnd(int ndim, const int64_t *shape, float lo, float hi) {
    kiln_tensor *t = host_new(KILN_F32, ndim, shape);
    kiln_rng r = {seed_ctr++, 0};
    kiln_rng_uniform(&r, kiln_tensor_map(t), kiln_tensor_numel(t), lo, hi);
    return t;
}
#define DIMS(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), (int64_t[]){__VA_ARGS__}
#define RND(lo, hi, ...) rnd(DIMS(__VA_ARGS__), lo, hi)
/* i32 [B, T]: kind 0 ids in [0, V) (every 7th KILN_IGNORE_INDEX when V < 0),
 * 1 a padding mask (row b > 0 has b·3 pads on the left), 2 segment ids,
 * 3 positions restarting with each segment */
static kiln_tensor *ints(int64_t B, int64_t T, int kind, int64_t V) {
    int64_t s[2] = {B, T};
    kiln_tensor *t = host_new(KILN_I32, 2, s);
    int32_t *p = kiln_tensor_map(t);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0, seg = 1, pos = 0; i < T; i++, pos++) {
            if (pos == 3 + 4 * seg) seg++, pos = 0;
            int64_t k = b * T + i;
            if (kind == 0) {
                int64_t v = V < 0 ? -V : V;
                p[k] = (int32_t)(kiln_rng_u64(seed_ctr, (uint64_t)k) % (uint64_t)v);
                if (V < 0 && k % 7 == 3) p[k] = KILN_IGNORE_INDEX;
            } else if (kind == 1) {
                p[k] = i >= b * 3 || i == T - 1;
            } else {
                p[k] = (int32_t)(kind == 2 ? seg : pos);
            }
        }
    seed_ctr++;
    return t;
}
static kiln_tensor *scalar(float v) {
    int64_t one = 1;
    kiln_tensor *t = host_new(KILN_F32, 1, &one);
    kiln_tensor_set(t, 0, &v, sizeof v);
    return t;
}
static int64_t f64_bits(double d) {
    int64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* ---- one case on every backend ------------------------------------------- */
typedef struct {
    char name[96];
    int op, n_in;
    kiln_tensor *in[KILN_OP_MAX_IN]; /* host */
    kiln_attrs a;
    bool backward; /* run the backward rule too */
} kcase;

typedef struct {
    void *p[1 + KILN_OP_MAX_AUX + KILN_OP_MAX_IN];
    size_t n[1 + KILN_OP_MAX_AUX + KILN_OP_MAX_IN];
    int count;
} blobs;

static void keep(blobs *b, const kiln_tensor *t) {
    size_t n = t ? kiln_tensor_nbytes(t) : 0;
    void *p = malloc(n ? n : 1);
    if (t && kiln_tensor_get(t, 0, p, n)) {
        CHECK(false, "read back: %s", kiln_last_error());
        n = 0;
    }
    b->p[b->count] = p;
    b->n[b->count++] = n;
}
static void blobs_free(blobs *b) {
    for (int i = 0; i < b->count; i++) free(b->p[i]);
    b->count = 0;
}

static kiln_tensor *to_device(const kiln_backend *be, const kiln_tensor *h) {
    kiln_tensor *t = kiln_tensor_new_on(be->buft, h->dtype, h->ndim, h->shape);
    if (t && kiln_tensor_copy(t, 0, h, 0, kiln_tensor_nbytes(h))) {
        kiln_tensor_release(t);
        return NULL;
    }
    return t;
}

/* Runs the case on backend be: the outputs (and the backward rule's
 * gradients) into out. */
static bool run_on(const kcase *c, const kiln_backend *be, blobs *out) {
    const kiln_op_def *d = kiln_op_get(c->op);
    const kiln_backend *was = kiln_backend_use(be); /* ops without inputs (fill) make theirs here */
    kiln_tensor *in[KILN_OP_MAX_IN] = {0}, *aux[KILN_OP_MAX_AUX] = {0}, *gin[KILN_OP_MAX_IN] = {0}, *gout = NULL;
    bool ok = true;
    for (int i = 0; i < c->n_in && ok; i++) ok = (in[i] = to_device(be, c->in[i])) != NULL;
    CHECK(ok, "%s on %s: inputs: %s", c->name, be->name, kiln_last_error());
    kiln_tensor *y = ok ? kiln_op_call_aux(c->op, in, c->n_in, &c->a, aux) : NULL;
    if (ok) CHECK(y != NULL, "%s on %s: %s", c->name, be->name, kiln_last_error());
    ok = ok && y;
    if (ok) {
        CHECK(kiln_backend_of(y) == be, "%s: the output is on %s, not %s", c->name, kiln_backend_of(y)->name, be->name);
        keep(out, y);
        for (int a = 0; a < d->n_aux; a++)
            if (c->op != KILN_OP_LINEAR_CE || c->a.i[1 + a]) keep(out, aux[a]); /* not made: a [1] placeholder */
    }
    if (ok && c->backward) {
        kiln_tensor *gh = rnd(y->ndim, y->shape, -1, 1);
        gout = to_device(be, gh);
        kiln_tensor_release(gh);
        kiln_bw_ctx ctx = {.op = c->op, .attrs = c->a, .n_in = c->n_in, .out = y};
        for (int i = 0; i < c->n_in; i++) {
            ctx.in[i] = in[i];
            ctx.in_meta[i] = kiln_meta_of(in[i]);
            ctx.needs[i] = !((d->nondiff_in >> i) & 1);
        }
        for (int a = 0; a < d->n_aux; a++) ctx.aux[a] = aux[a];
        kiln_status st = gout ? d->backward(&ctx, gout, gin) : kiln_last_status();
        CHECK(st == KILN_OK, "%s on %s: backward: %s", c->name, be->name, kiln_last_error());
        ok = st == KILN_OK;
        for (int i = 0; i < c->n_in && ok; i++) {
            if (!ctx.needs[i]) continue;
            CHECK(gin[i] && kiln_backend_of(gin[i]) == be, "%s: gradient %d missing or not on %s", c->name, i, be->name);
            keep(out, gin[i]);
        }
    }
    kiln_tensor_release(gout);
    for (int i = 0; i < KILN_OP_MAX_IN; i++) kiln_tensor_release(gin[i]);
    for (int a = 0; a < KILN_OP_MAX_AUX; a++) kiln_tensor_release(aux[a]);
    kiln_tensor_release(y);
    for (int i = 0; i < c->n_in; i++) kiln_tensor_release(in[i]);
    kiln_backend_use(was);
    return ok;
}

static void run_case(kcase *c) {
    n_cases++;
    blobs ref = {0};
    uint64_t seed0 = seed_ctr;
    bool ok = run_on(c, kiln_backend_at(KILN_DEVICE_CPU), &ref);
    for (int b = 0; b < KILN_N_DEVICES && ok; b++) {
        if (b == KILN_DEVICE_CPU) continue;
        const kiln_backend *be = kiln_backend_at(b);
        blobs got = {0};
        seed_ctr = seed0; /* the same incoming gradient */
        if (run_on(c, be, &got)) {
            CHECK(got.count == ref.count, "%s on %s: %d results, the CPU %d", c->name, be->name, got.count, ref.count);
            for (int k = 0; k < ref.count && k < got.count; k++) {
                bool same = got.n[k] == ref.n[k] && !memcmp(got.p[k], ref.p[k], ref.n[k]);
                CHECK(same, "%s on %s: result %d differs from the CPU's", c->name, be->name, k);
                n_compared++;
            }
        } else {
            ok = false;
        }
        blobs_free(&got);
    }
    blobs_free(&ref);
    if (ok) {
        fwd_cov[c->op] = true;
        if (c->backward) bwd_cov[c->op] = true;
    }
    for (int i = 0; i < c->n_in; i++) kiln_tensor_release(c->in[i]);
}

/* CASE(op, backward, attrs, inputs...) with a printf-style name first */
#define CASE(nm, opid, bw, attrs, ...)                                                      \
    do {                                                                                    \
        kcase c_ = {.op = (opid), .backward = (bw), .a = attrs};                            \
        kiln_tensor *t_[] = {__VA_ARGS__};                                                  \
        c_.n_in = (int)(sizeof t_ / sizeof t_[0]);                                          \
        for (int i_ = 0; i_ < c_.n_in; i_++) c_.in[i_] = t_[i_];                            \
        snprintf(c_.name, sizeof c_.name, "%s", nm);                                        \
        run_case(&c_);                                                                      \
    } while (0)
#define A(...) ((kiln_attrs){__VA_ARGS__})
#define NOATTR ((kiln_attrs){.i = {0}})

/* sizes: small odd, medium odd, large enough for the threaded paths */
static const int64_t Ts[] = {5, 37, 301}, Cs[] = {3, 24, 80}, Vs[] = {7, 29, 50};

static void ops_pointwise(int v) {
    int64_t T = Ts[v], C = Cs[v];
    CASE("add", KILN_OP_ADD, true, NOATTR, RND(-1, 1, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("add (broadcast)", KILN_OP_ADD, true, NOATTR, RND(-1, 1, 2, 3, T, C), RND(-1, 1, 2, 1, T, 1));
    CASE("add (row broadcast)", KILN_OP_ADD, true, NOATTR, RND(-1, 1, 3, T, C), RND(-1, 1, C));
    CASE("mul", KILN_OP_MUL, true, NOATTR, RND(-1, 1, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("scale", KILN_OP_SCALE, true, A(.f = {-0.37}), RND(-1, 1, 3, T, C));
    CASE("scale_by", KILN_OP_SCALE_BY, true, NOATTR, RND(-1, 1, 3, T, C), scalar(1.7f));
    CASE("silu", KILN_OP_SILU, true, NOATTR, RND(-6, 6, 3, T, C));
    CASE("silu_backward", KILN_OP_SILU_BWD, false, NOATTR, RND(-6, 6, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("sum", KILN_OP_SUM, true, NOATTR, RND(-1, 1, 3, T, C));
    CASE("mean", KILN_OP_MEAN, true, NOATTR, RND(-1, 1, 3, T, C));
    kiln_attrs e = {.i = {3, 3, T, C}};
    CASE("expand", KILN_OP_EXPAND, true, e, RND(-1, 1, 1));
    kiln_attrs st = {.i = {4, 2, 1, T, 1}};
    CASE("sum_to", KILN_OP_SUM_TO, false, st, RND(-1, 1, 2, 3, T, C));
    kiln_attrs st2 = {.i = {1, C}};
    CASE("sum_to (rows)", KILN_OP_SUM_TO, false, st2, RND(-1, 1, 3, T, C));
    kiln_attrs f = {.i = {3, 2, T, C}, .f = {0.625}};
    { /* no inputs: made on the device in use */
        kcase c = {.op = KILN_OP_FILL, .a = f};
        snprintf(c.name, sizeof c.name, "fill");
        run_case(&c);
    }
    CASE("cast_bf16", KILN_OP_CAST_BF16, true, NOATTR, RND(-3, 3, 3, T, C));
    CASE("round_bf16", KILN_OP_ROUND_BF16, true, NOATTR, RND(-3, 3, 3, T, C));
    kiln_attrs r = {.i = {3, T, 3, C}};
    CASE("reshape", KILN_OP_RESHAPE, true, r, RND(-1, 1, 3, T, C));
    CASE("transpose12", KILN_OP_TRANSPOSE12, true, NOATTR, RND(-1, 1, 2, T, 3, C));
    CASE("dropout", KILN_OP_DROPOUT, true, A(.i = {7}, .f = {0.3}), RND(-1, 1, 3, T, C), scalar(4242.0f));
    CASE("dropout (slice at 1000)", KILN_OP_DROPOUT, false, A(.i = {3, 0, 0, 0, 0, 1000}, .f = {0.5}),
         RND(-1, 1, 3, T, C), scalar(17.0f));
}

static void ops_linalg(int v) {
    int64_t T = Ts[v], K = Cs[v], N = Vs[v] + 6, V = Vs[v];
    CASE("embedding", KILN_OP_EMBEDDING, true, NOATTR, RND(-1, 1, V, K), ints(2, T, 0, V));
    CASE("embedding_backward", KILN_OP_EMBEDDING_BWD, false, A(.i = {V}), RND(-1, 1, 2, T, K), ints(2, T, 0, V));
    CASE("matmul rows a.b^T (linear)", KILN_OP_MATMUL, true, A(.i = {KILN_MM_ROWS, 0, 1}), RND(-1, 1, 2, T, K),
         RND(-1, 1, N, K));
    CASE("matmul rows a.b", KILN_OP_MATMUL, true, A(.i = {KILN_MM_ROWS, 0, 0}), RND(-1, 1, T, K), RND(-1, 1, K, N));
    CASE("matmul rows bf16", KILN_OP_MATMUL, true, A(.i = {KILN_MM_ROWS, 0, 1, 1}), RND(-1, 1, 2, T, K),
         RND(-1, 1, N, K));
    CASE("matmul rows sgemm", KILN_OP_MATMUL, true, A(.i = {KILN_MM_ROWS, 0, 1, 0, KILN_GEMM_SGEMM}),
         RND(-1, 1, 2, T, K), RND(-1, 1, N, K));
    CASE("matmul grad", KILN_OP_MATMUL, false, A(.i = {KILN_MM_GRAD}), RND(-1, 1, 2, T, K), RND(-1, 1, 2, T, N));
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            char nm[64];
            snprintf(nm, sizeof nm, "matmul batched %s.%s", ta ? "a^T" : "a", tb ? "b^T" : "b");
            kiln_tensor *a = ta ? RND(-1, 1, 2, 3, K, T) : RND(-1, 1, 2, 3, T, K);
            kiln_tensor *b = tb ? RND(-1, 1, 2, 3, N, K) : RND(-1, 1, 2, 3, K, N);
            CASE(nm, KILN_OP_MATMUL, true, A(.i = {KILN_MM_BATCHED, ta, tb}), a, b);
        }
    /* a bf16 operand (a frozen bf16 base) */
    kiln_tensor *wf = RND(-1, 1, N, K), *wb = NULL;
    {
        kiln_tensor *in[1] = {wf};
        wb = kiln_op_call(KILN_OP_CAST_BF16, in, 1, NULL);
    }
    CASE("matmul rows, bf16 weight", KILN_OP_MATMUL, false, A(.i = {KILN_MM_ROWS, 0, 1, 1}), RND(-1, 1, 2, T, K), wb);
    kiln_tensor_release(wf);
}

static void ops_nn(int v) {
    int64_t T = Ts[v], C = Cs[v], D = v == 0 ? 4 : v == 1 ? 24 : 32, V = Vs[v];
    CASE("rmsnorm", KILN_OP_RMSNORM, true, A(.f = {1e-5}), RND(-2, 2, 3, T, C), RND(0.5f, 1.5f, C));
    CASE("rmsnorm_backward_x", KILN_OP_RMSNORM_BWD_X, false, A(.f = {1e-5}), RND(-2, 2, 3, T, C), RND(0.5f, 1.5f, C),
         RND(-1, 1, 3, T, C));
    CASE("rmsnorm_backward_w", KILN_OP_RMSNORM_BWD_W, false, A(.f = {1e-5}), RND(-2, 2, 3, T, C), RND(0.5f, 1.5f, C),
         RND(-1, 1, 3, T, C));
    CASE("rope", KILN_OP_ROPE, true, A(.i = {5}, .f = {10000.0}), RND(-1, 1, 2, T, 3, D));
    CASE("rope (inverse)", KILN_OP_ROPE, false, A(.i = {0, 1}, .f = {500000.0}), RND(-1, 1, 2, T, 3, D));
    CASE("rope (positions)", KILN_OP_ROPE, true, A(.i = {0, 2}, .f = {10000.0}), RND(-1, 1, 2, T, 3, D), ints(2, T, 3, 0));
    kiln_attrs l3 = {.i = {3, 0, KILN_ROPE_LLAMA3, 8192, f64_bits(1.0), f64_bits(4.0)}, .f = {500000.0, 8.0}};
    CASE("rope (llama3 scaling)", KILN_OP_ROPE, true, l3, RND(-1, 1, 2, T, 3, D));
    kiln_attrs lin = {.i = {1, 0, KILN_ROPE_LINEAR}, .f = {10000.0, 2.0}};
    CASE("rope (linear scaling)", KILN_OP_ROPE, false, lin, RND(-1, 1, 2, T, 3, D));
    CASE("repeat_kv", KILN_OP_REPEAT_KV, true, A(.i = {3}), RND(-1, 1, 2, 2, T, D));
    CASE("repeat_kv (1)", KILN_OP_REPEAT_KV, true, A(.i = {1}), RND(-1, 1, 2, 2, T, D));
    CASE("repeat_kv_backward", KILN_OP_REPEAT_KV_BWD, false, A(.i = {3}), RND(-1, 1, 2, 6, T, D));
    CASE("attn_mask", KILN_OP_ATTN_MASK, false, A(.i = {T}), ints(2, T, 1, 0));
    CASE("attn_mask (last queries)", KILN_OP_ATTN_MASK, false, A(.i = {T > 2 ? T - 2 : 1}), ints(2, T, 1, 0));
    CASE("attn_mask (segments)", KILN_OP_ATTN_MASK, false, A(.i = {T, 1}), ints(2, T, 1, 0), ints(2, T, 2, 0));
    CASE("attn_mask (window 3)", KILN_OP_ATTN_MASK, false, A(.i = {T, 0, 3}), ints(2, T, 1, 0));
    CASE("attn_mask (segments, window 2)", KILN_OP_ATTN_MASK, false, A(.i = {T, 1, 2}), ints(2, T, 1, 0), ints(2, T, 2, 0));
    int64_t Tq = v == 2 ? 61 : T;
    CASE("softmax", KILN_OP_SOFTMAX, true, NOATTR, RND(-3, 3, 2, 3, Tq, Tq));
    CASE("softmax_backward", KILN_OP_SOFTMAX_BWD, false, NOATTR, RND(0, 1, 2, 3, Tq, Tq), RND(-1, 1, 2, 3, Tq, Tq));
    CASE("cross_entropy", KILN_OP_CROSS_ENTROPY, true, A(.i = {KILN_IGNORE_INDEX}), RND(-3, 3, 2, T, V),
         ints(2, T, 0, -V));
    CASE("cross_entropy_backward", KILN_OP_CROSS_ENTROPY_BWD, false, A(.i = {KILN_IGNORE_INDEX}), RND(-3, 3, 2, T, V),
         ints(2, T, 0, -V), scalar(0.25f));
    /* the preference objectives' pieces: rows (2i, 2i+1) a pair */
    CASE("row_nll", KILN_OP_ROW_NLL, true, A(.i = {KILN_IGNORE_INDEX}), RND(-3, 3, 4, T, V), ints(4, T, 0, -V));
    CASE("row_nll_backward", KILN_OP_ROW_NLL_BWD, false, A(.i = {KILN_IGNORE_INDEX}), RND(-3, 3, 4, T, V), ints(4, T, 0, -V),
         RND(-1, 1, 4));
    CASE("row_inv_count", KILN_OP_ROW_INV_COUNT, false, A(.i = {KILN_IGNORE_INDEX}), ints(4, T, 0, -V));
    CASE("pair_diff", KILN_OP_PAIR_DIFF, true, NOATTR, RND(-3, 3, 6));
    CASE("pair_diff_backward", KILN_OP_PAIR_DIFF_BWD, false, NOATTR, RND(-3, 3, 3));
    CASE("pair_diff (sum)", KILN_OP_PAIR_DIFF, true, A(.i = {1}), RND(-3, 3, 6));
    CASE("logsigmoid", KILN_OP_LOGSIGMOID, true, NOATTR, RND(-30, 30, 3, T, C));
    CASE("logsigmoid_backward", KILN_OP_LOGSIGMOID_BWD, false, NOATTR, RND(-30, 30, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("relu", KILN_OP_RELU, true, NOATTR, RND(-1, 1, 3, T, C));
    CASE("relu_backward", KILN_OP_RELU_BWD, false, NOATTR, RND(-1, 1, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("gt0", KILN_OP_GT0, false, NOATTR, RND(-1, 1, 3, T, C));
    CASE("tanh", KILN_OP_TANH, true, NOATTR, RND(-6, 6, 3, T, C));
    CASE("tanh_backward", KILN_OP_TANH_BWD, false, NOATTR, RND(-6, 6, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("gelu_tanh", KILN_OP_GELU_TANH, true, NOATTR, RND(-6, 6, 3, T, C));
    CASE("gelu_tanh_backward", KILN_OP_GELU_TANH_BWD, false, NOATTR, RND(-6, 6, 3, T, C), RND(-1, 1, 3, T, C));
    CASE("log1mexp", KILN_OP_LOG1MEXP, true, NOATTR, RND(-20, -1e-4f, 3, T, C));
    CASE("log1mexp_backward", KILN_OP_LOG1MEXP_BWD, false, NOATTR, RND(-20, -1e-4f, 3, T, C), RND(-1, 1, 3, T, C));
}

static void ops_fused(int v) {
    int64_t Tk = Ts[v] < 61 ? Ts[v] : 61, Tq = v == 1 ? Tk - 4 : Tk, D = v == 0 ? 8 : v == 1 ? 24 : 64;
    int64_t C = Cs[v], V = Vs[v], T = Ts[v];
    kiln_attrs fa = {.f = {0.2}}, fs = {.i = {1}, .f = {0.2}};
    CASE("flash_attn (GQA, padding)", KILN_OP_FLASH_ATTN, true, fa, RND(-1, 1, 2, 4, Tq, D), RND(-1, 1, 2, 2, Tk, D),
         RND(-1, 1, 2, 2, Tk, D), ints(2, Tk, 1, 0));
    CASE("flash_attn (segments)", KILN_OP_FLASH_ATTN, true, fs, RND(-1, 1, 2, 4, Tk, D), RND(-1, 1, 2, 2, Tk, D),
         RND(-1, 1, 2, 2, Tk, D), ints(2, Tk, 1, 0), ints(2, Tk, 2, 0));
    kiln_attrs fw = {.i = {0, 5}, .f = {0.2}}, fsw = {.i = {1, 3}, .f = {0.2}};
    CASE("flash_attn (window 5)", KILN_OP_FLASH_ATTN, true, fw, RND(-1, 1, 2, 4, Tq, D), RND(-1, 1, 2, 2, Tk, D),
         RND(-1, 1, 2, 2, Tk, D), ints(2, Tk, 1, 0));
    CASE("flash_attn (segments, window 3)", KILN_OP_FLASH_ATTN, true, fsw, RND(-1, 1, 2, 4, Tk, D), RND(-1, 1, 2, 2, Tk, D),
         RND(-1, 1, 2, 2, Tk, D), ints(2, Tk, 1, 0), ints(2, Tk, 2, 0));
    /* flash_attn_backward on a forward's own output and lse */
    for (int seg = 0; seg < 2; seg++) {
        kiln_tensor *q = RND(-1, 1, 2, 4, Tq, D), *k = RND(-1, 1, 2, 2, Tk, D), *vv = RND(-1, 1, 2, 2, Tk, D);
        kiln_tensor *pad = ints(2, Tk, 1, 0), *sg = seg ? ints(2, Tk, 2, 0) : NULL, *lse[1] = {0};
        kiln_tensor *fin[5] = {q, k, vv, pad, sg};
        kiln_tensor *o = kiln_op_call_aux(KILN_OP_FLASH_ATTN, fin, seg ? 5 : 4, seg ? &fs : &fa, lse);
        CHECK(o && lse[0], "flash_attn on the host: %s", kiln_last_error());
        if (!o) continue;
        if (seg)
            CASE("flash_attn_backward (segments)", KILN_OP_FLASH_ATTN_BWD, false, fs, q, k, vv, pad, o, lse[0],
                 RND(-1, 1, 2, 4, Tq, D), sg);
        else
            CASE("flash_attn_backward", KILN_OP_FLASH_ATTN_BWD, false, fa, q, k, vv, pad, o, lse[0],
                 RND(-1, 1, 2, 4, Tq, D));
    }
    CASE("linear_cross_entropy", KILN_OP_LINEAR_CE, true, A(.i = {KILN_IGNORE_INDEX, 1, 1, 0}), RND(-1, 1, 2, T, C),
         RND(-1, 1, V, C), ints(2, T, 0, -V));
    CASE("linear_cross_entropy (bf16)", KILN_OP_LINEAR_CE, true, A(.i = {KILN_IGNORE_INDEX, 1, 1, 1}),
         RND(-1, 1, 2, T, C), RND(-1, 1, V, C), ints(2, T, 0, -V));
    CASE("linear_cross_entropy (dh only)", KILN_OP_LINEAR_CE, false, A(.i = {KILN_IGNORE_INDEX, 1, 0, 0}),
         RND(-1, 1, 2, T, C), RND(-1, 1, V, C), ints(2, T, 0, -V));
    CASE("linear_cross_entropy (seeded bf16)", KILN_OP_LINEAR_CE, false, A(.i = {KILN_IGNORE_INDEX, 1, 1, 1, 1}),
         RND(-1, 1, 2, T, C), RND(-1, 1, V, C), ints(2, T, 0, -V), scalar(0.125f));
}

/* Ops no case here covers (forward, or the backward rule), and why: none.
 * A new op in KILN_OP_LIST needs a case above or a line here. */
static const struct {
    int op;
    bool backward_only; /* only its backward rule is exempt */
    const char *why;
} exempt[] = {
    {-1, false, NULL}, /* (end) */
};
static const char *exemption(int op, bool backward) {
    for (size_t i = 0; exempt[i].why; i++)
        if (exempt[i].op == op && (backward || !exempt[i].backward_only)) return exempt[i].why;
    return NULL;
}

static void check_coverage(void) {
    int fwd = 0, bwd = 0, diff = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        const kiln_op_def *d = kiln_op_get(op);
        const char *why = exemption(op, false);
        CHECK(fwd_cov[op] || why, "op %s: no case runs it on every backend, and no stated exemption", d->name);
        CHECK(!(fwd_cov[op] && why), "op %s: exempt, yet covered: drop the exemption", d->name);
        fwd += fwd_cov[op];
        if (!d->backward) continue;
        diff++;
        const char *bwhy = exemption(op, true);
        CHECK(bwd_cov[op] || bwhy, "op %s: its backward rule runs on no backend here, and no stated exemption", d->name);
        bwd += bwd_cov[op];
    }
    printf("%d of %d ops run on %d backends (%d cases, %d results compared bit for bit); %d of %d backward rules\n", fwd,
           KILN_OP_COUNT, KILN_N_DEVICES, n_cases, n_compared, bwd, diff);
}

/* ---- the seam's own kernels ------------------------------------------------ */
static void seam_kernels(void) {
    for (int v = 0; v < 3; v++) {
        int64_t T = Ts[v], C = Cs[v], N = Vs[v];
        kiln_tensor *g0 = RND(-1, 1, 3, T, C), *src = RND(-1, 1, 3 * T, C), *a = RND(-1, 1, 2, T, C),
                    *b = RND(-1, 1, 2, T, N), *acc0 = RND(-1, 1, C, N);
        void *ref[2] = {0};
        for (int d = 0; d < KILN_N_DEVICES; d++) {
            const kiln_backend *be = kiln_backend_at(d);
            kiln_tensor *g = to_device(be, g0), *s = to_device(be, src), *x = to_device(be, a), *y = to_device(be, b),
                        *acc = to_device(be, acc0);
            CHECK_OK(kiln_op_accumulate(g, s)); /* same numel, other shape */
            kiln_attrs at = {.i = {KILN_MM_GRAD}};
            CHECK_OK(kiln_matmul_into(x, y, &at, acc, 1.0f));
            CHECK_OK(kiln_matmul_into(x, y, &at, acc, 1.0f));
            kiln_tensor *res[2] = {g, acc};
            for (int k = 0; k < 2; k++) {
                size_t n = kiln_tensor_nbytes(res[k]);
                void *p = malloc(n);
                CHECK_OK(kiln_tensor_get(res[k], 0, p, n));
                if (d == 0) {
                    ref[k] = p;
                } else {
                    CHECK(!memcmp(p, ref[k], n), "%s on %s differs from the CPU's", k ? "matmul_into (beta 1)" : "accumulate",
                          be->name);
                    n_compared++;
                    free(p);
                }
            }
            kiln_tensor_release(g), kiln_tensor_release(s), kiln_tensor_release(x), kiln_tensor_release(y);
            kiln_tensor_release(acc);
        }
        free(ref[0]), free(ref[1]);
        kiln_tensor_release(g0), kiln_tensor_release(src), kiln_tensor_release(a), kiln_tensor_release(b);
        kiln_tensor_release(acc0);
    }
    /* accumulate refuses what does not fit, and a product's beta is 0 or 1 */
    kiln_tensor *x = RND(-1, 1, 4), *y = RND(-1, 1, 5);
    CHECK(kiln_op_accumulate(x, y) == KILN_ERR_SHAPE, "accumulate of 5 into 4 refused");
    kiln_tensor_release(x), kiln_tensor_release(y);
}

/* ---- the interpreter on each device ---------------------------------------- */
typedef struct {
    kiln_tensor *W, *w;
} tiny;
/* loss = sum(silu(rmsnorm(x·Wᵀ, w))²), differentiated times the scale */
static kiln_status tiny_fn(void *user, kiln_tensor *const *in, kiln_tensor **report, int *n_report, kiln_tensor **diff) {
    tiny *m = user;
    kiln_tensor *h = kiln_linear(in[0], m->W), *n = kiln_rmsnorm(h, m->w, 1e-5), *s = kiln_silu(n), *q = kiln_mul(s, s);
    kiln_tensor *sum = kiln_sum(q);
    kiln_tensor_release(h), kiln_tensor_release(n), kiln_tensor_release(s), kiln_tensor_release(q);
    if (!sum) return kiln_last_status();
    report[0] = sum;
    *n_report = 1;
    if (diff && !(*diff = kiln_scale_by(sum, in[1]))) return kiln_last_status();
    return KILN_OK;
}

static void interp_on_devices(void) {
    kiln_tensor *W0 = RND(-1, 1, 29, 24), *w0 = RND(0.5f, 1.5f, 29), *x0 = RND(-1, 1, 3, 301, 24), *s0 = scalar(0.5f);
    float ref_loss[2] = {0};
    void *ref_g[2] = {0};
    for (int d = 0; d < KILN_N_DEVICES; d++) {
        const kiln_backend *be = kiln_backend_at(d);
        for (int reuse = 0; reuse < 2; reuse++) {
            tiny m = {to_device(be, W0), to_device(be, w0)};
            m.W->requires_grad = m.w->requires_grad = true;
            kiln_tensor *params[2] = {m.W, m.w}, *in[2] = {to_device(be, x0), to_device(be, s0)};
            kiln_graph_options o;
            kiln_graph_options_default(&o);
            o.reuse_memory = reuse;
            o.verify = true;
            kiln_graph *g = NULL;
            kiln_interp *r = NULL;
            float loss = 0;
            CHECK_OK(kiln_graph_build(tiny_fn, &m, params, 2, in, 2, &o, &g));
            if (g) CHECK_OK(kiln_interp_new(g, &r));
            for (int run = 0; r && run < 2; run++) CHECK_OK(kiln_interp_run(r, in, &loss)); /* grads accumulate */
            for (int k = 0; k < 2 && r; k++) {
                CHECK(params[k]->grad && kiln_backend_of(params[k]->grad) == be, "interp on %s: gradient %d on the device",
                      be->name, k);
                if (!params[k]->grad) continue;
                size_t n = kiln_tensor_nbytes(params[k]->grad);
                void *p = malloc(n);
                CHECK_OK(kiln_tensor_get(params[k]->grad, 0, p, n));
                if (!ref_g[k]) {
                    ref_g[k] = p;
                } else {
                    CHECK(!memcmp(p, ref_g[k], n), "interp on %s (reuse %d): gradient %d differs from the CPU's", be->name,
                          reuse, k);
                    n_compared++;
                    free(p);
                }
            }
            if (d == 0 && !reuse) ref_loss[0] = loss;
            else CHECK(!memcmp(&loss, &ref_loss[0], sizeof loss), "interp on %s (reuse %d): loss %.9g, the CPU's %.9g",
                       be->name, reuse, loss, ref_loss[0]);
            if (d == 0 && reuse) printf("interpreter: loss %.7g, %d nodes, %d groups, arena %lld bytes\n", loss,
                                        kiln_graph_live_nodes(g), g->n_groups, (long long)g->arena_bytes);
            /* an input on another device is refused, naming both */
            if (r && KILN_N_DEVICES > 1) {
                const kiln_backend *other = kiln_backend_at(d == 0 ? 1 : 0);
                kiln_tensor *bad[2] = {to_device(other, x0), in[1]};
                CHECK(kiln_interp_run(r, bad, &loss) == KILN_ERR_INVALID && strstr(kiln_last_error(), other->name) &&
                          strstr(kiln_last_error(), be->name),
                      "interp on %s: an input on %s refused: %s", be->name, other->name, kiln_last_error());
                kiln_tensor_release(bad[0]);
            }
            kiln_interp_free(r);
            kiln_graph_free(g);
            kiln_tensor_release(in[0]), kiln_tensor_release(in[1]);
            kiln_tensor_release(m.W), kiln_tensor_release(m.w);
        }
    }
    free(ref_g[0]), free(ref_g[1]);
    kiln_tensor_release(W0), kiln_tensor_release(w0), kiln_tensor_release(x0), kiln_tensor_release(s0);
}

/* ---- devices kept apart ------------------------------------------------------ */
static void devices_apart(void) {
    for (int d = 0; d < KILN_N_DEVICES; d++) {
        const kiln_backend *be = kiln_backend_at(d);
        kiln_tensor *h = RND(-1, 1, 3, 5), *t = to_device(be, h);
        kiln_clear_error();
        void *p = kiln_tensor_map(t);
        if (be->caps & KILN_BACKEND_HOST_MAPPABLE) {
            CHECK(p != NULL, "%s: a host-mappable tensor maps", be->name);
        } else {
            CHECK(p == NULL && strstr(kiln_last_error(), be->name), "%s: kiln_tensor_map refused (%s)", be->name,
                  kiln_last_error());
        }
        for (int e = 0; e < KILN_N_DEVICES; e++) {
            if (e == d) continue;
            const kiln_backend *other = kiln_backend_at(e);
            kiln_tensor *u = to_device(other, h);
            kiln_tensor_set_name(t, "a_tensor"), kiln_tensor_set_name(u, "b_tensor");
            kiln_tensor *y = kiln_add(t, u);
            const char *msg = kiln_last_error();
            CHECK(!y && strstr(msg, "add") && strstr(msg, be->name) && strstr(msg, other->name),
                  "add of %s and %s refused naming the op and both: %s", be->name, other->name, msg);
            kiln_tensor *in[3] = {t, u, t};
            kiln_tensor *z = kiln_op_call(KILN_OP_RMSNORM_BWD_X, in, 3, &(kiln_attrs){.f = {1e-5}});
            msg = kiln_last_error();
            CHECK(!z && strstr(msg, "rmsnorm_backward_x") && strstr(msg, be->name) && strstr(msg, other->name),
                  "rmsnorm_backward_x across devices refused: %s", msg);
            kiln_tensor_release(y), kiln_tensor_release(z), kiln_tensor_release(u);
        }
        kiln_tensor_release(t), kiln_tensor_release(h);
    }
}

int main(void) {
    for (int v = 0; v < 3; v++) {
        ops_pointwise(v);
        ops_linalg(v);
        ops_nn(v);
        ops_fused(v);
    }
    seam_kernels();
    interp_on_devices();
    devices_apart();
    check_coverage();
    TEST_END();
}
