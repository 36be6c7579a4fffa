/* kiln graph: the IR of the compiler. Tracing runs unchanged model code with
 * a dispatcher that records one node per op call; autograd on the graph
 * reuses every op's backward rule (the same rules eager runs); passes rewrite
 * (attention -> flash attention, linear + cross-entropy -> fused chunked
 * kernel), eliminate dead and duplicate nodes, fuse element-wise chains, and
 * plan memory (a schedule, lifetimes, offsets in one arena, in-place reuse).
 * A graph interpreter runs a planned graph with the registry's kernels.
 *
 * Values are numbered in a valid execution order: a node's inputs always
 * have smaller ids. Parameters and their gradient buffers are the model's
 * own tensors, bound at run time, so weights loaded after compiling are
 * used and gradients land in param->grad.
 *
 * Ownership: kiln_graph_* constructors return graphs freed with
 * kiln_graph_free. Errors: kiln_status + kiln_last_error().
 */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_V_INPUT,    /* bound per call (ids, targets, masks, runtime scalars) */
    KILN_V_PARAM,    /* a model parameter, read in place */
    KILN_V_OP,       /* computed by `op` */
    KILN_V_AUX,      /* extra output `aux` of the multi-output op at in[0] */
    KILN_V_GRAD_ACC, /* sink: param `index`'s .grad += in[0] (times the scalar in[1] if n_in is 2) */
} kiln_value_kind;

#define KILN_GROUP_NONE (-1)

/* values a traced function may return (a loss and an objective's metrics) */
#define KILN_GRAPH_MAX_OUTPUTS 12

typedef struct {
    kiln_value_kind kind;
    int op;                     /* KILN_V_OP */
    int n_in;
    int in[KILN_OP_MAX_IN];
    int aux;                    /* KILN_V_AUX: which extra output */
    int aux_of[KILN_OP_MAX_AUX];  /* OP with extra outputs: their value ids */
    int index;                  /* INPUT: input slot; PARAM / GRAD_ACC: parameter */
    kiln_attrs attrs;
    kiln_meta meta;
    bool requires_grad;         /* depends on a trainable parameter */
    bool dead;                  /* removed by a pass */
    /* memory plan */
    int n_uses;
    int last_use;               /* schedule position of the last reader */
    int64_t offset;             /* arena offset in bytes, -1 = not in the arena */
    int alias;                  /* value whose buffer this one shares (views, in place), or -1 */
    int group;                  /* fused group id, or KILN_GROUP_NONE */
    bool acc_into_grad;         /* GEMM writes straight into the grad buffer (beta = 1) */
    bool internal;              /* fused: only read inside its group, lives in registers */
    int scope;                  /* kiln_op_set_scope() label when traced (model block) */
    bool recomputed;            /* a copy made by the recompute pass */
} kiln_value;

#define KILN_GRAPH_MAX_MISSES 16
typedef struct kiln_graph {
    int n, cap;
    kiln_value *v;
    int n_inputs, n_params;
    kiln_tensor **params;       /* borrowed: the model's parameters */
    int n_outputs;
    int outputs[KILN_GRAPH_MAX_OUTPUTS]; /* values returned to the caller */
    int diff;                   /* the value differentiated, or -1 */
    int n_forward;              /* values [0, n_forward) are the forward pass */
    int64_t arena_bytes;        /* after planning */
    int64_t unplanned_bytes;    /* sum of all buffers without reuse */
    int n_groups;               /* fused element-wise groups */
    int *group_start;           /* group k's members: group_members[group_start[k] .. group_start[k+1]) */
    int *group_members;         /*   in value order; the group runs at its last member */
    /* What the rewrites looked at and left: one line per subgraph shaped
     * like attention (a softmax) or like the head + cross-entropy that
     * stayed unfused, and why (kiln compile --explain, a warning in kiln
     * train). malloc'd, freed with the graph. */
    int n_misses;
    char *misses[KILN_GRAPH_MAX_MISSES];
} kiln_graph;

/* The function a graph is traced from: computes outputs from inputs with
 * ops. out_report receives values to return (e.g. the loss sum), out_diff
 * the scalar to differentiate (NULL: forward only). */
typedef kiln_status (*kiln_trace_fn)(void *user, kiln_tensor *const *inputs, kiln_tensor **out_report, int *n_report,
                                     kiln_tensor **out_diff);

