/* The Jinja subset for chat templates: the parser. It builds the tree in
 * jinja_impl.h from jinja_lex.c's tokens with Jinja2's operator precedence;
 * a statement, operator or literal kiln does not implement is an error
 * naming its line and column. */
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jinja_impl.h"

/* ---- parser ---- */

static token *cur(lexer *L) { return &L->toks[L->cur]; }
static token *peek(lexer *L, size_t k) {
    size_t i = L->cur + k;
    return &L->toks[i < L->n_toks ? i : L->n_toks - 1];
}
static bool is_op(const token *t, const char *op) { return t->kind == T_OP && !strcmp(t->s, op); }
static bool is_name(const token *t, const char *nm) { return t->kind == T_NAME && !strcmp(t->s, nm); }

static const char *tok_desc(const token *t) {
    switch (t->kind) {
    case T_DATA: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_EOF: return "the end of the template";
    default: return t->s;
    }
}

static kiln_status unexpected(lexer *L, const char *want) {
    token *t = cur(L);
    return jl_lex_error(L, t->line, t->col, "expected %s, found %s", want, tok_desc(t));
}

static kiln_status expect_op(lexer *L, const char *op) {
    if (!is_op(cur(L), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return unexpected(L, w);
    }
    L->cur++;
    return KILN_OK;
}

#define OOM kiln_error(KILN_ERR_OOM, "out of memory")
#define TRY(x)                      \
    do {                            \
        kiln_status st_ = (x);      \
        if (st_) {                  \
            jn_free(n);             \
            return st_;             \
        }                           \
    } while (0)
#define ADD(node, kid, nm)                \
    do {                                  \
        jnode *k_ = (kid);                \
        if (!jn_add((node), k_, (nm))) {  \
            jn_free(k_);                  \
            jn_free(n);                   \
            return OOM;                   \
        }                                 \
    } while (0)

/* JL_MAX_EXPR_DEPTH: the parser's recursion (L->depth, counted where it
 * recurses: parse_expr, prefix -/+ and not) and the height of the tree it
 * builds in loops (operator, filter, test, subscript and attribute chains). */
static kiln_status too_deep(lexer *L, int line, int col) {
    char lim[16];
    snprintf(lim, sizeof lim, "%d", JL_MAX_EXPR_DEPTH);
    return jl_lex_error(L, line, col, "expression nested deeper than %s levels (kiln's limit)", lim, NULL);
}
static bool tall(const jnode *n) { return n && n->height > JL_MAX_EXPR_DEPTH; }
static kiln_status enter(lexer *L) {
    if (L->depth >= JL_MAX_EXPR_DEPTH) return too_deep(L, cur(L)->line, cur(L)->col);
    L->depth++;
    return KILN_OK;
}

static kiln_status parse_expr(lexer *L, jnode **out);
static kiln_status parse_or(lexer *L, jnode **out);
static kiln_status parse_unary(lexer *L, bool with_filter, jnode **out);

static kiln_status parse_tuple_or_expr(lexer *L, bool simple, jnode **out);

/* (args) of a call, filter or test: positional and keyword arguments. */
static kiln_status parse_args(lexer *L, jnode *n) {
    L->cur++; /* ( */
    bool kw_seen = false;
    while (!is_op(cur(L), ")")) {
        if (n->n_kids > 1 && 0) break;
        const char *kw = NULL;
        token *t = cur(L);
        if (is_op(t, "*") || is_op(t, "**")) return jl_lex_error(L, t->line, t->col, "*args and **kwargs in calls are outside kiln's Jinja subset", NULL, NULL);
        if (t->kind == T_NAME && is_op(peek(L, 1), "=")) {
            kw = t->s;
            L->cur += 2;
            kw_seen = true;
        } else if (kw_seen) {
            return jl_lex_error(L, t->line, t->col, "a positional argument after a keyword argument", NULL, NULL);
        }
        jnode *a;
        kiln_status st = parse_expr(L, &a);
        if (st) return st;
        if (!jn_add(n, a, kw)) return jn_free(a), OOM;
        if (is_op(cur(L), ",")) L->cur++;
        else if (!is_op(cur(L), ")")) return unexpected(L, "',' or ')'");
    }
    L->cur++;
    return KILN_OK;
}

static kiln_status parse_primary(lexer *L, jnode **out) {
    token *t = cur(L);
    jnode *n = NULL;
    *out = NULL;
    if (t->kind == T_NAME) {
        L->cur++;
        n = jn_new(JN_CONST, t->line, t->col);
        if (!n) return OOM;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n->value = json_true();
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n->value = json_false();
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n->value = json_null();
        else {
            n->kind = JN_NAME;
            if (!(n->name = strdup(t->s))) return jn_free(n), OOM;
            L->loop_refs += !strcmp(t->s, "loop");
        }
    } else if (t->kind == T_STRING) {
        jbuf b = {0};
        int line = t->line, col = t->col;
        while (cur(L)->kind == T_STRING) { /* adjacent literals concatenate */
            jb_put(&b, cur(L)->s, cur(L)->n);
            L->cur++;
        }
        n = jn_new(JN_CONST, line, col);
        if (!n || b.oom || !(n->value = jl_string(b.s ? b.s : "", b.n))) {
            free(b.s);
            return jn_free(n), OOM;
        }
        free(b.s);
    } else if (t->kind == T_INT || t->kind == T_FLOAT) {
        L->cur++;
        n = jn_new(JN_CONST, t->line, t->col);
        if (!n || !(n->value = t->kind == T_INT ? json_integer(t->i) : json_real(t->f))) return jn_free(n), OOM;
    } else if (is_op(t, "(")) {
        L->cur++;
        kiln_status st = parse_tuple_or_expr(L, false, &n);
        if (st) return st;
        TRY(expect_op(L, ")"));
    } else if (is_op(t, "[")) {
        L->cur++;
        n = jn_new(JN_LIST, t->line, t->col);
        if (!n) return OOM;
        while (!is_op(cur(L), "]")) {
            jnode *e;
            TRY(parse_expr(L, &e));
            ADD(n, e, NULL);
            if (is_op(cur(L), ",")) L->cur++;
            else if (!is_op(cur(L), "]")) TRY(unexpected(L, "',' or ']'"));
        }
        L->cur++;
    } else if (is_op(t, "{")) {
        L->cur++;
        n = jn_new(JN_DICT, t->line, t->col);
        if (!n) return OOM;
        while (!is_op(cur(L), "}")) {
            jnode *k, *v;
            TRY(parse_expr(L, &k));
            ADD(n, k, NULL);
            TRY(expect_op(L, ":"));
            TRY(parse_expr(L, &v));
            ADD(n, v, NULL);
            if (is_op(cur(L), ",")) L->cur++;
            else if (!is_op(cur(L), "}")) TRY(unexpected(L, "',' or '}'"));
        }
        L->cur++;
    } else {
        return unexpected(L, "an expression");
    }
    *out = n;
    return KILN_OK;
}

/* [index], [a:b:c], .name, (call args) */
static kiln_status parse_postfix(lexer *L, jnode **io) {
    jnode *n = *io;
    for (;;) {
        token *t = cur(L);
        if (is_op(t, ".")) {
            token *nm = peek(L, 1);
            if (nm->kind == T_NAME) {
                jnode *a = jn_new(JN_ATTR, nm->line, nm->col);
                if (!a || !(a->name = strdup(nm->s)) || !jn_add(a, n, NULL)) {
                    jn_free(a);
                    jn_free(n);
                    return *io = NULL, OOM;
                }
                n = a;
                L->cur += 2;
            } else if (nm->kind == T_INT) {
                jnode *a = jn_new(JN_ITEM, nm->line, nm->col), *ix = jn_new(JN_CONST, nm->line, nm->col);
                if (ix) ix->value = json_integer(nm->i);
                if (!a || !ix || !ix->value || !jn_add(a, n, NULL)) {
                    jn_free(a), jn_free(ix), jn_free(n);
                    return *io = NULL, OOM;
                }
                n = a;
                if (!jn_add(a, ix, NULL)) return jn_free(ix), jn_free(n), *io = NULL, OOM;
                L->cur += 2;
            } else {
                L->cur++;
                kiln_status st = unexpected(L, "an attribute name after '.'");
                jn_free(n);
                return *io = NULL, st;
            }
        } else if (is_op(t, "[")) {
            L->cur++;
            jnode *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            kiln_status st = KILN_OK;
            for (;;) {
                if (is_op(cur(L), "]")) break;
                if (is_op(cur(L), ":")) {
                    if (++colons > 2) {
                        st = unexpected(L, "']'");
                        break;
                    }
                    L->cur++;
                    continue;
                }
                if (parts[colons]) {
                    st = unexpected(L, "':' or ']'");
                    break;
                }
                if ((st = parse_expr(L, &parts[colons]))) break;
            }
            if (!st) L->cur++;
            jnode *a = st ? NULL : jn_new(colons ? JN_SLICE : JN_ITEM, t->line, t->col);
            if (!st && (!a || !jn_add(a, n, NULL))) st = OOM;
            if (!st && colons == 0 && !parts[0]) st = jl_lex_error(L, t->line, t->col, "empty subscript", NULL, NULL);
            for (int k = 0; k < (colons ? 3 : 1) && !st; k++) {
                if (!jn_add(a, parts[k], NULL)) st = OOM;
                else parts[k] = NULL;
            }
            for (int k = 0; k < 3; k++) jn_free(parts[k]);
            if (st) {
                if (a && a->n_kids && a->kids[0] == n) jn_free(a);
                else jn_free(a), jn_free(n);
                return *io = NULL, st;
            }
            n = a;
        } else if (is_op(t, "(")) {
            jnode *c = jn_new(JN_CALL, t->line, t->col);
            if (!c || !jn_add(c, n, NULL)) return jn_free(c), jn_free(n), *io = NULL, OOM;
            n = c;
            kiln_status st = parse_args(L, c);
            if (st) return jn_free(n), *io = NULL, st;
        } else {
            break;
        }
        if (tall(n)) {
            kiln_status st = too_deep(L, n->line, n->col);
            jn_free(n);
            return *io = NULL, st;
        }
    }
    *io = n;
    return KILN_OK;
}

/* | filter(args), is [not] test(args), (call) */
static kiln_status parse_filters(lexer *L, jnode **io) {
    jnode *n = *io;
    for (;;) {
        token *t = cur(L);
        if (is_op(t, "|") || is_name(t, "is")) {
            bool test = t->kind == T_NAME;
            L->cur++;
            bool neg = false;
            if (test && is_name(cur(L), "not")) {
                neg = true;
                L->cur++;
            }
            token *nm = cur(L);
            if (nm->kind != T_NAME) {
                kiln_status st = unexpected(L, test ? "a test name" : "a filter name");
                return jn_free(n), *io = NULL, st;
            }
            L->cur++;
            jnode *f = jn_new(test ? JN_TEST : JN_FILTER, nm->line, nm->col);
            if (!f || !(f->name = strdup(nm->s)) || !jn_add(f, n, NULL)) return jn_free(f), jn_free(n), *io = NULL, OOM;
            n = f;
            f->op = neg;
            f->impl = test ? jl_test_find(nm->s) : jl_filter_find(nm->s);
            if (tall(n)) return jn_free(n), *io = NULL, too_deep(L, nm->line, nm->col);
            if (is_op(cur(L), "(")) {
                kiln_status st = parse_args(L, f);
                if (st) return jn_free(n), *io = NULL, st;
            } else if (test) {
                token *a = cur(L);
                bool arg = (a->kind == T_NAME || a->kind == T_STRING || a->kind == T_INT || a->kind == T_FLOAT ||
                            is_op(a, "[") || is_op(a, "{")) &&
                           !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and");
                if (is_name(a, "is")) return jn_free(n), *io = NULL, jl_lex_error(L, a->line, a->col, "you cannot chain tests with is", NULL, NULL);
                if (arg) {
                    jnode *x;
                    kiln_status st = parse_primary(L, &x);
                    if (!st) st = parse_postfix(L, &x);
                    if (st) return jn_free(n), *io = NULL, st;
                    if (!jn_add(f, x, NULL)) return jn_free(x), jn_free(n), *io = NULL, OOM;
                }
            }
        } else if (is_op(t, "(")) {
            kiln_status st = parse_postfix(L, &n);
            if (st) return *io = NULL, st;
        } else {
            break;
        }
    }
    *io = n;
    return KILN_OK;
}

static kiln_status parse_unary(lexer *L, bool with_filter, jnode **out) {
    token *t = cur(L);
    jnode *n;
    kiln_status st;
    if (is_op(t, "-") || is_op(t, "+")) {
        if ((st = enter(L))) return st;
        L->cur++;
        jnode *x;
        st = parse_unary(L, false, &x);
        L->depth--;
        if (st) return st;
        n = jn_new(JN_UNARY, t->line, t->col);
        if (!n || !jn_add(n, x, NULL)) return jn_free(n), jn_free(x), OOM;
        n->op = t->s[0];
    } else if ((st = parse_primary(L, &n))) {
        return st;
    }
    if ((st = parse_postfix(L, &n))) return st;
    if (with_filter && (st = parse_filters(L, &n))) return st;
    *out = n;
    return KILN_OK;
}

static kiln_status binary(lexer *L, jnode **left, int op, int line, int col,
                          kiln_status (*next)(lexer *, jnode **)) {
    jnode *r = NULL;
    kiln_status st = next(L, &r);
    if (st) return jn_free(*left), *left = NULL, st;
    jnode *n = jn_new(JN_BINARY, line, col);
    if (!n || !jn_add(n, *left, NULL)) return jn_free(n), jn_free(*left), jn_free(r), *left = NULL, OOM;
    *left = n;
    if (!jn_add(n, r, NULL)) return jn_free(r), jn_free(n), *left = NULL, OOM;
    n->op = op;
    if (tall(n)) return jn_free(n), *left = NULL, too_deep(L, line, col);
    return KILN_OK;
}

static kiln_status parse_unary_f(lexer *L, jnode **out) { return parse_unary(L, true, out); }

static kiln_status parse_pow(lexer *L, jnode **out) {
    kiln_status st = parse_unary_f(L, out);
    while (!st && is_op(cur(L), "**")) {
        token *t = cur(L);
        L->cur++;
        st = binary(L, out, 'P', t->line, t->col, parse_unary_f);
    }
    return st;
}

static kiln_status parse_math2(lexer *L, jnode **out) {
    kiln_status st = parse_pow(L, out);
    for (;;) {
        token *t = cur(L);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
        if (st || !op) return st;
        L->cur++;
        st = binary(L, out, op, t->line, t->col, parse_pow);
    }
}

static kiln_status parse_concat(lexer *L, jnode **out) {
    kiln_status st = parse_math2(L, out);
    while (!st && is_op(cur(L), "~")) {
        token *t = cur(L);
        L->cur++;
        st = binary(L, out, '~', t->line, t->col, parse_math2);
    }
    return st;
}

static kiln_status parse_math1(lexer *L, jnode **out) {
    kiln_status st = parse_concat(L, out);
    for (;;) {
        token *t = cur(L);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (st || !op) return st;
        L->cur++;
        st = binary(L, out, op, t->line, t->col, parse_concat);
    }
}

static kiln_status parse_compare(lexer *L, jnode **out) {
    jnode *n = NULL, *first;
    kiln_status st = parse_math1(L, &first);
    if (st) return st;
    for (;;) {
        token *t = cur(L);
        int op = -1;
        size_t skip = 1;
        if (is_op(t, "==")) op = JC_EQ;
        else if (is_op(t, "!=")) op = JC_NE;
        else if (is_op(t, "<")) op = JC_LT;
        else if (is_op(t, "<=")) op = JC_LE;
        else if (is_op(t, ">")) op = JC_GT;
        else if (is_op(t, ">=")) op = JC_GE;
        else if (is_name(t, "in")) op = JC_IN;
        else if (is_name(t, "not") && is_name(peek(L, 1), "in")) op = JC_NOTIN, skip = 2;
        if (op < 0) break;
        if (!n) {
            n = jn_new(JN_COMPARE, t->line, t->col);
            if (!n || !jn_add(n, first, NULL)) return jn_free(n), jn_free(first), OOM;
        }
        L->cur += skip;
        int *ops = realloc(n->ops, (size_t)n->n_kids * sizeof *ops);
        if (!ops) return jn_free(n), OOM;
        n->ops = ops;
        ops[n->n_kids - 1] = op;
        jnode *r = NULL;
        TRY(parse_math1(L, &r));
        ADD(n, r, NULL);
        if (tall(n)) TRY(too_deep(L, t->line, t->col));
    }
    *out = n ? n : first;
    return KILN_OK;
}

static kiln_status parse_not(lexer *L, jnode **out) {
    token *t = cur(L);
    if (is_name(t, "not")) {
        kiln_status st = enter(L);
        if (st) return st;
        L->cur++;
        jnode *x;
        st = parse_not(L, &x);
        L->depth--;
        if (st) return st;
        jnode *n = jn_new(JN_UNARY, t->line, t->col);
        if (!n || !jn_add(n, x, NULL)) return jn_free(n), jn_free(x), OOM;
        n->op = '!';
        *out = n;
        return KILN_OK;
    }
    return parse_compare(L, out);
}

static kiln_status parse_and(lexer *L, jnode **out) {
    kiln_status st = parse_not(L, out);
    while (!st && is_name(cur(L), "and")) {
        token *t = cur(L);
        L->cur++;
        st = binary(L, out, 'a', t->line, t->col, parse_not);
    }
    return st;
}

static kiln_status parse_or(lexer *L, jnode **out) {
    kiln_status st = parse_and(L, out);
    while (!st && is_name(cur(L), "or")) {
        token *t = cur(L);
        L->cur++;
        st = binary(L, out, 'o', t->line, t->col, parse_and);
    }
    return st;
}

/* a if cond [else b] */
static kiln_status parse_expr_(lexer *L, jnode **out);
static kiln_status parse_expr(lexer *L, jnode **out) {
    kiln_status st = enter(L);
    if (st) return st;
    st = parse_expr_(L, out);
    L->depth--;
    return st;
}

static kiln_status parse_expr_(lexer *L, jnode **out) {
    jnode *e1;
    kiln_status st = parse_or(L, &e1);
    if (st) return st;
    while (is_name(cur(L), "if")) {
        token *t = cur(L);
        L->cur++;
        jnode *n = jn_new(JN_COND, t->line, t->col), *c = NULL, *e3 = NULL;
        if (!n) return jn_free(e1), OOM;
        st = parse_or(L, &c);
        if (!st && is_name(cur(L), "else")) {
            L->cur++;
            st = parse_expr(L, &e3);
        }
        if (st || !jn_add(n, c, NULL) || !jn_add(n, e1, NULL) || !jn_add(n, e3, NULL)) {
            bool owned = n->n_kids >= 2;
            if (!owned) jn_free(e1);
            if (n->n_kids < 1) jn_free(c);
            if (n->n_kids < 3) jn_free(e3);
            jn_free(n);
            return st ? st : OOM;
        }
        e1 = n;
        if (tall(e1)) return jn_free(e1), too_deep(L, t->line, t->col);
    }
    *out = e1;
    return KILN_OK;
}

/* expr or expr, expr, ... (a tuple); simple: names only (for/set targets). */
static kiln_status parse_tuple_or_expr(lexer *L, bool simple, jnode **out) {
    token *t0 = cur(L);
    jnode *n = NULL, *first;
    kiln_status st;
    if (simple) {
        if (t0->kind != T_NAME) return unexpected(L, "a variable name");
        first = jn_new(JN_NAME, t0->line, t0->col);
        if (!first || !(first->name = strdup(t0->s))) return jn_free(first), OOM;
        L->cur++;
    } else if (is_op(t0, ")")) {
        n = jn_new(JN_TUPLE, t0->line, t0->col);
        return (*out = n) ? KILN_OK : OOM;
    } else if ((st = parse_expr(L, &first))) {
        return st;
    }
    if (!is_op(cur(L), ",")) {
        *out = first;
        return KILN_OK;
    }
    n = jn_new(JN_TUPLE, t0->line, t0->col);
    if (!n || !jn_add(n, first, NULL)) return jn_free(n), jn_free(first), OOM;
    while (is_op(cur(L), ",")) {
        L->cur++;
        token *t = cur(L);
        if (simple ? t->kind != T_NAME : (is_op(t, ")") || t->kind == T_BLOCK_END || t->kind == T_VAR_END || is_name(t, "in")))
            break;
        jnode *e;
        if (simple) {
            e = jn_new(JN_NAME, t->line, t->col);
            if (!e || !(e->name = strdup(t->s))) return jn_free(e), jn_free(n), OOM;
            L->cur++;
        } else {
            TRY(parse_expr(L, &e));
        }
        ADD(n, e, NULL);
    }
    *out = n;
    return KILN_OK;
}

/* ---- statements ---- */

static kiln_status parse_body(lexer *L, const char *const *ends, int *which, jnode **out);

/* JL_MAX_STMT_DEPTH: statements inside statements (L->stmt_depth). */
static kiln_status stmt_enter(lexer *L, const token *kw) {
    if (L->stmt_depth >= JL_MAX_STMT_DEPTH) {
        char lim[16];
        snprintf(lim, sizeof lim, "%d", JL_MAX_STMT_DEPTH);
        return jl_lex_error(L, kw->line, kw->col, "statements nested deeper than %s levels (kiln's limit)", lim, NULL);
    }
    L->stmt_depth++;
    return KILN_OK;
}

static kiln_status expect_end(lexer *L) {
    return cur(L)->kind == T_BLOCK_END ? (L->cur++, KILN_OK) : unexpected(L, "'%}'");
}

static kiln_status parse_if(lexer *L, token *kw, jnode **out) {
    jnode *n = jn_new(JN_IF, kw->line, kw->col), *c, *body, *rest = NULL;
    if (!n) return OOM;
    TRY(parse_expr(L, &c));
    ADD(n, c, NULL);
    TRY(expect_end(L));
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    int which;
    TRY(parse_body(L, ends, &which, &body));
    ADD(n, body, NULL);
    if (which == 0) {
        token *t = &L->toks[L->cur - 1];
        TRY(stmt_enter(L, t));
        TRY(parse_if(L, t, &rest));
        L->stmt_depth--;
        *out = n;
        ADD(n, rest, NULL);
        return KILN_OK;
    }
    if (which == 1) {
        TRY(expect_end(L));
        static const char *const e2[] = {"endif", NULL};
        TRY(parse_body(L, e2, &which, &rest));
    }
    ADD(n, rest, NULL);
    TRY(expect_end(L));
    *out = n;
    return KILN_OK;
}

static kiln_status parse_for(lexer *L, token *kw, jnode **out) {
    jnode *n = jn_new(JN_FOR, kw->line, kw->col), *tgt, *it, *body, *els = NULL, *cond = NULL;
    if (!n) return OOM;
    TRY(parse_tuple_or_expr(L, true, &tgt));
    ADD(n, tgt, NULL);
    if (!is_name(cur(L), "in")) TRY(unexpected(L, "'in'"));
    L->cur++;
    TRY(parse_or(L, &it)); /* Jinja2 parses the iterable without a ternary */
    ADD(n, it, NULL);
    if (is_name(cur(L), "if")) {
        L->cur++;
        TRY(parse_expr(L, &cond));
    }
    if (is_name(cur(L), "recursive")) {
        token *t = cur(L);
        jn_free(cond);
        TRY(jl_lex_error(L, t->line, t->col, "recursive for loops are outside kiln's Jinja subset", NULL, NULL));
    }
    if (cur(L)->kind != T_BLOCK_END) jn_free(cond);
    TRY(expect_end(L));
    static const char *const ends[] = {"else", "endfor", NULL};
    int which, refs = L->loop_refs;
    kiln_status st = parse_body(L, ends, &which, &body);
    n->op = L->loop_refs != refs;
    if (st) return jn_free(cond), jn_free(n), st;
    if (!jn_add(n, body, NULL)) return jn_free(body), jn_free(cond), jn_free(n), OOM;
    if (which == 0) {
        if ((st = expect_end(L))) return jn_free(cond), jn_free(n), st;
        static const char *const e2[] = {"endfor", NULL};
        if ((st = parse_body(L, e2, &which, &els))) return jn_free(cond), jn_free(n), st;
    }
    if (!jn_add(n, els, NULL)) return jn_free(els), jn_free(cond), jn_free(n), OOM;
    ADD(n, cond, NULL);
    TRY(expect_end(L));
    *out = n;
    return KILN_OK;
}

static kiln_status parse_set(lexer *L, token *kw, jnode **out) {
    jnode *n = jn_new(JN_SET, kw->line, kw->col), *tgt, *v;
    if (!n) return OOM;
    token *t = cur(L);
    if (t->kind == T_NAME && is_op(peek(L, 1), ".")) { /* namespace attribute */
        token *a = peek(L, 2);
        if (a->kind != T_NAME) {
            L->cur += 2;
            TRY(unexpected(L, "an attribute name"));
        }
        tgt = jn_new(JN_ATTR, a->line, a->col);
        jnode *base = jn_new(JN_NAME, t->line, t->col);
        if (!tgt || !base || !(tgt->name = strdup(a->s)) || !(base->name = strdup(t->s)) || !jn_add(tgt, base, NULL)) {
            jn_free(tgt), jn_free(base), jn_free(n);
            return OOM;
        }
        L->cur += 3;
    } else {
        TRY(parse_tuple_or_expr(L, true, &tgt));
    }
    ADD(n, tgt, NULL);
    if (is_op(cur(L), "=")) {
        L->cur++;
        TRY(parse_tuple_or_expr(L, false, &v));
        ADD(n, v, NULL);
        TRY(expect_end(L));
        *out = n;
        return KILN_OK;
    }
    if (cur(L)->kind != T_BLOCK_END) {
        if (is_op(cur(L), "|"))
            TRY(jl_lex_error(L, cur(L)->line, cur(L)->col, "filtered block set is outside kiln's Jinja subset", NULL, NULL));
        TRY(unexpected(L, "'=' or '%}'"));
    }
    if (tgt->kind != JN_NAME) TRY(jl_lex_error(L, kw->line, kw->col, "a block set must assign one name", NULL, NULL));
    L->cur++;
    n->kind = JN_SETBLOCK;
    static const char *const ends[] = {"endset", NULL};
    int which;
    TRY(parse_body(L, ends, &which, &v));
    ADD(n, v, NULL);
    TRY(expect_end(L));
    *out = n;
    return KILN_OK;
}

static kiln_status parse_macro(lexer *L, token *kw, jnode **out) {
    jnode *n = jn_new(JN_MACRO, kw->line, kw->col), *body;
    if (!n) return OOM;
    token *t = cur(L);
    if (t->kind != T_NAME) TRY(unexpected(L, "a macro name"));
    if (!(n->name = strdup(t->s))) return jn_free(n), OOM;
    L->cur++;
    ADD(n, NULL, NULL); /* body slot */
    TRY(expect_op(L, "("));
    while (!is_op(cur(L), ")")) {
        token *p = cur(L);
        if (p->kind != T_NAME) TRY(unexpected(L, "a parameter name"));
        L->cur++;
        jnode *def = NULL;
        if (is_op(cur(L), "=")) {
            L->cur++;
            TRY(parse_expr(L, &def));
        }
        ADD(n, def, p->s);
        if (is_op(cur(L), ",")) L->cur++;
        else if (!is_op(cur(L), ")")) TRY(unexpected(L, "',' or ')'"));
    }
    L->cur++;
    TRY(expect_end(L));
    static const char *const ends[] = {"endmacro", NULL};
    int which;
    TRY(parse_body(L, ends, &which, &body));
    n->kids[0] = body;
    TRY(expect_end(L));
    *out = n;
    return KILN_OK;
}

/* Statements until {% END %} for one of `ends` (NULL-terminated; NULL ends
 * = the whole template). On return the parser stands after the end name. */
static kiln_status parse_body(lexer *L, const char *const *ends, int *which, jnode **out) {
    token *t0 = cur(L);
    jnode *n = jn_new(JN_BLOCK, t0->line, t0->col);
    if (!n) return OOM;
    for (;;) {
        token *t = cur(L);
        if (t->kind == T_EOF) {
            if (!ends) break;
            char want[96];
            int last = 0;
            while (ends[last + 1]) last++;
            snprintf(want, sizeof want, "{%% %s %%}", ends[last]);
            TRY(jl_lex_error(L, t->line, t->col, "unexpected end of template: expected %s", want, NULL));
        }
        if (t->kind == T_DATA) {
            jnode *x = jn_new(JN_TEXT, t->line, t->col);
            if (!x || !(x->text = malloc(t->n + 1))) return jn_free(x), jn_free(n), OOM;
            memcpy(x->text, t->s, t->n + 1);
            x->text_len = t->n;
            ADD(n, x, NULL);
            L->cur++;
            continue;
        }
        if (t->kind == T_VAR_BEGIN) {
            L->cur++;
            jnode *x = jn_new(JN_PRINT, t->line, t->col), *e;
            if (!x) return jn_free(n), OOM;
            ADD(n, x, NULL);
            TRY(parse_tuple_or_expr(L, false, &e));
            ADD(x, e, NULL);
            if (cur(L)->kind != T_VAR_END) TRY(unexpected(L, "'}}'"));
            L->cur++;
            continue;
        }
        if (t->kind != T_BLOCK_BEGIN) TRY(unexpected(L, "template text or a tag"));
        token *kw = peek(L, 1);
        if (kw->kind != T_NAME) {
            L->cur++;
            TRY(unexpected(L, "a statement name"));
        }
        for (int i = 0; ends && ends[i]; i++)
            if (!strcmp(kw->s, ends[i])) {
                L->cur += 2;
                *which = i;
                *out = n;
                return KILN_OK;
            }
        L->cur += 2;
        jnode *x = NULL;
        bool nests = !strcmp(kw->s, "if") || !strcmp(kw->s, "for") || !strcmp(kw->s, "set") || !strcmp(kw->s, "macro") ||
                     !strcmp(kw->s, "generation");
        if (nests) TRY(stmt_enter(L, kw));
        if (!strcmp(kw->s, "if")) {
            TRY(parse_if(L, kw, &x));
        } else if (!strcmp(kw->s, "for")) {
            TRY(parse_for(L, kw, &x));
        } else if (!strcmp(kw->s, "set")) {
            TRY(parse_set(L, kw, &x));
        } else if (!strcmp(kw->s, "macro")) {
            TRY(parse_macro(L, kw, &x));
        } else if (!strcmp(kw->s, "break") || !strcmp(kw->s, "continue")) {
            x = jn_new(kw->s[0] == 'b' ? JN_BREAK : JN_CONTINUE, kw->line, kw->col);
            if (!x) return jn_free(n), OOM;
            ADD(n, x, NULL);
            TRY(expect_end(L));
            continue;
        } else if (!strcmp(kw->s, "generation")) {
            TRY(expect_end(L));
            static const char *const e[] = {"endgeneration", NULL};
            int w;
            jnode *body;
            TRY(parse_body(L, e, &w, &body));
            x = jn_new(JN_GENERATION, kw->line, kw->col);
            if (!x || !jn_add(x, body, NULL)) return jn_free(x), jn_free(body), jn_free(n), OOM;
            ADD(n, x, NULL);
            TRY(expect_end(L));
            L->stmt_depth--;
            continue;
        } else {
            static const char *const known_ends[] = {"elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration", NULL};
            for (int i = 0; known_ends[i]; i++)
                if (!strcmp(kw->s, known_ends[i])) TRY(jl_lex_error(L, kw->line, kw->col, "unexpected {%% %s %%}", kw->s, NULL));
            TRY(jl_lex_error(L, kw->line, kw->col, "statement '%s' is outside kiln's Jinja subset", kw->s, NULL));
        }
        L->stmt_depth -= nests;
        ADD(n, x, NULL);
    }
    *out = n;
    return KILN_OK;
}

kiln_status kiln_template_parse(const char *src, size_t len, const char *name, kiln_template **out) {
    *out = NULL;
    lexer L = {.name = name ? name : "template", .line = 1, .col = 1};
    /* Jinja2 normalises \r\n and \r to \n and drops one trailing newline. */
    char *norm = malloc(len + 1);
    if (!norm) return OOM;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[k++] = src[i];
        }
    }
    if (k && norm[k - 1] == '\n') k--;
    norm[k] = 0;
    L.src = norm;
    L.n = k;
    kiln_status st = jl_lex(&L);
    jnode *root = NULL;
    if (!st) st = parse_body(&L, NULL, NULL, &root);
    for (size_t i = 0; i < L.n_toks; i++) free(L.toks[i].s);
    free(L.toks);
    free(norm);
    if (st) return st;
    kiln_template *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(L.name))) {
        free(t);
        jn_free(root);
        return OOM;
    }
    t->root = root;
    *out = t;
    return KILN_OK;
}

void kiln_template_free(kiln_template *t) {
    if (!t) return;
    jn_free(t->root);
    free(t->name);
    free(t);
}
