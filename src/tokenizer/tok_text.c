/* Text plumbing shared by the tokenizer pipeline: checked buffers, UTF-8,
 * the few Unicode predicates HF takes from Rust's `char` (through
 * utf8proc's tables), PCRE2 patterns with HF's find_matches semantics, and
 * JSON field checks. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "tokenizer_impl.h"

/* ---- buffers ---- */

bool kd_buf_reserve(kd_buf *b, size_t extra) {
    if (extra > SIZE_MAX - b->n - 1) return false;
    return kiln_grow((void **)&b->p, &b->cap, b->n + extra + 1, 1, 64);
}

bool kd_buf_put(kd_buf *b, const void *s, size_t n) {
    if (!kd_buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

void kd_buf_free(kd_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

bool kd_spans_push(kd_spans *s, size_t off, size_t len, int32_t id, uint32_t flags) {
    if (s->n == s->cap && !kiln_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v, 64)) return false;
    s->v[s->n++] = (kd_span){off, len, id, flags};
    return true;
}

void kd_spans_free(kd_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

bool kd_events_push(kd_events *ev, size_t s, size_t e, bool match) {
    if (ev->n == ev->cap && !kiln_grow((void **)&ev->v, &ev->cap, ev->n + 1, sizeof *ev->v, 64)) return false;
    ev->v[ev->n++] = (kd_event){s, e, match};
    return true;
}

bool kd_work_init(kd_work *w) {
    memset(w, 0, sizeof *w);
    w->md = pcre2_match_data_create(1, NULL);
    w->mc = pcre2_match_context_create(NULL);
    /* Long runs (a 20000-letter word) need more than JIT's default 32 KiB. */
    w->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!w->md || !w->mc || !w->js) {
        kd_work_free(w);
        return false;
    }
    pcre2_jit_stack_assign(w->mc, NULL, w->js);
    /* The interpreter's backtracking (JIT has its stack above): real
     * pre-tokenizers stay a few frames deep. The match limit is set per call
     * from the budget in next_match. */
    pcre2_set_depth_limit(w->mc, 1000000);
    pcre2_set_heap_limit(w->mc, 64 * 1024); /* KiB */
    return true;
}

void kd_work_free(kd_work *w) {
    pcre2_match_data_free(w->md);
    pcre2_match_context_free(w->mc);
    pcre2_jit_stack_free(w->js);
    kd_buf_free(&w->arena);
    kd_buf_free(&w->nb1);
    kd_buf_free(&w->nb2);
    kd_spans_free(&w->s1);
    kd_spans_free(&w->s2);
    free(w->ev.v);
    memset(w, 0, sizeof *w);
}

/* ---- UTF-8 ---- */

size_t kd_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    *cp = 0xFFFFFFFFu;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t need;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) need = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, v = c & 0x07, min = 0x10000;
    else return 1;
    if (n < need) return 1;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 1;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    return need;
}

size_t kd_utf8_put(char *o, uint32_t cp) {
    utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)o);
    return n > 0 ? (size_t)n : 0;
}

bool kd_is_whitespace(uint32_t cp) {
    if ((cp >= 9 && cp <= 13) || cp == 0x85) return true;
    if (cp > 0x10FFFF) return false;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool kd_is_numeric(uint32_t cp) {
    if (cp > 0x10FFFF) return false;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* Length of the longest prefix of s that could start a valid sequence
 * (Rust's rule: each maximal such prefix becomes one U+FFFD). */
static size_t invalid_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    if (need == 1) return 1;
    size_t i = 1;
    for (; i < need && i < n; i++) {
        unsigned char d = s[i];
        unsigned lo = 0x80, hi = 0xBF;
        if (i == 1) {
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        }
        if (d < lo || d > hi) break;
    }
    return i;
}

bool kd_utf8_lossy(const char *s, size_t n, kd_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = kd_utf8_next(u + i, n - i, &cp);
        if (cp != 0xFFFFFFFFu) {
            i += l;
            continue;
        }
        if (!kd_buf_put(out, s + run, i - run) || !kd_buf_put(out, "\xEF\xBF\xBD", 3)) return false;
        i += invalid_len(u + i, n - i);
        run = i;
    }
    return kd_buf_put(out, s + run, n - run);
}

/* ---- patterns ---- */

/* HF compiles Split/Replace regexes with Oniguruma, whose \s is Unicode
 * White_Space; PCRE2's \s (UCP) lacks U+0085, so it is added. */
static char *onig_to_pcre2(const char *re) {
    size_t n = strlen(re);
    char *o = malloc(n * 12 + 1);
    if (!o) return NULL;
    size_t k = 0;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[i + 1];
            if (d == 's' && !in_class) k += (size_t)sprintf(o + k, "[\\s\\x{85}]");
            else if (d == 's') k += (size_t)sprintf(o + k, "\\s\\x{85}");
            else if (d == 'S' && !in_class) k += (size_t)sprintf(o + k, "[^\\s\\x{85}]");
            else o[k++] = c, o[k++] = d;
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            o[k++] = c;
            if (i + 1 < n && re[i + 1] == '^') o[k++] = re[++i];
            if (i + 1 < n && re[i + 1] == ']') o[k++] = re[++i];
            continue;
        }
        if (c == '[' && in_class && i + 1 < n && re[i + 1] == ':') { /* [:alpha:] */
            const char *end = strstr(re + i + 2, ":]");
            if (end) {
                size_t l = (size_t)(end + 2 - (re + i));
                memcpy(o + k, re + i, l);
                k += l;
                i += l - 1;
                continue;
            }
        }
        if (c == ']' && in_class) in_class = false;
        o[k++] = c;
    }
    o[k] = 0;
    return o;
}

