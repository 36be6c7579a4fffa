/* Chat templates of tokenizer_config.json files: load, render a
 * conversation as transformers' apply_chat_template does, and find the
 * bytes of the rendering that belong to assistant turns (the loss mask). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jinja_impl.h"

struct kiln_chat {
    kiln_template *tmpl;
    json_t *tokens; /* {"bos_token": ..., "eos_token": ..., ...} */
    char *name;
    char *source; /* the template's text (chat_template.jinja beside data rendered with it) */
    size_t source_len;
};

static json_t *token_string(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? v : NULL;
}

kiln_status kiln_chat_load(const char *config_path, const char *template_path, kiln_chat **out) {
    *out = NULL;
    if (!config_path && !template_path) return kiln_error(KILN_ERR_INVALID, "chat: no tokenizer_config.json and no template file");
    kiln_chat *c = calloc(1, sizeof *c);
    if (!c || !(c->tokens = json_object())) return free(c), kiln_error(KILN_ERR_OOM, "out of memory");
    json_t *cfg = NULL;
    char *src = NULL;
    size_t n = 0;
    kiln_status st = KILN_OK;
    if (config_path) {
        json_error_t e;
        /* model_max_length is often 1e30, beyond a JSON integer here */
        cfg = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &e);
        if (!cfg) st = kiln_error(KILN_ERR_FORMAT, "%s:%d:%d: %s", config_path, e.line, e.column, e.text);
        else if (!json_is_object(cfg)) st = kiln_error(KILN_ERR_FORMAT, "%s: not a JSON object", config_path);
        static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token", NULL};
        for (int i = 0; !st && keys[i]; i++) {
            json_t *v = json_object_get(cfg, keys[i]);
            json_t *s = token_string(v);
            if (v && !json_is_null(v) && !s)
                st = kiln_error(KILN_ERR_FORMAT, "%s: field %s: expected a string or {\"content\": ...}", config_path, keys[i]);
            else json_object_set(c->tokens, keys[i], s ? s : json_null());
        }
    } else {
        json_object_set_new(c->tokens, "bos_token", json_string(""));
        json_object_set_new(c->tokens, "eos_token", json_string(""));
    }
    const char *name = template_path ? template_path : config_path;
    if (!st && template_path) {
        st = kiln_read_file(template_path, &src, &n);
        if (st) kiln_error_context(st, "reading chat template %s", template_path);
    } else if (!st) {
        json_t *t = json_object_get(cfg, "chat_template");
        if (json_is_array(t)) {
            size_t i;
            json_t *x, *found = NULL;
            json_array_foreach(t, i, x) if (json_is_string(json_object_get(x, "name")) &&
                                            !strcmp(json_string_value(json_object_get(x, "name")), "default")) found = json_object_get(x, "template");
            t = found;
            if (!t) st = kiln_error(KILN_ERR_FORMAT, "%s: field chat_template is a list without a \"default\" template", config_path);
        }
        if (!st && !t)
            st = kiln_error(KILN_ERR_INVALID, "%s has no chat_template (give one with --chat-template FILE)", config_path);
        else if (!st && !json_is_string(t))
            st = kiln_error(KILN_ERR_FORMAT, "%s: field chat_template: expected a string", config_path);
        if (!st) {
            n = json_string_length(t);
            if (!(src = malloc(n + 1))) st = kiln_error(KILN_ERR_OOM, "out of memory");
            else memcpy(src, json_string_value(t), n + 1);
        }
    }
    if (!st) st = kiln_template_parse(src, n, name, &c->tmpl);
    if (!st && !(c->name = strdup(name))) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) c->source = src, c->source_len = n, src = NULL;
    free(src);
    json_decref(cfg);
    if (st) return kiln_chat_free(c), st;
    *out = c;
    return KILN_OK;
}

void kiln_chat_free(kiln_chat *c) {
    if (!c) return;
    kiln_template_free(c->tmpl);
    json_decref(c->tokens);
    free(c->name);
    free(c->source);
    free(c);
}

