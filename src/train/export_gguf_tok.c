/* tokenizer.json as llama.cpp's byte-level BPE vocabulary (tokenizer.ggml.*
 * with model "gpt2"). llama.cpp does not run a tokenizer.json: it splits
 * text with one of the pre-tokenizer regexes it implements, chosen by the
 * name in tokenizer.ggml.pre, and applies no normalizer. So the file's
 * pre-tokenizer is matched on its exact regex text and options to one of
 * those names, and anything else is refused: it would tokenize differently
 * there. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "export_gguf_impl.h"
#include "kiln/model_meta.h"
#include "kiln/template.h"

void kiln_gguf_vocab_free(kiln_gguf_vocab *v) {
    for (int64_t i = 0; v->tokens && i < v->n; i++) free(v->tokens[i]);
    for (size_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens), free(v->lens), free(v->types), free(v->merges);
    memset(v, 0, sizeof *v);
}

/* ---- the pre-tokenizer ------------------------------------------------- */

/* The regexes as Hugging Face writes them (ByteLevel's built-in one, and
 * the Split patterns of Llama 3's and Qwen2's tokenizer.json), with the
 * name llama.cpp's llama-vocab.cpp gives its implementation of each and
 * what that implementation assumes: llama-bpe looks every pre-token up as
 * a whole token before merging (ignore_merges); Qwen's files carry an NFC
 * normalizer that llama.cpp does not apply (its converter writes them the
 * same way; text already in NFC tokenizes alike). */
static const struct {
    const char *name, *regex, *whose;
    bool ignore_merges, nfc;
} known_pre[] = {
    {"gpt-2", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", "GPT-2", false, false},
    {"llama-bpe",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     "Llama 3", true, false},
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     "Qwen2", false, true},
};
#define N_KNOWN_PRE (sizeof known_pre / sizeof known_pre[0])

static bool is_true(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }
static bool is_false_or_absent(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return !v || json_is_false(v);
}

/* The regex a byte-level pre-tokenizer splits with: ByteLevel alone (its
 * built-in GPT-2 regex), or Sequence [Split(Regex, Isolated), ByteLevel
 * without its regex], the form Llama 3 and Qwen write. */
static kiln_status pre_regex(const char *path, json_t *pt, const char **regex) {
    const char *type = json_is_object(pt) ? json_string_value(json_object_get(pt, "type")) : NULL;
    if (type && !strcmp(type, "ByteLevel")) {
        if (is_true(pt, "add_prefix_space") || !(is_true(pt, "use_regex") || !json_object_get(pt, "use_regex")))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer ByteLevel with add_prefix_space true or use_regex false has no llama.cpp "
                              "pre-tokenizer",
                              path);
        *regex = known_pre[0].regex;
        return KILN_OK;
    }
    json_t *kids = type && !strcmp(type, "Sequence") ? json_object_get(pt, "pretokenizers") : NULL;
    json_t *split = json_array_get(kids, 0), *bl = json_array_get(kids, 1);
    const char *t0 = json_string_value(json_object_get(split, "type")), *t1 = json_string_value(json_object_get(bl, "type"));
    if (!kids || json_array_size(kids) != 2 || !t0 || strcmp(t0, "Split") || !t1 || strcmp(t1, "ByteLevel"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer %s: kiln export maps only ByteLevel, or Sequence [Split, ByteLevel], to a "
                          "llama.cpp pre-tokenizer (gpt-2, llama-bpe, qwen2)",
                          path, type ? type : "(none)");
    const char *re = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (!re)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: pre_tokenizer.pretokenizers[0].pattern is not a Regex: no llama.cpp pre-tokenizer",
                          path);
    if (!behavior || strcmp(behavior, "Isolated") || !is_false_or_absent(split, "invert"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer Split with behavior %s%s: llama.cpp's pre-tokenizers keep every match as "
                          "its own piece (Isolated, not inverted)",
                          path, behavior ? behavior : "(none)", is_false_or_absent(split, "invert") ? "" : ", invert true");
    if (is_true(bl, "add_prefix_space") || is_true(bl, "use_regex"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer.pretokenizers[1] ByteLevel with add_prefix_space or use_regex true splits "
                          "again, which no llama.cpp pre-tokenizer does",
                          path);
    *regex = re;
    return KILN_OK;
}

/* The llama.cpp name for root's model.type, normalizer and pre_tokenizer. */
static kiln_status pre_type(const char *path, json_t *root, const char **pre) {
    json_t *model = json_object_get(root, "model"), *norm = json_object_get(root, "normalizer");
    const char *mt = json_string_value(json_object_get(model, "type"));
    if (!mt || strcmp(mt, "BPE"))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.type %s: kiln export writes byte-level BPE only (tokenizer.ggml.model gpt2)",
                          path, mt ? mt : "(none)");
    if (is_true(model, "byte_fallback"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: model.byte_fallback is true: a SentencePiece-style BPE (Llama 2, Gemma), which llama.cpp "
                          "holds as tokenizer.ggml.model \"llama\" with scores; kiln export does not write that",
                          path);
    const char *re = NULL;
    kiln_status st = pre_regex(path, json_object_get(root, "pre_tokenizer"), &re);
    if (st) return st;
    size_t k = 0;
    while (k < N_KNOWN_PRE && strcmp(re, known_pre[k].regex)) k++;
    if (k == N_KNOWN_PRE)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre-tokenizer regex '%.100s%s' is none that llama.cpp implements by name (GPT-2's, "
                          "Llama 3's, Qwen2's): it would split text differently",
                          path, re, strlen(re) > 100 ? "..." : "");
    const char *nt = json_is_object(norm) ? json_string_value(json_object_get(norm, "type")) : NULL;
    if (norm && !json_is_null(norm) && !(known_pre[k].nfc && nt && !strcmp(nt, "NFC")))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: a normalizer (%s) is set; llama.cpp's BPE tokenizers apply none (NFC is accepted with "
                          "Qwen2's pre-tokenizer only, as llama.cpp's own converter does)",
                          path, nt ? nt : "not an object");
    bool im = is_true(model, "ignore_merges");
    if (im != known_pre[k].ignore_merges)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: model.ignore_merges is %s with %s's pre-tokenizer, but llama.cpp's \"%s\" %s merges: the "
                          "ids would differ",
                          path, im ? "true" : "false", known_pre[k].whose, known_pre[k].name,
                          known_pre[k].ignore_merges ? "ignores" : "applies");
    *pre = known_pre[k].name;
    return KILN_OK;
}

