/* The Jinja subset's evaluator: statements, expressions, scopes.
 *
 * Scoping follows Jinja2: the template has one scope over the caller's
 * variables; each for-loop iteration and each macro call gets a fresh
 * scope (a `set` inside a loop body does not survive the iteration, which
 * is why templates use namespace()); `if` opens none. Undefined follows
 * Jinja2's default Undefined: it prints as "", is false, iterates as empty,
 * has length 0, and any attribute, item, arithmetic or call on it is an
 * error, as in Jinja2. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "jinja_impl.h"

typedef struct scope {
    json_t *vars;
    struct scope *up;
} scope;

struct jrctx {
    const kiln_template *t;
    jbuf *out;
    json_t *nss;          /* namespace objects (identity) */
    const jnode **macros; /* defined so far */
    int n_macros, cap_macros;
    int ctl;              /* 1 break, 2 continue */
    size_t *gen;          /* {% generation %} spans: start, end, ... */
    size_t n_gen, cap_gen;
    int depth;          /* macro calls (JL_MAX_CALL_DEPTH) */
    int rdepth;         /* eval/exec nesting (JL_MAX_RENDER_DEPTH) */
    long long steps;    /* JL_MAX_STEPS */
    jl_budget budget;   /* JL_MAX_BYTES (jl_cur_budget while rendering) */
    bool budget_told;   /* the limit was reported at the innermost node */
};

#define OOM kiln_error(KILN_ERR_OOM, "out of memory")

kiln_status jl_rerr(jrctx *c, const jnode *at, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(KILN_ERR_INVALID, "%s:%d:%d: %s", c->t->name, at ? at->line : 0, at ? at->col : 0, msg);
}

json_t *jl_arg(const jargs *a, int pos, const char *kw, bool *present) {
    json_t *v = NULL;
    bool got = false;
    int p = 0;
    for (int i = 0; i < a->n; i++) {
        if (!a->kw[i]) {
            if (p++ == pos) v = a->v[i], got = true;
        } else if (kw && !strcmp(a->kw[i], kw)) {
            v = a->v[i], got = true;
        }
    }
    if (present) *present = got;
    return v;
}

kiln_status jl_args_check(jrctx *c, const jnode *at, const char *what, const jargs *a, int max_pos, const char *const *kws) {
    int p = 0;
    for (int i = 0; i < a->n; i++) {
        if (!a->kw[i]) {
            if (++p > max_pos) return jl_rerr(c, at, "%s takes at most %d positional arguments", what, max_pos);
            continue;
        }
        bool ok = false;
        for (int k = 0; kws && kws[k]; k++) ok |= !strcmp(kws[k], a->kw[i]);
        if (!ok) return jl_rerr(c, at, "%s: keyword argument '%s' is outside kiln's Jinja subset", what, a->kw[i]);
    }
    return KILN_OK;
}

static json_t *lookup(const scope *s, const char *name) {
    for (; s; s = s->up) {
        json_t *v = json_object_get(s->vars, name);
        if (v) return v;
    }
    return NULL;
}

static const jnode *find_macro(jrctx *c, const char *name) {
    for (int i = c->n_macros - 1; i >= 0; i--)
        if (!strcmp(c->macros[i]->name, name)) return c->macros[i];
    return NULL;
}

static bool is_ns(jrctx *c, const json_t *v) {
    for (size_t i = 0; v && i < json_array_size(c->nss); i++)
        if (json_array_get(c->nss, i) == v) return true;
    return false;
}

static kiln_status eval(jrctx *c, scope *s, const jnode *n, json_t **out);
static kiln_status exec(jrctx *c, scope *s, const jnode *n);

/* One step of the render (JL_MAX_STEPS) at node n. */
static kiln_status step(jrctx *c, const jnode *n) {
    if (++c->steps > JL_MAX_STEPS)
        return jl_rerr(c, n, "rendering takes more than %lld steps (kiln's limit: nodes evaluated plus loop iterations)",
                       JL_MAX_STEPS);
    return KILN_OK;
}

/* Entering node n (a step, one more level of nesting). */
static kiln_status enter(jrctx *c, const jnode *n) {
    if (c->rdepth >= JL_MAX_RENDER_DEPTH)
        return jl_rerr(c, n, "rendering nested deeper than %d levels (kiln's limit)", JL_MAX_RENDER_DEPTH);
    kiln_status st = step(c, n);
    if (!st) c->rdepth++;
    return st;
}

/* Leaving node n: past the byte budget, the error is the limit, named at
 * the innermost node (the OOM a refused charge caused, or a value quietly
 * missing a part). */
static kiln_status leave(jrctx *c, const jnode *n, kiln_status st) {
    c->rdepth--;
    if (c->budget.over && !c->budget_told) {
        c->budget_told = true;
        return jl_rerr(c, n, "rendering builds more than %zu MiB of text (kiln's limit)", JL_MAX_BYTES >> 20);
    }
    return st;
}

/* The nesting of v's lists and dicts (0: a scalar), looked at no deeper
 * than JL_MAX_VALUE_DEPTH + 1; each list or dict visited is a step.
 * *reaches: whether `target` (may be NULL) is inside. */
