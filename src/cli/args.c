/* The flag scanner every subcommand uses, and the checked value helpers:
 * one way to spell flags (--x v, --x=v), one message for a bad value
 * ("kiln CMD: --x: bad value 'v' (expected ...)"), and every number through
 * the core parser (src/core/parse.c). */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "kiln/backend.h"
#include "kiln/kernels.h"
#include "kiln/train.h"

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

bool kiln_cli_device(const char *cmd, const char *v, const kiln_backend **out) {
    const kiln_setting *s = kiln_setting_find("device");
    if (s && s->kind == KILN_SETTING_ENUM) { /* the run setting's names (KILN_DEVICE_* values) */
        int d;
        if (!kiln_cli_choice(cmd, "--device", v, s->choices, &d)) return false;
        *out = kiln_backend_at(d);
    } else {
        *out = kiln_backend_find(v);
    }
    return *out ? true : bad(cmd, "--device");
}

static bool opt_value(const char *cmd, const kiln_cli_opt *o, const char *v) {
    int64_t x;
    switch (o->kind) {
    case KILN_OPT_STR: *(const char **)o->out = v; return true;
    case KILN_OPT_INT:
        if (!kiln_cli_int(cmd, o->name, v, (int64_t)o->lo, (int64_t)o->hi, &x)) return false;
        *(int *)o->out = (int)x;
        return true;
    case KILN_OPT_I64: return kiln_cli_int(cmd, o->name, v, (int64_t)o->lo, (int64_t)o->hi, o->out);
    case KILN_OPT_U64: return kiln_cli_u64(cmd, o->name, v, o->out);
    case KILN_OPT_NUM: return kiln_cli_num(cmd, o->name, v, o->lo, o->hi, o->out);
    case KILN_OPT_CHOICE: return kiln_cli_choice(cmd, o->name, v, kiln_setting_find(o->setting)->choices, o->out);
    case KILN_OPT_TRUE: *(bool *)o->out = true; return true;
    case KILN_OPT_THREADS: return kiln_cli_threads(cmd, v);
    case KILN_OPT_DEVICE: return kiln_cli_device(cmd, v, o->out);
    }
    return false;
}

int kiln_cli_parse(const char *cmd, int argc, char **argv, const kiln_cli_opt *opts, int n_opts, const char *help,
                   const char **pos, int max_pos, int *n_pos) {
    kiln_cli_flag flags[64];
    int n = n_opts < 64 ? n_opts : 64;
    for (int k = 0; k < n; k++) flags[k] = (kiln_cli_flag){opts[k].name, opts[k].kind != KILN_OPT_TRUE};
    if (n_pos) *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int k = kiln_cli_scan(cmd, argc, argv, &i, flags, n, &v);
        if (k == KILN_ARG_HELP) return fputs(help, stdout), 1;
        if (k == KILN_ARG_ERROR) return 2;
        if (k == KILN_ARG_POS) {
            if (!pos || *n_pos >= max_pos) {
                fprintf(stderr, "kiln %s: unexpected argument '%s' (see --help)\n", cmd, v);
                return 2;
            }
            pos[(*n_pos)++] = v;
            continue;
        }
        if (!opt_value(cmd, &opts[k], v)) return 2;
        if (opts[k].given) *opts[k].given = true;
    }
    return 0;
}
