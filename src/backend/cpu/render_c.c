/* The CPU backend's renderer: C code generation from a planned graph. Each fused element-wise group
 * becomes one loop nest with its sizes as constants (restrict pointers, an
 * OpenMP SIMD loop whose remainder the compiler peels, OpenMP threads over
 * the outer range). Nothing read from files reaches the source: identifiers
 * are generated (g12, v345) and every constant is printed as a number. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "render_c.h"

typedef kiln_strbuf sbuf;
#define put kiln_strbuf_printf

/* The scalar math of the ops (kiln/opmath.h, the same text the kernels are
 * compiled from), as a string made by the Makefile. */
static const char *prelude =
#include "opmath_text.h"
    ;

/* The names a row epilogue's templates use besides operands and attrs. */
typedef struct {
    const char *x, *s, *r;
    int64_t n;
} row_names;

/* The one way a float constant enters generated C: finite values exactly
 * (9 significant digits round-trip a float), inf and NaN as builtins, since
 * printf's "inf"/"nan" are not C and `(inff)` failed to build. */
static void put_float(sbuf *b, float v) {
    if (isfinite(v)) put(b, "(%.9ef)", (double)v);
    else if (isnan(v)) put(b, "(__builtin_nanf(\"\"))");
    else put(b, v > 0 ? "(__builtin_inff())" : "(-__builtin_inff())");
}

/* Expands an op's C expression: $0..$7 -> operand names, $f0 -> attr, $i0
 * -> integer attr, $e -> the element index `i` of the loop; with
 * `rn`, also a row epilogue's $x, $s, $r and $n. */
static void expand(sbuf *b, const char *tmpl, char operands[][24], const kiln_attrs *a, const row_names *rn) {
    for (const char *p = tmpl; *p; p++) {
        if (rn && p[0] == '$' && (p[1] == 'x' || p[1] == 's' || p[1] == 'r' || p[1] == 'n')) {
            if (p[1] == 'n') put_float(b, (float)rn->n);
            else put(b, "%s", p[1] == 'x' ? rn->x : p[1] == 's' ? rn->s : rn->r);
            p += 1;
        } else if (p[0] == '$' && p[1] == 'e') { /* the element's flat index (indexed ops: dropout) */
            put(b, "i");
            p += 1;
        } else if (p[0] == '$' && p[1] == 'i' && p[2] >= '0' && p[2] <= '5') {
            put(b, "(%lldLL)", (long long)a->i[p[2] - '0']);
            p += 2;
        } else if (p[0] == '$' && p[1] == 'f' && p[2] >= '0' && p[2] <= '1') {
            put_float(b, (float)a->f[p[2] - '0']);
            p += 2;
        } else if (p[0] == '$' && p[1] >= '0' && p[1] <= '7') {
            put(b, "%s", operands[p[1] - '0']);
            p += 1;
        } else {
            put(b, "%c", *p);
        }
    }
}

/* Emits `const float tV = <expr>;` for members [0, upto) of group k (and the
 * store of each one that reaches memory), reading external inputs through
 * the args a<q>: element i, or the hoisted scalar. */
static void emit_members(sbuf *b, const kiln_graph *g, int k, const int *ids, int64_t N, int upto, const char *indent) {
    const int *mem = &g->group_members[g->group_start[k]];
    for (int s = 0; s < upto; s++) {
        const kiln_value *x = &g->v[mem[s]];
        char ops[KILN_OP_MAX_IN][24];
        for (int j = 0; j < x->n_in; j++) {
            int src = x->in[j];
            if (g->v[src].group == k) {
                snprintf(ops[j], sizeof ops[j], "t%d", src);
                continue;
            }
            int q = 0;
            while (ids[q] != src) q++;
            bool scalar = kiln_meta_numel(&g->v[src].meta) == 1 && N != 1;
            snprintf(ops[j], sizeof ops[j], scalar ? "a%d" : "a%d[i]", q);
        }
        put(b, "%sconst float t%d = ", indent, mem[s]);
        expand(b, kiln_op_get(x->op)->cexpr, ops, &x->attrs, NULL);
        put(b, ";\n");
        if (!x->internal) {
            int q = 0;
            while (ids[q] != mem[s]) q++;
            put(b, x->meta.dtype == KILN_BF16 ? "%sa%d[i] = kiln_f32_to_bf16(t%d);\n" : "%sa%d[i] = t%d;\n", indent, q, mem[s]);
        }
    }
}

