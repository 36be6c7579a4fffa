/* Preference pairs (issue 25, the data part): kiln tokenize on TRL's
 * {"prompt", "chosen", "rejected"} JSONL and the loader's pairs mode.
 *  - plain and conversational pairs (tests/chat/smollm2.jinja, and Llama 2's
 *    template, whose answers hold the eos id): every document's token ids
 *    equal the tokenizer's encoding of the prompt (the template's rendering
 *    with the generation prompt, written out here by hand) followed by the
 *    answer's, and the loader's rows ignore the prompt and target exactly
 *    the answer's tokens (and a plain answer's eos);
 *  - truncation as TRL's DPO: --max-prompt-len keeps the prompt's end,
 *    --max-len cuts answers from the right (a cut answer's eos is no
 *    target), pairs whose prompt leaves no room are skipped and counted;
 *  - every bad input refused with FILE:LINE and the field;
 *  - the split and the shuffle move whole pairs, deterministically; rows
 *    (2i, 2i+1) are the two answers of one prompt;
 *  - the shard format: version 3 + KILN_SHARD_PAIRS with a document table,
 *    corrupt tables refused, a version 2 header with the flag refused (as a
 *    version 2 reader refuses it), versions 1 and 2 still read, and each
 *    mode refuses the other kind of shard. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli_run.h"
#include "kiln/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/kiln_pairs_XXXXXX";
static kiln_tokenizer *tok;
static int32_t EOS;

typedef struct { int32_t *v; size_t n; } ids;

static ids enc(const char *s) {
    ids r = {0};
    CHECK_OK(kiln_tokenizer_encode(tok, s, strlen(s), &r.v, &r.n));
    return r;
}

static const char *tpath(const char *name) {
    static char buf[16][400];
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* writes tmpdir/name; the path stays valid for the whole test */
static const char *put(const char *name, const char *text) {
    static char files[128][400];
    static int k;
    if (k == 128) abort();
    char *p = files[k++];
    snprintf(p, 400, "%s/%s", tmpdir, name);
    CHECK_OK(kiln_write_file_atomic(p, text, strlen(text)));
    return p;
}

static kiln_status tokenize1(const char *path, const char *out, kiln_tokenize_opts *o, kiln_tokenize_stats *st) {
    const char *paths[1] = {path};
    return kiln_tokenize_files(tok, paths, 1, out, o, st);
}

/* document d of a shard: its tokens (eos included) and mask */
static size_t doc_of(const kiln_shard *s, uint64_t d, int32_t *v, uint8_t *m) {
    const uint64_t *end = kiln_shard_doc_ends(s);
    const uint8_t *mk = kiln_shard_mask(s);
    uint64_t b = d ? end[d - 1] : 0;
    for (uint64_t i = b; i < end[d]; i++) {
        v[i - b] = (int32_t)kiln_shard_token(s, i);
        m[i - b] = mk ? mk[i] : 1;
    }
    return (size_t)(end[d] - b);
}

/* The expected document: prompt[skip..] + answer[..alen] + eos. */
static bool doc_is(const kiln_shard *s, uint64_t d, ids prompt, size_t skip, ids answer, size_t alen, bool eos_target) {
    int32_t v[4096];
    uint8_t m[4096];
    size_t n = doc_of(s, d, v, m), P = prompt.n - skip;
    bool ok = n == P + alen + 1;
    for (size_t i = 0; ok && i < P; i++) ok = v[i] == prompt.v[skip + i] && m[i] == 0;
    for (size_t i = 0; ok && i < alen; i++) ok = v[P + i] == answer.v[i] && m[P + i] == 1;
    if (ok) ok = v[n - 1] == EOS && m[n - 1] == (eos_target ? 1 : 0);
    if (!ok) {
        fprintf(stderr, "document %llu (%zu tokens, want %zu):", (unsigned long long)d, n, P + alen + 1);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d/%u", (int)v[i], m[i]);
        fprintf(stderr, "\n");
    }
    return ok;
}

/* Row r of a batch as the spec says, computed from the parts: inputs the
 * prompt then the answer, targets ignored on the prompt, the answer's next
 * tokens after it, the eos (or ignored), then padding. */
static bool row_is(const kiln_batch *b, int r, ids prompt, ids answer, size_t alen, bool eos_target, int32_t pad) {
    const int32_t *in = b->input_ids + (size_t)r * b->T, *tg = b->targets + (size_t)r * b->T, *pm = b->pad_mask + (size_t)r * b->T;
    size_t P = prompt.n, n = P + alen; /* inputs */
    for (int t = 0; t < b->T; t++) {
        size_t u = (size_t)t;
        int32_t want_in = u < P ? prompt.v[u] : u < n ? answer.v[u - P] : pad;
        int32_t want_tg = u + 1 < P ? KILN_IGNORE_INDEX                 /* the prompt predicts nothing */
                          : u + 1 < n ? answer.v[u + 1 - P]            /* the answer's tokens */
                          : u + 1 == n ? (eos_target ? EOS : KILN_IGNORE_INDEX)
                                       : KILN_IGNORE_INDEX;             /* padding */
        if (in[t] != want_in || tg[t] != want_tg || pm[t] != (u < n) || b->positions[(size_t)r * b->T + u] != t) {
            fprintf(stderr, "row %d at t=%d: input %d (want %d), target %d (want %d), pad_mask %d\n", r, t, in[t], want_in,
                    tg[t], want_tg, pm[t]);
            return false;
        }
    }
    return true;
}

static void free_ids(ids *v, int n) {
    for (int i = 0; i < n; i++) free(v[i].v);
}