/* Activation recomputation: which activations backward recomputes instead
 * of keeping them from forward: none; a block's (attention, layer), from
 * the block's input; or (pointwise, the compiler's default) the element-wise
 * values whose inputs are kept anyway, from those inputs. */
/* The recompute settings, each spelled once: X(IDENT, "name"); the enum,
 * the run setting's choices and kiln_recompute_parse come from this list. */
#define KILN_RECOMPUTE_MODES(X) X(NONE, "none") X(ATTENTION, "attention") X(LAYER, "layer") X(POINTWISE, "pointwise")
#define KILN_RECOMPUTE_ENUM_(id, name) KILN_RECOMPUTE_##id,
enum { KILN_RECOMPUTE_MODES(KILN_RECOMPUTE_ENUM_) KILN_RECOMPUTE_N };

typedef struct {
    bool backward;        /* build the joint forward+backward graph */
    bool rewrite_attention;
    bool rewrite_linear_ce;
    bool reuse_memory;    /* false: every buffer its own (to check the plan) */
    bool fuse;            /* group element-wise chains into single loops */
    int recompute;        /* KILN_RECOMPUTE_*: activations recomputed in backward */
    bool bf16_as_f32;     /* bf16 products take operands rounded to bf16 held in fp32 (round_bf16)
                             instead of bf16 ones (cast_bf16): the device emulates them (default:
                             the current device's bf16_emulated) */
    bool verify;          /* kiln_graph_verify after tracing and every pass (default:
                             on in builds with -DKILN_GRAPH_VERIFY, the sanitizer build) */
} kiln_graph_options;
void kiln_graph_options_default(kiln_graph_options *o);

/* Traces fn on inputs shaped like `example` (their data is never read),
 * then (options) differentiates, rewrites, cleans up and plans. */
kiln_status kiln_graph_build(kiln_trace_fn fn, void *user, kiln_tensor **params, int n_params,
                             kiln_tensor *const *example, int n_inputs, const kiln_graph_options *o, kiln_graph **out);
void kiln_graph_free(kiln_graph *g);

/* Passes (each small and separately callable; build runs them in order,
 * src/graph/pipeline.c). Each returns a status (an allocation failure is an
 * error, never a silently partial pass) and, through the optional count,
 * what it did. */
kiln_status kiln_pass_rewrite_attention(kiln_graph *g, int *rewrites);
kiln_status kiln_pass_rewrite_linear_ce(kiln_graph *g, int *rewrites);
/* After autograd: a bf16 linear_cross_entropy gets the loss's incoming
 * gradient as its seed (rounding after scaling, as eager bf16). */
kiln_status kiln_pass_seed_linear_ce(kiln_graph *g, int *seeded);
kiln_status kiln_pass_dce(kiln_graph *g, int *removed);
kiln_status kiln_pass_cse(kiln_graph *g, int *merged);
kiln_status kiln_pass_acc_into_grad(kiln_graph *g, int *gemms); /* GEMMs that accumulate in place */
/* bf16 products: each fp32 operand is cast to bf16 once, right after its
 * producer (shared by every product that reads it, forward and backward),
 * so fusion folds the cast into the producer's loop and backward keeps the
 * half-size copy. With as_f32 (a device that emulates bf16 products) the
 * op is round_bf16 instead, and the product marks the operand as rounded. */
kiln_status kiln_pass_cast_bf16(kiln_graph *g, bool as_f32, int *casts);
/* In backward, a GEMM that adds into a gradient (and its sink) moves past
 * the run of element-wise values after it, so that fusion can join the run
 * to the group before the GEMM (the MLP's recomputed silu(gate) · up with
 * the gradients of gate and up: one loop over gate and up instead of two). */
kiln_status kiln_pass_sink_grad_gemms(kiln_graph *g, int *moved);
kiln_status kiln_pass_fuse(kiln_graph *g, int *groups); /* groups of 2+ ops */
/* Rematerialisation: forward values of the chosen blocks (or the pointwise
 * ones) that backward reads are recomputed just before their first backward
 * use. */
kiln_status kiln_pass_recompute(kiln_graph *g, int mode, int *copies);
/* Schedule position of value v: a fused member runs with its group's last. */
int kiln_graph_exec_pos(const kiln_graph *g, int v);
kiln_status kiln_pass_plan(kiln_graph *g, bool reuse);

