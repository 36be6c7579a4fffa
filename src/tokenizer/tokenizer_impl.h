/* Private to src/tokenizer: hash maps, text buffers, the tokenizer pipeline's
 * parts (tok_*.c) and the tokenizer struct shared by tokenizer.c,
 * tokenizer_json.c, tok_decode.c and bpe_train.c.
 *
 * The pipeline follows the Hugging Face `tokenizers` library (v0.22):
 * added tokens split the raw text first; every other piece is normalized,
 * split again on added tokens that match normalized text, pre-tokenized into
 * words, and each word goes through the BPE model. The post-processor adds
 * bos/eos; decoders turn token strings back into text. */
#ifndef KILN_TOKENIZER_IMPL_H
#define KILN_TOKENIZER_IMPL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kiln/tokenizer.h"

#include "tokenizer_names.h" /* links the kd_ helpers below as kiln_kd_* */

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
uint64_t *kd_strmap_get(const kd_strmap *m, const char *key, size_t len, uint64_t h);
uint64_t *kd_strmap_put(kd_strmap *m, const char *key, size_t len, uint64_t h, uint64_t init,
                        bool *inserted);
static inline const char *kd_strmap_key(const kd_strmap *m, size_t i, size_t *len) {
    *len = m->lens[i];
    return m->arena + m->offs[i];
}

/* ---- growable buffers (every size is overflow-checked) ---- */
typedef struct {
    char *p;
    size_t n, cap;
} kd_buf;
bool kd_buf_reserve(kd_buf *b, size_t extra);
bool kd_buf_put(kd_buf *b, const void *s, size_t n);
void kd_buf_free(kd_buf *b);

/* A piece of text in a work arena (id < 0) or an already-known token (id). */
#define KD_AT0 1u /* the piece starts at offset 0 of the original input */
typedef struct {
    size_t off, len;
    int32_t id;
    uint32_t flags;
} kd_span;
typedef struct {
    kd_span *v;
    size_t n, cap;
} kd_spans;
bool kd_spans_push(kd_spans *s, size_t off, size_t len, int32_t id, uint32_t flags);
void kd_spans_free(kd_spans *s);

/* find_matches events: [s, e) is a match or the text between matches. */
typedef struct {
    size_t s, e;
    bool match;
} kd_event;
typedef struct {
    kd_event *v;
    size_t n, cap;
} kd_events;
bool kd_events_push(kd_events *ev, size_t s, size_t e, bool match);

/* Per-thread scratch for encoding and decoding. */
typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    kd_buf arena, nb1, nb2;
    kd_spans s1, s2;
    kd_events ev;
} kd_work;
bool kd_work_init(kd_work *w);
void kd_work_free(kd_work *w);

/* ---- UTF-8 and the Unicode predicates HF takes from Rust's char ---- */
/* Decodes one char at s (n > 0); invalid bytes decode as themselves with
 * length 1 and *cp = 0xFFFFFFFF. */
size_t kd_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
size_t kd_utf8_put(char *o, uint32_t cp); /* o has room for 4 bytes */
bool kd_is_whitespace(uint32_t cp); /* char::is_whitespace (White_Space) */
bool kd_is_numeric(uint32_t cp);    /* char::is_numeric (Nd, Nl, No) */
/* Replaces invalid UTF-8 by U+FFFD like Rust's String::from_utf8_lossy. */
bool kd_utf8_lossy(const char *s, size_t n, kd_buf *out);

/* ---- patterns: {"String": s} (literal) or {"Regex": r} (PCRE2, UTF) ---- */
typedef struct {
    pcre2_code *re; /* NULL: literal */
    bool jit;
    char *lit;
    size_t lit_len;
    char *what; /* regexes: "PATH: WHERE: regex \"PATTERN\"" (truncated) for errors */
} kd_pattern;
kiln_status kd_pattern_parse(kd_pattern *p, json_t *j, const char *path, const char *where);
kiln_status kd_pattern_regex(kd_pattern *p, const char *re, const char *path, const char *where);
void kd_pattern_free(kd_pattern *p);
/* HF Pattern::find_matches on s[0..n): events covering the text in order,
 * appended to w->ev after clearing it. A regex gets a backtracking budget of
 * KD_RE_STEPS_PER_BYTE PCRE2 match-limit steps per byte of s (real
 * pre-tokenizers use at most 32), so a catastrophic pattern fails in time
 * linear in n with an error naming the file and the pattern. */
