/* kiln kernels: CPU kernels, forward and backward, as plain functions on raw
 * pointers and sizes. They know nothing about tensors, graphs or autograd.
 * All are OpenMP-parallel where the work is large enough. Row-major layout.
 *
 * Errors: kernels assume validated arguments (the ops layer checks shapes);
 * only kiln_gemm can fail (library errors), and reports through core.
 */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include "kiln/core.h"
#include "kiln/opmath.h" /* the scalar math (exp, silu, bf16 rounding, ...) */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the kernels with one form per instruction set ----------------------
 * (src/kernels/simd/, kiln/simd.h). Each name below is a macro: inside a
 * form's compilation (-DKILN_FORM=avx2) it names that form's symbol
 * (kiln_k_add_avx2), so the declarations below declare it and the kernel
 * files define it; everywhere else it becomes a call through the active
 * form's table, (*kiln_simd->add)(...): the table's members are the names
 * without kiln_k_ (a form's table t: t->add(...)). KILN_SIMD_KERNELS lists
 * the same kernels by those names, in table order. */
#define KILN_SIMD_KERNELS(X) \
    X(f32_to_bf16) X(round_bf16) X(bf16_to_f32) X(add) X(mul) X(scale) \
    X(axpy) X(exp) X(silu) X(silu_backward) X(rmsnorm) \
    X(rmsnorm_backward) X(rope) X(rope_freq) X(rope_freq_pos) X(rope_inv_freq) \
    X(softmax) X(softmax_backward) X(cross_entropy) X(cross_entropy_backward) X(sum) \
    X(sumsq) X(sumsq_multi) X(adamw) X(adamw_multi) X(flash_attn) \
    X(flash_attn_seg) X(flash_attn_win) X(flash_attn_backward) X(flash_attn_backward_seg) X(flash_attn_backward_win) \
    X(flash_attn_ex) X(flash_attn_backward_ex) \
    X(linear_cross_entropy) X(linear_cross_entropy_ex) X(linear_cross_entropy_scratch) X(gemm_f32) X(gemm_bf16)
#define KILN_FORMED_(s, f) kiln_k_##s##_##f
#define KILN_FORMED(s, f) KILN_FORMED_(s, f)
#ifdef KILN_FORM
#define KILN_SIMD_NAME(s) KILN_FORMED(s, KILN_FORM)
#else
#define KILN_SIMD_NAME(s) kiln_k_##s
#endif
#define kiln_k_f32_to_bf16 KILN_SIMD_NAME(f32_to_bf16)
#define kiln_k_round_bf16 KILN_SIMD_NAME(round_bf16)
#define kiln_k_bf16_to_f32 KILN_SIMD_NAME(bf16_to_f32)
#define kiln_k_add KILN_SIMD_NAME(add)
#define kiln_k_mul KILN_SIMD_NAME(mul)
#define kiln_k_scale KILN_SIMD_NAME(scale)
#define kiln_k_axpy KILN_SIMD_NAME(axpy)
#define kiln_k_exp KILN_SIMD_NAME(exp)
#define kiln_k_silu KILN_SIMD_NAME(silu)
#define kiln_k_silu_backward KILN_SIMD_NAME(silu_backward)
#define kiln_k_rmsnorm KILN_SIMD_NAME(rmsnorm)
#define kiln_k_rmsnorm_backward KILN_SIMD_NAME(rmsnorm_backward)
#define kiln_k_rope KILN_SIMD_NAME(rope)
#define kiln_k_rope_freq KILN_SIMD_NAME(rope_freq)
#define kiln_k_rope_freq_pos KILN_SIMD_NAME(rope_freq_pos)
#define kiln_k_rope_inv_freq KILN_SIMD_NAME(rope_inv_freq)
#define kiln_k_softmax KILN_SIMD_NAME(softmax)
#define kiln_k_softmax_backward KILN_SIMD_NAME(softmax_backward)
#define kiln_k_cross_entropy KILN_SIMD_NAME(cross_entropy)
#define kiln_k_cross_entropy_backward KILN_SIMD_NAME(cross_entropy_backward)
#define kiln_k_sum KILN_SIMD_NAME(sum)
#define kiln_k_sumsq KILN_SIMD_NAME(sumsq)
#define kiln_k_sumsq_multi KILN_SIMD_NAME(sumsq_multi)
#define kiln_k_adamw KILN_SIMD_NAME(adamw)
#define kiln_k_adamw_multi KILN_SIMD_NAME(adamw_multi)
#define kiln_k_flash_attn KILN_SIMD_NAME(flash_attn)
#define kiln_k_flash_attn_seg KILN_SIMD_NAME(flash_attn_seg)
#define kiln_k_flash_attn_win KILN_SIMD_NAME(flash_attn_win)
#define kiln_k_flash_attn_backward KILN_SIMD_NAME(flash_attn_backward)
#define kiln_k_flash_attn_backward_seg KILN_SIMD_NAME(flash_attn_backward_seg)
#define kiln_k_flash_attn_backward_win KILN_SIMD_NAME(flash_attn_backward_win)
#define kiln_k_flash_attn_ex KILN_SIMD_NAME(flash_attn_ex)
#define kiln_k_flash_attn_backward_ex KILN_SIMD_NAME(flash_attn_backward_ex)
#define kiln_k_linear_cross_entropy KILN_SIMD_NAME(linear_cross_entropy)
#define kiln_k_linear_cross_entropy_ex KILN_SIMD_NAME(linear_cross_entropy_ex)
#define kiln_k_linear_cross_entropy_scratch KILN_SIMD_NAME(linear_cross_entropy_scratch)
#define kiln_k_gemm_f32 KILN_SIMD_NAME(gemm_f32)
#define kiln_k_gemm_bf16 KILN_SIMD_NAME(gemm_bf16)

/* ---- GEMM -------------------------------------------------------------- */
/* C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b in [0, batch),
 * op(X) = X or X^T. A is M×K after op, B is K×N after op, C is M×N.
 * lda/ldb/ldc are row strides of the matrices as stored; strideA/B/C the
 * element distance between consecutive batch matrices (0 = broadcast).
 * beta must be 0 or 1 (1 accumulates into C, used for gradients).
 * fp32: oneDNN's matmul primitive, dnnl_sgemm, kiln_k_gemm_f32, or
 * OpenBLAS's or BLIS's cblas_sgemm (their OpenMP builds, where installed),
 * whichever measured fastest on this problem (its mean call, among those
 * within 1.5x the best beside busy threads; the first time it is met;
 * the choice is kept in kiln's cache directory so every process makes the
 * same one; KILN_GEMM=auto|onednn|sgemm|kiln|openblas|blis); bf16: the
 * matmul primitive or kiln's bf16 kernel. */
typedef struct {
    bool transA, transB;
    int64_t M, N, K;
    int64_t lda, ldb, ldc;
    int64_t batch, strideA, strideB, strideC;
    float alpha, beta;
} kiln_gemm_desc;
kiln_status kiln_gemm_f32(const kiln_gemm_desc *d, const float *A, const float *B, float *C);
/* Same with bf16 operands (as kiln_f32_to_bf16 stores them), fp32
 * accumulation and fp32 C; for mixed precision. */
kiln_status kiln_gemm_bf16(const kiln_gemm_desc *d, const uint16_t *A, const uint16_t *B, float *C);
/* ---- bf16 conversion (mixed precision) ---------------------------------- */
/* y[i] = kiln_f32_to_bf16(x[i]); with AVX512-BF16 through VCVTNE2PS2BF16,
 * bit-identical except that denormal inputs become signed zeros there. */
void kiln_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n);
/* y[i] = x[i] rounded to bf16 and widened back (the emulated bf16 path). */
void kiln_k_round_bf16(const float *x, float *y, int64_t n);
/* y[i] = x[i] widened exactly (the emulated products' bf16 operands). */
void kiln_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n);
/* Whether this CPU has AVX512-BF16; whether bf16 products run natively
 * (kiln_gemm_bf16) or emulated (operands rounded, fp32 GEMM), and in words.
 * kiln_bf16_force_emulation(true) takes the emulated path (tests). */
