/* BPE training: pre-token frequencies are counted once (in parallel, one
 * hash table per thread), then merges run over the unique words with pair
 * counts that are updated incrementally, an index from each pair to the
 * words that contain it, and a max-heap with lazy deletion. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

typedef struct { int32_t *v; uint32_t n, cap; } occ_list;

typedef struct {
    int64_t cnt;
    uint64_t key; /* left << 32 | right: ties go to the smaller key */
    uint32_t p;
} hent;

typedef struct {
    /* words */
    size_t n_words;
    int32_t *sym;       /* all words' symbols, word w at woff[w] */
    size_t *woff;
    uint32_t *wlen;
    int64_t *wcnt;
    uint32_t *wstamp;   /* last merge that visited the word */
    /* pairs */
    kd_map64 pair_ix;   /* key -> pair index */
    int64_t *pcnt;
    uint64_t *pkey;
    occ_list *pocc;
    size_t n_pairs, pair_cap;
    /* heap */
    hent *heap;
    size_t hn, hcap;
    /* new pairs of the current merge */
    uint32_t *touched;
    size_t n_touched, touched_cap;
    uint8_t *is_touched;
    bool oom;
} trainer;

static bool hless(const hent *a, const hent *b) { /* a before b */
    return a->cnt > b->cnt || (a->cnt == b->cnt && a->key < b->key);
}

static void hpush(trainer *T, int64_t cnt, uint32_t p) {
    if (T->hn == T->hcap) {
        size_t c = T->hcap ? T->hcap * 2 : 1024;
        hent *h = realloc(T->heap, c * sizeof *h);
        if (!h) {
            T->oom = true;
            return;
        }
        T->heap = h;
        T->hcap = c;
    }
    hent e = {cnt, T->pkey[p], p};
    size_t i = T->hn++;
    while (i > 0 && hless(&e, &T->heap[(i - 1) / 2])) {
        T->heap[i] = T->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    T->heap[i] = e;
}

static hent hpop(trainer *T) {
    hent top = T->heap[0], last = T->heap[--T->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= T->hn) break;
        if (c + 1 < T->hn && hless(&T->heap[c + 1], &T->heap[c])) c++;
        if (!hless(&T->heap[c], &last)) break;
        T->heap[i] = T->heap[c];
        i = c;
    }
    if (T->hn) T->heap[i] = last;
    return top;
}

static uint32_t pair_index(trainer *T, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    bool ins;
    uint64_t *v = kd_map64_put(&T->pair_ix, key, T->n_pairs, &ins);
    if (!v) {
        T->oom = true;
        return 0;
    }
    if (!ins) return (uint32_t)*v;
    if (T->n_pairs == T->pair_cap) {
        size_t c = T->pair_cap ? T->pair_cap * 2 : 4096;
        int64_t *pc = realloc(T->pcnt, c * sizeof *pc);
        if (pc) T->pcnt = pc;
        uint64_t *pk = realloc(T->pkey, c * sizeof *pk);
        if (pk) T->pkey = pk;
        occ_list *po = realloc(T->pocc, c * sizeof *po);
        if (po) T->pocc = po;
        uint8_t *it = realloc(T->is_touched, c);
        if (it) T->is_touched = it;
        if (!pc || !pk || !po || !it) {
            T->oom = true;
            return 0;
        }
        T->pair_cap = c;
    }
    uint32_t p = (uint32_t)T->n_pairs++;
    T->pcnt[p] = 0;
    T->pkey[p] = key;
    memset(&T->pocc[p], 0, sizeof T->pocc[p]);
    T->is_touched[p] = 0;
    return p;
}

static void occ_add(trainer *T, uint32_t p, int32_t w) {
    occ_list *o = &T->pocc[p];
    if (o->n && o->v[o->n - 1] == w) return;
    if (o->n == o->cap) {
        uint32_t c = o->cap ? o->cap * 2 : 4;
        int32_t *v = realloc(o->v, c * sizeof *v);
        if (!v) {
            T->oom = true;
            return;
        }
        o->v = v;
        o->cap = c;
    }
    o->v[o->n++] = w;
}

/* Adds sign * count of word w to each of its pairs; with sign > 0, pairs
 * holding `fresh` are indexed and remembered for the heap. */
