/* What a model directory says about its special tokens and chat format,
 * beyond the weights: generation_config.json (bos/eos/pad ids; eos may be a
 * list, as instruct models end a turn with one of several tokens),
 * config.json's ids as the fallback, and tokenizer_config.json (the token
 * strings, resolved to ids through its added_tokens_decoder or the
 * tokenizer, and the chat template, kept as text for the chat layer). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "kiln/model_meta.h"

#define PATH_CAP 4096

static bool exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

/* NULL when absent; a JSON object or an error naming the file. */
static kiln_status load_obj(const char *dir, const char *name, json_t **out, char *path) {
    *out = NULL;
    if (snprintf(path, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    if (!exists(path)) return KILN_OK;
    json_error_t je;
    /* numbers as doubles: Llama 3's tokenizer_config.json writes
     * model_max_length as the integer 1000000000000000019884624838656,
     * which jansson refuses as too big; ids are checked as integral below */
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    if (!o) return kiln_error(KILN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    if (!json_is_object(o)) {
        json_decref(o);
        return kiln_error(KILN_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    *out = o;
    return KILN_OK;
}

static kiln_status id_value(const char *path, const char *key, json_t *v, int32_t *out) {
    double x = json_number_value(v);
    if (!json_is_number(v) || !(x >= 0) || x > INT32_MAX || x != floor(x)) {
        if (json_is_number(v))
            return kiln_error(KILN_ERR_FORMAT, "%s: %s must be a token id (an integer >= 0), got %.17g", path, key, x);
        return kiln_error(KILN_ERR_FORMAT, "%s: %s must be a token id (an integer >= 0), got another type", path, key);
    }
    *out = (int32_t)x;
    return KILN_OK;
}

/* bos/eos/pad ids of one file into m where m has none yet. */
static kiln_status read_ids(const char *path, json_t *o, kiln_model_meta *m) {
    kiln_status st = KILN_OK;
    json_t *v;
    if (m->bos_id < 0 && (v = json_object_get(o, "bos_token_id")) && !json_is_null(v))
        st = id_value(path, "bos_token_id", v, &m->bos_id);
    if (!st && m->pad_id < 0 && (v = json_object_get(o, "pad_token_id")) && !json_is_null(v))
        st = id_value(path, "pad_token_id", v, &m->pad_id);
    if (!st && m->n_eos == 0 && (v = json_object_get(o, "eos_token_id")) && !json_is_null(v)) {
        if (json_is_array(v)) {
            size_t n = json_array_size(v);
            if (n == 0) /* no stop token at all: refused, not read as "none given" */
                return kiln_error(KILN_ERR_FORMAT, "%s: eos_token_id is an empty list (give an id, a list of ids, or null)",
                                  path);
            if (n > KILN_MAX_EOS)
                return kiln_error(KILN_ERR_UNSUPPORTED, "%s: eos_token_id lists %zu ids (kiln keeps at most %d)", path,
                                  n, KILN_MAX_EOS);
            for (size_t i = 0; i < n && !st; i++) st = id_value(path, "eos_token_id[]", json_array_get(v, i), &m->eos_ids[i]);
            if (!st) m->n_eos = (int)n;
        } else {
            st = id_value(path, "eos_token_id", v, &m->eos_ids[0]);
            if (!st) m->n_eos = 1;
        }
    }
    return st;
}

/* A token in tokenizer_config.json: a string, null, or an AddedToken object
 * {"content": ...}. */
static kiln_status token_string(const char *path, json_t *o, const char *key, char **out) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return KILN_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return kiln_error(KILN_ERR_FORMAT, "%s: %s must be a string or an object with \"content\"", path, key);
    if (!(*out = strdup(json_string_value(v)))) return kiln_error(KILN_ERR_OOM, "out of memory reading %s", path);
    return KILN_OK;
}

/* The id of a token string: added_tokens_decoder first, then the tokenizer's
 * vocabulary; -1 when neither has it. */
static int32_t token_id(json_t *decoder, const kiln_tokenizer *tok, const char *s) {
    const char *key;
    json_t *v;
    json_object_foreach(decoder, key, v) {
        const char *c = json_string_value(json_object_get(v, "content"));
        int64_t id = 0;
        if (c && !strcmp(c, s) && !kiln_parse_i64(key, 0, INT32_MAX, &id)) return (int32_t)id;
    }
    size_t len = strlen(s);
    for (int id = 0; tok && id < kiln_tokenizer_vocab_size(tok); id++) {
        size_t n = 0;
        const char *t = kiln_tokenizer_token(tok, id, &n);
        if (t && n == len && !memcmp(t, s, n)) return id;
    }
    return -1;
}

static kiln_status read_tokenizer_config(const char *path, json_t *o, const kiln_tokenizer *tok, kiln_model_meta *m) {
    kiln_status st = token_string(path, o, "bos_token", &m->bos_token);
    if (!st) st = token_string(path, o, "eos_token", &m->eos_token);
    if (!st) st = token_string(path, o, "pad_token", &m->pad_token);
    if (st) return st;
    json_t *ct = json_object_get(o, "chat_template");
    if (ct && json_is_array(ct)) { /* older files: named templates; "default" is the chat one */
        json_t *e, *pick = NULL;
        size_t i;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && !strcmp(name, "default")) pick = e;
        }
        if (!pick) return kiln_error(KILN_ERR_UNSUPPORTED, "%s: chat_template is a list without a \"default\" entry", path);
        ct = json_object_get(pick, "template");
    }
    if (ct && !json_is_null(ct)) {
        if (!json_is_string(ct)) return kiln_error(KILN_ERR_FORMAT, "%s: chat_template must be a string", path);
        if (!(m->chat_template = strdup(json_string_value(ct))))
            return kiln_error(KILN_ERR_OOM, "out of memory reading %s", path);
    }
    json_t *dec = json_object_get(o, "added_tokens_decoder");
    struct { const char *s; int32_t *id; const char *key; } want[] = {
        {m->bos_token, &m->bos_id, "bos_token"}, {m->pad_token, &m->pad_id, "pad_token"}};
    for (int i = 0; i < 2; i++)
        if (want[i].s && *want[i].id < 0) *want[i].id = token_id(dec, tok, want[i].s);
    if (m->eos_token && m->n_eos == 0) {
        int32_t id = token_id(dec, tok, m->eos_token);
        if (id < 0)
            return kiln_error(KILN_ERR_FORMAT, "%s: eos_token \"%.60s\" is not a token of the tokenizer", path, m->eos_token);
        m->eos_ids[m->n_eos++] = id;
    }
    return KILN_OK;
}

kiln_status kiln_model_meta_load(const char *dir, const kiln_tokenizer *tok, kiln_model_meta *out) {
    if (!dir || !out) return kiln_error(KILN_ERR_INVALID, "kiln_model_meta_load: NULL argument");
    kiln_model_meta m = {.bos_id = -1, .pad_id = -1};
    static const char *const files[] = {"generation_config.json", "config.json", "tokenizer_config.json"};
    kiln_status st = KILN_OK;
    char path[PATH_CAP];
    for (int i = 0; i < 3 && !st; i++) {
        json_t *o = NULL;
        if ((st = load_obj(dir, files[i], &o, path)) || !o) continue;
        st = i < 2 ? read_ids(path, o, &m) : read_tokenizer_config(path, o, tok, &m);
        json_decref(o);
    }
    /* chat_template.jinja beside them wins over tokenizer_config.json's
     * chat_template, as in transformers */
    if (!st && snprintf(path, PATH_CAP, "%s/chat_template.jinja", dir) < PATH_CAP && exists(path)) {
        char *text = NULL;
        size_t n = 0;
        if (!(st = kiln_read_file(path, &text, &n))) {
            if (memchr(text, 0, n)) st = kiln_error(KILN_ERR_FORMAT, "%s: a NUL byte in a chat template", path);
            else free(m.chat_template), m.chat_template = text, text = NULL;
        }
        free(text);
    }
    /* every eos id must be a token the tokenizer has */
    for (int i = 0; !st && tok && i < m.n_eos; i++)
        if (m.eos_ids[i] >= kiln_tokenizer_vocab_size(tok))
            st = kiln_error(KILN_ERR_FORMAT, "%s: eos id %d is outside the tokenizer's %d ids", dir, (int)m.eos_ids[i],
                            kiln_tokenizer_vocab_size(tok));
    if (st) {
        kiln_model_meta_free(&m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

void kiln_model_meta_free(kiln_model_meta *m) {
    if (!m) return;
    free(m->bos_token);
    free(m->eos_token);
    free(m->pad_token);
    free(m->chat_template);
    m->bos_token = m->eos_token = m->pad_token = m->chat_template = NULL;
}

bool kiln_model_meta_is_eos(const kiln_model_meta *m, int32_t id) {
    for (int i = 0; m && i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return true;
    return false;
}

static kiln_status write_json(const char *dir, const char *name, json_t *o) {
    char path[PATH_CAP];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s/%s", dir, name);
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    if (!text) return kiln_error(KILN_ERR_OOM, "out of memory writing %s", path);
    kiln_status st = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}

static json_t *id_or_null(int32_t id) { return id >= 0 ? json_integer(id) : json_null(); }

kiln_status kiln_model_meta_save(const char *dir, const kiln_model_meta *m) {
    if (!dir || !m) return kiln_error(KILN_ERR_INVALID, "kiln_model_meta_save: NULL argument");
    json_t *g = json_object(), *t = json_object(), *eos;
    if (m->n_eos == 1) eos = json_integer(m->eos_ids[0]);
    else if (m->n_eos == 0) eos = json_null();
    else {
        eos = json_array();
        for (int i = 0; i < m->n_eos; i++) json_array_append_new(eos, json_integer(m->eos_ids[i]));
    }
    json_object_set_new(g, "bos_token_id", id_or_null(m->bos_id));
    json_object_set_new(g, "eos_token_id", eos);
    json_object_set_new(g, "pad_token_id", id_or_null(m->pad_id));
    const char *keys[] = {"bos_token", "eos_token", "pad_token", "chat_template"};
    const char *vals[] = {m->bos_token, m->eos_token, m->pad_token, m->chat_template};
    for (int i = 0; i < 4; i++)
        if (vals[i]) json_object_set_new(t, keys[i], json_string(vals[i]));
    json_object_set_new(t, "tokenizer_class", json_string("PreTrainedTokenizerFast")); /* tokenizer.json beside it */
    kiln_status st = write_json(dir, "generation_config.json", g);
    if (!st) st = write_json(dir, "tokenizer_config.json", t);
    json_decref(g);
    json_decref(t);
    return st;
}
