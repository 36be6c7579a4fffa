/* tokenizer.json as llama.cpp's vocabulary. llama.cpp does not run a
 * tokenizer.json: it has a few tokenizers of its own, and what the file
 * says must be one of them exactly, or it is refused (it would tokenize
 * differently there):
 *   - byte-level BPE as model "gpt2": llama.cpp splits text with one of the
 *     pre-tokenizer regexes it implements, chosen by the name in
 *     tokenizer.ggml.pre, and applies no normalizer, so the file's
 *     pre-tokenizer is matched on its exact regex text and options to one
 *     of those names;
 *   - SentencePiece-style BPE (byte_fallback: Llama 2, Mistral, Gemma) as
 *     model "llama": llama.cpp turns spaces into U+2581 (prepending one
 *     with add_space_prefix), splits the text into characters and merges
 *     the adjacent pair whose concatenation is a token of the highest score
 *     (leftmost among equal scores), a character without a token as its
 *     <0xXX> bytes. It has no merge list: every token gets the score
 *     -(1 + the rank of the first merge that makes it), so the merges run
 *     in the file's order, and a vocabulary where that differs from the
 *     listed merges (two tokens that make a third without a merge joining
 *     them, a character without a token inside a token) is refused. */
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
    free(v->tokens), free(v->lens), free(v->types), free(v->merges), free(v->scores);
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

/* The llama.cpp name for a byte-level BPE's normalizer and pre_tokenizer. */
static kiln_status pre_type(const char *path, json_t *root, const char **pre) {
    json_t *model = json_object_get(root, "model"), *norm = json_object_get(root, "normalizer");
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

/* ---- SentencePiece-style BPE: the text pipeline ------------------------ */

static bool is_spm(const kiln_gguf_vocab *v) { return v->model && !strcmp(v->model, "llama"); }

#define WS "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static const char *type_of(json_t *o) { return json_is_object(o) ? json_string_value(json_object_get(o, "type")) : NULL; }
static bool str_is(json_t *o, const char *key, const char *want) {
    const char *s = json_string_value(json_object_get(o, key));
    return s && !strcmp(s, want);
}
/* {"type": "Replace", "pattern": {"String": from}, "content": to} */
static bool is_replace(json_t *o, const char *from, const char *to) {
    json_t *pat = json_object_get(o, "pattern");
    return str_is(o, "type", "Replace") && json_object_size(pat) == 1 && str_is(pat, "String", from) && str_is(o, "content", to);
}

/* The normalizer llama.cpp's SentencePiece tokenizer is: spaces to U+2581
 * (Replace), with add_space_prefix one U+2581 before every piece of text
 * (Prepend; Hugging Face prepends to every piece between added tokens, as
 * llama.cpp does after each special token). The order of the two does not
 * matter. */
static kiln_status spm_normalizer(const char *path, json_t *norm, bool *replaced, bool *prefix) {
    *replaced = *prefix = false;
    if (!norm || json_is_null(norm)) return KILN_OK;
    const char *t = type_of(norm);
    bool seq = t && !strcmp(t, "Sequence");
    json_t *steps = seq ? json_object_get(norm, "normalizers") : NULL;
    size_t n = seq ? json_array_size(steps) : 1;
    if (seq && !json_is_array(steps))
        return kiln_error(KILN_ERR_FORMAT, "%s: normalizer Sequence has no array normalizers", path);
    for (size_t i = 0; i < n; i++) {
        json_t *step = seq ? json_array_get(steps, i) : norm;
        const char *st = type_of(step);
        if (is_replace(step, " ", WS) && !*replaced) *replaced = true;
        else if (st && !strcmp(st, "Prepend") && str_is(step, "prepend", WS) && json_object_size(step) == 2 && !*prefix)
            *prefix = true;
        else {
            char where[64] = "normalizer";
            if (seq) snprintf(where, sizeof where, "normalizer.normalizers[%zu]", i);
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: %s %s: llama.cpp's SentencePiece tokenizer only turns spaces into U+2581 (and with "
                              "add_space_prefix puts one before the text); kiln export maps a Replace of ' ' by U+2581 "
                              "(Gemma), with a Prepend of U+2581 (Llama 2), and nothing else",
                              path, where, st ? st : "(no type)");
        }
    }
    return KILN_OK;
}