static void word_pairs(trainer *T, size_t w, int sign, int32_t fresh) {
    const int32_t *s = T->sym + T->woff[w];
    for (uint32_t i = 0; i + 1 < T->wlen[w] && !T->oom; i++) {
        uint32_t p = pair_index(T, s[i], s[i + 1]);
        if (T->oom) return;
        T->pcnt[p] += sign * T->wcnt[w];
        if (sign > 0 && (s[i] == fresh || s[i + 1] == fresh)) {
            occ_add(T, p, (int32_t)w);
            if (!T->is_touched[p]) {
                if (T->n_touched == T->touched_cap) {
                    uint32_t *tv = realloc(T->touched, 2 * T->touched_cap * sizeof *tv);
                    if (!tv) {
                        T->oom = true;
                        return;
                    }
                    T->touched = tv;
                    T->touched_cap *= 2;
                }
                T->is_touched[p] = 1;
                T->touched[T->n_touched++] = p;
            }
        }
    }
}

static bool word_has(const trainer *T, size_t w, int32_t a, int32_t b) {
    const int32_t *s = T->sym + T->woff[w];
    for (uint32_t i = 0; i + 1 < T->wlen[w]; i++)
        if (s[i] == a && s[i + 1] == b) return true;
    return false;
}

static void word_merge(trainer *T, size_t w, int32_t a, int32_t b, int32_t c) {
    int32_t *s = T->sym + T->woff[w];
    uint32_t o = 0, n = T->wlen[w];
    for (uint32_t i = 0; i < n; i++) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            s[o++] = c;
            i++;
        } else {
            s[o++] = s[i];
        }
    }
    T->wlen[w] = o;
}

static void apply_merge(trainer *T, uint32_t p, int32_t c, uint32_t stamp) {
    int32_t a = (int32_t)(T->pkey[p] >> 32), b = (int32_t)(uint32_t)T->pkey[p];
    occ_list occ = T->pocc[p];
    memset(&T->pocc[p], 0, sizeof T->pocc[p]);
    T->n_touched = 0;
    for (uint32_t k = 0; k < occ.n && !T->oom; k++) {
        size_t w = (size_t)occ.v[k];
        if (T->wstamp[w] == stamp || !word_has(T, w, a, b)) continue;
        T->wstamp[w] = stamp;
        word_pairs(T, w, -1, -1);
        word_merge(T, w, a, b, c);
        word_pairs(T, w, +1, c);
    }
    free(occ.v);
    for (size_t k = 0; k < T->n_touched; k++) {
        uint32_t q = T->touched[k];
        T->is_touched[q] = 0;
        if (T->pcnt[q] > 0) hpush(T, T->pcnt[q], q);
    }
}

static void trainer_free(trainer *T) {
    free(T->sym);
    free(T->woff);
    free(T->wlen);
    free(T->wcnt);
    free(T->wstamp);
    kd_map64_free(&T->pair_ix);
    for (size_t p = 0; p < T->n_pairs; p++) free(T->pocc[p].v);
    free(T->pcnt);
    free(T->pkey);
    free(T->pocc);
    free(T->heap);
    free(T->touched);
    free(T->is_touched);
}

static kiln_status trainer_init(trainer *T, const kd_strmap *words) {
    memset(T, 0, sizeof *T);
    T->n_words = words->n;
    size_t total = words->alen > 0 ? words->alen : 1;
    T->sym = malloc(total * sizeof *T->sym);
    T->woff = malloc((words->n + 1) * sizeof *T->woff);
    T->wlen = malloc((words->n + 1) * sizeof *T->wlen);
    T->wcnt = malloc((words->n + 1) * sizeof *T->wcnt);
    T->wstamp = calloc(words->n + 1, sizeof *T->wstamp);
    T->touched_cap = 1 << 16;
    T->touched = malloc(T->touched_cap * sizeof *T->touched);
    if (!T->sym || !T->woff || !T->wlen || !T->wcnt || !T->wstamp || !T->touched ||
        !kd_map64_init(&T->pair_ix, 1 << 16))
        return kiln_error(KILN_ERR_OOM, "out of memory for BPE training");
    for (size_t w = 0; w < words->n; w++) {
        size_t n;
        const unsigned char *k = (const unsigned char *)kd_strmap_key(words, w, &n);
        T->woff[w] = words->offs[w];
        T->wlen[w] = (uint32_t)n;
        T->wcnt[w] = (int64_t)words->vals[w];
        for (size_t i = 0; i < n; i++) T->sym[T->woff[w] + i] = KILN_TOK_BYTE0 + k[i];
    }
    for (size_t w = 0; w < words->n && !T->oom; w++) {
        const int32_t *s = T->sym + T->woff[w];
        for (uint32_t i = 0; i + 1 < T->wlen[w] && !T->oom; i++) {
            uint32_t p = pair_index(T, s[i], s[i + 1]);
            if (T->oom) break;
            T->pcnt[p] += T->wcnt[w];
            occ_add(T, p, (int32_t)w);
        }
    }
    for (size_t p = 0; p < T->n_pairs && !T->oom; p++) hpush(T, T->pcnt[p], (uint32_t)p);
    return T->oom ? kiln_error(KILN_ERR_OOM, "out of memory for BPE training") : KILN_OK;
}

