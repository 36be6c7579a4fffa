/* Normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip and
 * Sequence, with HF's semantics (normalizers/). Unicode data comes from
 * utf8proc. Invalid UTF-8 (which HF never sees: its input is a Rust String)
 * passes through unchanged. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "tokenizer_impl.h"

enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_LOWER, N_PREPEND, N_REPLACE, N_STRIP, N_SEQ };

struct kd_norm {
    int kind;
    char *str; /* Prepend: prepend; Replace: content */
    size_t len;
    kd_pattern pat;
    bool left, right;
    kd_norm **kids;
    size_t n_kids;
};

void kd_norm_free(kd_norm *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_kids; i++) kd_norm_free(n->kids[i]);
    free(n->kids);
    free(n->str);
    kd_pattern_free(&n->pat);
    free(n);
}

static kiln_status copy_str(json_t *obj, const char *key, const char *path, const char *where, kd_norm *n) {
    const char *s;
    size_t len;
    kiln_status st = kd_json_str(obj, key, path, where, &s, &len);
    if (st) return st;
    n->str = malloc(len + 1);
    if (!n->str) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    memcpy(n->str, s, len + 1);
    n->len = len;
    return KILN_OK;
}

kiln_status kd_norm_parse(json_t *j, const char *path, const char *where, kd_norm **out) {
    *out = NULL;
    if (!j || json_is_null(j)) return KILN_OK;
    if (!json_is_object(j)) return kiln_error(KILN_ERR_FORMAT, "%s: %s is not an object", path, where);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kiln_error(KILN_ERR_FORMAT, "%s: %s has no string \"type\"", path, where);
    kd_norm *n = calloc(1, sizeof *n);
    if (!n) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    static const char *const only_type[] = {"type", NULL};
    kiln_status st = KILN_OK;
    char sub[256];
    if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD") ||
        !strcmp(type, "Lowercase")) {
        n->kind = !strcmp(type, "NFC") ? N_NFC : !strcmp(type, "NFD") ? N_NFD : !strcmp(type, "NFKC") ? N_NFKC
                  : !strcmp(type, "NFKD") ? N_NFKD : N_LOWER;
        st = kd_json_keys(j, path, where, only_type);
    } else if (!strcmp(type, "Prepend")) {
        static const char *const keys[] = {"type", "prepend", NULL};
        n->kind = N_PREPEND;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = copy_str(j, "prepend", path, where, n);
    } else if (!strcmp(type, "Replace")) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        n->kind = N_REPLACE;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = copy_str(j, "content", path, where, n);
        if (!st) st = kd_pattern_parse(&n->pat, json_object_get(j, "pattern"), path, where);
    } else if (!strcmp(type, "Strip")) {
        static const char *const keys[] = {"type", "strip_left", "strip_right", NULL};
        n->kind = N_STRIP;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = kd_json_bool(j, "strip_left", true, path, where, &n->left);
        if (!st) st = kd_json_bool(j, "strip_right", true, path, where, &n->right);
    } else if (!strcmp(type, "Sequence")) {
        static const char *const keys[] = {"type", "normalizers", NULL};
        json_t *arr = json_object_get(j, "normalizers");
        n->kind = N_SEQ;
        st = kd_json_keys(j, path, where, keys);
        if (!st && !json_is_array(arr))
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s.normalizers is not an array", path, where);
        if (!st && json_array_size(arr)) {
            n->kids = calloc(json_array_size(arr), sizeof *n->kids);
            if (!n->kids) st = kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
        }
        for (size_t i = 0; !st && i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            st = kd_norm_parse(json_array_get(arr, i), path, sub, &n->kids[i]);
            if (!st && !n->kids[i]) st = kiln_error(KILN_ERR_FORMAT, "%s: %s is null", path, sub);
            if (!st) n->n_kids++;
        }
    } else {
        st = kd_unsupported(path, where, "normalizer", type);
    }
    if (st) {
        kd_norm_free(n);
        return st;
    }
    *out = n;
    return KILN_OK;
}

