/* A GGUF file's tokenizer (tokenizer.ggml.*) and special tokens, read as
 * llama.cpp's llama-vocab.cpp loads and runs them, so that kiln encodes a
 * text to the ids llama.cpp gives it (llama_tokenize with parse_special;
 * with add_special through KILN_ENCODE_SPECIAL).
 *
 * The tokenizer is built as the tokenizer.json that expresses it, parsed by
 * kiln_tokenizer_parse (so a checkpoint keeps a file Hugging Face reads):
 *   - model "gpt2": byte-level BPE, the merges in file order (a repeated
 *     pair keeps its first rank, as llama.cpp's map does), the
 *     pre-tokenizer regex of tokenizer.ggml.pre (gpt-2, llama-bpe, qwen2
 *     and the names llama.cpp treats as those), llama-bpe's whole-word
 *     lookup (ignore_merges), no normalizer;
 *   - model "llama": llama.cpp's SentencePiece tokenizer: spaces as U+2581,
 *     one prepended to every piece of text that starts the input or follows
 *     a special token (add_space_prefix), the adjacent pair whose merged
 *     text is a token of the highest score merging first (leftmost among
 *     equal scores: the merges share a rank, model.kiln_merge_ranks), bytes
 *     without a token as <0xXX>.
 * Tokens llama.cpp matches in text before splitting it (control, user
 * defined and unknown types, with its fix-ups by token text and model name)
 * become added tokens. Anything else is refused, naming file, key and
 * value. */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "kiln/gguf.h"

#define MAX_TOKENS (1 << 24)

/* llama.cpp's llama_token_type, as tokenizer.ggml.token_type stores it */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4 };
/* what matters of llama.cpp's token attributes */
#define AT_UNKNOWN 1u
#define AT_CONTROL 2u
#define AT_USER 4u
#define AT_LSTRIP 8u
#define AT_RSTRIP 16u
#define AT_MATCHED (AT_UNKNOWN | AT_CONTROL | AT_USER) /* split out of the text first */

/* The tokenizer.ggml.pre names kiln reads, as llama.cpp groups them (each
 * group one pre-tokenizer, with the same options); the regex as Hugging
 * Face writes it (NULL: ByteLevel's own, GPT-2's), which kiln export maps
 * back to the group's first name. */
static const char *const pre_gpt2[] = {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                                       "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", NULL};
static const char *const pre_llama3[] = {"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral",
                                         "midm-2.0", "lfm2", "jina-v5-nano", NULL};
static const char *const pre_qwen2[] = {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", NULL};
static const struct {
    const char *const *names;
    const char *regex;
    bool ignore_merges, add_bos;
} pres[] = {
    {pre_gpt2, NULL, false, false},
    {pre_llama3,
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     true, true},
    {pre_qwen2,
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     false, false},
};
#define N_PRES (sizeof pres / sizeof pres[0])

/* Token texts llama.cpp's loader acts on (llama-vocab.cpp): end of
 * generation, which it makes control tokens whatever their type */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>",
    "<eos>", "<turn|>", "<|tool_response>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL};
/* the fill-in-the-middle tokens: when the file names none of a kind, the
 * first of these texts llama.cpp meets becomes that kind, a control token */
static const char *const fim_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                      "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const fim_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                      "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>",
                                      "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const fim_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                      "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const fim_sep[] = {"<|file_sep|>", NULL};
static const struct {
    const char *key, *old_key; /* the file's id of this kind (and its deprecated name) */
    const char *const *texts;
} fims[] = {
    {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id", fim_pre},
    {"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id", fim_suf},
    {"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id", fim_mid},
    {"tokenizer.ggml.fim_pad_token_id", NULL, fim_pad},
    {"tokenizer.ggml.fim_rep_token_id", NULL, fim_rep},
    {"tokenizer.ggml.fim_sep_token_id", NULL, fim_sep},
};

static bool in_list(const char *s, size_t n, const char *const *list) {
    for (; *list; list++)
        if (strlen(*list) == n && !memcmp(*list, s, n)) return true;
    return false;
}

/* ---- the vocabulary ---------------------------------------------------- */

typedef struct {
    const kiln_gguf_file *f;
    const char *path;
    bool spm;           /* model "llama" (else "gpt2") */
    int pre;            /* gpt2: index in pres */
    const char *pre_name;
    size_t pre_len;
    int64_t n;
    const char **s;     /* token texts (in the mapping, or own[i]) */
    size_t *l;
    char **own;         /* llama.cpp's names for empty tokens */
    const kiln_gguf_kv *types, *scores;
    int32_t *slot;      /* open addressing: text -> id, -1 empty */
    size_t cap;
    bool add_bos, add_eos, add_space_prefix;
    int32_t bos, eos, eot, eom, pad, unk;
} vocab;

static void vocab_free(vocab *v) {
    for (int64_t i = 0; v->own && i < v->n; i++) free(v->own[i]);
    free(v->own);
    free(v->s);
    free(v->l);
    free(v->slot);
    memset(v, 0, sizeof *v);
}

static int32_t vfind(const vocab *v, const char *s, size_t n) {
    for (size_t h = kiln_hash_bytes(s, n) & (v->cap - 1);; h = (h + 1) & (v->cap - 1)) {
        int32_t id = v->slot[h];
        if (id < 0) return -1;
        if (v->l[id] == n && !memcmp(v->s[id], s, n)) return id;
    }
}

static int32_t vfind_str(const vocab *v, const char *s) { return vfind(v, s, strlen(s)); }

/* strict UTF-8 (what JSON holds): no overlong forms, surrogates or values
 * past U+10FFFF */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!k || i + k > n) return false;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += k;
    }
    return true;
}

