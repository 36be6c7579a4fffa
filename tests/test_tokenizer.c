/* Tokenizer: exact round trips, a hand-written tokenizer.json, save/load
 * equality, parallel == serial encoding, malformed files. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln/data.h"
#include "test.h"

static char tmpdir[64];

static const char *tmp_path(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", tmpdir, name);
    return buf;
}

static void write_text(const char *path, const char *s) {
    CHECK_OK(kiln_write_file_atomic(path, s, strlen(s)));
}

/* Pseudo-English from syllables, with punctuation, digits, UTF-8 and newlines. */
static char *gen_text(uint64_t seed, size_t n) {
    static const char *syl[] = {"the", "an", "ing", "er", "qu", "ab", "lo", "re", "ti", "on", "s", "ka", "mo"};
    static const char *punct[] = {",", ".", "!", "'s", "'ll", " --", ":", "\xc3\xa9t\xc3\xa9", "\xe2\x80\x94", "\xf0\x9f\x99\x82"};
    char *s = malloc(n + 64);
    size_t p = 0;
    for (uint64_t k = 0; p < n; k++) {
        uint64_t r = kiln_rng_u64(seed, k);
        int nsyl = 1 + (int)(r % 3);
        if (p) s[p++] = (r >> 8) % 17 == 0 ? '\n' : ' ';
        for (int i = 0; i < nsyl; i++) {
            const char *y = syl[(r >> (12 + 4 * i)) % 13];
            memcpy(s + p, y, strlen(y));
            p += strlen(y);
        }
        if ((r >> 40) % 7 == 0) {
            const char *q = punct[(r >> 44) % 10];
            memcpy(s + p, q, strlen(q));
            p += strlen(q);
        }
        if ((r >> 50) % 23 == 0) p += (size_t)sprintf(s + p, " %u", (unsigned)(r >> 54));
    }
    s[p] = 0;
    return s;
}

static void check_roundtrip(const kiln_tokenizer *t, const char *s, size_t n, const char *what) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *back = NULL;
    size_t blen = 0;
    CHECK_OK(kiln_tokenizer_encode(t, s, n, &ids, &n_ids));
    CHECK_OK(kiln_tokenizer_decode(t, ids, n_ids, &back, &blen));
    CHECK(back && blen == n && (n == 0 || memcmp(back, s, n) == 0), "round trip of %s (%zu bytes) -> %zu bytes", what, n, blen);
    CHECK(n_ids <= n, "%s: %zu ids for %zu bytes", what, n_ids, n);
    free(ids);
    free(back);
}

static void test_roundtrips(const kiln_tokenizer *t) {
    check_roundtrip(t, "", 0, "empty");
    const char *ws[] = {" ", "   ", "\n", "\n\n\t  \r\n", " \t", "a  b   c\n\n d"};
    for (int i = 0; i < 6; i++) check_roundtrip(t, ws[i], strlen(ws[i]), "whitespace");
    const char *utf = "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80!! "
                      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 don't we'll 12345";
    check_roundtrip(t, utf, strlen(utf), "utf-8");
    char buf[3000];
    for (uint64_t k = 0; k < 200; k++) {
        size_t n = (size_t)(kiln_rng_u64(7, k) % sizeof buf);
        for (size_t i = 0; i < n; i++) buf[i] = (char)(kiln_rng_u64(k + 100, i) & 0xff);
        check_roundtrip(t, buf, n, "random bytes");
    }
    /* Long single pre-tokens take the heap path of the merger. */
    char *longw = malloc(20001);
    for (int i = 0; i < 20000; i++) longw[i] = "abqu"[i % 4];
    check_roundtrip(t, longw, 20000, "a 20000-byte word");
    memset(longw, ' ', 20000);
    check_roundtrip(t, longw, 20000, "20000 spaces");
    free(longw);
}

