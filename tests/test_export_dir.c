/* `kiln export RUN --merge-lora -o DIR` as a person runs it (the kiln
 * binary beside this test), on a tiny LoRA run trained from a random base
 * model directory (--init):
 *   - targets that would destroy something are refused, naming both paths,
 *     and leave every byte as it was: a checkpoint of the run (the bug:
 *     merged weights over the base, adapters kept, applied twice), the run
 *     directory and anything inside it, the base model directory, a
 *     non-empty directory without config.json, a model directory holding a
 *     file kiln does not write;
 *   - an export into an old export replaces it whole: no adapter file and
 *     no stale chat_template.jinja survives;
 *   - 30 SIGKILLs at staggered delays during an export into an existing
 *     export: afterwards the directory is, file set and bytes, either the
 *     old export or the new one (0 mixed), and what the killed runs left
 *     beside it is removed by the next export, which says so;
 *   - a GGUF export removes the temporaries a killed one left. */
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "kiln/train.h"
#include "cli_run.h"
#include "test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static char dir[256];

static void write_corpus(const char *path) {
    static const char *words[] = {"the", "lord", "said", "unto", "moses", "and", "he", "went", "up", "into",
                                  "mountain", "of", "god", "in", "beginning", "was", "word", "light", "day", "night"};
    FILE *f = fopen(path, "w");
    for (int p = 0; p < 100; p++) {
        for (int w = 0; w < 60; w++) fprintf(f, "%s%s", w ? " " : "", words[kiln_rng_u64(11, (uint64_t)(p * 100 + w)) % 20]);
        fprintf(f, ".\n\n");
    }
    fclose(f);
}

/* ---- a directory as a sorted list of (name, bytes) --------------------- */

typedef struct {
    int n;
    char names[32][96];
    char *data[32];
    size_t len[32];
} snapshot;

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

static bool snap(const char *d, snapshot *s) {
    memset(s, 0, sizeof *s);
    DIR *dd = opendir(d);
    if (!dd) return false;
    for (struct dirent *e; (e = readdir(dd));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && s->n < 32) snprintf(s->names[s->n++], 96, "%s", e->d_name);
    closedir(dd);
    qsort(s->names, (size_t)s->n, sizeof s->names[0], cmp_name);
    for (int i = 0; i < s->n; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/%s", d, s->names[i]);
        if (kiln_read_file(p, &s->data[i], &s->len[i])) s->data[i] = NULL, s->len[i] = (size_t)-1;
    }
    return true;
}

static void snap_free(snapshot *s) {
    for (int i = 0; i < s->n; i++) free(s->data[i]);
    memset(s, 0, sizeof *s);
}

static bool snap_equal(const snapshot *a, const snapshot *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->names[i], b->names[i]) || a->len[i] != b->len[i] || !a->data[i] || !b->data[i] ||
            memcmp(a->data[i], b->data[i], a->len[i]))
            return false;
    return true;
}

static bool has(const snapshot *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return true;
    return false;
}

