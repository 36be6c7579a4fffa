/* `kiln eval RUN_DIR|MODEL_DIR`: loss and perplexity of the checkpoint
 * `kiln train --resume` would continue from (the newest complete one; the
 * run directory's links can lag one behind after a kill), or of a model
 * directory, on DIR/val.bin or on a text file tokenized with the model's
 * own tokenizer. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/backend.h"
#include "kiln/gguf.h"
#include "kiln/train.h"

static const char *eval_usage =
    "usage: kiln eval RUN_DIR|MODEL_DIR [--data DIR | --text FILE] [--batches N]\n"
    "                 [--batch B] [--seq-len T] [--docs paragraph|file|line] [--device NAME]\n"
    "\n"
    "Loads the checkpoint `kiln train --resume RUN_DIR` would continue from (the\n"
    "newest complete checkpoint-*/ of RUN_DIR), or MODEL_DIR itself (config.json\n"
    "and model.safetensors or a sharded model.safetensors.index.json, F32, BF16\n"
    "or F16), and prints its mean token loss and perplexity (6 significant\n"
    "digits) on packed rows, in order, of DIR/val.bin or of FILE.\n"
    "\n"
    "options:\n"
    "  --data DIR      directory with val.bin (default: the run's data directory,\n"
    "                  from its train_config.json)\n"
    "  --text FILE     a text file instead, tokenized with the model's own\n"
    "                  tokenizer.json exactly as `kiln tokenize` makes shards:\n"
    "                  documents (--docs, default paragraph) each followed by eos\n"
    "  --docs MODE     document split for --text: paragraph, file or line\n"
    "  --batches N     evaluate the first N micro-batches (default: 0 = all)\n"
    "  --batch B       rows per micro-batch (default: the run's batch, else 8)\n"
    "  --seq-len T     tokens per row (default: the run's seq_len, else 128;\n"
    "                  at most the model's max_position_embeddings)\n"
    "  --device NAME   where the model and the work live: one of" KILN_DEVICE_NAMES "\n"
    "                  (default: cpu; `kiln devices`)\n"
    "  --threads N     compute threads (default: all cores)\n"
    "  -h, --help      this text\n";

static bool int_arg(const char *flag, const char *v, long long lo, long long *out) {
    int64_t x;
    if (!kiln_cli_int("eval", flag, v, lo, 1LL << 40, &x)) return false;
    *out = x;
    return true;
}

typedef struct {
    const char *run_dir, *data_dir, *text;
    long long batches, batch, seq_len;
    kiln_doc_split split;
    const kiln_backend *device;
} eval_args;

static int parse_args(int argc, char **argv, eval_args *a) {
    static const char *const names[] = {"--data", "--batches", "--batch", "--seq-len", "--threads", "--text", "--docs",
                                        "--device"};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int k = kiln_cli_arg("eval", argc, argv, &i, names, 8, &v);
        if (k == KILN_ARG_HELP) {
            fputs(eval_usage, stdout);
            return -1;
        }
        if (k == KILN_ARG_ERROR) return 2;
        if (k == KILN_ARG_POS) {
            if (a->run_dir) {
                fprintf(stderr, "kiln eval: unexpected argument '%s'\n", v);
                return 2;
            }
            a->run_dir = v;
            continue;
        }
        bool ok = true;
        if (k == 0) a->data_dir = v;
        else if (k == 1) ok = int_arg(names[k], v, 0, &a->batches);
        else if (k == 2) ok = int_arg(names[k], v, 1, &a->batch);
        else if (k == 3) ok = int_arg(names[k], v, 2, &a->seq_len);
        else if (k == 4) ok = kiln_cli_threads("eval", v);
        else if (k == 5) a->text = v;
        else if (k == 7) ok = kiln_cli_device("eval", v, &a->device);
        else {
            static const kiln_choice docs[] = {
                {"paragraph", KILN_DOC_PARAGRAPH}, {"file", KILN_DOC_FILE}, {"line", KILN_DOC_LINE}, {NULL, 0}};
            int split = a->split;
            ok = kiln_cli_choice("eval", names[k], v, docs, &split);
            a->split = split;
        }
        if (!ok) return 2;
    }
    if (!a->run_dir) {
        fputs(eval_usage, stderr);
        return 2;
    }
    if (a->text && a->data_dir) {
        fprintf(stderr, "kiln eval: --text and --data exclude each other\n");
        return 2;
    }
    return 0;
}

/* The run's settings (data dir, batch, seq_len): the loaded checkpoint's
 * train_config.json, else RUN_DIR's. */
static kiln_status run_config(const char *run_dir, const char *model_dir, kiln_train_config *c) {
    char path[1200];
    kiln_train_config_default(c);
    snprintf(path, sizeof path, "%s/train_config.json", model_dir);
    if (access(path, R_OK) != 0) snprintf(path, sizeof path, "%s/train_config.json", run_dir);
    char *text = NULL;
    size_t n = 0;
    kiln_status st = kiln_read_file(path, &text, &n);
    if (!st) st = kiln_train_config_parse(text, path, c);
    free(text);
    return st;
}

/* FILE as a token shard in a fresh temporary directory (*tmpdir), made by
 * the code `kiln tokenize` runs, so --text and shards of the same text give
 * the same rows. */
