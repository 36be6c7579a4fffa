/* Private to the Jinja subset (jinja.c: lexer + parser, jinja_eval.c:
 * evaluator, jinja_lib.c: filters, tests, methods, str()/tojson).
 * Values are jansson values: NULL is Jinja's Undefined, json_null() is
 * None; lists, dicts, strings, ints, floats and bools are the JSON kinds
 * (tuples are lists). Every expression node remembers its template line
 * and column so that any failure names them. */
#ifndef KILN_JINJA_IMPL_H
#define KILN_JINJA_IMPL_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include "kiln/template.h"
#include "template_names.h" /* links the jn_/jb_/jl_ helpers as kiln_* */

/* Limits (issue 22). A template or a rendering past one is refused with
 * "NAME:LINE:COLUMN: ... (kiln's limit is N)", never a crash or a stall;
 * none is near what a real chat template needs (the Hugging Face ones nest
 * expressions < 10 deep, statements < 8, call no recursive macros, take
 * well under 100000 steps and a few MB for long conversations).
 *   JL_MAX_EXPR_DEPTH  expression nesting: unary chains, brackets and
 *                      parentheses, list/dict literals, and the height of
 *                      operator, filter, test, subscript and attribute
 *                      chains and ternaries (Python itself refuses 200
 *                      nested parentheses).
 *   JL_MAX_STMT_DEPTH  statements inside statements (if/elif/for/set
 *                      block/macro/generation; each elif counts one).
 *   JL_MAX_CALL_DEPTH  macro calls inside macro calls at render time.
 *   JL_MAX_RENDER_DEPTH nested evaluation (expression and statement nodes
 *                      on the evaluator's stack, across macro calls).
 *   JL_MAX_VALUE_DEPTH lists and dicts built inside lists and dicts.
 *   JL_MAX_STEPS       nodes evaluated, loop iterations and items range()
 *                      makes, in one render.
 *   JL_MAX_BYTES       bytes of text one render builds: output, every
 *                      string value and list element made (not the
 *                      variables passed in).
 *   JL_MAX_RANGE       items of range(), as Hugging Face's sandbox
 *                      (jinja2.sandbox.MAX_RANGE). */
#define JL_MAX_EXPR_DEPTH 256
#define JL_MAX_STMT_DEPTH 128
#define JL_MAX_CALL_DEPTH 64
#define JL_MAX_RENDER_DEPTH 1024
#define JL_MAX_VALUE_DEPTH 256
#define JL_MAX_STEPS 10000000LL
#define JL_MAX_BYTES ((size_t)64 << 20)
#define JL_MAX_RANGE 100000

typedef enum {
    /* expressions */
    JN_CONST,   /* value */
    JN_NAME,    /* name */
    JN_LIST,    /* kids: items */
    JN_TUPLE,   /* kids: items */
    JN_DICT,    /* kids: key, value, key, value, ... */
    JN_ATTR,    /* kids[0].name */
    JN_ITEM,    /* kids[0][kids[1]] */
    JN_SLICE,   /* kids[0][kids[1]:kids[2]:kids[3]] (each may be NULL) */
    JN_CALL,    /* kids[0](kids[1..]), names[i] = keyword or NULL */
    JN_FILTER,  /* kids[0] | name(kids[1..]) */
    JN_TEST,    /* kids[0] is name(kids[1..]); op = 1 when negated */
    JN_UNARY,   /* op kids[0]: '!' not, '-', '+' */
    JN_BINARY,  /* kids[0] op kids[1]: + - * / F(//) % P(**) ~ a(and) o(or) */
    JN_COMPARE, /* kids[0] ops[0] kids[1] ops[1] kids[2] ... (chained) */
    JN_COND,    /* kids[1] if kids[0] else kids[2] (kids[2] may be NULL) */
    /* statements */
    JN_BLOCK,   /* kids: statements */
    JN_TEXT,    /* text, text_len */
    JN_PRINT,   /* {{ kids[0] }} */
    JN_IF,      /* if kids[0]: kids[1] else kids[2] (NULL or a block / nested if) */
    JN_FOR,     /* for kids[0] in kids[1] [if kids[4]]: kids[2] else kids[3]; op = 1 when the body names `loop` */
    JN_SET,     /* set kids[0] = kids[1] */
    JN_SETBLOCK,/* set kids[0]: the output of kids[1] */
    JN_BREAK,
    JN_CONTINUE,
    JN_GENERATION, /* {% generation %} kids[0] {% endgeneration %} (HF) */
    JN_MACRO,   /* name; names[i]: parameters; kids[0]: body; kids[1+i]: default or NULL */
} jn_kind;

/* Comparison operators of JN_COMPARE. */
enum { JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN, JC_NOTIN };

typedef struct jnode jnode;
struct jnode {
    jn_kind kind;
    int op;
    int line, col;
    char *name;
    json_t *value;
    char *text;
    size_t text_len;
    jnode **kids;
    char **names;
    int *ops;
    int n_kids;
    int height;       /* 1 + the tallest kid's (jn_add keeps it) */
    const void *impl; /* JN_FILTER / JN_TEST: the table entry, found at parse time (NULL: unknown) */
};

struct kiln_template {
    char *name;
    jnode *root;
};

/* ---- tokens (jinja_lex.c) ---- */

typedef enum {
    T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF
} tkind;

typedef struct {
    tkind kind;
    int line, col;
    char *s; /* data, name, unescaped string, operator */
    size_t n;
    long long i;
    double f;
} token;