static int vdepth(jrctx *c, const json_t *v, const json_t *target, bool *reaches, int level) {
    if (!v || !(json_is_array(v) || json_is_object(v))) return 0;
    if (v == target) *reaches = true;
    if (level > JL_MAX_VALUE_DEPTH || *reaches) return 1;
    c->steps++;
    int d = 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            int k = vdepth(c, json_array_get(v, i), target, reaches, level + 1);
            if (k > d) d = k;
        }
    } else {
        const char *key;
        json_t *x;
        json_object_foreach((json_t *)v, key, x) {
            int k = vdepth(c, x, target, reaches, level + 1);
            if (k > d) d = k;
        }
    }
    return d + 1;
}

/* JL_MAX_VALUE_DEPTH for a value about to go inside a list or dict. */
static kiln_status nest_check(jrctx *c, const jnode *at, const json_t *v) {
    bool r = false;
    if (vdepth(c, v, NULL, &r, 1) + 1 > JL_MAX_VALUE_DEPTH)
        return jl_rerr(c, at, "a list or dict nested deeper than %d levels (kiln's limit)", JL_MAX_VALUE_DEPTH);
    return step(c, at);
}

static void free_args(jargs *a) {
    for (int i = 0; i < a->n; i++) json_decref(a->v[i]);
    free(a->v);
    a->v = NULL;
    a->n = 0;
}

/* Evaluates kids[first..] of a call/filter/test node into a. */
static kiln_status eval_args(jrctx *c, scope *s, const jnode *n, int first, jargs *a) {
    a->n = 0;
    a->v = calloc((size_t)(n->n_kids > first ? n->n_kids - first : 1), sizeof *a->v);
    a->kw = n->names + first;
    if (!a->v) return OOM;
    for (int i = first; i < n->n_kids; i++) {
        kiln_status st = eval(c, s, n->kids[i], &a->v[a->n]);
        a->n++;
        if (st) return free_args(a), st;
    }
    return KILN_OK;
}

/* Calls a macro: parameters bound from positionals, keywords, defaults. */
static kiln_status call_macro(jrctx *c, scope *s, const jnode *m, const jnode *at, const jargs *a, json_t **out) {
    (void)s;
    if (c->depth >= JL_MAX_CALL_DEPTH) return jl_rerr(c, at, "macro calls nested deeper than %d (kiln's limit)", JL_MAX_CALL_DEPTH);
    scope ms = {.vars = json_object(), .up = NULL};
    /* Macros see the template's top-level scope (where they were defined). */
    scope *top = s;
    while (top->up && top->up->up) top = top->up;
    ms.up = top;
    if (!ms.vars) return OOM;
    int n_params = m->n_kids - 1, pos = 0;
    kiln_status st = KILN_OK;
    for (int i = 0; i < a->n && !st; i++) {
        int k = -1;
        if (!a->kw[i]) {
            k = pos++;
            if (k >= n_params) st = jl_rerr(c, at, "macro '%s' takes %d arguments", m->name, n_params);
        } else {
            for (int p = 0; p < n_params; p++)
                if (!strcmp(m->names[1 + p], a->kw[i])) k = p;
            if (k < 0) st = jl_rerr(c, at, "macro '%s' has no parameter '%s'", m->name, a->kw[i]);
        }
        if (!st && a->v[i]) json_object_set(ms.vars, m->names[1 + k], a->v[i]);
    }
    for (int p = 0; p < n_params && !st; p++) {
        if (json_object_get(ms.vars, m->names[1 + p]) || !m->kids[1 + p]) continue;
        json_t *d;
        st = eval(c, &ms, m->kids[1 + p], &d);
        if (!st && d) json_object_set_new(ms.vars, m->names[1 + p], d);
    }
    jbuf buf = {0}, *saved = c->out;
    if (!st) {
        c->out = &buf;
        c->depth++;
        st = exec(c, &ms, m->kids[0]);
        c->depth--;
        c->out = saved;
    }
    json_decref(ms.vars);
    if (!st && buf.oom) st = OOM;
    if (!st && !(*out = jl_string(buf.s ? buf.s : "", buf.n))) st = OOM;
    free(buf.s);
    return st;
}

