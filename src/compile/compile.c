/* kiln_compile: shape variants, each a traced + planned graph whose fused
 * kernels (and, in reduce-overhead mode, whole step) are source text from
 * the parameters' backend's renderer, built and loaded by its compiler
 * descriptor and run inside its exec; the interpreter when it has none or
 * none works. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/backend.h"
#include "kiln/compile.h"

#define MAX_IN 8

typedef struct {
    int n_in;
    kiln_meta in[MAX_IN];
    kiln_graph *g;
    kiln_interp *r;
    kiln_module *mod;
    bool tuned;
    char tune_path[1100]; /* max-autotune's choices, kept beside the cached module */
    int base;             /* -1: owns its code and arena; else the variant whose it runs (dynamic) */
} variant;

struct kiln_compiled {
    kiln_trace_fn fn;
    void *user;
    kiln_tensor **params;
    int n_params, n_inputs;
    kiln_compile_options o;
    variant *v;
    int n_v, cap_v, n_built; /* variants in use, slots, and those with their own code */
    int last;
    kiln_compile_stats stats;
    bool warned_fallback, warned_limit;
};

void kiln_compile_options_default(kiln_compile_options *o) {
    *o = (kiln_compile_options){.mode = KILN_COMPILE_DEFAULT, .reuse_memory = true, .rewrites = true, .backward = true,
                                .max_variants = 8, .recompute = KILN_RECOMPUTE_POINTWISE};
}

#define MODE_DEF(id, name, mode, interp, strict, help) {name, mode, interp, strict, help},
const kiln_compile_mode_def kiln_compile_modes[] = {KILN_COMPILE_MODES(MODE_DEF){NULL, KILN_COMPILE_OFF, false, false, NULL}};

void kiln_compile_mode_apply(int index, kiln_compile_options *o) {
    const kiln_compile_mode_def *d = &kiln_compile_modes[index];
    o->mode = d->mode;
    o->interpret = d->interpret;
    o->strict = d->strict;
}

kiln_status kiln_compile_mode_parse(const char *s, kiln_compile_options *o) {
    for (int i = 0; kiln_compile_modes[i].name; i++)
        if (!strcmp(s, kiln_compile_modes[i].name)) return kiln_compile_mode_apply(i, o), KILN_OK;
#define MODE_ALIAS(id, name) if (!strcmp(s, name)) return kiln_compile_mode_apply(KILN_RUN_##id, o), KILN_OK;
    KILN_COMPILE_MODE_ALIASES(MODE_ALIAS)
    return kiln_error(KILN_ERR_INVALID, "unknown compile mode '%s' (one of" KILN_COMPILE_MODE_NAMES ")", s);
}

kiln_status kiln_recompute_parse(const char *s, kiln_compile_options *o) {
#define RECOMPUTE_NAME(id, name) if (!strcmp(s, name)) return o->recompute = KILN_RECOMPUTE_##id, KILN_OK;
    KILN_RECOMPUTE_MODES(RECOMPUTE_NAME)
#define RECOMPUTE_LIST(id, name) " " name
    return kiln_error(KILN_ERR_INVALID, "unknown recompute setting '%s' (one of" KILN_RECOMPUTE_MODES(RECOMPUTE_LIST) ")", s);
}

kiln_compiled *kiln_compile(kiln_trace_fn fn, void *user, kiln_tensor **params, int n_params, int n_inputs,
                            const kiln_compile_options *o) {
    if (n_inputs > MAX_IN) {
        kiln_error(KILN_ERR_INVALID, "kiln_compile: at most %d inputs", MAX_IN);
        return NULL;
    }
    kiln_compiled *c = calloc(1, sizeof *c);
    if (!c) {
        kiln_error(KILN_ERR_OOM, "out of memory");
        return NULL;
    }
    c->fn = fn;
    c->user = user;
    c->params = params;
    c->n_params = n_params;
    c->n_inputs = n_inputs;
    if (o) c->o = *o;
    else kiln_compile_options_default(&c->o);
    if (c->o.max_variants <= 0) c->o.max_variants = 8;
    c->cap_v = c->o.max_variants + (c->o.dynamic ? 64 : 0); /* dynamic shapes are cheap instances */
    c->v = calloc((size_t)c->cap_v, sizeof *c->v);
    if (!c->v) {
        free(c);
        kiln_error(KILN_ERR_OOM, "out of memory");
        return NULL;
    }
    c->last = -1;
    return c;
}