bool kiln_cpu_has_avx512bf16(void);
bool kiln_bf16_native(void);
const char *kiln_bf16_path(void);
void kiln_bf16_force_emulation(bool on);
/* Whether kiln's bf16 kernels use AMX tiles (TDPBF16PS): native bf16, a
 * CPU with AMX-BF16, the avx512 form active and the OS's permission (asked
 * for on the first call);
 * kiln_bf16_amx_off(true) keeps them on VDPBF16PS (tests, benchmarks). */
bool kiln_bf16_amx(void);
void kiln_bf16_amx_off(bool off);
/* Convenience: single matrix, packed (ld = row length of the stored matrix). */
kiln_status kiln_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                       float alpha, const float *A, const float *B, float beta, float *C);
/* The same product through oneDNN's BLAS-style dnnl_sgemm, one call per
 * batch matrix, whatever kiln_gemm_f32 would choose (the matmul op's
 * attribute i4 = KILN_GEMM_SGEMM asks for it; KILN_GEMM_MEASURED, 0, is
 * kiln_gemm_f32's choice). */
kiln_status kiln_gemm_f32_sgemm(const kiln_gemm_desc *d, const float *A, const float *B, float *C);
/* The same product through the named implementation, whatever the choice
 * would be (bench/gemm, tests): onednn, sgemm, kiln, openblas or blis;
 * KILN_ERR_INVALID naming an unknown one, KILN_ERR_UNSUPPORTED for openblas
 * or blis where their OpenMP builds are not installed (or in a sanitizer
 * build). */