static kiln_status call_global(jrctx *c, const jnode *at, const char *name, const jargs *a, json_t **out) {
    if (!strcmp(name, "raise_exception")) {
        jbuf b = {0};
        jl_str(&b, a->n ? a->v[0] : NULL);
        kiln_status st = jl_rerr(c, at, "the template raised an exception: %s", b.s ? b.s : "");
        free(b.s);
        return st;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *o = json_object();
        if (!o) return OOM;
        for (int i = 0; i < a->n; i++) {
            kiln_status st = nest_check(c, at, a->v[i]);
            if (st) return json_decref(o), st;
            if (a->kw[i]) {
                if (a->v[i]) json_object_set(o, a->kw[i], a->v[i]);
            } else if (a->v[i] && json_is_object(a->v[i]) && i == 0) {
                json_object_update(o, a->v[i]);
            } else {
                json_decref(o);
                return jl_rerr(c, at, "%s() takes keyword arguments (or one dict)", name);
            }
        }
        if (name[0] == 'n' && json_array_append(c->nss, o)) return json_decref(o), OOM;
        *out = o;
        return KILN_OK;
    }
    if (!strcmp(name, "range")) {
        long long v[3] = {0, 0, 1};
        if (a->n < 1 || a->n > 3) return jl_rerr(c, at, "range() takes 1 to 3 arguments");
        for (int i = 0; i < a->n; i++) {
            if (a->kw[i] || !a->v[i] || !json_is_integer(a->v[i])) return jl_rerr(c, at, "range() takes integers");
            v[a->n == 1 ? 1 : i] = json_integer_value(a->v[i]);
        }
        if (v[2] == 0) return jl_rerr(c, at, "range() step must not be zero");
        /* the length as Python has it, without overflow */
        __int128 span = (__int128)v[1] - v[0], len = 0;
        if (v[2] > 0 && span > 0) len = (span + v[2] - 1) / v[2];
        if (v[2] < 0 && span < 0) len = (-span + -(__int128)v[2] - 1) / -(__int128)v[2];
        if (len > JL_MAX_RANGE)
            return jl_rerr(c, at, "range() of more than %d items (kiln's limit, as Hugging Face's sandbox)", JL_MAX_RANGE);
        c->steps += (long long)len; /* making the items is work too */
        kiln_status st = step(c, at);
        if (st) return st;
        json_t *l = json_array();
        if (!l || !jl_charge((size_t)len * 16)) return json_decref(l), OOM;
        for (long long i = 0; i < (long long)len; i++)
            if (json_array_append_new(l, json_integer((json_int_t)(v[0] + (__int128)i * v[2])))) return json_decref(l), OOM;
        *out = l;
        return KILN_OK;
    }
    if (!strcmp(name, "strftime_now")) {
        if (a->n != 1 || !a->v[0] || !json_is_string(a->v[0])) return jl_rerr(c, at, "strftime_now() takes one format string");
        const char *fmt = jl_s(a->v[0]);
        size_t fn = jl_n(a->v[0]);
        if (memchr(fmt, 0, fn)) return jl_rerr(c, at, "strftime_now(): embedded null character");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        /* strftime gives 0 both for a buffer too small and an empty result:
         * with a leading 'x' the result is never empty, so 0 means grow (up
         * to the render budget: "%999999Y" is 999999 bytes, as in Python) */
        char *f2 = malloc(fn + 2);
        if (!f2) return OOM;
        f2[0] = 'x';
        memcpy(f2 + 1, fmt, fn + 1);
        kiln_status st = KILN_OK;
        for (size_t cap = 256;; cap *= 2) {
            char *buf = jl_charge(cap) ? malloc(cap) : NULL;
            if (!buf) {
                st = OOM;
                break;
            }
            size_t k = strftime(buf, cap, f2, &tm);
            if (k > 0) st = (*out = jl_string(buf + 1, k - 1)) ? KILN_OK : OOM;
            free(buf);
            if (k > 0) break;
        }
        free(f2);
        return st;
    }
    return jl_rerr(c, at, "'%s' is undefined or not callable (function outside kiln's Jinja subset)", name);
}

static kiln_status eval_call(jrctx *c, scope *s, const jnode *n, json_t **out) {
    const jnode *f = n->kids[0];
    jargs a = {0};
    kiln_status st;
    if (f->kind == JN_NAME) {
        json_t *v = lookup(s, f->name);
        if (v) return jl_rerr(c, n, "'%s' is not callable", f->name);
        if ((st = eval_args(c, s, n, 1, &a))) return st;
        const jnode *m = find_macro(c, f->name);
        st = m ? call_macro(c, s, m, n, &a, out) : call_global(c, n, f->name, &a, out);
        free_args(&a);
        return st;
    }
    if (f->kind == JN_ATTR) {
        json_t *obj;
        if ((st = eval(c, s, f->kids[0], &obj))) return st;
        if (!obj) return jl_rerr(c, f, "cannot call '%s' on an undefined value", f->name);
        if ((st = eval_args(c, s, n, 1, &a))) return json_decref(obj), st;
        st = jl_method(c, f, obj, f->name, &a, out);
        free_args(&a);
        json_decref(obj);
        return st;
    }
    return jl_rerr(c, n, "calling this expression is outside kiln's Jinja subset");
}

static bool as_int(const json_t *v, long long *x) {
    if (!v) return false;
    if (json_is_integer(v)) return *x = json_integer_value(v), true;
    if (json_is_boolean(v)) return *x = json_is_true(v), true;
    return false;
}

/* x / y of two ints as Python's int true division: the quotient correctly
 * rounded (not (double)x / (double)y, which rounds twice past 2^53). */
static double int_truediv(long long x, long long y) {
    const long long exact = 1LL << 53;
    if (x >= -exact && x <= exact && y >= -exact && y <= exact) return (double)x / (double)y;
    bool neg = (x < 0) != (y < 0);
    unsigned long long a = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    unsigned long long b = y < 0 ? 0ULL - (unsigned long long)y : (unsigned long long)y;
    if (a == 0) return neg ? -0.0 : 0.0;
    int la = 64 - __builtin_clzll(a), lb = 64 - __builtin_clzll(b);
    int sh = 56 + lb - la; /* the quotient gets >= 55 bits: the sticky bit rounds it once */
    if (sh < 0) sh = 0;
    unsigned __int128 num = (unsigned __int128)a << sh, q = num / b;
    if (num % b) q |= 1;
    double r = ldexp((double)q, -sh);
    return neg ? -r : r;
}