static void variant_free(variant *v) {
    kiln_interp_free(v->r);
    if (v->base < 0) kiln_module_free(v->mod); /* an instance borrows its base's */
    kiln_graph_free(v->g);
    memset(v, 0, sizeof *v);
}

void kiln_compiled_free(kiln_compiled *c) {
    if (!c) return;
    for (int i = 0; i < c->n_v; i++) variant_free(&c->v[i]);
    free(c->v);
    free(c);
}

static int find_variant(const kiln_compiled *c, kiln_tensor *const *in) {
    for (int i = 0; i < c->n_v; i++) {
        bool same = true;
        for (int j = 0; j < c->n_inputs && same; j++) {
            kiln_meta m = kiln_meta_of(in[j]);
            same = m.ndim == c->v[i].in[j].ndim && m.dtype == c->v[i].in[j].dtype &&
                   !memcmp(m.shape, c->v[i].in[j].shape, sizeof(int64_t) * (size_t)m.ndim);
        }
        if (same) return i;
    }
    return -1;
}

/* The device the step runs on: its parameters' (the current one without
 * parameters). */
static const kiln_backend *step_backend(const kiln_compiled *c) {
    return c->n_params > 0 ? kiln_backend_of(c->params[0]) : kiln_backend_current();
}

/* Generates (be's renderer), builds and loads (be's compiler) and binds the
 * code of a planned variant. */
static kiln_status generate(kiln_compiled *c, variant *v, const kiln_backend *be) {
    const kiln_graph *g = v->g;
    const kiln_renderer *rd = be->renderer;
    enum { MAXP = 9 };
    char *parts[MAXP] = {0};
    int n_parts = 0;
    /* split the kernels over several files built in parallel */
    int kparts = g->n_groups < 4 ? 1 : 4;
    bool tune = c->o.mode == KILN_COMPILE_MAX_AUTOTUNE;
    kiln_status st = KILN_OK;
    for (int p = 0; p < kparts && !st; p++)
        if (!(parts[n_parts++] = rd->groups(g, p, kparts, tune, c->o.dynamic)))
            st = kiln_error(KILN_ERR_OOM, "out of memory generating code");
    /* the whole-step function has constant sizes: with dynamic sizes the
     * runtime loop calls the (size-generic) kernels instead */
    bool whole_step = c->o.mode == KILN_COMPILE_REDUCE_OVERHEAD && !c->o.dynamic;
    if (!st && whole_step && !(parts[n_parts++] = rd->step(g)))
        st = kiln_error(KILN_ERR_OOM, "out of memory generating code");
    kiln_build_info info = {0};
    /* the device's compiler and target go into the cache key */
    char target[256];
    snprintf(target, sizeof target, "%s/%s", be->compiler->name, be->compiler->target);
    kiln_build_options bo = c->o.build;
    bo.target = target;
    if (!st) st = be->compiler->build((const char *const *)parts, n_parts, &bo, &v->mod, &info);
    for (int i = 0; i < n_parts; i++) free(parts[i]);
    if (st) return st;
    c->stats.cc_seconds = info.seconds;
    size_t pl = strlen(info.path);
    if (!info.private_tmp && pl > 3 && !strcmp(info.path + pl - 3, ".so"))
        snprintf(v->tune_path, sizeof v->tune_path, "%.*s.tune", (int)(pl - 3), info.path);
    c->stats.from_cache = info.from_cache;
    snprintf(c->stats.source_path, sizeof c->stats.source_path, "%s", info.src_path);
    char name[64];
    for (int k = 0; k < g->n_groups; k++) {
        snprintf(name, sizeof name, "kiln_g%d", k);
        kiln_group_fn f = (kiln_group_fn)kiln_module_sym(v->mod, name);
        if (!f) return kiln_last_status();
        kiln_interp_bind_group(v->r, k, f);
    }
    kiln_interp_set_dynamic(v->r, c->o.dynamic);
    if (whole_step) {
        kiln_step_fn s = (kiln_step_fn)kiln_module_sym(v->mod, "kiln_step");
        if (!s) return kiln_last_status();
        kiln_interp_bind_step(v->r, s);
    }
    return KILN_OK;
}