/* llama.cpp runs no pre-tokenizer on SentencePiece text. Accepted: none; a
 * Metaspace that only turns spaces into U+2581 (prepend_scheme never,
 * split false); a Split on ' ' after a normalizer that left no space to
 * split on (Gemma's). */
static kiln_status spm_pretok(const char *path, json_t *pt, bool *replaced) {
    if (!pt || json_is_null(pt)) return KILN_OK;
    const char *t = type_of(pt);
    if (t && !strcmp(t, "Metaspace")) {
        json_t *rep = json_object_get(pt, "replacement"), *split = json_object_get(pt, "split");
        const char *ps = json_string_value(json_object_get(pt, "prepend_scheme"));
        bool never = ps ? !strcmp(ps, "never") : json_is_false(json_object_get(pt, "add_prefix_space"));
        if (rep && !str_is(pt, "replacement", WS))
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: pre_tokenizer Metaspace with replacement '%s': llama.cpp turns "
                              "spaces into U+2581 only", path, json_string_value(rep) ? json_string_value(rep) : "?");
        if (!split || json_is_true(split))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer Metaspace with split true: Hugging Face runs BPE on each word (U+2581 "
                              "and what follows), llama.cpp's SentencePiece tokenizer on the whole text, merging "
                              "across words (tokens such as '" WS WS "')",
                              path);
        if (!never)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer Metaspace with prepend_scheme %s: Hugging Face prepends U+2581 only to "
                              "text that does not start with a space%s, llama.cpp's add_space_prefix to every piece of "
                              "text, after each special token too (kiln export maps prepend_scheme never, and a Prepend "
                              "normalizer as add_space_prefix)",
                              path, ps ? ps : "always", ps && !strcmp(ps, "first") ? ", and only at the start of the input" : "");
        *replaced = true;
        return KILN_OK;
    }
    if (t && !strcmp(t, "Split")) {
        json_t *pat = json_object_get(pt, "pattern");
        if (*replaced && json_object_size(pat) == 1 && str_is(pat, "String", " ") && is_false_or_absent(pt, "invert"))
            return KILN_OK; /* every space is U+2581 by now: nothing to split */
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer Split: llama.cpp's SentencePiece tokenizer does not split the text (kiln "
                          "export accepts a Split on ' ' only after a normalizer that turned every space into U+2581, "
                          "where it finds nothing)",
                          path);
    }
    return kiln_error(KILN_ERR_UNSUPPORTED,
                      "%s: pre_tokenizer %s: llama.cpp's SentencePiece tokenizer runs no pre-tokenizer (kiln export "
                      "maps none, Metaspace with prepend_scheme never and split false, and Gemma's no-op Split)",
                      path, t ? t : "(no type)");
}

/* llama.cpp shows a SentencePiece token with its U+2581 as spaces, a byte
 * token as its byte, and drops the space add_space_prefix put first: the
 * decoder must be that, Sequence [Replace(U+2581 -> ' '), ByteFallback,
 * Fuse] with Strip(' ', 1, 0) after exactly when the normalizer
 * prepends. */
static kiln_status spm_decoder(const char *path, json_t *dec, bool prefix) {
    json_t *d = json_object_get(dec, "decoders");
    size_t n = json_array_size(d);
    json_t *strip = json_array_get(d, 3);
    bool ok = str_is(dec, "type", "Sequence") && n == (prefix ? 4u : 3u) && is_replace(json_array_get(d, 0), WS, " ") &&
              str_is(json_array_get(d, 1), "type", "ByteFallback") && str_is(json_array_get(d, 2), "type", "Fuse");
    if (ok && prefix)
        ok = str_is(strip, "type", "Strip") && str_is(strip, "content", " ") &&
             json_integer_value(json_object_get(strip, "start")) == 1 && json_is_integer(json_object_get(strip, "stop")) &&
             json_integer_value(json_object_get(strip, "stop")) == 0;
    if (ok) return KILN_OK;
    const char *t = type_of(dec);
    return kiln_error(KILN_ERR_UNSUPPORTED,
                      "%s: decoder %s%s: llama.cpp shows SentencePiece tokens with U+2581 as spaces and byte tokens as "
                      "bytes%s; kiln export maps only the decoder that does that, Sequence [Replace(U+2581 -> ' '), "
                      "ByteFallback, Fuse%s]",
                      path, t ? t : "(none)", t && !strcmp(t, "Sequence") ? " of other steps" : "",
                      prefix ? ", without the space add_space_prefix put first" : "", prefix ? ", Strip(' ', 1, 0)" : "");
}

