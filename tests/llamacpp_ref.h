/* What the GGUF tests (test_gguf_llama, test_gguf_families, test_gguf_eos)
 * share to compare kiln with a real llama.cpp: kiln's side (greedy
 * continuations, -log p on a window, the top-2 logit gap where a
 * continuation parts, weights rounded as a file stores them) and
 * llama.cpp's (a job run by tests/node/gguf_llama.mjs on node-llama-cpp's
 * prebuilt CPU binary, one JSON result per model; metadata read back with
 * llama.cpp's gguf reader, ggml_ref.h). Header-only: static inline, each
 * test uses what it needs. Include after test.h, cli_run.h and
 * kiln/train.h. */
#ifndef KILN_TEST_LLAMACPP_REF_H
#define KILN_TEST_LLAMACPP_REF_H
#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>
#include "ggml_ref.h"

/* The GGUF tests' paths are a short mkdtemp directory plus a file name
 * (gcc cannot see that they fit); clang has no such warning. In a
 * SANITIZED build (test.h) the node comparisons are skipped as too slow. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* node and node-llama-cpp installed (why says what is missing when not);
 * script gets the path of tests/node/gguf_llama.mjs */
static inline bool llref_available(char *script, size_t n_script, char *why, size_t n_why) {
    char mod[1300];
    snprintf(script, n_script, "%s/tests/node/gguf_llama.mjs", cli_root);
    snprintf(mod, sizeof mod, "%s/tests/node/node_modules/node-llama-cpp/package.json", cli_root);
    if (system("command -v node >/dev/null 2>&1") == 0 && access(mod, R_OK) == 0) return true;
    snprintf(why, n_why, "needs node and %s (scripts/deps.sh --test installs them)", mod);
    return false;
}

/* kiln's greedy continuation of [bos +] prompt: seq gets the prompt
 * (*n_prompt ids) then up to n_predict generated ids (returned count),
 * stopping at the tokenizer's eos */
static inline int llref_greedy(kiln_llama *m, const kiln_tokenizer *tok, const char *prompt, int n_predict, int32_t *seq,
                               int *n_prompt) {
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n));
    int k = 0;
    if (kiln_tokenizer_bos(tok) >= 0) seq[k++] = kiln_tokenizer_bos(tok);
    memcpy(seq + k, ids, n * sizeof *ids);
    k += (int)n;
    free(ids);
    kiln_sample_config sc = {.max_tokens = n_predict, .temperature = 0, .top_p = 1, .stop_id = kiln_tokenizer_eos(tok)};
    int n_out = 0;
    CHECK_OK(kiln_generate(m, seq, k, &sc, seq + k, &n_out, NULL, NULL));
    *n_prompt = k;
    return n_out;
}

/* the gap between the two largest logits after seq[0..n) */
static inline double llref_top2_gap(kiln_llama *m, const int32_t *seq, int n) {
    int64_t s[2] = {1, n};
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, s);
    memcpy(t->data, seq, (size_t)n * sizeof *seq);
    kiln_tensor *lg = kiln_llama_forward(m, t, NULL, NULL);
    kiln_tensor_release(t);
    if (!lg) return -1;
    int64_t V = m->cfg.vocab_size;
    const float *row = kiln_f32(lg) + (int64_t)(n - 1) * V;
    double a = -1e30, b = -1e30;
    for (int64_t i = 0; i < V; i++)
        if (row[i] > a) b = a, a = row[i];
        else if (row[i] > b) b = row[i];
    kiln_tensor_release(lg);
    return a - b;
}

/* kiln's -log p(w[i+1] | w[..i]) for every position of the window */
static inline void llref_nll(kiln_llama *m, const int32_t *w, int n, double *nll) {
    int64_t s[2] = {1, n - 1};
    kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, s);
    memcpy(t->data, w, (size_t)(n - 1) * sizeof *w);
    kiln_tensor *lg = kiln_llama_forward(m, t, NULL, NULL);
    kiln_tensor_release(t);
    int64_t V = m->cfg.vocab_size;
    for (int i = 0; lg && i < n - 1; i++) {
        const float *row = kiln_f32(lg) + (int64_t)i * V;
        double mx = row[0], z = 0;
        for (int64_t j = 1; j < V; j++) mx = fmax(mx, row[j]);
        for (int64_t j = 0; j < V; j++) z += exp(row[j] - mx);
        nll[i] = mx + log(z) - row[w[i + 1]];
    }
    kiln_tensor_release(lg);
}

/* matrices rounded as the file stores them (type 1: f16, 2: bf16; norms
 * and other 1-D tensors stay f32) */
static inline void llref_round(kiln_llama *m, int type) {
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        if (p->ndim < 2) continue;
        float *x = kiln_f32(p);
        for (int64_t j = 0; j < kiln_tensor_numel(p); j++)
            x[j] = type == 1 ? kiln_f16_to_f32(kiln_f32_to_f16(x[j])) : kiln_bf16_to_f32(kiln_f32_to_bf16(x[j]));
    }
}

