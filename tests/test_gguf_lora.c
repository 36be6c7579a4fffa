/* `kiln export RUN --gguf-lora OUT.gguf` checked by a real llama.cpp
 * (node-llama-cpp's prebuilt CPU binary, tests/node/gguf_llama.mjs, which
 * loads the adapter onto the context as llama_adapter_lora_init does).
 * Per case a random base model and a LoRA directory beside it (the same
 * base, PEFT adapter files with random non-zero B, so the adapters matter):
 *   llama   all seven linears, rank 4, alpha 16, untied, GQA (the q/k B
 *           rows must be reordered as the base's q/k rows)
 *   qwen2   q,k,v,o (q/k/v biases in the base), rank 8, alpha 8, tied
 *   qwen3   all seven, rank 8, alpha 4 with rslora (alpha / sqrt(r)),
 *           head_dim 32 x 4 heads != hidden 64
 * The base is exported with --gguf (F32), the adapters with --gguf-lora;
 * llama.cpp on base + adapter must continue >= 4 of 5 prompts greedily for
 * 32 tokens exactly as kiln does on base + adapters (where one parts, the
 * top-2 logit gap is printed), give kiln's perplexity within 1e-3
 * (relative), and differ from the base alone, which must give kiln's base
 * perplexity. The adapter file is read back (kiln's reader: metadata,
 * names, shapes, the q/k row order). Refusals: a directory without
 * adapters, --gguf-lora with --type. The llama.cpp part skips with one
 * line without node/node-llama-cpp and in sanitizer builds. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"
#include "llamacpp_ref.h"

#define N_PREDICT 32
#define N_GREEDY 5
static char script[1200], dir[256];

typedef struct {
    const char *tag, *config, *arch;
    const char *targets;
    int rank;
    double alpha;
    bool rslora;
} lora_case;

static const lora_case cases[] = {
    {"llama",
     "{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 96,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false,"
     " \"bos_token_id\": 0, \"eos_token_id\": 1}",
     "llama", "all", 4, 16, false},
    {"qwen2",
     "{\"model_type\": \"qwen2\", \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 96,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true,"
     " \"use_sliding_window\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}",
     "qwen2", "q_proj,k_proj,v_proj,o_proj", 8, 8, false},
    {"qwen3",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 96,"
     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
     " \"max_position_embeddings\": 256, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
     " \"attention_bias\": false, \"use_sliding_window\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}",
     "qwen3", "all", 8, 4, true},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static const char *greedy_prompts[N_GREEDY] = {"abc def ghi", "hello world", "the quick brown fox", "pop bob mop",
                                               "1 22 333 jam"};
static const char *window_text = "moon fed bag pig kid; an odd lamp hid a big map, and 42 dogs ran off the old hill";

static void write_text(const char *path, const char *s) { CHECK_OK(kiln_write_file_atomic(path, s, strlen(s))); }

static void copy_file(const char *from, const char *to) {
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(from, &text, &n));
    if (text) CHECK_OK(kiln_write_file_atomic(to, text, n));
    free(text);
}

/* base: config, random weights (larger than HF's init, so greedy choices
 * are clear cut), tokenizer; lora: the same files and PEFT adapter files */
static void make_dirs(const lora_case *lc, const char *base, const char *lora, const char *tok) {
    char p[700], q[700];
    mkdir(base, 0755);
    mkdir(lora, 0755);
    snprintf(p, sizeof p, "%s/config.json", base);
    write_text(p, lc->config);
    kiln_llama_config c;
    CHECK_OK(kiln_llama_config_load(p, &c));
    snprintf(q, sizeof q, "%s/config.json", lora);
    copy_file(p, q);
    snprintf(p, sizeof p, "%s/tokenizer.json", base);
    copy_file(tok, p);
    snprintf(p, sizeof p, "%s/tokenizer.json", lora);
    copy_file(tok, p);
    kiln_llama *m = kiln_llama_new(&c, 5);
    CHECK(m != NULL, "%s: model", lc->tag);
    if (!m) return;
    kiln_rng r = {31, 0};
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *t = m->params[i];
        if (strstr(t->name, "norm")) kiln_rng_uniform(&r, kiln_f32(t), kiln_tensor_numel(t), 0.5f, 1.5f);
        else kiln_rng_normal(&r, kiln_f32(t), kiln_tensor_numel(t), 0, t->ndim == 2 ? 0.3f : 0.2f);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", base);
    CHECK_OK(kiln_save_weights(p, m));
    snprintf(q, sizeof q, "%s/model.safetensors", lora);
    copy_file(p, q);
    kiln_lora_config cfg = {.rank = lc->rank, .alpha = lc->alpha, .rslora = lc->rslora};
    CHECK_OK(kiln_lora_targets_parse(lc->targets, &cfg.targets));
    CHECK_OK(kiln_llama_lora_add(m, &cfg, 9));
    /* B random (PEFT starts it at zero: the adapter would do nothing) */
    for (int i = m->n_base; i < m->n_params; i++)
        if (strstr(m->params[i]->name, "lora_B"))
            kiln_rng_normal(&r, kiln_f32(m->params[i]), kiln_tensor_numel(m->params[i]), 0, 0.2f);
    CHECK_OK(kiln_lora_save(lora, m, base));
    kiln_llama_free(m);
}

