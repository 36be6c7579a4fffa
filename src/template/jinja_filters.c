/* The Jinja subset's filters, tests and Python methods (the ones chat
 * templates use), item access and iteration, with Jinja2's and Python's
 * semantics. Anything else is an error naming the template position. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jinja_impl.h"

#define OOM kiln_error(KILN_ERR_OOM, "out of memory")

static const char *type_name(const json_t *v) {
    if (!v) return "undefined";
    switch (json_typeof(v)) {
    case JSON_STRING: return "str";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_TRUE:
    case JSON_FALSE: return "bool";
    case JSON_NULL: return "NoneType";
    case JSON_ARRAY: return "list";
    default: return "dict";
    }
}

static const char *const str_methods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format", "format_map",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};
static const char *const dict_methods[] = {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
                                           "setdefault", "update", "values", NULL};
static const char *const list_methods[] = {"append", "clear", "copy", "count", "extend", "index", "insert", "pop",
                                           "remove", "reverse", "sort", NULL};

static bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

bool jl_is_method(const json_t *obj, const char *name) {
    if (!obj) return false;
    if (json_is_string(obj)) return in_list(str_methods, name);
    if (json_is_object(obj)) return in_list(dict_methods, name);
    if (json_is_array(obj)) return in_list(list_methods, name);
    return false;
}

json_t *jl_getitem(const json_t *obj, const json_t *key) {
    if (!obj || !key) return NULL;
    if (json_is_object(obj)) return json_is_string(key) ? json_incref(json_object_get(obj, jl_s(key))) : NULL;
    long long i;
    if (json_is_integer(key)) i = json_integer_value(key);
    else if (json_is_boolean(key)) i = json_is_true(key);
    else return NULL;
    if (json_is_array(obj)) {
        long long n = (long long)json_array_size(obj);
        if (i < 0) i += n;
        return i >= 0 && i < n ? json_incref(json_array_get(obj, (size_t)i)) : NULL;
    }
    if (json_is_string(obj)) {
        const char *s = jl_s(obj);
        size_t nb = jl_n(obj);
        long long n = (long long)jl_utf8_len(s, nb);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return NULL;
        size_t o = jl_utf8_off(s, nb, (size_t)i), o2 = jl_utf8_off(s, nb, (size_t)i + 1);
        return jl_string(s + o, o2 - o);
    }
    return NULL;
}

json_t *jl_iter_list(const json_t *v, const char **err) {
    *err = NULL;
    if (!v) return json_array();
    /* charged to the render budget: 8 bytes an item (strings: their own) */
    if (json_is_array(v)) return jl_charge(8 * json_array_size(v)) ? json_copy((json_t *)v) : NULL;
    if (json_is_object(v) && !jl_charge(40 * json_object_size(v))) return NULL;
    json_t *l = json_array();
    if (!l) return NULL;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) json_array_append_new(l, json_string(k));
        return l;
    }
    if (json_is_string(v)) {
        const char *s = jl_s(v);
        size_t n = jl_n(v), i = 0;
        while (i < n) {
            size_t j = i + 1;
            while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
            json_array_append_new(l, jl_string(s + i, j - i));
            i = j;
        }
        return l;
    }
    json_decref(l);
    *err = json_is_null(v) ? "'NoneType' object is not iterable" : "the value is not iterable";
    return NULL;
}

static json_t *str_of(const json_t *v) {
    jbuf b = {0};
    jl_str(&b, v);
    json_t *r = b.oom ? NULL : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return r;
}

static json_t *sub(const char *s, size_t b, size_t e) { return jl_string(s + b, e - b); }

static bool ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* upper / lower / capitalize / title on ASCII text (Unicode case mapping is
 * not implemented: refused rather than wrong). */
static kiln_status casemap(jrctx *c, const jnode *at, const char *how, const json_t *v, json_t **out) {
    const char *s = jl_s(v);
    size_t n = jl_n(v);
    if (!ascii(s, n)) return jl_rerr(c, at, "%s of non-ASCII text is outside kiln's Jinja subset", how);
    char *t = malloc(n + 1);
    if (!t) return OOM;
    bool start = true;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool up = how[0] == 'u' || ((how[0] == 'c' && i == 0) || (how[0] == 't' && start));
        bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        if (how[0] == 'l' || !up) t[i] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
        else t[i] = ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch;
        start = !alpha;
    }
    *out = jl_string(t, n);
    free(t);
    return *out ? KILN_OK : OOM;
}

static kiln_status need_str(jrctx *c, const jnode *at, const char *what, const json_t *v) {
    if (v && json_is_string(v)) return KILN_OK;
    return jl_rerr(c, at, "%s needs a string argument, got %s", what, type_name(v));
}