/* ---- plain pairs ---- */
static void plain_pairs(void) {
    const char *P[3] = {"What is 2+2?", "Name a colour.", "Stop<|eos|> then go:"};
    const char *C[3] = {" 4.", " Blue.", " gone"};
    const char *R[3] = {" 5, I think.", " Seven.", " staying here"};
    char text[2048] = "";
    for (int i = 0; i < 3; i++) {
        json_t *o = json_pack("{ssssss}", "prompt", P[i], "chosen", C[i], "rejected", R[i]);
        char *line = json_dumps(o, JSON_COMPACT);
        strcat(text, line);
        strcat(text, i == 1 ? "\n\n" : "\n"); /* a blank line is no example */
        free(line);
        json_decref(o);
    }
    const char *path = put("plain.jsonl", text);
    kiln_tokenize_opts o = {.val_frac = 0};
    kiln_tokenize_stats st;
    const char *out = tpath("plain");
    CHECK_OK(tokenize1(path, out, &o, &st));
    CHECK(st.pairs && st.train_pairs == 3 && st.val_pairs == 0 && st.train_docs == 6 && st.pairs_skipped == 0,
          "plain: 3 pairs as 6 documents (pairs %d, %llu pairs, %llu docs)", st.pairs, (unsigned long long)st.train_pairs,
          (unsigned long long)st.train_docs);
    ids p[3], c[3], r[3];
    for (int i = 0; i < 3; i++) p[i] = enc(P[i]), c[i] = enc(C[i]), r[i] = enc(R[i]);
    bool inner = false;
    for (size_t i = 0; i + 1 < p[2].n; i++) inner |= p[2].v[i] == EOS;
    CHECK(inner, "the third prompt holds the eos id inside");
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(tpath("plain/train.bin"), &s));
    if (!s) return;
    const kiln_shard_info *in = kiln_shard_get_info(s);
    CHECK(in->version == 3 && in->flags == (KILN_SHARD_PAIRS | KILN_SHARD_MASKED) && in->n_docs == 6 && kiln_shard_doc_ends(s),
          "pairs shard: version %u, flags 0x%x, %llu docs", in->version, in->flags, (unsigned long long)in->n_docs);
    bool same = true;
    for (int i = 0; i < 3; i++) {
        same &= doc_is(s, 2 * i, p[i], 0, c[i], c[i].n, true);
        same &= doc_is(s, 2 * i + 1, p[i], 0, r[i], r[i].n, true);
    }
    CHECK(same, "plain: document 2i = encode(prompt) + encode(chosen) + eos, 2i+1 the same with rejected; the prompt masked, the answer and its eos targets");
    printf("plain pair 0: prompt %zu tokens [%d %d ...], chosen %zu, rejected %zu\n", p[0].n, p[0].v[0], p[0].v[1], c[0].n, r[0].n);
    kiln_shard_close(s);
    /* the loader: 3 pairs, B = 6 rows, no shuffle: file order */
    kiln_loader_config lc = {.path = tpath("plain/train.bin"), .batch_size = 6, .seq_len = 24, .mode = KILN_PACK_PAIRS};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    kiln_batch *b = kiln_batch_alloc(6, 24);
    if (l && b) {
        CHECK(kiln_loader_pairs(l) == 3 && kiln_loader_items(l) == 6 && kiln_loader_len(l) == 1, "3 pairs, 6 rows, 1 batch (%lld, %lld, %lld)",
              (long long)kiln_loader_pairs(l), (long long)kiln_loader_items(l), (long long)kiln_loader_len(l));
        CHECK_OK(kiln_loader_get(l, 0, 0, b));
        int32_t pad = (int32_t)kiln_loader_info(l)->pad_id;
        bool rows = b->rows == 6 && !b->segmented;
        int64_t want = 0;
        for (int i = 0; i < 3; i++) {
            rows &= row_is(b, 2 * i, p[i], c[i], c[i].n, true, pad);
            rows &= row_is(b, 2 * i + 1, p[i], r[i], r[i].n, true, pad);
            want += (int64_t)(c[i].n + r[i].n + 2);
        }
        CHECK(rows, "plain rows: row 2i chosen, 2i+1 rejected of pair i; prompt positions ignored, the answer's tokens and eos the targets, padding after");
        CHECK(b->n_targets == want, "n_targets %lld = answer tokens + eos of the 6 rows (%lld)", (long long)b->n_targets, (long long)want);
        printf("plain batch: 6 rows x 24, %lld targets\n", (long long)b->n_targets);
    }
    kiln_batch_free(b);
    kiln_loader_close(l);
    free_ids(p, 3), free_ids(c, 3), free_ids(r, 3);
}

/* ---- conversational pairs ---- */
static const char *SMOL_SYS = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

