/* Byte-level BPE: the tokenizer object, encoding (with a per-call cache of
 * pre-token results and a rank hash) and decoding. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

#define UNUSED_TOK UINT64_MAX
#define NO_RANK UINT32_MAX
#define CACHE_MAX_WORD 255       /* longer pre-tokens are not cached */
#define CACHE_MAX_ENTRIES (1u << 20)
#define PAR_MIN_BYTES (64u << 10)

/* ---- construction ---- */

kiln_tokenizer *kd_tok_new(int vocab_size) {
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->vocab_size = vocab_size;
    t->bos = t->eos = t->pad = -1;
    t->tok_off = malloc((size_t)vocab_size * sizeof *t->tok_off);
    t->tok_len = calloc((size_t)vocab_size, sizeof *t->tok_len);
    t->tok_special = calloc((size_t)vocab_size, 1);
    t->blob_cap = (size_t)vocab_size * 8 + 64;
    t->blob = malloc(t->blob_cap);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    if (!t->tok_off || !t->tok_len || !t->tok_special || !t->blob ||
        !kd_map64_init(&t->merge_map, (size_t)vocab_size)) {
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
    free(t->tok_special);
    free(t->blob);
    free(t->merges);
    kd_map64_free(&t->merge_map);
    free(t);
}

kiln_status kd_tok_set(kiln_tokenizer *t, int id, const char *bytes, size_t len, bool special) {
    if (id < 0 || id >= t->vocab_size) return kiln_error(KILN_ERR_RANGE, "token id %d out of range", id);
    if (t->tok_off[id] != UNUSED_TOK) return kiln_error(KILN_ERR_FORMAT, "token id %d defined twice", id);
    if (t->blob_len + len > t->blob_cap) {
        size_t c = t->blob_cap * 2;
        while (c < t->blob_len + len) c *= 2;
        char *b = realloc(t->blob, c);
        if (!b) return kiln_error(KILN_ERR_OOM, "out of memory for the vocabulary");
        t->blob = b;
        t->blob_cap = c;
    }
    memcpy(t->blob + t->blob_len, bytes, len);
    t->tok_off[id] = t->blob_len;
    t->tok_len[id] = (uint32_t)len;
    t->tok_special[id] = special;
    t->blob_len += len;
    if (!special && len == 1 && t->byte_id[(unsigned char)bytes[0]] < 0)
        t->byte_id[(unsigned char)bytes[0]] = id;
    return KILN_OK;
}

kiln_status kd_tok_add_merge(kiln_tokenizer *t, int32_t left, int32_t right, int32_t result) {
    if (!t->merges) {
        t->merges = malloc((size_t)t->vocab_size * sizeof *t->merges);
        if (!t->merges) return kiln_error(KILN_ERR_OOM, "out of memory for merges");
    }
    if (t->n_merges >= t->vocab_size)
        return kiln_error(KILN_ERR_FORMAT, "more merges than vocabulary entries");
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    bool ins;
    uint64_t *v = kd_map64_put(&t->merge_map, key, 0, &ins);
    if (!v) return kiln_error(KILN_ERR_OOM, "out of memory for merges");
    if (!ins) return KILN_OK; /* a repeated merge never wins over its first rank */
    *v = (uint64_t)t->n_merges << 32 | (uint32_t)result;
    t->merges[t->n_merges][0] = left;
    t->merges[t->n_merges][1] = right;
    t->n_merges++;
    return KILN_OK;
}

kiln_tokenizer *kd_tok_new_base(int vocab_size) {
    kiln_tokenizer *t = kd_tok_new(vocab_size);
    if (!t) return NULL;
    static const char *const names[3] = {"<|bos|>", "<|eos|>", "<|pad|>"};
    for (int i = 0; i < 3; i++) kd_tok_set(t, i, names[i], strlen(names[i]), true);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        kd_tok_set(t, KILN_TOK_BYTE0 + b, &c, 1, false);
    }
    t->bos = KILN_TOK_BOS;
    t->eos = KILN_TOK_EOS;
    t->pad = KILN_TOK_PAD;
    return t;
}

void kd_byte_to_unicode(uint32_t cp[256]) {
    uint32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? (uint32_t)b : 256 + extra++;
    }
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

/* ---- BPE on one pre-token ---- */

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
            if (m[i] < m[best]) best = i;
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

typedef struct { uint64_t key; } heap_ent; /* rank << 32 | position */

static void heap_push(heap_ent *h, size_t *n, uint64_t key) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].key > key) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i].key = key;
}

static uint64_t heap_pop(heap_ent *h, size_t *n) {
    uint64_t top = h[0].key, last = h[--(*n)].key;
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key < h[c].key) c++;
        if (h[c].key >= last) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i].key = last;
    return top;
}

