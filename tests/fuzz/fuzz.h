/* Shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c, `make fuzz`).
 * Parsers that take a path get the input through one private temp file per
 * process, rewritten for every input. Each harness only asserts what the
 * sanitizers and libFuzzer check (no crash, no UB, no leak of the mapping
 * beyond the call); an error status is a fine outcome for a hostile input. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/core.h"

static char fuzz_path[64];

static inline void fuzz_cleanup(void) {
    if (fuzz_path[0]) unlink(fuzz_path);
}

/* Writes data to this process's temp file and returns its path. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix) {
    if (!fuzz_path[0]) {
        snprintf(fuzz_path, sizeof fuzz_path, "/tmp/kiln-fuzz-%d%s", (int)getpid(), suffix);
        atexit(fuzz_cleanup);
    }
    FILE *f = fopen(fuzz_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
    return fuzz_path;
}

/* A NUL-terminated copy (JSON text parsers); the caller frees it. */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* Quiet logging: a hostile input's warnings are expected. */
static inline void fuzz_quiet(void) {
    static int done;
    if (!done) kiln_log_set_level(KILN_LOG_ERROR), done = 1;
}
#endif