/* bytes of the character at s[0] as llama.cpp's unicode_len_utf8 counts
 * them (by the lead byte, cut at the end) */
static size_t char_len(const char *s, size_t n) {
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t k = len[(unsigned char)s[0] >> 4];
    return k < n ? k : n;
}

/* An integer key (llama.cpp writes u32; any integer type is read):
 * *out = its value when it is an id in [0, n), else unchanged (llama.cpp
 * keeps its default for an id outside the vocabulary). */
static kiln_status id_key(const vocab *v, const char *key, int32_t *out, bool *present) {
    const kiln_gguf_kv *kv = kiln_gguf_find(v->f, key);
    if (present) *present = false;
    if (!kv) return KILN_OK;
    int64_t x;
    switch (kv->type) {
    case KILN_GGUF_UINT8: { uint8_t a; memcpy(&a, kv->data, 1); x = a; } break;
    case KILN_GGUF_INT8: { int8_t a; memcpy(&a, kv->data, 1); x = a; } break;
    case KILN_GGUF_UINT16: { uint16_t a; memcpy(&a, kv->data, 2); x = a; } break;
    case KILN_GGUF_INT16: { int16_t a; memcpy(&a, kv->data, 2); x = a; } break;
    case KILN_GGUF_UINT32: { uint32_t a; memcpy(&a, kv->data, 4); x = a; } break;
    case KILN_GGUF_INT32: { int32_t a; memcpy(&a, kv->data, 4); x = a; } break;
    case KILN_GGUF_UINT64: { uint64_t a; memcpy(&a, kv->data, 8); x = a > INT64_MAX ? -1 : (int64_t)a; } break;
    case KILN_GGUF_INT64: { int64_t a; memcpy(&a, kv->data, 8); x = a; } break;
    default:
        return kiln_error(KILN_ERR_FORMAT, "%s: key %s is %s, not a token id (u32)", v->path, key, kiln_gguf_type_str(kv->type));
    }
    if (x >= 0 && x < v->n) {
        *out = (int32_t)x;
        if (present) *present = true;
    } else {
        kiln_log(KILN_LOG_WARN, "%s: %s %lld is outside the %lld tokens; as llama.cpp, it is ignored", v->path, key,
                 (long long)x, (long long)v->n);
    }
    return KILN_OK;
}

static kiln_status bool_key(const vocab *v, const char *key, bool *out) {
    if (!kiln_gguf_find(v->f, key)) return KILN_OK;
    return kiln_gguf_get_bool(v->f, key, out);
}

static kiln_status read_model(vocab *v) {
    const char *m;
    uint64_t ml;
    kiln_status st = kiln_gguf_get_str(v->f, "tokenizer.ggml.model", &m, &ml);
    if (st) return st;
    if (ml == 5 && !memcmp(m, "llama", 5)) {
        v->spm = true;
        return KILN_OK;
    }
    if (!(ml == 4 && !memcmp(m, "gpt2", 4)))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not one kiln reads (gpt2, llama)", v->path,
                          (int)(ml > 64 ? 64 : ml), m);
    if (!kiln_gguf_find(v->f, "tokenizer.ggml.pre"))
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: key tokenizer.ggml.pre missing: llama.cpp then splits text with its 'default' regexes, "
                          "which kiln does not reproduce (it reads gpt-2, llama-bpe, qwen2)",
                          v->path);
    const char *p;
    uint64_t pl;
    if ((st = kiln_gguf_get_str(v->f, "tokenizer.ggml.pre", &p, &pl))) return st;
    v->pre_name = p, v->pre_len = pl;
    for (size_t k = 0; k < N_PRES; k++)
        if (in_list(p, pl, pres[k].names)) {
            v->pre = (int)k;
            return KILN_OK;
        }
    return kiln_error(KILN_ERR_UNSUPPORTED,
                      "%s: tokenizer.ggml.pre '%.*s' is not one kiln reads (gpt-2, llama-bpe, qwen2 and the names "
                      "llama.cpp gives the same pre-tokenizer)",
                      v->path, (int)(pl > 64 ? 64 : pl), p);
}

