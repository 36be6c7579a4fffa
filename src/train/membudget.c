/* Memory-aware micro-batch choice. The compiled plan knows exactly how many
 * bytes a micro-batch needs: its arena (every activation and gradient buffer
 * of the joint forward+backward graph, after liveness-based reuse) plus the
 * evaluation step's arena; the rest is parameters, gradients, AdamW's two
 * moments, kernel scratch outside the arena and a fixed runtime overhead
 * (code, libraries, oneDNN and OpenMP state, measured on this build). The
 * graphs are built without running anything (tracing is symbolic), so an
 * estimate costs milliseconds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/kernels.h"
#include "kiln/train.h"

/* Measured: peak RSS minus the items below over runs of the small and demo
 * models at several micro-batch sizes (README "Mixed precision and
 * memory"): libraries, oneDNN's JIT and scratchpads, OpenMP stacks, the
 * token data and the allocator's slack. */
#define RUNTIME_OVERHEAD ((int64_t)48 << 20)

static kiln_status graph_arena(kiln_llama *m, int b, int T, const kiln_compile_options *o, bool backward, int64_t *bytes,
                               int64_t *scratch) {
    int64_t s[2] = {b, T}, one = 1;
    /* the fifth: LoRA dropout's key, read by a training trace that has dropout */
    kiln_tensor *in[5] = {kiln_tensor_wrap(NULL, KILN_I32, 2, s), kiln_tensor_wrap(NULL, KILN_I32, 2, s),
                          kiln_tensor_wrap(NULL, KILN_I32, 2, s), kiln_tensor_wrap(NULL, KILN_F32, 1, &one),
                          kiln_tensor_wrap(NULL, KILN_F32, 1, &one)};
    int n_in = backward && kiln_train_uses_dropout(m) ? 5 : 4;
    kiln_graph_options go;
    kiln_graph_options_default(&go);
    go.backward = backward;
    go.rewrite_attention = go.rewrite_linear_ce = o->rewrites;
    go.reuse_memory = o->reuse_memory;
    go.recompute = o->recompute; /* the plan the compiled step makes */
    kiln_graph *g = NULL;
    kiln_status st = KILN_OK;
    for (int i = 0; i < 5; i++)
        if (!in[i]) st = kiln_last_status();
    if (!st) st = kiln_graph_build(kiln_train_trace_step, m, m->params, m->n_params, in, n_in, &go, &g);
    if (!st) {
        *bytes = g->arena_bytes;
        /* bf16 products convert both operands into one scratch block, which
         * the caching allocator keeps: the largest one bounds it */
        for (int v = 0; v < g->n; v++) {
            const kiln_value *x = &g->v[v];
            if (x->kind == KILN_V_OP && !x->dead && x->op == KILN_OP_LINEAR_CE && x->attrs.i[3]) {
                /* the fused bf16 head: its rounded W (the largest part), a
                 * chunk of logits and gathered rows, never N×V */
                const kiln_meta *h = &g->v[x->in[0]].meta, *W = &g->v[x->in[1]].meta;
                int64_t n = (int64_t)kiln_k_linear_cross_entropy_scratch(kiln_meta_numel(h) / W->shape[1], W->shape[1],
                                                                         W->shape[0], 0, true);
                if (n + 128 > *scratch) *scratch = n + 128;
                continue;
            }
            if (x->kind == KILN_V_OP && !x->dead && x->op == KILN_OP_MATMUL && kiln_dtype_is_dequant(g->v[x->in[1]].meta.dtype)) {
                /* a held base: one tile of dequantized rows (kiln_gemm_dequant, at most 4 MB plus a row) */
                const kiln_meta *W = &g->v[x->in[1]].meta;
                int64_t rows = W->shape[0], cols = W->shape[1], per = cols ? (1 << 20) / cols : 0;
                per = per < 16 ? 16 : per;
                int64_t tile = (per < rows ? per : rows) * cols;
                /* a bf16 product: the tile in bf16 too, and A converted */
                int64_t n = tile * 4 + (x->attrs.i[3] ? tile * 2 + kiln_meta_numel(&g->v[x->in[0]].meta) * 4 : 0) + 128;
                if (n > *scratch) *scratch = n;
                continue;
            }
            if (x->kind != KILN_V_OP || x->dead || x->op != KILN_OP_MATMUL || !x->attrs.i[3]) continue;
            /* native: bf16 copies of fp32 operands; emulated (AVX2): fp32
             * copies of both, a bf16 base weight widened */
            int64_t n = kiln_meta_numel(&g->v[x->in[0]].meta) + kiln_meta_numel(&g->v[x->in[1]].meta);
            int64_t esz = kiln_bf16_native() ? 2 : 4;
            if (n * esz + 128 > *scratch) *scratch = n * esz + 128;
        }
    }
    kiln_graph_free(g);
    for (int i = 0; i < 5; i++) kiln_tensor_release(in[i]);
    return st ? kiln_error_context(st, "planning a micro-batch of %d x %d", b, T) : KILN_OK;
}

