/* kiln bench: times training steps (forward + backward, then the optimiser:
 * global norm, clipping, AdamW) of a model in eager mode and in each
 * compiled mode, in one process, and prints ms/step, the optimiser's share,
 * tokens/s, GFLOP/s, MFU, peak memory and compile times, with ratios. */
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/simd.h"
#include "kiln/backend.h"
#include "kiln/compile.h"
#include "kiln/graph.h"
#include "kiln/eager.h"
#include "kiln/kernels.h"
#include "kiln/model.h"
#include "kiln/quant.h"
#include "kiln/train.h"

static const char *bench_help =
    "usage: kiln bench [options]\n"
    "Times training steps (forward + backward, then global norm + clipping + AdamW, as\n"
    "kiln train runs them) on random tokens, eager and compiled, in one process; prints\n"
    "the optimiser's time and share of the step, and the ratios to eager.\n"
    "  --model NAME|FILE   tiny, small (default), demo or 124m, or a config.json\n"
    "  --batch N           sequences per micro-batch (default 8)\n"
    "  --seq N             sequence length (default 256)\n"
    "  --steps N           timed steps per mode (default 5; the median is reported)\n"
    "  --warmup N          untimed steps first (default 1; the first compiled one builds)\n"
    "  --rounds R          split the timed steps into R rounds, each running every mode in turn (a compiled\n"
    "                      mode loaded again from the cache, --warmup untimed steps first), so that a machine\n"
    "                      whose speed drifts slows every mode alike; prints the FMA peak before each round\n"
    "                      (default 1: each mode's steps in one run; at most --steps)\n"
    "  --modes LIST        comma-separated, of" KILN_COMPILE_MODE_NAMES " (eager = off)\n"
    "                      (default: eager,default,reduce-overhead,max-autotune)\n"
    "  --threads N         OpenMP threads (default: all cores)\n"
    "  --device NAME       where the model, its inputs and the work live: one of" KILN_DEVICE_NAMES "\n"
    "                      (default: cpu; `kiln devices`)\n"
    "  --profile           print time per op (eager) and the step's time by op class (every mode)\n"
    "  --recompute R       pointwise (default: element-wise values), none, attention or layer: compiled\n"
    "                      modes recompute these activations in backward instead of keeping them\n"
    "  --precision P       fp32 (default) or bf16 (autocast: bf16 matrix products, fp32 accumulate;\n"
    "                      MFU then against the bf16 peak: 2x the fp32 FMA peak with AVX512-BF16, the fp32\n"
    "                      peak itself where bf16 products are emulated in fp32)\n"
    "  --peak GFLOPS       fp32 FMA peak for MFU (default: measured at start)\n"
    "  --compete N         run every mode twice: idle, then beside N busy processes, and print\n"
    "                      the loaded speed against kiln's fair share of the cores\n"
    "  --pack documents    instead: the compiled step (first compiled mode of --modes) on rows of packed\n"
    "                      documents of --doc-len tokens next to plain packed rows of the same tokens\n"
    "  --doc-len N         document length for --pack documents (default 64)\n"
    "  --no-optim          forward + backward only (gradients accumulate, no optimiser step)\n"
    "  --results           also print one 'RESULT mode=... tokens_s=...' line per mode (bench/compare.sh reads them)\n"
    "Data parallel (a bench of its own: mpirun -np N of this kiln, eager steps, per --shard mode):\n"
    "  --ranks N           ranks on this machine; prints ms/step with the gradient buckets overlapped with\n"
    "                      backward and without, the communication hidden, the optimiser's moments,\n"
    "                      gradients and buffers per rank against the formula, and the peak RSS\n"
    "  --shard LIST        of off, optimizer, gradients (default off,gradients); also --model, --batch,\n"
    "                      --seq, --steps, --warmup, --threads (per rank), --accum N (per rank, default 1),\n"
    "                      --layers L (the model with L layers: a large model's widths in less memory),\n"
    "                      --bucket-mb MB (default 25)\n"

    "LoRA mode (a frozen base with adapters, as kiln train --lora-rank):\n"
    "  --lora-rank R       adapters of rank R (alpha 2R)\n"
    "  --lora-targets L    q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all (default all)\n"
    "  --objective O       ce (default), dpo, simpo or orpo: the step of that objective (dpo: sigmoid, beta 0.1,\n"
    "                      the adapters-off reference pass included; --batch even, rows 2i and 2i+1 a pair)\n"
    "  --base-dtype D      fp32 (default), bf16, f16, q8_0, q4_0, q4_k, q5_k or q6_k: the frozen base held so\n"
    "Bench-only model names: smollm2-135m (SmolLM2-135M's shape), llama-1b (a 1.1B Llama:\n"
    "hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 kv heads, vocab 32000), llama3-8b\n"
    "(Llama-3.1-8B's shape: hidden 4096, intermediate 14336, 32 layers, vocab 128256), gemma3-1b\n"
    "(Gemma-3-1B's config: hidden 1152, 26 layers, window 512 on 5 of 6, vocab 262144, tied).\n"
    "With --base-dtype f16 or a block type (q8_0, q4_0, q4_k, q5_k, q6_k) the base is made in\n"
    "that type directly (embeddings and head too, as a GGUF of that type holds them), never\n"
    "in fp32: random blocks from kiln's quantizer, 64 rows repeated over each matrix.\n";

/* Shapes to measure without a config.json: SmolLM2-135M (its Hugging Face
 * config) and a 1B-parameter Llama; random weights, as every bench model. */
static bool bench_config(const char *name, kiln_llama_config *c) {
    struct {
        const char *name;
        int64_t V, C, I, L, H, KV, ctx;
        bool tied;
        double theta;
    } k[] = {{"smollm2-135m", 49152, 576, 1536, 30, 9, 3, 8192, true, 100000},
             {"llama-1b", 32000, 2048, 8192, 16, 32, 8, 2048, false, 10000},
             {"llama3-8b", 128256, 4096, 14336, 32, 32, 8, 8192, false, 500000},
             {"gemma3-1b", 262144, 1152, 6912, 26, 4, 1, 32768, true, 1000000}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if (strcmp(name, k[i].name)) continue;
        kiln_llama_config_default(c);
        c->vocab_size = k[i].V, c->hidden_size = k[i].C, c->intermediate_size = k[i].I, c->num_hidden_layers = k[i].L;
        c->num_attention_heads = k[i].H, c->num_key_value_heads = k[i].KV, c->head_dim = k[i].C / k[i].H;
        c->max_position_embeddings = k[i].ctx, c->tie_word_embeddings = k[i].tied, c->rope_theta = k[i].theta;
        c->rms_norm_eps = 1e-5;
        if (!strcmp(name, "gemma3-1b")) { /* Gemma-3-1B's config.json */
            c->family = KILN_FAMILY_GEMMA3, c->head_dim = 256, c->rms_norm_eps = 1e-6, c->query_pre_attn_scalar = 256;
            c->sliding_window = 512, c->sliding_window_pattern = 6, c->rope_local_base_freq = 10000;
        }
        return true;
    }
    return false;
}

