/* The tokenizer object, the BPE model (HF models/bpe: merge_word with
 * continuing_subword_prefix, end_of_word_suffix, byte_fallback, unk_token,
 * fuse_unk and ignore_merges) and the encoding pipeline: added tokens ->
 * normalizer -> normalized added tokens -> pre-tokenizer -> model ->
 * post-processor. Each call keeps a cache of word results. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

#define UNUSED_TOK UINT64_MAX
#define CACHE_MAX_WORD 255       /* longer words are not cached */
#define CACHE_MAX_ENTRIES (1u << 20)
#define PAR_MIN_BYTES (64u << 10)
#define MAX_MERGES (1 << 28)

/* ---- construction ---- */

kiln_tokenizer *kd_tok_new(int vocab_size) {
    if (vocab_size <= 0 || vocab_size > (1 << 24)) return NULL;
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->vocab_size = vocab_size;
    t->bos = t->eos = t->pad = t->unk_id = -1;
    t->tok_off = malloc((size_t)vocab_size * sizeof *t->tok_off);
    t->tok_len = calloc((size_t)vocab_size, sizeof *t->tok_len);
    t->tok_flags = calloc((size_t)vocab_size, 1);
    t->blob_cap = (size_t)vocab_size * 8 + 64;
    t->blob = malloc(t->blob_cap);
    for (int b = 0; b < 256; b++) t->byte_id[b] = t->fallback_id[b] = -1;
    if (!t->tok_off || !t->tok_len || !t->tok_flags || !t->blob || !kd_map64_init(&t->merge_map, (size_t)vocab_size) ||
        !kd_strmap_init(&t->vocab, (size_t)vocab_size)) {
        kiln_tokenizer_free(t);
        return NULL;
    }
    for (int i = 0; i < vocab_size; i++) t->tok_off[i] = UNUSED_TOK;
    return t;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_flags);
    free(t->blob);
    free(t->merges);
    free(t->prefix);
    free(t->suffix);
    free(t->src_path);
    free(t->src_text);
    kd_map64_free(&t->merge_map);
    kd_strmap_free(&t->vocab);
    kd_added_free(t->added);
    kd_norm_free(t->norm);
    kd_pretok_free(t->pretok);
    kd_post_free(t->post);
    kd_dec_free(t->dec);
    free(t);
}

kiln_status kd_tok_vocab_put(kiln_tokenizer *t, const char *s, size_t len, int id) {
    bool ins;
    uint64_t *v = kd_strmap_put(&t->vocab, s, len, kiln_hash_bytes(s, len), (uint64_t)id, &ins);
    if (!v) return kiln_error(KILN_ERR_OOM, "out of memory for the vocabulary");
    if (!ins && *v != (uint64_t)id)
        return kiln_error(KILN_ERR_FORMAT, "vocabulary string of id %d is also id %d", id, (int)*v);
    if (len == 1 && t->byte_id[(unsigned char)s[0]] < 0) t->byte_id[(unsigned char)s[0]] = id;
    return KILN_OK;
}

int32_t kd_tok_vocab_get(const kiln_tokenizer *t, const char *s, size_t len) {
    const uint64_t *v = kd_strmap_get(&t->vocab, s, len, kiln_hash_bytes(s, len));
    return v ? (int32_t)*v : -1;
}

kiln_status kd_tok_set(kiln_tokenizer *t, int id, const char *bytes, size_t len, unsigned flags) {
    if (id < 0 || id >= t->vocab_size) return kiln_error(KILN_ERR_RANGE, "token id %d out of range", id);
    if (t->tok_off[id] != UNUSED_TOK) return kiln_error(KILN_ERR_FORMAT, "token id %d defined twice", id);
    if (len > UINT32_MAX || len > SIZE_MAX - t->blob_len) return kiln_error(KILN_ERR_RANGE, "token %d is too long", id);
    if (t->blob_len + len > t->blob_cap) {
        size_t c = t->blob_cap;
        while (c < t->blob_len + len) {
            if (c > SIZE_MAX / 2) return kiln_error(KILN_ERR_OOM, "vocabulary too large");
            c *= 2;
        }
        char *b = realloc(t->blob, c);
        if (!b) return kiln_error(KILN_ERR_OOM, "out of memory for the vocabulary");
        t->blob = b;
        t->blob_cap = c;
    }
    if (len) memcpy(t->blob + t->blob_len, bytes, len);
    t->tok_off[id] = t->blob_len;
    t->tok_len[id] = (uint32_t)len;
    t->tok_flags[id] = (uint8_t)flags;
    t->blob_len += len;
    /* A byte-level token outside the byte alphabet can never be a word. */
    if ((flags & KD_TOK_MODEL) && !(t->byte_level && (flags & KD_TOK_TEXT))) return kd_tok_vocab_put(t, bytes, len, id);
    return KILN_OK;
}

