/* `kiln train --init HF_DIR` as a user meets it (issue 22): every pairing of
 * the model's vocabulary, the tokenizer that comes with the directory, its
 * generation_config.json and the shards is checked before step 1, by the
 * rule `kiln generate` applies afterwards (a run that trains must be one
 * generate accepts); the model is announced as what it is; a qwen2 config
 * with fields at their fixed values and hidden_act "swish" trains; LoRA's
 * scaling is range-checked at the flag and use_rslora goes through to the
 * PEFT files and the merge. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/model.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"

static char dir[256];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static bool output_has(const char *const *needles) {
    bool all = true;
    for (int i = 0; needles[i]; i++) all = cli_output_has(needles[i]) && all;
    return all;
}

static int vocab_of(const char *tok_path) {
    kiln_tokenizer *t = NULL;
    int n = kiln_tokenizer_load(tok_path, &t) ? -1 : kiln_tokenizer_vocab_size(t);
    kiln_tokenizer_free(t);
    return n;
}

/* DIR/NAME: an HF model directory (config.json with `extra` fields, random
 * weights, a copy of tok) of a one-layer qwen2 with vocab_size V */
static void hf_dir(const char *name, int V, const char *extra, const char *tok, char *out, size_t n) {
    snprintf(out, n, "%s/%s", dir, name);
    mkdir(out, 0755);
    char json[1024], path[700];
    snprintf(json, sizeof json,
             "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": %d, \"hidden_size\": 32,"
             " \"intermediate_size\": 40, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
             " \"max_position_embeddings\": 64, \"tie_word_embeddings\": true%s}",
             V, extra);
    snprintf(path, sizeof path, "%s/config.json", out);
    write_text(path, json);
    kiln_llama_config c;
    CHECK_OK(kiln_llama_config_parse(json, path, &c));
    kiln_llama *m = kiln_llama_new(&c, 11);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (m) CHECK_OK(kiln_save_weights(path, m));
    kiln_llama_free(m);
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    CHECK(!kiln_read_file(tok, &text, &len) && !kiln_write_file_atomic(path, text, len), "copy the tokenizer into %s", out);
    free(text);
}

/* kiln train --init init --data data --run-dir DIR/runN (a new one each
 * time: run names the last) + more flags */
static char run[400];
static int train_init(const char *init, const char *data, const char *const *more) {
    static int n_runs;
    snprintf(run, sizeof run, "%s/run%d", dir, n_runs++);
    const char *argv[40] = {"train", "--init", init, "--data", data, "--run-dir", run, "--steps", "1", "--seq-len", "16",
                            "--batch", "1", "--accum", "1", "--eval-every", "0", "--no-plot"};
    int k = 18;
    for (int i = 0; more && more[i] && k < 38; i++) argv[k++] = more[i];
    argv[k] = NULL;
    return cli_kiln_run(argv);
}

