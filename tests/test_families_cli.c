/* Hostile and unsupported model configs through the kiln command, as a user
 * meets them: `kiln train --model crafted/config.json`, `kiln generate`
 * on a run directory whose config.json was tampered with, `kiln compile`.
 * Each must exit 1 with a message naming the file and what is wrong, before
 * anything is allocated (the crafted q_proj below used to wrap its byte size
 * to 0 and the initialisation wrote past a tiny block). */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/model.h"
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"

static char dir[256];

/* every needle in the output (NULL-terminated list) */
static bool output_has(const char *const *needles) {
    bool all = true;
    for (int i = 0; needles[i]; i++) all = cli_output_has(needles[i]) && all;
    return all;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static const char *crafted_json = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 300,"
                                  " \"hidden_size\": 2147483648, \"intermediate_size\": 8, \"num_hidden_layers\": 1,"
                                  " \"num_attention_heads\": 2, \"head_dim\": 1073741824}";
/* no overflow anywhere, but petabytes of parameters */
static const char *huge_json = "{\"vocab_size\": 300, \"hidden_size\": 65536, \"intermediate_size\": 1048576,"
                               " \"num_hidden_layers\": 4096, \"num_attention_heads\": 512}";

static void train_refuses(const char *data, const char *tok) {
    char crafted[512], huge[512], bad[512], run[512];
    snprintf(crafted, sizeof crafted, "%s/crafted", dir);
    mkdir(crafted, 0755);
    snprintf(crafted, sizeof crafted, "%s/crafted/config.json", dir);
    write_text(crafted, crafted_json);
    snprintf(run, sizeof run, "%s/run", dir);
    int rc = cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--model", crafted, "--run-dir", run,
                                       "--steps", "1", "--seq-len", "16", "--batch", "1", "--no-plot", NULL});
    CHECK(rc == 1 && output_has((const char *[]){crafted, "q_proj", "2147483648", "too large", NULL}),
          "train --model crafted/config.json refused, naming the file and the parameter (rc %d)", rc);

    snprintf(huge, sizeof huge, "%s/huge.json", dir);
    write_text(huge, huge_json);
    rc = cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--model", huge, "--run-dir", run, "--steps",
                                   "1", "--seq-len", "16", "--batch", "1", "--no-plot", NULL});
    CHECK(rc == 1 && output_has((const char *[]){huge, "3659177002270720 bytes", "available", NULL}),
          "train --model with petabytes of parameters refused, naming bytes needed and available (rc %d)", rc);

    snprintf(bad, sizeof bad, "%s/eps.json", dir);
    write_text(bad, "{\"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 8, \"num_hidden_layers\": 1,"
                    " \"num_attention_heads\": 4, \"rms_norm_eps\": 1e300}");
    rc = cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--model", bad, "--run-dir", run, "--steps",
                                   "1", "--seq-len", "16", "--batch", "1", "--no-plot", NULL});
    CHECK(rc == 1 && output_has((const char *[]){bad, "rms_norm_eps", "1e+300", NULL}),
          "rms_norm_eps 1e300 (inf as a float) refused naming file, field and value (rc %d)", rc);

    snprintf(bad, sizeof bad, "%s/int.json", dir);
    write_text(bad, "{\"vocab_size\": 300, \"hidden_size\": 5e121, \"intermediate_size\": 8, \"num_hidden_layers\": 1,"
                    " \"num_attention_heads\": 4}");
    rc = cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--model", bad, "--run-dir", run, "--steps",
                                   "1", "--seq-len", "16", "--batch", "1", "--no-plot", NULL});
    CHECK(rc == 1 && output_has((const char *[]){bad, "hidden_size", "5e+121", NULL}),
          "hidden_size 5e121 refused naming file, field and value (rc %d)", rc);
}

/* A run directory whose config.json is the crafted one: generate and
 * compile refuse it too. */
static void other_commands(void) {
    char run[512], path[600];
    snprintf(run, sizeof run, "%s/tampered", dir);
    mkdir(run, 0755);
    snprintf(path, sizeof path, "%s/config.json", run);
    write_text(path, crafted_json);
    snprintf(path, sizeof path, "%s/model.safetensors", run);
    write_text(path, "");
    int rc = cli_kiln_run((const char *[]){"generate", run, "--prompt", "the", "--max-tokens", "2", NULL});
    snprintf(path, sizeof path, "%s/config.json", run);
    CHECK(rc == 1 && output_has((const char *[]){path, "q_proj", "too large", NULL}),
          "generate on a tampered run refused naming its config.json (rc %d)", rc);
    snprintf(path, sizeof path, "%s/huge.json", dir);
    rc = cli_kiln_run((const char *[]){"compile", "--explain", "--model", path, NULL});
    CHECK(rc == 1 && output_has((const char *[]){path, "bytes", "available", NULL}),
          "compile --explain on a model beyond memory refused (rc %d)", rc);
}

static int train_with(const char *data, const char *tok, const char *config, const char *run, const char *seq) {
    return cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--model", config, "--run-dir", run, "--steps",
                                     "2", "--seq-len", seq, "--batch", "1", "--no-plot", "--eval-every", "0", NULL});
}

/* Families: refused fields name the file, field and value; a Qwen3 config
 * trains and is saved as Qwen3 (its q/k norms in the weights). */