/* The choices as text: "g<k> 0|1" (fused kernel serial or threaded), one
 * per line. (The GEMM implementation is kiln_gemm_f32's own choice, made by
 * measurement in every mode.) */
static void save_choices(const variant *v, const bool *threaded) {
    if (!v->tune_path[0]) return;
    kiln_strbuf b = {0};
    for (int k = 0; k < v->g->n_groups; k++) kiln_strbuf_printf(&b, "g%d %d\n", k, threaded[k]);
    if (!b.oom) kiln_write_file_atomic(v->tune_path, b.s, b.n);
    free(b.s);
    kiln_clear_error();
}

/* Applies saved choices; false (nothing applied) if the file is absent or
 * does not fit this graph exactly. */
static bool load_choices(variant *v) {
    char *text = NULL;
    size_t n = 0;
    if (!v->tune_path[0] || kiln_read_file(v->tune_path, &text, &n)) {
        kiln_clear_error();
        return false;
    }
    kiln_graph *g = v->g;
    int gsel[4096], ng = 0;
    bool ok = true;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line && ok; line = strtok_r(NULL, "\n", &save)) {
        /* "g<id> <choice>" */
        char kind = line[0];
        const char *sp = kind ? strchr(line + 1, ' ') : NULL;
        int64_t id = -1, choice = -1;
        if (!sp || kiln_parse_leading_i64(line + 1, 0, INT32_MAX, &id) || (size_t)(sp - line - 1) != strspn(line + 1, "0123456789") ||
            kiln_parse_i64(sp + 1, 0, 1, &choice))
            ok = false;
        else if (kind == 'g' && id == ng && ng < 4096) gsel[ng++] = choice;
        else ok = false;
    }
    free(text);
    if (!ok || ng != g->n_groups) return false;
    char name[64];
    for (int k = 0; k < ng; k++) {
        snprintf(name, sizeof name, gsel[k] ? "kiln_g%d_parallel" : "kiln_g%d_serial", k);
        kiln_group_fn f = (kiln_group_fn)kiln_module_sym(v->mod, name);
        if (!f) {
            kiln_clear_error();
            return false;
        }
        kiln_interp_bind_group(v->r, k, f);
    }
    return true;
}

/* max-autotune: after a first run bound every pointer, time each fused
 * kernel serial and threaded, keep the faster, and save the choices with
 * the module (a file from before, with "m" lines, does not fit: retuned). */
static void autotune(variant *v) {
    const kiln_graph *g = v->g;
    if (load_choices(v)) return;
    kiln_interp_zero_arena(v->r);
    bool *threaded = calloc((size_t)g->n_groups + 1, sizeof *threaded);
    char name[64];
    for (int k = 0; k < g->n_groups; k++) {
        void *args[512];
        kiln_interp_group_args(v->r, k, args, 512);
        kiln_group_fn cand[2];
        snprintf(name, sizeof name, "kiln_g%d_serial", k);
        cand[0] = (kiln_group_fn)kiln_module_sym(v->mod, name);
        snprintf(name, sizeof name, "kiln_g%d_parallel", k);
        cand[1] = (kiln_group_fn)kiln_module_sym(v->mod, name);
        if (!cand[0] || !cand[1]) continue;
        double best[2];
        for (int q = 0; q < 2; q++) {
            cand[q](args); /* warm */
            best[q] = 1e30;
            for (int rep = 0; rep < 5; rep++) {
                double t0 = kiln_time_now();
                cand[q](args);
                double dt = kiln_time_now() - t0;
                if (dt < best[q]) best[q] = dt;
            }
        }
        kiln_interp_bind_group(v->r, k, best[0] <= best[1] ? cand[0] : cand[1]);
        if (threaded) threaded[k] = best[1] < best[0];
    }
    if (threaded) save_choices(v, threaded);
    free(threaded);
    kiln_clear_error();
}

/* autotune and a run of generated code, inside the device's exec: the
 * module's kernels touch its memory at the device addresses the
 * interpreter binds (kiln_tensor_ptr). */