/* A held base made in its type: the projections, embeddings and head as
 * the bench's block type (norms one, biases zero, all else fp32); random
 * weights quantized by kiln's quantizer, 64 distinct rows repeated over
 * each matrix (the arithmetic is the same as for distinct rows, and an 8B
 * model is made in seconds, never as fp32). */
static kiln_dtype held_dtype(const char *name, void *user) {
    bool matrix = strstr(name, "_proj.weight") || strstr(name, "embed_tokens") || strstr(name, "lm_head");
    return matrix ? *(const kiln_dtype *)user : KILN_F32;
}

static kiln_status fill_held(kiln_llama *m) {
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->n_params && !st; i++) {
        kiln_tensor *p = m->params[i];
        int64_t cols = p->shape[p->ndim - 1], rows = kiln_tensor_numel(p) / cols, pr = rows < 64 ? rows : 64;
        kiln_qtype qt;
        if (!kiln_q_of_dtype(p->dtype, &qt)) return kiln_error(KILN_ERR_INVALID, "%s: %s", p->name, kiln_dtype_name(p->dtype));
        size_t rb = kiln_q_row_bytes(qt, cols);
        float *f = malloc((size_t)(pr * cols) * sizeof *f);
        char *q = malloc((size_t)pr * rb);
        if (!f || !q) st = kiln_error(KILN_ERR_OOM, "out of memory making %s", p->name);
        kiln_rng rng = {1234, (uint64_t)i << 40};
        if (!st && p->dtype == KILN_F32) {
            for (int64_t j = 0; j < pr * cols; j++) f[j] = strstr(p->name, "bias") ? 0.0f : 1.0f;
        } else if (!st) {
            kiln_rng_normal(&rng, f, pr * cols, 0.0f, 0.02f);
        }
        if (!st) st = kiln_q_quantize(qt, f, q, pr * cols);
        for (int64_t r = 0; r < rows && !st; r += pr)
            st = kiln_tensor_set(p, (size_t)r * rb, q, (size_t)(rows - r < pr ? rows - r : pr) * rb);
        free(f);
        free(q);
    }
    return st;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Peak RSS is reset between modes (Linux clear_refs 5) after returning the
 * previous mode's cached memory to the OS. */
static void reset_peak(void) {
    kiln_alloc_trim();
    kiln_alloc_reset_peak();
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

typedef struct {
    const char *name;
    double ms, opt_ms, tokens_s, gflops, peak_mb, alloc_mb, build_s, warm_s, arena_mb;
    bool ok, interpreted;
    double *step_ms, *step_opt_ms; /* every timed step so far, over the rounds */
    double *round_ms;              /* each round's median step (--rounds) */
    int n_steps;
} result;

typedef struct {
    kiln_llama *m;
    kiln_tensor *in[4];
    kiln_adamw *opt; /* NULL with --no-optim */
    kiln_train_config tc;
    int steps, warmup;
    double flops;
    bool profile;
    int recompute; /* KILN_RECOMPUTE_* for the compiled modes */
    kiln_objective obj; /* --objective: what the step minimises (ce: the model's loss) */
    kiln_step_trace tr;
    double peak; /* fp32 FMA GFLOP/s measured at start (--profile's per-product shares) */
} bench_ctx;

static void print_profile(const kiln_op_profile *table, int steps) {
    double total = 0;
    for (int o = 0; o < KILN_OP_COUNT; o++) total += table[o].seconds;
    printf("\nper-op time, eager, over %d steps (%.0f ms/step inside ops):\n%-24s %8s %8s %7s %9s\n", steps,
           total * 1e3 / steps, "op", "calls", "ms/step", "share", "GFLOP/s");
    for (int o = 0; o < KILN_OP_COUNT; o++)
        if (table[o].calls)
            printf("%-24s %8llu %8.1f %6.1f%% %9.1f\n", kiln_op_name(o), (unsigned long long)table[o].calls / steps,
                   table[o].seconds * 1e3 / steps, 100 * table[o].seconds / total,
                   table[o].seconds > 0 ? table[o].flops / table[o].seconds / 1e9 : 0);
}

/* The step's time by class of op (--profile): eager from the per-op
 * table, compiled from the interpreter's per-position times; the rest of
 * the step (dispatch, autograd, a whole-step module's own code) is what
 * the classes do not cover. */
enum { C_GEMM, C_ATTN, C_LOSS, C_NORM, C_ROPE, C_EMB, C_EW, C_GROUPS, C_ACC, C_OPT, C_N };
static const char *const class_names[C_N] = {"GEMM (matmul)", "attention", "head + loss", "norms", "rope",
                                             "embedding", "element-wise, layout", "fused groups (generated)",
                                             "gradient accumulation", "optimiser"};
static int op_class(int op) {
    const char *n = kiln_op_name(op);
    if (!strncmp(n, "matmul", 6)) return C_GEMM;
    if (strstr(n, "flash") || strstr(n, "softmax") || strstr(n, "attn")) return C_ATTN;
    if (strstr(n, "cross_entropy") || strstr(n, "logp") || strstr(n, "dpo")) return C_LOSS;
    if (strstr(n, "norm")) return C_NORM;
    if (strstr(n, "rope")) return C_ROPE;
    if (strstr(n, "embedding")) return C_EMB;
    return C_EW;
}
static void print_classes(const char *mode, const double sec[C_N], int steps, double step_ms) {
    double total = 0;
    printf("\nstep time by op class, %s (ms per step; share of the mean step, %.1f ms):\n", mode, step_ms);
    for (int c = 0; c < C_N; c++) {
        double ms = sec[c] * 1e3 / steps;
        if (ms <= 0) continue;
        total += ms;
        printf("  %-28s %9.1f %6.1f%%\n", class_names[c], ms, 100 * ms / step_ms);
    }
    printf("  %-28s %9.1f %6.1f%%\n", "rest (dispatch, step code)", step_ms - total, 100 * (step_ms - total) / step_ms);
}

/* The indices of the (at most top) costliest of n kinds, most seconds
 * first: each kind `size` bytes, its seconds a double at byte `off`. */
static int costliest(const void *kinds, size_t size, size_t off, int n, int *order, int top) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        double si;
        memcpy(&si, (const char *)kinds + (size_t)i * size + off, sizeof si);
        int at = m < top ? m++ : top; /* insertion into the kept ones, the last dropped past top */
        while (at > 0) {
            double sp;
            memcpy(&sp, (const char *)kinds + (size_t)order[at - 1] * size + off, sizeof sp);
            if (sp >= si) break;
            if (at < top) order[at] = order[at - 1];
            at--;
        }
        if (at < top) order[at] = i;
    }
    return m;
}