static inline bool llref_ids_equal(json_t *arr, const int32_t *ids, size_t n) {
    if (!json_is_array(arr) || json_array_size(arr) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != ids[i]) return false;
    return true;
}

static inline void llref_print_ids(const char *what, json_t *arr, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s llama.cpp:", what);
    for (size_t i = 0; i < json_array_size(arr); i++) fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(arr, i)));
    fprintf(stderr, "\n  %s kiln:     ", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* A job for gguf_llama.mjs: the prompts it tokenizes, the prompts it
 * continues greedily for n_predict tokens, one thread; the caller adds
 * "models" (and "ppl_tokens"). */
static inline json_t *llref_job(const char *const *prompts, int n_prompts, const char *const *greedy, int n_greedy, int n_predict) {
    json_t *job = json_object(), *ps = json_array(), *gs = json_array();
    for (int i = 0; i < n_prompts; i++) json_array_append_new(ps, json_string(prompts[i]));
    for (int i = 0; i < n_greedy; i++) json_array_append_new(gs, json_string(greedy[i]));
    json_object_set_new(job, "prompts", ps);
    json_object_set_new(job, "greedy_prompts", gs);
    json_object_set_new(job, "n_predict", json_integer(n_predict));
    json_object_set_new(job, "threads", json_integer(1));
    return job;
}

/* Writes job (consumed) to job_path, runs it and returns llama.cpp's
 * results, one object per model, which must number n_models. */
static inline json_t *llref_run(const char *script, const char *job_path, json_t *job, size_t n_models) {
    json_dump_file(job, job_path, 0);
    json_decref(job);
    int rc = cli_exec((const char *[]){"node", script, job_path, NULL});
    char *text = cli_output();
    CHECK(rc == 0, "node %s exited %d:\n%s", script, rc, text);
    json_t *res = json_array();
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] != '{') continue;
        json_error_t e;
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &e); /* a continuation may hold byte 0 */
        CHECK(o != NULL, "node-llama-cpp printed a line that is not JSON (%s): %.200s", e.text, line);
        if (o) json_array_append_new(res, o);
    }
    free(text);
    CHECK(json_array_size(res) == n_models, "%zu results from node-llama-cpp", json_array_size(res));
    return res;
}

/* a u32 / string metadata value as llama.cpp's gguf reader has it
 * (0xffffffff / "" when absent or of another type) */
static inline uint32_t llref_u32(const ggml_ref *G, struct gguf_context *g, const char *key) {
    int64_t id = G->find_key(g, key);
    uint32_t v = 0xffffffffu;
    if (id >= 0 && G->get_kv_type(g, id) == 4) memcpy(&v, G->get_val_data(g, id), 4);
    return v;
}

static inline const char *llref_str(const ggml_ref *G, struct gguf_context *g, const char *key) {
    int64_t id = G->find_key(g, key);
    return id >= 0 && G->get_kv_type(g, id) == 8 ? G->get_val_str(g, id) : "";
}
/* 400 KB of the KJV at a paragraph boundary (scripts/corpus.sh), or
 * (without bible-kjv) a made-up corpus of the same words */
static inline void llref_make_corpus(const char *path) {
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "command -v bible >/dev/null 2>&1 && bash %s/scripts/corpus.sh %s.full", cli_root, path);
    char full[600], *text = NULL;
    size_t n = 0;
    snprintf(full, sizeof full, "%s.full", path);
    if (system(cmd) == 0 && !kiln_read_file(full, &text, &n)) {
        size_t cut = n < 400000 ? n : 400000;
        while (cut < n && !(text[cut - 1] == '\n' && text[cut] == '\n')) cut++;
        CHECK_OK(kiln_write_file_atomic(path, text, cut));
        free(text);
        return;
    }
    printf("bible-kjv not installed: training on a made-up corpus instead\n");
    static const char *w[] = {"the", "lord", "said", "unto", "moses", "and", "he", "went", "up", "into", "mountain", "of", "god"};
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 60000; i++) fprintf(f, "%s%s", w[kiln_rng_u64(5, (uint64_t)i) % 13], i % 97 == 96 ? ".\n\n" : " ");
    fclose(f);
}

/* kiln's own byte-level BPE tokenizer (vocabulary 512) trained on
 * made-up words of 16 letters, saved to path */
static inline void llref_words_tokenizer(const char *path) {
    static char text[60000];
    size_t len = 0;
    for (uint64_t i = 0; len + 16 < sizeof text; i++) {
        int wl = 1 + (int)(kiln_rng_u64(9, 2 * i) % 7);
        for (int c = 0; c < wl; c++) text[len++] = (char)('a' + kiln_rng_u64(9, 1000003 * i + (uint64_t)c) % 16);
        text[len++] = i % 13 == 12 ? '\n' : ' ';
    }
    kiln_tokenizer *tk = NULL;
    CHECK_OK(kiln_tokenizer_train_text(text, len, 512, &tk));
    if (tk) CHECK_OK(kiln_tokenizer_save(tk, path));
    kiln_tokenizer_free(tk);
}