/* Declares the kernel's arguments: outputs writable, inputs const, scalars
 * (one element broadcast over N) loaded once. */
static void emit_args(sbuf *b, const kiln_graph *g, int k, const int *ids, int na, int64_t N) {
    for (int q = 0; q < na; q++) {
        const kiln_value *x = &g->v[ids[q]];
        bool is_out = x->group == k;
        bool scalar = !is_out && kiln_meta_numel(&x->meta) == 1 && N != 1;
        if (is_out && x->meta.dtype == KILN_BF16)
            put(b, "    uint16_t *restrict a%d = (uint16_t *)args[%d];\n", q, q);
        else if (is_out)
            put(b, "    float *restrict a%d = (float *)args[%d];\n", q, q);
        else if (scalar)
            put(b, "    const float a%d = ((const float *)args[%d])[0];\n", q, q);
        else
            put(b, "    const float *restrict a%d = (const float *)args[%d];\n", q, q);
    }
}

/* The loop of group k reading args[]; `parallel` chooses an OpenMP loop
 * inside an existing parallel region ("for"), a standalone one
 * ("parallel for"), or none (serial). */
/* With dynamic sizes the element count is a runtime argument after the
 * pointers (args[na]); otherwise it is a constant of the source. */
static void size_expr(sbuf *b, int na, int64_t N, bool dyn) {
    if (dyn) put(b, "    const int64_t n = (int64_t)(intptr_t)args[%d];\n", na);
    else put(b, "    const int64_t n = %lldLL;\n", (long long)N);
}

/* parallel loops over at least PREFETCH_MIN elements prefetch their inputs */
#define PREFETCH_MIN 65536
#define PF_BLOCK 256
#define PF_AHEAD 2048

static void group_loop(sbuf *b, const kiln_graph *g, int k, const char *omp, bool dyn) {
    int ids[512];
    int na = kiln_graph_group_args(g, k, ids, 512);
    const int *mem = &g->group_members[g->group_start[k]];
    int nm = g->group_start[k + 1] - g->group_start[k];
    int64_t N = kiln_meta_numel(&g->v[mem[0]].meta);
    emit_args(b, g, k, ids, na, N);
    size_expr(b, na, N, dyn);
    if (omp && (dyn || N >= PREFETCH_MIN)) {
        /* blocks of PF_BLOCK elements, each fetching its inputs' lines
         * PF_AHEAD elements ahead: on a Xeon the hardware prefetcher fell
         * behind a loop that computes more per element (silu(gate) · up to
         * bf16 took 3.2 ms reading its inputs from memory, 1.5 ms when it
         * also stored silu(gate), 1.7 ms with these prefetches); blocks of
         * 1024 (a burst of prefetches per block) slowed a three-input loop */
        put(b, "#pragma omp %s schedule(static)\n", omp);
        put(b, "    for (int64_t i0 = 0; i0 < n; i0 += %d) {\n", PF_BLOCK);
        put(b, "        const int64_t i1 = i0 + %d < n ? i0 + %d : n;\n", PF_BLOCK, PF_BLOCK);
        put(b, "        if (i0 + %d <= n)\n            for (int64_t p = i0 + %d; p < i0 + %d; p += 16) {\n", PF_AHEAD + PF_BLOCK,
            PF_AHEAD, PF_AHEAD + PF_BLOCK);
        for (int q = 0; q < na; q++) {
            const kiln_value *x = &g->v[ids[q]];
            if (x->group != k && kiln_meta_numel(&x->meta) == N) put(b, "                __builtin_prefetch(a%d + p);\n", q);
        }
        put(b, "            }\n#pragma omp simd\n        for (int64_t i = i0; i < i1; i++) {\n");
        emit_members(b, g, k, ids, N, nm, "            ");
        put(b, "        }\n    }\n");
        return;
    }
    if (omp) put(b, "#pragma omp %s simd schedule(static)\n", omp);
    else put(b, "#pragma omp simd\n");
    put(b, "    for (int64_t i = 0; i < n; i++) {\n");
    emit_members(b, g, k, ids, N, nm, "        ");
    put(b, "    }\n");
}