static void chat_pairs(void) {
    kiln_chat *chat = NULL;
    CHECK_OK(kiln_chat_load(NULL, "tests/chat/smollm2.jinja", &chat));
    if (!chat) return;
    const char *lines =
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"4.\"}], "
        "\"rejected\": [{\"role\": \"assistant\", \"content\": \"5.\"}]}\n"
        "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be terse.\"}, {\"role\": \"user\", \"content\": \"Hello!\"}, "
        "{\"role\": \"assistant\", \"content\": \"Hi.\"}, {\"role\": \"user\", \"content\": \"Joke?\"}], "
        "\"chosen\": [{\"role\": \"assistant\", \"content\": \"No.\"}], "
        "\"rejected\": [{\"role\": \"assistant\", \"content\": \"A long joke about C.\"}], \"id\": 7}\n";
    const char *path = put("chat.jsonl", lines);
    kiln_tokenize_opts o = {.val_frac = 0, .chat = chat};
    kiln_tokenize_stats st;
    CHECK_OK(tokenize1(path, tpath("chat"), &o, &st));
    CHECK(st.pairs && st.train_pairs == 2, "chat: 2 pairs (%llu)", (unsigned long long)st.train_pairs);
    /* the renderings, by hand */
    char p0[512], p1[512];
    snprintf(p0, sizeof p0, "%s<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", SMOL_SYS);
    snprintf(p1, sizeof p1,
             "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi.<|im_end|>\n"
             "<|im_start|>user\nJoke?<|im_end|>\n<|im_start|>assistant\n");
    /* ... and as the template renders the prompt with the generation prompt */
    json_t *conv = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}]}", 0, NULL);
    char *R = NULL;
    size_t rn = 0;
    CHECK_OK(kiln_chat_render(chat, conv, true, &R, &rn));
    CHECK(R && rn == strlen(p0) && !memcmp(R, p0, rn), "smollm2 renders the prompt as written here: %s", R ? R : "");
    free(R);
    json_decref(conv);
    ids p[2] = {enc(p0), enc(p1)}, c[2] = {enc("4.<|im_end|>\n"), enc("No.<|im_end|>\n")},
        r[2] = {enc("5.<|im_end|>\n"), enc("A long joke about C.<|im_end|>\n")};
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(tpath("chat/train.bin"), &s));
    if (s) {
        bool same = true;
        for (int i = 0; i < 2; i++) {
            same &= doc_is(s, 2 * i, p[i], 0, c[i], c[i].n, false);
            same &= doc_is(s, 2 * i + 1, p[i], 0, r[i], r[i].n, false);
        }
        CHECK(same, "chat: documents = encode(prompt rendered with the generation prompt) + encode(the answer's turn); "
                    "the prompt (its past assistant turn too) masked, the answer's turn the targets, the eos after a chat no target");
        kiln_shard_close(s);
    }
    kiln_loader_config lc = {.path = tpath("chat/train.bin"), .batch_size = 2, .seq_len = 160, .mode = KILN_PACK_PAIRS};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    kiln_batch *b = kiln_batch_alloc(2, 160);
    if (l && b) {
        int32_t pad = (int32_t)kiln_loader_info(l)->pad_id;
        bool rows = true;
        for (int i = 0; i < 2; i++) {
            CHECK_OK(kiln_loader_get(l, 0, i, b));
            rows &= b->rows == 2 && row_is(b, 0, p[i], c[i], c[i].n, false, pad) && row_is(b, 1, p[i], r[i], r[i].n, false, pad);
        }
        CHECK(rows, "chat rows: the prompt ignored, the answer's turn the targets");
        printf("chat pair 0 (smollm2): prompt %zu tokens, chosen %zu, rejected %zu\n", p[0].n, c[0].n, r[0].n);
    }
    kiln_batch_free(b);
    kiln_loader_close(l);
    free_ids(p, 2), free_ids(c, 2), free_ids(r, 2);
    kiln_chat_free(chat);

    /* Llama 2's template ends every answer with eos_token: the eos id inside
     * a document, which the document table keeps from splitting the pair */
    char *src = NULL;
    size_t sn;
    CHECK_OK(kiln_read_file("tests/chat/llama2.jinja", &src, &sn));
    json_t *cfg = json_pack("{s:s#,s:s,s:s}", "chat_template", src ? src : "", src ? (int)sn : 0, "bos_token", "<|bos|>", "eos_token", "<|eos|>");
    free(src);
    const char *cfg_path = tpath("llama2_config.json");
    json_dump_file(cfg, cfg_path, 0);
    json_decref(cfg);
    CHECK_OK(kiln_chat_load(cfg_path, NULL, &chat));
    if (!chat) return;
    path = put("llama2.jsonl",
               "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"4.\"}], "
               "\"rejected\": [{\"role\": \"assistant\", \"content\": \" 5 \"}]}\n");
    o.chat = chat;
    CHECK_OK(tokenize1(path, tpath("llama2"), &o, &st));
    ids lp = enc("<|bos|>[INST] What is 2+2? [/INST]"), lc4 = enc(" 4. <|eos|>"), lr5 = enc(" 5 <|eos|>");
    CHECK(lc4.n >= 2 && lc4.v[lc4.n - 1] == EOS, "the Llama 2 answer ends with the eos id");
    CHECK_OK(kiln_shard_open(tpath("llama2/train.bin"), &s));
    if (s) {
        CHECK(kiln_shard_get_info(s)->n_docs == 2 && doc_is(s, 0, lp, 0, lc4, lc4.n, false) && doc_is(s, 1, lp, 0, lr5, lr5.n, false),
              "llama2: one pair of two documents, the template's eos a target inside each answer");
        kiln_shard_close(s);
    }
    lc = (kiln_loader_config){.path = tpath("llama2/train.bin"), .batch_size = 2, .seq_len = 32, .mode = KILN_PACK_PAIRS};
    CHECK_OK(kiln_loader_open(&lc, &l));
    b = kiln_batch_alloc(2, 32);
    if (l && b) {
        CHECK_OK(kiln_loader_get(l, 0, 0, b));
        int32_t pad = (int32_t)kiln_loader_info(l)->pad_id;
        CHECK(row_is(b, 0, lp, lc4, lc4.n, false, pad) && row_is(b, 1, lp, lr5, lr5.n, false, pad),
              "llama2 rows: the answer's own eos is a target, the shard's closing eos is not");
    }
    kiln_batch_free(b);
    kiln_loader_close(l);
    free(lp.v), free(lc4.v), free(lr5.v);
    kiln_chat_free(chat);
}