kiln_status kiln_train_plan_bytes(kiln_llama *m, int b, int T, const kiln_compile_options *o, kiln_mem_estimate *out) {
    memset(out, 0, sizeof *out);
    kiln_status st = graph_arena(m, b, T, o, true, &out->arena_train, &out->scratch);
    if (!st) st = graph_arena(m, b, T, o, false, &out->arena_eval, &out->scratch);
    if (st) return st;
    for (int i = 0; i < m->n_params; i++) {
        /* as held (a bf16 base: 2 bytes each); gradients and AdamW's two
         * moments only for what trains (LoRA: the adapters), fp32 */
        int64_t bytes = kiln_tensor_numel(m->params[i]) * 4;
        out->params += (int64_t)kiln_tensor_nbytes(m->params[i]);
        if (m->params[i]->requires_grad) out->grads += bytes, out->optim += 2 * bytes;
    }
    out->batches = (int64_t)b * T * 3 * 4 * 2; /* ids, targets, mask; train and eval buffers */
    out->overhead = RUNTIME_OVERHEAD;
    out->total = out->arena_train + out->arena_eval + out->params + out->grads + out->optim + out->batches + out->scratch +
                 out->overhead;
    return KILN_OK;
}

/* The core's reading (MemAvailable, else sysconf, capped by a cgroup limit). */
int64_t kiln_mem_available(void) {
    uint64_t b = kiln_mem_available_bytes(NULL);
    return b > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)b;
}

const char *kiln_bytes_str(int64_t b, char *buf, size_t n) {
    double v = (double)b;
    if (v >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", v / (1024.0 * 1024 * 1024));
    else if (v >= 1024.0 * 1024) snprintf(buf, n, "%.1f MiB", v / (1024.0 * 1024));
    else snprintf(buf, n, "%.0f KiB", v / 1024.0);
    return buf;
}

static kiln_status fits(kiln_llama *m, int b, const kiln_train_config *c, const kiln_compile_options *co, int64_t budget,
                        kiln_mem_estimate *e, bool *ok) {
    kiln_status st = kiln_train_plan_bytes(m, b, c->seq_len, co, e);
    *ok = !st && e->total <= budget;
    return st;
}

kiln_status kiln_train_choose_batch(const kiln_train_config *c, kiln_llama *m, kiln_mem_choice *out) {
    memset(out, 0, sizeof *out);
    kiln_status st = kiln_train_check_batch_settings(c);
    if (st) return st;
    int N = c->global_batch, fixed = c->micro_batch > 0 ? c->micro_batch : 0; /* 0: auto */
    out->global_batch = N;
    kiln_compile_options co;
    kiln_train_compile_options(c, &co); /* checked by the config's validation */
    if (co.mode == KILN_COMPILE_OFF && fixed == 0)
        return kiln_error(KILN_ERR_INVALID, "--micro-batch auto needs --compile: the memory estimate is the compiled plan's "
                                            "(eager memory is not planned); give --micro-batch B with eager");
    char given[32];
    kiln_bytes_text(c->mem_budget, given, sizeof given);
    if (c->mem_budget > 0) {
        out->budget = c->mem_budget;
    } else {
        out->budget = kiln_mem_available() * 7 / 10;
        out->budget_default = true;
        if (out->budget <= 0) return kiln_error(KILN_ERR_IO, "cannot read MemAvailable from /proc/meminfo: give --mem-budget");
    }
    kiln_dtype old = kiln_autocast_set((kiln_dtype)c->precision); /* bf16 changes the graph (bf16 products and head) */
    char b1[32], b2[32];
    bool ok = false;
    if (fixed > 0 || co.mode == KILN_COMPILE_OFF) {
        out->micro_batch = out->largest_fit = fixed;
        if (co.mode != KILN_COMPILE_OFF && !(st = fits(m, fixed, c, &co, out->budget, &out->est, &ok)) && !ok && c->mem_budget > 0)
            st = kiln_error(KILN_ERR_LIMIT, "micro_batch %d x %d needs about %s, over --mem-budget %s", fixed, c->seq_len,
                            kiln_bytes_str(out->est.total, b1, sizeof b1), given);
        goto done;
    }
    kiln_mem_estimate e;
    if ((st = fits(m, 1, c, &co, out->budget, &e, &ok))) goto done;
    if (!ok) {
        st = kiln_error(KILN_ERR_LIMIT,
                        "memory budget %s is below what one sequence of %d tokens needs: the smallest budget that works is "
                        "%s (--mem-budget %lldM)", kiln_bytes_str(out->budget, b1, sizeof b1), c->seq_len,
                        kiln_bytes_str(e.total, b2, sizeof b2), (long long)((e.total + (1 << 20) - 1) >> 20));
        goto done;
    }
    /* the estimate grows with b: bisect for the largest b <= N that fits */
    int lo = 1, hi = N;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if ((st = fits(m, mid, c, &co, out->budget, &e, &ok))) goto done;
        if (ok) lo = mid;
        else hi = mid - 1;
    }
    out->largest_fit = lo;
    int b = lo;
    while (N % b) b--; /* N stays exact: the largest divisor that fits */
    out->micro_batch = b;
    st = fits(m, b, c, &co, out->budget, &out->est, &ok);
    if (!st && b < lo)
        snprintf(out->note, sizeof out->note,
                 "global batch %d has no divisor between %d and %d (the largest micro-batch that fits): using %d x %d; "
                 "a multiple of %d would take fewer, larger micro-batches", N, b + 1, lo, b, N / b, lo);
done:
    kiln_autocast_set(old);
    if (st) return st;
    out->accum = N / out->micro_batch;
    return KILN_OK;
}