/* The model's options and the text pipeline of a byte_fallback BPE; sets
 * v->add_space_prefix. */
static kiln_status spm_type(const char *path, json_t *root, kiln_gguf_vocab *v) {
    json_t *model = json_object_get(root, "model"), *drop = json_object_get(model, "dropout");
    if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.dropout is %g: llama.cpp merges deterministically", path,
                          json_number_value(drop));
    if (is_true(model, "ignore_merges"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: model.ignore_merges is true: Hugging Face takes a whole word that is a token as it is, "
                          "llama.cpp's SentencePiece tokenizer always merges",
                          path);
    static const char *const affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *a = json_string_value(json_object_get(model, affix[i]));
        if (a && *a)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.%s is '%s': llama.cpp's SentencePiece tokenizer has none", path,
                              affix[i], a);
    }
    bool replaced, prefix;
    kiln_status st = spm_normalizer(path, json_object_get(root, "normalizer"), &replaced, &prefix);
    if (!st) st = spm_pretok(path, json_object_get(root, "pre_tokenizer"), &replaced);
    if (!st && !replaced)
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "%s: neither the normalizer nor the pre-tokenizer turns spaces into U+2581, which llama.cpp's "
                        "SentencePiece tokenizer always does",
                        path);
    if (!st) st = spm_decoder(path, json_object_get(root, "decoder"), prefix);
    v->add_space_prefix = prefix;
    return st;
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
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* added_tokens: special ones are control tokens (matched in text only when
 * asked to parse specials), the others user-defined (always matched), as
 * in Hugging Face. GGUF keeps no lstrip/rstrip/single_word per token. In a
 * SentencePiece vocabulary llama.cpp matches them in the text before
 * spaces become U+2581; Hugging Face matches a "normalized" one in the
 * normalized text, which is the same place only for a token without
 * spaces or U+2581 and without a Prepend (after which llama.cpp puts a
 * U+2581 before the next piece of text, Hugging Face does not). */
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
        const char *text = json_string_value(content);
        json_t *norm = json_object_get(val, "normalized");
        bool normalized = norm ? json_is_true(norm) : !is_true(val, "special");
        if (is_spm(v) && normalized && (v->add_space_prefix || strchr(text, ' ') || strstr(text, WS)))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: added_tokens[%zu] ('%.40s') has normalized true: Hugging Face matches it in the text "
                              "after the normalizer, llama.cpp before (with %s it would tokenize differently)",
                              path, i, text, v->add_space_prefix ? "the Prepend normalizer" : "its spaces or U+2581");
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

/* ---- SentencePiece-style BPE: scores ----------------------------------- */

/* bytes of the character at s[0] as llama.cpp's unicode_len_utf8 counts
 * them (by the lead byte, cut at the end) */
static size_t char_len(const char *s, size_t n) {
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t k = len[(unsigned char)s[0] >> 4];
    return k < n ? k : n;
}

/* token text -> id, and (left, right) -> (rank, result) of the merges, by
 * open addressing (-1 / 0: empty) */
typedef struct {
    const kiln_gguf_vocab *v;
    int32_t *tok;
    size_t tok_cap;
    uint64_t *pair; /* (left << 32 | right) + 1 */
    uint32_t *rank;
    int32_t *result;
    size_t pair_cap;
} spm_index;

static void spm_index_free(spm_index *x) { free(x->tok), free(x->pair), free(x->rank), free(x->result); }

static int32_t spm_find(const spm_index *x, const char *s, size_t n) {
    for (size_t h = kiln_hash_bytes(s, n) & (x->tok_cap - 1);; h = (h + 1) & (x->tok_cap - 1)) {
        int32_t id = x->tok[h];
        if (id < 0 || (x->v->lens[id] == n && !memcmp(x->v->tokens[id], s, n))) return id;
    }
}