/* Inputs above the parallel threshold give the same ids on 1 and 2 threads. */
static void test_parallel(const kiln_tokenizer *t) {
    char *big = gen_text(99, 400000);
    size_t n = strlen(big);
    int32_t *a, *b;
    size_t na, nb;
    int saved = kiln_num_threads();
    kiln_set_num_threads(1);
    CHECK_OK(kiln_tokenizer_encode(t, big, n, &a, &na));
    kiln_set_num_threads(2);
    CHECK_OK(kiln_tokenizer_encode(t, big, n, &b, &nb));
    kiln_set_num_threads(saved);
    CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0, "1 vs 2 threads: %zu vs %zu ids", na, nb);
    CHECK(na < n / 2, "trained merges compress: %zu ids for %zu bytes", na, n);
    /* encode_docs == encode of each document + eos */
    size_t starts[3] = {0, 1000, 5000}, lens[3] = {1000, 0, 3000};
    int32_t *d;
    size_t nd;
    CHECK_OK(kiln_tokenizer_encode_docs(t, big, starts, lens, 3, KILN_TOK_EOS, &d, &nd));
    size_t pos = 0;
    for (int k = 0; k < 3; k++) {
        int32_t *e;
        size_t ne;
        CHECK_OK(kiln_tokenizer_encode(t, big + starts[k], lens[k], &e, &ne));
        CHECK(pos + ne + 1 <= nd && (ne == 0 || memcmp(d + pos, e, ne * sizeof *e) == 0) && d[pos + ne] == KILN_TOK_EOS,
              "encode_docs document %d", k);
        pos += ne + 1;
        free(e);
    }
    CHECK(pos == nd, "encode_docs length %zu vs %zu", nd, pos);
    free(d);
    /* one document larger than the parallel threshold */
    size_t whole = 0;
    kiln_set_num_threads(2);
    CHECK_OK(kiln_tokenizer_encode_docs(t, big, &whole, &n, 1, KILN_TOK_EOS, &d, &nd));
    kiln_set_num_threads(saved);
    CHECK(nd == na + 1 && !memcmp(d, a, na * sizeof *a) && d[na] == KILN_TOK_EOS, "one big document");
    free(d);
    free(a);
    free(b);
    free(big);
}

static void test_save_load(const kiln_tokenizer *t) {
    char path[128];
    tmp_path("trained.json", path, sizeof path);
    CHECK_OK(kiln_tokenizer_save(t, path));
    kiln_tokenizer *u = NULL;
    CHECK_OK(kiln_tokenizer_load(path, &u));
    if (!u) return;
    CHECK(kiln_tokenizer_vocab_size(u) == kiln_tokenizer_vocab_size(t), "vocab %d vs %d", kiln_tokenizer_vocab_size(u),
          kiln_tokenizer_vocab_size(t));
    CHECK(kiln_tokenizer_n_merges(u) == kiln_tokenizer_n_merges(t), "merges");
    CHECK(kiln_tokenizer_bos(u) == 0 && kiln_tokenizer_eos(u) == 1 && kiln_tokenizer_pad(u) == 2, "special ids");
    char *text = gen_text(5, 50000);
    int32_t *a, *b;
    size_t na, nb;
    CHECK_OK(kiln_tokenizer_encode(t, text, strlen(text), &a, &na));
    CHECK_OK(kiln_tokenizer_encode(u, text, strlen(text), &b, &nb));
    CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0, "loaded tokenizer gives other ids (%zu vs %zu)", na, nb);
    for (int id = 0; id < kiln_tokenizer_vocab_size(t); id++) {
        size_t l1, l2;
        const char *x = kiln_tokenizer_token(t, id, &l1), *y = kiln_tokenizer_token(u, id, &l2);
        if (!x || !y || l1 != l2 || memcmp(x, y, l1)) {
            CHECK(0, "token %d differs after load", id);
            break;
        }
    }
    test_roundtrips(u);
    free(a);
    free(b);
    free(text);
    kiln_tokenizer_free(u);
}

/* "Ġ" is U+0120, the GPT-2 byte-level form of a space. */
static const char *tiny_json =
    "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 9, \"content\": \"<|eos|>\", \"special\": true}],\n"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, \"decoder\": {\"type\": \"ByteLevel\"},\n"
    " \"model\": {\"type\": \"BPE\",\n"
    "  \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\xc4\xa0\": 3, \"ab\": 4, \"abc\": 5, \"\xc4\xa0" "ab\": 6, \"\xc4\xa0" "abc\": 7, \"aa\": 8},\n"
    "  \"merges\": [%s]}}\n";

static void expect_ids(const kiln_tokenizer *t, const char *text, const int32_t *want, size_t n) {
    int32_t *ids;
    size_t n_ids;
    CHECK_OK(kiln_tokenizer_encode(t, text, strlen(text), &ids, &n_ids));
    bool same = n_ids == n && memcmp(ids, want, n * sizeof *want) == 0;
    CHECK(same, "\"%s\": got %zu ids, first %d", text, n_ids, n_ids ? ids[0] : -1);
    free(ids);
}

