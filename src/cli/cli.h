/* Subcommands of the kiln CLI: each takes argv with argv[0] = its own name
 * and returns the process exit code. */
#ifndef KILN_CLI_H
#define KILN_CLI_H
#include <stdbool.h>
#include <stdint.h>
#include "kiln/core.h"
#include "kiln/model.h"
int kiln_cmd_tokenizer(int argc, char **argv);
int kiln_cmd_tokenize(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
/* kiln bench --ranks N (bench_ranks.c): data parallel over mpirun, per --shard mode. */
int kiln_bench_ranks(int argc, char **argv);
/* A bench model name (cmd_bench.c's shapes) or what kiln_llama_config_resolve takes. */
kiln_status kiln_bench_model_config(const char *model, kiln_llama_config *cfg);
/* kiln bench --pack documents (bench_pack.c): the compiled step (the first
 * compiled mode of `modes`) on rows of doc_len-token documents against
 * plain packed rows of the same tokens; prints both and the ratio. */
int kiln_bench_pack(void *model, int64_t B, int64_t T, int64_t doc_len, int steps, int warmup, const char *modes);
int kiln_cmd_compile(int argc, char **argv);
int kiln_cmd_train(int argc, char **argv);
int kiln_cmd_eval(int argc, char **argv);
int kiln_cmd_generate(int argc, char **argv);
int kiln_cmd_plot(int argc, char **argv);
int kiln_cmd_export(int argc, char **argv);
int kiln_cmd_devices(int argc, char **argv);
/* Writes the loss/lr SVG of a run (out_path NULL: RUN_DIR/loss.svg).
 * Returns 0 or a kiln_status with kiln_last_error() set; prints nothing. */
int kiln_cli_write_plot(const char *run_dir, const char *out_path);

/* The one flag scanner. One step: argv[*i] is a positional (KILN_ARG_POS,
 * *value = it; "-" and negative numbers count), -h/--help (KILN_ARG_HELP),
 * or one of `flags`, whose index comes back; a flag that takes a value gets
 * it from "--x=v" or the next argument (*i advances), one that takes none
 * gets *value = NULL. Unknown flags, missing values and a value given to a
 * flag that takes none print "kiln CMD: ..." and give KILN_ARG_ERROR. */
enum { KILN_ARG_POS = -1, KILN_ARG_HELP = -2, KILN_ARG_ERROR = -3 };
typedef struct {
    const char *name; /* "--batch", "-o" */
    bool takes_value;
} kiln_cli_flag;
int kiln_cli_scan(const char *cmd, int argc, char **argv, int *i, const kiln_cli_flag *flags, int n_flags,
                  const char **value);
/* The same where every flag takes a value (names, at most 64). */
int kiln_cli_arg(const char *cmd, int argc, char **argv, int *i, const char *const *names, int n_names,
                 const char **value);

/* Checked values: false after printing "kiln CMD: FLAG: bad value 'V'
 * (expected ...)"; the numbers come from the core parser. */
bool kiln_cli_int(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);
bool kiln_cli_u64(const char *cmd, const char *flag, const char *v, uint64_t *out);
bool kiln_cli_num(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
bool kiln_cli_size(const char *cmd, const char *flag, const char *v, int64_t *out);
bool kiln_cli_choice(const char *cmd, const char *flag, const char *v, const kiln_choice *choices, int *out);
/* A command's flags as a table, one row a flag: its name, what its value
 * is and where it goes; kiln_cli_parse scans argv with kiln_cli_scan and
 * stores each value through the row (checked by the helpers above). */
typedef enum {
    KILN_OPT_STR,     /* const char **out */
    KILN_OPT_INT,     /* int *out, in [lo, hi] */
    KILN_OPT_I64,     /* int64_t *out, in [lo, hi] */
    KILN_OPT_U64,     /* uint64_t *out */
    KILN_OPT_NUM,     /* double *out, in [lo, hi] */
    KILN_OPT_CHOICE,  /* int *out, one of the names of the run setting `setting` */
    KILN_OPT_TRUE,    /* bool *out = true; takes no value */
    KILN_OPT_THREADS, /* --threads N: sets the compute threads; out unused */
    KILN_OPT_DEVICE,  /* const kiln_backend **out: a name of KILN_BACKENDS (the run setting "device") */
} kiln_opt_kind;
typedef struct {
    const char *name;
    kiln_opt_kind kind;
    void *out;
    double lo, hi;
    const char *setting; /* KILN_OPT_CHOICE */
    bool *given;         /* may be NULL: set when the flag appears */
} kiln_cli_opt;
#define KILN_OPT(n, k, o) {.name = (n), .kind = (k), .out = (o)}
#define KILN_OPT_RANGE(n, k, o, l, h) {.name = (n), .kind = (k), .out = (o), .lo = (l), .hi = (h)}
#define KILN_OPT_SETTING(n, o, s) {.name = (n), .kind = KILN_OPT_CHOICE, .out = (o), .setting = (s)}
/* Returns 0 when parsed, 1 after printing `help` to stdout (-h/--help), 2
 * after printing an error to stderr. Positional arguments go to pos[] (at
 * most max_pos, counted in *n_pos; NULL/0: none allowed). */
int kiln_cli_parse(const char *cmd, int argc, char **argv, const kiln_cli_opt *opts, int n_opts, const char *help,
                   const char **pos, int max_pos, int *n_pos);
/* `kiln bench --compete N`: N spinning child processes (pids[n]); returns
 * how many started. stop kills and reaps them. */
int kiln_cli_compete_start(int n, int *pids);
void kiln_cli_compete_stop(int n, const int *pids);
/* --threads N (1..4096): sets the compute threads. */
bool kiln_cli_threads(const char *cmd, const char *v);
/* --device NAME: the backend of that name (the choices of the run setting
 * "device", i.e. KILN_BACKENDS); false after printing "kiln CMD: --device:
 * ..." naming the known devices. */
struct kiln_backend;
bool kiln_cli_device(const char *cmd, const char *v, const struct kiln_backend **out);
#endif
