/* Decoders (HF decoders/): ByteLevel, Metaspace, ByteFallback, Fuse,
 * Strip, Replace, BPEDecoder and Sequence, each turning a list of token
 * strings into another; and kiln_tokenizer_decode, which feeds them the
 * tokenizer.json strings of the ids, as HF's Tokenizer::decode does.
 * Without KILN_DECODE_LOSSY invalid UTF-8 is returned as bytes where HF
 * would write U+FFFD (so partial sequences stream exactly). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

enum { D_BYTELEVEL, D_METASPACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_REPLACE, D_BPE, D_SEQ };

struct kd_dec {
    int kind;
    uint32_t cp; /* Metaspace replacement, Strip content */
    bool never;  /* Metaspace prepend_scheme == never */
    size_t start, stop;
    kd_pattern pat;
    char *str; /* Replace content, BPEDecoder suffix */
    size_t len;
    kd_dec **kids;
    size_t n_kids;
};

void kd_dec_free(kd_dec *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) kd_dec_free(d->kids[i]);
    free(d->kids);
    kd_pattern_free(&d->pat);
    free(d->str);
    free(d);
}

kd_dec *kd_dec_bytelevel(void) {
    kd_dec *d = calloc(1, sizeof *d);
    if (d) d->kind = D_BYTELEVEL;
    return d;
}

static kiln_status one_char(json_t *j, const char *key, const char *path, const char *where, uint32_t *cp) {
    const char *s;
    size_t n;
    kiln_status st = kd_json_str(j, key, path, where, &s, &n);
    if (st) return st;
    if (n == 0 || kd_utf8_next((const unsigned char *)s, n, cp) != n || *cp == 0xFFFFFFFFu)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s.%s \"%s\" is not one character", path, where, key, s);
    return KILN_OK;
}

static kiln_status get_count(json_t *j, const char *key, const char *path, const char *where, size_t *out) {
    json_t *v = json_object_get(j, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 20))
        return kiln_error(KILN_ERR_FORMAT, "%s: %s.%s is not an integer in [0, %d]", path, where, key, 1 << 20);
    *out = (size_t)json_integer_value(v);
    return KILN_OK;
}

static kiln_status dup_str(json_t *j, const char *key, const char *path, const char *where, kd_dec *d) {
    const char *s;
    size_t n;
    kiln_status st = kd_json_str(j, key, path, where, &s, &n);
    if (st) return st;
    if (!(d->str = malloc(n + 1))) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    memcpy(d->str, s, n + 1);
    d->len = n;
    return KILN_OK;
}