bool kd_norm_chunk_safe(const kd_norm *n) {
    return !n || n->kind == N_NFC || n->kind == N_NFKC;
}

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* Unicode normal forms on the valid stretches of s. */
static kiln_status unicode_form(const char *s, size_t n, int kind, kd_buf *out) {
    if (all_ascii(s, n)) return kd_buf_put(out, s, n) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    int opt = UTF8PROC_STABLE | (kind == N_NFC || kind == N_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
              (kind == N_NFKC || kind == N_NFKD ? UTF8PROC_COMPAT : 0);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp = 0;
        while (j < n) {
            size_t l = kd_utf8_next(u + j, n - j, &cp);
            if (cp == 0xFFFFFFFFu) break;
            j += l;
        }
        if (j > i) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t m = utf8proc_map(u + i, (utf8proc_ssize_t)(j - i), &dst, (utf8proc_option_t)opt);
            if (m < 0) return kiln_error(KILN_ERR_INVALID, "normalizer: %s", utf8proc_errmsg(m));
            bool ok = kd_buf_put(out, dst, (size_t)m);
            free(dst);
            if (!ok) return kiln_error(KILN_ERR_OOM, "out of memory");
        }
        if (j < n) { /* one invalid byte, kept */
            if (!kd_buf_put(out, s + j, 1)) return kiln_error(KILN_ERR_OOM, "out of memory");
            j++;
        }
        i = j;
    }
    return KILN_OK;
}

static kiln_status lowercase(const char *s, size_t n, kd_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = kd_utf8_next(u + i, n - i, &cp);
        if (!kd_buf_reserve(out, 8)) return kiln_error(KILN_ERR_OOM, "out of memory");
        if (cp == 0xFFFFFFFFu) {
            out->p[out->n++] = s[i];
        } else if (cp == 0x130) {
            /* Rust's char::to_lowercase is the full mapping; utf8proc's is the
             * simple one. They differ only here: U+0130 -> "i" U+0307. */
            out->n += kd_utf8_put(out->p + out->n, 'i');
            out->n += kd_utf8_put(out->p + out->n, 0x307);
        } else {
            out->n += kd_utf8_put(out->p + out->n, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        }
        i += l;
    }
    return KILN_OK;
}

static kiln_status replace(const kd_norm *nm, kd_work *w, const char *s, size_t n, kd_buf *out) {
    kiln_status st = kd_pattern_find(&nm->pat, w, s, n);
    if (st) return st;
    for (size_t i = 0; i < w->ev.n; i++) {
        const kd_event *e = &w->ev.v[i];
        bool ok = e->match ? kd_buf_put(out, nm->str, nm->len) : kd_buf_put(out, s + e->s, e->e - e->s);
        if (!ok) return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    return KILN_OK;
}

/* Length of the whitespace run at the start / the end of s. */
static size_t ws_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = kd_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!kd_is_whitespace(cp)) break;
        i += l;
    }
    return i;
}

static size_t ws_suffix(const char *s, size_t n) {
    size_t i = 0, keep = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = kd_utf8_next((const unsigned char *)s + i, n - i, &cp);
        i += l;
        if (!kd_is_whitespace(cp)) keep = i;
    }
    return n - keep;
}

static kiln_status apply_one(const kd_norm *nm, kd_work *w, const char *s, size_t n, kd_buf *out) {
    switch (nm->kind) {
    case N_NFC: case N_NFD: case N_NFKC: case N_NFKD: return unicode_form(s, n, nm->kind, out);
    case N_LOWER: return lowercase(s, n, out);
    case N_PREPEND:
        if (n && !kd_buf_put(out, nm->str, nm->len)) return kiln_error(KILN_ERR_OOM, "out of memory");
        return kd_buf_put(out, s, n) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    case N_REPLACE: return replace(nm, w, s, n, out);
    case N_STRIP: {
        size_t a = nm->left ? ws_prefix(s, n) : 0;
        size_t b = nm->right && a < n ? ws_suffix(s + a, n - a) : 0;
        return kd_buf_put(out, s + a, n - a - b) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    }
    default: break;
    }
    return kiln_error(KILN_ERR_INVALID, "normalizer kind %d", nm->kind);
}

kiln_status kd_norm_apply(const kd_norm *nm, kd_work *w, const char *s, size_t n, kd_buf *out) {
    out->n = 0;
    if (nm->kind != N_SEQ) return apply_one(nm, w, s, n, out);
    if (nm->n_kids == 0) return kd_buf_put(out, s, n) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    /* Ping-pong between `out` and a private buffer; the last step lands in out. */
    kd_buf tmp = {0};
    kd_buf *bufs[2] = {out, &tmp};
    int cur = (int)(nm->n_kids % 2 == 1 ? 0 : 1);
    const char *src = s;
    size_t len = n;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < nm->n_kids && !st; i++) {
        kd_buf *dst = bufs[cur];
        dst->n = 0;
        st = kd_norm_apply(nm->kids[i], w, src, len, dst);
        src = dst->p ? dst->p : "";
        len = dst->n;
        cur ^= 1;
    }
    kd_buf_free(&tmp);
    return st;
}
