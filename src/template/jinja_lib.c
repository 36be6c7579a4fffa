/* The Jinja subset's value semantics, as Python has them: str(), repr(),
 * json.dumps (Hugging Face's tojson), truthiness, ==, <, and the UTF-8
 * helpers (Python strings count code points; str.isspace()). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jinja_impl.h"

/* Charged to the render budget: the bytes and a string's overhead. */
json_t *jl_string(const char *s, size_t n) { return jl_charge(n + 32) ? json_stringn_nocheck(s, n) : NULL; }

size_t jl_utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t jl_utf8_off(const char *s, size_t n, size_t i) {
    size_t k = 0, p = 0;
    while (p < n) {
        if (((unsigned char)s[p] & 0xC0) != 0x80) {
            if (k == i) return p;
            k++;
        }
        p++;
    }
    return n;
}

static uint32_t decode_cp(const char *s, size_t n, size_t *len) {
    unsigned char c = (unsigned char)s[0];
    size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (l > n) l = n;
    uint32_t cp = l == 1 ? c : l == 2 ? c & 0x1F : l == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < l; i++) cp = cp << 6 | ((unsigned char)s[i] & 0x3F);
    *len = l;
    return cp;
}

/* Python 3's str.isspace() code points. */
bool jl_space_at(const char *s, size_t n, size_t *len) {
    if (n == 0) return false;
    uint32_t cp = decode_cp(s, n, len);
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* Whether code point at s is one of chars (a UTF-8 set). */
static bool in_set(const char *s, size_t l, const char *chars, size_t cn) {
    size_t i = 0, cl;
    while (i < cn) {
        decode_cp(chars + i, cn - i, &cl);
        if (cl == l && !memcmp(chars + i, s, l)) return true;
        i += cl;
    }
    return false;
}

void jl_strip(const char *s, size_t n, const char *chars, size_t cn, bool left, bool right, size_t *b, size_t *e) {
    size_t i = 0, j = n, l;
    if (left)
        while (i < n) {
            if (chars ? (decode_cp(s + i, n - i, &l), !in_set(s + i, l, chars, cn)) : !jl_space_at(s + i, n - i, &l)) break;
            i += l;
        }
    if (right)
        while (j > i) {
            size_t k = j - 1;
            while (k > i && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
            bool strip = chars ? (decode_cp(s + k, j - k, &l), in_set(s + k, j - k, chars, cn)) : (jl_space_at(s + k, j - k, &l) && l == j - k);
            if (!strip) break;
            j = k;
        }
    *b = i;
    *e = j;
}

/* Python float repr: the shortest digits that round-trip, fixed notation
 * for exponents in [-4, 16), else d.ddde+XX. */
static void put_float(jbuf *b, double x, bool json) {
    if (isnan(x)) return jb_puts(b, json ? "NaN" : "nan");
    if (isinf(x)) return jb_puts(b, x > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
    char tmp[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        double back = 0;
        if (!kiln_parse_f64(tmp, -DBL_MAX, DBL_MAX, &back) && back == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[32];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int ex = 0;
    kiln_parse_int(q + 1, -400, 400, &ex); /* "e+05", written by snprintf above */
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) jb_putc(b, '-');
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            jb_puts(b, "0.");
            for (int i = 0; i < -ex - 1; i++) jb_putc(b, '0');
            jb_put(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= ex; i++) jb_putc(b, i < nd ? digits[i] : '0');
            jb_putc(b, '.');
            if (nd > ex + 1) jb_put(b, digits + ex + 1, (size_t)(nd - ex - 1));
            else jb_putc(b, '0');
        }
    } else {
        jb_putc(b, digits[0]);
        if (nd > 1) {
            jb_putc(b, '.');
            jb_put(b, digits + 1, (size_t)(nd - 1));
        }
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
        jb_puts(b, e);
    }
}

static void put_int(jbuf *b, json_int_t v) {
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)v);
    jb_puts(b, t);
}

static void repr_string(jbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    jb_putc(b, quote);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == (unsigned char)quote || c == '\\') {
            jb_putc(b, '\\');
            jb_putc(b, (char)c);
        } else if (c == '\n') jb_puts(b, "\\n");
        else if (c == '\r') jb_puts(b, "\\r");
        else if (c == '\t') jb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            jb_puts(b, e);
        } else jb_putc(b, (char)c);
    }
    jb_putc(b, quote);
}

void jl_repr(jbuf *b, const json_t *v) {
    if (!v) return;
    switch (json_typeof(v)) {
    case JSON_STRING: repr_string(b, jl_s(v), jl_n(v)); return;
    case JSON_ARRAY: {
        jb_putc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) jb_puts(b, ", ");
            jl_repr(b, json_array_get(v, i));
        }
        jb_putc(b, ']');
        return;
    }
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        jb_putc(b, '{');
        json_object_foreach((json_t *)v, k, x) {
            if (!first) jb_puts(b, ", ");
            first = false;
            repr_string(b, k, strlen(k));
            jb_puts(b, ": ");
            jl_repr(b, x);
        }
        jb_putc(b, '}');
        return;
    }
    default: jl_str(b, v);
    }
}

void jl_str(jbuf *b, const json_t *v) {
    if (!v) return;
    switch (json_typeof(v)) {
    case JSON_STRING: jb_put(b, jl_s(v), jl_n(v)); return;
    case JSON_INTEGER: put_int(b, json_integer_value(v)); return;
    case JSON_REAL: put_float(b, json_real_value(v), false); return;
    case JSON_TRUE: jb_puts(b, "True"); return;
    case JSON_FALSE: jb_puts(b, "False"); return;
    case JSON_NULL: jb_puts(b, "None"); return;
    default: jl_repr(b, v);
    }
}

