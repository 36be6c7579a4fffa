/* On the whole default corpus (the King James Bible from Debian's
 * bible-kjv, written by scripts/corpus.sh): a tokenizer trained here, saved
 * as tokenizer.json and loaded back gives identical ids, and decoding gives
 * back the exact bytes. Skipped (with a note) where `bible` is missing. */
#include <stdlib.h>
#include <unistd.h>
#include "kiln/data.h"
#include "test.h"

int main(void) {
    char dir[64];
    if (!t_tmpdir(dir, sizeof dir, "test_corpus")) return 1;
    char corpus[128], tokpath[128], cmd[400];
    snprintf(corpus, sizeof corpus, "%s/kjv.txt", dir);
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", dir);
    if (system("command -v bible >/dev/null 2>&1") != 0) {
        printf("bible-kjv not installed: corpus test skipped (scripts/deps.sh installs it)\n");
        TEST_END();
    }
    snprintf(cmd, sizeof cmd, "bash scripts/corpus.sh %s", corpus);
    CHECK(system(cmd) == 0, "scripts/corpus.sh");
    char *text;
    size_t n;
    CHECK_OK(kiln_read_file(corpus, &text, &n));
    if (!text) TEST_END();
    CHECK(n > 4000000, "the whole corpus (%zu bytes)", n);
    kiln_tokenizer *tok = NULL, *back = NULL;
    const char *paths[1] = {corpus};
    double t0 = kiln_time_now();
    CHECK_OK(kiln_tokenizer_train(paths, 1, 8192, &tok));
    double t1 = kiln_time_now();
    CHECK_OK(kiln_tokenizer_save(tok, tokpath));
    CHECK_OK(kiln_tokenizer_load(tokpath, &back));
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    double t2 = kiln_time_now();
    CHECK_OK(kiln_tokenizer_encode(tok, text, n, &a, &na));
    double t3 = kiln_time_now();
    CHECK_OK(kiln_tokenizer_encode(back, text, n, &b, &nb));
    CHECK(na == nb && na > 0 && memcmp(a, b, na * sizeof *a) == 0, "reloaded tokenizer.json gives identical ids (%zu)", na);
    char *dec = NULL;
    size_t nd = 0;
    CHECK_OK(kiln_tokenizer_decode(back, b, nb, &dec, &nd));
    CHECK(nd == n && dec && memcmp(dec, text, n) == 0, "decode(encode(corpus)) == corpus");
    printf("corpus %.2f MB: BPE training at vocab 8192 %.2f s, %zu tokens (%.2f bytes/token), encode %.0f MB/s\n", n / 1e6,
           t1 - t0, na, (double)n / (double)na, n / 1e6 / (t3 - t2));
    free(dec);
    free(a);
    free(b);
    free(text);
    kiln_tokenizer_free(tok);
    kiln_tokenizer_free(back);
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