static void test_tiny(const char *merges_json, const char *name) {
    char path[128], json[2048];
    snprintf(json, sizeof json, tiny_json, merges_json);
    write_text(tmp_path(name, path, sizeof path), json);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(path, &t));
    if (!t) return;
    CHECK(kiln_tokenizer_vocab_size(t) == 10 && kiln_tokenizer_eos(t) == 9 && kiln_tokenizer_bos(t) == -1, "tiny ids");
    /* "abc" -> a b -> ab c -> abc; " abcab" -> Ġ ab c ab -> Ġ abc ab ("ab c"
     * ranks before "Ġ ab"); " ab" -> Ġ ab -> Ġab; " abc" stays Ġ abc: the
     * merge "Ġab c" never sees "Ġab" next to "c". */
    expect_ids(t, "abc", (int32_t[]){5}, 1);
    expect_ids(t, " ab", (int32_t[]){6}, 1);
    expect_ids(t, " abc", (int32_t[]){3, 5}, 2);
    expect_ids(t, "abc ab abcab", (int32_t[]){5, 6, 3, 5, 4}, 5);
    expect_ids(t, "ba cab", (int32_t[]){1, 0, 3, 2, 4}, 5);
    /* equal ranks: the leftmost pair merges first */
    expect_ids(t, "aaa", (int32_t[]){8, 0}, 2);
    expect_ids(t, "aaaaa", (int32_t[]){8, 8, 0}, 3);
    /* words over 64 bytes take the heap merger: same rule */
    char longa[102];
    int32_t want[51];
    memset(longa, 'a', 101);
    longa[101] = 0;
    for (int i = 0; i < 50; i++) want[i] = 8;
    want[50] = 0;
    expect_ids(t, longa, want, 51);
    memcpy(longa + 95, "abcab", 6);
    for (int i = 47; i < 50; i++) want[i] = (int32_t[]){0, 5, 4}[i - 47];
    expect_ids(t, longa, want, 50);
    /* a byte without a token and no unk_token: dropped, as HF drops it */
    expect_ids(t, "abd", (int32_t[]){4}, 1);
    /* the special token typed in the text is matched */
    expect_ids(t, "ab<|eos|>c", (int32_t[]){4, 9, 2}, 3);
    char *s;
    size_t sl;
    kiln_status st;
    CHECK_OK(kiln_tokenizer_decode(t, (int32_t[]){7, 9}, 2, &s, &sl));
    CHECK(sl == 11 && !memcmp(s, " abc<|eos|>", 11), "decode tiny");
    free(s);
    st = kiln_tokenizer_decode(t, (int32_t[]){10}, 1, &s, &sl);
    CHECK(st == KILN_ERR_RANGE, "decode of an unknown id fails");
    kiln_tokenizer_free(t);
}

static void expect_load_error(const char *name, const char *content, const char *needle) {
    char path[128];
    tmp_path(name, path, sizeof path);
    if (content) write_text(path, content);
    kiln_tokenizer *t = NULL;
    kiln_status st = kiln_tokenizer_load(path, &t);
    CHECK(st != KILN_OK && t == NULL, "%s loads", name);
    CHECK(strstr(kiln_last_error(), needle) && strstr(kiln_last_error(), name), "%s: message \"%s\" lacks \"%s\"", name,
          kiln_last_error(), needle);
}