/* ---- truncation ---- */
static void truncation(void) {
    const char *P[3] = {"one two three four five six seven eight", "Hi", "alpha beta gamma delta epsilon zeta eta theta iota"};
    const char *C[3] = {" the answer is a long one indeed", " a b c d e f g h i j k", " ok"};
    const char *R[3] = {" no", " ok", " sure, it is long enough"};
    char text[2048] = "";
    for (int i = 0; i < 3; i++) {
        json_t *o = json_pack("{ssssss}", "prompt", P[i], "chosen", C[i], "rejected", R[i]);
        char *line = json_dumps(o, JSON_COMPACT);
        strcat(text, line);
        strcat(text, "\n");
        free(line);
        json_decref(o);
    }
    const char *path = put("trunc.jsonl", text);
    ids p[3], c[3], r[3];
    for (int i = 0; i < 3; i++) p[i] = enc(P[i]), c[i] = enc(C[i]), r[i] = enc(R[i]);
    /* both sides: the prompt keeps its last 3 tokens, answers cut to 7 - prompt */
    const size_t MP = 3, ML = 7;
    CHECK(p[0].n > MP && p[1].n < MP && c[0].n > ML - MP && r[0].n <= ML - MP && c[1].n > ML - p[1].n,
          "the texts exercise both cuts (prompts %zu %zu, answers %zu %zu %zu)", p[0].n, p[1].n, c[0].n, r[0].n, c[1].n);
    kiln_tokenize_opts o = {.val_frac = 0, .max_prompt_len = (int64_t)MP, .max_len = (int64_t)ML};
    kiln_tokenize_stats st;
    CHECK_OK(tokenize1(path, tpath("trunc"), &o, &st));
    uint64_t want_p = 0, want_a = 0;
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(tpath("trunc/train.bin"), &s));
    bool same = s != NULL;
    for (int i = 0; s && i < 3; i++) {
        size_t skip = p[i].n > MP ? p[i].n - MP : 0, PL = p[i].n - skip;
        want_p += skip > 0;
        size_t ac = c[i].n + PL > ML ? ML - PL : c[i].n, ar = r[i].n + PL > ML ? ML - PL : r[i].n;
        want_a += (ac < c[i].n) + (ar < r[i].n);
        same &= doc_is(s, 2 * i, p[i], skip, c[i], ac, ac == c[i].n);
        same &= doc_is(s, 2 * i + 1, p[i], skip, r[i], ar, ar == r[i].n);
    }
    CHECK(same, "--max-prompt-len 3 keeps the prompt's last 3 tokens; --max-len 7 cuts answers from the right, a cut answer's eos no target");
    CHECK(st.prompts_truncated == want_p && st.answers_truncated == want_a && st.pairs_skipped == 0 && st.train_pairs == 3,
          "counts: %llu prompts truncated (want %llu), %llu answers (want %llu), %llu skipped", (unsigned long long)st.prompts_truncated,
          (unsigned long long)want_p, (unsigned long long)st.answers_truncated, (unsigned long long)want_a,
          (unsigned long long)st.pairs_skipped);
    printf("truncation (--max-prompt-len 3 --max-len 7): %llu prompts and %llu answers truncated\n",
           (unsigned long long)st.prompts_truncated, (unsigned long long)st.answers_truncated);
    kiln_shard_close(s);
    /* every pair fits a row of --seq-len 7; one shorter refuses, naming the pair */
    kiln_loader_config lc = {.path = tpath("trunc/train.bin"), .batch_size = 2, .seq_len = (int)ML, .mode = KILN_PACK_PAIRS};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    kiln_loader_close(l);
    lc.seq_len = 5;
    CHECK(kiln_loader_open(&lc, &l) == KILN_ERR_INVALID && strstr(kiln_last_error(), "trunc/train.bin") &&
              strstr(kiln_last_error(), "pair 0") && strstr(kiln_last_error(), "--max-len 5"),
          "a pair longer than --seq-len is named: %s", kiln_last_error());

    /* --max-len alone: a prompt as long as the limit (no room for one answer
     * token) or longer is skipped and counted */
    o = (kiln_tokenize_opts){.val_frac = 0, .max_len = (int64_t)p[0].n};
    CHECK(p[2].n > p[0].n && p[1].n < p[0].n, "prompt lengths %zu < %zu < %zu", p[1].n, p[0].n, p[2].n);
    CHECK_OK(tokenize1(path, tpath("skip"), &o, &st));
    CHECK(st.pairs_skipped == 2 && st.train_pairs == 1 && st.prompts_truncated == 0, "--max-len %zu: %llu pairs skipped (want 2), %llu kept",
          p[0].n, (unsigned long long)st.pairs_skipped, (unsigned long long)st.train_pairs);
    CHECK_OK(kiln_shard_open(tpath("skip/train.bin"), &s));
    if (s) {
        size_t room = p[0].n - p[1].n;
        CHECK(doc_is(s, 0, p[1], 0, c[1], c[1].n < room ? c[1].n : room, c[1].n <= room) && doc_is(s, 1, p[1], 0, r[1], r[1].n, true),
              "the kept pair is the short prompt's");
        kiln_shard_close(s);
    }
    printf("skip (--max-len %zu): %llu of 3 pairs skipped\n", p[0].n, (unsigned long long)st.pairs_skipped);
    /* with --max-prompt-len under --max-len nothing is skipped */
    o.max_prompt_len = o.max_len - 1;
    CHECK_OK(tokenize1(path, tpath("skip"), &o, &st));
    CHECK(st.pairs_skipped == 0 && st.train_pairs == 3 && st.prompts_truncated == 2, "--max-prompt-len %lld: none skipped (%llu), 2 prompts cut (%llu)",
          (long long)o.max_prompt_len, (unsigned long long)st.pairs_skipped, (unsigned long long)st.prompts_truncated);
    /* all skipped: an error that says so, never empty shards */
    o = (kiln_tokenize_opts){.val_frac = 0, .max_len = 1};
    CHECK(tokenize1(path, tpath("skip"), &o, &st) == KILN_ERR_INVALID && strstr(kiln_last_error(), "all 3 were skipped"),
          "every pair skipped: %s", kiln_last_error());
    /* the limits belong to pairs */
    const char *txt = put("text.jsonl", "{\"text\": \"plain text\"}\n");
    o = (kiln_tokenize_opts){.val_frac = 0, .max_len = 8};
    CHECK(tokenize1(txt, tpath("skip"), &o, &st) == KILN_ERR_INVALID && strstr(kiln_last_error(), "--max-len"),
          "--max-len on a corpus without pairs refused: %s", kiln_last_error());
    free_ids(p, 3), free_ids(c, 3), free_ids(r, 3);
}

