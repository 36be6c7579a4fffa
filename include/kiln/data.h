/* kiln data: JSONL datasets, the token shard format (kiln tokenize) and the
 * batch loader. Uses core, tokenizer and template (chat JSONL is rendered
 * with the model's chat template).
 *
 * Ownership: opaque objects (kiln_shard, kiln_loader) are created by
 * *_open and freed by the matching *_close (NULL ok). Batches are allocated
 * with kiln_batch_alloc and freed with kiln_batch_free.
 *
 * Errors: every function that can fail returns a kiln_status (KILN_OK = 0) or
 * NULL and sets kiln_last_error() to a message that names the file, the
 * offset or the flag at fault. Nothing here prints except through kiln_log.
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kiln/core.h"
#include "kiln/template.h"
#include "kiln/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- token shards --------------------------------------------------------
 * File layout (little endian), 64-byte header then the tokens:
 *   0  "KILNTOK1"          8  u32 version (2 or 3)  12 u32 token width (2 or 4)
 *   16 u64 token count     24 u32 vocab size      28 u32 eos id
 *   32 u32 pad id          36 u32 bos id (0xffffffff = none)
 *   40 u64 document count  48 u32 flags           52 12 bytes reserved (zero)
 * Tokens are uint16 when vocab size <= 65536, else uint32. Every document is
 * followed by the eos id. Flag bit 0 (KILN_SHARD_MASKED): a loss mask of
 * one byte per token follows the tokens, 1 = the token is a training target,
 * 0 = it is context only (a prompt, a user turn) and never a target.
 * Flag bit 1 (KILN_SHARD_PAIRS, version 3 only): the documents are
 * preference pairs, documents 2i and 2i+1 the chosen and the rejected answer
 * to one prompt (each the prompt's tokens, the answer's, then the eos), and
 * after the tokens and the mask, zero-padded to a multiple of 8 bytes from
 * the file's start, come n_docs u64: the end of each document (the index
 * after its eos), since a chat template may put the eos id inside a
 * document. Shards without pairs are still written as version 2; version 1
 * files (no flags, no mask: every token a target) are still read. A reader
 * of version 2 refuses a pairs shard (its version, or on a version 2 header
 * its unknown flag), never reading the pairs as documents. */
#define KILN_SHARD_MAGIC "KILNTOK1"
#define KILN_SHARD_VERSION 3
#define KILN_SHARD_HEADER 64
#define KILN_SHARD_MASKED 1u
#define KILN_SHARD_PAIRS 2u

typedef struct {
    uint32_t version, width, vocab_size, eos_id, pad_id, bos_id;
    uint64_t count, n_docs;
    uint32_t flags;
} kiln_shard_info;

/* Writes a shard atomically (tokens must be < vocab_size). */
kiln_status kiln_shard_write(const char *path, const int32_t *tokens, size_t count,
                             const kiln_shard_info *info);
/* The same with a loss mask (count bytes, each 0 or 1; NULL = none).
 * Both write version 2 and ignore info->flags. */
kiln_status kiln_shard_write_masked(const char *path, const int32_t *tokens, const uint8_t *mask, size_t count,
                                    const kiln_shard_info *info);
/* A shard of preference pairs (version 3, KILN_SHARD_PAIRS): info->n_docs
 * documents (even: chosen, rejected, chosen, ...), doc_end[i] the index
 * after document i's eos (increasing, the last = count, each document at
 * least one token and its eos). mask as above (NULL = none). */
kiln_status kiln_shard_write_pairs(const char *path, const int32_t *tokens, const uint8_t *mask, size_t count,
                                   const uint64_t *doc_end, const kiln_shard_info *info);

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
/* A pairs shard's document ends (n_docs values, checked by open), or NULL
 * when the shard holds no pairs. */
const uint64_t *kiln_shard_doc_ends(const kiln_shard *s);
uint64_t kiln_shard_hash(const kiln_shard *s); /* of the whole file's bytes */

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
    /* Preference pairs (JSONL lines with "chosen"/"rejected"), as TRL's DPO
     * truncates them; 0 = no limit. The prompt keeps its last max_prompt_len
     * tokens (TRL's keep_end); then each answer is cut from the right so
     * that prompt + answer <= max_len tokens (the eos after a document is
     * not counted: it is only ever a target, so a row of --seq-len N holds
     * a pair of --max-len N). A pair whose prompt leaves no room under
     * max_len for one answer token is skipped (counted in pairs_skipped). */
    int64_t max_prompt_len, max_len;
    /* plain text (text files, JSONL "text" / --field) is encoded as HF's
     * add_special_tokens=True (the post-processor: Llama 2's <s>); true:
     * as add_special_tokens=False. Chats and pairs: the template's tokens. */
    bool no_special;
} kiln_tokenize_opts;