kiln_status kd_tok_add_merge(kiln_tokenizer *t, int32_t left, int32_t right, int32_t result) {
    return kd_tok_add_merge_rank(t, left, right, result, (uint32_t)t->n_merges);
}

kiln_status kd_tok_add_merge_rank(kiln_tokenizer *t, int32_t left, int32_t right, int32_t result, uint32_t rank) {
    if (rank >= MAX_MERGES) return kiln_error(KILN_ERR_LIMIT, "merge rank %u is not below %d", rank, MAX_MERGES);
    if (t->n_merges >= MAX_MERGES) return kiln_error(KILN_ERR_LIMIT, "more than %d merges", MAX_MERGES);
    if ((size_t)t->n_merges == t->merges_cap) {
        size_t c = t->merges_cap ? t->merges_cap * 2 : 1024;
        int32_t(*m)[2] = realloc(t->merges, c * sizeof *m);
        if (!m) return kiln_error(KILN_ERR_OOM, "out of memory for merges");
        t->merges = m;
        t->merges_cap = c;
    }
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t *v = kd_map64_put(&t->merge_map, key, 0, NULL);
    if (!v) return kiln_error(KILN_ERR_OOM, "out of memory for merges");
    *v = (uint64_t)rank << 32 | (uint32_t)result;
    t->merges[t->n_merges][0] = left;
    t->merges[t->n_merges][1] = right;
    t->n_merges++;
    return KILN_OK;
}

void kd_byte_to_unicode(uint32_t cp[256]) {
    uint32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? (uint32_t)b : 256 + extra++;
    }
}

static bool is_name(const char *s, size_t n, const char *const *names) {
    for (; *names; names++)
        if (strlen(*names) == n && !memcmp(*names, s, n)) return true;
    return false;
}