/* Python's float divmod (Objects/floatobject.c float_divmod); fy != 0. */
static void float_divmod(double fx, double fy, double *div_out, double *mod_out) {
    double mod = fmod(fx, fy), div = (fx - mod) / fy, floordiv;
    if (mod) {
        if ((fy < 0) != (mod < 0)) {
            mod += fy;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, fy);
    }
    if (div) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, fx / fy);
    }
    *div_out = floordiv;
    *mod_out = mod;
}

/* x ** y for ints, y >= 0; false when it does not fit in 64 bits. */
static bool int_pow(long long x, long long y, long long *r) {
    if (x == 0 || x == 1) return *r = y == 0 ? 1 : x, true;
    if (x == -1) return *r = y % 2 ? -1 : 1, true;
    long long acc = 1, base = x;
    for (;;) {
        if (y & 1 && __builtin_mul_overflow(acc, base, &acc)) return false;
        y >>= 1;
        if (!y) break;
        if (__builtin_mul_overflow(base, base, &base)) return false;
    }
    *r = acc;
    return true;
}

static kiln_status arith(jrctx *c, const jnode *n, json_t *a, json_t *b, json_t **out) {
    int op = n->op;
    long long x = 0, y = 0;
    const char *sym = op == 'F' ? "//" : op == 'P' ? "**" : (char[]){(char)op, 0};
    if (op == '+' && a && b && json_is_string(a) && json_is_string(b)) {
        jbuf buf = {0};
        jb_put(&buf, jl_s(a), jl_n(a));
        jb_put(&buf, jl_s(b), jl_n(b));
        *out = buf.oom ? NULL : jl_string(buf.s ? buf.s : "", buf.n);
        free(buf.s);
        return *out ? KILN_OK : OOM;
    }
    if (op == '+' && a && b && json_is_array(a) && json_is_array(b)) {
        if (!jl_charge(8 * (json_array_size(a) + json_array_size(b)))) return OOM;
        *out = json_copy(a);
        if (!*out || json_array_extend(*out, b)) return OOM;
        return KILN_OK;
    }
    bool ints = as_int(a, &x) && as_int(b, &y);
    bool nums = a && b && (json_is_number(a) || json_is_boolean(a)) && (json_is_number(b) || json_is_boolean(b));
    if (op == '*' && a && b && ((json_is_string(a) && as_int(b, &y)) || (json_is_string(b) && as_int(a, &y)))) {
        /* exactly y copies, under the render budget (checked before building) */
        json_t *str = json_is_string(a) ? a : b;
        size_t len = jl_n(str);
        if (y <= 0 || len == 0) return (*out = jl_string("", 0)) ? KILN_OK : OOM;
        if ((unsigned long long)y > (SIZE_MAX / 2) / len || (size_t)y * len > c->budget.limit - c->budget.used) {
            c->budget.over = true;
            return OOM;
        }
        jbuf buf = {0};
        for (long long i = 0; i < y && !buf.oom; i++) jb_put(&buf, jl_s(str), len);
        *out = buf.oom ? NULL : jl_string(buf.s ? buf.s : "", buf.n);
        free(buf.s);
        return *out ? KILN_OK : OOM;
    }
    if (!nums)
        return jl_rerr(c, n, "unsupported operand types for %s%s", sym, !a || !b ? " (an undefined value)" : "");
    double fx = json_is_boolean(a) ? (double)json_is_true(a) : json_number_value(a);
    double fy = json_is_boolean(b) ? (double)json_is_true(b) : json_number_value(b);
    long long r = 0;
    bool big = false, inf = false; /* inf: jansson has no infinite or NaN floats */
#define REAL(x) (isfinite(x) ? json_real(x) : (inf = true, (json_t *)NULL)) /* an int result past 64 bits: Jinja2 gives a big int, kiln refuses */
    switch (op) {
    case '+':
        if (ints) big = __builtin_add_overflow(x, y, &r);
        *out = big ? NULL : ints ? json_integer(r) : REAL(fx + fy);
        break;
    case '-':
        if (ints) big = __builtin_sub_overflow(x, y, &r);
        *out = big ? NULL : ints ? json_integer(r) : REAL(fx - fy);
        break;
    case '*':
        if (ints) big = __builtin_mul_overflow(x, y, &r);
        *out = big ? NULL : ints ? json_integer(r) : REAL(fx * fy);
        break;
    case '/':
        if (fy == 0) return jl_rerr(c, n, "division by zero");
        *out = REAL(ints ? int_truediv(x, y) : fx / fy);
        break;
    case 'F':
    case '%':
        if (fy == 0) return jl_rerr(c, n, "%s by zero", op == '%' ? "modulo" : "division");
        if (ints) {
            long long q = 0, m = 0;
            if (y == -1) { /* x / -1 overflows for INT64_MIN; x % -1 is 0 */
                m = 0;
                big = op == 'F' && __builtin_sub_overflow(0LL, x, &q);
            } else {
                q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
            }
            *out = big ? NULL : json_integer(op == 'F' ? q : m);
        } else {
            double q, m;
            float_divmod(fx, fy, &q, &m);
            *out = REAL(op == 'F' ? q : m);
        }
        break;
    case 'P':
        if (ints && y >= 0) {
            big = !int_pow(x, y, &r);
            *out = big ? NULL : json_integer(r);
        } else {
            /* Python's float pow: refusals where Python raises or leaves
             * the reals (a complex result) */
            if (fx == 0 && fy < 0 && isfinite(fy)) return jl_rerr(c, n, "0.0 cannot be raised to a negative power");
            if (fx < 0 && isfinite(fx) && isfinite(fy) && fy != floor(fy))
                return jl_rerr(c, n, "a negative number to a fractional power is complex (outside kiln's Jinja subset)");
            double p = pow(fx, fy);
            if (isinf(p) && isfinite(fx) && isfinite(fy)) return jl_rerr(c, n, "** overflows a float (Numerical result out of range)");
            *out = REAL(p);
        }
        break;
    default: return jl_rerr(c, n, "unknown operator");
    }
#undef REAL
    if (inf) return jl_rerr(c, n, "a float result of %s that is infinite or NaN is outside kiln's Jinja subset", sym);
    if (big)
        return jl_rerr(c, n, "the integer result of %s does not fit in 64 bits (Jinja2 would give a big integer; kiln refuses)", sym);
    return *out ? KILN_OK : OOM;
}