static kiln_status read_tokens(vocab *v) {
    const kiln_gguf_kv *kv;
    kiln_status st = kiln_gguf_get_array(v->f, "tokenizer.ggml.tokens", KILN_GGUF_STRING, &kv);
    if (st) return st;
    if (kv->n == 0) return kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", v->path);
    if (kv->n > MAX_TOKENS)
        return kiln_error(KILN_ERR_LIMIT, "%s: tokenizer.ggml.tokens has %llu tokens (kiln reads up to %d)", v->path,
                          (unsigned long long)kv->n, MAX_TOKENS);
    v->n = (int64_t)kv->n;
    for (v->cap = 64; v->cap < 2 * (size_t)v->n; v->cap *= 2) {}
    v->s = malloc((size_t)v->n * sizeof *v->s);
    v->l = malloc((size_t)v->n * sizeof *v->l);
    v->own = calloc((size_t)v->n, sizeof *v->own);
    v->slot = malloc(v->cap * sizeof *v->slot);
    if (!v->s || !v->l || !v->own || !v->slot) return kiln_error(KILN_ERR_OOM, "%s: out of memory for the vocabulary", v->path);
    memset(v->slot, 0xff, v->cap * sizeof *v->slot);
    for (int64_t i = 0; i < v->n; i++) {
        v->s[i] = kv->strs[i];
        v->l[i] = (size_t)kv->lens[i];
        if (!v->l[i]) { /* as llama.cpp names it */
            char name[40];
            snprintf(name, sizeof name, "[EMPTY_%lld]", (long long)i);
            if (!(v->own[i] = strdup(name))) return kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
            v->s[i] = v->own[i];
            v->l[i] = strlen(name);
        }
        if (memchr(v->s[i], 0, v->l[i]) || !valid_utf8((const unsigned char *)v->s[i], v->l[i]))
            return kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%lld] is not valid UTF-8 text (or holds a NUL byte)",
                              v->path, (long long)i);
        size_t h = kiln_hash_bytes(v->s[i], v->l[i]) & (v->cap - 1);
        for (; v->slot[h] >= 0; h = (h + 1) & (v->cap - 1)) {
            int32_t j = v->slot[h];
            if (v->l[j] == v->l[i] && !memcmp(v->s[j], v->s[i], v->l[i]))
                return kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%lld] '%.*s' is also token %d (llama.cpp refuses "
                                  "a vocabulary with a text twice)", v->path, (long long)i, (int)(v->l[i] > 40 ? 40 : v->l[i]),
                                  v->s[i], (int)j);
        }
        v->slot[h] = (int32_t)i;
    }
    /* types and scores: optional, one per token */
    if (kiln_gguf_find(v->f, "tokenizer.ggml.token_type")) {
        if ((st = kiln_gguf_get_array(v->f, "tokenizer.ggml.token_type", KILN_GGUF_INT32, &v->types))) return st;
        if (v->types->n != kv->n)
            return kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu values for %llu tokens", v->path,
                              (unsigned long long)v->types->n, (unsigned long long)kv->n);
    }
    const kiln_gguf_kv *sc = kiln_gguf_find(v->f, "tokenizer.ggml.scores");
    if (sc) {
        if (sc->type != KILN_GGUF_ARRAY || (sc->elem_type != KILN_GGUF_FLOAT32 && sc->elem_type != KILN_GGUF_INT32))
            return kiln_error(KILN_ERR_FORMAT, "%s: key tokenizer.ggml.scores is %s of %s, not an array of f32 (or i32)",
                              v->path, kiln_gguf_type_str(sc->type), kiln_gguf_type_str(sc->elem_type));
        if (sc->n != kv->n)
            return kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.scores has %llu values for %llu tokens", v->path,
                              (unsigned long long)sc->n, (unsigned long long)kv->n);
        v->scores = sc;
    }
    return KILN_OK;
}

static int32_t token_type(const vocab *v, int64_t i) {
    if (!v->types) return TT_NORMAL;
    int32_t t;
    memcpy(&t, (const char *)v->types->data + 4 * i, 4);
    return t;
}

