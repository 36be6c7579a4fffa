/* Shared by the exporters: export_gguf.c (the model: architecture metadata
 * and tensors), export_gguf_lora.c (a LoRA run's adapters for llama.cpp),
 * export_gguf_tok.c (the tokenizer as tokenizer.ggml.*) and
 * export_dir.c (model directories, and the checks and clean-up of every
 * export target). Not a public header. */
#ifndef KILN_EXPORT_GGUF_IMPL_H
#define KILN_EXPORT_GGUF_IMPL_H
#include "kiln/gguf.h"
#include "kiln/train.h"

/* How a kiln family is written as one of llama.cpp's architectures
 * (export_gguf.c): Llama and Mistral as "llama", Qwen2 as "qwen2", Qwen3 as
 * "qwen3", Gemma 2 as "gemma2", Gemma 3 as "gemma3". */
typedef struct {
    const char *arch;     /* general.architecture, and the prefix of its keys */
    bool permute;         /* llama rotates adjacent pairs: q/k rows reordered */
    bool rope_freqs;      /* rope_scaling llama3: the rope_freqs.weight tensor */
    int64_t context;      /* context_length */
    bool gemma;           /* gemma2/gemma3: (1 + w) norms, post norms, the window in the file */
} kiln_gguf_arch;
/* The architecture of config c (read from path), or the refusal of what it
 * cannot hold, naming path, the field and the reason. */
kiln_status kiln_gguf_plan_arch(const char *path, const kiln_llama_config *c, kiln_gguf_arch *a);
/* Row r of a q/k projection (or its bias, or a LoRA B of it) of `rows`
 * rows in `heads` heads as the llama architecture's file holds it: the
 * Hugging Face row it comes from (each head's rotate_half halves made
 * adjacent pairs). heads <= 0: r. */
int64_t kiln_gguf_qk_source_row(int64_t rows, int heads, int64_t r);

/* tokenizer.json as llama.cpp's vocabulary: its tokens padded to the
 * model's vocab_size and token types; for byte-level BPE (model "gpt2")
 * the merges and the pre-tokenizer name, for SentencePiece-style BPE
 * (byte_fallback: model "llama") a score per token that makes llama.cpp's
 * highest-score-first merging give the merges' rank order. */
typedef struct {
    char **tokens;
    size_t *lens;
    int32_t *types;
    char **merges;      /* gpt2 only */
    size_t n_merges;    /* the file's merges (both models) */
    int64_t n;
    const char *pre;    /* tokenizer.ggml.pre: "gpt-2", "llama-bpe", "qwen2"; NULL for llama */
    const char *model;  /* tokenizer.ggml.model: "gpt2" or "llama" */
    float *scores;      /* llama: tokenizer.ggml.scores */
    bool add_space_prefix; /* llama: the normalizer prepends U+2581 */
    int64_t unk;        /* llama: model.unk_token's id, -1 when none */
} kiln_gguf_vocab;

/* Reads tok_path (refusing what llama.cpp would tokenize differently, with
 * the file and field named) into v. Free with kiln_gguf_vocab_free. */
kiln_status kiln_gguf_vocab_read(const char *tok_path, int64_t n_vocab, kiln_gguf_vocab *v);
void kiln_gguf_vocab_free(kiln_gguf_vocab *v);
/* Writes v and the special ids, add_bos_token and the chat template of the
 * model directory dir (as kiln generate uses them) into w. */
kiln_status kiln_gguf_vocab_set(kiln_gguf_writer *w, const kiln_llama_config *c, const char *tok_path, const char *dir,
                                const kiln_gguf_vocab *v);

/* Refuses a model-directory export target (named in the error with the
 * directory it collides with) that is model_dir, lies inside source (the
 * run or model directory given) or model_dir, lies inside a run directory
 * or checkpoint, or is the base model of model_dir's LoRA adapters; and an
 * existing target that is not a directory kiln could have written
 * (non-empty without config.json, or holding other files), as it is
 * replaced whole. */
kiln_status kiln_export_check_target(const char *source, const char *model_dir, const char *target);
/* Removes what killed exports into target left beside it (TARGET.kiln-tmp-
 * <pid>, TARGET.kiln-old-<pid>, TARGET.tmp.<pid>...) whose process is gone,
 * saying so in one log line. */
kiln_status kiln_export_clean(const char *target);
/* rope_scaling llama3 as llama.cpp holds it: one divisor per frequency
 * (rope_freqs.weight, head_dim / 2 floats, malloc'd; NULL on OOM);
 * gguf_model.c inverts it. */
float *kiln_llama3_freq_factors(const kiln_llama_config *c);
#endif