/* ---- tokens and merges ------------------------------------------------- */

static kiln_status set_token(kiln_gguf_vocab *v, const char *path, int64_t id, const char *s, size_t n, int32_t type) {
    if (id < 0 || id >= v->n)
        return kiln_error(KILN_ERR_RANGE, "%s: token '%.*s' has id %lld, outside the model's vocabulary of %lld", path,
                          (int)(n > 40 ? 40 : n), s, (long long)id, (long long)v->n);
    if (v->tokens[id] && (v->lens[id] != n || memcmp(v->tokens[id], s, n)))
        return kiln_error(KILN_ERR_FORMAT, "%s: id %lld is both '%s' and '%.*s'", path, (long long)id, v->tokens[id],
                          (int)(n > 40 ? 40 : n), s);
    if (!v->tokens[id] && !(v->tokens[id] = strndup(s, n))) return kiln_error(KILN_ERR_OOM, "out of memory");
    v->lens[id] = n;
    v->types[id] = type;
    return KILN_OK;
}

/* GGUF token types (llama.cpp's llama_token_type): byte-level vocabularies
 * have no byte tokens of their own (that type is SentencePiece's <0xNN>) */
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

/* added_tokens: special ones are control tokens (matched in text only when
 * asked to parse specials), the others user-defined (always matched), as
 * in Hugging Face. GGUF keeps no lstrip/rstrip/single_word per token. */
static kiln_status read_added(const char *path, json_t *added, kiln_gguf_vocab *v) {
    size_t i;
    json_t *val;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id"), *content = json_object_get(val, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return kiln_error(KILN_ERR_FORMAT, "%s: added_tokens[%zu] lacks an integer id or a string content", path, i);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (is_true(val, flags[f]))
                return kiln_error(KILN_ERR_UNSUPPORTED, "%s: added_tokens[%zu] ('%.40s') has %s true, which GGUF cannot hold",
                                  path, i, json_string_value(content), flags[f]);
        int32_t type = is_true(val, "special") ? TT_CONTROL : TT_USER_DEFINED;
        kiln_status st = set_token(v, path, json_integer_value(id), json_string_value(content), json_string_length(content), type);
        if (st) return st;
    }
    return KILN_OK;
}

