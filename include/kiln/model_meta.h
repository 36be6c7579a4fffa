/* kiln formats: a model directory's metadata files (generation_config.json,
 * config.json's ids, tokenizer_config.json). Uses core and tokenizer.
 *
 * Ownership: kiln_model_meta_load fills a struct whose strings are malloc'd;
 * kiln_model_meta_free releases them.
 *
 * Errors: a kiln_status, with kiln_last_error() naming the file and field.
 */
#ifndef KILN_MODEL_META_H
#define KILN_MODEL_META_H

#include <stdbool.h>
#include <stdint.h>
#include "kiln/core.h"
#include "kiln/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model metadata --------------------------------------------------------
 * A model directory's generation_config.json, config.json and
 * tokenizer_config.json (each optional): bos/eos/pad ids, where
 * generation_config.json wins over config.json and either over the token
 * strings of tokenizer_config.json (resolved through its
 * added_tokens_decoder, then the tokenizer). eos may be several ids (an
 * instruct model ends a turn with any of them). The chat template is kept
 * as text (a list of named templates gives its "default" one). */
#define KILN_MAX_EOS 16
typedef struct {
    int32_t bos_id, pad_id;          /* -1: none given */
    int n_eos;
    int32_t eos_ids[KILN_MAX_EOS];
    char *bos_token, *eos_token, *pad_token; /* tokenizer_config.json's strings; NULL if absent */
    char *chat_template;             /* NULL if absent */
    /* whether a prompt starts with bos: has_add_bos when the file says
     * (a GGUF's tokenizer.ggml.add_bos_token, or llama.cpp's default for
     * its tokenizer, kiln_gguf_model_meta); false: not said (a model
     * directory, where kiln adds the tokenizer's bos when it has one) */
    bool has_add_bos, add_bos;
} kiln_model_meta;
/* tok (may be NULL) resolves token strings and bounds the eos ids. Free the
 * result with kiln_model_meta_free. */
kiln_status kiln_model_meta_load(const char *dir, const kiln_tokenizer *tok, kiln_model_meta *out);
void kiln_model_meta_free(kiln_model_meta *m);
bool kiln_model_meta_is_eos(const kiln_model_meta *m, int32_t id);
/* Writes dir/generation_config.json (ids; eos an integer or a list) and
 * dir/tokenizer_config.json (token strings, chat template). */
kiln_status kiln_model_meta_save(const char *dir, const kiln_model_meta *m);

#ifdef __cplusplus
}
#endif
#endif