static bool is_row_member(const kiln_graph *g, int v) { return g->v[v].kind == KILN_V_OP && kiln_op_get(g->v[v].op)->row; }

/* A group ending in a row reduction (kiln_row_epilogue, e.g. RMSNorm): per
 * row, the element-wise members feed the row's values into a local array
 * while the reduction accumulates, then the row's output is written from
 * the op's templates: one pass over the inputs. */
static void row_loop(sbuf *b, const kiln_graph *g, int k, const char *omp, bool dyn) {
    int ids[512];
    int na = kiln_graph_group_args(g, k, ids, 512);
    const int *mem = &g->group_members[g->group_start[k]];
    int nm = g->group_start[k + 1] - g->group_start[k], ni = 0;
    while (!is_row_member(g, mem[ni])) ni++; /* members after it: bf16 casts or roundings of its result */
    const kiln_value *norm = &g->v[mem[ni]];
    const kiln_row_epilogue *ep = kiln_op_get(norm->op)->row;
    int64_t N = kiln_meta_numel(&norm->meta), C = norm->meta.shape[norm->meta.ndim - 1];
    int xq = -1;
    char ops[KILN_OP_MAX_IN][24] = {{0}};
    for (int q = 0; q < na; q++) {
        if (ids[q] == norm->in[0]) xq = q;
        for (int j = 1; j < norm->n_in; j++)
            if (ids[q] == norm->in[j]) snprintf(ops[j], sizeof ops[j], "a%d[j]", q); /* read whole: element j */
    }
    emit_args(b, g, k, ids, na, N);
    size_expr(b, na, N, dyn);
    if (omp) put(b, "#pragma omp %s schedule(static)\n", omp);
    put(b, "    for (int64_t r = 0; r < n / %lldLL; r++) {\n        float xr[%lld];\n        float ss = 0.0f;\n", (long long)C,
        (long long)C);
    put(b, "#pragma omp simd reduction(+ : ss)\n        for (int64_t j = 0; j < %lldLL; j++) {\n", (long long)C);
    put(b, "            const int64_t i = r * %lldLL + j;\n", (long long)C);
    emit_members(b, g, k, ids, N, ni, "            ");
    if (g->v[norm->in[0]].group == k) put(b, "            xr[j] = t%d;\n", norm->in[0]);
    else put(b, "            xr[j] = a%d[i];\n", xq);
    row_names rn = {.x = "xr[j]", .s = "ss", .r = "rs", .n = C};
    put(b, "            ss += ");
    expand(b, ep->acc, ops, &norm->attrs, &rn);
    put(b, ";\n        }\n        const float rs = ");
    expand(b, ep->fin, ops, &norm->attrs, &rn);
    put(b, ";\n#pragma omp simd\n        for (int64_t j = 0; j < %lldLL; j++) {\n", (long long)C);
    put(b, "            const float y = ");
    expand(b, ep->out, ops, &norm->attrs, &rn);
    put(b, ";\n");
    for (int s = ni; s < nm; s++) {
        const kiln_value *x = &g->v[mem[s]];
        if (x->internal) continue;
        int q = 0;
        while (ids[q] != mem[s]) q++;
        const char *store = x->meta.dtype == KILN_BF16       ? "            a%d[r * %lldLL + j] = kiln_f32_to_bf16(y);\n"
                            : x->op == KILN_OP_ROUND_BF16 ? "            a%d[r * %lldLL + j] = kiln_round_bf16f(y);\n"
                                                          : "            a%d[r * %lldLL + j] = y;\n";
        put(b, store, q, (long long)C);
    }
    put(b, "        }\n    }\n");
}