kiln_status kiln_gemm_f32_impl(const char *impl, const kiln_gemm_desc *d, const float *A, const float *B, float *C);
/* Whether kiln_gemm_f32_impl can run impl here (a known name, and for
 * openblas and blis their OpenMP builds opened). */
bool kiln_gemm_f32_impl_available(const char *impl);
enum { KILN_GEMM_MEASURED = 0, KILN_GEMM_SGEMM = 1 };
/* The fp32 choices so far in words ("12 fp32 products: onednn 3, sgemm 5,
 * kiln 4 (2 measured now, the rest from the cache)"), for kiln bench. */
const char *kiln_gemm_choices(void);
/* Which backend kiln_gemm uses, for the benchmark and --explain. */
const char *kiln_gemm_backend(void);
void kiln_gemm_cache_clear(void);

/* The fp32 FMA peak of this machine on all OpenMP threads, measured for
 * about `seconds` (0 when the CPU has neither AVX-512 nor AVX2+FMA). */
double kiln_fma_peak_gflops(double seconds);

/* ---- element-wise ------------------------------------------------------ */
void kiln_k_add(const float *a, const float *b, float *out, int64_t n);
void kiln_k_mul(const float *a, const float *b, float *out, int64_t n);
void kiln_k_scale(const float *x, float s, float *out, int64_t n);
void kiln_k_axpy(float a, const float *x, float *y, int64_t n); /* y += a*x */
/* y = kiln_expf_fast(x), 16 or 8 lanes at a time with the flash kernels'
 * vector forms (AVX-512, AVX2) in those forms: tests hold them to the
 * scalar's bits. */
void kiln_k_exp(const float *x, float *y, int64_t n);
void kiln_k_silu(const float *x, float *out, int64_t n);
/* out[j] = kiln_dropout_f(x[j], key, offset + j, p, inst) (dropout.c) */
void kiln_k_dropout(const float *x, float key, float p, int64_t inst, int64_t offset, float *out, int64_t n);
void kiln_k_silu_backward(const float *x, const float *gout, float *gin, int64_t n);
/* out[r, j] = a[r, j] op b[(r % nb_rows) ...] style broadcasting is done in ops */

/* ---- normalisation ----------------------------------------------------- */
/* rows × dim; y = x * rsqrt(mean(x^2) + eps) * w */
void kiln_k_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps);
/* dx (overwritten, may be NULL) from dy; dw accumulated (+=) if non-NULL */
void kiln_k_rmsnorm_backward(const float *x, const float *w, const float *dy,
                             float *dx, float *dw, int64_t rows, int64_t dim, float eps);

/* ---- rotary embedding (Hugging Face rotate_half convention) ------------ */
/* x: B×T×H×D, position of token t is pos0 + t. inverse=true applies the
 * inverse rotation (the backward). D must be even. */
void kiln_k_rope(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D,
                 int64_t pos0, float theta, bool inverse);
/* The same with given frequencies inv[D/2] (angle of position p: p * inv[j]). */
void kiln_k_rope_freq(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0,
                      const float *inv, bool inverse);
