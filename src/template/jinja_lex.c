/* The Jinja subset for chat templates: node and buffer helpers, and the
 * lexer.
 *
 * The lexer follows Jinja2's (3.x) rules as Hugging Face configures them:
 * trim_blocks (a block or comment tag eats one newline after it),
 * lstrip_blocks (spaces before a block or comment tag at the start of a line
 * go), `{%-`/`-%}` (all whitespace before/after goes), `{%+` (no lstrip),
 * newlines normalised to "\n" and one trailing newline dropped
 * (keep_trailing_newline=False). */
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jinja_impl.h"

kiln_status jl_lex_error(const lexer *L, int line, int col, const char *fmt, const char *a, const char *b) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    return kiln_error(KILN_ERR_FORMAT, "%s:%d:%d: %s", L->name, line, col, msg);
}

/* ---- nodes and buffers ---- */

jnode *jn_new(jn_kind kind, int line, int col) {
    jnode *n = calloc(1, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = line;
        n->col = col;
    }
    return n;
}

_Thread_local jl_budget *jl_cur_budget;

bool jn_add(jnode *n, jnode *kid, const char *name) {
    jnode **k = realloc(n->kids, (size_t)(n->n_kids + 1) * sizeof *k);
    if (!k) return false;
    n->kids = k;
    char **nm = realloc(n->names, (size_t)(n->n_kids + 1) * sizeof *nm);
    if (!nm) return false;
    n->names = nm;
    nm[n->n_kids] = name ? strdup(name) : NULL;
    k[n->n_kids++] = kid;
    if (kid && kid->height + 1 > n->height) n->height = kid->height + 1;
    return true;
}

void jn_free(jnode *n) {
    if (!n) return;
    for (int i = 0; i < n->n_kids; i++) {
        jn_free(n->kids[i]);
        if (n->names) free(n->names[i]);
    }
    free(n->kids);
    free(n->names);
    free(n->ops);
    free(n->name);
    free(n->text);
    json_decref(n->value);
    free(n);
}

void jb_put(jbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (!jl_charge(n)) {
        b->oom = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->s, c);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }

/* ---- lexer ---- */


/* Advances the position over n bytes, counting lines and code points. */
static void adv(lexer *L, size_t n) {
    for (size_t i = 0; i < n && L->pos < L->n; i++) {
        unsigned char c = (unsigned char)L->src[L->pos++];
        if (c == '\n') {
            L->line++;
            L->col = 1;
        } else if ((c & 0xC0) != 0x80) {
            L->col++;
        }
    }
}

static bool push(lexer *L, tkind k, int line, int col, const char *s, size_t n) {
    if (L->n_toks == L->cap) {
        size_t c = L->cap ? L->cap * 2 : 256;
        token *t = realloc(L->toks, c * sizeof *t);
        if (!t) return false;
        L->toks = t;
        L->cap = c;
    }
    token *t = &L->toks[L->n_toks];
    memset(t, 0, sizeof *t);
    t->kind = k;
    t->line = line;
    t->col = col;
    if (s) {
        t->s = malloc(n + 1);
        if (!t->s) return false;
        memcpy(t->s, s, n);
        t->s[n] = 0;
        t->n = n;
    }
    L->n_toks++;
    return true;
}

/* Length of the whitespace run at s (Python's \s, Unicode). */
static size_t ws_run(const char *s, size_t n) {
    size_t i = 0, l;
    while (i < n && jl_space_at(s + i, n - i, &l)) i += l;
    return i;
}

/* Python's text.rstrip(): the length kept. */
static size_t rstrip_len(const char *s, size_t n) {
    size_t b, e;
    jl_strip(s, n, NULL, 0, false, true, &b, &e);
    return e;
}