static kiln_status compare(jrctx *c, const jnode *at, int op, json_t *a, json_t *b, bool *r) {
    char err[160];
    bool lt;
    switch (op) {
    case JC_EQ: *r = jl_equal(a, b); return KILN_OK;
    case JC_NE: *r = !jl_equal(a, b); return KILN_OK;
    case JC_LT: case JC_GE:
        if (!jl_less(a, b, &lt, err, sizeof err)) return jl_rerr(c, at, "%s", err);
        *r = op == JC_LT ? lt : !lt;
        return KILN_OK;
    case JC_GT: case JC_LE:
        if (!jl_less(b, a, &lt, err, sizeof err)) return jl_rerr(c, at, "%s", err);
        *r = op == JC_GT ? lt : !lt;
        return KILN_OK;
    default: break;
    }
    /* in / not in */
    bool found = false;
    if (!b) {
        found = false;
    } else if (json_is_string(b)) {
        if (!a || !json_is_string(a)) return jl_rerr(c, at, "'in <string>' requires a string on the left");
        found = jl_n(a) == 0 || memmem(jl_s(b), jl_n(b), jl_s(a), jl_n(a)) != NULL;
    } else if (json_is_array(b)) {
        for (size_t i = 0; !found && i < json_array_size(b); i++) found = jl_equal(a, json_array_get(b, i));
    } else if (json_is_object(b)) {
        found = a && json_is_string(a) && json_object_get(b, jl_s(a)) != NULL;
    } else {
        return jl_rerr(c, at, "'in' needs a string, list or dict on the right");
    }
    *r = op == JC_IN ? found : !found;
    return KILN_OK;
}

/* Python slicing of a list or string (code points). */
static kiln_status do_slice(jrctx *c, const jnode *n, json_t *obj, json_t *lo, json_t *hi, json_t *step, json_t **out) {
    bool str = json_is_string(obj);
    if (!str && !json_is_array(obj)) return jl_rerr(c, n, "slicing needs a list or a string");
    long long len = str ? (long long)jl_utf8_len(jl_s(obj), jl_n(obj)) : (long long)json_array_size(obj);
    long long st = 1, b, e;
    if (step && !json_is_null(step) && !as_int(step, &st)) return jl_rerr(c, n, "slice step must be an integer");
    if (st == 0) return jl_rerr(c, n, "slice step cannot be zero");
    long long v;
    if (lo && !json_is_null(lo)) {
        if (!as_int(lo, &v)) return jl_rerr(c, n, "slice indices must be integers");
        b = v < 0 ? v + len : v;
        if (b < 0) b = st < 0 ? -1 : 0;
        if (b >= len) b = st < 0 ? len - 1 : len;
    } else {
        b = st < 0 ? len - 1 : 0;
    }
    if (hi && !json_is_null(hi)) {
        if (!as_int(hi, &v)) return jl_rerr(c, n, "slice indices must be integers");
        e = v < 0 ? v + len : v;
        if (e < 0) e = st < 0 ? -1 : 0;
        if (e >= len) e = st < 0 ? len - 1 : len;
    } else {
        e = st < 0 ? -1 : len;
    }
    if (str) {
        jbuf buf = {0};
        const char *s = jl_s(obj);
        size_t n_b = jl_n(obj);
        for (long long i = b; st > 0 ? i < e : i > e; i += st) {
            size_t o = jl_utf8_off(s, n_b, (size_t)i), o2 = jl_utf8_off(s, n_b, (size_t)i + 1);
            jb_put(&buf, s + o, o2 - o);
        }
        *out = buf.oom ? NULL : jl_string(buf.s ? buf.s : "", buf.n);
        free(buf.s);
    } else {
        *out = jl_charge(8 * (size_t)len) ? json_array() : NULL;
        for (long long i = b; *out && (st > 0 ? i < e : i > e); i += st)
            json_array_append(*out, json_array_get(obj, (size_t)i));
    }
    return *out ? KILN_OK : OOM;
}

static kiln_status eval_(jrctx *c, scope *s, const jnode *n, json_t **out);
static kiln_status eval(jrctx *c, scope *s, const jnode *n, json_t **out) {
    *out = NULL;
    kiln_status st = enter(c, n);
    if (st) return st;
    st = leave(c, n, eval_(c, s, n, out));
    if (st) json_decref(*out), *out = NULL;
    return st;
}