static kiln_status read_merges(const char *path, json_t *jm, kiln_gguf_vocab *v) {
    v->n_merges = json_array_size(jm);
    if (!(v->merges = calloc(v->n_merges + 1, sizeof *v->merges))) return kiln_error(KILN_ERR_OOM, "out of memory");
    for (size_t i = 0; i < v->n_merges; i++) {
        json_t *m = json_array_get(jm, i);
        if (json_is_string(m)) v->merges[i] = strdup(json_string_value(m));
        else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                 json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
            if ((v->merges[i] = malloc(strlen(a) + strlen(b) + 2))) sprintf(v->merges[i], "%s %s", a, b);
        } else {
            return kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
        if (!v->merges[i]) return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    return KILN_OK;
}

kiln_status kiln_gguf_vocab_read(const char *path, int64_t n_vocab, kiln_gguf_vocab *v) {
    memset(v, 0, sizeof *v);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, e.line, e.text);
    kiln_status st = pre_type(path, root, &v->pre);
    json_t *model = json_object_get(root, "model");
    json_t *jv = json_object_get(model, "vocab"), *jm = json_object_get(model, "merges");
    if (!st && (!json_is_object(jv) || !json_is_array(jm)))
        st = kiln_error(KILN_ERR_FORMAT, "%s: model.vocab must be an object and model.merges an array", path);
    v->n = n_vocab;
    if (!st && (!(v->tokens = calloc((size_t)n_vocab, sizeof *v->tokens)) || !(v->lens = calloc((size_t)n_vocab, sizeof *v->lens)) ||
                !(v->types = calloc((size_t)n_vocab, sizeof *v->types))))
        st = kiln_error(KILN_ERR_OOM, "out of memory");
    const char *k;
    json_t *val;
    if (!st) json_object_foreach(jv, k, val) {
        if (!json_is_integer(val)) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.vocab['%s'] is not an integer id", path, k);
            break;
        }
        if ((st = set_token(v, path, json_integer_value(val), k, strlen(k), TT_NORMAL))) break;
    }
    json_t *added = json_object_get(root, "added_tokens");
    if (!st && json_is_array(added)) st = read_added(path, added, v);
    /* ids the model has beyond the tokenizer's (a rounded-up embedding) */
    for (int64_t id = 0; !st && id < v->n; id++)
        if (!v->tokens[id]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
            st = set_token(v, path, id, pad, strlen(pad), TT_UNUSED);
        }
    if (!st) st = read_merges(path, jm, v);
    json_decref(root);
    if (st) kiln_gguf_vocab_free(v);
    return st;
}

/* ---- special ids ------------------------------------------------------- */

/* Token texts llama.cpp's loader (llama-vocab.cpp) makes end-of-generation
 * by their text alone, whatever the file's keys say. */
static bool eog_by_text(const char *s) {
    static const char *const texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                        "<|eom_id|>", "<EOT>", "<|end_of_text|>", NULL};
    for (int i = 0; texts[i]; i++)
        if (!strcmp(s, texts[i])) return true;
    return false;
}

/* The model's eos ids as llama.cpp holds them, as its converter and loader
 * do: one tokenizer.ggml.eos_token_id (the first id of the list: kiln's
 * resolution, generation_config.json before config.json before
 * tokenizer_config.json's eos_token); the id whose text is <|eom_id|> as
 * eom_token_id and <|eot_id|> as eot_token_id (Llama 3.1-3.3 Instruct's
 * [<|end_of_text|>, <|eom_id|>, <|eot_id|>]); another second id as
 * eot_token_id. llama.cpp ends generation at eos, eot and eom, and at the
 * texts of eog_by_text; an id none of these covers is refused, named, as
 * llama.cpp would generate past it where kiln stops. */
static kiln_status eos_keys(const char *dir, const kiln_model_meta *meta, const kiln_gguf_vocab *v, int64_t *eos,
                            int64_t *eot, int64_t *eom) {
    *eot = *eom = -1;
    if (meta->n_eos == 0) return KILN_OK;
    *eos = meta->eos_ids[0];
    bool placed[KILN_MAX_EOS] = {false};
    placed[0] = true;
    for (int i = 1; i < meta->n_eos; i++) { /* by text first */
        int32_t id = meta->eos_ids[i];
        const char *text = id < v->n ? v->tokens[id] : "";
        if (id == *eos) placed[i] = true;
        else if (!strcmp(text, "<|eom_id|>") && (*eom < 0 || *eom == id)) *eom = id, placed[i] = true;
        else if (!strcmp(text, "<|eot_id|>") && (*eot < 0 || *eot == id)) *eot = id, placed[i] = true;
    }
    for (int i = 1; i < meta->n_eos; i++) {
        int32_t id = meta->eos_ids[i];
        const char *text = id < v->n ? v->tokens[id] : "";
        if (placed[i] || id == *eot || id == *eom) continue;
        if (*eot < 0) *eot = id;
        else if (!eog_by_text(text))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: eos id %d ('%.40s') cannot be written to GGUF: tokenizer.ggml.eos_token_id is %lld, "
                              "eot_token_id %lld%s, and llama.cpp ends generation at no other token but those whose text "
                              "it knows (<|eot_id|>, <|eom_id|>, <|im_end|>, <|end_of_text|>, ...)",
                              dir, (int)id, text, (long long)*eos, (long long)*eot,
                              *eom >= 0 ? ", eom_token_id set" : "");
    }
    return KILN_OK;
}