static float token_score(const vocab *v, int64_t i) {
    if (!v->scores) return 0;
    if (v->scores->elem_type == KILN_GGUF_INT32) {
        int32_t x;
        memcpy(&x, (const char *)v->scores->data + 4 * i, 4);
        return (float)x;
    }
    float x;
    memcpy(&x, (const char *)v->scores->data + 4 * i, 4);
    return x;
}

/* The special ids and flags as llama.cpp resolves them: its defaults for
 * the tokenizer (llama: bos 1, eos 2, unk 0; gpt2: 11, 11, none; an id
 * outside the vocabulary is none), then the file's keys. */
static kiln_status read_specials(vocab *v) {
    v->bos = v->spm ? 1 : 11, v->eos = v->spm ? 2 : 11, v->unk = v->spm ? 0 : -1;
    v->eot = v->eom = v->pad = -1;
    if (v->bos >= v->n) v->bos = -1;
    if (v->eos >= v->n) v->eos = -1;
    struct { const char *key; int32_t *id; } keys[] = {
        {"tokenizer.ggml.bos_token_id", &v->bos}, {"tokenizer.ggml.eos_token_id", &v->eos},
        {"tokenizer.ggml.eot_token_id", &v->eot}, {"tokenizer.ggml.eom_token_id", &v->eom},
        {"tokenizer.ggml.unknown_token_id", &v->unk}, {"tokenizer.ggml.padding_token_id", &v->pad}};
    kiln_status st = KILN_OK;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0] && !st; k++) st = id_key(v, keys[k].key, keys[k].id, NULL);
    v->add_bos = v->spm || pres[v->pre].add_bos;
    v->add_eos = false;
    v->add_space_prefix = v->spm;
    if (!st) st = bool_key(v, "tokenizer.ggml.add_bos_token", &v->add_bos);
    if (!st) st = bool_key(v, "tokenizer.ggml.add_eos_token", &v->add_eos);
    if (!st) st = bool_key(v, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
    if (!st && v->add_bos && v->bos < 0)
        st = kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.add_bos_token is true but there is no bos token "
                        "(tokenizer.ggml.bos_token_id)", v->path);
    if (!st && v->add_eos && v->eos < 0)
        st = kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.add_eos_token is true but there is no eos token "
                        "(tokenizer.ggml.eos_token_id)", v->path);
    return st;
}

static kiln_status vocab_read(const kiln_gguf_file *f, vocab *v) {
    memset(v, 0, sizeof *v);
    v->f = f;
    v->path = kiln_gguf_path(f);
    kiln_status st = read_model(v);
    if (!st) st = read_tokens(v);
    if (!st) st = read_specials(v);
    if (st) vocab_free(v);
    return st;
}

/* ---- attributes: which tokens are split out of the text first ---------- */

static bool name_has(const vocab *v, const char *key, const char *const *needles, bool lower) {
    const char *s;
    uint64_t n;
    const kiln_gguf_kv *kv = kiln_gguf_find(v->f, key);
    if (!kv || kv->type != KILN_GGUF_STRING || kiln_gguf_get_str(v->f, key, &s, &n)) return false;
    char *c = strndup(s, n);
    if (!c) return false;
    for (size_t i = 0; lower && c[i]; i++) c[i] = (char)tolower((unsigned char)c[i]);
    bool hit = false;
    for (; *needles && !hit; needles++) hit = strstr(c, *needles) != NULL;
    free(c);
    return hit;
}

static kiln_status need_token(const vocab *v, const char *text, const char *why, int32_t *id) {
    *id = vfind_str(v, text);
    if (*id < 0)
        return kiln_error(KILN_ERR_FORMAT, "%s: %s but there is no token '%s' (llama.cpp fails to load it)", v->path, why, text);
    return KILN_OK;
}