/* ---- bad input ---- */
static void bad_input(void) {
    kiln_chat *chat = NULL;
    CHECK_OK(kiln_chat_load(NULL, "tests/chat/smollm2.jinja", &chat));
    const char *good = "{\"prompt\": \"p\", \"chosen\": \" c\", \"rejected\": \" r\"}\n";
    const char *cgood =
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
        "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}\n";
    struct { const char *line; bool chat; const char *field, *why; } cases[] = {
        {"{\"prompt\": \"p\", \"rejected\": \" r\"}", false, "\"chosen\"", "missing"},
        {"{\"prompt\": \"p\", \"chosen\": \" c\"}", false, "\"rejected\"", "missing"},
        {"{\"chosen\": \" c\", \"rejected\": \" r\"}", false, "\"prompt\"", "missing"},
        {"{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \" r\"}", false, "\"chosen\"", "empty answer"},
        {"{\"prompt\": \"p\", \"chosen\": \" c\", \"rejected\": \"\"}", false, "\"rejected\"", "empty answer"},
        {"{\"prompt\": \"p\", \"chosen\": 3, \"rejected\": \" r\"}", false, "\"chosen\"", "got a number"},
        {"{\"prompt\": \"p\", \"chosen\": \" c\", \"rejected\": [{\"role\": \"assistant\", \"content\": \"x\"}]}", false, "\"rejected\"",
         "expected a string"},
        {"{\"prompt\": 7, \"chosen\": \" c\", \"rejected\": \" r\"}", false, "\"prompt\"", "expected a string or a list"},
        {"{\"prompt\": {\"a\": 1}, \"chosen\": \" c\", \"rejected\": \" r\"}", false, "\"prompt\"", "got an object"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": \"a\", \"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         true, "\"chosen\"", "expected a list of messages"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": []}",
         true, "\"rejected\"", "empty answer"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"\"}], "
         "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         true, "\"chosen\"", "empty answer"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"user\", \"content\": \"a\"}], "
         "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         true, "\"chosen\"", "role \"user\""},
        {"{\"prompt\": [\"q\"], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         true, "\"prompt\"", "message 0"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
         "\"rejected\": [{\"role\": \"assistant\", \"content\": 5}]}",
         true, "\"rejected\"", "smollm2.jinja"}, /* the template's own error, with its place */
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
         "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         false, "\"prompt\"", "needs a chat template"}, /* chat NULL */
        {"{\"prompt\": \"p\", \"chosen\": \" c\", \"rejected\": \" r\"", false, "", "invalid JSON"},
    };
    int n = (int)(sizeof cases / sizeof *cases), named = 0;
    for (int i = 0; i < n; i++) {
        char name[64], text[1024], where[96];
        snprintf(name, sizeof name, "bad%d.jsonl", i);
        bool conv = cases[i].chat; /* the first line: a good pair of the same kind */
        snprintf(text, sizeof text, "%s%s\n", conv ? cgood : good, cases[i].line);
        const char *path = put(name, text);
        kiln_tokenize_opts o = {.val_frac = 0, .chat = cases[i].chat ? chat : NULL};
        kiln_tokenize_stats st;
        kiln_status s = tokenize1(path, tpath("bad"), &o, &st);
        snprintf(where, sizeof where, "%s:2: ", path);
        const char *e = kiln_last_error();
        bool ok = s != KILN_OK && strstr(e, where) && strstr(e, cases[i].field) && strstr(e, cases[i].why);
        named += ok;
        CHECK(ok, "case %d: \"%s\" lacks %s / field %s / \"%s\"", i, e, where, cases[i].field, cases[i].why);
        if (i == 0) printf("refused: %s\n", e);
    }
    printf("bad pairs: %d of %d refused with FILE:LINE: field and reason\n", named, n);
    /* --skip-bad counts them instead */
    char text[4096] = "";
    strcat(text, good);
    for (int i = 0; i < 9; i++) strcat(text, cases[i].line), strcat(text, "\n");
    strcat(text, "{\"prompt\": \"q\", \"chosen\": \" yes\", \"rejected\": \" no\"}\n");
    const char *path = put("skipbad.jsonl", text);
    kiln_tokenize_opts o = {.val_frac = 0, .skip_bad = true};
    kiln_tokenize_stats st;
    CHECK_OK(tokenize1(path, tpath("bad"), &o, &st));
    CHECK(st.bad_lines == 9 && st.train_pairs == 2, "--skip-bad: %llu bad lines (want 9), %llu pairs (want 2)", (unsigned long long)st.bad_lines,
          (unsigned long long)st.train_pairs);
    /* a corpus mixing pairs with anything else: an error naming both places,
     * even with --skip-bad */
    path = put("mixed.jsonl", "{\"prompt\": \"p\", \"chosen\": \" c\", \"rejected\": \" r\"}\n{\"text\": \"plain\"}\n");
    CHECK(tokenize1(path, tpath("bad"), &o, &st) == KILN_ERR_INVALID && strstr(kiln_last_error(), "mixed.jsonl:2: not a preference pair") &&
              strstr(kiln_last_error(), "mixed.jsonl:1 is one"),
          "a text line after pairs: %s", kiln_last_error());
    path = put("mixed2.jsonl", "{\"prompt\": \"p\", \"completion\": \" c\"}\n{\"prompt\": \"p\", \"chosen\": \" c\", \"rejected\": \" r\"}\n");
    CHECK(tokenize1(path, tpath("bad"), &o, &st) == KILN_ERR_INVALID && strstr(kiln_last_error(), "mixed2.jsonl:2: a preference pair") &&
              strstr(kiln_last_error(), "mixed2.jsonl:1 is other data"),
          "a pair after a prompt/completion line: %s", kiln_last_error());
    const char *paths[2] = {put("pairs_a.jsonl", good), put("plain_b.txt", "some text\n")};
    CHECK(kiln_tokenize_files(tok, paths, 2, tpath("bad"), &o, &st) == KILN_ERR_INVALID && strstr(kiln_last_error(), "plain_b.txt: not a preference pair"),
          "a text file beside pairs: %s", kiln_last_error());
    o.train_on = KILN_TRAIN_ALL;
    CHECK(tokenize1(paths[0], tpath("bad"), &o, &st) == KILN_ERR_INVALID && strstr(kiln_last_error(), "pairs_a.jsonl:1:") &&
              strstr(kiln_last_error(), "--train-on all"),
          "--train-on all refused for pairs: %s", kiln_last_error());
    kiln_chat_free(chat);
}

/* ---- split, shuffle, batches ---- */
#define NP 11
static char PQ[NP][64], PC[NP][64], PR[NP][64];

/* which pair's chosen (k = 0) or rejected (k = 1) document row r holds, -1 none */
static int which(const kiln_batch *b, int r, ids full[NP][2], int k) {
    for (int p = 0; p < NP; p++) {
        ids d = full[p][k];
        bool same = true;
        for (int t = 0; t < b->T && same; t++)
            same = (size_t)t < d.n ? b->input_ids[(size_t)r * b->T + t] == d.v[t] && b->pad_mask[(size_t)r * b->T + t]
                                   : b->pad_mask[(size_t)r * b->T + t] == 0;
        if (same) return p;
    }
    return -1;
}

static bool same_batch(const kiln_batch *a, const kiln_batch *b) {
    size_t n = (size_t)a->B * a->T * sizeof(int32_t);
    return a->rows == b->rows && a->n_targets == b->n_targets && !memcmp(a->input_ids, b->input_ids, n) &&
           !memcmp(a->targets, b->targets, n) && !memcmp(a->pad_mask, b->pad_mask, n);
}

