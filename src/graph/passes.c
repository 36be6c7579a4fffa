/* Graph passes: dead-code and common-subexpression elimination, the
 * attention and linear + cross-entropy rewrites, and GEMMs that accumulate
 * straight into gradient buffers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

kiln_status kiln_pass_dce(kiln_graph *g, int *removed_out) {
    bool *live = calloc((size_t)g->n + 1, sizeof *live);
    if (!live) return kiln_error(KILN_ERR_OOM, "out of memory removing dead code");
    for (int i = 0; i < g->n_outputs; i++) live[g->outputs[i]] = true;
    if (g->diff >= 0) live[g->diff] = true;
    for (int i = g->n - 1; i >= 0; i--) {
        kiln_value *x = &g->v[i];
        if (x->dead) continue;
        if (x->kind == KILN_V_GRAD_ACC || x->kind == KILN_V_PARAM || x->kind == KILN_V_INPUT) live[i] = true;
        if (!live[i]) continue;
        for (int j = 0; j < x->n_in; j++) live[x->in[j]] = true;
    }
    /* a live multi-output op writes all its outputs */
    for (int i = 0; i < g->n; i++)
        if (live[i] && g->v[i].kind == KILN_V_OP)
            for (int a = 0; a < kiln_op_get(g->v[i].op)->n_aux; a++) live[g->v[i].aux_of[a]] = true;
    for (int i = 0; i < g->n; i++)
        if (live[i] && g->v[i].kind == KILN_V_AUX) live[g->v[i].in[0]] = true;
    int removed = 0;
    for (int i = 0; i < g->n; i++)
        if (!live[i] && !g->v[i].dead) {
            g->v[i].dead = true;
            removed++;
        }
    free(live);
    if (removed_out) *removed_out = removed;
    return KILN_OK;
}

static bool same_node(const kiln_value *a, const kiln_value *b) {
    return a->kind == KILN_V_OP && b->kind == KILN_V_OP && a->op == b->op && a->n_in == b->n_in &&
           !memcmp(a->in, b->in, sizeof(int) * (size_t)a->n_in) && !memcmp(&a->attrs, &b->attrs, sizeof a->attrs) &&
           a->meta.ndim == b->meta.ndim && !memcmp(a->meta.shape, b->meta.shape, sizeof a->meta.shape);
}

kiln_status kiln_pass_cse(kiln_graph *g, int *merged_out) {
    int merged = 0;
    /* bucket by a hash of (op, inputs, attrs) */
    int cap = 1;
    while (cap < g->n * 2) cap *= 2;
    int *table = malloc(sizeof(int) * (size_t)cap);
    if (!table) return kiln_error(KILN_ERR_OOM, "out of memory merging common subexpressions");
    for (int i = 0; i < cap; i++) table[i] = -1;
    for (int i = 0; i < g->n; i++) {
        kiln_value *x = &g->v[i];
        if (x->dead || x->kind != KILN_V_OP || kiln_op_get(x->op)->n_aux) continue;
        uint64_t h = (uint64_t)x->op * 0x9e3779b97f4a7c15ull;
        for (int j = 0; j < x->n_in; j++) h = (h ^ (uint64_t)x->in[j]) * 0x100000001b3ull;
        for (int j = 0; j < 6; j++) h = (h ^ (uint64_t)x->attrs.i[j]) * 0x100000001b3ull;
        size_t s = (size_t)(h & (uint64_t)(cap - 1));
        int found = -1;
        while (table[s] >= 0) {
            if (same_node(&g->v[table[s]], x)) {
                found = table[s];
                break;
            }
            s = (s + 1) & (size_t)(cap - 1);
        }
        if (found >= 0) {
            kiln_graph_replace_uses(g, i, found);
            x->dead = true;
            merged++;
        } else {
            table[s] = i;
        }
    }
    free(table);
    if (merged_out) *merged_out = merged;
    return KILN_OK;
}

/* Turns value `v` into a multi-output op, appending its extra outputs. The
 * graph is unchanged unless every extra output could be added. */