/* the adapter file as kiln's reader has it: metadata, one a/b pair per
 * adapted linear, PEFT's shapes, a as A and b as B with q/k rows reordered
 * for llama */
static void check_file(const lora_case *lc, const char *path, const kiln_llama *m) {
    kiln_gguf_file *f = NULL;
    CHECK_OK(kiln_gguf_open(path, &f));
    if (!f) return;
    const char *s;
    uint64_t n;
    CHECK(!kiln_gguf_get_str(f, "general.type", &s, &n) && n == 7 && !memcmp(s, "adapter", 7), "%s: general.type", lc->tag);
    CHECK(!kiln_gguf_get_str(f, "adapter.type", &s, &n) && n == 4 && !memcmp(s, "lora", 4), "%s: adapter.type", lc->tag);
    CHECK(!kiln_gguf_get_str(f, "general.architecture", &s, &n) && n == strlen(lc->arch) && !memcmp(s, lc->arch, n),
          "%s: general.architecture", lc->tag);
    float alpha = 0;
    CHECK_OK(kiln_gguf_get_f32(f, "adapter.lora.alpha", &alpha));
    /* llama.cpp's scale: alpha / r */
    double want = lc->rslora ? lc->alpha / sqrt((double)lc->rank) : lc->alpha / lc->rank;
    CHECK(t_rel((double)alpha / lc->rank, want) < 1e-6, "%s: alpha %g / r %d != scaling %g", lc->tag, alpha, lc->rank, want);
    int per = __builtin_popcount(m->lora.targets);
    CHECK(kiln_gguf_tensor_count(f) == 2 * per * m->cfg.num_hidden_layers, "%s: %lld tensors", lc->tag,
          (long long)kiln_gguf_tensor_count(f));
    static const char *const names[KILN_LORA_N] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    int bad = 0, moved = 0;
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int t = 0; t < KILN_LORA_N; t++) {
            const kiln_tensor *A = m->lora_a[l * KILN_LORA_N + t], *B = m->lora_b[l * KILN_LORA_N + t];
            if (!A) continue;
            char na[64], nb[64];
            snprintf(na, sizeof na, "blk.%lld.%s.weight.lora_a", (long long)l, names[t]);
            snprintf(nb, sizeof nb, "blk.%lld.%s.weight.lora_b", (long long)l, names[t]);
            const kiln_gguf_tensor *ta = kiln_gguf_tensor_find(f, na), *tb = kiln_gguf_tensor_find(f, nb);
            if (!ta || !tb || ta->type != KILN_GGML_F32 || tb->type != KILN_GGML_F32 || ta->shape[0] != A->shape[0] ||
                ta->shape[1] != A->shape[1] || tb->shape[0] != B->shape[0] || tb->shape[1] != B->shape[1]) {
                bad++;
                continue;
            }
            bad += memcmp(ta->data, kiln_f32(A), ta->nbytes) != 0;
            /* q/k B under llama: file row 2j + s of a head is HF row s * d/2 + j */
            bool qk = !strcmp(lc->arch, "llama") && (t == KILN_LORA_Q || t == KILN_LORA_K);
            int64_t heads = t == KILN_LORA_Q ? m->cfg.num_attention_heads : m->cfg.num_key_value_heads, d = B->shape[0] / heads;
            int64_t R = B->shape[1];
            for (int64_t r = 0; r < B->shape[0]; r++) {
                int64_t src = qk ? (r / d) * d + (r % d % 2) * (d / 2) + (r % d) / 2 : r;
                bad += memcmp((const float *)tb->data + r * R, kiln_f32(B) + src * R, (size_t)R * 4) != 0;
                moved += src != r;
            }
        }
    CHECK(bad == 0, "%s: %d adapter tensors or rows differ from the model's", lc->tag, bad);
    if (!strcmp(lc->arch, "llama")) CHECK(moved > 0, "%s: no q/k row reordered", lc->tag);
    printf("%s: adapter file: %lld tensors, adapter.lora.alpha %g (rank %d: scale %g%s), %d q/k B rows reordered\n", lc->tag,
           (long long)kiln_gguf_tensor_count(f), alpha, lc->rank, alpha / lc->rank, lc->rslora ? ", rslora" : "", moved);
    kiln_gguf_close(f);
}

