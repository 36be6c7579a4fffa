/* `kiln generate RUN_DIR --prompt TEXT ...`: samples from a run's newest
 * checkpoint and streams the text as it comes. */
#include <jansson.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/backend.h"
#include "kiln/gguf.h"
#include "kiln/train.h"
#include "kiln/model_meta.h"

static const char *generate_usage =
    "usage: kiln generate RUN_DIR [--prompt TEXT] [--max-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--top-p P] [--seed S] [--tokenizer FILE] [--device NAME]\n"
    "       kiln generate RUN_DIR --chat MESSAGE [--system TEXT] [--chat-template FILE] ...\n"
    "\n"
    "Loads the checkpoint `kiln train --resume RUN_DIR` would continue from\n"
    "(or RUN_DIR itself when it is a model directory: config.json, weights,\n"
    "tokenizer.json), encodes the prompt (after <|bos|> when the tokenizer has\n"
    "one) and writes the prompt and its continuation to stdout as tokens\n"
    "arrive, until an eos id of the model (generation_config.json, config.json,\n"
    "tokenizer_config.json, or the tokenizer's eos) or --max-tokens.\n"
    "\n"
    "With --chat the prompt is a conversation: MESSAGE as the user's turn (after\n"
    "--system TEXT as a system turn), rendered through the model's chat template\n"
    "(tokenizer_config.json's chat_template, or --chat-template FILE) with the\n"
    "generation prompt, encoded as rendered (the template writes any bos), and\n"
    "only the reply is written.\n"
    "\n"
    "options:\n"
    "  --prompt TEXT       text to continue (default: empty, i.e. start from bos)\n"
    "  --chat MESSAGE      a user message to answer (instead of --prompt)\n"
    "  --system TEXT       with --chat: a system message before it\n"
    "  --chat-template F   with --chat: a Jinja template file instead of the model's\n"
    "  --max-tokens N      new tokens at most (default: 200); prompt + N must fit\n"
    "                      the model's max_position_embeddings\n"
    "  --temperature T     softmax temperature; 0 = greedy (default: 0.8)\n"
    "  --top-k K           sample among the K most likely tokens; 0 = off (default: 50)\n"
    "  --top-p P           nucleus: the smallest set holding mass P; 1 = off (default: 0.95)\n"
    "  --seed S            sampling seed; the same seed repeats a sample (default: 1)\n"
    "  --tokenizer FILE    tokenizer.json (default: the model's tokenizer.json)\n"
    "  --device NAME       where the model, its key/value cache and the work live:\n"
    "                      one of" KILN_DEVICE_NAMES " (default: cpu; `kiln devices`)\n"
    "  --threads N         compute threads (default: all cores)\n"
    "  -h, --help          this text\n";

typedef struct {
    const kiln_tokenizer *tok;
    int32_t *ids;
    int n;
    size_t printed; /* bytes of the decoded continuation already written */
    kiln_status err;
    const kiln_sample_config *sc; /* its stop ids are not text */
} stream;

/* Length of s[0..n) without a trailing UTF-8 sequence that is still
 * incomplete (its remaining bytes belong to tokens not yet sampled). */
static size_t complete_utf8(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back && c >= 0xC0 ? n - back : n;
    }
    return n;
}

/* Decodes every new id so far and writes the bytes not yet printed. */
static void flush_text(stream *s, bool final) {
    char *text = NULL;
    size_t len = 0;
    if (s->err || kiln_tokenizer_decode(s->tok, s->ids, (size_t)s->n, &text, &len)) {
        if (!s->err) s->err = kiln_last_status();
        return;
    }
    size_t upto = final ? len : complete_utf8(text, len);
    if (upto > s->printed) {
        fwrite(text + s->printed, 1, upto - s->printed, stdout);
        fflush(stdout);
        s->printed = upto;
    }
    free(text);
}

static void on_token(int32_t id, void *user) {
    stream *s = user;
    if (kiln_sample_is_stop(s->sc, id)) return; /* the stop token is not text */
    s->ids[s->n++] = id;
    flush_text(s, false);
}

