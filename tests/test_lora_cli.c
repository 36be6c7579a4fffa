/* `kiln export RUN --merge-lora -o DIR` as a person runs it, through the
 * kiln binary built beside this test: a tiny LoRA run trained from a
 * generated corpus, exported merged; the merged directory is a plain model
 * directory (config, weights, tokenizer files, generation config, no
 * adapter or trainer files), its `kiln eval` loss equals the LoRA run's to
 * float rounding, greedy `kiln generate` gives the same text, and the merge
 * really changed the weights it targets. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/safetensors.h"
#include "cli_run.h"
#include "test.h"

static char dir[256];

/* "val loss X" of the last `kiln eval` */
static double eval_loss(void) {
    char *text = cli_output();
    const char *p = strstr(text, "val loss ");
    double v = p ? strtod(p + 9, NULL) : NAN;
    if (!p) fprintf(stderr, "--- no val loss in:\n%s\n---\n", text);
    free(text);
    return v;
}

/* the generated text of the last `kiln generate`, without its timing line */
static char *generated(void) {
    char *text = cli_output();
    char *t = strstr(text, "\n[");
    if (t) *t = 0;
    return text;
}

static bool exists(const char *d, const char *name) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", d, name);
    return access(p, F_OK) == 0;
}

static void write_corpus(const char *path) {
    static const char *words[] = {"the", "lord", "said", "unto", "moses", "and", "he", "went", "up", "into",
                                  "mountain", "of", "god", "in", "beginning", "was", "word", "light", "day", "night"};
    FILE *f = fopen(path, "w");
    for (int p = 0; p < 200; p++) {
        for (int s = 0; s < 6; s++) {
            for (int w = 0; w < 12; w++)
                fprintf(f, "%s%s", w ? " " : "", words[kiln_rng_u64(11, (uint64_t)(p * 100 + s * 12 + w)) % 20]);
            fprintf(f, ". ");
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
}

/* largest |a - b| over the tensors both files name, and how many differ */
static double weights_diff(const char *fa, const char *fb, int *n_changed, int *n_common) {
    kiln_st_file *a = NULL, *b = NULL;
    double worst = 0;
    *n_changed = *n_common = 0;
    CHECK_OK(kiln_st_open(fa, &a));
    CHECK_OK(kiln_st_open(fb, &b));
    for (int i = 0; a && b && i < kiln_st_count(a); i++) {
        const kiln_st_tensor *x = kiln_st_at(a, i), *y = kiln_st_find(b, x->name);
        if (!y || x->dtype != KILN_F32 || y->dtype != KILN_F32 || x->nbytes != y->nbytes) continue;
        (*n_common)++;
        double d = 0;
        for (size_t k = 0; k < x->nbytes / 4; k++) d = fmax(d, fabs((double)((const float *)x->bytes)[k] - ((const float *)y->bytes)[k]));
        *n_changed += d > 0;
        worst = fmax(worst, d);
    }
    kiln_st_close(a);
    kiln_st_close(b);
    return worst;
}

static void merge_export(void) {
    char corpus[512], tok[512], data[512], run[512], merged[512], p1[800], p2[800];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(run, sizeof run, "%s/lora", dir);
    snprintf(merged, sizeof merged, "%s/merged", dir);
    write_corpus(corpus);
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", corpus, "--vocab-size", "300", "-o", tok, NULL}) == 0, "tokenizer train");
    CHECK(cli_kiln_run((const char *[]){"tokenize", corpus, "--tokenizer", tok, "-o", data, NULL}) == 0, "tokenize");
    int rc = cli_kiln_run((const char *[]){"train", "--data", data, "--tokenizer", tok, "--run-dir", run, "--model", "tiny",
                                       "--seq-len", "32", "--batch", "2", "--accum", "1", "--steps", "6", "--warmup", "1",
                                       "--lr", "2e-2", "--eval-every", "0", "--no-plot", "--lora-rank", "4", "--lora-alpha",
                                       "16", "--lora-targets", "all", NULL});
    CHECK(rc == 0, "LoRA training through the CLI (rc %d)", rc);
    if (rc) {
        char *o = cli_output();
        fprintf(stderr, "--- kiln train:\n%s\n---\n", o);
        free(o);
        return;
    }
    rc = cli_kiln_run((const char *[]){"export", run, "--merge-lora", "-o", merged, NULL});
    CHECK(rc == 0 && cli_output_has("merged"), "kiln export --merge-lora (rc %d)", rc);

    /* a plain model directory: what a model needs, nothing of the run */
    const char *must[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 5; i++) CHECK(exists(merged, must[i]), "merged directory has %s", must[i]);
    const char *mustnt[] = {"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json",
                            "train_config.json"};
    for (int i = 0; i < 5; i++) CHECK(!exists(merged, mustnt[i]), "merged directory has no %s", mustnt[i]);

    /* the merge moved exactly the targeted linears (all 7 per layer) */
    snprintf(p1, sizeof p1, "%s/model.safetensors", run);
    snprintf(p2, sizeof p2, "%s/model.safetensors", merged);
    int changed = 0, common = 0;
    double d = weights_diff(p1, p2, &changed, &common);
    printf("  merge changed %d of %d base tensors (max |dW| %.3e)\n", changed, common, d);
    CHECK(common > 0 && changed == 7 * 2, "the 14 targeted weights of the 2 layers changed (%d of %d)", changed, common);

    /* loss of the merged directory = loss of base + adapters */
    const char *bt[] = {"--data", data, "--batch", "2", "--seq-len", "32", "--batches", "8", NULL};
    const char *ev_run[12] = {"eval", run}, *ev_merged[12] = {"eval", merged};
    for (int i = 0; bt[i]; i++) ev_run[2 + i] = ev_merged[2 + i] = bt[i];
    CHECK(cli_kiln_run(ev_run) == 0, "kiln eval of the LoRA run");
    double l_run = eval_loss();
    CHECK(cli_kiln_run(ev_merged) == 0, "kiln eval of the merged directory");
    double l_merged = eval_loss();
    printf("  kiln eval: LoRA run %.6g, merged %.6g\n", l_run, l_merged);
    CHECK(isfinite(l_run) && t_rel(l_run, l_merged) < 2e-5, "merged loss %.6g = LoRA run loss %.6g", l_merged, l_run);

    /* greedy generation: the same text from both */
    const char *gen[] = {"generate", run, "--prompt", "the lord said", "--max-tokens", "12", "--temperature", "0", NULL};
    CHECK(cli_kiln_run(gen) == 0, "generate from the LoRA run");
    char *g_run = generated();
    gen[1] = merged;
    CHECK(cli_kiln_run(gen) == 0, "generate from the merged directory");
    char *g_merged = generated();
    CHECK(g_run && g_merged && !strcmp(g_run, g_merged) && strlen(g_run) > strlen("the lord said"),
          "greedy text equal: '%s' vs '%s'", g_run ? g_run : "", g_merged ? g_merged : "");
    free(g_run);
    free(g_merged);

    /* a directory without adapters has nothing to merge */
    snprintf(p1, sizeof p1, "%s/again", dir);
    rc = cli_kiln_run((const char *[]){"export", merged, "--merge-lora", "-o", p1, NULL});
    CHECK(rc == 1 && cli_output_has("no LoRA adapters") && cli_output_has("adapter_config.json"),
          "--merge-lora of a plain model is refused naming adapter_config.json (rc %d)", rc);
    rc = cli_kiln_run((const char *[]){"export", run, "--merge-lora", NULL});
    CHECK(rc == 2 && cli_output_has("-o"), "--merge-lora without -o is a usage error (rc %d)", rc);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_lora_cli_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    setenv("KILN_CACHE_DIR", dir, 1);
    merge_export();
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