kiln_status kd_pattern_regex(kd_pattern *p, const char *re, const char *path, const char *where) {
    memset(p, 0, sizeof *p);
    char *conv = onig_to_pcre2(re);
    if (!conv) return kiln_error(KILN_ERR_OOM, "%s: out of memory compiling a regex", path);
    int err;
    PCRE2_SIZE eoff;
    /* Oniguruma's ^ and $ match at line breaks: PCRE2_MULTILINE. */
    p->re = pcre2_compile((PCRE2_SPTR)conv, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &err, &eoff, NULL);
    free(conv);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s: regex \"%s\" is not accepted by PCRE2: %s", path, where, re,
                          (const char *)msg);
    }
    p->jit = pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE) == 0;
    /* For match errors: the file, the component and the pattern (cut at a
     * character boundary when long). */
    size_t rn = strlen(re), cut = rn;
    if (cut > 96) {
        cut = 93;
        while (cut > 0 && ((unsigned char)re[cut] & 0xC0) == 0x80) cut--;
    }
    size_t wn = strlen(path) + strlen(where) + cut + 32;
    if (!(p->what = malloc(wn))) {
        kd_pattern_free(p);
        return kiln_error(KILN_ERR_OOM, "%s: out of memory compiling a regex", path);
    }
    snprintf(p->what, wn, "%s: %s: regex \"%.*s%s\"", path, where, (int)cut, re, cut < rn ? "..." : "");
    return KILN_OK;
}

kiln_status kd_pattern_parse(kd_pattern *p, json_t *j, const char *path, const char *where) {
    memset(p, 0, sizeof *p);
    json_t *s = json_object_get(j, "String"), *r = json_object_get(j, "Regex");
    if (!json_is_object(j) || json_object_size(j) != 1 || (!json_is_string(s) && !json_is_string(r)))
        return kiln_error(KILN_ERR_FORMAT, "%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", path, where);
    if (r) {
        if (!json_string_length(r))
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s.pattern: an empty regex is not supported", path, where);
        return kd_pattern_regex(p, json_string_value(r), path, where);
    }
    if (!json_string_length(s))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s.pattern: an empty string is not supported", path, where);
    p->lit_len = json_string_length(s);
    p->lit = malloc(p->lit_len);
    if (!p->lit) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    memcpy(p->lit, json_string_value(s), p->lit_len);
    return KILN_OK;
}

void kd_pattern_free(kd_pattern *p) {
    pcre2_code_free(p->re);
    free(p->lit);
    free(p->what);
    memset(p, 0, sizeof *p);
}

/* Match limits (PCRE2 counts backtracking steps, JIT and interpreter alike;
 * a limit holds for one call) bound the work of a whole find: the find has
 * *budget steps, each call first tries RE_FIRST_LIMIT steps and doubles the
 * limit while it runs out, and every try is charged in full, so the steps
 * taken never exceed the budget and a successful call costs under four times
 * what it needed. The GPT-2, Llama 3 and Qwen2 regexes need at most 22 steps
 * a call (8 with JIT) except over a run of spaces, which Llama 3's
 * \s*[\r\n]+ backtracks across once (a step a byte); charged, they use at
 * most 32 steps per byte (one first try a byte: Qwen2 on digits), a
 * catastrophic regex takes about 2 ns a step. Not bounded: scans that do not
 * backtrack ([a-z]+@|. on letters is quadratic with few steps). */