typedef struct {
    const char *run_dir, *prompt, *tokenizer, *chat, *system, *chat_template;
    kiln_sample_config sc;
    const kiln_backend *device;
} gen_args;

static int parse_args(int argc, char **argv, gen_args *a) {
    bool prompt_given = false;
    const kiln_cli_opt opts[] = {
        {.name = "--prompt", .kind = KILN_OPT_STR, .out = &a->prompt, .given = &prompt_given},
        KILN_OPT_RANGE("--max-tokens", KILN_OPT_INT, &a->sc.max_tokens, 0, 1 << 24),
        KILN_OPT_RANGE("--temperature", KILN_OPT_NUM, &a->sc.temperature, 0, 1e6),
        KILN_OPT_RANGE("--top-k", KILN_OPT_INT, &a->sc.top_k, 0, 1 << 30),
        KILN_OPT_RANGE("--top-p", KILN_OPT_NUM, &a->sc.top_p, 1e-12, 1),
        KILN_OPT("--seed", KILN_OPT_U64, &a->sc.seed),
        KILN_OPT("--tokenizer", KILN_OPT_STR, &a->tokenizer),
        KILN_OPT("--threads", KILN_OPT_THREADS, NULL),
        KILN_OPT("--chat", KILN_OPT_STR, &a->chat),
        KILN_OPT("--system", KILN_OPT_STR, &a->system),
        KILN_OPT("--chat-template", KILN_OPT_STR, &a->chat_template),
        KILN_OPT("--device", KILN_OPT_DEVICE, &a->device),
    };
    const char *pos[2];
    int n_pos = 0;
    int pr = kiln_cli_parse("generate", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), generate_usage, pos, 2, &n_pos);
    if (pr == 1) return -1;
    if (pr) return 2;
    if (n_pos > 1) {
        fprintf(stderr, "kiln generate: unexpected argument '%s' (one RUN_DIR; quote the prompt)\n", pos[1]);
        return 2;
    }
    if (n_pos) a->run_dir = pos[0];
    if (a->chat && prompt_given) {
        fputs("kiln generate: --chat and --prompt exclude each other (--chat renders the prompt)\n", stderr);
        return 2;
    }
    if (!a->chat && (a->system || a->chat_template)) {
        fprintf(stderr, "kiln generate: %s needs --chat\n", a->system ? "--system" : "--chat-template");
        return 2;
    }
    if (!a->run_dir) {
        fputs(generate_usage, stderr);
        return 2;
    }
    return 0;
}

/* prompt ids: bos (if any) + the encoded text */
static kiln_status encode_prompt(const kiln_tokenizer *tok, const char *text, int32_t **ids, int *n) {
    int32_t *body = NULL;
    size_t nb = 0;
    kiln_status st = kiln_tokenizer_encode(tok, text, strlen(text), &body, &nb);
    if (st) return st;
    int bos = kiln_tokenizer_bos(tok);
    *ids = malloc((nb + 1) * sizeof **ids);
    if (!*ids) {
        free(body);
        return kiln_error(KILN_ERR_OOM, "out of memory");
    }
    *n = 0;
    if (bos >= 0) (*ids)[(*n)++] = bos;
    if (nb) memcpy(*ids + *n, body, nb * sizeof *body);
    *n += (int)nb;
    free(body);
    if (*n == 0) return kiln_error(KILN_ERR_INVALID, "the prompt is empty and the tokenizer has no <|bos|> to start from");
    return KILN_OK;
}

/* --chat: the conversation rendered by the model's template with the
 * generation prompt and encoded as rendered, as transformers'
 * apply_chat_template(..., add_generation_prompt=True) tokenizes it (no
 * special tokens added: the template writes bos where the model has one). */
/* A GGUF's chat template and token strings as the tokenizer_config.json
 * kiln_chat_load reads, in a temporary file (path: its name; removed by
 * the caller). */
