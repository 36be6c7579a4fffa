/* Subcommands of the kiln CLI: each takes argv with argv[0] = its own name
 * and returns the process exit code. */
#ifndef KILN_CLI_H
#define KILN_CLI_H
int kiln_cmd_tokenizer(int argc, char **argv);
int kiln_cmd_tokenize(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
int kiln_cmd_compile(int argc, char **argv);
int kiln_cmd_train(int argc, char **argv);
int kiln_cmd_eval(int argc, char **argv);
int kiln_cmd_generate(int argc, char **argv);
int kiln_cmd_plot(int argc, char **argv);
int kiln_cmd_export(int argc, char **argv);
/* Writes the loss/lr SVG of a run (out_path NULL: RUN_DIR/loss.svg).
 * Returns 0 or a kiln_status with kiln_last_error() set; prints nothing. */
int kiln_cli_write_plot(const char *run_dir, const char *out_path);

/* One step of flag scanning: argv[*i] is a positional (KILN_ARG_POS, *value
 * = it; "-" and negative numbers count), --help (KILN_ARG_HELP), or one of
 * `names`, whose index comes back with *value from "--x=v" or the next
 * argument (*i advances). Unknown flags and missing values print
 * "kiln CMD: ..." and give KILN_ARG_ERROR. */
enum { KILN_ARG_POS = -1, KILN_ARG_HELP = -2, KILN_ARG_ERROR = -3 };
int kiln_cli_arg(const char *cmd, int argc, char **argv, int *i, const char *const *names, int n_names,
                 const char **value);
#endif