typedef struct {
    uint64_t train_tokens, val_tokens, train_docs, val_docs, bytes;
    uint64_t bad_lines;     /* skipped with skip_bad */
    uint64_t masked_tokens; /* tokens that are not targets (train + val) */
    bool pairs;             /* the shards hold preference pairs (two docs each) */
    uint64_t train_pairs, val_pairs;
    uint64_t pairs_skipped;     /* prompt (after max_prompt_len) >= max_len */
    uint64_t prompts_truncated; /* pairs whose prompt lost its start */
    uint64_t answers_truncated; /* answers (chosen or rejected) cut to fit max_len */
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
 * unless skip_bad.
 * Preference pairs: a JSONL line with "chosen" or "rejected" is a pair
 * {"prompt", "chosen", "rejected"}, all strings, or TRL's conversational
 * form: prompt a list of messages, chosen and rejected lists of assistant
 * messages. The prompt (a string; or rendered with the generation prompt)
 * and each answer (a string; or the rendering of prompt + answer after the
 * prompt's, to the end of the last assistant turn) are encoded apart, as
 * TRL does, so both documents of a pair begin with the same prompt tokens;
 * the answer tokens are the targets, and the eos after an answer is one
 * for plain strings that were not truncated. A corpus is all pairs or none
 * (anything else is an error naming the file and line); pairs go to val
 * whole (by the hash of the line's three fields) and the shards are
 * written with KILN_SHARD_PAIRS. */
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
 *   pairs: a shard of preference pairs only (KILN_SHARD_PAIRS; the other
 *           modes refuse one, and this one refuses other shards): the
 *           items are pairs, and micro-batch i holds pairs [iB/2, iB/2 +
 *           B/2) of the epoch's permutation (B must be even): row 2k the
 *           chosen and row 2k+1 the rejected document of its k-th pair,
 *           each as a padded row (its inputs from t = 0, the rest padding),
 *           targets the next token where the shard's mask makes it one (the
 *           answer's tokens), KILN_IGNORE_INDEX elsewhere. A document longer
 *           than T + 1 tokens (T inputs and the eos) is an error at open
 *           naming its pair (kiln tokenize --max-len T makes them fit).
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
typedef enum { KILN_PACK_PACKED = 0, KILN_PACK_PADDED = 1, KILN_PACK_DOCUMENTS = 2, KILN_PACK_PAIRS = 3 } kiln_pack_mode;

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
    /* Pairs mode with the reference's log-probabilities (kiln dpo-ref):
     * ref_logps[r] for row r (0 past the last real row). */
    float *ref_logps;    /* B */
    bool has_ref;
    int64_t *doc;        /* B: pairs mode, the shard document of each row (2 pair + rejected); -1 otherwise */
} kiln_batch;

kiln_batch *kiln_batch_alloc(int B, int T); /* NULL + error on OOM */
void kiln_batch_free(kiln_batch *b);

typedef struct { int64_t epoch, next_index; } kiln_loader_state;

typedef struct kiln_loader kiln_loader;
kiln_status kiln_loader_open(const kiln_loader_config *cfg, kiln_loader **out);
void kiln_loader_close(kiln_loader *l);
int64_t kiln_loader_len(const kiln_loader *l);   /* micro-batches per epoch */
int64_t kiln_loader_items(const kiln_loader *l); /* rows per epoch (pairs: 2 per pair) */
int64_t kiln_loader_pairs(const kiln_loader *l); /* pairs per epoch (0 outside pairs mode) */
const kiln_shard_info *kiln_loader_info(const kiln_loader *l);
uint64_t kiln_loader_shard_hash(const kiln_loader *l);
/* Pairs mode: the reference's log-probabilities of the shard's n documents
 * (kept, not copied; NULL: none), copied into every batch's ref_logps. */
kiln_status kiln_loader_set_ref(kiln_loader *l, const float *logps, uint64_t n);

/* The reference's log-probabilities of a pairs shard, stored beside it by
 * the first phase of a DPO run without adapters (SHARD.bin ->
 * SHARD.dpo-ref.bin): a 64-byte header ("KILNREF1", u32 version 1, u32
 * header size 64, u64 documents, u64 hash of the shard's bytes, u64 hash
 * of the reference model's weights, i32 seq_len, i32 batch, char[8]
 * precision, 8 reserved zero bytes), one f32 per document (its answer's
 * summed target log-probabilities, finite, <= 0), then a u64 hash of all
 * bytes before it. */
typedef struct {
    uint64_t n_docs, shard_hash, model_hash;
    int32_t seq_len, batch;
    char precision[8];
} kiln_ref_logps_meta;
void kiln_ref_logps_path(const char *shard_path, char *out, size_t n);
kiln_status kiln_ref_logps_write(const char *path, const kiln_ref_logps_meta *m, const float *logps);
/* Reads and checks the file (*logps: malloc'd, meta->n_docs values). */
kiln_status kiln_ref_logps_read(const char *path, kiln_ref_logps_meta *m, float **logps);
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
