/* kiln ops: the op registry and the op API the model is written against.
 *
 * Every op is one registry entry (kiln_op_def), device-neutral: its name,
 * shape rule, backward rule written with ops (so eager autograd and the
 * graph compiler share one source of truth), FLOP counts and the C
 * expression or row epilogue fusion uses. Its kernels belong to the
 * backends (include/kiln/backend.h: each backend's table, by op id; the
 * CPU's in src/backend/cpu/).
 *
 * Calling an op (kiln_linear, kiln_add, ...) checks shapes, then hands the
 * call to the current thread's dispatcher: none installed runs the kernel
 * at once without recording anything; the eager layer installs one that
 * also records the autograd tape; a tracer can record graph nodes instead.
 *
 * Ownership: every op returns a new reference (release it). Inputs are
 * borrowed. Errors: an op returns NULL and sets kiln_last_error() naming the
 * op and the shapes. Any NULL input makes an op return NULL without touching
 * the error, so a chain of ops can be checked once at its end.
 */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_OP_MAX_IN 8
#define KILN_OP_MAX_AUX 2 /* extra outputs of a multi-output op */

/* The op list, once: X(ID, sym) for every op, in id order. It generates the
 * enum (KILN_OP_<ID>), the declarations of the registry entries
 * (kiln_opdef_<sym>, defined in src/ops/) and the registry itself. A new op
 * is one line here, its kiln_op_def and its kernels (one per backend);
 * tests/test_ops_grad.c then demands a finite-difference check of it or a
 * stated exemption, and tests/test_backend_ops.c a run on every backend. */
