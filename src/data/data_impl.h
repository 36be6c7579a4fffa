/* Private to src/data: hash maps, the pre-tokenizer and the tokenizer
 * struct shared by tokenizer.c, tokenizer_json.c and bpe_train.c. */
#ifndef KILN_DATA_IMPL_H
#define KILN_DATA_IMPL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kiln/data.h"

/* ---- u64 -> u64 open-addressing map (key UINT64_MAX is reserved) ---- */
typedef struct {
    uint64_t *keys, *vals;
    size_t cap, n; /* cap: power of two */
} kd_map64;
bool kd_map64_init(kd_map64 *m, size_t expect);
void kd_map64_free(kd_map64 *m);
/* Pointer to the value of `key`, or NULL. */
uint64_t *kd_map64_get(const kd_map64 *m, uint64_t key);
/* Pointer to the value of `key`, inserting `init` if absent; NULL on OOM. */
uint64_t *kd_map64_put(kd_map64 *m, uint64_t key, uint64_t init, bool *inserted);

/* ---- byte string -> u64 map; keys are copied into an owned arena ---- */
typedef struct {
    uint32_t *slots;   /* entry index + 1, 0 = empty */
    uint64_t *hashes;  /* per entry */
    uint64_t *offs;    /* per entry: key offset in arena */
    uint32_t *lens;    /* per entry */
    uint64_t *vals;    /* per entry */
    char *arena;
    size_t cap, n, ecap, alen, acap;
} kd_strmap;
bool kd_strmap_init(kd_strmap *m, size_t expect);
void kd_strmap_free(kd_strmap *m);
uint64_t kd_hash_bytes(const void *p, size_t n);
uint64_t *kd_strmap_get(const kd_strmap *m, const char *key, size_t len, uint64_t h);
uint64_t *kd_strmap_put(kd_strmap *m, const char *key, size_t len, uint64_t h, uint64_t init,
                        bool *inserted);
static inline const char *kd_strmap_key(const kd_strmap *m, size_t i, size_t *len) {
    *len = m->lens[i];
    return m->arena + m->offs[i];
}

/* ---- pre-tokenizer ---- */
/* Length of the pre-token that starts at text[0] (n > 0). */
size_t kd_pretoken_len(const unsigned char *s, size_t n);
/* The first pre-token boundary at or after `pos` where encoding can start
 * afresh (a whitespace byte after a non-whitespace byte), or n. */
size_t kd_chunk_boundary(const unsigned char *s, size_t n, size_t pos);

/* ---- the tokenizer ---- */
struct kiln_tokenizer {
    int vocab_size;            /* max id + 1 */
    int n_merges;
    int bos, eos, pad;         /* -1 when absent */
    int32_t byte_id[256];
    uint64_t *tok_off;         /* per id: offset in blob, UINT64_MAX = unused */
    uint32_t *tok_len;
    uint8_t *tok_special;
    char *blob;
    size_t blob_len, blob_cap;
    int32_t (*merges)[2];      /* rank -> (left, right) */
    kd_map64 merge_map;        /* (left << 32 | right) -> (rank << 32 | result id) */
};
/* An empty tokenizer with room for `vocab_size` ids, all unused. */
kiln_tokenizer *kd_tok_new(int vocab_size);
/* Sets token `id` to the given bytes. */
kiln_status kd_tok_set(kiln_tokenizer *t, int id, const char *bytes, size_t len, bool special);
/* Appends merge (left, right) -> result; builds merge_map. */
kiln_status kd_tok_add_merge(kiln_tokenizer *t, int32_t left, int32_t right, int32_t result);
/* The kiln layout: specials 0..2 and bytes 3..258. */
kiln_tokenizer *kd_tok_new_base(int vocab_size);
/* GPT-2 byte <-> unicode code point mapping. */
void kd_byte_to_unicode(uint32_t cp_of_byte[256]);
#endif