/* str.split / rsplit (sep NULL: runs of whitespace). */
static kiln_status split(jrctx *c, const jnode *at, const json_t *v, const json_t *sep, long long maxsplit, bool right,
                         json_t **out) {
    const char *s = jl_s(v);
    size_t n = jl_n(v);
    json_t *l = json_array();
    if (!l) return OOM;
    if (sep && !json_is_null(sep)) {
        if (need_str(c, at, "split", sep)) return json_decref(l), need_str(c, at, "split", sep);
        const char *p = jl_s(sep);
        size_t m = jl_n(sep);
        if (m == 0) return json_decref(l), jl_rerr(c, at, "split: empty separator");
        if (!right) {
            size_t b = 0, i = 0;
            long long k = 0;
            while (i + m <= n && (maxsplit < 0 || k < maxsplit)) {
                const char *q = memmem(s + i, n - i, p, m);
                if (!q) break;
                i = (size_t)(q - s);
                json_array_append_new(l, sub(s, b, i));
                i += m;
                b = i;
                k++;
            }
            json_array_append_new(l, sub(s, b, n));
        } else {
            size_t e = n, i = n;
            long long k = 0;
            while (i >= m && (maxsplit < 0 || k < maxsplit)) {
                if (!memcmp(s + i - m, p, m)) {
                    json_array_insert_new(l, 0, sub(s, i, e));
                    i -= m;
                    e = i;
                    k++;
                } else {
                    i--;
                }
            }
            json_array_insert_new(l, 0, sub(s, 0, e));
        }
    } else {
        if (right && maxsplit >= 0) return json_decref(l), jl_rerr(c, at, "rsplit(None, maxsplit) is outside kiln's Jinja subset");
        size_t i = 0, len;
        long long k = 0;
        for (;;) {
            while (i < n && jl_space_at(s + i, n - i, &len)) i += len;
            if (i >= n) break;
            if (maxsplit >= 0 && k == maxsplit) {
                size_t b, e;
                jl_strip(s + i, n - i, NULL, 0, false, true, &b, &e);
                json_array_append_new(l, sub(s, i, i + e));
                break;
            }
            size_t b = i;
            while (i < n && !jl_space_at(s + i, n - i, &len)) i++;
            json_array_append_new(l, sub(s, b, i));
            k++;
        }
    }
    *out = l;
    return KILN_OK;
}

static kiln_status replace(jrctx *c, const jnode *at, const json_t *v, const json_t *old, const json_t *new_,
                           long long count, json_t **out) {
    if (need_str(c, at, "replace", old) || need_str(c, at, "replace", new_)) return KILN_ERR_INVALID;
    const char *s = jl_s(v), *o = jl_s(old), *w = jl_s(new_);
    size_t n = jl_n(v), m = jl_n(old), k = jl_n(new_);
    if (m == 0) return jl_rerr(c, at, "replace with an empty pattern is outside kiln's Jinja subset");
    jbuf b = {0};
    size_t i = 0;
    long long done = 0;
    while (i < n) { /* memmem: linear, where a byte-by-byte search is quadratic */
        const char *q = count < 0 || done < count ? memmem(s + i, n - i, o, m) : NULL;
        if (!q) {
            jb_put(&b, s + i, n - i);
            break;
        }
        jb_put(&b, s + i, (size_t)(q - (s + i)));
        jb_put(&b, w, k);
        i = (size_t)(q - s) + m;
        done++;
    }
    *out = b.oom ? NULL : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? KILN_OK : OOM;
}

static bool affix(const json_t *v, const json_t *p, bool end) {
    size_t n = jl_n(v), m = jl_n(p);
    return m <= n && !memcmp(jl_s(v) + (end ? n - m : 0), jl_s(p), m);
}

static kiln_status strip_method(jrctx *c, const jnode *at, const char *name, const json_t *v, const json_t *chars, json_t **out) {
    if (chars && !json_is_null(chars) && need_str(c, at, name, chars)) return KILN_ERR_INVALID;
    bool has = chars && !json_is_null(chars);
    size_t b, e;
    jl_strip(jl_s(v), jl_n(v), has ? jl_s(chars) : NULL, has ? jl_n(chars) : 0, name[0] != 'r', name[0] != 'l', &b, &e);
    return (*out = sub(jl_s(v), b, e)) ? KILN_OK : OOM;
}

static bool int_arg(const json_t *v, long long *x) {
    if (v && json_is_integer(v)) return *x = json_integer_value(v), true;
    return false;
}

/* ---- methods: a table per type, {name, function, positional and keyword
 * arguments}, the arguments checked before the function runs ---- */

