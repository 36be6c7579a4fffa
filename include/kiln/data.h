/* kiln data: the BPE tokenizer (train, encode, decode, tokenizer.json),
 * the token shard format and the batch loader. Uses core only.
 *
 * Ownership: opaque objects (kiln_tokenizer, kiln_shard, kiln_loader) are
 * created by *_open/_load/_train and freed by the matching *_free/_close
 * (NULL ok). Arrays a function returns through an out-pointer (token ids,
 * decoded bytes) are malloc'd and belong to the caller: free() them.
 * Batches are allocated with kiln_batch_alloc and freed with kiln_batch_free.
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
#ifndef KILN_DATA_H
#define KILN_DATA_H

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
kiln_status kiln_tokenizer_save(const kiln_tokenizer *tok, const char *path);
void kiln_tokenizer_free(kiln_tokenizer *tok);

int kiln_tokenizer_vocab_size(const kiln_tokenizer *tok); /* max id + 1 */
int kiln_tokenizer_n_merges(const kiln_tokenizer *tok);
int kiln_tokenizer_bos(const kiln_tokenizer *tok); /* -1 when absent */
int kiln_tokenizer_eos(const kiln_tokenizer *tok);
int kiln_tokenizer_pad(const kiln_tokenizer *tok);
/* Overrides bos/eos/pad (e.g. from tokenizer_config.json); -1 = none. */
kiln_status kiln_tokenizer_set_special(kiln_tokenizer *tok, int bos, int eos, int pad);
/* Token `id` as stored: its bytes for byte-level vocabularies, otherwise
 * (and for added tokens) its tokenizer.json string; NULL if id is unused. */
const char *kiln_tokenizer_token(const kiln_tokenizer *tok, int id, size_t *len);
/* The id of an added token with this content, else of the vocabulary
 * entry with these bytes (as kiln_tokenizer_token gives them); -1. */
int kiln_tokenizer_find(const kiln_tokenizer *tok, const char *text, size_t len);
bool kiln_tokenizer_is_special(const kiln_tokenizer *tok, int id); /* a special added token */

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

/* ---- chat templates: a Jinja subset --------------------------------------
 * Parses and renders the Jinja of Hugging Face chat templates as
 * transformers does (Jinja2 with trim_blocks and lstrip_blocks, its
 * raise_exception, tojson and strftime_now, the loopcontrols extension and
 * {% generation %}): if/elif/else, for (loop.*, else, filters), set (also
 * block set and namespace attributes), macro, break/continue; Python
 * operators, literals, subscripts and slices, the filters, tests and str /
 * dict methods chat templates use. Anything outside the subset is an error
 * "NAME:LINE:COLUMN: ...", never a different rendering. Variables come from
 * a jansson object (messages, add_generation_prompt, bos_token, ...). */
typedef struct kiln_template kiln_template;
struct json_t;
kiln_status kiln_template_parse(const char *src, size_t len, const char *name, kiln_template **out);
void kiln_template_free(kiln_template *t);
/* *out is malloc'd and NUL-terminated (*len excludes the NUL; len may be
 * NULL). gen_spans (may be NULL): the byte ranges [s, e) of the output
 * written inside {% generation %} blocks, 2 * *n_gen values, malloc'd. */
kiln_status kiln_template_render(const kiln_template *t, const struct json_t *vars, char **out, size_t *len,
                                 size_t **gen_spans, size_t *n_gen);

/* A model's chat template with its special-token strings. Loaded from a
 * tokenizer_config.json (chat_template: a string, or a list of {name,
 * template} of which "default" is used; bos_token/eos_token/unk_token/
 * pad_token as strings or {"content": ...}); template_path (may be NULL)
 * overrides the config's template; config_path may be NULL when
 * template_path is given (the tokens are then empty strings). */
typedef struct kiln_chat kiln_chat;
kiln_status kiln_chat_load(const char *config_path, const char *template_path, kiln_chat **out);
void kiln_chat_free(kiln_chat *c);
/* The template's text as loaded (not NUL-terminated beyond *len). */
const char *kiln_chat_source(const kiln_chat *c, size_t *len);
/* Renders a conversation {"messages": [...], ...}: the other keys of the
 * object (tools, documents, enable_thinking, ...) are template variables
 * too, tools defaulting to None as in transformers. */
kiln_status kiln_chat_render(const kiln_chat *c, const struct json_t *conversation, bool add_generation_prompt,
                             char **out, size_t *len);
/* Renders the conversation (no generation prompt) and finds the byte ranges
 * an assistant would generate: with {% generation %} blocks, those;
 * otherwise, for each assistant message i, from the end of the rendering
 * of messages[:i] with the generation prompt to the end of messages[:i+1]
 * rendered (content and end-of-turn), each prefix checked to be a prefix of
 * the whole rendering. last_only: only the final assistant message.
 * *spans holds 2 * *n_spans offsets [start, end), malloc'd. */