/* The same with the position of token (b, t) given: pos [B*T], each >= 0
 * (packed documents restart at 0). The angles are those of
 * kiln_k_rope_freq at the same position, bit for bit. */
void kiln_k_rope_freq_pos(const float *x, float *out, int64_t B, int64_t T, int64_t H, int64_t D, const int32_t *pos,
                          const float *inv, bool inverse);
/* Frequencies of Hugging Face's rope_scaling types: DEFAULT theta^(-2j/D);
 * LINEAR those / factor; LLAMA3 (_compute_llama3_parameters) per band by
 * wavelength against orig_max / low and orig_max / high. */
enum { KILN_K_ROPE_DEFAULT = 0, KILN_K_ROPE_LINEAR = 1, KILN_K_ROPE_LLAMA3 = 2 };
void kiln_k_rope_inv_freq(int64_t D, double theta, int type, double factor, double low, double high, int64_t orig_max,
                          float *inv);

/* ---- softmax over the last dim ----------------------------------------- */
void kiln_k_softmax(const float *x, float *y, int64_t rows, int64_t n);
/* dx = y * (dy - sum(dy*y)) */
void kiln_k_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t n);

/* ---- embedding --------------------------------------------------------- */
void kiln_k_embedding(const float *W, const int32_t *ids, float *out, int64_t n, int64_t dim);
/* dW += scatter of dout by ids (dW: vocab×dim, not zeroed here) */
void kiln_k_embedding_backward(const float *dout, const int32_t *ids, float *dW, int64_t n,
                               int64_t dim, int64_t vocab);

/* ---- cross-entropy ----------------------------------------------------- */
/* logits: n×V; returns the SUM of -log softmax(logits)[target] over rows
 * whose target != ignore_index; *count receives how many rows counted. */
double kiln_k_cross_entropy(const float *logits, const int32_t *targets, int64_t n, int64_t V,
                            int32_t ignore_index, int64_t *count);
/* dlogits = g * (softmax(logits) - onehot(target)) for counted rows, 0 else */
void kiln_k_cross_entropy_backward(const float *logits, const int32_t *targets, float g,
                                   float *dlogits, int64_t n, int64_t V, int32_t ignore_index);

/* ---- reductions -------------------------------------------------------- */
double kiln_k_sum(const float *x, int64_t n);
double kiln_k_sumsq(const float *x, int64_t n);
/* sum over j in [0, count) of kiln_k_sumsq(x[j], n[j]), added in j order:
 * the same chunks and the same additions (bit-identical to that loop), but
 * all parameters' chunks in one parallel pass (the global gradient norm). */
double kiln_k_sumsq_multi(const float *const *x, const int64_t *n, int count);

/* ---- optimiser --------------------------------------------------------- */
/* One AdamW update over n elements; lr and bias corrections are runtime
 * values. wd is applied decoupled: p -= lr * wd * p. */
void kiln_k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float bc2);
/* The fused optimiser step: for each slot, g' = g * gscale (clipping), the
 * AdamW update above with g' and the slot's wd, then g = 0; all slots' blocks
 * in one parallel pass. Bit-identical to kiln_k_scale(g, gscale), then
 * kiln_k_adamw, then zeroing g, slot by slot. */
typedef struct kiln_adamw_slot {
    float *p, *g, *m, *v;
    int64_t n;
    float wd;
} kiln_adamw_slot;
void kiln_k_adamw_multi(const kiln_adamw_slot *s, int count, float gscale, float lr, float beta1, float beta2,
                        float eps, float bc1, float bc2);


/* ---- fused kernels for the compiler ------------------------------------ */
/* Flash attention. q [B,H,T,D], k and v [B,Hkv,Tk,D] (grouped-query: head h
 * reads kv head h/(H/Hkv)), pad_mask [B,Tk] i32 (1 = real key, 0 = padding;
 * NULL = all real), causal with query i at absolute position Tk-T+i (key j
 * visible iff j <= Tk-T+i and pad_mask[b,j]); scores scaled by `scale`.
 * Writes out [B,H,T,D] and lse [B,H,T] (natural-log logsumexp of each scaled,
 * masked score row; -INFINITY for a row with no visible key, whose output is
 * 0). Never builds T×Tk. Bitwise deterministic for any thread count. */