const char *kiln_chat_source(const kiln_chat *c, size_t *len) {
    if (len) *len = c ? c->source_len : 0;
    return c ? c->source : NULL;
}

/* Template variables: the conversation's keys (messages replaced by `msgs`),
 * tools None unless given, the special tokens, add_generation_prompt. */
static json_t *vars_of(const kiln_chat *c, const json_t *conv, json_t *msgs, bool agp) {
    json_t *v = json_copy((json_t *)conv);
    if (!v) return NULL;
    json_object_set(v, "messages", msgs);
    if (!json_object_get(v, "tools")) json_object_set_new(v, "tools", json_null());
    const char *k;
    json_t *x;
    json_object_foreach(c->tokens, k, x) if (!json_object_get(v, k)) json_object_set(v, k, x);
    json_object_set_new(v, "add_generation_prompt", json_boolean(agp));
    return v;
}

static kiln_status check_conv(const kiln_chat *c, const json_t *conv) {
    if (!json_is_object(conv)) return kiln_error(KILN_ERR_INVALID, "a conversation must be a JSON object with \"messages\"");
    json_t *m = json_object_get(conv, "messages");
    if (!json_is_array(m)) return kiln_error(KILN_ERR_INVALID, "field messages: expected a list of {\"role\", \"content\"}");
    size_t i;
    json_t *x;
    json_array_foreach(m, i, x) {
        if (!json_is_object(x) || !json_is_string(json_object_get(x, "role")))
            return kiln_error(KILN_ERR_INVALID, "messages[%zu]: expected an object with a string \"role\"", i);
    }
    (void)c;
    return KILN_OK;
}

static kiln_status render_msgs(const kiln_chat *c, const json_t *conv, json_t *msgs, bool agp, char **out, size_t *len,
                               size_t **gen, size_t *n_gen) {
    json_t *v = vars_of(c, conv, msgs, agp);
    if (!v) return kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status st = kiln_template_render(c->tmpl, v, out, len, gen, n_gen);
    json_decref(v);
    return st;
}

kiln_status kiln_chat_render(const kiln_chat *c, const json_t *conv, bool agp, char **out, size_t *len) {
    kiln_status st = check_conv(c, conv);
    if (st) return st;
    return render_msgs(c, conv, json_object_get(conv, "messages"), agp, out, len, NULL, NULL);
}

static json_t *prefix(json_t *msgs, size_t n) {
    json_t *p = json_array();
    for (size_t i = 0; p && i < n; i++) json_array_append(p, json_array_get(msgs, i));
    return p;
}

static size_t lcp(const char *a, size_t an, const char *b, size_t bn) {
    size_t k = 0;
    while (k < an && k < bn && a[k] == b[k]) k++;
    return k;
}

