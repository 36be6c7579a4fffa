/* tokenizer.json (Hugging Face format) load and save, through jansson.
 * Loading builds the whole pipeline; every field kiln does not implement
 * is an error naming the file and the field. Saving writes kiln's own
 * layout for trained tokenizers and copies the source of loaded ones. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer_impl.h"

static size_t put_cp(char *o, uint32_t cp) { return kd_utf8_put(o, cp); }

/* The tokenizer.json form of token `id` into buf (>= 2 * len + 1 bytes). */
static size_t mapped(const kiln_tokenizer *t, const uint32_t cp[256], int id, char *buf) {
    size_t n, o = 0;
    const char *s = kiln_tokenizer_token(t, id, &n);
    if ((t->tok_flags[id] & (KD_TOK_SPECIAL | KD_TOK_TEXT)) || !t->byte_level) {
        memcpy(buf, s, n);
        o = n;
    } else {
        for (size_t i = 0; i < n; i++) o += put_cp(buf + o, cp[(unsigned char)s[i]]);
    }
    buf[o] = 0;
    return o;
}

static json_t *pre_tok_obj(void) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                     "use_regex", 1);
}

static json_t *build_json(const kiln_tokenizer *t) {
    uint32_t cp[256];
    kd_byte_to_unicode(cp);
    size_t maxlen = 0;
    for (int i = 0; i < t->vocab_size; i++) maxlen = t->tok_len[i] > maxlen ? t->tok_len[i] : maxlen;
    char *buf = malloc(6 * maxlen + 8), *buf2 = malloc(6 * maxlen + 8);
    json_t *root = json_object(), *vocab = json_object(), *merges = json_array(), *added = json_array();
    bool ok = buf && buf2 && root && vocab && merges && added;
    for (int i = 0; ok && i < t->vocab_size; i++) {
        if (t->tok_off[i] == UINT64_MAX) continue;
        size_t n = mapped(t, cp, i, buf);
        ok = !json_object_setn_new(vocab, buf, n, json_integer(i));
        if (ok && (t->tok_flags[i] & KD_TOK_SPECIAL))
            ok = !json_array_append_new(added, json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", buf,
                                                         n, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                         "special", 1));
    }
    for (int r = 0; ok && r < t->n_merges; r++) {
        size_t a = mapped(t, cp, t->merges[r][0], buf);
        buf[a] = ' ';
        size_t b = mapped(t, cp, t->merges[r][1], buf2);
        memcpy(buf + a + 1, buf2, b + 1);
        ok = !json_array_append_new(merges, json_stringn(buf, a + 1 + b));
    }
    free(buf);
    free(buf2);
    if (ok) {
        json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:O, s:O}", "type", "BPE", "dropout",
                                  "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                                  "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
        ok = model && !json_object_set_new(root, "version", json_string("1.0")) &&
             !json_object_set_new(root, "truncation", json_null()) && !json_object_set_new(root, "padding", json_null()) &&
             !json_object_set(root, "added_tokens", added) && !json_object_set_new(root, "normalizer", json_null()) &&
             !json_object_set_new(root, "pre_tokenizer", pre_tok_obj()) &&
             !json_object_set_new(root, "post_processor", json_null()) &&
             !json_object_set_new(root, "decoder", pre_tok_obj()) && !json_object_set_new(root, "model", model);
    }
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

kiln_status kiln_tokenizer_save(const kiln_tokenizer *t, const char *path) {
    if (t->src_text) { /* parsed from memory: that text */
        kiln_status st = kiln_write_file_atomic(path, t->src_text, t->src_len);
        if (st) return kiln_error_context(st, "saving tokenizer %s", path);
        return KILN_OK;
    }
    if (t->src_path) { /* loaded: its own file is the faithful form */
        char *s;
        size_t n;
        kiln_status st = kiln_read_file(t->src_path, &s, &n);
        if (!st) st = kiln_write_file_atomic(path, s, n);
        if (!st) free(s);
        if (st) return kiln_error_context(st, "saving tokenizer %s (a copy of %s)", path, t->src_path);
        return KILN_OK;
    }
    json_t *root = build_json(t);
    if (!root) return kiln_error(KILN_ERR_OOM, "%s: out of memory building tokenizer.json", path);
    char *s = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    if (!s) return kiln_error(KILN_ERR_OOM, "%s: out of memory serialising tokenizer.json", path);
    kiln_status st = kiln_write_file_atomic(path, s, strlen(s));
    free(s);
    if (st) return kiln_error_context(st, "saving tokenizer %s", path);
    return KILN_OK;
}

