/* Pre-tokenizers: ByteLevel, Split, Digits, Metaspace, Whitespace,
 * WhitespaceSplit and Sequence, with HF's semantics (pre_tokenizers/
 * and NormalizedString::split). Each step turns the text spans of a list
 * into sub-spans; empty pieces are dropped as HF drops them. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

enum { P_BYTELEVEL, P_SPLIT, P_DIGITS, P_METASPACE, P_WHITESPACE, P_WSSPLIT, P_SEQ };
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { PS_ALWAYS, PS_FIRST, PS_NEVER };

/* HF's ByteLevel regex (GPT-2). */
static const char *const GPT2_RE = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust regex's Unicode \w+|[^\w\s]+ (Whitespace pre-tokenizer). */
static const char *const WS_RE = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
                                 "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\s\\x{85}]+";

struct kd_pretok {
    int kind, behavior, prepend;
    bool add_prefix_space, use_regex, invert, individual, split;
    kd_pattern pat;
    char repl[5];
    size_t repl_len;
    uint32_t repl_cp;
    kd_pretok **kids;
    size_t n_kids;
};

void kd_pretok_free(kd_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) kd_pretok_free(p->kids[i]);
    free(p->kids);
    kd_pattern_free(&p->pat);
    free(p);
}

kd_pretok *kd_pretok_bytelevel(bool add_prefix_space, bool use_regex) {
    kd_pretok *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = P_BYTELEVEL;
    p->add_prefix_space = add_prefix_space;
    p->use_regex = use_regex;
    if (use_regex && kd_pattern_regex(&p->pat, GPT2_RE, "(builtin)", "ByteLevel")) {
        free(p);
        return NULL;
    }
    return p;
}

static kiln_status parse_behavior(json_t *j, const char *path, const char *where, int *out) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *b = json_string_value(json_object_get(j, "behavior"));
    for (int i = 0; b && i < 5; i++)
        if (!strcmp(b, names[i])) {
            *out = i;
            return KILN_OK;
        }
    return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s.behavior \"%s\" is not one of Removed, Isolated, "
                      "MergedWithPrevious, MergedWithNext, Contiguous", path, where, b ? b : "(missing)");
}

static kiln_status parse_metaspace(kd_pretok *p, json_t *j, const char *path, const char *where) {
    static const char *const keys[] = {"type", "replacement", "add_prefix_space", "prepend_scheme", "split", "str_rep", NULL};
    kiln_status st = kd_json_keys(j, path, where, keys);
    const char *r;
    size_t rn;
    if (!st) st = kd_json_str(j, "replacement", path, where, &r, &rn);
    if (st) return st;
    uint32_t cp;
    if (rn == 0 || rn > 4 || kd_utf8_next((const unsigned char *)r, rn, &cp) != rn || cp == 0xFFFFFFFFu)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s.replacement \"%s\" is not one character", path, where, r);
    memcpy(p->repl, r, rn);
    p->repl_len = rn;
    p->repl_cp = cp;
    p->prepend = PS_ALWAYS;
    json_t *ps = json_object_get(j, "prepend_scheme");
    if (ps && !json_is_null(ps)) {
        const char *v = json_string_value(ps);
        if (v && !strcmp(v, "always")) p->prepend = PS_ALWAYS;
        else if (v && !strcmp(v, "first")) p->prepend = PS_FIRST;
        else if (v && !strcmp(v, "never")) p->prepend = PS_NEVER;
        else return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s.prepend_scheme \"%s\" is not always, first or never",
                               path, where, v ? v : "?");
    }
    bool aps;
    json_t *a = json_object_get(j, "add_prefix_space");
    if ((st = kd_json_bool(j, "add_prefix_space", true, path, where, &aps))) return st;
    if (a && !json_is_null(a) && !aps) { /* the legacy field, as HF reads it */
        if (ps && !json_is_null(ps) && p->prepend != PS_NEVER)
            return kiln_error(KILN_ERR_FORMAT, "%s: %s: add_prefix_space false contradicts prepend_scheme", path, where);
        p->prepend = PS_NEVER;
    }
    return kd_json_bool(j, "split", true, path, where, &p->split);
}