#define KILN_OP_LIST(X)                                                                              \
    X(EMBEDDING, embedding)             /* (W[V,C], ids[...] i32) -> [..., C] */                     \
    X(EMBEDDING_BWD, embedding_bwd)     /* (g[...,C], ids[...]) i0=V -> [V, C] */                    \
    X(MATMUL, matmul)                   /* see kiln_matmul modes; f0 = beta, kernels only; i3 bf16    \
                                           product; i5 bit j: operand j is already rounded to bf16   \
                                           and held as f32 (round_bf16: used as it is) */            \
    X(ADD, add)                         /* (a, b broadcast to a) -> a's shape */                     \
    X(MUL, mul)                         /* (a, b) same shape */                                      \
    X(SCALE, scale)                     /* (x) f0=c -> c*x */                                        \
    X(SCALE_BY, scale_by)               /* (x, s[1]) -> s*x, s a runtime scalar */                   \
    X(SILU, silu)                                                                                    \
    X(SILU_BWD, silu_bwd)               /* (x, g) */                                                 \
    X(TANH, tanh)                                                                                    \
    X(TANH_BWD, tanh_bwd)               /* (x, g) -> g (1 - tanh^2 x) */                             \
    X(GELU_TANH, gelu_tanh)             /* GELU, tanh approximation (gelu_pytorch_tanh) */           \
    X(GELU_TANH_BWD, gelu_tanh_bwd)     /* (x, g) */                                                 \
    X(RMSNORM, rmsnorm)                 /* (x[...,C], w[C]) f0=eps */                                \
    X(RMSNORM_BWD_X, rmsnorm_bwd_x)     /* (x, w, g) f0=eps */                                       \
    X(RMSNORM_BWD_W, rmsnorm_bwd_w)     /* (x, w, g) f0=eps -> [C] */                                \
    X(ROPE, rope)                       /* (x[B,T,H,D] [, pos[B,T] i32]) f0=theta i0=pos0             */ \
                                        /* i1=inverse | 2 (pos given), scaling: i2=type f1=factor   */ \
                                        /* i3=orig_max i4,i5=low,high (f64 bits)                    */ \
    X(REPEAT_KV, repeat_kv)             /* (x[B,Hkv,T,D]) i0=n_rep -> [B,Hkv*n_rep,T,D] */           \
    X(REPEAT_KV_BWD, repeat_kv_bwd)     /* (g[B,H,T,D]) i0=n_rep -> [B,H/n_rep,T,D] */               \
    X(TRANSPOSE12, transpose12)         /* [A,B,C,D] -> [A,C,B,D] */                                 \
    X(RESHAPE, reshape)                 /* view; i0=ndim, i1..i4 = shape */                          \
    X(ATTN_MASK, attn_mask)             /* (pad_mask[B,T] [, seg[B,T]] i32) i0=q_len i1=seg given    \
                                           i2=sliding window (0 none) -> [B,1,Tq,Tk] additive */     \
    X(SOFTMAX, softmax)                 /* last dim */                                               \
    X(SOFTMAX_BWD, softmax_bwd)         /* (y, g) */                                                 \
    X(CROSS_ENTROPY, cross_entropy)     /* (logits[...,V], targets[...] i32) i0=ignore -> [1] sum */ \
    X(CROSS_ENTROPY_BWD, cross_entropy_bwd) /* (logits, targets, g[1]) i0=ignore */                  \
    X(SUM, sum)                         /* -> [1] */                                                 \
    X(MEAN, mean)                       /* -> [1] */                                                 \
    X(EXPAND, expand)                   /* (g[1]) i0=ndim, i1..i4=shape -> filled */                 \
    X(SUM_TO, sum_to)                   /* (g) i0=ndim, i1..i4=shape: sum over broadcast dims */     \
    X(FILL, fill)                       /* () i0=ndim, i1..i4=shape, f0=value (seeds backward) */    \
    /* fused ops the compiler rewrites to (eager runs the model's decomposition) */                  \
    X(FLASH_ATTN, flash_attn)           /* (q[B,H,T,D], k,v[B,Hkv,Tk,D], pad[B,Tk] [, seg[B,Tk]])    \
                                           f0=scale i0=seg given i1=window -> out; aux lse[B,H,T] */ \
    X(FLASH_ATTN_BWD, flash_attn_bwd)   /* (q,k,v,pad,out,lse,dout [, seg]) -> dq; aux dk, dv */     \
    X(LINEAR_CE, linear_ce)             /* (h[...,C], W[V,C], targets[...] [, seed[1]]) i0=ignore     \
                                           i1=need_dh i2=need_dW i3=bf16 products i4=seed given      \
                                           f0=soft-cap of the logits (0 none)                        \
                                           -> loss sum [1]; aux dh, dW (of seed·loss; seed 1) */     \
    X(CAST_BF16, cast_bf16)             /* (x f32) -> bf16, round to nearest even; gradient passes */ \
    X(ROUND_BF16, round_bf16)           /* (x f32) -> f32 holding x rounded to bf16 (the emulated     \
                                           products' operand form); gradient passes */               \
    X(DROPOUT, dropout)                 /* (x, key[1]) f0=p i0=instance i5=index offset -> masked  */ \
    /* what preference objectives are built of (objective.c) */                                    \
    X(ROW_NLL, row_nll)                 /* (logits[R,T,V], targets[R,T] i32) i0=ignore -> [R] sums */ \
    X(ROW_NLL_BWD, row_nll_bwd)         /* (logits, targets, g[R]) i0=ignore -> dlogits */           \
    X(ROW_INV_COUNT, row_inv_count)     /* (targets[R,T] i32) i0=ignore -> [R] 1/targets (0: none) */ \
    X(PAIR_DIFF, pair_diff)             /* (x[2P]) -> [P]: x[2i] - x[2i+1] (i0=1: + x[2i+1]) */      \
    X(PAIR_DIFF_BWD, pair_diff_bwd)     /* (g[P]) -> [2P]: g[i], -g[i] (i0=1: g[i]) */               \
    X(LOGSIGMOID, logsigmoid)           /* log(1 / (1 + e^-x)) */                                    \
    X(LOGSIGMOID_BWD, logsigmoid_bwd)   /* (x, g) -> g / (1 + e^x) */                                \
    X(RELU, relu)                                                                                    \
    X(RELU_BWD, relu_bwd)               /* (x, g) -> g where x > 0 */                                \
    X(GT0, gt0)                         /* x > 0 ? 1 : 0, no gradient */                             \
    X(LOG1MEXP, log1mexp)               /* log(1 - e^x), x < 0 (ORPO's odds) */                      \
    X(LOG1MEXP_BWD, log1mexp_bwd)       /* (x, g) -> -g / (e^-x - 1) */

typedef enum {
#define KILN_OP_ENUM_(id, sym) KILN_OP_##id,
    KILN_OP_LIST(KILN_OP_ENUM_)
#undef KILN_OP_ENUM_
    KILN_OP_COUNT
} kiln_op_id;

typedef struct {
    int64_t i[6];
    double f[2];
} kiln_attrs;

/* Shape and dtype of a tensor without its data. */
typedef struct {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    kiln_dtype dtype;
} kiln_meta;

/* What a backward rule sees: attrs, the saved tensors (NULL where the op
 * does not save that input), every input's meta, the saved output, and
 * which inputs need a gradient. */