/* --profile, compiled: the kinds of fused group (the same ops over the same
 * element count, one per layer, say) that took longest per step. Their
 * loops are mostly memory-bound: GB/s counts each argument
 * (kiln_graph_group_args) read or written once per call. */
typedef struct {
    char ops[160];
    int64_t n;
    int groups;
    double sec, bytes; /* bytes: per step's calls */
    uint64_t calls;
} group_kind;
static void print_groups(const kiln_graph_profile *gp, const kiln_graph *g, int steps) {
    enum { TOP = 6 };
    if (!g) return;
    group_kind *kinds = calloc((size_t)KILN_PROFILE_GROUPS, sizeof *kinds);
    if (!kinds) return;
    int nk = 0;
    for (int k = 0; k < g->n_groups && k < KILN_PROFILE_GROUPS; k++) {
        if (!gp->each_group_calls[k]) continue;
        const int *mem = &g->group_members[g->group_start[k]];
        const int nm = g->group_start[k + 1] - g->group_start[k];
        group_kind x = {.n = kiln_meta_numel(&g->v[mem[0]].meta), .groups = 1, .sec = gp->each_group_seconds[k],
                        .calls = gp->each_group_calls[k]};
        size_t o = 0;
        for (int q = 0; q < nm && o + 1 < sizeof x.ops; q++)
            o += (size_t)snprintf(x.ops + o, sizeof x.ops - o, "%s%s", q ? " " : "", kiln_op_name(g->v[mem[q]].op));
        int ids[64];
        const int na = kiln_graph_group_args(g, k, ids, 64);
        for (int a = 0; a < na && a < 64; a++)
            x.bytes += (double)x.calls * (double)kiln_meta_numel(&g->v[ids[a]].meta) *
                       (double)kiln_dtype_size(g->v[ids[a]].meta.dtype);
        int at = 0;
        while (at < nk && (kinds[at].n != x.n || strcmp(kinds[at].ops, x.ops))) at++;
        if (at == nk) kinds[nk++] = x;
        else kinds[at].groups++, kinds[at].sec += x.sec, kinds[at].bytes += x.bytes, kinds[at].calls += x.calls;
    }
    int order[TOP];
    const int shown = costliest(kinds, sizeof *kinds, offsetof(group_kind, sec), nk, order, TOP);
    for (int t = 0; t < shown; t++) {
        const group_kind x = kinds[order[t]];
        if (!t) printf("  the costliest kinds of fused group (ms per step; groups x ms per call; memory traffic):\n");
        printf("    %7.1f ms  %3d x %6.2f ms  %6.1f GB/s  %lld elements: %s\n", x.sec * 1e3 / steps, x.groups,
               x.sec * 1e3 / (double)x.calls, x.bytes / x.sec / 1e9, (long long)x.n, x.ops);
    }
    free(kinds);
}

/* --profile, compiled: the products (MATMUL positions of one geometry:
 * M, N, K, transposes, batch, bf16 or not) that took longest per step, at
 * what share of the peak they ran: the step's GEMMs against bench/gemm's
 * figures for the same shapes. Where the GEMM goes into a fused group it is
 * not timed here (a group is timed whole). */
typedef struct {
    kiln_matmul_geom g;
    bool bf16;
    int positions;
    double sec, flops; /* per step's calls */
    uint64_t calls;
} gemm_kind;
static void print_gemms(const kiln_graph_profile *gp, const kiln_graph *g, int steps, double peak) {
    enum { TOP = 8 };
    if (!g) return;
    gemm_kind *kinds = calloc((size_t)(g->n > 0 ? g->n : 1), sizeof *kinds);
    if (!kinds) return;
    int nk = 0;
    double total = 0;
    for (int i = 0; i < g->n && i < KILN_PROFILE_POSITIONS; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind != KILN_V_OP || x->op != KILN_OP_MATMUL || !gp->each_pos_calls[i]) continue;
        kiln_meta im[KILN_OP_MAX_IN], out;
        for (int j = 0; j < x->n_in; j++) im[j] = g->v[x->in[j]].meta;
        gemm_kind k = {.bf16 = x->attrs.i[3] != 0, .positions = 1, .sec = gp->each_pos_seconds[i],
                       .calls = gp->each_pos_calls[i]};
        if (kiln_matmul_geometry(im, &x->attrs, &k.g, &out)) {
            kiln_clear_error();
            continue;
        }
        k.flops = (double)k.calls * kiln_op_flops(x->op, im, &x->attrs, &x->meta);
        total += k.sec;
        int at = 0;
        while (at < nk && !(kinds[at].g.M == k.g.M && kinds[at].g.N == k.g.N && kinds[at].g.K == k.g.K &&
                            kinds[at].g.ta == k.g.ta && kinds[at].g.tb == k.g.tb && kinds[at].g.batch == k.g.batch &&
                            kinds[at].bf16 == k.bf16))
            at++;
        if (at == nk) kinds[nk++] = k;
        else kinds[at].positions++, kinds[at].sec += k.sec, kinds[at].flops += k.flops, kinds[at].calls += k.calls;
    }
    int order[TOP];
    const int shown = costliest(kinds, sizeof *kinds, offsetof(gemm_kind, sec), nk, order, TOP);
    for (int t = 0; t < shown; t++) {
        const gemm_kind x = kinds[order[t]];
        if (!t)
            printf("  the costliest products (%.1f ms per step in %d geometries; ms per step; positions x ms per call; "
                   "GFLOP/s, %% of the %s peak):\n",
                   total * 1e3 / steps, nk, kiln_bf16_native() ? "fp32 or bf16" : "fp32");
        const double rate = x.sec > 0 ? x.flops / x.sec / 1e9 : 0, p = x.bf16 && kiln_bf16_native() ? 2 * peak : peak;
        char batch[32] = "";
        if (x.g.batch > 1) snprintf(batch, sizeof batch, " x %lld", (long long)x.g.batch);
        printf("    %7.1f ms  %3d x %7.3f ms  %6.1f GFLOP/s %3.0f%%  %s %c%c M %lld N %lld K %lld%s\n", x.sec * 1e3 / steps,
               x.positions, x.sec * 1e3 / (double)x.calls, rate, 100 * rate / p, x.bf16 ? "bf16" : "fp32",
               x.g.ta ? 'T' : 'N', x.g.tb ? 'T' : 'N', (long long)x.g.M, (long long)x.g.N, (long long)x.g.K, batch);
    }
    free(kinds);
}