static kiln_status attributes(const vocab *v, uint8_t *attr) {
    for (int64_t i = 0; i < v->n; i++) {
        int32_t t = token_type(v, i);
        attr[i] = t == TT_UNKNOWN ? AT_UNKNOWN : t == TT_CONTROL ? AT_CONTROL : t == TT_USER_DEFINED ? AT_USER : 0;
    }
    /* fill-in-the-middle tokens the file does not name: by text */
    for (size_t k = 0; k < sizeof fims / sizeof fims[0]; k++) {
        int32_t id = -1;
        bool given = false, old = false;
        kiln_status st = id_key(v, fims[k].key, &id, &given);
        if (!st && fims[k].old_key) st = id_key(v, fims[k].old_key, &id, &old);
        if (st) return st;
        if (given || old) continue;
        int n_cand = 0, n_plain = 0;
        int32_t cand = -1;
        for (const char *const *t = fims[k].texts; *t; t++) {
            int32_t j = vfind_str(v, *t);
            if (j < 0) continue;
            n_cand++, cand = j;
            n_plain += !(attr[j] & AT_CONTROL);
        }
        if (n_cand == 1) attr[cand] |= AT_CONTROL;
        else if (n_cand > 1 && n_plain)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: %s is not set and %d tokens have its texts (one not a control token): llama.cpp makes "
                              "whichever it meets first a control token, in the order of its hash map",
                              v->path, fims[k].key, n_cand);
    }
    /* end of generation by text: control tokens */
    for (const char *const *t = eog_texts; *t; t++) {
        int32_t j = vfind_str(v, *t);
        if (j >= 0) attr[j] |= AT_CONTROL;
    }
    /* gpt-oss's, always rendered: user defined */
    static const char *const user[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *t = user; *t; t++) {
        int32_t j = vfind_str(v, *t);
        if (j >= 0) attr[j] = AT_USER;
    }
    /* o200k_harmony, solar-open: <|end|> is not the end there */
    int32_t ret = vfind_str(v, "<|return|>"), call = vfind_str(v, "<|call|>"), calls = vfind_str(v, "<|calls|>");
    int32_t flush = vfind_str(v, "<|flush|>"), end = vfind_str(v, "<|end|>");
    if (end >= 0 && ((ret >= 0 && (call >= 0 || calls >= 0)) || ((call >= 0 || calls >= 0) && flush >= 0))) attr[end] = AT_USER;
    /* Gemma 4, PaddleOCR: </s> is plain text there */
    int32_t tool = vfind_str(v, "<|tool_response>"), s_end = vfind_str(v, "</s>");
    if (tool >= 0 && s_end >= 0) attr[s_end] = 0;
    /* per model name (llama.cpp's per-token attributes) */
    static const char *const jina_pre[] = {"jina-v2-de", "jina-v2-es", "jina-v2-code", NULL};
    static const char *const jina_arch[] = {"nomic-bert-moe", "jina-bert-v3", NULL};
    static const char *const phi3[] = {"phi-3", "phi3", NULL};
    static const char *const mbert[] = {"modern-bert", NULL};
    if (name_has(v, "tokenizer.ggml.pre", jina_pre, false) || name_has(v, "general.architecture", jina_arch, false)) {
        int32_t j = vfind_str(v, "<mask>");
        if (j >= 0) attr[j] |= AT_LSTRIP;
    } else if (name_has(v, "general.name", phi3, true)) { /* spaces after its special tokens are dropped */
        for (int64_t i = 0; i < v->n; i++)
            if (attr[i] & AT_MATCHED) attr[i] |= AT_RSTRIP;
        int32_t j;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        kiln_status st = need_token(v, "</s>", "general.name says Phi-3", &j);
        if (st) return st;
        attr[j] |= AT_RSTRIP;
        for (int k = 0; k < 3; k++) {
            if ((st = need_token(v, keep[k], "general.name says Phi-3", &j))) return st;
            attr[j] &= (uint8_t)~AT_RSTRIP;
        }
    } else if (name_has(v, "general.name", mbert, true)) {
        int32_t j = vfind_str(v, "[MASK]");
        if (j >= 0) attr[j] |= AT_LSTRIP;
    }
    return KILN_OK;
}

/* ---- tokenizer.json ---------------------------------------------------- */

static json_t *jstr(const vocab *v, int32_t id) { return json_stringn(v->s[id], v->l[id]); }

