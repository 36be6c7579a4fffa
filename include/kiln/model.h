/* kiln model: the Llama configuration (Hugging Face LlamaConfig field names)
 * and the forward pass, written once against the op API. The model never
 * knows whether ops run eagerly or are traced.
 *
 * Ownership: kiln_llama_new returns a model the caller frees with
 * kiln_llama_free; its parameter tensors belong to the model. Forward
 * functions return new references. Errors: NULL / kiln_status with
 * kiln_last_error() naming the field or op.
 */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The Hugging Face model families kiln builds from one model code: the
 * differences are switches (biases, q/k norms, window), not copies. */
typedef enum {
    KILN_FAMILY_LLAMA, KILN_FAMILY_MISTRAL, KILN_FAMILY_QWEN2, KILN_FAMILY_QWEN3, KILN_FAMILY_GEMMA2, KILN_FAMILY_GEMMA3
} kiln_family;
#define KILN_FAMILY_LAST KILN_FAMILY_GEMMA3
/* Gemma's differences from the Llama layer: RMSNorm scaling by (1 + w),
 * embeddings times sqrt(hidden_size), norms after attention and after the
 * MLP as well as before, GeGLU (tanh-approximate GELU), scores scaled by
 * query_pre_attn_scalar^-1/2 */
#define KILN_FAMILY_IS_GEMMA(f) ((f) == KILN_FAMILY_GEMMA2 || (f) == KILN_FAMILY_GEMMA3)

#define KILN_CONFIG_MAX_EOS 16 /* ids in an eos_token_id list */

typedef struct {
    kiln_family family; /* model_type: llama, mistral, qwen2, qwen3, gemma2, gemma3_text */
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int64_t num_attention_heads, num_key_value_heads, max_position_embeddings;
    int64_t head_dim; /* may differ from hidden_size / num_attention_heads */
    double rms_norm_eps, rope_theta;
    kiln_rope_scaling rope_scaling; /* rope_scaling: null, linear or llama3 */
    double initializer_range;       /* std of the initial weights */
    bool tie_word_embeddings;
    bool attention_bias; /* llama, qwen3: biases on q, k, v and o (qwen2 has q/k/v biases always) */
    bool mlp_bias;       /* llama: biases on gate, up and down */
    /* mistral: sliding_window (0 = null); qwen2/qwen3: sliding_window,
     * use_sliding_window and max_window_layers as written (the window
     * applies to layers >= max_window_layers when use_sliding_window) */
    int64_t sliding_window, max_window_layers;
    bool use_sliding_window;
    /* gemma2, gemma3: layer l slides (sliding_window) unless
     * (l + 1) % sliding_window_pattern == 0 (gemma2: 2; a layer_types list
     * is read as the pattern it follows) */
    int64_t sliding_window_pattern;
    double query_pre_attn_scalar; /* gemma: scores times query_pre_attn_scalar^-1/2 (others: head_dim) */
    /* gemma: c tanh(x / c) on the attention scores and on the final logits
     * (0: none) */
    double attn_logit_softcapping, final_logit_softcapping;
    /* gemma3: the RoPE base of the sliding layers (no scaling there);
     * rope_theta and rope_scaling are the full-attention layers' */
    double rope_local_base_freq;
    int64_t bos_token_id, eos_token_id, pad_token_id; /* -1: not set */
    /* eos_token_id given as a list: its other entries (eos_token_id holds the first) */
    bool eos_is_list;
    int n_eos_more;
    int64_t eos_more[KILN_CONFIG_MAX_EOS - 1];
} kiln_llama_config;

/* Fills defaults that HF uses (eps 1e-6, theta 10000, untied...). */
void kiln_llama_config_default(kiln_llama_config *c);
/* Named sizes: "tiny" (hidden 128, 2 layers), "small" (hidden 512, 8
 * layers, vocab 8192: the benchmark model), "demo" (the README's run),
 * "124m" (vocab 32000, hidden 768, intermediate 2048, 12 layers, 12 heads,
 * tied: 110M parameters, the realistic benchmark, bench/compare.sh). */