#define KD_RE_STEPS_PER_BYTE 256
kiln_status kd_pattern_find(const kd_pattern *p, kd_work *w, const char *s, size_t n);

/* ---- JSON helpers for the component parsers ---- */
/* Fails naming `path`, `where` and the key when obj has a key not in the
 * NULL-terminated list. */
kiln_status kd_json_keys(json_t *obj, const char *path, const char *where, const char *const *allowed);
kiln_status kd_json_bool(json_t *obj, const char *key, bool dflt, const char *path, const char *where, bool *out);
kiln_status kd_json_str(json_t *obj, const char *key, const char *path, const char *where, const char **s, size_t *n);
kiln_status kd_unsupported(const char *path, const char *where, const char *kind, const char *type);

/* ---- normalizers (tok_normalize.c) ---- */
typedef struct kd_norm kd_norm;
kiln_status kd_norm_parse(json_t *j, const char *path, const char *where, kd_norm **out);
void kd_norm_free(kd_norm *n);
/* out = normalize(s[0..len)) */
kiln_status kd_norm_apply(const kd_norm *n, kd_work *w, const char *s, size_t len, kd_buf *out);
bool kd_norm_chunk_safe(const kd_norm *n);

/* ---- pre-tokenizers (tok_pretok.c) ---- */
typedef struct kd_pretok kd_pretok;
kiln_status kd_pretok_parse(json_t *j, const char *path, const char *where, kd_pretok **out);
kd_pretok *kd_pretok_bytelevel(bool add_prefix_space, bool use_regex);
void kd_pretok_free(kd_pretok *p);
/* Splits the text spans of `in` (in w->arena) into `out`; tokens pass through. */
kiln_status kd_pretok_apply(const kd_pretok *p, kd_work *w, kd_spans *in, kd_spans *out);
/* 1 when the last step is ByteLevel (the model then sees bytes), 0 without
 * ByteLevel; an error when ByteLevel is followed by other steps. */
int kd_pretok_byte_level(const kd_pretok *p, const char *path);
/* kiln's own pipeline (ByteLevel with the GPT-2 regex alone): the text can
 * be cut before a space that follows a printable ASCII byte and encoded in
 * parts with the same result. */
bool kd_pretok_chunk_safe(const kd_pretok *p);

/* ---- added tokens (tok_added.c) ---- */
typedef struct kd_added kd_added;
typedef struct {
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
    const char *content;
    size_t len;
} kd_added_def;
kiln_status kd_added_build(const kd_added_def *defs, size_t n, const kd_norm *norm, kd_added **out);
void kd_added_free(kd_added *a);
/* HF AddedVocabulary::find_matches over s[0..n) with the raw or the
 * normalized set: text pieces (offsets relative to `base`) and tokens. */
kiln_status kd_added_split(const kd_added *a, bool normalized, const char *s, size_t n, size_t base,
                           uint32_t flags, kd_spans *out);
bool kd_added_has(const kd_added *a, bool normalized);
bool kd_added_any_space(const kd_added *a); /* some content holds an ASCII space */

/* ---- post-processors (tok_post.c) ---- */
typedef struct kd_post kd_post;
kiln_status kd_post_parse(json_t *j, const char *path, const char *where, int vocab_size, kd_post **out);
void kd_post_free(kd_post *p);
/* ids[0..n) -> *out (malloc'd) with the special tokens of the template. */
kiln_status kd_post_apply(const kd_post *p, const int32_t *ids, size_t n, int32_t **out, size_t *n_out);

/* ---- decoders (tok_decode.c) ---- */
typedef struct kd_dec kd_dec;
kiln_status kd_dec_parse(json_t *j, const char *path, const char *where, kd_dec **out);
kd_dec *kd_dec_bytelevel(void);
void kd_dec_free(kd_dec *d);

