/* Private to src/data: the shards `kiln tokenize` is collecting, shared by
 * shard.c (plain text, the split, writing) and jsonl.c (JSONL examples). */
#ifndef KILN_DATA_IMPL_H
#define KILN_DATA_IMPL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kiln/data.h"

#include "data_names.h" /* links the kd_ helpers below as kiln_kd_* */

/* ---- kiln tokenize: the shards being collected (shard.c) ---- */
typedef struct { int32_t *v; uint8_t *m; size_t n, cap; uint64_t docs, masked; } kd_tokvec;
typedef struct {
    const kiln_tokenizer *tok;
    const kiln_tokenize_opts *opts;
    kd_tokvec train, val;
    size_t last_train_start; /* of the last document put in train */
} kd_tk_ctx;
/* Adds one document (ids with their loss mask, NULL = all targets) and the
 * eos after it to train or val (chosen by the hash of doc[0..len)). */
kiln_status kd_tokenize_add(kd_tk_ctx *c, const char *doc, size_t len, const int32_t *ids, const uint8_t *mask,
                            size_t n, bool eos_target);
/* The examples of a JSONL file (jsonl.c). */
kiln_status kd_tokenize_jsonl(kd_tk_ctx *c, const char *path, kiln_tokenize_stats *stats);
#endif