typedef struct {
    int op;
    kiln_attrs attrs;
    int n_in;
    kiln_tensor *in[KILN_OP_MAX_IN];
    kiln_meta in_meta[KILN_OP_MAX_IN];
    kiln_tensor *out;
    kiln_tensor *aux[KILN_OP_MAX_AUX]; /* saved extra outputs (save_aux) */
    bool needs[KILN_OP_MAX_IN];
} kiln_bw_ctx;

/* Computes gin[i] (new references) for every i with c->needs[i]. */
typedef kiln_status (*kiln_backward_fn)(const kiln_bw_ctx *c, kiln_tensor *gout, kiln_tensor **gin);

/* A row reduction that can end a fused element-wise group (RMSNorm after
 * the residual add): per row of input 0 (its last dim, length n) the group's
 * element-wise members produce the row's values $x while `acc` is summed
 * over the row (in float), `fin` turns that sum $s into one factor $r per
 * row, and `out` gives each output element. $1.. are the other inputs'
 * element j (each read whole, [n]); $n the row length; $f0 attribute f[0].
 * Fusion, the interpreter and the code generator know such an op only by
 * this property, and its kernels must compute the same. */
typedef struct {
    const char *acc; /* "$x * $x" */
    const char *fin; /* from $s and $n */
    const char *out; /* from $x, $r and $1.. */
} kiln_row_epilogue;

typedef struct {
    const char *name;
    int n_in;
    /* Optional trailing inputs (0..n_opt of them after the n_in): the op's
     * attributes say which are present, so its shape rule can check them
     * (rope's positions, the attention ops' segment ids). */
    int n_opt;
    unsigned save_in;      /* bitmask: inputs the backward rule reads */
    bool save_out;         /* the backward rule reads the output */
    bool is_view;          /* output aliases input 0's storage */
    unsigned nondiff_in;   /* bitmask: inputs that never get a gradient (ids, masks) */
    kiln_status (*shape)(const kiln_meta *in, const kiln_attrs *a, kiln_meta *out);
    kiln_backward_fn backward; /* NULL: not differentiable */
    double (*flops)(const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out);
    /* Element-wise ops: the C expression of one output element, with $0, $1
     * the input elements and $f0 the attribute f[0] (code generation and
     * fusion use it; NULL: not fusable). */
    const char *cexpr;
    /* Row reductions that can end a fused group (NULL: not one). */
    const kiln_row_epilogue *row;
    /* Multi-output ops: n_aux extra outputs, never differentiated, whose
     * shapes come from aux_shape (the kernel gets them as its aux). */
    int n_aux;
    bool save_aux; /* the backward rule reads the extra outputs */
    kiln_status (*aux_shape)(const kiln_meta *in, const kiln_attrs *a, kiln_meta *aux);
    /* Element-wise ops whose value depends on the element's flat index
     * (dropout's mask): the C expression reads it as $e, and whoever runs
     * the kernel on a slice of the tensor (the interpreter's chunks)
     * passes the slice's first index in attribute i[5] (0 for a whole
     * tensor). */
    bool indexed;
} kiln_op_def;

const kiln_op_def *kiln_op_get(int op);
const char *kiln_op_name(int op);
double kiln_op_flops(int op, const kiln_meta *in, const kiln_attrs *a, const kiln_meta *out);
kiln_meta kiln_meta_of(const kiln_tensor *t);
int64_t kiln_meta_numel(const kiln_meta *m);
const char *kiln_meta_str(const kiln_meta *m, char *buf, size_t n); /* "[2, 3] f32" */

/* The generic entry: checks, then dispatches. */
kiln_tensor *kiln_op_call(int op, kiln_tensor *const *in, int n_in, const kiln_attrs *attrs);
/* Same for multi-output ops: aux[i] receives new references to the extra
 * outputs (aux may be NULL to drop them). */
kiln_tensor *kiln_op_call_aux(int op, kiln_tensor *const *in, int n_in, const kiln_attrs *attrs, kiln_tensor **aux);
/* Runs the op's kernel now on its inputs' device, through that backend
 * (allocates the outputs there). For dispatchers. */
kiln_tensor *kiln_op_execute(int op, kiln_tensor *const *in, const kiln_attrs *attrs, const kiln_meta *out,
                             kiln_tensor **aux);