kiln_status kd_tok_finish(kiln_tokenizer *t, const kd_added_def *defs, size_t n) {
    static const char *const bos[] = {"<|bos|>", "<|begin_of_text|>", "<s>", "<bos>", NULL};
    static const char *const eos1[] = {"<|eos|>", NULL};
    static const char *const eos2[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", NULL};
    static const char *const pad[] = {"<|pad|>", "<pad>", NULL};
    kiln_status st = kd_added_build(defs, n, t->norm, &t->added);
    if (st) return st;
    for (size_t i = 0; i < n; i++) {
        if (!defs[i].special) continue;
        if (t->bos < 0 && is_name(defs[i].content, defs[i].len, bos)) t->bos = defs[i].id;
        if (is_name(defs[i].content, defs[i].len, eos1) || (t->eos < 0 && is_name(defs[i].content, defs[i].len, eos2)))
            t->eos = defs[i].id;
        if (t->pad < 0 && is_name(defs[i].content, defs[i].len, pad)) t->pad = defs[i].id;
    }
    t->chunk_safe = t->byte_level && !t->norm && kd_pretok_chunk_safe(t->pretok) && !kd_added_any_space(t->added) &&
                    !kd_added_has(t->added, true) && !t->has_prefix && !t->has_suffix;
    return KILN_OK;
}

kiln_tokenizer *kd_tok_new_base(int vocab_size) {
    kiln_tokenizer *t = kd_tok_new(vocab_size);
    if (!t) return NULL;
    static const char *const names[3] = {"<|bos|>", "<|eos|>", "<|pad|>"};
    kd_added_def defs[3];
    t->byte_level = true;
    kiln_status st = KILN_OK;
    for (int i = 0; i < 3 && !st; i++) {
        st = kd_tok_set(t, i, names[i], strlen(names[i]), KD_TOK_SPECIAL | KD_TOK_ADDED | KD_TOK_MODEL);
        defs[i] = (kd_added_def){.id = i, .special = true, .content = names[i], .len = strlen(names[i])};
    }
    for (int b = 0; b < 256 && !st; b++) {
        char c = (char)b;
        st = kd_tok_set(t, KILN_TOK_BYTE0 + b, &c, 1, KD_TOK_MODEL);
    }
    t->pretok = kd_pretok_bytelevel(false, true);
    t->dec = kd_dec_bytelevel();
    if (st || !t->pretok || !t->dec || kd_tok_finish(t, defs, 3)) {
        kiln_tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* ---- accessors ---- */

int kiln_tokenizer_vocab_size(const kiln_tokenizer *t) { return t->vocab_size; }
int kiln_tokenizer_n_merges(const kiln_tokenizer *t) { return t->n_merges; }
int kiln_tokenizer_bos(const kiln_tokenizer *t) { return t->bos; }
int kiln_tokenizer_eos(const kiln_tokenizer *t) { return t->eos; }
int kiln_tokenizer_pad(const kiln_tokenizer *t) { return t->pad; }

const char *kiln_tokenizer_token(const kiln_tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->vocab_size || t->tok_off[id] == UNUSED_TOK) return NULL;
    if (len) *len = t->tok_len[id];
    return t->blob + t->tok_off[id];
}

/* ---- BPE on one word ---- */

static inline uint64_t merge_of(const kiln_tokenizer *t, int32_t a, int32_t b) {
    const uint64_t *v = kd_map64_get(&t->merge_map, (uint64_t)(uint32_t)a << 32 | (uint32_t)b);
    return v ? *v : UINT64_MAX;
}

/* Short words: a rank per adjacent pair, merge the lowest (leftmost on ties). */
static size_t bpe_short(const kiln_tokenizer *t, int32_t *sym, size_t n) {
    uint64_t m[64];
    for (size_t i = 0; i + 1 < n; i++) m[i] = merge_of(t, sym[i], sym[i + 1]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (m[i] >> 32 < m[best] >> 32) best = i; /* the rank: shared ranks go leftmost */
        if (m[best] == UINT64_MAX) break;
        sym[best] = (int32_t)(uint32_t)m[best];
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof *sym);
        memmove(m + best, m + best + 1, (n - best - 2) * sizeof *m);
        n--;
        if (best > 0) m[best - 1] = merge_of(t, sym[best - 1], sym[best]);
        if (best + 1 < n) m[best] = merge_of(t, sym[best], sym[best + 1]);
    }
    return n;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t key) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > key) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = key;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Long words: a linked list and a heap keyed by (rank, position), O(n log n),
 * as HF's Word::merge_all. Returns SIZE_MAX when out of memory. */
static size_t bpe_long(const kiln_tokenizer *t, int32_t *sym, size_t n) {
    if (n > UINT32_MAX || n > SIZE_MAX / (3 * sizeof(uint64_t))) return SIZE_MAX;
    int64_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
    uint64_t *h = malloc(3 * n * sizeof *h);
    size_t hn = 0, out = SIZE_MAX;
    if (!next || !prev || !h) goto done;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int64_t)i + 1 : -1;
        prev[i] = (int64_t)i - 1;
        if (i + 1 < n) {
            uint64_t r = merge_of(t, sym[i], sym[i + 1]);
            if (r != UINT64_MAX) heap_push(h, &hn, (r >> 32) << 32 | i);
        }
    }
    while (hn) {
        uint64_t k = heap_pop(h, &hn);
        size_t p = (uint32_t)k;
        if (sym[p] < 0 || next[p] < 0) continue;
        uint64_t r = merge_of(t, sym[p], sym[next[p]]);
        if (r == UINT64_MAX || (r >> 32) != (k >> 32)) continue;
        size_t q = (size_t)next[p];
        sym[p] = (int32_t)(uint32_t)r;
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = (int64_t)p;
        if (prev[p] >= 0) {
            uint64_t r2 = merge_of(t, sym[prev[p]], sym[p]);
            if (r2 != UINT64_MAX) heap_push(h, &hn, (r2 >> 32) << 32 | (uint64_t)prev[p]);
        }
        if (next[p] >= 0) {
            uint64_t r2 = merge_of(t, sym[p], sym[next[p]]);
            if (r2 != UINT64_MAX) heap_push(h, &hn, (r2 >> 32) << 32 | p);
        }
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (sym[i] >= 0) sym[w++] = sym[i];
    out = w;
done:
    free(next);
    free(prev);
    free(h);
    return out;
}