static void copy_dir(const char *from, const char *to) {
    char cmd[1800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void put(const char *d, const char *name, const char *text) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", d, name);
    CHECK_OK(kiln_write_file_atomic(p, text, strlen(text)));
}

static void put_file(const char *d, const char *name, const char *from_dir) {
    char p[800], q[800], *text = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/%s", d, name);
    snprintf(q, sizeof q, "%s/%s", from_dir, name);
    CHECK_OK(kiln_read_file(q, &text, &n));
    if (text) CHECK_OK(kiln_write_file_atomic(p, text, n));
    free(text);
}

/* entries of dir whose names start with prefix */
static int count_prefix(const char *d, const char *prefix) {
    DIR *dd = opendir(d);
    int n = 0;
    for (struct dirent *e; dd && (e = readdir(dd));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (dd) closedir(dd);
    return n;
}

/* a random base model directory (what --init starts from) */
static void make_base(const char *mdir, const char *tok_path) {
    kiln_llama_config c;
    kiln_llama_config_default(&c);
    /* 3.5 M parameters (14 MB of F32): an export takes long enough for kills
     * to land in every phase of it */
    c.vocab_size = 300, c.hidden_size = 256, c.intermediate_size = 768, c.num_hidden_layers = 4;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64, c.max_position_embeddings = 128;
    c.bos_token_id = KILN_TOK_BOS, c.eos_token_id = KILN_TOK_EOS, c.pad_token_id = KILN_TOK_PAD;
    kiln_llama *m = kiln_llama_new(&c, 3);
    CHECK(m != NULL, "base model");
    if (!m) return;
    char p[800];
    mkdir(mdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", mdir);
    CHECK_OK(kiln_llama_config_save(p, &c));
    snprintf(p, sizeof p, "%s/model.safetensors", mdir);
    CHECK_OK(kiln_save_weights(p, m));
    kiln_llama_free(m);
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(tok_path, &text, &n));
    snprintf(p, sizeof p, "%s/tokenizer.json", mdir);
    if (text) CHECK_OK(kiln_write_file_atomic(p, text, n));
    free(text);
}

/* kiln export SRC --merge-lora -o OUT must fail (rc 1), name every needle,
 * and leave `keep` (a directory) byte for byte as it was */
static void refused(const char *what, const char *src, const char *out, const char *keep, const char *const *needles) {
    snapshot before, after;
    snap(keep, &before);
    int rc = cli_kiln_run((const char *[]){"export", src, "--merge-lora", "-o", out, NULL});
    char *o = cli_output();
    bool named = true;
    for (int i = 0; needles[i]; i++) named = named && strstr(o, needles[i]);
    CHECK(rc == 1 && named, "%s: rc %d; the message must name %s and %s: %s", what, rc, needles[0], needles[1] ? needles[1] : "",
          o);
    if (rc == 1) printf("  refused (%s): %s", what, o);
    free(o);
    snap(keep, &after);
    CHECK(before.n > 0 && snap_equal(&before, &after), "%s: %s changed", what, keep);
    snap_free(&before), snap_free(&after);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_export_dir_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    setenv("KILN_CACHE_DIR", dir, 1);
    double t_start = kiln_time_now();
    char corpus[400], tok[400], data[400], base[400], run[400], ck_old[600], ck_new[600], ref_old[400], ref_new[400], out[400];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(base, sizeof base, "%s/base", dir);
    snprintf(run, sizeof run, "%s/lora", dir);
    snprintf(ck_old, sizeof ck_old, "%s/checkpoint-00000002", run);
    snprintf(ck_new, sizeof ck_new, "%s/checkpoint-00000004", run);
    snprintf(ref_old, sizeof ref_old, "%s/ref-old", dir);
    snprintf(ref_new, sizeof ref_new, "%s/ref-new", dir);
    snprintf(out, sizeof out, "%s/merged", dir);
    write_corpus(corpus);
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", corpus, "--vocab-size", "300", "-o", tok, NULL}) == 0, "tokenizer train");
    CHECK(cli_kiln_run((const char *[]){"tokenize", corpus, "--tokenizer", tok, "-o", data, NULL}) == 0, "tokenize");
    make_base(base, tok);
    int rc = cli_kiln_run((const char *[]){"train", "--init", base, "--data", data, "--tokenizer", tok, "--run-dir", run,
                                       "--seq-len", "32", "--batch", "2", "--accum", "1", "--steps", "4", "--save-every", "2",
                                       "--keep", "0", "--warmup", "1", "--lr", "2e-2", "--eval-every", "0", "--no-plot",
                                       "--threads", "1", "--lora-rank", "4", "--lora-alpha", "16", "--lora-targets", "all", NULL});
    CHECK(rc == 0 && access(ck_old, F_OK) == 0 && access(ck_new, F_OK) == 0, "LoRA training with two checkpoints (rc %d)", rc);
    if (rc) {
        char *o = cli_output();
        fprintf(stderr, "--- kiln train:\n%s\n---\n", o);
        free(o);
        TEST_END();
    }

    /* item 2: the destructive targets */
    refused("a checkpoint of the run", run, ck_new, ck_new, (const char *[]){ck_new, "checkpoint of", run, NULL});
    refused("an older checkpoint into the newest", ck_old, ck_new, ck_new, (const char *[]){ck_new, "trainer_state.json", NULL});
    refused("the run directory itself", run, run, ck_new, (const char *[]){"refusing", run, NULL});
    char inside[600];
    snprintf(inside, sizeof inside, "%s/merged", run);
    refused("a new directory inside the run", run, inside, ck_new, (const char *[]){inside, run, NULL});
    refused("the base model directory", run, base, base, (const char *[]){base, "base model", NULL});
    char user[400];
    snprintf(user, sizeof user, "%s/user", dir);
    mkdir(user, 0755);
    put(user, "thesis.tex", "my data\n");
    refused("a directory without config.json", run, user, user, (const char *[]){user, "config.json", NULL});
    put(user, "config.json", "{}");
    refused("a model directory with a file kiln does not write", run, user, user, (const char *[]){user, "thesis.tex", NULL});

    /* the two known-good exports; the old one as an older kiln left it
     * (the checkpoint's adapter files beside its weights) plus a chat
     * template the new export does not have */
    CHECK(cli_kiln_run((const char *[]){"export", ck_old, "--merge-lora", "-o", ref_old, NULL}) == 0, "export of the old checkpoint");
    put_file(ref_old, "adapter_config.json", ck_old);
    put_file(ref_old, "adapter_model.safetensors", ck_old);
    put(ref_old, "chat_template.jinja", "{{ messages[0]['content'] }}");
    double t0 = kiln_time_now();
    CHECK(cli_kiln_run((const char *[]){"export", run, "--merge-lora", "-o", ref_new, NULL}) == 0, "export of the run");
    double t_export = kiln_time_now() - t0;
    snapshot A, B, S;
    snap(ref_old, &A), snap(ref_new, &B);
    CHECK(has(&A, "adapter_model.safetensors") && has(&A, "chat_template.jinja") && !snap_equal(&A, &B), "two different exports");
    const char *mustnt[] = {"adapter_config.json", "adapter_model.safetensors", "chat_template.jinja", "trainer_state.json",
                            "optimizer.safetensors"};
    for (int i = 0; i < 5; i++) CHECK(!has(&B, mustnt[i]), "the merged directory has no %s", mustnt[i]);
    CHECK(has(&B, "config.json") && has(&B, "model.safetensors") && has(&B, "tokenizer.json"), "the merged directory is a model");

    /* an export over the old one replaces it whole */
    copy_dir(ref_old, out);
    CHECK(cli_kiln_run((const char *[]){"export", run, "--merge-lora", "-o", out, NULL}) == 0, "export over an old export");
    snap(out, &S);
    CHECK(snap_equal(&S, &B), "an export over an old one is exactly the new export (%d files; no adapter or stale file)", S.n);
    snap_free(&S);

    /* 30 kills at staggered delays (0 to 2x a whole export) */
    enum { KILLS = 30 };
    int n_old = 0, n_new = 0, n_mixed = 0, n_left = 0;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "merged.");
    for (int k = 0; k < KILLS; k++) {
        copy_dir(ref_old, out);
        double delay = t_export * 2.0 * k / (KILLS - 1);
        rc = cli_kiln_signal((const char *[]){"export", run, "--merge-lora", "-o", out, NULL}, SIGKILL, delay);
        snap(out, &S);
        bool is_old = snap_equal(&S, &A), is_new = snap_equal(&S, &B);
        n_old += is_old, n_new += is_new, n_mixed += !is_old && !is_new;
        if (!is_old && !is_new) {
            fprintf(stderr, "  kill %d after %.3f s: a mixed directory of %d files:", k, delay, S.n);
            for (int i = 0; i < S.n; i++) fprintf(stderr, " %s", S.names[i]);
            fprintf(stderr, "\n");
        }
        snap_free(&S);
        n_left += count_prefix(dir, prefix) > 0;
    }
    printf("  %d kills (0 to %.3f s; a whole export takes %.3f s): %d left the old export, %d the new, %d mixed; %d left "
           "temporaries beside it\n",
           KILLS, 2 * t_export, t_export, n_old, n_new, n_mixed, n_left);
    CHECK(n_mixed == 0, "%d of %d killed exports left a mixed directory", n_mixed, KILLS);
    CHECK(n_old > 0 && n_new > 0, "the kills landed on both sides of the swap (old %d, new %d)", n_old, n_new);
    /* one more killed mid-way, for sure leaving its staging directory */
    copy_dir(ref_old, out);
    int left_before = count_prefix(dir, prefix);
    rc = cli_exec((const char *[]){"true", NULL});
    char fake[600];
    {
        pid_t p = fork(); /* a pid that is certainly gone */
        if (p == 0) _exit(0);
        waitpid(p, NULL, 0);
        snprintf(fake, sizeof fake, "%s/merged.kiln-tmp-%d", dir, (int)p);
        mkdir(fake, 0755);
        put(fake, "model.safetensors", "half a file");
    }
    CHECK(cli_kiln_run((const char *[]){"export", run, "--merge-lora", "-o", out, NULL}) == 0, "export after the kills");
    CHECK(cli_output_has("removed") && cli_output_has("leftover") && cli_output_has("kiln-tmp-"),
          "the next export says it removed the leftovers (%d before)", left_before + 1);
    CHECK(count_prefix(dir, prefix) == 0, "no leftovers after the next export (%d)", count_prefix(dir, prefix));
    snap(out, &S);
    CHECK(snap_equal(&S, &B), "the next export completes the new directory");
    snap_free(&S);

    /* a GGUF export removes what a killed one left */
    char gguf[400], gtmp[600];
    snprintf(gguf, sizeof gguf, "%s/m.gguf", dir);
    {
        pid_t p = fork();
        if (p == 0) _exit(0);
        waitpid(p, NULL, 0);
        snprintf(gtmp, sizeof gtmp, "%s.tmp.%d.%d.123", gguf, (int)p, (int)p);
    }
    put(dir, strrchr(gtmp, '/') + 1, "a partial GGUF");
    rc = cli_kiln_run((const char *[]){"export", ref_new, "--gguf", gguf, NULL});
    CHECK(rc == 0 && access(gguf, F_OK) == 0 && access(gtmp, F_OK) != 0 && cli_output_has("removed 1 leftover"),
          "kiln export --gguf removes a dead export's temporary (rc %d)", rc);
    snap_free(&A), snap_free(&B);
    printf("  %.1f s in all\n", kiln_time_now() - t_start);
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