static const char *const ops3[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char single_ops[] = "+-/*%~[](){}<>=.:|,;";

/* Unescapes a Python string literal body (what Jinja2 does with
 * "unicode-escape"); appends to b. */
static kiln_status unescape(lexer *L, int line, int col, const char *s, size_t n, jbuf *b) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            jb_putc(b, s[i]);
            continue;
        }
        char c = s[++i];
        unsigned cp = 0;
        int hex = 0;
        switch (c) {
        case 'n': jb_putc(b, '\n'); continue;
        case 't': jb_putc(b, '\t'); continue;
        case 'r': jb_putc(b, '\r'); continue;
        case '\\': jb_putc(b, '\\'); continue;
        case '\'': jb_putc(b, '\''); continue;
        case '"': jb_putc(b, '"'); continue;
        case 'a': jb_putc(b, '\a'); continue;
        case 'b': jb_putc(b, '\b'); continue;
        case 'f': jb_putc(b, '\f'); continue;
        case 'v': jb_putc(b, '\v'); continue;
        case '\n': continue;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (c >= '0' && c <= '7')
                return jl_lex_error(L, line, col, "octal escape \\%c in a string literal is outside kiln's Jinja subset",
                            (char[]){c, 0}, NULL);
            jb_putc(b, '\\');
            jb_putc(b, c);
            continue;
        }
        for (int k = 0; k < hex; k++) {
            char h = ++i < n ? s[i] : 0;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return jl_lex_error(L, line, col, "truncated \\%s escape in a string literal", (char[]){c, 0}, NULL);
            cp = cp * 16 + (unsigned)d;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
            return jl_lex_error(L, line, col, "escape to an invalid code point in a string literal", NULL, NULL);
        char u[4];
        size_t k = 0;
        if (cp < 0x80) u[k++] = (char)cp;
        else if (cp < 0x800) u[k++] = (char)(0xC0 | (cp >> 6)), u[k++] = (char)(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            u[k++] = (char)(0xE0 | (cp >> 12)), u[k++] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[k++] = (char)(0x80 | (cp & 0x3F));
        else
            u[k++] = (char)(0xF0 | (cp >> 18)), u[k++] = (char)(0x80 | ((cp >> 12) & 0x3F)),
            u[k++] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[k++] = (char)(0x80 | (cp & 0x3F));
        jb_put(b, u, k);
    }
    return b->oom ? kiln_error(KILN_ERR_OOM, "out of memory") : KILN_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* Tokens inside {{ }} or {% %} up to the end tag. *line_starting: whether
 * the end tag's match ended with a newline. */
static kiln_status lex_tag(lexer *L, bool block, bool *line_starting) {
    char stack[256];
    int depth = 0;
    const char *s = L->src;
    for (;;) {
        size_t p = L->pos, rest = L->n - p;
        int line = L->line, col = L->col;
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t m = 0;
            bool strip = false;
            if (rest >= 3 && (s[p] == '-' || (block && s[p] == '+')) && !memcmp(s + p + 1, end, 2)) {
                m = 3;
                strip = s[p] == '-';
            } else if (rest >= 2 && !memcmp(s + p, end, 2)) {
                m = 2;
                if (block && rest > 2 && s[p + 2] == '\n') m = 3; /* trim_blocks */
            }
            if (m) {
                if (strip) m += ws_run(s + p + m, rest - m);
                *line_starting = s[p + m - 1] == '\n';
                adv(L, m);
                return push(L, block ? T_BLOCK_END : T_VAR_END, line, col, NULL, 0) ? KILN_OK
                                                                                    : kiln_error(KILN_ERR_OOM, "out of memory");
            }
        }
        if (rest == 0)
            return jl_lex_error(L, line, col, "unexpected end of template inside %s", block ? "a {% %} tag" : "a {{ }} tag", NULL);
        size_t w = ws_run(s + p, rest);
        if (w) {
            adv(L, w);
            continue;
        }
        char c = s[p];
        if (is_digit(c)) {
            size_t q = p;
            while (q < L->n && (is_digit(s[q]) || s[q] == '_')) q++;
            bool flt = false;
            if (q + 1 < L->n && s[q] == '.' && is_digit(s[q + 1])) {
                flt = true;
                q++;
                while (q < L->n && (is_digit(s[q]) || s[q] == '_')) q++;
            }
            if (q < L->n && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < L->n && (s[r] == '+' || s[r] == '-')) r++;
                if (r < L->n && is_digit(s[r])) {
                    flt = true;
                    q = r;
                    while (q < L->n && is_digit(s[q])) q++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t i = p; i < q && k < sizeof num - 1; i++)
                if (s[i] != '_') num[k++] = s[i];
            num[k] = 0;
            if (!push(L, flt ? T_FLOAT : T_INT, line, col, num, k)) return kiln_error(KILN_ERR_OOM, "out of memory");
            token *t = &L->toks[L->n_toks - 1];
            int64_t iv = 0;
            if (flt ? kiln_parse_f64(num, -DBL_MAX, DBL_MAX, &t->f) : kiln_parse_i64(num, INT64_MIN, INT64_MAX, &iv))
                return jl_lex_error(L, line, col, "number %s is out of range", num, NULL);
            if (!flt) t->i = iv;
            adv(L, q - p);
            continue;
        }
        if (is_name0(c)) {
            size_t q = p;
            while (q < L->n && (is_name0(s[q]) || is_digit(s[q]))) q++;
            if (!push(L, T_NAME, line, col, s + p, q - p)) return kiln_error(KILN_ERR_OOM, "out of memory");
            adv(L, q - p);
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < L->n && s[q] != c) q += s[q] == '\\' ? 2 : 1;
            if (q >= L->n) return jl_lex_error(L, line, col, "unterminated string literal", NULL, NULL);
            jbuf b = {0};
            kiln_status st = unescape(L, line, col, s + p + 1, q - p - 1, &b);
            if (!st && !push(L, T_STRING, line, col, b.s ? b.s : "", b.n)) st = kiln_error(KILN_ERR_OOM, "out of memory");
            free(b.s);
            if (st) return st;
            adv(L, q + 1 - p);
            continue;
        }
        size_t m = 0;
        for (int k = 0; ops3[k]; k++)
            if (rest >= 2 && !memcmp(s + p, ops3[k], 2)) m = 2;
        if (!m && strchr(single_ops, c) && c) m = 1;
        if (!m) {
            char ch[8] = {0};
            size_t cl = 1;
            while (cl < 4 && p + cl < L->n && ((unsigned char)s[p + cl] & 0xC0) == 0x80) cl++;
            memcpy(ch, s + p, cl);
            return jl_lex_error(L, line, col, "unexpected character '%s' in a tag", ch, NULL);
        }
        if (m == 1 && (c == '(' || c == '[' || c == '{')) {
            if (depth == (int)sizeof stack) {
                char lim[16];
                snprintf(lim, sizeof lim, "%d", (int)sizeof stack);
                return jl_lex_error(L, line, col, "brackets nested deeper than %s levels (kiln's limit)", lim, NULL);
            }
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (m == 1 && (c == ')' || c == ']' || c == '}')) {
            if (depth == 0 || stack[depth - 1] != c) return jl_lex_error(L, line, col, "unexpected '%s'", (char[]){c, 0}, NULL);
            depth--;
        }
        if (!push(L, T_OP, line, col, s + p, m)) return kiln_error(KILN_ERR_OOM, "out of memory");
        adv(L, m);
    }
}

