/* `kiln export --gguf` checked by a real llama.cpp (node-llama-cpp's
 * prebuilt CPU binary, through tests/node/gguf_llama.mjs): a model trained
 * here on 400 KB of the King James Bible (150 steps, a few seconds) and a
 * random model with tied embeddings are exported as F32, F16, BF16 and
 * Q8_0; llama.cpp must load each, tokenize prompts to kiln's ids, continue
 * prompts greedily with kiln's tokens (F32: the same as `kiln generate
 * --temperature 0`; F16/BF16: the same as kiln running the rounded weights
 * the file holds), give the perplexity kiln computes on validation text
 * (F32), and Q8_0 within 1% of F32's. The metadata is read back with
 * llama.cpp's gguf reader. Skips with one line when node or node-llama-cpp
 * is missing. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"
#include "llamacpp_ref.h"


#define N_PREDICT 32
static char script[1200], dir[256];
static ggml_ref G;
static bool have_ref;
static const char *types[4] = {"f32", "f16", "bf16", "q8_0"};
static const char *chat_template =
    "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|eos|>{% endfor %}";

static void write_text(const char *path, const char *s) { CHECK_OK(kiln_write_file_atomic(path, s, strlen(s))); }

static const char *prompts[] = {
    "And God said",
    "In the beginning God created the heaven and the earth.",
    "  two  spaces,\tand a tab;\n\nnew lines\n and 12345 digits, 3.14, (brackets) [x] {y} - \"quotes\" 'n' don't we'll I'm",
    "trailing spaces   ",
    "Ünïcode lëtters: café, naïve, Zürich",
};
static const char *greedy_prompts[] = {"And God said", "In the beginning", "And the king said unto", "Blessed are"};
#define N_PROMPTS 5
#define N_GREEDY 4

/* kiln's perplexity on the window w[0..n) (w[0] = bos) */
static double kiln_ppl(kiln_llama *m, const int32_t *w, int n) {
    int64_t s[2] = {1, n - 1};
    kiln_tensor *ids = kiln_tensor_new(KILN_I32, 2, s), *tg = kiln_tensor_new(KILN_I32, 2, s);
    memcpy(ids->data, w, (size_t)(n - 1) * sizeof *w);
    memcpy(tg->data, w + 1, (size_t)(n - 1) * sizeof *w);
    kiln_tensor *loss = kiln_ce_loss(m, ids, tg, NULL, NULL);
    double ppl = loss ? exp(kiln_f32(loss)[0] / (n - 1)) : -1;
    kiln_tensor_release(loss), kiln_tensor_release(ids), kiln_tensor_release(tg);
    return ppl;
}