kiln_status kiln_chat_assistant_spans(const kiln_chat *c, const struct json_t *conversation, bool last_only,
                                      char **text, size_t *len, size_t **spans, size_t *n_spans);

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
} kiln_model_meta;
/* tok (may be NULL) resolves token strings and bounds the eos ids. Free the
 * result with kiln_model_meta_free. */
kiln_status kiln_model_meta_load(const char *dir, const kiln_tokenizer *tok, kiln_model_meta *out);
void kiln_model_meta_free(kiln_model_meta *m);
bool kiln_model_meta_is_eos(const kiln_model_meta *m, int32_t id);
/* Writes dir/generation_config.json (ids; eos an integer or a list) and
 * dir/tokenizer_config.json (token strings, chat template). */
kiln_status kiln_model_meta_save(const char *dir, const kiln_model_meta *m);

/* ---- token shards --------------------------------------------------------
 * File layout (little endian), 64-byte header then the tokens:
 *   0  "KILNTOK1"          8  u32 version (2)     12 u32 token width (2 or 4)
 *   16 u64 token count     24 u32 vocab size      28 u32 eos id
 *   32 u32 pad id          36 u32 bos id (0xffffffff = none)
 *   40 u64 document count  48 u32 flags           52 12 bytes reserved (zero)
 * Tokens are uint16 when vocab size <= 65536, else uint32. Every document is
 * followed by the eos id. Flag bit 0 (KILN_SHARD_MASKED): a loss mask of
 * one byte per token follows the tokens, 1 = the token is a training target,
 * 0 = it is context only (a prompt, a user turn) and never a target.
 * Version 1 files (no flags, no mask: every token a target) are still read. */
#define KILN_SHARD_MAGIC "KILNTOK1"
#define KILN_SHARD_VERSION 2
#define KILN_SHARD_HEADER 64
#define KILN_SHARD_MASKED 1u

typedef struct {
    uint32_t version, width, vocab_size, eos_id, pad_id, bos_id;
    uint64_t count, n_docs;
    uint32_t flags;
} kiln_shard_info;

/* Writes a shard atomically (tokens must be < vocab_size). */
kiln_status kiln_shard_write(const char *path, const int32_t *tokens, size_t count,
                             const kiln_shard_info *info);
/* The same with a loss mask (count bytes, each 0 or 1; NULL = none). */
kiln_status kiln_shard_write_masked(const char *path, const int32_t *tokens, const uint8_t *mask, size_t count,
                                    const kiln_shard_info *info);

typedef struct kiln_shard kiln_shard;
/* Memory-maps and validates the whole shard once (magic, version, width,
 * count against file size, every token < vocab size). */
kiln_status kiln_shard_open(const char *path, kiln_shard **out);
void kiln_shard_close(kiln_shard *s);
const kiln_shard_info *kiln_shard_get_info(const kiln_shard *s);
static inline uint32_t kiln_shard_width_token(const void *data, uint32_t width, uint64_t i) {
    return width == 2 ? ((const uint16_t *)data)[i] : ((const uint32_t *)data)[i];
}
uint32_t kiln_shard_token(const kiln_shard *s, uint64_t i); /* i < count */
/* The loss mask (count bytes), or NULL when every token is a target. */
const uint8_t *kiln_shard_mask(const kiln_shard *s);

/* Document splitting for `kiln tokenize`. */
typedef enum {
    KILN_DOC_PARAGRAPH = 0, /* runs of non-blank lines, separated by blank lines */
    KILN_DOC_FILE = 1,      /* each file is one document */
    KILN_DOC_LINE = 2,      /* each non-blank line */
} kiln_doc_split;

/* Which tokens of a JSONL example are training targets. Plain text ({"text"}
 * or --field) is always trained on whole. */
typedef enum {
    KILN_TRAIN_ASSISTANT = 0,  /* chat: every assistant turn; prompt/completion: the completion */
    KILN_TRAIN_COMPLETION = 1, /* chat: the last assistant turn; prompt/completion: the completion */
    KILN_TRAIN_ALL = 2,        /* every token */
} kiln_train_on;

typedef struct {
    double val_frac;        /* fraction of documents held out (by content hash) */
    kiln_doc_split split;
    uint64_t seed;          /* mixes into the held-out choice */
    /* JSONL inputs (files named *.jsonl): one JSON object a line, either
     * {"text": ...}, {"prompt": ..., "completion": ...} or {"messages": [...]}
     * (rendered with `chat`, which must then be set). */
    const kiln_chat *chat;
    const char *field;      /* non-NULL: the text is this string field of every line */
    kiln_train_on train_on;
    bool skip_bad;          /* count and skip bad lines instead of failing on the first */
} kiln_tokenize_opts;

typedef struct {
    uint64_t train_tokens, val_tokens, train_docs, val_docs, bytes;
    uint64_t bad_lines;     /* skipped with skip_bad */
    uint64_t masked_tokens; /* tokens that are not targets (train + val) */
} kiln_tokenize_stats;

