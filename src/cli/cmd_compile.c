/* kiln compile --explain: what the compiler does to a model's training step:
 * the graph before and after the passes, every fused kernel with its FLOPs
 * and bytes, the memory plan and the generated file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "kiln/train.h"

static const char *compile_help =
    "usage: kiln compile --explain [options]\n"
    "Traces a model's training step (forward, backward, gradient accumulation), runs the\n"
    "compiler's passes and prints what they did.\n"
    "  --model NAME|FILE   tiny (default), small, demo, or a config.json\n"
    "  --batch N           rows per micro-batch (default 2)\n"
    "  --seq N             sequence length (default 32)\n"
    "  --mode MODE         one of" KILN_COMPILE_MODE_NAMES " (default: default)\n"
    "  --precision P       fp32 (default) or bf16 (autocast)\n"
    "  --recompute R       pointwise (default), none, attention or layer\n"
    "  --graph             also list every node before and after the passes\n";

static void print_line(const char *text, void *user) {
    (void)user;
    printf("  %s\n", text);
}

static void summary(const char *title, const kiln_graph *g) {
    int counts[KILN_OP_COUNT] = {0};
    for (int i = 0; i < g->n; i++)
        if (!g->v[i].dead && g->v[i].kind == KILN_V_OP) counts[g->v[i].op]++;
    printf("%s: %d nodes, %.2f GFLOP, arena %.2f MB (all buffers %.2f MB)\n  ", title, kiln_graph_live_nodes(g),
           kiln_graph_flops(g) / 1e9, g->arena_bytes / 1e6, g->unplanned_bytes / 1e6);
    for (int o = 0; o < KILN_OP_COUNT; o++)
        if (counts[o]) printf("%s x%d  ", kiln_op_name(o), counts[o]);
    printf("\n");
}

static void groups(const kiln_graph *g) {
    printf("fused element-wise kernels (one loop each; internal values never reach memory):\n");
    for (int k = 0; k < g->n_groups; k++) {
        int s = g->group_start[k], e = g->group_start[k + 1], ids[512];
        int na = kiln_graph_group_args(g, k, ids, 512);
        double flops = 0, bytes = 0;
        for (int q = 0; q < na; q++) bytes += (double)kiln_meta_numel(&g->v[ids[q]].meta) * 4;
        printf("  kiln_g%-3d", k);
        for (int m = s; m < e; m++) {
            const kiln_value *x = &g->v[g->group_members[m]];
            kiln_meta im[KILN_OP_MAX_IN];
            for (int j = 0; j < x->n_in; j++) im[j] = g->v[x->in[j]].meta;
            flops += kiln_op_flops(x->op, im, &x->attrs, &x->meta);
            printf(" %s%s%s", m > s ? "+ " : "", kiln_op_name(x->op), x->internal ? "*" : "");
        }
        printf("  [%lld elements, %.2f MFLOP, %.2f MB]\n", (long long)kiln_meta_numel(&g->v[g->group_members[s]].meta),
               flops / 1e6, bytes / 1e6);
    }
}

int kiln_cmd_compile(int argc, char **argv) {
    const char *model = "tiny", *mode = "default", *precision = "fp32", *recompute = "pointwise";
    int64_t B = 2, T = 32;
    bool explain = false, list = false;
    const kiln_cli_opt opts[] = {
        KILN_OPT("--model", KILN_OPT_STR, &model),
        KILN_OPT_RANGE("--batch", KILN_OPT_I64, &B, 1, 1 << 20),
        KILN_OPT_RANGE("--seq", KILN_OPT_I64, &T, 2, 1 << 24),
        KILN_OPT("--mode", KILN_OPT_STR, &mode),
        KILN_OPT("--explain", KILN_OPT_TRUE, &explain),
        KILN_OPT("--graph", KILN_OPT_TRUE, &list),
        KILN_OPT("--precision", KILN_OPT_STR, &precision),
        KILN_OPT("--recompute", KILN_OPT_STR, &recompute),
    };
    int pr = kiln_cli_parse("compile", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), compile_help, NULL, 0, NULL);
    if (pr) return pr == 1 ? 0 : 2;
    if (!explain) {
        fputs(compile_help, stderr);
        return 2;
    }
    kiln_llama_config cfg;
    kiln_status st = kiln_llama_config_resolve(model, &cfg);
    kiln_compile_options co;
    kiln_compile_options_default(&co);
    if (!st) st = kiln_compile_mode_parse(mode, &co);
    if (!st) st = kiln_recompute_parse(recompute, &co);
    kiln_dtype prec = KILN_F32;
    if (!st) st = kiln_precision_parse(precision, &prec);
    if (st) {
        fprintf(stderr, "kiln compile: %s\n", kiln_last_error());
        return 2;
    }
    if (T > cfg.max_position_embeddings) cfg.max_position_embeddings = T;
    kiln_autocast_set(prec);
    kiln_llama *m = kiln_llama_new(&cfg, 1);
    if (!m) {
        fprintf(stderr, "kiln compile: --model %s: %s\n", model, kiln_last_error());
        return 1;
    }
    int64_t shape[2] = {B, T}, one = 1;
    kiln_tensor *in[4] = {kiln_tensor_zeros(KILN_I32, 2, shape), kiln_tensor_zeros(KILN_I32, 2, shape),
                          kiln_tensor_new(KILN_I32, 2, shape), kiln_tensor_zeros(KILN_F32, 1, &one)};
    int32_t *ones = malloc((size_t)(B * T) * sizeof *ones); /* the padding mask, set through the seam */
    st = ones && in[2] ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory making the inputs");
    for (int64_t i = 0; !st && i < B * T; i++) ones[i] = 1;
    if (!st) st = kiln_tensor_set(in[2], 0, ones, (size_t)(B * T) * sizeof *ones);
    free(ones);
    if (st) {
        fprintf(stderr, "kiln compile: %s\n", kiln_last_error());
        return 1;
    }
    kiln_graph_options go;
    kiln_graph_options_default(&go);
    go.rewrite_attention = go.rewrite_linear_ce = go.fuse = false;
    kiln_graph *before = NULL;
    st = kiln_graph_build(kiln_train_trace_step, m, m->params, m->n_params, in, 4, &go, &before);
    if (st) {
        fprintf(stderr, "kiln compile: %s\n", kiln_last_error());
        return 1;
    }
    printf("model %s, micro-batch %lld x %lld, mode %s, precision %s, recompute %s\n\n", model, (long long)B, (long long)T,
           mode, precision, recompute);
    summary("joint graph before the rewrites and fusion", before);
    if (list) kiln_graph_print(before, print_line, NULL);
    kiln_compiled *cs = kiln_train_compile(m, &co, true);
    float rep[1];
    st = cs ? kiln_compiled_run(cs, in, rep) : kiln_last_status();
    if (st) {
        fprintf(stderr, "kiln compile: %s\n", kiln_last_error());
        return 1;
    }
    const kiln_graph *after = kiln_compiled_graph(cs);
    kiln_compile_stats s = kiln_compiled_stats(cs);
    printf("\n");
    summary("after the passes (flash attention, fused linear + cross-entropy, CSE/DCE, gradient GEMMs after element-wise runs, fusion, plan)", after);
    if (list) kiln_graph_print(after, print_line, NULL);
    printf("\n");
    if (!after->n_misses) {
        printf("rewrites: every attention and the head + cross-entropy were fused\n\n");
    } else {
        printf("rewrites that did not fire (%d):\n", after->n_misses);
        for (int i = 0; i < after->n_misses; i++) printf("  %s\n", after->misses[i]);
        printf("\n");
    }
    groups(after);
    printf("\nmemory plan: arena %.2f MB for %.2f MB of buffers (%.0f%% reuse); parameters and gradients stay in the model\n",
           after->arena_bytes / 1e6, after->unplanned_bytes / 1e6,
           after->unplanned_bytes ? 100.0 * (1 - (double)after->arena_bytes / after->unplanned_bytes) : 0);
    printf("build: %.3f s (%s); %s\n", s.build_seconds, s.from_cache ? "loaded from the cache" : "compiled",
           s.interpreted ? "running in the interpreter" : "generated C:");
    if (!s.interpreted) printf("  %s\n", s.source_path);
    kiln_compiled_free(cs);
    kiln_graph_free(before);
    for (int i = 0; i < 4; i++) kiln_tensor_release(in[i]);
    kiln_llama_free(m);
    return 0;
}