static void test_malformed(void) {
    char json[2048];
    expect_load_error("missing.json", NULL, "cannot open");
    expect_load_error("bad.json", "{\"model\": {\"vocab\": {\"a\": 0,}", "invalid JSON");
    expect_load_error("nomerges.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "model.merges");
    expect_load_error("novocab.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "model.vocab");
    expect_load_error("wordpiece.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}, \"merges\": []}}", "BPE");
    snprintf(json, sizeof json, tiny_json, "\"a b\", \"a z\"");
    expect_load_error("unknown.json", json, "unknown token \"z\"");
    snprintf(json, sizeof json, tiny_json, "\"b c\"");
    expect_load_error("nomerged.json", json, "not in model.vocab");
    snprintf(json, sizeof json, tiny_json, "\"abc\"");
    expect_load_error("onetoken.json", json, "merges[0]");
    expect_load_error("badid.json", "{\"model\": {\"vocab\": {\"a\": -4}, \"merges\": []}}", "id");
    expect_load_error("array.json", "[1, 2]", "not a JSON object");
    /* every component or option kiln does not implement is named */
    static const char *const refused[][3] = {
        {"punct.json", "\"pre_tokenizer\": {\"type\": \"Punctuation\"}", "pre-tokenizer \"Punctuation\""},
        {"field.json", "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"foo\": 1}", "field \"foo\""},
        {"trunc.json", "\"truncation\": {\"max_length\": 512}", "truncation"},
        {"norm.json", "\"normalizer\": {\"type\": \"Precompiled\"}", "normalizer \"Precompiled\""},
        {"dec.json", "\"decoder\": {\"type\": \"WordPiece\"}", "decoder \"WordPiece\""},
        {"post.json", "\"post_processor\": {\"type\": \"Nope\"}", "post-processor \"Nope\""},
        {"regex.json", "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
                       "\"behavior\": \"Isolated\", \"invert\": false}", "PCRE2"},
        {"behav.json", "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
                       "\"behavior\": \"Sideways\", \"invert\": false}", "Sideways"},
        {"order.json", "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
                       "{\"type\": \"Digits\"}]}", "ByteLevel must come last"},
        /* sizes from the file are checked before they are used */
        {"strip.json", "\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1000000000000, \"stop\": 0}",
         "decoder.start"},
        {"tmpl.json", "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                      "{\"id\": \"<x>\", \"type_id\": 0}}], \"special_tokens\": {\"<x>\": {\"id\": \"<x>\", "
                      "\"ids\": [4294967296], \"tokens\": [\"<x>\"]}}}", "token id"},
        {"dropout.json", "\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}",
         "dropout"},
        {"bigid.json", "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 2147483648}, \"merges\": []}", "id"},
        {"addid.json", "\"added_tokens\": [{\"id\": 7, \"content\": \"<x>\"}]", "gives it id 1"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        bool has_model = strstr(refused[i][1], "\"model\"") != NULL;
        snprintf(json, sizeof json, "{%s%s}", refused[i][1],
                 has_model ? "" : ", \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}");
        expect_load_error(refused[i][0], json, refused[i][2]);
    }
}

int main(void) {
    kiln_log_set_level(KILN_LOG_WARN);
    if (!t_tmpdir(tmpdir, sizeof tmpdir, "tok")) return 1;

    char *text = gen_text(1, 300000);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_train_text(text, strlen(text), 700, &t));
    free(text);
    if (t) {
        CHECK(kiln_tokenizer_vocab_size(t) == 700 && kiln_tokenizer_n_merges(t) == 700 - 259, "vocab %d",
              kiln_tokenizer_vocab_size(t));
        size_t l;
        const char *b = kiln_tokenizer_token(t, KILN_TOK_BYTE0 + 'x', &l);
        CHECK(b && l == 1 && b[0] == 'x', "byte ids start at 3");
        b = kiln_tokenizer_token(t, KILN_TOK_EOS, &l);
        CHECK(b && l == 7 && !memcmp(b, "<|eos|>", 7), "eos is id 1");
        test_roundtrips(t);
        test_parallel(t);
        test_save_load(t);
        /* Training is deterministic. */
        char *again = gen_text(1, 300000);
        kiln_tokenizer *t2 = NULL;
        CHECK_OK(kiln_tokenizer_train_text(again, strlen(again), 700, &t2));
        bool same = t2 != NULL;
        for (int id = 0; same && id < 700; id++) {
            size_t l1, l2;
            const char *x = kiln_tokenizer_token(t, id, &l1), *y = kiln_tokenizer_token(t2, id, &l2);
            same = l1 == l2 && !memcmp(x, y, l1);
        }
        CHECK(same, "training twice gives the same vocabulary");
        kiln_tokenizer_free(t2);
        free(again);
    }
    kiln_tokenizer_free(t);
    test_tiny("\"a b\", \"ab c\", \"\xc4\xa0 ab\", \"\xc4\xa0" "ab c\", \"a a\"", "tiny.json");
    test_tiny("[\"a\", \"b\"], [\"ab\", \"c\"], [\"\xc4\xa0\", \"ab\"], [\"\xc4\xa0" "ab\", \"c\"], [\"a\", \"a\"]", "tiny_arrays.json");
    test_malformed();
    CHECK(kiln_tokenizer_train_text("x", 1, 100, &t) == KILN_ERR_INVALID, "vocab size below 259 is refused");

    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
