/* tokenizer.json (Hugging Face format) save and load, through jansson. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "data_impl.h"

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* The byte-level form of token `id` into buf (>= 3 * len + 1 bytes). */
static size_t mapped(const kiln_tokenizer *t, const uint32_t cp[256], int id, char *buf) {
    size_t n, o = 0;
    const char *s = kiln_tokenizer_token(t, id, &n);
    if (t->tok_special[id]) {
        memcpy(buf, s, n);
        o = n;
    } else {
        for (size_t i = 0; i < n; i++) o += put_utf8(buf + o, cp[(unsigned char)s[i]]);
    }
    buf[o] = 0;
    return o;
}

static json_t *pre_tok_obj(void) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", 1);
}

static json_t *build_json(const kiln_tokenizer *t) {
    uint32_t cp[256];
    kd_byte_to_unicode(cp);
    size_t maxlen = 0;
    for (int i = 0; i < t->vocab_size; i++) maxlen = t->tok_len[i] > maxlen ? t->tok_len[i] : maxlen;
    char *buf = malloc(6 * maxlen + 8), *buf2 = malloc(6 * maxlen + 8);
    json_t *root = json_object(), *vocab = json_object(), *merges = json_array(),
           *added = json_array();
    bool ok = buf && buf2 && root && vocab && merges && added;
    for (int i = 0; ok && i < t->vocab_size; i++) {
        if (t->tok_off[i] == UINT64_MAX) continue;
        size_t n = mapped(t, cp, i, buf);
        ok = !json_object_setn_new(vocab, buf, n, json_integer(i));
        if (ok && t->tok_special[i])
            ok = !json_array_append_new(
                added, json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", buf, n,
                                 "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
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
        json_t *model = json_pack(
            "{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:O, s:O}", "type", "BPE", "dropout",
            "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
            "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
        ok = model && !json_object_set_new(root, "version", json_string("1.0")) &&
             !json_object_set_new(root, "truncation", json_null()) &&
             !json_object_set_new(root, "padding", json_null()) &&
             !json_object_set(root, "added_tokens", added) &&
             !json_object_set_new(root, "normalizer", json_null()) &&
             !json_object_set_new(root, "pre_tokenizer", pre_tok_obj()) &&
             !json_object_set_new(root, "post_processor", json_null()) &&
             !json_object_set_new(root, "decoder", pre_tok_obj()) &&
             !json_object_set_new(root, "model", model);
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
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < n) {
            cp = (uint32_t)(c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return false;
        }
        if (cp >= 512 || inv[cp] < 0) return false;
        out[o++] = (char)inv[cp];
    }
    *on = o;
    return true;
}

typedef struct {
    const char *path;
    json_t *vocab, *merges, *added;
    kd_strmap by_name; /* JSON token string -> id */
    kiln_tokenizer *t;
} loader_ctx;

static kiln_status fail(loader_ctx *c, kiln_status code, const char *what) {
    return kiln_error(code, "%s: %s", c->path, what);
}

static kiln_status find_parts(loader_ctx *c, json_t *root) {
    if (!json_is_object(root)) return fail(c, KILN_ERR_FORMAT, "top level is not a JSON object");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return fail(c, KILN_ERR_FORMAT, "missing object \"model\"");
    json_t *type = json_object_get(model, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE")))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.type is \"%s\", only \"BPE\" is supported",
                          c->path, json_is_string(type) ? json_string_value(type) : "?");
    c->vocab = json_object_get(model, "vocab");
    c->merges = json_object_get(model, "merges");
    c->added = json_object_get(root, "added_tokens");
    if (!json_is_object(c->vocab)) return fail(c, KILN_ERR_FORMAT, "missing object model.vocab");
    if (!json_is_array(c->merges)) return fail(c, KILN_ERR_FORMAT, "missing array model.merges");
    if (c->added && !json_is_null(c->added) && !json_is_array(c->added))
        return fail(c, KILN_ERR_FORMAT, "added_tokens is not an array");
    return KILN_OK;
}

#define MAX_ID (1 << 24)

static kiln_status check_id(loader_ctx *c, json_t *v, const char *where, const char *name, int *id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s \"%s\": id is not an integer in [0, %d)", c->path,
                          where, name, MAX_ID);
    *id = (int)json_integer_value(v);
    return KILN_OK;
}

static kiln_status build_vocab(loader_ctx *c) {
    int max_id = -1, id = 0;
    const char *key;
    json_t *v;
    size_t i;
    kiln_status st;
    json_object_foreach(c->vocab, key, v) {
        if ((st = check_id(c, v, "model.vocab", key, &id))) return st;
        if (id > max_id) max_id = id;
    }
    json_array_foreach(c->added, i, v) {
        if ((st = check_id(c, json_object_get(v, "id"), "added_tokens", "", &id))) return st;
        if (!json_is_string(json_object_get(v, "content")))
            return kiln_error(KILN_ERR_FORMAT, "%s: added_tokens[%zu] has no string \"content\"", c->path, i);
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return fail(c, KILN_ERR_FORMAT, "model.vocab is empty");
    c->t = kd_tok_new(max_id + 1);
    if (!c->t || !kd_strmap_init(&c->by_name, (size_t)max_id + 1))
        return fail(c, KILN_ERR_OOM, "out of memory");
    json_array_foreach(c->added, i, v) {
        const char *s = json_string_value(json_object_get(v, "content"));
        id = (int)json_integer_value(json_object_get(v, "id"));
        size_t n = strlen(s);
        if (!kd_strmap_put(&c->by_name, s, n, kd_hash_bytes(s, n), (uint64_t)id, NULL))
            return fail(c, KILN_ERR_OOM, "out of memory");
        if ((st = kd_tok_set(c->t, id, s, n, true))) return kiln_error_context(st, "%s: added_tokens[%zu]", c->path, i);
        if (!strcmp(s, "<|bos|>") || !strcmp(s, "<|begin_of_text|>")) c->t->bos = id;
        if (!strcmp(s, "<|eos|>") || (c->t->eos < 0 && (!strcmp(s, "<|endoftext|>") || !strcmp(s, "<|end_of_text|>"))))
            c->t->eos = id;
        if (!strcmp(s, "<|pad|>")) c->t->pad = id;
    }
    int16_t inv[512];
    uint32_t cp[256];
    memset(inv, 0xff, sizeof inv);
    kd_byte_to_unicode(cp);
    for (int b = 0; b < 256; b++) inv[cp[b]] = (int16_t)b;
    json_object_foreach(c->vocab, key, v) {
        size_t n = strlen(key), bn;
        id = (int)json_integer_value(v);
        uint64_t h = kd_hash_bytes(key, n);
        bool ins;
        uint64_t *slot = kd_strmap_put(&c->by_name, key, n, h, (uint64_t)id, &ins);
        if (!slot) return fail(c, KILN_ERR_OOM, "out of memory");
        if (!ins) {
            if (*slot != (uint64_t)id)
                return kiln_error(KILN_ERR_FORMAT, "%s: token \"%s\" has ids %d and %d", c->path, key, (int)*slot, id);
            continue; /* a special also listed in the vocab */
        }
        char *bytes = malloc(n + 1);
        if (!bytes) return fail(c, KILN_ERR_OOM, "out of memory");
        if (!unmap(key, n, inv, bytes, &bn)) {
            free(bytes);
            return kiln_error(KILN_ERR_FORMAT, "%s: model.vocab token \"%s\" (id %d) is not in the byte-level alphabet",
                              c->path, key, id);
        }
        st = kd_tok_set(c->t, id, bytes, bn, false);
        free(bytes);
        if (st) return kiln_error_context(st, "%s: model.vocab \"%s\"", c->path, key);
    }
    return KILN_OK; /* bytes without a token fail at encode time, naming the byte */
}

static int lookup(loader_ctx *c, const char *s, size_t n) {
    uint64_t *v = kd_strmap_get(&c->by_name, s, n, kd_hash_bytes(s, n));
    return v ? (int)*v : -1;
}

static kiln_status build_merges(loader_ctx *c) {
    size_t i;
    json_t *m;
    char *cat = NULL;
    size_t cat_cap = 0;
    kiln_status st = KILN_OK;
    json_array_foreach(c->merges, i, m) {
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] \"%s\" is not two tokens separated by one space", c->path, i, a);
                break;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            an = strlen(a);
            bn = strlen(b);
        } else {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] is neither \"A B\" nor [\"A\", \"B\"]", c->path, i);
            break;
        }
        int ia = lookup(c, a, an), ib = lookup(c, b, bn);
        if (ia < 0 || ib < 0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] references unknown token \"%.*s\"", c->path, i,
                            (int)(ia < 0 ? an : bn), ia < 0 ? a : b);
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
        memcpy(cat + an, b, bn);
        int ic = lookup(c, cat, an + bn);
        if (ic < 0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu]: merged token \"%.*s\" is not in model.vocab", c->path,
                            i, (int)(an + bn), cat);
            break;
        }
        if ((st = kd_tok_add_merge(c->t, ia, ib, ic))) {
            kiln_error_context(st, "%s: model.merges[%zu]", c->path, i);
            break;
        }
    }
    free(cat);
    return st;
}

kiln_status kiln_tokenizer_load(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f) return kiln_error(KILN_ERR_IO, "cannot open tokenizer %s: %s", path, strerror(errno));
        fclose(f);
        return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", path, jerr.line,
                          jerr.column, jerr.text);
    }
    loader_ctx c = {.path = path};
    kiln_status st = find_parts(&c, root);
    if (!st) st = build_vocab(&c);
    if (!st) st = build_merges(&c);
    kd_strmap_free(&c.by_name);
    json_decref(root);
    if (st) {
        kiln_tokenizer_free(c.t);
        return st;
    }
    *out = c.t;
    return KILN_OK;
}
