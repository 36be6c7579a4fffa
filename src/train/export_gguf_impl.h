/* Shared by the exporters: export_gguf.c (the model: architecture metadata
 * and tensors), export_gguf_tok.c (the tokenizer as tokenizer.ggml.*) and
 * export_dir.c (model directories, and the checks and clean-up of every
 * export target). Not a public header. */
#ifndef KILN_EXPORT_GGUF_IMPL_H
#define KILN_EXPORT_GGUF_IMPL_H
#include "kiln/gguf.h"
#include "kiln/train.h"

/* tokenizer.json as llama.cpp's BPE vocabulary: its tokens padded to the
 * model's vocab_size, token types, merges, and the pre-tokenizer name. */
typedef struct {
    char **tokens;
    size_t *lens;
    int32_t *types;
    char **merges;
    size_t n_merges;
    int64_t n;
    const char *pre; /* tokenizer.ggml.pre: "gpt-2", "llama-bpe", "qwen2" */
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
#endif
