/* Added tokens, matched before anything else (HF AddedVocabulary): tokens
 * with normalized=false against the raw text, the others against the
 * normalized text (their content normalized the same way). Matching is
 * leftmost-longest and non-overlapping, as HF's Aho-Corasick automaton
 * with MatchKind::LeftmostLongest; single_word, lstrip and rstrip then act
 * on each match. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

typedef struct {
    kd_map64 edges;   /* node << 8 | byte -> child node */
    int32_t *term;    /* node -> definition index, -1 */
    size_t n_nodes, cap;
    uint8_t first[256];
    bool any;
} trie;

struct kd_added {
    kd_added_def *defs;
    size_t n;
    char *text; /* the contents, copied */
    trie raw, norm;
    pcre2_code *word_re; /* Rust regex's \w, for single_word */
};

static bool trie_init(trie *t) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->term = malloc(t->cap * sizeof *t->term);
    if (!t->term || !kd_map64_init(&t->edges, 64)) return false;
    t->term[0] = -1;
    t->n_nodes = 1;
    return true;
}

static void trie_free(trie *t) {
    kd_map64_free(&t->edges);
    free(t->term);
}

static bool trie_add(trie *t, const char *s, size_t n, int32_t def) {
    if (n == 0) return true; /* an empty pattern never splits anything */
    size_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)node << 8 | (unsigned char)s[i];
        bool ins;
        uint64_t *v = kd_map64_put(&t->edges, key, t->n_nodes, &ins);
        if (!v) return false;
        if (ins) {
            if (t->n_nodes == t->cap) {
                if (t->cap > SIZE_MAX / 2 / sizeof *t->term) return false;
                int32_t *q = realloc(t->term, 2 * t->cap * sizeof *q);
                if (!q) return false;
                t->term = q;
                t->cap *= 2;
            }
            t->term[t->n_nodes++] = -1;
        }
        node = (size_t)*v;
    }
    if (t->term[node] < 0) t->term[node] = def; /* same content twice: the first wins */
    t->first[(unsigned char)s[0]] = 1;
    t->any = true;
    return true;
}

/* Longest pattern starting at s[0]: its end, or 0. */
static size_t trie_longest(const trie *t, const char *s, size_t n, int32_t *def) {
    size_t node = 0, best = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t *v = kd_map64_get(&t->edges, (uint64_t)node << 8 | (unsigned char)s[i]);
        if (!v) break;
        node = (size_t)*v;
        if (t->term[node] >= 0) {
            best = i + 1;
            *def = t->term[node];
        }
    }
    return best;
}

void kd_added_free(kd_added *a) {
    if (!a) return;
    free(a->defs);
    free(a->text);
    trie_free(&a->raw);
    trie_free(&a->norm);
    pcre2_code_free(a->word_re);
    free(a);
}