/* Long words: a linked list and a heap keyed by (rank, position), O(n log n). */
static size_t bpe_long(const kiln_tokenizer *t, int32_t *sym, size_t n) {
    int64_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
    heap_ent *h = malloc(3 * n * sizeof *h);
    size_t hn = 0, out = n;
    if (!next || !prev || !h) goto done; /* leave unmerged: still decodes exactly */
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
        out--;
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
    if (a->n + extra <= a->cap) return true;
    size_t c = a->cap ? a->cap * 2 : 1024;
    while (c < a->n + extra) c *= 2;
    int32_t *p = realloc(a->v, c * sizeof *p);
    if (!p) return false;
    a->v = p;
    a->cap = c;
    return true;
}

typedef struct {
    kd_strmap cache; /* pre-token -> (offset in ids << 16 | count) */
    ivec cached;     /* token ids of cached pre-tokens */
    ivec out;
    int32_t *scratch;
    size_t scratch_cap;
    bool oom;
} encoder;

static bool encoder_init(encoder *e) {
    memset(e, 0, sizeof *e);
    return kd_strmap_init(&e->cache, 4096);
}

static void encoder_free(encoder *e) {
    kd_strmap_free(&e->cache);
    free(e->cached.v);
    free(e->scratch);
}

static void encode_word(const kiln_tokenizer *t, encoder *e, const unsigned char *s, size_t n) {
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        h = kd_hash_bytes(s, n);
        uint64_t *v = kd_strmap_get(&e->cache, (const char *)s, n, h);
        if (v) {
            size_t cnt = *v & 0xffff;
            if (!ivec_reserve(&e->out, cnt)) goto oom;
            memcpy(e->out.v + e->out.n, e->cached.v + (*v >> 16), cnt * sizeof(int32_t));
            e->out.n += cnt;
            return;
        }
    }
    if (!ivec_reserve(&e->out, n)) goto oom;
    int32_t *sym = e->out.v + e->out.n;
    for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[s[i]];
    size_t m = n <= 64 ? bpe_short(t, sym, n) : bpe_long(t, sym, n);
    if (n <= CACHE_MAX_WORD) {
        if (e->cache.n >= CACHE_MAX_ENTRIES) {
            kd_strmap_free(&e->cache);
            e->cached.n = 0;
            if (!kd_strmap_init(&e->cache, 4096)) goto oom;
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
    return;
oom:
    e->oom = true;
}

static void encode_span(const kiln_tokenizer *t, encoder *e, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n && !e->oom) {
        size_t l = kd_pretoken_len(s + i, n - i);
        encode_word(t, e, s + i, l);
        i += l;
    }
}

/* A loaded vocabulary may lack some bytes; text that holds one cannot be
 * encoded exactly, so it is refused. */
static bool has_missing(const kiln_tokenizer *t) {
    bool missing = false;
    for (int b = 0; b < 256; b++) missing |= t->byte_id[b] < 0;
    return missing;
}

static kiln_status check_bytes(const kiln_tokenizer *t, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] < 0)
            return kiln_error(KILN_ERR_INVALID, "byte 0x%02x at offset %zu has no token in the vocabulary", s[i], i);
    return KILN_OK;
}

/* Runs `fn` over `n_parts` parts on up to that many threads, then
 * concatenates the per-part outputs. */
typedef void (*part_fn)(const kiln_tokenizer *t, encoder *e, const void *ctx, int part);

static kiln_status run_parts(const kiln_tokenizer *t, int n_parts, part_fn fn, const void *ctx,
                             int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    encoder *enc = calloc((size_t)n_parts, sizeof *enc);
    if (!enc) return kiln_error(KILN_ERR_OOM, "out of memory encoding");
    int ok = 1;
#pragma omp parallel for num_threads(n_parts) schedule(static, 1) reduction(&& : ok)
    for (int p = 0; p < n_parts; p++) {
        if (!encoder_init(&enc[p])) {
            enc[p].oom = true;
        } else {
            fn(t, &enc[p], ctx, p);
        }
        ok = ok && !enc[p].oom;
    }
    size_t total = 0;
    for (int p = 0; p < n_parts; p++) total += enc[p].out.n;
    int32_t *all = NULL;
    if (ok && total) {
        all = malloc(total * sizeof *all);
        if (!all) ok = 0;
    }
    size_t pos = 0;
    for (int p = 0; p < n_parts; p++) {
        if (all && enc[p].out.n) memcpy(all + pos, enc[p].out.v, enc[p].out.n * sizeof *all);
        pos += enc[p].out.n;
        free(enc[p].out.v);
        encoder_free(&enc[p]);
    }
    free(enc);
    if (!ok) return kiln_error(KILN_ERR_OOM, "out of memory encoding");
    *ids = all;
    *n_ids = total;
    return KILN_OK;
}

typedef struct {
    const unsigned char *s;
    size_t bounds[65];
} text_ctx;