static kiln_status become(kiln_graph *g, int v, int op, int n_in, const int *in, kiln_attrs attrs) {
    const kiln_op_def *d = kiln_op_get(op);
    kiln_meta im[KILN_OP_MAX_IN], am[KILN_OP_MAX_AUX];
    for (int i = 0; i < n_in; i++) im[i] = g->v[in[i]].meta;
    if (d->aux_shape && d->aux_shape(im, &attrs, am)) return kiln_last_status();
    int n0 = g->n;
    for (int a = 0; a < d->n_aux; a++) {
        kiln_value av = {.kind = KILN_V_AUX, .n_in = 1, .in = {v}, .aux = a, .meta = am[a], .scope = g->v[v].scope};
        int id = kiln_graph_add(g, av);
        if (id < 0) {
            g->n = n0;
            return kiln_last_status();
        }
        g->v[v].aux_of[a] = id;
    }
    kiln_value *x = &g->v[v];
    x->op = op;
    x->n_in = n_in;
    memcpy(x->in, in, sizeof(int) * (size_t)n_in);
    x->attrs = attrs;
    return KILN_OK;
}

static bool is_op(const kiln_graph *g, int v, int op) { return g->v[v].kind == KILN_V_OP && !g->v[v].dead && g->v[v].op == op; }

/* Notes a rewrite that did not fire on value v (at most KILN_GRAPH_MAX_MISSES). */
static void miss(kiln_graph *g, int v, const char *what, const char *why) {
    if (g->n_misses >= KILN_GRAPH_MAX_MISSES) return;
    char line[400];
    int scope = g->v[v].scope;
    if (scope > 0)
        snprintf(line, sizeof line, "%s of layer %d (v%d) not fused: %s", what, (scope - 1) / 2, v, why);
    else
        snprintf(line, sizeof line, "%s (v%d) not fused: %s", what, v, why);
    if ((g->misses[g->n_misses] = strdup(line))) g->n_misses++;
}

/* Why softmax p is not softmax(scale(q·k_repᵀ) + mask(pad[, seg]))·v_rep
 * (NULL when it is: in[] and *a then make the flash_attn, *o the product). */
static const char *attention_shape(const kiln_graph *g, int p, int *in, kiln_attrs *a, int *o_out, char *buf, size_t n) {
    int o = kiln_graph_only_user(g, p);
    if (o < 0) return "the probabilities have other readers than one product with v";
    if (!is_op(g, o, KILN_OP_MATMUL) || g->v[o].attrs.i[0] != KILN_MM_BATCHED || g->v[o].attrs.i[1] || g->v[o].attrs.i[2] ||
        g->v[o].in[0] != p)
        return "the probabilities are not multiplied by v (a batched product, neither side transposed)";
    int vr = g->v[o].in[1], s2 = g->v[p].in[0];
    if (!is_op(g, s2, KILN_OP_ADD) || kiln_graph_only_user(g, s2) != p)
        return "the softmax's input is not scores + mask (an add read by the softmax alone)";
    int s1 = g->v[s2].in[0], mask = g->v[s2].in[1];
    if (!is_op(g, mask, KILN_OP_ATTN_MASK)) return "the added term is not an attention mask (attn_mask)";
    if (is_op(g, s1, KILN_OP_SCALE) && is_op(g, g->v[s1].in[0], KILN_OP_TANH))
        return "the scores are soft-capped (c tanh(s / c), Gemma 2's attn_logit_softcapping), which the flash kernels do not do";
    if (!is_op(g, s1, KILN_OP_SCALE) || kiln_graph_only_user(g, s1) != s2)
        return "the scores are not scaled once (scale) and read by the mask's add alone";
    int sc = g->v[s1].in[0];
    if (!is_op(g, sc, KILN_OP_MATMUL) || kiln_graph_only_user(g, sc) != s1 || g->v[sc].attrs.i[0] != KILN_MM_BATCHED ||
        g->v[sc].attrs.i[1] || !g->v[sc].attrs.i[2])
        return "the scores are not q·kᵀ (a batched product with k transposed, read by the scale alone)";
    int q = g->v[sc].in[0], kr = g->v[sc].in[1], k = kr, v = vr;
    int64_t rk = 1, rv = 1;
    if (is_op(g, kr, KILN_OP_REPEAT_KV)) k = g->v[kr].in[0], rk = g->v[kr].attrs.i[0];
    if (is_op(g, vr, KILN_OP_REPEAT_KV)) v = g->v[vr].in[0], rv = g->v[vr].attrs.i[0];
    const kiln_meta *qm = &g->v[q].meta, *km = &g->v[k].meta;
    if (rk != rv) {
        snprintf(buf, n, "k and v are repeated differently for the query heads (%lld and %lld)", (long long)rk, (long long)rv);
        return buf;
    }
    if (qm->ndim != 4 || km->ndim != 4) return "q or k is not [B, heads, T, head_dim]";
    if (g->v[mask].attrs.i[0] != qm->shape[2]) {
        snprintf(buf, n, "the mask is for %lld queries, q has %lld", (long long)g->v[mask].attrs.i[0], (long long)qm->shape[2]);
        return buf;
    }
    /* a block-diagonal mask hands its segment ids on, and its window */
    bool seg = g->v[mask].attrs.i[1] != 0;
    int x[5] = {q, k, v, g->v[mask].in[0], seg ? g->v[mask].in[1] : 0};
    memcpy(in, x, sizeof x);
    /* bf16 when both products were bf16 ones (autocast): the kernel then
     * rounds their operands as they did (on AMX) */
    const bool bf16 = g->v[sc].attrs.i[3] && g->v[o].attrs.i[3];
    *a = (kiln_attrs){.i = {seg, g->v[mask].attrs.i[2], bf16}, .f = {g->v[s1].attrs.f[0]}};
    *o_out = o;
    return NULL;
}