static void refusals(const char *base, const char *lora) {
    char out[600];
    snprintf(out, sizeof out, "%s/refused.gguf", dir);
    int rc = cli_exec((const char *[]){cli_kiln, "export", base, "--gguf-lora", out, NULL});
    char *o = cli_output();
    CHECK(rc == 1 && strstr(o, "no LoRA adapters") && strstr(o, "adapter_config.json") && strstr(o, base),
          "--gguf-lora of a directory without adapters: rc %d: %s", rc, o);
    if (rc == 1) printf("refused: %s", o);
    free(o);
    CHECK(access(out, F_OK) != 0, "a refused export left %s", out);
    rc = cli_exec((const char *[]){cli_kiln, "export", lora, "--gguf-lora", out, "--type", "f16", NULL});
    o = cli_output();
    CHECK(rc == 2 && strstr(o, "--gguf-lora"), "--gguf-lora with --type: rc %d: %s", rc, o);
    free(o);
    CHECK(access(out, F_OK) != 0, "a refused export left %s", out);
}

typedef struct {
    kiln_llama *m[2]; /* base + adapters, base alone */
    kiln_tokenizer *tok;
    int32_t seq[2][N_GREEDY][128];
    int np[2][N_GREEDY], ng[2][N_GREEDY];
    int32_t w[64];
    int nw;
    double nll[2][64], ppl[2];
} kiln_side;

/* llama.cpp's continuation is kiln's: the same ids, or kiln's up to the eos
 * it chose last, where node-llama-cpp's evaluate ends without yielding the
 * end-of-generation token */
static bool same_greedy(json_t *got, const int32_t *want, int n, int32_t eos) {
    if (llref_ids_equal(got, want, (size_t)n)) return true;
    return n > 0 && want[n - 1] == eos && llref_ids_equal(got, want, (size_t)n - 1);
}

/* tokens both agree on from the start */
static size_t common_prefix(json_t *got, const int32_t *want, int n) {
    size_t d = 0;
    while (d < json_array_size(got) && (int)d < n && json_integer_value(json_array_get(got, d)) == want[d]) d++;
    return d;
}

static double ppl_of(const double *nll, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += nll[i];
    return exp(s / n);
}