static kiln_status gguf_chat_config(const char *gguf, const kiln_model_meta *meta, char *path, size_t n) {
    if (!meta->chat_template)
        return kiln_error(KILN_ERR_INVALID, "--chat: %s has no tokenizer.chat_template; give --chat-template FILE", gguf);
    const char *base = getenv("TMPDIR");
    snprintf(path, n, "%s/kiln_chat_XXXXXX", base && *base ? base : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return kiln_error(KILN_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    close(fd);
    json_t *o = json_pack("{s:s}", "chat_template", meta->chat_template);
    if (o && meta->bos_token) json_object_set_new(o, "bos_token", json_string(meta->bos_token));
    if (o && meta->eos_token) json_object_set_new(o, "eos_token", json_string(meta->eos_token));
    if (o && meta->pad_token) json_object_set_new(o, "pad_token", json_string(meta->pad_token));
    int rc = o ? json_dump_file(o, path, 0) : -1;
    json_decref(o);
    return rc ? kiln_error(KILN_ERR_IO, "cannot write %s", path) : KILN_OK;
}

static kiln_status chat_prompt(const gen_args *a, const char *dir, const kiln_model_meta *meta, const kiln_tokenizer *tok,
                               int32_t **ids, int *n) {
    char cfg[4096], jinja[4096];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
    kiln_chat *chat = NULL;
    bool gguf = kiln_is_gguf_path(dir);
    if (gguf && !a->chat_template) { /* the file's tokenizer.chat_template */
        kiln_status gs = gguf_chat_config(dir, meta, cfg, sizeof cfg);
        if (gs) return gs;
    }
    bool have_cfg = (!gguf || !a->chat_template) && access(cfg, F_OK) == 0;
    /* the template: --chat-template, the model's chat_template.jinja (what
     * its chat data was rendered with), tokenizer_config.json's */
    const char *tpl = a->chat_template ? a->chat_template : !gguf && access(jinja, F_OK) == 0 ? jinja : NULL;
    if (!have_cfg && !tpl)
        return kiln_error(KILN_ERR_INVALID,
                          "--chat: %s has no chat_template.jinja and no tokenizer_config.json (they hold the chat "
                          "template); give --chat-template FILE",
                          dir);
    kiln_status st = kiln_chat_load(have_cfg ? cfg : NULL, tpl, &chat);
    if (gguf && !a->chat_template) unlink(cfg);
    if (st) return kiln_error_context(st, "--chat");
    json_t *conv = json_pack("{s:[]}", "messages");
    json_t *msgs = json_object_get(conv, "messages");
    if (a->system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", a->system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", a->chat));
    char *text = NULL;
    size_t len = 0;
    st = json_array_size(msgs) ? kiln_chat_render(chat, conv, true, &text, &len)
                               : kiln_error(KILN_ERR_OOM, "out of memory");
    json_decref(conv);
    kiln_chat_free(chat);
    if (st) return st;
    size_t nb = 0;
    st = kiln_tokenizer_encode(tok, text, len, ids, &nb);
    free(text);
    if (st) return st;
    *n = (int)nb;
    if (!nb) return kiln_error(KILN_ERR_INVALID, "--chat: the chat template rendered an empty prompt");
    return KILN_OK;
}

static int generate_on_device(gen_args *a);

int kiln_cmd_generate(int argc, char **argv) {
    gen_args a = {NULL, "", NULL, NULL, NULL, NULL, {.max_tokens = 200, .temperature = 0.8, .top_k = 50, .top_p = 0.95, .seed = 1},
                  NULL};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    /* the model is made on the device, and with it everything generation
     * makes (the key/value cache, the inputs of each step) */
    const kiln_backend *was = kiln_backend_use(a.device ? a.device : kiln_backend_current());
    rc = generate_on_device(&a);
    kiln_backend_use(was);
    return rc;
}

static int generate_on_device(gen_args *ap) {
    gen_args a = *ap;
    int rc = 0;
    char tok_path[4096], dir[3000];
    /* the checkpoint --resume would continue from (or a model directory) */
    if (kiln_model_dir_resolve(a.run_dir, dir, sizeof dir)) {
        fprintf(stderr, "kiln generate: %s\n", kiln_last_error());
        return 1;
    }
    if (a.tokenizer) snprintf(tok_path, sizeof tok_path, "%s", a.tokenizer);
    else if (kiln_is_gguf_path(dir)) snprintf(tok_path, sizeof tok_path, "%s", dir); /* the file's own */
    else snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    kiln_model_meta meta = {.bos_id = -1, .pad_id = -1};

    kiln_llama *m = NULL;
    kiln_tokenizer *tok = NULL;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    stream s = {0};
    if (kiln_load_model_dir(dir, &m) || kiln_tokenizer_open_any(tok_path, &tok) || kiln_model_meta_open_any(dir, tok, &meta) ||
        (a.chat ? chat_prompt(&a, dir, &meta, tok, &prompt, &n_prompt) : encode_prompt(tok, a.prompt, &prompt, &n_prompt))) {
        fprintf(stderr, "kiln generate: %s\n", kiln_last_error());
        rc = 1;
        goto done;
    }
    if (kiln_tokenizer_vocab_size(tok) > m->cfg.vocab_size) {
        fprintf(stderr, "kiln generate: %s has %d tokens but the model only %lld\n", tok_path,
                kiln_tokenizer_vocab_size(tok), (long long)m->cfg.vocab_size);
        rc = 1;
        goto done;
    }
    if (n_prompt >= m->cfg.max_position_embeddings) {
        fprintf(stderr, "kiln generate: the prompt (%d tokens) leaves no room in max_position_embeddings %lld\n", n_prompt,
                (long long)m->cfg.max_position_embeddings);
        rc = 1;
        goto done;
    }
    if ((int64_t)n_prompt + a.sc.max_tokens > m->cfg.max_position_embeddings) {
        a.sc.max_tokens = (int)(m->cfg.max_position_embeddings - n_prompt);
        fprintf(stderr, "kiln generate: --max-tokens lowered to %d (the model's max_position_embeddings is %lld)\n",
                a.sc.max_tokens, (long long)m->cfg.max_position_embeddings);
    }
    /* the model's eos ids (generation_config.json, config.json,
     * tokenizer_config.json), and the tokenizer's own eos */
    a.sc.stop_id = kiln_tokenizer_eos(tok);
    a.sc.stop_ids = meta.eos_ids;
    a.sc.n_stop_ids = meta.n_eos;
    int32_t *out = malloc(((size_t)a.sc.max_tokens + 1) * sizeof *out);
    s = (stream){tok, malloc(((size_t)a.sc.max_tokens + 1) * sizeof *s.ids), 0, 0, KILN_OK, &a.sc};
    if (!out || !s.ids) {
        free(out);
        fprintf(stderr, "kiln generate: out of memory\n");
        rc = 1;
        goto done;
    }
    if (!a.chat) fputs(a.prompt, stdout); /* a chat reply is written alone */
    fflush(stdout);
    int n_out = 0;
    double t0 = kiln_time_now();
    kiln_status st = kiln_generate(m, prompt, n_prompt, &a.sc, out, &n_out, on_token, &s);
    double dt = kiln_time_now() - t0;
    flush_text(&s, true);
    fputc('\n', stdout);
    fflush(stdout);
    bool at_eos = n_out > 0 && kiln_sample_is_stop(&a.sc, out[n_out - 1]);
    free(out);
    if (st || s.err) {
        fprintf(stderr, "kiln generate: %s\n", kiln_last_error());
        rc = 1;
    } else {
        fprintf(stderr, "[%d tokens in %.2fs, %.1f tok/s%s]\n", n_out, dt, dt > 0 ? n_out / dt : 0.0,
                at_eos ? ", stopped at eos" : "");
    }
done:
    kiln_model_meta_free(&meta);
    free(s.ids);
    free(prompt);
    kiln_tokenizer_free(tok);
    kiln_llama_free(m);
    return rc;
}