static json_t *added_tokens(const vocab *v, const uint8_t *attr) {
    json_t *a = json_array();
    for (int64_t i = 0; a && i < v->n; i++) {
        if (!(attr[i] & AT_MATCHED)) continue;
        json_t *t = json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content", jstr(v, (int32_t)i),
                              "single_word", 0, "lstrip", (attr[i] & AT_LSTRIP) != 0, "rstrip", (attr[i] & AT_RSTRIP) != 0,
                              "normalized", 0, "special", (attr[i] & (AT_CONTROL | AT_UNKNOWN)) != 0);
        if (!t || json_array_append_new(a, t)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* bos (and eos) around the text when llama.cpp adds them (add_special) */
static json_t *post_processor(const vocab *v) {
    if (!v->add_bos && !v->add_eos) return json_null();
    json_t *single = json_array(), *pair = json_array(), *specials = json_object();
    for (int s = 0; s < 2; s++) {
        if (v->add_bos) json_array_append_new(s ? pair : single, json_pack("{s:{s:o,s:i}}", "SpecialToken", "id", jstr(v, v->bos), "type_id", s));
        json_array_append_new(s ? pair : single, json_pack("{s:{s:s,s:i}}", "Sequence", "id", s ? "B" : "A", "type_id", s));
        if (v->add_eos) json_array_append_new(s ? pair : single, json_pack("{s:{s:o,s:i}}", "SpecialToken", "id", jstr(v, v->eos), "type_id", s));
    }
    int32_t ids[2] = {v->add_bos ? v->bos : -1, v->add_eos ? v->eos : -1};
    for (int k = 0; k < 2; k++)
        if (ids[k] >= 0)
            json_object_setn_new(specials, v->s[ids[k]], v->l[ids[k]],
                                 json_pack("{s:o,s:[I],s:[o]}", "id", jstr(v, ids[k]), "ids", (json_int_t)ids[k], "tokens",
                                           jstr(v, ids[k])));
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair, "special_tokens",
                     specials);
}

static json_t *bytelevel(bool regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", regex);
}

/* gpt2: the merges in file order; llama.cpp splits each at its first space
 * after the first byte */
static kiln_status gpt2_merges(const vocab *v, json_t *merges) {
    const kiln_gguf_kv *kv;
    kiln_status st = kiln_gguf_get_array(v->f, "tokenizer.ggml.merges", KILN_GGUF_STRING, &kv);
    if (st) return st;
    size_t cap = 64;
    while (cap < 2 * kv->n + 2) cap *= 2;
    uint64_t *seen = malloc(cap * sizeof *seen); /* (left << 32 | right) + 1, 0 empty */
    char *cat = NULL;
    size_t cat_cap = 0;
    if (!seen) return kiln_error(KILN_ERR_OOM, "%s: out of memory for the merges", v->path);
    memset(seen, 0, cap * sizeof *seen);
    for (uint64_t i = 0; i < kv->n && !st; i++) {
        const char *s = kv->strs[i];
        size_t n = (size_t)kv->lens[i];
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        int shown = (int)(n > 60 ? 60 : n);
        if (!sp) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] '%.*s' is not two tokens separated by a space",
                            v->path, (unsigned long long)i, shown, s);
            break;
        }
        size_t an = (size_t)(sp - s), bn = n - an - 1;
        if (n > cat_cap) {
            char *p = realloc(cat, n);
            if (!p) {
                st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
                break;
            }
            cat = p, cat_cap = n;
        }
        memcpy(cat, s, an);
        memcpy(cat + an, sp + 1, bn);
        int32_t a = vfind(v, s, an), b = vfind(v, sp + 1, bn), c = vfind(v, cat, an + bn);
        if (a < 0 || b < 0 || c < 0) {
            st = kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] '%.*s' names no token: '%.*s' is not in "
                            "tokenizer.ggml.tokens", v->path, (unsigned long long)i, shown, s,
                            a < 0 ? (int)(an > 60 ? 60 : an) : b < 0 ? (int)(bn > 60 ? 60 : bn) : (int)(an + bn > 60 ? 60 : an + bn),
                            a < 0 ? s : b < 0 ? sp + 1 : cat);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
        size_t h = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
        while (seen[h] && seen[h] != key) h = (h + 1) & (cap - 1);
        if (seen[h]) continue; /* llama.cpp keeps a pair's first rank */
        seen[h] = key;
        json_t *m = json_pack("[o,o]", jstr(v, a), jstr(v, b));
        if (!m || json_array_append_new(merges, m)) st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
    }
    free(seen);
    free(cat);
    return st;
}

typedef struct {
    int32_t a, b, t, k;
    float score;
} spm_merge;

static int cmp_merge(const void *x, const void *y) {
    const spm_merge *p = x, *q = y;
    if (p->score != q->score) return p->score > q->score ? -1 : 1;
    if (p->t != q->t) return p->t < q->t ? -1 : 1;
    return (p->k > q->k) - (p->k < q->k);
}

/* llama: every split of a token into two tokens is a merge, ranked by the
 * token's score (equal scores: one rank) */