static kiln_status autotune_on_device(void *p) {
    autotune(p);
    return KILN_OK;
}

typedef struct {
    kiln_interp *r;
    kiln_tensor *const *in;
    float *report;
} run_args;

static kiln_status run_on_device(void *p) {
    run_args *a = p;
    return kiln_interp_run(a->r, a->in, a->report);
}

static kiln_status build_variant(kiln_compiled *c, kiln_tensor *const *in, int *out) {
    double t0 = kiln_time_now();
    variant *v = &c->v[c->n_v];
    v->base = -1;
    v->n_in = c->n_inputs;
    for (int j = 0; j < c->n_inputs; j++) v->in[j] = kiln_meta_of(in[j]);
    kiln_graph_options go;
    kiln_graph_options_default(&go);
    go.backward = c->o.backward;
    go.rewrite_attention = go.rewrite_linear_ce = c->o.rewrites;
    go.reuse_memory = c->o.reuse_memory;
    go.recompute = c->o.recompute;
    go.verify |= c->o.verify_graph;
    go.bf16_as_f32 = kiln_backend_bf16_emulated(step_backend(c));
    kiln_status st = kiln_graph_build(c->fn, c->user, c->params, c->n_params, in, c->n_inputs, &go, &v->g);
    if (!st) st = kiln_interp_new(v->g, &v->r);
    if (st) {
        variant_free(v);
        return kiln_error_context(st, "compiling");
    }
    c->stats.cc_seconds = 0;
    c->stats.source_path[0] = 0;
    c->stats.interpreted = true;
    if (!c->o.interpret) {
        const kiln_backend *be = step_backend(c);
        const char *ver = NULL;
        if (!be->renderer || !be->compiler) {
            st = kiln_error(KILN_ERR_UNSUPPORTED, "device %s has no renderer and compiler for generated code", be->name);
        } else if (!kiln_compiler_available(&c->o.build, &ver)) {
            st = kiln_error(KILN_ERR_UNSUPPORTED, "no working C compiler (set KILN_CC)");
        } else {
            st = generate(c, v, be);
        }
        if (st) {
            if (c->o.strict) {
                variant_free(v);
                return kiln_error_context(st, "--compile=strict");
            }
            if (!c->warned_fallback)
                kiln_log(KILN_LOG_WARN, "compiled code unavailable (%s): running the planned graph in the interpreter",
                         kiln_last_error());
            c->warned_fallback = true;
            kiln_module_free(v->mod);
            v->mod = NULL;
            kiln_interp_bind_step(v->r, NULL);
            for (int k = 0; k < v->g->n_groups; k++) kiln_interp_bind_group(v->r, k, NULL);
            kiln_clear_error();
        } else {
            c->stats.interpreted = false;
        }
    }
    *out = c->n_v++;
    c->n_built++;
    const kiln_graph *g = v->g;
    c->stats.variants = c->n_v;
    c->stats.build_seconds = kiln_time_now() - t0;
    c->stats.arena_bytes = g->arena_bytes;
    c->stats.unplanned_bytes = g->unplanned_bytes;
    c->stats.nodes = kiln_graph_live_nodes(g);
    c->stats.fused_groups = 0;
    c->stats.fused_ops = 0;
    for (int k = 0; k < g->n_groups; k++) {
        int n = g->group_start[k + 1] - g->group_start[k];
        if (n > 1) c->stats.fused_groups++, c->stats.fused_ops += n;
    }
    c->stats.flops = kiln_graph_flops(g);
    return KILN_OK;
}

/* Same nodes, inputs, fusion and plan decisions, and no buffer larger:
 * b can run a's code in a's arena at a's offsets. */
static bool same_structure(const kiln_graph *a, const kiln_graph *b) {
    if (a->n != b->n || a->n_groups != b->n_groups || a->n_outputs != b->n_outputs) return false;
    for (int i = 0; i < a->n; i++) {
        const kiln_value *x = &a->v[i], *y = &b->v[i];
        if (x->dead != y->dead || x->kind != y->kind || x->op != y->op || x->n_in != y->n_in || x->group != y->group ||
            x->internal != y->internal || x->acc_into_grad != y->acc_into_grad || x->index != y->index ||
            memcmp(x->in, y->in, sizeof(int) * (size_t)x->n_in) || x->meta.dtype != y->meta.dtype ||
            kiln_meta_numel(&y->meta) > kiln_meta_numel(&x->meta))
            return false;
    }
    return true;
}