static kiln_status eval_(jrctx *c, scope *s, const jnode *n, json_t **out) {
    kiln_status st;
    json_t *a = NULL, *b = NULL;
    switch (n->kind) {
    case JN_CONST: *out = json_incref(n->value); return KILN_OK;
    case JN_NAME: *out = json_incref(lookup(s, n->name)); return KILN_OK;
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: {
        json_t *r = n->kind == JN_DICT ? json_object() : json_array();
        if (!r) return OOM;
        for (int i = 0; i < n->n_kids; i++) {
            if ((st = eval(c, s, n->kids[i], &a))) return json_decref(r), st;
            if (n->kind == JN_DICT && i % 2 == 0) {
                if (!a || !json_is_string(a)) {
                    json_decref(a);
                    json_decref(r);
                    return jl_rerr(c, n->kids[i], "dict literal keys must be strings in kiln's Jinja subset");
                }
                if ((st = eval(c, s, n->kids[i + 1], &b))) return json_decref(a), json_decref(r), st;
                if ((st = nest_check(c, n->kids[i + 1], b))) return json_decref(a), json_decref(b), json_decref(r), st;
                if (!b) b = json_null(); /* cannot store Undefined; rare */
                json_object_set_new(r, jl_s(a), b);
                json_decref(a);
                i++;
            } else {
                if (!a) return json_decref(r), jl_rerr(c, n->kids[i], "an undefined value in a list literal");
                if ((st = nest_check(c, n->kids[i], a))) return json_decref(a), json_decref(r), st;
                json_array_append_new(r, a);
            }
        }
        *out = r;
        return KILN_OK;
    }
    case JN_ATTR:
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        if (!a) return jl_rerr(c, n, "'%s' of an undefined value", n->name);
        if (jl_is_method(a, n->name)) {
            json_decref(a);
            return jl_rerr(c, n, "the method '%s' used as a value is outside kiln's Jinja subset", n->name);
        }
        if (json_is_object(a)) *out = json_incref(json_object_get(a, n->name));
        json_decref(a);
        return KILN_OK;
    case JN_ITEM:
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        if (!a) return jl_rerr(c, n, "subscript of an undefined value");
        if ((st = eval(c, s, n->kids[1], &b))) return json_decref(a), st;
        if (b && json_is_string(b) && !json_is_object(a) && jl_is_method(a, jl_s(b))) {
            json_decref(a), json_decref(b);
            return jl_rerr(c, n, "a method used as a value is outside kiln's Jinja subset");
        }
        *out = jl_getitem(a, b);
        json_decref(a);
        json_decref(b);
        return KILN_OK;
    case JN_SLICE: {
        json_t *v[4] = {NULL, NULL, NULL, NULL};
        st = KILN_OK;
        for (int i = 0; i < 4 && !st; i++)
            if (n->kids[i]) st = eval(c, s, n->kids[i], &v[i]);
        if (!st && !v[0]) st = jl_rerr(c, n, "slice of an undefined value");
        if (!st) st = do_slice(c, n, v[0], v[1], v[2], v[3], out);
        for (int i = 0; i < 4; i++) json_decref(v[i]);
        return st;
    }
    case JN_CALL: return eval_call(c, s, n, out);
    case JN_FILTER:
    case JN_TEST: {
        jargs args = {0};
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        if ((st = eval_args(c, s, n, 1, &args))) return json_decref(a), st;
        if (n->kind == JN_FILTER) {
            st = jl_filter(c, n, n->name, a, &args, out);
        } else {
            bool r = false;
            st = jl_test(c, n, n->name, a, &args, &r);
            if (!st) *out = json_boolean(n->op ? !r : r);
        }
        free_args(&args);
        json_decref(a);
        return st;
    }
    case JN_UNARY:
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        if (n->op == '!') {
            *out = json_boolean(!jl_truthy(a));
        } else if (a && json_is_integer(a)) {
            if (n->op == '-' && json_integer_value(a) == LLONG_MIN) {
                json_decref(a);
                return jl_rerr(c, n, "the integer result of unary - does not fit in 64 bits (Jinja2 would give a big integer; kiln refuses)");
            }
            *out = json_integer(n->op == '-' ? -json_integer_value(a) : json_integer_value(a));
        } else if (a && json_is_real(a)) {
            *out = json_real(n->op == '-' ? -json_real_value(a) : json_real_value(a));
        } else if (a && json_is_boolean(a)) {
            *out = json_integer(n->op == '-' ? -(long long)json_is_true(a) : json_is_true(a));
        } else {
            json_decref(a);
            return jl_rerr(c, n, "bad operand for unary %c", n->op);
        }
        json_decref(a);
        return KILN_OK;
    case JN_BINARY:
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        if (n->op == 'a' || n->op == 'o') {
            bool t = jl_truthy(a);
            if ((n->op == 'a') != t) {
                *out = a;
                return KILN_OK;
            }
            json_decref(a);
            return eval(c, s, n->kids[1], out);
        }
        if ((st = eval(c, s, n->kids[1], &b))) return json_decref(a), st;
        if (n->op == '~') {
            jbuf buf = {0};
            jl_str(&buf, a);
            jl_str(&buf, b);
            *out = buf.oom ? NULL : jl_string(buf.s ? buf.s : "", buf.n);
            free(buf.s);
            st = *out ? KILN_OK : OOM;
        } else {
            st = arith(c, n, a, b, out);
        }
        json_decref(a);
        json_decref(b);
        return st;
    case JN_COMPARE: {
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        bool r = true;
        for (int i = 1; i < n->n_kids && r; i++) {
            if ((st = eval(c, s, n->kids[i], &b))) return json_decref(a), st;
            st = compare(c, n, n->ops[i - 1], a, b, &r);
            json_decref(a);
            a = b;
            if (st) return json_decref(a), st;
        }
        json_decref(a);
        *out = json_boolean(r);
        return KILN_OK;
    }
    case JN_COND:
        if ((st = eval(c, s, n->kids[0], &a))) return st;
        bool t = jl_truthy(a);
        json_decref(a);
        if (t) return eval(c, s, n->kids[1], out);
        return n->kids[2] ? eval(c, s, n->kids[2], out) : KILN_OK;
    default: return jl_rerr(c, n, "not an expression");
    }
}

