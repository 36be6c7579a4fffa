/* kiln tokenizer: the BPE tokenizer (train, encode, decode, tokenizer.json).
 * Uses core only.
 *
 * Ownership: opaque objects (kiln_tokenizer) are
 * created by *_open/_load/_train and freed by the matching *_free/_close
 * (NULL ok). Arrays a function returns through an out-pointer (token ids,
 * decoded bytes) are malloc'd and belong to the caller: free() them.
 *
 * Errors: every function that can fail returns a kiln_status (KILN_OK = 0) or
 * NULL and sets kiln_last_error() to a message that names the file, the
 * offset or the flag at fault. Nothing here prints except through kiln_log.
 *
 * Token ids (tokenizers trained by kiln): 0 = <|bos|>, 1 = <|eos|>,
 * 2 = <|pad|>, 3..258 = the 256 single bytes (id = 3 + byte), 259.. = merges
 * in rank order. A tokenizer.json loaded from elsewhere keeps its own ids;
 * bos/eos/pad are found by name among its special tokens (<|bos|>,
 * <|begin_of_text|>, <s>, <bos> / <|eos|>, <|end_of_text|>, <|endoftext|>,
 * </s>, <eos> / <|pad|>, <pad>) and are -1 when absent.
 *
 * Compatibility: tokenizer.json is run as the Hugging Face `tokenizers`
 * library (v0.22) runs it: added tokens, normalizer, pre-tokenizer, BPE
 * model, post-processor and decoder (the README lists the components; any
 * other is refused at load, naming it and the file). Encoding gives HF's
 * ids on any valid UTF-8; invalid UTF-8 is encoded too (byte-level
 * tokenizers: exactly, byte by byte). kiln trains byte-level BPE with the
 * GPT-2 pre-tokenizer regex (PCRE2, Unicode classes) it declares.
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tokenizer ---------------------------------------------------------- */
#define KILN_TOK_BOS 0
#define KILN_TOK_EOS 1
#define KILN_TOK_PAD 2
#define KILN_TOK_BYTE0 3          /* id of byte 0 in kiln-trained vocabularies */
#define KILN_TOK_BASE_VOCAB 259   /* specials + bytes */

typedef struct kiln_tokenizer kiln_tokenizer;

/* Learns merges from the files until the vocabulary (specials + 256 bytes +
 * merges) has vocab_size entries, or no pair occurs any more. Deterministic:
 * ties go to the smaller (left, right) id pair. */
kiln_status kiln_tokenizer_train(const char *const *paths, int n_paths, int vocab_size,
                                 kiln_tokenizer **out);
/* The same on an in-memory text (tests, tools). */
kiln_status kiln_tokenizer_train_text(const char *text, size_t len, int vocab_size,
                                      kiln_tokenizer **out);
/* Hugging Face tokenizer.json (model type "BPE"). Save is atomic: a
 * trained tokenizer is written in kiln's layout (ByteLevel, specials in
 * added_tokens); a loaded one is written as a copy of its file. */
kiln_status kiln_tokenizer_load(const char *path, kiln_tokenizer **out);
/* The same from tokenizer.json text in memory (len bytes, no NUL needed);
 * `source` names it in errors. Saving such a tokenizer writes that text.
 * kiln reads one key of its own there, which Hugging Face ignores:
 * model.kiln_merge_ranks, one rank per merge, where merges may share a rank
 * and the leftmost pair of the lowest rank merges first (llama.cpp's
 * SentencePiece tokenizer ranks merges by the score of the merged token;
 * kiln_gguf_tokenizer writes it; without it merge i has rank i). */
kiln_status kiln_tokenizer_parse(const char *json, size_t len, const char *source, kiln_tokenizer **out);
kiln_status kiln_tokenizer_save(const kiln_tokenizer *tok, const char *path);
void kiln_tokenizer_free(kiln_tokenizer *tok);

int kiln_tokenizer_vocab_size(const kiln_tokenizer *tok); /* max id + 1 */
int kiln_tokenizer_n_merges(const kiln_tokenizer *tok);
int kiln_tokenizer_bos(const kiln_tokenizer *tok); /* -1 when absent */
int kiln_tokenizer_eos(const kiln_tokenizer *tok);
int kiln_tokenizer_pad(const kiln_tokenizer *tok);
/* Token `id` as stored: its bytes for byte-level vocabularies, otherwise
 * (and for added tokens) its tokenizer.json string; NULL if id is unused. */
const char *kiln_tokenizer_token(const kiln_tokenizer *tok, int id, size_t *len);

/* Encodes any byte string (invalid UTF-8 included) as HF's
 * encode(text, add_special_tokens=False): special tokens typed in the text
 * are matched, no bos/eos is added. *ids is malloc'd (NULL when
 * *n_ids == 0 is allowed); the caller frees it. With kiln's own pipeline,
 * inputs above ~64 KiB are cut before spaces and encoded on
 * kiln_num_threads() threads; the result does not depend on the thread
 * count. Safe to call from several threads on the same tokenizer. */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *tok, const char *text, size_t len,
                                  int32_t **ids, size_t *n_ids);
#define KILN_ENCODE_SPECIAL 1u /* add_special_tokens=True: the post-processor's bos/eos */
kiln_status kiln_tokenizer_encode_ex(const kiln_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                     int32_t **ids, size_t *n_ids);
/* Encodes n_docs documents (doc i = text[starts[i] .. starts[i] + lens[i]))
 * and appends `sep` (e.g. the eos id; -1 for none) after each one. Documents
 * are spread over threads; the output is in document order. */
kiln_status kiln_tokenizer_encode_docs(const kiln_tokenizer *tok, const char *text,
                                       const size_t *starts, const size_t *lens, size_t n_docs,
                                       int32_t sep, int32_t **ids, size_t *n_ids);
/* The same with flags: KILN_ENCODE_SPECIAL runs each document through the
 * post-processor (HF's add_special_tokens=True: Llama 2's <s>), and `sep`
 * is not appended after a document the post-processor already ended with
 * it. */
kiln_status kiln_tokenizer_encode_docs_ex(const kiln_tokenizer *tok, const char *text, const size_t *starts,
                                          const size_t *lens, size_t n_docs, int32_t sep, unsigned flags, int32_t **ids,
                                          size_t *n_ids);
/* HF's decode(ids, skip_special_tokens=False) through the file's decoder
 * (specials as their text), except that bytes which are not valid UTF-8
 * are kept as bytes (HF writes U+FFFD) so that a prefix of the ids decodes
 * to a prefix of the text. *out is malloc'd, NUL-terminated (not counted in
 * *len). An id out of range is an error (HF skips it). */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *tok, const int32_t *ids, size_t n,
                                  char **out, size_t *len);
#define KILN_DECODE_SKIP_SPECIAL 1u /* skip_special_tokens=True */
#define KILN_DECODE_LOSSY 2u        /* invalid UTF-8 -> U+FFFD exactly as HF */
kiln_status kiln_tokenizer_decode_ex(const kiln_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                                     char **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
