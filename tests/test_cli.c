/* The kiln command as a person uses it: help and usage errors, the whole
 * pipeline on a generated corpus (tokenizer, shards, train, Ctrl-C saves and
 * exits 0, resume, eval, generate, plot), and a corrupt checkpoint refused
 * with the file named. Runs the kiln binary built beside this test. */
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli_run.h"
#include "test.h"

static char dir[256];

/* The whole output, exactly. */
static bool output_is(const char *want) {
    char *text = cli_output();
    bool same = !strcmp(text, want);
    if (!same) fprintf(stderr, "--- output is:\n%s--- expected:\n%s---\n", text, want);
    free(text);
    return same;
}

static void write_corpus(const char *path) {
    static const char *words[] = {"the", "lord", "said", "unto", "moses", "and", "he", "went", "up", "into",
                                  "mountain", "of", "god", "in", "beginning", "was", "word", "light", "day", "night"};
    FILE *f = fopen(path, "w");
    for (int p = 0; p < 300; p++) {
        for (int s = 0; s < 6; s++) {
            for (int w = 0; w < 12; w++)
                fprintf(f, "%s%s", w ? " " : "", words[kiln_rng_u64(7, (uint64_t)(p * 100 + s * 12 + w)) % 20]);
            fprintf(f, ". ");
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
}

static void help_and_usage(void) {
    CHECK(cli_kiln_run((const char *[]){"--help", NULL}) == 0 && cli_output_has("commands:"), "kiln --help");
    CHECK(cli_kiln_run((const char *[]){"frobnicate", NULL}) == 2 && cli_output_has("unknown command"), "unknown command");
    const char *cmds[] = {"tokenizer", "tokenize", "train", "eval", "generate", "plot", "bench", "compile", "devices"};
    for (int i = 0; i < 9; i++)
        CHECK(cli_kiln_run((const char *[]){cmds[i], "--help", NULL}) == 0 && cli_output_has("usage"), "kiln %s --help", cmds[i]);
    CHECK(cli_kiln_run((const char *[]){"train", "--lr", "abc", NULL}) == 2 && cli_output_has("--lr"), "bad flag value named");
    /* the devices, listed; an unknown --device names the known ones */
    CHECK(cli_kiln_run((const char *[]){"devices", NULL}) == 0 && cli_output_has("cpu\n") && cli_output_has("cpu-isolated\n") &&
              cli_output_has("CPU GEMM: fp32: by measurement per shape among oneDNN ") &&
              cli_output_has("not host-mappable") && cli_output_has("kernels:"),
          "kiln devices lists cpu and cpu-isolated");
    const char *devcmd[][3] = {{"generate", "run", NULL}, {"eval", "run", NULL}, {"bench", NULL, NULL}};
    for (int i = 0; i < 3; i++) {
        const char *args[6] = {devcmd[i][0], devcmd[i][1] ? devcmd[i][1] : "--device", devcmd[i][1] ? "--device" : "tpu0",
                               devcmd[i][1] ? "tpu0" : NULL, NULL};
        CHECK(cli_kiln_run(args) == 2 && cli_output_has("--device") && cli_output_has("'tpu0'") && cli_output_has("cpu") &&
                  cli_output_has("cpu-isolated"),
              "kiln %s --device tpu0 names the known devices", devcmd[i][0]);
    }
    /* the error text names the flag once (it was formatted into itself: "compile: compile: ompile ...") */
    CHECK(cli_kiln_run((const char *[]){"train", "--compile", "bogus", "--data", dir, NULL}) == 2 &&
              output_is("kiln train: --compile: bad value 'bogus' (expected off, default, reduce-overhead, max-autotune, "
                        "interpret or strict)\n"),
          "--compile bogus: exact message");
    /* every command reads numbers through the one checked parser and says
     * so in one format (bench and compile took "8x" as 8 and "abc" as 0) */
    struct {
        const char *args[10], *want;
    } bad[] = {
        {{"bench", "--batch", "8x"}, "kiln bench: --batch: bad value '8x' (expected an integer in [1, 1048576])\n"},
        {{"bench", "--peak", "abc"}, "kiln bench: --peak: bad value 'abc' (expected a number in [0, 1e+09])\n"},
        {{"bench", "--threads", "abc"}, "kiln bench: --threads: bad value 'abc' (expected an integer in [1, 4096])\n"},
        {{"bench", "--steps", "-3"}, "kiln bench: --steps: bad value '-3' (expected an integer in [1, 1048576])\n"},
        {{"compile", "--explain", "--seq", "32x"}, "kiln compile: --seq: bad value '32x' (expected an integer in [2, 16777216])\n"},
        {{"train", "--seed", "-1"}, "kiln train: --seed: bad value '-1' (expected a non-negative integer below 2^64)\n"},
        {{"train", "--threads", "0"}, "kiln train: --threads: bad value '0' (expected an integer in [1, 4096])\n"},
        {{"generate", "run", "--top-k", "1.5"}, "kiln generate: --top-k: bad value '1.5' (expected an integer in [0, 1073741824])\n"},
        {{"eval", "run", "--batches", "many"}, "kiln eval: --batches: bad value 'many' (expected an integer in [0, 1099511627776])\n"},
        {{"tokenize", "c.txt", "--tokenizer", "t.json", "-o", "out", "--seed", "x1"}, "kiln tokenize: --seed: bad value 'x1' (expected a non-negative integer below 2^64)\n"},
        {{"tokenizer", "train", "c.txt", "--vocab-size", "1e4", "-o", "t.json"},
         "kiln tokenizer train: --vocab-size: bad value '1e4' (expected an integer in [259, 16777216])\n"},
        {{"bench", "--profile=yes"}, "kiln bench: --profile takes no value\n"},
        {{"bench", "--rounds", "0"}, "kiln bench: --rounds: bad value '0' (expected an integer in [1, 1048576])\n"},
        {{"bench", "--rounds", "6"}, "kiln bench: --rounds 6 is more than --steps: each round times at least one step of every mode\n"},
        {{"bench", "--rounds", "2", "--profile"},
         "kiln bench: --rounds 2 and --profile do not go together (the profile covers one round's steps: use --rounds 1)\n"},
        {{"bench", "--rounds", "2", "--pack", "documents"},
         "kiln bench: --rounds 2 and --pack documents do not go together (the documents bench times its two steps in one round)\n"},
        {{"tokenizer", "encode", "--no-special=1"}, "kiln tokenizer encode: --no-special takes no value\n"},
        {{"tokenizer", "encode", "--skip-special"}, "kiln tokenizer encode: unknown flag --skip-special (see --help)\n"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        CHECK(cli_kiln_run(bad[k].args) == 2 && output_is(bad[k].want), "%s %s %s refused", bad[k].args[0], bad[k].args[1],
              bad[k].args[2]);
    CHECK(cli_kiln_run((const char *[]){"train", "--batch", "0", "--data", dir, NULL}) != 0 && cli_output_has("batch"),
          "bad batch named");
    /* rounds: every mode runs in each round, the steps split over them, the
     * peak measured before each (a machine whose speed drifts then slows
     * every mode alike) */
    CHECK(cli_kiln_run((const char *[]){"bench", "--model", "tiny", "--batch", "2", "--seq", "16", "--steps", "3", "--rounds",
                                        "2", "--modes", "eager,default", "--results", NULL}) == 0 &&
              cli_output_has("2 rounds, every mode in each (the first rounds one step more); fp32 FMA peak before each round:") &&
              cli_output_has("RESULT mode=eager ") && cli_output_has("RESULT mode=default ") && cli_output_has("(median of 3 steps per mode"),
          "bench --rounds 2 runs both modes over 3 steps");
    { /* and each round's ratio to eager, from that round's steps: two positive ratios */
        char *text = cli_output();
        const char *line = text ? strstr(text, "default vs eager in each round (median steps):") : NULL;
        double r1 = 0, r2 = 0;
        CHECK(line && sscanf(line, "default vs eager in each round (median steps): %lfx %lfx", &r1, &r2) == 2 && r1 > 0 &&
                  r2 > 0,
              "bench --rounds 2 prints default's ratio to eager in each round: %s", line ? line : "(no line)");
        free(text);
    }
    /* --profile: the compiled step by class, then its costliest kinds of
     * fused group, which are part of the class: their ms add up to at most
     * the class's (each figure printed to 0.1 ms; 4 x 64 tokens, so that
     * the class takes some: at 2 x 16 it printed 0.0 ms on a Zen 5) */
    CHECK(cli_kiln_run((const char *[]){"bench", "--model", "tiny", "--batch", "4", "--seq", "64", "--steps", "2", "--modes",
                                        "default", "--profile", NULL}) == 0 &&
              cli_output_has("step time by op class, default") &&
              cli_output_has("the costliest kinds of fused group (ms per step; groups x ms per call; memory traffic):") &&
              cli_output_has(" elements: silu mul"),
          "bench --profile lists the costliest kinds of fused group");
    {
        char *text = cli_output();
        const char *cls = text ? strstr(text, "fused groups (generated)") : NULL;
        const char *list = text ? strstr(text, "memory traffic):\n") : NULL;
        double class_ms = -1, sum = 0, ms;
        int kinds = 0;
        if (cls) sscanf(cls, "fused groups (generated) %lf", &class_ms);
        for (const char *l = list ? strchr(list, '\n') + 1 : NULL; l && sscanf(l, " %lf ms ", &ms) == 1 && strstr(l, "elements:");
             l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
            sum += ms, kinds++;
        CHECK(class_ms > 0 && kinds >= 1 && kinds <= 6 && sum <= class_ms + 0.05 * kinds + 0.05,
              "the listed kinds (%d, %.1f ms) are part of the fused groups' %.1f ms", kinds, sum, class_ms);
        /* then its costliest products: all of them together are the GEMM
         * class (the step has no other matmul op), each line's ms per step
         * is its positions times its ms per call, and its GFLOP/s is its
         * own M N K over that call's time */
        const char *gc = text ? strstr(text, "GEMM (matmul)") : NULL;
        const char *gl = text ? strstr(text, "the costliest products (") : NULL;
        double gemm_ms = -1, all_ms = -1, psum = 0;
        int geoms = 0, lines = 0, consistent = 0;
        if (gc) sscanf(gc, "GEMM (matmul) %lf", &gemm_ms);
        if (gl) sscanf(gl, "the costliest products (%lf ms per step in %d geometries", &all_ms, &geoms);
        for (const char *l = gl ? strchr(gl, '\n') + 1 : NULL; l && strstr(l, " K ") && strstr(l, " K ") < strchr(l, '\n');
             l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
            double step_ms, call_ms, rate, pct;
            int pos;
            long long M, N, K;
            char prec[8], tr[3];
            if (sscanf(l, " %lf ms %d x %lf ms %lf GFLOP/s %lf%% %7s %2s M %lld N %lld K %lld", &step_ms, &pos, &call_ms,
                       &rate, &pct, prec, tr, &M, &N, &K) != 10)
                break;
            lines++, psum += step_ms;
            /* the figures as printed: ms to 0.1 and 0.001, GFLOP/s to 0.1 */
            const double f = 2.0 * (double)M * (double)N * (double)K / 1e9;
            consistent += fabs(step_ms - pos * call_ms) <= 0.05 + 0.0005 * pos + 1e-9 && !strcmp(prec, "fp32") &&
                          call_ms > 0.0005 && rate >= f / ((call_ms + 0.0005) * 1e-3) * 0.99 - 0.05 &&
                          rate <= f / ((call_ms - 0.0005) * 1e-3) * 1.01 + 0.05;
        }
        CHECK(gemm_ms > 0 && fabs(all_ms - gemm_ms) <= 0.1 && geoms >= lines && lines >= 1 && lines <= 8 &&
                  psum <= all_ms + 0.05 * lines + 0.05 && consistent == lines,
              "bench --profile's costliest products (%d of %d, %.1f of %.1f ms; %d consistent) are the GEMM class's %.1f ms",
              lines, geoms, psum, all_ms, consistent, gemm_ms);
        free(text);
    }
    CHECK(cli_kiln_run((const char *[]){"train", "--data", "/nonexistent/data", "--tokenizer", "t.json", NULL}) == 1 &&
              cli_output_has("/nonexistent/data"),
          "missing data dir named");
    /* range errors in a --config file name the file and the key */
    char cfg[400], want[800];
    snprintf(cfg, sizeof cfg, "%s/bad_config.json", dir);
    const char *bad_cfg = "{\"lr\": 0.01, \"epochs\": 0}";
    CHECK_OK(kiln_write_file_atomic(cfg, bad_cfg, strlen(bad_cfg)));
    snprintf(want, sizeof want, "kiln train: %s: epochs: bad value '0' (expected an integer >= 1)\n", cfg);
    CHECK(cli_kiln_run((const char *[]){"train", "--config", cfg, "--tokenizer", "t.json", NULL}) == 2 && output_is(want),
          "--config range error names the file");
    /* a run without its tokenizer could not be used by generate: refused at start */
    CHECK(cli_kiln_run((const char *[]){"train", "--data", dir, "--run-dir", "/nonexistent/run", NULL}) == 2 &&
              cli_output_has("no --tokenizer"),
          "a new run without --tokenizer is refused");
}

/* The output up to the closing "[N tokens in ...]" line (stderr's timing). */
static char *output_text(void) {
    char *text = cli_output();
    char *end = strstr(text, "\n[");
    if (end) end[1] = 0;
    return text;
}

/* generate --chat: the user message rendered through the template with the
 * generation prompt (the template writes bos), then the reply alone; the
 * same ids given as --prompt (bos + the rendered rest) continue the same
 * way under greedy decoding. */
static void chat_generate(const char *run, const char *tok) {
    char tpl[600];
    snprintf(tpl, sizeof tpl, "%s/chat.jinja", dir);
    FILE *f = fopen(tpl, "w");
    fputs("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}",
          f);
    fclose(f);
    int rc = cli_kiln_run((const char *[]){"generate", run, "--chat", "and god said", "--system", "the lord", "--chat-template",
                                       tpl, "--temperature", "0", "--max-tokens", "12", NULL});
    char *chat = output_text();
    CHECK(rc == 0 && chat, "generate --chat (rc %d)", rc);
    rc = cli_kiln_run((const char *[]){"generate", run, "--prompt", "<system>the lord\n<user>and god said\n<assistant>",
                                   "--temperature", "0", "--max-tokens", "12", NULL});
    char *plain = output_text();
    const char *echo = "<system>the lord\n<user>and god said\n<assistant>";
    CHECK(rc == 0 && plain && !strncmp(plain, echo, strlen(echo)), "generate --prompt echoes the rendered prompt (rc %d)", rc);
    CHECK(chat && plain && strlen(chat) > 1 && !strcmp(chat, plain + strlen(echo)),
          "--chat replies as the rendered prompt continues: '%s' vs '%s'", chat ? chat : "", plain ? plain + strlen(echo) : "");
    free(chat);
    free(plain);
    /* the template goes with the data into the fine-tuned model: tokenize
     * through it (chat_template.jinja beside the shards), train --init on
     * them (the run's model directory holds it), generate --chat finds it */
    char jl[600], data[600], ft[600], got[700];
    snprintf(jl, sizeof jl, "%s/chat.jsonl", dir);
    snprintf(data, sizeof data, "%s/chatdata", dir);
    snprintf(ft, sizeof ft, "%s/chatrun", dir);
    f = fopen(jl, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"who begat number %d\"}, "
                   "{\"role\": \"assistant\", \"content\": \"and %d begat %d\"}]}\n",
                i, i, i + 1);
    fclose(f);
    CHECK(cli_kiln_run((const char *[]){"tokenize", jl, "--tokenizer", tok, "--chat-template", tpl, "-o", data, NULL}) == 0,
          "tokenize a chat JSONL through the template");
    char *want = NULL, *have = NULL;
    size_t nw = 0, nh = 0;
    snprintf(got, sizeof got, "%s/chat_template.jinja", data);
    CHECK(!kiln_read_file(tpl, &want, &nw) && !kiln_read_file(got, &have, &nh) && nw == nh && !memcmp(want, have, nw),
          "the shards' directory records the template they were rendered with");
    free(have);
    have = NULL;
    rc = cli_kiln_run((const char *[]){"train", "--init", run, "--data", data, "--run-dir", ft, "--seq-len", "32", "--batch", "2",
                                   "--accum", "1", "--steps", "1", "--eval-every", "0", "--no-plot", NULL});
    snprintf(got, sizeof got, "%s/chat_template.jinja", ft);
    CHECK(rc == 0 && !kiln_read_file(got, &have, &nh) && nw == nh && !memcmp(want, have, nw),
          "train --init on chat shards puts the template in the model directory (rc %d)", rc);
    free(want);
    free(have);
    rc = cli_kiln_run((const char *[]){"generate", ft, "--chat", "who begat number 3", "--temperature", "0", "--max-tokens", "6",
                                   NULL});
    chat = output_text();
    rc = rc == 0 ? cli_kiln_run((const char *[]){"generate", ft, "--chat", "who begat number 3", "--chat-template", tpl,
                                             "--temperature", "0", "--max-tokens", "6", NULL})
                 : rc;
    plain = output_text();
    CHECK(rc == 0 && chat && plain && !strcmp(chat, plain), "generate --chat uses the model's chat_template.jinja (rc %d)", rc);
    free(chat);
    free(plain);
    CHECK(cli_kiln_run((const char *[]){"generate", run, "--chat", "hi", "--prompt", "x", NULL}) == 2 &&
              cli_output_has("exclude each other"),
          "--chat with --prompt is refused");
    CHECK(cli_kiln_run((const char *[]){"generate", run, "--system", "x", NULL}) == 2 && cli_output_has("--system needs --chat"),
          "--system without --chat is refused");
    snprintf(tpl, sizeof tpl, "%s/bad.jinja", dir);
    f = fopen(tpl, "w");
    fputs("{% for m in messages %}{{ m.content | wordwrap(5) }}{% endfor %}", f);
    fclose(f);
    CHECK(cli_kiln_run((const char *[]){"generate", run, "--chat", "hi", "--chat-template", tpl, NULL}) == 1 &&
              cli_output_has("bad.jinja") && cli_output_has("wordwrap"),
          "a template outside the subset is refused naming the file and the construct");
}

static void pipeline(void) {
    char corpus[512], tok[512], data[512], run[512], path[600];
    int rc;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(run, sizeof run, "%s/run", dir);
    write_corpus(corpus);
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", corpus, "--vocab-size", "300", "-o", tok, NULL}) == 0,
          "tokenizer train");
    CHECK(cli_kiln_run((const char *[]){"tokenize", corpus, "--tokenizer", tok, "-o", data, NULL}) == 0, "tokenize");
    /* a save past the file-size limit: a message naming the file, exit 1
     * (it was killed by SIGXFSZ, exit 153, saying nothing) */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "ulimit -f 64; exec %s train --data %s --tokenizer %s --run-dir %s/fsz --model tiny --seq-len 32 --batch 2 "
             "--accum 1 --steps 1 --eval-every 0 --no-plot >%s/out.txt 2>&1",
             cli_kiln, data, tok, dir, dir);
    rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    CHECK(rc == 1 && cli_output_has("File too large") && cli_output_has("model.safetensors"),
          "a save over ulimit -f fails with a message (exit %d)", rc);
    /* a long run interrupted by Ctrl-C: finishes the step, saves, exits 0 */
    rc = cli_kiln_signal((const char *[]){"train", "--data", data, "--tokenizer", tok, "--run-dir", run, "--model", "tiny",
                                       "--seq-len", "32", "--batch", "2", "--accum", "2", "--steps", "100000", "--save-every",
                                       "0", "--eval-every", "0", "--no-plot", NULL},
                      SIGINT, 3.0);
    CHECK(rc == 0, "Ctrl-C during training exits 0 (got %d)", rc);
    CHECK(cli_output_has("a step over steps 2-4: expect about") && cli_output_has("for the 99996 steps left"),
          "after its first steps the run says how long the rest will take");
    snprintf(path, sizeof path, "%s/trainer_state.json", run);
    CHECK(access(path, R_OK) == 0, "Ctrl-C saved a checkpoint");
    CHECK(cli_kiln_signal((const char *[]){"train", "--resume", run, "--steps", "100000", "--no-plot", NULL}, SIGINT, 2.0) == 0,
          "resume, then Ctrl-C again");
    /* fine-tuning without --tokenizer takes the tokenizer of the run it starts from */
    char ft[400];
    snprintf(ft, sizeof ft, "%s/ft", dir);
    rc = cli_kiln_run((const char *[]){"train", "--init", run, "--data", data, "--run-dir", ft, "--seq-len", "32", "--batch", "2",
                                   "--accum", "1", "--steps", "1", "--eval-every", "0", "--no-plot", NULL});
    snprintf(path, sizeof path, "%s/tokenizer.json", ft);
    CHECK(rc == 0 && access(path, R_OK) == 0, "--init without --tokenizer uses the run's (rc %d)", rc);
    CHECK(cli_kiln_run((const char *[]){"eval", run, NULL}) == 0 && cli_output_has("perplexity"), "eval");
    CHECK(cli_kiln_run((const char *[]){"generate", run, "--prompt", "the lord", "--max-tokens", "8", "--seed", "1", NULL}) ==
                  0 && cli_output_has("the lord"),
          "generate echoes the prompt and continues");
    CHECK(cli_kiln_run((const char *[]){"plot", run, NULL}) == 0 && cli_output_has("loss.svg"), "plot");
    /* the model, its key/value cache and the work on cpu-isolated: the
     * same greedy text, the same loss */
    char *on[2] = {NULL, NULL};
    const char *devs[2] = {"cpu", "cpu-isolated"};
    for (int d = 0; d < 2; d++) {
        rc = cli_kiln_run((const char *[]){"generate", run, "--prompt", "the lord", "--max-tokens", "12", "--temperature", "0",
                                       "--device", devs[d], NULL});
        on[d] = output_text();
        CHECK(rc == 0, "generate --device %s (rc %d)", devs[d], rc);
    }
    CHECK(on[0] && on[1] && strlen(on[0]) > strlen("the lord") && !strcmp(on[0], on[1]),
          "generate --device cpu-isolated gives --device cpu's text: '%s' vs '%s'", on[0] ? on[0] : "", on[1] ? on[1] : "");
    for (int d = 0; d < 2; d++) {
        free(on[d]);
        rc = cli_kiln_run((const char *[]){"eval", run, "--batches", "2", "--device", devs[d], NULL});
        on[d] = cli_output();
        char *cut = strstr(on[d], "  (");
        if (cut) *cut = 0; /* the loss and perplexity, without the timing */
        CHECK(rc == 0 && cut, "eval --device %s (rc %d)", devs[d], rc);
    }
    CHECK(!strcmp(on[0], on[1]), "eval --device cpu-isolated gives --device cpu's loss: '%s' vs '%s'", on[0], on[1]);
    free(on[0]);
    free(on[1]);
    chat_generate(run, tok);
    /* a truncated model file is refused with its name, and nothing crashes */
    char target[600];
    snprintf(path, sizeof path, "%s/model.safetensors", run);
    ssize_t n = readlink(path, target, sizeof target - 1);
    CHECK(n > 0, "model.safetensors is a link to the newest checkpoint");
    if (n > 0) {
        target[n] = 0;
        char real[1300];
        snprintf(real, sizeof real, "%s/%s", run, target);
        CHECK(truncate(real, 20) == 0, "truncate");
        /* the run dir: the truncated newest checkpoint is passed over (as
         * --resume does), with a warning naming the file */
        rc = cli_kiln_run((const char *[]){"generate", run, "--prompt", "the", "--max-tokens", "4", NULL});
        CHECK(rc == 0 && cli_output_has("model.safetensors") && cli_output_has("older"),
              "a truncated newest checkpoint is passed over naming the file (rc %d)", rc);
        /* that checkpoint directory itself is refused, naming the file */
        char *slash = strrchr(real, '/');
        if (slash) *slash = 0;
        rc = cli_kiln_run((const char *[]){"generate", real, "--prompt", "the", "--max-tokens", "4", NULL});
        CHECK(rc == 1 && cli_output_has("model.safetensors"), "a truncated model is refused naming the file (rc %d)", rc);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_cli_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    setenv("KILN_CACHE_DIR", dir, 1);
    help_and_usage();
    pipeline();
    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