kiln_status jl_lex(lexer *L) {
    bool line_starting = true;
    const char *s = L->src;
    while (L->pos < L->n) {
        size_t p = L->pos;
        const char *t = NULL;
        for (size_t q = p; q + 1 < L->n; q++)
            if (s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
                t = s + q;
                break;
            }
        int line = L->line, col = L->col;
        if (!t) {
            if (!push(L, T_DATA, line, col, s + p, L->n - p)) return kiln_error(KILN_ERR_OOM, "out of memory");
            adv(L, L->n - p);
            break;
        }
        size_t tp = (size_t)(t - s), text_n = tp - p;
        char kind = t[1];
        char sign = tp + 2 < L->n && (t[2] == '-' || t[2] == '+') ? t[2] : 0;
        if (sign == '-') {
            text_n = rstrip_len(s + p, text_n);
        } else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: the text after the last newline, if whitespace only */
            size_t l_pos = 0;
            for (size_t i = text_n; i > 0; i--)
                if (s[p + i - 1] == '\n') {
                    l_pos = i;
                    break;
                }
            if ((l_pos > 0 || line_starting) && l_pos < text_n && ws_run(s + p + l_pos, text_n - l_pos) == text_n - l_pos)
                text_n = l_pos;
        }
        if (text_n && !push(L, T_DATA, line, col, s + p, text_n)) return kiln_error(KILN_ERR_OOM, "out of memory");
        adv(L, tp - p);
        line = L->line;
        col = L->col;
        adv(L, 2 + (sign ? 1 : 0));
        if (kind == '#') {
            const char *e = NULL;
            for (size_t q = L->pos; q + 1 < L->n; q++)
                if (s[q] == '#' && s[q + 1] == '}') {
                    e = s + q;
                    break;
                }
            if (!e) return jl_lex_error(L, line, col, "missing end of comment tag", NULL, NULL);
            size_t q = (size_t)(e - s), m = q + 2;
            if (q > L->pos && s[q - 1] == '-') m += ws_run(s + m, L->n - m);
            else if (!(q > L->pos && s[q - 1] == '+') && m < L->n && s[m] == '\n') m++;
            line_starting = s[m - 1] == '\n';
            adv(L, m - L->pos);
            continue;
        }
        if (!push(L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, line, col, NULL, 0))
            return kiln_error(KILN_ERR_OOM, "out of memory");
        kiln_status st = lex_tag(L, kind == '%', &line_starting);
        if (st) return st;
    }
    return push(L, T_EOF, L->line, L->col, NULL, 0) ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
}