kiln_status kiln_llama_config_preset(const char *name, kiln_llama_config *c);
/* A preset name, or a path to a config.json (anything with '/' or ".json"). */
kiln_status kiln_llama_config_resolve(const char *name_or_path, kiln_llama_config *c);
bool kiln_llama_config_is_preset(const char *name_or_path);
kiln_status kiln_llama_config_validate(const kiln_llama_config *c);
/* The family's name ("llama", ..., "gemma3"), its config.json
 * model_type ("gemma3_text" for gemma3) and architectures entry
 * ("LlamaForCausalLM"). */
const char *kiln_family_name(kiln_family f);
const char *kiln_family_model_type(kiln_family f);
const char *kiln_family_architecture(kiln_family f);
/* The attention window (sliding_window where this config's attention uses
 * one on some layer, else 0): on those layers a query at position p sees
 * keys j > p - window (Hugging Face's sliding_window), eager and in the
 * flash kernels, with packed documents and the generation cache. */
int64_t kiln_llama_config_window(const kiln_llama_config *c);
/* The sliding window of one layer (0: it attends to every earlier key):
 * Mistral's on every layer, Qwen2/3's on layers >= max_window_layers,
 * Gemma's where (layer + 1) % sliding_window_pattern != 0. */
int64_t kiln_llama_layer_window(const kiln_llama_config *c, int64_t layer);
/* The RoPE base of layer l and its scaling (*s): rope_theta and
 * rope_scaling, but Gemma 3's sliding layers use rope_local_base_freq
 * unscaled. */
double kiln_llama_layer_rope(const kiln_llama_config *c, int64_t layer, const kiln_rope_scaling **s);
/* true when id is eos_token_id or one of the list's other entries */
bool kiln_llama_config_is_eos(const kiln_llama_config *c, int64_t id);
/* Field by field (padding bytes are not part of a config). */
bool kiln_llama_config_equal(const kiln_llama_config *a, const kiln_llama_config *b);
/* Parses config.json text (path only names the source in errors). Every
 * field must be one kiln implements for the model_type, one the family has
 * fixed, given at that value (qwen2's mlp_bias false; another value would
 * change the network and is refused by name), or one of a short list it
 * ignores on purpose (torch_dtype, transformers_version, use_cache, ...);
 * anything else is refused naming the file and the field. hidden_act is
 * SiLU by either of transformers' names ("silu", "swish"); Gemma's
 * hidden_activation (and hidden_act) is "gelu_pytorch_tanh". A
 * Gemma3ForConditionalGeneration config (model_type gemma3) reads as its
 * text_config: kiln builds the language model, the vision tower is not
 * part of it (a note says so). */
kiln_status kiln_llama_config_parse(const char *json, const char *source, kiln_llama_config *c);
kiln_status kiln_llama_config_load(const char *path, kiln_llama_config *c);
/* JSON text (malloc'd) with HF field names; written atomically by _save. */
char *kiln_llama_config_to_json(const kiln_llama_config *c);
kiln_status kiln_llama_config_save(const char *path, const kiln_llama_config *c);

typedef struct {
    kiln_tensor *input_layernorm, *q_proj, *k_proj, *v_proj, *o_proj;
    kiln_tensor *post_attention_layernorm, *gate_proj, *up_proj, *down_proj;
    /* NULL where the family has none */
    kiln_tensor *q_bias, *k_bias, *v_bias, *o_bias, *gate_bias, *up_bias, *down_bias;
    kiln_tensor *q_norm, *k_norm; /* qwen3, gemma3: RMSNorm weights [head_dim] */
    /* gemma: post_attention_layernorm normalises the attention's output;
     * these come before and after the MLP */
    kiln_tensor *pre_feedforward_layernorm, *post_feedforward_layernorm;
} kiln_llama_layer;

/* LoRA (low-rank adapters, as PEFT defines them): each targeted linear
 * y = W x becomes y = W x + scaling * B (A x), scaling = alpha / rank (or
 * alpha / sqrt(rank) with rslora, PEFT's use_rslora), A [rank, in] drawn as
 * PEFT draws it (Kaiming-uniform, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))),
 * B [out, rank] zero, W frozen. */
