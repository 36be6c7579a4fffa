/* Subcommands of the kiln CLI: each takes argv with argv[0] = its own name
 * and returns the process exit code. */
#ifndef KILN_CLI_H
#define KILN_CLI_H
int kiln_cmd_tokenizer(int argc, char **argv);
int kiln_cmd_tokenize(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
#endif
