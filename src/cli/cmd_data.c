/* `kiln tokenizer {train,encode,decode}` and `kiln tokenize`. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/gguf.h"
#include "kiln/data.h"

static const char *tokenizer_usage =
    "usage: kiln tokenizer train CORPUS... --vocab-size N -o FILE\n"
    "       kiln tokenizer encode --tokenizer FILE [--no-special] [TEXT | -]\n"
    "       kiln tokenizer decode --tokenizer FILE [--skip-special] [IDS... | -]\n"
    "       kiln tokenizer render --config tokenizer_config.json CONVERSATION.json\n"
    "                             [--chat-template FILE] [--add-generation-prompt]\n"
    "\n"
    "train   learns a byte-level BPE tokenizer from text files and writes it as a\n"
    "        Hugging Face tokenizer.json (ids: 0 <|bos|>, 1 <|eos|>, 2 <|pad|>,\n"
    "        3..258 the bytes, then merges).\n"
    "encode  prints the ids of TEXT (or of stdin when TEXT is - or absent), as the\n"
    "        Hugging Face library's encode(TEXT): with the post-processor's special\n"
    "        tokens (bos/eos); --no-special: add_special_tokens=False.\n"
    "decode  writes the text of the ids (arguments, or whitespace/comma separated\n"
    "        on stdin with -) to stdout, as HF's decode; --skip-special drops\n"
    "        special tokens.\n"
    "render  prints a conversation ({\"messages\": [...]}, other keys become template\n"
    "        variables) rendered with the model's chat template, as transformers'\n"
    "        apply_chat_template does; --chat-template FILE overrides the config's.\n"
    "options: --threads N (default: all cores), -h/--help\n";

static const char *tokenize_usage =
    "usage: kiln tokenize CORPUS... --tokenizer FILE -o DIR [--val-frac F]\n"
    "                     [--docs paragraph|file|line] [--seed N] [--threads N]\n"
    "                     [--config tokenizer_config.json] [--chat-template FILE]\n"
    "                     [--train-on assistant|completion|all] [--field NAME] [--skip-bad]\n"
    "                     [--max-prompt-len N] [--max-len N] [--no-special]\n"
    "\n"
    "Encodes text files into DIR/train.bin and DIR/val.bin (token shards, each\n"
    "document followed by <|eos|>). Each document of plain text (text files,\n"
    "JSONL \"text\" or --field) is encoded as transformers' tokenizer(text) does,\n"
    "through the tokenizer's post-processor (Llama 2's <s> before it);\n"
    "--no-special encodes without it. Documents are blank-line-separated\n"
    "paragraphs by default. A document is held out for val.bin when a hash of\n"
    "its text and the seed falls below --val-frac (default 0.05), so the split\n"
    "is deterministic.\n"
    "\n"
    "A CORPUS named *.jsonl holds one example a line: {\"text\": ...},\n"
    "{\"prompt\": ..., \"completion\": ...} or {\"messages\": [...]} (rendered with\n"
    "the chat template of --config, or --chat-template FILE; without either, the\n"
    "chat_template.jinja or else tokenizer_config.json's chat_template beside\n"
    "--tokenizer, as transformers' AutoTokenizer finds it); --field NAME takes\n"
    "that string field as the text. --train-on: which tokens are targets (the\n"
    "rest are context only, stored as the shard's loss mask): assistant (default;\n"
    "every assistant turn, or the completion), completion (the last assistant\n"
    "turn, or the completion), all. A bad line stops with FILE:LINE; --skip-bad\n"
    "counts and skips bad lines.\n"
    "\n"
    "Preference pairs (TRL's DPO data): lines {\"prompt\", \"chosen\", \"rejected\"},\n"
    "all strings, or prompt a list of messages and chosen/rejected lists of\n"
    "assistant messages (rendered with the chat template). The corpus must then\n"
    "hold only pairs. Each pair becomes two documents, prompt + chosen and\n"
    "prompt + rejected, the answer tokens the only targets; val.bin gets whole\n"
    "pairs (the loader's pairs mode: kiln train --objective dpo|simpo --pack pairs).\n"
    "Truncation, as TRL's DPO (keep_end):\n"
    "  --max-prompt-len N  keep the last N prompt tokens (cut from the left)\n"
    "  --max-len N         cut each answer from the right so that prompt + answer\n"
    "                      <= N tokens (the eos after it is not counted: a row of\n"
    "                      --seq-len N holds it); a pair whose prompt leaves no room\n"
    "                      for an answer token is skipped and counted.\n"
    "A cut answer's eos is no target. Bad pairs (a missing field, an empty answer,\n"
    "a field of the wrong type) stop with FILE:LINE: field \"NAME\": reason.\n";

typedef struct {
    const char **pos; /* positional arguments */
    int n_pos;
    const char *vocab_size, *out, *tokenizer, *val_frac, *docs, *seed, *threads;
    const char *config, *chat_template, *field, *train_on, *max_prompt_len, *max_len;
    bool help, add_generation_prompt, skip_bad, no_special, skip_special;
} args;