typedef kiln_status (*method_fn)(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out);
typedef struct {
    const char *name;
    method_fn fn;
    int max_pos;
    const char *const *kws;
} method_def;

static kiln_status m_affix(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    json_t *a0 = jl_arg(a, 0, NULL, NULL);
    kiln_status st;
    bool end = name[0] == 'e', r = false;
    if (a0 && json_is_array(a0)) {
        for (size_t i = 0; i < json_array_size(a0); i++) {
            json_t *p = json_array_get(a0, i);
            if ((st = need_str(c, at, name, p))) return st;
            r |= affix(obj, p, end);
        }
    } else {
        if ((st = need_str(c, at, name, a0))) return st;
        r = affix(obj, a0, end);
    }
    *out = json_boolean(r);
    return KILN_OK;
}

static kiln_status m_strip(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    return strip_method(c, at, name, obj, jl_arg(a, 0, NULL, NULL), out);
}

static kiln_status m_split(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    long long ms = -1;
    json_t *m = jl_arg(a, 1, "maxsplit", NULL);
    if (m && !int_arg(m, &ms)) return jl_rerr(c, at, "%s: maxsplit must be an integer", name);
    return split(c, at, obj, jl_arg(a, 0, "sep", NULL), ms, name[0] == 'r', out);
}

static kiln_status m_case(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    (void)a;
    return casemap(c, at, name, obj, out);
}

static kiln_status m_replace(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    (void)name;
    long long cnt = -1;
    json_t *a2 = jl_arg(a, 2, NULL, NULL);
    if (a2 && !int_arg(a2, &cnt)) return jl_rerr(c, at, "replace: count must be an integer");
    return replace(c, at, obj, jl_arg(a, 0, NULL, NULL), jl_arg(a, 1, NULL, NULL), cnt, out);
}

static kiln_status m_find(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    json_t *a0 = jl_arg(a, 0, NULL, NULL);
    kiln_status st = need_str(c, at, name, a0);
    if (st) return st;
    const char *s = jl_s(obj), *p = jl_s(a0);
    size_t n = jl_n(obj), m = jl_n(a0);
    long long found = -1, cnt = 0;
    if (m == 0) { /* every position matches: find 0, rfind len, count len + 1 */
        long long len = (long long)jl_utf8_len(s, n);
        *out = json_integer(name[0] == 'c' ? len + 1 : name[0] == 'r' ? len : 0);
        return KILN_OK;
    }
    size_t last = 0;
    bool any = false;
    for (const char *q = memmem(s, n, p, m); q; q = memmem(q, (size_t)(s + n - q), p, m)) {
        size_t i = (size_t)(q - s);
        if (!any) found = (long long)jl_utf8_len(s, i);
        any = true;
        last = i;
        cnt++;
        if (name[0] == 'f') break;
        q += name[0] == 'c' ? m : 1; /* count: non-overlapping; rfind: every start */
    }
    if (any && name[0] == 'r') found = (long long)jl_utf8_len(s, last);
    *out = json_integer(name[0] == 'c' ? cnt : found);
    return KILN_OK;
}

static kiln_status m_join(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    (void)name;
    json_t *a0 = jl_arg(a, 0, NULL, NULL);
    const char *err, *s = jl_s(obj);
    size_t n = jl_n(obj);
    json_t *items = a0 ? jl_iter_list(a0, &err) : NULL;
    if (!items) return jl_rerr(c, at, "join needs an iterable of strings");
    jbuf b = {0};
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *x = json_array_get(items, i);
        if (!json_is_string(x)) return json_decref(items), free(b.s), jl_rerr(c, at, "join: item %zu is not a string", i);
        if (i) jb_put(&b, s, n);
        jb_put(&b, jl_s(x), jl_n(x));
    }
    json_decref(items);
    *out = b.oom ? NULL : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? KILN_OK : OOM;
}

static kiln_status m_dict_list(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    (void)c, (void)at, (void)a;
    json_t *l = json_array();
    const char *k;
    json_t *x;
    json_object_foreach(obj, k, x) {
        if (name[0] == 'k') json_array_append_new(l, json_string(k));
        else if (name[0] == 'v') json_array_append(l, x);
        else json_array_append_new(l, json_pack("[sO]", k, x));
    }
    *out = l;
    return l ? KILN_OK : OOM;
}

static kiln_status m_get(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    (void)c, (void)at, (void)name;
    json_t *a0 = jl_arg(a, 0, NULL, NULL), *a1 = jl_arg(a, 1, NULL, NULL);
    json_t *v = a0 && json_is_string(a0) ? json_object_get(obj, jl_s(a0)) : NULL;
    *out = json_incref(v ? v : a1 ? a1 : json_null());
    return KILN_OK;
}