static kiln_status text_shard(const char *model_dir, const char *file, kiln_doc_split split, char *tmpdir,
                              char *shard, size_t n) {
    char tok_path[1200];
    if (kiln_is_gguf_path(model_dir)) snprintf(tok_path, sizeof tok_path, "%s", model_dir); /* the file's own */
    else snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model_dir);
    if (access(file, R_OK) != 0) return kiln_error(KILN_ERR_IO, "--text %s: %s", file, strerror(errno));
    if (access(tok_path, R_OK) != 0)
        return kiln_error(KILN_ERR_IO, "--text needs the model's tokenizer: %s: %s", tok_path, strerror(errno));
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, 1024, "%s/kiln_eval_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot create a temporary directory %s: %s", tmpdir, strerror(errno));
        tmpdir[0] = 0;
        return st;
    }
    kiln_tokenizer *tok = NULL;
    kiln_tokenize_opts o = {.val_frac = 0, .split = split};
    kiln_tokenize_stats s;
    const char *paths[1] = {file};
    kiln_status st = kiln_tokenizer_open_any(tok_path, &tok);
    kiln_log_set_level(KILN_LOG_WARN); /* its progress lines name the temporary directory: noise here */
    if (!st) st = kiln_tokenize_files(tok, paths, 1, tmpdir, &o, &s);
    kiln_log_set_level(KILN_LOG_INFO);
    kiln_tokenizer_free(tok);
    snprintf(shard, n, "%s/train.bin", tmpdir);
    return st;
}

static void remove_tmp(const char *tmpdir) {
    if (!tmpdir[0]) return;
    char p[1100];
    static const char *const files[] = {"train.bin", "val.bin"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        unlink(p);
    }
    rmdir(tmpdir);
}

static int eval_on_device(const eval_args *a);

int kiln_cmd_eval(int argc, char **argv) {
    eval_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    /* the model is made on the device, and with it the work of evaluation */
    const kiln_backend *was = kiln_backend_use(a.device ? a.device : kiln_backend_current());
    rc = eval_on_device(&a);
    kiln_backend_use(was);
    return rc;
}

static int eval_on_device(const eval_args *ap) {
    eval_args a = *ap;
    int rc = 0;
    char dir[1024];
    if (kiln_model_dir_resolve(a.run_dir, dir, sizeof dir)) {
        fprintf(stderr, "kiln eval: %s\n", kiln_last_error());
        return 1;
    }
    kiln_train_config c;
    kiln_status cst = run_config(a.run_dir, dir, &c);
    if (cst && !a.data_dir && !a.text) {
        fprintf(stderr, "kiln eval: no --data or --text given and the run's settings are unreadable: %s\n",
                kiln_last_error());
        return 1;
    }
    if (cst) kiln_train_config_default(&c); /* a model directory: defaults for batch and seq_len */
    kiln_llama *m = NULL;
    kiln_loader *l = NULL;
    kiln_batch *b = NULL;
    char tmpdir[1024] = "", path[1100];
    if (kiln_load_model_dir(dir, &m)) {
        fprintf(stderr, "kiln eval: %s\n", kiln_last_error());
        return 1;
    }
    if (a.text) {
        if (text_shard(dir, a.text, a.split, tmpdir, path, sizeof path)) {
            fprintf(stderr, "kiln eval: %s\n", kiln_last_error());
            rc = 1;
            goto done;
        }
    } else {
        snprintf(path, sizeof path, "%s/val.bin", a.data_dir ? a.data_dir : c.data);
    }
    const char *what = a.text ? a.text : path;
    int T = a.seq_len ? (int)a.seq_len : c.seq_len;
    if (T > m->cfg.max_position_embeddings) T = (int)m->cfg.max_position_embeddings;
    kiln_loader_config lc = {path, a.batch ? (int)a.batch : c.batch, T, KILN_PACK_PACKED, false, c.seed};
    if (kiln_loader_open(&lc, &l) || !(b = kiln_batch_alloc(lc.batch_size, lc.seq_len))) {
        fprintf(stderr, "kiln eval: %s\n", kiln_last_error());
        rc = 1;
        goto done;
    }
    if ((int64_t)kiln_loader_info(l)->vocab_size > m->cfg.vocab_size) {
        fprintf(stderr, "kiln eval: %s has vocabulary %u but the model %lld\n", what, kiln_loader_info(l)->vocab_size,
                (long long)m->cfg.vocab_size);
        rc = 1;
        goto done;
    }
    int64_t n = a.batches > 0 && a.batches < kiln_loader_len(l) ? a.batches : kiln_loader_len(l);
    double sum = 0, t0 = kiln_time_now();
    int64_t tokens = 0;
    for (int64_t i = 0; i < n; i++) {
        double li = 0;
        int64_t ti = 0;
        if (kiln_loader_get(l, 0, i, b) || kiln_evaluate(m, &b, 1, &li, &ti)) {
            fprintf(stderr, "kiln eval: batch %lld: %s\n", (long long)i, kiln_last_error());
            rc = 1;
            goto done;
        }
        sum += li * (double)ti;
        tokens += ti;
    }
    if (tokens == 0) {
        fprintf(stderr, "kiln eval: %s holds no complete row of %d tokens\n", what, T);
        rc = 1;
        goto done;
    }
    double loss = sum / (double)tokens, dt = kiln_time_now() - t0;
    printf("%s loss %#.6g  perplexity %#.6g  (%lld tokens, %lld batches of %dx%d, %s, model %s, %.1fs)\n",
           a.text ? "text" : "val", loss, exp(loss), (long long)tokens, (long long)n, lc.batch_size, T, what, dir, dt);
done:
    kiln_batch_free(b);
    kiln_loader_close(l);
    kiln_llama_free(m);
    remove_tmp(tmpdir);
    return rc;
}