static void shuffle_split(void) {
    char text[8192] = "";
    for (int i = 0; i < NP; i++) {
        snprintf(PQ[i], sizeof PQ[i], "Question %d: which one?", i);
        snprintf(PC[i], sizeof PC[i], " Answer %d, the right one.", i);
        snprintf(PR[i], sizeof PR[i], " Wrong %d!", i);
        json_t *o = json_pack("{ssssss}", "prompt", PQ[i], "chosen", PC[i], "rejected", PR[i]);
        char *line = json_dumps(o, JSON_COMPACT);
        strcat(text, line);
        strcat(text, "\n");
        free(line);
        json_decref(o);
    }
    const char *path = put("many.jsonl", text);
    /* inputs of each pair's documents: prompt + answer (the eos only a target) */
    ids full[NP][2];
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < 2; k++) {
            char s[160];
            snprintf(s, sizeof s, "%s%s", PQ[i], k ? PR[i] : PC[i]);
            ids q = enc(PQ[i]), a = enc(k ? PR[i] : PC[i]);
            full[i][k].n = q.n + a.n;
            full[i][k].v = malloc((q.n + a.n) * sizeof(int32_t));
            memcpy(full[i][k].v, q.v, q.n * sizeof(int32_t));
            memcpy(full[i][k].v + q.n, a.v, a.n * sizeof(int32_t));
            free(q.v), free(a.v);
        }
    /* the split moves whole pairs */
    kiln_tokenize_opts o = {.val_frac = 0.3, .seed = 4};
    kiln_tokenize_stats st;
    CHECK_OK(tokenize1(path, tpath("split"), &o, &st));
    CHECK(st.train_pairs + st.val_pairs == NP && st.val_pairs > 0 && st.train_pairs > 0, "split: %llu + %llu pairs",
          (unsigned long long)st.train_pairs, (unsigned long long)st.val_pairs);
    int seen[NP] = {0};
    const char *shards[2] = {tpath("split/train.bin"), tpath("split/val.bin")};
    bool whole = true;
    for (int f = 0; f < 2; f++) {
        kiln_shard *s = NULL;
        CHECK_OK(kiln_shard_open(shards[f], &s));
        if (!s) continue;
        const kiln_shard_info *in = kiln_shard_get_info(s);
        whole &= (in->flags & KILN_SHARD_PAIRS) && in->n_docs == 2 * (f ? st.val_pairs : st.train_pairs);
        for (uint64_t d = 0; d < in->n_docs; d += 2) {
            int32_t v[2][512];
            uint8_t m[2][512];
            size_t n0 = doc_of(s, d, v[0], m[0]), n1 = doc_of(s, d + 1, v[1], m[1]);
            int hit = -1;
            for (int p = 0; p < NP; p++)
                if (n0 == full[p][0].n + 1 && n1 == full[p][1].n + 1 && !memcmp(v[0], full[p][0].v, full[p][0].n * 4) &&
                    !memcmp(v[1], full[p][1].v, full[p][1].n * 4))
                    hit = p;
            whole &= hit >= 0;
            if (hit >= 0) seen[hit]++;
        }
        kiln_shard_close(s);
    }
    for (int p = 0; p < NP; p++) whole &= seen[p] == 1;
    CHECK(whole, "every pair exactly once, its two documents side by side in one shard");
    printf("split (--val-frac 0.3): %llu train pairs, %llu val pairs\n", (unsigned long long)st.train_pairs, (unsigned long long)st.val_pairs);
    /* too few pairs for the hash: the last pair goes to val whole */
    const char *two = put("two.jsonl", "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"d\", \"chosen\": \" e\", \"rejected\": \" f\"}\n");
    o = (kiln_tokenize_opts){.val_frac = 1e-9};
    CHECK_OK(tokenize1(two, tpath("two"), &o, &st));
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(tpath("two/val.bin"), &s));
    if (s) {
        ids d = enc("d"), e = enc(" e"), f = enc(" f");
        CHECK(st.train_pairs == 1 && st.val_pairs == 1 && doc_is(s, 0, d, 0, e, e.n, true) && doc_is(s, 1, d, 0, f, f.n, true),
              "the held-out last pair is whole in val.bin (%llu + %llu)", (unsigned long long)st.train_pairs,
              (unsigned long long)st.val_pairs);
        free(d.v), free(e.v), free(f.v);
        kiln_shard_close(s);
    }

    /* the loader: 11 pairs, 2 per batch of 4 rows, shuffled */
    o = (kiln_tokenize_opts){.val_frac = 0};
    CHECK_OK(tokenize1(path, tpath("many"), &o, &st));
    kiln_loader_config lc = {.path = tpath("many/train.bin"), .batch_size = 4, .seq_len = 48, .mode = KILN_PACK_PAIRS, .shuffle = true, .seed = 9};
    kiln_loader *l = NULL, *l2 = NULL, *l3 = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    CHECK_OK(kiln_loader_open(&lc, &l2));
    lc.seed = 10;
    CHECK_OK(kiln_loader_open(&lc, &l3));
    kiln_batch *b = kiln_batch_alloc(4, 48), *b2 = kiln_batch_alloc(4, 48);
    if (!l || !l2 || !l3 || !b || !b2) goto done;
    CHECK(kiln_loader_pairs(l) == NP && kiln_loader_items(l) == 2 * NP && kiln_loader_len(l) == (NP + 1) / 2,
          "%lld pairs, %lld rows, %lld batches", (long long)kiln_loader_pairs(l), (long long)kiln_loader_items(l), (long long)kiln_loader_len(l));
    int order[3][NP], len = (int)kiln_loader_len(l);
    bool pairs_ok = true, once = true, det = true, last_pad = true;
    for (int ep = 0; ep < 2; ep++) {
        int cnt[NP] = {0}, k = 0;
        for (int i = 0; i < len; i++) {
            CHECK_OK(kiln_loader_next(l, b));
            CHECK_OK(kiln_loader_get(l2, ep, i, b2)); /* random access, another loader, same seed */
            det &= same_batch(b, b2);
            for (int r = 0; r < b->rows; r += 2) {
                int pc = which(b, r, full, 0), pr = which(b, r + 1, full, 1);
                pairs_ok &= pc >= 0 && pc == pr;
                /* the two rows share the prompt: the same inputs and no target until the answer */
                for (int t = 0; pc >= 0 && t < b->T; t++) {
                    const int32_t *tg = b->targets;
                    if (tg[(size_t)r * b->T + t] != KILN_IGNORE_INDEX || tg[(size_t)(r + 1) * b->T + t] != KILN_IGNORE_INDEX) break;
                    pairs_ok &= b->input_ids[(size_t)r * b->T + t] == b->input_ids[(size_t)(r + 1) * b->T + t];
                }
                if (pc >= 0) cnt[pc]++, order[ep][k++] = pc;
            }
            if (i == len - 1) {
                last_pad &= b->rows == 2;
                for (int t = 2 * b->T; t < 4 * b->T; t++) last_pad &= b->pad_mask[t] == 0 && b->targets[t] == KILN_IGNORE_INDEX;
            }
        }
        for (int p = 0; p < NP; p++) once &= cnt[p] == 1;
    }
    for (int i = 0; i < len; i++) {
        CHECK_OK(kiln_loader_get(l3, 0, i, b));
        for (int r = 0; r < b->rows; r += 2) order[2][2 * i + r / 2] = which(b, r, full, 0);
    }
    CHECK(pairs_ok, "rows (2i, 2i+1) are the chosen and the rejected answer of one pair, with the same prompt");
    CHECK(once, "every pair exactly once per epoch");
    CHECK(det, "the batches are a function of (seed, epoch, index): sequential = random access on another loader");
    CHECK(last_pad, "the epoch's last batch holds the odd pair: 2 rows, the rest padding");
    bool id0 = true, diff01 = false, diff_seed = false;
    for (int i = 0; i < NP; i++) {
        id0 &= order[0][i] == i;
        diff01 |= order[0][i] != order[1][i];
        diff_seed |= order[0][i] != order[2][i];
    }
    CHECK(!id0 && diff01 && diff_seed, "shuffled: not file order, another order in epoch 1 and with another seed");
    printf("shuffle (seed 9), epoch 0 pair order:");
    for (int i = 0; i < NP; i++) printf(" %d", order[0][i]);
    printf("; epoch 1:");
    for (int i = 0; i < NP; i++) printf(" %d", order[1][i]);
    printf("\n");
    /* without shuffle: file order */
    kiln_loader_close(l3);
    lc.shuffle = false;
    l3 = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l3));
    if (l3) {
        CHECK_OK(kiln_loader_get(l3, 3, 1, b));
        CHECK(which(b, 0, full, 0) == 2 && which(b, 1, full, 1) == 2 && which(b, 2, full, 0) == 3 && which(b, 3, full, 1) == 3,
              "unshuffled batch 1 = pairs 2 and 3");
    }
    /* resume: state after 3 batches continues the same sequence */
    kiln_loader_state rs = {1, 3};
    CHECK_OK(kiln_loader_set_state(l2, rs));
    CHECK_OK(kiln_loader_next(l2, b));
    CHECK_OK(kiln_loader_get(l, 1, 3, b2));
    CHECK(same_batch(b, b2), "resumed at (epoch 1, batch 3)");