static void check_metadata(const char *path, const kiln_llama_config *c, int type, const char *tmpl) {
    if (!have_ref) return;
    struct gguf_context *g = ggml_ref_open(&G, path);
    CHECK(g != NULL, "llama.cpp's gguf reader refused %s", path);
    if (!g) return;
    struct { const char *k; int type; int64_t want; } u[] = {
        {"llama.context_length", 4, c->max_position_embeddings}, {"llama.embedding_length", 4, c->hidden_size},
        {"llama.block_count", 4, c->num_hidden_layers}, {"llama.feed_forward_length", 4, c->intermediate_size},
        {"llama.attention.head_count", 4, c->num_attention_heads}, {"llama.attention.head_count_kv", 4, c->num_key_value_heads},
        {"llama.rope.dimension_count", 4, c->head_dim}, {"llama.vocab_size", 4, c->vocab_size},
        {"general.file_type", 4, type == 0 ? 0 : type == 1 ? 1 : type == 2 ? 32 : 7},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        int64_t id = G.find_key(g, u[i].k);
        uint32_t v = 0;
        if (id >= 0 && G.get_kv_type(g, id) == 4) memcpy(&v, G.get_val_data(g, id), 4);
        CHECK(id >= 0 && G.get_kv_type(g, id) == 4 && v == u[i].want, "%s: %s is %u, want %lld", path, u[i].k, v,
              (long long)u[i].want);
    }
    const char *fk[] = {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"};
    double fw[] = {c->rope_theta, c->rms_norm_eps};
    for (int i = 0; i < 2; i++) {
        int64_t id = G.find_key(g, fk[i]);
        float v = 0;
        if (id >= 0 && G.get_kv_type(g, id) == 6) memcpy(&v, G.get_val_data(g, id), 4);
        CHECK(v == (float)fw[i], "%s = %g, want %g", fk[i], v, fw[i]);
    }
    int64_t id = G.find_key(g, "general.architecture");
    CHECK(id >= 0 && !strcmp(G.get_val_str(g, id), "llama"), "general.architecture");
    id = G.find_key(g, "tokenizer.ggml.model");
    CHECK(id >= 0 && !strcmp(G.get_val_str(g, id), "gpt2"), "tokenizer.ggml.model");
    id = G.find_key(g, "tokenizer.ggml.tokens");
    CHECK(id >= 0 && G.get_arr_type(g, id) == 8 && (int64_t)G.get_arr_n(g, id) == c->vocab_size, "tokenizer.ggml.tokens");
    id = G.find_key(g, "tokenizer.ggml.token_type");
    CHECK(id >= 0 && G.get_arr_type(g, id) == 5 && (int64_t)G.get_arr_n(g, id) == c->vocab_size, "token_type");
    if (id >= 0 && G.get_arr_n(g, id) > 3) {
        const int32_t *tt = G.get_arr_data(g, id);
        CHECK(tt[0] == 3 && tt[1] == 3 && tt[2] == 3 && tt[3] == 1, "token types %d %d %d %d: specials control, bytes normal",
              tt[0], tt[1], tt[2], tt[3]);
    }
    id = G.find_key(g, "tokenizer.ggml.merges");
    CHECK(id >= 0 && G.get_arr_type(g, id) == 8 && G.get_arr_n(g, id) > 0, "tokenizer.ggml.merges");
    const char *ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"};
    for (uint32_t i = 0; i < 3; i++) {
        id = G.find_key(g, ids[i]);
        uint32_t v = 99;
        if (id >= 0 && G.get_kv_type(g, id) == 4) memcpy(&v, G.get_val_data(g, id), 4);
        CHECK(v == i, "%s = %u, want %u", ids[i], v, i);
    }
    id = G.find_key(g, "tokenizer.ggml.add_bos_token");
    CHECK(id >= 0 && G.get_kv_type(g, id) == 7 && *(const uint8_t *)G.get_val_data(g, id) == 1, "add_bos_token");
    id = G.find_key(g, "tokenizer.chat_template");
    CHECK((id >= 0) == (tmpl != NULL), "tokenizer.chat_template present iff tokenizer_config.json has one");
    if (id >= 0 && tmpl) CHECK(!strcmp(G.get_val_str(g, id), tmpl), "chat template '%s'", G.get_val_str(g, id));
    /* norms F32, matrices in the requested type */
    int want = type == 0 ? 0 : type == 1 ? 1 : type == 2 ? 30 : 8, bad = 0;
    for (int64_t i = 0; i < G.get_n_tensors(g); i++) {
        bool norm = strstr(G.get_tensor_name(g, i), "norm") != NULL;
        bad += G.get_tensor_type(g, i) != (norm ? 0 : want);
    }
    CHECK(bad == 0, "%s: %d tensors of the wrong type", path, bad);
    int64_t n_t = 2 + 9 * c->num_hidden_layers + !c->tie_word_embeddings;
    CHECK(G.get_n_tensors(g) == n_t, "%lld tensors, want %lld", (long long)G.get_n_tensors(g), (long long)n_t);
    CHECK((G.find_tensor(g, "output.weight") >= 0) == !c->tie_word_embeddings, "output.weight present iff untied");
    G.free(g);
}

static json_t *run_llama(const char *tag, const int32_t *w, int nw) {
    json_t *job = llref_job(prompts, N_PROMPTS, greedy_prompts, N_GREEDY, N_PREDICT), *ms = json_array(), *wt = json_array();
    for (int i = 0; i < nw; i++) json_array_append_new(wt, json_integer(w[i]));
    /* every type with an f32 key/value cache and plain attention, then f32
     * once more with llama.cpp's defaults (f16 cache, flash attention) */
    for (int t = 0; t < 5; t++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s-%s.gguf", dir, tag, types[t % 4]);
        json_array_append_new(ms, json_pack("{s:s, s:b}", "path", p, "defaults", t == 4));
    }
    json_object_set_new(job, "models", ms);
    json_object_set_new(job, "ppl_tokens", wt);
    char jp[600];
    snprintf(jp, sizeof jp, "%s/job-%s.json", dir, tag);
    return llref_run(script, jp, job, 5);
}

/* Exports the model of `mdir` as every type and compares llama.cpp with kiln. */
static void check_model(const char *mdir, const char *tag) {
    kiln_llama *m = NULL;
    kiln_tokenizer *tok = NULL;
    char tp[600], out[600];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", mdir);
    CHECK_OK(kiln_load_model_dir(mdir, &m));
    CHECK_OK(kiln_tokenizer_load(tp, &tok));
    if (!m || !tok) return;
    for (int t = 0; t < 4; t++) {
        snprintf(out, sizeof out, "%s/%s-%s.gguf", dir, tag, types[t]);
        int rc = cli_exec((const char *[]){cli_kiln, "export", mdir, "--gguf", out, "--type", types[t], NULL});
        char *o = cli_output();
        CHECK(rc == 0 && strstr(o, "GGUF v3"), "kiln export %s --type %s: rc %d\n%s", mdir, types[t], rc, o);
        if (t == 0) printf("%s", o);
        free(o);
        check_metadata(out, &m->cfg, t, strcmp(tag, "random") ? NULL : chat_template);
    }
    /* a validation window: bos + the first tokens of val.bin (or of the
     * corpus text when there is none) */
    enum { NW = 200 };
    int32_t w[NW];
    int nw = 0;
    char vp[600];
    snprintf(vp, sizeof vp, "%s/data/val.bin", dir);
    kiln_shard *sh = NULL;
    CHECK_OK(kiln_shard_open(vp, &sh));
    w[nw++] = kiln_tokenizer_bos(tok);
    for (uint64_t i = 0; sh && nw < NW && i < kiln_shard_get_info(sh)->count; i++) w[nw++] = (int32_t)kiln_shard_token(sh, i);
    kiln_shard_close(sh);
    double ppl_kiln = kiln_ppl(m, w, nw);

    json_t *res = run_llama(tag, w, nw);
    /* kiln's reference for each type: the f32 model, and the same with its
     * matrices rounded to f16 / bf16 as the files hold them */
    kiln_llama *ref_m[3] = {m, NULL, NULL};
    static int32_t seq[3][N_GREEDY][256];
    static double nll_ref[3][NW];
    int np[3][N_GREEDY], ng[3][N_GREEDY];
    for (int t = 0; t < 3; t++) {
        if (t > 0) {
            CHECK_OK(kiln_load_model_dir(mdir, &ref_m[t]));
            if (!ref_m[t]) return;
            llref_round(ref_m[t], t);
        }
        for (int g = 0; g < N_GREEDY; g++) ng[t][g] = llref_greedy(ref_m[t], tok, greedy_prompts[g], N_PREDICT, seq[t][g], &np[t][g]);
        llref_nll(ref_m[t], w, nw, nll_ref[t]);
    }
    bool trained = !strcmp(tag, "trained");
    double ppl[5] = {0};
    for (size_t r = 0; r < json_array_size(res) && r < 5; r++) {
        json_t *o = json_array_get(res, r);
        char label[64];
        snprintf(label, sizeof label, "%s-%s%s", tag, types[r % 4], r == 4 ? " (llama.cpp defaults)" : "");
        const char *err = json_string_value(json_object_get(o, "error"));
        CHECK(!err, "llama.cpp on %s: %s", label, err);
        if (err) continue;
        if (r == 0 && trained) {
            printf("llama.cpp loading %s-f32.gguf:\n", tag);
            json_t *l;
            size_t i;
            json_array_foreach(json_object_get(o, "load_log"), i, l) if (strstr(json_string_value(l), "file ") ||
                                                                          strstr(json_string_value(l), "arch") ||
                                                                          strstr(json_string_value(l), "vocab") ||
                                                                          strstr(json_string_value(l), "token"))
                printf("  %s\n", json_string_value(l));
        }
        for (int p = 0; p < N_PROMPTS; p++) {
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(kiln_tokenizer_encode(tok, prompts[p], strlen(prompts[p]), &ids, &n));
            json_t *got = json_array_get(json_object_get(o, "prompt_ids"), (size_t)p);
            bool same = llref_ids_equal(got, ids, n);
            CHECK(same, "%s: llama.cpp tokenizes prompt %d differently from kiln", label, p);
            if (!same) llref_print_ids(label, got, ids, n);
            free(ids);
        }
        /* how far llama.cpp's log-probabilities are from kiln's on the same
         * weights: the rounding its kernels add */
        int ref = r % 4 < 3 ? (int)(r % 4) : 0;
        double worst = 0;
        for (int i = 0; i + 1 < nw; i++)
            worst = fmax(worst, fabs(json_real_value(json_array_get(json_object_get(o, "nll"), (size_t)i)) - nll_ref[ref][i]));
        ppl[r] = json_real_value(json_object_get(o, "ppl"));
        CHECK(json_real_value(json_object_get(o, "prob_sum_err")) < 1e-4, "probabilities do not sum to 1");
        if (r == 0) CHECK(worst < 2e-4, "%s: log-probabilities differ from kiln's by up to %.3g", label, worst);
        int n_same = 0;
        for (int g = 0; g < N_GREEDY; g++) {
            json_t *got = json_array_get(json_object_get(o, "greedy"), (size_t)g);
            const int32_t *want = seq[ref][g] + np[ref][g];
            bool same = llref_ids_equal(got, want, (size_t)ng[ref][g]);
            n_same += same;
            if (g == 0)
                printf("%-34s '%s' ->%s%s\n", label, greedy_prompts[g],
                       json_string_value(json_array_get(json_object_get(o, "greedy_text"), 0)), same ? "" : "  (differs)");
            if (same) continue;
            size_t d = 0;
            while (d < json_array_size(got) && (int)d < ng[ref][g] && json_integer_value(json_array_get(got, d)) == want[d]) d++;
            double gap = llref_top2_gap(ref_m[ref], seq[ref][g], np[ref][g] + (int)d);
            printf("  '%s': first differs at token %zu, where kiln's top-2 logit gap is %.3g (|log p| error %.3g)\n",
                   greedy_prompts[g], d, gap, worst);
            /* f32, and the trained model in every float type: identical.
             * The random model in f16/bf16: llama.cpp rounds the
             * activations to the weights' type for its matrix products, so
             * a continuation may part only at a near tie, where kiln's gap
             * between the two best logits is within twice that error. */
            if (r == 0 || ((r == 1 || r == 2) && trained))
                CHECK(0, "%s: llama.cpp's greedy continuation of '%s' differs from kiln's", label, greedy_prompts[g]);
            else if (r == 1 || r == 2)
                CHECK(gap < 2 * worst, "%s: '%s' differs at token %zu where the gap %.3g is not a near tie (error %.3g)", label,
                      greedy_prompts[g], d, gap, worst);
        }
        printf("%-34s greedy: %d of %d continuations of %d tokens identical; |log p - kiln's| <= %.3g\n", label, n_same,
               N_GREEDY, N_PREDICT, worst);
    }
    printf("%s: perplexity on %d validation tokens: kiln %.4f, llama.cpp f32 %.4f f16 %.4f bf16 %.4f q8_0 %.4f\n", tag, nw - 1,
           ppl_kiln, ppl[0], ppl[1], ppl[2], ppl[3]);
    CHECK(t_rel(ppl[0], ppl_kiln) < 1e-4, "llama.cpp's f32 perplexity %.6f vs kiln's %.6f", ppl[0], ppl_kiln);
    if (trained) CHECK(t_rel(ppl[3], ppl[0]) < 0.01, "q8_0 perplexity %.4f is not within 1%% of f32's %.4f", ppl[3], ppl[0]);
    for (int t = 1; t < 3; t++) kiln_llama_free(ref_m[t]);
    json_decref(res);

    if (!strcmp(tag, "trained")) {
        /* what a user sees: kiln generate --temperature 0 prints prompt +
         * the same text llama.cpp continues with */
        int rc = cli_exec((const char *[]){cli_kiln, "generate", mdir, "--prompt", greedy_prompts[0], "--max-tokens", "32", "--temperature",
                                      "0", "--threads", "1", NULL});
        char *o = cli_output(), *text = NULL;
        size_t len = 0;
        int n_ids = np[0][0] + ng[0][0];
        if (ng[0][0] > 0 && seq[0][0][n_ids - 1] == kiln_tokenizer_eos(tok)) n_ids--; /* not printed */
        CHECK_OK(kiln_tokenizer_decode(tok, seq[0][0], (size_t)n_ids, &text, &len));
        /* decode includes the bos text; generate prints the prompt itself */
        const char *body = text + strlen("<|bos|>");
        CHECK(rc == 0 && !strncmp(o, body, strlen(body)), "kiln generate printed '%s', the greedy ids decode to '%s'", o, body);
        free(text), free(o);
    }
    if (!strcmp(tag, "random")) {
        /* --chat on the GGUF: its tokenizer.chat_template and token strings
         * render the prompt the model directory's tokenizer_config.json does */
        char g[600];
        snprintf(g, sizeof g, "%s/%s-f32.gguf", dir, tag);
        const char *args[] = {"--chat", "Who are you?", "--max-tokens", "8", "--temperature", "0", "--threads", "1", NULL};
        int rc1 = cli_exec((const char *[]){cli_kiln, "generate", mdir, args[0], args[1], args[2], args[3], args[4], args[5],
                                       args[6], args[7], NULL});
        char *from_dir = cli_output();
        int rc2 = cli_exec((const char *[]){cli_kiln, "generate", g, args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                                       args[7], NULL});
        char *from_gguf = cli_output();
        /* the last line is timing */
        char *a = strrchr(from_dir, '['), *b = strrchr(from_gguf, '[');
        if (a) *a = 0;
        if (b) *b = 0;
        CHECK(rc1 == 0 && rc2 == 0 && !strcmp(from_dir, from_gguf), "generate --chat on the GGUF = on the directory: '%s' vs '%s'",
              from_gguf, from_dir);
        free(from_dir);
        free(from_gguf);
    }
    kiln_tokenizer_free(tok);
    kiln_llama_free(m);
}

/* A random model with tied embeddings and as many kv heads as heads, its
 * weights larger than HF's init so greedy choices are clear cut. */
static void make_random_model(const char *mdir, const char *tok_path) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 160, c.num_hidden_layers = 2;
    c.num_attention_heads = 2, c.num_key_value_heads = 2, c.head_dim = 32, c.max_position_embeddings = 256;
    c.rms_norm_eps = 1e-6, c.rope_theta = 500000, c.tie_word_embeddings = true;
    c.bos_token_id = KILN_TOK_BOS, c.eos_token_id = KILN_TOK_EOS, c.pad_token_id = KILN_TOK_PAD;
    kiln_llama *m = kiln_llama_new(&c, 3);
    kiln_rng r = {17, 0};
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *p = m->params[i];
        if (p->ndim == 2) kiln_rng_normal(&r, kiln_f32(p), kiln_tensor_numel(p), 0, 0.3f);
        else kiln_rng_uniform(&r, kiln_f32(p), kiln_tensor_numel(p), 0.5f, 1.5f);
    }
    char p[600];
    mkdir(mdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", mdir);
    CHECK_OK(kiln_llama_config_save(p, &c));
    snprintf(p, sizeof p, "%s/model.safetensors", mdir);
    CHECK_OK(kiln_save_weights(p, m));
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_load(tok_path, &tok));
    snprintf(p, sizeof p, "%s/tokenizer.json", mdir);
    CHECK_OK(kiln_tokenizer_save(tok, p));
    /* and a chat template, which goes into tokenizer.chat_template */
    json_t *tc = json_pack("{s:s}", "chat_template", chat_template);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", mdir);
    CHECK(json_dump_file(tc, p, 0) == 0, "write %s", p);
    json_decref(tc);
    kiln_tokenizer_free(tok);
    kiln_llama_free(m);
}