/* softmax(scale(q·k_repᵀ) + mask(pad[, seg]))·v_rep  ->  flash_attn(q, k, v, pad[, seg]), the
 * mask's sliding window kept; every other softmax is noted with the reason */
kiln_status kiln_pass_rewrite_attention(kiln_graph *g, int *done_out) {
    int done = 0;
    kiln_status st = KILN_OK;
    for (int p = 0; p < g->n && !st; p++) {
        if (!is_op(g, p, KILN_OP_SOFTMAX)) continue;
        int in[5], o = -1;
        kiln_attrs a;
        char buf[160];
        const char *why = attention_shape(g, p, in, &a, &o, buf, sizeof buf);
        if (why) {
            miss(g, p, "attention", why);
            continue;
        }
        if (!(st = become(g, o, KILN_OP_FLASH_ATTN, a.i[0] ? 5 : 4, in, a))) done++;
    }
    if (!st && done) st = kiln_pass_dce(g, NULL);
    if (done_out) *done_out = done;
    return st;
}

/* cross_entropy(h·Wᵀ, targets)  ->  linear_cross_entropy(h, W, targets); a
 * bf16 head (MATMUL i3) becomes the op's bf16 form (i3 too), which rounds
 * as that MATMUL and its backward products do. A head over a held bf16
 * weight (a LoRA base) stays a MATMUL: the fused op takes fp32 operands. */
/* A soft-cap before the cross-entropy c, scale(tanh(scale(z, 1/cap)), cap)
 * with each step read by the next alone (kiln_softcap): *logits becomes z
 * and cap is returned; 0 (and *logits unchanged) when there is none. */
static double softcap_of(const kiln_graph *g, int *logits, int c) {
    int s2 = *logits;
    if (!is_op(g, s2, KILN_OP_SCALE) || kiln_graph_only_user(g, s2) != c) return 0;
    int t = g->v[s2].in[0];
    if (!is_op(g, t, KILN_OP_TANH) || kiln_graph_only_user(g, t) != s2) return 0;
    int s1 = g->v[t].in[0];
    if (!is_op(g, s1, KILN_OP_SCALE) || kiln_graph_only_user(g, s1) != t) return 0;
    double cap = g->v[s2].attrs.f[0], inv = g->v[s1].attrs.f[0];
    if (!(cap > 0) || fabs(cap * inv - 1.0) > 1e-12) return 0;
    *logits = g->v[s1].in[0];
    return cap;
}

