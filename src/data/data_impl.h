/* Private to src/data: the shards `kiln tokenize` is collecting, shared by
 * shard.c (plain text, the split, writing) and jsonl.c (JSONL examples). */
#ifndef KILN_DATA_IMPL_H
#define KILN_DATA_IMPL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kiln/data.h"
struct json_t;

#include "data_names.h" /* links the kd_ helpers below as kiln_kd_* */

/* ---- kiln tokenize: the shards being collected (shard.c) ---- */
typedef struct {
    int32_t *v; uint8_t *m; size_t n, cap; uint64_t docs, masked;
    uint64_t *ends; size_t ends_cap; /* pairs: the end of each document (docs of them) */
} kd_tokvec;
typedef struct {
    const kiln_tokenizer *tok;
    const kiln_tokenize_opts *opts;
    kd_tokvec train, val;
    size_t last_train_start; /* of the last document (pair) put in train */
    /* what the corpus holds, decided by its first example: 0 not yet, 1
     * preference pairs, 2 anything else; where that was decided */
    int kind;
    char kind_where[320];
} kd_tk_ctx;
/* Adds one document (ids with their loss mask, NULL = all targets) and the
 * eos after it to train or val (chosen by the hash of doc[0..len)). */
kiln_status kd_tokenize_add(kd_tk_ctx *c, const char *doc, size_t len, const int32_t *ids, const uint8_t *mask,
                            size_t n, bool eos_target);
/* Records that FILE[:LINE] holds pairs (pairs) or other data; an error
 * naming both places when the corpus so far holds the other kind. line 0:
 * a whole (plain text) file. */
kiln_status kd_tokenize_kind(kd_tk_ctx *c, bool pairs, const char *path, size_t line);
/* The examples of a JSONL file (jsonl.c). */
kiln_status kd_tokenize_jsonl(kd_tk_ctx *c, const char *path, kiln_tokenize_stats *stats);

/* ---- preference pairs (pairs.c) ---- */
typedef struct {
    char *text[3];   /* the prompt, chosen and rejected answer as encoded */
    size_t len[3];
    int32_t *ids[3];
    size_t n[3];
    bool chat;       /* conversational: the eos after an answer is no target */
    uint64_t key;    /* hash of the line's prompt, chosen and rejected: the val split */
} kd_pair;
/* True when the JSON object is a pair line (it has "chosen" or "rejected"). */
bool kd_pair_line(const struct json_t *obj);
/* Renders one pair line (errors name the field). */
kiln_status kd_pair_build(const kiln_tokenize_opts *o, const struct json_t *obj, kd_pair *p);
/* Encodes its three texts (thread-safe). */
kiln_status kd_pair_encode(const kiln_tokenizer *tok, kd_pair *p);
/* Truncates as opts say and adds the pair (both documents to train or
 * val), or counts it skipped (*skipped = true). */
kiln_status kd_pair_add(kd_tk_ctx *c, kd_pair *p, kiln_tokenize_stats *stats, bool *skipped);
void kd_pair_free(kd_pair *p);
/* Adds two documents (a pair) to the same split, chosen by key. */
kiln_status kd_tokenize_add_pair(kd_tk_ctx *c, uint64_t key, const int32_t *const ids[2], const uint8_t *const mask[2],
                                 const size_t n[2], const bool eos_target[2]);
#endif