static const char *find(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

/* The span of assistant message i in the full rendering R. tail: what the
 * template writes after any conversation, even an empty one (Llama 3.0's
 * unconditional assistant header), which belongs to no turn. */
static kiln_status locate(const kiln_chat *c, const json_t *conv, json_t *msgs, size_t i, const char *R, size_t rn,
                          const char *tail, size_t tn, size_t *s0, size_t *s1) {
    json_t *pre = prefix(msgs, i), *upto = prefix(msgs, i + 1);
    char *P = NULL, *Q = NULL;
    size_t pn = 0, qn = 0;
    kiln_status st = pre && upto ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = render_msgs(c, conv, pre, true, &P, &pn, NULL, NULL);
    if (st) kiln_error_context(st, "rendering messages[:%zu] with the generation prompt", i);
    if (!st) {
        st = render_msgs(c, conv, upto, false, &Q, &qn, NULL, NULL);
        if (st) kiln_error_context(st, "rendering messages[:%zu]", i + 1);
    }
    if (!st && tn && qn >= pn + tn && !memcmp(Q + qn - tn, tail, tn)) qn -= tn;
    if (!st && (pn > rn || memcmp(P, R, pn)))
        st = kiln_error(KILN_ERR_INVALID,
                        "assistant message %zu: the template renders messages[:%zu] + generation prompt differently from the start of the whole conversation (differs at byte %zu), so its turn cannot be located; use a template with {%% generation %%} blocks",
                        i, i, lcp(P, pn, R, rn));
    if (!st) {
        *s0 = pn;
        if (qn > pn && qn <= rn && !memcmp(Q, R, qn)) {
            *s1 = qn;
        } else {
            /* The template renders a final turn differently from a past one
             * (Qwen3's empty <think> block): locate the content in both and
             * extend over what follows it in both (the end-of-turn). */
            json_t *content = json_object_get(json_array_get(msgs, i), "content");
            const char *cs = json_is_string(content) ? json_string_value(content) : "";
            size_t b, e, cn = json_is_string(content) ? json_string_length(content) : 0;
            jl_strip(cs, cn, NULL, 0, true, true, &b, &e);
            const char *r = find(R + pn, rn - pn, cs + b, e - b);
            const char *q = pn <= qn ? find(Q + pn, qn - pn, cs + b, e - b) : NULL;
            if (!r || !q) {
                st = kiln_error(KILN_ERR_INVALID, "assistant message %zu: its content is not in the rendering after the generation prompt", i);
            } else {
                size_t re = (size_t)(r - R) + (e - b), qe = (size_t)(q - Q) + (e - b);
                *s1 = re + lcp(R + re, rn - re, Q + qe, qn - qe);
            }
        }
    }
    json_decref(pre);
    json_decref(upto);
    free(P);
    free(Q);
    return st;
}

kiln_status kiln_chat_assistant_spans(const kiln_chat *c, const json_t *conv, bool last_only, char **text, size_t *len,
                                      size_t **spans, size_t *n_spans) {
    *text = NULL;
    *spans = NULL;
    *n_spans = 0;
    kiln_status st = check_conv(c, conv);
    if (st) return st;
    json_t *msgs = json_object_get(conv, "messages");
    char *R;
    size_t rn, *gen, n_gen;
    if ((st = render_msgs(c, conv, msgs, false, &R, &rn, &gen, &n_gen))) return st;
    if (n_gen) { /* the template marks what the assistant generates */
        if (last_only && n_gen > 1) {
            gen[0] = gen[2 * n_gen - 2];
            gen[1] = gen[2 * n_gen - 1];
            n_gen = 1;
        }
        *text = R;
        *len = rn;
        *spans = gen;
        *n_spans = n_gen;
        return KILN_OK;
    }
    free(gen);
    size_t n = json_array_size(msgs), *sp = malloc(2 * (n ? n : 1) * sizeof *sp), k = 0;
    if (!sp) return free(R), kiln_error(KILN_ERR_OOM, "out of memory");
    /* the template's unconditional tail: the rendering of no messages, when
     * it renders (a template may refuse an empty conversation: no tail) */
    char *tail = NULL;
    size_t tn = 0;
    json_t *none = json_array();
    if (!none) return free(R), free(sp), kiln_error(KILN_ERR_OOM, "out of memory");
    if (render_msgs(c, conv, none, false, &tail, &tn, NULL, NULL)) tail = NULL, tn = 0;
    json_decref(none);
    size_t last = n;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant")) last = i;
    for (size_t i = 0; i < n && !st; i++) {
        if (strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant")) continue;
        if (last_only && i != last) continue;
        st = locate(c, conv, msgs, i, R, rn, tail, tn, &sp[2 * k], &sp[2 * k + 1]);
        if (!st && k && sp[2 * k] < sp[2 * k - 1])
            st = kiln_error(KILN_ERR_INVALID, "assistant message %zu overlaps the previous assistant turn", i);
        k++;
    }
    free(tail);
    if (st) return free(R), free(sp), st;
    *text = R;
    *len = rn;
    *spans = sp;
    *n_spans = k;
    return KILN_OK;
}