/* The compiled step's largest computed value, and how many hold [tokens
 * x vocab] or more (logits the fused head + cross-entropy never forms). */
static void largest_value(const kiln_graph *g, int64_t tokens, int64_t vocab) {
    int best = -1, logits = 0;
    double most = 0;
    for (int i = 0; g && i < g->n; i++) {
        if (g->v[i].dead || g->v[i].kind != KILN_V_OP) continue; /* computed values, not parameters */
        double n = 1;
        for (int d = 0; d < g->v[i].meta.ndim; d++) n *= (double)g->v[i].meta.shape[d];
        if (n > most) most = n, best = i;
        int nd = g->v[i].meta.ndim; /* [..., tokens, vocab]: a row of logits per token */
        logits += nd >= 1 && g->v[i].meta.shape[nd - 1] == vocab && n >= (double)tokens * (double)vocab;
    }
    if (best < 0) return;
    char b[96];
    printf("  largest value: v%d %s %s (%.0f MB); [tokens x vocab] (%lld x %lld) logits values: %d\n", best,
           kiln_dtype_name(g->v[best].meta.dtype), kiln_dims_str(g->v[best].meta.ndim, g->v[best].meta.shape, b, sizeof b),
           most * (double)kiln_dtype_size(g->v[best].meta.dtype) / 1e6, (long long)tokens, (long long)vocab, logits);
}

/* One round of a mode: compiles it (the first round builds, later ones load
 * from the cache), runs --warmup untimed steps and then `steps` timed ones,
 * appending their times to r. The first round also reports the plan. */
static void run_round(bench_ctx *b, const char *mode, result *r, int steps, bool first) {
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    bool eager = !strcmp(mode, "eager");
    co.recompute = b->recompute;
    r->ok = false;
    if (!eager && kiln_compile_mode_parse(mode, &co)) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        return;
    }
    reset_peak();
    bool pref = b->obj.kind != KILN_OBJECTIVE_CE;
    b->tr = (kiln_step_trace){.m = b->m, .o = &b->obj};
    kiln_compiled *cs = eager ? NULL : pref ? kiln_train_compile_objective(&b->tr, &co, true) : kiln_train_compile(b->m, &co, true);
    if (!eager && !cs) return;
    kiln_op_profile table[KILN_OP_COUNT];
    /* the profile's per-position tables are too large for the stack */
    kiln_graph_profile *gp = b->profile && !eager ? malloc(sizeof *gp) : NULL;
    if (b->profile && !eager && !gp) {
        fprintf(stderr, "kiln bench: out of memory for the profile\n");
        kiln_compiled_free(cs);
        return;
    }
    double *ms = r->step_ms + r->n_steps, *opt_ms = r->step_opt_ms + r->n_steps;
    for (int i = 0; i < b->warmup + steps; i++) {
        if (eager && b->profile && i == b->warmup) kiln_eager_profile(table);
        if (gp && i == b->warmup) kiln_graph_profile_set(gp);
        double t0 = kiln_time_now();
        kiln_status st;
        if (eager && pref) { /* the objective's trace, inputs by name */
            kiln_tensor *by[KILN_IN_N] = {0}, *report[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS] = {0};
            by[KILN_IN_IDS] = b->in[0], by[KILN_IN_TARGETS] = b->in[1], by[KILN_IN_MASK] = b->in[2];
            by[KILN_IN_SCALE] = by[KILN_IN_SCALE_2] = b->in[3]; /* orpo's two terms: one scale, for timing */
            st = b->obj.trace(&b->obj, b->m, by, report);
            kiln_tensor *scaled = st ? NULL : kiln_objective_diff(&b->obj, report, by);
            if (!st) st = scaled ? kiln_backward(scaled) : kiln_last_status();
            kiln_tensor_release(scaled);
            for (int k = 0; k < b->obj.n_terms + b->obj.n_metrics; k++) kiln_tensor_release(report[k]);
        } else if (eager) {
            kiln_tensor *sum = kiln_ce_loss(b->m, b->in[0], b->in[1], b->in[2], NULL);
            kiln_tensor *scaled = kiln_scale_by(sum, b->in[3]);
            st = kiln_backward(scaled);
            kiln_tensor_release(scaled);
            kiln_tensor_release(sum);
        } else if (pref) { /* the compiled step's inputs, by the trace's names */
            kiln_tensor *in[KILN_IN_N];
            for (int k = 0; k < b->tr.n_in; k++)
                in[k] = b->tr.names[k] <= KILN_IN_MASK ? b->in[b->tr.names[k]] : b->in[3]; /* scale, scale_2 */
            float rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
            st = kiln_compiled_run(cs, in, rep);
        } else {
            float rep[KILN_OBJ_MAX_TERMS + KILN_OBJ_MAX_METRICS];
            st = kiln_compiled_run(cs, b->in, rep);
        }
        double t1 = kiln_time_now();
        if (!st && b->opt) { /* the optimiser step kiln train runs after the window */
            kiln_step_result sr = {.lr = b->tc.lr};
            st = kiln_adamw_apply(b->opt, &b->tc, b->tc.lr, &sr);
        }
        double dt = kiln_time_now() - t0;
        if (st) {
            fprintf(stderr, "kiln bench: %s step failed: %s\n", mode, kiln_last_error());
            if (gp) kiln_graph_profile_set(NULL);
            free(gp);
            kiln_compiled_free(cs);
            return;
        }
        if (i == 0 && cs && first) r->build_s = kiln_compiled_stats(cs).build_seconds;
        if (i >= b->warmup) ms[i - b->warmup] = dt * 1e3, opt_ms[i - b->warmup] = (t0 + dt - t1) * 1e3;
    }
    if (eager && b->profile) {
        kiln_eager_profile(NULL);
        print_profile(table, b->steps);
    }
    if (gp) kiln_graph_profile_set(NULL);
    r->n_steps += steps;
    if (b->profile) { /* one round (--rounds 1): the profile covers these steps */
        double mean_ms = 0; /* the profile's classes are sums over the steps: set against the mean step */
        double sec[C_N] = {0};
        for (int i = 0; i < steps; i++) mean_ms += ms[i] / steps;
        for (int o = 0; o < KILN_OP_COUNT; o++)
            sec[op_class(o)] += eager ? table[o].seconds : gp->op_seconds[o];
        if (!eager) sec[C_GROUPS] = gp->group_seconds, sec[C_ACC] = gp->acc_seconds;
        for (int i = 0; i < steps; i++) sec[C_OPT] += opt_ms[i] / 1e3;
        print_classes(mode, sec, steps, mean_ms);
        if (!eager) print_groups(gp, kiln_compiled_graph(cs), steps);
        if (!eager) print_gemms(gp, kiln_compiled_graph(cs), steps, b->peak);
    }
    free(gp);
    double peak_mb = (double)kiln_peak_rss() / 1e6, alloc_mb = (double)kiln_alloc_get_stats().peak_bytes / 1e6;
    if (peak_mb > r->peak_mb) r->peak_mb = peak_mb;
    if (alloc_mb > r->alloc_mb) r->alloc_mb = alloc_mb; /* the caching allocator's high-water mark */
    r->ok = true;
    if (cs && first) { /* the plan, once */
        kiln_compile_stats s = kiln_compiled_stats(cs);
        r->arena_mb = (double)s.arena_bytes / 1e6;
        r->interpreted = s.interpreted;
        largest_value(kiln_compiled_graph(cs), b->in[0]->shape[0] * b->in[0]->shape[1], b->m->cfg.vocab_size);
        /* the step is freed first, so that the process never holds two
         * arenas (the peak RSS of `time -v` is then the step's own) */
        kiln_compiled_free(cs);
        cs = NULL;
        /* warm start: a second compile of the same step loads from the cache */
        kiln_compiled *again = kiln_train_compile(b->m, &co, true);
        float rep[1];
        if (again && !kiln_compiled_run(again, b->in, rep)) r->warm_s = kiln_compiled_stats(again).build_seconds;
        kiln_compiled_free(again);
        printf("  %s: %d nodes, %d fused groups (%d ops), arena %.0f MB (%.0f MB without reuse), %.1f GFLOP executed per step "
               "(%.2fx the model's), %s%s\n",
               mode, s.nodes, s.fused_groups, s.fused_ops, s.arena_bytes / 1e6, s.unplanned_bytes / 1e6, s.flops / 1e9,
               s.flops / b->flops, s.interpreted ? "interpreted" : "generated: ", s.interpreted ? "" : s.source_path);
    }
    kiln_compiled_free(cs);
}

