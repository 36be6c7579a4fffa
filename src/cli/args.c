/* The flag scanner every subcommand uses, and the checked value helpers:
 * one way to spell flags (--x v, --x=v), one message for a bad value
 * ("kiln CMD: --x: bad value 'v' (expected ...)"), and every number through
 * the core parser (src/core/parse.c). */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "kiln/kernels.h"

int kiln_cli_scan(const char *cmd, int argc, char **argv, int *i, const kiln_cli_flag *flags, int n_flags,
                  const char **value) {
    const char *s = argv[*i];
    *value = s;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return KILN_ARG_HELP;
    if (s[0] != '-' || !strcmp(s, "-") || (s[1] >= '0' && s[1] <= '9')) return KILN_ARG_POS;
    const char *eq = strchr(s, '=');
    size_t nl = eq ? (size_t)(eq - s) : strlen(s);
    for (int k = 0; k < n_flags; k++) {
        if (strlen(flags[k].name) != nl || strncmp(s, flags[k].name, nl)) continue;
        if (!flags[k].takes_value) {
            if (eq) {
                fprintf(stderr, "kiln %s: %s takes no value\n", cmd, flags[k].name);
                return KILN_ARG_ERROR;
            }
            *value = NULL;
            return k;
        }
        *value = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
        if (*value) return k;
        fprintf(stderr, "kiln %s: %s needs a value\n", cmd, flags[k].name);
        return KILN_ARG_ERROR;
    }
    fprintf(stderr, "kiln %s: unknown flag %.*s (see --help)\n", cmd, (int)nl, s);
    return KILN_ARG_ERROR;
}

int kiln_cli_arg(const char *cmd, int argc, char **argv, int *i, const char *const *names, int n_names,
                 const char **value) {
    kiln_cli_flag flags[64];
    int n = n_names < 64 ? n_names : 64;
    for (int k = 0; k < n; k++) flags[k] = (kiln_cli_flag){names[k], true};
    return kiln_cli_scan(cmd, argc, argv, i, flags, n, value);
}

/* kiln_last_error() holds "bad value '...' (expected ...)" */
static bool bad(const char *cmd, const char *flag) {
    fprintf(stderr, "kiln %s: %s: %s\n", cmd, flag, kiln_last_error());
    return false;
}

bool kiln_cli_int(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    return kiln_parse_i64(v, lo, hi, out) ? bad(cmd, flag) : true;
}

bool kiln_cli_u64(const char *cmd, const char *flag, const char *v, uint64_t *out) {
    return kiln_parse_u64(v, out) ? bad(cmd, flag) : true;
}

bool kiln_cli_num(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
    return kiln_parse_f64(v, lo, hi, out) ? bad(cmd, flag) : true;
}

bool kiln_cli_size(const char *cmd, const char *flag, const char *v, int64_t *out) {
    return kiln_parse_bytes(v, out) ? bad(cmd, flag) : true;
}

bool kiln_cli_choice(const char *cmd, const char *flag, const char *v, const kiln_choice *choices, int *out) {
    return kiln_parse_choice(v, choices, out) ? bad(cmd, flag) : true;
}

bool kiln_cli_threads(const char *cmd, const char *v) {
    int64_t n;
    if (!kiln_cli_int(cmd, "--threads", v, 1, 4096, &n)) return false;
    kiln_set_num_threads((int)n);
    return true;
}