kiln_status kd_dec_parse(json_t *j, const char *path, const char *where, kd_dec **out) {
    *out = NULL;
    if (!j || json_is_null(j)) return KILN_OK;
    if (!json_is_object(j)) return kiln_error(KILN_ERR_FORMAT, "%s: %s is not an object", path, where);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kiln_error(KILN_ERR_FORMAT, "%s: %s has no string \"type\"", path, where);
    kd_dec *d = calloc(1, sizeof *d);
    if (!d) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    kiln_status st;
    char sub[256];
    static const char *const only_type[] = {"type", NULL};
    if (!strcmp(type, "ByteLevel")) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        d->kind = D_BYTELEVEL;
        st = kd_json_keys(j, path, where, keys);
    } else if (!strcmp(type, "Metaspace")) {
        static const char *const keys[] = {"type", "replacement", "add_prefix_space", "prepend_scheme", "split", "str_rep", NULL};
        d->kind = D_METASPACE;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = one_char(j, "replacement", path, where, &d->cp);
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        if (!st && ps && strcmp(ps, "always") && strcmp(ps, "first") && strcmp(ps, "never"))
            st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s.prepend_scheme \"%s\" is not always, first or never", path, where, ps);
        d->never = (ps && !strcmp(ps, "never")) || json_is_false(json_object_get(j, "add_prefix_space"));
    } else if (!strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")) {
        d->kind = type[0] == 'B' ? D_BYTEFALLBACK : D_FUSE;
        st = kd_json_keys(j, path, where, only_type);
    } else if (!strcmp(type, "Strip")) {
        static const char *const keys[] = {"type", "content", "start", "stop", NULL};
        d->kind = D_STRIP;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = one_char(j, "content", path, where, &d->cp);
        if (!st) st = get_count(j, "start", path, where, &d->start);
        if (!st) st = get_count(j, "stop", path, where, &d->stop);
    } else if (!strcmp(type, "Replace")) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        d->kind = D_REPLACE;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = dup_str(j, "content", path, where, d);
        if (!st) st = kd_pattern_parse(&d->pat, json_object_get(j, "pattern"), path, where);
    } else if (!strcmp(type, "BPEDecoder")) {
        static const char *const keys[] = {"type", "suffix", NULL};
        d->kind = D_BPE;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = dup_str(j, "suffix", path, where, d);
    } else if (!strcmp(type, "Sequence")) {
        static const char *const keys[] = {"type", "decoders", NULL};
        json_t *arr = json_object_get(j, "decoders");
        d->kind = D_SEQ;
        st = kd_json_keys(j, path, where, keys);
        if (!st && !json_is_array(arr)) st = kiln_error(KILN_ERR_FORMAT, "%s: %s.decoders is not an array", path, where);
        if (!st && json_array_size(arr) && !(d->kids = calloc(json_array_size(arr), sizeof *d->kids)))
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
        for (size_t i = 0; !st && i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", where, i);
            st = kd_dec_parse(json_array_get(arr, i), path, sub, &d->kids[i]);
            if (!st && !d->kids[i]) st = kiln_error(KILN_ERR_FORMAT, "%s: %s is null", path, sub);
            if (!st) d->n_kids++;
        }
    } else {
        st = kd_unsupported(path, where, "decoder", type);
    }
    if (st) {
        kd_dec_free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

/* ---- token string lists ---- */

typedef struct {
    kd_buf b;
    kd_spans s; /* off/len into b */
} strlist;

static bool sl_push(strlist *l, const char *s, size_t n) {
    size_t off = l->b.n;
    return kd_buf_put(&l->b, s, n) && kd_spans_push(&l->s, off, n, -1, 0);
}

/* appends to the last string (which must be the buffer's tail) */
static bool sl_append(strlist *l, const char *s, size_t n) {
    if (!kd_buf_put(&l->b, s, n)) return false;
    l->s.v[l->s.n - 1].len += n;
    return true;
}

static void sl_free(strlist *l) {
    kd_buf_free(&l->b);
    kd_spans_free(&l->s);
}

#define TOK(l, i) ((l)->b.p + (l)->s.v[i].off)
#define LEN(l, i) ((l)->s.v[i].len)

static int16_t g_char_byte[512]; /* GPT-2 code point -> byte, -1 */
static uint32_t g_byte_char[256];

static void build_tables(void) {
    kd_byte_to_unicode(g_byte_char);
    for (int i = 0; i < 512; i++) g_char_byte[i] = -1;
    for (int b = 0; b < 256; b++) g_char_byte[g_byte_char[b]] = (int16_t)b;
}

static void init_tables(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_tables);
}

static bool byte_level(const strlist *in, bool lossy, strlist *out) {
    kd_buf raw = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < in->s.n; i++) {
        const unsigned char *s = (const unsigned char *)TOK(in, i);
        size_t n = LEN(in, i), start = raw.n;
        for (size_t k = 0; ok && k < n;) {
            uint32_t cp;
            size_t l = kd_utf8_next(s + k, n - k, &cp);
            if (cp >= 512 || g_char_byte[cp] < 0) { /* a char outside the map: the token's own bytes */
                raw.n = start;
                ok = kd_buf_put(&raw, s, n);
                break;
            }
            char b = (char)g_char_byte[cp];
            ok = kd_buf_put(&raw, &b, 1);
            k += l;
        }
    }
    if (ok) ok = sl_push(out, "", 0);
    if (ok) {
        if (lossy) {
            size_t before = out->b.n;
            ok = kd_utf8_lossy(raw.p ? raw.p : "", raw.n, &out->b);
            out->s.v[out->s.n - 1].len = out->b.n - before;
        } else {
            ok = sl_append(out, raw.p ? raw.p : "", raw.n);
        }
    }
    kd_buf_free(&raw);
    return ok;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "<0xAB>" -> 0xAB, else -1 (u8::from_str_radix also takes "+A") */
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int a = hexval(s[3]), b = hexval(s[4]);
    if (s[3] == '+' && b >= 0) return b;
    return a >= 0 && b >= 0 ? a * 16 + b : -1;
}

