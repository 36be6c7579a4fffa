/* `kiln tokenize` on JSONL: one example a line ({"text"}, {"prompt",
 * "completion"}, {"messages"} or --field NAME), rendered to text with the
 * byte ranges that are training targets, encoded once, and the loss mask
 * read off the token sequence through each token's bytes. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

typedef struct {
    size_t line;
    char *text;
    size_t len;
    size_t *spans; /* trained byte ranges [s, e), 2 * n_spans; NULL with all */
    size_t n_spans;
    bool all;        /* every token is a target */
    bool eos_target; /* the eos after the example is a target */
    bool plain;      /* a "text" line (or --field): through the post-processor, as plain text files */
    int32_t *ids;
    uint8_t *mask;
    size_t n_ids;
    bool is_pair;    /* a preference pair: `pair` holds it */
    kd_pair pair;
    kiln_status st;
    char err[512];
} example;

static void ex_free(example *e) {
    kd_pair_free(&e->pair);
    free(e->text);
    free(e->spans);
    free(e->ids);
    free(e->mask);
    memset(e, 0, sizeof *e);
}

static kiln_status one_span(example *e, size_t s, size_t end) {
    e->spans = malloc(2 * sizeof *e->spans);
    if (!e->spans) return kiln_error(KILN_ERR_OOM, "out of memory");
    e->spans[0] = s;
    e->spans[1] = end;
    e->n_spans = 1;
    return KILN_OK;
}

static const char *str_field(json_t *o, const char *k, kiln_status *st) {
    json_t *v = json_object_get(o, k);
    if (!json_is_string(v)) {
        *st = kiln_error(KILN_ERR_INVALID, "field \"%s\": expected a string, got %s", k,
                         !v ? "nothing" : json_is_null(v) ? "null" : json_is_array(v) ? "a list" : json_is_object(v) ? "an object" : "a number or boolean");
        return NULL;
    }
    return json_string_value(v);
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* Builds the example's text and trained ranges from one JSON object. */
static kiln_status build(const kiln_tokenize_opts *o, json_t *obj, example *e) {
    kiln_status st = KILN_OK;
    if (!json_is_object(obj)) return kiln_error(KILN_ERR_INVALID, "expected a JSON object");
    bool all = o->train_on == KILN_TRAIN_ALL;
    if (o->field || (!json_object_get(obj, "messages") && !json_object_get(obj, "prompt") && json_object_get(obj, "text"))) {
        const char *f = o->field ? o->field : "text";
        const char *t = str_field(obj, f, &st);
        if (!t) return st;
        e->len = json_string_length(json_object_get(obj, f));
        e->text = dup_bytes(t, e->len);
        e->all = e->eos_target = e->plain = true;
        return e->text ? KILN_OK : kiln_error(KILN_ERR_OOM, "out of memory");
    }
    if (json_object_get(obj, "messages")) {
        if (!o->chat)
            return kiln_error(KILN_ERR_INVALID, "a \"messages\" line needs a chat template (--config tokenizer_config.json or --chat-template FILE)");
        e->eos_target = all;
        if (all) {
            e->all = true;
            return kiln_chat_render(o->chat, obj, false, &e->text, &e->len);
        }
        return kiln_chat_assistant_spans(o->chat, obj, o->train_on == KILN_TRAIN_COMPLETION, &e->text, &e->len, &e->spans,
                                         &e->n_spans);
    }
    if (json_object_get(obj, "prompt") || json_object_get(obj, "completion")) {
        const char *p = str_field(obj, "prompt", &st), *c = p ? str_field(obj, "completion", &st) : NULL;
        if (!p || !c) return st;
        size_t pn = json_string_length(json_object_get(obj, "prompt")), cn = json_string_length(json_object_get(obj, "completion"));
        e->text = malloc(pn + cn + 1);
        if (!e->text) return kiln_error(KILN_ERR_OOM, "out of memory");
        memcpy(e->text, p, pn);
        memcpy(e->text + pn, c, cn);
        e->text[pn + cn] = 0;
        e->len = pn + cn;
        e->eos_target = true;
        e->all = all;
        return all ? KILN_OK : one_span(e, pn, pn + cn);
    }
    return kiln_error(KILN_ERR_INVALID, "expected a \"text\", \"prompt\" and \"completion\", or \"messages\" field (or choose one with --field NAME)");
}

/* Encodes the example and marks each token whose bytes overlap a trained
 * range. The tokens must spell the text byte for byte (byte-level BPE). */
static kiln_status encode(const kiln_tokenizer *tok, const kiln_tokenize_opts *o, example *e) {
    bool special = e->plain && !o->no_special;
    kiln_status st = kiln_tokenizer_encode_ex(tok, e->text, e->len, special ? KILN_ENCODE_SPECIAL : 0, &e->ids, &e->n_ids);
    /* the eos after the example is added with it: not twice */
    if (!st && special && e->n_ids && e->ids[e->n_ids - 1] == kiln_tokenizer_eos(tok)) e->n_ids--;
    if (st || e->all) return st;
    e->mask = malloc(e->n_ids ? e->n_ids : 1);
    if (!e->mask) return kiln_error(KILN_ERR_OOM, "out of memory");
    size_t pos = 0, k = 0;
    for (size_t i = 0; i < e->n_ids; i++) {
        size_t tl;
        const char *tb = kiln_tokenizer_token(tok, e->ids[i], &tl);
        if (!tb || tl == 0 || pos + tl > e->len || memcmp(e->text + pos, tb, tl))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "token %zu (id %d) does not spell bytes %zu.. of the rendered text: loss masks need a tokenizer whose tokens are the text's bytes (byte-level BPE)",
                              i, (int)e->ids[i], pos);
        while (k < e->n_spans && e->spans[2 * k + 1] <= pos) k++;
        e->mask[i] = k < e->n_spans && e->spans[2 * k] < pos + tl;
        pos += tl;
    }
    if (pos != e->len)
        return kiln_error(KILN_ERR_UNSUPPORTED, "the tokens spell %zu of the %zu bytes of the rendered text", pos, e->len);
    return KILN_OK;
}