static void text_part(const kiln_tokenizer *t, encoder *e, const void *ctx, int p) {
    const text_ctx *c = ctx;
    encode_span(t, e, c->s + c->bounds[p], c->bounds[p + 1] - c->bounds[p]);
}

static int threads_for(size_t bytes) {
    int n = kiln_num_threads();
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    if (bytes < PAR_MIN_BYTES) return 1;
    if ((size_t)n > bytes / (PAR_MIN_BYTES / 2)) n = (int)(bytes / (PAR_MIN_BYTES / 2));
    return n < 1 ? 1 : n;
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len,
                                  int32_t **ids, size_t *n_ids) {
    text_ctx c;
    c.s = (const unsigned char *)text;
    int n = threads_for(len);
    c.bounds[0] = 0;
    for (int p = 1; p < n; p++) {
        size_t b = kd_chunk_boundary(c.s, len, len / (size_t)n * (size_t)p);
        c.bounds[p] = b < c.bounds[p - 1] ? c.bounds[p - 1] : b;
    }
    c.bounds[n] = len;
    kiln_status st = has_missing(t) ? check_bytes(t, c.s, len) : KILN_OK;
    if (st) return st;
    return run_parts(t, n, text_part, &c, ids, n_ids);
}

typedef struct {
    const unsigned char *s;
    const size_t *starts, *lens;
    int32_t sep;
    size_t first[65]; /* document range of each part */
} docs_ctx;

static void docs_part(const kiln_tokenizer *t, encoder *e, const void *ctx, int p) {
    const docs_ctx *c = ctx;
    for (size_t d = c->first[p]; d < c->first[p + 1] && !e->oom; d++) {
        encode_span(t, e, c->s + c->starts[d], c->lens[d]);
        if (c->sep >= 0) {
            if (!ivec_reserve(&e->out, 1)) {
                e->oom = true;
                break;
            }
            e->out.v[e->out.n++] = c->sep;
        }
    }
}

/* Fewer documents than threads: each document is split across threads. */
static kiln_status encode_few_docs(const kiln_tokenizer *t, const char *text, const size_t *starts,
                                   const size_t *lens, size_t n_docs, int32_t sep, int32_t **ids, size_t *n_ids) {
    ivec all = {0};
    kiln_status st = KILN_OK;
    for (size_t d = 0; d < n_docs && !st; d++) {
        int32_t *one;
        size_t n;
        st = kiln_tokenizer_encode(t, text + starts[d], lens[d], &one, &n);
        if (st) break;
        if (!ivec_reserve(&all, n + 1)) st = kiln_error(KILN_ERR_OOM, "out of memory encoding");
        if (!st && n) memcpy(all.v + all.n, one, n * sizeof *one);
        all.n += st ? 0 : n;
        if (!st && sep >= 0) all.v[all.n++] = sep;
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

kiln_status kiln_tokenizer_encode_docs(const kiln_tokenizer *t, const char *text,
                                       const size_t *starts, const size_t *lens, size_t n_docs,
                                       int32_t sep, int32_t **ids, size_t *n_ids) {
    docs_ctx c = {.s = (const unsigned char *)text, .starts = starts, .lens = lens, .sep = sep};
    size_t total = 0;
    for (size_t d = 0; d < n_docs; d++) total += lens[d];
    int n = threads_for(total);
    if ((size_t)n > n_docs && n_docs > 0) return encode_few_docs(t, text, starts, lens, n_docs, sep, ids, n_ids);
    /* Split the documents into n runs of about equal bytes. */
    size_t d = 0, acc = 0;
    c.first[0] = 0;
    for (int p = 1; p < n; p++) {
        size_t target = total / (size_t)n * (size_t)p;
        while (d < n_docs && acc < target) acc += lens[d++];
        c.first[p] = d;
    }
    c.first[n] = n_docs;
    bool miss = has_missing(t);
    for (size_t k = 0; miss && k < n_docs; k++) {
        kiln_status st = check_bytes(t, c.s + starts[k], lens[k]);
        if (st) return kiln_error_context(st, "document %zu", k);
    }
    return run_parts(t, n, docs_part, &c, ids, n_ids);
}

kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, size_t n,
                                  char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size || t->tok_off[ids[i]] == UNUSED_TOK)
            return kiln_error(KILN_ERR_RANGE, "decode: id %d at position %zu is not in the vocabulary (size %d)",
                              (int)ids[i], i, t->vocab_size);
        total += t->tok_len[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return kiln_error(KILN_ERR_OOM, "out of memory decoding %zu bytes", total);
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + p, t->blob + t->tok_off[ids[i]], t->tok_len[ids[i]]);
        p += t->tok_len[ids[i]];
    }
    s[p] = 0;
    *out = s;
    *len = p;
    return KILN_OK;
}
