/* kiln compile: turns a traced step into something fast to call.
 *
 * kiln_compile() wraps a trace function (see kiln/graph.h); the first call
 * with a given set of input shapes traces it, builds the joint graph, runs
 * the passes and the memory plan, generates C for the fused element-wise
 * groups and the step, builds it with the system compiler (cached on disk)
 * and loads it. Later calls with the same shapes reuse that variant; a new
 * shape builds another, up to max_variants, after which kiln_compiled_run
 * answers KILN_ERR_LIMIT and the caller runs eager (warned once).
 * Without a working compiler the planned graph runs in the interpreter, with
 * one warning (strict makes it an error).
 *
 * Compiled steps read and write the model's own parameter and gradient
 * buffers, so loading weights after compiling is safe and saving saves the
 * same tensors.
 */
#ifndef KILN_COMPILE_H
#define KILN_COMPILE_H

#include "kiln/build.h"
#include "kiln/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_COMPILE_OFF = 0,
    KILN_COMPILE_DEFAULT,         /* one call per fused kernel from a small runtime loop */
    KILN_COMPILE_REDUCE_OVERHEAD, /* the whole step as one generated function */
    KILN_COMPILE_MAX_AUTOTUNE,    /* time candidate variants of each kernel at build time */
} kiln_compile_mode;

typedef struct {
    kiln_compile_mode mode;
    bool strict;        /* no compiler or a failed build is an error, not a fallback */
    bool dynamic;       /* sizes are runtime values: a smaller shape with the same graph
                           runs the built code and plan instead of building a variant */
    bool interpret;     /* skip code generation: run the planned graph in the interpreter */
    bool reuse_memory;  /* the memory plan's buffer reuse (off: to check the plan) */
    bool rewrites;      /* attention and linear + cross-entropy rewrites */
    bool backward;      /* joint forward + backward graph */
    int max_variants;   /* shape variants before falling back to eager (default 8) */
    int recompute;      /* KILN_RECOMPUTE_* (kiln/graph.h; default _POINTWISE) */
    bool verify_graph;  /* kiln_graph_verify after every pass (tests; always in the sanitizer build) */
    kiln_build_options build;
} kiln_compile_options;

/* The compile modes a user names (--compile, --mode, --modes), each spelled
 * once: X(IDENT, "name", mode, interpret, strict, "what it does"). The run
 * settings' enum (KILN_RUN_<IDENT>, kiln/train.h), their choices, the
 * parser below and the help texts are made from this list; a new mode is a
 * line here. The first line is "off"; older spellings are aliases. */
#define KILN_COMPILE_MODES(X)                                                                              \
    X(EAGER, "off", KILN_COMPILE_OFF, false, false, "eager: no compiler")                                   \
    X(COMPILE_DEFAULT, "default", KILN_COMPILE_DEFAULT, false, false, "generated kernels, a runtime loop")   \
    X(REDUCE_OVERHEAD, "reduce-overhead", KILN_COMPILE_REDUCE_OVERHEAD, false, false, "the whole step generated") \
    X(MAX_AUTOTUNE, "max-autotune", KILN_COMPILE_MAX_AUTOTUNE, false, false, "variants timed at build")       \
    X(INTERPRET, "interpret", KILN_COMPILE_DEFAULT, true, false, "the planned graph in the interpreter")     \
    X(STRICT, "strict", KILN_COMPILE_DEFAULT, false, true, "default; a failed build is an error")
#define KILN_COMPILE_MODE_ALIASES(X) X(EAGER, "none") X(EAGER, "eager")
/* " off default reduce-overhead ..." as one string literal, for help texts */
#define KILN_COMPILE_MODE_NAME_(id, name, ...) " " name
#define KILN_COMPILE_MODE_NAMES KILN_COMPILE_MODES(KILN_COMPILE_MODE_NAME_)

/* A run's compile setting: the index of its line (KILN_RUN_EAGER = 0 ...). */
#define KILN_RUN_ENUM_(id, ...) KILN_RUN_##id,
typedef enum { KILN_COMPILE_MODES(KILN_RUN_ENUM_) KILN_RUN_N_MODES } kiln_run_compile;

typedef struct {
    const char *name;
    kiln_compile_mode mode;
    bool interpret, strict;
    const char *help;
} kiln_compile_mode_def;
/* KILN_COMPILE_MODES in order (index = KILN_RUN_<IDENT>), ended by a NULL name. */
extern const kiln_compile_mode_def kiln_compile_modes[];

void kiln_compile_options_default(kiln_compile_options *o);
/* Sets o->mode, o->interpret and o->strict from a mode of
 * KILN_COMPILE_MODES (index) . */
void kiln_compile_mode_apply(int index, kiln_compile_options *o);
/* Parses a name of KILN_COMPILE_MODES or an alias into the options. */
kiln_status kiln_compile_mode_parse(const char *s, kiln_compile_options *o);
/* "none", "attention" or "layer" into o->recompute. */
kiln_status kiln_recompute_parse(const char *s, kiln_compile_options *o);

typedef struct kiln_compiled kiln_compiled;
kiln_compiled *kiln_compile(kiln_trace_fn fn, void *user, kiln_tensor **params, int n_params, int n_inputs,
                            const kiln_compile_options *o);
void kiln_compiled_free(kiln_compiled *c);
/* Runs the variant for these input shapes (building it first if new).
 * report receives the traced function's reported scalars. */
kiln_status kiln_compiled_run(kiln_compiled *c, kiln_tensor *const *inputs, float *report);

typedef struct {
    int variants;
    bool interpreted;        /* running in the graph interpreter */
    double build_seconds;    /* last variant: trace + passes + code generation + cc */
    double cc_seconds;       /* of which the C compiler */
    bool from_cache;
    int64_t arena_bytes, unplanned_bytes;
    int nodes, fused_groups, fused_ops;
    double flops;            /* per call, from the op registry */
    char source_path[1024];  /* generated C of the last variant ("" if none) */
} kiln_compile_stats;
kiln_compile_stats kiln_compiled_stats(const kiln_compiled *c);
/* The last variant's graph (for --explain); NULL before the first run. */
const kiln_graph *kiln_compiled_graph(const kiln_compiled *c);
/* The number of inputs kiln_compiled_run reads (as given to kiln_compile). */
int kiln_compiled_n_inputs(const kiln_compiled *c);

#ifdef __cplusplus
}
#endif
#endif