/* --flag value, --flag=value; "-" alone is positional. */
static int parse(int argc, char **argv, int first, args *a, const char *cmd) {
    static const kiln_cli_flag flags[] = {
        {"--vocab-size", true}, {"-o", true},           {"--output", true},       {"--tokenizer", true},
        {"--val-frac", true},   {"--docs", true},       {"--seed", true},         {"--threads", true},
        {"--config", true},     {"--chat-template", true}, {"--field", true},     {"--train-on", true},
        {"--max-prompt-len", true}, {"--max-len", true},
        {"--no-special", false}, {"--skip-special", false}, {"--add-generation-prompt", false}, {"--skip-bad", false}};
    a->pos = calloc((size_t)argc + 1, sizeof *a->pos);
    if (!a->pos) return 1;
    for (int i = first; i < argc; i++) {
        const char *v;
        int k = kiln_cli_scan(cmd, argc, argv, &i, flags, (int)(sizeof flags / sizeof flags[0]), &v);
        if (k == KILN_ARG_HELP) {
            a->help = true;
            continue;
        }
        if (k == KILN_ARG_POS) {
            a->pos[a->n_pos++] = v;
            continue;
        }
        if (k == KILN_ARG_ERROR) return 2;
        /* the valueless flags: --no-special is encode's and tokenize's, --skip-special decode's */
        enum { VALUED = 14 }; /* flags[VALUED..]: the valueless ones */
        if ((k == VALUED && strcmp(cmd, "tokenizer encode") && strcmp(cmd, "tokenize")) || (k == VALUED + 1 && strcmp(cmd, "tokenizer decode")) ||
            (k >= 12 && k < VALUED && strcmp(cmd, "tokenize"))) {
            fprintf(stderr, "kiln %s: unknown flag %s (see --help)\n", cmd, flags[k].name);
            return 2;
        }
        bool *set[] = {&a->no_special, &a->skip_special, &a->add_generation_prompt, &a->skip_bad};
        if (k >= VALUED) {
            *set[k - VALUED] = true;
            continue;
        }
        const char **slot[] = {&a->vocab_size, &a->out, &a->out, &a->tokenizer, &a->val_frac,
                               &a->docs, &a->seed, &a->threads, &a->config, &a->chat_template,
                               &a->field, &a->train_on, &a->max_prompt_len, &a->max_len};
        *slot[k] = v;
    }
    return 0;
}

static bool set_threads(const char *cmd, const args *a) { return !a->threads || kiln_cli_threads(cmd, a->threads); }

static int fail(const char *cmd) {
    fprintf(stderr, "kiln %s: %s\n", cmd, kiln_last_error());
    return 1;
}

static char *read_stdin(size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0) break;
        if (len == cap) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
    }
    if (buf) buf[len] = 0;
    *n = len;
    return buf;
}

static int cmd_train(args *a) {
    const char *cmd = "tokenizer train";
    int64_t vs;
    if (a->n_pos == 0) return fprintf(stderr, "kiln %s: no CORPUS files given\n%s", cmd, tokenizer_usage), 2;
    if (!a->vocab_size) return fprintf(stderr, "kiln %s: --vocab-size is required\n", cmd), 2;
    if (!a->out) return fprintf(stderr, "kiln %s: -o FILE is required\n", cmd), 2;
    if (!kiln_cli_int(cmd, "--vocab-size", a->vocab_size, KILN_TOK_BASE_VOCAB, 1 << 24, &vs)) return 2;
    double t0 = kiln_time_now();
    kiln_tokenizer *t = NULL;
    if (kiln_tokenizer_train(a->pos, a->n_pos, (int)vs, &t)) return fail(cmd);
    kiln_status st = kiln_tokenizer_save(t, a->out);
    if (!st)
        fprintf(stderr, "kiln %s: %d tokens (%d merges) in %.2f s -> %s\n", cmd, kiln_tokenizer_vocab_size(t),
                kiln_tokenizer_n_merges(t), kiln_time_now() - t0, a->out);
    kiln_tokenizer_free(t);
    return st ? fail(cmd) : 0;
}