/* Tokenizes the files into DIR/train.bin and DIR/val.bin (DIR is created).
 * A document goes to val iff a hash of (its bytes, seed) falls below
 * val_frac, so the split is deterministic and duplicates stay together; when
 * val_frac > 0 and that leaves val empty, the last document goes there.
 * Progress is logged through kiln_log. A JSONL example is one document;
 * its masked tokens are found on the token sequence: the example is
 * rendered, the trained byte ranges located in the rendering (assistant
 * turns: kiln_chat_assistant_spans; a completion: after the prompt), the
 * text encoded once, and a token is a target when its bytes overlap a
 * trained range (so a merge across a boundary never shifts the mask). The
 * eos after a chat example is not a target (the template's own end-of-turn
 * is); after a completion or a text it is. A bad line fails with FILE:LINE
 * unless skip_bad. */
kiln_status kiln_tokenize_files(const kiln_tokenizer *tok, const char *const *paths, int n_paths,
                                const char *dir, const kiln_tokenize_opts *opts,
                                kiln_tokenize_stats *stats);

/* ---- loader --------------------------------------------------------------
 * Items are rows of T inputs (+1 for the target):
 *   packed: contiguous windows tokens[wT .. wT+T] (stride T), no padding;
 *   padded: document-aligned rows: each document's inputs (all its tokens
 *           but the closing eos) cut into rows of at most T; the last real
 *           input of a row targets the next token of the document (the eos
 *           at the end); a short row is right-padded with the pad id,
 *           pad_mask 0, target KILN_IGNORE_INDEX.
 *   documents: the pieces of padded mode (a document's inputs, cut into
 *           pieces of at most T) packed whole into rows, first fit over the
 *           last few open rows; each piece is a segment of its row
 *           (segments 1, 2, ... in row order, 0 for padding) whose
 *           positions restart at 0, and targets stay inside the piece's
 *           document, so the model attends within a segment only (block-
 *           diagonal causal) and nothing crosses a document boundary. The
 *           rest of a row is padding as in padded mode.
 * A shard's loss mask turns the target of every masked token into
 * KILN_IGNORE_INDEX (its input stays, pad_mask 1), so n_targets and the
 * token-normalised loss count only trained targets.
 * An epoch is a permutation of the items, seeded by (seed, epoch) (identity
 * when shuffle is off); micro-batch i takes items [iB, iB+B) of it, so a
 * batch is a pure function of (seed, epoch, index). In documents mode the
 * pieces are also put into rows in a seeded order of the documents (file
 * order when shuffle is off), once per loader: rows per epoch stay fixed.
 * The final micro-batch of an epoch may hold fewer rows: `rows` says how
 * many; the rows after it are all padding (mask 0, targets ignored). */
typedef enum { KILN_PACK_PACKED = 0, KILN_PACK_PADDED = 1, KILN_PACK_DOCUMENTS = 2 } kiln_pack_mode;

typedef struct {
    const char *path;  /* shard */
    int batch_size;    /* B */
    int seq_len;       /* T */
    kiln_pack_mode mode;
    bool shuffle;
    uint64_t seed;
} kiln_loader_config;

typedef struct {
    int B, T;
    int rows;            /* rows holding data (< B only in an epoch's last batch) */
    int64_t n_targets;   /* targets != KILN_IGNORE_INDEX */
    int64_t epoch, index;
    int32_t *input_ids;  /* B*T, row-major; wrap with kiln_tensor_wrap if needed */
    int32_t *targets;    /* B*T */
    int32_t *pad_mask;   /* B*T, 1 = real token, 0 = padding */
    /* Filled in every mode; the model uses them only when `segmented`
     * (documents mode): the RoPE position of each token (t in packed and
     * padded rows) and its segment in the row (1.. real, 0 padding). */
    int32_t *positions;  /* B*T */
    int32_t *segments;   /* B*T */
    bool segmented;      /* rows hold several documents: attend within segments */
} kiln_batch;

kiln_batch *kiln_batch_alloc(int B, int T); /* NULL + error on OOM */
void kiln_batch_free(kiln_batch *b);

typedef struct { int64_t epoch, next_index; } kiln_loader_state;

typedef struct kiln_loader kiln_loader;
kiln_status kiln_loader_open(const kiln_loader_config *cfg, kiln_loader **out);
void kiln_loader_close(kiln_loader *l);
int64_t kiln_loader_len(const kiln_loader *l);   /* micro-batches per epoch */
int64_t kiln_loader_items(const kiln_loader *l); /* rows per epoch */
const kiln_shard_info *kiln_loader_info(const kiln_loader *l);
/* Random access. Not safe to call concurrently on one loader (it caches the
 * last epoch's permutation); open one loader per thread instead. */
kiln_status kiln_loader_get(kiln_loader *l, int64_t epoch, int64_t index, kiln_batch *b);
/* Sequential: returns batch `state.next_index` of `state.epoch`, then moves
 * on (to the next epoch after the last batch). */
kiln_status kiln_loader_next(kiln_loader *l, kiln_batch *b);
kiln_loader_state kiln_loader_get_state(const kiln_loader *l);
kiln_status kiln_loader_set_state(kiln_loader *l, kiln_loader_state st);

#ifdef __cplusplus
}
#endif
#endif