static size_t spm_pair_slot(const spm_index *x, uint64_t key) {
    size_t h = (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & (x->pair_cap - 1);
    while (x->pair[h] && x->pair[h] != key) h = (h + 1) & (x->pair_cap - 1);
    return h;
}

static bool spm_has_pair(const spm_index *x, int32_t a, int32_t b) {
    return x->pair[spm_pair_slot(x, ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1)] != 0;
}

static kiln_status spm_index_build(const char *path, const kiln_gguf_vocab *v, size_t n_merges, spm_index *x) {
    memset(x, 0, sizeof *x);
    x->v = v;
    for (x->tok_cap = 64; x->tok_cap < 2 * (size_t)v->n; x->tok_cap *= 2) {}
    for (x->pair_cap = 64; x->pair_cap < 2 * n_merges + 2; x->pair_cap *= 2) {}
    x->tok = malloc(x->tok_cap * sizeof *x->tok);
    x->pair = calloc(x->pair_cap, sizeof *x->pair);
    x->rank = malloc(x->pair_cap * sizeof *x->rank);
    x->result = malloc(x->pair_cap * sizeof *x->result);
    if (!x->tok || !x->pair || !x->rank || !x->result) return kiln_error(KILN_ERR_OOM, "out of memory");
    memset(x->tok, 0xff, x->tok_cap * sizeof *x->tok);
    for (int64_t i = 0; i < v->n; i++) {
        size_t h = kiln_hash_bytes(v->tokens[i], v->lens[i]) & (x->tok_cap - 1);
        for (; x->tok[h] >= 0; h = (h + 1) & (x->tok_cap - 1)) {
            int32_t j = x->tok[h];
            if (v->lens[j] == v->lens[i] && !memcmp(v->tokens[j], v->tokens[i], v->lens[i]))
                return kiln_error(KILN_ERR_FORMAT, "%s: tokens %d and %lld are both '%.40s' (llama.cpp refuses a vocabulary "
                                  "with a text twice)", path, (int)j, (long long)i, v->tokens[i]);
        }
        x->tok[h] = (int32_t)i;
    }
    return KILN_OK;
}

/* The merges as Hugging Face ranks them (the file's order, "#version"
 * lines skipped; a pair listed twice has its last rank) into x. */
static kiln_status spm_read_merges(const char *path, json_t *jm, kiln_gguf_vocab *v, spm_index *x) {
    size_t i;
    json_t *m;
    uint32_t rank = 0;
    char *cat = NULL;
    size_t cat_cap = 0;
    kiln_status st = KILN_OK;
    json_array_foreach(jm, i, m) {
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            a = json_string_value(m);
            if (!strncmp(a, "#version", 8)) continue;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] '%.60s' is not two tokens separated by one space",
                                path, i, a);
                break;
            }
            an = (size_t)(sp - a), b = sp + 1, bn = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), an = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1)), bn = json_string_length(json_array_get(m, 1));
        } else {
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
            break;
        }
        if (an + bn > cat_cap) {
            char *p = realloc(cat, an + bn);
            if (!p) {
                st = kiln_error(KILN_ERR_OOM, "out of memory");
                break;
            }
            cat = p, cat_cap = an + bn;
        }
        memcpy(cat, a, an);
        memcpy(cat + an, b, bn);
        int32_t ia = spm_find(x, a, an), ib = spm_find(x, b, bn), ic = spm_find(x, cat, an + bn);
        if (ia < 0 || ib < 0 || ic < 0) {
            const char *what = ia < 0 ? a : ib < 0 ? b : cat;
            size_t wn = ia < 0 ? an : ib < 0 ? bn : an + bn;
            st = kiln_error(KILN_ERR_FORMAT, "%s: model.merges[%zu] ('%.*s' '%.*s'): '%.*s' is no token", path, i,
                            (int)(an > 40 ? 40 : an), a, (int)(bn > 40 ? 40 : bn), b, (int)(wn > 40 ? 40 : wn), what);
            break;
        }
        int32_t byte = v->types[ia] == TT_BYTE ? ia : v->types[ib] == TT_BYTE ? ib : v->types[ic] == TT_BYTE ? ic : -1;
        if (byte >= 0) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "%s: model.merges[%zu] ('%.*s' '%.*s') involves the byte token %s: Hugging Face merges the "
                            "bytes a character without a token falls back to, llama.cpp keeps such a character whole",
                            path, i, (int)(an > 40 ? 40 : an), a, (int)(bn > 40 ? 40 : bn), b, v->tokens[byte]);
            break;
        }
        size_t h = spm_pair_slot(x, ((uint64_t)(uint32_t)ia << 32 | (uint32_t)ib) + 1);
        x->pair[h] = ((uint64_t)(uint32_t)ia << 32 | (uint32_t)ib) + 1;
        x->rank[h] = rank++;
        x->result[h] = ic;
    }
    free(cat);
    v->n_merges = rank;
    return st;
}