static bool is_row_group(const kiln_graph *g, int k) {
    for (int m = g->group_start[k]; m < g->group_start[k + 1]; m++)
        if (is_row_member(g, g->group_members[m])) return true;
    return false;
}

static void any_loop(sbuf *b, const kiln_graph *g, int k, const char *omp, bool dyn) {
    if (is_row_group(g, k)) row_loop(b, g, k, omp ? (strcmp(omp, "for") ? "parallel for" : "for") : NULL, dyn);
    else group_loop(b, g, k, omp, dyn);
}

static bool parallel_worthwhile(const kiln_graph *g, int k) {
    return kiln_meta_numel(&g->v[g->group_members[g->group_start[k]]].meta) >= 16384;
}

char *kiln_codegen_groups(const kiln_graph *g, int part, int n_parts, bool serial_variants, bool dynamic) {
    sbuf b = {0};
    put(&b, "/* kiln generated module: fused element-wise kernels, part %d of %d */\n", part, n_parts);
    put(&b, "%s", prelude);
    for (int k = part; k < g->n_groups; k += n_parts) {
        int ids[512];
        int na = kiln_graph_group_args(g, k, ids, 512);
        int nm = g->group_start[k + 1] - g->group_start[k];
        put(&b, "\n/* group %d: %d op(s), %d argument(s) */\n", k, nm, na);
        put(&b, "void kiln_g%d(void *const *args) {\n", k);
        any_loop(&b, g, k, parallel_worthwhile(g, k) ? "parallel for" : NULL, dynamic);
        put(&b, "}\n");
        if (serial_variants) {
            put(&b, "void kiln_g%d_serial(void *const *args) {\n", k);
            any_loop(&b, g, k, NULL, dynamic);
            put(&b, "}\n");
            put(&b, "void kiln_g%d_parallel(void *const *args) {\n", k);
            any_loop(&b, g, k, "parallel for", dynamic);
            put(&b, "}\n");
        }
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* The whole step as one function: generated loops for the fused groups,
 * consecutive ones sharing one OpenMP parallel region (barriers between
 * them), and a call back into the runtime for every other node. */
char *kiln_codegen_step(const kiln_graph *g) {
    sbuf b = {0};
    put(&b, "/* kiln generated module: the whole step (reduce-overhead) */\n%s", prelude);
    put(&b, "void kiln_step(void *const *ptrs, int (*run_value)(void *r, int v), void *r) {\n");
    bool in_region = false;
    for (int i = 0; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind == KILN_V_INPUT || x->kind == KILN_V_PARAM || x->kind == KILN_V_AUX) continue;
        if (x->kind == KILN_V_OP && x->group != KILN_GROUP_NONE) {
            if (kiln_graph_exec_pos(g, i) != i) continue;
            int k = x->group;
            int ids[512];
            int na = kiln_graph_group_args(g, k, ids, 512);
            if (!in_region) {
                put(&b, "#pragma omp parallel\n  {\n");
                in_region = true;
            }
            put(&b, "  { /* group %d */\n    void *const args[%d] = {", k, na ? na : 1);
            for (int q = 0; q < na; q++) put(&b, "%sptrs[%d]", q ? ", " : "", ids[q]);
            if (!na) put(&b, "0");
            put(&b, "};\n");
            any_loop(&b, g, k, "for", false);
            put(&b, "  }\n");
            continue;
        }
        if (x->kind == KILN_V_OP && kiln_op_get(x->op)->is_view) {
            if (in_region) {
                put(&b, "  }\n");
                in_region = false;
            }
            put(&b, "  run_value(r, %d);\n", i); /* sets the view's pointer */
            continue;
        }
        if (in_region) {
            put(&b, "  }\n");
            in_region = false;
        }
        put(&b, "  if (run_value(r, %d)) return; /* %s */\n", i,
            x->kind == KILN_V_OP ? kiln_op_name(x->op) : "gradient accumulation");
    }
    if (in_region) put(&b, "  }\n");
    put(&b, "}\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