static void compare(const lora_case *lc, kiln_side *k, json_t *with, json_t *alone) {
    const char *err = json_string_value(json_object_get(with, "error"));
    CHECK(!err, "llama.cpp on %s base + adapter: %s", lc->tag, err);
    const char *err2 = json_string_value(json_object_get(alone, "error"));
    CHECK(!err2, "llama.cpp on %s base: %s", lc->tag, err2);
    if (err || err2) {
        json_t *l;
        size_t i;
        json_array_foreach(json_object_get(err ? with : alone, "log_tail"), i, l) fprintf(stderr, "  %s\n", json_string_value(l));
        return;
    }
    json_t *l;
    size_t i;
    json_array_foreach(json_object_get(with, "lora_log"), i, l) if (strstr(json_string_value(l), "tensors from lora file"))
        printf("  llama.cpp %s: %s\n", lc->tag, json_string_value(l));
    /* |log p - kiln's| with the adapter and without; how far the adapter
     * moves llama.cpp's and kiln's log-probabilities */
    double worst = 0, worst_b = 0, moved = 0, moved_kiln = 0;
    for (int j = 0; j + 1 < k->nw; j++) {
        double a = json_real_value(json_array_get(json_object_get(with, "nll"), (size_t)j));
        double b = json_real_value(json_array_get(json_object_get(alone, "nll"), (size_t)j));
        worst = fmax(worst, fabs(a - k->nll[0][j]));
        worst_b = fmax(worst_b, fabs(b - k->nll[1][j]));
        moved = fmax(moved, fabs(a - b));
        moved_kiln = fmax(moved_kiln, fabs(k->nll[0][j] - k->nll[1][j]));
    }
    int n_same = 0, n_same_base = 0, n_differ = 0;
    int32_t eos = kiln_tokenizer_eos(k->tok);
    for (int g = 0; g < N_GREEDY; g++) {
        json_t *got = json_array_get(json_object_get(with, "greedy"), (size_t)g);
        json_t *got_b = json_array_get(json_object_get(alone, "greedy"), (size_t)g);
        n_differ += !json_equal(got, got_b);
        /* with the adapter against kiln's base + adapters, the base alone
         * against kiln's base */
        for (int t = 0; t < 2; t++) {
            json_t *gt = t ? got_b : got;
            const int32_t *want = k->seq[t][g] + k->np[t][g];
            bool same = same_greedy(gt, want, k->ng[t][g], eos);
            if (t) n_same_base += same;
            else n_same += same;
            if (same) continue;
            size_t d = common_prefix(gt, want, k->ng[t][g]);
            double gap = llref_top2_gap(k->m[t], k->seq[t][g], k->np[t][g] + (int)d);
            printf("  %s%s '%s': first differs at token %zu, where kiln's top-2 logit gap is %.3g (|log p| error %.3g)\n",
                   lc->tag, t ? " base" : " + adapter", greedy_prompts[g], d, gap, t ? worst_b : worst);
        }
    }
    double ppl_l = json_real_value(json_object_get(with, "ppl")), ppl_b = json_real_value(json_object_get(alone, "ppl"));
    printf("%-6s base + adapter: greedy %d of %d continuations of %d tokens identical to kiln's; perplexity on %d tokens "
           "llama.cpp %.6f, kiln %.6f (rel %.2g; |log p - kiln's| <= %.3g)\n",
           lc->tag, n_same, N_GREEDY, N_PREDICT, k->nw - 1, ppl_l, k->ppl[0], t_rel(ppl_l, k->ppl[0]), worst);
    printf("%-6s base alone:     greedy %d of %d identical to kiln's base; perplexity llama.cpp %.6f, kiln %.6f (rel %.2g; "
           "|log p - kiln's| <= %.3g)\n",
           lc->tag, n_same_base, N_GREEDY, ppl_b, k->ppl[1], t_rel(ppl_b, k->ppl[1]), worst_b);
    printf("%-6s the adapter changes %d of %d llama.cpp continuations, its perplexity %.4f -> %.4f, its log p by up to %.3g "
           "(kiln's by %.3g)\n",
           lc->tag, n_differ, N_GREEDY, ppl_b, ppl_l, moved, moved_kiln);
    printf("%-6s '%s' -> llama.cpp + adapter:%s\n", lc->tag, greedy_prompts[0],
           json_string_value(json_array_get(json_object_get(with, "greedy_text"), 0)));
    CHECK(n_same >= 4, "%s: llama.cpp with the adapter continues only %d of %d prompts as kiln does", lc->tag, n_same, N_GREEDY);
    CHECK(t_rel(ppl_l, k->ppl[0]) < 1e-3, "%s: llama.cpp's perplexity with the adapter %.6f vs kiln's %.6f", lc->tag, ppl_l,
          k->ppl[0]);
    CHECK(t_rel(ppl_b, k->ppl[1]) < 1e-3, "%s: llama.cpp's base perplexity %.6f vs kiln's %.6f", lc->tag, ppl_b, k->ppl[1]);
    CHECK(n_same_base >= 4, "%s: llama.cpp on the base continues only %d of %d prompts as kiln does", lc->tag, n_same_base,
          N_GREEDY);
    /* the adapter matters: llama.cpp's outputs move with it, far beyond the
     * tolerances above, as kiln's do */
    CHECK(t_rel(ppl_l, ppl_b) > 2e-3 && moved > 0.1 && moved_kiln > 0.1,
          "%s: the adapter moves the perplexity only %.4f -> %.4f, log p by %.3g (kiln's by %.3g)", lc->tag, ppl_b, ppl_l, moved,
          moved_kiln);
    CHECK(n_differ >= 1, "%s: the adapter changes no greedy continuation", lc->tag);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_gguf_lora_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    /* kiln's own byte-level BPE tokenizer, trained on made-up words */
    char tok_path[600];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    llref_words_tokenizer(tok_path);
    kiln_set_num_threads(1);

    static kiln_side ks[N_CASES];
    json_t *models = json_array();
    bool ok = true;
    for (int ci = 0; ci < N_CASES && ok; ci++) {
        const lora_case *lc = &cases[ci];
        kiln_side *k = &ks[ci];
        char base[600], lora[600], bg[700], lg[700];
        snprintf(base, sizeof base, "%s/%s-base", dir, lc->tag);
        snprintf(lora, sizeof lora, "%s/%s-lora", dir, lc->tag);
        snprintf(bg, sizeof bg, "%s/%s-base.gguf", dir, lc->tag);
        snprintf(lg, sizeof lg, "%s/%s-lora.gguf", dir, lc->tag);
        make_dirs(lc, base, lora, tok_path);
        int rc = cli_exec((const char *[]){cli_kiln, "export", base, "--gguf", bg, NULL});
        char *o = cli_output();
        CHECK(rc == 0 && strstr(o, lc->arch), "kiln export %s --gguf: rc %d\n%s", base, rc, o);
        free(o);
        rc = cli_exec((const char *[]){cli_kiln, "export", lora, "--gguf-lora", lg, NULL});
        o = cli_output();
        CHECK(rc == 0 && strstr(o, "LoRA adapter") && strstr(o, lc->arch), "kiln export %s --gguf-lora: rc %d\n%s", lora, rc, o);
        printf("%s", o);
        free(o);
        CHECK_OK(kiln_load_model_dir(lora, &k->m[0]));
        CHECK_OK(kiln_load_model_dir(base, &k->m[1]));
        CHECK_OK(kiln_tokenizer_load(tok_path, &k->tok));
        if (!k->m[0] || !k->m[1] || !k->tok || !k->m[0]->lora_a) {
            ok = false;
            break;
        }
        check_file(lc, lg, k->m[0]);
        if (ci == 0) refusals(base, lora);
        /* kiln's side: base + adapters (unmerged, as kiln generate runs a
         * LoRA run) and the base alone */
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(kiln_tokenizer_encode(k->tok, window_text, strlen(window_text), &ids, &n));
        k->nw = 0;
        if (kiln_tokenizer_bos(k->tok) >= 0) k->w[k->nw++] = kiln_tokenizer_bos(k->tok);
        for (size_t i = 0; i < n && k->nw < 64; i++) k->w[k->nw++] = ids[i];
        free(ids);
        for (int t = 0; t < 2; t++) {
            for (int g = 0; g < N_GREEDY; g++)
                k->ng[t][g] = llref_greedy(k->m[t], k->tok, greedy_prompts[g], N_PREDICT, k->seq[t][g], &k->np[t][g]);
            llref_nll(k->m[t], k->w, k->nw, k->nll[t]);
            k->ppl[t] = ppl_of(k->nll[t], k->nw - 1);
        }
        json_t *wt = json_array();
        for (int i = 0; i < k->nw; i++) json_array_append_new(wt, json_integer(k->w[i]));
        json_array_append_new(models, json_pack("{s:s, s:b, s:O, s:s}", "path", bg, "defaults", 0, "ppl_tokens", wt, "lora", lg));
        json_array_append_new(models, json_pack("{s:s, s:b, s:O}", "path", bg, "defaults", 0, "ppl_tokens", wt));
        json_decref(wt);
    }
    char why[1500];
#ifdef SANITIZED
    (void)why, (void)compare, (void)script;
    printf("test_gguf_lora: llama.cpp part skipped in the sanitizer build (the optimised build runs it)\n");
#else
    if (!ok) {
        printf("test_gguf_lora: llama.cpp part not run: the models did not load\n");
    } else if (!llref_available(script, sizeof script, why, sizeof why)) {
        printf("test_gguf_lora: llama.cpp part skipped: %s\n", why);
    } else {
        json_t *job = llref_job(greedy_prompts, N_GREEDY, greedy_prompts, N_GREEDY, N_PREDICT);
        json_object_set_new(job, "models", json_incref(models));
        char jp[600];
        snprintf(jp, sizeof jp, "%s/job.json", dir);
        json_t *res = llref_run(script, jp, job, 2 * N_CASES);
        for (int ci = 0; ci < N_CASES && (size_t)(2 * ci + 1) < json_array_size(res); ci++) {
            /* the prompts tokenize alike (the base file's tokenizer) */
            json_t *o = json_array_get(res, (size_t)(2 * ci));
            int same_tok = 0;
            for (int p = 0; p < N_GREEDY; p++) {
                int32_t *ids = NULL;
                size_t n = 0;
                CHECK_OK(kiln_tokenizer_encode(ks[ci].tok, greedy_prompts[p], strlen(greedy_prompts[p]), &ids, &n));
                same_tok += llref_ids_equal(json_array_get(json_object_get(o, "prompt_ids"), (size_t)p), ids, n);
                free(ids);
            }
            CHECK(same_tok == N_GREEDY, "%s: llama.cpp tokenizes %d of %d prompts as kiln", cases[ci].tag, same_tok, N_GREEDY);
            compare(&cases[ci], &ks[ci], o, json_array_get(res, (size_t)(2 * ci + 1)));
        }
        json_decref(res);
    }
#endif
    json_decref(models);
    for (int ci = 0; ci < N_CASES; ci++) {
        kiln_llama_free(ks[ci].m[0]), kiln_llama_free(ks[ci].m[1]);
        kiln_tokenizer_free(ks[ci].tok);
    }
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