/* ---- load ---- */

/* Decodes a byte-level token string into bytes; false if a character is not
 * in the GPT-2 byte mapping. */
static bool unmap(const char *s, size_t n, const int16_t inv[512], char *out, size_t *on) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += kd_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (cp >= 512 || inv[cp] < 0) return false;
        out[o++] = (char)inv[cp];
    }
    *on = o;
    return true;
}

#define MAX_ID (1 << 24)

typedef struct {
    const char *path;
    json_t *root, *model, *vocab, *merges, *added;
    kd_strmap by_name; /* tokenizer.json string -> id (model.vocab) */
    int16_t inv[512];
    kiln_tokenizer *t;
    kd_added_def *defs;
    size_t n_defs;
} loader_ctx;

static kiln_status fail(loader_ctx *c, kiln_status code, const char *what) {
    return kiln_error(code, "%s: %s", c->path, what);
}

static kiln_status find_parts(loader_ctx *c) {
    static const char *const top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                      "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    static const char *const model_keys[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                             "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                             "vocab", "merges", "kiln_merge_ranks", NULL};
    json_t *root = c->root;
    if (!json_is_object(root)) return fail(c, KILN_ERR_FORMAT, "top level is not a JSON object");
    kiln_status st = kd_json_keys(root, c->path, "top level", top);
    if (st) return st;
    json_t *v = json_object_get(root, "version");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "1.0")))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: version is not \"1.0\"", c->path);
    static const char *const nulls[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        json_t *x = json_object_get(root, nulls[i]);
        if (x && !json_is_null(x))
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %s is set; kiln does not implement %s (it must be null)", c->path,
                              nulls[i], nulls[i]);
    }
    c->model = json_object_get(root, "model");
    if (!json_is_object(c->model)) return fail(c, KILN_ERR_FORMAT, "missing object \"model\"");
    json_t *type = json_object_get(c->model, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE")))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.type is \"%s\", only \"BPE\" is supported", c->path,
                          json_is_string(type) ? json_string_value(type) : "?");
    if ((st = kd_json_keys(c->model, c->path, "model", model_keys))) return st;
    json_t *drop = json_object_get(c->model, "dropout");
    if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.dropout is set; kiln encodes deterministically (dropout must "
                          "be null or 0)", c->path);
    c->vocab = json_object_get(c->model, "vocab");
    c->merges = json_object_get(c->model, "merges");
    c->added = json_object_get(root, "added_tokens");
    if (!json_is_object(c->vocab)) return fail(c, KILN_ERR_FORMAT, "missing object model.vocab");
    if (!json_is_array(c->merges)) return fail(c, KILN_ERR_FORMAT, "missing array model.merges");
    if (c->added && !json_is_null(c->added) && !json_is_array(c->added))
        return fail(c, KILN_ERR_FORMAT, "added_tokens is not an array");
    return KILN_OK;
}

static kiln_status check_id(loader_ctx *c, json_t *v, const char *where, const char *name, int *id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s \"%s\": id is not an integer in [0, %d)", c->path, where, name, MAX_ID);
    *id = (int)json_integer_value(v);
    return KILN_OK;
}

static int by_name(loader_ctx *c, const char *s, size_t n) {
    uint64_t *v = kd_strmap_get(&c->by_name, s, n, kiln_hash_bytes(s, n));
    return v ? (int)*v : -1;
}

/* The model string of a tokenizer.json string: bytes for byte-level
 * vocabularies; false if it is outside the byte alphabet. */
static bool model_form(loader_ctx *c, const char *s, size_t n, char *out, size_t *on) {
    if (!c->t->byte_level) {
        memcpy(out, s, n);
        *on = n;
        return true;
    }
    return unmap(s, n, c->inv, out, on);
}

/* added_tokens: flags, and the ids HF assigns (vocabulary id by content,
 * else the next free one after the vocabulary); a file whose ids differ is
 * refused rather than encoded differently. */