/* ---- the tokenizer ---- */
#define KD_TOK_SPECIAL 1u /* an added token marked special */
#define KD_TOK_ADDED 2u   /* listed in added_tokens */
#define KD_TOK_TEXT 4u    /* stored as its tokenizer.json string, not as bytes */
#define KD_TOK_MODEL 8u   /* a model.vocab entry */

struct kiln_tokenizer {
    int vocab_size;            /* max id + 1 */
    int n_merges;
    int bos, eos, pad;         /* -1 when absent */
    /* tokens: the bytes the model sees (byte-level vocabularies: raw bytes)
     * or the tokenizer.json string (KD_TOK_TEXT) */
    uint64_t *tok_off;         /* per id: offset in blob, UINT64_MAX = unused */
    uint32_t *tok_len;
    uint8_t *tok_flags;
    char *blob;
    size_t blob_len, blob_cap;
    /* BPE model */
    bool byte_level;           /* the last pre-tokenizer is ByteLevel: words are bytes */
    int32_t byte_id[256];      /* byte_level: id of each single byte, -1 if none */
    kd_strmap vocab;           /* model string -> id */
    int32_t (*merges)[2];      /* rank -> (left, right) */
    size_t merges_cap;
    kd_map64 merge_map;        /* (left << 32 | right) -> (rank << 32 | result id) */
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;            /* -1: none */
    int32_t fallback_id[256];  /* byte_fallback: id of "<0xXX>" */
    char *prefix, *suffix;     /* continuing_subword_prefix, end_of_word_suffix (model form) */
    size_t prefix_len, suffix_len;
    bool has_prefix, has_suffix;
    /* pipeline */
    kd_added *added;
    kd_norm *norm;
    kd_pretok *pretok;
    kd_post *post;
    kd_dec *dec;               /* NULL: tokens joined by spaces */
    bool chunk_safe;           /* long texts may be cut and encoded in parallel */
    char *src_path;            /* loaded from this file (saving copies it) */
    char *src_text;            /* parsed from this text (saving writes it) */
    size_t src_len;
};
/* An empty tokenizer with room for `vocab_size` ids, all unused. */
kiln_tokenizer *kd_tok_new(int vocab_size);
/* Sets token `id` to the given bytes with KD_TOK_* flags. */
kiln_status kd_tok_set(kiln_tokenizer *t, int id, const char *bytes, size_t len, unsigned flags);
/* Adds a model vocabulary entry (model string -> id). */
kiln_status kd_tok_vocab_put(kiln_tokenizer *t, const char *s, size_t len, int id);
int32_t kd_tok_vocab_get(const kiln_tokenizer *t, const char *s, size_t len);
/* Appends merge (left, right) -> result at the next rank; a repeated pair
 * takes the later rank, as in HF (its merges are collected into a map). */
kiln_status kd_tok_add_merge(kiln_tokenizer *t, int32_t left, int32_t right, int32_t result);
/* The same at an explicit rank (merges may share one: the leftmost pair of
 * the lowest rank merges first). */
kiln_status kd_tok_add_merge_rank(kiln_tokenizer *t, int32_t left, int32_t right, int32_t result, uint32_t rank);
/* The kiln layout and pipeline: specials 0..2, bytes 3..258, ByteLevel
 * with the GPT-2 regex, ByteLevel decoder. */
kiln_tokenizer *kd_tok_new_base(int vocab_size);
/* Builds the added-token matcher from the KD_TOK_ADDED ids and sets
 * bos/eos/pad from their names; call after the pipeline is set. */
kiln_status kd_tok_finish(kiln_tokenizer *t, const kd_added_def *defs, size_t n);
/* GPT-2 byte <-> unicode code point mapping. */
void kd_byte_to_unicode(uint32_t cp_of_byte[256]);
/* Pre-tokens (model strings) of one text as kiln's trainer counts them:
 * the pipeline up to the model; calls fn for each word. */
typedef bool (*kd_word_fn)(void *ctx, const char *s, size_t n);
kiln_status kd_tok_words(const kiln_tokenizer *t, kd_work *w, const char *s, size_t n, kd_word_fn fn, void *ctx);
/* A cut point at or after pos for chunk_safe pipelines, or n. */
size_t kd_chunk_boundary(const unsigned char *s, size_t n, size_t pos);
#endif