static kiln_status spm_merges(const vocab *v, const uint8_t *attr, json_t *merges, json_t *ranks) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (vfind_str(v, name) < 0)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: tokenizer.ggml.tokens has no '%s': kiln reads SentencePiece vocabularies with all 256 "
                              "byte tokens (llama.cpp falls back to them for text outside the vocabulary)",
                              v->path, name);
    }
    for (int64_t i = 0; i < v->n; i++) {
        float s = token_score(v, i);
        if (isnan(s)) return kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.scores[%lld] is NaN", v->path, (long long)i);
    }
    size_t n = 0, cap = (size_t)v->n + 16;
    spm_merge *m = malloc(cap * sizeof *m);
    if (!m) return kiln_error(KILN_ERR_OOM, "%s: out of memory for the merges", v->path);
    kiln_status st = KILN_OK;
    for (int64_t i = 0; i < v->n && !st; i++) {
        const char *s = v->s[i];
        size_t l = v->l[i];
        for (size_t k = char_len(s, l); k < l && !st; k += char_len(s + k, l - k)) {
            int32_t a = vfind(v, s, k), b = vfind(v, s + k, l - k);
            if (a >= 0 && b >= 0) {
                if (n == cap) {
                    spm_merge *p = realloc(m, 2 * cap * sizeof *m);
                    if (!p) {
                        st = kiln_error(KILN_ERR_OOM, "%s: out of memory for the merges", v->path);
                        break;
                    }
                    m = p, cap *= 2;
                }
                m[n++] = (spm_merge){a, b, (int32_t)i, (int32_t)k, token_score(v, i)};
                continue;
            }
            /* a character with no token of its own stays a symbol in
             * llama.cpp and can still merge; kiln's BPE turns it into bytes
             * first. Tokens split out of the text first never meet this. */
            bool a_char = a >= 0 || char_len(s, k) == k, b_char = b >= 0 || char_len(s + k, l - k) == l - k;
            if (a_char && b_char && !(attr[i] & AT_MATCHED))
                st = kiln_error(KILN_ERR_UNSUPPORTED,
                                "%s: token %lld '%.*s' merges from '%.*s' and '%.*s', where '%.*s' is no token: llama.cpp "
                                "merges such a character, kiln's BPE falls back to its bytes first",
                                v->path, (long long)i, (int)(l > 40 ? 40 : l), s, (int)k, s, (int)(l - k), s + k,
                                a < 0 ? (int)k : (int)(l - k), a < 0 ? s : s + k);
        }
    }
    if (!st) qsort(m, n, sizeof *m, cmp_merge);
    json_int_t rank = 0;
    for (size_t i = 0; i < n && !st; i++) {
        if (i && m[i].score != m[i - 1].score) rank++;
        json_t *p = json_pack("[o,o]", jstr(v, m[i].a), jstr(v, m[i].b));
        if (!p || json_array_append_new(merges, p) || json_array_append_new(ranks, json_integer(rank)))
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
    }
    free(m);
    return st;
}

static kiln_status build_json(const vocab *v, const uint8_t *attr, json_t **out) {
    *out = NULL;
    json_t *vocab_o = json_object(), *merges = json_array(), *ranks = v->spm ? json_array() : NULL;
    kiln_status st = vocab_o && merges && (ranks || !v->spm) ? KILN_OK : kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
    for (int64_t i = 0; i < v->n && !st; i++)
        if (json_object_setn_new(vocab_o, v->s[i], v->l[i], json_integer(i)))
            st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
    if (!st) st = v->spm ? spm_merges(v, attr, merges, ranks) : gpt2_merges(v, merges);
    json_t *added = st ? NULL : added_tokens(v, attr);
    if (!st && !added) st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
    if (st) {
        json_decref(vocab_o), json_decref(merges), json_decref(ranks), json_decref(added);
        return st;
    }
    json_t *model, *norm, *pre, *dec;
    const char *ws = "\xe2\x96\x81"; /* U+2581 */
    if (v->spm) {
        model = json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o, s:o}", "type", "BPE", "dropout", "unk_token",
                          v->unk >= 0 ? jstr(v, v->unk) : json_null(), "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1,
                          "byte_fallback", 1, "ignore_merges", 0, "vocab", vocab_o, "merges", merges, "kiln_merge_ranks", ranks);
        json_t *replace = json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ", "content", ws);
        norm = v->add_space_prefix
                   ? json_pack("{s:s, s:[{s:s, s:s}, o]}", "type", "Sequence", "normalizers", "type", "Prepend", "prepend", ws, replace)
                   : replace;
        pre = json_null();
        json_t *decs = json_pack("[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}]", "type", "Replace", "pattern", "String", ws, "content",
                                 " ", "type", "ByteFallback", "type", "Fuse");
        if (v->add_space_prefix) json_array_append_new(decs, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0));
        dec = json_pack("{s:s, s:o}", "type", "Sequence", "decoders", decs);
    } else {
        model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout", "unk_token",
                          "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges",
                          pres[v->pre].ignore_merges, "vocab", vocab_o, "merges", merges);
        norm = json_null();
        pre = pres[v->pre].regex ? json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type",
                                             "Split", "pattern", "Regex", pres[v->pre].regex, "behavior", "Isolated", "invert",
                                             0, bytelevel(false))
                                 : bytelevel(true);
        dec = bytelevel(true);
    }
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                             "added_tokens", added, "normalizer", norm, "pre_tokenizer", pre, "post_processor", post_processor(v),
                             "decoder", dec, "model", model);
    if (!root) return kiln_error(KILN_ERR_OOM, "%s: out of memory building its tokenizer.json", v->path);
    *out = root;
    return KILN_OK;
}