static kiln_status read_added(loader_ctx *c, int *max_id) {
    size_t n = json_array_size(c->added), i;
    json_t *a;
    if (n && !(c->defs = calloc(n, sizeof *c->defs))) return fail(c, KILN_ERR_OOM, "out of memory");
    int next = (int)json_object_size(c->vocab);
    kd_strmap seen; /* content -> id of the added tokens so far */
    if (!kd_strmap_init(&seen, n + 1)) return fail(c, KILN_ERR_OOM, "out of memory");
    kiln_status st = KILN_OK;
    static const char *const keys[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special", NULL};
    json_array_foreach(c->added, i, a) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        st = json_is_object(a) ? kd_json_keys(a, c->path, where, keys)
                                           : kiln_error(KILN_ERR_FORMAT, "%s: %s is not an object", c->path, where);
        const char *content = "";
        size_t len = 0;
        if (!st) st = kd_json_str(a, "content", c->path, where, &content, &len);
        int id = 0;
        if (!st) st = check_id(c, json_object_get(a, "id"), "added_tokens", content, &id);
        kd_added_def d = {.id = id, .content = content, .len = len};
        if (!st) st = kd_json_bool(a, "special", false, c->path, where, &d.special);
        if (!st) st = kd_json_bool(a, "single_word", false, c->path, where, &d.single_word);
        if (!st) st = kd_json_bool(a, "lstrip", false, c->path, where, &d.lstrip);
        if (!st) st = kd_json_bool(a, "rstrip", false, c->path, where, &d.rstrip);
        if (!st) st = kd_json_bool(a, "normalized", !d.special, c->path, where, &d.normalized);
        if (st) break;
        if (len == 0) continue; /* HF ignores empty added tokens */
        uint64_t h = kiln_hash_bytes(content, len), *prev = kd_strmap_get(&seen, content, len, h);
        int hf = prev ? (int)*prev : by_name(c, content, len);
        if (hf < 0) hf = next++;
        if (hf != id) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: %s \"%s\" has id %d, but the Hugging Face library gives it id %d "
                            "(its vocabulary id, or the next id after the vocabulary)", c->path, where, content, id, hf);
            break;
        }
        if (!prev && !kd_strmap_put(&seen, content, len, h, (uint64_t)id, NULL)) {
            st = fail(c, KILN_ERR_OOM, "out of memory");
            break;
        }
        if (id > *max_id) *max_id = id;
        c->defs[c->n_defs++] = d;
    }
    kd_strmap_free(&seen);
    return st;
}

static kiln_status build_vocab(loader_ctx *c) {
    int max_id = -1, id = 0;
    const char *key;
    json_t *v;
    kiln_status st;
    if (!kd_strmap_init(&c->by_name, json_object_size(c->vocab) + 1)) return fail(c, KILN_ERR_OOM, "out of memory");
    json_object_foreach(c->vocab, key, v) {
        if ((st = check_id(c, v, "model.vocab", key, &id))) return st;
        if (id > max_id) max_id = id;
        size_t n = strlen(key);
        if (!kd_strmap_put(&c->by_name, key, n, kiln_hash_bytes(key, n), (uint64_t)id, NULL))
            return fail(c, KILN_ERR_OOM, "out of memory");
    }
    if ((st = read_added(c, &max_id))) return st;
    if (max_id < 0) return fail(c, KILN_ERR_FORMAT, "model.vocab is empty");
    int byte_level = kd_pretok_byte_level(c->t->pretok, c->path);
    if (byte_level < 0) return kiln_last_status();
    /* the pipeline parts move into the sized tokenizer */
    kiln_tokenizer *sized = kd_tok_new(max_id + 1);
    if (!sized) return fail(c, KILN_ERR_OOM, "out of memory");
    sized->pretok = c->t->pretok;
    c->t->pretok = NULL;
    kiln_tokenizer_free(c->t);
    c->t = sized;
    c->t->byte_level = byte_level == 1;
    uint32_t cp[256];
    memset(c->inv, 0xff, sizeof c->inv);
    kd_byte_to_unicode(cp);
    for (int b = 0; b < 256; b++) c->inv[cp[b]] = (int16_t)b;
    char *bytes = NULL;
    size_t cap = 0;
    json_object_foreach(c->vocab, key, v) {
        size_t n = strlen(key), bn;
        id = (int)json_integer_value(v);
        if (n + 1 > cap) {
            cap = 2 * n + 16;
            char *p = realloc(bytes, cap);
            if (!p) {
                free(bytes);
                return fail(c, KILN_ERR_OOM, "out of memory");
            }
            bytes = p;
        }
        unsigned flags = KD_TOK_MODEL;
        if (!model_form(c, key, n, bytes, &bn)) { /* outside the byte alphabet: kept as text */
            memcpy(bytes, key, n);
            bn = n;
            flags |= KD_TOK_TEXT;
        }
        if (!c->t->byte_level) flags |= KD_TOK_TEXT;
        st = kd_tok_set(c->t, id, bytes, bn, flags);
        if (st) {
            free(bytes);
            return kiln_error_context(st, "%s: model.vocab \"%s\"", c->path, key);
        }
    }
    free(bytes);
    for (size_t i = 0; i < c->n_defs; i++) {
        const kd_added_def *d = &c->defs[i];
        unsigned f = KD_TOK_ADDED | (d->special ? KD_TOK_SPECIAL : 0);
        if (c->t->tok_off[d->id] != UINT64_MAX) {
            c->t->tok_flags[d->id] |= (uint8_t)f;
        } else if ((st = kd_tok_set(c->t, d->id, d->content, d->len, f | KD_TOK_TEXT))) {
            return kiln_error_context(st, "%s: added_tokens \"%s\"", c->path, d->content);
        }
    }
    return KILN_OK;
}