typedef kiln_tensor *(*kiln_dispatch_fn)(void *ctx, int op, kiln_tensor *const *in, int n_in,
                                         const kiln_attrs *attrs, const kiln_meta *out, kiln_tensor **aux);
typedef struct {
    kiln_dispatch_fn fn;
    void *ctx;
} kiln_dispatcher;
/* Thread-local; returns the previous one so it can be restored. */
kiln_dispatcher kiln_op_set_dispatcher(kiln_dispatcher d);
kiln_dispatcher kiln_op_get_dispatcher(void);

/* A scope label for the ops called from now on (thread-local; 0 = none).
 * The model marks each block (attention of layer l: 2l+1, its MLP: 2l+2) so
 * a tracer can tell which block a node belongs to, e.g. to recompute a
 * block's activations in backward; eager ignores it. Returns the previous. */
int kiln_op_set_scope(int scope);
int kiln_op_get_scope(void);

/* Called (on this thread) once a parameter's gradient is complete for the
 * backward pass under way, eager or compiled, in the order they complete;
 * parameters backward never reaches get no call. Data-parallel training
 * starts communicating a bucket of gradients from here while backward goes
 * on. NULL removes the hook. */
typedef void (*kiln_grad_ready_fn)(kiln_tensor *param, void *user);
void kiln_set_grad_ready_hook(kiln_grad_ready_fn fn, void *user);
void kiln_grad_ready(kiln_tensor *param); /* calls the hook, if any */
bool kiln_grad_ready_hooked(void);

/* dst += src (same numel, f32, one device), used to accumulate gradients:
 * the backend's KILN_KERNEL_ACCUMULATE. */
kiln_status kiln_op_accumulate(kiln_tensor *dst, const kiln_tensor *src);

/* ---- the op API -------------------------------------------------------- */
kiln_tensor *kiln_embedding(kiln_tensor *W, kiln_tensor *ids);
kiln_tensor *kiln_embedding_backward(kiln_tensor *g, kiln_tensor *ids, int64_t vocab);
/* y = x·Wᵀ, x [..., K], W [N, K] -> [..., N] (a MATMUL, mode rows) */
kiln_tensor *kiln_linear(kiln_tensor *x, kiln_tensor *W);
/* Runs a MATMUL (attrs as kiln_matmul's: i0 mode, i1 ta, i2 tb) into an
 * existing c with beta 0 or 1 (1 accumulates: gradients straight into .grad),
 * through the backend of a, b and c (one device). */
kiln_status kiln_matmul_into(const kiln_tensor *a, const kiln_tensor *b, const kiln_attrs *attrs, kiln_tensor *c, float beta);
/* A MATMUL as one (batched) row-major GEMM, C = op(A)·op(B) with op(A)
 * M×K, op(B) K×N: leading dims and batch strides in elements (stride 0:
 * not batched). The shape rule checks through it and every backend's
 * kernel runs it. */
typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    int64_t batch, stride_a, stride_b, stride_c;
} kiln_matmul_geom;
kiln_status kiln_matmul_geometry(const kiln_meta *in, const kiln_attrs *a, kiln_matmul_geom *g, kiln_meta *out);
/* MATMUL modes:
 *  KILN_MM_BATCHED: a [P..., M, K], b [P..., K, N] (last two dims transposed
 *                   by ta/tb), same leading dims -> [P..., M, N]
 *  KILN_MM_ROWS:    a [R..., K], b [K, N] (or [N, K] with tb) -> [R..., N]
 *  KILN_MM_GRAD:    a [R..., M], b [R..., N] -> aᵀ·b = [M, N], summed over rows */
enum { KILN_MM_BATCHED = 0, KILN_MM_ROWS = 1, KILN_MM_GRAD = 2 };
/* Attribute i4: KILN_GEMM_MEASURED (0: kiln_gemm_f32 picks the
 * implementation by measurement) or KILN_GEMM_SGEMM (dnnl_sgemm), kiln/kernels.h. */
/* Attribute i3 = 1: bf16 operands, fp32 accumulation and output (the
 * kernel rounds both operands to bf16 in scratch; see kiln_bf16_path for
 * native vs emulated). The backward rule gives its gradient products the
 * same i3. kiln_matmul sets i3 from the thread's autocast setting for the
 * ROWS and GRAD modes (linear layers and their weight gradients); BATCHED
 * products (attention) stay fp32, as the compiler's flash attention is. */
kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b, int mode, bool ta, bool tb);
/* kiln_matmul with i3 given explicitly (used by the backward rule). */
kiln_tensor *kiln_matmul_prec(kiln_tensor *a, kiln_tensor *b, int mode, bool ta, bool tb, bool bf16);
/* Autocast (torch.autocast for matrix products): KILN_BF16 makes this
 * thread's kiln_matmul/kiln_linear calls bf16 products; KILN_F32 (default)
 * turns it off. Parameters, gradients, norms, softmax, the loss and the
 * optimiser stay fp32. Returns the previous setting. */
kiln_dtype kiln_autocast_set(kiln_dtype dt);
kiln_dtype kiln_autocast_get(void);
/* "fp32" or "bf16" -> KILN_F32 / KILN_BF16. */
kiln_status kiln_precision_parse(const char *s, kiln_dtype *out);
kiln_tensor *kiln_add(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_mul(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_scale(kiln_tensor *x, double c);
kiln_tensor *kiln_scale_by(kiln_tensor *x, kiln_tensor *s);
kiln_tensor *kiln_silu(kiln_tensor *x);
kiln_tensor *kiln_silu_backward(kiln_tensor *x, kiln_tensor *g);
kiln_tensor *kiln_rmsnorm(kiln_tensor *x, kiln_tensor *w, double eps);
kiln_tensor *kiln_rmsnorm_backward_x(kiln_tensor *x, kiln_tensor *w, kiln_tensor *g, double eps);
kiln_tensor *kiln_rmsnorm_backward_w(kiln_tensor *x, kiln_tensor *w, kiln_tensor *g, double eps);
kiln_tensor *kiln_rope(kiln_tensor *x, double theta, int64_t pos0, bool inverse);
/* Hugging Face's rope_scaling (config.json): DEFAULT none; LINEAR every
 * frequency / factor; LLAMA3 (Llama 3.1+) by frequency band: wavelengths
 * above original_max_position_embeddings / low_freq_factor are divided by
 * factor, below original_max / high_freq_factor kept, interpolated between. */
typedef enum { KILN_ROPE_DEFAULT = 0, KILN_ROPE_LINEAR = 1, KILN_ROPE_LLAMA3 = 2 } kiln_rope_type;
typedef struct {
    kiln_rope_type type;
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max_position_embeddings;
} kiln_rope_scaling;
/* kiln_rope with scaled frequencies (s NULL or DEFAULT: kiln_rope). */
kiln_tensor *kiln_rope_scaled(kiln_tensor *x, double theta, int64_t pos0, bool inverse, const kiln_rope_scaling *s);
/* The same with a position per token: pos [B, T] i32 (>= 0) instead of
 * pos0 + t (packed documents restart at 0). pos NULL: kiln_rope_scaled. */
kiln_tensor *kiln_rope_at(kiln_tensor *x, kiln_tensor *pos, double theta, bool inverse, const kiln_rope_scaling *s);
kiln_tensor *kiln_repeat_kv(kiln_tensor *x, int64_t n_rep);
kiln_tensor *kiln_repeat_kv_backward(kiln_tensor *g, int64_t n_rep);
kiln_tensor *kiln_transpose12(kiln_tensor *x);
kiln_tensor *kiln_reshape(kiln_tensor *x, int ndim, const int64_t *shape);
/* pad_mask [B, Tk] (1 real, 0 pad) -> [B, 1, Tq, Tk] with 0 where query i
 * (at absolute position Tk-Tq+i) may see key j, -inf elsewhere. */
kiln_tensor *kiln_attn_mask(kiln_tensor *pad_mask, int64_t q_len);
/* The same, block-diagonal: query i sees key j only when seg[i] == seg[j]
 * too (seg [B, Tk] i32, the segment of each token; queries are the last
 * Tq). seg NULL: kiln_attn_mask. */
kiln_tensor *kiln_attn_mask_seg(kiln_tensor *pad_mask, kiln_tensor *seg, int64_t q_len);
/* The same with a sliding window of `window` keys (0: none; seg may be NULL). */
kiln_tensor *kiln_attn_mask_win(kiln_tensor *pad_mask, kiln_tensor *seg, int64_t q_len, int64_t window);
kiln_tensor *kiln_softmax(kiln_tensor *x);
kiln_tensor *kiln_softmax_backward(kiln_tensor *y, kiln_tensor *g);
kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *targets, int32_t ignore_index);
kiln_tensor *kiln_cross_entropy_backward(kiln_tensor *logits, kiln_tensor *targets, kiln_tensor *g,
                                         int32_t ignore_index);
kiln_tensor *kiln_sum(kiln_tensor *x);
kiln_tensor *kiln_mean(kiln_tensor *x);
kiln_tensor *kiln_expand(kiln_tensor *g, int ndim, const int64_t *shape);
kiln_tensor *kiln_sum_to(kiln_tensor *g, int ndim, const int64_t *shape);
kiln_tensor *kiln_fill(int ndim, const int64_t *shape, double value);
kiln_tensor *kiln_cast_bf16(kiln_tensor *x);
kiln_tensor *kiln_round_bf16(kiln_tensor *x);
/* Preference objectives' pieces: per-row sums of -log p(target) over
 * targets != ignore ([R] from logits [R, T, V]); 1 / the row's target
 * count (0 for a row without); chosen - rejected of rows (2i, 2i+1);
 * log-sigmoid; relu; the indicator x > 0 (no gradient). */
kiln_tensor *kiln_row_nll(kiln_tensor *logits, kiln_tensor *targets, int32_t ignore_index);
kiln_tensor *kiln_row_nll_backward(kiln_tensor *logits, kiln_tensor *targets, kiln_tensor *g, int32_t ignore_index);
kiln_tensor *kiln_row_inv_count(kiln_tensor *targets, int32_t ignore_index);
kiln_tensor *kiln_pair_diff(kiln_tensor *x);
kiln_tensor *kiln_pair_sum(kiln_tensor *x); /* x[2i] + x[2i+1] */
kiln_tensor *kiln_pair_diff_backward(kiln_tensor *g);
kiln_tensor *kiln_logsigmoid(kiln_tensor *x);
kiln_tensor *kiln_logsigmoid_backward(kiln_tensor *x, kiln_tensor *g);
kiln_tensor *kiln_relu(kiln_tensor *x);
kiln_tensor *kiln_relu_backward(kiln_tensor *x, kiln_tensor *g);
kiln_tensor *kiln_gt0(kiln_tensor *x);
kiln_tensor *kiln_tanh(kiln_tensor *x);
kiln_tensor *kiln_tanh_backward(kiln_tensor *x, kiln_tensor *g);
/* GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
kiln_tensor *kiln_gelu_tanh(kiln_tensor *x);
kiln_tensor *kiln_gelu_tanh_backward(kiln_tensor *x, kiln_tensor *g);
/* Soft-capping by composition: cap * tanh(x / cap) (Gemma 2's logits) */
kiln_tensor *kiln_softcap(kiln_tensor *x, double cap);
kiln_tensor *kiln_log1mexp(kiln_tensor *x);
kiln_tensor *kiln_log1mexp_backward(kiln_tensor *x, kiln_tensor *g);
/* A new tensor holding W in storage dtype dt (f32, bf16, f16 or one of
 * ggml's block types), on W's device, with W's name; requires_grad only
 * for an f32 result of a trainable W. Values go through fp32: f16/bf16
 * round to nearest even, block types are ggml's reference quantization
 * (kiln/quant.h), widening is exact. A non-finite value is an error naming
 * the tensor and the element; rows must be whole blocks of dt. Not an op:
 * nothing is recorded. */
kiln_tensor *kiln_tensor_convert(const kiln_tensor *W, kiln_dtype dt);
/* Inverted dropout with a counter-based mask (kiln/opmath.h): element i is
 * zeroed with probability p, else scaled by 1 / (1 - p); the mask is a
 * function of (key, instance, i) only, so the same key and instance give
 * the same mask (backward reuses it; resume and eager = compiled hold).
 * key: f32 [1] holding an integer in [0, 2^24), a runtime input (it changes
 * every micro-batch without rebuilding a compiled step). p = 0 returns x. */
kiln_tensor *kiln_dropout(kiln_tensor *x, kiln_tensor *key, double p, int64_t instance);
kiln_tensor *kiln_flash_attn(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v, kiln_tensor *pad_mask, double scale);
/* With segment ids [B, Tk] i32 (NULL: kiln_flash_attn): attention within a
 * segment only, key blocks no query of a block can see skipped. */
kiln_tensor *kiln_flash_attn_seg(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v, kiln_tensor *pad_mask, kiln_tensor *seg,
                                 double scale);
/* Under bf16 autocast its products are bf16 ones (i3), as kiln_linear's. */
kiln_tensor *kiln_linear_cross_entropy(kiln_tensor *h, kiln_tensor *W, kiln_tensor *targets, int32_t ignore_index);

#ifdef __cplusplus
}
#endif
#endif