typedef enum {
    KILN_LORA_Q, KILN_LORA_K, KILN_LORA_V, KILN_LORA_O, KILN_LORA_GATE, KILN_LORA_UP, KILN_LORA_DOWN, KILN_LORA_N
} kiln_lora_target;
typedef struct {
    int rank;          /* 0: no adapters */
    double alpha;      /* scaling = alpha / rank, or alpha / sqrt(rank) with rslora */
    double dropout;    /* on the adapter's input, in training only (lora_key set) */
    unsigned targets;  /* bit (1 << kiln_lora_target) per targeted linear */
    bool rslora;       /* PEFT's use_rslora (rank-stabilised scaling) */
} kiln_lora_config;
/* The sane range of a scaling: outside it a run overflows (1e300 trains to
 * a NaN loss) or its adapters do nothing; kiln_lora_config_validate refuses. */
#define KILN_LORA_MIN_SCALING 1e-6
#define KILN_LORA_MAX_SCALING 1e4

typedef struct {
    kiln_llama_config cfg;
    kiln_tensor *embed_tokens, *norm, *lm_head; /* lm_head == embed_tokens when tied */
    kiln_llama_layer *layers;
    int n_params;
    kiln_tensor **params; /* every distinct parameter, named as Hugging Face names it */
    int n_base;           /* params[0..n_base): the base model; after them, LoRA adapters */
    kiln_lora_config lora;
    kiln_tensor **lora_a, **lora_b; /* [layer * KILN_LORA_N + target], NULL where not targeted */
    /* The dropout key of the micro-batch being trained (f32 [1], see
     * kiln_dropout), borrowed; NULL (evaluation, generation): no dropout.
     * Each adapter's mask is its own op instance (layer * KILN_LORA_N + target). */
    kiln_tensor *lora_key;
    /* true: the forward runs the base alone, adapters skipped (a preference
     * objective's reference pass: the same weights, no second copy) */
    bool lora_off;
} kiln_llama;

/* Parameters initialised as HF does: normal(0, 0.02), norms at one. The
 * same seed gives the same weights on any thread count. */
kiln_llama *kiln_llama_new(const kiln_llama_config *c, uint64_t seed);
/* The same parameters, not initialised (a loader fills every one), each
 * of the dtype dtype_of gives its Hugging Face name: f32 (trainable) or a
 * type a file holds (f16, bf16, ggml's blocks: frozen, requires_grad
 * false). Sized at those dtypes and checked against the machine first. */
kiln_llama *kiln_llama_new_empty(const kiln_llama_config *c, kiln_dtype (*dtype_of)(const char *name, void *user), void *user);
/* Bytes of all parameters (f32), computed with overflow checks:
 * KILN_ERR_RANGE naming the parameter when they do not fit in 64 bits.
 * kiln_llama_new refuses a model whose parameters exceed
 * kiln_mem_available_bytes() before allocating anything. */
kiln_status kiln_llama_param_bytes(const kiln_llama_config *c, uint64_t *bytes);
void kiln_llama_free(kiln_llama *m);
kiln_tensor *kiln_llama_param(const kiln_llama *m, const char *name);
int64_t kiln_llama_num_params(const kiln_llama *m);
/* requires_grad = trainable for every parameter whose name matches the
 * glob (fnmatch); returns how many matched. */
int kiln_llama_set_trainable(kiln_llama *m, const char *glob, bool trainable);
void kiln_llama_zero_grad(kiln_llama *m);

/* ---- LoRA (lora.c) ---- */
/* "q_proj", "k_proj", ... "down_proj" (PEFT's target_modules names). */
const char *kiln_lora_target_name(int target);
/* A comma list of those names (or "all") into a target mask; an unknown
 * name is an error naming it. */
kiln_status kiln_lora_targets_parse(const char *list, unsigned *mask);
/* The one place the adapters' factor is computed (forward and merge):
 * alpha / rank, or alpha / sqrt(rank) with rslora. */