static void families(const char *data, const char *tok) {
    char cfg[512], run[512];
    const char *base = "\"vocab_size\": 300, \"hidden_size\": 32, \"intermediate_size\": 40, \"num_hidden_layers\": 1,"
                       " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64";
    char json[1024];
    snprintf(run, sizeof run, "%s/famrun", dir);
    snprintf(cfg, sizeof cfg, "%s/yarn.json", dir);
    snprintf(json, sizeof json, "{\"model_type\": \"qwen2\", %s, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}}", base);
    write_text(cfg, json);
    int rc = train_with(data, tok, cfg, run, "16");
    CHECK(rc == 1 && output_has((const char *[]){cfg, "rope_scaling", "\"yarn\"", NULL}), "rope_scaling yarn refused (rc %d)", rc);
    snprintf(cfg, sizeof cfg, "%s/gemma.json", dir);
    snprintf(json, sizeof json, "{\"model_type\": \"gemma\", %s}", base);
    write_text(cfg, json);
    rc = train_with(data, tok, cfg, run, "16");
    CHECK(rc == 1 && output_has((const char *[]){cfg, "model_type", "\"gemma\"", NULL}), "model_type gemma refused (rc %d)", rc);
    snprintf(cfg, sizeof cfg, "%s/mistral.json", dir);
    snprintf(json, sizeof json, "{\"model_type\": \"mistral\", %s, \"sliding_window\": 8}", base);
    write_text(cfg, json);
    char swa_run[600];
    snprintf(swa_run, sizeof swa_run, "%s/famrun_swa", dir);
    rc = train_with(data, tok, cfg, swa_run, "16");
    CHECK(rc == 0, "--seq-len 16 beyond mistral's sliding_window 8 trains (sliding-window attention; rc %d)", rc);

    /* Gemma 2 beyond its window: trains, warns that its soft-capped
     * attention stays unfused, and is saved as Gemma2ForCausalLM */
    snprintf(cfg, sizeof cfg, "%s/gemma2.json", dir);
    snprintf(json, sizeof json,
             "{\"architectures\": [\"Gemma2ForCausalLM\"], \"model_type\": \"gemma2\", %s, \"head_dim\": 8,"
             " \"sliding_window\": 8, \"query_pre_attn_scalar\": 8, \"hidden_activation\": \"gelu_pytorch_tanh\"}",
             base);
    write_text(cfg, json);
    char g2_run[600];
    snprintf(g2_run, sizeof g2_run, "%s/famrun_gemma2", dir);
    rc = cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--model", cfg, "--run-dir", g2_run, "--steps",
                                       "2", "--seq-len", "16", "--batch", "1", "--no-plot", "--eval-every", "0", "--compile",
                                       "default", NULL});
    CHECK(rc == 0 && output_has((const char *[]){"not fused", "soft-capped", NULL}),
          "a gemma2 config.json trains past its window, saying its soft-capped attention stays unfused (rc %d)", rc);
    char g2cfg[700];
    snprintf(g2cfg, sizeof g2cfg, "%s/config.json", g2_run);
    kiln_llama_config g2;
    CHECK(kiln_llama_config_load(g2cfg, &g2) == KILN_OK && g2.family == KILN_FAMILY_GEMMA2 && g2.sliding_window == 8 &&
              g2.attn_logit_softcapping == 50 && g2.final_logit_softcapping == 30,
          "the run's config.json is gemma2 with its window and soft-caps: %s", kiln_last_error());

    snprintf(cfg, sizeof cfg, "%s/qwen3.json", dir);
    snprintf(json, sizeof json,
             "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", %s, \"head_dim\": 16,"
             " \"tie_word_embeddings\": true, \"rope_theta\": 1000000.0, \"torch_dtype\": \"bfloat16\"}",
             base);
    write_text(cfg, json);
    rc = train_with(data, tok, cfg, run, "16");
    CHECK(rc == 0, "a qwen3 config.json trains (rc %d)", rc);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", run);
    kiln_llama_config c;
    CHECK(kiln_llama_config_load(path, &c) == KILN_OK && c.family == KILN_FAMILY_QWEN3 && c.head_dim == 16 &&
              c.hidden_size == 32 && c.tie_word_embeddings,
          "the run's config.json is still qwen3 with head_dim 16: %s", kiln_last_error());
    char *text = NULL;
    size_t n;
    CHECK(kiln_read_file(path, &text, &n) == KILN_OK && strstr(text, "Qwen3ForCausalLM"), "architectures Qwen3ForCausalLM saved");
    free(text);
    kiln_llama *m = NULL;
    CHECK(kiln_load_model_dir(run, &m) == KILN_OK && m && kiln_llama_param(m, "model.layers.0.self_attn.q_norm.weight"),
          "the saved weights hold qwen3's q_norm: %s", kiln_last_error());
    kiln_llama_free(m);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_families_cli_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    char corpus[512], tok[512], data[512];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    FILE *f = fopen(corpus, "w");
    for (int p = 0; p < 60; p++) fprintf(f, "the lord said unto moses, go up into the mountain of god %d.\n\n", p);
    fclose(f);
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", corpus, "--vocab-size", "300", "-o", tok, NULL}) == 0,
          "tokenizer train");
    CHECK(cli_kiln_run((const char *[]){"tokenize", corpus, "--tokenizer", tok, "-o", data, NULL}) == 0, "tokenize");
    train_refuses(data, tok);
    other_commands();
    families(data, tok);
    if (t_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_END();
}