static int cmd_encode(args *a, kiln_tokenizer *t) {
    char *text = NULL;
    size_t n;
    if (a->n_pos > 1) return fprintf(stderr, "kiln tokenizer encode: give one TEXT (quote it) or -\n"), 2;
    if (a->n_pos == 0 || !strcmp(a->pos[0], "-")) {
        text = read_stdin(&n);
        if (!text) return fprintf(stderr, "kiln tokenizer encode: cannot read stdin\n"), 1;
    }
    int32_t *ids;
    size_t n_ids;
    unsigned fl = a->no_special ? 0 : KILN_ENCODE_SPECIAL;
    kiln_status st = text ? kiln_tokenizer_encode_ex(t, text, n, fl, &ids, &n_ids)
                          : kiln_tokenizer_encode_ex(t, a->pos[0], strlen(a->pos[0]), fl, &ids, &n_ids);
    free(text);
    if (st) return fail("tokenizer encode");
    for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", (int)ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

/* Appends the ids in s (separated by spaces, commas, brackets) to *ids. */
static bool parse_ids(const char *s, int32_t **ids, size_t *n, size_t *cap) {
    while (*s) {
        if (strchr(" \t\r\n,[]", *s)) {
            s++;
            continue;
        }
        size_t len = strcspn(s, " \t\r\n,[]");
        char word[32];
        int64_t v = 0;
        snprintf(word, sizeof word, "%.*s", (int)(len < sizeof word ? len : sizeof word - 1), s);
        if (len >= sizeof word || kiln_parse_i64(word, INT32_MIN, INT32_MAX, &v)) {
            fprintf(stderr, "kiln tokenizer decode: \"%.20s\" is not an id\n", s);
            return false;
        }
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            int32_t *p = realloc(*ids, *cap * sizeof *p);
            if (!p) return false;
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s += len;
    }
    return true;
}

static int cmd_decode(args *a, kiln_tokenizer *t) {
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    for (int i = 0; i < a->n_pos && ok; i++) {
        if (!strcmp(a->pos[i], "-")) {
            size_t len;
            char *in = read_stdin(&len);
            ok = in && parse_ids(in, &ids, &n, &cap);
            free(in);
        } else {
            ok = parse_ids(a->pos[i], &ids, &n, &cap);
        }
    }
    char *out = NULL;
    size_t len = 0;
    unsigned fl = KILN_DECODE_LOSSY | (a->skip_special ? KILN_DECODE_SKIP_SPECIAL : 0);
    if (ok && kiln_tokenizer_decode_ex(t, ids, n, fl, &out, &len)) {
        free(ids);
        return fail("tokenizer decode");
    }
    free(ids);
    if (!ok) return 2;
    fwrite(out, 1, len, stdout);
    free(out);
    return 0;
}

static int cmd_render(args *a) {
    const char *cmd = "tokenizer render";
    if (a->n_pos != 1) return fprintf(stderr, "kiln %s: give one CONVERSATION.json\n%s", cmd, tokenizer_usage), 2;
    if (!a->config && !a->chat_template)
        return fprintf(stderr, "kiln %s: --config tokenizer_config.json or --chat-template FILE is required\n", cmd), 2;
    json_error_t e;
    json_t *conv = json_load_file(a->pos[0], 0, &e);
    if (!conv) return fprintf(stderr, "kiln %s: %s:%d:%d: %s\n", cmd, a->pos[0], e.line, e.column, e.text), 1;
    kiln_chat *c = NULL;
    char *out = NULL;
    size_t n = 0;
    int rc = 0;
    if (kiln_chat_load(a->config, a->chat_template, &c)) {
        fprintf(stderr, "kiln %s: %s\n", cmd, kiln_last_error());
        rc = 1;
    } else if (kiln_chat_render(c, conv, a->add_generation_prompt, &out, &n)) {
        fprintf(stderr, "kiln %s: %s: %s\n", cmd, a->pos[0], kiln_last_error());
        rc = 1;
    } else {
        fwrite(out, 1, n, stdout);
    }
    free(out);
    kiln_chat_free(c);
    json_decref(conv);
    return rc;
}

int kiln_cmd_tokenizer(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(tokenizer_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    args a = {0};
    char cmd[64];
    snprintf(cmd, sizeof cmd, "tokenizer %s", sub);
    int rc = parse(argc, argv, 2, &a, cmd);
    if (!rc && a.help) {
        fputs(tokenizer_usage, stdout);
    } else if (!rc && !set_threads(cmd, &a)) {
        rc = 2;
    } else if (!rc && !strcmp(sub, "train")) {
        rc = cmd_train(&a);
    } else if (!rc && !strcmp(sub, "render")) {
        rc = cmd_render(&a);
    } else if (!rc && (!strcmp(sub, "encode") || !strcmp(sub, "decode"))) {
        kiln_tokenizer *t = NULL;
        if (!a.tokenizer) {
            fprintf(stderr, "kiln %s: --tokenizer FILE is required\n", cmd);
            rc = 2;
        } else if (kiln_tokenizer_open_any(a.tokenizer, &t)) {
            rc = fail(cmd);
        } else {
            rc = sub[0] == 'e' ? cmd_encode(&a, t) : cmd_decode(&a, t);
        }
        kiln_tokenizer_free(t);
    } else if (!rc) {
        fprintf(stderr, "kiln tokenizer: unknown subcommand \"%s\" (train, encode, decode, render)\n", sub);
        rc = 2;
    }
    free(a.pos);
    return rc;
}

/* The template the shards were rendered with goes beside them as
 * chat_template.jinja (the file transformers saves too), so a run trained
 * on them carries it into its model directory (kiln_model_files_save) and
 * `generate --chat` answers in the format it learned. Shards made without a
 * template lose a stale one. */
static kiln_status record_template(const char *out, const kiln_chat *chat) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/chat_template.jinja", out) >= (int)sizeof path)
        return kiln_error(KILN_ERR_INVALID, "path too long: %s", out);
    if (!chat) {
        if (unlink(path) != 0 && errno != ENOENT) return kiln_error(KILN_ERR_IO, "cannot remove stale %s: %s", path, strerror(errno));
        return KILN_OK;
    }
    size_t n = 0;
    const char *src = kiln_chat_source(chat, &n);
    return kiln_write_file_atomic(path, src, n);
}

/* The chat template beside the tokenizer file, as transformers'
 * AutoTokenizer finds it in a model directory: chat_template.jinja wins over
 * tokenizer_config.json's chat_template (kiln_model_meta_load's rule), and
 * tokenizer_config.json gives the special tokens either way. False when
 * there is neither. */
static bool template_beside(const char *tokenizer, char *cfg, char *tmpl, size_t cap, const char **config,
                            const char **chat_template) {
    const char *slash = strrchr(tokenizer, '/');
    int dn = slash ? (int)(slash - tokenizer) : 1;
    const char *dir = slash ? tokenizer : ".";
    if (slash == tokenizer) dn = 1; /* "/tokenizer.json" */
    if (snprintf(cfg, cap, "%.*s/tokenizer_config.json", dn, dir) >= (int)cap ||
        snprintf(tmpl, cap, "%.*s/chat_template.jinja", dn, dir) >= (int)cap)
        return false;
    bool have_cfg = access(cfg, R_OK) == 0, have_tmpl = access(tmpl, R_OK) == 0;
    if (have_tmpl) {
        *chat_template = tmpl;
        *config = have_cfg ? cfg : NULL;
        return true;
    }
    if (!have_cfg) return false;
    json_t *o = json_load_file(cfg, JSON_DECODE_INT_AS_REAL, NULL);
    bool has = json_object_get(o, "chat_template") != NULL; /* a broken file: kiln_chat_load says why */
    if (!o) has = true;
    json_decref(o);
    if (has) *config = cfg;
    return has;
}

int kiln_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize";
    args a = {0};
    int rc = parse(argc, argv, 1, &a, cmd);
    kiln_tokenize_opts o = {.val_frac = 0.05, .split = KILN_DOC_PARAGRAPH};
    if (!rc && a.help) {
        fputs(tokenize_usage, stdout);
        goto done;
    }
    if (!rc && !set_threads(cmd, &a)) rc = 2;
    if (!rc && a.n_pos == 0) rc = (fprintf(stderr, "kiln %s: no CORPUS files given\n%s", cmd, tokenize_usage), 2);
    if (!rc && !a.tokenizer) rc = (fprintf(stderr, "kiln %s: --tokenizer FILE is required\n", cmd), 2);
    if (!rc && !a.out) rc = (fprintf(stderr, "kiln %s: -o DIR is required\n", cmd), 2);
    /* [0, 1): everything held out would leave no training data */
    if (!rc && a.val_frac && (!kiln_cli_num(cmd, "--val-frac", a.val_frac, 0, 1, &o.val_frac) || o.val_frac >= 1)) {
        if (o.val_frac >= 1) fprintf(stderr, "kiln %s: --val-frac: bad value '%s' (expected a number in [0, 1))\n", cmd, a.val_frac);
        rc = 2;
    }
    static const kiln_choice docs[] = {
        {"paragraph", KILN_DOC_PARAGRAPH}, {"file", KILN_DOC_FILE}, {"line", KILN_DOC_LINE}, {NULL, 0}};
    int split = o.split;
    if (!rc && a.docs && !kiln_cli_choice(cmd, "--docs", a.docs, docs, &split)) rc = 2;
    o.split = split;
    if (!rc && a.seed && !kiln_cli_u64(cmd, "--seed", a.seed, &o.seed)) rc = 2;
    static const kiln_choice trains[] = {
        {"assistant", KILN_TRAIN_ASSISTANT}, {"completion", KILN_TRAIN_COMPLETION}, {"all", KILN_TRAIN_ALL}, {NULL, 0}};
    int train_on = o.train_on;
    if (!rc && a.train_on && !kiln_cli_choice(cmd, "--train-on", a.train_on, trains, &train_on)) rc = 2;
    o.train_on = (kiln_train_on)train_on;
    o.field = a.field;
    o.skip_bad = a.skip_bad;
    o.no_special = a.no_special;
    if (!rc && a.max_prompt_len && !kiln_cli_int(cmd, "--max-prompt-len", a.max_prompt_len, 1, INT32_MAX, &o.max_prompt_len)) rc = 2;
    if (!rc && a.max_len && !kiln_cli_int(cmd, "--max-len", a.max_len, 1, INT32_MAX, &o.max_len)) rc = 2;
    if (rc) goto done;
    kiln_tokenizer *t = NULL;
    kiln_chat *chat = NULL;
    kiln_tokenize_stats s;
    char beside_cfg[4096], beside_tmpl[4096];
    const char *config = a.config, *chat_template = a.chat_template;
    bool beside = !config && !chat_template &&
                  template_beside(a.tokenizer, beside_cfg, beside_tmpl, sizeof beside_cfg, &config, &chat_template);
    if (beside && kiln_chat_load(config, chat_template, &chat)) {
        /* plain text needs no template: say why "messages" lines would fail */
        fprintf(stderr, "kiln %s: not using the chat template beside the tokenizer: %s\n", cmd, kiln_last_error());
    } else if (beside) {
        fprintf(stderr, "kiln %s: chat template: %s (beside --tokenizer; --config or --chat-template chooses another)\n", cmd,
                chat_template ? chat_template : config);
    }
    if (!beside && (config || chat_template) && kiln_chat_load(config, chat_template, &chat)) {
        rc = fail(cmd);
    } else if ((o.chat = chat), kiln_tokenizer_open_any(a.tokenizer, &t) || kiln_tokenize_files(t, a.pos, a.n_pos, a.out, &o, &s)) {
        rc = fail(cmd);
    } else if (record_template(a.out, chat)) {
        rc = fail(cmd);
    } else {
        if (s.pairs)
            fprintf(stderr, "kiln %s: %.2f MB -> %s/train.bin (%llu tokens, %llu pairs), %s/val.bin (%llu tokens, %llu pairs)",
                    cmd, s.bytes / 1e6, a.out, (unsigned long long)s.train_tokens, (unsigned long long)s.train_pairs, a.out,
                    (unsigned long long)s.val_tokens, (unsigned long long)s.val_pairs);
        else
            fprintf(stderr, "kiln %s: %.2f MB -> %s/train.bin (%llu tokens, %llu docs), %s/val.bin (%llu tokens, %llu docs)",
                    cmd, s.bytes / 1e6, a.out, (unsigned long long)s.train_tokens, (unsigned long long)s.train_docs, a.out,
                    (unsigned long long)s.val_tokens, (unsigned long long)s.val_docs);
        if (s.masked_tokens) fprintf(stderr, ", %llu tokens masked (not targets)", (unsigned long long)s.masked_tokens);
        if (s.prompts_truncated) fprintf(stderr, ", %llu prompts truncated", (unsigned long long)s.prompts_truncated);
        if (s.answers_truncated) fprintf(stderr, ", %llu answers truncated", (unsigned long long)s.answers_truncated);
        if (s.pairs_skipped)
            fprintf(stderr, ", %llu pairs skipped (prompt >= --max-len)", (unsigned long long)s.pairs_skipped);
        if (s.bad_lines) fprintf(stderr, ", %llu bad lines skipped", (unsigned long long)s.bad_lines);
        fputc('\n', stderr);
    }
    kiln_chat_free(chat);
    kiln_tokenizer_free(t);
done:
    free(a.pos);
    return rc;
}