double kiln_lora_scaling(const kiln_lora_config *lc);
/* rank, alpha (finite, > 0, and a scaling in [KILN_LORA_MIN_SCALING,
 * KILN_LORA_MAX_SCALING]), dropout, targets; errors name the field
 * (lora_alpha, r) and the values. */
kiln_status kiln_lora_config_validate(const kiln_lora_config *lc);
/* Adds adapters (params named model.layers.L.self_attn.q_proj.lora_A.weight,
 * ...lora_B.weight, after the base parameters) and freezes every base
 * parameter (no gradient, no optimiser state). Once per model. */
kiln_status kiln_llama_lora_add(kiln_llama *m, const kiln_lora_config *lc, uint64_t seed);
/* --base-dtype: holds the frozen base's linear weights (the seven
 * projections of every layer, the bulk of the parameters) in dt: KILN_BF16
 * (rounded to nearest even; its products become bf16 products), KILN_F16
 * or one of ggml's block types (kiln_tensor_convert: ggml's reference
 * quantization; products on the dequantized rows, fp32 or bf16 under
 * autocast), or back in KILN_F32. No fp32 copy is kept. Embeddings, norms,
 * biases, the head and the adapters stay as they are. Anything but fp32
 * needs adapters (a frozen base); a base already held in another type is
 * not cast again (requantizing loses more). */
kiln_status kiln_llama_base_cast(kiln_llama *m, kiln_dtype dt);
/* W += scaling B A for every adapter (in double), then removes the
 * adapters: the model is a plain one, every parameter trainable again. A
 * bf16 base weight is widened to fp32 first (the merged model is fp32).
 * A merged weight that is not finite (or an adapter that is not) is an
 * error naming the tensor and the element; the model is then partly merged
 * and only fit to be freed. */
kiln_status kiln_llama_lora_merge(kiln_llama *m);

/* Key/value cache for generation: keys and values of every layer for up to
 * max_len positions (a sliding layer's last window - 1), so each new token
 * costs one position. */
typedef struct kiln_llama_cache kiln_llama_cache;
kiln_llama_cache *kiln_llama_cache_new(const kiln_llama *m, int64_t batch, int64_t max_len);
void kiln_llama_cache_free(kiln_llama_cache *c);
int64_t kiln_llama_cache_len(const kiln_llama_cache *c);
/* Bytes the cache holds: a full-attention layer keeps max_len positions, a
 * sliding layer its last window - 1 (all a later query can see), so a
 * Gemma 3 or Mistral cache grows with the window, not the context. */
uint64_t kiln_llama_cache_bytes(const kiln_llama_cache *c);

/* ids [B, T] i32, pad_mask [B, T] i32 (1 real, 0 pad; NULL: all real).
 * Returns logits [B, T, V]. With a cache, the T new positions follow the
 * cached ones (pad_mask may then be NULL) and are appended to it. */
kiln_tensor *kiln_llama_forward(kiln_llama *m, kiln_tensor *ids, kiln_tensor *pad_mask, kiln_llama_cache *cache);
/* Rows that pack several documents: positions [B, T] i32 (RoPE position of
 * each token, restarting at 0 where a document starts) and segments [B, T]
 * i32 (the document of each token in its row): attention is causal within
 * a segment only (block-diagonal), so each document's logits are those it
 * has alone. Not with a cache. */
typedef struct {
    kiln_tensor *positions, *segments;
} kiln_llama_docs;
/* kiln_llama_forward with packed documents (docs NULL: the same). */
kiln_tensor *kiln_llama_forward_ex(kiln_llama *m, kiln_tensor *ids, kiln_tensor *pad_mask, const kiln_llama_docs *docs,
                                   kiln_llama_cache *cache);
/* Model FLOPs per trained token (forward + backward): 6 x the matrix
 * products' weights + 6 x layers x seq_len x query width (causal attention
 * counted as executed: half of the T x T scores). */
double kiln_llama_flops_per_token(const kiln_llama_config *c, int64_t seq_len);

#ifdef __cplusplus
}
#endif
#endif
