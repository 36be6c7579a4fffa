/* Text to numbers, the one place kiln does it: CLI flags, string values of
 * JSON settings, environment variables and the few text files kiln reads
 * all come through here, so every number is checked the same way (the whole
 * text, the range, no overflow, finite) and every refusal reads the same:
 * "bad value 'TEXT' (expected ...)", which callers prefix with the flag, key
 * or file it came from. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln/core.h"

kiln_status kiln_bad_value(const char *text, const char *expected) {
    return kiln_error(KILN_ERR_INVALID, "bad value '%.200s' (expected %s)", text ? text : "", expected);
}

/* "an integer in [1, 4096]", "a non-negative integer", "an integer >= 2" */
static void int_expect(char *buf, size_t n, int64_t lo, int64_t hi) {
    if (lo == 0 && hi == INT64_MAX) snprintf(buf, n, "a non-negative integer");
    else if (hi == INT64_MAX) snprintf(buf, n, "an integer >= %lld", (long long)lo);
    else if (lo == INT64_MIN) snprintf(buf, n, "an integer <= %lld", (long long)hi);
    else snprintf(buf, n, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
}

kiln_status kiln_check_i64(int64_t v, int64_t lo, int64_t hi, const char *text) {
    if (v >= lo && v <= hi) return KILN_OK;
    char want[96], own[32];
    int_expect(want, sizeof want, lo, hi);
    if (!text) snprintf(own, sizeof own, "%lld", (long long)v), text = own;
    return kiln_bad_value(text, want);
}

kiln_status kiln_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char want[96];
    int_expect(want, sizeof want, lo, hi);
    if (!s || !*s || isspace((unsigned char)*s)) return kiln_bad_value(s, want);
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || x < lo || x > hi) return kiln_bad_value(s, want);
    *out = x;
    return KILN_OK;
}

kiln_status kiln_parse_int(const char *s, int lo, int hi, int *out) {
    int64_t v = 0;
    kiln_status st = kiln_parse_i64(s, lo, hi, &v);
    if (!st) *out = (int)v;
    return st;
}

kiln_status kiln_parse_leading_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    size_t nd = s ? strspn(s, "0123456789") : 0;
    char num[24];
    if (nd == 0 || nd >= sizeof num) {
        snprintf(num, sizeof num, "%.20s", s ? s : "");
        return kiln_bad_value(num, "a non-negative integer");
    }
    memcpy(num, s, nd);
    num[nd] = 0;
    return kiln_parse_i64(num, lo, hi, out);
}

kiln_status kiln_parse_u64(const char *s, uint64_t *out) {
    const char *want = "a non-negative integer below 2^64";
    /* strtoull accepts "-1" (as 2^64-1) and leading blanks: only digits here */
    if (!s || !isdigit((unsigned char)*s)) return kiln_bad_value(s, want);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return kiln_bad_value(s, want);
    *out = x;
    return KILN_OK;
}

static void num_expect(char *buf, size_t n, double lo, double hi) {
    if (lo == -DBL_MAX && hi == DBL_MAX) snprintf(buf, n, "a number");
    else if (hi == DBL_MAX) snprintf(buf, n, "a number >= %g", lo);
    else snprintf(buf, n, "a number in [%g, %g]", lo, hi);
}

kiln_status kiln_parse_f64(const char *s, double lo, double hi, double *out) {
    char want[96];
    num_expect(want, sizeof want, lo, hi);
    if (!s || !*s || isspace((unsigned char)*s)) return kiln_bad_value(s, want);
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    /* ERANGE also flags underflow to a tiny value, which is a fine number */
    if ((errno == ERANGE && fabs(x) > 1) || *end || !isfinite(x) || !(x >= lo && x <= hi)) return kiln_bad_value(s, want);
    *out = x;
    return KILN_OK;
}

/* The message lists each value once, by its first (canonical) name: the
 * later names of a value are accepted spellings. */
kiln_status kiln_parse_choice(const char *s, const kiln_choice *choices, int *out) {
    for (const kiln_choice *c = choices; s && c->name; c++)
        if (!strcmp(s, c->name)) {
            *out = c->value;
            return KILN_OK;
        }
    int n = 0;
    for (const kiln_choice *c = choices; c->name; c++)
        if (!strcmp(kiln_choice_name(choices, c->value), c->name)) n++;
    char want[512];
    size_t k = 0;
    want[0] = 0;
    int i = 0;
    for (const kiln_choice *c = choices; c->name && k < sizeof want; c++) {
        if (strcmp(kiln_choice_name(choices, c->value), c->name)) continue;
        k += (size_t)snprintf(want + k, sizeof want - k, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", c->name);
        i++;
    }
    return kiln_bad_value(s, want);
}

const char *kiln_choice_name(const kiln_choice *choices, int value) {
    for (const kiln_choice *c = choices; c->name; c++)
        if (c->value == value) return c->name;
    return "?";
}

kiln_status kiln_parse_bytes(const char *s, int64_t *out) {
    const char *want = "a memory size such as 512M, 1G or 1.5GiB (K, M, G, T: powers of 1024)";
    if (!s || !*s || isspace((unsigned char)*s) || *s == '-') return kiln_bad_value(s, want);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v <= 0) return kiln_bad_value(s, want);
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1024.0, end++; break;
    case 'M': mul = 1024.0 * 1024, end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024, end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: return kiln_bad_value(s, want);
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || v * mul >= 9.0e18 || v * mul < 1) return kiln_bad_value(s, want);
    *out = (int64_t)(v * mul);
    return KILN_OK;
}

kiln_status kiln_parse_bytes_hf(const char *s, int64_t *out) {
    const char *want = "a size such as 5GB, 500MB, 2GiB or 1000000 (KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB: of 1024)";
    static const struct {
        const char *unit;
        double mul;
    } units[] = {{"", 1},          {"B", 1},         {"KB", 1e3},           {"MB", 1e6},         {"GB", 1e9},
                 {"TB", 1e12},     {"KiB", 1024.0},  {"MiB", 1048576.0},    {"GiB", 1073741824.0}, {"K", 1e3},
                 {"M", 1e6},       {"G", 1e9}};
    size_t nl = s ? strspn(s, "0123456789.") : 0;
    char num[64];
    double v = 0, mul = 0;
    if (nl == 0 || nl >= sizeof num) return kiln_bad_value(s, want);
    memcpy(num, s, nl);
    num[nl] = 0;
    if (kiln_parse_f64(num, 0, 9.2e18, &v)) return kiln_bad_value(s, want);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(s + nl, units[i].unit)) mul = units[i].mul;
    if (mul == 0 || !(v * mul >= 1) || v * mul > 9.2e18) return kiln_bad_value(s, want);
    *out = (int64_t)(v * mul);
    return KILN_OK;
}

const char *kiln_bytes_text(int64_t b, char *buf, size_t n) {
    static const char units[] = "KMGT";
    int u = -1;
    while (u < 3 && b > 0 && b % 1024 == 0) b /= 1024, u++;
    if (u < 0) snprintf(buf, n, "%lld", (long long)b);
    else snprintf(buf, n, "%lld%c", (long long)b, units[u]);
    return buf;
}