done:
    kiln_batch_free(b);
    kiln_batch_free(b2);
    kiln_loader_close(l);
    kiln_loader_close(l2);
    kiln_loader_close(l3);
    for (int i = 0; i < NP; i++) free(full[i][0].v), free(full[i][1].v);
}

/* ---- the shard format and the modes ---- */
static void patch32(const char *path, size_t off, uint32_t v, const char *to) {
    char *d;
    size_t n;
    if (kiln_read_file(path, &d, &n)) return;
    memcpy(d + off, &v, 4);
    kiln_write_file_atomic(to, d, n);
    free(d);
}

static void format_and_modes(void) {
    const char *pairs = tpath("plain/train.bin");
    /* every other mode refuses a pairs shard, naming it */
    kiln_pack_mode others[3] = {KILN_PACK_PACKED, KILN_PACK_PADDED, KILN_PACK_DOCUMENTS};
    for (int i = 0; i < 3; i++) {
        kiln_loader_config lc = {.path = pairs, .batch_size = 2, .seq_len = 8, .mode = others[i]};
        kiln_loader *l = NULL;
        CHECK(kiln_loader_open(&lc, &l) == KILN_ERR_INVALID && !l && strstr(kiln_last_error(), pairs) &&
                  strstr(kiln_last_error(), "--pack pairs"),
              "mode %d refuses the pairs shard: %s", (int)others[i], kiln_last_error());
        if (i == 0) printf("refused: %s\n", kiln_last_error());
    }
    kiln_loader_config lc = {.path = pairs, .batch_size = 3, .seq_len = 32, .mode = KILN_PACK_PAIRS};
    kiln_loader *l = NULL;
    CHECK(kiln_loader_open(&lc, &l) == KILN_ERR_INVALID && strstr(kiln_last_error(), "even batch"), "odd batch refused: %s",
          kiln_last_error());
    /* old shards: version 2 with a mask, version 1 without; pairs mode refuses them */
    int32_t tok6[6] = {5, 6, 1, 7, 8, 1};
    uint8_t mask6[6] = {0, 1, 1, 0, 1, 0};
    kiln_shard_info info = {.vocab_size = 10, .eos_id = 1, .pad_id = 2, .bos_id = 0, .n_docs = 2, .flags = KILN_SHARD_PAIRS};
    const char *v2 = tpath("v2.bin"), *v1 = tpath("v1.bin");
    CHECK_OK(kiln_shard_write_masked(v2, tok6, mask6, 6, &info)); /* flags in info are ignored: a version 2 shard */
    CHECK_OK(kiln_shard_write(v1, tok6, 6, &info));
    patch32(v1, 8, 1, v1); /* as the first kiln wrote them: no flags, no mask */
    const char *old[2] = {v2, v1};
    for (int k = 0; k < 2; k++) {
        kiln_shard *s = NULL;
        CHECK_OK(kiln_shard_open(old[k], &s));
        if (s) {
            const kiln_shard_info *in = kiln_shard_get_info(s);
            CHECK(in->version == (uint32_t)(2 - k) && !(in->flags & KILN_SHARD_PAIRS) && !kiln_shard_doc_ends(s) &&
                      (kiln_shard_mask(s) != NULL) == (k == 0),
                  "version %d shard reads as before", 2 - k);
            kiln_shard_close(s);
        }
        kiln_loader_config oc = {.path = old[k], .batch_size = 2, .seq_len = 2, .mode = KILN_PACK_PADDED};
        CHECK_OK(kiln_loader_open(&oc, &l));
        kiln_batch *b = kiln_batch_alloc(2, 2);
        if (l && b) {
            CHECK_OK(kiln_loader_get(l, 0, 0, b));
            /* doc 0: inputs 5 6, targets 6 and the eos; doc 1: 7 8, targets 8 and the eos, masked in version 2 */
            CHECK(b->rows == 2 && b->input_ids[0] == 5 && b->targets[0] == 6 && b->targets[1] == 1 && b->targets[2] == 8 &&
                      b->targets[3] == (k == 0 ? KILN_IGNORE_INDEX : 1),
                  "version %d shard in padded mode (mask %s)", 2 - k, k == 0 ? "applied" : "absent");
        }
        kiln_batch_free(b);
        kiln_loader_close(l);
        l = NULL;
        kiln_loader_config pc = {.path = old[k], .batch_size = 2, .seq_len = 4, .mode = KILN_PACK_PAIRS};
        CHECK(kiln_loader_open(&pc, &l) == KILN_ERR_INVALID && strstr(kiln_last_error(), old[k]) &&
                  strstr(kiln_last_error(), "no preference pairs"),
              "pairs mode refuses a version %d shard: %s", 2 - k, kiln_last_error());
    }
    /* the pairs writer checks its table */
    uint64_t ends[2] = {3, 6};
    const char *pw = tpath("w.bin");
    CHECK_OK(kiln_shard_write_pairs(pw, tok6, mask6, 6, ends, &info));
    uint64_t bad_ends[2] = {2, 6};
    CHECK(kiln_shard_write_pairs(pw, tok6, mask6, 6, bad_ends, &info) == KILN_ERR_INVALID, "a document not ending in eos refused");
    info.n_docs = 1;
    CHECK(kiln_shard_write_pairs(pw, tok6, mask6, 6, ends, &info) == KILN_ERR_INVALID && strstr(kiln_last_error(), "pairs"),
          "an odd document count refused");
    info.n_docs = 2;
    CHECK_OK(kiln_shard_write_pairs(pw, tok6, NULL, 6, ends, &info));
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(pw, &s));
    if (s) {
        const uint64_t *e = kiln_shard_doc_ends(s);
        CHECK(kiln_shard_get_info(s)->version == 3 && kiln_shard_get_info(s)->flags == KILN_SHARD_PAIRS && e && e[0] == 3 && e[1] == 6 &&
                  !kiln_shard_mask(s),
              "a pairs shard without a mask");
        kiln_shard_close(s);
    }
    /* readers: a version 2 header with the flag is refused (what a version 2
     * reader does; on the real version 3 header it refuses the version), as
     * are version 4, an odd count and a broken table */
    const char *bad = tpath("bad.bin");
    CHECK_OK(kiln_shard_write_pairs(pw, tok6, mask6, 6, ends, &info));
    patch32(pw, 8, 2, bad);
    CHECK(kiln_shard_open(bad, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "unknown flags 0x3") && strstr(kiln_last_error(), bad),
          "version 2 + pairs flag: %s", kiln_last_error());
    patch32(pw, 8, 4, bad);
    CHECK(kiln_shard_open(bad, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "version 4"), "version 4: %s", kiln_last_error());
    patch32(pw, 40, 3, bad);
    CHECK(kiln_shard_open(bad, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "odd"), "odd document count: %s", kiln_last_error());
    char *d;
    size_t n;
    CHECK_OK(kiln_read_file(pw, &d, &n));
    uint64_t two = 2;
    memcpy(d + n - 16, &two, 8); /* document 0 ends after token 1: not an eos */
    CHECK_OK(kiln_write_file_atomic(bad, d, n));
    CHECK(kiln_shard_open(bad, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "document 0 ends at 2") &&
              strstr(kiln_last_error(), "not after an eos"),
          "broken table: %s", kiln_last_error());
    CHECK_OK(kiln_write_file_atomic(bad, d, n - 8));
    CHECK(kiln_shard_open(bad, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "document table"), "truncated table: %s", kiln_last_error());
    free(d);
}