/* Checks the IR's invariants: every input an earlier, live value; each op's
 * arity and its shape and dtype against its definition's shape rule; extra
 * outputs linked both ways with the op's shapes; parameters, inputs and
 * gradient sinks against their tensors; results live; fused groups
 * consistent (members live ops listed once, in order; internal values read
 * only inside their group and never results). KILN_ERR_INVALID naming the
 * value and the broken rule. kiln_graph_build runs it after every pass when
 * options.verify is set (the tests, and by default the sanitizer build). */
kiln_status kiln_graph_verify(const kiln_graph *g);

/* Group k's kernel arguments, in the order generated code reads them: its
 * external inputs (first use order), then its members that reach memory.
 * Returns the count (at most cap). */
int kiln_graph_group_args(const kiln_graph *g, int k, int *ids, int cap);

/* Runs a planned graph: inputs bound by slot, outputs copied to `report`
 * (one float per output value, which must hold one element). */
typedef struct kiln_interp kiln_interp;
kiln_status kiln_interp_new(const kiln_graph *g, kiln_interp **out);
void kiln_interp_free(kiln_interp *r);
kiln_status kiln_interp_run(kiln_interp *r, kiln_tensor *const *inputs, float *report);
/* Generated code for fused group k: called with the data pointers of
 * kiln_graph_group_args(), replacing the chunk-wise interpreter loop. */
typedef void (*kiln_group_fn)(void *const *args);
void kiln_interp_bind_group(kiln_interp *r, int k, kiln_group_fn fn);
/* A whole generated step: calls back `run_value` for every position that is
 * not generated code; ptrs[v] is the data pointer of value v, kept current. */
typedef void (*kiln_step_fn)(void *const *ptrs, int (*run_value)(void *r, int v), void *r);
void kiln_interp_bind_step(kiln_interp *r, kiln_step_fn fn);
/* Runtime sizes: generated group kernels get their element count as an
 * extra argument after the pointers (code built with dynamic sizes). */
void kiln_interp_set_dynamic(kiln_interp *r, bool on);
/* An interpreter for g running in `owner`'s arena (g planned with owner's
 * offsets, every buffer no larger): shapes that share one plan and code. */
kiln_status kiln_interp_new_shared(const kiln_graph *g, kiln_interp *owner, kiln_interp **out);
/* For autotuning after a run: group k's current argument pointers (returns
 * their count), and zeroing the arena so timings see no stale NaNs. */
int kiln_interp_group_args(const kiln_interp *r, int k, void **args, int cap);
/* Value v's header (its data is valid after a run). */
const kiln_tensor *kiln_interp_tensor(const kiln_interp *r, int v);
void kiln_interp_zero_arena(kiln_interp *r);

/* Time per schedule position of every interpreter run while set (kiln
 * bench --profile; process-wide, NULL stops): library ops by op, fused
 * groups together and each by id, gradient accumulation apart. In a
 * whole-step module (reduce-overhead) only the positions it calls back for
 * are timed: its own generated code is the step's remainder. */
enum { KILN_PROFILE_GROUPS = 1024, KILN_PROFILE_POSITIONS = 16384 };
typedef struct {
    double op_seconds[KILN_OP_COUNT];
    uint64_t op_calls[KILN_OP_COUNT];
    double group_seconds, acc_seconds;
    uint64_t group_calls, acc_calls;
    /* each fused group by id (ids from KILN_PROFILE_GROUPS on: in the sums above only) */
    double each_group_seconds[KILN_PROFILE_GROUPS];
    uint64_t each_group_calls[KILN_PROFILE_GROUPS];
    /* each library op by schedule position (positions from
     * KILN_PROFILE_POSITIONS on: in op_seconds only) */
    double each_pos_seconds[KILN_PROFILE_POSITIONS];
    uint64_t each_pos_calls[KILN_PROFILE_POSITIONS];
} kiln_graph_profile;
void kiln_graph_profile_set(kiln_graph_profile *p);

/* Human-readable dump (for --explain). */
void kiln_graph_print(const kiln_graph *g, void (*line)(const char *text, void *user), void *user);
/* Totals over live nodes. */
double kiln_graph_flops(const kiln_graph *g);
int kiln_graph_live_nodes(const kiln_graph *g);

#ifdef __cplusplus
}
#endif
#endif