static void refusals(const char *run_dir) {
    char out[600], cfg[600];
    snprintf(out, sizeof out, "%s/x.gguf", dir);
    CHECK(cli_exec((const char *[]){cli_kiln, "export", "--help", NULL}) == 0, "export --help");
    char *h = cli_output();
    CHECK(strstr(h, "usage: kiln export") != NULL, "export --help: %s", h);
    free(h);
    CHECK(cli_exec((const char *[]){cli_kiln, "export", run_dir, "--gguf", out, "--type", "q3_k_m", NULL}) == 2, "unknown --type");
    h = cli_output();
    CHECK(strstr(h, "q3_k_m") != NULL, "unknown type not named: %s", h);
    free(h);
    CHECK(cli_exec((const char *[]){cli_kiln, "export", run_dir, NULL}) == 2, "no --gguf");
    CHECK(cli_exec((const char *[]){cli_kiln, "export", "/nonexistent/model", "--gguf", out, NULL}) == 1, "missing dir");
    char *o = cli_output();
    CHECK(strstr(o, "/nonexistent/model") != NULL, "missing dir not named: %s", o);
    free(o);
    /* a family whose llama.cpp architecture cannot hold the model (more in
     * test_gguf_families) */
    char qdir[600];
    snprintf(qdir, sizeof qdir, "%s/qwen", dir);
    mkdir(qdir, 0755);
    snprintf(cfg, sizeof cfg, "%s/config.json", qdir);
    write_text(cfg, "{\"model_type\": \"qwen3\", \"vocab_size\": 8, \"hidden_size\": 8, \"intermediate_size\": 8,"
                    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"head_dim\": 4,"
                    " \"attention_bias\": true}");
    CHECK(cli_exec((const char *[]){cli_kiln, "export", qdir, "--gguf", out, NULL}) == 1, "qwen3 with attention biases accepted");
    o = cli_output();
    CHECK(strstr(o, "attention_bias") && strstr(o, "qwen3") && strstr(o, "config.json"), "refusal does not name the field: %s", o);
    free(o);
    /* a tokenizer llama.cpp's gpt2 tokenizer would not reproduce */
    char tp[600], bad[600];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
    snprintf(bad, sizeof bad, "%s/tokenizer-nfc.json", dir);
    json_t *t = json_load_file(tp, 0, NULL);
    CHECK(t != NULL, "read %s", tp);
    if (t) {
        json_object_set_new(t, "normalizer", json_pack("{s:s}", "type", "NFC"));
        json_dump_file(t, bad, 0);
        json_decref(t);
        CHECK(cli_exec((const char *[]){cli_kiln, "export", run_dir, "--gguf", out, "--tokenizer", bad, NULL}) == 1, "NFC tokenizer accepted");
        o = cli_output();
        CHECK(strstr(o, "tokenizer-nfc.json") && strstr(o, "normalizer"), "refusal does not name file and field: %s", o);
        free(o);
    }
    CHECK(access(out, F_OK) != 0, "a refused export left %s", out);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_gguf_llama_XXXXXX");
    if (!cli_init(dir)) return 1;
    char why[1500];
    if (!llref_available(script, sizeof script, why, sizeof why)) {
        printf("test_gguf_llama: skipped: %s\n", why);
        TEST_END();
    }
    have_ref = ggml_ref_load(&G, why, sizeof why);
    if (!have_ref) printf("test_gguf_llama: metadata not read back: %s\n", why);
    if (!mkdtemp(dir)) return 1;
    char corpus[600], tok[600], data[600], run_dir[600], cfg[600], rnd[600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(cfg, sizeof cfg, "%s/model.json", dir);
    snprintf(rnd, sizeof rnd, "%s/random", dir);
    llref_make_corpus(corpus);
    /* untied, grouped-query attention (4 heads, 2 kv heads), head_dim 16 */
    write_text(cfg, "{\"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 192, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 256,"
                    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}");
    double t0 = kiln_time_now();
    CHECK(cli_exec((const char *[]){cli_kiln, "tokenizer", "train", corpus, "--vocab-size", "512", "-o", tok, NULL}) == 0, "tokenizer train");
    CHECK(cli_exec((const char *[]){cli_kiln, "tokenize", corpus, "--tokenizer", tok, "-o", data, NULL}) == 0, "tokenize");
    /* one thread: on a shared machine OpenMP threads waiting on each other
     * cost more than this small model gains from them */
    int rc = cli_exec((const char *[]){cli_kiln, "train", "--data", data, "--tokenizer", tok, "--run-dir", run_dir, "--model", cfg, "--batch",
                                  "8", "--accum", "1", "--seq-len", "64", "--steps", "150", "--warmup", "10", "--lr", "1e-2",
                                  "--min-lr", "1e-3", "--eval-every", "0", "--save-every", "0", "--no-plot", "--threads", "1", NULL});
    char *o = cli_output();
    CHECK(rc == 0, "kiln train: %d\n%s", rc, o);
    const char *done = strstr(o, "done at");
    printf("trained in %.1f s: %.*s", kiln_time_now() - t0, done ? (int)strcspn(done, "\n") + 1 : 0, done ? done : "");
    free(o);
    kiln_set_num_threads(1);
    check_model(run_dir, "trained");
    make_random_model(rnd, tok);
    check_model(rnd, "random");
    refusals(run_dir);
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