kiln_status kd_pretok_parse(json_t *j, const char *path, const char *where, kd_pretok **out) {
    *out = NULL;
    if (!j || json_is_null(j)) return KILN_OK;
    if (!json_is_object(j)) return kiln_error(KILN_ERR_FORMAT, "%s: %s is not an object", path, where);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return kiln_error(KILN_ERR_FORMAT, "%s: %s has no string \"type\"", path, where);
    kd_pretok *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    kiln_status st;
    char sub[256];
    if (!strcmp(type, "ByteLevel")) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        bool trim;
        p->kind = P_BYTELEVEL;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = kd_json_bool(j, "add_prefix_space", true, path, where, &p->add_prefix_space);
        if (!st) st = kd_json_bool(j, "use_regex", true, path, where, &p->use_regex);
        if (!st) st = kd_json_bool(j, "trim_offsets", true, path, where, &trim); /* offsets only */
        if (!st && p->use_regex) st = kd_pattern_regex(&p->pat, GPT2_RE, path, where);
    } else if (!strcmp(type, "Split")) {
        static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
        p->kind = P_SPLIT;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = kd_pattern_parse(&p->pat, json_object_get(j, "pattern"), path, where);
        if (!st) st = parse_behavior(j, path, where, &p->behavior);
        if (!st) st = kd_json_bool(j, "invert", false, path, where, &p->invert);
    } else if (!strcmp(type, "Digits")) {
        static const char *const keys[] = {"type", "individual_digits", NULL};
        p->kind = P_DIGITS;
        st = kd_json_keys(j, path, where, keys);
        if (!st) st = kd_json_bool(j, "individual_digits", false, path, where, &p->individual);
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = P_METASPACE;
        st = parse_metaspace(p, j, path, where);
    } else if (!strcmp(type, "Whitespace") || !strcmp(type, "WhitespaceSplit")) {
        static const char *const keys[] = {"type", NULL};
        p->kind = type[10] ? P_WSSPLIT : P_WHITESPACE;
        st = kd_json_keys(j, path, where, keys);
        if (!st && p->kind == P_WHITESPACE) st = kd_pattern_regex(&p->pat, WS_RE, path, where);
    } else if (!strcmp(type, "Sequence")) {
        static const char *const keys[] = {"type", "pretokenizers", NULL};
        json_t *arr = json_object_get(j, "pretokenizers");
        p->kind = P_SEQ;
        st = kd_json_keys(j, path, where, keys);
        if (!st && !json_is_array(arr))
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s.pretokenizers is not an array", path, where);
        if (!st && json_array_size(arr) && !(p->kids = calloc(json_array_size(arr), sizeof *p->kids)))
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
        for (size_t i = 0; !st && i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            st = kd_pretok_parse(json_array_get(arr, i), path, sub, &p->kids[i]);
            if (!st && !p->kids[i]) st = kiln_error(KILN_ERR_FORMAT, "%s: %s is null", path, sub);
            if (!st) p->n_kids++;
        }
    } else {
        st = kd_unsupported(path, where, "pre-tokenizer", type);
    }
    if (st) {
        kd_pretok_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

int kd_pretok_byte_level(const kd_pretok *p, const char *path) {
    if (!p) return 0;
    if (p->kind == P_BYTELEVEL) return 1;
    if (p->kind != P_SEQ) return 0;
    for (size_t i = 0; i < p->n_kids; i++) {
        int b = kd_pretok_byte_level(p->kids[i], path);
        if (b < 0) return b;
        if (b && i + 1 < p->n_kids) {
            kiln_error(KILN_ERR_UNSUPPORTED, "%s: pre_tokenizer: a ByteLevel step followed by other steps is not "
                       "implemented by kiln (ByteLevel must come last)", path);
            return -1;
        }
        if (b) return 1;
    }
    return 0;
}

bool kd_pretok_chunk_safe(const kd_pretok *p) {
    return p && p->kind == P_BYTELEVEL && p->use_regex;
}

/* ---- applying ---- */

typedef bool (*char_pred)(const kd_pretok *p, uint32_t cp);
static bool pred_numeric(const kd_pretok *p, uint32_t cp) { (void)p; return kd_is_numeric(cp); }
static bool pred_space(const kd_pretok *p, uint32_t cp) { (void)p; return kd_is_whitespace(cp); }
static bool pred_repl(const kd_pretok *p, uint32_t cp) { return cp == p->repl_cp; }

/* HF's find_matches for a char predicate: each matching char is a match. */
static kiln_status char_events(const kd_pretok *p, kd_work *w, const char *s, size_t n, char_pred pred) {
    kd_events *ev = &w->ev;
    ev->n = 0;
    bool ok = true;
    if (n == 0) ok = kd_events_push(ev, 0, 0, false);
    size_t last = 0, i = 0;
    while (ok && i < n) {
        uint32_t cp;
        size_t l = kd_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (pred(p, cp)) {
            if (last < i) ok = kd_events_push(ev, last, i, false);
            if (ok) ok = kd_events_push(ev, i, i + l, true);
            last = i + l;
        }
        i += l;
    }
    if (ok && n > last) ok = kd_events_push(ev, last, n, false);
    return ok ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
}

/* NormalizedString::split: events -> kept pieces, in place in w->ev. */
static void apply_behavior(kd_events *ev, int behavior, bool invert) {
    if (invert)
        for (size_t i = 0; i < ev->n; i++) ev->v[i].match = !ev->v[i].match;
    kd_event *v = ev->v;
    size_t k = 0;
    bool prev = false;
    switch (behavior) {
    case B_ISOLATED:
        return;
    case B_REMOVED:
        for (size_t i = 0; i < ev->n; i++)
            if (!v[i].match) v[k++] = v[i];
        break;
    case B_CONTIGUOUS:
    case B_MERGED_PREV:
        for (size_t i = 0; i < ev->n; i++) {
            bool m = v[i].match;
            bool join = behavior == B_CONTIGUOUS ? m == prev : m && !prev;
            if (join && k > 0) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prev = m;
        }
        break;
    case B_MERGED_NEXT: {
        size_t w = ev->n;
        for (size_t i = ev->n; i-- > 0;) {
            bool m = v[i].match;
            if (m && !prev && w < ev->n) v[w].s = v[i].s;
            else v[--w] = v[i];
            prev = m;
        }
        memmove(v, v + w, (ev->n - w) * sizeof *v);
        k = ev->n - w;
        break;
    }
    }
    ev->n = k;
    for (size_t i = 0; i < k; i++) v[i].match = false;
}

static kiln_status emit(kd_work *w, size_t base, uint32_t flags, kd_spans *out) {
    for (size_t i = 0; i < w->ev.n; i++) {
        const kd_event *e = &w->ev.v[i];
        if (e->e == e->s) continue;
        uint32_t f = e->s == 0 ? flags : (flags & ~KD_AT0);
        if (!kd_spans_push(out, base + e->s, e->e - e->s, -1, f)) return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    return KILN_OK;
}

/* Appends text to the arena; returns its offset via *off. */
static bool arena_add(kd_work *w, const char *a, size_t an, size_t src_off, size_t src_len, size_t *off) {
    if (!kd_buf_reserve(&w->arena, an + src_len)) return false;
    *off = w->arena.n;
    memcpy(w->arena.p + w->arena.n, a, an);
    memmove(w->arena.p + w->arena.n + an, w->arena.p + src_off, src_len);
    w->arena.n += an + src_len;
    return true;
}

static kiln_status metaspace(const kd_pretok *p, kd_work *w, const kd_span *sp, kd_spans *out) {
    size_t spaces = 0;
    for (size_t i = 0; i < sp->len; i++) spaces += w->arena.p[sp->off + i] == ' ';
    if (!kd_buf_reserve(&w->arena, sp->len + (spaces + 1) * p->repl_len)) return kiln_error(KILN_ERR_OOM, "out of memory");
    size_t off = w->arena.n, o = off;
    char *a = w->arena.p;
    const char *s = a + sp->off;
    bool starts = sp->len >= p->repl_len && !memcmp(s, p->repl, p->repl_len);
    if (sp->len && s[0] == ' ') starts = true; /* becomes the replacement below */
    if (!starts && (p->prepend == PS_ALWAYS || (p->prepend == PS_FIRST && (sp->flags & KD_AT0)))) {
        memcpy(a + o, p->repl, p->repl_len);
        o += p->repl_len;
    }
    for (size_t i = 0; i < sp->len; i++) {
        if (s[i] == ' ') {
            memcpy(a + o, p->repl, p->repl_len);
            o += p->repl_len;
        } else {
            a[o++] = s[i];
        }
    }
    w->arena.n = o;
    size_t len = o - off;
    if (!p->split) return kd_spans_push(out, off, len, -1, sp->flags) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status st = char_events(p, w, w->arena.p + off, len, pred_repl);
    if (st) return st;
    apply_behavior(&w->ev, B_MERGED_NEXT, false);
    return emit(w, off, sp->flags, out);
}

static kiln_status step(const kd_pretok *p, kd_work *w, const kd_span *sp, kd_spans *out) {
    kiln_status st = KILN_OK;
    size_t off = sp->off, len = sp->len;
    switch (p->kind) {
    case P_BYTELEVEL:
        if (p->add_prefix_space && w->arena.p[off] != ' ') {
            size_t noff;
            if (!arena_add(w, " ", 1, off, len, &noff)) return kiln_error(KILN_ERR_OOM, "out of memory");
            off = noff;
            len++;
        }
        if (!p->use_regex) return kd_spans_push(out, off, len, -1, sp->flags) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
        st = kd_pattern_find(&p->pat, w, w->arena.p + off, len);
        if (!st) apply_behavior(&w->ev, B_ISOLATED, false);
        break;
    case P_SPLIT:
        st = kd_pattern_find(&p->pat, w, w->arena.p + off, len);
        if (!st) apply_behavior(&w->ev, p->behavior, p->invert);
        break;
    case P_DIGITS:
        st = char_events(p, w, w->arena.p + off, len, pred_numeric);
        if (!st) apply_behavior(&w->ev, p->individual ? B_ISOLATED : B_CONTIGUOUS, false);
        break;
    case P_METASPACE:
        return metaspace(p, w, sp, out);
    case P_WHITESPACE:
        st = kd_pattern_find(&p->pat, w, w->arena.p + off, len);
        if (!st) apply_behavior(&w->ev, B_REMOVED, true);
        break;
    case P_WSSPLIT:
        st = char_events(p, w, w->arena.p + off, len, pred_space);
        if (!st) apply_behavior(&w->ev, B_REMOVED, false);
        break;
    }
    return st ? st : emit(w, off, sp->flags, out);
}

kiln_status kd_pretok_apply(const kd_pretok *p, kd_work *w, kd_spans *in, kd_spans *out) {
    out->n = 0;
    if (p->kind != P_SEQ) {
        for (size_t i = 0; i < in->n; i++) {
            kd_span sp = in->v[i];
            kiln_status st = sp.id >= 0 || sp.len == 0
                                 ? (kd_spans_push(out, sp.off, sp.len, sp.id, sp.flags) ? KILN_OK
                                                                                        : kiln_error(KILN_ERR_OOM, "out of memory"))
                                 : step(p, w, &sp, out);
            if (st) return st;
        }
        return KILN_OK;
    }
    if (p->n_kids == 0) {
        for (size_t i = 0; i < in->n; i++)
            if (!kd_spans_push(out, in->v[i].off, in->v[i].len, in->v[i].id, in->v[i].flags))
                return kiln_error(KILN_ERR_OOM, "out of memory");
        return KILN_OK;
    }
    kd_spans tmp = {0};
    kd_spans *bufs[2] = {out, &tmp};
    int cur = p->n_kids % 2 == 1 ? 0 : 1;
    kd_spans *src = in;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < p->n_kids && !st; i++) {
        st = kd_pretok_apply(p->kids[i], w, src, bufs[cur]);
        src = bufs[cur];
        cur ^= 1;
    }
    kd_spans_free(&tmp);
    return st;
}