/* ---- llama.cpp's quantizer: llama_model_quantize of node-llama-cpp's
 * libllama, its parameters laid out as the llama.h of that version ---- */
enum llref_ftype {
    LLAMA_FTYPE_ALL_F32 = 0,
    LLAMA_FTYPE_MOSTLY_F16 = 1,
    LLAMA_FTYPE_MOSTLY_Q4_0 = 2,
    LLAMA_FTYPE_MOSTLY_Q8_0 = 7,
    LLAMA_FTYPE_MOSTLY_Q4_K_S = 14,
    LLAMA_FTYPE_MOSTLY_Q4_K_M = 15,
    LLAMA_FTYPE_MOSTLY_Q5_K_S = 16,
    LLAMA_FTYPE_MOSTLY_Q5_K_M = 17,
    LLAMA_FTYPE_MOSTLY_Q6_K = 18,
};
enum llref_ggml_type { GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_COUNT = 43 };
struct llama_model_imatrix_data;
struct llama_model_kv_override;
struct llama_model_tensor_override;
typedef struct llama_model_quantize_params {
    int32_t nthread;
    enum llref_ftype ftype;
    enum llref_ggml_type output_tensor_type;
    enum llref_ggml_type token_embedding_type;
    bool allow_requantize;
    bool quantize_output_tensor;
    bool only_copy;
    bool pure;
    bool keep_split;
    bool dry_run;
    const struct llama_model_imatrix_data *imatrix;
    const struct llama_model_kv_override *kv_overrides;
    const struct llama_model_tensor_override *tt_overrides;
    const int32_t *prune_layers;
    size_t max_buf_size;
} llama_model_quantize_params;

static struct {
    void *lib, *ggml;
    llama_model_quantize_params (*default_params)(void);
    uint32_t (*quantize)(const char *, const char *, const llama_model_quantize_params *);
    void (*backend_init)(void);
    void (*log_set)(void (*)(int, const char *, void *), void *);
    char log[8192]; /* llama.cpp's log, the last 8 KB, for a failure's message */
} llref_q;

static inline void llref_on_log(int level, const char *text, void *user) {
    (void)level, (void)user;
    size_t n = strlen(llref_q.log), k = strlen(text);
    if (n + k >= sizeof llref_q.log) n = 0;
    memcpy(llref_q.log + n, text, k + 1 < sizeof llref_q.log ? k + 1 : 0);
}
static inline const char *llref_quant_log(void) { return llref_q.log; }

/* dlopens libllama (once); false with the reason in why when absent */
static inline bool llref_quant_load(char *why, size_t n) {
    if (llref_q.lib) return true;
    char bins[1200], path[1300];
    ggml_ref_bin_dir(bins, sizeof bins);
    snprintf(path, sizeof path, "%s/libllama.v0.4.0.so", bins);
    if (access(path, R_OK) != 0) {
        snprintf(why, n, "%s not found (scripts/deps.sh --test installs node-llama-cpp)", path);
        return false;
    }
    llref_q.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!llref_q.lib) {
        snprintf(why, n, "dlopen %s: %s", path, dlerror());
        return false;
    }
    *(void **)&llref_q.default_params = dlsym(llref_q.lib, "llama_model_quantize_default_params");
    *(void **)&llref_q.quantize = dlsym(llref_q.lib, "llama_model_quantize");
    *(void **)&llref_q.backend_init = dlsym(llref_q.lib, "llama_backend_init");
    *(void **)&llref_q.log_set = dlsym(llref_q.lib, "llama_log_set");
    if (!llref_q.default_params || !llref_q.quantize || !llref_q.backend_init || !llref_q.log_set) {
        snprintf(why, n, "%s lacks llama_model_quantize and friends", path);
        return false;
    }
    /* the CPU backend, which node-llama-cpp's binary loads from its folder */
    snprintf(path, sizeof path, "%s/libggml.v0.4.0.so", bins);
    llref_q.ggml = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void (*load_all)(const char *) =
        llref_q.ggml ? (void (*)(const char *))dlsym(llref_q.ggml, "ggml_backend_load_all_from_path") : NULL;
    llref_q.log_set(llref_on_log, NULL);
    llref_q.backend_init();
    if (load_all) load_all(bins);
    return true;
}

/* llama.cpp quantizes in to out as ftype (no importance matrix, one thread) */
static inline bool llref_quantize(const char *in, const char *out, int ftype) {
    llama_model_quantize_params p = llref_q.default_params();
    p.nthread = 1;
    p.ftype = (enum llref_ftype)ftype;
    llref_q.log[0] = 0;
    return llref_q.quantize(in, out, &p) == 0;
}
#endif