#define BATCH 512

static kiln_status flush(kd_tk_ctx *c, const char *path, example *b, int n, kiln_tokenize_stats *stats) {
    const kiln_tokenizer *tok = c->tok;
#pragma omp parallel for schedule(dynamic, 8)
    for (int i = 0; i < n; i++) {
        if (b[i].st) continue;
        b[i].st = b[i].is_pair ? kd_pair_encode(tok, &b[i].pair) : encode(tok, c->opts, &b[i]);
        if (b[i].st) snprintf(b[i].err, sizeof b[i].err, "%s", kiln_last_error());
    }
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && !st; i++) {
        if (b[i].st) {
            if (!c->opts->skip_bad)
                st = kiln_error(b[i].st, "%s:%zu: %s", path, b[i].line, b[i].err);
            else if (stats->bad_lines++ < 5)
                kiln_log(KILN_LOG_WARN, "tokenize: skipping %s:%zu: %s", path, b[i].line, b[i].err);
            continue;
        }
        if (!b[i].is_pair) {
            st = kd_tokenize_add(c, b[i].text, b[i].len, b[i].ids, b[i].mask, b[i].n_ids, b[i].eos_target);
            continue;
        }
        bool skipped = false;
        st = kd_pair_add(c, &b[i].pair, stats, &skipped);
        if (skipped && stats->pairs_skipped <= 5) {
            int64_t mp = c->opts->max_prompt_len, pl = (int64_t)b[i].pair.n[0];
            kiln_log(KILN_LOG_INFO, "tokenize: skipping the pair at %s:%zu: its prompt (%lld tokens%s) leaves no room under --max-len %lld",
                     path, b[i].line, (long long)(mp && pl > mp ? mp : pl), mp && pl > mp ? " after --max-prompt-len" : "",
                     (long long)c->opts->max_len);
        }
    }
    for (int i = 0; i < n; i++) ex_free(&b[i]);
    return st;
}

kiln_status kd_tokenize_jsonl(kd_tk_ctx *c, const char *path, kiln_tokenize_stats *stats) {
    char *data;
    size_t n;
    kiln_status st = kiln_read_file(path, &data, &n);
    if (st) return kiln_error_context(st, "reading %s", path);
    example *b = calloc(BATCH, sizeof *b);
    if (!b) return free(data), kiln_error(KILN_ERR_OOM, "out of memory");
    double t0 = kiln_time_now();
    uint64_t bad0 = stats->bad_lines, lines = 0;
    int nb = 0;
    size_t line = 0, i = 0;
    while (!st && i < n) {
        const char *nl = memchr(data + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - data) : n, s = i;
        i = e + 1;
        line++;
        bool blank = true;
        for (size_t k = s; k < e && blank; k++) blank = data[k] == ' ' || data[k] == '\t' || data[k] == '\r';
        if (blank) continue;
        lines++;
        example *x = &b[nb++];
        x->line = line;
        json_error_t je;
        json_t *obj = json_loadb(data + s, e - s, JSON_ALLOW_NUL, &je);
        /* the first example decides whether the corpus is preference pairs */
        x->is_pair = !c->opts->field && kd_pair_line(obj);
        if (obj && json_is_object(obj) && (st = kd_tokenize_kind(c, x->is_pair, path, line))) {
            json_decref(obj);
            break;
        }
        if (x->is_pair && c->opts->train_on == KILN_TRAIN_ALL) {
            st = kiln_error(KILN_ERR_INVALID, "%s:%zu: --train-on all does not apply to preference pairs (their answers are the targets, the prompt never)",
                            path, line);
            json_decref(obj);
            break;
        }
        if (!obj) {
            x->st = KILN_ERR_FORMAT;
            snprintf(x->err, sizeof x->err, "invalid JSON at column %d: %s", je.column, je.text);
        } else if ((x->st = x->is_pair ? kd_pair_build(c->opts, obj, &x->pair) : build(c->opts, obj, x))) {
            snprintf(x->err, sizeof x->err, "%s", kiln_last_error());
        }
        json_decref(obj);
        if (nb == BATCH) {
            st = flush(c, path, b, nb, stats);
            nb = 0;
        }
    }
    if (!st) st = flush(c, path, b, nb, stats);
    else
        for (int k = 0; k < nb; k++) ex_free(&b[k]);
    if (!st && stats->bad_lines > bad0)
        kiln_log(KILN_LOG_WARN, "tokenize: %s: skipped %llu bad lines of %llu", path,
                 (unsigned long long)(stats->bad_lines - bad0), (unsigned long long)lines);
    if (!st)
        kiln_log(KILN_LOG_INFO, "tokenize: %s: %llu examples in %.2f s", path,
                 (unsigned long long)(lines - (stats->bad_lines - bad0)), kiln_time_now() - t0);
    stats->bytes += n;
    free(b);
    free(data);
    return st;
}