kiln_status kiln_pass_rewrite_linear_ce(kiln_graph *g, int *done_out) {
    int done = 0;
    kiln_status st = KILN_OK;
    for (int c = 0; c < g->n && !st; c++) {
        if (!is_op(g, c, KILN_OP_CROSS_ENTROPY)) continue;
        int logits = g->v[c].in[0];
        const char *what = "the head + cross-entropy";
        double cap = softcap_of(g, &logits, c);
        if (!is_op(g, logits, KILN_OP_MATMUL) || g->v[logits].attrs.i[0] != KILN_MM_ROWS || !g->v[logits].attrs.i[2]) {
            miss(g, c, what, "the logits are not h·Wᵀ (a linear)");
            continue;
        }
        if (kiln_graph_only_user(g, logits) != (cap > 0 ? g->v[g->v[g->v[c].in[0]].in[0]].in[0] : c)) {
            miss(g, c, what, "the logits have other readers than the cross-entropy (they would be materialised anyway)");
            continue;
        }
        int h = g->v[logits].in[0], W = g->v[logits].in[1];
        if (g->v[h].meta.dtype != KILN_F32 || g->v[W].meta.dtype != KILN_F32) {
            char why[160];
            snprintf(why, sizeof why, "the head's operands are %s and %s (the fused op takes fp32; a held bf16 head stays a product)",
                     kiln_dtype_name(g->v[h].meta.dtype), kiln_dtype_name(g->v[W].meta.dtype));
            miss(g, c, what, why);
            continue;
        }
        int in[3] = {h, W, g->v[c].in[1]};
        kiln_attrs a = {.i = {g->v[c].attrs.i[0], g->v[h].requires_grad, g->v[W].requires_grad, g->v[logits].attrs.i[3] != 0},
                        .f = {cap}};
        if (!(st = become(g, c, KILN_OP_LINEAR_CE, 3, in, a))) done++;
    }
    if (!st && done) st = kiln_pass_dce(g, NULL);
    if (done_out) *done_out = done;
    return st;
}

/* The values `v` is computed from that come after `before`, in order, into
 * cone (at most max); false unless each is a one-element f32 op without
 * extra outputs (the loss's incoming gradient: the seed FILL times the
 * trainer's scale), which can be computed earlier. */
static bool scalar_cone(const kiln_graph *g, int v, int before, int *cone, int *n, int max) {
    if (v < before) return true;
    for (int i = 0; i < *n; i++)
        if (cone[i] == v) return true;
    const kiln_value *x = &g->v[v];
    if (x->kind != KILN_V_OP || x->dead || kiln_op_get(x->op)->n_aux || x->meta.dtype != KILN_F32 ||
        kiln_meta_numel(&x->meta) != 1 || *n >= max)
        return false;
    for (int j = 0; j < x->n_in; j++)
        if (!scalar_cone(g, x->in[j], before, cone, n, max)) return false;
    int k = *n; /* keep the cone in value order: inputs first */
    while (k > 0 && cone[k - 1] > v) cone[k] = cone[k - 1], k--;
    cone[k] = v;
    (*n)++;
    return true;
}

/* The common incoming gradient of a linear_cross_entropy's used extra
 * outputs: every live reader of dh and dW is scale_by(aux, G) with one G;
 * -1 if not so (or nothing reads them). */
static int incoming_grad(const kiln_graph *g, int c) {
    int G = -1;
    bool any = false;
    for (int i = c + 1; i < g->n; i++) {
        const kiln_value *x = &g->v[i];
        if (x->dead || x->kind == KILN_V_AUX) continue;
        for (int j = 0; j < x->n_in; j++) {
            int a = x->in[j];
            if (a != g->v[c].aux_of[0] && a != g->v[c].aux_of[1]) continue;
            if (!is_op(g, i, KILN_OP_SCALE_BY) || j != 0 || (G >= 0 && x->in[1] != G)) return -1;
            G = x->in[1];
            any = true;
        }
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == g->v[c].aux_of[0] || g->outputs[i] == g->v[c].aux_of[1]) return -1;
    return any ? G : -1;
}

/* After autograd: a bf16 linear_cross_entropy's gradients reach the
 * parameters as scale_by(aux, G), G the loss's incoming gradient, and a
 * scaling after the rounding to bf16 is not what eager computes (eager
 * scales dlogits, then its bf16 products round them). G is computed from
 * runtime inputs only (seed 1 times the trainer's scale), so it is computed
 * before the op instead, handed to it as its seed (input 3, i4), and the
 * scalings go: the op's gradients are then eager's to float rounding, and
 * two passes over dh and dW are saved. fp32 heads keep their form (the
 * place of an fp32 scaling changes nothing but fp32 rounding). */