kiln_status kiln_gguf_tokenizer(const kiln_gguf_file *f, kiln_tokenizer **out) {
    *out = NULL;
    vocab v;
    kiln_status st = vocab_read(f, &v);
    if (st) return st;
    uint8_t *attr = calloc((size_t)v.n, 1);
    json_t *root = NULL;
    if (!attr) st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v.path);
    if (!st) st = attributes(&v, attr);
    if (!st) st = build_json(&v, attr, &root);
    free(attr);
    char *text = NULL;
    if (!st && !(text = json_dumps(root, JSON_COMPACT)))
        st = kiln_error(KILN_ERR_OOM, "%s: out of memory writing its tokenizer.json", v.path);
    json_decref(root);
    if (!st) {
        char source[4200];
        snprintf(source, sizeof source, "%s (its tokenizer.ggml.* as tokenizer.json)", v.path);
        st = kiln_tokenizer_parse(text, strlen(text), source, out);
    }
    free(text);
    vocab_free(&v);
    return st;
}

/* ---- model metadata ---------------------------------------------------- */

static kiln_status dup_token(const vocab *v, int32_t id, char **out) {
    *out = NULL;
    if (id < 0) return KILN_OK;
    if (!(*out = strndup(v->s[id], v->l[id]))) return kiln_error(KILN_ERR_OOM, "%s: out of memory", v->path);
    return KILN_OK;
}

kiln_status kiln_gguf_model_meta(const kiln_gguf_file *f, const kiln_tokenizer *tok, kiln_model_meta *out) {
    if (!f || !out) return kiln_error(KILN_ERR_INVALID, "kiln_gguf_model_meta: NULL argument");
    vocab v;
    kiln_status st = vocab_read(f, &v);
    if (st) return st;
    kiln_model_meta m = {.bos_id = v.bos, .pad_id = v.pad, .has_add_bos = true, .add_bos = v.add_bos};
    if (tok && kiln_tokenizer_vocab_size(tok) != v.n)
        st = kiln_error(KILN_ERR_INVALID, "%s: the tokenizer given has %d tokens, tokenizer.ggml.tokens %lld", v.path,
                        kiln_tokenizer_vocab_size(tok), (long long)v.n);
    /* eos, then eom and eot: kiln export's order for Llama 3.1's
     * [<|end_of_text|>, <|eom_id|>, <|eot_id|>] */
    int32_t ends[3] = {v.eos, v.eom, v.eot};
    for (int i = 0; i < 3 && !st; i++)
        if (ends[i] >= 0 && !kiln_model_meta_is_eos(&m, ends[i])) m.eos_ids[m.n_eos++] = ends[i];
    if (!st) st = dup_token(&v, m.bos_id, &m.bos_token);
    if (!st) st = dup_token(&v, m.n_eos ? m.eos_ids[0] : -1, &m.eos_token);
    if (!st) st = dup_token(&v, m.pad_id, &m.pad_token);
    if (!st && kiln_gguf_find(f, "tokenizer.chat_template")) {
        const char *s;
        uint64_t n;
        st = kiln_gguf_get_str(f, "tokenizer.chat_template", &s, &n);
        if (!st && memchr(s, 0, n)) st = kiln_error(KILN_ERR_FORMAT, "%s: tokenizer.chat_template holds a NUL byte", v.path);
        if (!st && !(m.chat_template = strndup(s, n))) st = kiln_error(KILN_ERR_OOM, "%s: out of memory", v.path);
    }
    vocab_free(&v);
    if (st) {
        kiln_model_meta_free(&m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

static bool gguf_name(const char *p) {
    size_t n = p ? strlen(p) : 0;
    return n > 5 && !strcasecmp(p + n - 5, ".gguf");
}

kiln_status kiln_tokenizer_open_any(const char *path, kiln_tokenizer **out) {
    if (!gguf_name(path)) return kiln_tokenizer_load(path, out);
    kiln_gguf_file *f = NULL;
    kiln_status st = kiln_gguf_open(path, &f);
    if (!st) st = kiln_gguf_tokenizer(f, out);
    kiln_gguf_close(f);
    return st;
}

kiln_status kiln_model_meta_open_any(const char *dir_or_gguf, const kiln_tokenizer *tok, kiln_model_meta *out) {
    if (!gguf_name(dir_or_gguf)) return kiln_model_meta_load(dir_or_gguf, tok, out);
    kiln_gguf_file *f = NULL;
    kiln_status st = kiln_gguf_open(dir_or_gguf, &f);
    if (!st) st = kiln_gguf_model_meta(f, tok, out);
    kiln_gguf_close(f);
    return st;
}