/* ---- the command ---- */
static void command(void) {
    if (!cli_init(tmpdir)) {
        printf("test_pairs: skipped the command checks (kiln not built beside the test)\n");
        return;
    }
    const char *tp = tpath("tok.json");
    CHECK_OK(kiln_tokenizer_save(tok, tp));
    const char *help[] = {"tokenize", "--help", NULL};
    CHECK(cli_kiln_run(help) == 0 && cli_output_has("--max-prompt-len N") && cli_output_has("keep_end") &&
              cli_output_has("pairs mode"),
          "tokenize --help states the pairs and their truncation");
    const char *args[] = {"tokenize", tpath("trunc.jsonl"), "--tokenizer", tp, "-o", tpath("cli"), "--val-frac", "0",
                          "--max-len", "9", "--max-prompt-len", "8", NULL};
    CHECK(cli_kiln_run(args) == 0 && cli_output_has("3 pairs") && cli_output_has("prompts truncated") &&
              cli_output_has("answers truncated"),
          "kiln tokenize on pairs: the summary line");
    const char *skip[] = {"tokenize", tpath("trunc.jsonl"), "--tokenizer", tp, "-o", tpath("cli"), "--val-frac", "0", "--max-len", "3", NULL};
    CHECK(cli_kiln_run(skip) == 0 && cli_output_has("pairs skipped (prompt >= --max-len)"), "the summary counts skipped pairs");
    char *out = cli_output();
    char *line = strstr(out, "kiln tokenize:");
    if (line) printf("%.*s\n", (int)strcspn(line, "\n"), line);
    free(out);
    const char *bad[] = {"tokenize", tpath("bad0.jsonl"), "--tokenizer", tp, "-o", tpath("cli"), NULL};
    CHECK(cli_kiln_run(bad) == 1 && cli_output_has("bad0.jsonl:2: field \"chosen\": missing"), "a bad pair stops the command");
}

int main(void) {
    kiln_log_set_level(KILN_LOG_WARN);
    if (!mkdtemp(tmpdir)) return 1;
    char *text;
    size_t n;
    CHECK_OK(kiln_read_file("tests/chat/conversations.json", &text, &n));
    CHECK_OK(kiln_tokenizer_train_text(text, n, 700, &tok));
    free(text);
    if (!tok) TEST_END();
    EOS = kiln_tokenizer_eos(tok);
    plain_pairs();
    chat_pairs();
    truncation();
    bad_input();
    shuffle_split();
    format_and_modes();
    command();
    kiln_tokenizer_free(tok);
    if (t_rmtree(tmpdir)) printf("could not remove %s\n", tmpdir);
    TEST_END();
}