static const char *const split_kws[] = {"sep", "maxsplit", NULL};
/* sorted by name (bsearch) */
static const method_def str_table[] = {
    {"capitalize", m_case, 0, NULL}, {"count", m_find, 1, NULL},   {"endswith", m_affix, 1, NULL},
    {"find", m_find, 1, NULL},       {"join", m_join, 1, NULL},    {"lower", m_case, 0, NULL},
    {"lstrip", m_strip, 1, NULL},    {"replace", m_replace, 3, NULL}, {"rfind", m_find, 1, NULL},
    {"rsplit", m_split, 2, split_kws}, {"rstrip", m_strip, 1, NULL}, {"split", m_split, 2, split_kws},
    {"startswith", m_affix, 1, NULL}, {"strip", m_strip, 1, NULL}, {"title", m_case, 0, NULL},
    {"upper", m_case, 0, NULL},
};
static const method_def dict_table[] = {
    {"get", m_get, 2, NULL}, {"items", m_dict_list, 0, NULL}, {"keys", m_dict_list, 0, NULL}, {"values", m_dict_list, 0, NULL},
};

static int cmp_def(const void *key, const void *def) { return strcmp((const char *)key, *(const char *const *)def); }
#define FIND(table, name) bsearch((name), (table), sizeof(table) / sizeof *(table), sizeof *(table), cmp_def)

kiln_status jl_method(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out) {
    const method_def *m = json_is_string(obj) ? FIND(str_table, name) : json_is_object(obj) ? FIND(dict_table, name) : NULL;
    if (m) {
        kiln_status st = jl_args_check(c, at, name, a, m->max_pos, m->kws);
        return st ? st : m->fn(c, at, obj, name, a, out);
    }
    if (jl_is_method(obj, name))
        return jl_rerr(c, at, "the %s method '%s' is outside kiln's Jinja subset (or not allowed in the sandbox)",
                       type_name(obj), name);
    return jl_rerr(c, at, "%s has no method '%s'", type_name(obj), name);
}

static kiln_status length(jrctx *c, const jnode *at, const json_t *v, json_t **out) {
    long long n;
    if (!v) n = 0;
    else if (json_is_string(v)) n = (long long)jl_utf8_len(jl_s(v), jl_n(v));
    else if (json_is_array(v)) n = (long long)json_array_size(v);
    else if (json_is_object(v)) n = (long long)json_object_size(v);
    else return jl_rerr(c, at, "object of type '%s' has no len()", type_name(v));
    *out = json_integer(n);
    return KILN_OK;
}

/* Applies test `name` with extra arguments args[from..] (select, selectattr). */
static kiln_status test_with(jrctx *c, const jnode *at, const char *name, json_t *x, const jargs *a, int from, bool *r) {
    jargs t = {.v = a->v + from, .kw = a->kw + from, .n = a->n - from};
    return jl_test(c, at, name, x, &t, r);
}

static kiln_status select_items(jrctx *c, const jnode *at, const char *fname, json_t *v, const jargs *a, json_t **out) {
    bool attr = strstr(fname, "attr") != NULL, reject = fname[0] == 'r';
    const char *err;
    json_t *items = jl_iter_list(v, &err), *l = json_array();
    if (!items || !l) return json_decref(items), json_decref(l), items ? OOM : jl_rerr(c, at, "%s: %s", fname, err);
    json_t *key = attr ? jl_arg(a, 0, NULL, NULL) : NULL;
    json_t *tname = jl_arg(a, attr ? 1 : 0, NULL, NULL);
    kiln_status st = KILN_OK;
    if (attr && (!key || !json_is_string(key))) st = jl_rerr(c, at, "%s needs an attribute name", fname);
    if (!st && tname && !json_is_string(tname)) st = jl_rerr(c, at, "%s: the test name must be a string", fname);
    for (size_t i = 0; i < json_array_size(items) && !st; i++) {
        json_t *x = json_array_get(items, i), *y = attr ? jl_getitem(x, key) : json_incref(x);
        bool r;
        if (tname) st = test_with(c, at, jl_s(tname), y, a, attr ? 2 : 1, &r);
        else r = jl_truthy(y);
        json_decref(y);
        if (!st && r != reject) json_array_append(l, x);
    }
    json_decref(items);
    if (st) return json_decref(l), st;
    *out = l;
    return KILN_OK;
}

/* ---- filters: a table {name, function, positional and keyword
 * arguments}; max_pos < 0: the function checks its own arguments ---- */