static kiln_status model_options(loader_ctx *c) {
    kiln_tokenizer *t = c->t;
    json_t *m = c->model;
    kiln_status st = kd_json_bool(m, "ignore_merges", false, c->path, "model", &t->ignore_merges);
    if (!st) st = kd_json_bool(m, "byte_fallback", false, c->path, "model", &t->byte_fallback);
    if (!st) st = kd_json_bool(m, "fuse_unk", false, c->path, "model", &t->fuse_unk);
    if (st) return st;
    json_t *unk = json_object_get(m, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return fail(c, KILN_ERR_FORMAT, "model.unk_token is not a string");
        t->unk_id = by_name(c, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return kiln_error(KILN_ERR_FORMAT, "%s: model.unk_token \"%s\" is not in model.vocab", c->path,
                              json_string_value(unk));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_id[b] = kd_tok_vocab_get(t, name, 6);
    }
    static const char *const fix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(m, fix[k]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) return kiln_error(KILN_ERR_FORMAT, "%s: model.%s is not a string", c->path, fix[k]);
        size_t n = json_string_length(v), bn;
        char *buf = malloc(n + 1);
        if (!buf) return fail(c, KILN_ERR_OOM, "out of memory");
        if (!model_form(c, json_string_value(v), n, buf, &bn)) {
            free(buf);
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.%s \"%s\" is outside the byte-level alphabet", c->path,
                              fix[k], json_string_value(v));
        }
        if (k == 0) t->prefix = buf, t->prefix_len = bn, t->has_prefix = bn > 0;
        else t->suffix = buf, t->suffix_len = bn, t->has_suffix = bn > 0;
    }
    return KILN_OK;
}

/* model.kiln_merge_ranks (kiln's, which Hugging Face ignores): one rank
 * per merge, shared ranks allowed; the leftmost pair of the lowest rank
 * merges first, as llama.cpp's SentencePiece tokenizer ranks by score. */
static kiln_status merge_ranks(loader_ctx *c, json_t **out) {
    json_t *r = json_object_get(c->model, "kiln_merge_ranks");
    *out = NULL;
    if (!r || json_is_null(r)) return KILN_OK;
    if (!json_is_array(r) || json_array_size(r) != json_array_size(c->merges))
        return kiln_error(KILN_ERR_FORMAT, "%s: model.kiln_merge_ranks is not an array of one rank per merge (%zu)", c->path,
                          json_array_size(c->merges));
    size_t i;
    json_t *v;
    json_array_foreach(r, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 28))
            return kiln_error(KILN_ERR_FORMAT, "%s: model.kiln_merge_ranks[%zu] is not an integer in [0, 2^28)", c->path, i);
    }
    *out = r;
    return KILN_OK;
}