/* ---- per-call encoder state ---- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

static bool ivec_reserve(ivec *a, size_t extra) {
    if (extra > SIZE_MAX / sizeof(int32_t) - a->n) return false;
    if (a->n + extra <= a->cap) return true;
    size_t c = a->cap ? a->cap : 1024;
    while (c < a->n + extra) {
        if (c > SIZE_MAX / 2 / sizeof(int32_t)) return false;
        c *= 2;
    }
    int32_t *p = realloc(a->v, c * sizeof *p);
    if (!p) return false;
    a->v = p;
    a->cap = c;
    return true;
}

typedef struct {
    kd_work w;
    kd_spans top;
    kd_buf sbuf;     /* prefix + char + suffix */
    kd_strmap cache; /* word -> (offset in cached << 16 | count) */
    ivec cached, out;
    kiln_status st;
    char msg[512];
} encoder;

static bool encoder_init(encoder *e) {
    memset(e, 0, sizeof *e);
    if (!kd_work_init(&e->w)) return false;
    return kd_strmap_init(&e->cache, 4096);
}

static void encoder_free(encoder *e) {
    kd_work_free(&e->w);
    kd_spans_free(&e->top);
    kd_buf_free(&e->sbuf);
    kd_strmap_free(&e->cache);
    free(e->cached.v);
    free(e->out.v);
}

static void fail(encoder *e, kiln_status st) {
    if (e->st) return;
    e->st = st;
    snprintf(e->msg, sizeof e->msg, "%s", kiln_last_error());
}

/* HF BPE::merge_word's symbols: one per char (byte, for byte-level
 * vocabularies), with prefix/suffix, byte fallback and unk. */
static size_t initial_symbols(const kiln_tokenizer *t, encoder *e, const unsigned char *s, size_t n, int32_t *sym) {
    size_t m = 0;
    if (t->byte_level && !t->has_prefix && !t->has_suffix) {
        for (; m < n && t->byte_id[s[m]] >= 0; m++) sym[m] = t->byte_id[s[m]];
        if (m == n) return m;
        m = 0;
    }
    int32_t unk = -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = t->byte_level ? 1 : kd_utf8_next(s + i, n - i, &cp);
        bool first = i == 0, last = i + l == n;
        kd_buf *b = &e->sbuf;
        b->n = 0;
        if ((!first && t->has_prefix && !kd_buf_put(b, t->prefix, t->prefix_len)) || !kd_buf_put(b, s + i, l) ||
            (last && t->has_suffix && !kd_buf_put(b, t->suffix, t->suffix_len))) {
            fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
            return 0;
        }
        i += l;
        int32_t id = kd_tok_vocab_get(t, b->p, b->n);
        if (id >= 0) {
            if (unk >= 0) sym[m++] = unk, unk = -1;
            sym[m++] = id;
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < b->n && all; k++) all = t->fallback_id[(unsigned char)b->p[k]] >= 0;
            if (all) {
                for (size_t k = 0; k < b->n; k++) sym[m++] = t->fallback_id[(unsigned char)b->p[k]];
                continue; /* HF leaves a pending unk pending here */
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) sym[m++] = unk;
            unk = t->unk_id;
        } /* no unk_token: HF drops the char */
    }
    if (unk >= 0) sym[m++] = unk;
    return m;
}