typedef kiln_status (*filter_fn)(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out);
typedef struct {
    const char *name;
    filter_fn fn;
    int max_pos;
    const char *const *kws;
} filter_def;

static kiln_status f_trim(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name;
    json_t *s = str_of(v);
    if (!s) return OOM;
    kiln_status st = strip_method(c, at, "strip", s, jl_arg(a, 0, "chars", NULL), out);
    json_decref(s);
    return st;
}

static kiln_status f_tojson(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name;
    json_t *ind = jl_arg(a, 1, "indent", NULL), *asc = jl_arg(a, 0, "ensure_ascii", NULL);
    json_t *seps = jl_arg(a, 2, "separators", NULL), *sk = jl_arg(a, 3, "sort_keys", NULL);
    long long indent = -1;
    if (ind && !json_is_null(ind) && (!int_arg(ind, &indent) || indent < 0 || indent > 64))
        return jl_rerr(c, at, "tojson: indent must be a small non-negative integer");
    if (asc && jl_truthy(asc)) return jl_rerr(c, at, "tojson(ensure_ascii=True) is outside kiln's Jinja subset");
    const char *isep = NULL, *ksep = NULL;
    if (seps && !json_is_null(seps)) {
        if (!json_is_array(seps) || json_array_size(seps) != 2 || !json_is_string(json_array_get(seps, 0)) ||
            !json_is_string(json_array_get(seps, 1)))
            return jl_rerr(c, at, "tojson: separators must be two strings");
        isep = jl_s(json_array_get(seps, 0));
        ksep = jl_s(json_array_get(seps, 1));
    }
    jbuf b = {0};
    kiln_status st = jl_tojson(&b, v, (int)indent, sk && jl_truthy(sk), isep, ksep);
    if (st) return free(b.s), jl_rerr(c, at, "tojson: %s", kiln_last_error());
    *out = b.oom ? NULL : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? KILN_OK : OOM;
}

static kiln_status f_length(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name, (void)a;
    return length(c, at, v, out);
}

static kiln_status f_first_last(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)a;
    const char *err;
    json_t *items = jl_iter_list(v, &err);
    if (!items) return jl_rerr(c, at, "%s: %s", name, err);
    size_t n = json_array_size(items);
    *out = n ? json_incref(json_array_get(items, name[0] == 'f' ? 0 : n - 1)) : NULL;
    json_decref(items);
    return KILN_OK;
}

static kiln_status f_case(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)a;
    json_t *s = str_of(v);
    if (!s) return OOM;
    kiln_status st = casemap(c, at, name, s, out);
    json_decref(s);
    return st;
}

static kiln_status f_string(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)c, (void)at, (void)name, (void)a;
    return (*out = str_of(v)) ? KILN_OK : OOM;
}

static kiln_status f_safe(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)c, (void)at, (void)name, (void)a;
    *out = json_incref(v);
    return KILN_OK;
}

static kiln_status f_default(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)c, (void)at, (void)name;
    json_t *dv = jl_arg(a, 0, "default_value", NULL), *bo = jl_arg(a, 1, "boolean", NULL);
    bool use = !v || (bo && jl_truthy(bo) && !jl_truthy(v));
    *out = use ? (dv ? json_incref(dv) : json_string("")) : json_incref(v);
    return KILN_OK;
}

static kiln_status f_join(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name;
    const char *err;
    json_t *d = jl_arg(a, 0, "d", NULL), *attr = jl_arg(a, 1, "attribute", NULL);
    if (d && !json_is_string(d)) return jl_rerr(c, at, "join: the separator must be a string");
    json_t *items = jl_iter_list(v, &err);
    if (!items) return jl_rerr(c, at, "join: %s", err);
    jbuf b = {0};
    for (size_t i = 0; i < json_array_size(items); i++) {
        if (i && d) jb_put(&b, jl_s(d), jl_n(d));
        json_t *x = json_array_get(items, i);
        if (attr) {
            json_t *y = jl_getitem(x, attr);
            jl_str(&b, y);
            json_decref(y);
        } else {
            jl_str(&b, x);
        }
    }
    json_decref(items);
    *out = b.oom ? NULL : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? KILN_OK : OOM;
}

static kiln_status f_list(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name, (void)a;
    const char *err;
    *out = jl_iter_list(v, &err);
    return *out ? KILN_OK : jl_rerr(c, at, "list: %s", err ? err : "out of memory");
}

static kiln_status f_reverse(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name, (void)a;
    const char *err;
    json_t *items = jl_iter_list(v, &err);
    if (!items) return jl_rerr(c, at, "reverse: %s", err);
    json_t *r = json_is_string(v) ? NULL : json_array();
    jbuf b = {0};
    for (size_t i = json_array_size(items); i > 0; i--) {
        json_t *x = json_array_get(items, i - 1);
        if (r) json_array_append(r, x);
        else jb_put(&b, jl_s(x), jl_n(x));
    }
    json_decref(items);
    *out = r ? r : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? KILN_OK : OOM;
}