static bool flush_bytes(kd_buf *bytes, bool lossy, strlist *out) {
    if (!bytes->n) return true;
    bool ok = true;
    bool valid = true;
    for (size_t i = 0; i < bytes->n && valid;) {
        uint32_t cp;
        i += kd_utf8_next((const unsigned char *)bytes->p + i, bytes->n - i, &cp);
        valid = cp != 0xFFFFFFFFu;
    }
    if (valid || !lossy) ok = sl_push(out, bytes->p, bytes->n);
    else
        for (size_t i = 0; ok && i < bytes->n; i++) ok = sl_push(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
    return ok;
}

static bool byte_fallback(const strlist *in, bool lossy, strlist *out) {
    kd_buf bytes = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < in->s.n; i++) {
        int b = fallback_byte(TOK(in, i), LEN(in, i));
        if (b >= 0) {
            char c = (char)b;
            ok = kd_buf_put(&bytes, &c, 1);
            continue;
        }
        ok = flush_bytes(&bytes, lossy, out) && sl_push(out, TOK(in, i), LEN(in, i));
    }
    if (ok) ok = flush_bytes(&bytes, lossy, out);
    kd_buf_free(&bytes);
    return ok;
}

static bool strip(const kd_dec *d, const strlist *in, strlist *out) {
    bool ok = true;
    for (size_t i = 0; ok && i < in->s.n; i++) {
        const unsigned char *s = (const unsigned char *)TOK(in, i);
        size_t n = LEN(in, i), a = 0, e = n;
        uint32_t cp;
        for (size_t k = 0; k < d->start && a < n; k++) {
            size_t l = kd_utf8_next(s + a, n - a, &cp);
            if (cp != d->cp) break;
            a += l;
        }
        for (size_t k = 0; k < d->stop && e > a; k++) {
            size_t b = e - 1;
            while (b > a && e - b < 4 && (s[b] & 0xC0) == 0x80) b--;
            if (b + kd_utf8_next(s + b, e - b, &cp) != e) cp = 0xFFFFFFFFu;
            if (cp != d->cp) break;
            e = b;
        }
        ok = sl_push(out, (const char *)s + a, e - a);
    }
    return ok;
}

static bool run(const kd_dec *d, kd_work *w, strlist *in, bool lossy, strlist *out, kiln_status *st);

static bool run_one(const kd_dec *d, kd_work *w, strlist *in, bool lossy, strlist *out, kiln_status *st) {
    bool ok = true;
    switch (d->kind) {
    case D_BYTELEVEL: return byte_level(in, lossy, out);
    case D_BYTEFALLBACK: return byte_fallback(in, lossy, out);
    case D_FUSE:
        ok = sl_push(out, "", 0);
        for (size_t i = 0; ok && i < in->s.n; i++) ok = sl_append(out, TOK(in, i), LEN(in, i));
        return ok;
    case D_STRIP: return strip(d, in, out);
    case D_METASPACE:
        for (size_t i = 0; ok && i < in->s.n; i++) {
            const unsigned char *s = (const unsigned char *)TOK(in, i);
            size_t n = LEN(in, i), run_start = 0, k = 0;
            ok = sl_push(out, "", 0);
            while (ok && k < n) {
                uint32_t cp;
                size_t l = kd_utf8_next(s + k, n - k, &cp);
                if (cp == d->cp) {
                    ok = sl_append(out, (const char *)s + run_start, k - run_start);
                    if (ok && (i != 0 || d->never)) ok = sl_append(out, " ", 1);
                    run_start = k + l;
                }
                k += l;
            }
            if (ok) ok = sl_append(out, (const char *)s + run_start, n - run_start);
        }
        return ok;
    case D_REPLACE:
        if (!w->md && !kd_work_init(w)) return false; /* made on first use: decoding runs per generated token */
        for (size_t i = 0; ok && i < in->s.n; i++) {
            /* the token is copied: matching writes w->ev, not `in` */
            if ((*st = kd_pattern_find(&d->pat, w, TOK(in, i), LEN(in, i)))) return false;
            ok = sl_push(out, "", 0);
            for (size_t k = 0; ok && k < w->ev.n; k++) {
                const kd_event *e = &w->ev.v[k];
                ok = e->match ? sl_append(out, d->str, d->len) : sl_append(out, TOK(in, i) + e->s, e->e - e->s);
            }
        }
        return ok;
    case D_BPE:
        for (size_t i = 0; ok && i < in->s.n; i++) {
            const char *s = TOK(in, i);
            size_t n = LEN(in, i), p = 0;
            ok = sl_push(out, "", 0);
            while (ok && p < n) {
                const char *f = d->len && n - p >= d->len ? memmem(s + p, n - p, d->str, d->len) : NULL;
                size_t e = f ? (size_t)(f - s) : n;
                ok = sl_append(out, s + p, e - p);
                if (ok && f) ok = i + 1 == in->s.n ? true : sl_append(out, " ", 1);
                p = f ? e + d->len : n;
            }
        }
        return ok;
    case D_SEQ: return run(d, w, in, lossy, out, st);
    }
    return false;
}