/* llama.cpp merges adjacent pieces whose concatenation is a token, by the
 * token's score; Hugging Face the listed pairs, by rank. With token T's
 * score -(1 + the lowest rank of a merge giving T) (a token no merge gives:
 * below every merge) they agree where (a) every two tokens that make a
 * token are a listed merge, and (b) no token holds a character that is no
 * token next to a token (llama.cpp merges that character, Hugging Face has
 * turned it into bytes). Tokens both split out of the raw text first (added
 * tokens) never come out of merging unless their text holds U+2581 or a
 * space, which the raw text does not have where the merged text does. The
 * merges of one token share a score in llama.cpp where Hugging Face ranks
 * them one by one: converters write them one after another
 * (SentencePiece's own order); Gemma's whitespace runs are interleaved, and
 * tokenize alike (tests/test_gguf_families). */
static kiln_status spm_scores(const char *path, json_t *jm, kiln_gguf_vocab *v) {
    spm_index x;
    kiln_status st = spm_index_build(path, v, json_array_size(jm), &x);
    uint32_t *first = st ? NULL : malloc((size_t)v->n * sizeof *first);
    if (!st && !(first && (v->scores = malloc((size_t)v->n * sizeof *v->scores)))) st = kiln_error(KILN_ERR_OOM, "out of memory");
    if (!st) st = spm_read_merges(path, jm, v, &x);
    if (!st && v->n_merges >= (1u << 24))
        st = kiln_error(KILN_ERR_LIMIT, "%s: %zu merges: their ranks are not all distinct as float32 scores (at most 2^24)",
                        path, v->n_merges);
    for (int64_t i = 0; !st && i < v->n; i++) first[i] = UINT32_MAX;
    for (size_t h = 0; !st && h < x.pair_cap; h++)
        if (x.pair[h] && x.rank[h] < first[x.result[h]]) first[x.result[h]] = x.rank[h];
    for (int64_t i = 0; !st && i < v->n; i++)
        v->scores[i] = first[i] < UINT32_MAX ? -(float)first[i] - 1 : -(float)v->n_merges - 1;
    for (int64_t i = 0; !st && i < v->n; i++) {
        const char *s = v->tokens[i];
        size_t l = v->lens[i];
        bool added = v->types[i] == TT_CONTROL || v->types[i] == TT_USER_DEFINED || v->types[i] == TT_UNKNOWN;
        if (added && !memchr(s, ' ', l) && !strstr(s, WS)) continue;
        for (size_t k = char_len(s, l); k < l && !st; k += char_len(s + k, l - k)) {
            int32_t a = spm_find(&x, s, k), b = spm_find(&x, s + k, l - k);
            int shown = (int)(l > 40 ? 40 : l), an = (int)(k > 40 ? 40 : k), bn = (int)(l - k > 40 ? 40 : l - k);
            if (a >= 0 && b >= 0) {
                if (!spm_has_pair(&x, a, b))
                    st = kiln_error(KILN_ERR_UNSUPPORTED,
                                    "%s: token %lld '%.*s' is '%.*s' + '%.*s', two tokens that model.merges does not "
                                    "join: llama.cpp's SentencePiece tokenizer merges any two adjacent pieces that make a "
                                    "token, Hugging Face only the listed pairs",
                                    path, (long long)i, shown, s, an, s, bn, s + k);
            } else if ((a >= 0 || char_len(s, k) == k) && (b >= 0 || char_len(s + k, l - k) == l - k)) {
                st = kiln_error(KILN_ERR_UNSUPPORTED,
                                "%s: token %lld '%.*s' is '%.*s' + '%.*s', where '%.*s' is no token: llama.cpp merges "
                                "such a character, Hugging Face has turned it into its bytes",
                                path, (long long)i, shown, s, an, s, bn, s + k, a < 0 ? an : bn, a < 0 ? s : s + k);
            }
        }
    }
    free(first);
    spm_index_free(&x);
    return st;
}