/* Binds a for/set target (a name or a tuple of names). */
static kiln_status bind(jrctx *c, scope *s, const jnode *tgt, json_t *v) {
    if (tgt->kind == JN_NAME) {
        if (!v) return json_object_del(s->vars, tgt->name), KILN_OK;
        return json_object_set(s->vars, tgt->name, v) ? OOM : KILN_OK;
    }
    json_t *items = NULL;
    const char *err = NULL;
    if (!v || !(items = jl_iter_list(v, &err)))
        return jl_rerr(c, tgt, "cannot unpack %s", v ? err : "an undefined value");
    if (json_array_size(items) != (size_t)tgt->n_kids) {
        json_decref(items);
        return jl_rerr(c, tgt, "cannot unpack %zu values into %d names", json_array_size(items), tgt->n_kids);
    }
    kiln_status st = KILN_OK;
    for (int i = 0; i < tgt->n_kids && !st; i++) st = bind(c, s, tgt->kids[i], json_array_get(items, (size_t)i));
    json_decref(items);
    return st;
}

static kiln_status exec_for(jrctx *c, scope *s, const jnode *n) {
    json_t *it, *items;
    kiln_status st = eval(c, s, n->kids[1], &it);
    if (st) return st;
    const char *err = NULL;
    /* a list is iterated as it is (lists cannot change in the subset) */
    items = it && json_is_array(it) ? json_incref(it) : jl_iter_list(it, &err);
    json_decref(it);
    if (!items) return jl_rerr(c, n->kids[1], "%s", err ? err : "out of memory");
    if (n->kids[4]) { /* for x in xs if cond: filter first (loop.length counts what passes) */
        json_t *kept = json_array();
        for (size_t i = 0; kept && i < json_array_size(items) && !st; i++) {
            if ((st = step(c, n))) break;
            scope is = {.vars = json_object(), .up = s};
            json_t *cv = NULL;
            if (!is.vars) st = OOM;
            if (!st) st = bind(c, &is, n->kids[0], json_array_get(items, i));
            if (!st) st = eval(c, &is, n->kids[4], &cv);
            if (!st && jl_truthy(cv)) json_array_append(kept, json_array_get(items, i));
            json_decref(cv);
            json_decref(is.vars);
        }
        json_decref(items);
        if (!kept) return OOM;
        if (st) return json_decref(kept), st;
        items = kept;
    }
    size_t len = json_array_size(items);
    /* one scope object, emptied at each iteration (nothing else can hold
     * it); the loop object only when the body names `loop` */
    scope is = {.vars = len ? json_object() : NULL, .up = s};
    if (len && !is.vars) st = OOM;
    for (size_t i = 0; i < len && !st; i++) {
        if ((st = step(c, n))) break;
        if (i && json_object_clear(is.vars)) {
            st = OOM;
            break;
        }
        if (n->op) {
            json_t *loop = json_object();
            if (!loop) {
                st = OOM;
                break;
            }
            json_object_set_new(loop, "index", json_integer((json_int_t)i + 1));
            json_object_set_new(loop, "index0", json_integer((json_int_t)i));
            json_object_set_new(loop, "revindex", json_integer((json_int_t)(len - i)));
            json_object_set_new(loop, "revindex0", json_integer((json_int_t)(len - i - 1)));
            json_object_set_new(loop, "first", json_boolean(i == 0));
            json_object_set_new(loop, "last", json_boolean(i + 1 == len));
            json_object_set_new(loop, "length", json_integer((json_int_t)len));
            json_object_set_new(loop, "depth", json_integer(1));
            json_object_set_new(loop, "depth0", json_integer(0));
            if (i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
            if (i + 1 < len) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
            json_object_set_new(is.vars, "loop", loop);
        }
        st = bind(c, &is, n->kids[0], json_array_get(items, i));
        if (!st) st = exec(c, &is, n->kids[2]);
        if (c->ctl == 1) {
            c->ctl = 0;
            break;
        }
        c->ctl = 0;
    }
    json_decref(is.vars);
    json_decref(items);
    if (!st && len == 0 && n->kids[3]) st = exec(c, s, n->kids[3]);
    return st;
}

static kiln_status exec_(jrctx *c, scope *s, const jnode *n);
static kiln_status exec(jrctx *c, scope *s, const jnode *n) {
    kiln_status st = enter(c, n);
    return st ? st : leave(c, n, exec_(c, s, n));
}

static kiln_status exec_(jrctx *c, scope *s, const jnode *n) {
    kiln_status st = KILN_OK;
    json_t *v = NULL;
    switch (n->kind) {
    case JN_BLOCK:
        for (int i = 0; i < n->n_kids && !st && !c->ctl; i++) st = exec(c, s, n->kids[i]);
        return st;
    case JN_TEXT: jb_put(c->out, n->text, n->text_len); return c->out->oom ? OOM : KILN_OK;
    case JN_PRINT:
        if ((st = eval(c, s, n->kids[0], &v))) return st;
        if (n->kids[0]->kind == JN_TUPLE) st = jl_rerr(c, n, "printing a tuple is outside kiln's Jinja subset");
        else jl_str(c->out, v);
        json_decref(v);
        return st ? st : c->out->oom ? OOM : KILN_OK;
    case JN_IF:
        if ((st = eval(c, s, n->kids[0], &v))) return st;
        bool t = jl_truthy(v);
        json_decref(v);
        if (t) return exec(c, s, n->kids[1]);
        return n->kids[2] ? exec(c, s, n->kids[2]) : KILN_OK;
    case JN_FOR: return exec_for(c, s, n);
    case JN_SET: {
        const jnode *tgt = n->kids[0];
        if ((st = eval(c, s, n->kids[1], &v))) return st;
        if (tgt->kind == JN_ATTR) {
            json_t *ns = lookup(s, tgt->kids[0]->name);
            bool inside = false;
            if (!is_ns(c, ns)) st = jl_rerr(c, tgt, "'%s' is not a namespace: only namespace attributes can be set", tgt->kids[0]->name);
            else if (vdepth(c, v, ns, &inside, 1) + 1 > JL_MAX_VALUE_DEPTH)
                st = jl_rerr(c, tgt, "a list or dict nested deeper than %d levels (kiln's limit)", JL_MAX_VALUE_DEPTH);
            else if (inside) st = jl_rerr(c, tgt, "a namespace inside itself is outside kiln's Jinja subset");
            else if (!v) json_object_del(ns, tgt->name);
            else json_object_set(ns, tgt->name, v);
        } else {
            st = bind(c, s, tgt, v);
        }
        json_decref(v);
        return st;
    }
    case JN_SETBLOCK: {
        jbuf buf = {0}, *saved = c->out;
        c->out = &buf;
        st = exec(c, s, n->kids[1]);
        c->out = saved;
        if (!st && buf.oom) st = OOM;
        if (!st && !(v = jl_string(buf.s ? buf.s : "", buf.n))) st = OOM;
        if (!st) st = bind(c, s, n->kids[0], v);
        json_decref(v);
        free(buf.s);
        return st;
    }
    case JN_BREAK:
    case JN_CONTINUE:
        c->ctl = n->kind == JN_BREAK ? 1 : 2;
        return KILN_OK;
    case JN_GENERATION: {
        size_t start = c->out->n;
        if ((st = exec(c, s, n->kids[0]))) return st;
        if (c->n_gen + 2 > c->cap_gen) {
            size_t cap = c->cap_gen ? 2 * c->cap_gen : 16;
            size_t *g = realloc(c->gen, cap * sizeof *g);
            if (!g) return OOM;
            c->gen = g;
            c->cap_gen = cap;
        }
        c->gen[c->n_gen++] = start;
        c->gen[c->n_gen++] = c->out->n;
        return KILN_OK;
    }
    case JN_MACRO:
        if (c->n_macros == c->cap_macros) {
            int cap = c->cap_macros ? 2 * c->cap_macros : 8;
            const jnode **m = realloc(c->macros, (size_t)cap * sizeof *m);
            if (!m) return OOM;
            c->macros = m;
            c->cap_macros = cap;
        }
        c->macros[c->n_macros++] = n;
        return KILN_OK;
    default: return jl_rerr(c, n, "not a statement");
    }
}

kiln_status kiln_template_render(const kiln_template *t, const struct json_t *vars, char **out, size_t *len,
                                 size_t **gen_spans, size_t *n_gen) {
    *out = NULL;
    if (len) *len = 0;
    if (gen_spans) *gen_spans = NULL;
    if (n_gen) *n_gen = 0;
    if (vars && !json_is_object(vars)) return kiln_error(KILN_ERR_INVALID, "%s: template variables must be a JSON object", t->name);
    jbuf buf = {0};
    jrctx c = {.t = t, .out = &buf, .nss = json_array(), .budget = {.limit = JL_MAX_BYTES}};
    jl_budget *outer = jl_cur_budget; /* none, unless a render renders */
    jl_cur_budget = &c.budget;
    scope global = {.vars = (json_t *)vars, .up = NULL};
    scope top = {.vars = json_object(), .up = &global};
    kiln_status st = c.nss && top.vars ? KILN_OK : OOM;
    if (!global.vars) global.vars = top.vars; /* no variables: an empty scope */
    if (!st) st = exec(&c, &top, t->root);
    if (!st && buf.oom) st = OOM;
    json_decref(top.vars);
    json_decref(c.nss);
    free(c.macros);
    jl_cur_budget = outer;
    if (st) {
        free(buf.s);
        free(c.gen);
        return st;
    }
    if (!buf.s && !(buf.s = calloc(1, 1))) return free(c.gen), OOM;
    *out = buf.s;
    if (len) *len = buf.n;
    if (gen_spans) *gen_spans = c.gen;
    else free(c.gen);
    if (n_gen) *n_gen = c.n_gen / 2;
    return KILN_OK;
}