kiln_status kd_added_build(const kd_added_def *defs, size_t n, const kd_norm *norm, kd_added **out) {
    *out = NULL;
    kd_added *a = calloc(1, sizeof *a);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += defs[i].len;
    if (!a || !trie_init(&a->raw) || !trie_init(&a->norm) || !(a->defs = calloc(n ? n : 1, sizeof *a->defs)) ||
        !(a->text = malloc(total + 1))) {
        kd_added_free(a);
        return kiln_error(KILN_ERR_OOM, "out of memory for added tokens");
    }
    kd_work w;
    kd_buf nb = {0};
    bool have_work = false;
    kiln_status st = KILN_OK;
    size_t pos = 0;
    for (size_t i = 0; i < n && !st; i++) {
        a->defs[i] = defs[i];
        memcpy(a->text + pos, defs[i].content, defs[i].len);
        a->defs[i].content = a->text + pos;
        pos += defs[i].len;
        if (defs[i].single_word && !a->word_re) {
            int err;
            PCRE2_SIZE eo;
            a->word_re = pcre2_compile((PCRE2_SPTR) "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                                       PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &eo, NULL);
            if (!a->word_re) st = kiln_error(KILN_ERR_INVALID, "added tokens: cannot compile the word class");
        }
        if (st) break;
        if (!defs[i].normalized) {
            if (!trie_add(&a->raw, a->defs[i].content, defs[i].len, (int32_t)i)) st = kiln_error(KILN_ERR_OOM, "out of memory");
            continue;
        }
        const char *pat = a->defs[i].content;
        size_t plen = defs[i].len;
        if (norm) {
            if (!have_work && !(have_work = kd_work_init(&w))) {
                st = kiln_error(KILN_ERR_OOM, "out of memory");
                break;
            }
            if ((st = kd_norm_apply(norm, &w, pat, plen, &nb))) break;
            pat = nb.p ? nb.p : "";
            plen = nb.n;
        }
        if (!trie_add(&a->norm, pat, plen, (int32_t)i)) st = kiln_error(KILN_ERR_OOM, "out of memory");
    }
    a->n = n;
    if (have_work) kd_work_free(&w);
    kd_buf_free(&nb);
    if (st) {
        kd_added_free(a);
        return st;
    }
    *out = a;
    return KILN_OK;
}

bool kd_added_has(const kd_added *a, bool normalized) {
    return a && (normalized ? a->norm.any : a->raw.any);
}

bool kd_added_any_space(const kd_added *a) {
    for (size_t i = 0; a && i < a->n; i++)
        if (memchr(a->defs[i].content, ' ', a->defs[i].len)) return true;
    return false;
}

/* Start of the char that ends at s[i] (i > 0). */
static size_t char_start(const char *s, size_t i) {
    size_t b = i - 1;
    while (b > 0 && i - b < 4 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    uint32_t cp;
    if (b + kd_utf8_next((const unsigned char *)s + b, i - b, &cp) != i) b = i - 1;
    return b;
}

static bool is_word(const kd_added *a, const char *s, size_t n) {
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return false;
    int rc = pcre2_match(a->word_re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc > 0;
}

kiln_status kd_added_split(const kd_added *a, bool normalized, const char *s, size_t n, size_t base,
                           uint32_t flags, kd_spans *out) {
    const trie *t = normalized ? &a->norm : &a->raw;
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        if (!t->first[(unsigned char)s[pos]]) {
            pos++;
            continue;
        }
        int32_t def = -1;
        size_t len = trie_longest(t, s + pos, n - pos, &def);
        if (!len) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + len;
        pos = stop; /* the automaton's matches do not overlap, kept or not */
        const kd_added_def *d = &a->defs[def];
        if (d->single_word) {
            bool start_space = start == 0, stop_space = stop == n;
            if (!start_space) {
                size_t b = char_start(s, start);
                start_space = !is_word(a, s + b, start - b);
            }
            if (!stop_space) {
                uint32_t cp;
                size_t l = kd_utf8_next((const unsigned char *)s + stop, n - stop, &cp);
                stop_space = !is_word(a, s + stop, l);
            }
            if (!start_space || !stop_space) continue;
        }
        if (d->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t b = char_start(s, ns);
                uint32_t cp;
                kd_utf8_next((const unsigned char *)s + b, ns - b, &cp);
                if (!kd_is_whitespace(cp)) break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (d->rstrip) {
            while (stop < n) {
                uint32_t cp;
                size_t l = kd_utf8_next((const unsigned char *)s + stop, n - stop, &cp);
                if (!kd_is_whitespace(cp)) break;
                stop += l;
            }
        }
        if (start_offset < start &&
            !kd_spans_push(out, base + start_offset, start - start_offset, -1, start_offset == 0 ? flags : flags & ~KD_AT0))
            return kiln_error(KILN_ERR_OOM, "out of memory");
        if (!kd_spans_push(out, base + start, stop - start, d->id, 0)) return kiln_error(KILN_ERR_OOM, "out of memory");
        start_offset = stop;
    }
    if (start_offset < n &&
        !kd_spans_push(out, base + start_offset, n - start_offset, -1, start_offset == 0 ? flags : flags & ~KD_AT0))
        return kiln_error(KILN_ERR_OOM, "out of memory");
    return KILN_OK;
}
