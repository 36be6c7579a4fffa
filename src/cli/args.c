/* The flag scanner the subcommands share. */
#include <stdio.h>
#include <string.h>
#include "cli.h"

int kiln_cli_arg(const char *cmd, int argc, char **argv, int *i, const char *const *names, int n_names,
                 const char **value) {
    const char *s = argv[*i];
    *value = s;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return KILN_ARG_HELP;
    if (s[0] != '-' || !strcmp(s, "-") || (s[1] >= '0' && s[1] <= '9')) return KILN_ARG_POS;
    const char *eq = strchr(s, '=');
    size_t nl = eq ? (size_t)(eq - s) : strlen(s);
    for (int k = 0; k < n_names; k++)
        if (strlen(names[k]) == nl && !strncmp(s, names[k], nl)) {
            *value = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
            if (*value) return k;
            fprintf(stderr, "kiln %s: flag %s needs a value\n", cmd, names[k]);
            return KILN_ARG_ERROR;
        }
    fprintf(stderr, "kiln %s: unknown flag %.*s (see --help)\n", cmd, (int)nl, s);
    return KILN_ARG_ERROR;
}