static void model_word(const kiln_tokenizer *t, encoder *e, const unsigned char *s, size_t n) {
    if (n == 0 || e->st) return;
    if (t->ignore_merges) {
        int32_t id = kd_tok_vocab_get(t, (const char *)s, n);
        if (id >= 0) {
            if (!ivec_reserve(&e->out, 1)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
            e->out.v[e->out.n++] = id;
            return;
        }
    }
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        h = kiln_hash_bytes(s, n);
        uint64_t *v = kd_strmap_get(&e->cache, (const char *)s, n, h);
        if (v) {
            size_t cnt = *v & 0xffff;
            if (!ivec_reserve(&e->out, cnt)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
            memcpy(e->out.v + e->out.n, e->cached.v + (*v >> 16), cnt * sizeof(int32_t));
            e->out.n += cnt;
            return;
        }
    }
    /* at most one symbol per byte, or per byte of prefix + char + suffix */
    size_t room = n, extra = t->prefix_len + t->suffix_len;
    if (extra && n > (SIZE_MAX / sizeof(int32_t)) / (1 + extra))
        return fail(e, kiln_error(KILN_ERR_OOM, "a %zu-byte word is too long", n));
    if (extra) room = n * (1 + extra);
    if (!ivec_reserve(&e->out, room)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
    int32_t *sym = e->out.v + e->out.n;
    size_t m = initial_symbols(t, e, s, n, sym);
    if (e->st) return;
    m = m <= 64 ? bpe_short(t, sym, m) : bpe_long(t, sym, m);
    if (m == SIZE_MAX) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory merging a %zu-byte word", n));
    if (n <= CACHE_MAX_WORD) {
        if (e->cache.n >= CACHE_MAX_ENTRIES) {
            kd_strmap_free(&e->cache);
            e->cached.n = 0;
            if (!kd_strmap_init(&e->cache, 4096)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
        }
        if (ivec_reserve(&e->cached, m)) {
            uint64_t *v = kd_strmap_put(&e->cache, (const char *)s, n, h, 0, NULL);
            if (v) {
                *v = (uint64_t)e->cached.n << 16 | m;
                memcpy(e->cached.v + e->cached.n, sym, m * sizeof *sym);
                e->cached.n += m;
            }
        }
    }
    e->out.n += m;
}

/* The pipeline up to the model on one piece of raw text that is not an
 * added token: spans of words (w->arena) and tokens in w->s1 or w->s2. */
static kiln_status segment_words(const kiln_tokenizer *t, kd_work *w, const char *s, size_t n, uint32_t flags,
                                 kd_spans **res) {
    w->arena.n = 0;
    kiln_status st = KILN_OK;
    if (t->norm) {
        if ((st = kd_norm_apply(t->norm, w, s, n, &w->nb1))) return st;
        s = w->nb1.p ? w->nb1.p : "";
        n = w->nb1.n;
    }
    if (!kd_buf_put(&w->arena, s, n)) return kiln_error(KILN_ERR_OOM, "out of memory encoding");
    kd_spans *a = &w->s1, *b = &w->s2;
    a->n = 0;
    if (kd_added_has(t->added, true)) st = kd_added_split(t->added, true, w->arena.p, n, 0, flags, a);
    else if (n && !kd_spans_push(a, 0, n, -1, flags)) st = kiln_error(KILN_ERR_OOM, "out of memory encoding");
    if (!st && t->pretok) {
        st = kd_pretok_apply(t->pretok, w, a, b);
        a = b;
    }
    *res = a;
    return st;
}

static void encode_segment(const kiln_tokenizer *t, encoder *e, const char *s, size_t n, uint32_t flags) {
    kd_spans *sp;
    kiln_status st = segment_words(t, &e->w, s, n, flags, &sp);
    if (st) return fail(e, st);
    for (size_t i = 0; i < sp->n && !e->st; i++) {
        if (sp->v[i].id >= 0) {
            if (!ivec_reserve(&e->out, 1)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
            e->out.v[e->out.n++] = sp->v[i].id;
        } else {
            model_word(t, e, (const unsigned char *)e->w.arena.p + sp->v[i].off, sp->v[i].len);
        }
    }
}

static void encode_text(const kiln_tokenizer *t, encoder *e, const char *s, size_t n, uint32_t flags) {
    if (!kd_added_has(t->added, false)) return encode_segment(t, e, s, n, flags);
    e->top.n = 0;
    kiln_status st = kd_added_split(t->added, false, s, n, 0, flags, &e->top);
    if (st) return fail(e, st);
    for (size_t i = 0; i < e->top.n && !e->st; i++) {
        kd_span sp = e->top.v[i];
        if (sp.id >= 0) {
            if (!ivec_reserve(&e->out, 1)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
            e->out.v[e->out.n++] = sp.id;
        } else {
            encode_segment(t, e, s + sp.off, sp.len, sp.flags);
        }
    }
}

kiln_status kd_tok_words(const kiln_tokenizer *t, kd_work *w, const char *s, size_t n, kd_word_fn fn, void *ctx) {
    kd_spans top = {0};
    kiln_status st = KILN_OK;
    if (kd_added_has(t->added, false)) st = kd_added_split(t->added, false, s, n, 0, KD_AT0, &top);
    else if (n && !kd_spans_push(&top, 0, n, -1, KD_AT0)) st = kiln_error(KILN_ERR_OOM, "out of memory");
    for (size_t i = 0; !st && i < top.n; i++) {
        if (top.v[i].id >= 0) continue;
        kd_spans *sp;
        st = segment_words(t, w, s + top.v[i].off, top.v[i].len, top.v[i].flags, &sp);
        for (size_t k = 0; !st && k < sp->n; k++)
            if (sp->v[k].id < 0 && sp->v[k].len && !fn(ctx, w->arena.p + sp->v[k].off, sp->v[k].len))
                st = kiln_error(KILN_ERR_OOM, "out of memory counting words");
    }
    kd_spans_free(&top);
    return st;
}

/* ---- running parts on threads ---- */

typedef void (*part_fn)(const kiln_tokenizer *t, encoder *e, const void *ctx, int part);

static kiln_status run_parts(const kiln_tokenizer *t, int n_parts, part_fn fn, const void *ctx, int32_t **ids,
                             size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    encoder *enc = calloc((size_t)n_parts, sizeof *enc);
    if (!enc) return kiln_error(KILN_ERR_OOM, "out of memory encoding");
#pragma omp parallel for num_threads(n_parts) schedule(static, 1)
    for (int p = 0; p < n_parts; p++) {
        if (!encoder_init(&enc[p])) fail(&enc[p], kiln_error(KILN_ERR_OOM, "out of memory encoding"));
        else fn(t, &enc[p], ctx, p);
    }
    size_t total = 0;
    kiln_status st = KILN_OK;
    const char *msg = NULL;
    for (int p = 0; p < n_parts; p++) {
        total += enc[p].out.n;
        if (enc[p].st && !st) st = enc[p].st, msg = enc[p].msg;
    }
    int32_t *all = NULL;
    if (!st && total && !(all = malloc(total * sizeof *all))) st = kiln_error(KILN_ERR_OOM, "out of memory encoding");
    else if (st) st = kiln_error(st, "%s", msg);
    size_t pos = 0;
    for (int p = 0; p < n_parts; p++) {
        if (all && enc[p].out.n) memcpy(all + pos, enc[p].out.v, enc[p].out.n * sizeof *all);
        pos += enc[p].out.n;
        encoder_free(&enc[p]);
    }
    free(enc);
    if (st) {
        free(all);
        return st;
    }
    *ids = all;
    *n_ids = total;
    return KILN_OK;
}

typedef struct {
    const char *s;
    size_t bounds[65];
} text_ctx;

/* Where the text may be cut (chunk_safe), it is also encoded in windows of
 * about 64 KiB so the word lists stay in cache. */
static void text_part(const kiln_tokenizer *t, encoder *e, const void *ctx, int p) {
    const text_ctx *c = ctx;
    size_t a = c->bounds[p], end = c->bounds[p + 1];
    while (t->chunk_safe && end - a > PAR_MIN_BYTES && !e->st) {
        size_t b = a + kd_chunk_boundary((const unsigned char *)c->s + a, end - a, PAR_MIN_BYTES);
        if (b >= end) break;
        encode_text(t, e, c->s + a, b - a, a == 0 ? KD_AT0 : 0);
        a = b;
    }
    encode_text(t, e, c->s + a, end - a, a == 0 ? KD_AT0 : 0);
}

static int threads_for(size_t bytes) {
    int n = kiln_num_threads();
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    if (bytes < PAR_MIN_BYTES) return 1;
    if ((size_t)n > bytes / (PAR_MIN_BYTES / 2)) n = (int)(bytes / (PAR_MIN_BYTES / 2));
    return n < 1 ? 1 : n;
}

kiln_status kiln_tokenizer_encode_ex(const kiln_tokenizer *t, const char *text, size_t len, unsigned flags,
                                     int32_t **ids, size_t *n_ids) {
    text_ctx c;
    c.s = text;
    int n = t->chunk_safe ? threads_for(len) : 1;
    c.bounds[0] = 0;
    for (int p = 1; p < n; p++) {
        size_t b = kd_chunk_boundary((const unsigned char *)text, len, len / (size_t)n * (size_t)p);
        c.bounds[p] = b < c.bounds[p - 1] ? c.bounds[p - 1] : b;
    }
    c.bounds[n] = len;
    kiln_status st = run_parts(t, n, text_part, &c, ids, n_ids);
    if (st || !(flags & KILN_ENCODE_SPECIAL) || !t->post) return st;
    int32_t *with;
    size_t nw;
    st = kd_post_apply(t->post, *ids, *n_ids, &with, &nw);
    free(*ids);
    *ids = st ? NULL : with;
    *n_ids = st ? 0 : nw;
    return st;
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    return kiln_tokenizer_encode_ex(t, text, len, 0, ids, n_ids);
}

typedef struct {
    const char *s;
    const size_t *starts, *lens;
    int32_t sep;
    bool special; /* each document through the post-processor */
    size_t first[65]; /* document range of each part */
} docs_ctx;

/* ids [from, e->out.n) through the post-processor, in place */
static void post_tail(const kiln_tokenizer *t, encoder *e, size_t from) {
    int32_t *with;
    size_t nw;
    kiln_status st = kd_post_apply(t->post, e->out.v + from, e->out.n - from, &with, &nw);
    if (st) return fail(e, st);
    e->out.n = from;
    if (!ivec_reserve(&e->out, nw)) {
        free(with);
        return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
    }
    if (nw) memcpy(e->out.v + from, with, nw * sizeof *with);
    e->out.n += nw;
    free(with);
}

static void docs_part(const kiln_tokenizer *t, encoder *e, const void *ctx, int p) {
    const docs_ctx *c = ctx;
    for (size_t d = c->first[p]; d < c->first[p + 1] && !e->st; d++) {
        size_t from = e->out.n;
        encode_text(t, e, c->s + c->starts[d], c->lens[d], KD_AT0);
        if (c->special && t->post && !e->st) post_tail(t, e, from);
        if (e->st) return;
        /* a post-processor that ends a document with the separator already */
        if (c->sep >= 0 && !(c->special && e->out.n > from && e->out.v[e->out.n - 1] == c->sep)) {
            if (!ivec_reserve(&e->out, 1)) return fail(e, kiln_error(KILN_ERR_OOM, "out of memory encoding"));
            e->out.v[e->out.n++] = c->sep;
        }
    }
}

/* Fewer documents than threads: each document is split across threads. */
static kiln_status encode_few_docs(const kiln_tokenizer *t, const char *text, const size_t *starts, const size_t *lens,
                                   size_t n_docs, int32_t sep, bool special, int32_t **ids, size_t *n_ids) {
    ivec all = {0};
    kiln_status st = KILN_OK;
    for (size_t d = 0; d < n_docs && !st; d++) {
        int32_t *one;
        size_t n;
        st = kiln_tokenizer_encode_ex(t, text + starts[d], lens[d], special ? KILN_ENCODE_SPECIAL : 0, &one, &n);
        if (st) break;
        if (!ivec_reserve(&all, n + 1)) st = kiln_error(KILN_ERR_OOM, "out of memory encoding");
        if (!st && n) memcpy(all.v + all.n, one, n * sizeof *one);
        if (!st) all.n += n;
        if (!st && sep >= 0 && !(special && n && one[n - 1] == sep)) all.v[all.n++] = sep;
        free(one);
    }
    if (st) {
        free(all.v);
        return st;
    }
    *ids = all.v;
    *n_ids = all.n;
    return KILN_OK;
}

kiln_status kiln_tokenizer_encode_docs(const kiln_tokenizer *t, const char *text, const size_t *starts,
                                       const size_t *lens, size_t n_docs, int32_t sep, int32_t **ids, size_t *n_ids) {
    return kiln_tokenizer_encode_docs_ex(t, text, starts, lens, n_docs, sep, 0, ids, n_ids);
}

kiln_status kiln_tokenizer_encode_docs_ex(const kiln_tokenizer *t, const char *text, const size_t *starts,
                                          const size_t *lens, size_t n_docs, int32_t sep, unsigned flags, int32_t **ids,
                                          size_t *n_ids) {
    bool special = flags & KILN_ENCODE_SPECIAL;
    docs_ctx c = {.s = text, .starts = starts, .lens = lens, .sep = sep, .special = special};
    size_t total = 0;
    for (size_t d = 0; d < n_docs; d++) total += lens[d];
    int n = threads_for(total);
    if ((size_t)n > n_docs && n_docs > 0) return encode_few_docs(t, text, starts, lens, n_docs, sep, special, ids, n_ids);
    /* Split the documents into n runs of about equal bytes. */
    size_t d = 0, acc = 0;
    c.first[0] = 0;
    for (int p = 1; p < n; p++) {
        size_t target = total / (size_t)n * (size_t)p;
        while (d < n_docs && acc < target) acc += lens[d++];
        c.first[p] = d;
    }
    c.first[n] = n_docs;
    return run_parts(t, n, docs_part, &c, ids, n_ids);
}