/* Runs the merges on the counted words and builds the tokenizer. */
static kiln_status train_words(const kd_strmap *words, int vocab_size, kiln_tokenizer **out) {
    trainer T;
    kiln_status st = trainer_init(&T, words);
    int n_merges = 0, want = vocab_size - KILN_TOK_BASE_VOCAB;
    int32_t(*merges)[2] = malloc((size_t)(want > 0 ? want : 1) * sizeof *merges);
    if (!st && !merges) st = kiln_error(KILN_ERR_OOM, "out of memory for BPE training");
    double t0 = kiln_time_now();
    while (!st && n_merges < want && T.hn && !T.oom) {
        hent e = hpop(&T);
        if (e.cnt != T.pcnt[e.p]) {
            if (T.pcnt[e.p] > 0) hpush(&T, T.pcnt[e.p], e.p);
            continue;
        }
        if (e.cnt <= 0) continue;
        merges[n_merges][0] = (int32_t)(e.key >> 32);
        merges[n_merges][1] = (int32_t)(uint32_t)e.key;
        apply_merge(&T, e.p, KILN_TOK_BASE_VOCAB + n_merges, (uint32_t)n_merges + 1);
        n_merges++;
        if (n_merges % 1000 == 0)
            kiln_log(KILN_LOG_DEBUG, "bpe: %d merges, %.1f s", n_merges, kiln_time_now() - t0);
    }
    if (!st && T.oom) st = kiln_error(KILN_ERR_OOM, "out of memory for BPE training");
    trainer_free(&T);
    kiln_tokenizer *t = st ? NULL : kd_tok_new_base(KILN_TOK_BASE_VOCAB + n_merges);
    if (!st && !t) st = kiln_error(KILN_ERR_OOM, "out of memory for the tokenizer");
    for (int r = 0; !st && r < n_merges; r++) {
        size_t la, lb;
        const char *a = kiln_tokenizer_token(t, merges[r][0], &la);
        const char *b = kiln_tokenizer_token(t, merges[r][1], &lb);
        char *buf = malloc(la + lb + 1);
        if (!buf) {
            st = kiln_error(KILN_ERR_OOM, "out of memory for the tokenizer");
            break;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        st = kd_tok_set(t, KILN_TOK_BASE_VOCAB + r, buf, la + lb, KD_TOK_MODEL);
        free(buf);
        if (!st) st = kd_tok_add_merge(t, merges[r][0], merges[r][1], KILN_TOK_BASE_VOCAB + r);
    }
    free(merges);
    if (st) {
        kiln_tokenizer_free(t);
        return st;
    }
    if (n_merges < want)
        kiln_log(KILN_LOG_WARN, "bpe: the text only supports %d merges; vocabulary size is %d, not %d",
                 n_merges, KILN_TOK_BASE_VOCAB + n_merges, vocab_size);
    *out = t;
    return KILN_OK;
}

/* ---- counting pre-tokens ---- */

/* Words are counted with the pipeline the saved tokenizer.json declares
 * (its special tokens split first, then ByteLevel with the GPT-2 regex), so
 * training sees the words that encoding (kiln's or HF's) will see. */
static bool count_word(void *ctx, const char *s, size_t n) {
    kd_strmap *m = ctx;
    uint64_t *v = kd_strmap_put(m, s, n, kiln_hash_bytes(s, n), 0, NULL);
    if (!v) return false;
    (*v)++;
    return true;
}

/* Adds the pre-token counts of text into `words`, on kiln_num_threads(). */
static kiln_status count_text(kd_strmap *words, const char *text, size_t len) {
    kiln_tokenizer *base = kd_tok_new_base(KILN_TOK_BASE_VOCAB);
    if (!base) return kiln_error(KILN_ERR_OOM, "out of memory");
    const unsigned char *s = (const unsigned char *)text;
    int n = kiln_num_threads();
    if (n < 1) n = 1;
    if (n > 16) n = 16;
    if (len < (1u << 20)) n = 1;
    size_t bounds[17];
    bounds[0] = 0;
    for (int p = 1; p < n; p++) {
        size_t b = kd_chunk_boundary(s, len, len / (size_t)n * (size_t)p);
        bounds[p] = b < bounds[p - 1] ? bounds[p - 1] : b;
    }
    bounds[n] = len;
    kd_strmap local[16];
    kiln_status sts[16] = {0};
    char msg[16][256];
#pragma omp parallel for num_threads(n) schedule(static, 1)
    for (int p = 0; p < n; p++) {
        kd_work w;
        if (!kd_strmap_init(&local[p], 1 << 14) || !kd_work_init(&w)) {
            sts[p] = KILN_ERR_OOM;
            snprintf(msg[p], sizeof msg[p], "out of memory counting pre-tokens");
            continue;
        }
        sts[p] = kd_tok_words(base, &w, text + bounds[p], bounds[p + 1] - bounds[p], count_word, &local[p]);
        if (sts[p]) snprintf(msg[p], sizeof msg[p], "%s", kiln_last_error());
        kd_work_free(&w);
    }
    kiln_status st = KILN_OK;
    for (int p = 0; p < n; p++) {
        if (sts[p] && !st) st = kiln_error(sts[p], "%s", msg[p]);
        for (size_t e = 0; !st && e < local[p].n; e++) {
            size_t kl;
            const char *k = kd_strmap_key(&local[p], e, &kl);
            uint64_t *v = kd_strmap_put(words, k, kl, local[p].hashes[e], 0, NULL);
            if (!v) st = kiln_error(KILN_ERR_OOM, "out of memory counting pre-tokens");
            else *v += local[p].vals[e];
        }
        kd_strmap_free(&local[p]);
    }
    kiln_tokenizer_free(base);
    return st;
}

static kiln_status check_size(int vocab_size) {
    if (vocab_size < KILN_TOK_BASE_VOCAB || vocab_size > (1 << 24))
        return kiln_error(KILN_ERR_INVALID, "vocab size %d: must be in [%d, %d] (3 specials + 256 bytes + merges)",
                          vocab_size, KILN_TOK_BASE_VOCAB, 1 << 24);
    return KILN_OK;
}

kiln_status kiln_tokenizer_train_text(const char *text, size_t len, int vocab_size, kiln_tokenizer **out) {
    *out = NULL;
    kiln_status st = check_size(vocab_size);
    if (st) return st;
    kd_strmap words;
    if (!kd_strmap_init(&words, 1 << 14)) return kiln_error(KILN_ERR_OOM, "out of memory");
    st = count_text(&words, text, len);
    if (!st) st = train_words(&words, vocab_size, out);
    kd_strmap_free(&words);
    return st;
}

kiln_status kiln_tokenizer_train(const char *const *paths, int n_paths, int vocab_size, kiln_tokenizer **out) {
    *out = NULL;
    kiln_status st = check_size(vocab_size);
    if (st) return st;
    kd_strmap words;
    if (!kd_strmap_init(&words, 1 << 14)) return kiln_error(KILN_ERR_OOM, "out of memory");
    double t0 = kiln_time_now();
    size_t bytes = 0;
    for (int i = 0; i < n_paths && !st; i++) {
        char *text;
        size_t n;
        st = kiln_read_file(paths[i], &text, &n);
        if (st) {
            kiln_error_context(st, "reading corpus %s", paths[i]);
            break;
        }
        st = count_text(&words, text, n);
        free(text);
        bytes += n;
        kiln_log(KILN_LOG_INFO, "bpe: counted %s (%.1f MB, %zu unique pre-tokens so far)", paths[i], n / 1e6, words.n);
    }
    if (!st) {
        kiln_log(KILN_LOG_INFO, "bpe: %.1f MB counted in %.2f s; learning %d merges", bytes / 1e6,
                 kiln_time_now() - t0, vocab_size - KILN_TOK_BASE_VOCAB);
        st = train_words(&words, vocab_size, out);
    }
    kd_strmap_free(&words);
    return st;
}