/* --compile-dynamic: trace the new shape (milliseconds), and if its graph is
 * the same as a built variant's with no larger buffer, run that variant's
 * size-generic code in its arena with this shape's sizes. */
static int dynamic_instance(kiln_compiled *c, kiln_tensor *const *in) {
    if (!c->o.dynamic || c->n_v >= c->cap_v) return -1;
    kiln_graph_options go;
    kiln_graph_options_default(&go);
    go.backward = c->o.backward;
    go.rewrite_attention = go.rewrite_linear_ce = c->o.rewrites;
    go.reuse_memory = c->o.reuse_memory;
    go.recompute = c->o.recompute;
    go.verify |= c->o.verify_graph;
    go.bf16_as_f32 = kiln_backend_bf16_emulated(step_backend(c));
    kiln_graph *g = NULL;
    if (kiln_graph_build(c->fn, c->user, c->params, c->n_params, in, c->n_inputs, &go, &g)) {
        kiln_clear_error();
        return -1;
    }
    for (int b = 0; b < c->n_v; b++) {
        variant *base = &c->v[b];
        if (base->base >= 0 || !base->mod || !same_structure(base->g, g)) continue;
        for (int i = 0; i < g->n; i++) g->v[i].offset = base->g->v[i].offset;
        g->arena_bytes = base->g->arena_bytes;
        variant *v = &c->v[c->n_v];
        memset(v, 0, sizeof *v);
        v->base = b;
        v->g = g;
        v->mod = base->mod;
        v->n_in = c->n_inputs;
        for (int j = 0; j < c->n_inputs; j++) v->in[j] = kiln_meta_of(in[j]);
        if (kiln_interp_new_shared(g, base->r, &v->r)) break;
        kiln_interp_set_dynamic(v->r, true);
        char name[64];
        for (int k = 0; k < g->n_groups; k++) {
            snprintf(name, sizeof name, "kiln_g%d", k);
            kiln_interp_bind_group(v->r, k, (kiln_group_fn)kiln_module_sym(v->mod, name));
        }
        c->stats.variants = c->n_v + 1;
        return c->n_v++;
    }
    kiln_graph_free(g);
    kiln_clear_error();
    return -1;
}

kiln_status kiln_compiled_run(kiln_compiled *c, kiln_tensor *const *in, float *report) {
    int i = find_variant(c, in);
    if (i < 0) i = dynamic_instance(c, in);
    if (i < 0) {
        if (c->n_built >= c->o.max_variants || c->n_v >= c->cap_v) {
            if (!c->warned_limit)
                kiln_log(KILN_LOG_WARN, "compiled step: %d shape variants built (the limit); new shapes run eager",
                         c->o.max_variants);
            c->warned_limit = true;
            return kiln_error(KILN_ERR_LIMIT, "compiled step: variant limit (%d) reached", c->o.max_variants);
        }
        kiln_status st = build_variant(c, in, &i);
        if (st) return st;
    }
    c->last = i;
    variant *v = &c->v[i];
    /* generated code runs inside the device's exec; the interpreter alone
     * reaches the device through the backend itself */
    const kiln_backend *be = step_backend(c);
    run_args ra = {v->r, in, report};
    kiln_status st = v->mod ? kiln_backend_exec(be, run_on_device, &ra) : kiln_interp_run(v->r, in, report);
    if (!st && c->o.mode == KILN_COMPILE_MAX_AUTOTUNE && v->mod && !v->tuned) {
        v->tuned = true;
        kiln_backend_exec(be, autotune_on_device, v);
    }
    return st;
}

kiln_compile_stats kiln_compiled_stats(const kiln_compiled *c) { return c->stats; }
const kiln_graph *kiln_compiled_graph(const kiln_compiled *c) { return c->last >= 0 ? c->v[c->last].g : NULL; }
int kiln_compiled_n_inputs(const kiln_compiled *c) { return c->n_inputs; }