static bool run(const kd_dec *d, kd_work *w, strlist *in, bool lossy, strlist *out, kiln_status *st) {
    if (d->kind != D_SEQ) return run_one(d, w, in, lossy, out, st);
    strlist a = {0}, b = {0};
    strlist *cur = in;
    bool ok = true;
    for (size_t i = 0; ok && i < d->n_kids; i++) {
        strlist *dst = cur == &a ? &b : &a;
        dst->b.n = 0;
        dst->s.n = 0;
        ok = run_one(d->kids[i], w, cur, lossy, dst, st);
        cur = dst;
    }
    for (size_t i = 0; ok && i < cur->s.n; i++) ok = sl_push(out, TOK(cur, i), LEN(cur, i));
    sl_free(&a);
    sl_free(&b);
    return ok;
}

/* The tokenizer.json string of token `id`. */
static bool token_string(const kiln_tokenizer *t, int32_t id, strlist *l) {
    const char *s = t->blob + t->tok_off[id];
    size_t n = t->tok_len[id];
    if (!t->byte_level || (t->tok_flags[id] & KD_TOK_TEXT)) return sl_push(l, s, n);
    if (!sl_push(l, "", 0)) return false;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        size_t k = kd_utf8_put(u, g_byte_char[(unsigned char)s[i]]);
        if (!sl_append(l, u, k)) return false;
    }
    return true;
}

kiln_status kiln_tokenizer_decode_ex(const kiln_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                                     size_t *len) {
    *out = NULL;
    *len = 0;
    init_tables();
    strlist toks = {0}, res = {0};
    kd_work w;
    memset(&w, 0, sizeof w);
    kiln_status st = KILN_OK;
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size || t->tok_off[ids[i]] == UINT64_MAX) {
            st = kiln_error(KILN_ERR_RANGE, "decode: id %d at position %zu is not in the vocabulary (size %d)",
                            (int)ids[i], i, t->vocab_size);
            break;
        }
        if ((flags & KILN_DECODE_SKIP_SPECIAL) && (t->tok_flags[ids[i]] & KD_TOK_SPECIAL)) continue;
        ok = token_string(t, ids[i], &toks);
    }
    if (!st && ok) {
        if (t->dec) {
            ok = run(t->dec, &w, &toks, (flags & KILN_DECODE_LOSSY) != 0, &res, &st);
        } else { /* HF joins the tokens with spaces */
            ok = sl_push(&res, "", 0);
            for (size_t i = 0; ok && i < toks.s.n; i++)
                ok = (i == 0 || sl_append(&res, " ", 1)) && sl_append(&res, TOK(&toks, i), LEN(&toks, i));
        }
    }
    kd_buf all = {0};
    for (size_t i = 0; !st && ok && i < res.s.n; i++) ok = kd_buf_put(&all, TOK(&res, i), LEN(&res, i));
    if (!st && ok) ok = kd_buf_reserve(&all, 0);
    sl_free(&toks);
    sl_free(&res);
    kd_work_free(&w);
    if (!st && !ok) st = kiln_error(KILN_ERR_OOM, "out of memory decoding");
    if (st) {
        kd_buf_free(&all);
        return st;
    }
    all.p[all.n] = 0;
    *out = all.p;
    *len = all.n;
    return KILN_OK;
}

kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    return kiln_tokenizer_decode_ex(t, ids, n, 0, out, len);
}