static void show_output(int rc) {
    if (!rc) return;
    char *o = cli_output();
    fprintf(stderr, "--- kiln said:\n%s---\n", o ? o : "");
    free(o);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_init_cli_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    char corpus[512], tok_a[512], tok_b[512], data_a[512], data_b[512];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(tok_a, sizeof tok_a, "%s/a.json", dir);
    snprintf(tok_b, sizeof tok_b, "%s/b.json", dir);
    snprintf(data_a, sizeof data_a, "%s/data_a", dir);
    snprintf(data_b, sizeof data_b, "%s/data_b", dir);
    FILE *f = fopen(corpus, "w");
    for (int p = 0; p < 80; p++)
        fprintf(f, "the lord said unto moses, go up into the mountain of god %d, and %d went up.\n\n", p, p * 7 + 3);
    fclose(f);
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", corpus, "--vocab-size", "420", "-o", tok_a, NULL}) == 0, "tokenizer a");
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", corpus, "--vocab-size", "300", "-o", tok_b, NULL}) == 0, "tokenizer b");
    CHECK(cli_kiln_run((const char *[]){"tokenize", corpus, "--tokenizer", tok_a, "-o", data_a, NULL}) == 0, "tokenize with a");
    CHECK(cli_kiln_run((const char *[]){"tokenize", corpus, "--tokenizer", tok_b, "-o", data_b, NULL}) == 0, "tokenize with b");
    int na = vocab_of(tok_a), nb = vocab_of(tok_b);
    printf("  tokenizer a: %d ids, b: %d ids\n", na, nb);
    CHECK(na > nb + 20 && nb > 0, "tokenizer a (%d ids) is larger than b (%d)", na, nb);
    char small[512], big[512], path[700], n1[32], n2[32];

    /* item 6: a tokenizer with ids past the model's vocab_size (shards of a
     * smaller tokenizer fit the model, so this trained, and generate then
     * refused the run): refused naming both files and both numbers */
    hf_dir("small", na - 10, "", tok_a, small, sizeof small);
    int rc = train_init(small, data_b, NULL);
    snprintf(n1, sizeof n1, "%d token ids", na);
    snprintf(n2, sizeof n2, "vocab_size %d", na - 10);
    snprintf(path, sizeof path, "%s/config.json", small);
    CHECK(rc == 1 && output_has((const char *[]){"small/tokenizer.json", path, n1, n2, NULL}),
          "a tokenizer larger than the model's vocab_size refused before step 1 (rc %d)", rc);
    snprintf(path, sizeof path, "%s/trainer_state.json", run);
    CHECK(access(path, F_OK) != 0, "nothing was trained");

    /* the shards' tokenizer against the --init one */
    hf_dir("big", na + 20, ", \"hidden_act\": \"swish\", \"mlp_bias\": false, \"attention_bias\": true", tok_a, big, sizeof big);
    rc = train_init(big, data_b, NULL);
    snprintf(n1, sizeof n1, "%d token ids", na);
    snprintf(n2, sizeof n2, "tokenizer of %d", nb);
    CHECK(rc == 1 && output_has((const char *[]){"big/tokenizer.json", "data_b/train.bin", n1, n2, "not the tokenizer", NULL}),
          "shards of another tokenizer refused naming both (rc %d)", rc);

    /* a smaller tokenizer than the model is fine (HF pads embeddings); the
     * model is announced as what it is, not as the default preset (item
     * 13); qwen2 with hidden_act swish and fixed fields trains (11, 12) */
    rc = train_init(big, data_a, NULL);
    show_output(rc);
    char want[700];
    snprintf(want, sizeof want, "model --init %s (qwen2, vocab %d, hidden 32, layers 1, heads 4, kv heads 2)", big, na + 20);
    char *said = cli_output();
    CHECK(rc == 0 && said && strstr(said, want) && !strstr(said, "demo"), "train --init announces '%s' (rc %d): %s", want, rc,
          said ? said : "");
    free(said);
    rc = cli_kiln_run((const char *[]){"generate", run, "--prompt", "the lord", "--max-tokens", "4", NULL});
    CHECK(rc == 0, "generate takes the run that trained (rc %d)", rc);

    /* generation_config.json of the --init model: an empty eos list (item
     * 9a), an eos id outside the tokenizer (generate refuses it) */
    snprintf(path, sizeof path, "%s/generation_config.json", big);
    write_text(path, "{\"eos_token_id\": []}");
    rc = train_init(big, data_a, NULL);
    CHECK(rc == 1 && output_has((const char *[]){path, "eos_token_id", "empty list", NULL}),
          "generation_config.json eos_token_id [] refused before step 1 (rc %d)", rc);
    char gen[100];
    snprintf(gen, sizeof gen, "{\"eos_token_id\": [1, %d]}", na + 5);
    write_text(path, gen);
    rc = train_init(big, data_a, NULL);
    snprintf(n1, sizeof n1, "eos id %d", na + 5);
    CHECK(rc == 1 && output_has((const char *[]){"big", n1, "outside the tokenizer", NULL}),
          "an eos id the tokenizer lacks refused at train, as generate would (rc %d)", rc);
    unlink(path);

    /* item 7: an absurd LoRA scaling is refused at the flag */
    rc = train_init(big, data_a, (const char *[]){"--lora-rank", "4", "--lora-alpha", "1e300", NULL});
    CHECK(rc == 2 && output_has((const char *[]){"--lora-alpha", "lora_alpha", "1e+300", "scaling", NULL}),
          "--lora-alpha 1e300 refused naming the flag and the scaling (rc %d)", rc);
    rc = train_init(big, data_a, (const char *[]){"--lora-rank", "1", "--lora-alpha", "20000", NULL});
    CHECK(rc == 2 && output_has((const char *[]){"--lora-alpha", "20000", NULL}), "scaling 2e4 refused (rc %d)", rc);

    /* use_rslora through the flag, the PEFT file and the merge */
    rc = train_init(big, data_a,
                    (const char *[]){"--lora-rank", "4", "--lora-alpha", "8", "--use-rslora", "--lora-targets", "all", "--lr",
                                     "5e-2", "--warmup", "0", NULL});
    show_output(rc);
    CHECK(rc == 0, "LoRA with --use-rslora trains (rc %d)", rc);
    snprintf(path, sizeof path, "%s/adapter_config.json", run);
    json_t *o = json_load_file(path, 0, NULL);
    CHECK(o && json_is_true(json_object_get(o, "use_rslora")) && json_integer_value(json_object_get(o, "r")) == 4,
          "adapter_config.json has use_rslora true");
    json_decref(o);
    kiln_llama *m = NULL;
    char ck[600];
    CHECK_OK(kiln_model_dir_resolve(run, ck, sizeof ck));
    snprintf(path, sizeof path, "%s/train_config.json", ck);
    o = json_load_file(path, 0, NULL);
    CHECK(o && json_is_true(json_object_get(o, "use_rslora")), "train_config.json keeps use_rslora");
    json_decref(o);
    CHECK_OK(kiln_load_model_dir(ck, &m));
    CHECK(m && m->lora.rslora && kiln_lora_scaling(&m->lora) == 4.0, "the run loads with scaling 8 / sqrt(4) = 4");
    kiln_llama_free(m);
    char merged[400];
    snprintf(merged, sizeof merged, "%s/merged", dir);
    rc = cli_kiln_run((const char *[]){"export", run, "--merge-lora", "-o", merged, NULL});
    CHECK(rc == 0, "export --merge-lora of the rslora run (rc %d)", rc);

    if (t_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_END();
}
