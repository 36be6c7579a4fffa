/* Tokenizer benchmark: BPE training time at vocab 8192 and encoding MB/s on
 * 1 and 2 threads.
 *   build/bench/tokenizer [CORPUS] [VOCAB]
 * Without CORPUS it writes the default corpus with scripts/corpus.sh into
 * /tmp/kiln_bench_corpus.txt (needs the bible-kjv package). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/data.h"

static double encode_mbs(const kiln_tokenizer *t, const char *text, size_t n, int threads, size_t *n_ids) {
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
        free(ids);
        if (dt < best) best = dt;
    }
    return (double)n / 1e6 / best;
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
    double one = encode_mbs(t, text, n, 1, &n_ids);
    double two = encode_mbs(t, text, n, 2, &n_ids);
    printf("encode: %.1f MB/s on 1 thread, %.1f MB/s on 2 threads (%zu tokens, %.2f bytes/token)\n", one, two, n_ids,
           (double)n / (double)n_ids);
    kiln_set_num_threads(threads);
    kiln_tokenizer_free(t);
    free(text);
    return 0;
}