static void json_string_out(jbuf *b, const char *s, size_t n) {
    jb_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') jb_puts(b, "\\\"");
        else if (c == '\\') jb_puts(b, "\\\\");
        else if (c == '\n') jb_puts(b, "\\n");
        else if (c == '\r') jb_puts(b, "\\r");
        else if (c == '\t') jb_puts(b, "\\t");
        else if (c == '\b') jb_puts(b, "\\b");
        else if (c == '\f') jb_puts(b, "\\f");
        else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            jb_puts(b, e);
        } else jb_putc(b, (char)c);
    }
    jb_putc(b, '"');
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static kiln_status dump(jbuf *b, const json_t *v, int indent, int level, bool sort, const char *isep, const char *ksep) {
    if (!v) return kiln_error(KILN_ERR_INVALID, "tojson: an undefined value is not JSON serializable");
    switch (json_typeof(v)) {
    case JSON_STRING: json_string_out(b, jl_s(v), jl_n(v)); return KILN_OK;
    case JSON_INTEGER: put_int(b, json_integer_value(v)); return KILN_OK;
    case JSON_REAL: put_float(b, json_real_value(v), true); return KILN_OK;
    case JSON_TRUE: jb_puts(b, "true"); return KILN_OK;
    case JSON_FALSE: jb_puts(b, "false"); return KILN_OK;
    case JSON_NULL: jb_puts(b, "null"); return KILN_OK;
    default: break;
    }
    bool arr = json_is_array(v);
    size_t n = arr ? json_array_size(v) : json_object_size(v);
    if (n == 0) {
        jb_puts(b, arr ? "[]" : "{}");
        return KILN_OK;
    }
    const char **keys = NULL;
    if (!arr) {
        keys = malloc(n * sizeof *keys);
        if (!keys) return kiln_error(KILN_ERR_OOM, "out of memory");
        size_t k = 0;
        const char *key;
        json_t *x;
        json_object_foreach((json_t *)v, key, x) keys[k++] = key;
        if (sort) qsort(keys, n, sizeof *keys, cmp_keys);
    }
    jb_putc(b, arr ? '[' : '{');
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && !st; i++) {
        if (i) jb_puts(b, isep);
        if (indent >= 0) {
            jb_putc(b, '\n');
            for (int s = 0; s < indent * (level + 1); s++) jb_putc(b, ' ');
        }
        if (!arr) {
            json_string_out(b, keys[i], strlen(keys[i]));
            jb_puts(b, ksep);
        }
        st = dump(b, arr ? json_array_get(v, i) : json_object_get(v, keys[i]), indent, level + 1, sort, isep, ksep);
    }
    if (indent >= 0) {
        jb_putc(b, '\n');
        for (int s = 0; s < indent * level; s++) jb_putc(b, ' ');
    }
    jb_putc(b, arr ? ']' : '}');
    free(keys);
    return st;
}

kiln_status jl_tojson(jbuf *b, const json_t *v, int indent, bool sort_keys, const char *item_sep, const char *key_sep) {
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    return dump(b, v, indent, 0, sort_keys, item_sep, key_sep);
}

bool jl_truthy(const json_t *v) {
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_STRING: return jl_n(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return true;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    default: return false;
    }
}

static bool is_num(const json_t *v) { return v && (json_is_number(v) || json_is_boolean(v)); }
static double num(const json_t *v) { return json_is_boolean(v) ? (json_is_true(v) ? 1 : 0) : json_number_value(v); }

bool jl_equal(const json_t *a, const json_t *b) {
    if (!a || !b) return !a && !b;
    if (is_num(a) && is_num(b)) {
        if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
        return num(a) == num(b);
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    switch (json_typeof(a)) {
    case JSON_STRING: return jl_n(a) == jl_n(b) && !memcmp(jl_s(a), jl_s(b), jl_n(a));
    case JSON_NULL: return true;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jl_equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)a, k, x) {
            json_t *y = json_object_get(b, k);
            if (!y || !jl_equal(x, y)) return false;
        }
        return true;
    }
    default: return false;
    }
}

bool jl_less(const json_t *a, const json_t *b, bool *lt, char *err, size_t errn) {
    if (is_num(a) && is_num(b)) {
        if (json_is_integer(a) && json_is_integer(b)) *lt = json_integer_value(a) < json_integer_value(b);
        else *lt = num(a) < num(b);
        return true;
    }
    if (a && b && json_is_string(a) && json_is_string(b)) {
        size_t n = jl_n(a) < jl_n(b) ? jl_n(a) : jl_n(b);
        int c = memcmp(jl_s(a), jl_s(b), n);
        *lt = c < 0 || (c == 0 && jl_n(a) < jl_n(b));
        return true;
    }
    if (a && b && json_is_array(a) && json_is_array(b)) {
        size_t n = json_array_size(a) < json_array_size(b) ? json_array_size(a) : json_array_size(b);
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
            if (!jl_equal(x, y)) return jl_less(x, y, lt, err, errn);
        }
        *lt = json_array_size(a) < json_array_size(b);
        return true;
    }
    snprintf(err, errn, "'<' is not supported between %s and %s", !a ? "undefined" : json_is_null(a) ? "None" : "these values",
             !b ? "undefined" : json_is_null(b) ? "None" : "these values");
    return false;
}