static kiln_status f_items(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name, (void)a;
    if (!v) return (*out = json_array()) ? KILN_OK : OOM;
    if (!json_is_object(v)) return jl_rerr(c, at, "items: needs a mapping, got %s", type_name(v));
    jargs none = {0};
    return jl_method(c, at, v, "items", &none, out);
}

static kiln_status f_replace(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name;
    kiln_status st = KILN_OK;
    json_t *s = str_of(v);
    long long cnt = -1;
    json_t *a2 = jl_arg(a, 2, NULL, NULL);
    if (a2 && !int_arg(a2, &cnt)) st = jl_rerr(c, at, "replace: count must be an integer");
    if (!st) st = s ? replace(c, at, s, jl_arg(a, 0, NULL, NULL), jl_arg(a, 1, NULL, NULL), cnt, out) : OOM;
    json_decref(s);
    return st;
}

static kiln_status f_map(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name;
    kiln_status st = KILN_OK;
    const char *err;
    json_t *a0 = jl_arg(a, 0, NULL, NULL);
    json_t *attr = jl_arg(a, -1, "attribute", NULL), *dflt = jl_arg(a, -1, "default", NULL);
    if (!attr && (!a0 || !json_is_string(a0))) return jl_rerr(c, at, "map needs attribute=NAME or a filter name");
    json_t *items = jl_iter_list(v, &err), *l = json_array();
    if (!items || !l) return json_decref(items), json_decref(l), items ? OOM : jl_rerr(c, at, "map: %s", err);
    jargs none = {0};
    for (size_t i = 0; i < json_array_size(items) && !st; i++) {
        json_t *x = json_array_get(items, i), *y = NULL;
        if (attr) {
            y = jl_getitem(x, attr);
            if (!y && dflt) y = json_incref(dflt);
            if (!y) st = jl_rerr(c, at, "map: item %zu has no attribute (Undefined in a list)", i);
        } else {
            st = jl_filter(c, at, jl_s(a0), x, &none, &y);
        }
        if (!st) json_array_append_new(l, y ? y : json_null());
    }
    json_decref(items);
    if (st) return json_decref(l), st;
    *out = l;
    return KILN_OK;
}

static kiln_status f_select(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    return select_items(c, at, name, v, a, out);
}

static kiln_status f_abs(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name, (void)a;
    if (v && json_is_integer(v)) {
        if (json_integer_value(v) == LLONG_MIN)
            return jl_rerr(c, at, "abs: the integer result does not fit in 64 bits (Jinja2 would give a big integer; kiln refuses)");
        *out = json_integer(llabs(json_integer_value(v)));
    } else if (v && json_is_real(v)) *out = json_real(fabs(json_real_value(v)));
    else return jl_rerr(c, at, "abs: needs a number, got %s", type_name(v));
    return KILN_OK;
}

static kiln_status f_int(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)name;
    json_t *d = jl_arg(a, 0, "default", NULL);
    if (v && json_is_integer(v)) *out = json_incref(v);
    else if (v && json_is_real(v)) {
        double x = json_real_value(v);
        if (isnan(x)) *out = d ? json_incref(d) : json_integer(0); /* Jinja2: int(nan) fails, the default */
        else if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0))
            return jl_rerr(c, at, "int: %s does not fit in 64 bits (Jinja2 would give a big integer or fail; kiln refuses)",
                           isinf(x) ? "infinity" : "the value");
        else *out = json_integer((json_int_t)x);
    } else if (v && json_is_boolean(v)) *out = json_integer(json_is_true(v));
    else if (v && json_is_string(v)) {
        const char *t = jl_s(v);
        int64_t x = 0;
        t += strspn(t, " \t\n\r\f\v"); /* Python's int() skips leading blanks */
        if (!kiln_parse_i64(t, INT64_MIN, INT64_MAX, &x)) *out = json_integer(x);
        else return jl_rerr(c, at, "int of a non-integer string is outside kiln's Jinja subset");
    } else *out = d ? json_incref(d) : json_integer(0);
    return KILN_OK;
}