/* The medians over every round's steps. */
static void finish(const bench_ctx *b, result *r) {
    if (!r->ok || !r->n_steps) {
        r->ok = false;
        return;
    }
    qsort(r->step_ms, (size_t)r->n_steps, sizeof *r->step_ms, cmp_d);
    qsort(r->step_opt_ms, (size_t)r->n_steps, sizeof *r->step_opt_ms, cmp_d);
    r->ms = r->step_ms[r->n_steps / 2];
    r->opt_ms = r->step_opt_ms[r->n_steps / 2];
    r->tokens_s = (double)(b->in[0]->shape[0] * b->in[0]->shape[1]) / (r->ms / 1e3);
    r->gflops = b->flops / (r->ms / 1e3) / 1e9;
}

/* Every mode of names[0..n) for b->steps timed steps, in `rounds` rounds:
 * each round runs each mode in turn, so that a machine whose speed drifts
 * (a shared host, a neighbour, the clock) slows every mode alike instead of
 * the ones that happen to run late. The FMA peak is measured before each
 * round; peaks[] gets them. */
static bool run_modes(bench_ctx *b, const char *const *names, int n, int rounds, result *res, double *peaks) {
    for (int i = 0; i < n; i++) {
        res[i] = (result){.name = names[i], .ok = true};
        res[i].step_ms = calloc(2 * (size_t)b->steps + (size_t)rounds, sizeof(double));
        if (!res[i].step_ms) return false;
        res[i].step_opt_ms = res[i].step_ms + b->steps;
        res[i].round_ms = res[i].step_opt_ms + b->steps;
    }
    for (int k = 0; k < rounds; k++) {
        int steps = b->steps / rounds + (k < b->steps % rounds); /* the first rounds take the remainder */
        if (peaks) peaks[k] = kiln_fma_peak_gflops(0.1);
        for (int i = 0; i < n; i++) {
            if (!res[i].ok) continue;
            run_round(b, names[i], &res[i], steps, k == 0);
            if (!res[i].ok) continue;
            double *tmp = malloc((size_t)steps * sizeof *tmp); /* the round's median step */
            if (!tmp) return false;
            memcpy(tmp, res[i].step_ms + res[i].n_steps - steps, (size_t)steps * sizeof *tmp);
            qsort(tmp, (size_t)steps, sizeof *tmp, cmp_d);
            res[i].round_ms[k] = steps % 2 ? tmp[steps / 2] : 0.5 * (tmp[steps / 2 - 1] + tmp[steps / 2]);
            free(tmp);
        }
    }
    for (int i = 0; i < n; i++) finish(b, &res[i]);
    return true;
}

static void free_results(result *res, int n) {
    for (int i = 0; i < n; i++) free(res[i].step_ms);
}

/* Fills tensor t of n 4-byte values through the seam from host values. */
static kiln_status fill_host(kiln_tensor *t, const void *h, int64_t n) {
    return t ? kiln_tensor_set(t, 0, h, (size_t)n * 4) : kiln_last_status();
}

static int bench_on_device(int argc, char **argv, const kiln_backend **device);

kiln_status kiln_bench_model_config(const char *model, kiln_llama_config *cfg) {
    return bench_config(model, cfg) ? KILN_OK : kiln_llama_config_resolve(model, cfg);
}