typedef struct {
    const char *name;
    const char *src;
    size_t n;
    size_t pos;
    int line, col;
    token *toks;
    size_t n_toks, cap;
    size_t cur; /* parser position */
    int depth;      /* expression recursion (JL_MAX_EXPR_DEPTH) */
    int stmt_depth; /* statement nesting (JL_MAX_STMT_DEPTH) */
    int loop_refs;  /* names `loop` parsed so far (a for without one builds no loop object) */
} lexer;
/* Tokenizes L->src[0..n) into L->toks (ending in T_EOF). */
kiln_status jl_lex(lexer *L);
/* "NAME:LINE:COL: message" (fmt takes up to two %s: a, b). */
kiln_status jl_lex_error(const lexer *L, int line, int col, const char *fmt, const char *a, const char *b);

/* Allocation helpers shared by the parser. */
jnode *jn_new(jn_kind kind, int line, int col);
bool jn_add(jnode *n, jnode *kid, const char *name);
void jn_free(jnode *n);

/* ---- growable byte buffer ---- */
typedef struct { char *s; size_t n, cap; bool oom; } jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
static inline void jb_puts(jbuf *b, const char *s) { jb_put(b, s, __builtin_strlen(s)); }
void jb_putc(jbuf *b, char c);

/* ---- the render budget (JL_MAX_BYTES) ----
 * The rendering on this thread (NULL outside kiln_template_render): every
 * byte appended to a jbuf and every string made by jl_string is charged to
 * it; past the limit the charge fails (the buffer turns oom, jl_string gives
 * NULL) and `over` stays set so that the evaluator reports the limit at the
 * node it was evaluating. */
typedef struct { size_t used, limit; bool over; } jl_budget;
extern _Thread_local jl_budget *jl_cur_budget;
static inline bool jl_charge(size_t n) {
    jl_budget *b = jl_cur_budget;
    if (!b) return true;
    if (b->over || n > b->limit - b->used) return b->over = true, false;
    b->used += n;
    return true;
}

/* ---- the library (jinja_lib.c) ---- */
/* Python's str(v) appended to b (Undefined gives ""). */
void jl_str(jbuf *b, const json_t *v);
/* Python's repr(v). */
void jl_repr(jbuf *b, const json_t *v);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), sort_keys). */
kiln_status jl_tojson(jbuf *b, const json_t *v, int indent, bool sort_keys, const char *item_sep,
                      const char *key_sep);
bool jl_truthy(const json_t *v);
/* Python ==. */
bool jl_equal(const json_t *a, const json_t *b);
/* Python <: sets *lt; an error (message in err) for kinds Python cannot order. */
bool jl_less(const json_t *a, const json_t *b, bool *lt, char *err, size_t errn);
/* Number of code points of a UTF-8 string. */
size_t jl_utf8_len(const char *s, size_t n);
/* Byte offset of code point i (i <= length). */
size_t jl_utf8_off(const char *s, size_t n, size_t i);
/* Python str.isspace() for the code point at s (its byte length in *len). */
bool jl_space_at(const char *s, size_t n, size_t *len);
/* Python str.strip/lstrip/rstrip: chars NULL = whitespace. */
void jl_strip(const char *s, size_t n, const char *chars, size_t cn, bool left, bool right, size_t *b, size_t *e);
static inline const char *jl_s(const json_t *v) { return json_string_value(v); }
static inline size_t jl_n(const json_t *v) { return json_string_length(v); }
json_t *jl_string(const char *s, size_t n);

/* ---- evaluation context, shared with the filters (jinja_filters.c) ---- */
typedef struct jrctx jrctx;
/* "TEMPLATE:LINE:COL: message" for node `at`. */
kiln_status jl_rerr(jrctx *c, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Call arguments: v[i] owned by the caller, kw[i] = keyword or NULL. */
typedef struct { json_t **v; char **kw; int n; } jargs;
/* Argument `pos` (positional) or keyword `kw`; NULL when absent. */
json_t *jl_arg(const jargs *a, int pos, const char *kw, bool *present);
/* Refuses more than max_pos positionals or keywords outside kws (NULL-terminated). */
kiln_status jl_args_check(jrctx *c, const jnode *at, const char *what, const jargs *a, int max_pos, const char *const *kws);
/* Filters and tests by name. When name is at->name itself (the node's own
 * filter or test), at->impl is the table entry the parser found with
 * jl_filter_find / jl_test_find and no lookup is made again. */
kiln_status jl_filter(jrctx *c, const jnode *at, const char *name, json_t *subj, const jargs *a, json_t **out);
kiln_status jl_test(jrctx *c, const jnode *at, const char *name, json_t *subj, const jargs *a, bool *out);
/* The table entry of a filter / test, NULL when kiln has none. */
const void *jl_filter_find(const char *name);
const void *jl_test_find(const char *name);
kiln_status jl_method(jrctx *c, const jnode *at, json_t *obj, const char *name, const jargs *a, json_t **out);
/* Whether `name` is a Python method of obj's type (str, list, dict). */
bool jl_is_method(const json_t *obj, const char *name);
/* obj[key] as Jinja2 reads it: NULL (Undefined) when absent. New reference. */
json_t *jl_getitem(const json_t *obj, const json_t *key);
/* Python's iteration over v as a new list (dict: keys; str: characters);
 * NULL with *err set when v is not iterable. Undefined gives []. */
json_t *jl_iter_list(const json_t *v, const char **err);
#endif