/* Byte tokens <0x00>..<0xFF>, all of them (llama.cpp falls back to them for
 * text outside the vocabulary), typed as bytes; the unknown token. */
static kiln_status spm_specials(const char *path, json_t *model, kiln_gguf_vocab *v) {
    json_t *jv = json_object_get(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_t *id = json_object_get(jv, name);
        if (!json_is_integer(id))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: model.vocab has no '%s': a byte_fallback vocabulary needs all 256 byte tokens "
                              "<0x00>..<0xFF> (llama.cpp falls back to them for characters without a token)",
                              path, name);
        int64_t i = json_integer_value(id);
        if (v->types[i] == TT_NORMAL) v->types[i] = TT_BYTE;
    }
    v->unk = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) {
        json_t *id = json_object_get(jv, unk);
        if (!json_is_integer(id))
            return kiln_error(KILN_ERR_FORMAT, "%s: model.unk_token '%.40s' is not in model.vocab", path, unk);
        v->unk = json_integer_value(id);
        if (v->types[v->unk] == TT_CONTROL) v->types[v->unk] = TT_UNKNOWN;
    }
    return KILN_OK;
}

kiln_status kiln_gguf_vocab_read(const char *path, int64_t n_vocab, kiln_gguf_vocab *v) {
    memset(v, 0, sizeof *v);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) return kiln_error(KILN_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, e.line, e.text);
    json_t *model = json_object_get(root, "model");
    const char *mt = json_string_value(json_object_get(model, "type"));
    kiln_status st = KILN_OK;
    if (!mt || strcmp(mt, "BPE"))
        st = kiln_error(KILN_ERR_UNSUPPORTED, "%s: model.type %s: kiln export writes BPE only (tokenizer.ggml.model gpt2, "
                        "or llama for byte_fallback)", path, mt ? mt : "(none)");
    else if (is_true(model, "byte_fallback")) v->model = "llama", st = spm_type(path, root, v);
    else v->model = "gpt2", st = pre_type(path, root, &v->pre);
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
    if (!st && is_spm(v)) st = spm_specials(path, model, v);
    if (!st) st = is_spm(v) ? spm_scores(path, jm, v) : read_merges(path, jm, v);
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
    bool spm = is_spm(v);
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.model", v->model);
    if (!st && !spm) st = kiln_gguf_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (!st) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->lens, (uint64_t)v->n);
    if (!st && spm) st = kiln_gguf_set_array(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, v->scores, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, v->types, (uint64_t)v->n);
    if (!st && !spm) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, v->n_merges);
    /* llama.cpp's defaults for "llama" (bos 1, eos 2, unk 0) hold where no
     * id is written: without an eos it would stop at id 2 where kiln does
     * not (unk is harmless: with all 256 byte tokens it never comes out) */
    if (!st && spm && eos < 0)
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "%s: no eos token (generation_config.json, config.json, tokenizer_config.json or an eos-named "
                        "special token): llama.cpp's SentencePiece tokenizer would end generation at id 2 ('%.40s')",
                        dir, v->n > 2 ? v->tokens[2] : "");
    struct { const char *k; int64_t id; } ids[] = {{"tokenizer.ggml.bos_token_id", bos}, {"tokenizer.ggml.eos_token_id", eos},
                                                   {"tokenizer.ggml.eot_token_id", eot}, {"tokenizer.ggml.eom_token_id", eom},
                                                   {"tokenizer.ggml.padding_token_id", pad},
                                                   {"tokenizer.ggml.unknown_token_id", spm ? v->unk : -1}};
    for (int i = 0; i < 6 && !st; i++) {
        if (ids[i].id >= c->vocab_size)
            st = kiln_error(KILN_ERR_RANGE, "%s: %s %lld is outside the vocabulary (%lld)", dir, ids[i].k, (long long)ids[i].id,
                            (long long)c->vocab_size);
        else if (ids[i].id >= 0) st = kiln_gguf_set_u32(w, ids[i].k, (uint32_t)ids[i].id);
    }
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (!st && spm) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix);
    if (!st && meta.chat_template) st = kiln_gguf_set_str(w, "tokenizer.chat_template", meta.chat_template);
    kiln_model_meta_free(&meta);
    return st;
}