#define RE_FIRST_LIMIT 32

static int next_match(const kd_pattern *p, kd_work *w, const char *s, size_t n, size_t pos, size_t *ms, size_t *me,
                      uint64_t *budget) {
    if (!p->re) {
        const char *f = n - pos >= p->lit_len ? memmem(s + pos, n - pos, p->lit, p->lit_len) : NULL;
        if (!f) return 0;
        *ms = (size_t)(f - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    int rc = PCRE2_ERROR_MATCHLIMIT;
    for (uint64_t lim = RE_FIRST_LIMIT; *budget > 0; lim *= 2) {
        uint64_t t = lim < *budget ? lim : *budget;
        if (t > UINT32_MAX) t = UINT32_MAX;
        pcre2_set_match_limit(w->mc, (uint32_t)t);
        rc = p->jit ? pcre2_jit_match(p->re, (PCRE2_SPTR)s, n, pos, 0, w->md, w->mc)
                    : pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, 0, w->md, w->mc);
        *budget -= t;
        if (rc != PCRE2_ERROR_MATCHLIMIT) break;
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return rc;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

kiln_status kd_pattern_find(const kd_pattern *p, kd_work *w, const char *s, size_t n) {
    kd_events *ev = &w->ev;
    ev->n = 0;
    if (n == 0) return kd_events_push(ev, 0, 0, false) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    size_t pos = 0, prev = 0, last_end = SIZE_MAX;
    uint64_t budget = (uint64_t)KD_RE_STEPS_PER_BYTE * ((uint64_t)n + 1);
    while (pos <= n) {
        size_t ms, me;
        int rc = next_match(p, w, s, n, pos, &ms, &me, &budget);
        if (rc == 0) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            const char *what = p->what ? p->what : "regex";
            if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
                rc == PCRE2_ERROR_JIT_STACKLIMIT)
                return kiln_error(KILN_ERR_INVALID,
                                  "%s backtracks catastrophically: it gave up at byte %zu of a %zu-byte piece of "
                                  "text (%s; kiln allows a regex %d backtracking steps per byte of text, real "
                                  "pre-tokenizers use at most 32; look for nested repeats such as (a|a)* or "
                                  "(\\w+\\s?)*)", what, pos, n, (const char *)msg, KD_RE_STEPS_PER_BYTE);
            return kiln_error(KILN_ERR_INVALID, "%s: match failed at byte %zu: %s", what, pos, (const char *)msg);
        }
        /* Like the onig/regex crates: no empty match right where the last one ended. */
        if (ms == me && me == last_end) {
            if (pos >= n) break;
            uint32_t cp;
            pos += kd_utf8_next((const unsigned char *)s + pos, n - pos, &cp);
            continue;
        }
        if (prev != ms && !kd_events_push(ev, prev, ms, false)) return kiln_error(KILN_ERR_OOM, "out of memory");
        if (!kd_events_push(ev, ms, me, true)) return kiln_error(KILN_ERR_OOM, "out of memory");
        prev = pos = last_end = me;
    }
    if (prev != n && !kd_events_push(ev, prev, n, false)) return kiln_error(KILN_ERR_OOM, "out of memory");
    return KILN_OK;
}

/* ---- JSON ---- */

kiln_status kd_json_keys(json_t *obj, const char *path, const char *where, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, key);
        if (!ok)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s: field \"%s\" is not implemented by kiln", path, where, key);
    }
    return KILN_OK;
}

kiln_status kd_json_bool(json_t *obj, const char *key, bool dflt, const char *path, const char *where, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return KILN_OK;
    }
    if (!json_is_boolean(v)) return kiln_error(KILN_ERR_FORMAT, "%s: %s.%s is not true or false", path, where, key);
    *out = json_is_true(v);
    return KILN_OK;
}

kiln_status kd_json_str(json_t *obj, const char *key, const char *path, const char *where, const char **s, size_t *n) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) return kiln_error(KILN_ERR_FORMAT, "%s: %s.%s is missing or not a string", path, where, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return KILN_OK;
}

kiln_status kd_unsupported(const char *path, const char *where, const char *kind, const char *type) {
    return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s: %s \"%s\" is not implemented by kiln", path, where, kind,
                      type ? type : "(no type)");
}

/* ---- chunking for kiln's own pipeline ---- */

size_t kd_chunk_boundary(const unsigned char *s, size_t n, size_t pos) {
    if (pos == 0) return 0;
    for (size_t i = pos; i < n; i++)
        if (s[i] == ' ' && s[i - 1] > ' ' && s[i - 1] < 0x7F) return i;
    return n;
}