/* The chat template must render, as llama.cpp will render it for every
 * chat: a system, user, assistant, user conversation with the generation
 * prompt (or, for a template that refuses a system message by design, the
 * same without it), through the template of kiln generate --chat. */
static kiln_status check_template(const char *dir) {
    char cfg[4200], jinja[4200];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
    bool have_cfg = access(cfg, F_OK) == 0, have_jinja = access(jinja, F_OK) == 0;
    kiln_chat *chat = NULL;
    kiln_status st = kiln_chat_load(have_cfg ? cfg : NULL, have_jinja ? jinja : NULL, &chat);
    if (st) return kiln_error_context(st, "%s: the chat template does not parse", dir);
    json_t *conv = json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}]}", "messages", "role", "system", "content",
                             "You are a helpful assistant.", "role", "user", "content", "Hello! Who are you?", "role",
                             "assistant", "content", "I am an assistant. How can I help?", "role", "user", "content",
                             "What is 2 + 2?");
    char *text = NULL, first[1024] = "";
    size_t len = 0;
    if (!conv) st = kiln_error(KILN_ERR_OOM, "out of memory");
    else if ((st = kiln_chat_render(chat, conv, true, &text, &len))) {
        snprintf(first, sizeof first, "%s", kiln_last_error());
        json_array_remove(json_object_get(conv, "messages"), 0);
        free(text), text = NULL;
        if (!kiln_chat_render(chat, conv, true, &text, &len)) st = KILN_OK; /* no system role, by design */
        else st = kiln_error(st, "%s: the chat template fails to render a system/user/assistant/user conversation with "
                                 "add_generation_prompt (llama.cpp would be given a template that fails): %s",
                             dir, first);
    }
    free(text);
    json_decref(conv);
    kiln_chat_free(chat);
    return st;
}

/* The special ids and the chat template as kiln generate uses them: the
 * prompt starts with the tokenizer's bos when it has one (add_bos_token);
 * generation stops at any of the model's eos ids (generation_config.json,
 * config.json, tokenizer_config.json through kiln_model_meta; eos_keys). */
kiln_status kiln_gguf_vocab_set(kiln_gguf_writer *w, const kiln_llama_config *c, const char *tok_path, const char *dir,
                                const kiln_gguf_vocab *v) {
    kiln_tokenizer *tok = NULL;
    kiln_model_meta meta = {.bos_id = -1, .pad_id = -1};
    kiln_status st = kiln_tokenizer_load(tok_path, &tok); /* kiln must be able to use it as well */
    if (!st) st = kiln_model_meta_load(dir, tok, &meta);
    if (st) {
        kiln_tokenizer_free(tok);
        return st;
    }
    bool add_bos = kiln_tokenizer_bos(tok) >= 0;
    int64_t bos = add_bos ? kiln_tokenizer_bos(tok) : meta.bos_id;
    int64_t pad = meta.pad_id >= 0 ? meta.pad_id : kiln_tokenizer_pad(tok);
    int64_t eos = kiln_tokenizer_eos(tok), eot = -1, eom = -1;
    if (kiln_tokenizer_vocab_size(tok) > c->vocab_size)
        st = kiln_error(KILN_ERR_INVALID, "%s has %d tokens but the model only %lld", tok_path, kiln_tokenizer_vocab_size(tok),
                        (long long)c->vocab_size);
    kiln_tokenizer_free(tok);
    if (!st) st = eos_keys(dir, &meta, v, &eos, &eot, &eom);
    if (!st && meta.chat_template) st = check_template(dir);
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (!st) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->lens, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, v->types, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, v->n_merges);
    struct { const char *k; int64_t id; } ids[] = {{"tokenizer.ggml.bos_token_id", bos}, {"tokenizer.ggml.eos_token_id", eos},
                                                   {"tokenizer.ggml.eot_token_id", eot}, {"tokenizer.ggml.eom_token_id", eom},
                                                   {"tokenizer.ggml.padding_token_id", pad}};
    for (int i = 0; i < 5 && !st; i++) {
        if (ids[i].id >= c->vocab_size)
            st = kiln_error(KILN_ERR_RANGE, "%s: %s %lld is outside the vocabulary (%lld)", dir, ids[i].k, (long long)ids[i].id,
                            (long long)c->vocab_size);
        else if (ids[i].id >= 0) st = kiln_gguf_set_u32(w, ids[i].k, (uint32_t)ids[i].id);
    }
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (!st && meta.chat_template) st = kiln_gguf_set_str(w, "tokenizer.chat_template", meta.chat_template);
    kiln_model_meta_free(&meta);
    return st;
}