kiln_status kiln_pass_seed_linear_ce(kiln_graph *g, int *done_out) {
    int done = 0;
    for (int c = 0; c < g->n; c++) {
        if (!is_op(g, c, KILN_OP_LINEAR_CE) || !g->v[c].attrs.i[3] || g->v[c].attrs.i[4]) continue;
        int G = incoming_grad(g, c), cone[8], n = 0;
        if (G < 0 || !scalar_cone(g, G, c, cone, &n, 8)) continue;
        /* copies of the cone at c, c+1, ...: each insert moves every later
         * value (the cone's originals, c, G) one place up */
        int copy[8];
        for (int k = 0; k < n; k++) {
            kiln_value cv = g->v[cone[k] + k];
            for (int j = 0; j < cv.n_in; j++)
                for (int q = 0; q < k; q++)
                    if (cv.in[j] == cone[q] + k) cv.in[j] = copy[q];
            cv.n_uses = 0;
            if (kiln_graph_insert(g, c + k, cv) < 0) return kiln_last_status();
            copy[k] = c + k;
        }
        /* G is the cone's last value (the rest are its inputs); a G
         * before c (a runtime input) has an empty cone and stays */
        int moved = c + n, Gn = n ? G + n : G, seed = n ? copy[n - 1] : G;
        kiln_value *x = &g->v[moved];
        x->in[3] = seed;
        x->n_in = 4;
        x->attrs.i[4] = 1;
        for (int i = moved + 1; i < g->n; i++)
            if (is_op(g, i, KILN_OP_SCALE_BY) && g->v[i].in[1] == Gn &&
                (g->v[i].in[0] == x->aux_of[0] || g->v[i].in[0] == x->aux_of[1])) {
                kiln_graph_replace_uses(g, i, g->v[i].in[0]);
                g->v[i].dead = true;
            }
        done++;
        c = moved;
    }
    if (done_out) *done_out = done;
    return done ? kiln_pass_dce(g, NULL) : KILN_OK;
}

/* dW = aᵀ·b feeding only a gradient sink: the GEMM adds into the parameter's
 * .grad itself (beta = 1), so the product needs no buffer and no extra pass. */
kiln_status kiln_pass_acc_into_grad(kiln_graph *g, int *done_out) {
    int done = 0;
    for (int s = 0; s < g->n; s++) {
        if (g->v[s].dead || g->v[s].kind != KILN_V_GRAD_ACC) continue;
        int x = g->v[s].in[0];
        /* grad += s * y instead of materialising s * y (the fused linear +
         * cross-entropy's weight gradient is scaled by the incoming one) */
        if (is_op(g, x, KILN_OP_SCALE_BY) && g->v[s].n_in == 1 && kiln_graph_only_user(g, x) == s) {
            g->v[s].n_in = 2;
            g->v[s].in[0] = g->v[x].in[0];
            g->v[s].in[1] = g->v[x].in[1];
            g->v[x].dead = true;
            done++;
            continue;
        }
        if (!is_op(g, x, KILN_OP_MATMUL) || g->v[x].attrs.i[0] != KILN_MM_GRAD || kiln_graph_only_user(g, x) != s) continue;
        g->v[x].acc_into_grad = true;
        g->v[x].index = g->v[s].index;
        done++;
    }
    if (done_out) *done_out = done;
    return KILN_OK;
}

static int cast_of(const kiln_graph *g, int p, int op) {
    for (int i = p + 1; i < g->n; i++)
        if (!g->v[i].dead && is_op(g, i, op) && g->v[i].in[0] == p) return i;
    return -1;
}

/* Each fp32 operand of a bf16 product is rounded once, by an op of its own
 * that fusion puts into its producer's loop, and every product reading that
 * value reads the rounded one. Where the CPU has bf16 products that op is
 * cast_bf16 (bf16 storage, half the size: what the products take). Where
 * bf16 is emulated the products are fp32 GEMMs of rounded operands, so the
 * op is round_bf16 (the rounded values held in fp32) and the product marks
 * the operand as rounded (i5) and uses it as it is: a bf16 copy would be
 * widened again on every call. */