void kiln_k_flash_attn(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                       float *out, float *lse, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                       int64_t Tk, int64_t D, float scale);
/* The same, block-diagonal: seg [B,Tk] i32 (NULL = kiln_k_flash_attn) gives
 * each token's segment, and query i (key position Tk-T+i) sees key j only
 * when their segments are equal too. A key block whose segments no query
 * of the query block shares is skipped (packed short documents cost
 * attention within each document only). */
void kiln_k_flash_attn_seg(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                           const int32_t *seg, float *out, float *lse, int64_t B, int64_t H, int64_t Hkv,
                           int64_t T, int64_t Tk, int64_t D, float scale);
/* The same with a sliding window W (0: none): query i also sees key j
 * only when (Tk-T+i) - j < W, as Hugging Face's sliding_window. Key blocks
 * wholly before every query's window are skipped. */
void kiln_k_flash_attn_win(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                           const int32_t *seg, float *out, float *lse, int64_t B, int64_t H, int64_t Hkv,
                           int64_t T, int64_t Tk, int64_t D, float scale, int64_t window);
/* Gradients given dout [B,H,T,D]: dq [B,H,T,D] overwritten; dk, dv
 * [B,Hkv,Tk,D] overwritten (summed over the heads that share a kv head).
 * Recomputes probabilities from q, k and lse. Bitwise deterministic for any
 * thread count. */
void kiln_k_flash_attn_backward(const float *q, const float *k, const float *v,
                                const int32_t *pad_mask, const float *out, const float *lse,
                                const float *dout, float *dq, float *dk, float *dv, int64_t B,
                                int64_t H, int64_t Hkv, int64_t T, int64_t Tk, int64_t D,
                                float scale);
/* Its backward with segment ids (NULL = kiln_k_flash_attn_backward). */
void kiln_k_flash_attn_backward_seg(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                                    const int32_t *seg, const float *out, const float *lse, const float *dout,
                                    float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                    int64_t Tk, int64_t D, float scale);
/* Its backward with a sliding window (as kiln_k_flash_attn_win). */
void kiln_k_flash_attn_backward_win(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                                    const int32_t *seg, const float *out, const float *lse, const float *dout,
                                    float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                    int64_t Tk, int64_t D, float scale, int64_t window);
/* The forward and backward with a window, and bf16: where the CPU has a
 * native bf16 product (AMX tiles where kiln_bf16_amx, else VDPBF16PS where
 * kiln_bf16_native, in the avx512 form) and D is a multiple of 32, every
 * product takes bf16 operands (q, k, v, dout, and the probabilities P and dS
 * rounded before their products, as eager's bf16 products round them) with
 * fp32 accumulation; elsewhere bf16 changes nothing (the fp32 products). */
void kiln_k_flash_attn_ex(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                          const int32_t *seg, float *out, float *lse, int64_t B, int64_t H, int64_t Hkv,
                          int64_t T, int64_t Tk, int64_t D, float scale, int64_t window, bool bf16);
void kiln_k_flash_attn_backward_ex(const float *q, const float *k, const float *v, const int32_t *pad_mask,
                                   const int32_t *seg, const float *out, const float *lse, const float *dout,
                                   float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                   int64_t Tk, int64_t D, float scale, int64_t window, bool bf16);
/* Fused final linear + cross-entropy. loss = sum over rows n with
 * targets[n] != ignore of -log softmax(h[n]·Wᵀ)[targets[n]]; *count = number
 * of such rows. h [N,C], W [V,C]. When dh (N×C, overwritten) and/or dW (V×C,
 * overwritten) are non-NULL, also writes the gradients of that sum (seed 1):
 * dlogits = softmax − onehot (0 for ignored rows), dh = dlogits·W,
 * dW = dlogitsᵀ·h. Works in chunks of `chunk` counted rows (0 = choose) so
 * only chunk×V logits exist at a time; ignored rows cost nothing (their dh
 * rows are zero). Matrix products go through kiln_gemm_f32. Returns the loss
 * sum; NaN if a GEMM or the scratch allocation failed (error set in core). */
