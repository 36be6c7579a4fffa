/* The library exports kiln_ names only (issue 11: the data layer's helpers
 * were linked as bare kd_*, the Jinja subset's as jn_/jb_/jl_): every global
 * symbol defined in libkiln.a, read with binutils' nm beside this test's
 * build directory, must carry the prefix. */
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

int main(int argc, char **argv) {
    (void)argc;
    char self[1024], cmd[1200], line[512];
    snprintf(self, sizeof self, "%s", argv[0]);
    const char *dir = dirname(self);
    snprintf(cmd, sizeof cmd, "nm -g --defined-only '%s/../libkiln.a' 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    int total = 0, bare = 0, kd = 0;
    while (p && fgets(line, sizeof line, p)) {
        char addr[64], type[8], name[400];
        if (sscanf(line, "%63s %7s %399s", addr, type, name) != 3) continue;
        total++;
        if (!strncmp(name, "kiln_", 5)) continue;
        /* the compiler's own: names no C identifier can have (ASan's
         * __odr_asan.X, OpenMP's .gomp_critical_user_...) and reserved __ */
        if (strchr(name, '.') || !strncmp(name, "__", 2)) continue;
        bare++;
        kd += !strncmp(name, "kd_", 3);
        if (bare <= 20) printf("  exported without the kiln_ prefix: %s\n", name);
    }
    int rc = p ? pclose(p) : -1;
    if (rc != 0 || total == 0) {
        printf("test_symbols: skipped (nm did not list %s/../libkiln.a: binutils missing?)\n", dir);
        TEST_END();
    }
    printf("  %d global symbols, %d without the kiln_ prefix\n", total, bare);
    CHECK(total > 100, "the library's symbols were read (%d)", total);
    CHECK(kd == 0, "%d data-layer kd_ helpers exported under their bare names", kd);
    CHECK(bare == 0, "%d symbols exported without the kiln_ prefix (listed above)", bare);
    TEST_END();
}