int kiln_cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--ranks")) return kiln_bench_ranks(argc, argv); /* a bench of its own, over mpirun */
    const kiln_backend *device = NULL;
    int rc = bench_on_device(argc, argv, &device);
    if (device) kiln_backend_use(device); /* the thread's device from before */
    return rc;
}

/* The bench; *was gets the thread's previous device once --device is in
 * effect (the model, its inputs and everything the steps make live there). */
static int bench_on_device(int argc, char **argv, const kiln_backend **was) {
    const kiln_backend *dev = NULL;
    const char *model = "small", *modes = "eager,default,reduce-overhead,max-autotune";
    int64_t B = 8, T = 256;
    bench_ctx b = {.steps = 5, .warmup = 1, .recompute = KILN_RECOMPUTE_POINTWISE};
    double peak = 0;
    kiln_dtype prec = KILN_F32;
    bool no_optim = false, results = false;
    int rounds = 1, compete = 0, lora_rank = 0, base_dtype = KILN_F32, precision = KILN_F32, objective = KILN_OBJECTIVE_CE;
    int pack = KILN_PACK_PACKED;
    int64_t doc_len = 0;
    const char *lora_targets = "all";
    const kiln_cli_opt opts[] = {
        KILN_OPT("--model", KILN_OPT_STR, &model),
        KILN_OPT_RANGE("--batch", KILN_OPT_I64, &B, 1, 1 << 20),
        KILN_OPT_RANGE("--seq", KILN_OPT_I64, &T, 2, 1 << 24),
        KILN_OPT_RANGE("--steps", KILN_OPT_INT, &b.steps, 1, 1 << 20),
        KILN_OPT_RANGE("--warmup", KILN_OPT_INT, &b.warmup, 1, 1 << 20),
        KILN_OPT_RANGE("--rounds", KILN_OPT_INT, &rounds, 1, 1 << 20),
        KILN_OPT("--threads", KILN_OPT_THREADS, NULL),
        KILN_OPT_RANGE("--peak", KILN_OPT_NUM, &peak, 0, 1e9),
        KILN_OPT("--profile", KILN_OPT_TRUE, &b.profile),
        KILN_OPT("--modes", KILN_OPT_STR, &modes),
        KILN_OPT_SETTING("--precision", &precision, "precision"),
        KILN_OPT_SETTING("--recompute", &b.recompute, "recompute"),
        KILN_OPT_RANGE("--compete", KILN_OPT_INT, &compete, 1, 64),
        KILN_OPT_SETTING("--pack", &pack, "pack"),
        KILN_OPT_RANGE("--doc-len", KILN_OPT_I64, &doc_len, 2, 1 << 24),
        KILN_OPT("--no-optim", KILN_OPT_TRUE, &no_optim),
        KILN_OPT("--results", KILN_OPT_TRUE, &results),
        KILN_OPT_RANGE("--lora-rank", KILN_OPT_INT, &lora_rank, 1, 65536),
        KILN_OPT("--lora-targets", KILN_OPT_STR, &lora_targets),
        KILN_OPT_SETTING("--base-dtype", &base_dtype, "base_dtype"),
        KILN_OPT_SETTING("--objective", &objective, "objective"),
        KILN_OPT("--device", KILN_OPT_DEVICE, &dev),
    };
    int pr = kiln_cli_parse("bench", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), bench_help, NULL, 0, NULL);
    if (pr) return pr == 1 ? 0 : 2;
    if (rounds > b.steps || (rounds > 1 && (b.profile || pack == KILN_PACK_DOCUMENTS))) {
        fprintf(stderr, "kiln bench: --rounds %d %s\n", rounds,
                rounds > b.steps ? "is more than --steps: each round times at least one step of every mode"
                : b.profile ? "and --profile do not go together (the profile covers one round's steps: use --rounds 1)"
                            : "and --pack documents do not go together (the documents bench times its two steps in one round)");
        return 2;
    }
    *was = kiln_backend_use(dev ? dev : kiln_backend_current());
    dev = kiln_backend_current();
    prec = (kiln_dtype)precision;
    kiln_llama_config cfg;
    kiln_status st = kiln_bench_model_config(model, &cfg);
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        return 1;
    }
    if (T > cfg.max_position_embeddings) cfg.max_position_embeddings = T;
    if (base_dtype == KILN_BASE_DTYPE_AUTO) base_dtype = KILN_F32;
    if (base_dtype != KILN_F32 && !lora_rank) {
        fprintf(stderr, "kiln bench: --base-dtype %s needs --lora-rank: a %s base is frozen, only adapters train\n",
                kiln_dtype_name(base_dtype), kiln_dtype_name(base_dtype));
        return 2;
    }
    {
        kiln_train_config oc;
        kiln_train_config_default(&oc);
        oc.objective = objective, oc.pack = objective == KILN_OBJECTIVE_CE ? oc.pack : KILN_PACK_PAIRS, oc.lora_rank = lora_rank;
        if (objective != KILN_OBJECTIVE_CE && (B % 2 || (objective == KILN_OBJECTIVE_DPO && !lora_rank))) {
            fprintf(stderr, "kiln bench: --objective %s needs an even --batch (rows 2i, 2i+1 a pair)%s\n",
                    objective == KILN_OBJECTIVE_DPO ? "dpo" : objective == KILN_OBJECTIVE_SIMPO ? "simpo" : "orpo",
                    objective == KILN_OBJECTIVE_DPO ? " and --lora-rank (the reference is the base with the adapters off)" : "");
            return 2;
        }
        if (kiln_objective_from_config(&oc, &b.obj)) {
            fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
            return 2;
        }
    }
    kiln_dtype held = (kiln_dtype)base_dtype;
    bool in_type = kiln_dtype_is_dequant(held); /* made in its type, never fp32 */
    b.m = in_type ? kiln_llama_new_empty(&cfg, held_dtype, &held) : kiln_llama_new(&cfg, 1234);
    kiln_lora_config lc = {.rank = lora_rank, .alpha = 2.0 * lora_rank};
    st = b.m ? KILN_OK : kiln_last_status();
    if (!st && in_type) st = fill_held(b.m);
    if (!st && lora_rank && !(st = kiln_lora_targets_parse(lora_targets, &lc.targets))) st = kiln_llama_lora_add(b.m, &lc, 1234);
    if (!st && base_dtype == KILN_BF16) st = kiln_llama_base_cast(b.m, KILN_BF16);
    kiln_alloc_trim(); /* the fp32 copies of a bf16 base go back to the system */
    malloc_trim(0);
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        kiln_llama_free(b.m);
        return 1;
    }
    if (pack == KILN_PACK_PADDED || (doc_len && pack != KILN_PACK_DOCUMENTS) || (compete && pack == KILN_PACK_DOCUMENTS)) {
        fprintf(stderr, "kiln bench: %s\n", compete && pack == KILN_PACK_DOCUMENTS
                ? "--compete and --pack documents do not go together (the documents bench times its two steps alone)"
                : "only --pack documents (with --doc-len) has a bench of its own, not --pack padded or --doc-len alone");
        kiln_llama_free(b.m);
        return 2;
    }
    if (pack == KILN_PACK_DOCUMENTS) {
        if (!doc_len) doc_len = 64;
        kiln_dtype was = kiln_autocast_set(prec);
        int rc = kiln_bench_pack(b.m, B, T, doc_len, b.steps, b.warmup, modes);
        kiln_autocast_set(was);
        kiln_llama_free(b.m);
        return rc;
    }
    if (lora_rank) {
        int64_t trainable = 0, base_bytes = 0;
        for (int i = 0; i < b.m->n_params; i++) {
            if (b.m->params[i]->requires_grad) trainable += kiln_tensor_numel(b.m->params[i]);
            else base_bytes += (int64_t)kiln_tensor_nbytes(b.m->params[i]);
        }
        printf("LoRA r=%d on %s: %.2fM trainable parameters; frozen base %.0f MB (%s linears)\n", lora_rank, lora_targets,
               trainable / 1e6, base_bytes / 1e6, kiln_dtype_name(held));
    }
    int64_t shape[2] = {B, T}, one = 1;
    for (int i = 0; i < 3; i++) b.in[i] = kiln_tensor_new(KILN_I32, 2, shape);
    b.in[3] = kiln_tensor_new(KILN_F32, 1, &one);
    /* the inputs made on the host, then set on the device */
    int32_t *host = malloc((size_t)(3 * B * T) * sizeof *host);
    float norm = 1.0f / (float)(B * T);
    kiln_rng rng = {99, 0};
    for (int64_t i = 0; host && i < B * T; i++) {
        host[i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)cfg.vocab_size);
        host[B * T + i] = (int32_t)(kiln_rng_next_u64(&rng) % (uint64_t)cfg.vocab_size);
        host[2 * B * T + i] = 1;
    }
    st = host ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory making the inputs");
    for (int i = 0; i < 3 && !st; i++) st = fill_host(b.in[i], host + i * B * T, B * T);
    if (!st) st = fill_host(b.in[3], &norm, 1);
    free(host);
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        for (int i = 0; i < 4; i++) kiln_tensor_release(b.in[i]);
        kiln_llama_free(b.m);
        return 1;
    }
    kiln_train_config_default(&b.tc);
    if (!no_optim && !(b.opt = kiln_adamw_new(b.m, &b.tc))) {
        fprintf(stderr, "kiln bench: %s\n", kiln_last_error());
        return 1;
    }
    kiln_eager_enable();
    bool measure = peak == 0;
    for (int i = 0; measure && i < 5; i++) { /* best of five short runs: the machine is shared */
        double p = kiln_fma_peak_gflops(0.1);
        if (p > peak) peak = p;
    }
    if (!(peak > 0)) peak = 445; /* no vector FMA to measure: ../shared/README.md's figure */
    b.peak = peak;
    b.flops = kiln_llama_flops_per_token(&cfg, T) * (double)(B * T);
    printf("model %s: %.2fM parameters, batch %lld x %lld, %d threads, GEMM: %s, kernels %s, device %s\n", model,
           (double)kiln_llama_num_params(b.m) / 1e6, (long long)B, (long long)T, kiln_num_threads(), kiln_gemm_backend(),
           kiln_form_describe(), dev->name);
    printf("model FLOPs per step: %.1f GFLOP (%.1f MFLOP/token); fp32 FMA peak %.0f GFLOP/s\n", b.flops / 1e9,
           b.flops / 1e6 / (double)(B * T), peak);
    /* vdpbf16ps does twice the fp32 FMA's work per instruction; without it a
     * bf16 product runs as an fp32 one, so the fp32 peak is its ceiling */
    double mfu_peak = prec == KILN_BF16 && kiln_bf16_native() ? 2 * peak : peak;
    if (prec == KILN_BF16)
        printf("precision bf16: %s; bf16 peak for MFU %.0f GFLOP/s (%s)\n", kiln_bf16_path(), mfu_peak,
               kiln_bf16_amx()      ? "2x the fp32 FMA peak: a yardstick, AMX tiles run above it, so MFU may pass 100%"
               : kiln_bf16_native() ? "2x the fp32 FMA peak"
                                    : "no bf16 FMA on this CPU: the fp32 peak");
    kiln_dtype old_prec = kiln_autocast_set(prec);
    result res[8] = {0}, loaded[8] = {0};
    const char *names[8];
    int n = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", modes);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n < 8; tok = strtok_r(NULL, ",", &save))
        names[n++] = tok;
    double *peaks = calloc((size_t)rounds, sizeof *peaks);
    bool ran = peaks && run_modes(&b, names, n, rounds, res, peaks);
    int hogs[64], n_hogs = 0;
    if (ran && compete) { /* the same modes again beside N busy processes */
        n_hogs = kiln_cli_compete_start(compete, hogs);
        printf("\nagain beside %d busy processes:\n", n_hogs);
        ran = run_modes(&b, names, n, rounds, loaded, NULL);
        kiln_cli_compete_stop(n_hogs, hogs);
    }
    kiln_autocast_set(old_prec);
    int rc = 0;
    if (!ran) {
        fprintf(stderr, "kiln bench: out of memory for %d steps' times\n", b.steps);
        rc = 1;
        goto out;
    }
    if (measure) { /* a probe that a neighbour slowed reads low, and a low peak overstates MFU:
                    * MFU uses the best probe, before the steps, before each round and after */
        double start_peak = peak;
        for (int k = 0; k < rounds; k++) peak = peaks[k] > peak ? peaks[k] : peak;
        for (int i = 0; i < 3; i++) {
            double p = kiln_fma_peak_gflops(0.1);
            if (p > peak) peak = p;
        }
        mfu_peak = prec == KILN_BF16 && kiln_bf16_native() ? 2 * peak : peak;
        if (peak > start_peak * 1.005)
            printf("fp32 FMA peak: %.0f GFLOP/s at start, %.0f the best probe during and after the steps (MFU uses %.0f)\n",
                   start_peak, peak, peak);
    }
    double base = 0;
    for (int i = 0; i < n; i++)
        if (res[i].ok && !strcmp(res[i].name, "eager")) base = res[i].tokens_s;
    printf("\n%-16s %9s %9s %7s %9s %8s %6s %9s %12s %9s %10s %9s %9s\n", "mode", "ms/step", "optim ms", "optim%",
           "tokens/s", "GFLOP/s", "MFU", "vs eager", "peak RSS MB", "alloc MB", "arena MB", "build s", "warm s");
    for (int i = 0; i < n; i++) {
        result *r = &res[i];
        if (!r->ok) {
            printf("%-16s failed\n", r->name);
            continue;
        }
        printf("%-16s %9.1f %9.2f %6.1f%% %9.0f %8.1f %5.1f%% %8.2fx %12.0f %9.0f %10.0f %9.2f %9.3f\n", r->name, r->ms,
               r->opt_ms, r->ms > 0 ? 100 * r->opt_ms / r->ms : 0, r->tokens_s, r->gflops,
               100 * r->gflops / mfu_peak, base > 0 ? r->tokens_s / base : 0, r->peak_mb, r->alloc_mb, r->arena_mb, r->build_s,
               r->warm_s);
    }
    printf("(median of %d steps per mode; a step is forward + backward + %s; optim%% = median optimiser ms / median\n"
           " step ms; MFU = model FLOPs / %s peak; alloc MB = the caching allocator's peak,\n"
           " live + cached; build s = first call (trace, passes, code generation, cc); warm s = the same step\n"
           " compiled again, loaded from the cache)\n", b.steps,
           b.opt ? "the optimiser (global norm, clip, AdamW)" : "nothing (--no-optim)",
           prec != KILN_BF16 ? "fp32 FMA" : kiln_bf16_native() ? "bf16 (2x fp32 FMA)" : "bf16 (= fp32 FMA, emulated)");
    printf("GEMM choices (by measurement, kiln_cache_dir()/gemm-choices): %s\n", kiln_gemm_choices());
    if (rounds > 1) { /* how much the machine itself moved while the modes ran */
        double lo = peaks[0], hi = peaks[0];
        for (int k = 1; k < rounds; k++) lo = peaks[k] < lo ? peaks[k] : lo, hi = peaks[k] > hi ? peaks[k] : hi;
        printf("%d rounds, every mode in each (%s); fp32 FMA peak before each round:", rounds,
               b.steps % rounds ? "the first rounds one step more" : "the same steps in each");
        for (int k = 0; k < rounds; k++) printf(" %.0f", peaks[k]);
        printf(" GFLOP/s (spread %.0f%%)\n", lo > 0 ? 100 * (hi - lo) / lo : 0);
        /* each round's ratio to eager, its modes back to back: on a shared
         * host a neighbour slows the compute-bound modes more than eager */
        int e = -1;
        for (int i = 0; i < n; i++)
            if (res[i].ok && !strcmp(res[i].name, "eager")) e = i;
        for (int i = 0; i < n && e >= 0; i++) {
            if (i == e || !res[i].ok) continue;
            printf("%s vs eager in each round (median steps):", res[i].name);
            for (int k = 0; k < rounds; k++)
                printf(" %.2fx", res[i].round_ms[k] > 0 ? res[e].round_ms[k] / res[i].round_ms[k] : 0);
            printf("\n");
        }
    }
    /* a compiled mode slower than eager is said, not left to the ratio
     * column: kiln train --compile with it would lose time on this machine */
    for (int i = 0; i < n && base > 0; i++)
        if (res[i].ok && strcmp(res[i].name, "eager") && res[i].tokens_s < base)
            printf("slower than eager here: %s ran %.3fx eager's tokens/s (%d threads, batch %lld x %lld): on this "
                   "machine kiln train --compile %s would lose to --compile off%s\n",
                   res[i].name, res[i].tokens_s / base, kiln_num_threads(), (long long)B, (long long)T, res[i].name,
                   !strcmp(res[i].name, "max-autotune") ? " (kiln train's max-autotune measures both and trains the faster)"
                                                        : "");
    if (n_hogs) {
        /* kiln's T threads and N spinners share C cores: T/(T+N) of them
         * is kiln's fair part, against the min(T, C) it uses alone */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        double T = kiln_num_threads(), C = cores > 0 ? (double)cores : T;
        double fair = T + n_hogs > C ? C * T / (T + n_hogs) / (T < C ? T : C) : 1.0;
        printf("\nbeside %d busy processes (%d threads, %.0f cores: fair share %.0f%% of idle speed)\n%-16s %10s %10s %10s "
               "%9s %12s\n",
               n_hogs, (int)T, C, 100 * fair, "mode", "idle tok/s", "load tok/s", "fair tok/s", "vs idle", "vs fair");
        for (int i = 0; i < n; i++)
            if (res[i].ok && loaded[i].ok)
                printf("%-16s %10.0f %10.0f %10.0f %8.1f%% %11.2fx\n", res[i].name, res[i].tokens_s, loaded[i].tokens_s,
                       fair * res[i].tokens_s, 100 * loaded[i].tokens_s / res[i].tokens_s,
                       loaded[i].tokens_s / (fair * res[i].tokens_s));
    }
    for (int i = 0; results && i < n; i++)
        if (res[i].ok)
            printf("RESULT mode=%s precision=%s threads=%d tokens_s=%.1f mfu=%.4f peak_mb=%.0f ms=%.1f optim_ms=%.2f "
                   "peak_gflops=%.1f mfu_peak_gflops=%.1f device=%s\n", res[i].name, prec == KILN_BF16 ? "bf16" : "fp32",
                   kiln_num_threads(), res[i].tokens_s, res[i].gflops / mfu_peak, res[i].peak_mb, res[i].ms, res[i].opt_ms, peak,
                   mfu_peak, dev->name);
out:
    free(peaks);
    free_results(res, n);
    free_results(loaded, n);
    for (int i = 0; i < 4; i++) kiln_tensor_release(b.in[i]);
    kiln_adamw_free(b.opt);
    kiln_llama_free(b.m);
    return rc;
}