double kiln_k_linear_cross_entropy(const float *h, const float *W, const int32_t *targets, int64_t N,
                                   int64_t C, int64_t V, int32_t ignore_index, int64_t chunk,
                                   int64_t *count, float *dh, float *dW);
/* The same with options: seed multiplies the gradients (dlogits =
 * seed·(softmax − onehot), formed as kiln_k_cross_entropy_backward forms
 * them); bf16 makes the three products bf16 ones, as the bf16 MATMUL runs
 * them (h, W and the seeded dlogits rounded to bf16; kiln_gemm_bf16
 * natively, an fp32 GEMM of the rounded values emulated), the softmax and
 * the loss fp32. softcap c > 0: the logits are capped first, z -> c·tanh(z/c)
 * (Gemma 2's final_logit_softcapping; z·(1/c), tanhf, ·c as kiln_softcap),
 * and the gradient goes back through the cap. opts NULL: seed 1, fp32. */
typedef struct {
    float seed;
    bool bf16;
    float softcap;
} kiln_lce_opts;
double kiln_k_linear_cross_entropy_ex(const float *h, const float *W, const int32_t *targets, int64_t N,
                                      int64_t C, int64_t V, int32_t ignore_index, int64_t chunk,
                                      int64_t *count, float *dh, float *dW, const kiln_lce_opts *opts);
/* Bytes of scratch the call allocates (the memory estimate counts it). */
size_t kiln_k_linear_cross_entropy_scratch(int64_t N, int64_t C, int64_t V, int64_t chunk, bool bf16);

/* kiln's own fp32 GEMM for one matrix (src/kernels/simd/gemm.c), one of the
 * candidates kiln_gemm_f32 chooses among by measurement:
 * C = alpha op(A) op(B) + beta C, row-major, op(A) M x K, op(B) K x N;
 * beta 0 (C is not read: NaN there does not propagate) or 1; M, N, K >= 1.
 * Packed panels and a register-blocked micro-kernel per form; OpenMP-parallel
 * on the caller's thread count; K is never split between threads, so the
 * result's bits do not depend on the thread count. false only when it cannot
 * allocate its packing buffers (no error is set). */
bool kiln_k_gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* kiln's own bf16 GEMM (src/kernels/simd/gemm_bf16.c), the same contract
 * with bf16 operands (as kiln_f32_to_bf16 stores them) and fp32 C, summed
 * as VDPBF16PS sums: per pair of k, acc += a[2i+1] b[2i+1], then
 * acc += a[2i] b[2i] (exact products, each add rounded to nearest even,
 * denormal inputs and outputs flushed to zero). The avx512 form runs
 * VDPBF16PS where the CPU has AVX512-BF16; every other form and CPU runs an
 * emulation with the same bits. */
bool kiln_k_gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                      int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc);


/* ---- the active form's table (kiln/simd.h) ------------------------------ */
#ifndef KILN_FORM
#include "kiln/simd.h"
#define KILN_SIMD_SLOT_(s) __typeof__(kiln_k_##s) *s;
typedef struct kiln_simd_table {
    KILN_SIMD_KERNELS(KILN_SIMD_SLOT_)
} kiln_simd_table;
#undef KILN_SIMD_SLOT_
extern const kiln_simd_table *kiln_simd;
/* a form's table; NULL when the form is not built or does not run here */
const kiln_simd_table *kiln_simd_table_of(kiln_form f);
#undef KILN_SIMD_NAME
#define KILN_SIMD_NAME(s) (*kiln_simd->s)
#endif

#ifdef __cplusplus
}
#endif

/* ==== helpers of the kernels =============================================
 * Inline so that loops using them vectorise. The scalar math generated code
 * shares (kiln_expf_fast, silu, bf16 rounding) is kiln/opmath.h. */
#include <float.h>
#include <math.h>
#include <string.h>

/* max(x[0..n)), -INFINITY for an empty or all -inf row, NaNs skipped.
 * OpenMP's max reduction starts its private copies from the type's least
 * value, which gcc takes as -inf and clang as -FLT_MAX: a row of -inf then
 * reduces to -FLT_MAX, and a fully masked softmax row to NaN. The rescan
 * runs only when the result is -FLT_MAX and gives the true max either way. */
static inline float kiln_row_max(const float *x, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    if (m == -FLT_MAX) {
        m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    }
    return m;
}

#endif
