/* `kiln eval MODEL_DIR --text FILE`: the text tokenized with the model's own
 * tokenizer gives the loss `kiln eval --data` gives on shards `kiln
 * tokenize` made from the same text, and the loss kiln_evaluate computes on
 * them in process (printed to 6 significant digits); model directories with
 * BF16 shards work the same; bad arguments are refused naming the file.
 * Runs the kiln binary built beside this test. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"

static char dir[256];

/* "<what> loss X  perplexity P  (N tokens" of the last run: X as printed */
static bool printed_loss(const char *what, char *loss, size_t n, long long *tokens) {
    char *t = cli_output(), key[32];
    snprintf(key, sizeof key, "%s loss ", what);
    const char *p = strstr(t, key);
    bool ok = false;
    if (p) {
        char l[64], ppl[64];
        ok = sscanf(p + strlen(key), "%63s perplexity %63s (%lld tokens", l, ppl, tokens) == 3;
        snprintf(loss, n, "%s", l);
    }
    if (!ok) fprintf(stderr, "--- no '%s' line in:\n%s\n---\n", key, t);
    free(t);
    return ok;
}

static const char *path_in(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void write_corpus(const char *path) {
    static const char *words[] = {"the", "lord", "said", "unto", "moses", "and", "he", "went", "up", "into",
                                  "mountain", "of", "god", "in", "café", "naïve", "日本", "light", "day", "night"};
    FILE *f = fopen(path, "w");
    for (int p = 0; p < 40; p++) {
        for (int s = 0; s < 4; s++) {
            for (int w = 0; w < 10; w++)
                fprintf(f, "%s%s", w ? " " : "", words[kiln_rng_u64(11, (uint64_t)(p * 100 + s * 10 + w)) % 20]);
            fprintf(f, ". ");
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
}

/* The loss kiln eval prints, computed here through the library: packed rows
 * of T, batches of B, in order. */
static double library_loss(const char *model_dir, const char *shard, int B, int T, int64_t *tokens) {
    kiln_llama *m = NULL;
    CHECK_OK(kiln_load_model_dir(model_dir, &m));
    kiln_loader_config lc = {shard, B, T, KILN_PACK_PACKED, false, 0};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    kiln_batch *b = kiln_batch_alloc(B, T);
    double sum = 0;
    *tokens = 0;
    for (int64_t i = 0; m && l && b && i < kiln_loader_len(l); i++) {
        double li = 0;
        int64_t ti = 0;
        CHECK_OK(kiln_loader_get(l, 0, i, b));
        CHECK_OK(kiln_evaluate(m, &b, 1, &li, &ti));
        sum += li * (double)ti;
        *tokens += ti;
    }
    kiln_batch_free(b);
    kiln_loader_close(l);
    kiln_llama_free(m);
    return *tokens ? sum / (double)*tokens : NAN;
}

static void test_eval_text(void) {
    char text[512]; /* path_in's buffers are reused */
    snprintf(text, sizeof text, "%s", path_in("corpus.txt"));
    write_corpus(text);
    char *corpus = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(text, &corpus, &len));
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_train_text(corpus, len, 320, &tok));
    free(corpus);
    if (!tok) return;
    char model[512], bf16[512];
    snprintf(model, sizeof model, "%s", path_in("model"));
    snprintf(bf16, sizeof bf16, "%s", path_in("model_bf16"));
    mkdir(model, 0777);
    mkdir(bf16, 0777);
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    c.vocab_size = kiln_tokenizer_vocab_size(tok), c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 8, c.max_position_embeddings = 64;
    kiln_llama *m = kiln_llama_new(&c, 5);
    char p[600];
    const char *dirs[2] = {model, bf16};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/config.json", dirs[i]);
        CHECK_OK(kiln_llama_config_save(p, &c));
        snprintf(p, sizeof p, "%s/tokenizer.json", dirs[i]);
        CHECK_OK(kiln_tokenizer_save(tok, p));
        kiln_weights_options o = {i ? KILN_BF16 : KILN_F32, i ? 20000 : 0};
        CHECK_OK(kiln_save_model_weights(dirs[i], m, &o));
    }
    kiln_llama_free(m);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", bf16);
    CHECK(access(p, R_OK) == 0, "the BF16 model is sharded");

    /* shards of the same text, made by kiln tokenize: everything in train.bin */
    char shards[512], tpath[600];
    snprintf(shards, sizeof shards, "%s", path_in("shards"));
    CHECK(cli_kiln_run((const char *[]){"tokenize", text, "--tokenizer", path_in("model/tokenizer.json"), "-o", shards,
                                    "--val-frac", "0", NULL}) == 0,
          "kiln tokenize");
    snprintf(tpath, sizeof tpath, "%s/train.bin", shards);
    snprintf(p, sizeof p, "%s/val.bin", shards);
    CHECK(rename(tpath, p) == 0, "train.bin -> val.bin");

    for (int i = 0; i < 2; i++) {
        char lt[64] = "", lv[64] = "", want[64];
        long long nt = 0, nv = 0;
        CHECK(cli_kiln_run((const char *[]){"eval", dirs[i], "--text", text, "--seq-len", "16", "--batch", "4", NULL}) == 0,
              "eval --text on %s", dirs[i]);
        CHECK(printed_loss("text", lt, sizeof lt, &nt), "text loss printed");
        CHECK(cli_kiln_run((const char *[]){"eval", dirs[i], "--data", shards, "--seq-len", "16", "--batch", "4", NULL}) == 0,
              "eval --data on %s", dirs[i]);
        CHECK(printed_loss("val", lv, sizeof lv, &nv), "val loss printed");
        int64_t tokens = 0;
        double l = library_loss(dirs[i], p, 4, 16, &tokens);
        snprintf(want, sizeof want, "%#.6g", l);
        printf("  %s: --text %s (%lld tokens), shards %s (%lld tokens), library %.9f\n", dirs[i], lt, nt, lv, nv, l);
        CHECK(!strcmp(lt, lv) && nt == nv, "--text gives %s over %lld tokens, the shards %s over %lld", lt, nt, lv, nv);
        CHECK(!strcmp(lt, want) && nt == tokens, "printed %s, the library computes %s", lt, want);
        CHECK(strlen(lt) == 7, "6 significant digits: %s", lt);
    }

    /* refusals */
    CHECK(cli_kiln_run((const char *[]){"eval", model, "--text", path_in("nope.txt"), NULL}) == 1 && cli_output_has("nope.txt"),
          "a missing --text file is named");
    snprintf(p, sizeof p, "%s/tokenizer.json", bf16);
    unlink(p);
    CHECK(cli_kiln_run((const char *[]){"eval", bf16, "--text", text, NULL}) == 1 && cli_output_has("tokenizer.json"),
          "a model without tokenizer.json is refused for --text, naming it");
    CHECK(cli_kiln_run((const char *[]){"eval", model, "--text", text, "--data", shards, NULL}) == 2, "--text with --data");
    CHECK(cli_kiln_run((const char *[]){"eval", "--help", NULL}) == 0 && cli_output_has("--resume") && cli_output_has("--text"),
          "eval --help says what it loads");
    kiln_tokenizer_free(tok);
}

int main(void) {
    kiln_log_set_level(KILN_LOG_ERROR);
    snprintf(dir, sizeof dir, "/tmp/kiln_test_eval_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    test_eval_text();
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