kiln_status kiln_pass_cast_bf16(kiln_graph *g, bool as_f32, int *inserted_out) {
    int inserted = 0;
    kiln_status st = KILN_OK;
    const bool native = !as_f32;
    const int rop = native ? KILN_OP_CAST_BF16 : KILN_OP_ROUND_BF16;
    for (int i = 0; i < g->n && !st; i++) {
        if (!is_op(g, i, KILN_OP_MATMUL) || !g->v[i].attrs.i[3]) continue;
        for (int j = 0; j < 2; j++) {
            int p = g->v[i].in[j];
            if (g->v[p].meta.dtype != KILN_F32 || (g->v[i].attrs.i[5] >> j & 1)) continue;
            int c = cast_of(g, p, rop);
            if (c < 0) {
                kiln_value cv = {.kind = KILN_V_OP, .op = rop, .n_in = 1, .in = {p}, .meta = g->v[p].meta,
                                 .requires_grad = g->v[p].requires_grad, .scope = g->v[p].scope};
                if (native) cv.meta.dtype = KILN_BF16;
                if (kiln_graph_insert(g, p + 1, cv) < 0) {
                    st = kiln_last_status(); /* the graph is whole: the casts so far are complete */
                    break;
                }
                c = p + 1;
                i++; /* the product moved one place up */
                inserted++;
            }
            g->v[i].in[j] = c;
            if (!native) g->v[i].attrs.i[5] |= 1 << j;
        }
    }
    if (inserted_out) *inserted_out = inserted;
    return st;
}

/* Sinking gradient GEMMs (graph.h). A new order of the backward values: a
 * GEMM that accumulates into a gradient is held back, with every value that
 * reads a held one (its gradient sink), until the next value that fusion
 * cannot put in an element-wise group; held values go out in their order,
 * and before any other gradient sink, so each gradient still sums its terms
 * in the same order. Their inputs are earlier values and nothing but their
 * sinks reads them, so moving them later keeps every dependency. */
kiln_status kiln_pass_sink_grad_gemms(kiln_graph *g, int *moved_out) {
    const int n = g->n, nf = g->n_forward;
    int *order = malloc(sizeof(int) * (size_t)(n + 1)), *held = malloc(sizeof(int) * (size_t)(n + 1));
    int *newid = malloc(sizeof(int) * (size_t)(n + 1));
    bool *is_held = calloc((size_t)n + 1, sizeof(bool));
    kiln_value *nv = malloc(sizeof(kiln_value) * (size_t)(n + 1));
    if (!order || !held || !newid || !is_held || !nv) {
        free(order), free(held), free(newid), free(is_held), free(nv);
        return kiln_error(KILN_ERR_OOM, "out of memory ordering gradient GEMMs");
    }
    int no = 0, nh = 0, moved = 0;
    for (int v = 0; v < nf; v++) order[no++] = v;
    for (int v = nf; v < n; v++) {
        const kiln_value *x = &g->v[v];
        bool hold = !x->dead && x->kind == KILN_V_OP && x->acc_into_grad;
        for (int j = 0; j < x->n_in && !hold && !x->dead; j++) hold = is_held[x->in[j]];
        if (hold) {
            is_held[v] = true;
            held[nh++] = v;
            continue;
        }
        const bool passes = x->dead || kiln_fusable(g, v) || (x->kind == KILN_V_AUX && !is_held[x->in[0]]);
        if (!passes && nh) { /* the run ends here: the held values first */
            for (int k = 0; k < nh; k++) order[no++] = held[k], moved += g->v[held[k]].kind == KILN_V_OP;
            nh = 0;
        }
        order[no++] = v;
    }
    for (int k = 0; k < nh; k++) order[no++] = held[k];
    for (int i = 0; i < n; i++) newid[order[i]] = i;
    for (int i = 0; i < n; i++) {
        kiln_value x = g->v[order[i]];
        for (int j = 0; j < x.n_in; j++) x.in[j] = newid[x.in[j]];
        if (x.kind == KILN_V_OP)
            for (int a = 0; a < kiln_op_get(x.op)->n_aux; a++) x.aux_of[a] = newid[x.aux_of[a]];
        nv[i] = x;
    }
    memcpy(g->v, nv, sizeof(kiln_value) * (size_t)n);
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = newid[g->outputs[i]];
    if (g->diff >= 0) g->diff = newid[g->diff];
    free(order), free(held), free(newid), free(is_held), free(nv);
    if (moved_out) *moved_out = moved;
    return KILN_OK;
}