static kiln_status f_escape(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    (void)c, (void)at, (void)name, (void)a;
    json_t *s = str_of(v);
    if (!s) return OOM;
    jbuf b = {0};
    for (size_t i = 0; i < jl_n(s); i++) {
        char ch = jl_s(s)[i];
        if (ch == '&') jb_puts(&b, "&amp;");
        else if (ch == '<') jb_puts(&b, "&lt;");
        else if (ch == '>') jb_puts(&b, "&gt;");
        else if (ch == '"') jb_puts(&b, "&#34;");
        else if (ch == '\'') jb_puts(&b, "&#39;");
        else jb_putc(&b, ch);
    }
    json_decref(s);
    *out = b.oom ? NULL : jl_string(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? KILN_OK : OOM;
}

static const char *const trim_kws[] = {"chars", NULL};
static const char *const tojson_kws[] = {"indent", "ensure_ascii", "separators", "sort_keys", NULL};
static const char *const default_kws[] = {"default_value", "boolean", NULL};
static const char *const join_kws[] = {"d", "attribute", NULL};
static const char *const map_kws[] = {"attribute", "default", NULL};
static const char *const int_kws[] = {"default", NULL};
/* sorted by name (bsearch) */
static const filter_def filter_table[] = {
    {"abs", f_abs, 0, NULL},          {"capitalize", f_case, 0, NULL},      {"count", f_length, 0, NULL},
    {"d", f_default, 2, default_kws}, {"default", f_default, 2, default_kws}, {"e", f_escape, -1, NULL},
    {"escape", f_escape, -1, NULL},   {"first", f_first_last, 0, NULL},     {"int", f_int, 1, int_kws},
    {"items", f_items, 0, NULL},      {"join", f_join, 2, join_kws},        {"last", f_first_last, 0, NULL},
    {"length", f_length, 0, NULL},    {"list", f_list, 0, NULL},            {"lower", f_case, 0, NULL},
    {"map", f_map, 1, map_kws},       {"reject", f_select, -1, NULL},       {"rejectattr", f_select, -1, NULL},
    {"replace", f_replace, 3, NULL},  {"reverse", f_reverse, 0, NULL},      {"safe", f_safe, 0, NULL},
    {"select", f_select, -1, NULL},   {"selectattr", f_select, -1, NULL},   {"string", f_string, 0, NULL},
    {"title", f_case, 0, NULL},       {"tojson", f_tojson, 4, tojson_kws},  {"trim", f_trim, 1, trim_kws},
    {"upper", f_case, 0, NULL},
};

const void *jl_filter_find(const char *name) { return FIND(filter_table, name); }

kiln_status jl_filter(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, json_t **out) {
    const filter_def *f = at && at->kind == JN_FILTER && at->name == name ? at->impl : jl_filter_find(name);
    if (!f) return jl_rerr(c, at, "filter '%s' is outside kiln's Jinja subset", name);
    kiln_status st = f->max_pos >= 0 ? jl_args_check(c, at, name, a, f->max_pos, f->kws) : KILN_OK;
    return st ? st : f->fn(c, at, name, v, a, out);
}

/* ---- tests: a table {name, function}; every test takes at most one
 * positional argument, checked first (also for names kiln lacks) ---- */

typedef kiln_status (*test_fn)(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r);
typedef struct {
    const char *name;
    test_fn fn;
} test_def;

static int kind_of(const json_t *v) { return v ? (int)json_typeof(v) : -1; }

#define TYPE_TEST(fname, expr)                                                                                  \
    static kiln_status fname(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, \
                             bool *r) {                                                                         \
        (void)c, (void)at, (void)name, (void)a0, (void)present;                                                 \
        int t = kind_of(v);                                                                                     \
        (void)t;                                                                                                \
        *r = (expr);                                                                                            \
        return KILN_OK;                                                                                         \
    }
TYPE_TEST(t_defined, v != NULL)
TYPE_TEST(t_undefined, v == NULL)
TYPE_TEST(t_none, t == JSON_NULL)
TYPE_TEST(t_string, t == JSON_STRING)
TYPE_TEST(t_mapping, t == JSON_OBJECT)
TYPE_TEST(t_number, t == JSON_INTEGER || t == JSON_REAL || t == JSON_TRUE || t == JSON_FALSE)
TYPE_TEST(t_integer, t == JSON_INTEGER)
TYPE_TEST(t_float, t == JSON_REAL)
TYPE_TEST(t_boolean, t == JSON_TRUE || t == JSON_FALSE)
TYPE_TEST(t_true, t == JSON_TRUE)
TYPE_TEST(t_false, t == JSON_FALSE)
TYPE_TEST(t_iterable, !v || t == JSON_STRING || t == JSON_ARRAY || t == JSON_OBJECT)
TYPE_TEST(t_callable, false)

static kiln_status t_parity(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r) {
    (void)present;
    long long x, d = 2;
    if (!int_arg(v, &x)) return jl_rerr(c, at, "test '%s' needs an integer, got %s", name, type_name(v));
    if (name[0] == 'd' && (!int_arg(a0, &d) || d == 0)) return jl_rerr(c, at, "divisibleby needs a non-zero integer");
    long long m = d == -1 ? 0 : x % d; /* INT64_MIN % -1 overflows; the sign of m does not matter */
    *r = name[0] == 'o' ? m != 0 : m == 0;
    return KILN_OK;
}

static kiln_status t_eq(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r) {
    if (!present) return jl_rerr(c, at, "test '%s' needs an argument", name);
    *r = jl_equal(v, a0);
    if (name[0] == 's' && v && a0 && json_typeof(v) != json_typeof(a0)) *r = false;
    return KILN_OK;
}

static kiln_status t_ne(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r) {
    if (!present) return jl_rerr(c, at, "test '%s' needs an argument", name);
    *r = !jl_equal(v, a0);
    return KILN_OK;
}

static kiln_status t_order(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r) {
    (void)present;
    char err[160];
    bool lt;
    bool less = name[0] == 'l';
    if (!jl_less(less ? v : a0, less ? a0 : v, &lt, err, sizeof err)) return jl_rerr(c, at, "%s", err);
    bool eq = name[1] == 'e' && !name[2];
    *r = eq ? (lt || jl_equal(v, a0)) : lt;
    return KILN_OK;
}

static kiln_status t_in(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r) {
    (void)name, (void)present;
    if (!a0) return jl_rerr(c, at, "test 'in' needs a container");
    if (json_is_array(a0)) {
        *r = false;
        for (size_t i = 0; i < json_array_size(a0); i++) *r |= jl_equal(v, json_array_get(a0, i));
    } else if (json_is_object(a0)) {
        *r = v && json_is_string(v) && json_object_get(a0, jl_s(v));
    } else if (json_is_string(a0) && v && json_is_string(v)) {
        *r = jl_n(v) == 0 || memmem(jl_s(a0), jl_n(a0), jl_s(v), jl_n(v)) != NULL;
    } else {
        return jl_rerr(c, at, "test 'in': unsupported operands");
    }
    return KILN_OK;
}

static kiln_status t_case(jrctx *c, const jnode *at, const char *name, json_t *v, json_t *a0, bool present, bool *r) {
    (void)a0, (void)present;
    json_t *s = str_of(v);
    if (!s) return OOM;
    bool cased = false, ok = ascii(jl_s(s), jl_n(s));
    for (size_t i = 0; i < jl_n(s); i++) {
        char ch = jl_s(s)[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) cased = true;
        if (name[0] == 'l' ? (ch >= 'A' && ch <= 'Z') : (ch >= 'a' && ch <= 'z')) ok = false;
    }
    bool non_ascii = !ascii(jl_s(s), jl_n(s));
    json_decref(s);
    if (non_ascii) return jl_rerr(c, at, "test '%s' on non-ASCII text is outside kiln's Jinja subset", name);
    *r = ok && cased;
    return KILN_OK;
}

/* sorted by strcmp (bsearch): "!=" and "==" come first */
static const test_def test_table[] = {
    {"!=", t_ne},           {"==", t_eq},          {"boolean", t_boolean}, {"callable", t_callable},
    {"defined", t_defined}, {"divisibleby", t_parity}, {"eq", t_eq},       {"equalto", t_eq},
    {"even", t_parity},     {"false", t_false},    {"float", t_float},     {"ge", t_order},
    {"greaterthan", t_order}, {"gt", t_order},     {"in", t_in},           {"integer", t_integer},
    {"iterable", t_iterable}, {"le", t_order},     {"lessthan", t_order},  {"lower", t_case},
    {"lt", t_order},        {"mapping", t_mapping}, {"ne", t_ne},          {"none", t_none},
    {"number", t_number},   {"odd", t_parity},     {"sameas", t_eq},       {"sequence", t_iterable},
    {"string", t_string},   {"true", t_true},      {"undefined", t_undefined}, {"upper", t_case},
};

const void *jl_test_find(const char *name) { return FIND(test_table, name); }

kiln_status jl_test(jrctx *c, const jnode *at, const char *name, json_t *v, const jargs *a, bool *r) {
    bool pres;
    json_t *a0 = jl_arg(a, 0, NULL, &pres);
    kiln_status st = jl_args_check(c, at, name, a, 1, NULL);
    if (st) return st;
    const test_def *t = at && at->kind == JN_TEST && at->name == name ? at->impl : jl_test_find(name);
    if (!t) return jl_rerr(c, at, "test '%s' is outside kiln's Jinja subset", name);
    return t->fn(c, at, name, v, a0, pres, r);
}
