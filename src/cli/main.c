/* kiln: the command-line entry point; dispatches to subcommands. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "kiln/core.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"tokenizer", kiln_cmd_tokenizer, "train, encode or decode with a byte-level BPE tokenizer"},
    {"tokenize", kiln_cmd_tokenize, "turn text files into token shards (train.bin, val.bin)"},
    {"train", kiln_cmd_train, "train a model (or resume a run) on token shards"},
    {"eval", kiln_cmd_eval, "loss and perplexity of a run's model on val.bin"},
    {"generate", kiln_cmd_generate, "sample text from a run's model"},
    {"plot", kiln_cmd_plot, "SVG of training/validation loss and lr of one or two runs"},
    {"bench", kiln_cmd_bench, "time training steps of a model configuration"},
    {"export", kiln_cmd_export, "write a model as GGUF for llama.cpp (--gguf OUT.gguf --type f32|f16|bf16|q8_0)"},
    {"compile", kiln_cmd_compile, "show what the compiler does to a model's training step (--explain)"},
    {"devices", kiln_cmd_devices, "list the devices (--device NAME) with their buffers, capabilities and kernels"},
};

static void usage(FILE *f) {
    fprintf(f, "kiln %s: train Llama-style language models on the CPU\n\nusage: kiln COMMAND [options]\n\ncommands:\n",
            KILN_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`kiln COMMAND --help` describes each command.\n");
}

/* OpenMP's threads wait for work by spinning (libgomp: about 300,000 polls,
 * a fraction of a millisecond) before they sleep. Alone on its cores that
 * is what keeps kiln fast; beside busy processes a spinning thread burns the
 * time slice the thread it waits for needs. A short spin keeps both: see
 * README "Sharing the cores" (10,000 polls: beside 3 spinners as fast as
 * 1,000, and alone about 4% faster in the bf16 step on a KVM guest, whose
 * wake-ups are slow). libgomp reads its settings when it is loaded, before
 * main, so kiln sets them and runs itself again, once, unless the user
 * chose a policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME set).
 * A kiln built with clang runs on LLVM's libomp, whose threads spin for
 * KMP_BLOCKTIME milliseconds (200 by default) and whose shortest spin short
 * of none is 1 ms: 0 there (beside another test, test_gemm and
 * test_gguf_quant of the clang build took 49 CPU-seconds spinning by
 * default, 40 with 0). */
#define KILN_SPINCOUNT "10000"
static void tune_waiting(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("KMP_BLOCKTIME") || getenv("KILN_OMP_TUNED"))
        return;
    if (setenv("GOMP_SPINCOUNT", KILN_SPINCOUNT, 1) || setenv("KMP_BLOCKTIME", "0", 1) || setenv("KILN_OMP_TUNED", "1", 1))
        return;
    execv("/proc/self/exe", argv); /* only returns on failure: then run as we are */
    unsetenv("GOMP_SPINCOUNT"), unsetenv("KMP_BLOCKTIME");
}

int main(int argc, char **argv) {
    tune_waiting(argv);
    /* Past the file-size limit (ulimit -f) a write would kill the process
     * with SIGXFSZ mid-save, saying nothing; ignored, the write fails with
     * EFBIG and the save reports "File too large" naming the file. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
