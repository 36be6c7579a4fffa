/* Shared by the two halves of the GGUF exporter: export_gguf.c (the model:
 * architecture metadata and tensors) and export_gguf_tok.c (the tokenizer
 * as tokenizer.ggml.*). Not a public header. */
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
#endif