static kiln_status build_merges(loader_ctx *c) {
    size_t i;
    json_t *m, *ranks;
    char *cat = NULL;
    size_t cat_cap = 0;
    kiln_status st = merge_ranks(c, &ranks);
    if (st) return st;
    json_t *pre = json_object_get(c->model, "continuing_subword_prefix");
    size_t plen = json_is_string(pre) ? json_string_length(pre) : 0;
    const char *pstr = plen ? json_string_value(pre) : "";
    json_array_foreach(c->merges, i, m) {
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            a = json_string_value(m);
            if (!strncmp(a, "#version", 8)) continue; /* as HF skips it */
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] \"%s\" is not two tokens separated by one space",
                                c->path, i, a);
                break;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            an = json_string_length(json_array_get(m, 0));
            bn = json_string_length(json_array_get(m, 1));
        } else {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] is neither \"A B\" nor [\"A\", \"B\"]", c->path, i);
            break;
        }
        int ia = by_name(c, a, an), ib = by_name(c, b, bn);
        if (ia < 0 || ib < 0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] references unknown token \"%.*s\"", c->path, i,
                            (int)(ia < 0 ? an : bn), ia < 0 ? a : b);
            break;
        }
        if (plen && (bn < plen || memcmp(b, pstr, plen))) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu]: \"%.*s\" does not start with the "
                            "continuing_subword_prefix", c->path, i, (int)bn, b);
            break;
        }
        if (an + bn > cat_cap) {
            cat_cap = 2 * (an + bn);
            char *p = realloc(cat, cat_cap);
            if (!p) {
                st = fail(c, KILN_ERR_OOM, "out of memory");
                break;
            }
            cat = p;
        }
        memcpy(cat, a, an);
        memcpy(cat + an, b + plen, bn - plen);
        int ic = by_name(c, cat, an + bn - plen);
        if (ic < 0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu]: merged token \"%.*s\" is not in model.vocab", c->path,
                            i, (int)(an + bn - plen), cat);
            break;
        }
        st = ranks ? kd_tok_add_merge_rank(c->t, ia, ib, ic, (uint32_t)json_integer_value(json_array_get(ranks, i)))
                   : kd_tok_add_merge(c->t, ia, ib, ic);
        if (st) {
            kiln_error_context(st, "%s: model.merges[%zu]", c->path, i);
            break;
        }
    }
    free(cat);
    return st;
}

static kiln_status build_pipeline(loader_ctx *c) {
    kiln_tokenizer *t = c->t;
    kiln_status st = kd_norm_parse(json_object_get(c->root, "normalizer"), c->path, "normalizer", &t->norm);
    if (!st) st = kd_post_parse(json_object_get(c->root, "post_processor"), c->path, "post_processor", t->vocab_size, &t->post);
    if (!st) st = kd_dec_parse(json_object_get(c->root, "decoder"), c->path, "decoder", &t->dec);
    if (!st) st = kd_tok_finish(t, c->defs, c->n_defs);
    return st;
}

static kiln_status parse(const char *text, size_t len, const char *source, kiln_tokenizer **out) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", source, jerr.line, jerr.column,
                          jerr.text);
    loader_ctx c = {.path = source, .root = root};
    kiln_status st = find_parts(&c);
    /* the pre-tokenizer decides how the vocabulary is stored: parse it first
     * into a placeholder tokenizer */
    if (!st && !(c.t = kd_tok_new(1))) st = fail(&c, KILN_ERR_OOM, "out of memory");
    if (!st) st = kd_pretok_parse(json_object_get(root, "pre_tokenizer"), source, "pre_tokenizer", &c.t->pretok);
    if (!st) st = build_vocab(&c);
    if (!st) st = model_options(&c);
    if (!st) st = build_merges(&c);
    if (!st) st = build_pipeline(&c);
    kd_strmap_free(&c.by_name);
    free(c.defs);
    json_decref(root);
    if (st) {
        kiln_tokenizer_free(c.t);
        return st;
    }
    *out = c.t;
    return KILN_OK;
}

kiln_status kiln_tokenizer_load(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    char *text;
    size_t len;
    kiln_status st = kiln_read_file(path, &text, &len); /* one read: jansson's file reader goes byte by byte */
    if (st) return kiln_error_context(st, "cannot open tokenizer %s", path);
    st = parse(text, len, path, out);
    free(text);
    if (!st && !((*out)->src_path = strdup(path))) {
        kiln_tokenizer_free(*out);
        *out = NULL;
        st = kiln_error(KILN_ERR_OOM, "%s: out of memory", path);
    }
    return st;
}

kiln_status kiln_tokenizer_parse(const char *json, size_t len, const char *source, kiln_tokenizer **out) {
    *out = NULL;
    if (!json || !source) return kiln_error(KILN_ERR_INVALID, "kiln_tokenizer_parse: NULL argument");
    kiln_status st = parse(json, len, source, out);
    if (st) return st;
    if (!((*out)->src_text = malloc(len + 1))) {
        kiln_tokenizer_free(*out);
        *out = NULL;
        return kiln_error(KILN_ERR_OOM, "%s: out of memory", source);
    }
    memcpy((*out)->src_text, json, len);
    (*out)->src_text[len] = 0;
    (*out)->src_len = len;
    return KILN_OK;
}
